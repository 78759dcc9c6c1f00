//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's
//! semantics, and a fence the API server keeps.
#![doc = ""]
#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![warn(clippy::too_many_lines)]

mod elector;
mod fence;
mod gate;
mod identity;
mod leadership;
mod timing;
mod watch;

pub use elector::{Elector, Fence, LeaderConfig, Lost};
pub use fence::{FenceState, fence_holder, is_fence_refusal, no_such_kind};
pub use gate::{WriteGate, may_write};
pub use identity::default_identity;
pub use leadership::Leadership;
pub use timing::{LeaseVerdict, TimingError, check_timing, lease_verdict};
pub use watch::{DefaultBackoff, Watches};

#[cfg(test)]
pub(crate) mod test_support {
    use std::time::Duration;

    use kube::Client;
    use kube::api::ApiResource;

    use crate::LeaderConfig;

    pub const LEASE: Duration = Duration::from_secs(15);

    /// A fence of group example.com, kind LeaderFence.
    pub fn fence_resource() -> ApiResource {
        ApiResource {
            group: "example.com".into(),
            version: "v1".into(),
            api_version: "example.com/v1".into(),
            kind: "LeaderFence".into(),
            plural: "leaderfences".into(),
        }
    }

    pub fn config(identity: &str) -> LeaderConfig {
        LeaderConfig::new("l", "ns", identity)
            .with_timing(LEASE, Duration::from_secs(10), Duration::from_secs(2))
            .with_field_manager("test")
            .with_fence(crate::Fence::new(fence_resource(), "install"))
    }

    /// A client that is never called: these tests exercise no request.
    pub fn dummy_client() -> Client {
        let (service, _handle) =
            tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
        Client::new(service, "default")
    }
}
