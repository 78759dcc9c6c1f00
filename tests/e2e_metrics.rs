//! Secure metrics as deploy/ serves them (`--metrics-secure`): HTTPS, each
//! scrape's bearer token reviewed by the API server — no token 401, a
//! ServiceAccount without the metrics-reader role 403, with it 200 — and
//! the answers cached, so repeated scrapes cost the API server nothing; then
//! a real Prometheus scraping it with a ServiceAccount token.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::json;

/// The operator, serving secure metrics, its requests made as `user` (the
/// admin impersonating it) so the audit log tells them from other tests'.
async fn secure_operator(ns: &TestNamespace, user: &str, extra: &[&str]) -> Operator {
    let kubeconfig = ns.kubeconfig_variant(user, |kc| {
        kc["users"][0]["user"]["as"] = json!(user);
        kc["users"][0]["user"]["as-groups"] = json!(["system:masters"]);
    });
    let mut args = vec!["--metrics-secure"];
    args.extend_from_slice(extra);
    spawn_operator(&ns.name, &kubeconfig, &args, &format!("{}-{user}", ns.name)).await
}

/// A token of a new ServiceAccount in `ns`: one bound to the metrics-reader
/// role if `reader`.
fn service_account_token(ns: &TestNamespace, name: &str, reader: bool) -> String {
    if reader {
        return metrics_reader_token(&ns.name, name);
    }
    ns.kubectl_ok(&["create", "serviceaccount", name]);
    ns.kubectl_ok(&["create", "token", name]).trim().to_owned()
}

/// A scrape of the metrics: (status code, HTTP version).
fn scrape(op: &Operator, token: Option<&str>, http2: bool) -> (u16, String) {
    let (code, version, _) = https_get(op.metrics, "/metrics", token, if http2 { &["--http2"] } else { &[] });
    (code, version)
}

#[tokio::test]
async fn only_a_token_allowed_to_read_metrics_gets_them_and_its_review_is_cached() {
    let ns = TestNamespace::new("metrics-auth").await;
    let user = format!("{}-operator", ns.name);
    let op = secure_operator(&ns, &user, &[]).await;
    let reader = service_account_token(&ns, "reader", true);
    let nobody = service_account_token(&ns, "nobody", false);

    assert_eq!(scrape(&op, None, false).0, 401, "no token");
    assert_eq!(scrape(&op, Some("not-a-token"), false).0, 401, "a made-up token");
    assert_eq!(scrape(&op, Some(&nobody), false).0, 403, "a ServiceAccount without the role");
    // RBAC may take a moment to see the new binding.
    wait_until("the reader's scrape to be allowed", TIMEOUT, || async {
        (scrape(&op, Some(&reader), false).0 == 200).then_some(())
    })
    .await;
    let reviews_before = reviews(&user);
    assert!(
        reviews_before.0 >= 3 && reviews_before.1 >= 2,
        "the reviews so far are in the audit log: {reviews_before:?}"
    );
    for _ in 0..10 {
        assert_eq!(scrape(&op, Some(&reader), false), (200, "1.1".into()));
    }
    assert_eq!(reviews(&user), reviews_before, "a scrape with a reviewed token asked the API server again");
    // HTTP/2 is off unless --enable-http2: a client asking for it gets 1.1.
    assert_eq!(scrape(&op, Some(&reader), true), (200, "1.1".into()));
}

/// The TokenReviews and SubjectAccessReviews `user` has made.
fn reviews(user: &str) -> (usize, usize) {
    let made = audited_as(user);
    let count = |resource: &str| made.iter().filter(|r| r.resource == resource && r.verb == "create").count();
    (count("tokenreviews"), count("subjectaccessreviews"))
}

#[tokio::test]
async fn http2_is_served_when_enabled() {
    let ns = TestNamespace::new("metrics-h2").await;
    let op = secure_operator(&ns, &format!("{}-operator", ns.name), &["--enable-http2"]).await;
    let reader = service_account_token(&ns, "reader", true);
    wait_until("an HTTP/2 scrape", TIMEOUT, || async {
        (scrape(&op, Some(&reader), true) == (200, "2".into())).then_some(())
    })
    .await;
}

/// Prometheus, scraping `target` every second over HTTPS with `token_file`;
/// stopped when dropped.
struct Prometheus {
    _child: Process,
    port: u16,
}

fn start_prometheus(name: &str, target: u16, token_file: &str) -> Prometheus {
    let dir = format!("{}/{name}", env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&dir).unwrap();
    let config = format!(
        "global: {{ scrape_interval: 1s, evaluation_interval: 1s }}\n\
         scrape_configs:\n\
         - job_name: sample-controller-metrics\n\
         \x20 scheme: https\n\
         \x20 tls_config: {{ insecure_skip_verify: true }}\n\
         \x20 authorization: {{ credentials_file: {token_file} }}\n\
         \x20 static_configs: [{{ targets: ['127.0.0.1:{target}'] }}]\n"
    );
    std::fs::write(format!("{dir}/prometheus.yml"), config).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let binary = std::env::var("PROMETHEUS").unwrap_or_else(|_| "prometheus".into());
    let log = std::fs::File::create(format!("{dir}/prometheus.log")).unwrap();
    let mut cmd = Command::new(&binary);
    cmd.arg(format!("--config.file={dir}/prometheus.yml"))
        .arg(format!("--storage.tsdb.path={dir}/data"))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(log);
    let what = format!("{binary} (hack/test.sh installs Debian's prometheus package; or set PROMETHEUS to its path)");
    Prometheus { _child: Process::start(&mut cmd, &what), port }
}

/// The samples of an instant query, as (labels, value).
async fn query(prometheus: &Prometheus, promql: &str) -> Vec<(serde_json::Value, f64)> {
    let Some((200, body)) = http_get(prometheus.port, &format!("/api/v1/query?query={promql}")).await else {
        return vec![];
    };
    let body: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let Some(result) = body["data"]["result"].as_array() else { return vec![] };
    result.iter().filter_map(|s| Some((s["metric"].clone(), s["value"][1].as_str()?.parse().ok()?))).collect()
}

#[tokio::test]
async fn a_real_prometheus_scrapes_the_operator_with_a_service_account_token() {
    let ns = TestNamespace::new("metrics-prom").await;
    let op = secure_operator(&ns, &format!("{}-operator", ns.name), &[]).await;
    let token = service_account_token(&ns, "prometheus", true);
    let token_file = format!("{}/{}-token", env!("CARGO_TARGET_TMPDIR"), ns.name);
    std::fs::write(&token_file, &token).unwrap();
    create_foo(&ns.api(), "scraped", "scraped", Some(1)).await;

    let prometheus = start_prometheus(&ns.name, op.metrics, &token_file);
    wait_until("Prometheus to report the operator up", Duration::from_secs(90), || async {
        let up = query(&prometheus, "up").await;
        up.iter().any(|(labels, v)| labels["job"] == "sample-controller-metrics" && *v == 1.0).then_some(())
    })
    .await;
    let synced = wait_until("a reconcile counted, as Prometheus stored it", TIMEOUT, || async {
        let samples = query(&prometheus, "controller_runtime_reconcile_total").await;
        samples
            .into_iter()
            .find(|(labels, v)| labels["result"] == "success" && labels["controller"] == "foo" && *v >= 1.0)
    })
    .await;
    println!("Prometheus read {}", synced.0);
}
