//! What a sync of one Foo must do — upstream's `syncHandler` as a pure
//! function. Given the Foo, the Deployment of its `spec.deploymentName` as
//! the API server returned it (or none) and the Deployments labelled for
//! this Foo, [`decide`] returns a [`Plan`]: which writes to make, which
//! events to emit and how the sync ends. [`crate::reconcile::sync`] carries it out and
//! does nothing else, so every branch is tested here without a server.

use kube::runtime::events::EventType;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{Resource, ResourceExt};

use crate::api::constants::*;
use crate::api::deployment::{desired_deployment, is_controlled_by};
use crate::api::deployment_view::DeploymentView;
use crate::api::foo::{Foo, FooStatus};
use crate::api::shard::{FollowedLabels, Shard};

/// The one write the sync makes to the Deployment named by the Foo.
#[derive(Clone, Debug, PartialEq)]
pub enum DeploymentAction {
    /// It is missing: create it.
    Create(Box<Deployment>),
    /// It is ours but its replicas differ from `spec.replicas`, or it lacks
    /// our label: patch what differs.
    Patch(DeploymentPatch),
    /// It is ours and in sync, or it cannot be touched: no write.
    Keep,
}

/// A merge patch of a Deployment the Foo controls, made only if the object is
/// still the one checked for ownership (its uid and `resource_version`), so a
/// Deployment that changed hands meanwhile is not touched. It never touches
/// `spec.template`, so it never rolls out new pods.
#[derive(Clone, Debug, PartialEq)]
pub struct DeploymentPatch {
    pub name: String,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    /// `spec.replicas` to set, when the Foo asks for others.
    pub replicas: Option<i32>,
    /// Add our managed-by label: the Deployment was made by upstream's
    /// controller (or lost the label), so our label-filtered watch cannot
    /// see it. A metadata-only change: no rollout, no pod replaced.
    pub adopt: bool,
    /// The shard labels to set (`None`: remove) so that the Deployment
    /// follows its Foo into the Foo's shard ([`crate::api::shard`]); metadata
    /// only, as `adopt`.
    pub relabel: FollowedLabels,
}

impl DeploymentPatch {
    /// The JSON merge patch: the preconditions, and only the fields that change.
    pub fn body(&self) -> serde_json::Value {
        let mut body = serde_json::json!({
            "metadata": { "uid": self.uid, "resourceVersion": self.resource_version },
        });
        let mut labels = serde_json::Map::new();
        if self.adopt {
            labels.insert(LABEL_MANAGED_BY.to_owned(), LABEL_MANAGED_BY_VALUE.into());
        }
        for (key, value) in &self.relabel {
            labels.insert(key.clone(), value.clone().into());
        }
        if !labels.is_empty() {
            body["metadata"]["labels"] = labels.into();
        }
        if let Some(replicas) = self.replicas {
            body["spec"] = serde_json::json!({ "replicas": replicas });
        }
        body
    }
}

/// A Deployment this Foo controls under a name it no longer asks for.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct StaleDeployment {
    pub(crate) name: String,
    /// Delete precondition: only this very object, never a successor that
    /// took its name.
    pub(crate) uid: Option<String>,
}

/// An Event to publish about the Foo.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct EventSpec {
    pub(crate) type_: EventType,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
}

/// How the sync ends.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Outcome {
    /// Done; look again on the next change.
    Synced,
    /// The Foo names a Deployment another owner controls: fail the sync so
    /// it is retried with backoff, as upstream does.
    ResourceExists { deployment: String },
    /// The spec cannot be acted on; retrying would loop, so wait for the Foo
    /// to change.
    InvalidSpec,
}

/// Everything one sync of a Foo must do.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub deployment: DeploymentAction,
    pub(crate) delete: Vec<StaleDeployment>,
    /// The status to write, `None` when the Foo's status is already right.
    pub status: Option<FooStatus>,
    pub(crate) events: Vec<EventSpec>,
    pub(crate) outcome: Outcome,
}

impl Plan {
    /// True when the plan writes anything to the API (events aside).
    pub(crate) fn writes(&self) -> bool {
        self.deployment != DeploymentAction::Keep || !self.delete.is_empty() || self.status.is_some()
    }
}

/// Decide what a sync of `foo` does.
///
/// - `current`: the Deployment named `spec.deploymentName` in the Foo's
///   namespace, as cached (or as the API server returned it), or `None` if
///   it is missing.
/// - `owned`: cached Deployments of the Foo's namespace; those the Foo
///   controls under another name are deleted once the current one is ours.
/// - `followed`: the labels of the Foo its Deployment carries too, so it
///   stays in the Foo's shard ([`crate::api::shard::Shard::follow`]).
/// - `now`: the time stamped on a condition that changes status.
pub fn decide(
    foo: &Foo,
    current: Option<&DeploymentView>,
    owned: &[Arc<DeploymentView>],
    followed: &FollowedLabels,
    now: &Time,
) -> Plan {
    let name = &foo.spec.deployment_name;
    let Some(desired) = desired_deployment(foo, followed) else {
        // Only an older CRD without validation admits this. Upstream logs
        // and drops the item; we also tell the user, on the Foo itself.
        return refusal(foo, REASON_INVALID_SPEC, MESSAGE_EMPTY_DEPLOYMENT_NAME.to_owned(), Outcome::InvalidSpec, now);
    };
    let (deployment, available, cond) = match current {
        None => {
            // The status the Deployment will show once created (none of its
            // replicas available yet), so the syncs its creation triggers
            // find nothing to write.
            let want = foo.spec.desired_replicas();
            (DeploymentAction::Create(Box::new(desired)), 0, availability(name, 0, want))
        }
        Some(d) if !is_controlled_by(d, foo) => {
            // Never modify what we do not own: report it and fail the sync.
            let outcome = Outcome::ResourceExists { deployment: name.clone() };
            return refusal(foo, REASON_RESOURCE_EXISTS, message_resource_exists(name), outcome, now);
        }
        Some(d) => {
            let want = foo.spec.replicas.unwrap_or_else(|| d.spec_replicas());
            let available = d.available_replicas();
            (patch(foo, d, followed), available, availability(name, available, want))
        }
    };
    let mut plan = Plan {
        deployment,
        delete: stale_deployments(foo, owned),
        status: status_with(foo, available, cond, now),
        events: vec![],
        outcome: Outcome::Synced,
    };
    for stale in &plan.delete {
        plan.events.push(normal(REASON_DELETED_OLD, message_deleted_old(&stale.name)));
    }
    // Beyond upstream: `Synced` only when the sync changed something, not
    // on every sync (upstream's also come every 30 s, from its resync).
    if plan.writes() {
        plan.events.push(normal(REASON_SYNCED, MESSAGE_SYNCED.to_owned()));
    }
    plan
}

/// A Foo the controller cannot act on: say why on the Foo (`Ready=False`,
/// and a Warning event when that is news) and write nothing else. Upstream
/// repeats the event on every retry; the condition already says it.
fn refusal(foo: &Foo, reason: &'static str, message: String, outcome: Outcome, now: &Time) -> Plan {
    let status = status_with(foo, 0, ready(false, reason, message.clone()), now);
    let events = if status.is_some() { vec![warning(reason, message)] } else { vec![] };
    Plan { deployment: DeploymentAction::Keep, delete: vec![], status, events, outcome }
}

/// Patch our Deployment `d`: its replicas when the Foo asks for others, our
/// label when it lacks it (made by upstream's controller, or removed by
/// someone), the shard labels when the Foo moved to another shard — all in
/// one request.
fn patch(foo: &Foo, d: &DeploymentView, followed: &FollowedLabels) -> DeploymentAction {
    let replicas = foo.spec.replicas.filter(|want| *want != d.spec_replicas());
    let adopt = !d.is_managed();
    let relabel = d.relabelling(followed);
    if replicas.is_none() && !adopt && relabel.is_empty() {
        return DeploymentAction::Keep;
    }
    DeploymentAction::Patch(DeploymentPatch {
        name: foo.spec.deployment_name.clone(),
        uid: d.uid(),
        resource_version: d.resource_version(),
        replicas,
        adopt,
        relabel,
    })
}

/// Whether `existing`, a Deployment this Foo controls that a create found
/// although the cache lacked it, carries other shard labels than our copy
/// of the Foo asks for. Either the Foo moved into this shard (relabel the
/// Deployment) or it left, and its new shard relabelled the Deployment
/// before our watch told us (leave it): only the Foo read afresh tells
/// which ([`left_the_shard`]).
pub(crate) fn shard_move_to_confirm(foo: &Foo, existing: &DeploymentView, followed: &FollowedLabels) -> bool {
    is_controlled_by(existing, foo) && !existing.relabelling(followed).is_empty()
}

/// With the Foo read afresh (`None`: gone): whether it left `shard` since
/// our copy (`foo`, following `followed`) — gone, replaced by another of
/// its name, or following other labels — so that its Deployment is the new
/// shard's, not ours to move back. A move *into* this shard reads the same
/// labels twice.
pub(crate) fn left_the_shard(foo: &Foo, fresh: Option<&Foo>, shard: &Shard, followed: &FollowedLabels) -> bool {
    fresh.is_none_or(|fresh| fresh.uid() != foo.uid() || shard.follow(fresh.metadata.labels.as_ref()) != *followed)
}

/// The Deployments this Foo controls under a name it no longer asks for.
fn stale_deployments(foo: &Foo, owned: &[Arc<DeploymentView>]) -> Vec<StaleDeployment> {
    owned
        .iter()
        .map(|d| &**d)
        .filter(|d| {
            d.name_any() != foo.spec.deployment_name
                && d.meta().deletion_timestamp.is_none()
                && is_controlled_by(*d, foo)
        })
        .map(|d| StaleDeployment { name: d.name_any(), uid: d.uid() })
        .collect()
}

/// `Ready` from the Deployment's available replicas.
fn availability(deployment: &str, available: i32, want: i32) -> Condition {
    let message = format!("Deployment {deployment:?} has {available}/{want} replicas available");
    if available >= want { ready(true, REASON_AVAILABLE, message) } else { ready(false, REASON_PROGRESSING, message) }
}

/// A `Ready` condition without its bookkeeping fields; [`status_with`] fills
/// in the generation and the transition time.
fn ready(ok: bool, reason: &str, message: impl Into<String>) -> Condition {
    Condition {
        type_: CONDITION_READY.to_owned(),
        status: if ok { "True" } else { "False" }.to_owned(),
        reason: reason.to_owned(),
        message: message.into(),
        observed_generation: None,
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    }
}

/// The status the Foo should have, or `None` if it already has it — the
/// check that spares upstream's write on every sync.
fn status_with(foo: &Foo, available: i32, mut cond: Condition, now: &Time) -> Option<FooStatus> {
    let current = foo.status.clone().unwrap_or_default();
    let generation = foo.metadata.generation;
    cond.observed_generation = generation;
    // API conventions: lastTransitionTime moves only when status flips.
    cond.last_transition_time = match current.conditions.iter().find(|c| c.type_ == cond.type_) {
        Some(old) if old.status == cond.status => old.last_transition_time.clone(),
        _ => now.clone(),
    };
    // Replace in place so other tools' conditions keep their order.
    let mut conditions = current.conditions.clone();
    match conditions.iter_mut().find(|c| c.type_ == cond.type_) {
        Some(slot) => *slot = cond,
        None => conditions.push(cond),
    }
    let want = FooStatus { available_replicas: available, observed_generation: generation, conditions };
    (foo.status.as_ref() != Some(&want)).then_some(want)
}

/// The Warning a Foo's sync sends for a Deployment the adoption pass left
/// alone ([`crate::reconcile::adoption`]).
pub(crate) fn not_adopted(deployment_name: &str) -> EventSpec {
    warning(REASON_NOT_ADOPTED, message_not_adopted(deployment_name))
}

fn warning(reason: &'static str, message: String) -> EventSpec {
    EventSpec { type_: EventType::Warning, reason, message }
}

fn normal(reason: &'static str, message: String) -> EventSpec {
    EventSpec { type_: EventType::Normal, reason, message }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::shard::{Shard, UNSHARDED};
    use crate::testing::{DeploymentFixture, FooFixture};
    use k8s_openapi::jiff::Timestamp;

    fn now() -> Time {
        Time(Timestamp::from_second(1_800_000_000).unwrap())
    }

    /// Run a plan's status back into the Foo, as the API server would.
    fn with_status(mut foo: Foo, plan: &Plan) -> Foo {
        foo.status = plan.status.clone();
        foo
    }

    fn reasons(plan: &Plan) -> Vec<&'static str> {
        plan.events.iter().map(|e| e.reason).collect()
    }

    #[test]
    fn creates_deployment_when_missing() {
        let foo = Foo::test("example-foo").replicas(1);
        let plan = decide(&foo, None, &[], UNSHARDED, &now());
        let DeploymentAction::Create(d) = &plan.deployment else {
            panic!("expected a create, got {:?}", plan.deployment)
        };
        assert_eq!(**d, desired_deployment(&foo, UNSHARDED).unwrap());
        let status = plan.status.as_ref().expect("status is written after a create");
        assert_eq!(status.available_replicas, 0);
        assert_eq!(status.observed_generation, Some(1));
        assert_eq!(status.conditions[0].status, "False");
        assert_eq!(reasons(&plan), vec![REASON_SYNCED]);
        assert_eq!(plan.outcome, Outcome::Synced);
    }

    #[test]
    fn the_status_written_at_creation_is_the_one_the_new_deployment_shows() {
        // The Deployment's creation (and the Deployment controller's status
        // updates until a pod is available) must not cost a second write.
        let foo = Foo::test("example-foo").replicas(2);
        let created = decide(&foo, None, &[], UNSHARDED, &now());
        let foo = with_status(foo, &created);
        let d = DeploymentView::owned_by(&foo).replicas(2).available(0);
        let next = decide(&foo, Some(&d), &[Arc::new(d.clone())], UNSHARDED, &now());
        assert!(!next.writes(), "{next:?}");
        assert!(next.events.is_empty());
    }

    #[test]
    fn does_nothing_when_in_sync() {
        let foo = Foo::test("example-foo").replicas(2);
        let d = DeploymentView::owned_by(&foo).replicas(2).available(2);
        // First sync records the status...
        let first = decide(&foo, Some(&d), &[Arc::new(d.clone())], UNSHARDED, &now());
        assert_eq!(first.deployment, DeploymentAction::Keep);
        assert!(first.status.is_some());
        // ...and the next one, with that status in place, writes nothing and
        // emits nothing, even at a later time.
        let foo = with_status(foo, &first);
        let later = Time(Timestamp::from_second(1_800_000_600).unwrap());
        let plan = decide(&foo, Some(&d), &[Arc::new(d.clone())], UNSHARDED, &later);
        assert!(!plan.writes(), "in-sync Foo must not write: {plan:?}");
        assert!(plan.events.is_empty(), "in-sync Foo must not emit events: {plan:?}");
        assert_eq!(plan.outcome, Outcome::Synced);
    }

    #[test]
    fn a_deployment_scaled_by_hand_under_a_current_status_is_put_back_with_a_synced_event() {
        let foo = Foo::test("example-foo").replicas(2);
        let d = DeploymentView::owned_by(&foo).replicas(2).available(2);
        let foo = with_status(foo.clone(), &decide(&foo, Some(&d), &[], UNSHARDED, &now()));
        // Scaled to 5 by hand, still 2 available: the Foo's status stays
        // right, only the Deployment needs a write.
        let scaled = DeploymentView::owned_by(&foo).replicas(5).available(2);
        let plan = decide(&foo, Some(&scaled), &[], UNSHARDED, &now());
        assert!(matches!(plan.deployment, DeploymentAction::Patch(_)), "{plan:?}");
        assert_eq!(plan.status, None);
        assert!(plan.writes());
        assert_eq!(reasons(&plan), vec![REASON_SYNCED]);
    }

    #[test]
    fn updates_deployment_replicas_when_they_differ() {
        let foo = Foo::test("example-foo").replicas(3);
        let d = DeploymentView::owned_by(&foo).replicas(1).available(1);
        let plan = decide(&foo, Some(&d), &[], UNSHARDED, &now());
        assert_eq!(
            plan.deployment,
            DeploymentAction::Patch(DeploymentPatch {
                name: "example-foo".into(),
                uid: Some("uid-deploy-example-foo".into()),
                resource_version: Some("200".into()),
                replicas: Some(3),
                adopt: false,
                relabel: Default::default(),
            })
        );
        assert_eq!(reasons(&plan), vec![REASON_SYNCED]);
        let status = plan.status.unwrap();
        assert_eq!(status.available_replicas, 1);
        assert_eq!(status.conditions[0].status, "False", "1/3 available is not ready");
    }

    /// The merge patch that sets `labels` on example-foo's Deployment and
    /// nothing else, conditional on the object checked.
    fn label_patch(labels: serde_json::Value) -> serde_json::Value {
        serde_json::json!({ "metadata": {
            "uid": "uid-deploy-example-foo",
            "resourceVersion": "200",
            "labels": labels,
        }})
    }

    /// A Deployment of `foo` as the shard `labels` made it.
    fn in_shard(foo: &Foo, labels: &[(&str, &str)]) -> DeploymentView {
        let mut d = DeploymentView::owned_by(foo).replicas(1).available(1);
        let map = d.metadata.labels.get_or_insert_default();
        map.extend(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        d
    }

    #[test]
    fn a_sharded_foos_deployment_is_created_with_the_foos_shard_label() {
        let shard = Shard::parse("shard=a").unwrap();
        let foo = Foo::test("example-foo").label("shard", "a").label("team", "x");
        let plan = decide(&foo, None, &[], &shard.follow(foo.metadata.labels.as_ref()), &now());
        let DeploymentAction::Create(d) = &plan.deployment else { panic!("expected a create, got {plan:?}") };
        let labels = d.metadata.labels.as_ref().unwrap();
        assert_eq!(labels.get("shard").map(String::as_str), Some("a"));
        assert!(!labels.contains_key("team"), "only the labels the selector names");
        let pods = d.spec.as_ref().unwrap().template.metadata.as_ref().unwrap().labels.as_ref().unwrap();
        assert!(!pods.contains_key("shard"), "not on the pods: moving shards never rolls them");
    }

    #[test]
    fn a_foo_moved_to_another_shard_has_its_deployment_relabelled_and_nothing_else() {
        let shard = Shard::parse("shard=b").unwrap();
        let foo = Foo::test("example-foo").label("shard", "b");
        let d = in_shard(&foo, &[("shard", "a")]);
        let plan = decide(&foo, Some(&d), &[], &shard.follow(foo.metadata.labels.as_ref()), &now());
        let DeploymentAction::Patch(patch) = &plan.deployment else { panic!("expected a patch, got {plan:?}") };
        let labels = serde_json::json!({ "shard": "b" });
        assert_eq!(patch.body(), label_patch(labels), "metadata only, conditional on the object checked");
        let moved = in_shard(&foo, &[("shard", "b")]);
        let again = decide(&foo, Some(&moved), &[], &shard.follow(foo.metadata.labels.as_ref()), &now());
        assert_eq!(again.deployment, DeploymentAction::Keep, "in its shard: nothing to write");
    }

    #[test]
    fn a_deployment_found_in_another_shard_than_our_copy_of_its_foo_is_confirmed_before_it_is_moved() {
        let shard = Shard::parse("shard=b").unwrap();
        let foo = Foo::test("example-foo").label("shard", "b");
        let followed = shard.follow(foo.metadata.labels.as_ref());
        assert!(shard_move_to_confirm(&foo, &in_shard(&foo, &[("shard", "a")]), &followed));
        assert!(!shard_move_to_confirm(&foo, &in_shard(&foo, &[("shard", "b")]), &followed), "in our shard already");
        let theirs = DeploymentView::foreign("example-foo");
        assert!(!shard_move_to_confirm(&foo, &theirs, &followed), "not ours: never moved");
    }

    #[test]
    fn a_foo_read_afresh_with_other_labels_or_gone_or_replaced_left_the_shard_and_one_with_ours_did_not() {
        let shard = Shard::parse("shard=b").unwrap();
        let ours = Foo::test("example-foo").label("shard", "b");
        let followed = shard.follow(ours.metadata.labels.as_ref());
        let moved_on = Foo::test("example-foo").label("shard", "c");
        assert!(left_the_shard(&ours, Some(&moved_on), &shard, &followed), "its labels moved on");
        assert!(left_the_shard(&ours, None, &shard, &followed), "deleted");
        let replaced = Foo::test("example-foo").label("shard", "b").uid("another");
        assert!(left_the_shard(&ours, Some(&replaced), &shard, &followed), "another Foo of that name");
        assert!(!left_the_shard(&ours, Some(&ours.clone()), &shard, &followed), "moved into this shard: ours to move");
    }

    #[test]
    fn a_foo_moved_to_the_shard_of_unlabelled_foos_has_the_label_removed_from_its_deployment() {
        let shard = Shard::parse("!shard").unwrap();
        let foo = Foo::test("example-foo");
        let d = in_shard(&foo, &[("shard", "a")]);
        let plan = decide(&foo, Some(&d), &[], &shard.follow(foo.metadata.labels.as_ref()), &now());
        let DeploymentAction::Patch(patch) = &plan.deployment else { panic!("expected a patch, got {plan:?}") };
        assert_eq!(patch.body()["metadata"]["labels"], serde_json::json!({ "shard": null }));
        assert_eq!(patch.replicas, None);
    }

    #[test]
    fn a_deployment_made_by_upstream_is_adopted_with_a_label_only_patch() {
        let foo = Foo::test("example-foo").replicas(2);
        let d = DeploymentView::made_by_upstream(&foo).replicas(2).available(2);
        let plan = decide(&foo, Some(&d), &[], UNSHARDED, &now());
        let DeploymentAction::Patch(patch) = &plan.deployment else { panic!("expected a patch, got {plan:?}") };
        let labels = serde_json::json!({ "app.kubernetes.io/managed-by": "sample-controller" });
        assert_eq!(patch.body(), label_patch(labels), "metadata only: no spec, so no rollout");
        assert_eq!(plan.outcome, Outcome::Synced);
        assert_eq!(plan.status.unwrap().conditions[0].status, "True");
    }

    #[test]
    fn adopting_and_scaling_an_upstream_deployment_is_one_patch() {
        let foo = Foo::test("example-foo").replicas(3);
        let d = DeploymentView::made_by_upstream(&foo).replicas(1);
        let DeploymentAction::Patch(patch) = decide(&foo, Some(&d), &[], UNSHARDED, &now()).deployment else {
            panic!()
        };
        assert_eq!(patch.body()["spec"], serde_json::json!({ "replicas": 3 }));
        assert_eq!(patch.body()["metadata"]["labels"][LABEL_MANAGED_BY], LABEL_MANAGED_BY_VALUE);
    }

    #[test]
    fn an_unlabelled_deployment_of_another_owner_is_never_adopted() {
        let foo = Foo::test("example-foo").replicas(1);
        let someone_elses = DeploymentView::made_by_upstream(&foo.clone().uid("uid-predecessor"));
        let plan = decide(&foo, Some(&someone_elses), &[], UNSHARDED, &now());
        assert_eq!(plan.deployment, DeploymentAction::Keep);
        assert_eq!(plan.outcome, Outcome::ResourceExists { deployment: "example-foo".into() });
    }

    #[test]
    fn unset_replicas_leave_the_deployment_replicas_alone() {
        let foo = Foo::test("example-foo").unset_replicas();
        let d = DeploymentView::owned_by(&foo).replicas(4).available(4);
        let plan = decide(&foo, Some(&d), &[], UNSHARDED, &now());
        assert_eq!(plan.deployment, DeploymentAction::Keep);
        assert_eq!(plan.status.unwrap().conditions[0].status, "True");
    }

    #[test]
    fn not_controlled_by_us_is_refused_without_touching_it() {
        let foo = Foo::test("example-foo").replicas(3);
        let d = DeploymentView::foreign("example-foo").replicas(1);
        let plan = decide(&foo, Some(&d), &[], UNSHARDED, &now());
        assert_eq!(plan.deployment, DeploymentAction::Keep);
        assert!(plan.delete.is_empty());
        assert_eq!(plan.events.len(), 1);
        assert_eq!(plan.events[0].type_, EventType::Warning);
        assert_eq!(plan.events[0].reason, "ErrResourceExists");
        assert_eq!(plan.events[0].message, r#"Resource "example-foo" already exists and is not managed by Foo"#);
        assert_eq!(plan.outcome, Outcome::ResourceExists { deployment: "example-foo".into() });
        let status = plan.status.unwrap();
        assert_eq!(status.conditions[0].reason, "ErrResourceExists");
    }

    #[test]
    fn a_deployment_of_a_previous_foo_with_the_same_name_is_not_ours() {
        let old = Foo::test("example-foo").replicas(1);
        let d = DeploymentView::owned_by(&old).replicas(1).available(1);
        let mut new = old.clone();
        new.metadata.uid = Some("uid-recreated".into());
        let plan = decide(&new, Some(&d), &[Arc::new(d.clone())], UNSHARDED, &now());
        assert_eq!(plan.outcome, Outcome::ResourceExists { deployment: "example-foo".into() });
        assert!(plan.delete.is_empty());
    }

    #[test]
    fn status_follows_the_deployment_available_replicas() {
        let foo = Foo::test("example-foo").replicas(2);
        let d = DeploymentView::owned_by(&foo).replicas(2).available(0);
        let first = decide(&foo, Some(&d), &[], UNSHARDED, &now());
        let foo = with_status(foo, &first);
        let ready = DeploymentView::owned_by(&foo).replicas(2).available(2);
        let plan = decide(&foo, Some(&ready), &[], UNSHARDED, &now());
        assert_eq!(plan.deployment, DeploymentAction::Keep);
        let status = plan.status.as_ref().unwrap();
        assert_eq!(status.available_replicas, 2);
        assert_eq!(status.conditions[0].status, "True");
        assert_eq!(status.conditions[0].reason, "Available");
        assert_eq!(reasons(&plan), vec![REASON_SYNCED]);
    }

    #[test]
    fn a_new_generation_is_recorded_in_status() {
        let foo = Foo::test("example-foo").replicas(2);
        let d = DeploymentView::owned_by(&foo).replicas(2).available(2);
        let mut foo = with_status(foo.clone(), &decide(&foo, Some(&d), &[], UNSHARDED, &now()));
        foo.metadata.generation = Some(2);
        let plan = decide(&foo, Some(&d), &[], UNSHARDED, &now());
        let status = plan.status.unwrap();
        assert_eq!(status.observed_generation, Some(2));
        assert_eq!(status.conditions[0].observed_generation, Some(2));
    }

    #[test]
    fn condition_transition_time_moves_only_when_its_status_flips() {
        let foo = Foo::test("example-foo").replicas(2);
        let t0 = now();
        let t1 = Time(Timestamp::from_second(1_800_000_100).unwrap());
        let t2 = Time(Timestamp::from_second(1_800_000_200).unwrap());
        let foo = with_status(
            foo.clone(),
            &decide(&foo, Some(&DeploymentView::owned_by(&foo).replicas(2).available(0)), &[], UNSHARDED, &t0),
        );
        // 0 -> 1 available: still False, time kept.
        let plan = decide(&foo, Some(&DeploymentView::owned_by(&foo).replicas(2).available(1)), &[], UNSHARDED, &t1);
        let foo = with_status(foo, &plan);
        assert_eq!(foo.status.as_ref().unwrap().conditions[0].last_transition_time, t0);
        // 1 -> 2 available: flips to True, time moves.
        let plan = decide(&foo, Some(&DeploymentView::owned_by(&foo).replicas(2).available(2)), &[], UNSHARDED, &t2);
        assert_eq!(plan.status.unwrap().conditions[0].last_transition_time, t2);
    }

    #[test]
    fn other_conditions_are_kept_in_place() {
        let mut foo = Foo::test("example-foo").replicas(1);
        let d = DeploymentView::owned_by(&foo).replicas(1).available(1);
        let mut other = ready(true, "X", "set by another tool");
        other.type_ = "Audited".into();
        foo.status = Some(FooStatus { conditions: vec![other.clone()], ..Default::default() });
        let status = decide(&foo, Some(&d), &[], UNSHARDED, &now()).status.unwrap();
        assert_eq!(status.conditions.len(), 2);
        assert_eq!(status.conditions[0], other);
        assert_eq!(status.conditions[1].type_, "Ready");
    }

    #[test]
    fn old_deployment_is_deleted_after_deployment_name_changes() {
        let before = Foo::test("example-foo").deployment("old-name").replicas(1);
        let old = DeploymentView::owned_by(&before).replicas(1).available(1);
        let mut after = before.clone();
        after.spec.deployment_name = "new-name".into();
        after.metadata.generation = Some(2);
        // The new one does not exist yet: create it and drop the old one.
        let plan = decide(&after, None, &[Arc::new(old.clone())], UNSHARDED, &now());
        assert!(matches!(plan.deployment, DeploymentAction::Create(_)));
        assert_eq!(plan.delete, vec![StaleDeployment { name: "old-name".into(), uid: old.metadata.uid.clone() }]);
        assert_eq!(reasons(&plan), vec![REASON_DELETED_OLD, REASON_SYNCED]);
    }

    #[test]
    fn old_deployment_is_kept_while_the_new_name_is_taken_by_someone_else() {
        let before = Foo::test("example-foo").deployment("old-name").replicas(1);
        let old = DeploymentView::owned_by(&before).replicas(1).available(1);
        let mut after = before.clone();
        after.spec.deployment_name = "taken".into();
        let plan =
            decide(&after, Some(&DeploymentView::foreign("taken").replicas(1)), &[Arc::new(old)], UNSHARDED, &now());
        assert!(plan.delete.is_empty(), "keep serving until the new Deployment is ours");
        assert_eq!(plan.outcome, Outcome::ResourceExists { deployment: "taken".into() });
    }

    #[test]
    fn labelled_deployments_we_do_not_control_are_never_deleted() {
        let foo_ = Foo::test("example-foo").replicas(1);
        let current = DeploymentView::owned_by(&foo_).replicas(1).available(1);
        // Same labels, another controller: e.g. copied by hand.
        let mut lookalike =
            DeploymentView::owned_by(&Foo::test("example-foo").deployment("copy").replicas(1)).replicas(1).available(1);
        lookalike.metadata.owner_references.as_mut().unwrap()[0].uid = "uid-someone-else".into();
        let mut terminating = DeploymentView::owned_by(&Foo::test("example-foo").deployment("going").replicas(1))
            .replicas(1)
            .available(1);
        terminating.metadata.deletion_timestamp = Some(now());
        let plan =
            decide(&foo_, Some(&current), &[current.clone(), lookalike, terminating].map(Arc::new), UNSHARDED, &now());
        assert!(plan.delete.is_empty(), "{:?}", plan.delete);
    }

    #[test]
    fn empty_deployment_name_warns_and_waits_for_a_change() {
        let foo = Foo::test("example-foo").deployment("").replicas(1);
        let plan = decide(&foo, None, &[], UNSHARDED, &now());
        assert_eq!(plan.deployment, DeploymentAction::Keep);
        assert_eq!(plan.outcome, Outcome::InvalidSpec);
        assert_eq!(plan.events.len(), 1);
        assert_eq!(plan.events[0].type_, EventType::Warning);
        assert_eq!(plan.events[0].reason, REASON_INVALID_SPEC);
        assert_eq!(plan.status.as_ref().unwrap().conditions[0].reason, REASON_INVALID_SPEC);
        // The next sync neither writes the status again nor repeats the event.
        let foo = with_status(foo, &plan);
        let again = decide(&foo, None, &[], UNSHARDED, &now());
        assert!(again.status.is_none() && again.events.is_empty(), "{again:?}");
    }
}

/// Properties of [`decide`] over arbitrary Foos and arbitrary observed
/// Deployments: it never panics, never plans a write to a Deployment the Foo
/// does not control, and a second decision over the outcome of the first
/// plans nothing.
#[cfg(test)]
mod properties {
    use super::*;
    use crate::api::deployment_view::{ViewSpec, ViewStatus};
    use crate::api::shard::UNSHARDED;
    use crate::testing::FooFixture;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
    use k8s_openapi::jiff::Timestamp;
    use proptest::prelude::*;

    /// Whose a Deployment is.
    #[derive(Clone, Copy, Debug)]
    enum Owner {
        Nobody,
        ThisFoo,
        /// A Foo of the same name, deleted and re-created (another uid).
        Predecessor,
        /// This Foo, but as a non-controller owner.
        ThisFooNotController,
    }

    fn owner() -> impl Strategy<Value = Owner> {
        prop_oneof![
            Just(Owner::Nobody),
            Just(Owner::ThisFoo),
            Just(Owner::Predecessor),
            Just(Owner::ThisFooNotController)
        ]
    }

    fn arb_foo() -> impl Strategy<Value = Foo> {
        ("[a-c]{1,2}", prop_oneof![Just(String::new()), "[a-c]{1,2}"], proptest::option::of(1..=10i32), 1..4i64)
            .prop_map(|(name, deployment, replicas, generation)| {
                let mut f = Foo::test(&name).deployment(&deployment);
                f.spec.replicas = replicas;
                f.metadata.generation = Some(generation);
                f
            })
    }

    fn deployment(
        foo: &Foo,
        name: &str,
        owner: Owner,
        replicas: i32,
        available: i32,
        terminating: bool,
        labelled: bool,
    ) -> DeploymentView {
        let reference = |uid: &str, controller| OwnerReference {
            api_version: "samplecontroller.k8s.io/v1alpha1".into(),
            kind: "Foo".into(),
            name: foo.name_any(),
            uid: uid.into(),
            controller: Some(controller),
            block_owner_deletion: Some(true),
        };
        let this = foo.uid().unwrap();
        let owners = match owner {
            Owner::Nobody => None,
            Owner::ThisFoo => Some(vec![reference(&this, true)]),
            Owner::Predecessor => Some(vec![reference("uid-predecessor", true)]),
            Owner::ThisFooNotController => Some(vec![reference(&this, false)]),
        };
        DeploymentView {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(format!("uid-deploy-{name}")),
                resource_version: Some("7".into()),
                owner_references: owners,
                labels: labelled.then(|| [(LABEL_MANAGED_BY.to_owned(), LABEL_MANAGED_BY_VALUE.to_owned())].into()),
                deletion_timestamp: terminating.then_some(Time(Timestamp::UNIX_EPOCH)),
                ..ObjectMeta::default()
            },
            spec: Some(ViewSpec { replicas: Some(replicas) }),
            status: Some(ViewStatus { available_replicas: Some(available) }),
            managed: false,
            shard_labels: None,
        }
    }

    /// A Foo, the Deployment of its `spec.deploymentName` (maybe none, maybe
    /// without our label: made by upstream), and other Deployments of its
    /// namespace (labelled: the cache holds no others).
    fn world() -> impl Strategy<Value = (Foo, Option<DeploymentView>, Vec<DeploymentView>)> {
        let observed = (owner(), 0..12i32, 0..12i32, any::<bool>());
        let others = proptest::collection::vec(("[a-c]{1,2}", owner(), 0..12i32, any::<bool>()), 0..4);
        (arb_foo(), proptest::option::of(observed), others).prop_map(|(foo, observed, others)| {
            let name = foo.spec.deployment_name.clone();
            let current = observed.filter(|_| !name.is_empty()).map(|(owner, replicas, available, labelled)| {
                deployment(&foo, &name, owner, replicas, available, false, labelled)
            });
            let mut names = std::collections::BTreeSet::from([name.clone()]);
            let others = others
                .into_iter()
                .filter(|(n, ..)| names.insert(n.clone())) // unique names, as in a namespace
                .map(|(n, owner, replicas, terminating)| deployment(&foo, &n, owner, replicas, 0, terminating, true))
                .collect();
            (foo, current, others)
        })
    }

    /// The cluster after `plan` was carried out: the API server's view.
    fn carry_out(
        foo: &Foo,
        current: Option<&DeploymentView>,
        owned: &[Arc<DeploymentView>],
        plan: &Plan,
    ) -> (Foo, Option<DeploymentView>, Vec<Arc<DeploymentView>>) {
        let mut foo = foo.clone();
        if plan.status.is_some() {
            foo.status = plan.status.clone();
        }
        let current = match &plan.deployment {
            DeploymentAction::Create(d) => {
                let mut created = DeploymentView::from((**d).clone());
                created.metadata.uid = Some("uid-created".into());
                created.metadata.resource_version = Some("8".into());
                let spec = created.spec.get_or_insert_with(Default::default);
                spec.replicas = spec.replicas.or(Some(1)); // the API server's default
                created.status = Some(ViewStatus::default());
                Some(created)
            }
            DeploymentAction::Patch(p) => current.cloned().map(|mut d| {
                if let Some(replicas) = p.replicas {
                    d.spec.as_mut().unwrap().replicas = Some(replicas);
                }
                if p.adopt {
                    d.metadata
                        .labels
                        .get_or_insert_with(Default::default)
                        .insert(LABEL_MANAGED_BY.into(), LABEL_MANAGED_BY_VALUE.into());
                }
                d
            }),
            DeploymentAction::Keep => current.cloned(),
        };
        let owned = owned.iter().filter(|d| !plan.delete.iter().any(|s| s.name == d.name_any())).cloned().collect();
        (foo, current, owned)
    }

    fn now() -> Time {
        Time(Timestamp::from_second(1_800_000_000).unwrap())
    }

    proptest! {
        #[test]
        fn writes_only_what_the_foo_controls_and_a_second_decision_plans_nothing((foo, current, others) in world()) {
            let owned: Vec<Arc<DeploymentView>> = others.into_iter().map(Arc::new).collect();
            let plan = decide(&foo, current.as_ref(), &owned, UNSHARDED, &now());

            match &plan.deployment {
                DeploymentAction::Create(_) => prop_assert!(current.is_none()),
                DeploymentAction::Patch(p) => {
                    let d = current.as_ref().filter(|d| is_controlled_by(*d, &foo));
                    prop_assert!(d.is_some_and(|d| d.uid() == p.uid && d.resource_version() == p.resource_version), "{p:?}");
                }
                DeploymentAction::Keep => {}
            }
            for stale in &plan.delete {
                let d = owned.iter().find(|d| d.name_any() == stale.name);
                prop_assert!(d.is_some_and(|d| is_controlled_by(&**d, &foo) && d.uid() == stale.uid), "{stale:?}");
            }
            if current.as_ref().is_some_and(|d| !is_controlled_by(d, &foo)) {
                prop_assert!(plan.delete.is_empty(), "nothing is deleted while the name is someone else's");
            }

            let (foo, current, owned) = carry_out(&foo, current.as_ref(), &owned, &plan);
            let later = Time(Timestamp::from_second(1_800_000_060).unwrap());
            let again = decide(&foo, current.as_ref(), &owned, UNSHARDED, &later);
            prop_assert!(!again.writes() && again.events.is_empty(), "first {plan:?}\nthen {again:?}");
        }
    }
}
