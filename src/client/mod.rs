//! The Kubernetes client every part of the operator shares: it names itself
//! (`User-Agent: sample-controller/<version>`, so the API server's audit log
//! and API Priority and Fairness can tell it apart), counts every request
//! (each retry too) as client-go's `rest_client_requests_total{code,method,host}`,
//! and retries a request as client-go does: only when the server said when
//! ([`RetryAfter`]).
//!
//! Where the client connects is found as upstream's `BuildConfigFromFlags`
//! finds it ([`config`]), and the parameters every request carries (our field
//! manager) and the scope of every `Api` are set here, once.
//!
//! kube's own retry layer is turned off: it retries 429, 503 and 504 with or
//! without a `Retry-After`, and waits the longer of that and its own backoff
//! (5 ms doubling to 1000 s, 15 tries), so after a minute of refusals it
//! waited tens of seconds more than the server asked for.

pub(crate) mod label_selector;
pub(crate) mod lists;
pub(crate) mod retry;
pub(crate) mod watch;

use std::task::{Context, Poll};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use http::{Request, Response, Uri};
use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, PatchParams, PostParams};
use kube::client::{Body, ClientBuilder};
use kube::config::{InferConfigError, KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::{Client, Config, Resource};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tower::buffer::BufferLayer;
use tower::retry::{Policy, RetryLayer};
use tower::{BoxError, Layer, Service};

use crate::client::retry::with_jitter;
use crate::observe::metrics::RestLabels;

/// Field manager for every write (create, patch, status). Upstream uses the
/// same name, so managedFields name the same manager after swapping the
/// binaries (the status's entry is an `Apply` here, an `Update` upstream).
pub const FIELD_MANAGER: &str = "sample-controller";

/// `User-Agent` of every request, so the API server's audit log and API
/// Priority and Fairness can tell this operator from other clients.
pub const USER_AGENT: &str = concat!("sample-controller/", env!("CARGO_PKG_VERSION"));

/// Retries of one request the server asked to be retried later, as
/// client-go's `maxRetries`.
pub(crate) const MAX_RETRIES: u32 = 10;
/// The longest `Retry-After` taken as sent.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);
/// Requests queued for the retry layer (it needs a cloneable service).
const QUEUED: usize = 1024;

/// Why no client configuration could be had.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The kubeconfig given with `--kubeconfig` cannot be used.
    #[error("cannot use kubeconfig {path}: {source}")]
    Kubeconfig {
        path: String,
        #[source]
        source: KubeconfigError,
    },

    /// No kubeconfig and not in a cluster.
    #[error("no cluster configuration found ({0}); pass --kubeconfig, set KUBECONFIG, or run in a cluster")]
    NotFound(#[source] InferConfigError),
}

/// Client configuration: `kubeconfig` (`--kubeconfig`, or KUBECONFIG), else
/// kube's inference (~/.kube/config, then in-cluster); `master` overrides
/// the server address, as upstream's `clientcmd.BuildConfigFromFlags`, which
/// with a master and no kubeconfig reads no kubeconfig at all: no credentials.
pub(crate) async fn config(kubeconfig: Option<&str>, master: Option<&Uri>) -> Result<Config, ConfigError> {
    let mut config = match (kubeconfig, master) {
        (Some(path), _) => {
            let error = |source| ConfigError::Kubeconfig { path: path.to_owned(), source };
            let kc = Kubeconfig::read_from(path).map_err(error)?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await.map_err(error)?
        }
        (None, Some(master)) => Config::new(master.clone()),
        (None, None) => Config::infer().await.map_err(ConfigError::NotFound)?,
    };
    if let Some(master) = master {
        config.cluster_url = master.clone();
    }
    Ok(config)
}

/// A client for `config`, counting its requests into `requests`.
pub fn build(mut config: Config, requests: Family<RestLabels, Counter>) -> kube::Result<Client> {
    config.headers.push((http::header::USER_AGENT, http::HeaderValue::from_static(USER_AGENT)));
    config.default_retry = false;
    let host = config.cluster_url.authority().map(|a| a.to_string()).unwrap_or_default();
    let builder = ClientBuilder::try_from(config)?;
    Ok(builder
        .with_layer(&CountRequests { requests, host })
        .with_layer(&BufferLayer::new(QUEUED))
        .with_layer(&RetryLayer::new(RetryAfter { left: MAX_RETRIES }))
        .build())
}

/// `K`s in `namespace`, or in all namespaces (`None`).
pub fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Every merge patch's parameters: our field manager.
pub(crate) fn patch_params() -> PatchParams {
    PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..PatchParams::default() }
}

/// Send `request` and decode its response without ever holding a large one
/// whole (kube's own calls hold it twice, as bytes and as text, beside the
/// decoded object): see [`decode_streamed`].
pub(crate) async fn send_streamed<T>(client: &Client, request: http::Request<Vec<u8>>) -> kube::Result<T>
where
    T: serde::de::DeserializeOwned + Send + 'static,
{
    decode_read(client.request_stream(request).await?).await
}

/// Decode a response's `body` as it streams in: up to [`IN_PLACE`] bytes
/// are read and decoded here; a longer body is decoded as it arrives, by
/// serde on a blocking thread through a synchronous bridge. With a `T` that
/// skips what it does not need ([`crate::api::wire`]), a response's size
/// costs no memory, and the common small response costs no thread.
pub(crate) async fn decode_streamed<T>(body: Body) -> kube::Result<T>
where
    T: serde::de::DeserializeOwned + Send + 'static,
{
    use futures::TryStreamExt;
    use http_body_util::BodyExt;
    decode_read(body.into_data_stream().map_err(std::io::Error::other).into_async_read()).await
}

async fn decode_read<T>(body: impl futures::AsyncRead + Send + 'static) -> kube::Result<T>
where
    T: serde::de::DeserializeOwned + Send + 'static,
{
    use futures::AsyncReadExt;
    use tokio_util::compat::FuturesAsyncReadCompatExt;
    let mut body = Box::pin(body);
    let mut start = Vec::new();
    let read = (&mut body).take(IN_PLACE).read_to_end(&mut start).await.map_err(kube::Error::ReadEvents)?;
    if (read as u64) < IN_PLACE {
        return serde_json::from_slice(&start).map_err(kube::Error::SerdeError);
    }
    let rest = futures::io::Cursor::new(start).chain(body);
    let reader = tokio_util::io::SyncIoBridge::new(Box::pin(rest).compat());
    tokio::task::spawn_blocking(move || serde_json::from_reader(std::io::BufReader::new(reader)))
        .await
        .map_err(|e| kube::Error::Service(e.into()))?
        .map_err(kube::Error::SerdeError)
}

/// The longest response [`decode_streamed`] decodes in place: a Foo's status
/// write answers with a few kilobytes, a page of 500 Deployments' metadata
/// with a megabyte or more.
const IN_PLACE: u64 = 64 * 1024;

/// A server-side apply's parameters: our field manager, taking over the
/// fields it applies from any other manager (a controller's own fields, as
/// the API conventions ask of controllers).
///
/// Field validation is off: the body is our own typed status, and under the
/// server's default (`Warn`) the API server parses an apply patch a second
/// time, with a YAML parser, only to find unknown fields to warn of in a
/// header this client never reads (1.8 % of the API server's CPU while
/// 10 000 Foos converged: docs/api-cost.md).
pub(crate) fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force().validation_ignore()
}

/// Every create's and replace's parameters: our field manager.
pub(crate) fn post_params() -> PostParams {
    PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() }
}

/// What the server asked in `response`: to be asked again after this long.
/// client-go's rule: a 429 or a 5xx with a `Retry-After` in seconds.
pub(crate) fn retry_after<B>(response: &Response<B>) -> Option<Duration> {
    let status = response.status();
    if status != http::StatusCode::TOO_MANY_REQUESTS && !status.is_server_error() {
        return None;
    }
    let seconds = response.headers().get(http::header::RETRY_AFTER)?.to_str().ok()?.trim().parse::<u64>().ok()?;
    // Kubernetes asks for seconds; a larger number is a broken answer, not a
    // reason to overflow a timer.
    Some(Duration::from_secs(seconds.min(MAX_RETRY_AFTER.as_secs())))
}

/// Retry a request when the server says when, waiting that long (jittered),
/// at most [`MAX_RETRIES`] times; anything else goes back to the caller,
/// whose own backoff decides (the watches' pacing, a sync's retry).
#[derive(Clone, Debug)]
pub(crate) struct RetryAfter {
    left: u32,
}

impl<B> Policy<Request<Body>, Response<B>, BoxError> for RetryAfter {
    type Future = tokio::time::Sleep;

    fn retry(&mut self, _: &mut Request<Body>, result: &mut Result<Response<B>, BoxError>) -> Option<Self::Future> {
        let wait = retry_after(result.as_ref().ok()?)?;
        self.left = self.left.checked_sub(1)?;
        Some(tokio::time::sleep(with_jitter(wait, fastrand::f64())))
    }

    fn clone_request(&mut self, request: &Request<Body>) -> Option<Request<Body>> {
        // A streamed body cannot be sent twice; every body kube sends can.
        let body = request.body().try_clone()?;
        let mut copy = Request::new(body);
        *copy.method_mut() = request.method().clone();
        *copy.uri_mut() = request.uri().clone();
        *copy.version_mut() = request.version();
        *copy.headers_mut() = request.headers().clone();
        *copy.extensions_mut() = request.extensions().clone();
        Some(copy)
    }
}

/// Counts each request by response code (`<error>` when none came, as
/// client-go), method and API server.
struct CountRequests {
    requests: Family<RestLabels, Counter>,
    host: String,
}

impl<S> Layer<S> for CountRequests {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted { inner, requests: self.requests.clone(), host: self.host.clone() }
    }
}

struct Counted<S> {
    inner: S,
    requests: Family<RestLabels, Counter>,
    host: String,
}

impl<S, B> Service<Request<Body>> for Counted<S>
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Future: Send + 'static,
{
    type Response = Response<B>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response<B>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let method = request.method().to_string();
        let (requests, host) = (self.requests.clone(), self.host.clone());
        self.inner
            .call(request)
            .map(move |response| {
                let code = response.as_ref().map_or_else(|_| "<error>".to_owned(), |r| r.status().as_u16().to_string());
                requests.get_or_create(&RestLabels { code, method, host }).inc();
                response
            })
            .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::metric_value;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const OK: &str = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok";

    #[tokio::test]
    async fn a_response_is_decoded_whole_whether_short_or_longer_than_decoded_in_place() {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let long = "y".repeat(IN_PLACE as usize * 3);
        let server = tokio::spawn(async move {
            for (n, pad) in [(1, String::new()), (2, long)] {
                let (_, reply) = handle.next_request().await.expect("a request");
                let body = serde_json::to_vec(&serde_json::json!({ "pad": pad, "n": n })).unwrap();
                reply.send_response(Response::new(Body::from(body)));
            }
        });
        #[derive(serde::Deserialize)]
        struct Answer {
            n: u32,
        }
        for want in [1, 2] {
            let request = Request::get("/answer").body(Vec::new()).unwrap();
            let answer: Answer = send_streamed(&client, request).await.expect("decoded");
            assert_eq!(answer.n, want, "the field after the padding");
        }
        server.await.unwrap();
    }

    /// An HTTP server on loopback giving `answers` in turn, one connection
    /// each; hands back the request heads it read.
    async fn scripted_server(answers: &[&'static str]) -> (String, tokio::task::JoinHandle<Vec<String>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let answers = answers.to_vec();
        let served = tokio::spawn(async move {
            let mut heads = Vec::new();
            for answer in answers {
                let (mut conn, _) = listener.accept().await.unwrap();
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = conn.read(&mut buf).await.unwrap();
                    head.extend_from_slice(&buf[..n]);
                }
                conn.write_all(answer.as_bytes()).await.unwrap();
                heads.push(String::from_utf8_lossy(&head).into_owned());
            }
            heads
        });
        (addr, served)
    }

    fn counted(requests: Family<RestLabels, Counter>, addr: &str, code: &str) -> Option<f64> {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("rest_client_requests", "", requests);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        metric_value(&text, &format!(r#"rest_client_requests_total{{code="{code}",method="GET",host="{addr}"}}"#))
    }

    fn get() -> http::Request<Vec<u8>> {
        http::Request::get("/healthz").body(Vec::new()).unwrap()
    }

    #[tokio::test]
    async fn a_refusal_with_retry_after_is_retried_once_that_time_has_passed() {
        let refused =
            "HTTP/1.1 429 Too Many Requests\r\nretry-after: 1\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
        let (addr, served) = scripted_server(&[refused, OK]).await;
        let requests = Family::<RestLabels, Counter>::default();
        let client = build(Config::new(format!("http://{addr}").parse().unwrap()), requests.clone()).unwrap();
        let started = std::time::Instant::now();
        assert_eq!(client.request_text(get()).await.unwrap(), "ok");
        let waited = started.elapsed();
        assert!(waited >= Duration::from_secs(1), "retried after {waited:?}, before the server's second");
        assert!(waited < Duration::from_secs(5), "waited {waited:?} for a server that asked for one second");
        assert_eq!(served.await.unwrap().len(), 2);
        assert_eq!((counted(requests.clone(), &addr, "429"), counted(requests, &addr, "200")), (Some(1.0), Some(1.0)));
    }

    #[tokio::test]
    async fn a_failure_without_retry_after_goes_back_to_the_caller_at_once() {
        let unavailable = "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
        // A second answer the client must not ask for.
        let (addr, served) = scripted_server(&[unavailable, OK]).await;
        let client = build(Config::new(format!("http://{addr}").parse().unwrap()), Family::default()).unwrap();
        let err = client.request_text(get()).await.expect_err("503 is the caller's to handle");
        assert!(matches!(&err, kube::Error::Api(s) if s.code == 503), "{err}");
        assert!(!served.is_finished() || served.await.unwrap().len() == 1, "retried without being asked");
    }

    #[test]
    fn retry_after_is_read_as_client_go_reads_it() {
        let answer = |code: u16, header: Option<&str>| {
            let mut r = Response::builder().status(code);
            if let Some(h) = header {
                r = r.header(http::header::RETRY_AFTER, h);
            }
            retry_after(&r.body(()).unwrap())
        };
        assert_eq!(answer(429, Some("3")), Some(Duration::from_secs(3)));
        assert_eq!(answer(503, Some(" 1 ")), Some(Duration::from_secs(1)));
        assert_eq!(answer(500, Some("2")), Some(Duration::from_secs(2)), "a 5xx with a Retry-After");
        assert_eq!(answer(429, None), None);
        assert_eq!(answer(409, Some("1")), None, "only refusals for the server's own state");
        assert_eq!(answer(429, Some("Wed, 21 Oct 2015 07:28:00 GMT")), None, "dates are not sent by the API server");
        assert_eq!(answer(429, Some("18446744073709551615")), Some(MAX_RETRY_AFTER), "no overflow");
        assert!(with_jitter(MAX_RETRY_AFTER, 0.99) < Duration::from_secs(4600));
    }

    #[tokio::test]
    async fn every_request_names_the_operator_and_is_counted_by_code_and_method() {
        let (addr, served) = scripted_server(&[OK]).await;
        let requests = Family::<RestLabels, Counter>::default();
        let client = build(Config::new(format!("http://{addr}").parse().unwrap()), requests.clone()).unwrap();
        assert_eq!(client.request_text(get()).await.unwrap(), "ok");
        let head = served.await.unwrap().remove(0).to_ascii_lowercase();
        assert!(head.contains(&format!("\r\nuser-agent: {USER_AGENT}\r\n")), "{head}");
        // The server is gone: no response, counted as client-go does.
        assert!(client.request_text(get()).await.is_err());
        assert_eq!(counted(requests.clone(), &addr, "200"), Some(1.0));
        assert_eq!(counted(requests, &addr, "<error>"), Some(1.0));
    }
}
