//! The first syncs, paced. On a start or taking the Lease, every Foo is
//! synced once (on a relist, those it finds changed and the owners of the
//! Deployments it lists), and nearly all those syncs find nothing to do. Queued
//! all at once (as kube-runtime's `reconcile_all_on` and a list's triggers
//! do) they stand in front of whatever changes meanwhile: at 100 000 Foos an
//! edit made during a start waited up to 1.8 s behind them. And each waits
//! as a whole Foo in the store the syncs read ([`crate::cache::foos`]): at
//! 100 000 never-synced Foos the peak of a start was 343.5 MiB, 267.2 once
//! they were paced (docs/api-cost.md).
//!
//! So every sync a list (or taking the Lease) asks for waits here, and the
//! backlog lets into the controller's queue only as many as its room at a
//! time: first those that need a sync ([`Lane::Soon`]: never synced, edited
//! since, or found changed by a relist), then those whose status shows
//! their generation observed ([`Lane::Later`]). A change seen by a watch
//! (an edit, a Deployment's event) goes straight in ([`Lane::Now`]) and
//! overtakes them all. The room is small because the queue does not keep
//! order: once every worker is busy, kube-runtime's scheduler holds what is
//! due in a hash set and takes from it in hash order, so a change waits
//! behind a share of what the backlog let in, and of what it lets in while
//! the change waits. The backlog lets Foos in first in first out per lane,
//! soon before later, as fast as the workers take them, and what it let in
//! queues as an equal of every other trigger. Only a list or taking the
//! Lease fills the soon lane, so a Foo in sync waits at most for what they
//! found, never for ever (the aging that controller-runtime's priority
//! queue gives its low-priority items).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use futures::Stream;
use kube::runtime::reflector::ObjectRef;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::api::foo::Foo;
use crate::cache::{FooCache, by_name};
use crate::observe::queue_metrics::{Key, Priority, QueueMetrics, queue_key};

/// Foos the backlog lets in at a time, per worker: one waiting for each
/// worker besides the one it runs, so that no worker waits for the next
/// (room is made the moment a worker takes a Foo), and few enough that a
/// change among them is taken soon whatever order the queue takes them in.
pub(crate) const ROOM_PER_WORKER: usize = 2;

/// Entries a drained backlog keeps room for; a larger table is let go.
const ROOM_KEPT: usize = 64;

/// Which way a sync goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lane {
    /// Straight into the controller's queue: a change a watch reports.
    Now,
    /// Through the backlog, ahead of [`Lane::Later`]: a listed Foo that
    /// needs a sync.
    Soon,
    /// Through the backlog, behind everything else: a listed Foo most
    /// likely in sync.
    Later,
}

impl Lane {
    /// How the queue's metrics rank a Foo of this lane: what needs a sync
    /// as a change, what most likely does not as a first sync.
    fn priority(self) -> Priority {
        match self {
            Lane::Now | Lane::Soon => Priority::Change,
            Lane::Later => Priority::FirstSync,
        }
    }
}

/// The lane of a Foo's first sync after a start, a relist or taking the
/// Lease: later when its status says its generation was observed (it was in
/// sync when last synced, and most likely still is); soon when it was not
/// (a new Foo, one edited since, or one only upstream's controller synced,
/// which writes no observedGeneration).
pub(crate) fn first_sync_lane(foo: &Foo) -> Lane {
    let observed = foo.status.as_ref().and_then(|s| s.observed_generation);
    match (observed, foo.metadata.generation) {
        (Some(observed), Some(generation)) if observed == generation => Lane::Later,
        _ => Lane::Soon,
    }
}

/// The Foos whose syncs wait for room.
pub struct Backlog {
    state: Mutex<State>,
    /// Something was pushed, or a worker took a Foo the backlog let in.
    changed: Notify,
    room: usize,
    queue: Arc<QueueMetrics>,
}

#[derive(Default)]
struct State {
    soon: VecDeque<ObjectRef<Foo>>,
    later: VecDeque<ObjectRef<Foo>>,
    /// The lane each waiting Foo is let in from, so that it waits once: a
    /// start lists a Foo twice, as a Foo and as the owner of its
    /// Deployment. A Foo moved up from `later` to `soon` stays in `later`
    /// too, and is passed over there.
    waiting: HashMap<ObjectRef<Foo>, Lane>,
    /// Let in, and not yet taken by a worker.
    let_in: HashSet<Key>,
}

impl Backlog {
    /// A backlog that lets in `workers` × [`ROOM_PER_WORKER`] Foos at a
    /// time. What it is pushed counts as the workqueue's adds.
    pub(crate) fn new(workers: u16, queue: Arc<QueueMetrics>) -> Self {
        let room = usize::from(workers.max(1)) * ROOM_PER_WORKER;
        Backlog { state: Mutex::default(), changed: Notify::new(), room, queue }
    }

    /// Sync `foo`, by `lane`.
    pub(crate) fn push(&self, foo: ObjectRef<Foo>, lane: Lane) {
        self.queue.added_as(queue_key(&foo), lane.priority());
        self.state.lock().push(foo, lane);
        self.changed.notify_one();
    }

    /// Sync every cached Foo (taking the Lease), each by its
    /// [`first_sync_lane`]; the Foos are read one at a time, none kept.
    pub(crate) fn push_all(&self, foos: &FooCache) {
        self.push_lanes(foos.extract(|foo| Some((by_name(foo), first_sync_lane(foo)))));
    }

    fn push_lanes(&self, pushed: Vec<(ObjectRef<Foo>, Lane)>) {
        pushed.iter().for_each(|(foo, lane)| self.queue.added_as(queue_key(foo), lane.priority()));
        let mut state = self.state.lock();
        pushed.into_iter().for_each(|(foo, lane)| state.push(foo, lane));
        drop(state);
        self.changed.notify_one();
    }

    /// A worker took `key` (or found it deleted): if the backlog let it in,
    /// that frees room for the next. Any sync of that Foo does, even one
    /// another trigger started before the backlog's reached the queue: then
    /// one more waits there for a moment, no harm done.
    pub(crate) fn taken(&self, key: &str) {
        if self.state.lock().let_in.remove(key) {
            self.changed.notify_one();
        }
    }

    /// The Foos to sync, as the backlog lets them in; for the controller's
    /// `reconcile_on`. Never ends.
    pub(crate) fn stream(self: Arc<Self>) -> impl Stream<Item = ObjectRef<Foo>> + Send + 'static {
        futures::stream::unfold(self, |backlog| async move {
            loop {
                // `Notify` keeps a wake-up given while nobody waited, so
                // one given between this check and the wait is not lost.
                if let Some(foo) = backlog.next() {
                    return Some((foo, backlog));
                }
                backlog.changed.notified().await;
            }
        })
    }

    fn next(&self) -> Option<ObjectRef<Foo>> {
        self.state.lock().next(self.room)
    }
}

impl State {
    fn push(&mut self, foo: ObjectRef<Foo>, lane: Lane) {
        // A change goes to the controller, not here; pushed here, it is
        // paced as one that needs a sync.
        let lane = if lane == Lane::Later { Lane::Later } else { Lane::Soon };
        match self.waiting.get(&foo) {
            None => {}
            Some(Lane::Later) if lane == Lane::Soon => {}
            Some(_) => return,
        }
        self.waiting.insert(foo.clone(), lane);
        match lane {
            Lane::Later => self.later.push_back(foo),
            _ => self.soon.push_back(foo),
        }
    }

    fn next(&mut self, room: usize) -> Option<ObjectRef<Foo>> {
        if self.let_in.len() >= room {
            return None;
        }
        let foo = self.pop();
        self.let_go();
        let foo = foo?;
        self.let_in.insert(queue_key(&foo));
        Some(foo)
    }

    /// The next Foo waiting, soon before later, passing over the entries
    /// of those that moved up.
    fn pop(&mut self) -> Option<ObjectRef<Foo>> {
        loop {
            let (foo, lane) = match self.soon.pop_front() {
                Some(foo) => (foo, Lane::Soon),
                None => (self.later.pop_front()?, Lane::Later),
            };
            if self.waiting.get(&foo) == Some(&lane) {
                self.waiting.remove(&foo);
                return Some(foo);
            }
        }
    }

    /// The tables a drained burst of 100 000 grew (a start's list), given
    /// back: a queue once empty, the table of what waits once nothing does.
    fn let_go(&mut self) {
        for lane in [&mut self.soon, &mut self.later] {
            if lane.is_empty() && lane.capacity() > ROOM_KEPT {
                lane.shrink_to(ROOM_KEPT);
            }
        }
        if self.waiting.is_empty() && self.waiting.capacity() > 2 * ROOM_KEPT {
            self.waiting.shrink_to(ROOM_KEPT);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FooFixture;
    use futures::{FutureExt, StreamExt};

    fn in_sync(name: &str) -> Foo {
        let mut foo = Foo::test(name).generation(2);
        foo.status = Some(crate::api::foo::FooStatus { observed_generation: Some(2), ..Default::default() });
        foo
    }

    /// What taking the Lease pushes for `foos`.
    fn lanes(foos: &[Foo]) -> Vec<(ObjectRef<Foo>, Lane)> {
        foos.iter().map(|foo| (by_name(foo), first_sync_lane(foo))).collect()
    }

    fn names(foos: &[ObjectRef<Foo>]) -> Vec<&str> {
        foos.iter().map(|f| f.name.as_str()).collect()
    }

    /// What the stream gives now, without waiting.
    fn ready(stream: &mut (impl Stream<Item = ObjectRef<Foo>> + Unpin)) -> Vec<ObjectRef<Foo>> {
        std::iter::from_fn(|| stream.next().now_or_never().flatten()).collect()
    }

    fn backlog(workers: u16) -> Arc<Backlog> {
        Arc::new(Backlog::new(workers, Arc::new(QueueMetrics::default())))
    }

    #[test]
    fn a_foo_in_sync_when_last_synced_waits_later_and_a_new_edited_or_upstream_synced_one_soon() {
        assert_eq!(first_sync_lane(&in_sync("a")), Lane::Later);
        let mut edited = in_sync("b");
        edited.metadata.generation = Some(3);
        assert_eq!(first_sync_lane(&edited), Lane::Soon);
        assert_eq!(first_sync_lane(&Foo::test("new")), Lane::Soon, "no status yet");
        let mut upstreams = in_sync("c");
        upstreams.status.as_mut().unwrap().observed_generation = None;
        assert_eq!(first_sync_lane(&upstreams), Lane::Soon, "upstream writes no observedGeneration");
    }

    #[test]
    fn a_foo_that_needs_a_sync_overtakes_those_in_sync_and_both_wait_for_room() {
        let backlog = backlog(1);
        let waiting: Vec<Foo> = (0..ROOM_PER_WORKER + 3).map(|i| in_sync(&format!("foo-{i}"))).collect();
        backlog.push_lanes(lanes(&waiting));
        backlog.push(by_name(&Foo::test("edited")), Lane::Soon);
        let mut stream = Box::pin(backlog.clone().stream());
        let first = ready(&mut stream);
        assert_eq!(first.len(), ROOM_PER_WORKER, "one room's worth: {:?}", names(&first));
        assert_eq!(first[0].name, "edited");
        backlog.push(by_name(&Foo::test("edited-later")), Lane::Soon);
        assert_eq!(ready(&mut stream), [], "no room");
        backlog.taken("default/foo-0");
        assert_eq!(names(&ready(&mut stream)), ["edited-later"], "one taken, the next needing a sync let in");
        backlog.taken("default/edited");
        assert_eq!(names(&ready(&mut stream)), ["foo-1"]);
    }

    #[test]
    fn a_foo_listed_twice_waits_once_and_moves_up_if_it_needs_a_sync() {
        let backlog = backlog(4);
        backlog.push(by_name(&Foo::test("a")), Lane::Later);
        backlog.push(by_name(&Foo::test("a")), Lane::Later);
        backlog.push(by_name(&Foo::test("b")), Lane::Later);
        backlog.push(by_name(&Foo::test("c")), Lane::Later);
        backlog.push(by_name(&Foo::test("c")), Lane::Soon);
        backlog.push(by_name(&Foo::test("b")), Lane::Soon);
        backlog.push(by_name(&Foo::test("b")), Lane::Later);
        assert_eq!(names(&ready(&mut Box::pin(backlog.stream()))), ["c", "b", "a"]);
    }

    #[tokio::test]
    async fn the_backlog_drains_while_foos_that_need_a_sync_keep_overtaking_it() {
        let backlog = backlog(2);
        let waiting: Vec<Foo> = (0..1000).map(|i| in_sync(&format!("foo-{i}"))).collect();
        backlog.push_lanes(lanes(&waiting));
        let mut stream = Box::pin(backlog.clone().stream());
        let (mut drained, mut edits) = (Vec::new(), 0);
        for round in 0.. {
            backlog.push(by_name(&Foo::test(&format!("edit-{round}"))), Lane::Soon);
            // A worker takes all that is queued, a Foo that needs a sync among them.
            let queued = ready(&mut stream);
            assert!(queued.len() <= 2 * ROOM_PER_WORKER, "round {round}: {} queued", queued.len());
            for foo in queued {
                backlog.taken(&queue_key(&foo));
                edits += usize::from(foo.name.starts_with("edit-"));
                drained.extend(foo.name.starts_with("foo-").then_some(foo.name));
            }
            if drained.len() == 1000 {
                assert_eq!(edits, round + 1, "each let in first");
                break;
            }
            assert!(round < 1000, "the backlog stalled at {}", drained.len());
        }
        let in_order: Vec<String> = (0..1000).map(|i| format!("foo-{i}")).collect();
        assert_eq!(drained, in_order, "first in, first out");
        assert!(backlog.state.lock().later.capacity() <= ROOM_KEPT, "a drained backlog lets its table go");
        assert!(backlog.state.lock().waiting.capacity() <= 2 * ROOM_KEPT, "and the table of what waits");
    }

    #[test]
    fn a_list_of_never_synced_foos_is_let_in_a_room_at_a_time_and_its_table_let_go() {
        let backlog = backlog(1);
        let new: Vec<Foo> = (0..1000).map(|i| Foo::test(&format!("new-{i}"))).collect();
        backlog.push_lanes(lanes(&new));
        let mut stream = Box::pin(backlog.clone().stream());
        let mut let_in = Vec::new();
        while let_in.len() < 1000 {
            let queued = ready(&mut stream);
            assert!(!queued.is_empty() && queued.len() <= ROOM_PER_WORKER, "{} let in", queued.len());
            queued.iter().for_each(|foo| backlog.taken(&queue_key(foo)));
            let_in.extend(queued.into_iter().map(|foo| foo.name));
        }
        let in_order: Vec<String> = (0..1000).map(|i| format!("new-{i}")).collect();
        assert_eq!(let_in, in_order);
        let state = backlog.state.lock();
        assert!(state.soon.capacity() <= ROOM_KEPT, "{} slots kept", state.soon.capacity());
        assert!(state.waiting.capacity() <= 2 * ROOM_KEPT, "{} slots kept", state.waiting.capacity());
    }

    #[test]
    fn a_drained_burst_lets_every_table_go_whatever_lanes_it_came_in() {
        // Many that need a sync and one in sync: the first lane drains
        // while something still waits in the other.
        let mixed = backlog(1);
        let mut foos: Vec<Foo> = (0..1000).map(|i| Foo::test(&format!("new-{i}"))).collect();
        foos.push(in_sync("synced"));
        mixed.push_lanes(lanes(&foos));
        // In sync at first, then all found needing a sync: each later
        // entry is passed over, the last ones too.
        let moved = backlog(1);
        let listed: Vec<Foo> = (0..1000).map(|i| in_sync(&format!("foo-{i}"))).collect();
        moved.push_lanes(lanes(&listed));
        listed.iter().for_each(|foo| moved.push(by_name(foo), Lane::Soon));
        for backlog in [mixed, moved] {
            let mut stream = Box::pin(backlog.clone().stream());
            let mut let_in = 0;
            while let Some(foo) = stream.next().now_or_never().flatten() {
                backlog.taken(&queue_key(&foo));
                let_in += 1;
            }
            assert!(let_in >= 1000, "{let_in} let in");
            let state = backlog.state.lock();
            assert!(state.waiting.is_empty(), "{} still wait", state.waiting.len());
            assert!(state.waiting.capacity() <= 2 * ROOM_KEPT, "{} slots kept", state.waiting.capacity());
            let kept = (state.soon.capacity(), state.later.capacity());
            assert!(kept.0 <= ROOM_KEPT && kept.1 <= ROOM_KEPT, "{kept:?} slots kept");
        }
    }
}
