//! The overload benchmark's driver (hack/bench-overload.sh; not a benchmark
//! of its own): runs one client — this operator, or the client-go reference —
//! against the plane through the tests' fault-injecting proxy, waits until it
//! has listed and is watching, cuts its watches and refuses every request for
//! a while, then lets everything through, and prints one line of what the
//! client did:
//!
//!   LABEL FAULT requests=N lists=N most_in_1s=N rewatch_s=S|none
//!
//! `rewatch_s` is the time from the fault's end until the client's watches
//! of both Foos and Deployments went through again (`none` within 30 s).
//!
//!   overload --kubeconfig K --fault 429|500|503 --seconds S --label L -- CMD ARGS...
//!
//! `{kubeconfig}` in ARGS is replaced by a kubeconfig for the proxy.
#[path = "../tests/common/fault_proxy.rs"]
#[allow(dead_code)]
mod fault_proxy;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fault_proxy::{Fault, FaultProxy, Seen, most_within};
use kube::config::{KubeConfigOptions, Kubeconfig};

/// How long the client is given to watch again after the fault.
const RECOVERY: Duration = Duration::from_secs(30);

struct Args {
    kubeconfig: String,
    fault: String,
    seconds: u64,
    label: String,
    command: Vec<String>,
}

fn args() -> Args {
    let mut it = std::env::args().skip(1);
    let (mut kubeconfig, mut fault, mut seconds, mut label) = (None, None, 60, String::from("client"));
    let mut command = Vec::new();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--kubeconfig" => kubeconfig = it.next(),
            "--fault" => fault = it.next(),
            "--seconds" => seconds = it.next().and_then(|s| s.parse().ok()).expect("--seconds N"),
            "--label" => label = it.next().expect("--label L"),
            "--bench" => {} // cargo bench passes it
            // cargo bench appends its --bench after ours too.
            "--" => command = it.by_ref().filter(|a| a != "--bench").collect(),
            other => panic!("unknown argument {other}"),
        }
    }
    Args { kubeconfig: kubeconfig.expect("--kubeconfig"), fault: fault.expect("--fault"), seconds, label, command }
}

fn fault(name: &str) -> Fault {
    match name {
        "429" => Fault::Refuse { code: 429, retry_after: Some(1) },
        "500" => Fault::Refuse { code: 500, retry_after: None },
        "503" => Fault::Refuse { code: 503, retry_after: None },
        "reset" => Fault::Reset,
        other => panic!("unknown fault {other}: 429, 500, 503 or reset"),
    }
}

/// Whether `client`'s watches of Foos and Deployments both passed at or
/// after `since`.
fn watching(seen: &[Seen], since: Instant) -> Option<Instant> {
    let first = |resource: &str| {
        seen.iter().find(|s| s.at >= since && s.passed && s.is_watch() && s.resource == resource).map(|s| s.at)
    };
    Some(first("foos")?.max(first("deployments")?))
}

#[tokio::main]
async fn main() {
    let args = args();
    let kc = Kubeconfig::read_from(&args.kubeconfig).expect("read the kubeconfig");
    let upstream = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await.expect("kubeconfig");
    let proxy = FaultProxy::start(upstream, &[]).await;
    let path = std::env::temp_dir().join(format!("overload-{}-kubeconfig", std::process::id()));
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters: [{{name: proxy, cluster: {{server: \"{}\"}}}}]\n\
         users: [{{name: none, user: {{}}}}]\ncontexts: [{{name: proxy, context: {{cluster: proxy, user: none}}}}]\n\
         current-context: proxy\n",
        proxy.url
    );
    std::fs::write(&path, kubeconfig).unwrap();
    let command: Vec<String> = args.command.iter().map(|a| a.replace("{kubeconfig}", path.to_str().unwrap())).collect();
    let log_path = std::env::temp_dir().join(format!("overload-{}-{}.log", args.label, std::process::id()));
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = Command::new(&command[0])
        .args(&command[1..])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start the client");

    // Listed and watching, and a moment more for its first syncs.
    let started = Instant::now();
    while watching(&proxy.seen(), started).is_none() {
        if started.elapsed() > Duration::from_secs(120) {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            panic!("the client never started watching; its log ({}):\n{log}", log_path.display());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;

    let from = Instant::now();
    proxy.set(fault(&args.fault));
    proxy.cut_watches();
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    proxy.set(Fault::None);
    let ended = Instant::now();
    let mut rewatch = None;
    while rewatch.is_none() && ended.elapsed() < RECOVERY {
        tokio::time::sleep(Duration::from_millis(50)).await;
        rewatch = watching(&proxy.seen(), ended);
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&log_path);

    let during: Vec<Seen> = proxy.seen().into_iter().filter(|s| s.at >= from && s.at < ended).collect();
    let lists = during.iter().filter(|s| s.is_full_list()).count();
    let rewatch = rewatch.map_or("none".to_owned(), |at| format!("{:.1}", (at - ended).as_secs_f64()));
    println!(
        "{} {} requests={} lists={} most_in_1s={} rewatch_s={}",
        args.label,
        args.fault,
        during.len(),
        lists,
        most_within(&during, Duration::from_secs(1)),
        rewatch
    );
}
