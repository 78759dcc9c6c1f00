//! kubernetes/sample-controller in Rust: a `Foo` custom resource that owns an
//! nginx Deployment.
//!
//! A folder per concept, in layers: a folder uses only those below it
//! (docs/design.md draws them; `tests/layers.rs` checks it). Top down:
//! - `app`: the process, which puts everything together;
//! - `ops`: the operator's own tools (command line, preflight, watchdog);
//! - `controller`: watches turned into syncs, and the backlog that paces
//!   the first ones;
//! - `reconcile`: one sync of a Foo: the decision, its writes, its Events;
//! - `cache`: what the watches saw, and our own writes they have not yet;
//! - `api`: the Foo, the Deployment it owns, their names and labels.
//!
//! Below the Foo, machinery any controller could use, which never imports
//! it:
//! - `client`: the Kubernetes client, its retries, the paced watches;
//! - `observe`: metrics and logs.
//!
//! Two crates of their own stand beside it, for any kube-rs controller:
//! crates/kube-lease-fence (leader election and the API server's fence)
//! and crates/kube-secure-metrics (the metrics and probe endpoints, TLS,
//! who may read the metrics, the process's metrics).

#![warn(clippy::too_many_lines)]
// An item is `pub` only where the public API below or the test surface
// reaches it (re-exported, or in a signature of one that is); the others
// are `pub(crate)`, and the lint catches a `pub` that reaches nobody.
#![cfg_attr(feature = "test-fixtures", warn(unreachable_pub))]

mod api;
mod app;
mod cache;
mod client;
mod controller;
mod observe;
mod ops;
mod reconcile;

#[cfg(any(test, feature = "test-fixtures"))]
pub mod testing;

// The public API: the custom resources (crdgen prints their CRDs)...
pub use api::confinement::{CONFINEMENT_POLICY, policy_file as confinement_policy_file};
pub use api::foo::{Foo, FooSpec, FooStatus};
pub use api::leader_fence::{LeaderFence, LeaderFenceSpec};
// ...and what src/main.rs runs.
pub use app::run;
pub use observe::telemetry;
pub use ops::cli::Cli;
pub use ops::go_flags::{GoStyleArgs, from_go_style};
