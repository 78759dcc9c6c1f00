//! The easy path: the candidacy run in a task of its own, and whether this
//! replica leads as a `watch::Receiver<bool>` (kube-lease-manager's shape),
//! beside the gate that says, write by write, whether it may still write.

use std::sync::Arc;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::{Elector, Lost, Watches, WriteGate};

/// A candidacy running in the background ([`Elector::run`]): it acquires
/// the Lease, then renews it until leadership is lost or [`Leadership::stop`]
/// releases it. It stands once: after a loss, `leading` stays `false`, as
/// client-go's `OnStoppedLeading` ends a process that a restart makes a
/// candidate again (a new [`Elector`] stands again). Dropping the handle
/// stops the candidacy as `stop` does, without waiting for the release.
#[derive(Debug)]
#[must_use = "dropping the handle stops the candidacy"]
pub struct Leadership {
    leading: watch::Receiver<bool>,
    gate: Arc<WriteGate>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Option<Lost>>,
}

/// Whatever ends the candidacy's task, a panic too: the gate shut, then
/// `leading` false, in that order.
struct Ended {
    gate: Arc<WriteGate>,
    leading: watch::Sender<bool>,
}

impl Drop for Ended {
    fn drop(&mut self) {
        self.gate.revoke();
        self.leading.send_replace(false);
    }
}

impl<W: Watches> Elector<W> {
    /// Stand for the Lease in a task of its own (on the current tokio
    /// runtime). A release on stop is bounded by the renew deadline: past
    /// it, the Lease is left to expire.
    pub fn run(mut self) -> Leadership {
        let (leading, watching) = watch::channel(false);
        let (stop, mut stopped) = oneshot::channel();
        let gate = self.gate();
        let bound = self.cfg.renew_deadline;
        let task = tokio::spawn(async move {
            let ended = Ended { gate: self.gate(), leading };
            tokio::select! {
                () = self.acquire() => {}
                // A stop, or the handle dropped, before leading; the write
                // under way may have taken the Lease all the same.
                _ = &mut stopped => {
                    released_within(bound, self.release_after_cut_acquire()).await;
                    return None;
                }
            }
            ended.leading.send_replace(true);
            tokio::select! {
                lost = self.hold() => Some(lost),
                _ = &mut stopped => {
                    released_within(bound, self.release()).await;
                    None
                }
            }
        });
        Leadership { leading: watching, gate, stop: Some(stop), task }
    }
}

/// Wait for `release` at most `bound`; the gate is shut already.
async fn released_within(bound: std::time::Duration, release: impl Future<Output = ()>) {
    if tokio::time::timeout(bound, release).await.is_err() {
        tracing::warn!("the Lease was not released within the renew deadline; it will expire");
    }
}

impl Leadership {
    /// Whether this replica leads, now and at each change: `false` until
    /// it takes the Lease, `true` while it holds it, `false` again once it
    /// lost or released it (`wait_for(|l| *l)` waits to lead). Leading is
    /// not permission to write: a write that must not come from a deposed
    /// leader checks [`Leadership::gate`] first.
    pub fn leading(&self) -> watch::Receiver<bool> {
        self.leading.clone()
    }

    /// The write gate the candidacy keeps up to date.
    pub fn gate(&self) -> Arc<WriteGate> {
        self.gate.clone()
    }

    /// End the candidacy: while leading, the gate is shut and the Lease
    /// released, so that a standby takes over at once; while waiting, the
    /// wait ends. Returns why leadership was lost if it was lost before.
    pub async fn stop(mut self) -> Option<Lost> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match (&mut self.task).await {
            Ok(lost) => lost,
            // The task panicked: propagate, as awaiting it inline would.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::test_support::{config, dummy_client};

    #[tokio::test(start_paused = true)]
    async fn a_candidacy_stopped_before_it_leads_ends_at_once_never_having_led() {
        // The API server never answers: the candidate waits to lead.
        let leadership = Elector::new(dummy_client(), config("me")).unwrap().run();
        let (leading, gate) = (leadership.leading(), leadership.gate());
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!*leading.borrow(), "led without the Lease");
        let stopped = tokio::time::timeout(Duration::from_secs(1), leadership.stop()).await;
        assert_eq!(stopped, Ok(None), "the wait did not end at the stop, or reported a loss");
        assert!(!*leading.borrow() && !gate.holds());
    }
}
