//! Who may read `/metrics` when it is served securely: as kubebuilder's
//! scaffold (controller-runtime's `WithAuthenticationAndAuthorization`), the
//! caller's bearer token is authenticated with a TokenReview and the user it
//! names authorized with a SubjectAccessReview for `get` on the
//! non-resource URL `/metrics` (a ClusterRole bound to the scraper grants
//! it: the crate's README).
//!
//! Answers are cached per token — by its SHA-256, never the token itself —
//! for a minute if allowed and ten seconds if not, so Prometheus scraping
//! every 15 s costs the API server two requests a minute, not two a scrape.
//!
//! The reviews go out as the controller, through the client it is given
//! (a controller's own, which its Lease renewals use), so anyone who can reach the port must not be able to make
//! it flood the API server: tokens never allowed are reviewed at most
//! [`REVIEWS_PER_SECOND`] a second (bursts of [`REVIEW_BURST`]),
//! [`REVIEWS_IN_FLIGHT`] at a time; past that a new token gets
//! [`Access::TooMany`] (429). A scraper already allowed never waits on
//! that: its cached answer is used for a minute, then it is reviewed again
//! under a limit of its own (a flood of new tokens does not spend it), and
//! while that limit or the API server refuses, its last answer stays good
//! for up to [`STALE_FOR`] more. The cache forgets the least recently used
//! answers first.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::Client;
use kube::api::{Api, PostParams};
use parking_lot::Mutex;
use tokio::sync::{Semaphore, SemaphorePermit};
// tokio's clock, so the tests can stop and advance it.
use tokio::time::Instant;
use tracing::{debug, warn};

/// The path and verb a scraper must be allowed.
pub(crate) const METRICS_PATH: &str = "/metrics";
const VERB: &str = "get";
/// How long an answer is reused.
const ALLOWED_FOR: Duration = Duration::from_secs(60);
const DENIED_FOR: Duration = Duration::from_secs(10);
/// How long past its minute an allowed answer still stands while its
/// review again cannot be made (over its limit, or the API server failing):
/// the longest a revoked scraper may still read the metrics, and how long
/// Prometheus is answered through a flood or an API server outage.
pub const STALE_FOR: Duration = Duration::from_secs(300);
/// The most answers kept. Under the review limit at most
/// `REVIEW_BURST + REVIEWS_PER_SECOND × 60 s` = 310 are live at once, so
/// the bound is reached only through expired answers not yet dropped; it is
/// there so that no change of the limits can make the cache unbounded.
const MAX_CACHED: usize = 1024;
/// How many answers a full cache forgets at once. Finding the least
/// recently used is a scan of the whole cache; forgetting an eighth of it
/// each time makes that scan happen once per 128 insertions, not at each.
const EVICTED: usize = MAX_CACHED / 8;
/// Reviews of tokens not cached, on average: the rate a token bucket
/// refills at. A deploy's scrapers, each token reviewed again once a
/// minute, stay far below it, while 2 000 junk tokens in 10 s cost at most
/// `REVIEW_BURST + 5 × 10` = 60 TokenReviews (and a SubjectAccessReview
/// each only for the tokens the API server accepts).
pub const REVIEWS_PER_SECOND: u32 = 5;
/// Reviews that may start at once after a quiet spell: the bucket's size,
/// so a few scrapers starting together are all reviewed at once.
pub const REVIEW_BURST: u32 = 10;
/// Reviews waiting on the API server at once. They share the controller's
/// client, and its API Priority and Fairness flow, with its Lease
/// renewals: two cannot crowd those out, even when the API server is slow
/// to answer them.
pub(crate) const REVIEWS_IN_FLIGHT: usize = 2;
/// How long a new token waits for one of those to finish before it is
/// refused: a review takes milliseconds, and a request that cannot be
/// reviewed soon is better refused than queued without bound.
const PERMIT_WAIT: Duration = Duration::from_millis(250);
/// The longest a token's two reviews may take: an API server that accepts
/// them and stalls would otherwise hold both places in flight for good, and
/// every new token, Prometheus's own once its answer expires, would get 429.
/// A review past it is answered as one the API server failed (500), and
/// not cached.
pub(crate) const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);
/// Over-limit refusals are logged at most this often, with their count: a
/// flood must not flood the log either.
const REFUSALS_LOGGED_EVERY: Duration = Duration::from_secs(60);

/// What a request may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Access {
    /// A valid token whose user may `get` `/metrics`: 200.
    Allowed,
    /// No token, or one the API server does not accept: 401.
    Unauthenticated,
    /// A valid token whose user may not read the metrics: 403.
    Forbidden,
    /// A token not cached while reviews are over their limit: 429, to be
    /// asked again after `retry_after`. Never cached.
    TooMany {
        /// When to ask again.
        retry_after: Duration,
    },
}

impl Access {
    fn cached_for(self) -> Duration {
        if self == Access::Allowed { ALLOWED_FOR } else { DENIED_FOR }
    }
}

/// The token of an `Authorization: Bearer <token>` header value.
pub(crate) fn bearer_token(authorization: Option<&str>) -> Option<&str> {
    let (scheme, token) = authorization?.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The cache key of a token: its SHA-256, so the cache holds no token.
fn token_key(token: &str) -> [u8; 32] {
    // SHA-256 is 32 bytes long: copy_from_slice cannot fail, and no
    // fallback key could make two tokens share an answer.
    let mut key = [0u8; 32];
    key.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, token.as_bytes()).as_ref());
    key
}

/// Reviews scrapers' tokens through the API server, with a cache and a
/// limit on the reviews.
pub struct MetricsAuth {
    client: Client,
    cache: Mutex<Cache>,
    /// Reviews of tokens never allowed.
    limiter: Mutex<Limiter>,
    /// Reviews again of tokens allowed before: a limit of their own, so
    /// that a flood of new tokens cannot spend it.
    renewals: Mutex<Limiter>,
    in_flight: Semaphore,
}

/// What it holds, never a token.
impl std::fmt::Debug for MetricsAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsAuth")
            .field("answers_cached", &self.cache.lock().answers.len())
            .field("reviews_in_flight", &(REVIEWS_IN_FLIGHT - self.in_flight.available_permits()))
            .finish_non_exhaustive()
    }
}

impl MetricsAuth {
    /// Reviews through `client`, as its user, which needs `create` on
    /// `tokenreviews` and `subjectaccessreviews` (the crate's README).
    pub fn new(client: Client) -> Self {
        MetricsAuth {
            client,
            cache: Mutex::default(),
            limiter: Mutex::new(Limiter::new(Instant::now())),
            renewals: Mutex::new(Limiter::new(Instant::now())),
            in_flight: Semaphore::new(REVIEWS_IN_FLIGHT),
        }
    }

    /// The access of a request with this `Authorization` header. `Err` if
    /// the API server could not answer (not cached: the next scrape asks
    /// again).
    pub async fn check(&self, authorization: Option<&str>) -> kube::Result<Access> {
        let Some(token) = bearer_token(authorization) else { return Ok(Access::Unauthenticated) };
        let key = token_key(token);
        // Before the limit: only a review costs the API server anything,
        // and a scraper already reviewed must never be throttled.
        if let Some(access) = self.cached(&key) {
            return Ok(access);
        }
        // Allowed before, and not long ago: reviewed again under a limit of
        // its own, and still allowed if that review cannot be made now.
        let allowed_before = self.cache.lock().allowed_recently(&key, Instant::now());
        let limiter = if allowed_before { &self.renewals } else { &self.limiter };
        let _permit = match self.admit(limiter).await {
            Ok(permit) => permit,
            Err(_) if allowed_before => return Ok(self.still_allowed("the reviews are over their limit")),
            Err(retry_after) => return Ok(Access::TooMany { retry_after }),
        };
        let reviewed = tokio::time::timeout(REVIEW_TIMEOUT, self.review(token)).await;
        let access = match reviewed {
            Ok(Ok(access)) => access,
            Err(_) if allowed_before => return Ok(self.still_allowed("the review timed out")),
            Ok(Err(e)) if allowed_before => {
                warn!(error = %e, "cannot review a metrics scraper's token again; its last answer stands meanwhile");
                return Ok(Access::Allowed);
            }
            Err(_) => {
                let took = format!("the token's review took over {} s", REVIEW_TIMEOUT.as_secs());
                return Err(kube::Error::Service(took.into()));
            }
            Ok(Err(e)) => return Err(e),
        };
        debug!(?access, "metrics scraper reviewed");
        self.remember(key, access);
        Ok(access)
    }

    /// A scraper allowed before, whose review again cannot be made now: its
    /// last answer stands, for up to [`STALE_FOR`] past its time.
    fn still_allowed(&self, why: &str) -> Access {
        debug!(why, "a metrics scraper's last answer stands while it cannot be reviewed again");
        Access::Allowed
    }

    /// Who the token is, and whether they may read the metrics.
    async fn review(&self, token: &str) -> kube::Result<Access> {
        let Some(user) = self.authenticate(token).await? else { return Ok(Access::Unauthenticated) };
        Ok(if self.authorize(user).await? { Access::Allowed } else { Access::Forbidden })
    }

    fn cached(&self, key: &[u8; 32]) -> Option<Access> {
        self.cache.lock().get(key, Instant::now())
    }

    fn remember(&self, key: [u8; 32], access: Access) {
        self.cache.lock().insert(key, access, Instant::now());
    }

    /// A permit to review one token, or how long to wait before asking
    /// again: one of the reviews in flight must end within [`PERMIT_WAIT`],
    /// and `limiter`'s bucket must hold a review.
    async fn admit(&self, limiter: &Mutex<Limiter>) -> Result<SemaphorePermit<'_>, Duration> {
        let permit = tokio::time::timeout(PERMIT_WAIT, self.in_flight.acquire()).await;
        let mut limiter = limiter.lock();
        let now = Instant::now();
        let admitted = match permit {
            Ok(Ok(permit)) => limiter.take(now).map(|()| permit),
            // The semaphore is never closed: this is the wait running out.
            // The reviews in flight take milliseconds: ask again in a second.
            Ok(Err(_)) | Err(_) => Err(Duration::from_secs(1)),
        };
        if admitted.is_err()
            && let Some(refused) = limiter.refused(now)
        {
            warn!(
                refused,
                "metrics token reviews over their limit ({REVIEWS_PER_SECOND} a second, bursts of {REVIEW_BURST}, \
                 {REVIEWS_IN_FLIGHT} at a time): tokens not yet reviewed get 429, scrapers already reviewed are \
                 still answered; many distinct tokens mean a client trying tokens on the metrics port: find it \
                 there (reported every {} s at most)",
                REFUSALS_LOGGED_EVERY.as_secs()
            );
        }
        admitted
    }

    /// The user the token belongs to, if the API server accepts it.
    async fn authenticate(&self, token: &str) -> kube::Result<Option<UserInfo>> {
        let review = TokenReview {
            // `Option<String>` up to Kubernetes 1.36's API, `String` from
            // 1.37's on: `into` builds either.
            #[allow(clippy::useless_conversion)]
            spec: TokenReviewSpec { token: token.to_owned().into(), ..TokenReviewSpec::default() },
            ..TokenReview::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone()).create(&PostParams::default(), &review).await?;
        let status = reviewed.status.unwrap_or_default();
        Ok(if status.authenticated == Some(true) { status.user } else { None })
    }

    /// Whether `user` may `get` the metrics path.
    async fn authorize(&self, user: UserInfo) -> kube::Result<bool> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(METRICS_PATH.into()),
                    verb: Some(VERB.into()),
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let reviewed =
            Api::<SubjectAccessReview>::all(self.client.clone()).create(&PostParams::default(), &review).await?;
        Ok(reviewed.status.is_some_and(|s| s.allowed))
    }
}

/// The answers, by token key, each with the use that last read or wrote
/// it, so a full cache forgets the least recently used.
#[derive(Default)]
struct Cache {
    answers: HashMap<[u8; 32], Cached>,
    /// Counts reads and writes: each stamps its answer with a new value.
    uses: u64,
}

struct Cached {
    access: Access,
    until: Instant,
    used: u64,
}

impl Cache {
    /// A live answer; reading it makes it the most recently used.
    fn get(&mut self, key: &[u8; 32], now: Instant) -> Option<Access> {
        let cached = self.answers.get_mut(key).filter(|c| now < c.until)?;
        self.uses += 1;
        cached.used = self.uses;
        Some(cached.access)
    }

    /// Whether the token was allowed, its answer expired less than
    /// [`STALE_FOR`] ago.
    fn allowed_recently(&self, key: &[u8; 32], now: Instant) -> bool {
        self.answers.get(key).is_some_and(|c| c.access == Access::Allowed && now < c.until + STALE_FOR)
    }

    fn insert(&mut self, key: [u8; 32], access: Access, now: Instant) {
        if self.answers.len() >= MAX_CACHED && !self.answers.contains_key(&key) {
            self.make_room(now);
        }
        self.uses += 1;
        self.answers.insert(key, Cached { access, until: now + access.cached_for(), used: self.uses });
    }

    /// Down to `MAX_CACHED - EVICTED` answers: the expired ones go first
    /// (an allowed one once past [`STALE_FOR`] too), then the least
    /// recently used. Each call frees at least [`EVICTED`] places, so its
    /// O(n) passes are shared by as many insertions.
    fn make_room(&mut self, now: Instant) {
        self.answers.retain(|_, c| now < c.until || (c.access == Access::Allowed && now < c.until + STALE_FOR));
        let keep = MAX_CACHED - EVICTED;
        let Some(excess) = self.answers.len().checked_sub(keep).filter(|n| *n > 0) else { return };
        let mut uses: Vec<u64> = self.answers.values().map(|c| c.used).collect();
        // Every stamp is distinct: the excess-th smallest is the most
        // recently used of the answers to forget.
        let newest_forgotten = *uses.select_nth_unstable(excess - 1).1;
        self.answers.retain(|_, c| c.used > newest_forgotten);
        // Not a warning: the review limit keeps fewer answers live than the
        // bound, so this takes a change of the limits to happen at all.
        debug!(forgotten = excess, "metrics review cache full of live answers; forgot the least recently used");
    }
}

/// The token bucket of reviews, and the refusals not yet logged.
struct Limiter {
    /// Reviews that may start now, up to [`REVIEW_BURST`]; refilled at
    /// [`REVIEWS_PER_SECOND`] from `at`.
    reviews: f64,
    at: Instant,
    refused: u64,
    logged: Option<Instant>,
}

impl Limiter {
    fn new(now: Instant) -> Self {
        Limiter { reviews: f64::from(REVIEW_BURST), at: now, refused: 0, logged: None }
    }

    /// Takes one review, or says how long until there is one.
    fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let refill = now.duration_since(self.at).as_secs_f64() * f64::from(REVIEWS_PER_SECOND);
        self.reviews = (self.reviews + refill).min(f64::from(REVIEW_BURST));
        self.at = now;
        if self.reviews >= 1.0 {
            self.reviews -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.reviews) / f64::from(REVIEWS_PER_SECOND)))
        }
    }

    /// Counts a refusal; the refusals to log now, if a line is due.
    fn refused(&mut self, now: Instant) -> Option<u64> {
        self.refused += 1;
        if self.logged.is_some_and(|at| now < at + REFUSALS_LOGGED_EVERY) {
            return None;
        }
        self.logged = Some(now);
        Some(std::mem::take(&mut self.refused))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// An allowed scraper is reviewed again after a minute; a refused one
    /// after 10 s, so a fixed binding takes effect soon.
    #[test]
    fn an_allowed_answer_is_kept_longer_than_a_refusal() {
        assert_eq!(Access::Allowed.cached_for(), ALLOWED_FOR);
        for refused in [Access::Forbidden, Access::Unauthenticated] {
            assert_eq!(refused.cached_for(), DENIED_FOR, "{refused:?}");
        }
        assert!(ALLOWED_FOR > DENIED_FOR);
    }

    #[test]
    fn only_a_bearer_token_is_taken() {
        let table = [
            (None, None),
            (Some("Bearer abc"), Some("abc")),
            (Some("bearer  abc "), Some("abc")),
            (Some("Bearer "), None),
            (Some("Basic dXNlcjpwYXNz"), None),
            (Some("abc"), None),
        ];
        for (header, want) in table {
            assert_eq!(bearer_token(header), want, "{header:?}");
        }
    }

    type Handle = tower_test::mock::Handle<http::Request<kube::client::Body>, http::Response<kube::client::Body>>;

    /// A client whose requests `handle` answers.
    pub(crate) fn mocked() -> (Client, Handle) {
        let (service, handle) = tower_test::mock::pair();
        (Client::new(service, "default"), handle)
    }

    /// A client whose every request is a TokenReview answered "not
    /// authenticated", and how many it has made.
    pub(crate) fn refusing_every_token() -> (Client, Arc<AtomicUsize>) {
        let (client, mut handle) = mocked();
        let reviews = Arc::new(AtomicUsize::new(0));
        let counted = reviews.clone();
        tokio::spawn(async move {
            while let Some((request, send)) = handle.next_request().await {
                assert_eq!(request.uri().path(), TOKEN_REVIEWS, "only TokenReviews for unknown tokens");
                counted.fetch_add(1, Ordering::SeqCst);
                let body = serde_json::json!({ "status": { "authenticated": false } });
                send.send_response(http::Response::new(kube::client::Body::from(serde_json::to_vec(&body).unwrap())));
            }
        });
        (client, reviews)
    }

    async fn answer(handle: &mut Handle, path: &str, body: serde_json::Value) -> serde_json::Value {
        let next = tokio::time::timeout(Duration::from_secs(5), handle.next_request()).await;
        let (request, send) = next.expect("no request made").expect("a request");
        assert_eq!((request.method().as_str(), request.uri().path()), ("POST", path));
        let sent = request.into_body().collect_bytes().await.unwrap();
        send.send_response(http::Response::new(kube::client::Body::from(serde_json::to_vec(&body).unwrap())));
        serde_json::from_slice(&sent).unwrap()
    }

    /// A cache key of its own for `n`.
    fn key(n: usize) -> [u8; 32] {
        let mut key = [0; 32];
        key[..8].copy_from_slice(&n.to_le_bytes());
        key
    }

    /// An answer that lives until `until`, used before any other.
    fn cached_until(access: Access, until: Instant) -> Cached {
        Cached { access, until, used: 0 }
    }

    /// The cache never holds more than MAX_CACHED answers: at the bound the
    /// expired ones go first, and only when too few have expired does it
    /// forget live ones.
    #[tokio::test]
    async fn the_review_cache_stays_within_its_bound_dropping_expired_answers_first() {
        let auth = MetricsAuth::new(mocked().0);
        // Expired, and past the time an allowed answer still stands.
        let past = Instant::now() - STALE_FOR - Duration::from_secs(1);
        {
            let mut cache = auth.cache.lock();
            cache.answers.insert(key(0), cached_until(Access::Allowed, Instant::now() + ALLOWED_FOR));
            cache.answers.extend((1..MAX_CACHED).map(|n| (key(n), cached_until(Access::Allowed, past))));
        }
        auth.remember(key(MAX_CACHED), Access::Forbidden);
        assert_eq!(auth.cache.lock().answers.len(), 2, "the expired answers go, the live one and the new one stay");
        assert_eq!(auth.cached(&key(0)), Some(Access::Allowed));
        assert_eq!(auth.cached(&key(MAX_CACHED)), Some(Access::Forbidden));
        for n in 1..=MAX_CACHED + 10 {
            auth.remember(key(MAX_CACHED + n), Access::Allowed);
            let len = auth.cache.lock().answers.len();
            assert!(len <= MAX_CACHED, "{len} answers cached");
        }
    }

    /// Prometheus's answer, read at each scrape, outlives a flood of new
    /// tokens that fills the cache many times over; an answer nobody reads
    /// again goes, though it was written after Prometheus's.
    #[tokio::test]
    async fn a_recently_used_answer_survives_a_flood_of_new_tokens_and_the_least_recently_used_goes() {
        let mut cache = Cache::default();
        let now = Instant::now();
        let (scraper, idle) = (key(0), key(1));
        cache.insert(scraper, Access::Allowed, now);
        cache.insert(idle, Access::Allowed, now);
        for n in 2..4 * MAX_CACHED {
            cache.insert(key(n), Access::Unauthenticated, now);
            assert!(cache.answers.len() <= MAX_CACHED, "{} answers cached", cache.answers.len());
            if n % 100 == 0 {
                assert_eq!(cache.get(&scraper, now), Some(Access::Allowed), "the scraper's answer, {n} tokens in");
            }
        }
        assert_eq!(cache.get(&scraper, now), Some(Access::Allowed));
        assert_eq!(cache.get(&idle, now), None, "the least recently used answer is still cached");
        assert!(cache.answers.len() > MAX_CACHED - EVICTED, "a full cache forgot more than it needed to");
    }

    /// The check of `token`, as a middleware makes it.
    async fn check(auth: &MetricsAuth, token: &str) -> Access {
        auth.check(Some(&format!("Bearer {token}"))).await.unwrap()
    }

    /// A flood of junk tokens: the bucket's burst is reviewed, every token
    /// past it refused without a request, until the bucket refills.
    #[tokio::test(start_paused = true)]
    async fn a_flood_of_new_tokens_past_the_burst_gets_too_many_without_a_review_until_the_bucket_refills() {
        let (client, reviews) = refusing_every_token();
        let auth = MetricsAuth::new(client);
        let burst = usize::try_from(REVIEW_BURST).unwrap();
        let per_second = usize::try_from(REVIEWS_PER_SECOND).unwrap();
        let flood = |from: usize| {
            let auth = &auth;
            async move {
                let mut too_many = 0;
                for n in from..from + 100 {
                    match check(auth, &format!("junk-{n}")).await {
                        Access::Unauthenticated => {}
                        Access::TooMany { retry_after } => {
                            assert!(retry_after > Duration::ZERO, "ask again later, not now");
                            assert!(retry_after <= Duration::from_secs(1) / REVIEWS_PER_SECOND, "{retry_after:?}");
                            too_many += 1;
                        }
                        other => panic!("junk-{n}: {other:?}"),
                    }
                }
                too_many
            }
        };
        assert_eq!(flood(0).await, 100 - burst, "refused past the burst");
        assert_eq!(reviews.load(Ordering::SeqCst), burst, "TokenReviews sent");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(flood(100).await, 100 - per_second, "refused a second later");
        assert_eq!(reviews.load(Ordering::SeqCst), burst + per_second, "TokenReviews sent");
    }

    /// Prometheus, reviewed before the flood, is answered from the cache
    /// while every new token is refused.
    #[tokio::test(start_paused = true)]
    async fn a_scraper_whose_answer_is_cached_is_answered_while_new_tokens_are_refused() {
        let (client, reviews) = refusing_every_token();
        let auth = MetricsAuth::new(client);
        auth.remember(token_key("prometheus"), Access::Allowed);
        let mut n = 0;
        while !matches!(check(&auth, &format!("junk-{n}")).await, Access::TooMany { .. }) {
            n += 1;
        }
        let sent = reviews.load(Ordering::SeqCst);
        for _ in 0..10 {
            assert_eq!(check(&auth, "prometheus").await, Access::Allowed);
        }
        assert_eq!(reviews.load(Ordering::SeqCst), sent, "a cached answer made a request");
    }

    /// With two reviews waiting on the API server, a third new token waits
    /// PERMIT_WAIT, then is refused without a request.
    #[tokio::test(start_paused = true)]
    async fn a_new_token_past_the_reviews_in_flight_waits_briefly_then_gets_too_many() {
        let (client, mut handle) = mocked();
        let auth = Arc::new(MetricsAuth::new(client));
        let checks: Vec<_> = (0..=REVIEWS_IN_FLIGHT)
            .map(|n| {
                let auth = auth.clone();
                tokio::spawn(async move { check(&auth, &format!("slow-{n}")).await })
            })
            .collect();
        let mut held = Vec::new();
        for _ in 0..REVIEWS_IN_FLIGHT {
            held.push(handle.next_request().await.expect("a review").1);
        }
        tokio::time::sleep(PERMIT_WAIT + Duration::from_millis(1)).await;
        let refused: Vec<_> = checks.iter().filter(|c| c.is_finished()).collect();
        assert_eq!(refused.len(), 1, "checks answered while the reviews wait");
        let more = tokio::time::timeout(Duration::from_secs(1), handle.next_request()).await;
        assert!(more.is_err(), "a review past {REVIEWS_IN_FLIGHT} in flight was sent");
        for send in held {
            let body = serde_json::json!({ "status": { "authenticated": false } });
            send.send_response(http::Response::new(kube::client::Body::from(serde_json::to_vec(&body).unwrap())));
        }
        let mut answers = Vec::new();
        for c in checks {
            answers.push(c.await.unwrap());
        }
        let too_many = answers.iter().filter(|a| matches!(a, Access::TooMany { .. })).count();
        let reviewed = answers.iter().filter(|a| **a == Access::Unauthenticated).count();
        assert_eq!((too_many, reviewed), (1, REVIEWS_IN_FLIGHT), "{answers:?}");
    }

    /// A review the API server never answers ends at REVIEW_TIMEOUT as an
    /// error, not cached, and gives its place in flight back.
    #[tokio::test(start_paused = true)]
    async fn a_review_the_api_server_stalls_ends_at_its_deadline_and_frees_its_place() {
        let (client, mut handle) = mocked();
        let auth = Arc::new(MetricsAuth::new(client));
        let stalled = tokio::spawn({
            let auth = auth.clone();
            async move { auth.check(Some("Bearer stalled")).await }
        });
        let (_, held) = handle.next_request().await.expect("a review");
        tokio::time::sleep(REVIEW_TIMEOUT + Duration::from_millis(1)).await;
        let ended = tokio::time::timeout(Duration::from_millis(1), stalled).await.expect("ended at its deadline");
        let err = ended.unwrap().expect_err("a stalled review is an error");
        assert!(err.to_string().contains("took over"), "{err}");
        assert_eq!(auth.cached(&token_key("stalled")), None, "an error is not cached");
        assert_eq!(auth.in_flight.available_permits(), REVIEWS_IN_FLIGHT, "its place is free again");
        drop(held);
    }

    /// A flood is logged once a minute with its count, not once a request.
    #[test]
    fn over_limit_refusals_are_logged_once_a_minute_with_their_count() {
        let start = Instant::now();
        let mut limiter = Limiter::new(start);
        assert_eq!(limiter.refused(start), Some(1), "the first refusal is logged at once");
        for _ in 0..99 {
            assert_eq!(limiter.refused(start + Duration::from_secs(30)), None);
        }
        assert_eq!(limiter.refused(start + REFUSALS_LOGGED_EVERY), Some(100), "the refusals since the last line");
        assert_eq!(limiter.refused(start + REFUSALS_LOGGED_EVERY + Duration::from_secs(1)), None);
    }

    /// A client whose API server knows one token, `prometheus`, allowed to
    /// read the metrics, and `fails` for its reviews while set; every other
    /// token is not authenticated. Counts the TokenReviews of each.
    fn knowing_prometheus(fails: Arc<std::sync::atomic::AtomicBool>) -> (Client, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let (client, mut handle) = mocked();
        let (junk, prometheus) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (junk_reviews, prometheus_reviews) = (junk.clone(), prometheus.clone());
        tokio::spawn(async move {
            while let Some((request, send)) = handle.next_request().await {
                let path = request.uri().path().to_owned();
                let sent: serde_json::Value =
                    serde_json::from_slice(&request.into_body().collect_bytes().await.unwrap()).unwrap();
                let known = sent["spec"]["token"] == "prometheus" || path == ACCESS_REVIEWS;
                if path == TOKEN_REVIEWS {
                    let count = if known { &prometheus_reviews } else { &junk_reviews };
                    count.fetch_add(1, Ordering::SeqCst);
                }
                if known && fails.load(Ordering::SeqCst) {
                    let failed = serde_json::json!({ "kind": "Status", "code": 500, "message": "etcd is down" });
                    let mut response =
                        http::Response::new(kube::client::Body::from(serde_json::to_vec(&failed).unwrap()));
                    *response.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
                    send.send_response(response);
                    continue;
                }
                let body = match (path.as_str(), known) {
                    (TOKEN_REVIEWS, true) => serde_json::json!({ "status": { "authenticated": true,
                        "user": { "username": "system:serviceaccount:monitoring:prometheus" } } }),
                    (TOKEN_REVIEWS, false) => serde_json::json!({ "status": { "authenticated": false } }),
                    _ => serde_json::json!({ "status": { "allowed": true } }),
                };
                send.send_response(http::Response::new(kube::client::Body::from(serde_json::to_vec(&body).unwrap())));
            }
        });
        (client, junk, prometheus)
    }

    /// Prometheus scraping every 5 s through a flood of new tokens that
    /// lasts past its answer's minute: it is reviewed again on time, under
    /// its own limit, and every scrape is answered; the flood still gets
    /// no more reviews than the limit allows.
    #[tokio::test(start_paused = true)]
    async fn a_scraper_allowed_before_is_answered_through_a_flood_that_outlasts_its_cached_answer() {
        let (client, junk, prometheus) = knowing_prometheus(Arc::default());
        let auth = MetricsAuth::new(client);
        assert_eq!(check(&auth, "prometheus").await, Access::Allowed);
        let (mut n, start) = (0, Instant::now());
        // 2 000 junk tokens over 90 s, 45 ms apart; a scrape every 5 s.
        while n < 2000 {
            if n % 111 == 0 {
                assert_eq!(check(&auth, "prometheus").await, Access::Allowed, "{:?} into the flood", start.elapsed());
            }
            let _ = check(&auth, &format!("junk-{n}")).await;
            n += 1;
            tokio::time::advance(Duration::from_millis(45)).await;
        }
        assert!(start.elapsed() >= Duration::from_secs(90), "{:?}", start.elapsed());
        assert!(prometheus.load(Ordering::SeqCst) >= 2, "reviewed again once its answer expired");
        let bound = u64::from(REVIEW_BURST) + u64::from(REVIEWS_PER_SECOND) * start.elapsed().as_secs() + 1;
        let junk = u64::try_from(junk.load(Ordering::SeqCst)).unwrap();
        assert!(junk <= bound, "{junk} junk reviews, past the limit's {bound}");
    }

    /// While its review again fails, a scraper allowed before keeps its
    /// answer for STALE_FOR past its time, and not longer.
    #[tokio::test(start_paused = true)]
    async fn a_scraper_allowed_before_keeps_its_answer_while_the_api_server_fails_for_a_bounded_time() {
        let fails = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (client, _, _) = knowing_prometheus(fails.clone());
        let auth = MetricsAuth::new(client);
        assert_eq!(check(&auth, "prometheus").await, Access::Allowed);
        fails.store(true, Ordering::SeqCst);
        tokio::time::advance(ALLOWED_FOR + Duration::from_secs(1)).await;
        assert_eq!(check(&auth, "prometheus").await, Access::Allowed, "its last answer stands");
        tokio::time::advance(STALE_FOR).await;
        let expired = auth.check(Some("Bearer prometheus")).await;
        assert!(expired.is_err(), "past STALE_FOR the failure shows: {expired:?}");
        fails.store(false, Ordering::SeqCst);
        assert_eq!(check(&auth, "prometheus").await, Access::Allowed, "reviewed again once the API server answers");
    }

    pub(crate) const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
    const ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";

    #[tokio::test]
    async fn a_scraper_is_reviewed_once_and_then_answered_from_the_cache() {
        let (client, mut handle) = mocked();
        let auth = std::sync::Arc::new(MetricsAuth::new(client));
        let first = tokio::spawn({
            let auth = auth.clone();
            async move { auth.check(Some("Bearer scraper-token")).await.unwrap() }
        });
        let user = serde_json::json!({ "username": "system:serviceaccount:monitoring:prometheus",
            "uid": "u-1", "groups": ["system:serviceaccounts"], "extra": { "k": ["v"] } });
        let authenticated = serde_json::json!({ "status": { "authenticated": true, "user": user } });
        let review = answer(&mut handle, TOKEN_REVIEWS, authenticated).await;
        assert_eq!(review["spec"]["token"], "scraper-token");
        let access = answer(&mut handle, ACCESS_REVIEWS, serde_json::json!({ "status": { "allowed": true } })).await;
        for (field, want) in [("username", "user"), ("uid", "uid"), ("groups", "groups"), ("extra", "extra")] {
            assert_eq!(access["spec"][want], user[field], "the reviewed user's {field}");
        }
        assert_eq!(access["spec"]["nonResourceAttributes"], serde_json::json!({ "path": "/metrics", "verb": "get" }));
        assert_eq!(first.await.unwrap(), Access::Allowed);
        for _ in 0..3 {
            assert_eq!(auth.check(Some("Bearer scraper-token")).await.unwrap(), Access::Allowed);
        }
        let more = tokio::time::timeout(Duration::from_millis(50), handle.next_request()).await;
        assert!(more.is_err(), "a cached answer made a request");
    }

    #[tokio::test]
    async fn an_unknown_token_is_unauthenticated_and_a_user_without_the_role_forbidden() {
        let (client, mut handle) = mocked();
        let auth = std::sync::Arc::new(MetricsAuth::new(client));
        let no_token = tokio::time::timeout(Duration::from_secs(1), auth.check(None)).await;
        assert_eq!(no_token.expect("no token, no request").unwrap(), Access::Unauthenticated);
        let check = |token: &'static str| {
            let auth = auth.clone();
            tokio::spawn(async move { auth.check(Some(&format!("Bearer {token}"))).await.unwrap() })
        };
        let unknown = check("made-up");
        answer(&mut handle, TOKEN_REVIEWS, serde_json::json!({ "status": { "authenticated": false } })).await;
        assert_eq!(unknown.await.unwrap(), Access::Unauthenticated);
        let other = check("someone-else");
        answer(
            &mut handle,
            TOKEN_REVIEWS,
            serde_json::json!({ "status": { "authenticated": true, "user": { "username": "jane" } } }),
        )
        .await;
        answer(&mut handle, ACCESS_REVIEWS, serde_json::json!({ "status": { "allowed": false } })).await;
        assert_eq!(other.await.unwrap(), Access::Forbidden);
    }
}
