//! Command-line flags, each also settable through an environment variable.
//! Names follow upstream sample-controller (`--kubeconfig`, `--master`) and
//! kubebuilder (`--metrics-bind-address`, `--health-probe-bind-address`,
//! `--leader-elect`).

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::api::shard::Shard;
use crate::observe::telemetry::LogFormat;

/// What else the binary does.
#[derive(Subcommand, Debug, Clone, PartialEq, Eq)]
pub(crate) enum Command {
    /// Check the cluster the operator would run against, before an install or an upgrade: the
    /// Kubernetes version, the installed Foo CRD against this binary's, the ServiceAccount's RBAC
    /// (in --namespace, or cluster-wide), streaming lists, and whether the leader fence follows the
    /// Lease (--leader-election-id in --leader-election-namespace). One line per check; exits 1 on
    /// any failure.
    Check {
        /// The operator's ServiceAccount, NAMESPACE:NAME.
        #[arg(long, value_name = "NAMESPACE:NAME", default_value = "sample-controller:sample-controller", value_parser = parse_service_account)]
        service_account: (String, String),
    },
}

fn parse_service_account(s: &str) -> Result<(String, String), String> {
    match s.split_once(':') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() => Ok((ns.into(), name.into())),
        _ => Err(format!("{s:?} is not NAMESPACE:NAME")),
    }
}

/// Default `--workers`. Upstream's 2 (from 2017) halves convergence: on the
/// benchmark's plane even the floor (nothing but the required writes) is
/// twice as fast at 16 as at 2.
pub const DEFAULT_WORKERS: u16 = 16;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "sample-controller",
    version,
    about = "Reconciles samplecontroller.k8s.io/v1alpha1 Foos into nginx Deployments.",
    long_about = "Reconciles samplecontroller.k8s.io/v1alpha1 Foos into nginx Deployments.\n\n\
        Cluster access is found the usual way (--kubeconfig, then KUBECONFIG, then ~/.kube/config, \
        then the in-cluster service account); --master overrides the API server address, and \
        without --kubeconfig it connects to that address with no credentials at all, as upstream.\n\
        Logging is controlled by RUST_LOG (default: info, without kube-client's per-request error logs)."
)]
pub struct Cli {
    /// Without a command, the operator runs.
    #[command(subcommand)]
    pub(crate) command: Option<Command>,

    /// Path to a kubeconfig. Only required if out-of-cluster.
    #[arg(long, env = "SAMPLE_CONTROLLER_KUBECONFIG", value_name = "PATH", global = true)]
    pub(crate) kubeconfig: Option<String>,

    /// The address of the Kubernetes API server. Overrides any value in kubeconfig; without
    /// --kubeconfig, requests go to it with no credentials (as upstream's).
    #[arg(long, env = "SAMPLE_CONTROLLER_MASTER", value_name = "URL", value_parser = parse_master, global = true)]
    pub(crate) master: Option<http::Uri>,

    /// Watch Foos in this namespace only (default: all namespaces).
    #[arg(long, env = "SAMPLE_CONTROLLER_NAMESPACE", value_name = "NAMESPACE", global = true)]
    pub(crate) namespace: Option<String>,

    /// Reconcile only the Foos whose labels match this selector (kubectl's -l grammar:
    /// 'shard=a', 'shard notin (a,b)' for the rest); their Deployments carry the Foo's values
    /// of the keys it names, and the Lease is named after it (--leader-election-id +
    /// '-shard-a-<hash>'), so each shard elects its own leader.
    #[arg(long, env = "SAMPLE_CONTROLLER_SHARD_SELECTOR", value_name = "SELECTOR", value_parser = Shard::parse, global = true)]
    pub(crate) shard_selector: Option<Shard>,

    /// Fill the caches with streaming lists (a watch with sendInitialEvents, Kubernetes 1.34+)
    /// instead of paged LISTs.
    #[arg(long, env = "SAMPLE_CONTROLLER_STREAMING_LISTS", default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) streaming_lists: bool,

    /// Foos reconciled concurrently. A sync makes no reads and at most a few
    /// writes, so it mostly waits on round trips; the API server's Priority
    /// and Fairness, not this number, is what protects it.
    #[arg(long, env = "SAMPLE_CONTROLLER_WORKERS", default_value_t = DEFAULT_WORKERS, value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) workers: u16,

    /// The memory this replica may use, as Kubernetes writes it (128Mi), to size its Foos
    /// against (sample_controller_memory_limit_foos, a WARN past it); default: its cgroup's limit.
    #[arg(long, env = "SAMPLE_CONTROLLER_MEMORY_LIMIT", value_name = "BYTES", value_parser = crate::ops::sizing::parse_quantity)]
    pub(crate) memory_limit: Option<u64>,

    /// How long one sync of a Foo may take before it is abandoned, counted
    /// (controller_runtime_reconcile_timeouts_total) and retried with backoff, as
    /// controller-runtime's ReconciliationTimeout. A healthy sync takes milliseconds;
    /// the default leaves room for two of the API server's own 60 s request timeouts.
    #[arg(long, env = "SAMPLE_CONTROLLER_RECONCILE_TIMEOUT", default_value = "2m", value_parser = parse_positive_duration)]
    pub(crate) reconcile_timeout: Duration,

    /// Address for Prometheus metrics (/metrics), e.g. ":8443"; "0" (the default, as kubebuilder's)
    /// serves none, so a bare run opens no port but the probes'.
    #[arg(long, env = "SAMPLE_CONTROLLER_METRICS_BIND_ADDRESS", default_value = "0", value_name = "ADDR", value_parser = parse_bind_address)]
    pub(crate) metrics_bind_address: BindAddress,

    /// Serve metrics over HTTPS, only to callers whose bearer token passes a TokenReview and a
    /// SubjectAccessReview for get on /metrics (the default, as kubebuilder's); false serves
    /// them over plain HTTP to anyone who can connect.
    #[arg(long, env = "SAMPLE_CONTROLLER_METRICS_SECURE", default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) metrics_secure: bool,

    /// Directory holding the metrics certificate as tls.crt and tls.key (a kubernetes.io/tls
    /// Secret), read again when it changes; without it, a self-signed one is made at start.
    #[arg(long, env = "SAMPLE_CONTROLLER_METRICS_CERT_DIR", value_name = "DIR")]
    pub(crate) metrics_cert_dir: Option<std::path::PathBuf>,

    /// Offer HTTP/2 on the secure metrics listener (off: the HTTP/2 rapid-reset attacks).
    #[arg(long, env = "SAMPLE_CONTROLLER_ENABLE_HTTP2", default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) enable_http2: bool,

    /// Address for the liveness (/healthz) and readiness (/readyz) probes; "0" disables it.
    #[arg(long, env = "SAMPLE_CONTROLLER_HEALTH_PROBE_BIND_ADDRESS", default_value = ":8081", value_name = "ADDR", value_parser = parse_bind_address)]
    pub(crate) health_probe_bind_address: BindAddress,

    /// Elect a leader through a coordination.k8s.io Lease; only the leader reconciles.
    #[arg(long, env = "SAMPLE_CONTROLLER_LEADER_ELECT", default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) leader_elect: bool,

    /// Name of the Lease used for leader election.
    #[arg(
        long,
        env = "SAMPLE_CONTROLLER_LEADER_ELECTION_ID",
        default_value = "sample-controller",
        value_name = "NAME",
        global = true
    )]
    pub(crate) leader_election_id: String,

    /// Namespace of the leader-election Lease (default: the client's namespace: the pod's in a
    /// cluster, else the kubeconfig context's, else "default").
    #[arg(long, env = "SAMPLE_CONTROLLER_LEADER_ELECTION_NAMESPACE", value_name = "NAMESPACE", global = true)]
    pub(crate) leader_election_namespace: Option<String>,

    /// How long a standby waits after the last renewal it saw before taking over.
    #[arg(long, env = "SAMPLE_CONTROLLER_LEADER_ELECT_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub(crate) leader_elect_lease_duration: Duration,

    /// How long the leader keeps trying to renew before it gives up leading (and exits).
    #[arg(long, env = "SAMPLE_CONTROLLER_LEADER_ELECT_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    pub(crate) leader_elect_renew_deadline: Duration,

    /// Interval between attempts to acquire or renew the lease.
    #[arg(long, env = "SAMPLE_CONTROLLER_LEADER_ELECT_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    pub(crate) leader_elect_retry_period: Duration,

    /// How often the leader checks, by two server-side dry runs, that the API server confines its
    /// ServiceAccount to the Deployment writes the operator makes (deploy/'s admission policy);
    /// "0" checks only at start.
    #[arg(long, env = "SAMPLE_CONTROLLER_CONFINEMENT_CHECK_PERIOD", default_value = "5m", value_parser = parse_duration)]
    pub(crate) confinement_check_period: Duration,

    /// Log format.
    #[arg(long, env = "SAMPLE_CONTROLLER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Where to serve an endpoint; `None` when disabled ("0").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BindAddress(pub Option<SocketAddr>);

fn parse_master(master: &str) -> Result<http::Uri, String> {
    master.parse().map_err(|e| format!("{master:?} is not a URL: {e}"))
}

/// A bind address in kubebuilder's forms: ":8080" (all interfaces),
/// "127.0.0.1:8080", or "0" (disabled).
pub(crate) fn parse_bind_address(addr: &str) -> Result<BindAddress, String> {
    if addr == "0" || addr.is_empty() {
        return Ok(BindAddress(None));
    }
    let full = if addr.starts_with(':') { format!("0.0.0.0{addr}") } else { addr.to_owned() };
    full.parse().map(|a| BindAddress(Some(a))).map_err(|e| format!("{addr:?}: {e} (expected host:port, :port or 0)"))
}

/// A [`parse_duration`] above zero: a deadline of nothing would fail every sync.
fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    parse_duration(s).and_then(|d| if d.is_zero() { Err(format!("{s:?}: must be above zero")) } else { Ok(d) })
}

/// A duration as Go's `time.ParseDuration` reads it ("15s", "500ms",
/// "1m30s", "1.5h"), as client-go's leader-election flags take it; not
/// negative.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration like 15s, 500ms, 1m30s or 2h");
    let nanos = go_parse_duration::parse_duration(s.trim()).map_err(|_| bad())?;
    u64::try_from(nanos).map(Duration::from_nanos).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_addresses_in_kubebuilder_forms() {
        assert_eq!(parse_bind_address(":8080").unwrap(), BindAddress(Some("0.0.0.0:8080".parse().unwrap())));
        assert_eq!(parse_bind_address("127.0.0.1:9").unwrap(), BindAddress(Some("127.0.0.1:9".parse().unwrap())));
        assert_eq!(parse_bind_address("0").unwrap(), BindAddress(None));
        let err = Cli::try_parse_from(["sample-controller", "--metrics-bind-address", "nope"]).unwrap_err();
        assert!(err.to_string().contains("expected host:port, :port or 0"), "{err}");
        assert!(Cli::try_parse_from(["sample-controller", "--master", "not a url"]).is_err());
    }

    #[test]
    fn a_shard_selector_is_checked_at_start_and_its_fault_named() {
        let err = Cli::try_parse_from(["sample-controller", "--shard-selector", "app=nginx"]).unwrap_err();
        assert!(err.to_string().contains("set on Deployments by the controller"), "{err}");
        let cli = Cli::try_parse_from(["sample-controller", "--shard-selector", "!shard"]).unwrap();
        assert_eq!(cli.shard_selector.unwrap().selector().as_deref(), Some("!shard"));
    }

    #[test]
    fn version_names_the_crate_version() {
        let shown = Cli::try_parse_from(["sample-controller", "--version"]).unwrap_err();
        assert_eq!(shown.kind(), clap::error::ErrorKind::DisplayVersion);
        assert_eq!(shown.to_string().trim(), format!("sample-controller {}", env!("CARGO_PKG_VERSION")));
    }

    #[test]
    fn durations_in_go_forms() {
        let ok = [
            ("15s", Duration::from_secs(15)),
            ("500ms", Duration::from_millis(500)),
            ("2m", Duration::from_secs(120)),
            ("1m30s", Duration::from_secs(90)),
            ("1h", Duration::from_secs(3600)),
            ("1.5s", Duration::from_millis(1500)),
            ("0", Duration::ZERO),
            ("250us", Duration::from_micros(250)),
        ];
        for (text, want) in ok {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
        for bad in ["soon", "15", "5d", "", "s", "-1s", "1..5s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} must be refused");
        }
    }

    /// kubebuilder's scaffold: metrics off, and secure once an address turns
    /// them on; probes on :8081.
    #[test]
    fn defaults_match_kubebuilder() {
        let cli = Cli::try_parse_from(["sample-controller"]).unwrap();
        assert_eq!(cli.workers, DEFAULT_WORKERS);
        assert!(!cli.leader_elect);
        assert_eq!(cli.metrics_bind_address, BindAddress(None));
        assert!(cli.metrics_secure);
        assert_eq!(cli.health_probe_bind_address, BindAddress(Some("0.0.0.0:8081".parse().unwrap())));
        let cli = Cli::try_parse_from(["sample-controller", "--metrics-bind-address", ":8443"]).unwrap();
        assert!(cli.metrics_secure, "turning metrics on must not turn their authentication off");
        let cli = Cli::try_parse_from(["sample-controller", "--metrics-secure=false"]).unwrap();
        assert!(!cli.metrics_secure);
        let cli = Cli::try_parse_from(["sample-controller", "--leader-elect", "--workers", "4"]).unwrap();
        assert!(cli.leader_elect);
        assert_eq!(cli.workers, 4);
        assert!(Cli::try_parse_from(["sample-controller", "--workers", "0"]).is_err());
    }

    #[test]
    fn a_sync_has_a_two_minute_deadline_unless_told_another_above_zero() {
        let cli = Cli::try_parse_from(["sample-controller"]).unwrap();
        assert_eq!(cli.reconcile_timeout, Duration::from_secs(120));
        let cli = Cli::try_parse_from(["sample-controller", "--reconcile-timeout=1500ms"]).unwrap();
        assert_eq!(cli.reconcile_timeout, Duration::from_millis(1500));
        assert!(Cli::try_parse_from(["sample-controller", "--reconcile-timeout=0"]).is_err());
    }
}
