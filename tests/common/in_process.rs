//! The controller run inside the test process: whole, watching a
//! namespace, or as single syncs over caches a test fills.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::runtime::watcher::Event as WatchEvent;
use kube::{Client, Config};
use sample_controller::Foo;
use sample_controller::testing::api::DeploymentView;
use sample_controller::testing::api::Shard;
use sample_controller::testing::app::start_adoption;
use sample_controller::testing::cache::{Caches, filled, trim_deployment, trim_foo};
use sample_controller::testing::controller::{self, Settings};
use sample_controller::testing::observe::Metrics;
use sample_controller::testing::reconcile::Adoption;
use sample_controller::testing::reconcile::{Context, DEFAULT_RECONCILE_TIMEOUT};

/// A controller running in this test process, stopped when dropped.
pub struct RunningController {
    tasks: [tokio::task::JoinHandle<()>; 2],
    pub metrics: Arc<Metrics>,
}

impl Drop for RunningController {
    fn drop(&mut self) {
        self.tasks.iter().for_each(|t| t.abort());
    }
}

/// Start the controller with a client for `config` built as the operator
/// builds it (its User-Agent, its request counting), watching `namespace`
/// (all when None).
pub fn start_controller(config: Config, namespace: Option<&str>) -> RunningController {
    start_controller_with(config, namespace, 2)
}

/// [`start_controller`] with `workers` concurrent syncs.
pub fn start_controller_with(config: Config, namespace: Option<&str>, workers: u16) -> RunningController {
    start_controller_timed(config, namespace, workers, DEFAULT_RECONCILE_TIMEOUT)
}

/// [`start_controller_with`], each sync abandoned after `deadline`.
pub fn start_controller_timed(
    config: Config,
    namespace: Option<&str>,
    workers: u16,
    deadline: Duration,
) -> RunningController {
    let metrics = Arc::new(Metrics::new());
    let client = sample_controller::testing::client::build(config, metrics.rest_requests.clone()).expect("client");
    let settings =
        Settings { namespace: namespace.map(str::to_owned), workers, shard: Shard::all(), streaming_lists: false };
    let (controller, caches, backlog) = controller::build(&client, &settings, metrics.queue.clone());
    let adoption = Arc::new(Adoption::new(sample_controller::testing::client::api(&client, namespace), workers.into()));
    let adopting = start_adoption(&caches, &adoption, None);
    let ctx = Context::new(client.clone(), caches, adoption, metrics.clone(), Some("integration-test".into()), None);
    let ctx = Arc::new(ctx.with_reconcile_timeout(deadline));
    let task = tokio::spawn(controller::run(controller, ctx, backlog));
    RunningController { tasks: [task, adopting], metrics }
}

/// What a single sync (with no controller around it) runs with: `caches`,
/// no adoption pass, no leader election.
pub fn context(client: Client, caches: Caches, metrics: Arc<Metrics>) -> Arc<Context> {
    Arc::new(Context::new(client, caches, Arc::new(Adoption::none()), metrics, None, None))
}

/// Controller caches holding `foos` and `deployments`, as a watch's first
/// list would fill them; they change only when the test says so, so a test
/// can make them lag behind the API server.
pub async fn caches_holding(foos: &[Foo], deployments: &[Deployment]) -> Caches {
    caches_of_shard(&Shard::all(), foos, deployments).await
}

/// [`caches_holding`], as the caches of `shard` hold them (trimmed to the
/// labels its Deployments follow).
pub async fn caches_of_shard(shard: &Shard, foos: &[Foo], deployments: &[Deployment]) -> Caches {
    let views = deployments.iter().cloned().map(DeploymentView::from);
    Caches {
        foos: filled(foos.iter().cloned(), trim_foo(shard)).await,
        deployments: filled(views, trim_deployment(shard)).await,
        shard: shard.clone(),
    }
}
