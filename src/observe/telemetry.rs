//! Logging through tracing: `RUST_LOG` filters (default [`DEFAULT_FILTER`]), text for a
//! terminal or JSON for log pipelines; klog's `-v=N` from upstream's command
//! lines maps onto a filter ([`klog_filter`]).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// `info`, without kube-client's own report of each failed request and
/// dropped connection: the controller reports the failures that matter
/// (a sync's, with its Foo; a watch's, as it reconnects), so WARN and ERROR
/// lines are the ones someone should look at.
pub(crate) const DEFAULT_FILTER: &str = "info,kube_client::client=error,kube_client::client::builder=off";

/// How log lines are written (`--log-format`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

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

/// Our own code's log targets: the operator, and its leader election and
/// metrics server (crates of their own).
const OURS: [&str; 3] = ["sample_controller", "kube_lease_fence", "kube_secure_metrics"];

/// The log filter for klog's verbosity: 0-3 is our default, 4 and 5 add our
/// debug lines, 6 and up our trace lines and kube's debug lines. `None` for
/// a level that is not a number.
pub(crate) fn klog_filter(level: &str) -> Option<String> {
    let level: u8 = level.parse().ok()?;
    let ours = |at: &str| OURS.map(|target| format!("{target}={at}")).join(",");
    Some(match level {
        0..=3 => DEFAULT_FILTER.to_owned(),
        4..=5 => format!("{DEFAULT_FILTER},{}", ours("debug")),
        _ => format!("{DEFAULT_FILTER},{},kube=debug", ours("trace")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn klog_levels_map_onto_our_filter_and_add_detail_from_4_and_6() {
        for level in ["0", "2", "3"] {
            assert_eq!(klog_filter(level).as_deref(), Some(DEFAULT_FILTER), "{level}");
        }
        let debug = "sample_controller=debug,kube_lease_fence=debug,kube_secure_metrics=debug";
        assert_eq!(klog_filter("4"), Some(format!("{DEFAULT_FILTER},{debug}")));
        assert_eq!(klog_filter("5"), klog_filter("4"));
        let trace = "sample_controller=trace,kube_lease_fence=trace,kube_secure_metrics=trace,kube=debug";
        assert_eq!(klog_filter("6"), Some(format!("{DEFAULT_FILTER},{trace}")));
        assert_eq!(klog_filter("loud"), None);
        assert_eq!(klog_filter("-1"), None);
    }
}
