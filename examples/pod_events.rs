//! A Pod operator that reports every Pod add, update and delete, with the
//! output of the classic client-go "Pod operator" examples:
//!
//! ```text
//! Find a Pod add event.
//!     Name: <name>
//!     Resource Version: <resourceVersion>
//! Find a Pod update event.
//!     Pod Name: <name>
//!     Resource Version: <resourceVersion>
//!     Old Status: <phase>
//!     New Status: <phase>
//! Find a Pod delete event.
//!     Name: <name>
//!     Resource Version: <resourceVersion>
//! ```
//!
//! As there, an update is reported when the Pod's phase changes. Written on
//! kube-runtime's `watcher`: its events say "applied" or "deleted", so the
//! previous version of each Pod is kept to tell an add from an update, and
//! a Pod missing from a re-list (a deletion while the watch was down) is
//! reported as deleted, as client-go's informer does.
//!
//! ```sh
//! cargo run --example pod_events -- --namespace default
//! cargo run --example pod_events -- --namespace default --leader-elect
//! ```
//!
//! With `--leader-elect`, replicas contend for the Lease `pod-events` in
//! the namespace (`default` without one) through kube-lease-fence
//! (crates/), and only the leader reports: it prints `leading as
//! <identity>` once it holds the Lease, and releases it on SIGTERM or
//! Ctrl-C, so a standby takes over at once. The elector's write gate has
//! nothing to guard here (printing writes nothing to the API server); a
//! reporter that wrote would check `gate.holds()` before each write.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch};
use kube::{Api, Client, ResourceExt};
use kube_lease_fence::{Elector, LeaderConfig, default_identity};
use tokio::signal::unix::{SignalKind, signal};

/// What is remembered of a Pod: its resourceVersion and phase.
#[derive(Clone)]
struct Seen {
    resource_version: String,
    phase: String,
}

impl Seen {
    fn of(pod: &Pod) -> Self {
        Seen {
            resource_version: pod.resource_version().unwrap_or_default(),
            phase: pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default(),
        }
    }
}

#[derive(Default)]
struct Pods {
    known: BTreeMap<String, Seen>,
    /// Names listed since the last `Init` (a re-list in progress).
    relisted: BTreeSet<String>,
}

impl Pods {
    fn applied(&mut self, pod: &Pod) {
        let (name, now) = (pod.name_any(), Seen::of(pod));
        match self.known.insert(name.clone(), now.clone()) {
            None => println!("Find a Pod add event.\n\tName: {name}\n\tResource Version: {}", now.resource_version),
            Some(before) if before.phase != now.phase => println!(
                "Find a Pod update event.\n\tPod Name: {name}\n\tResource Version: {}\n\tOld Status: {}\n\tNew Status: {}",
                now.resource_version, before.phase, now.phase
            ),
            Some(_) => {}
        }
    }

    fn deleted(&mut self, name: &str, resource_version: &str) {
        self.known.remove(name);
        println!("Find a Pod delete event.\n\tName: {name}\n\tResource Version: {resource_version}");
    }

    fn handle(&mut self, event: Event<Pod>) {
        match event {
            Event::Init => self.relisted.clear(),
            Event::InitApply(pod) => {
                self.relisted.insert(pod.name_any());
                self.applied(&pod);
            }
            Event::InitDone => {
                let gone: Vec<(String, Seen)> = self
                    .known
                    .iter()
                    .filter(|(n, _)| !self.relisted.contains(*n))
                    .map(|(n, s)| (n.clone(), s.clone()))
                    .collect();
                for (name, seen) in gone {
                    self.deleted(&name, &seen.resource_version);
                }
            }
            Event::Apply(pod) => self.applied(&pod),
            Event::Delete(pod) => self.deleted(&pod.name_any(), &pod.resource_version().unwrap_or_default()),
        }
    }
}

/// Report every Pod event of `pods`, for ever.
async fn report(pods: Api<Pod>) {
    let mut state = Pods::default();
    let mut events = std::pin::pin!(watch(pods, watcher::Config::default()).default_backoff());
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => state.handle(event),
            Err(e) => eprintln!("watch error (retrying): {e}"),
        }
    }
}

/// Report only while this replica holds the Lease `pod-events` in
/// `namespace`; release it on SIGTERM or Ctrl-C.
async fn report_as_leader(client: Client, namespace: &str, pods: Api<Pod>) -> Result<(), String> {
    let identity = default_identity("POD_NAME", "pod-events");
    let cfg = LeaderConfig::new("pod-events", namespace, identity).with_retry_cap(Duration::from_secs(60));
    let identity = cfg.identity.clone();
    let mut elector = Elector::new(client, cfg).map_err(|e| e.to_string())?;
    let mut terminate = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let stop = async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    let mut stop = std::pin::pin!(stop);
    tokio::select! {
        () = elector.acquire() => println!("leading as {identity}"),
        () = &mut stop => return Ok(()),
    }
    let result = tokio::select! {
        lost = elector.hold() => Err(format!("stopped leading: {lost}")),
        () = report(pods) => Ok(()),
        () = &mut stop => Ok(()),
    };
    elector.release().await;
    result
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::try_default().await?;
    let args: Vec<String> = std::env::args().collect();
    let namespace = args.iter().position(|a| a == "--namespace").and_then(|i| args.get(i + 1));
    let pods: Api<Pod> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    if args.iter().any(|a| a == "--leader-elect") {
        report_as_leader(client, namespace.map_or("default", String::as_str), pods).await?;
    } else {
        report(pods).await;
    }
    Ok(())
}
