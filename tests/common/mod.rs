//! The integration tests' one harness, a module per concern: [`cluster`]
//! (the control plane hack/test.sh started, a namespace per test, kubectl,
//! waits), [`in_process`] (the controller run inside the test), [`process`]
//! (programs the tests start), [`deployed`] (deploy/ installed, its pods and
//! their tokens), [`endpoints`] (one HTTP client for their endpoints),
//! [`audit`] (the API server's audit log), [`fault_proxy`] (faults
//! injected between the operator and the API server), [`held_relay`]
//! (its requests held in flight) and [`tenant`] (a tenant filling what it
//! writes to the API server's limits).
#![allow(dead_code, unused_imports)] // each test binary uses its own subset

pub mod audit;
pub mod cluster;
pub mod deployed;
pub mod endpoints;
pub mod fault_proxy;
pub mod held_relay;
pub mod in_process;
pub mod process;
pub mod tenant;

pub use audit::*;
pub use cluster::*;
pub use deployed::*;
pub use endpoints::*;
pub use held_relay::*;
pub use in_process::*;
pub use process::*;
