//! Taking over Deployments that a Foo controls but that lack our managed-by
//! label: those upstream's Go controller made before it was swapped for this
//! one (or that someone unlabelled). Our Deployment watch selects on that
//! label, so without it a Deployment is invisible: hand scaling and deletion
//! would not be put back, and the Foo's status would not follow its pods.
//!
//! Once the caches are synced, and under leader election once this replica
//! leads, the operator ([`crate::app`]) runs one pass; syncs wait for it
//! ([`Adoption::finished`]), as until then a Deployment of ours could look
//! missing. The pass lists the candidates — metadata only, those without
//! our label ([`unmanaged_selector`]), in pages of [`PAGE`] — and labels
//! each that a cached Foo controls by uid **and names** ([`judge`]) with one
//! conditional, metadata-only patch: no rollout, no pod replaced, never a
//! Deployment some other owner controls. What the pass misses (a Deployment
//! made after its list, a label removed later) a sync adopts when it meets
//! it, through the same [`DeploymentPatch`].
//!
//! A Deployment a Foo controls under another name (its `deploymentName`
//! was changed while upstream ran, and upstream leaves the old one serving)
//! is left as it is: adopting it would make the Foo's next sync delete it as
//! stale, and a switch of controllers must not delete what users still
//! serve from. Its Foo's first sync after the pass reports it with a
//! Warning Event ([`Adoption::take_left_alone`]), once per pass.
//!
//! Anyone who may create Deployments writes what the list returns
//! (annotations of any size), so each page is decoded as it arrives and only
//! the fields the pass reads are kept ([`Listed`]): the pass's memory grows
//! with the number of candidates a Foo controls, never with what the
//! Deployments carry.

use std::collections::HashMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, OwnerReference};
use kube::api::{ListParams, ObjectMeta, Patch};
use kube::core::{PartialObjectMeta, PartialObjectMetaExt, Request};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use parking_lot::Mutex;
use serde::Deserialize;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::api::deployment::{controlling_foo, has_managed_label, unmanaged_selector};
use crate::api::deployment_view::DeploymentView;
use crate::api::foo::Foo;
use crate::api::shard::FollowedLabels;
use crate::client::{patch_params, send_streamed};
use crate::reconcile::decision::DeploymentPatch;

/// Deployments per page of the pass's list: kube-runtime's page size for
/// the watches' lists. Each is decoded as it streams in, keeping a few
/// hundred bytes of each ([`Listed`]), so the page size bounds requests,
/// not memory.
pub(crate) const PAGE: u32 = 500;

/// What the pass needs of a cached Foo.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct CachedFoo {
    pub(crate) uid: String,
    /// Its `spec.deploymentName`: the one Deployment it may adopt.
    pub(crate) deployment_name: String,
    /// The shard labels its Deployment follows.
    pub(crate) followed: FollowedLabels,
}

/// What the pass does with a listed Deployment a cached Foo controls.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Judgement {
    /// Label it ours (and put it in its Foo's shard).
    Adopt(DeploymentPatch),
    /// Leave it alone: its Foo names another Deployment.
    LeaveAlone { foo: ObjectRef<Foo>, deployment: String },
}

/// The adoption pass of one controller run, and whether it has finished.
pub struct Adoption {
    /// Where to look (the watched namespace, or all); `None`: nothing to do.
    deployments: Option<Api<Deployment>>,
    concurrency: usize,
    finished: watch::Sender<bool>,
    /// Deployments left alone, by the Foo that controls them, until its
    /// sync reports them.
    left_alone: Mutex<HashMap<ObjectRef<Foo>, Vec<String>>>,
}

impl Adoption {
    pub fn new(deployments: Api<Deployment>, concurrency: usize) -> Self {
        Adoption {
            deployments: Some(deployments),
            concurrency: concurrency.max(1),
            finished: watch::Sender::new(false),
            left_alone: Mutex::default(),
        }
    }

    /// No pass, finished already: for caches whose contents a test fixes.
    #[cfg(any(test, feature = "test-fixtures"))]
    pub fn none() -> Self {
        Adoption { deployments: None, concurrency: 1, finished: watch::Sender::new(true), left_alone: Mutex::default() }
    }

    /// Resolves once the pass has run (or failed: see [`Adoption::run`]).
    pub(crate) async fn finished(&self) {
        // Err only if the sender is gone, and it lives as long as `self`.
        let _ = self.finished.subscribe().wait_for(|finished| *finished).await;
    }

    /// The Deployments the pass left alone that `foo` controls (under
    /// another name than it gives), each handed out once.
    pub(crate) fn take_left_alone(&self, foo: &ObjectRef<Foo>) -> Vec<String> {
        self.left_alone.lock().remove(foo).unwrap_or_default()
    }

    /// Run the pass; `cached_foo` answers with what the pass needs of a
    /// cached Foo ([`CachedFoo`]), `writable` whether this replica may
    /// still write (leader election). Adopted Deployments are handed to
    /// `adopted` (for the cache) as the API server returned them. A failure
    /// is logged and not fatal: a sync still adopts each Deployment it
    /// meets, at the cost of a create attempt and a read.
    pub(crate) async fn run(
        &self,
        cached_foo: impl Fn(&ObjectRef<Foo>) -> Option<CachedFoo>,
        writable: impl Fn() -> bool,
        adopted: impl Fn(DeploymentView),
    ) {
        if let Some(api) = &self.deployments {
            match self.adopt(api, &cached_foo, &writable, &adopted).await {
                Ok(0) => {}
                Ok(n) => info!(deployments = n, "adopted Deployments made by an earlier controller"),
                Err(e) => warn!(error = %e, "cannot list Deployments to adopt; each Foo's sync will adopt its own"),
            }
        }
        debug!("adoption pass finished; syncs may start");
        self.finished.send_replace(true);
    }

    /// List page after page, acting on each before the next is read.
    async fn adopt(
        &self,
        api: &Api<Deployment>,
        cached_foo: &impl Fn(&ObjectRef<Foo>) -> Option<CachedFoo>,
        writable: &impl Fn() -> bool,
        adopted: &impl Fn(DeploymentView),
    ) -> kube::Result<usize> {
        let (mut count, mut continue_token) = (0, None);
        loop {
            let page = list_page(api, continue_token.take()).await?;
            let mut patches = Vec::new();
            for d in page.items.iter().map(Listed::as_meta) {
                match judge(&d, cached_foo) {
                    Some(Judgement::Adopt(patch)) => patches.extend(d.namespace().map(|ns| (ns, patch))),
                    Some(Judgement::LeaveAlone { foo, deployment }) => self.leave_alone(foo, deployment),
                    None => {}
                }
            }
            count += self.patch_all(api, patches, writable, adopted).await;
            continue_token = page.metadata.continue_.filter(|token| !token.is_empty());
            if continue_token.is_none() || !writable() {
                return Ok(count);
            }
        }
    }

    fn leave_alone(&self, foo: ObjectRef<Foo>, deployment: String) {
        warn!(
            foo = %format!("{}/{}", foo.namespace.as_deref().unwrap_or_default(), foo.name),
            deployment = %deployment,
            "left unadopted a Deployment this Foo controls but no longer names (upstream left it running); \
             delete it when it is no longer needed"
        );
        self.left_alone.lock().entry(foo).or_default().push(deployment);
    }

    /// Send `patches` (namespace, patch), `concurrency` at a time, while
    /// this replica may write; the number that took.
    async fn patch_all(
        &self,
        api: &Api<Deployment>,
        patches: Vec<(String, DeploymentPatch)>,
        writable: &impl Fn() -> bool,
        adopted: &impl Fn(DeploymentView),
    ) -> usize {
        use futures::StreamExt;
        let pp = patch_params();
        futures::stream::iter(patches)
            // No longer leading: the syncs fail on their own checks, and the
            // next leader's pass adopts what is left.
            .take_while(|_| std::future::ready(writable()))
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
            .await
    }
}

/// One page of the candidates, decoded as it streams in
/// ([`crate::client::send_streamed`]): no copy of the body is ever held whole.
async fn list_page(api: &Api<Deployment>, continue_token: Option<String>) -> kube::Result<ListedPage> {
    let lp = ListParams { continue_token, ..ListParams::default().labels(&unmanaged_selector()).limit(PAGE) };
    let request = Request::new(api.resource_url()).list_metadata(&lp).map_err(kube::Error::BuildRequest)?;
    send_streamed(&api.clone().into_client(), request).await
}

/// A page of the candidates, as much of it as the pass reads.
#[derive(Debug, Default, Deserialize)]
struct ListedPage {
    #[serde(default)]
    metadata: ListMeta,
    // An empty list's items come as `null` (Go's nil slice), not `[]`.
    #[serde(default, deserialize_with = "null_as_empty")]
    items: Vec<Listed>,
}

fn null_as_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Listed>, D::Error> {
    Ok(Option::deserialize(d)?.unwrap_or_default())
}

/// What the pass reads of a listed Deployment: serde skips the rest
/// (labels, annotations, managedFields, every ownerReference but the
/// controller's) as it reads, never holding it.
#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct Listed {
    metadata: ListedMeta,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListedMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    #[serde(default, deserialize_with = "crate::api::wire::controller_reference")]
    owner_references: Option<OwnerReference>,
}

impl Listed {
    /// As the rest of the crate reads Deployments' metadata.
    fn as_meta(&self) -> PartialObjectMeta<Deployment> {
        let m = &self.metadata;
        ObjectMeta {
            name: m.name.clone(),
            namespace: m.namespace.clone(),
            uid: m.uid.clone(),
            resource_version: m.resource_version.clone(),
            owner_references: m.owner_references.clone().map(|r| vec![r]),
            ..ObjectMeta::default()
        }
        .into_response_partial()
    }
}

/// What the pass does with `d`, if a cached Foo controls it and it lacks
/// our label: its controller ownerReference names a Foo (by API group and
/// kind) whose uid, as `cached_foo` reports it, is the one referenced. It is
/// adopted if the Foo names it (the patch also puts it in its Foo's shard),
/// left alone if the Foo names another. A Foo deleted and re-created under
/// the same name has another uid and adopts nothing.
pub(crate) fn judge(
    d: &PartialObjectMeta<Deployment>,
    cached_foo: impl Fn(&ObjectRef<Foo>) -> Option<CachedFoo>,
) -> Option<Judgement> {
    if has_managed_label(d) {
        return None;
    }
    let meta: &ObjectMeta = &d.metadata;
    let foo = controlling_foo(d)?;
    let cached = cached_foo(&foo)?;
    if cached.uid != *foo.extra.uid.as_ref()? {
        return None;
    }
    if cached.deployment_name != d.name_any() {
        // The reference's uid and resourceVersion are no part of the key.
        let key = ObjectRef::new(&foo.name).within(foo.namespace.as_deref().unwrap_or_default());
        return Some(Judgement::LeaveAlone { foo: key, deployment: d.name_any() });
    }
    Some(Judgement::Adopt(DeploymentPatch {
        name: d.name_any(),
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
        replicas: None,
        adopt: true,
        relabel: cached.followed,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::constants::{LABEL_MANAGED_BY, LABEL_MANAGED_BY_VALUE};
    use crate::testing::{DeploymentFixture, FooFixture};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::core::PartialObjectMetaExt;

    /// `d` as the pass reads it from a metadata-only list: through the JSON
    /// the API server sends and the pass's own decoding.
    fn listed(d: Deployment) -> PartialObjectMeta<Deployment> {
        let json = serde_json::to_string(&d.metadata.into_response_partial::<Deployment>()).unwrap();
        serde_json::from_str::<Listed>(&json).unwrap().as_meta()
    }

    /// A cache holding `foos`, unsharded, as `cached_foo` reads it.
    fn cached(foos: &[Foo]) -> impl Fn(&ObjectRef<Foo>) -> Option<CachedFoo> + '_ {
        |r| {
            let foo = foos.iter().find(|f| ObjectRef::from_obj(*f) == *r)?;
            Some(CachedFoo {
                uid: foo.uid()?,
                deployment_name: foo.spec.deployment_name.clone(),
                followed: FollowedLabels::new(),
            })
        }
    }

    fn adopted(judgement: Option<Judgement>) -> DeploymentPatch {
        match judgement {
            Some(Judgement::Adopt(patch)) => patch,
            other => panic!("not adopted: {other:?}"),
        }
    }

    #[test]
    fn a_deployment_adopted_by_a_shard_is_put_in_its_foos_shard_in_the_same_patch() {
        let foo = Foo::test("example-foo").label("shard", "a");
        let shard = crate::api::shard::Shard::parse("shard=a").unwrap();
        let in_shard = |_: &ObjectRef<Foo>| {
            let followed = shard.follow(foo.metadata.labels.as_ref());
            Some(CachedFoo { uid: ResourceExt::uid(&foo)?, deployment_name: "example-foo".into(), followed })
        };
        let patch = adopted(judge(&listed(Deployment::made_by_upstream(&foo)), in_shard));
        assert_eq!(
            patch.body()["metadata"]["labels"],
            serde_json::json!({ LABEL_MANAGED_BY: LABEL_MANAGED_BY_VALUE, "shard": "a" })
        );
    }

    #[test]
    fn a_deployment_made_by_upstream_for_a_cached_foo_is_labelled_and_nothing_else() {
        let foo = Foo::test("example-foo");
        let patch = adopted(judge(&listed(Deployment::made_by_upstream(&foo)), cached(&[foo])));
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
    fn a_deployment_its_foo_no_longer_names_is_left_alone_and_reported_against_the_foo() {
        let old = Foo::test("example-foo").deployment("old-name");
        let renamed = old.clone().deployment("new-name");
        assert_eq!(
            judge(&listed(Deployment::made_by_upstream(&old)), cached(std::slice::from_ref(&renamed))),
            Some(Judgement::LeaveAlone { foo: ObjectRef::from_obj(&renamed), deployment: "old-name".into() })
        );
    }

    #[test]
    fn what_a_foo_left_alone_is_reported_once_per_pass() {
        let adoption = Adoption::none();
        let foo = ObjectRef::<Foo>::new("example-foo").within("default");
        adoption.leave_alone(foo.clone(), "old-name".into());
        assert_eq!(adoption.take_left_alone(&foo), vec!["old-name".to_owned()]);
        assert_eq!(adoption.take_left_alone(&foo), Vec::<String>::new(), "handed out once");
    }

    #[test]
    fn already_labelled_deployments_are_left_alone() {
        let foo = Foo::test("example-foo");
        let mut d = Deployment::owned_by(&foo);
        // The list's selector leaves these out; were one listed anyway (a
        // label added since), it is not patched again.
        let labelled = d.metadata.clone().into_response_partial::<Deployment>();
        assert_eq!(judge(&labelled, cached(std::slice::from_ref(&foo))), None);
        d.metadata.labels = None;
        assert!(judge(&listed(d), cached(&[foo])).is_some(), "the same one, unlabelled, is adopted");
    }

    #[test]
    fn a_deployment_of_a_foo_recreated_under_the_same_name_is_not_adopted() {
        let old = Foo::test("example-foo").uid("uid-old");
        let new = Foo::test("example-foo").uid("uid-new");
        assert_eq!(judge(&listed(Deployment::made_by_upstream(&old)), cached(&[new])), None);
    }

    #[test]
    fn a_deployment_whose_foo_is_not_cached_is_not_adopted() {
        let foo = Foo::test("example-foo");
        assert_eq!(judge(&listed(Deployment::made_by_upstream(&foo)), cached(&[])), None);
    }

    #[test]
    fn only_a_controller_reference_to_a_foo_of_our_group_counts() {
        let foo = Foo::test("example-foo");
        let with_owner = |edit: fn(&mut OwnerReference)| {
            let mut d = Deployment::made_by_upstream(&foo);
            edit(&mut d.metadata.owner_references.as_mut().unwrap()[0]);
            listed(d)
        };
        let foos = [foo.clone()];
        assert!(judge(&with_owner(|_| {}), cached(&foos)).is_some(), "the reference itself is fine");
        assert_eq!(judge(&with_owner(|o| o.controller = Some(false)), cached(&foos)), None);
        assert_eq!(judge(&with_owner(|o| o.controller = None), cached(&foos)), None);
        assert_eq!(judge(&with_owner(|o| o.kind = "Bar".into()), cached(&foos)), None);
        assert_eq!(judge(&with_owner(|o| o.api_version = "example.com/v1alpha1".into()), cached(&foos)), None);
        assert_eq!(judge(&listed(Deployment::foreign("example-foo")), cached(&foos)), None);
    }

    #[test]
    fn the_controller_reference_is_found_among_others_and_nothing_else_is_kept() {
        let foo = Foo::test("example-foo");
        let mut d = Deployment::made_by_upstream(&foo);
        let other = |n: usize| OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: format!("cm-{n}"),
            uid: format!("uid-cm-{n}"),
            ..OwnerReference::default()
        };
        let refs = d.metadata.owner_references.as_mut().unwrap();
        refs.insert(0, other(0));
        refs.push(other(1));
        d.metadata.annotations = Some([("big".to_owned(), "x".repeat(100_000))].into());
        d.metadata.finalizers = Some(vec!["example.com/keep".into()]);
        let kept = listed(d);
        assert_eq!(kept.metadata.owner_references.as_ref().map(Vec::len), Some(1));
        assert_eq!(controlling_foo(&kept).map(|r| r.name), Some("example-foo".to_owned()));
        assert_eq!((kept.metadata.annotations, kept.metadata.finalizers), (None, None));
        assert!(judge(&listed(Deployment::made_by_upstream(&foo)), cached(&[foo])).is_some());
    }

    #[test]
    fn a_page_is_read_with_its_continue_token_and_null_references() {
        let page: ListedPage = serde_json::from_value(serde_json::json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": { "continue": "next", "resourceVersion": "9" },
            "items": [
                { "metadata": { "name": "a", "namespace": "ns", "ownerReferences": null } },
                { "metadata": { "name": "b", "namespace": "ns" } },
            ],
        }))
        .unwrap();
        assert_eq!(page.metadata.continue_.as_deref(), Some("next"));
        let names: Vec<_> = page.items.iter().map(|d| d.as_meta().name_any()).collect();
        assert_eq!(names, ["a", "b"]);
    }

    #[test]
    fn an_empty_page_is_read_with_its_items_null() {
        let page: ListedPage = serde_json::from_value(serde_json::json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": { "resourceVersion": "9" },
            "items": null,
        }))
        .unwrap();
        assert!(page.items.is_empty());
        assert_eq!(page.metadata.continue_, None);
    }
}
