//! What a sync of one Foo must do — upstream's `syncHandler` as a pure
//! function. Given the Foo, the Deployment of its `spec.deploymentName` as
//! the API server returned it (or none) and the Deployments labelled for
//! this Foo, [`decide`] returns a [`Plan`]: which writes to make, which
//! events to emit and how the sync ends. `controller.rs` carries it out and
//! does nothing else, so every branch is tested here without a server.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{Resource, ResourceExt};

use crate::constants::*;
use crate::deployment::{available_replicas, desired_deployment, is_controlled_by, spec_replicas};
use crate::foo::{Foo, FooStatus};

/// The one write the sync makes to the Deployment named by the Foo.
#[derive(Clone, Debug, PartialEq)]
pub enum DeploymentAction {
    /// It is missing: create it.
    Create(Box<Deployment>),
    /// It is ours but its replicas differ from `spec.replicas`: set them,
    /// only if the object is still at `resource_version` (the one checked for
    /// ownership), so a Deployment that changed hands meanwhile is not
    /// touched.
    Scale { name: String, resource_version: Option<String>, replicas: i32 },
    /// It is ours and in sync, or it cannot be touched: no write.
    None,
}

/// A Deployment this Foo controls under a name it no longer asks for.
#[derive(Clone, Debug, PartialEq)]
pub struct StaleDeployment {
    pub name: String,
    /// Delete precondition: only this very object, never a successor that
    /// took its name.
    pub uid: Option<String>,
}

/// An Event to publish about the Foo.
#[derive(Clone, Debug, PartialEq)]
pub struct EventSpec {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

/// How the sync ends.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Done; look again on the next change (and the periodic safety resync).
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
    pub delete: Vec<StaleDeployment>,
    /// The status to write, `None` when the Foo's status is already right.
    pub status: Option<FooStatus>,
    pub events: Vec<EventSpec>,
    pub outcome: Outcome,
}

impl Plan {
    /// True when the plan writes anything to the API (events aside).
    pub fn writes(&self) -> bool {
        self.deployment != DeploymentAction::None || !self.delete.is_empty() || self.status.is_some()
    }
}

/// Decide what a sync of `foo` does.
///
/// - `current`: the Deployment named `spec.deploymentName` in the Foo's
///   namespace, read fresh from the API server, or `None` if it is missing.
/// - `labelled`: the Deployments carrying this Foo's labels; those the Foo
///   controls under another name are deleted once the current one is ours.
/// - `now`: the time stamped on a condition that changes status.
pub fn decide(foo: &Foo, current: Option<&Deployment>, labelled: &[Deployment], now: &Time) -> Plan {
    let name = &foo.spec.deployment_name;
    let Some(desired) = desired_deployment(foo) else {
        // Only an older CRD without validation admits this. Upstream logs
        // and drops the item; we also tell the user, on the Foo itself.
        let status = status_with(foo, 0, ready(false, REASON_INVALID_SPEC, MESSAGE_EMPTY_DEPLOYMENT_NAME), now);
        return Plan {
            deployment: DeploymentAction::None,
            delete: vec![],
            status,
            events: vec![warning(REASON_INVALID_SPEC, MESSAGE_EMPTY_DEPLOYMENT_NAME.to_owned())],
            outcome: Outcome::InvalidSpec,
        };
    };

    let (deployment, available, cond) = match current {
        None => {
            let cond = ready(false, REASON_PROGRESSING, format!("Creating Deployment {name:?}"));
            (DeploymentAction::Create(Box::new(desired)), 0, cond)
        }
        Some(d) if !is_controlled_by(d, foo) => {
            // Never modify what we do not own: report it and fail the sync.
            let message = message_resource_exists(name);
            let status = status_with(foo, 0, ready(false, REASON_RESOURCE_EXISTS, message.clone()), now);
            return Plan {
                deployment: DeploymentAction::None,
                delete: vec![],
                status,
                events: vec![warning(REASON_RESOURCE_EXISTS, message)],
                outcome: Outcome::ResourceExists { deployment: name.clone() },
            };
        }
        Some(d) => {
            let have = spec_replicas(d);
            let action = match foo.spec.replicas {
                Some(want) if want != have => DeploymentAction::Scale {
                    name: name.clone(),
                    resource_version: d.resource_version(),
                    replicas: want,
                },
                _ => DeploymentAction::None,
            };
            let want = foo.spec.replicas.unwrap_or(have);
            let available = available_replicas(d);
            let message = format!("Deployment {name:?} has {available}/{want} replicas available");
            let cond = if available >= want {
                ready(true, REASON_AVAILABLE, message)
            } else {
                ready(false, REASON_PROGRESSING, message)
            };
            (action, available, cond)
        }
    };

    let delete = labelled
        .iter()
        .filter(|d| d.name_any() != *name && d.meta().deletion_timestamp.is_none() && is_controlled_by(d, foo))
        .map(|d| StaleDeployment { name: d.name_any(), uid: d.uid() })
        .collect();

    let mut plan = Plan {
        deployment,
        delete,
        status: status_with(foo, available, cond, now),
        events: vec![],
        outcome: Outcome::Synced,
    };
    for stale in &plan.delete {
        plan.events.push(normal(REASON_DELETED_OLD, message_deleted_old(&stale.name)));
    }
    // Beyond upstream: `Synced` only when the sync changed something, not
    // on every resync.
    if plan.writes() {
        plan.events.push(normal(REASON_SYNCED, MESSAGE_SYNCED.to_owned()));
    }
    plan
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

fn warning(reason: &'static str, message: String) -> EventSpec {
    EventSpec { warning: true, reason, message }
}

fn normal(reason: &'static str, message: String) -> EventSpec {
    EventSpec { warning: false, reason, message }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{foo, foreign_deployment, owned_deployment};
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
        let foo = foo("example-foo", "example-foo", Some(1));
        let plan = decide(&foo, None, &[], &now());
        let DeploymentAction::Create(d) = &plan.deployment else {
            panic!("expected a create, got {:?}", plan.deployment)
        };
        assert_eq!(**d, desired_deployment(&foo).unwrap());
        let status = plan.status.as_ref().expect("status is written after a create");
        assert_eq!(status.available_replicas, 0);
        assert_eq!(status.observed_generation, Some(1));
        assert_eq!(status.conditions[0].status, "False");
        assert_eq!(reasons(&plan), vec![REASON_SYNCED]);
        assert_eq!(plan.outcome, Outcome::Synced);
    }

    #[test]
    fn does_nothing_when_in_sync() {
        let foo = foo("example-foo", "example-foo", Some(2));
        let d = owned_deployment(&foo, 2, 2);
        // First sync records the status...
        let first = decide(&foo, Some(&d), std::slice::from_ref(&d), &now());
        assert_eq!(first.deployment, DeploymentAction::None);
        assert!(first.status.is_some());
        // ...and the next one, with that status in place, writes nothing and
        // emits nothing, even at a later time.
        let foo = with_status(foo, &first);
        let later = Time(Timestamp::from_second(1_800_000_600).unwrap());
        let plan = decide(&foo, Some(&d), std::slice::from_ref(&d), &later);
        assert!(!plan.writes(), "in-sync Foo must not write: {plan:?}");
        assert!(plan.events.is_empty(), "in-sync Foo must not emit events: {plan:?}");
        assert_eq!(plan.outcome, Outcome::Synced);
    }

    #[test]
    fn updates_deployment_replicas_when_they_differ() {
        let foo = foo("example-foo", "example-foo", Some(3));
        let d = owned_deployment(&foo, 1, 1);
        let plan = decide(&foo, Some(&d), &[], &now());
        assert_eq!(
            plan.deployment,
            DeploymentAction::Scale { name: "example-foo".into(), resource_version: Some("200".into()), replicas: 3 }
        );
        assert_eq!(reasons(&plan), vec![REASON_SYNCED]);
        let status = plan.status.unwrap();
        assert_eq!(status.available_replicas, 1);
        assert_eq!(status.conditions[0].status, "False", "1/3 available is not ready");
    }

    #[test]
    fn unset_replicas_leave_the_deployment_replicas_alone() {
        let foo = foo("example-foo", "example-foo", None);
        let d = owned_deployment(&foo, 4, 4);
        let plan = decide(&foo, Some(&d), &[], &now());
        assert_eq!(plan.deployment, DeploymentAction::None);
        assert_eq!(plan.status.unwrap().conditions[0].status, "True");
    }

    #[test]
    fn not_controlled_by_us_is_refused_without_touching_it() {
        let foo = foo("example-foo", "example-foo", Some(3));
        let d = foreign_deployment("example-foo", 1);
        let plan = decide(&foo, Some(&d), &[], &now());
        assert_eq!(plan.deployment, DeploymentAction::None);
        assert!(plan.delete.is_empty());
        assert_eq!(plan.events.len(), 1);
        assert!(plan.events[0].warning);
        assert_eq!(plan.events[0].reason, "ErrResourceExists");
        assert_eq!(plan.events[0].message, r#"Resource "example-foo" already exists and is not managed by Foo"#);
        assert_eq!(plan.outcome, Outcome::ResourceExists { deployment: "example-foo".into() });
        let status = plan.status.unwrap();
        assert_eq!(status.conditions[0].reason, "ErrResourceExists");
    }

    #[test]
    fn a_deployment_of_a_previous_foo_with_the_same_name_is_not_ours() {
        let old = foo("example-foo", "example-foo", Some(1));
        let d = owned_deployment(&old, 1, 1);
        let mut new = old.clone();
        new.metadata.uid = Some("uid-recreated".into());
        let plan = decide(&new, Some(&d), std::slice::from_ref(&d), &now());
        assert_eq!(plan.outcome, Outcome::ResourceExists { deployment: "example-foo".into() });
        assert!(plan.delete.is_empty());
    }

    #[test]
    fn status_follows_the_deployment_available_replicas() {
        let foo = foo("example-foo", "example-foo", Some(2));
        let d = owned_deployment(&foo, 2, 0);
        let first = decide(&foo, Some(&d), &[], &now());
        let foo = with_status(foo, &first);
        let ready = owned_deployment(&foo, 2, 2);
        let plan = decide(&foo, Some(&ready), &[], &now());
        assert_eq!(plan.deployment, DeploymentAction::None);
        let status = plan.status.as_ref().unwrap();
        assert_eq!(status.available_replicas, 2);
        assert_eq!(status.conditions[0].status, "True");
        assert_eq!(status.conditions[0].reason, "Available");
        assert_eq!(reasons(&plan), vec![REASON_SYNCED]);
    }

    #[test]
    fn a_new_generation_is_recorded_in_status() {
        let foo = foo("example-foo", "example-foo", Some(2));
        let d = owned_deployment(&foo, 2, 2);
        let mut foo = with_status(foo.clone(), &decide(&foo, Some(&d), &[], &now()));
        foo.metadata.generation = Some(2);
        let plan = decide(&foo, Some(&d), &[], &now());
        let status = plan.status.unwrap();
        assert_eq!(status.observed_generation, Some(2));
        assert_eq!(status.conditions[0].observed_generation, Some(2));
    }

    #[test]
    fn condition_transition_time_moves_only_when_its_status_flips() {
        let foo = foo("example-foo", "example-foo", Some(2));
        let t0 = now();
        let t1 = Time(Timestamp::from_second(1_800_000_100).unwrap());
        let t2 = Time(Timestamp::from_second(1_800_000_200).unwrap());
        let foo = with_status(foo.clone(), &decide(&foo, Some(&owned_deployment(&foo, 2, 0)), &[], &t0));
        // 0 -> 1 available: still False, time kept.
        let plan = decide(&foo, Some(&owned_deployment(&foo, 2, 1)), &[], &t1);
        let foo = with_status(foo, &plan);
        assert_eq!(foo.status.as_ref().unwrap().conditions[0].last_transition_time, t0);
        // 1 -> 2 available: flips to True, time moves.
        let plan = decide(&foo, Some(&owned_deployment(&foo, 2, 2)), &[], &t2);
        assert_eq!(plan.status.unwrap().conditions[0].last_transition_time, t2);
    }

    #[test]
    fn other_conditions_are_kept_in_place() {
        let mut foo = foo("example-foo", "example-foo", Some(1));
        let d = owned_deployment(&foo, 1, 1);
        let mut other = ready(true, "X", "set by another tool");
        other.type_ = "Audited".into();
        foo.status = Some(FooStatus { conditions: vec![other.clone()], ..Default::default() });
        let status = decide(&foo, Some(&d), &[], &now()).status.unwrap();
        assert_eq!(status.conditions.len(), 2);
        assert_eq!(status.conditions[0], other);
        assert_eq!(status.conditions[1].type_, "Ready");
    }

    #[test]
    fn old_deployment_is_deleted_after_deployment_name_changes() {
        let before = foo("example-foo", "old-name", Some(1));
        let old = owned_deployment(&before, 1, 1);
        let mut after = before.clone();
        after.spec.deployment_name = "new-name".into();
        after.metadata.generation = Some(2);
        // The new one does not exist yet: create it and drop the old one.
        let plan = decide(&after, None, std::slice::from_ref(&old), &now());
        assert!(matches!(plan.deployment, DeploymentAction::Create(_)));
        assert_eq!(plan.delete, vec![StaleDeployment { name: "old-name".into(), uid: old.metadata.uid.clone() }]);
        assert_eq!(reasons(&plan), vec![REASON_DELETED_OLD, REASON_SYNCED]);
    }

    #[test]
    fn old_deployment_is_kept_while_the_new_name_is_taken_by_someone_else() {
        let before = foo("example-foo", "old-name", Some(1));
        let old = owned_deployment(&before, 1, 1);
        let mut after = before.clone();
        after.spec.deployment_name = "taken".into();
        let plan = decide(&after, Some(&foreign_deployment("taken", 1)), &[old], &now());
        assert!(plan.delete.is_empty(), "keep serving until the new Deployment is ours");
        assert_eq!(plan.outcome, Outcome::ResourceExists { deployment: "taken".into() });
    }

    #[test]
    fn labelled_deployments_we_do_not_control_are_never_deleted() {
        let foo_ = foo("example-foo", "example-foo", Some(1));
        let current = owned_deployment(&foo_, 1, 1);
        // Same labels, another controller: e.g. copied by hand.
        let mut lookalike = owned_deployment(&foo("example-foo", "copy", Some(1)), 1, 1);
        lookalike.metadata.owner_references.as_mut().unwrap()[0].uid = "uid-someone-else".into();
        let mut terminating = owned_deployment(&foo("example-foo", "going", Some(1)), 1, 1);
        terminating.metadata.deletion_timestamp = Some(now());
        let plan = decide(&foo_, Some(&current), &[current.clone(), lookalike, terminating], &now());
        assert!(plan.delete.is_empty(), "{:?}", plan.delete);
    }

    #[test]
    fn empty_deployment_name_warns_and_waits_for_a_change() {
        let foo = foo("example-foo", "", Some(1));
        let plan = decide(&foo, None, &[], &now());
        assert_eq!(plan.deployment, DeploymentAction::None);
        assert_eq!(plan.outcome, Outcome::InvalidSpec);
        assert_eq!(plan.events.len(), 1);
        assert!(plan.events[0].warning);
        assert_eq!(plan.events[0].reason, REASON_INVALID_SPEC);
        assert_eq!(plan.status.as_ref().unwrap().conditions[0].reason, REASON_INVALID_SPEC);
        // The status is not written again on the next sync.
        let foo = with_status(foo, &plan);
        assert!(decide(&foo, None, &[], &now()).status.is_none());
    }
}
