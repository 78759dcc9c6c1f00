//! Who may read `/metrics` when it is served securely: as kubebuilder's
//! scaffold (controller-runtime's `WithAuthenticationAndAuthorization`), the
//! caller's bearer token is authenticated with a TokenReview and the user it
//! names authorized with a SubjectAccessReview for `get` on the
//! non-resource URL `/metrics` (the `metrics-reader` ClusterRole grants it).
//!
//! Answers are cached per token — by its SHA-256, never the token itself —
//! for a minute if allowed and ten seconds if not, so Prometheus scraping
//! every 15 s costs the API server two requests a minute, not two a scrape.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::Client;
use kube::api::{Api, PostParams};
use parking_lot::Mutex;
use tracing::{debug, warn};

/// The path and verb a scraper must be allowed.
pub const METRICS_PATH: &str = "/metrics";
const VERB: &str = "get";
/// How long an answer is reused.
const ALLOWED_FOR: Duration = Duration::from_secs(60);
const DENIED_FOR: Duration = Duration::from_secs(10);
/// More distinct tokens than this (someone trying many) and the expired
/// answers are dropped, then all of them.
const MAX_CACHED: usize = 1024;

/// What a request may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Allowed,
    /// No token, or one the API server does not accept: 401.
    Unauthenticated,
    /// A valid token whose user may not read the metrics: 403.
    Forbidden,
}

impl Access {
    fn cached_for(self) -> Duration {
        if self == Access::Allowed { ALLOWED_FOR } else { DENIED_FOR }
    }
}

/// The token of an `Authorization: Bearer <token>` header value.
pub fn bearer_token(authorization: Option<&str>) -> Option<&str> {
    let (scheme, token) = authorization?.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Reviews scrapers' tokens through the API server, with a cache.
pub struct MetricsAuth {
    client: Client,
    cache: Mutex<HashMap<[u8; 32], (Access, Instant)>>,
}

impl MetricsAuth {
    pub fn new(client: Client) -> Self {
        MetricsAuth { client, cache: Mutex::default() }
    }

    /// The access of a request with this `Authorization` header. `Err` if
    /// the API server could not answer (not cached: the next scrape asks
    /// again).
    pub async fn check(&self, authorization: Option<&str>) -> kube::Result<Access> {
        let Some(token) = bearer_token(authorization) else { return Ok(Access::Unauthenticated) };
        // SHA-256 is 32 bytes long: copy_from_slice cannot fail, and no
        // fallback key could make two tokens share an answer.
        let mut key = [0u8; 32];
        key.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, token.as_bytes()).as_ref());
        if let Some(access) = self.cached(&key) {
            return Ok(access);
        }
        let access = match self.authenticate(token).await? {
            None => Access::Unauthenticated,
            Some(user) => {
                if self.authorize(user).await? {
                    Access::Allowed
                } else {
                    Access::Forbidden
                }
            }
        };
        debug!(?access, "metrics scraper reviewed");
        self.remember(key, access);
        Ok(access)
    }

    fn cached(&self, key: &[u8; 32]) -> Option<Access> {
        let cache = self.cache.lock();
        cache.get(key).filter(|(_, until)| Instant::now() < *until).map(|(access, _)| *access)
    }

    fn remember(&self, key: [u8; 32], access: Access) {
        let mut cache = self.cache.lock();
        let now = Instant::now();
        if cache.len() >= MAX_CACHED {
            cache.retain(|_, (_, until)| now < *until);
            if cache.len() >= MAX_CACHED {
                warn!(tokens = cache.len(), "too many distinct metrics tokens; forgetting every cached answer");
                cache.clear();
            }
        }
        cache.insert(key, (access, now + access.cached_for()));
    }

    /// The user the token belongs to, if the API server accepts it.
    async fn authenticate(&self, token: &str) -> kube::Result<Option<UserInfo>> {
        let review = TokenReview {
            spec: TokenReviewSpec { token: Some(token.to_owned()), ..TokenReviewSpec::default() },
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

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A client whose requests `handle` answers.
    fn mocked()
    -> (Client, tower_test::mock::Handle<http::Request<kube::client::Body>, http::Response<kube::client::Body>>) {
        let (service, handle) = tower_test::mock::pair();
        (Client::new(service, "default"), handle)
    }

    async fn answer(
        handle: &mut tower_test::mock::Handle<http::Request<kube::client::Body>, http::Response<kube::client::Body>>,
        path: &str,
        body: serde_json::Value,
    ) -> serde_json::Value {
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

    /// The cache never holds more than MAX_CACHED answers: at the bound the
    /// expired ones go first, and only when none has expired does it start
    /// over (tokens past the bound are someone trying many).
    #[tokio::test]
    async fn the_review_cache_stays_within_its_bound_dropping_expired_answers_first() {
        let auth = MetricsAuth::new(mocked().0);
        let past = Instant::now() - Duration::from_secs(1);
        {
            let mut cache = auth.cache.lock();
            cache.insert(key(0), (Access::Allowed, Instant::now() + ALLOWED_FOR));
            cache.extend((1..MAX_CACHED).map(|n| (key(n), (Access::Allowed, past))));
        }
        auth.remember(key(MAX_CACHED), Access::Forbidden);
        assert_eq!(auth.cache.lock().len(), 2, "the expired answers go, the live one and the new one stay");
        assert_eq!(auth.cached(&key(0)), Some(Access::Allowed));
        assert_eq!(auth.cached(&key(MAX_CACHED)), Some(Access::Forbidden));
        for n in 1..=MAX_CACHED + 10 {
            auth.remember(key(MAX_CACHED + n), Access::Allowed);
            assert!(auth.cache.lock().len() <= MAX_CACHED, "{} answers cached", auth.cache.lock().len());
        }
    }

    const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
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
