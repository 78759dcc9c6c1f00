//! The Foos' store, our own: what a sync reads of each Foo in fixed fields
//! ([`super::deployments`] says why), and beside it the few Foos the
//! `Controller` has work for.
//!
//! kube-runtime's `Controller` reads the object of each sync it runs from a
//! reflector store, which keeps every object whole (a 360-byte `ObjectMeta`
//! and a key of four strings: 920 bytes per Foo at 10 000, as
//! `benches/cache_memory.rs` counted it in build 3706ab2). Here that store,
//! the working set, holds only the Foos with a sync to come, under way or
//! to retry: whatever wakes a sync puts its Foo there
//! ([`FooStore::schedule`]) before the `Controller` hears of it, and a sync
//! that ends with nothing left to do takes it out ([`FooStore::done`])
//! unless something woke it again meanwhile. At rest the working set is
//! empty, and every Foo is one entry here.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::watcher;
use parking_lot::{Mutex, RwLock};

use super::token::Token;
use super::{Behind, Keep, key_from_ref, key_of, object_ref, split_key};
use crate::api::foo::{Foo, FooSpec, FooStatus, status_caught_up};

/// The Foos the watch delivered, kept small, and the Foos with work to do.
pub struct FooStore {
    state: RwLock<State>,
    /// Filled by a relist until it is complete, then swapped in whole.
    relist: Mutex<Option<State>>,
    working: Working,
}

#[derive(Default)]
struct State {
    /// By `namespace/name`. Boxed: a slot is the size of what it holds,
    /// and a map's slots are a third to half empty after it grows.
    by_name: HashMap<Arc<str>, Box<Kept>>,
}

/// What a sync reads of one Foo.
struct Kept {
    uid: Option<Token>,
    version: Option<Token>,
    generation: Option<i64>,
    created: Option<Time>,
    deleting: Option<Time>,
    /// The labels its shard keeps (none when it keeps none).
    labels: Option<BTreeMap<String, String>>,
    deployment_name: Box<str>,
    replicas: Option<i32>,
    status: Option<Box<FooStatus>>,
}

/// The Foos with a sync to come, under way, or to retry, in the
/// kube-runtime store the `Controller` reads them from.
struct Working {
    store: Store<Foo>,
    writing: Mutex<Writing>,
}

struct Writing {
    writer: Writer<Foo>,
    /// The Foo watch's first list is complete: the working set says it is
    /// ready, and the `Controller` starts syncing, as it would on a
    /// reflector store of every Foo.
    ready: bool,
    /// The most Foos held since the store's map was last built: a hash map
    /// keeps the room it grew to, so once a burst has drained, it is built
    /// again.
    peak: usize,
}

/// Below this many Foos held at once, the room a burst left is not worth
/// building the map again for.
const REBUILT_FROM: usize = 1024;

impl Default for FooStore {
    fn default() -> Self {
        let (store, writer) = reflector::store();
        let writing = Mutex::new(Writing { writer, ready: false, peak: 0 });
        FooStore { state: RwLock::default(), relist: Mutex::default(), working: Working { store, writing } }
    }
}

impl Keep<Foo> for FooStore {
    fn apply(&self, event: &watcher::Event<Foo>) {
        match event {
            watcher::Event::Apply(foo) => self.state.write().insert(foo),
            watcher::Event::Delete(foo) => {
                self.state.write().by_name.remove(key_of(foo).as_str());
                self.working.remove(&ObjectRef::from_obj(foo), None);
            }
            watcher::Event::Init => *self.relist.lock() = Some(State::default()),
            watcher::Event::InitApply(foo) => self.relist.lock().get_or_insert_default().insert(foo),
            watcher::Event::InitDone => {
                if let Some(listed) = self.relist.lock().take() {
                    // Work on Foos deleted while the watch was down goes, as
                    // a watch's deletion takes it.
                    self.working.remove_where(|held| !listed.by_name.contains_key(key_of(held).as_str()));
                    *self.state.write() = listed;
                }
                self.working.set_ready();
            }
        }
    }

    fn get(&self, key: &ObjectRef<Foo>) -> Option<Foo> {
        self.state.read().view(&key_from_ref(key))
    }

    fn filter_map<T>(&self, mut f: impl FnMut(Foo) -> Option<T>) -> Vec<T> {
        let state = self.state.read();
        state.by_name.iter().filter_map(|(key, kept)| f(kept.view(key))).collect()
    }

    fn count(&self) -> usize {
        self.state.read().by_name.len()
    }
}

impl FooStore {
    /// The store the `Controller` reads the Foos it syncs from.
    pub(super) fn working_set(&self) -> Store<Foo> {
        self.working.store.clone()
    }

    /// Put the Foo `key` names in the working set, for a sync the caller
    /// is about to wake: a newer copy than any there, so a sync under way
    /// with an older one leaves it for the next ([`FooStore::done`]). One a
    /// relist under way holds is as the relist has it.
    pub(super) fn schedule(&self, key: &ObjectRef<Foo>) {
        let key = key_from_ref(key);
        let listed = self.relist.lock().as_ref().and_then(|relist| relist.view(&key));
        let Some(foo) = listed.or_else(|| self.state.read().view(&key)) else { return };
        self.working.insert(foo);
    }

    /// A sync of `foo` (the copy the working set gave it) ended with nothing
    /// left to do: out of the working set, unless a newer copy is there
    /// (something woke it again since it started).
    pub(super) fn done(&self, foo: &Arc<Foo>) {
        self.working.remove(&ObjectRef::from_obj(&**foo), Some(foo));
    }

    pub(super) fn contains(&self, key: &ObjectRef<Foo>) -> bool {
        self.state.read().by_name.contains_key(key_from_ref(key).as_str())
    }

    /// The Foos whose status has not caught up with their generation, read
    /// in place: none is rebuilt, as at a start every Foo is behind, and
    /// rebuilding each at once for every count made the start's peak (a
    /// kilobyte and a half a Foo: 150 MiB at 100 000).
    pub(super) fn behind(&self) -> Vec<Behind> {
        let state = self.state.read();
        let behind = state.by_name.iter().filter(|(_, kept)| !kept.caught_up());
        behind.map(|(key, kept)| Behind { key: key.clone(), never_synced_since: kept.never_synced_since() }).collect()
    }

    /// The Foos in `namespace` whose spec names the Deployment `name`.
    pub(super) fn naming(&self, namespace: &str, name: &str) -> Vec<ObjectRef<Foo>> {
        let state = self.state.read();
        let naming = state
            .by_name
            .iter()
            .filter(|(key, kept)| &*kept.deployment_name == name && split_key(key).0 == Some(namespace));
        naming.map(|(key, _)| object_ref(key)).collect()
    }
}

impl Working {
    fn insert(&self, foo: Foo) {
        let mut writing = self.writing.lock();
        writing.writer.apply_watcher_event(&watcher::Event::Apply(foo));
        writing.peak = writing.peak.max(self.store.len());
    }

    /// Take out the Foo `key` names (only if it is `copy`, when given).
    fn remove(&self, key: &ObjectRef<Foo>, copy: Option<&Arc<Foo>>) {
        let mut writing = self.writing.lock();
        let Some(held) = self.store.get(key) else { return };
        if copy.is_none_or(|copy| Arc::ptr_eq(copy, &held)) {
            writing.writer.apply_watcher_event(&watcher::Event::Delete((*held).clone()));
            self.shrink(&mut writing);
        }
    }

    /// Take out the Foos held that match `gone` (a scan: after relists).
    fn remove_where(&self, gone: impl Fn(&Foo) -> bool) {
        let mut writing = self.writing.lock();
        for held in self.store.state_filter(|held| gone(held)) {
            writing.writer.apply_watcher_event(&watcher::Event::Delete((*held).clone()));
        }
        self.shrink(&mut writing);
    }

    /// Once a burst has drained, build the map again, empty. Only empty: a
    /// rebuild copies what it holds into new `Arc`s, and a sync under way
    /// would no longer find its copy there to take out ([`FooStore::done`]).
    fn shrink(&self, writing: &mut Writing) {
        if writing.ready && writing.peak >= REBUILT_FROM && self.store.is_empty() {
            self.rebuild(writing);
        }
    }

    /// Once: say the working set is ready, keeping what it holds (a Foo
    /// listed for a sync before the list was complete).
    fn set_ready(&self) {
        let mut writing = self.writing.lock();
        if !writing.ready {
            self.rebuild(&mut writing);
            writing.ready = true;
        }
    }

    /// Build the map again with what it holds: a list of it, as a relist
    /// replaces a reflector store's map (it is ready after the first).
    fn rebuild(&self, writing: &mut Writing) {
        let held = self.store.state();
        writing.writer.apply_watcher_event(&watcher::Event::Init);
        for foo in &held {
            writing.writer.apply_watcher_event(&watcher::Event::InitApply((**foo).clone()));
        }
        writing.writer.apply_watcher_event(&watcher::Event::InitDone);
        writing.peak = held.len();
    }
}

impl State {
    fn view(&self, key: &str) -> Option<Foo> {
        self.by_name.get_key_value(key).map(|(key, kept)| kept.view(key))
    }

    fn insert(&mut self, foo: &Foo) {
        let meta = &foo.metadata;
        let kept = Kept {
            uid: meta.uid.as_deref().map(Token::new),
            version: meta.resource_version.as_deref().map(Token::new),
            generation: meta.generation,
            created: meta.creation_timestamp.clone(),
            deleting: meta.deletion_timestamp.clone(),
            labels: meta.labels.clone(),
            deployment_name: foo.spec.deployment_name.as_str().into(),
            replicas: foo.spec.replicas,
            status: foo.status.clone().map(Box::new),
        };
        self.by_name.insert(key_of(foo).into(), Box::new(kept));
    }
}

impl Kept {
    fn caught_up(&self) -> bool {
        let observed = self.status.as_ref().and_then(|s| s.observed_generation);
        status_caught_up(self.generation, observed, self.deleting.is_some())
    }

    /// When it was created, if no sync ever wrote its status.
    fn never_synced_since(&self) -> Option<Time> {
        let never = self.status.as_ref().and_then(|s| s.observed_generation).is_none();
        self.created.clone().filter(|_| never)
    }

    /// The Foo the trim left, rebuilt.
    fn view(&self, key: &str) -> Foo {
        let (namespace, name) = split_key(key);
        let metadata = ObjectMeta {
            name: Some(name.to_owned()),
            namespace: namespace.map(str::to_owned),
            uid: self.uid.as_ref().map(Token::to_string),
            resource_version: self.version.as_ref().map(Token::to_string),
            generation: self.generation,
            creation_timestamp: self.created.clone(),
            deletion_timestamp: self.deleting.clone(),
            labels: self.labels.clone(),
            ..ObjectMeta::default()
        };
        let spec = FooSpec { deployment_name: self.deployment_name.to_string(), replicas: self.replicas };
        Foo { metadata, spec, status: self.status.as_deref().cloned() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FooStatus;
    use crate::api::shard::Shard;
    use crate::cache::trim_foo;
    use crate::testing::FooFixture;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use k8s_openapi::jiff::Timestamp;
    use watcher::Event::*;

    fn trimmed(mut foo: Foo) -> Foo {
        trim_foo(&Shard::parse("shard in (a,b)").unwrap())(&mut foo);
        foo
    }

    fn applied(events: impl IntoIterator<Item = watcher::Event<Foo>>) -> FooStore {
        let store = FooStore::default();
        events.into_iter().for_each(|e| store.apply(&e));
        store
    }

    fn working(store: &FooStore) -> Vec<String> {
        let mut names: Vec<_> = store.working_set().state().iter().map(|f| f.metadata.name.clone().unwrap()).collect();
        names.sort();
        names
    }

    #[test]
    fn a_sync_reads_back_the_foo_the_trim_left() {
        let mut synced = Foo::test("synced").label("shard", "a").generation(3);
        synced.metadata.creation_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        synced.status = Some(FooStatus {
            available_replicas: 2,
            observed_generation: Some(3),
            conditions: vec![Condition {
                type_: "Ready".into(),
                status: "True".into(),
                reason: "Synced".into(),
                message: "Foo synced successfully".into(),
                last_transition_time: Time(Timestamp::UNIX_EPOCH),
                observed_generation: Some(3),
            }],
        });
        let mut going = Foo::test("going");
        going.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        going.metadata.resource_version = Some("0x2a".into());
        let mut bare = Foo::test("bare");
        (bare.metadata.uid, bare.metadata.resource_version, bare.spec.replicas) = (None, None, None);
        for foo in [synced, going, bare] {
            let foo = trimmed(foo);
            let store = applied([Apply(foo.clone())]);
            assert_eq!(store.get(&ObjectRef::from_obj(&foo)), Some(foo));
        }
    }

    #[test]
    fn a_sync_leaves_the_working_set_unless_woken_again_meanwhile() {
        let (a, b) = (trimmed(Foo::test("a")), trimmed(Foo::test("b")));
        let store = applied([Apply(a.clone()), Apply(b.clone())]);
        assert!(working(&store).is_empty(), "at rest, nothing in it");
        store.schedule(&ObjectRef::from_obj(&a));
        store.schedule(&ObjectRef::from_obj(&b));
        let key = ObjectRef::from_obj(&a);
        let given = store.working_set().get(&key).unwrap();
        store.done(&given);
        store.schedule(&ObjectRef::from_obj(&b));
        let stale = store.working_set().get(&ObjectRef::from_obj(&b)).unwrap();
        store.schedule(&ObjectRef::from_obj(&b));
        store.done(&stale);
        assert_eq!(working(&store), ["b"], "woken again while its sync ran: stays for the next");
        store.done(&store.working_set().get(&ObjectRef::from_obj(&b)).unwrap());
        assert!(working(&store).is_empty());
    }

    #[test]
    fn a_foo_woken_during_the_first_list_waits_in_the_working_set_until_the_list_is_complete() {
        use futures::FutureExt;
        let a = trimmed(Foo::test("a"));
        let store = applied([Init, InitApply(a.clone())]);
        store.schedule(&ObjectRef::from_obj(&a));
        let ready = || store.working_set().wait_until_ready().now_or_never().is_some();
        assert!(!ready(), "the Controller waits for the first list, as on a reflector store");
        store.apply(&InitDone);
        assert!(ready());
        assert_eq!(working(&store), ["a"], "found in the list under way, kept when it completed");
    }

    #[test]
    fn once_a_burst_has_drained_the_working_set_is_built_again_and_syncs_under_way_still_leave_it() {
        let foos: Vec<Foo> = (0..2000).map(|i| trimmed(Foo::test(&format!("foo-{i}")))).collect();
        let listed = foos.iter().cloned().map(InitApply);
        let store = applied(std::iter::once(Init).chain(listed).chain([InitDone]));
        foos.iter().for_each(|foo| store.schedule(&ObjectRef::from_obj(foo)));
        assert_eq!(store.working.writing.lock().peak, 2000);
        let copy = |foo: &Foo| store.working_set().get(&ObjectRef::from_obj(foo)).unwrap();
        // The last one's sync is under way with its copy while the rest end.
        let under_way = copy(&foos[1999]);
        foos[..1999].iter().for_each(|foo| store.done(&copy(foo)));
        assert_eq!(store.working.writing.lock().peak, 2000, "one left: not rebuilt");
        store.done(&under_way);
        assert!(store.working_set().is_empty(), "the sync under way took its Foo out");
        assert_eq!(store.working.writing.lock().peak, 0, "drained: built again");
    }

    #[test]
    fn work_on_a_deleted_foo_is_dropped_by_its_deletion_or_a_relist() {
        let (a, b, c) = (trimmed(Foo::test("a")), trimmed(Foo::test("b")), trimmed(Foo::test("c")));
        let store = applied([Apply(a.clone()), Apply(b.clone()), Apply(c.clone())]);
        for foo in [&a, &b, &c] {
            store.schedule(&ObjectRef::from_obj(foo));
        }
        store.apply(&Delete(a));
        assert_eq!(working(&store), ["b", "c"]);
        // A relist that no longer holds b: deleted while the watch was down.
        for e in [Init, InitApply(c.clone()), InitDone] {
            store.apply(&e);
        }
        assert_eq!(working(&store), ["c"]);
        assert!(store.get(&ObjectRef::from_obj(&b)).is_none());
    }

    #[test]
    fn behind_finds_the_foos_whose_status_is_behind_their_generation_and_no_others_not_one_being_deleted() {
        let status = |observed| Some(FooStatus { observed_generation: observed, ..FooStatus::default() });
        let mut synced = trimmed(Foo::test("synced").generation(2));
        synced.status = status(Some(2));
        let mut edited = trimmed(Foo::test("edited").generation(3));
        edited.status = status(Some(2));
        let never = trimmed(Foo::test("never").generation(1));
        let mut going = never.clone();
        (going.metadata.name, going.metadata.deletion_timestamp) =
            (Some("going".into()), Some(Time(Timestamp::UNIX_EPOCH)));
        let store = applied([Apply(synced), Apply(edited.clone()), Apply(never.clone()), Apply(going)]);
        let mut behind = store.behind();
        behind.sort_by_key(|b| b.key.clone());
        let key = |foo: &Foo| Arc::<str>::from(key_of(foo).as_str());
        assert_eq!(
            behind,
            [
                Behind { key: key(&edited), never_synced_since: None },
                Behind { key: key(&never), never_synced_since: never.metadata.creation_timestamp.clone() }
            ]
        );
    }

    #[test]
    fn naming_finds_the_foos_of_a_deployment_name_in_its_namespace_only() {
        let a = trimmed(Foo::test("a").deployment("shared"));
        let b = trimmed(Foo::test("b").deployment("shared"));
        let mut elsewhere = trimmed(Foo::test("c").deployment("shared"));
        elsewhere.metadata.namespace = Some("other".into());
        let other_name = trimmed(Foo::test("d").deployment("own"));
        let store = applied([Apply(a.clone()), Apply(b), Apply(elsewhere), Apply(other_name)]);
        let mut names: Vec<_> =
            store.naming(a.metadata.namespace.as_deref().unwrap(), "shared").into_iter().map(|k| k.name).collect();
        names.sort();
        assert_eq!(names, ["a", "b"]);
    }
}
