//! Publishing a sync's Events off its critical path, as client-go's event
//! broadcaster does: a sync queues its events and returns; a background task
//! sends them through kube-runtime's [`Recorder`] (events.k8s.io/v1, repeats
//! counted into a series). Events are best effort: a full queue drops them
//! with a warning, as client-go does, rather than slowing syncs down.

use std::sync::Mutex;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::warn;

use crate::constants::{ACTION_RECONCILE, CONTROLLER_NAME};
use crate::decision::EventSpec;

/// Events waiting to be sent. client-go's broadcaster queues 1000 and drops
/// the rest; at ten thousand new Foos at once (a restore, the benchmark's
/// scale mode) that lost seven in ten of their Synced events. An entry is a
/// few hundred bytes, and the channel allocates only what is queued.
const QUEUE: usize = 10_000;
/// Events sent at once: one, as client-go's broadcaster does, so that events
/// never crowd out the syncs' own writes at the API server.
const CONCURRENCY: usize = 1;

/// Queues events and sends them in the background.
pub struct Publisher {
    queue: Mutex<Option<mpsc::Sender<(EventSpec, ObjectReference)>>>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Publisher {
    /// Start the background sender. `instance` is the Events'
    /// `reportingInstance` (the leader-election identity).
    pub fn start(client: Client, instance: Option<String>) -> Self {
        let recorder = Recorder::new(client, Reporter { controller: CONTROLLER_NAME.into(), instance });
        let (tx, rx) = mpsc::channel(QUEUE);
        let task = tokio::spawn(
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) })
                .for_each_concurrent(CONCURRENCY, move |(ev, reference)| {
                    let recorder = recorder.clone();
                    async move { send(&recorder, &ev, &reference).await }
                }),
        );
        Publisher { queue: Mutex::new(Some(tx)), task: Mutex::new(Some(task)) }
    }

    /// Queue `ev` about `regarding`; never waits.
    pub fn publish(&self, ev: EventSpec, regarding: ObjectReference) {
        let queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let Some(tx) = queue.as_ref() else { return };
        if let Err(e) = tx.try_send((ev, regarding)) {
            let (ev, _) = e.into_inner();
            warn!(reason = ev.reason, "event queue full or closed; dropping event");
        }
    }

    /// Send what is queued (for at most `grace`), then stop. For a graceful
    /// shutdown; a replica that lost its lease calls [`Publisher::abort`].
    pub async fn flush(&self, grace: Duration) {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).take();
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut task) = task
            && tokio::time::timeout(grace, &mut task).await.is_err()
        {
            warn!(?grace, "events still queued at shutdown were dropped");
            task.abort();
        }
    }

    /// Stop at once, dropping what is queued.
    pub fn abort(&self) {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(task) = self.task.lock().unwrap_or_else(|e| e.into_inner()).take() {
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
        type_: if ev.warning { EventType::Warning } else { EventType::Normal },
        reason: ev.reason.into(),
        note: Some(ev.message.clone()),
        action: ACTION_RECONCILE.into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, regarding).await {
        warn!(object = ?regarding.name, reason = ev.reason, error = %e, "cannot publish event");
    }
}
