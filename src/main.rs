//! `sample-controller`: parse flags, start logging, run the operator.

#![warn(clippy::too_many_lines)]

use std::process::ExitCode;

use clap::Parser;
use sample_controller::{Cli, from_go_style, run, telemetry};

/// jemalloc, for memory that stays flat: see Cargo.toml.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// One thread runs it all. The controller waits on the API server far more
/// than it computes, and on a multi-threaded runtime answers woke tasks on
/// other threads: at 10 000 new Foos that took 12–13 s of CPU
/// against 7 s on one thread, from the cores the API server needs
/// (docs/api-cost.md).
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    // Upstream's command line (Go's `-kubeconfig=PATH`, klog's `-v=N`) works as is.
    let go = from_go_style(std::env::args());
    let cli = Cli::parse_from(go.args);
    telemetry::init(cli.log_format, go.log_filter.as_deref());
    go.notices.iter().for_each(|notice| tracing::info!("{notice}"));
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "exiting");
            ExitCode::FAILURE
        }
    }
}
