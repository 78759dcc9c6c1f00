//! kubernetes/sample-controller in Rust: a `Foo` custom resource that owns an
//! nginx Deployment.
//!
//! A module per concept, in layers: a module uses only those below it
//! (docs/design.md draws them; `tests/layers.rs` checks it).
//! - the process: [`app`] puts together [`cli`] and [`go_flags`] (the
//!   command line), [`check`] (the preflight, `sample-controller check`), [`telemetry`] (logs), [`http`] and [`tls`] (endpoints);
//! - the controller: [`controller`] turns watches into syncs, [`sync`]
//!   carries one out and retries it, [`watchdog`] says when Foos stop
//!   converging, [`events`] publishes its Events,
//!   [`cache`] keeps what the watches ([`watch`]) saw, [`backlog`] paces
//!   the first syncs so that changes overtake them, [`adoption`] takes
//!   over what upstream's controller made, [`leader`] elects the one replica
//!   that writes and names it in its [`leader_fence`] for the API server;
//! - the pure core: [`decision`] what a sync does, [`deployment`] the
//!   Deployment a Foo asks for, [`foo`] the API type, [`wire`] objects as
//!   the caches decode them, [`shard`] which Foos
//!   an instance owns, [`error`] how a sync fails, [`retry`] when to try
//!   again;
//! - the plumbing: [`client`], [`metrics`] (with [`workqueue`] and
//!   [`process`]), [`metrics_auth`], [`constants`].

pub mod adoption;
pub mod app;
pub mod backlog;
pub mod cache;
pub mod check;
pub mod cli;
pub mod client;
pub mod constants;
pub mod controller;
pub mod decision;
pub mod deployment;
pub mod error;
pub mod events;
pub mod foo;
pub mod go_flags;
pub mod http;
pub mod leader;
pub mod leader_fence;
pub mod metrics;
pub mod metrics_auth;
pub mod process;
pub mod retry;
pub mod shard;
pub mod sync;
pub mod telemetry;
pub mod tls;
pub mod watch;
pub mod watchdog;
pub mod wire;
pub mod workqueue;

#[cfg(any(test, feature = "test-fixtures"))]
pub mod testing;

pub use foo::{Foo, FooSpec, FooStatus};
