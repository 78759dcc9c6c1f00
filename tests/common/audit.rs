//! The API server's audit log, as hack/audit.py reads it for the tests and
//! the benchmarks alike: every request a client made, counted once.

use std::process::Command;
use std::time::{Duration, Instant};

use sample_controller::testing::client::USER_AGENT;

use super::TIMEOUT;

pub const AUDIT_LOG_ENV: &str = "SAMPLE_CONTROLLER_TEST_AUDIT_LOG";

/// One request as the API server's audit log records it.
#[derive(Debug, Clone, PartialEq)]
pub struct Audited {
    /// Who, as the API server saw it: the impersonated user if any.
    pub user: String,
    /// The pod the request's ServiceAccount token is bound to, if any.
    pub pod: Option<String>,
    /// When the API server received it.
    pub at: k8s_openapi::jiff::Timestamp,
    pub verb: String,
    pub resource: String,
    pub subresource: Option<String>,
    pub name: Option<String>,
    /// The HTTP status of the answer (none for a watch that only started).
    pub code: Option<u16>,
    /// A server-side dry run (`dryRun=All`): admitted or refused, nothing
    /// written.
    pub dry_run: bool,
}

impl Audited {
    /// Whether the API server admitted it (a 2xx answer).
    pub fn admitted(&self) -> bool {
        self.code.is_some_and(|c| (200..300).contains(&c))
    }
}

/// The requests clients whose User-Agent starts with `user_agent` made in
/// `namespace`, from the audit log hack/test.sh has the API server write.
/// Counting there sees every request a client makes, not only the ones a
/// test expects.
pub fn audited(namespace: &str, user_agent: &str) -> Vec<Audited> {
    records(user_agent, namespace, "-")
}

/// Every request `user` made (or someone impersonating it), in any namespace.
pub fn audited_as(user: &str) -> Vec<Audited> {
    records("-", "-", user)
}

/// hack/audit.py's `records`: the one reader of the audit log, shared with
/// the benchmarks ("-" matches anything).
fn records(user_agent: &str, namespace: &str, user: &str) -> Vec<Audited> {
    let path = std::env::var(AUDIT_LOG_ENV).unwrap_or_else(|_| {
        panic!("{AUDIT_LOG_ENV} is not set: run the tests with hack/test.sh, whose control plane writes an audit log")
    });
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/hack/audit.py");
    let out = Command::new("python3")
        .args([script, "records", &path, user_agent, namespace, user])
        .output()
        .expect("run python3 hack/audit.py");
    assert!(out.status.success(), "hack/audit.py records failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            let e: serde_json::Value = serde_json::from_str(line).expect("a JSON line from hack/audit.py");
            let text = |v: &serde_json::Value| v.as_str().map(str::to_owned);
            Audited {
                user: text(&e["user"]).unwrap_or_default(),
                pod: text(&e["pod"]),
                at: e["at"].as_str().and_then(|t| t.parse().ok()).unwrap_or_default(),
                verb: text(&e["verb"]).unwrap_or_default(),
                resource: text(&e["resource"]).unwrap_or_default(),
                subresource: text(&e["subresource"]),
                name: text(&e["name"]),
                code: e["code"].as_u64().and_then(|c| u16::try_from(c).ok()),
                dry_run: e["dry_run"].as_bool().unwrap_or(false),
            }
        })
        .collect()
}

/// The operator's requests in `ns` once their count has not moved for
/// `still` (its Events go out in the background, after the syncs). Lease
/// renewals never stop, so they do not count as movement.
pub async fn settled_requests(ns: &str, still: Duration) -> Vec<Audited> {
    let moving = |all: &[Audited]| all.iter().filter(|r| r.resource != "leases").count();
    let (mut last, mut since) = (audited_apart(ns).await, Instant::now());
    let deadline = Instant::now() + TIMEOUT;
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = audited_apart(ns).await;
        if moving(&now) != moving(&last) {
            (last, since) = (now, Instant::now());
        } else if since.elapsed() >= still {
            return now;
        }
        let latest = &last[last.len().saturating_sub(5)..];
        assert!(Instant::now() < deadline, "the operator kept making requests; the latest: {latest:?}");
    }
}

/// The operator's requests in `ns`, read on tokio's blocking pool: a large
/// audit log takes seconds to read, and a test's other futures (one
/// sampling the replicas, say) must run meanwhile.
async fn audited_apart(ns: &str) -> Vec<Audited> {
    let ns = ns.to_owned();
    tokio::task::spawn_blocking(move || audited(&ns, USER_AGENT)).await.expect("read the audit log")
}

/// Verbs that change something.
pub const WRITES: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];
