//! The metrics and probe endpoints, on axum: `/metrics` (OpenMetrics text),
//! `/healthz` (the process serves requests) and `/readyz` (ready to work,
//! as its user says: a controller's caches filled, say); `/metrics` over
//! HTTPS for reviewed tokens when secure.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use parking_lot::Mutex;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::task::{JoinHandle, JoinSet};

use prometheus_client::metrics::counter::Counter;

use crate::auth::{Access, MetricsAuth};

/// What `/metrics` answers: OpenMetrics text, encoded afresh at each
/// scrape (a `prometheus_client` registry's, say).
pub type Exposition = Arc<dyn Fn() -> String + Send + Sync>;

/// A listener that could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("cannot serve HTTP on {addr}: {source}")]
pub struct BindError {
    /// The address asked for.
    pub addr: SocketAddr,
    /// Why it could not be bound.
    #[source]
    pub source: std::io::Error,
}

type Result<T> = std::result::Result<T, BindError>;

/// What `/readyz` reports: 503 until [`Readiness::caches_synced`], then
/// 200. A controller that keeps its caches warm on every replica, standbys
/// too, calls it on each once they are filled: a ready standby can take
/// over at once, and a rolling update or a drain waits for that.
#[derive(Debug, Default)]
pub struct Readiness {
    caches_synced: AtomicBool,
}

impl Readiness {
    /// From now on ready.
    pub fn caches_synced(&self) {
        self.caches_synced.store(true, Ordering::SeqCst);
    }

    /// Whether [`Readiness::caches_synced`] was called.
    pub fn is_ready(&self) -> bool {
        self.caches_synced.load(Ordering::SeqCst)
    }
}

/// A listener serving in the background: the address it is bound to (the
/// kernel's pick for port 0), and a graceful stop. Dropped, it serves on
/// for the rest of the process, as a controller's endpoints usually do.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Server {
    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stop accepting connections, answer the requests under way, close
    /// idle keep-alive connections, and wait for the open ones to end, at
    /// most `grace`; those still open then are closed. Whether every
    /// connection ended within `grace`.
    pub async fn shutdown(mut self, grace: Duration) -> bool {
        self.stop.send_replace(true);
        if tokio::time::timeout(grace, &mut self.task).await.is_ok() {
            return true;
        }
        // Its connections' tasks are aborted with it.
        self.task.abort();
        false
    }
}

/// A listener's bounds: the connections it serves at once, how many of
/// them one client address may hold (its connections past that are closed
/// at once), and how long a client may take over its TLS handshake or a
/// request header (an idle HTTP/1.1 connection gives its place up after as
/// long). When all places are taken, a new connection takes the place of
/// the oldest connection of the client holding the most, so that no
/// client keeps another out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// Connections served at once (64).
    pub connections: usize,
    /// The most of them one client address holds (32).
    pub per_client: usize,
    /// The longest TLS handshake or request header (10 s).
    pub slow_client: Duration,
}

impl Default for Limits {
    /// 64 connections, 32 of one client, 10 s: room for many Prometheus
    /// replicas, while a client opening thousands cannot make the process
    /// hold thousands (each costs a task and tens of KiB of buffers with
    /// TLS).
    fn default() -> Self {
        Limits { connections: MAX_CONNECTIONS, per_client: PER_CLIENT, slow_client: SLOW_CLIENT }
    }
}

impl Limits {
    /// Serve `connections` at once (at least 1); one client's share stays
    /// within it.
    pub fn with_connections(mut self, connections: usize) -> Self {
        self.connections = connections.max(1);
        self.per_client = self.per_client.min(self.connections);
        self
    }

    /// Let one client address hold `per_client` connections (at least 1,
    /// at most the listener's).
    pub fn with_per_client(mut self, per_client: usize) -> Self {
        self.per_client = per_client.clamp(1, self.connections.max(1));
        self
    }

    /// Drop a TLS handshake or request header slower than `slow_client`.
    pub fn with_slow_client(mut self, slow_client: Duration) -> Self {
        self.slow_client = slow_client;
        self
    }
}

/// Bind `addr` now (so a bad address fails start-up) and serve `router`
/// (`what` it serves, for the log) in the background, over HTTP/1.1; a
/// request header slower than 10 s is dropped, and at most 64 connections
/// are served at once, a new one taking the place of the oldest of the
/// client that holds the most.
pub async fn serve(addr: SocketAddr, what: &'static str, router: Router) -> Result<Server> {
    serve_with(addr, what, router, Limits::default()).await
}

/// [`serve`] within `limits`.
pub async fn serve_with(addr: SocketAddr, what: &'static str, router: Router, limits: Limits) -> Result<Server> {
    let (listener, bound) = bind(addr).await?;
    tracing::info!(addr = %bound, endpoints = %what, "serving HTTP");
    let slow = limits.slow_client;
    Ok(spawn_server(listener, bound, limits, move |tcp, stop| serve_connection(tcp, router.clone(), false, slow, stop)))
}

/// Like [`serve`], over TLS with `tls`, each connection HTTP/1.1 only
/// unless `tls` offers `h2` (as [`crate::server_config`] does when asked
/// for HTTP/2); a handshake slower than 10 s is dropped too.
pub async fn serve_tls(
    addr: SocketAddr,
    what: &'static str,
    router: Router,
    tls: Arc<tokio_rustls::rustls::ServerConfig>,
) -> Result<Server> {
    serve_tls_with(addr, what, router, tls, Limits::default()).await
}

/// [`serve_tls`] within `limits`.
pub async fn serve_tls_with(
    addr: SocketAddr,
    what: &'static str,
    router: Router,
    tls: Arc<tokio_rustls::rustls::ServerConfig>,
    limits: Limits,
) -> Result<Server> {
    // One answer to "HTTP/2?": what the handshake offers.
    let http2 = tls.alpn_protocols.iter().any(|protocol| protocol == b"h2");
    let (listener, bound) = bind(addr).await?;
    tracing::info!(addr = %bound, tls = true, http2, endpoints = %what, "serving HTTP");
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let slow = limits.slow_client;
    Ok(spawn_server(listener, bound, limits, move |tcp, stop| {
        let (acceptor, router) = (acceptor.clone(), router.clone());
        async move {
            if let Ok(Ok(stream)) = tokio::time::timeout(slow, acceptor.accept(tcp)).await {
                serve_connection(stream, router, http2, slow, stop).await;
            }
        }
    }))
}

/// [`accept`] in a task of its own, and its handle.
fn spawn_server<F, Fut>(listener: TcpListener, bound: SocketAddr, limits: Limits, serve: F) -> Server
where
    F: Fn(TcpStream, watch::Receiver<bool>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (stop, stopping) = watch::channel(false);
    let places = Places::within(limits);
    let task = tokio::spawn(accept(listener, bound, places, serve, stopping));
    Server { addr: bound, stop, task }
}

/// Accept connections on `listener` until `stop` says so, each served by
/// `serve` in a task of its own, as many at once as `places` has; then
/// wait for the connections to end.
async fn accept<F, Fut>(
    listener: TcpListener,
    bound: SocketAddr,
    places: Places,
    serve: F,
    mut stop: watch::Receiver<bool>,
) where
    F: Fn(TcpStream, watch::Receiver<bool>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let places = Arc::new(Mutex::new(places));
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            // A dropped `Server` (the sender gone) disables this branch:
            // serving goes on.
            Ok(()) = stop.changed() => break,
            // Ended connections, reaped so that the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors, say: accepting again at once
                // would spin (and log) until one is freed.
                tracing::warn!(addr = %bound, error = %e, "cannot accept a connection; trying again in 1 s");
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        let Some((place, evicted)) = places.lock().take(peer.ip()) else {
            // That client holds its share already: closed at once.
            drop(tcp);
            continue;
        };
        let connection = serve(tcp, stop.clone());
        // Given back however the connection ends, a panic of a handler too:
        // a place kept would count against its client for good.
        let held = Held { places: places.clone(), place };
        connections.spawn(async move {
            let _held = held;
            tokio::select! {
                () = connection => {}
                // Its place given to another client's connection.
                _ = evicted => {}
            }
        });
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

/// A connection's place, given back when dropped.
struct Held {
    places: Arc<Mutex<Places>>,
    place: Place,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.places.lock().give_back(self.place);
    }
}

/// A connection's place: its peer and its number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Place {
    peer: IpAddr,
    id: u64,
}

/// The places of a listener's connections, by peer address: at most
/// [`MAX_CONNECTIONS`] in all, at most [`PER_CLIENT`] of them one client's
/// (past that, its new connection is closed at once). When all are taken,
/// a new connection takes the place of the oldest connection of the peer
/// that holds the most — its own peer's, when that holds as many — so that
/// no client, however many idle or slow connections it holds, keeps
/// another out: the kubelet's probe, one connection from the node, is
/// always served (an accept that waited for a place, as before, let 300
/// idle connections of one client keep every probe out).
#[derive(Debug)]
struct Places {
    by_peer: HashMap<IpAddr, VecDeque<(u64, oneshot::Sender<()>)>>,
    held: usize,
    next: u64,
    connections: usize,
    per_client: usize,
}

impl Places {
    fn within(limits: Limits) -> Self {
        // The fields are public: at least one place, and one for a client.
        let connections = limits.connections.max(1);
        let per_client = limits.per_client.clamp(1, connections);
        Places { by_peer: HashMap::new(), held: 0, next: 0, connections, per_client }
    }

    /// A place for a connection from `peer`, and what resolves when it is
    /// taken back for another; none when `peer` holds its share.
    fn take(&mut self, peer: IpAddr) -> Option<(Place, oneshot::Receiver<()>)> {
        if self.by_peer.get(&peer).is_some_and(|held| held.len() >= self.per_client) {
            return None;
        }
        if self.held >= self.connections {
            self.evict_for(peer);
        }
        let (evict, evicted) = oneshot::channel();
        self.next += 1;
        self.by_peer.entry(peer).or_default().push_back((self.next, evict));
        self.held += 1;
        Some((Place { peer, id: self.next }, evicted))
    }

    /// Close the oldest connection of the peer holding the most (`peer`'s
    /// own among equals).
    fn evict_for(&mut self, peer: IpAddr) {
        let own = self.by_peer.get(&peer).map_or(0, VecDeque::len);
        let heaviest = self.by_peer.iter().max_by_key(|(_, held)| held.len()).map(|(p, held)| (*p, held.len()));
        let Some((heaviest, most)) = heaviest else { return };
        let victim = if own >= most { peer } else { heaviest };
        if let Some(held) = self.by_peer.get_mut(&victim)
            && let Some((_, evict)) = held.pop_front()
        {
            // Dropped, the sender resolves the connection's receiver.
            drop(evict);
            self.held -= 1;
            if held.is_empty() {
                self.by_peer.remove(&victim);
            }
        }
    }

    /// A connection ended (or was closed for another): its place is free,
    /// unless it was taken back already.
    fn give_back(&mut self, place: Place) {
        let Some(held) = self.by_peer.get_mut(&place.peer) else { return };
        if let Some(at) = held.iter().position(|(id, _)| *id == place.id) {
            held.remove(at);
            self.held -= 1;
        }
        if held.is_empty() {
            self.by_peer.remove(&place.peer);
        }
    }
}

/// One connection, until it closes, or until `stop` says so: then the
/// request under way is answered and the connection closed.
async fn serve_connection<Io>(io: Io, router: Router, http2: bool, slow: Duration, mut stop: watch::Receiver<bool>)
where
    Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let io = hyper_util::rt::TokioIo::new(io);
    let service = hyper_util::service::TowerToHyperService::new(router);
    let mut builder = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    if !http2 {
        builder = builder.http1_only();
    }
    // hyper starts this timer whenever it waits for a request header, on
    // an idle keep-alive connection too: an idle one gives its place up.
    builder.http1().timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(slow);
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    let ended = tokio::select! {
        ended = connection.as_mut() => ended,
        Ok(()) = stop.changed() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = ended {
        tracing::debug!(error = %e, "HTTP connection ended");
    }
}

/// Bind `addr`; also returns the bound address (with port 0 the kernel
/// picks one, and the start-up log says which).
async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr).await.map_err(|source| BindError { addr, source })?;
    let bound = listener.local_addr().map_err(|source| BindError { addr, source })?;
    Ok((listener, bound))
}

/// How long the listener waits after failing to accept a connection.
const ACCEPT_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a client may take over its TLS handshake or request header.
const SLOW_CLIENT: std::time::Duration = std::time::Duration::from_secs(10);

/// Connections served at once, per listener (the probes and the metrics
/// each have theirs). Each costs a task and buffers (tens of KiB with
/// TLS), and a scraper or a kubelet needs one: 64 leave room for many
/// Prometheus replicas while a client opening thousands cannot make the
/// operator hold thousands; past it, the client holding the most loses its
/// oldest ([`Places`]). HTTP/1.1 connections idle past [`SLOW_CLIENT`] are
/// closed; an HTTP/2 connection (only when the TLS configuration offers
/// `h2`) has no such timeout.
const MAX_CONNECTIONS: usize = 64;

/// The most connections of one client address on a listener: half of
/// [`MAX_CONNECTIONS`], so that one client never holds them all, and its
/// connections past its share cost an accept, not another's place.
const PER_CLIENT: usize = MAX_CONNECTIONS / 2;

/// What the metrics listener serves, as its start-up log line says.
pub const METRICS_ENDPOINTS: &str = "/metrics";
/// What the probes' listener serves, as its start-up log line says.
pub const PROBE_ENDPOINTS: &str = "/healthz,/readyz";

/// `/metrics`, open to whoever reaches it.
pub fn metrics_router(exposition: Exposition) -> Router {
    Router::new().route("/metrics", get(metrics_handler)).with_state(exposition)
}

/// The metrics router, each request first checked by `auth`: 401 without
/// a valid token, 403 for a user without `get` on `/metrics`, 429 with
/// `Retry-After` for a token not yet reviewed while the reviews are over
/// their limit (counted in `throttled`), 500 if the API server could not be
/// asked.
pub fn secure_metrics_router(exposition: Exposition, auth: Arc<MetricsAuth>, throttled: Counter) -> Router {
    metrics_router(exposition).layer(axum::middleware::from_fn_with_state((auth, throttled), authorize))
}

async fn authorize(
    State((auth, throttled)): State<(Arc<MetricsAuth>, Counter)>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let header = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    // A refused client gives its connection's place up: one answered 401
    // every few seconds on a kept-alive connection would hold it for good.
    let close = request.version() < axum::http::Version::HTTP_2;
    let mut refused = match auth.check(header).await {
        Ok(Access::Allowed) => return next.run(request).await,
        Ok(Access::Unauthenticated) => {
            (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")], "Unauthorized").into_response()
        }
        Ok(Access::Forbidden) => (StatusCode::FORBIDDEN, "Forbidden").into_response(),
        Ok(Access::TooMany { retry_after }) => {
            throttled.inc();
            let retry_after = retry_after_seconds(retry_after).to_string();
            (StatusCode::TOO_MANY_REQUESTS, [(header::RETRY_AFTER, retry_after)], "Too Many Requests").into_response()
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot review a metrics scraper's token");
            (StatusCode::INTERNAL_SERVER_ERROR, "cannot review the token").into_response()
        }
    };
    if close {
        refused.headers_mut().insert(header::CONNECTION, axum::http::HeaderValue::from_static("close"));
    }
    refused
}

/// `Retry-After` counts whole seconds: rounded up, so a client that obeys
/// it does not come back too early, and at least 1 (0 would say "now").
fn retry_after_seconds(wait: std::time::Duration) -> u64 {
    (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
}

/// `/healthz` (always 200: the process answers) and `/readyz`
/// ([`Readiness`]).
pub fn probes_router(readiness: Arc<Readiness>) -> Router {
    Router::new().route("/healthz", get(|| async { "ok" })).route("/readyz", get(readyz)).with_state(readiness)
}

async fn metrics_handler(State(exposition): State<Exposition>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], exposition())
}

async fn readyz(State(readiness): State<Arc<Readiness>>) -> impl IntoResponse {
    if readiness.is_ready() { (StatusCode::OK, "ok") } else { (StatusCode::SERVICE_UNAVAILABLE, "not ready") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use tower::ServiceExt;

    async fn get(router: &Router, path: &str) -> StatusCode {
        let request = axum::http::Request::get(path).body(Body::empty()).unwrap();
        router.clone().oneshot(request).await.unwrap().status()
    }

    #[tokio::test]
    async fn readyz_answers_503_until_the_caches_are_synced_and_healthz_always_200() {
        let readiness = Arc::new(Readiness::default());
        let router = probes_router(readiness.clone());
        assert_eq!(get(&router, "/readyz").await, StatusCode::SERVICE_UNAVAILABLE, "standby or leader alike");
        assert_eq!(get(&router, "/healthz").await, StatusCode::OK);
        readiness.caches_synced();
        assert_eq!(get(&router, "/readyz").await, StatusCode::OK);
        assert_eq!(get(&router, "/metrics").await, StatusCode::NOT_FOUND, "metrics are on their own listener");
    }

    /// Once the token reviews are over their limit, a scraper with a token
    /// not yet reviewed is told 429 and when to come back, without a
    /// review, and the refusal is counted.
    #[tokio::test(start_paused = true)]
    async fn a_new_token_over_the_review_limit_is_answered_429_with_retry_after_and_counted() {
        use crate::auth::{REVIEW_BURST, tests::refusing_every_token};
        let (client, reviews) = refusing_every_token();
        let throttled = Counter::default();
        let exposition: Exposition = Arc::new(|| "# EOF\n".to_owned());
        let router = secure_metrics_router(exposition, Arc::new(MetricsAuth::new(client)), throttled.clone());
        let scrape = |token: String| {
            let request = axum::http::Request::get("/metrics")
                .header(header::AUTHORIZATION, format!("Bearer {token}"))
                .body(Body::empty())
                .unwrap();
            router.clone().oneshot(request)
        };
        for n in 0..REVIEW_BURST {
            assert_eq!(scrape(format!("junk-{n}")).await.unwrap().status(), StatusCode::UNAUTHORIZED, "junk-{n}");
        }
        let refused = scrape("one-more".into()).await.unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        let close = refused.headers().get(header::CONNECTION);
        assert_eq!(close.map(|v| v.to_str().unwrap()), Some("close"), "a refused client gives its place up");
        assert_eq!(refused.headers().get(header::RETRY_AFTER).map(|v| v.to_str().unwrap()), Some("1"));
        assert_eq!(reviews.load(std::sync::atomic::Ordering::SeqCst), usize::try_from(REVIEW_BURST).unwrap());
        assert_eq!(throttled.get(), 1);
    }

    /// A plain listener on a free port serving the probes, as [`serve`]
    /// does, and its address.
    async fn probes_listening() -> SocketAddr {
        probes_server().await.local_addr()
    }

    async fn probes_server() -> Server {
        let router = probes_router(Arc::new(Readiness::default()));
        serve("127.0.0.1:0".parse().unwrap(), PROBE_ENDPOINTS, router).await.unwrap()
    }

    /// `GET /healthz` on `tcp`, and the answer's status line.
    async fn healthz(tcp: &mut TcpStream) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        tcp.write_all(b"GET /healthz HTTP/1.1\r\nhost: operator\r\n\r\n").await.unwrap();
        let mut answer = vec![0; 512];
        let read = tcp.read(&mut answer).await.unwrap();
        String::from_utf8_lossy(&answer[..read]).lines().next().unwrap_or_default().to_owned()
    }

    // Real time, not paused: a paused clock jumps ahead while the kernel
    // still carries the connection, and would time out what never waited.
    #[tokio::test]
    async fn a_client_that_sends_no_request_header_for_10_s_is_dropped_from_the_probes_too() {
        use tokio::io::AsyncReadExt;
        let addr = probes_listening().await;
        let mut idle = TcpStream::connect(addr).await.unwrap();
        let started = std::time::Instant::now();
        let read = tokio::time::timeout(SLOW_CLIENT * 2, idle.read(&mut [0; 16])).await;
        assert!(matches!(read, Ok(Ok(0) | Err(_))), "still open after {:?}: {read:?}", SLOW_CLIENT * 2);
        assert!(started.elapsed() >= SLOW_CLIENT - std::time::Duration::from_millis(100), "{:?}", started.elapsed());
    }

    /// A connection to `addr` from the loopback address `from` (Linux
    /// answers on all of 127/8): another client, as the API server's
    /// kubelet and a pod are.
    async fn connect_from(from: [u8; 4], addr: SocketAddr) -> TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::from((from, 0))).unwrap();
        socket.connect(addr).await.unwrap()
    }

    /// Ten probes from the kubelet's address, each answered within a second.
    async fn probes_answered_within_a_second(addr: SocketAddr) -> usize {
        let mut answered = 0;
        for _ in 0..10 {
            let probe = async {
                let mut tcp = connect_from([127, 0, 0, 1], addr).await;
                healthz(&mut tcp).await
            };
            if let Ok(status) = tokio::time::timeout(std::time::Duration::from_secs(1), probe).await {
                answered += usize::from(status == "HTTP/1.1 200 OK");
            }
        }
        answered
    }

    #[tokio::test]
    async fn a_client_holding_hundreds_of_idle_or_slow_connections_does_not_keep_the_probes_out() {
        use tokio::io::AsyncWriteExt;
        let addr = probes_listening().await;
        assert_eq!(probes_answered_within_a_second(addr).await, 10, "before");
        // One client, another address: 150 idle connections and 150 that
        // send their request header a byte at a time.
        let mut held = Vec::new();
        for n in 0..300 {
            let mut tcp = connect_from([127, 0, 0, 2], addr).await;
            if n % 2 == 1 {
                tcp.write_all(b"GET /hea").await.unwrap();
            }
            held.push(tcp);
        }
        assert_eq!(probes_answered_within_a_second(addr).await, 10, "while 300 connections are held");
        drop(held);
    }

    /// Whether the listener closed `tcp` (within 5 s).
    async fn closed(tcp: &mut TcpStream) -> bool {
        use tokio::io::AsyncReadExt;
        let read = tokio::time::timeout(std::time::Duration::from_secs(5), tcp.read(&mut [0; 16])).await;
        matches!(read, Ok(Ok(0) | Err(_)))
    }

    #[tokio::test]
    async fn a_client_past_its_share_is_closed_at_once_and_past_the_cap_the_heaviest_clients_oldest_goes() {
        let addr = probes_listening().await;
        let mut a = Vec::new();
        for _ in 0..PER_CLIENT {
            let mut tcp = connect_from([127, 0, 0, 2], addr).await;
            assert_eq!(healthz(&mut tcp).await, "HTTP/1.1 200 OK");
            a.push(tcp);
        }
        let mut past_share = connect_from([127, 0, 0, 2], addr).await;
        assert!(closed(&mut past_share).await, "a client's connection past its share is closed at once");
        let mut b = Vec::new();
        for _ in 0..MAX_CONNECTIONS - PER_CLIENT {
            let mut tcp = connect_from([127, 0, 0, 3], addr).await;
            assert_eq!(healthz(&mut tcp).await, "HTTP/1.1 200 OK");
            b.push(tcp);
        }
        // Every place taken: a third client's connection takes the place of
        // the oldest of one of the two holding the most.
        let mut third = connect_from([127, 0, 0, 4], addr).await;
        assert_eq!(healthz(&mut third).await, "HTTP/1.1 200 OK", "another client is served at the cap");
        let (a_oldest, b_oldest) = tokio::join!(closed(&mut a[0]), closed(&mut b[0]));
        assert!(a_oldest ^ b_oldest, "one of the heaviest clients' oldest connections is closed, one only");
        assert_eq!(healthz(&mut third).await, "HTTP/1.1 200 OK", "the third client's connection stays");
    }

    #[test]
    fn the_places_never_exceed_the_cap_or_a_clients_share_and_a_freed_place_is_counted_once() {
        let [a, b, c]: [IpAddr; 3] = ["10.0.0.1", "10.0.0.2", "10.0.0.3"].map(|ip| ip.parse().unwrap());
        let mut places = Places::within(Limits::default());
        let mut taken: Vec<_> = (0..PER_CLIENT).map(|_| places.take(a).expect("a's share")).collect();
        assert!(places.take(a).is_none(), "past a's share");
        let _b: Vec<_> = (0..MAX_CONNECTIONS - PER_CLIENT).map(|_| places.take(b).expect("b's share")).collect();
        assert_eq!(places.held, MAX_CONNECTIONS);
        let (c_place, _c_evicted) = places.take(c).expect("c, at the cap");
        assert_eq!(places.held, MAX_CONNECTIONS, "at the cap, one taken back for the new one");
        let a_lost = taken[0].1.try_recv().is_err_and(|e| e == oneshot::error::TryRecvError::Closed);
        let b_left = places.by_peer.get(&b).map_or(0, VecDeque::len);
        assert!(a_lost || b_left < MAX_CONNECTIONS - PER_CLIENT, "one of the heaviest lost its oldest");
        if a_lost {
            let (first, _) = taken.remove(0);
            places.give_back(first);
            assert_eq!(places.held, MAX_CONNECTIONS, "its place was taken back already: not freed twice");
        }
        places.give_back(c_place);
        assert_eq!(places.held, MAX_CONNECTIONS - 1);
        assert!(!places.by_peer.contains_key(&c), "a peer with no connection left is forgotten");
    }

    /// A listener whose `/slow` answers after `delay`, and `/healthz` at once.
    async fn slow_server(delay: Duration) -> Server {
        let slow = move || async move {
            tokio::time::sleep(delay).await;
            "done"
        };
        let router = Router::new()
            .route("/slow", axum::routing::get(slow))
            .route("/healthz", axum::routing::get(|| async { "ok" }));
        serve("127.0.0.1:0".parse().unwrap(), "/slow", router).await.unwrap()
    }

    /// The status line of the answer on `tcp`.
    async fn status_line(tcp: &mut TcpStream) -> String {
        use tokio::io::AsyncReadExt;
        let mut answer = vec![0; 512];
        let read = tcp.read(&mut answer).await.unwrap();
        String::from_utf8_lossy(&answer[..read]).lines().next().unwrap_or_default().to_owned()
    }

    #[tokio::test]
    async fn a_shutdown_answers_the_request_under_way_closes_idle_connections_and_accepts_no_more() {
        use tokio::io::AsyncWriteExt;
        let server = slow_server(Duration::from_millis(500)).await;
        let addr = server.local_addr();
        let mut idle = TcpStream::connect(addr).await.unwrap();
        assert_eq!(healthz(&mut idle).await, "HTTP/1.1 200 OK", "a keep-alive connection, idle since");
        let mut busy = TcpStream::connect(addr).await.unwrap();
        busy.write_all(b"GET /slow HTTP/1.1\r\nhost: operator\r\n\r\n").await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let started = std::time::Instant::now();
        let (drained, answer, idle_closed) =
            tokio::join!(server.shutdown(Duration::from_secs(5)), status_line(&mut busy), closed(&mut idle));
        assert_eq!(answer, "HTTP/1.1 200 OK", "the request under way is answered");
        assert!(idle_closed, "the idle connection is closed");
        assert!(drained, "every connection ended within the grace");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the idle connection held the shutdown: {:?}",
            started.elapsed()
        );
        assert!(TcpStream::connect(addr).await.is_err(), "still accepting");
    }

    #[tokio::test]
    async fn a_request_longer_than_the_grace_is_cut_and_the_shutdown_says_so() {
        use tokio::io::AsyncWriteExt;
        let server = slow_server(Duration::from_secs(30)).await;
        let mut busy = TcpStream::connect(server.local_addr()).await.unwrap();
        busy.write_all(b"GET /slow HTTP/1.1\r\nhost: operator\r\n\r\n").await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!server.shutdown(Duration::from_millis(300)).await, "said drained with a request under way");
        assert!(closed(&mut busy).await, "the connection outlived its grace");
    }

    #[tokio::test]
    async fn a_listener_within_smaller_limits_closes_a_client_past_its_own_share() {
        let limits = Limits::default().with_connections(4).with_per_client(2);
        let router = probes_router(Arc::new(Readiness::default()));
        let server = serve_with("127.0.0.1:0".parse().unwrap(), PROBE_ENDPOINTS, router, limits).await.unwrap();
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut tcp = connect_from([127, 0, 0, 2], server.local_addr()).await;
            assert_eq!(healthz(&mut tcp).await, "HTTP/1.1 200 OK");
            held.push(tcp);
        }
        let mut third = connect_from([127, 0, 0, 2], server.local_addr()).await;
        assert!(closed(&mut third).await, "a third connection of a client whose share is 2");
        let mut other = connect_from([127, 0, 0, 3], server.local_addr()).await;
        assert_eq!(healthz(&mut other).await, "HTTP/1.1 200 OK", "another client is served");
    }

    #[test]
    fn limits_keep_a_clients_share_within_the_listeners_places() {
        let limits = Limits::default().with_connections(3);
        assert_eq!((limits.connections, limits.per_client), (3, 3));
        assert_eq!(Limits::default().with_per_client(0).per_client, 1);
        assert_eq!(Limits::default().with_connections(0).connections, 1);
    }

    #[test]
    fn retry_after_is_whole_seconds_rounded_up_and_never_zero() {
        let table = [(0, 1), (1, 1), (200, 1), (1_000, 1), (1_001, 2), (2_500, 3)];
        for (millis, want) in table {
            assert_eq!(retry_after_seconds(std::time::Duration::from_millis(millis)), want, "{millis} ms");
        }
    }
}
