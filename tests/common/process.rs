//! Programs the tests start — the operator binary, its image under runc,
//! the client-go examples, Prometheus — each a [`Process`] killed when
//! dropped, so a failing test leaves nothing running.

use std::collections::{BTreeSet, HashSet};
use std::ops::{Deref, DerefMut};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kube_secure_metrics::{METRICS_ENDPOINTS, PROBE_ENDPOINTS};

use k8s_openapi::api::coordination::v1::Lease;

use super::{TIMEOUT, TestNamespace, kubeconfig_path, metric, wait_until};

/// A started program; killed and reaped when dropped.
pub struct Process(Child);

impl Process {
    /// Start `cmd`; `what` names it in the panic if it cannot start.
    pub fn start(cmd: &mut Command, what: &str) -> Self {
        Process(cmd.spawn().unwrap_or_else(|e| panic!("cannot start {what}: {e}")))
    }
}

impl Deref for Process {
    type Target = Child;

    fn deref(&self) -> &Child {
        &self.0
    }
}

impl DerefMut for Process {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `sample-controller` process and the ports it serves on.
pub struct Operator {
    pub child: Process,
    pub metrics: u16,
    pub probes: u16,
}

/// Send `signal` (`-TERM`, `-STOP`, `-CONT`) to the operator process.
/// The host's fixed ports — 8081 and 8443, a bare run's and deploy/'s —
/// held by one test at a time, across the test command's runners (they
/// share the target directory): taken, it is released when dropped, after
/// what bound them has exited (drop that first).
pub struct HostPorts(#[allow(dead_code)] std::fs::File);

impl HostPorts {
    pub fn lock() -> Self {
        let path = format!("{}/host-ports.lock", env!("CARGO_TARGET_TMPDIR"));
        let file = std::fs::File::create(&path).unwrap_or_else(|e| panic!("create {path}: {e}"));
        file.lock().unwrap_or_else(|e| panic!("lock {path}: {e}"));
        HostPorts(file)
    }
}

pub fn signal(op: &Operator, signal: &str) {
    let pid = op.child.id().to_string();
    assert!(Command::new("kill").args([signal, &pid]).status().unwrap().success(), "kill {signal} {pid}");
}

/// The ports `pid` listens on — TCP in LISTEN, UDP bound — over IPv4 and
/// IPv6, from /proc: the kernel's socket tables, matched by inode against
/// the sockets among the process's open files. The tests' own connections
/// are not the process's sockets, so only what it opened is counted.
pub fn listening_ports(pid: u32) -> BTreeSet<u16> {
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap_or_else(|e| panic!("read the open files of process {pid}: {e}"))
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|link| Some(link.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned()))
        .collect();
    let mut ports = BTreeSet::new();
    // st: 0A is TCP_LISTEN; a bound, unconnected UDP socket reads 07.
    for (table, listening) in [("tcp", "0A"), ("tcp6", "0A"), ("udp", "07"), ("udp6", "07")] {
        // The tables of the process's network namespace.
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(st), Some(inode)) = (fields.get(1), fields.get(3), fields.get(9)) else { continue };
            if *st == listening && inodes.contains(*inode) {
                let port = local.rsplit(':').next().and_then(|hex| u16::from_str_radix(hex, 16).ok());
                // Port 0: a UDP socket not bound to any port.
                ports.extend(port.filter(|p| *p != 0));
            }
        }
    }
    ports
}

/// Lease timings short enough for tests: 5 s lease, 3 s renew deadline,
/// 1 s retry.
pub const LEASE: Duration = Duration::from_secs(5);

/// How late after a Lease's expiry a standby may take it: the watch's
/// delivery of the dead leader's last renewal, and the standby's one write.
/// No retry period: the standby sleeps until the expiry itself, timed from
/// when its watch showed that renewal (crates/kube-lease-fence/src/elector.rs, `acquire`).
pub const EXPIRY_SLACK: Duration = Duration::from_secs(1);

/// The operator's exit status once it has exited, within `bound`.
pub async fn exited_within(op: &mut Operator, bound: Duration, what: &str) -> std::process::ExitStatus {
    // A child process's exit has no watch: polled.
    wait_until(what, bound, || {
        let status = op.child.try_wait().expect("wait for the operator");
        async move { status }
    })
    .await
}

pub async fn spawn_operator(ns: &str, kubeconfig: &str, extra: &[&str], log_name: &str) -> Operator {
    start_logged(operator_command(ns, kubeconfig, extra), log_name).await
}

/// The operator binary watching `ns`, as `kubeconfig` authenticates, on
/// ports the kernel picks (it logs which); its metrics over plain HTTP for
/// the tests to read, unless `extra` asks for `--metrics-secure`.
pub fn operator_command(ns: &str, kubeconfig: &str, extra: &[&str]) -> Command {
    let mut cmd = cluster_wide_command(kubeconfig, extra);
    cmd.args(["--namespace", ns]);
    cmd
}

/// As [`operator_command`], watching every namespace.
pub fn cluster_wide_command(kubeconfig: &str, extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sample-controller"));
    cmd.args(["--kubeconfig", kubeconfig]).args([
        "--metrics-bind-address",
        "127.0.0.1:0",
        "--health-probe-bind-address",
        "127.0.0.1:0",
    ]);
    if !extra.iter().any(|a| a.starts_with("--metrics-secure")) {
        cmd.arg("--metrics-secure=false");
    }
    cmd.args(extra).env("RUST_LOG", "info,sample_controller=debug").env_remove("SAMPLE_CONTROLLER_KUBECONFIG");
    // The plane is on loopback: no proxy of the machine's in between.
    for proxy in ["HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy"] {
        cmd.env_remove(proxy);
    }
    cmd
}

/// Start an operator (the binary, or the image under runc) with its log in
/// a file under the test's target directory, and wait until it has logged
/// the ports it bound.
pub async fn start_logged(mut cmd: Command, log_name: &str) -> Operator {
    let log_path = format!("{}/{log_name}.log", env!("CARGO_TARGET_TMPDIR"));
    let log = std::fs::File::create(&log_path).unwrap();
    let child = Process::start(cmd.stdout(Stdio::null()).stderr(log), "the operator");
    let (metrics, probes) = wait_until("the operator to report its ports", TIMEOUT, || async {
        let log = std::fs::read_to_string(&log_path).ok()?;
        Some((bound_port(&log, METRICS_ENDPOINTS)?, bound_port(&log, PROBE_ENDPOINTS)?))
    })
    .await;
    Operator { child, metrics, probes }
}

/// The port of the listener serving `endpoints`, from its start-up log line,
/// as text (`serving HTTP addr=127.0.0.1:PORT endpoints=...`) or JSON
/// (`{"message":"serving HTTP","addr":"...","endpoints":"..."}`).
fn bound_port(log: &str, endpoints: &str) -> Option<u16> {
    let addr = log.lines().find_map(|line| match serde_json::from_str::<serde_json::Value>(line) {
        Ok(json) => (json["message"] == "serving HTTP" && json["endpoints"] == endpoints)
            .then(|| json["addr"].as_str().map(str::to_owned))?,
        Err(_) => (line.contains("serving HTTP") && line.ends_with(&format!("endpoints={endpoints}")))
            .then(|| line.split_whitespace().find_map(|w| w.strip_prefix("addr=")).map(str::to_owned))?,
    })?;
    addr.rsplit(':').next()?.parse().ok()
}

/// Leader-election flags for a candidate in `ns`: the renew deadline is 3/5
/// of the lease, the retry period 1 s.
pub fn election_args(ns: &str, lease_duration: Duration) -> Vec<String> {
    lease_args(ns, "sample-controller-test", lease_duration)
}

/// Leader-election flags for a candidate for the Lease `ns/name`, timed as
/// [`election_args`].
pub fn lease_args(ns: &str, name: &str, lease_duration: Duration) -> Vec<String> {
    let secs = lease_duration.as_secs();
    vec![
        "--leader-elect".into(),
        format!("--leader-election-id={name}"),
        format!("--leader-election-namespace={ns}"),
        format!("--leader-elect-lease-duration={secs}s"),
        format!("--leader-elect-renew-deadline={}s", (secs * 3 / 5).max(1)),
        "--leader-elect-retry-period=1s".into(),
    ]
}

pub async fn spawn_candidate(ns: &str, lease_duration: Duration, name: &str) -> Operator {
    let args = election_args(ns, lease_duration);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    spawn_operator(ns, &kubeconfig_path(), &args, &format!("{ns}-{name}")).await
}

pub const SUCCESS_SERIES: &str = "controller_runtime_reconcile_total{controller=\"foo\",result=\"success\"}";
pub const RECONCILE_ERRORS_SERIES: &str = "controller_runtime_reconcile_errors_total{controller=\"foo\"}";
pub const LEADER_SERIES: &str = "leader_election_master_status{name=\"sample-controller-test\"}";

/// The identity holding the test Lease, if any.
pub async fn holder(ns: &TestNamespace) -> Option<String> {
    let lease = ns.api::<Lease>().get_opt("sample-controller-test").await.ok()??;
    lease.spec?.holder_identity.filter(|h| !h.is_empty())
}

/// Wait until exactly one of `ops` reports itself leader; return its index.
pub async fn one_leader(ops: &[&Operator]) -> usize {
    wait_until("exactly one leader", TIMEOUT, || async {
        let mut leaders = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            match metric(op, LEADER_SERIES).await {
                Some(1.0) => leaders.push(i),
                Some(_) => {}
                None => return None, // not up yet
            }
        }
        (leaders.len() == 1).then(|| leaders[0])
    })
    .await
}

/// A workspace example's binary (`cargo build --workspace --all-targets`
/// builds it beside the test binaries, as the test command does), talking
/// to the test plane as its admin.
pub fn example_command(name: &str) -> Command {
    let exe = std::env::current_exe().expect("the test binary's path");
    // target/<profile>/deps/<test> -> target/<profile>/examples/<name>
    let path =
        exe.parent().and_then(|deps| deps.parent()).expect("a test binary under target/").join("examples").join(name);
    assert!(path.exists(), "{} is not built: cargo build --workspace --all-targets builds it", path.display());
    let mut cmd = Command::new(path);
    cmd.env("KUBECONFIG", kubeconfig_path());
    for proxy in ["HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy"] {
        cmd.env_remove(proxy);
    }
    cmd
}
