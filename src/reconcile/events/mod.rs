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
//! How the Events' series are kept in bounded memory: [`series`]; what a
//! full queue drops: [`drops`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, Recorder, Reporter};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use crate::api::constants::{ACTION_RECONCILE, CONTROLLER_NAME};
use crate::observe::queue_metrics::QueueMetrics;
use crate::reconcile::decision::EventSpec;
use kube_lease_fence::{WriteGate, may_write};

use drops::{Drops, report_drops};
use series::{Generations, REMEMBERED, series_key};

mod drops;
mod series;

/// Events waiting to be sent. client-go's broadcaster queues 1000 and drops
/// the rest; at ten thousand new Foos at once (a restore, the benchmark's
/// scale mode) that lost seven in ten of their Synced events. An entry is a
/// few hundred bytes, and the channel allocates only what is queued.
pub(super) const QUEUE: usize = 10_000;
/// How often an idle publisher drops the generations whose window is over.
const EXPIRY_CHECK: Duration = Duration::from_secs(60);
/// One Event per this while syncs are backed up. Sent one after another,
/// about 1 400 Events of 10 000 new Foos went out while the Foos converged
/// (docs/design.md).
const BACKED_UP_PACE: Duration = Duration::from_secs(1);

/// Queues events and sends them in the background.
pub struct Publisher {
    queue: Mutex<Option<mpsc::Sender<(EventSpec, ObjectReference)>>>,
    task: Mutex<Option<JoinHandle<()>>>,
    drops: Arc<Mutex<Drops>>,
}

impl Publisher {
    /// Start the background sender. `instance` is the Events'
    /// `reportingInstance` (the leader-election identity); under leader
    /// election, an event is sent only while `gate` holds; Events yield
    /// to the syncs `syncs` counts ([`QueueMetrics::backed_up`]).
    pub fn start(
        client: Client,
        instance: Option<String>,
        gate: Option<Arc<WriteGate>>,
        syncs: Arc<QueueMetrics>,
    ) -> Self {
        Self::start_remembering(client, instance, gate, syncs, REMEMBERED)
    }

    fn start_remembering(
        client: Client,
        instance: Option<String>,
        gate: Option<Arc<WriteGate>>,
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
                if !may_write(gate.as_deref()) {
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
    pub(crate) fn publish(&self, ev: EventSpec, regarding: ObjectReference) {
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
    use kube::runtime::events::EventType;
    use serde_json::Value;

    pub(super) fn synced() -> EventSpec {
        EventSpec { type_: EventType::Normal, reason: "Synced", message: "Foo synced successfully".into() }
    }

    pub(super) fn foo(name: &str) -> ObjectReference {
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
        let gate = Arc::new(WriteGate::holding_for(Duration::from_secs(3600)));
        let (service, mut api) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let publisher = Publisher::start(Client::new(service, "default"), None, Some(gate.clone()), syncs.clone());
        publisher.publish(synced(), foo("a"));
        publisher.publish(synced(), foo("b"));
        assert_eq!(next_event(&mut api).await.1, "a");
        tokio::time::sleep(BACKED_UP_PACE / 2).await; // "b" is waiting its turn
        gate.doubt();
        let flushed = publisher.flush(Duration::from_secs(5));
        tokio::select! {
            Some((request, _)) = api.next_request() => panic!("sent {} after the fence stopped holding", request.uri()),
            _ = flushed => {}
        }
    }

    #[tokio::test]
    async fn a_replica_past_its_renew_deadline_sends_none_of_its_queued_events() {
        let (service, mut api) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let gate = Arc::new(WriteGate::new()); // never renewed: does not hold
        let publisher = Publisher::start(Client::new(service, "default"), None, Some(gate), Arc::default());
        publisher.publish(synced(), foo("a"));
        let flushed = publisher.flush(Duration::from_secs(5));
        // (The sender's end of the mock closes when the publisher stops.)
        tokio::select! {
            Some((request, _)) = api.next_request() => panic!("sent {}", request.uri()),
            _ = flushed => {}
        }
    }
}
