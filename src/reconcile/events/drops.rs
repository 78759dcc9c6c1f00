//! Events dropped on a full queue, reported as client-go reports them: a
//! warning at once, then the count every [`DROP_REPORT`].

use std::time::{Duration, Instant};

use tracing::warn;

use super::QUEUE;

/// How often events dropped on a full queue are reported, at most.
const DROP_REPORT: Duration = Duration::from_secs(30);

/// Events dropped on a full queue, reported in one line every
/// [`DROP_REPORT`] rather than one line each: a restore of 100 000 Foos
/// dropped 75 000 `Synced` events, and logged each.
#[derive(Default)]
pub(super) struct Drops {
    unreported: u64,
    last_report: Option<Instant>,
}

impl Drops {
    /// One more dropped at `now`: how many to report now, if a report is due.
    pub(super) fn dropped(&mut self, now: Instant) -> Option<u64> {
        self.unreported += 1;
        self.due(now)
    }

    /// How many to report at `now`: those not yet reported, once the last
    /// report is [`DROP_REPORT`] old (the first of a burst at once).
    pub(super) fn due(&mut self, now: Instant) -> Option<u64> {
        let due = self.unreported > 0 && self.last_report.is_none_or(|last| now - last >= DROP_REPORT);
        due.then(|| {
            self.last_report = Some(now);
            std::mem::take(&mut self.unreported)
        })
    }
}

pub(super) fn report_drops(dropped: Option<u64>) {
    if let Some(dropped) = dropped {
        warn!(dropped, queued = QUEUE, "event queue full: events dropped (reported every 30 s at most)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
