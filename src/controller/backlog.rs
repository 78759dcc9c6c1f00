//! Every sync a trigger asks for, paced and shared fairly between
//! namespaces, before it reaches kube-runtime's queue.
//!
//! On a start or taking the Lease, every Foo is synced once (on a relist,
//! those it finds changed and the owners of the Deployments it lists), and
//! nearly all those syncs find nothing to do. Queued all at once (as
//! kube-runtime's `reconcile_all_on` and a list's triggers do) they stand in
//! front of whatever changes meanwhile: at 100 000 Foos an edit made during
//! a start waited up to 1.8 s behind them, and each waited as a whole Foo in
//! the store the syncs read ([`crate::cache::foos`]). A tenant's burst of
//! new Foos did the same to every other namespace's changes.
//!
//! So every sync waits here first, and the backlog lets into the
//! controller's queue only as many as its room at a time, by lane: a change
//! a watch reports ([`Lane::Now`]: an edit, a new Foo, a Deployment's
//! event), then listed Foos that need a sync ([`Lane::Soon`]: never synced,
//! edited since, or found changed by a relist), then those whose status
//! shows their generation observed ([`Lane::Later`]) — upstream's order,
//! changes before resyncs. Within a lane the namespaces take turns, one Foo
//! each, and each namespace's Foos go first in first out: a Foo created in
//! a quiet namespace waits for one Foo of each busy one, not for their
//! thousands. The room is small because the queue does not keep order: once
//! every worker is busy, kube-runtime's scheduler holds what is due in a
//! hash set and takes from it in hash order, so a Foo let in waits behind
//! at most a room's worth. Only a list or taking the Lease fills the lower
//! lanes, so a Foo in sync waits at most for what they found and for the
//! changes meanwhile (the aging that controller-runtime's priority queue
//! gives its low-priority items). A Foo waits as two short strings shared
//! by its entries, not as the whole Foo.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use futures::Stream;
use kube::runtime::reflector::ObjectRef;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::api::foo::Foo;
use crate::cache::{FooCache, by_name};
use crate::observe::queue_metrics::{Key, Priority, QueueMetrics, queue_key};

/// Foos the backlog lets in at a time, per worker, beside those the workers
/// run: one waiting for each, so that no worker waits for the next (room is
/// made the moment a worker takes a Foo), and no more, so that a Foo let in
/// is taken within one round of the workers whatever order the queue takes
/// them in. Two each made a quiet namespace's new Foo wait up to 2.6 s
/// through another's burst of 10 000, as the API server slowed every sync.
pub(crate) const ROOM_PER_WORKER: usize = 1;

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
    /// The lanes, first served first.
    const IN_TURN: [Lane; 3] = [Lane::Now, Lane::Soon, Lane::Later];

    /// Its place in [`Lane::IN_TURN`]: the lower, the sooner.
    fn rank(self) -> usize {
        self as usize
    }

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
    /// What waits, by namespace.
    spaces: HashMap<Arc<str>, Space>,
    /// For each lane (by [`Lane::rank`]), the namespaces with a Foo in it,
    /// in the order of their turns.
    turns: [VecDeque<Arc<str>>; 3],
    /// Let in, and not yet taken by a worker.
    let_in: HashSet<Key>,
}

/// The Foos of one namespace that wait.
#[derive(Default)]
struct Space {
    /// The lane each waiting Foo is let in from, so that it waits once: a
    /// start lists a Foo twice, as a Foo and as the owner of its
    /// Deployment. A Foo moved up to a sooner lane stays in the later one
    /// too, and is passed over there.
    waiting: HashMap<Arc<str>, Lane>,
    /// For each lane, its Foos' names, first in first out.
    lanes: [VecDeque<Arc<str>>; 3],
}

impl Space {
    /// The next Foo waiting in `lane`, passing over those that moved up.
    fn pop(&mut self, lane: Lane) -> Option<Arc<str>> {
        while let Some(name) = self.lanes[lane.rank()].pop_front() {
            if self.waiting.get(&name) == Some(&lane) {
                self.waiting.remove(&name);
                return Some(name);
            }
        }
        None
    }

    fn is_empty(&self) -> bool {
        self.waiting.is_empty() && self.lanes.iter().all(VecDeque::is_empty)
    }
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
        let namespace = foo.namespace.as_deref().unwrap_or_default();
        let namespace = match self.spaces.get_key_value(namespace) {
            Some((known, _)) => known.clone(),
            None => Arc::from(namespace),
        };
        let space = self.spaces.entry(namespace.clone()).or_default();
        let name = match space.waiting.get_key_value(foo.name.as_str()) {
            Some((_, waits)) if waits.rank() <= lane.rank() => return,
            Some((known, _)) => known.clone(),
            None => Arc::from(foo.name.as_str()),
        };
        space.waiting.insert(name.clone(), lane);
        let queue = &mut space.lanes[lane.rank()];
        if queue.is_empty() {
            self.turns[lane.rank()].push_back(namespace);
        }
        queue.push_back(name);
    }

    fn next(&mut self, room: usize) -> Option<ObjectRef<Foo>> {
        if self.let_in.len() >= room {
            return None;
        }
        let foo = Lane::IN_TURN.into_iter().find_map(|lane| self.pop(lane));
        self.let_go();
        let foo = foo?;
        self.let_in.insert(queue_key(&foo));
        Some(foo)
    }

    /// The next Foo waiting in `lane`: the first of the namespace whose
    /// turn it is, which then goes to the back of the line if it has more.
    fn pop(&mut self, lane: Lane) -> Option<ObjectRef<Foo>> {
        let turns = &mut self.turns[lane.rank()];
        while let Some(namespace) = turns.pop_front() {
            let Some(space) = self.spaces.get_mut(&namespace) else { continue };
            let name = space.pop(lane);
            if !space.lanes[lane.rank()].is_empty() {
                turns.push_back(namespace.clone());
            } else if space.is_empty() {
                self.spaces.remove(&namespace);
            }
            if let Some(name) = name {
                return Some(ObjectRef::new(&name).within(&namespace));
            }
        }
        None
    }

    /// The tables a drained burst of 100 000 grew (a start's list), given
    /// back: a namespace's with it, once nothing of it waits; the lines of
    /// turns and the table of namespaces once empty.
    fn let_go(&mut self) {
        for turns in &mut self.turns {
            if turns.is_empty() && turns.capacity() > ROOM_KEPT {
                turns.shrink_to(ROOM_KEPT);
            }
        }
        if self.spaces.is_empty() && self.spaces.capacity() > ROOM_KEPT {
            self.spaces.shrink_to(ROOM_KEPT);
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

    /// `name` in `namespace`, as a trigger names it.
    fn foo_in(namespace: &str, name: &str) -> ObjectRef<Foo> {
        ObjectRef::new(name).within(namespace)
    }

    /// Nothing waits, and the tables a burst grew are given back.
    fn assert_let_go(backlog: &Backlog) {
        let state = backlog.state.lock();
        assert!(state.spaces.is_empty(), "{} namespaces still wait", state.spaces.len());
        assert!(state.spaces.capacity() <= ROOM_KEPT, "{} slots kept", state.spaces.capacity());
        let kept: Vec<usize> = state.turns.iter().map(VecDeque::capacity).collect();
        assert!(kept.iter().all(|&slots| slots <= ROOM_KEPT), "{kept:?} slots kept");
    }

    /// Take every Foo `backlog` lets in, as a worker would, until it lets
    /// in no more: their names, in order.
    fn drain(backlog: &Arc<Backlog>) -> Vec<String> {
        let mut stream = Box::pin(backlog.clone().stream());
        std::iter::from_fn(|| stream.next().now_or_never().flatten())
            .map(|foo| {
                backlog.taken(&queue_key(&foo));
                format!("{}/{}", foo.namespace.unwrap_or_default(), foo.name)
            })
            .collect()
    }

    #[test]
    fn a_foo_created_in_a_quiet_namespace_waits_for_one_of_a_busy_namespaces_not_its_thousands() {
        // Room for two.
        let backlog = backlog(2 / ROOM_PER_WORKER as u16);
        (0..10_000).for_each(|i| backlog.push(foo_in("busy", &format!("foo-{i}")), Lane::Now));
        let mut stream = Box::pin(backlog.clone().stream());
        let first = ready(&mut stream);
        assert_eq!(names(&first), ["foo-0", "foo-1"], "one room's worth");
        backlog.push(foo_in("quiet", "new"), Lane::Now);
        backlog.taken("busy/foo-0");
        assert_eq!(names(&ready(&mut stream)), ["foo-2"], "the busy namespace's turn was next");
        backlog.taken("busy/foo-1");
        assert_eq!(ready(&mut stream), [foo_in("quiet", "new")], "then the quiet one's");
    }

    #[test]
    fn namespaces_take_turns_within_each_lane_and_a_change_still_comes_before_any_listed_foo() {
        let backlog = backlog(100);
        for (ns, n) in [("a", 3), ("b", 1), ("c", 2)] {
            (0..n).for_each(|i| backlog.push(foo_in(ns, &format!("listed-{i}")), Lane::Later));
        }
        (0..2).for_each(|i| backlog.push(foo_in("c", &format!("new-{i}")), Lane::Soon));
        (0..3).for_each(|i| backlog.push(foo_in("a", &format!("edited-{i}")), Lane::Now));
        backlog.push(foo_in("b", "edited-0"), Lane::Now);
        assert_eq!(
            drain(&backlog),
            [
                "a/edited-0",
                "b/edited-0",
                "a/edited-1",
                "a/edited-2", // the changes, in turns
                "c/new-0",
                "c/new-1", // then what a list found needing a sync
                "a/listed-0",
                "b/listed-0",
                "c/listed-0",
                "a/listed-1",
                "c/listed-1",
                "a/listed-2",
            ]
        );
        assert_let_go(&backlog);
    }

    #[test]
    fn a_listed_foo_edited_while_it_waits_is_let_in_once_as_a_change() {
        let backlog = backlog(100);
        backlog.push(foo_in("a", "x"), Lane::Later);
        backlog.push(foo_in("a", "y"), Lane::Later);
        backlog.push(foo_in("b", "x"), Lane::Soon);
        backlog.push(foo_in("a", "y"), Lane::Now);
        backlog.push(foo_in("a", "y"), Lane::Soon);
        backlog.push(foo_in("b", "x"), Lane::Later);
        assert_eq!(drain(&backlog), ["a/y", "b/x", "a/x"]);
        assert_let_go(&backlog);
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
    fn a_foo_that_needs_a_sync_overtakes_those_in_sync_and_all_wait_for_room() {
        // Room for two.
        let backlog = backlog(2 / ROOM_PER_WORKER as u16);
        let waiting: Vec<Foo> = (0..5).map(|i| in_sync(&format!("foo-{i}"))).collect();
        backlog.push_lanes(lanes(&waiting));
        backlog.push(by_name(&Foo::test("edited")), Lane::Soon);
        let mut stream = Box::pin(backlog.clone().stream());
        let first = ready(&mut stream);
        assert_eq!(first.len(), 2, "one room's worth: {:?}", names(&first));
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
        assert_let_go(&backlog);
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
        assert_let_go(&backlog);
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
            assert_let_go(&backlog);
        }
    }
}
