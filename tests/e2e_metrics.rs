//! Secure metrics as deploy/ serves them (`--metrics-secure`): HTTPS, each
//! scrape's bearer token reviewed by the API server — no token 401, a
//! ServiceAccount without the metrics-reader role 403, with it 200 — and
//! the answers cached, so repeated scrapes cost the API server nothing; a
//! flood of junk tokens limited to a few reviews, the reader still answered;
//! then a real Prometheus scraping it with a ServiceAccount token.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use k8s_openapi::jiff::Timestamp;
use kube_secure_metrics::{REVIEW_BURST, REVIEWS_PER_SECOND};
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

/// How the flood of the test below is sent: distinct junk tokens, so none
/// is answered from the cache, that many at a time — one client's share of
/// a listener's connections (32 of 64): past it, kube-secure-metrics closes
/// a client's connections unanswered, which the probes' test covers.
const FLOOD_TOKENS: usize = 2_000;
const FLOOD_AT_ONCE: usize = 32;

/// Someone who can reach the metrics port sends 2 000 distinct junk
/// tokens, 50 at a time (about 10 s). Each is answered 401 (reviewed: not a
/// token) or 429 with a `Retry-After` (over the review limit), and the
/// audit log shows no more TokenReviews from the operator since the flood
/// began than the limit's burst plus its rate over the flood's length. The
/// reader, reviewed before the flood, is answered 200 after it with no
/// review (from the cache). The operator runs with leader election, its
/// Lease renewals through the client the reviews use: the audit log shows
/// them through the flood with no gap as long as the renew deadline, so the
/// reviews never put its lease at risk.
#[tokio::test]
async fn a_flood_of_junk_tokens_costs_no_more_token_reviews_than_the_limit_and_the_reader_is_still_answered() {
    let ns = TestNamespace::new("metrics-flood").await;
    let user = format!("{}-operator", ns.name);
    let election = election_args(&ns.name, LEASE);
    let op = secure_operator(&ns, &user, &election.iter().map(String::as_str).collect::<Vec<_>>()).await;
    wait_until("the operator to lead", TIMEOUT, || holder(&ns)).await;
    let reader = service_account_token(&ns, "reader", true);
    wait_until("the reader's scrape to be allowed", TIMEOUT, || async {
        (scrape(&op, Some(&reader), false).0 == 200).then_some(())
    })
    .await;

    let from = Timestamp::now();
    let started = std::time::Instant::now();
    let answers = flood(&ns.name, op.metrics);
    let took = started.elapsed();
    let until = Timestamp::now();
    assert_eq!(scrape(&op, Some(&reader), false).0, 200, "the reader's scrape after the flood");

    assert_flood_answered(&answers, took);
    let made = audited_as(&user);
    let since = |resource: &str, from: Timestamp| {
        made.iter().filter(|r| r.resource == resource && r.verb == "create" && r.at >= from).count()
    };
    let limit = REVIEW_BURST as usize + REVIEWS_PER_SECOND as usize * took.as_secs().saturating_add(1) as usize;
    let token_reviews = since("tokenreviews", from);
    println!("{FLOOD_TOKENS} junk tokens in {took:?}: {token_reviews} TokenReviews (the limit allows {limit})");
    assert!(token_reviews <= limit, "{token_reviews} TokenReviews for the flood");
    assert_eq!(since("tokenreviews", until), 0, "the reader's scrape after the flood was reviewed again");
    assert_eq!(since("subjectaccessreviews", from), 0, "no junk token authenticates; the reader was not reviewed");
    assert_renewals_kept_their_period(&made, from, until);
}

/// `FLOOD_TOKENS` scrapes of `port`, each with a junk token of its own,
/// `FLOOD_AT_ONCE` at a time, by one curl (thousands of processes would
/// take longer than the window): each answer's status code and
/// `Retry-After` header (empty if none).
fn flood(name: &str, port: u16) -> Vec<(u16, String)> {
    let transfer = |n: usize| {
        format!(
            "url = \"https://127.0.0.1:{port}/metrics\"\nheader = \"Authorization: Bearer junk-{n}\"\n\
             output = \"/dev/null\"\nsilent\ninsecure\nmax-time = 10\n\
             write-out = \"%{{http_code}} %header{{retry-after}}\\n\"\n"
        )
    };
    let config = format!("{}/{name}-flood.curlrc", env!("CARGO_TARGET_TMPDIR"));
    std::fs::write(&config, (0..FLOOD_TOKENS).map(transfer).collect::<Vec<_>>().join("next\n")).unwrap();
    let at_once = FLOOD_AT_ONCE.to_string();
    let out = Command::new("curl").args(["--parallel", "--parallel-max", &at_once, "-K", &config]).output();
    let out = out.expect("run curl");
    let answers: Vec<(u16, String)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            let (code, retry_after) = line.split_once(' ').unwrap_or((line, ""));
            (code.parse().unwrap_or(0), retry_after.trim().to_owned())
        })
        .collect();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let said: String = stderr.chars().skip(stderr.chars().count().saturating_sub(500)).collect();
    assert_eq!(answers.len(), FLOOD_TOKENS, "curl reported fewer answers; it said: {said}");
    answers
}

/// Every junk token answered: 401 if it was reviewed, else 429 with a
/// `Retry-After` of at least a second; no more reviewed than the limit
/// allows over the flood's length, `took`.
fn assert_flood_answered(answers: &[(u16, String)], took: Duration) {
    for (code, retry_after) in answers {
        match code {
            401 => {}
            429 => assert!(retry_after.parse::<u64>().is_ok_and(|s| s >= 1), "429 with Retry-After {retry_after:?}"),
            other => panic!("a junk token was answered {other} (0: no answer)"),
        }
    }
    let reviewed = answers.iter().filter(|(code, _)| *code == 401).count();
    let limit = REVIEW_BURST as usize + REVIEWS_PER_SECOND as usize * (took.as_secs() as usize + 1);
    assert!(reviewed <= limit, "{reviewed} junk tokens were reviewed in {took:?}, past the limit's {limit}");
}

/// The Lease renewals (updates) in `[from, until]`: from `from` to the first,
/// between each two and from the last to `until`, no gap as long as the
/// renew deadline (3/5 of [`LEASE`] in these tests), and every one accepted.
fn assert_renewals_kept_their_period(made: &[Audited], from: Timestamp, until: Timestamp) {
    let renewals: Vec<&Audited> =
        made.iter().filter(|r| r.resource == "leases" && r.verb == "update" && r.at >= from && r.at <= until).collect();
    assert!(renewals.iter().all(|r| r.code == Some(200)), "a renewal failed during the flood: {renewals:?}");
    let times: Vec<Timestamp> =
        std::iter::once(from).chain(renewals.iter().map(|r| r.at)).chain(std::iter::once(until)).collect();
    let longest = times.windows(2).map(|w| w[1].as_millisecond() - w[0].as_millisecond()).max().unwrap_or(0);
    let deadline = i64::try_from((LEASE * 3 / 5).as_millis()).unwrap();
    assert!(longest < deadline, "{longest} ms without a Lease renewal during the flood: {renewals:?}");
}

/// Prometheus scrapes every 5 s, its answer cached for a minute, while
/// someone who can reach the port sends 2 000 fresh junk tokens over 90 s
/// (23 a second, past the 5 a second the reviews of new tokens are limited
/// to): every scrape is answered 200 — its review again, once its answer
/// expires, has a limit of its own — and the flood's TokenReviews stay
/// within the limit.
#[tokio::test]
async fn the_reader_is_answered_at_every_scrape_through_a_flood_of_fresh_tokens_that_outlasts_its_cached_answer() {
    let ns = TestNamespace::new("metrics-long-flood").await;
    let user = format!("{}-operator", ns.name);
    let op = secure_operator(&ns, &user, &[]).await;
    let reader = service_account_token(&ns, "reader", true);
    wait_until("the reader's scrape to be allowed", TIMEOUT, || async {
        (scrape(&op, Some(&reader), false).0 == 200).then_some(())
    })
    .await;
    let from = Timestamp::now();
    let started = std::time::Instant::now();
    let mut flood = slow_flood(&ns.name, op.metrics, FLOOD_TOKENS, 23);
    let mut scrapes = Vec::new();
    for n in 1..=19 {
        tokio::time::sleep_until((started + Duration::from_secs(5) * n).into()).await;
        scrapes.push((started.elapsed().as_secs(), scrape(&op, Some(&reader), false).0));
    }
    let flooded = flood.wait().expect("curl's flood");
    let took = started.elapsed();
    println!("the reader's scrapes (second, code) through {FLOOD_TOKENS} junk tokens in {took:?}: {scrapes:?}");
    assert!(flooded.success(), "curl's flood failed");
    assert!(took >= Duration::from_secs(90), "the flood must outlast the reader's cached answer: {took:?}");
    assert!(scrapes.iter().all(|(_, code)| *code == 200), "a scrape of the reader was refused: {scrapes:?}");
    let made = audited_as(&user);
    let token_reviews =
        made.iter().filter(|r| r.resource == "tokenreviews" && r.verb == "create" && r.at >= from).count();
    // The flood's reviews under the limit, and the reader's own, once a
    // minute.
    let limit = REVIEW_BURST as usize + REVIEWS_PER_SECOND as usize * (took.as_secs() as usize + 1) + 2;
    println!("{token_reviews} TokenReviews (the limit allows {limit})");
    assert!(token_reviews <= limit, "{token_reviews} TokenReviews during the flood");
}

/// `tokens` scrapes of `port`, each with a junk token of its own, one after
/// the other at `per_second`, by a curl in the background.
fn slow_flood(name: &str, port: u16, tokens: usize, per_second: u32) -> std::process::Child {
    let transfer = |n: usize| {
        format!(
            "url = \"https://127.0.0.1:{port}/metrics\"\nheader = \"Authorization: Bearer slow-junk-{n}\"\n\
             output = \"/dev/null\"\nsilent\ninsecure\nmax-time = 10\n"
        )
    };
    let config = format!("{}/{name}-slow-flood.curlrc", env!("CARGO_TARGET_TMPDIR"));
    std::fs::write(&config, (0..tokens).map(transfer).collect::<Vec<_>>().join("next\n")).unwrap();
    Command::new("curl")
        .args(["--rate", &format!("{per_second}/s"), "-K", &config])
        .stdout(Stdio::null())
        .spawn()
        .expect("run curl")
}

/// The kubelet's probes, from its own address, are answered within a
/// second while another client (another address) holds 300 idle or slow
/// connections to the probe port and 300 to the metrics port, opening a new
/// one whenever the operator closes one.
#[tokio::test]
async fn the_probes_answer_within_a_second_while_another_client_holds_hundreds_of_connections_to_both_ports() {
    let ns = TestNamespace::new("metrics-starve").await;
    let op = secure_operator(&ns, &format!("{}-operator", ns.name), &[]).await;
    let probes = || async {
        let mut answered = 0;
        for _ in 0..10 {
            let probe = tokio::time::timeout(Duration::from_secs(1), http_get(op.probes, "/healthz"));
            answered += usize::from(matches!(probe.await, Ok(Some((200, _)))));
        }
        answered
    };
    assert_eq!(probes().await, 10, "before");
    let holding: Vec<_> = [op.probes, op.metrics]
        .into_iter()
        .flat_map(|port| (0..300).map(move |n| tokio::spawn(hold_connection(port, n % 2 == 1))))
        .collect();
    // Long enough for every connection to be open, or waiting for a place.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let answered = probes().await;
    println!("{answered} of 10 probes answered within 1 s while another client holds 600 connections");
    for task in holding {
        task.abort();
    }
    assert_eq!(answered, 10);
}

/// One connection from 127.0.0.2 to `port`, idle or (`slow`) sending the
/// start of a request and no more, opened again a moment after the operator
/// closes it (as a client paced by its own round trips), until the task is
/// aborted.
async fn hold_connection(port: u16, slow: bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(([127, 0, 0, 2], 0).into()).unwrap();
        let Ok(mut tcp) = socket.connect(([127, 0, 0, 1], port).into()).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        if slow {
            let _ = tcp.write_all(b"GET /hea").await;
        }
        // Until the operator closes it.
        let _ = tcp.read(&mut [0; 64]).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
