//! Publishing a sync's Events off its critical path, as client-go's event
//! broadcaster does: a sync queues its events and returns; a background task
//! sends them through kube-runtime's [`Recorder`] (events.k8s.io/v1, repeats
//! counted into a series). Events are best effort: a full queue drops them
//! with a warning, as client-go does, rather than slowing syncs down.
//! Beyond client-go, Events yield to syncs: while every worker is busy and
//! another Foo is due ([`QueueMetrics::backed_up`]), one Event goes out per
//! [`BACKED_UP_PACE`], so a burst of syncs (a restore) shares the API server
//! with only one Event a second; the rest follow once it is through.
//!
//! A [`Recorder`] remembers every Event it sent for six minutes, to count a
//! repeat into the first one's series, in a table that never shrinks and
//! holds about 1.4 KiB per slot. Ten thousand new Foos at once (a restore)
//! left 30 MiB there for the life of the process. So Events are spread over
//! generations of Recorders ([`Generations`]): a new series goes to the
//! newest, which takes [`REMEMBERED`] of them before a fresh one takes over;
//! a repeat goes to the Recorder that holds its series. A generation is
//! dropped, with its table, once its newest Event is six minutes old (its
//! series are over: a repeat would start a new Event anyway; checked at each
//! Event, and every minute while none comes), and when [`GENERATIONS`] are
//! alive and another is needed, the one whose newest Event is oldest goes,
//! so memory stays bounded, as client-go's bounded correlator cache keeps
//! it. A series is cut short only when its generation went quietest while
//! more than `REMEMBERED * (GENERATIONS - 1)` other series started.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use crate::api::constants::{ACTION_RECONCILE, CONTROLLER_NAME};
use crate::observe::workqueue::QueueMetrics;
use crate::reconcile::decision::EventSpec;
use kube_lease_fence::{WriteGate, may_write};

/// Events waiting to be sent. client-go's broadcaster queues 1000 and drops
/// the rest; at ten thousand new Foos at once (a restore, the benchmark's
/// scale mode) that lost seven in ten of their Synced events. An entry is a
/// few hundred bytes, and the channel allocates only what is queued.
const QUEUE: usize = 10_000;
/// New series a [`Recorder`] starts before a fresh one takes them: one
/// under 7/8 of 256, hashbrown's load limit (an insert, a repeat's too,
/// makes room for one more before it looks), so its table normally stays at
/// 256 slots (about 1.4 KiB each, and an Event's strings). 1024 took a
/// table of 2048 slots, and at 10 000 new Foos the four tables held
/// 11.5 MiB, a quarter of the heap.
const REMEMBERED: usize = 223;
/// Recorders alive at once, at most: about 2 MiB at the very worst.
const GENERATIONS: usize = 4;
/// How long kube-runtime's Recorder counts a repeat into a series.
const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);
/// How often an idle publisher drops the generations whose window is over.
const EXPIRY_CHECK: Duration = Duration::from_secs(60);
/// One Event per this while syncs are backed up. Sent one after another,
/// about 1 400 Events of 10 000 new Foos went out while the Foos converged
/// (docs/design.md).
const BACKED_UP_PACE: Duration = Duration::from_secs(1);
/// How often events dropped on a full queue are reported, at most.
const DROP_REPORT: Duration = Duration::from_secs(30);

/// Queues events and sends them in the background.
pub struct Publisher {
    queue: Mutex<Option<mpsc::Sender<(EventSpec, ObjectReference)>>>,
    task: Mutex<Option<JoinHandle<()>>>,
    drops: Arc<Mutex<Drops>>,
}

impl Publisher {
    /// Start the background sender. `instance` is the Events'
    /// `reportingInstance` (the leader-election identity); under leader
    /// election, an event is sent only while `fence` holds; Events yield
    /// to the syncs `syncs` counts ([`QueueMetrics::backed_up`]).
    pub fn start(
        client: Client,
        instance: Option<String>,
        fence: Option<Arc<WriteGate>>,
        syncs: Arc<QueueMetrics>,
    ) -> Self {
        Self::start_remembering(client, instance, fence, syncs, REMEMBERED)
    }

    fn start_remembering(
        client: Client,
        instance: Option<String>,
        fence: Option<Arc<WriteGate>>,
        syncs: Arc<QueueMetrics>,
        remembered: usize,
    ) -> Self {
        let reporter = Reporter { controller: CONTROLLER_NAME.into(), instance };
        let (tx, mut rx) = mpsc::channel::<(EventSpec, ObjectReference)>(QUEUE);
        let drops = Arc::new(Mutex::new(Drops::default()));
        let task_drops = drops.clone();
        // One at a time, as client-go's broadcaster sends, and one a second
        // while syncs are backed up: Events must not crowd out the writes
        // they describe.
        let task = tokio::spawn(async move {
            let mut recorders = Generations::new(remembered);
            let mut last_sent = None;
            loop {
                // A quiet queue still lets finished generations go.
                let next = tokio::time::timeout(EXPIRY_CHECK, rx.recv()).await;
                // The rest of a burst's drops, once the queue has room again.
                report_drops(task_drops.lock().due(Instant::now()));
                let Ok(next) = next else {
                    recorders.expire(Instant::now());
                    continue;
                };
                let Some((ev, regarding)) = next else { break };
                if let Some(last) = last_sent
                    && syncs.backed_up()
                {
                    tokio::time::sleep_until(last + BACKED_UP_PACE).await;
                }
                if !may_write(fence.as_deref()) {
                    // A paused leader's queue: a standby may lead by now.
                    debug!(reason = ev.reason, "not leading any more; event dropped");
                    continue;
                }
                let new = || Recorder::new(client.clone(), reporter.clone());
                let recorder = recorders.for_series(series_key(&ev, &regarding), Instant::now(), new);
                send(recorder, &ev, &regarding).await;
                last_sent = Some(tokio::time::Instant::now());
            }
        });
        Publisher { queue: Mutex::new(Some(tx)), task: Mutex::new(Some(task)), drops }
    }

    /// Queue `ev` about `regarding`; never waits.
    pub fn publish(&self, ev: EventSpec, regarding: ObjectReference) {
        let queue = self.queue.lock();
        let Some(tx) = queue.as_ref() else { return };
        match tx.try_send((ev, regarding)) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => report_drops(self.drops.lock().dropped(Instant::now())),
            Err(mpsc::error::TrySendError::Closed((ev, _))) => {
                debug!(reason = ev.reason, "shutting down; event dropped")
            }
        }
    }

    /// Send what is queued (for at most `grace`), then stop. For a graceful
    /// shutdown; a replica that lost its lease drops its publisher instead,
    /// which sends nothing more.
    pub async fn flush(&self, grace: Duration) {
        self.queue.lock().take();
        let task = self.task.lock().take();
        if let Some(mut task) = task
            && tokio::time::timeout(grace, &mut task).await.is_err()
        {
            warn!(?grace, "events still queued at shutdown were dropped");
            task.abort();
        }
    }

    /// Stop at once, dropping what is queued.
    fn abort(&self) {
        self.queue.lock().take();
        if let Some(task) = self.task.lock().take() {
            task.abort();
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.abort();
    }
}

/// Events dropped on a full queue, reported in one line every
/// [`DROP_REPORT`] rather than one line each: a restore of 100 000 Foos
/// dropped 75 000 `Synced` events, and logged each.
#[derive(Default)]
struct Drops {
    unreported: u64,
    last_report: Option<Instant>,
}

impl Drops {
    /// One more dropped at `now`: how many to report now, if a report is due.
    fn dropped(&mut self, now: Instant) -> Option<u64> {
        self.unreported += 1;
        self.due(now)
    }

    /// How many to report at `now`: those not yet reported, once the last
    /// report is [`DROP_REPORT`] old (the first of a burst at once).
    fn due(&mut self, now: Instant) -> Option<u64> {
        let due = self.unreported > 0 && self.last_report.is_none_or(|last| now - last >= DROP_REPORT);
        due.then(|| {
            self.last_report = Some(now);
            std::mem::take(&mut self.unreported)
        })
    }
}

fn report_drops(dropped: Option<u64>) {
    if let Some(dropped) = dropped {
        warn!(dropped, queued = QUEUE, "event queue full: events dropped (reported every 30 s at most)");
    }
}

/// Which series an Event belongs to: what kube-runtime's Recorder keys a
/// series on that varies here (the reporter and the action are fixed).
fn series_key(ev: &EventSpec, regarding: &ObjectReference) -> u64 {
    let mut h = DefaultHasher::new();
    (ev.type_ == EventType::Warning, ev.reason).hash(&mut h);
    let r = regarding;
    (&r.api_version, &r.kind, &r.namespace, &r.name, &r.uid, &r.field_path).hash(&mut h);
    h.finish()
}

/// One Recorder and what it has done.
struct Generation<R> {
    id: u64,
    recorder: R,
    /// New series it started.
    started: usize,
    /// When it sent its newest Event.
    newest: Instant,
}

/// Recorders `R` by generation, and which one holds each live series.
struct Generations<R> {
    /// Oldest first.
    alive: VecDeque<Generation<R>>,
    /// Series key -> (generation id, last event).
    series: HashMap<u64, (u64, Instant)>,
    /// `series`' size after its last sweep; the next one is at twice that.
    swept: usize,
    next_id: u64,
    remembered: usize,
}

impl<R> Generations<R> {
    fn new(remembered: usize) -> Self {
        Generations { alive: VecDeque::new(), series: HashMap::new(), swept: 0, next_id: 0, remembered }
    }

    /// The recorder for an event of series `key` at `now`: the one holding
    /// the series, else the newest (made with `new` when full or none).
    fn for_series(&mut self, key: u64, now: Instant, new: impl FnOnce() -> R) -> &R {
        self.expire(now);
        let holder = self.series.get(&key).map(|&(id, _)| id).filter(|id| self.alive.iter().any(|g| g.id == *id));
        let id = match holder {
            Some(id) => id,
            None => {
                if self.alive.back().is_none_or(|g| g.started >= self.remembered) {
                    if self.alive.len() == GENERATIONS {
                        // The one whose series went quiet longest goes.
                        let quietest = (0..self.alive.len()).min_by_key(|&i| self.alive[i].newest).expect("full");
                        self.alive.remove(quietest);
                    }
                    self.alive.push_back(Generation { id: self.next_id, recorder: new(), started: 0, newest: now });
                    self.next_id += 1;
                }
                let newest = self.alive.back_mut().expect("just made");
                newest.started += 1;
                newest.id
            }
        };
        self.series.insert(key, (id, now));
        let generation = self.alive.iter_mut().find(|g| g.id == id).expect("alive");
        generation.newest = now;
        &generation.recorder
    }

    /// Drop the generations whose series are all over, and now and then
    /// the series of dropped generations.
    fn expire(&mut self, now: Instant) {
        let over = |at: Instant| now.saturating_duration_since(at) >= SERIES_WINDOW;
        self.alive.retain(|g| !over(g.newest));
        if self.series.len() >= 2 * self.swept.max(self.remembered) {
            let alive: Vec<u64> = self.alive.iter().map(|g| g.id).collect();
            self.series.retain(|_, (id, at)| !over(*at) && alive.contains(id));
            self.series.shrink_to_fit();
            self.swept = self.series.len();
        }
    }
}

async fn send(recorder: &Recorder, ev: &EventSpec, regarding: &ObjectReference) {
    let event = Event {
        type_: ev.type_,
        reason: ev.reason.into(),
        note: Some(ev.message.clone()),
        action: ACTION_RECONCILE.into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, regarding).await {
        warn!(object = ?regarding.name, reason = ev.reason, error = %e, "cannot publish event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Method, Request, Response};
    use kube::client::Body;
    use serde_json::Value;

    #[test]
    fn dropped_events_are_reported_at_once_then_counted_every_thirty_seconds() {
        let t0 = Instant::now();
        let mut drops = Drops::default();
        assert_eq!(drops.due(t0), None, "none dropped");
        assert_eq!(drops.dropped(t0), Some(1), "the first of a burst at once");
        let later = (1..=99).map(|s| drops.dropped(t0 + Duration::from_millis(s * 100)));
        assert!(later.flatten().next().is_none(), "the rest within 30 s are counted, not logged");
        assert_eq!(drops.due(t0 + DROP_REPORT - Duration::from_millis(1)), None);
        assert_eq!(drops.due(t0 + DROP_REPORT), Some(99));
        assert_eq!(drops.due(t0 + DROP_REPORT * 3), None, "all reported");
        assert_eq!(drops.dropped(t0 + DROP_REPORT * 3), Some(1), "a new burst, a report at once");
    }

    fn synced() -> EventSpec {
        EventSpec { type_: EventType::Normal, reason: "Synced", message: "Foo synced successfully".into() }
    }

    fn foo(name: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("samplecontroller.k8s.io/v1alpha1".into()),
            kind: Some("Foo".into()),
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        }
    }

    /// The next request's method and the Foo its Event is about; answered
    /// with the Event it carried, as the API server would.
    async fn next_event(handle: &mut tower_test::mock::Handle<Request<Body>, Response<Body>>) -> (Method, String) {
        let (request, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
            .await
            .expect("no event was sent")
            .expect("publisher gone");
        let method = request.method().clone();
        let bytes = request.into_body().collect_bytes().await.unwrap();
        let event: Value = serde_json::from_slice(&bytes).unwrap();
        let regarding = event["regarding"]["name"].as_str().unwrap_or_default().to_owned();
        send.send_response(Response::builder().status(200).body(Body::from(bytes.to_vec())).unwrap());
        (method, regarding)
    }

    #[tokio::test]
    async fn a_repeated_event_joins_its_series_after_its_recorder_was_followed_by_another() {
        let (service, mut api) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let syncs = Arc::new(QueueMetrics::default());
        let publisher = Publisher::start_remembering(Client::new(service, "default"), None, None, syncs, 2);
        for name in ["a", "a", "b", "c", "a"] {
            publisher.publish(synced(), foo(name));
        }
        let mut sent = Vec::new();
        for _ in 0..5 {
            sent.push(next_event(&mut api).await);
        }
        let sent: Vec<_> = sent.iter().map(|(method, name)| (method.as_str(), name.as_str())).collect();
        // "c" is the third series: a fresh Recorder starts it. The last "a"
        // still goes to the first Recorder, which counts it into its series.
        assert_eq!(sent, [("POST", "a"), ("PATCH", "a"), ("POST", "b"), ("POST", "c"), ("PATCH", "a")]);
    }

    /// Syncs with one worker and a Foo due: backed up once that worker is busy.
    fn one_worker_and_a_foo_due() -> Arc<QueueMetrics> {
        let syncs = Arc::new(QueueMetrics::default());
        syncs.set_workers(1);
        syncs.added("default/waiting".into());
        syncs
    }

    #[tokio::test(start_paused = true)]
    async fn events_go_out_one_a_second_while_syncs_are_backed_up_and_at_once_after() {
        let syncs = one_worker_and_a_foo_due();
        let busy = syncs.started("default/busy");
        let (service, mut api) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let publisher = Publisher::start(Client::new(service, "default"), None, None, syncs.clone());
        for name in ["a", "b", "c"] {
            publisher.publish(synced(), foo(name));
        }
        let start = tokio::time::Instant::now();
        assert_eq!(next_event(&mut api).await.1, "a");
        assert_eq!(start.elapsed(), Duration::ZERO, "the first Event has nothing to wait for");
        assert_eq!(next_event(&mut api).await.1, "b");
        let second = tokio::time::Instant::now();
        assert_eq!(second - start, BACKED_UP_PACE, "the next one waited its turn");
        drop(busy); // the worker is free: the waiting Foo can start
        assert_eq!(next_event(&mut api).await.1, "c");
        assert_eq!(second.elapsed(), Duration::ZERO, "no sync running, nothing to yield to");
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_waiting_its_turn_is_dropped_if_the_replica_stops_leading_meanwhile() {
        let syncs = one_worker_and_a_foo_due();
        let _busy = syncs.started("default/busy");
        let fence = Arc::new(WriteGate::holding_for(Duration::from_secs(3600)));
        let (service, mut api) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let publisher = Publisher::start(Client::new(service, "default"), None, Some(fence.clone()), syncs.clone());
        publisher.publish(synced(), foo("a"));
        publisher.publish(synced(), foo("b"));
        assert_eq!(next_event(&mut api).await.1, "a");
        tokio::time::sleep(BACKED_UP_PACE / 2).await; // "b" is waiting its turn
        fence.doubt();
        let flushed = publisher.flush(Duration::from_secs(5));
        tokio::select! {
            Some((request, _)) = api.next_request() => panic!("sent {} after the fence stopped holding", request.uri()),
            _ = flushed => {}
        }
    }

    /// Which generation (the order it was made in) `for_series` picks.
    fn pick(g: &mut Generations<u32>, key: u64, at: Instant) -> u32 {
        let next = g.next_id as u32;
        *g.for_series(key, at, || next)
    }

    #[test]
    fn a_new_series_goes_to_the_newest_recorder_until_it_is_full() {
        let (mut g, t) = (Generations::new(2), Instant::now());
        assert_eq!([1, 2, 3, 4, 5].map(|k| pick(&mut g, k, t)), [0, 0, 1, 1, 2]);
        assert_eq!([1, 3, 5].map(|k| pick(&mut g, k, t)), [0, 1, 2], "repeats stay with their series");
    }

    #[test]
    fn a_generation_is_dropped_once_its_newest_event_is_past_the_series_window() {
        let (mut g, t) = (Generations::new(1), Instant::now());
        pick(&mut g, 1, t);
        pick(&mut g, 2, t + Duration::from_secs(60));
        pick(&mut g, 1, t + Duration::from_secs(300)); // keeps generation 0 alive
        assert_eq!(pick(&mut g, 1, t + Duration::from_secs(300) + SERIES_WINDOW - Duration::from_secs(1)), 0);
        let later = t + Duration::from_secs(301) + 2 * SERIES_WINDOW;
        pick(&mut g, 9, later);
        assert_eq!(g.alive.iter().map(|a| a.id).collect::<Vec<_>>(), [2], "both earlier generations are gone");
        assert_eq!(pick(&mut g, 1, later), 3, "a repeat after its window is a new series (generation 2 is full)");
    }

    #[test]
    fn no_more_than_the_bound_of_generations_is_alive_the_quietest_going_first() {
        let (mut g, t) = (Generations::new(1), Instant::now());
        let at = |s: u64| t + Duration::from_secs(s);
        for key in 0..(GENERATIONS as u64) {
            pick(&mut g, key, at(key));
        }
        pick(&mut g, 0, at(10)); // generation 0's series repeats: it stays
        pick(&mut g, 100, at(11)); // a new series needs a fifth generation
        assert_eq!(g.alive.len(), GENERATIONS);
        let ids: Vec<_> = g.alive.iter().map(|a| a.id).collect();
        assert_eq!(ids, [0, 2, 3, 4], "generation 1 was the quietest");
        assert_eq!(pick(&mut g, 0, at(12)), 0, "the repeating series kept its Recorder");
        for key in 200..(200 + GENERATIONS as u64) {
            pick(&mut g, key, at(13));
        }
        assert_eq!(g.alive.len(), GENERATIONS);
        // Series of dropped generations are forgotten, in time.
        for key in 300..(300 + 4 * GENERATIONS as u64) {
            pick(&mut g, key, at(14));
        }
        assert!(g.series.len() <= 2 * GENERATIONS, "{} series remembered", g.series.len());
    }

    /// The forgotten series are swept out when the table has doubled since
    /// the last sweep (at least twice what a Recorder remembers): a sweep
    /// reads every series, so one per event would make each event cost the
    /// whole table (cargo-mutants: nothing noticed a sweep on every event).
    #[test]
    fn series_are_swept_when_the_table_doubles_not_on_every_event() {
        let (mut g, t) = (Generations::new(10), Instant::now());
        for key in 0..20 {
            pick(&mut g, key, t);
        }
        assert_eq!(g.swept, 0, "swept before the table held twice what a Recorder remembers");
        pick(&mut g, 20, t);
        assert_eq!(g.swept, 20, "an event finding 20 series sweeps (none over: all kept)");
        for key in 21..40 {
            pick(&mut g, key, t);
        }
        assert_eq!(g.swept, 20, "swept again before the table doubled");
        pick(&mut g, 40, t);
        assert_eq!(g.swept, 40);
    }

    #[test]
    fn a_series_is_one_kind_of_event_about_one_object() {
        let warning = EventSpec { type_: EventType::Warning, ..synced() };
        let other_reason = EventSpec { reason: "DeletedOldDeployment", ..synced() };
        let key = series_key(&synced(), &foo("a"));
        assert_eq!(key, series_key(&EventSpec { message: "another note".into(), ..synced() }, &foo("a")));
        assert_ne!(key, series_key(&synced(), &foo("b")));
        assert_ne!(key, series_key(&warning, &foo("a")));
        assert_ne!(key, series_key(&other_reason, &foo("a")));
    }

    #[tokio::test]
    async fn a_replica_past_its_renew_deadline_sends_none_of_its_queued_events() {
        let (service, mut api) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let fence = Arc::new(WriteGate::new()); // never renewed: does not hold
        let publisher = Publisher::start(Client::new(service, "default"), None, Some(fence), Arc::default());
        publisher.publish(synced(), foo("a"));
        let flushed = publisher.flush(Duration::from_secs(5));
        // (The sender's end of the mock closes when the publisher stops.)
        tokio::select! {
            Some((request, _)) = api.next_request() => panic!("sent {}", request.uri()),
            _ = flushed => {}
        }
    }
}
