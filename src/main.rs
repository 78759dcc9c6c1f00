//! `sample-controller`: parse flags, start logging, run the operator.

use std::process::ExitCode;

use clap::Parser;
use sample_controller::{app, cli::Cli, telemetry};

/// jemalloc, for memory that stays flat: see Cargo.toml.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init(cli.log_format);
    match app::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "exiting");
            ExitCode::FAILURE
        }
    }
}
