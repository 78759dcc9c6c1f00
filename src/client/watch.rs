//! The watches the caches are filled from, paced for a struggling API server:
//! kube-runtime's `watcher`, which resumes a failed watch from its last
//! resourceVersion and lists again only when the server says that version is
//! gone (410), wrapped so that
//! - a failure is retried after a delay from [`Pacing`]: the server's
//!   `Retry-After` when it sent one (see [`crate::client`], whose retries wait
//!   it out first), else [`FIRST_RETRY`] (1 s) doubling to 2 s, jittered. Never sooner than a
//!   second: a watch that keeps failing costs the server at most one request a
//!   second, and an API server that recovers is watched again within 2.5 s;
//! - a watch whose server refused the connection (the process is gone: a
//!   restart) tries again every [`REFUSED_RETRY`] — a refused connection costs
//!   no API server anything — and starts over with a fresh list: a restarted
//!   server answers a resumed watch with "too old resource version" only
//!   seconds after it serves lists again.
//!
//! kube-runtime's `StreamBackoff` is not used because it resets on any item,
//! and the watcher yields `Init` before each attempt at a list: on a server
//! that answered lists with 500s, that made the list a tight loop (742 LISTs
//! in the overload test's 12 s of 500s; 0 with this pacing).

use std::error::Error as _;
use std::fmt::Debug;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::watcher;
use tokio::time::Instant;

use crate::client::retry::{FIRST_RETRY, with_jitter};

/// The longest a failing watch waits between tries, before jitter: the
/// longest the controller stays deaf after the server recovers.
pub(crate) const MAX_RETRY: Duration = Duration::from_secs(2);
/// The retry of a watch or list whose connection was refused: no API server
/// is there to load, and its return is noticed within this (jittered).
pub(crate) const REFUSED_RETRY: Duration = Duration::from_millis(250);
/// After this long without a failure, the next one starts from
/// [`FIRST_RETRY`] again (client-go's reflector resets after 2 minutes).
pub(crate) const HEALTHY_RESET: Duration = Duration::from_secs(120);

/// When a failing watch tries again: a pure rule over its failures.
#[derive(Debug, Default)]
pub(crate) struct Pacing {
    failures: u32,
    last_failure: Option<Instant>,
}

impl Pacing {
    /// The delay before the next try, counting a failure at `now`.
    /// `retry_after` is what the server asked for, if it did; `jitter` is a
    /// random number in [0, 1).
    pub(crate) fn failed(&mut self, now: Instant, retry_after: Option<Duration>, jitter: f64) -> Duration {
        if self.last_failure.is_some_and(|last| now.duration_since(last) >= HEALTHY_RESET) {
            self.failures = 0;
        }
        self.last_failure = Some(now);
        let nominal = retry_after.unwrap_or_else(|| {
            let doubled = FIRST_RETRY.saturating_mul(1u32.checked_shl(self.failures).unwrap_or(u32::MAX));
            doubled.min(MAX_RETRY)
        });
        self.failures = self.failures.saturating_add(1);
        with_jitter(nominal, jitter)
    }
}

/// The watches of the leader elector (its Lease and its fence), paced as the
/// caches' are.
#[derive(Clone, Copy, Debug, Default)]
pub struct Paced;

impl kube_lease_fence::Watches for Paced {
    fn watch<K>(
        &self,
        api: kube::Api<K>,
        config: watcher::Config,
    ) -> futures::stream::BoxStream<'static, watcher::Result<watcher::Event<K>>>
    where
        K: Resource + Clone + serde::de::DeserializeOwned + Debug + Send + Sync + 'static,
    {
        watch(api, config).boxed()
    }
}

/// A watch of `api` with `config`, paced by [`Pacing`]; errors are passed on
/// (the controller logs them) after which the next try waits.
pub(crate) fn watch<K>(
    api: kube::Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static
where
    K: Resource + Clone + serde::de::DeserializeOwned + Debug + Send + Sync + 'static,
{
    let fresh = move || watcher::watcher(api.clone(), config.clone()).boxed();
    let state = (fresh(), fresh, Pacing::default(), None::<Duration>);
    futures::stream::unfold(state, |(mut events, fresh, mut pacing, wait)| async move {
        if let Some(wait) = wait {
            tokio::time::sleep(wait).await;
        }
        let event = events.next().await?;
        let wait = match &event {
            Ok(_) => None,
            Err(e) if refused(e) => {
                if server_gone(e) {
                    events = fresh();
                }
                // The next server has no history of failing.
                pacing = Pacing::default();
                Some(with_jitter(REFUSED_RETRY, fastrand::f64()))
            }
            Err(e) => Some(pacing.failed(Instant::now(), status_wait(e), fastrand::f64())),
        };
        Some((event, (events, fresh, pacing, wait)))
    })
}

/// True when a watch could not start or went on because nothing accepted
/// the connection: the API server's process is gone, and its successor's
/// watch cache will not know the old resourceVersion.
pub(crate) fn server_gone(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::WatchStartFailed(_) | watcher::Error::WatchFailed(_)) && refused(e)
}

/// The wait the server asked for in the `Status` it failed the request with
/// (`details.retryAfterSeconds`), once the client's own retries are spent.
fn status_wait(e: &watcher::Error) -> Option<Duration> {
    let status = match e {
        watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s))
        | watcher::Error::InitialListFailed(kube::Error::Api(s)) => s,
        watcher::Error::WatchError(s) => s,
        _ => return None,
    };
    let seconds = status.details.as_ref()?.retry_after_seconds;
    (seconds > 0).then(|| Duration::from_secs(seconds.into()))
}

/// True when nothing accepted the connection of the request that failed.
pub(crate) fn refused(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::WatchStartFailed(e) | watcher::Error::WatchFailed(e) | watcher::Error::InitialListFailed(e) => {
            connection_refused(e)
        }
        watcher::Error::WatchError(_) | watcher::Error::NoResourceVersion => false,
    }
}

fn connection_refused(e: &kube::Error) -> bool {
    refused_below(e.source())
}

/// Whether an error in the chain from `err` is a refused connection; an
/// `io::Error` that wraps another error is looked into too (the TLS
/// connector wraps the TCP connector's errors so).
fn refused_below(mut err: Option<&(dyn std::error::Error + 'static)>) -> bool {
    while let Some(e) = err {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::ConnectionRefused {
                return true;
            }
            if let Some(inner) = io.get_ref()
                && refused_below(Some(inner))
            {
                return true;
            }
        }
        err = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn a_failing_watch_waits_a_second_then_two_and_never_longer() {
        let (mut p, now) = (Pacing::default(), Instant::now());
        let delays: Vec<_> = (0..5).map(|i| p.failed(now + secs(i as f64), None, 0.0)).collect();
        assert_eq!(delays, [secs(1.0), secs(2.0), secs(2.0), secs(2.0), secs(2.0)]);
    }

    #[test]
    fn jitter_only_lengthens_a_delay_and_by_at_most_a_quarter() {
        let now = Instant::now();
        assert_eq!(Pacing::default().failed(now, None, 0.999_999).as_millis(), 1249);
        assert_eq!(Pacing::default().failed(now, Some(secs(4.0)), 0.5), secs(4.5));
        // A random source gone wrong cannot shorten or stretch it further.
        assert_eq!(Pacing::default().failed(now, None, -3.0), secs(1.0));
        assert_eq!(Pacing::default().failed(now, None, 7.0), secs(1.25));
    }

    #[test]
    fn the_servers_retry_after_is_waited_out_as_sent_however_long_or_short() {
        let (mut p, now) = (Pacing::default(), Instant::now());
        for _ in 0..3 {
            p.failed(now, None, 0.0);
        }
        assert_eq!(p.failed(now, Some(secs(1.0)), 0.0), secs(1.0), "not the grown backoff");
        assert_eq!(p.failed(now, Some(secs(30.0)), 0.0), secs(30.0), "not capped at MAX_RETRY");
    }

    #[test]
    fn the_wait_a_failed_requests_status_asks_for_is_read() {
        let mut status = kube::core::Status::failure("storage is (re)initializing", "TooManyRequests").with_code(429);
        let failed = |s: &kube::core::Status| watcher::Error::WatchStartFailed(kube::Error::Api(s.clone().boxed()));
        assert_eq!(status_wait(&failed(&status)), None, "no details");
        status.details = Some(kube::core::response::StatusDetails {
            name: String::new(),
            group: String::new(),
            kind: String::new(),
            uid: String::new(),
            causes: vec![],
            retry_after_seconds: 3,
        });
        assert_eq!(status_wait(&failed(&status)), Some(secs(3.0)));
        status.details.as_mut().unwrap().retry_after_seconds = 0;
        assert_eq!(status_wait(&failed(&status)), None, "0 asks for nothing: the backoff decides");
        status.details.as_mut().unwrap().retry_after_seconds = 3;
        assert_eq!(status_wait(&watcher::Error::WatchError(status.clone().boxed())), Some(secs(3.0)));
    }

    #[test]
    fn the_backoff_starts_over_only_after_two_healthy_minutes() {
        let (mut p, now) = (Pacing::default(), Instant::now());
        p.failed(now, None, 0.0);
        assert_eq!(p.failed(now + secs(119.0), None, 0.0), secs(2.0), "a flapping watch keeps its backoff");
        assert_eq!(p.failed(now + secs(119.0) + HEALTHY_RESET, None, 0.0), secs(1.0));
    }

    /// What the client returns for a request to a port nothing listens on.
    async fn refused_request() -> kube::Error {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let config = kube::Config::new(format!("https://127.0.0.1:{port}").parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        client.apiserver_version().await.expect_err("nothing listens there")
    }

    #[tokio::test]
    async fn only_a_refused_connection_counts_as_the_server_gone() {
        assert!(server_gone(&watcher::Error::WatchStartFailed(refused_request().await)));
        assert!(server_gone(&watcher::Error::WatchFailed(refused_request().await)));
        let reset = kube::Error::Service(Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionReset)));
        assert!(!server_gone(&watcher::Error::WatchStartFailed(reset)));
        let overloaded =
            kube::Error::Api(kube::core::Status::failure("busy", "TooManyRequests").with_code(429).boxed());
        assert!(!server_gone(&watcher::Error::WatchStartFailed(overloaded)));
        assert!(!server_gone(&watcher::Error::InitialListFailed(refused_request().await)), "already listing afresh");
        assert!(refused(&watcher::Error::InitialListFailed(refused_request().await)), "retried soon all the same");
    }
}
