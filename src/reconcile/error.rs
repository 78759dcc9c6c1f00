//! How a sync fails. Each error names the Foo it concerns; the process's
//! own failures (flags, credentials, listeners, a lost Lease) are another
//! type, [`crate::app::Error`], as they never reach a sync's retry.

use crate::api::constants::FENCE_POLICY;

/// A failed sync: logged and retried by the sync's error policy.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// An API request for a Foo's sync failed; retried with backoff.
    #[error("Foo {foo}: {action}: {source}")]
    Api {
        foo: String,
        action: ApiAction,
        #[source]
        source: kube::Error,
    },

    /// The Foo names a Deployment that something else controls; retried with
    /// backoff in case it is deleted or handed over.
    #[error("Foo {foo}: Deployment {deployment:?} already exists and is not managed by Foo")]
    ResourceExists { foo: String, deployment: String },

    /// A Foo came without a namespace; Foo is namespaced, so only a broken
    /// API answer can cause this.
    #[error("Foo {0}: the API server returned it without a namespace")]
    MissingNamespace(String),

    /// This replica led, but has not renewed its Lease within the renew
    /// deadline (it was paused, or cut off): it writes nothing more, as a
    /// standby may lead by now. Its elector ends the process next.
    #[error("Foo {foo}: not written: this replica's lease renewal is past its deadline")]
    NotLeading { foo: String },

    /// The API server's leader fence refused a write of this replica's: it
    /// writes nothing until its elector has checked the Lease (renewed, or
    /// found it taken and ended the process).
    #[error("Foo {foo}: not written: the API server's leader fence refused a write; checking the Lease")]
    FenceInDoubt { foo: String },

    /// The sync ran past `--reconcile-timeout` (a request the API server
    /// never answered, say) and was abandoned where it stood; retried with
    /// backoff, as controller-runtime's `ReconciliationTimeout` does.
    #[error("Foo {foo}: sync abandoned after {after:?} (--reconcile-timeout)")]
    TimedOut { foo: String, after: std::time::Duration },

    /// The sync panicked: a bug. That sync alone failed; retried with
    /// backoff, as controller-runtime recovers a reconcile's panic.
    #[error("Foo {foo}: sync panicked: {message}")]
    Panicked { foo: String, message: String },
}

/// The request of a sync that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiAction {
    CreateDeployment,
    GetDeployment,
    PatchDeployment,
    DeleteOldDeployment,
    ListFoo,
    ApplyFooStatus,
}

impl std::fmt::Display for ApiAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ApiAction::CreateDeployment => "create Deployment",
            ApiAction::GetDeployment => "get Deployment",
            ApiAction::PatchDeployment => "patch Deployment",
            ApiAction::DeleteOldDeployment => "delete old Deployment",
            ApiAction::ListFoo => "list Foo",
            ApiAction::ApplyFooStatus => "apply Foo status",
        })
    }
}

impl SyncError {
    /// True for a write refused because the object changed since it was
    /// read (HTTP 409 Conflict): the cache was behind, and a retry fixes it.
    pub fn is_conflict(&self) -> bool {
        matches!(self, SyncError::Api { source: kube::Error::Api(s), .. } if s.is_conflict())
    }

    /// True when the API server refused the request for its own state (429
    /// Too Many Requests, a 5xx) or could not be reached.
    pub(crate) fn is_server_failure(&self) -> bool {
        match self {
            SyncError::Api { source: kube::Error::Api(s), .. } => s.code == 429 || s.code >= 500,
            SyncError::Api { source: kube::Error::HyperError(_) | kube::Error::Service(_), .. } => true,
            _ => false,
        }
    }

    /// True for a write the API server's leader fence refused: its view of
    /// the Lease names no holder or another pod, or the request's token names
    /// no pod (HTTP 403; 422 for a binding changed to
    /// `parameterNotFoundAction: Deny` that finds no LeaderFence).
    pub fn is_fence_refusal(&self) -> bool {
        matches!(self, SyncError::Api { source, .. } if kube_lease_fence::is_fence_refusal(source, FENCE_POLICY))
    }

    /// True for an error that retrying alone cannot fix (controller-runtime's
    /// terminal errors): a Deployment of someone else's holds the name. It is
    /// still retried, at the backoff's pace, as nothing else reliably says
    /// the name was freed; the Foo's status says why it waits.
    pub(crate) fn is_terminal(&self) -> bool {
        matches!(self, SyncError::ResourceExists { .. })
    }

    /// True when a retry must wait at least a second: the server failed,
    /// or did not answer within the sync's deadline, or its fence refused
    /// (the elector checks the Lease first).
    pub(crate) fn retries_slowly(&self) -> bool {
        self.is_server_failure()
            || self.is_fence_refusal()
            || matches!(self, SyncError::FenceInDoubt { .. } | SyncError::TimedOut { .. })
    }
}

pub(crate) type SyncResult<T> = std::result::Result<T, SyncError>;

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(code: u16) -> SyncError {
        let status = kube::core::Status::failure("", "").with_code(code);
        SyncError::Api {
            foo: "default/f".into(),
            action: ApiAction::PatchDeployment,
            source: kube::Error::Api(status.boxed()),
        }
    }

    #[test]
    fn a_refusal_for_the_servers_own_state_is_a_server_failure_and_a_refusal_of_the_request_is_not() {
        for code in [429, 500, 503, 504] {
            assert!(answered(code).is_server_failure(), "{code}");
        }
        for code in [400, 403, 404, 409, 422] {
            assert!(!answered(code).is_server_failure(), "{code}");
        }
        let unreachable = kube::Error::Service(Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionReset)));
        let api = SyncError::Api { foo: "default/f".into(), action: ApiAction::GetDeployment, source: unreachable };
        assert!(api.is_server_failure());
        assert!(!SyncError::ResourceExists { foo: "default/f".into(), deployment: "d".into() }.is_server_failure());
    }

    #[test]
    fn a_refusal_by_the_leader_fence_is_told_from_other_refusals_and_retried_slowly() {
        let refused = |code: u16, message: &str| SyncError::Api {
            foo: "default/f".into(),
            action: ApiAction::CreateDeployment,
            source: kube::Error::Api(kube::core::Status::failure(message, "Forbidden").with_code(code).boxed()),
        };
        // As the API server words them.
        let denied = "ValidatingAdmissionPolicy 'sample-controller-leader-fence' with binding \
                      'sample-controller-leader-fence' denied request:";
        let holder_elsewhere = refused(
            403,
            &format!(
                "deployments.apps \"d\" is forbidden: {denied} pod a does not hold the Lease l (its LeaderFence names b_1f)"
            ),
        );
        let no_lease = refused(
            422,
            &format!(
                "foos \"f\" is forbidden: {denied} failed to configure binding: no params found for policy \
                      binding with `Deny` parameterNotFoundAction"
            ),
        );
        for fenced in [holder_elsewhere, no_lease] {
            assert!(fenced.is_fence_refusal() && fenced.retries_slowly(), "{fenced}");
        }
        let rbac = refused(403, "deployments.apps is forbidden: User \"u\" cannot create resource \"deployments\"");
        assert!(!rbac.is_fence_refusal() && !rbac.retries_slowly(), "an RBAC refusal");
        let other_policy = refused(403, "ValidatingAdmissionPolicy 'replica-limit' with binding 'b' denied request: x");
        assert!(!other_policy.is_fence_refusal(), "another policy's refusal");
        assert!(!refused(409, denied).is_fence_refusal(), "not a refusal by admission");
        assert!(SyncError::FenceInDoubt { foo: "default/f".into() }.retries_slowly(), "held while in doubt");
        let timed_out = SyncError::TimedOut { foo: "default/f".into(), after: std::time::Duration::from_secs(120) };
        assert!(timed_out.retries_slowly(), "a deadline met: the API server did not answer");
        let panicked = SyncError::Panicked { foo: "default/f".into(), message: "bug".into() };
        assert!(!panicked.retries_slowly(), "a bug, not the API server");
    }

    #[test]
    fn only_a_foreign_deployment_holding_the_name_is_terminal() {
        let foo = || "default/f".to_owned();
        assert!(SyncError::ResourceExists { foo: foo(), deployment: "d".into() }.is_terminal());
        let passing = [
            answered(403),
            answered(500),
            SyncError::NotLeading { foo: foo() },
            SyncError::TimedOut { foo: foo(), after: std::time::Duration::from_secs(1) },
            SyncError::Panicked { foo: foo(), message: "bug".into() },
        ];
        for error in passing {
            assert!(!error.is_terminal(), "{error}");
        }
    }

    #[test]
    fn only_a_conflict_answer_is_a_conflict() {
        let conflict = kube::core::Status::failure("the object has been modified", "Conflict").with_code(409);
        let changed = SyncError::Api {
            foo: "default/f".into(),
            action: ApiAction::PatchDeployment,
            source: kube::Error::Api(conflict.boxed()),
        };
        assert!(changed.is_conflict());
        assert!(!answered(404).is_conflict());
        assert!(!SyncError::NotLeading { foo: "default/f".into() }.is_conflict());
    }
}
