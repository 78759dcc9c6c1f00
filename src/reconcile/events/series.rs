//! Series of Events, spread over generations of kube-runtime Recorders so
//! that the memory they keep stays bounded.
//!
//! A [`Recorder`](kube::runtime::events::Recorder) remembers every Event it sent for six minutes, to count a
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
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::EventType;

use crate::reconcile::decision::EventSpec;

/// New series a [`Recorder`](kube::runtime::events::Recorder) starts before a fresh one takes them: one
/// under 7/8 of 256, hashbrown's load limit (an insert, a repeat's too,
/// makes room for one more before it looks), so its table normally stays at
/// 256 slots (about 1.4 KiB each, and an Event's strings). 1024 took a
/// table of 2048 slots, and at 10 000 new Foos the four tables held
/// 11.5 MiB, a quarter of the heap.
pub(super) const REMEMBERED: usize = 223;

/// Recorders alive at once, at most: about 2 MiB at the very worst.
const GENERATIONS: usize = 4;

/// How long kube-runtime's Recorder counts a repeat into a series.
const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);

/// Which series an Event belongs to: what kube-runtime's Recorder keys a
/// series on that varies here (the reporter and the action are fixed).
pub(super) fn series_key(ev: &EventSpec, regarding: &ObjectReference) -> u64 {
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
pub(super) struct Generations<R> {
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
    pub(super) fn new(remembered: usize) -> Self {
        Generations { alive: VecDeque::new(), series: HashMap::new(), swept: 0, next_id: 0, remembered }
    }

    /// The recorder for an event of series `key` at `now`: the one holding
    /// the series, else the newest (made with `new` when full or none).
    pub(super) fn for_series(&mut self, key: u64, now: Instant, new: impl FnOnce() -> R) -> &R {
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
    pub(super) fn expire(&mut self, now: Instant) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::events::tests::{foo, synced};

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
}
