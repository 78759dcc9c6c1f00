//! The controller's view of the cluster: the Foos and the Deployments it made,
//! kept by watches, so a sync reads memory and never the API server, in
//! stores of our own that keep each object in a few fixed fields
//! ([`FooStore`], [`DeploymentStore`]); the `Controller` reads the Foo of
//! each sync from a working set of the Foos it has work for (in
//! [`FooStore`]).
//!
//! Three things are added to plain stores:
//! - objects are **trimmed** before they are stored ([`trim_deployment`],
//!   [`trim_foo`]) to what a sync reads, whatever else they carry: at ten
//!   thousand Foos the rest (managedFields, annotations) is most of the
//!   memory, and anyone who may edit a Foo or a Deployment writes it
//!   (finalizers, ownerReferences, annotations, other tools' conditions have
//!   no size bound but the API server's object limit), so what is cached is
//!   bounded by the number of objects, not by what users write in them.
//!   Most of it is never even built: the watches decode Foos as
//!   [`crate::api::wire::FooWire`] and Deployments as a [`DeploymentView`], whose
//!   metadata skips what no sync reads and whose pod template is not there;
//! - **our own writes are seen at once** ([`Cache::wrote`]). A watch delivers
//!   our write a few milliseconds after the API server acknowledged it; a sync
//!   that runs in between would otherwise see the old object and repeat the
//!   write (a second create, a second status patch and event). What the API
//!   server returned to our write stands in for the cached object until the
//!   watch has caught up with it ([`own_writes`]). Nothing is written on the
//!   strength of it alone: every write stays a create or conditional on a
//!   resourceVersion. A status write no longer wakes its own Foo (the
//!   controller filters Foo changes on their generation), but the Deployment
//!   it created does, within milliseconds, and that sync needs the Foo as
//!   written;
//! - an **index by controller uid** ([`DeploymentCache::controlled_by`]), so
//!   a sync finds the Deployments its Foo controls without a scan.
//!
//! Readiness is our own flag, set at the first full list, not kube-runtime's
//! `Store::wait_until_ready`: that wakes only the last of several tasks
//! waiting at once (its `DelayedInit` keeps one waker), and the `Controller`
//! itself waits on its store (now the working set), so the adoption pass,
//! waiting too, was never woken and every sync waited for it.

mod deployments;
mod foos;
mod own_writes;
mod token;

use std::fmt::Debug;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::api::deployment::controller_of;
use crate::api::deployment_view::DeploymentView;
use crate::api::foo::{Foo, status_caught_up};
use crate::api::shard::Shard;
pub use deployments::DeploymentStore;
pub use foos::FooStore;
use own_writes::OwnWrites;

/// What the controller knows of the cluster, filled by its watches.
#[derive(Clone)]
pub struct Caches {
    pub foos: Arc<FooCache>,
    /// Only the Deployments labelled as made by this controller.
    pub deployments: Arc<DeploymentCache>,
    /// The shard both caches are narrowed to, whose labels the Deployments
    /// follow from their Foos.
    pub shard: Shard,
}

/// The Foos, in a store of our own beside the few the `Controller` has work
/// for.
pub type FooCache = Cache<Foo, FooStore>;

/// The Deployments, in a store of our own that keeps them small.
pub type DeploymentCache = Cache<DeploymentView, DeploymentStore>;

impl Caches {
    /// Resolves once both caches hold their first full list: `true`; or
    /// `false` once a watch ended before its first list (the controller
    /// stopped).
    pub(crate) async fn synced(&self) -> bool {
        self.foos.synced().await && self.deployments.synced().await
    }
}

/// Where a cache keeps what its watch delivers: each object in a few
/// fixed fields, rebuilt when read.
pub trait Keep<K: Resource<DynamicType = ()>>: Default + Send + Sync + 'static {
    /// Keep what a (trimmed) watch event says.
    fn apply(&self, event: &watcher::Event<K>);
    /// The object kept under `key`, rebuilt.
    fn get(&self, key: &ObjectRef<K>) -> Option<K>;
    /// What `f` makes of each object kept, rebuilt one at a time.
    fn filter_map<T>(&self, f: impl FnMut(K) -> Option<T>) -> Vec<T>;
    /// How many objects are kept.
    fn count(&self) -> usize;
}

/// How a cache trims what it keeps.
type Trim<K> = Arc<dyn Fn(&mut K) + Send + Sync>;

/// A store of `K`, plus our own writes it has not seen yet.
pub struct Cache<K: Resource<DynamicType = ()> + Clone + 'static, S> {
    kept: S,
    /// What is dropped from every object before it is kept.
    trim: Trim<K>,
    written: Mutex<OwnWrites<K>>,
    /// Set once the first full list is stored; any number may wait on it.
    synced: watch::Sender<bool>,
}

impl<K, S> Cache<K, S>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Send + Sync + 'static,
    S: Keep<K>,
{
    /// An empty cache of objects trimmed by `trim`, that [`Cache::reflect`]
    /// fills.
    pub fn new(trim: impl Fn(&mut K) + Send + Sync + 'static) -> Arc<Self> {
        let synced = watch::Sender::new(false);
        let trim: Trim<K> = Arc::new(trim);
        Arc::new(Cache { kept: S::default(), trim, written: Mutex::default(), synced })
    }

    /// Feed `events` (a watcher stream), trimmed, into this cache; the
    /// events are passed on, trimmed, for the controller's triggers.
    pub fn reflect(
        self: &Arc<Self>,
        events: impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
    ) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static {
        let (cache, trim) = (self.clone(), self.trim.clone());
        events.modify(move |obj| trim(obj)).inspect(move |event| {
            if let Ok(event) = event {
                cache.kept.apply(event);
                cache.observe(event);
            }
        })
    }

    /// The object as we know it: the cached one, or what the API server
    /// returned to our last write of it if the cache has not seen that yet.
    /// `None` if it does not exist (or we deleted it).
    pub(crate) fn get(&self, key: &ObjectRef<K>) -> Option<Arc<K>> {
        self.written().resolve(key, self.kept.get(key).map(Arc::new))
    }

    /// The newest version we know of `obj`, a copy the store handed out
    /// earlier: the store's current one (the watch may have delivered our
    /// write since, and cleared our record of it), or our write.
    pub(crate) fn latest(&self, obj: Arc<K>) -> Arc<K> {
        let key = ObjectRef::from_obj(&*obj);
        let cached = self.kept.get(&key).map_or_else(|| obj.clone(), Arc::new);
        self.written().resolve(&key, Some(cached)).unwrap_or(obj)
    }

    /// How many objects the watch has delivered and not deleted.
    pub(crate) fn count(&self) -> usize {
        self.kept.count()
    }

    /// What `f` makes of each object as the watch delivered it (our own
    /// writes it has not delivered yet are not looked at): for a pass over
    /// every object that keeps little of each.
    pub(crate) fn extract<T>(&self, f: impl Fn(&K) -> Option<T>) -> Vec<T> {
        self.kept.filter_map(|obj| f(&obj))
    }

    /// Record what the API server returned to our write (`None`: we deleted
    /// the object `before`). `before` is the version the write was based on
    /// (`None` for a create).
    pub(crate) fn wrote(&self, before: Option<&K>, after: Option<K>) {
        let after = after.map(|mut obj| {
            (self.trim)(&mut obj);
            Arc::new(obj)
        });
        self.written().record(before, after);
    }

    /// Resolves once the first full list has been stored: `true`; `false`
    /// if the cache was dropped first.
    pub(crate) async fn synced(&self) -> bool {
        self.synced.subscribe().wait_for(|synced| *synced).await.is_ok()
    }

    fn observe(&self, event: &watcher::Event<K>) {
        match event {
            watcher::Event::Apply(obj) | watcher::Event::InitApply(obj) | watcher::Event::Delete(obj) => {
                self.written().observe(obj);
            }
            watcher::Event::InitDone => {
                self.synced.send_replace(true);
            }
            watcher::Event::Init => {}
        }
    }

    fn written(&self) -> parking_lot::MutexGuard<'_, OwnWrites<K>> {
        self.written.lock()
    }
}

/// A Foo whose newest generation has no status yet, as the watchdog counts
/// it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Behind {
    /// `namespace/name`: the store's own key, shared.
    pub(crate) key: Arc<str>,
    /// When it was created, if no sync ever wrote its status.
    pub(crate) never_synced_since: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

impl FooCache {
    /// The Foos the `Controller` syncs, read from the working set
    /// ([`FooStore`]).
    pub(crate) fn store(&self) -> Store<Foo> {
        self.kept.working_set()
    }

    /// Put the Foo `key` names where the sync about to be woken will read
    /// it, if it is cached.
    pub(crate) fn schedule(&self, key: &ObjectRef<Foo>) {
        self.kept.schedule(key);
    }

    /// A sync of `foo` (the copy the `Controller` gave it) ended with
    /// nothing left to do.
    pub(crate) fn done(&self, foo: &Arc<Foo>) {
        self.kept.done(foo);
    }

    /// Whether the Foo `key` names is cached, read without rebuilding it.
    pub(crate) fn contains(&self, key: &ObjectRef<Foo>) -> bool {
        self.kept.contains(key)
    }

    /// The Foos whose newest generation has no status written for it yet
    /// ([`status_caught_up`]): those behind in the store, unless our own
    /// status write the watch has not delivered caught one up (one behind
    /// only in our write is not looked for: a status write only catches a
    /// Foo up). Only the Foos with such a write are rebuilt, one at a time.
    pub(crate) fn unsynced(&self) -> Vec<Behind> {
        let written = self.written();
        let mut behind = self.kept.behind();
        if !written.is_empty() {
            behind.retain(|b| {
                let key = object_ref(&b.key);
                if !written.holds(&key) {
                    return true;
                }
                let resolved = written.resolve(&key, self.kept.get(&key).map(Arc::new));
                resolved.is_some_and(|foo| {
                    let observed = foo.status.as_ref().and_then(|s| s.observed_generation);
                    !status_caught_up(foo.metadata.generation, observed, foo.metadata.deletion_timestamp.is_some())
                })
            });
        }
        behind
    }

    /// The Foos in `namespace` that name the Deployment `name`, read without
    /// rebuilding any Foo.
    pub(crate) fn naming(&self, namespace: &str, name: &str) -> Vec<ObjectRef<Foo>> {
        self.kept.naming(namespace, name)
    }
}

impl DeploymentCache {
    /// Cached Deployments whose controller (the ownerReference with
    /// `controller: true`) has `uid`, as [`Cache::get`] sees them: found
    /// through an index, so a sync costs the same with ten or ten thousand
    /// Deployments cached.
    pub(crate) fn controlled_by(&self, uid: &str) -> Vec<Arc<DeploymentView>> {
        let keys = self.kept.controlled_by(uid);
        let controller_uid = |d: &DeploymentView| controller_of(d).map(|o| o.uid.as_str() == uid);
        keys.iter().filter_map(|key| self.get(key)).filter(|d| controller_uid(d) == Some(true)).collect()
    }
}

/// Keep what a sync reads of a Deployment (what [`DeploymentStore`] keeps):
/// identity, resourceVersion, controller, deletion,
/// whether it carries our label, and the labels it follows its Foo's shard
/// by, in a map its shard's Deployments share (the view itself holds only
/// `spec.replicas` and `status.availableReplicas`).
pub fn trim_deployment(shard: &Shard) -> impl Fn(&mut DeploymentView) + Send + Sync + 'static {
    let shard = shard.clone();
    move |d| {
        trim_metadata(d);
        // A sync reads a Deployment's owner by its controller reference only.
        let controller = crate::api::deployment::controller_of(&*d).cloned();
        d.metadata.owner_references = controller.map(|owner| vec![owner]);
        d.managed = d.is_managed();
        // Once: a view trimmed before has its labels in `shard_labels` already.
        if d.shard_labels.is_none() {
            d.shard_labels = Some(shard.follow_shared(d.metadata.labels.as_ref()));
        }
        d.metadata.labels = None;
        // Read of Foos only; the Deployments' store keeps neither.
        d.metadata.generation = None;
        d.metadata.creation_timestamp = None;
    }
}

/// Keep a Foo's spec, identity, the labels its Deployment follows (read
/// back by [`Shard::follow_cached`]) and the status the controller owns:
/// other writers' conditions are theirs to keep (the status write is a
/// server-side apply of ours alone).
pub fn trim_foo(shard: &Shard) -> impl Fn(&mut Foo) + Send + Sync + 'static {
    let shard = shard.clone();
    move |foo| {
        trim_metadata(foo);
        foo.metadata.owner_references = None;
        shard.trim_labels(&mut foo.metadata.labels);
        if let Some(status) = &mut foo.status {
            status.keep_owned_by_controller();
        }
    }
}

/// `obj`'s key by name and namespace only, which is all keys compare on:
/// [`ObjectRef::from_obj`] also copies the uid and resourceVersion, about 80
/// bytes more for each of the tens of thousands of entries a map keeps.
pub(crate) fn by_name<K: Resource<DynamicType = ()>>(obj: &K) -> ObjectRef<K> {
    let meta = obj.meta();
    let key = ObjectRef::new(meta.name.as_deref().unwrap_or_default());
    match &meta.namespace {
        Some(ns) => key.within(ns),
        None => key,
    }
}

/// A store's key for `obj`: `namespace/name` (neither may hold a `/`).
fn key_of<K: Resource>(obj: &K) -> String {
    let meta = obj.meta();
    format!("{}/{}", meta.namespace.as_deref().unwrap_or_default(), meta.name.as_deref().unwrap_or_default())
}

/// [`key_of`] the object `key` names.
fn key_from_ref<K: Resource<DynamicType = ()>>(key: &ObjectRef<K>) -> String {
    format!("{}/{}", key.namespace.as_deref().unwrap_or_default(), key.name)
}

/// The namespace and name of a [`key_of`].
fn split_key(key: &str) -> (Option<&str>, &str) {
    match key.split_once('/') {
        Some((namespace, name)) if !namespace.is_empty() => (Some(namespace), name),
        Some((_, name)) => (None, name),
        None => (None, key),
    }
}

/// The object a [`key_of`] names.
fn object_ref<K: Resource<DynamicType = ()>>(key: &str) -> ObjectRef<K> {
    match split_key(key) {
        (Some(namespace), name) => ObjectRef::new(name).within(namespace),
        (None, name) => ObjectRef::new(name),
    }
}

/// What no sync reads of any object.
fn trim_metadata<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    // kubectl's last-applied-configuration is a copy of the whole object.
    meta.annotations = None;
    meta.finalizers = None;
    meta.generate_name = None;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{DeploymentFixture, FooFixture};
    use futures::StreamExt;
    use k8s_openapi::api::apps::v1::Deployment;
    use kube::ResourceExt;
    use std::collections::BTreeMap;

    #[tokio::test]
    async fn latest_prefers_what_the_watch_delivered_since_over_a_stale_copy() {
        // A sync was handed the Foo before our status write; by the time it
        // runs, the watch has delivered our write and an edit after it.
        let before = Foo::test("f");
        let mut ours = before.clone();
        ours.metadata.resource_version = Some("101".into());
        ours.status = Some(crate::FooStatus { available_replicas: 1, ..Default::default() });
        let mut edited = ours.clone();
        edited.metadata.resource_version = Some("102".into());
        let cache = FooCache::new(trim_foo(&Shard::all()));
        let (events, stream) = futures::channel::mpsc::unbounded();
        let drained = tokio::spawn(cache.reflect(stream).for_each(|_| async {}));
        for event in [watcher::Event::Init, watcher::Event::InitApply(before.clone()), watcher::Event::InitDone] {
            events.unbounded_send(Ok(event)).unwrap();
        }
        assert!(cache.synced().await);
        cache.wrote(Some(&before), Some(ours.clone()));
        assert_eq!(cache.latest(Arc::new(before.clone())).resource_version().as_deref(), Some("101"), "our write");
        events.unbounded_send(Ok(watcher::Event::Apply(ours))).unwrap();
        events.unbounded_send(Ok(watcher::Event::Apply(edited))).unwrap();
        drop(events);
        drained.await.unwrap();
        assert_eq!(cache.latest(Arc::new(before)).resource_version().as_deref(), Some("102"), "the watch's newer one");
        assert!(cache.written().is_empty(), "the watch delivered our write: the record is gone");
    }

    #[tokio::test]
    async fn a_foo_our_status_write_caught_up_is_not_unsynced_before_the_watch_delivers_it() {
        let never = Foo::test("never").generation(1);
        let mut edited = Foo::test("edited").generation(2);
        edited.status = Some(crate::FooStatus { observed_generation: Some(1), ..Default::default() });
        let cache = FooCache::new(trim_foo(&Shard::all()));
        let (events, stream) = futures::channel::mpsc::unbounded();
        let drained = tokio::spawn(cache.reflect(stream).for_each(|_| async {}));
        let listed = [
            watcher::Event::Init,
            watcher::Event::InitApply(never.clone()),
            watcher::Event::InitApply(edited.clone()),
            watcher::Event::InitDone,
        ];
        for event in listed {
            events.unbounded_send(Ok(event)).unwrap();
        }
        assert!(cache.synced().await);
        let keys = |cache: &FooCache| {
            let mut keys: Vec<_> = cache.unsynced().into_iter().map(|b| b.key.to_string()).collect();
            keys.sort();
            keys
        };
        let key = |foo: &Foo| key_of(foo);
        assert_eq!(keys(&cache), [key(&edited), key(&never)]);
        let mut caught_up = edited.clone();
        caught_up.metadata.resource_version = Some("201".into());
        caught_up.status = Some(crate::FooStatus { observed_generation: Some(2), ..Default::default() });
        cache.wrote(Some(&edited), Some(caught_up));
        assert_eq!(keys(&cache), [key(&never)], "our write caught it up");
        drop(events);
        drained.await.unwrap();
    }

    #[tokio::test]
    async fn controlled_by_follows_applies_deletes_and_relists() {
        use watcher::Event::*;
        let (a, b) = (Foo::test("a").deployment("a1"), Foo::test("b").deployment("b1"));
        let a1 = DeploymentView::owned_by(&a);
        let a2 = DeploymentView::owned_by(&a.clone().deployment("a2"));
        let b1 = DeploymentView::owned_by(&b);
        let cache = DeploymentCache::new(trim_deployment(&Shard::all()));
        let (events, stream) = futures::channel::mpsc::unbounded();
        let drained = tokio::spawn(cache.reflect(stream).for_each(|_| async {}));
        let send = |e| events.unbounded_send(Ok(e)).unwrap();
        let names = |uid: &str| {
            let mut names: Vec<_> = cache.controlled_by(uid).iter().map(|d| d.name_any()).collect();
            names.sort();
            names
        };
        let foreign = DeploymentView::foreign("x");
        for e in [Init, InitApply(a1.clone()), InitApply(a2.clone()), InitApply(b1), InitApply(foreign), InitDone] {
            send(e);
        }
        assert!(cache.synced().await);
        assert_eq!((names("uid-a"), names("uid-b")), (vec!["a1".to_owned(), "a2".into()], vec!["b1".to_owned()]));
        assert_eq!(names("uid-other"), vec!["x".to_owned()], "any controller, not only Foos");
        send(Delete(a2));
        // A relist that no longer holds b1 (deleted while the watch was down).
        for e in [Init, InitApply(a1), InitDone] {
            send(e);
        }
        drop(events);
        drained.await.unwrap();
        assert_eq!((names("uid-a"), names("uid-b")), (vec!["a1".to_owned()], vec![]));
    }

    #[test]
    fn a_key_by_name_holds_no_uid_or_version_and_finds_the_same_entry() {
        let foo = Foo::test("f");
        let key = by_name(&foo);
        assert_eq!((key.name.as_str(), key.namespace.as_deref()), ("f", foo.metadata.namespace.as_deref()));
        assert_eq!((key.extra.uid.as_deref(), key.extra.resource_version.as_deref()), (None, None));
        let full = ObjectRef::from_obj(&foo);
        assert!(full.extra.uid.is_some(), "the fixture has a uid to leave out");
        assert_eq!(key, full, "keys compare on name and namespace");
    }

    #[test]
    fn trimmed_deployment_view_keeps_what_a_sync_reads() {
        let f = Foo::test("f").deployment("d").replicas(2);
        let mut full = Deployment::owned_by(&f).replicas(2).available(1);
        full.metadata.annotations =
            Some([("kubectl.kubernetes.io/last-applied-configuration".into(), "{}".into())].into());
        // Decoded from the API server's JSON, as the watch does.
        let mut d: DeploymentView = serde_json::from_value(serde_json::to_value(&full).unwrap()).unwrap();
        trim_deployment(&Shard::all())(&mut d);
        assert!(crate::api::deployment::is_controlled_by(&d, &f));
        assert_eq!((d.spec_replicas(), d.available_replicas()), (2, 1));
        assert_eq!(d.resource_version().as_deref(), Some("200"));
        assert!(d.metadata.annotations.is_none() && d.metadata.labels.is_none());
        assert!(d.is_managed(), "that it carried our label is kept without the labels");
        assert!(!serde_json::to_string(&d).unwrap().contains("template"), "the pod template is not kept");
        let mut upstreams = DeploymentView::made_by_upstream(&f);
        trim_deployment(&Shard::all())(&mut upstreams);
        assert!(!upstreams.is_managed());
    }

    #[test]
    fn a_shards_caches_keep_the_labels_its_deployments_follow_and_no_others() {
        let shard = Shard::parse("shard in (a,b)").unwrap();
        let f = Foo::test("f").label("shard", "a").label("team", "x");
        let mut d = DeploymentView::owned_by(&f);
        d.metadata.labels.get_or_insert_default().insert("shard".into(), "a".into());
        let untrimmed = d.clone();
        trim_deployment(&shard)(&mut d);
        assert_eq!(d.metadata.labels, None);
        assert_eq!(d.shard_labels.as_deref(), Some(&BTreeMap::from([("shard".to_owned(), Some("a".to_owned()))])));
        assert!(d.is_managed());
        for wanted in ["a", "b"] {
            let followed = BTreeMap::from([("shard".to_owned(), Some(wanted.to_owned()))]);
            assert_eq!(d.relabelling(&followed), untrimmed.relabelling(&followed), "to {wanted}: as before the trim");
        }
        let mut foo = f.clone();
        trim_foo(&shard)(&mut foo);
        assert_eq!(foo.metadata.labels, Some([("shard".to_owned(), "a".to_owned())].into()));
    }

    #[test]
    fn a_fixed_shards_caches_keep_no_labels_and_read_back_the_shards() {
        let shard = Shard::parse("shard=a").unwrap();
        let mut foo = Foo::test("f").label("shard", "a").label("team", "x");
        let followed = shard.follow(foo.metadata.labels.as_ref());
        trim_foo(&shard)(&mut foo);
        assert_eq!(foo.metadata.labels, None);
        assert_eq!(shard.follow_cached(foo.metadata.labels.as_ref()), followed);
        let mut d = DeploymentView::owned_by(&Foo::test("f"));
        d.metadata.labels.get_or_insert_default().insert("shard".into(), "a".into());
        trim_deployment(&shard)(&mut d);
        assert!(d.relabelling(&followed).is_empty(), "in its Foo's shard");
        trim_deployment(&shard)(&mut d);
        assert!(d.relabelling(&followed).is_empty(), "trimmed twice, still in it");
        let to_b = BTreeMap::from([("shard".to_owned(), Some("b".to_owned()))]);
        assert_eq!(d.relabelling(&to_b), to_b, "a Foo moved to b: relabelled");
    }
}
