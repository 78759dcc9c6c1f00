//! kubernetes/sample-controller in Rust: a `Foo` custom resource that owns an
//! nginx Deployment.
//!
//! A module per concept: [`foo`] the API type, [`deployment`] the Deployment
//! a Foo asks for, [`decision`] what a sync does (pure), [`cache`] what the
//! watches keep, [`adoption`] taking over what upstream's controller made,
//! [`controller`] the watches that trigger syncs, [`sync`] carrying a
//! sync's plan out, [`retry`] when a failed one runs again, [`events`] their
//! Events, [`constants`] every name put on
//! the wire, plus the process around them: [`app`], [`cli`], [`client`],
//! [`telemetry`], [`metrics`] (with [`workqueue`]), [`http`] and [`leader`].

pub mod adoption;
pub mod app;
pub mod cache;
pub mod cli;
pub mod client;
pub mod constants;
pub mod controller;
pub mod decision;
pub mod deployment;
pub mod events;
pub mod foo;
pub mod http;
pub mod leader;
pub mod metrics;
pub mod metrics_auth;
pub mod retry;
pub mod sync;
pub mod telemetry;
pub mod tls;
pub mod watch;
pub mod workqueue;

#[cfg(any(test, feature = "test-fixtures"))]
pub mod testing;

pub use foo::{Foo, FooSpec, FooStatus};

/// Every failure the controller reports, each naming the object involved.
#[derive(Debug, thiserror::Error)]
pub enum Error {
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

    /// The kubeconfig given with `--kubeconfig` cannot be used.
    #[error("cannot use kubeconfig {path}: {source}")]
    Kubeconfig {
        path: String,
        #[source]
        source: kube::config::KubeconfigError,
    },

    /// No kubeconfig and not in a cluster.
    #[error("no cluster configuration found ({0}); pass --kubeconfig, set KUBECONFIG, or run in a cluster")]
    NoClusterConfig(#[source] kube::config::InferConfigError),

    /// The Kubernetes client could not be built.
    #[error("cannot build the Kubernetes client: {0}")]
    Client(#[source] kube::Error),

    /// This replica stopped leading; it exits so that it restarts as a
    /// standby, as client-go and controller-runtime do.
    #[error("lost the lease {lease}: {reason}")]
    LostLease { lease: String, reason: leader::Lost },

    /// This replica led, but has not renewed its Lease within the renew
    /// deadline (it was paused, or cut off): it writes nothing more, as a
    /// standby may lead by now. Its elector ends the process next.
    #[error("Foo {foo}: not written: this replica's lease renewal is past its deadline")]
    NotLeading { foo: String },

    /// The leader-election timing flags would allow two leaders or a tight
    /// loop; refused at start with client-go's message.
    #[error(
        "invalid leader election timing: {0} (--leader-elect-lease-duration, --leader-elect-renew-deadline, --leader-elect-retry-period)"
    )]
    LeaderTiming(String),

    /// The metrics listener's certificate cannot be read or made.
    #[error("metrics TLS: {0}")]
    Tls(String),

    /// A listener for metrics or probes could not be bound.
    #[error("cannot serve HTTP on {addr}: {source}")]
    Http {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// The request of a sync that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiAction {
    CreateDeployment,
    GetDeployment,
    PatchDeployment,
    DeleteOldDeployment,
    PatchFooStatus,
}

impl std::fmt::Display for ApiAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ApiAction::CreateDeployment => "create Deployment",
            ApiAction::GetDeployment => "get Deployment",
            ApiAction::PatchDeployment => "patch Deployment",
            ApiAction::DeleteOldDeployment => "delete old Deployment",
            ApiAction::PatchFooStatus => "apply Foo status",
        })
    }
}

impl Error {
    /// True for a write refused because the object changed since it was
    /// read (HTTP 409 Conflict): the cache was behind, and a retry fixes it.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Api { source: kube::Error::Api(s), .. } if s.is_conflict())
    }

    /// True when the API server refused the request for its own state (429
    /// Too Many Requests, a 5xx) or could not be reached.
    pub fn is_server_failure(&self) -> bool {
        match self {
            Error::Api { source: kube::Error::Api(s), .. } => s.code == 429 || s.code >= 500,
            Error::Api { source: kube::Error::HyperError(_) | kube::Error::Service(_), .. } => true,
            _ => false,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(code: u16) -> Error {
        let status = kube::core::Status::failure("", "").with_code(code);
        Error::Api {
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
        let api = Error::Api { foo: "default/f".into(), action: ApiAction::GetDeployment, source: unreachable };
        assert!(api.is_server_failure());
        assert!(!Error::ResourceExists { foo: "default/f".into(), deployment: "d".into() }.is_server_failure());
    }
}
