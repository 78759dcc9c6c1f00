//! HTTP to the processes under test, through one client: curl (plain or
//! TLS with a self-signed certificate, HTTP/1.1 or 2, a bearer token).

use std::process::Command;

use super::{Operator, kubectl_ok};

/// An answer: status code, HTTP version, body.
pub struct Answer {
    pub code: u16,
    pub version: String,
    pub body: String,
}

/// GET `url` with curl (a self-signed certificate is accepted), with a
/// bearer token if any and `extra` curl flags; `None` if nothing answered.
pub fn get(url: &str, token: Option<&str>, extra: &[&str]) -> Option<Answer> {
    let mut curl = Command::new("curl");
    curl.args(["-skg", "--max-time", "10", "-w", "\n%{http_code} %{http_version}", url]).args(extra);
    if let Some(token) = token {
        curl.args(["-H", &format!("Authorization: Bearer {token}")]);
    }
    let out = curl.output().expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n')?;
    let (code, version) = status.split_once(' ')?;
    let code = code.parse().ok().filter(|c| *c != 0)?;
    Some(Answer { code, version: version.to_owned(), body: body.to_owned() })
}

/// GET a path on localhost over plain HTTP: (status code, body); None if
/// nothing listens. Off the async runtime's threads, as curl blocks.
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let url = format!("http://127.0.0.1:{port}{path}");
    let answer = tokio::task::spawn_blocking(move || get(&url, None, &[])).await.ok()??;
    Some((answer.code, answer.body))
}

/// GET over HTTPS: (status code, HTTP version, body); code 0 if nothing
/// answered.
pub fn https_get(port: u16, path: &str, token: Option<&str>, extra: &[&str]) -> (u16, String, String) {
    match get(&format!("https://127.0.0.1:{port}{path}"), token, extra) {
        Some(a) => (a.code, a.version, a.body),
        None => (0, String::new(), String::new()),
    }
}

/// A ServiceAccount `name` in `namespace` bound to deploy/'s metrics-reader
/// ClusterRole, and a token for it.
pub fn metrics_reader_token(namespace: &str, name: &str) -> String {
    kubectl_ok(&["apply", "-f", "deploy/08-metrics-reader-role.yaml"]);
    kubectl_ok(&["create", "serviceaccount", name, "-n", namespace]);
    let binding = format!("{namespace}-{name}");
    let subject = format!("--serviceaccount={namespace}:{name}");
    kubectl_ok(&["create", "clusterrolebinding", &binding, "--clusterrole=sample-controller-metrics-reader", &subject]);
    kubectl_ok(&["create", "token", name, "-n", namespace]).trim().to_owned()
}

/// The value of the first sample whose line starts with `series`.
pub async fn metric(op: &Operator, series: &str) -> Option<f64> {
    let (_, body) = http_get(op.metrics, "/metrics").await?;
    sample_controller::testing::metric_value(&body, series)
}
