//! How a sync fails. Each error names the Foo it concerns; the process's
//! own failures (flags, credentials, listeners, a lost Lease) are another
//! type, [`crate::app::Error`], as they never reach a sync's retry.

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
}

/// The request of a sync that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiAction {
    CreateDeployment,
    GetDeployment,
    PatchDeployment,
    DeleteOldDeployment,
    ApplyFooStatus,
}

impl std::fmt::Display for ApiAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ApiAction::CreateDeployment => "create Deployment",
            ApiAction::GetDeployment => "get Deployment",
            ApiAction::PatchDeployment => "patch Deployment",
            ApiAction::DeleteOldDeployment => "delete old Deployment",
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
    pub fn is_server_failure(&self) -> bool {
        match self {
            SyncError::Api { source: kube::Error::Api(s), .. } => s.code == 429 || s.code >= 500,
            SyncError::Api { source: kube::Error::HyperError(_) | kube::Error::Service(_), .. } => true,
            _ => false,
        }
    }
}

pub type SyncResult<T> = std::result::Result<T, SyncError>;

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
