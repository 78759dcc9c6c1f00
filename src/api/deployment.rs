//! The Deployment a Foo asks for — upstream's `newDeployment(foo)` — and
//! the one ownership rule, by controller ownerReference
//! ([`controlling_foo`], [`is_controlled_by`]). Pure functions over plain
//! values; the API calls live in [`crate::reconcile::sync`] and [`crate::reconcile::adoption`].

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use crate::api::constants::*;
use crate::api::foo::Foo;
use crate::api::shard::FollowedLabels;

/// Labels shared by the Deployment's selector and its pods: upstream's
/// `app: nginx` and `controller: <foo name>`.
pub(crate) fn selector_labels(foo_name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_APP.to_owned(), LABEL_APP_VALUE.to_owned()),
        (LABEL_CONTROLLER.to_owned(), foo_name.to_owned()),
    ])
}

/// Label selector matching exactly the Deployments this controller creates;
/// the controller's Deployment watch and list use it so Deployments of
/// other tools are never sent to it, let alone cached.
pub fn managed_selector() -> String {
    format!("{LABEL_MANAGED_BY}={LABEL_MANAGED_BY_VALUE}")
}

/// Label selector for the Deployments the adoption pass looks at: those
/// without our label. Upstream's `newDeployment` puts `app` and `controller`
/// on the selector and the pods only, not on the Deployment, so nothing
/// narrows the search further; the pass lists metadata only, once, and then
/// checks each owner by uid ([`is_controlled_by`]).
pub(crate) fn unmanaged_selector() -> String {
    format!("!{LABEL_MANAGED_BY}")
}

/// True when the Deployment carries our managed-by label, so our watch sees
/// it. A Deployment a Foo controls without it is adopted: labelled, nothing
/// else changed.
pub(crate) fn has_managed_label<K: Resource>(deployment: &K) -> bool {
    deployment.labels().get(LABEL_MANAGED_BY).is_some_and(|v| v == LABEL_MANAGED_BY_VALUE)
}

/// The controller ownerReference a Deployment of this Foo carries, so the
/// garbage collector deletes it with the Foo. `None` when the Foo has no uid
/// (never the case for an object read from the API server).
pub(crate) fn owner_reference(foo: &Foo) -> Option<OwnerReference> {
    // kube's helper sets `controller` only; upstream (metav1.NewControllerRef)
    // also blocks the Foo's foreground deletion until the Deployment is gone.
    let mut owner = foo.controller_owner_ref(&())?;
    owner.block_owner_deletion = Some(true);
    Some(owner)
}

/// The controller ownerReference of `obj` (`controller: true`), as Go's
/// `metav1.GetControllerOf`: the one lookup every ownership test uses.
pub(crate) fn controller_of<K: Resource>(obj: &K) -> Option<&OwnerReference> {
    obj.meta().owner_references.iter().flatten().find(|o| o.controller == Some(true))
}

/// The Foo that controls `obj`: its controller ownerReference, if that names
/// a Foo (apiVersion and kind), read by kube-runtime's own rule — the one by
/// which its `Controller` maps an owned object to its owner. The reference's
/// uid is in the result's `extra.uid`.
pub(crate) fn controlling_foo<K: Resource>(obj: &K) -> Option<ObjectRef<Foo>> {
    ObjectRef::from_owner_ref(obj.meta().namespace.as_deref(), controller_of(obj)?, ())
}

/// True when `deployment` has a controller ownerReference naming this Foo's
/// uid. Names are not enough: a Foo deleted and re-created under the same
/// name is a different owner, and its predecessor's Deployment is not its to
/// modify.
pub(crate) fn is_controlled_by<K: Resource>(deployment: &K, foo: &Foo) -> bool {
    let Some(uid) = foo.meta().uid.as_deref() else {
        return false;
    };
    controller_of(deployment).is_some_and(|r| r.uid == uid)
}

/// Upstream's `newDeployment`: the Deployment a Foo asks for, carrying the
/// `followed` labels of the Foo's shard ([`crate::api::shard`]). `None` when the
/// Foo cannot own anything (no uid, or an empty deploymentName).
pub fn desired_deployment(foo: &Foo, followed: &FollowedLabels) -> Option<Deployment> {
    let owner = owner_reference(foo)?;
    if foo.spec.deployment_name.is_empty() {
        return None;
    }
    let foo_name = foo.name_any();
    let labels = selector_labels(&foo_name);
    let mut metadata_labels = labels.clone();
    metadata_labels.insert(LABEL_MANAGED_BY.to_owned(), LABEL_MANAGED_BY_VALUE.to_owned());
    metadata_labels.extend(followed.iter().filter_map(|(k, v)| Some((k.clone(), v.clone()?))));
    Some(Deployment {
        metadata: ObjectMeta {
            name: Some(foo.spec.deployment_name.clone()),
            namespace: foo.namespace(),
            labels: Some(metadata_labels),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: Some(DeploymentSpec {
            replicas: foo.spec.replicas,
            selector: LabelSelector { match_labels: Some(labels.clone()), ..LabelSelector::default() },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta { labels: Some(labels), ..ObjectMeta::default() }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: CONTAINER_NAME.to_owned(),
                        image: Some(CONTAINER_IMAGE.to_owned()),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::shard::UNSHARDED;
    use crate::testing::{DeploymentFixture, FooFixture};

    #[test]
    fn desired_deployment_matches_upstream_new_deployment() {
        let foo = Foo::test("example-foo").replicas(3);
        let d = desired_deployment(&foo, UNSHARDED).unwrap();
        assert_eq!(d.metadata.name.as_deref(), Some("example-foo"));
        assert_eq!(d.metadata.namespace.as_deref(), Some("default"));
        let spec = d.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, Some(3));
        let want = selector_labels("example-foo");
        assert_eq!(want.get("app").map(String::as_str), Some("nginx"));
        assert_eq!(want.get("controller").map(String::as_str), Some("example-foo"));
        assert_eq!(spec.selector.match_labels.as_ref(), Some(&want));
        let template_meta = spec.template.metadata.as_ref().unwrap();
        assert_eq!(template_meta.labels.as_ref(), Some(&want));
        let containers = &spec.template.spec.as_ref().unwrap().containers;
        assert_eq!(containers.len(), 1);
        assert_eq!(containers[0].name, "nginx");
        assert_eq!(containers[0].image.as_deref(), Some("nginx:latest"));
        let owners = d.metadata.owner_references.as_ref().unwrap();
        assert_eq!(owners.len(), 1);
        assert_eq!(owners[0].kind, "Foo");
        assert_eq!(owners[0].api_version, "samplecontroller.k8s.io/v1alpha1");
        assert_eq!(owners[0].name, "example-foo");
        assert_eq!(owners[0].uid, foo.metadata.uid.clone().unwrap());
        assert_eq!(owners[0].controller, Some(true));
        assert_eq!(owners[0].block_owner_deletion, Some(true));
        assert!(is_controlled_by(&d, &foo));
    }

    #[test]
    fn managed_by_label_is_on_the_deployment_but_not_on_pods_or_selector() {
        let d = desired_deployment(&Foo::test("f").deployment("d").unset_replicas(), UNSHARDED).unwrap();
        let meta_labels = d.metadata.labels.unwrap();
        assert_eq!(meta_labels.get(LABEL_MANAGED_BY).map(String::as_str), Some(LABEL_MANAGED_BY_VALUE));
        let spec = d.spec.unwrap();
        assert!(!spec.selector.match_labels.unwrap().contains_key(LABEL_MANAGED_BY));
        assert!(!spec.template.metadata.unwrap().labels.unwrap().contains_key(LABEL_MANAGED_BY));
        assert_eq!(spec.replicas, None, "unset replicas stays unset, as upstream");
    }

    #[test]
    fn no_deployment_for_an_empty_name_or_a_foo_without_uid() {
        assert!(desired_deployment(&Foo::test("f").deployment("").replicas(1), UNSHARDED).is_none());
        let mut no_uid = Foo::test("f").deployment("d").replicas(1);
        no_uid.metadata.uid = None;
        assert!(desired_deployment(&no_uid, UNSHARDED).is_none());
    }

    #[test]
    fn ownership_is_by_controller_uid_not_by_name() {
        let owner = Foo::test("f").deployment("d").replicas(1);
        let mut same_name_new_uid = owner.clone();
        same_name_new_uid.metadata.uid = Some("another-uid".into());
        let ours = desired_deployment(&owner, UNSHARDED).unwrap();
        assert!(is_controlled_by(&ours, &owner));
        assert!(!is_controlled_by(&ours, &same_name_new_uid));
        assert!(!is_controlled_by(&Deployment::foreign("d").replicas(1), &owner));

        let mut not_controller = ours.clone();
        not_controller.metadata.owner_references.as_mut().unwrap()[0].controller = Some(false);
        assert!(!is_controlled_by(&not_controller, &owner));
        assert_eq!(controlling_foo(&not_controller), None);
    }

    #[test]
    fn the_controlling_foo_is_named_by_api_version_and_kind_in_the_deployments_namespace() {
        let foo = Foo::test("f").deployment("d");
        let with_owner = |edit: fn(&mut OwnerReference)| {
            let mut d = Deployment::owned_by(&foo);
            edit(&mut d.metadata.owner_references.as_mut().unwrap()[0]);
            controlling_foo(&d)
        };
        let owner = with_owner(|_| {}).unwrap();
        assert_eq!(owner, ObjectRef::new("f").within("default"));
        assert_eq!(owner.extra.uid, foo.metadata.uid);
        assert_eq!(with_owner(|o| o.api_version = "samplecontroller.k8s.io/v1".into()), None, "another version");
        assert_eq!(with_owner(|o| o.kind = "Bar".into()), None);
        assert_eq!(with_owner(|o| o.api_version = "example.com/v1alpha1".into()), None);
        assert_eq!(with_owner(|o| o.api_version = "v1".into()), None, "the core group is not ours");
        assert_eq!(controlling_foo(&Deployment::foreign("d")), None);
    }
}
