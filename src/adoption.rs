//! Taking over Deployments that a Foo controls but that lack our managed-by
//! label: those upstream's Go controller made before it was swapped for this
//! one (or that someone unlabelled). Our Deployment watch selects on that
//! label, so without it a Deployment is invisible: hand scaling and deletion
//! would not be put back, and the Foo's status would not follow its pods.
//!
//! Once the caches are synced, and under leader election once this replica
//! leads, the operator ([`crate::app`]) runs one pass; syncs wait for it
//! ([`Adoption::finished`]), as until then a Deployment of ours could look
//! missing. The pass lists the candidates once — metadata
//! only, those without our label ([`unmanaged_selector`]) — and labels
//! each that a cached Foo controls by uid ([`adoption_patch`]) with one
//! conditional, metadata-only patch: no rollout, no pod replaced, never a
//! Deployment some other owner controls. What the pass misses (a Deployment
//! made after its list, a label removed later) a sync adopts when it meets
//! it, through the same [`DeploymentPatch`].

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{ListParams, ObjectMeta, Patch};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::client::patch_params;
use crate::decision::DeploymentPatch;
use crate::deployment::{DeploymentView, controlling_foo, has_managed_label, unmanaged_selector};
use crate::foo::Foo;
use crate::shard::FollowedLabels;

/// The adoption pass of one controller run, and whether it has finished.
pub struct Adoption {
    /// Where to look (the watched namespace, or all); `None`: nothing to do.
    deployments: Option<Api<Deployment>>,
    concurrency: usize,
    finished: watch::Sender<bool>,
}

impl Adoption {
    pub fn new(deployments: Api<Deployment>, concurrency: usize) -> Self {
        Adoption {
            deployments: Some(deployments),
            concurrency: concurrency.max(1),
            finished: watch::Sender::new(false),
        }
    }

    /// No pass, finished already: for caches whose contents a test fixes.
    pub fn none() -> Self {
        Adoption { deployments: None, concurrency: 1, finished: watch::Sender::new(true) }
    }

    /// Resolves once the pass has run (or failed: see [`Adoption::run`]).
    pub async fn finished(&self) {
        // Err only if the sender is gone, and it lives as long as `self`.
        let _ = self.finished.subscribe().wait_for(|finished| *finished).await;
    }

    /// Run the pass; `cached_foo` answers with the uid of a cached Foo and
    /// the labels its Deployment follows ([`crate::shard::Shard::follow_cached`]),
    /// `may_write` whether this replica may still write (leader election).
    /// Adopted Deployments are handed to `adopted` (for the cache) as the API
    /// server returned them. A failure is logged and not fatal: a sync still
    /// adopts each Deployment it meets, at the cost of a create attempt and a
    /// read.
    pub async fn run(
        &self,
        cached_foo: impl Fn(&ObjectRef<Foo>) -> Option<(String, FollowedLabels)>,
        may_write: impl Fn() -> bool,
        adopted: impl Fn(DeploymentView),
    ) {
        if let Some(api) = &self.deployments {
            match self.adopt(api, &cached_foo, &may_write, &adopted).await {
                Ok(0) => {}
                Ok(n) => info!(deployments = n, "adopted Deployments made by an earlier controller"),
                Err(e) => warn!(error = %e, "cannot list Deployments to adopt; each Foo's sync will adopt its own"),
            }
        }
        self.finished.send_replace(true);
    }

    async fn adopt(
        &self,
        api: &Api<Deployment>,
        cached_foo: &impl Fn(&ObjectRef<Foo>) -> Option<(String, FollowedLabels)>,
        may_write: &impl Fn() -> bool,
        adopted: &impl Fn(DeploymentView),
    ) -> kube::Result<usize> {
        let candidates = api.list_metadata(&ListParams::default().labels(&unmanaged_selector())).await?;
        let patches: Vec<(String, DeploymentPatch)> =
            candidates.items.iter().filter_map(|d| Some((d.namespace()?, adoption_patch(d, cached_foo)?))).collect();
        let pp = patch_params();
        let count = futures::stream::iter(patches)
            // No longer leading: the syncs fail on their own checks, and the
            // next leader's pass adopts what is left.
            .take_while(|_| std::future::ready(may_write()))
            .map(|(namespace, patch)| {
                let api: Api<Deployment> = Api::namespaced(api.clone().into_client(), &namespace);
                let pp = &pp;
                async move { (api.patch(&patch.name, pp, &Patch::Merge(patch.body())).await, namespace, patch.name) }
            })
            .buffer_unordered(self.concurrency)
            .filter_map(|(result, namespace, name)| async move {
                match result {
                    Ok(d) => Some(d),
                    // Changed or deleted since the list: the sync that meets
                    // it decides again.
                    Err(kube::Error::Api(s)) if s.is_conflict() || s.is_not_found() => None,
                    Err(e) => {
                        warn!(deployment = %format!("{namespace}/{name}"), error = %e, "cannot adopt Deployment");
                        None
                    }
                }
            })
            .fold(0, |n, d| {
                adopted(d.into());
                async move { n + 1 }
            })
            .await;
        Ok(count)
    }
}

/// The patch that adopts `d`, if a Foo controls it and it lacks our label:
/// its controller ownerReference names a Foo (by API group and kind) whose
/// uid, as `cached_foo` reports it, is the one referenced; the patch also
/// puts it in its Foo's shard. A Foo deleted and
/// re-created under the same name has another uid and adopts nothing.
pub fn adoption_patch(
    d: &PartialObjectMeta<Deployment>,
    cached_foo: impl Fn(&ObjectRef<Foo>) -> Option<(String, FollowedLabels)>,
) -> Option<DeploymentPatch> {
    if has_managed_label(d) {
        return None;
    }
    let meta: &ObjectMeta = &d.metadata;
    let foo = controlling_foo(d)?;
    let (uid, followed) = cached_foo(&foo)?;
    (uid == *foo.extra.uid.as_ref()?).then(|| DeploymentPatch {
        name: d.name_any(),
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
        replicas: None,
        adopt: true,
        relabel: followed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::constants::{LABEL_MANAGED_BY, LABEL_MANAGED_BY_VALUE};
    use crate::testing::{DeploymentFixture, FooFixture};
    use kube::core::PartialObjectMetaExt;

    /// `d` as a metadata-only list returns it.
    fn listed(d: Deployment) -> PartialObjectMeta<Deployment> {
        d.metadata.into_response_partial()
    }

    /// A cache holding `foos`, unsharded, as `cached_foo` reads it.
    fn cached(foos: &[Foo]) -> impl Fn(&ObjectRef<Foo>) -> Option<(String, FollowedLabels)> + '_ {
        |r| foos.iter().find(|f| ObjectRef::from_obj(*f) == *r).and_then(|f| Some((f.uid()?, FollowedLabels::new())))
    }

    #[test]
    fn a_deployment_adopted_by_a_shard_is_put_in_its_foos_shard_in_the_same_patch() {
        let foo = Foo::test("example-foo").label("shard", "a");
        let shard = crate::shard::Shard::parse("shard=a").unwrap();
        let in_shard = |_: &ObjectRef<Foo>| Some((ResourceExt::uid(&foo)?, shard.follow(foo.metadata.labels.as_ref())));
        let patch = adoption_patch(&listed(Deployment::made_by_upstream(&foo)), in_shard).unwrap();
        assert_eq!(
            patch.body()["metadata"]["labels"],
            serde_json::json!({ LABEL_MANAGED_BY: LABEL_MANAGED_BY_VALUE, "shard": "a" })
        );
    }

    #[test]
    fn a_deployment_made_by_upstream_for_a_cached_foo_is_labelled_and_nothing_else() {
        let foo = Foo::test("example-foo");
        let patch = adoption_patch(&listed(Deployment::made_by_upstream(&foo)), cached(&[foo])).unwrap();
        assert_eq!(
            patch.body(),
            serde_json::json!({ "metadata": {
                "uid": "uid-deploy-example-foo",
                "resourceVersion": "200",
                "labels": { LABEL_MANAGED_BY: LABEL_MANAGED_BY_VALUE },
            }})
        );
    }

    #[test]
    fn already_labelled_deployments_are_left_alone() {
        let foo = Foo::test("example-foo");
        assert_eq!(adoption_patch(&listed(Deployment::owned_by(&foo)), cached(&[foo])), None);
    }

    #[test]
    fn a_deployment_of_a_foo_recreated_under_the_same_name_is_not_adopted() {
        let old = Foo::test("example-foo").uid("uid-old");
        let new = Foo::test("example-foo").uid("uid-new");
        assert_eq!(adoption_patch(&listed(Deployment::made_by_upstream(&old)), cached(&[new])), None);
    }

    #[test]
    fn a_deployment_whose_foo_is_not_cached_is_not_adopted() {
        let foo = Foo::test("example-foo");
        assert_eq!(adoption_patch(&listed(Deployment::made_by_upstream(&foo)), cached(&[])), None);
    }

    #[test]
    fn only_a_controller_reference_to_a_foo_of_our_group_counts() {
        let foo = Foo::test("example-foo");
        let with_owner = |edit: fn(&mut k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference)| {
            let mut d = Deployment::made_by_upstream(&foo);
            edit(&mut d.metadata.owner_references.as_mut().unwrap()[0]);
            listed(d)
        };
        let foos = [foo.clone()];
        assert!(adoption_patch(&with_owner(|_| {}), cached(&foos)).is_some(), "the reference itself is fine");
        assert_eq!(adoption_patch(&with_owner(|o| o.controller = Some(false)), cached(&foos)), None);
        assert_eq!(adoption_patch(&with_owner(|o| o.controller = None), cached(&foos)), None);
        assert_eq!(adoption_patch(&with_owner(|o| o.kind = "Bar".into()), cached(&foos)), None);
        assert_eq!(adoption_patch(&with_owner(|o| o.api_version = "example.com/v1alpha1".into()), cached(&foos)), None);
        assert_eq!(adoption_patch(&listed(Deployment::foreign("example-foo")), cached(&foos)), None);
    }
}
