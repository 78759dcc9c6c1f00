//! What the tests use beyond the crate's public API (the Foo, the
//! LeaderFence and the process's entry points, at the crate root): fixtures
//! built fluently, and the internals the integration tests, the benchmarks
//! and the examples drive or compare with, re-exported by folder. The other
//! items of src/ are `pub(crate)`, but for the types these name in their
//! signatures.
//!
//! Compiled only for this crate's unit tests and, through the
//! `test-fixtures` feature that the crate's dev-dependency on itself turns
//! on, for its integration tests, benchmarks and examples: never part of
//! the binaries users run (`cargo build --release --bins` leaves it out).

mod fixtures;

pub use fixtures::{DeploymentFixture, FooFixture, metric_value};

/// The Foo's names, labels and Deployment, as the tests compare them.
pub mod api {
    pub use crate::api::constants::{
        CONDITION_READY, CONTAINER_IMAGE, CONTROLLER_NAME, FENCE_POLICY, LABEL_MANAGED_BY, LABEL_MANAGED_BY_VALUE,
        POD_NAME_ENV, REASON_NOT_ADOPTED, REASON_SYNCED, message_not_adopted,
    };
    pub use crate::api::deployment::{desired_deployment, managed_selector};
    pub use crate::api::deployment_view::DeploymentView;
    pub use crate::api::shard::{Shard, UNSHARDED};
    pub use crate::api::wire::FooWire;
}

/// Parts of the process a test assembles itself (an in-process controller).
pub mod app {
    pub use crate::app::{leader_config, start_adoption};
}

/// The caches, for tests that fill them by hand.
pub mod cache {
    pub use crate::cache::{
        Cache, Caches, DeploymentCache, DeploymentStore, FooCache, FooStore, Keep, trim_deployment, trim_foo,
    };
    pub use crate::testing::fixtures::filled;
}

/// The client as the operator builds it, and how it names itself.
pub mod client {
    pub use crate::client::watch::Paced;
    pub use crate::client::{FIELD_MANAGER, USER_AGENT, api, build};
}

/// The controller's loop, run in process.
pub mod controller {
    pub use crate::controller::{Settings, build, run};
}

/// The operator's metrics.
pub mod observe {
    pub use crate::observe::metrics::Metrics;
}

/// The defaults the tests size their runs by.
pub mod ops {
    pub use crate::ops::cli::DEFAULT_WORKERS;
    pub use crate::ops::sizing::{PEAK_BASE, PEAK_PER_FOO};
    pub use crate::ops::watchdog::PERIOD;
}

/// One sync and its parts: the decision, the context, the errors, the
/// Events, the adoption pass.
pub mod reconcile {
    pub use crate::reconcile::adoption::Adoption;
    pub use crate::reconcile::context::{Context, DEFAULT_RECONCILE_TIMEOUT};
    pub use crate::reconcile::decision::{DeploymentAction, DeploymentPatch, decide};
    pub use crate::reconcile::error::{ApiAction, SyncError};
    pub use crate::reconcile::events::Publisher;
    pub use crate::reconcile::guard::{error_policy, reconcile};
    #[cfg(feature = "test-hooks")]
    pub use crate::reconcile::sync::PANICS_IN_SYNC;
}
