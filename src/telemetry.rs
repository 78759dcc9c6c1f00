//! Logging through tracing: `RUST_LOG` filters (default [`DEFAULT_FILTER`]), text for a
//! terminal or JSON for log pipelines.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

/// `info`, without kube-client's own report of each failed request and
/// dropped connection: the controller reports the failures that matter
/// (a sync's, with its Foo; a watch's, as it reconnects), so WARN and ERROR
/// lines are the ones someone should look at.
pub const DEFAULT_FILTER: &str = "info,kube_client::client=error,kube_client::client::builder=off";

/// Start logging. `RUST_LOG` wins over `default_filter` (from klog's `-v`),
/// which wins over [`DEFAULT_FILTER`].
pub fn init(format: LogFormat, default_filter: Option<&str>) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter.unwrap_or(DEFAULT_FILTER)));
    // Colours only on a terminal, not in log files and pipelines.
    let ansi = std::io::stderr().is_terminal();
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    // A second init (tests) is harmless; ignore the error it returns.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
