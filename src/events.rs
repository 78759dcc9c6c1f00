//! Publishing a sync's Events off its critical path, as client-go's event
//! broadcaster does: a sync queues its events and returns; a background task
//! sends them through kube-runtime's [`Recorder`] (events.k8s.io/v1, repeats
//! counted into a series). Events are best effort: a full queue drops them
//! with a warning, as client-go does, rather than slowing syncs down.
//!
//! A [`Recorder`] remembers every Event it sent for six minutes, to count a
//! repeat into the first one's series, in a table that never shrinks and
//! holds about 1.5 KiB per Event. Ten thousand new Foos at once (a restore)
//! left 30 MiB there for the life of the process. So each Recorder sends at
//! most [`REMEMBERED`] Events and is then replaced: memory stays bounded, as
//! client-go's bounded correlator cache keeps it, and an Event repeated
//! after more than that many others starts a new Event instead of a series
//! (same number of requests; `kubectl describe` lists it twice).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, Recorder, Reporter};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use crate::constants::{ACTION_RECONCILE, CONTROLLER_NAME};
use crate::decision::EventSpec;
use crate::leader::{Fence, may_write};

/// Events waiting to be sent. client-go's broadcaster queues 1000 and drops
/// the rest; at ten thousand new Foos at once (a restore, the benchmark's
/// scale mode) that lost seven in ten of their Synced events. An entry is a
/// few hundred bytes, and the channel allocates only what is queued.
const QUEUE: usize = 10_000;
/// Events a [`Recorder`] sends before a fresh one takes over. Its table then
/// never outgrows 2048 slots (hashbrown keeps a 7/8 load), about 3 MiB.
const REMEMBERED: usize = 1024;

/// Queues events and sends them in the background.
pub struct Publisher {
    queue: Mutex<Option<mpsc::Sender<(EventSpec, ObjectReference)>>>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Publisher {
    /// Start the background sender. `instance` is the Events'
    /// `reportingInstance` (the leader-election identity); under leader
    /// election, an event is sent only while `fence` holds.
    pub fn start(client: Client, instance: Option<String>, fence: Option<Arc<Fence>>) -> Self {
        Self::start_remembering(client, instance, fence, REMEMBERED)
    }

    fn start_remembering(
        client: Client,
        instance: Option<String>,
        fence: Option<Arc<Fence>>,
        remembered: usize,
    ) -> Self {
        let reporter = Reporter { controller: CONTROLLER_NAME.into(), instance };
        let (tx, mut rx) = mpsc::channel::<(EventSpec, ObjectReference)>(QUEUE);
        // One at a time, as client-go's broadcaster sends: events never crowd
        // out the syncs' own writes at the API server.
        let task = tokio::spawn(async move {
            let mut recorder = Recorder::new(client.clone(), reporter.clone());
            let mut sent = 0;
            while let Some((ev, regarding)) = rx.recv().await {
                if !may_write(fence.as_deref()) {
                    // A paused leader's queue: a standby may lead by now.
                    debug!(reason = ev.reason, "not leading any more; event dropped");
                    continue;
                }
                if sent == remembered {
                    recorder = Recorder::new(client.clone(), reporter.clone());
                    sent = 0;
                }
                send(&recorder, &ev, &regarding).await;
                sent += 1;
            }
        });
        Publisher { queue: Mutex::new(Some(tx)), task: Mutex::new(Some(task)) }
    }

    /// Queue `ev` about `regarding`; never waits.
    pub fn publish(&self, ev: EventSpec, regarding: ObjectReference) {
        let queue = self.queue.lock();
        let Some(tx) = queue.as_ref() else { return };
        if let Err(e) = tx.try_send((ev, regarding)) {
            let (ev, _) = e.into_inner();
            warn!(reason = ev.reason, "event queue full or closed; dropping event");
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
    async fn a_repeated_event_joins_its_series_until_the_recorder_is_replaced() {
        let (service, mut api) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let publisher = Publisher::start_remembering(Client::new(service, "default"), None, None, 2);
        for name in ["a", "a", "b", "a"] {
            publisher.publish(synced(), foo(name));
        }
        let mut sent = Vec::new();
        for _ in 0..4 {
            sent.push(next_event(&mut api).await);
        }
        let sent: Vec<_> = sent.iter().map(|(method, name)| (method.as_str(), name.as_str())).collect();
        // The second "a" is counted into the first one's series (a patch); the
        // third comes after two events, from a fresh Recorder: a new Event.
        assert_eq!(sent, [("POST", "a"), ("PATCH", "a"), ("POST", "b"), ("POST", "a")]);
    }

    #[tokio::test]
    async fn a_replica_past_its_renew_deadline_sends_none_of_its_queued_events() {
        let (service, mut api) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let fence = Arc::new(Fence::new()); // never renewed: does not hold
        let publisher = Publisher::start(Client::new(service, "default"), None, Some(fence));
        publisher.publish(synced(), foo("a"));
        let flushed = publisher.flush(Duration::from_secs(5));
        // (The sender's end of the mock closes when the publisher stops.)
        tokio::select! {
            Some((request, _)) = api.next_request() => panic!("sent {}", request.uri()),
            _ = flushed => {}
        }
    }
}
