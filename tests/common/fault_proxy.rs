//! A fault-injecting proxy between a client under test and the control
//! plane's API server. The client talks plain HTTP to it on loopback, without
//! credentials; it forwards each request with the plane's admin credentials,
//! the client's own `User-Agent` kept (so the audit log still tells clients
//! apart). On command it answers chosen requests itself — a status with or
//! without `Retry-After`, after a delay, or by dropping the connection — and
//! it ends every open watch; and it can leave the requests to one path
//! unanswered for good (a write the API server never answers). It records
//! every request it saw, by verb and resource, and whether it passed.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body as HttpBody, Frame};
use http_body_util::BodyExt;
use kube::client::Body;
use kube::{Client, Config};
use parking_lot::Mutex;
use tokio::sync::watch;

/// What the proxy does to the requests a fault applies to.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// Everything passes.
    None,
    /// Answered with `code` (and `Retry-After: seconds` if given), a JSON
    /// `Status` as the API server writes one.
    Refuse { code: u16, retry_after: Option<u32> },
    /// Passed on after `delay`.
    Delay(Duration),
    /// The connection is dropped without an answer.
    Reset,
}

/// One request the proxy saw.
#[derive(Clone, Debug)]
pub struct Seen {
    pub at: Instant,
    /// `list`, `watchlist` (a watch that sends every object first: a full
    /// list by another way, as client-go's informers make by default),
    /// `watch`, `get`, `create`, `update`, `patch`, `delete`.
    pub verb: String,
    /// `foos`, `foos/status`, `deployments`, ... (empty for non-resource paths).
    pub resource: String,
    /// Whether it reached the API server.
    pub passed: bool,
}

struct State {
    fault: Mutex<Fault>,
    /// Requests a fault never applies to (`leases`, so an elector keeps its
    /// Lease through the fault, as the measurement did).
    spared: Vec<&'static str>,
    seen: Mutex<Vec<Seen>>,
    /// Paths (a part of one) whose requests are never answered.
    hung: Mutex<Vec<String>>,
    /// Bumped to end every open watch.
    cuts: watch::Sender<u64>,
    upstream: Client,
}

/// The proxy; it stops when dropped.
pub struct FaultProxy {
    pub url: String,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FaultProxy {
    /// A proxy to the API server `upstream` describes, on a port the kernel
    /// picks; faults spare requests for the `spared` resources.
    pub async fn start(mut upstream: Config, spared: &[&'static str]) -> Self {
        // Transparent: the client under test sees every answer, and retries
        // as it would without the proxy.
        upstream.default_retry = false;
        let upstream = Client::try_from(upstream).expect("upstream client");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(State {
            fault: Mutex::new(Fault::None),
            spared: spared.to_vec(),
            seen: Mutex::default(),
            hung: Mutex::default(),
            cuts: watch::Sender::new(0),
            upstream,
        });
        let serving = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let state = serving.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| handle(state.clone(), request));
                    let io = hyper_util::rt::TokioIo::new(stream);
                    // Errors here are the faults themselves (a dropped
                    // connection) or the client going away.
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                });
            }
        });
        FaultProxy { url, state, task }
    }

    /// A client configuration that goes through this proxy.
    pub fn config(&self) -> Config {
        Config::new(self.url.parse().unwrap())
    }

    /// Apply `fault` from now on.
    pub fn set(&self, fault: Fault) {
        *self.state.fault.lock() = fault;
    }

    /// Leave every request whose path contains `part` unanswered from now
    /// on, for as long as the proxy lives: it reaches no API server, and
    /// its client waits until it gives up.
    pub fn hang(&self, part: &str) {
        self.state.hung.lock().push(part.to_owned());
    }

    /// End every watch open now (the connection is dropped mid-stream).
    pub fn cut_watches(&self) {
        self.state.cuts.send_modify(|n| *n += 1);
    }

    /// Every request seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().clone()
    }
}

async fn handle(
    state: Arc<State>,
    request: Request<hyper::body::Incoming>,
) -> Result<Response<CutBody>, std::io::Error> {
    // Subscribed before anything is awaited: a cut while this request is on
    // its way still ends its watch.
    let mut cuts = state.cuts.subscribe();
    cuts.mark_unchanged();
    let (verb, resource) = classify(&request);
    if state.hung.lock().iter().any(|part| request.uri().path().contains(part.as_str())) {
        state.seen.lock().push(Seen { at: Instant::now(), verb, resource, passed: false });
        return std::future::pending().await;
    }
    let fault =
        if state.spared.iter().any(|s| resource.starts_with(s)) { Fault::None } else { state.fault.lock().clone() };
    let passed = matches!(fault, Fault::None | Fault::Delay(_));
    state.seen.lock().push(Seen { at: Instant::now(), verb: verb.clone(), resource, passed });
    match fault {
        Fault::Refuse { code, retry_after } => return Ok(refusal(code, retry_after)),
        Fault::Reset => return Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset)),
        Fault::Delay(delay) => tokio::time::sleep(delay).await,
        Fault::None => {}
    }
    let (mut parts, incoming) = request.into_parts();
    let body = incoming.collect().await.map_err(std::io::Error::other)?.to_bytes();
    for hop in ["host", "connection", "keep-alive", "transfer-encoding", "te", "upgrade"] {
        parts.headers.remove(hop);
    }
    let upstream = Request::from_parts(parts, Body::from(body.to_vec()));
    let response = match state.upstream.send(upstream).await {
        Ok(response) => response,
        // The API server could not be reached: the client sees a dropped
        // connection, as it would without the proxy.
        Err(e) => return Err(std::io::Error::other(e.to_string())),
    };
    let cut = Box::pin(async move {
        let _ = cuts.changed().await;
    });
    let (parts, body) = response.into_parts();
    Ok(Response::from_parts(
        parts,
        CutBody { inner: Some(body), cut: if verb == "watch" || verb == "watchlist" { Some(cut) } else { None } },
    ))
}

/// An answer like the API server's own to a refused request.
fn refusal(code: u16, retry_after: Option<u32>) -> Response<CutBody> {
    let status = StatusCode::from_u16(code).expect("a status code");
    let reason = status.canonical_reason().unwrap_or("Error").replace(' ', "");
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason,
        "message": format!("injected by the test proxy: {status}"),
        "details": { "retryAfterSeconds": retry_after.unwrap_or(0) },
    });
    let mut response = Response::builder().status(status).header("content-type", "application/json");
    if let Some(seconds) = retry_after {
        response = response.header("retry-after", seconds.to_string());
    }
    let body = Body::from(serde_json::to_vec(&body).unwrap());
    response.body(CutBody { inner: Some(body), cut: None }).unwrap()
}

/// `(verb, resource)` of an API request, as the audit log names them.
pub fn classify<B>(request: &Request<B>) -> (String, String) {
    let path = request.uri().path();
    let query = |param: &str| request.uri().query().is_some_and(|q| q.split('&').any(|p| p == param));
    let watching = query("watch=true") || query("watch=1");
    // A watch that sends the initial objects first is a list.
    let listing = query("sendInitialEvents=true");
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    // /api/v1/... or /apis/GROUP/VERSION/...
    let rest: &[&str] = match parts.as_slice() {
        ["api", _, rest @ ..] => rest,
        ["apis", _, _, rest @ ..] => rest,
        _ => &[],
    };
    let rest = match rest {
        ["namespaces", _, tail @ ..] if !tail.is_empty() => tail,
        other => other,
    };
    let (resource, named) = match rest {
        [] => (String::new(), false),
        [resource] => (resource.to_string(), false),
        [resource, _name] => (resource.to_string(), true),
        [resource, _name, sub, ..] => (format!("{resource}/{sub}"), true),
    };
    let verb = match *request.method() {
        http::Method::GET if watching && listing => "watchlist",
        http::Method::GET if watching => "watch",
        http::Method::GET if named => "get",
        http::Method::GET => "list",
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE => "delete",
        _ => "other",
    };
    (verb.to_owned(), resource)
}

/// An upstream answer passed on until a cut, which ends it with an error
/// (the connection is dropped mid-stream, as when an API server goes away).
pub struct CutBody {
    inner: Option<Body>,
    cut: Option<Pin<Box<dyn std::future::Future<Output = ()> + Send>>>,
}

impl HttpBody for CutBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(cut) = self.cut.as_mut()
            && cut.as_mut().poll(cx).is_ready()
        {
            self.inner = None;
            self.cut = None;
            return Poll::Ready(Some(Err(std::io::Error::from(std::io::ErrorKind::ConnectionAborted))));
        }
        let Some(inner) = self.inner.as_mut() else { return Poll::Ready(None) };
        Pin::new(inner).poll_frame(cx).map_err(|e| std::io::Error::other(e.to_string()))
    }
}

impl Seen {
    /// A request for every object: a LIST, or a watch that sends them first.
    pub fn is_full_list(&self) -> bool {
        self.verb == "list" || self.verb == "watchlist"
    }

    /// A request that watches: a watch, or a watch that lists first.
    pub fn is_watch(&self) -> bool {
        self.verb == "watch" || self.verb == "watchlist"
    }
}

/// Requests in `seen` matching `verb` and `resource`.
pub fn count(seen: &[Seen], verb: &str, resource: &str) -> usize {
    seen.iter().filter(|s| s.verb == verb && s.resource == resource).count()
}

/// The most requests in any window of `window` among `seen`.
pub fn most_within(seen: &[Seen], window: Duration) -> usize {
    let mut at: Vec<Instant> = seen.iter().map(|s| s.at).collect();
    at.sort();
    (0..at.len()).map(|i| at[i..].iter().take_while(|t| t.duration_since(at[i]) < window).count()).max().unwrap_or(0)
}
