//! The first syncs, paced. On a start, a relist or taking the Lease, every
//! Foo is synced once, and nearly all those syncs find nothing to do. Queued
//! all at once (as kube-runtime's `reconcile_all_on` and a list's triggers
//! do) they stand in front of whatever changes meanwhile: at 100 000 Foos an
//! edit made during a start waited up to 1.8 s behind them.
//!
//! So a Foo whose status shows its generation observed waits here, and the
//! backlog lets into the controller's queue only as many as its room at a
//! time; a change (an edit, a Deployment's event, a Foo never synced) goes
//! straight in and overtakes them. The room is small because the queue
//! does not keep order: once every worker is busy, kube-runtime's scheduler
//! holds what is due in a hash set and takes from it in hash order, so a
//! change waits behind a share of what the backlog let in, and of what it
//! lets in while the change waits. The backlog lets Foos in first in first
//! out, as fast as the workers take them, and what it let in queues as an
//! equal of every other trigger: none waits for ever (the aging that
//! controller-runtime's priority queue gives its low-priority items).

use std::collections::{HashSet, VecDeque};
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

/// Which way a Foo's first sync goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lane {
    /// Straight into the controller's queue.
    Now,
    /// Through the backlog, behind what changes meanwhile.
    Later,
}

impl Lane {
    /// How the queue's metrics rank a Foo of this lane.
    fn priority(self) -> Priority {
        match self {
            Lane::Now => Priority::Change,
            Lane::Later => Priority::FirstSync,
        }
    }
}

/// The lane of a Foo's first sync after a start, a relist or taking the
/// Lease: later when its status says its generation was observed (it was in
/// sync when last synced, and most likely still is); now when it was not
/// (a new Foo, one edited since, or one only upstream's controller synced,
/// which writes no observedGeneration).
pub(crate) fn first_sync_lane(foo: &Foo) -> Lane {
    let observed = foo.status.as_ref().and_then(|s| s.observed_generation);
    match (observed, foo.metadata.generation) {
        (Some(observed), Some(generation)) if observed == generation => Lane::Later,
        _ => Lane::Now,
    }
}

/// The Foos whose syncs wait for room, and those that do not.
pub struct Backlog {
    state: Mutex<State>,
    /// Something was pushed, or a worker took a Foo the backlog let in.
    changed: Notify,
    room: usize,
    queue: Arc<QueueMetrics>,
}

#[derive(Default)]
struct State {
    now: VecDeque<ObjectRef<Foo>>,
    later: VecDeque<ObjectRef<Foo>>,
    /// What `later` holds, so that a Foo waits in it once: a start lists
    /// it twice, as a Foo and as the owner of its Deployment.
    waiting: HashSet<ObjectRef<Foo>>,
    /// Let in from `later`, and not yet taken by a worker.
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
        match lane {
            Lane::Now => self.now.push_back(foo),
            Lane::Later if self.waiting.insert(foo.clone()) => self.later.push_back(foo),
            Lane::Later => {}
        }
    }

    fn next(&mut self, room: usize) -> Option<ObjectRef<Foo>> {
        if let Some(foo) = self.now.pop_front() {
            let_go(&mut self.now);
            return Some(foo);
        }
        if self.let_in.len() >= room {
            return None;
        }
        let foo = self.later.pop_front()?;
        self.waiting.remove(&foo);
        self.let_in.insert(queue_key(&foo));
        if let_go(&mut self.later) {
            self.waiting.shrink_to(ROOM_KEPT);
        }
        Some(foo)
    }
}

/// A drained lane gives back what a burst of 100 000 took (a takeover of
/// Foos only upstream synced sends them all now): whether it did.
fn let_go(lane: &mut VecDeque<ObjectRef<Foo>>) -> bool {
    let drained = lane.is_empty() && lane.capacity() > ROOM_KEPT;
    if drained {
        lane.shrink_to(ROOM_KEPT);
    }
    drained
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
    fn a_foo_in_sync_when_last_synced_waits_and_a_new_edited_or_upstream_synced_one_does_not() {
        assert_eq!(first_sync_lane(&in_sync("a")), Lane::Later);
        let mut edited = in_sync("b");
        edited.metadata.generation = Some(3);
        assert_eq!(first_sync_lane(&edited), Lane::Now);
        assert_eq!(first_sync_lane(&Foo::test("new")), Lane::Now, "no status yet");
        let mut upstreams = in_sync("c");
        upstreams.status.as_mut().unwrap().observed_generation = None;
        assert_eq!(first_sync_lane(&upstreams), Lane::Now, "upstream writes no observedGeneration");
    }

    #[test]
    fn a_change_overtakes_the_backlog_which_lets_in_only_its_room() {
        let backlog = backlog(1);
        let waiting: Vec<Foo> = (0..ROOM_PER_WORKER + 3).map(|i| in_sync(&format!("foo-{i}"))).collect();
        backlog.push_lanes(lanes(&waiting));
        backlog.push(by_name(&Foo::test("edited")), Lane::Now);
        let mut stream = Box::pin(backlog.clone().stream());
        let first = ready(&mut stream);
        assert_eq!(first.len(), 1 + ROOM_PER_WORKER, "the change and one room's worth");
        assert_eq!(first[0].name, "edited");
        backlog.push(by_name(&Foo::test("edited-later")), Lane::Now);
        assert_eq!(names(&ready(&mut stream)), ["edited-later"], "a change needs no room");
        backlog.taken("default/foo-0");
        backlog.taken("default/foo-0");
        backlog.taken("default/edited");
        assert_eq!(names(&ready(&mut stream)), [format!("foo-{ROOM_PER_WORKER}")], "one taken, one let in");
    }

    #[test]
    fn a_foo_listed_twice_waits_once() {
        let backlog = backlog(1);
        backlog.push(by_name(&Foo::test("a")), Lane::Later);
        backlog.push(by_name(&Foo::test("a")), Lane::Later);
        backlog.push(by_name(&Foo::test("b")), Lane::Later);
        assert_eq!(names(&ready(&mut Box::pin(backlog.stream()))), ["a", "b"]);
    }

    #[tokio::test]
    async fn the_backlog_drains_while_changes_keep_overtaking_it() {
        let backlog = backlog(2);
        let waiting: Vec<Foo> = (0..1000).map(|i| in_sync(&format!("foo-{i}"))).collect();
        backlog.push_lanes(lanes(&waiting));
        let mut stream = Box::pin(backlog.clone().stream());
        let mut drained = Vec::new();
        for round in 0.. {
            backlog.push(by_name(&Foo::test(&format!("edit-{round}"))), Lane::Now);
            // A worker takes all that is queued, a change among them.
            let queued = ready(&mut stream);
            assert!(queued.len() <= 1 + 2 * ROOM_PER_WORKER, "round {round}: {} queued", queued.len());
            for foo in queued {
                backlog.taken(&queue_key(&foo));
                drained.extend(foo.name.starts_with("foo-").then_some(foo.name));
            }
            if drained.len() == 1000 {
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
    fn a_drained_burst_of_changes_lets_its_table_go() {
        let backlog = backlog(1);
        let upstreams: Vec<Foo> = (0..1000).map(|i| Foo::test(&format!("upstreams-{i}"))).collect();
        backlog.push_lanes(lanes(&upstreams));
        let mut stream = Box::pin(backlog.clone().stream());
        let first: Vec<_> = (0..999).map(|_| stream.next().now_or_never().flatten().unwrap()).collect();
        assert_eq!(first.len(), 999, "changes need no room");
        assert!(backlog.state.lock().now.capacity() >= 1000, "one still waits: the table stays");
        assert_eq!(ready(&mut stream).len(), 1);
        assert!(backlog.state.lock().now.capacity() <= ROOM_KEPT, "{} slots kept", backlog.state.lock().now.capacity());
    }
}
