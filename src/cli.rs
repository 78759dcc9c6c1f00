//! Command-line flags, each also settable through an environment variable.
//! Names follow upstream sample-controller (`--kubeconfig`, `--master`) and
//! kubebuilder (`--metrics-bind-address`, `--health-probe-bind-address`,
//! `--leader-elect`).

use std::net::SocketAddr;
use std::time::Duration;

use clap::{CommandFactory, Parser, ValueEnum};
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::{Error, Result};

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
        then the in-cluster service account); --master overrides the API server address.\n\
        Logging is controlled by RUST_LOG (default: info, without kube-client's per-request error logs)."
)]
pub struct Cli {
    /// Path to a kubeconfig. Only required if out-of-cluster.
    #[arg(long, env = "SAMPLE_CONTROLLER_KUBECONFIG", value_name = "PATH")]
    pub kubeconfig: Option<String>,

    /// The address of the Kubernetes API server. Overrides any value in kubeconfig.
    #[arg(long, env = "SAMPLE_CONTROLLER_MASTER", value_name = "URL", value_parser = parse_master)]
    pub master: Option<http::Uri>,

    /// Watch Foos in this namespace only (default: all namespaces).
    #[arg(long, env = "SAMPLE_CONTROLLER_NAMESPACE", value_name = "NAMESPACE")]
    pub namespace: Option<String>,

    /// Foos reconciled concurrently. A sync makes no reads and at most a few
    /// writes, so it mostly waits on round trips; the API server's Priority
    /// and Fairness, not this number, is what protects it.
    #[arg(long, env = "SAMPLE_CONTROLLER_WORKERS", default_value_t = DEFAULT_WORKERS, value_parser = clap::value_parser!(u16).range(1..))]
    pub workers: u16,

    /// Address for Prometheus metrics (/metrics); "0" disables it.
    #[arg(long, env = "SAMPLE_CONTROLLER_METRICS_BIND_ADDRESS", default_value = ":8080", value_name = "ADDR", value_parser = parse_bind_address)]
    pub metrics_bind_address: BindAddress,

    /// Serve metrics over HTTPS, only to callers whose bearer token passes a TokenReview and a
    /// SubjectAccessReview for get on /metrics (on in deploy/, on :8443).
    #[arg(long, env = "SAMPLE_CONTROLLER_METRICS_SECURE", default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub metrics_secure: bool,

    /// Directory holding the metrics certificate as tls.crt and tls.key (a kubernetes.io/tls
    /// Secret), read again when it changes; without it, a self-signed one is made at start.
    #[arg(long, env = "SAMPLE_CONTROLLER_METRICS_CERT_DIR", value_name = "DIR")]
    pub metrics_cert_dir: Option<std::path::PathBuf>,

    /// Offer HTTP/2 on the secure metrics listener (off: the HTTP/2 rapid-reset attacks).
    #[arg(long, env = "SAMPLE_CONTROLLER_ENABLE_HTTP2", default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub enable_http2: bool,

    /// Address for the liveness (/healthz) and readiness (/readyz) probes; "0" disables it.
    #[arg(long, env = "SAMPLE_CONTROLLER_HEALTH_PROBE_BIND_ADDRESS", default_value = ":8081", value_name = "ADDR", value_parser = parse_bind_address)]
    pub health_probe_bind_address: BindAddress,

    /// Elect a leader through a coordination.k8s.io Lease; only the leader reconciles.
    #[arg(long, env = "SAMPLE_CONTROLLER_LEADER_ELECT", default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub leader_elect: bool,

    /// Name of the Lease used for leader election.
    #[arg(
        long,
        env = "SAMPLE_CONTROLLER_LEADER_ELECTION_ID",
        default_value = "sample-controller",
        value_name = "NAME"
    )]
    pub leader_election_id: String,

    /// Namespace of the leader-election Lease (default: the pod's namespace, else "default").
    #[arg(long, env = "SAMPLE_CONTROLLER_LEADER_ELECTION_NAMESPACE", value_name = "NAMESPACE")]
    pub leader_election_namespace: Option<String>,

    /// How long a standby waits after the last renewal it saw before taking over.
    #[arg(long, env = "SAMPLE_CONTROLLER_LEADER_ELECT_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,

    /// How long the leader keeps trying to renew before it gives up leading (and exits).
    #[arg(long, env = "SAMPLE_CONTROLLER_LEADER_ELECT_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Duration,

    /// Interval between attempts to acquire or renew the lease.
    #[arg(long, env = "SAMPLE_CONTROLLER_LEADER_ELECT_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,

    /// Log format.
    #[arg(long, env = "SAMPLE_CONTROLLER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Where to serve an endpoint; `None` when disabled ("0").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BindAddress(pub Option<SocketAddr>);

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl Cli {
    /// Client configuration: `--kubeconfig` (or KUBECONFIG), else kube's
    /// inference (~/.kube/config, then in-cluster); `--master` overrides the
    /// server address, as upstream's `clientcmd.BuildConfigFromFlags`.
    pub async fn kube_config(&self) -> Result<kube::Config> {
        let mut config = match (&self.kubeconfig, &self.master) {
            (Some(path), _) => {
                let error = |source| Error::Kubeconfig { path: path.clone(), source };
                let kc = Kubeconfig::read_from(path).map_err(error)?;
                kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await.map_err(error)?
            }
            (None, Some(master)) => kube::Config::new(master.clone()),
            (None, None) => kube::Config::infer().await.map_err(Error::NoClusterConfig)?,
        };
        if let Some(master) = &self.master {
            config.cluster_url = master.clone();
        }
        Ok(config)
    }

    pub fn lease_namespace(&self) -> String {
        self.leader_election_namespace
            .clone()
            .or_else(|| std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace").ok())
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "default".to_owned())
    }
}

/// The command line after [`from_go_style`]: what clap parses, and what
/// was translated on the way.
#[derive(Debug, Default, PartialEq)]
pub struct GoStyleArgs {
    pub args: Vec<String>,
    /// One line per flag that was mapped or ignored, for the log.
    pub notices: Vec<String>,
    /// klog's `-v=N`, as a log filter (used when RUST_LOG is unset).
    pub log_filter: Option<String>,
}

/// klog's boolean flags that upstream's command lines carry and that mean
/// nothing here: logs always go to stderr.
const KLOG_IGNORED: [&str; 2] = ["logtostderr", "alsologtostderr"];

/// Accept upstream's command line unchanged. Go's flag package takes long
/// flags with one dash (`-kubeconfig=PATH`, `-kubeconfig PATH`,
/// `-master=URL`); every long flag of ours is accepted that way too. klog's
/// `-v=N` becomes a log filter; `-logtostderr` and `-alsologtostderr` are
/// dropped. Anything else is left for clap to accept or refuse.
pub fn from_go_style(args: impl IntoIterator<Item = String>) -> GoStyleArgs {
    let ours: Vec<String> = Cli::command().get_arguments().filter_map(|a| a.get_long().map(str::to_owned)).collect();
    let mut out = GoStyleArgs::default();
    let mut args = args.into_iter();
    out.args.extend(args.next()); // the program
    while let Some(arg) = args.next() {
        if arg == "--" {
            out.args.push(arg);
            out.args.extend(args.by_ref());
            break;
        }
        let Some(flag) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            out.args.push(arg);
            continue;
        };
        let (name, value) = match flag.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (flag, None),
        };
        if name == "v" {
            let level = value.or_else(|| args.next()).unwrap_or_default();
            let filter = klog_filter(&level);
            out.notices.push(match &filter {
                Some(f) => format!("-v={level} (klog) maps to RUST_LOG={f}"),
                None => format!("-v={level} (klog) is not a number; ignored"),
            });
            out.log_filter = filter;
        } else if KLOG_IGNORED.contains(&name) {
            out.notices.push(format!("-{flag} (klog) ignored: logs always go to stderr"));
        } else if !arg.starts_with("--") && name.len() > 1 && ours.iter().any(|o| o == name) {
            out.args.push(format!("-{arg}"));
        } else {
            out.args.push(arg);
        }
    }
    out
}

/// The log filter for klog's verbosity: 0-3 is our default, 4 and 5 add our
/// debug lines, 6 and up our trace lines and kube's debug lines.
fn klog_filter(level: &str) -> Option<String> {
    let level: u8 = level.parse().ok()?;
    let base = crate::telemetry::DEFAULT_FILTER;
    Some(match level {
        0..=3 => base.to_owned(),
        4..=5 => format!("{base},sample_controller=debug"),
        _ => format!("{base},sample_controller=trace,kube=debug"),
    })
}

fn parse_master(master: &str) -> Result<http::Uri, String> {
    master.parse().map_err(|e| format!("{master:?} is not a URL: {e}"))
}

/// A bind address in kubebuilder's forms: ":8080" (all interfaces),
/// "127.0.0.1:8080", or "0" (disabled).
pub fn parse_bind_address(addr: &str) -> Result<BindAddress, String> {
    if addr == "0" || addr.is_empty() {
        return Ok(BindAddress(None));
    }
    let full = if addr.starts_with(':') { format!("0.0.0.0{addr}") } else { addr.to_owned() };
    full.parse().map(|a| BindAddress(Some(a))).map_err(|e| format!("{addr:?}: {e} (expected host:port, :port or 0)"))
}

/// Durations as Go's `time.ParseDuration` reads them in flags: "15s",
/// "500ms", "1m30s", "1.5h"; units ns, us (µs), ms, s, m, h. A bare "0"
/// is zero; any other number needs its unit.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let text = s.trim();
    let bad = || format!("{text:?} is not a duration like 15s, 500ms, 1m30s or 2h");
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err(bad());
    }
    let mut rest = text;
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(bad)?;
        let (number, tail) = rest.split_at(number_end);
        let value: f64 = number.parse().map_err(|_| bad())?;
        let unit_end = tail.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_end);
        let seconds = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => return Err(format!("{text:?}: a number needs a unit (ns, us, ms, s, m, h)")),
            _ => return Err(format!("{text:?}: unknown unit {unit:?} (use ns, us, ms, s, m or h)")),
        };
        total += value * seconds;
        rest = tail;
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
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

    fn go_style(args: &[&str]) -> GoStyleArgs {
        from_go_style(std::iter::once("sample-controller").chain(args.iter().copied()).map(str::to_owned))
    }

    #[test]
    fn upstreams_readme_command_line_starts_ours() {
        // sample-controller's README: `./sample-controller -kubeconfig=$HOME/.kube/config`
        let go = go_style(&["-kubeconfig=/home/me/.kube/config", "-master=https://10.0.0.1:6443"]);
        assert!(go.notices.is_empty(), "{:?}", go.notices);
        let cli = Cli::try_parse_from(go.args).unwrap();
        assert_eq!(cli.kubeconfig.as_deref(), Some("/home/me/.kube/config"));
        assert_eq!(cli.master, Some("https://10.0.0.1:6443".parse().unwrap()));
        // Go's other form: the value as the next argument.
        let cli = Cli::try_parse_from(go_style(&["-kubeconfig", "/k", "-namespace", "ns"]).args).unwrap();
        assert_eq!((cli.kubeconfig.as_deref(), cli.namespace.as_deref()), (Some("/k"), Some("ns")));
    }

    #[test]
    fn klog_flags_are_mapped_or_ignored_with_a_notice() {
        let go = go_style(&["-v=4", "-logtostderr", "--alsologtostderr=true", "-kubeconfig=/k"]);
        assert_eq!(go.args, ["sample-controller", "--kubeconfig=/k"]);
        assert_eq!(go.log_filter, Some(format!("{},sample_controller=debug", crate::telemetry::DEFAULT_FILTER)));
        assert_eq!(go.notices.len(), 3, "{:?}", go.notices);
        assert!(go.notices[0].starts_with("-v=4 (klog) maps to RUST_LOG="), "{:?}", go.notices);
        assert_eq!(go.notices[1], "-logtostderr (klog) ignored: logs always go to stderr");
        assert_eq!(go_style(&["-v", "2"]).log_filter.as_deref(), Some(crate::telemetry::DEFAULT_FILTER));
        assert!(go_style(&["-v=7"]).log_filter.unwrap().ends_with("sample_controller=trace,kube=debug"));
        assert_eq!(go_style(&["-v=loud"]).log_filter, None);
    }

    #[test]
    fn short_flags_values_and_unknown_flags_are_left_to_clap() {
        let go = go_style(&["-V", "--workers", "-1", "-nonsense=1", "--", "-kubeconfig=x"]);
        assert_eq!(go.args, ["sample-controller", "-V", "--workers", "-1", "-nonsense=1", "--", "-kubeconfig=x"]);
        assert!(Cli::try_parse_from(go_style(&["-nonsense=1"]).args).is_err());
    }

    #[test]
    fn defaults_match_kubebuilder() {
        let cli = Cli::try_parse_from(["sample-controller"]).unwrap();
        assert_eq!(cli.workers, DEFAULT_WORKERS);
        assert!(!cli.leader_elect);
        assert_eq!(cli.metrics_bind_address, BindAddress(Some("0.0.0.0:8080".parse().unwrap())));
        assert_eq!(cli.health_probe_bind_address, BindAddress(Some("0.0.0.0:8081".parse().unwrap())));
        let cli = Cli::try_parse_from(["sample-controller", "--leader-elect", "--workers", "4"]).unwrap();
        assert!(cli.leader_elect);
        assert_eq!(cli.workers, 4);
        assert!(Cli::try_parse_from(["sample-controller", "--workers", "0"]).is_err());
    }
}
