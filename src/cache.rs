//! The controller's view of the cluster: the Foos and the Deployments it made,
//! kept by watches in kube-runtime reflector stores, so a sync reads memory
//! and never the API server.
//!
//! Two things are added to the plain reflector:
//! - objects are **trimmed** before they are stored ([`trim_deployment`],
//!   [`trim_foo`]): a sync needs a handful of fields, and at ten thousand Foos
//!   the rest (managedFields, annotations) is most of the memory. Deployments
//!   are decoded as a [`DeploymentView`], so their pod templates are never
//!   even built;
//! - **our own writes are seen at once** ([`Cache::wrote`]). A watch delivers
//!   our write a few milliseconds after the API server acknowledged it; a sync
//!   that runs in between would otherwise see the old object and repeat the
//!   write (a second create, a second status patch and event). What the API
//!   server returned to our write stands in for the cached object until the
//!   watch has caught up with it. Nothing is written on the strength of it
//!   alone: every write stays a create or conditional on a resourceVersion.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::watcher;
use kube::runtime::{WatchStreamExt, reflector::reflector};
use kube::{Resource, ResourceExt};
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::deployment::{DeploymentView, controller_of};
use crate::foo::Foo;

/// A reflector store of `K`, plus our own writes it has not seen yet.
pub struct Cache<K: Resource<DynamicType = ()> + Clone + 'static> {
    store: Store<K>,
    /// What is dropped from every object before it is kept.
    trim: fn(&mut K),
    written: Mutex<OwnWrites<K>>,
    controlled: Mutex<ByController<K>>,
    synced: watch::Sender<bool>,
}

impl<K> Cache<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Send + Sync + 'static,
{
    /// An empty cache of objects trimmed by `trim`, and the writer that
    /// [`Cache::reflect`] fills it with.
    pub fn new(trim: fn(&mut K)) -> (Arc<Self>, Writer<K>) {
        let (store, writer) = reflector::store();
        let cache = Cache {
            store,
            trim,
            written: Mutex::default(),
            controlled: Mutex::default(),
            synced: watch::Sender::new(false),
        };
        (Arc::new(cache), writer)
    }

    /// Feed `events` (a watcher stream), trimmed, into this cache; the
    /// events are passed on, trimmed, for the controller's triggers.
    pub fn reflect(
        self: &Arc<Self>,
        writer: Writer<K>,
        events: impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
    ) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static {
        let cache = self.clone();
        reflector(writer, events.modify(self.trim)).inspect(move |event| {
            if let Ok(event) = event {
                cache.observe(event);
            }
        })
    }

    /// The object as we know it: the cached one, or what the API server
    /// returned to our last write of it if the cache has not seen that yet.
    /// `None` if it does not exist (or we deleted it).
    pub fn get(&self, key: &ObjectRef<K>) -> Option<Arc<K>> {
        self.written().resolve(key, self.store.get(key))
    }

    /// The newest version we know of `obj`, a copy the store handed out
    /// earlier: the store's current one (the watch may have delivered our
    /// write since, and cleared our record of it), or our write.
    pub fn latest(&self, obj: Arc<K>) -> Arc<K> {
        let key = ObjectRef::from_obj(&*obj);
        let cached = self.store.get(&key).unwrap_or_else(|| obj.clone());
        self.written().resolve(&key, Some(cached)).unwrap_or(obj)
    }

    /// Cached objects matching `predicate`, as [`Cache::get`] sees them.
    pub fn filter(&self, predicate: impl Fn(&K) -> bool) -> Vec<Arc<K>> {
        let written = self.written();
        self.store
            .state_filter(&predicate)
            .into_iter()
            .filter_map(|obj| written.resolve(&ObjectRef::from_obj(&obj), Some(obj)))
            .filter(|obj| predicate(obj))
            .collect()
    }

    /// Cached objects whose controller (the ownerReference with `controller:
    /// true`) has `uid`, as [`Cache::get`] sees them: found through an index,
    /// so a sync costs the same with ten or ten thousand objects cached.
    pub fn controlled_by(&self, uid: &str) -> Vec<Arc<K>> {
        let keys = self.controlled.lock().keys(uid);
        keys.iter().filter_map(|key| self.get(key)).filter(|obj| controller_uid(&**obj) == Some(uid)).collect()
    }

    /// Record what the API server returned to our write (`None`: we deleted
    /// the object `before`). `before` is the version the write was based on
    /// (`None` for a create).
    pub fn wrote(&self, before: Option<&K>, after: Option<K>) {
        let after = after.map(|mut obj| {
            (self.trim)(&mut obj);
            Arc::new(obj)
        });
        self.written().record(before, after);
    }

    /// Resolves once the first full list has been stored.
    pub async fn synced(&self) {
        let mut rx = self.synced.subscribe();
        // Err only if the sender is gone, and it lives as long as `self`.
        let _ = rx.wait_for(|synced| *synced).await;
    }

    /// The reader the controller schedules syncs from.
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    fn observe(&self, event: &watcher::Event<K>) {
        match event {
            watcher::Event::Apply(obj) | watcher::Event::InitApply(obj) => {
                self.written().observe(obj);
                self.controlled.lock().apply(obj);
            }
            watcher::Event::Delete(obj) => {
                self.written().observe(obj);
                self.controlled.lock().remove(&ObjectRef::from_obj(obj));
            }
            watcher::Event::InitDone => {
                // A relist replaced the store: objects deleted while the
                // watch was down must leave the index too.
                *self.controlled.lock() = ByController::of(self.store.state());
                self.synced.send_replace(true);
            }
            watcher::Event::Init => {}
        }
    }

    fn written(&self) -> parking_lot::MutexGuard<'_, OwnWrites<K>> {
        self.written.lock()
    }
}

/// The uid of `obj`'s controller, if it has one.
fn controller_uid<K: Resource>(obj: &K) -> Option<&str> {
    controller_of(obj).map(|o| o.uid.as_str())
}

/// Cached objects by the uid of their controller.
struct ByController<K: Resource<DynamicType = ()>> {
    /// A Vec, not a set: a controller has one object or a few. Each starts
    /// with room for one; a HashSet's or Vec's first insert takes room for
    /// four (400 bytes here), which at ten thousand Foos was 4 MiB.
    keys: HashMap<String, Vec<ObjectRef<K>>>,
    controller: HashMap<ObjectRef<K>, String>,
}

impl<K: Resource<DynamicType = ()>> Default for ByController<K> {
    fn default() -> Self {
        ByController { keys: HashMap::new(), controller: HashMap::new() }
    }
}

impl<K: Resource<DynamicType = ()>> ByController<K> {
    fn of(objects: Vec<Arc<K>>) -> Self {
        let mut index = Self::default();
        objects.iter().for_each(|obj| index.apply(obj));
        index
    }

    fn apply(&mut self, obj: &K) {
        // Name and namespace only (keys compare on those): no copies of the
        // uid and resourceVersion per entry.
        let key = ObjectRef::new(&obj.name_any()).within(obj.namespace().as_deref().unwrap_or_default());
        self.remove(&key);
        if let Some(uid) = controller_uid(obj) {
            self.keys.entry(uid.to_owned()).or_insert_with(|| Vec::with_capacity(1)).push(key.clone());
            self.controller.insert(key, uid.to_owned());
        }
    }

    fn remove(&mut self, key: &ObjectRef<K>) {
        let Some(uid) = self.controller.remove(key) else { return };
        if let Some(keys) = self.keys.get_mut(&uid) {
            keys.retain(|k| k != key);
            if keys.is_empty() {
                self.keys.remove(&uid);
            }
        }
    }

    fn keys(&self, uid: &str) -> Vec<ObjectRef<K>> {
        self.keys.get(uid).cloned().unwrap_or_default()
    }
}

/// Our writes that the watch has not delivered yet, by object.
struct OwnWrites<K: Resource<DynamicType = ()>> {
    entries: HashMap<ObjectRef<K>, Entry<K>>,
}

impl<K: Resource<DynamicType = ()>> Default for OwnWrites<K> {
    fn default() -> Self {
        OwnWrites { entries: HashMap::new() }
    }
}

struct Entry<K> {
    /// The object written (its uid).
    uid: Option<String>,
    /// The resourceVersion our write replaced; `None` for a create.
    replaced: Option<String>,
    /// What the API server returned; `None` after a delete.
    result: Option<Arc<K>>,
}

impl<K: Resource<DynamicType = ()> + Clone> OwnWrites<K> {
    fn record(&mut self, before: Option<&K>, after: Option<Arc<K>>) {
        let Some(named) = after.as_deref().or(before) else { return };
        let key = ObjectRef::from_obj(named);
        let uid = named.uid();
        let replaced = before.and_then(|b| b.resource_version());
        self.entries.insert(key, Entry { uid, replaced, result: after });
    }

    /// The watch delivered `obj`: once that is our write or anything after
    /// it, the cache knows better than our record.
    fn observe(&mut self, obj: &K) {
        let key = ObjectRef::from_obj(obj);
        if self.entries.get(&key).is_some_and(|e| Self::supersedes(e, obj)) {
            self.entries.remove(&key);
        }
    }

    fn resolve(&self, key: &ObjectRef<K>, cached: Option<Arc<K>>) -> Option<Arc<K>> {
        let Some(entry) = self.entries.get(key) else { return cached };
        let stands_in = match (&entry.replaced, cached.as_deref()) {
            // Our create: until the cache shows that very object, whatever
            // it holds under the name is older.
            (None, cached) => cached.is_none_or(|c| c.uid() != entry.uid),
            // Our update or delete: only of the version the cache still
            // holds. Anything else there is newer.
            (Some(replaced), Some(c)) => c.uid() == entry.uid && c.resource_version().as_ref() == Some(replaced),
            (Some(_), None) => false,
        };
        if stands_in { entry.result.clone() } else { cached }
    }

    /// True when `seen` is the written object at or after our write: same
    /// uid, and not the version the write replaced. (A different uid is an
    /// older object of the same name, whose deletion is still on its way.)
    fn supersedes(entry: &Entry<K>, seen: &K) -> bool {
        seen.uid() == entry.uid && seen.resource_version() != entry.replaced
    }
}

/// Keep what a sync reads of a Deployment: identity, owner, deletion, and
/// whether it carries our label (the view itself holds only `spec.replicas`
/// and `status.availableReplicas`).
pub fn trim_deployment(d: &mut DeploymentView) {
    trim_metadata(d);
    d.managed = d.is_managed();
    d.metadata.labels = None;
}

/// Keep a Foo's spec, status and identity.
pub fn trim_foo(foo: &mut Foo) {
    trim_metadata(foo);
    foo.metadata.labels = None;
}

fn trim_metadata<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    // kubectl's last-applied-configuration is a copy of the whole object.
    meta.annotations = None;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{DeploymentFixture, FooFixture};
    use futures::StreamExt;
    use k8s_openapi::api::apps::v1::Deployment;

    fn key(d: &Deployment) -> ObjectRef<Deployment> {
        ObjectRef::from_obj(d)
    }

    fn version(d: &Deployment, rv: &str, replicas: i32) -> Deployment {
        let mut d = d.clone();
        d.metadata.resource_version = Some(rv.into());
        d.spec.as_mut().unwrap().replicas = Some(replicas);
        d
    }

    #[test]
    fn a_created_object_stands_in_until_the_watch_delivers_it() {
        let d = Deployment::owned_by(&Foo::test("f").deployment("d"));
        let mut w = OwnWrites::default();
        w.record(None, Some(Arc::new(d.clone())));
        assert_eq!(w.resolve(&key(&d), None).as_deref(), Some(&d), "not in the cache yet");
        w.observe(&d);
        assert_eq!(w.resolve(&key(&d), None), None, "the watch saw it and then its deletion");
    }

    #[test]
    fn a_patch_stands_in_for_the_version_it_replaced_only() {
        let d = Deployment::owned_by(&Foo::test("f").deployment("d"));
        let (old, ours, later) = (version(&d, "1", 1), version(&d, "2", 3), version(&d, "3", 5));
        let mut w = OwnWrites::default();
        w.record(Some(&old), Some(Arc::new(ours.clone())));
        assert_eq!(w.resolve(&key(&d), Some(Arc::new(old.clone()))).as_deref(), Some(&ours));
        assert_eq!(w.resolve(&key(&d), Some(Arc::new(later.clone()))).as_deref(), Some(&later));
        // The watch delivering the replaced version (in flight) changes nothing.
        w.observe(&old);
        assert_eq!(w.resolve(&key(&d), Some(Arc::new(old))).as_deref(), Some(&ours));
        w.observe(&ours);
        assert!(w.entries.is_empty());
    }

    #[test]
    fn a_deleted_object_is_gone_until_the_watch_shows_otherwise() {
        let d = version(&Deployment::owned_by(&Foo::test("f").deployment("d")), "7", 1);
        let mut w = OwnWrites::default();
        w.record(Some(&d), None);
        assert_eq!(w.resolve(&key(&d), Some(Arc::new(d.clone()))), None);
        // A new object of that name (another uid) is not hidden by it.
        let mut successor = d.clone();
        successor.metadata.uid = Some("uid-successor".into());
        w.observe(&successor);
        assert_eq!(w.resolve(&key(&d), Some(Arc::new(successor.clone()))).as_deref(), Some(&successor));
    }

    #[test]
    fn an_older_object_of_the_same_name_does_not_clear_our_create() {
        let d = Deployment::owned_by(&Foo::test("f").deployment("d"));
        let mut predecessor = d.clone();
        predecessor.metadata.uid = Some("uid-predecessor".into());
        let mut w = OwnWrites::default();
        w.record(None, Some(Arc::new(d.clone())));
        w.observe(&predecessor); // its Delete event, arriving late
        assert_eq!(w.resolve(&key(&d), None).as_deref(), Some(&d));
    }

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
        let (cache, writer) = Cache::new(trim_foo);
        let (events, stream) = futures::channel::mpsc::unbounded();
        let drained = tokio::spawn(cache.reflect(writer, stream).for_each(|_| async {}));
        for event in [watcher::Event::Init, watcher::Event::InitApply(before.clone()), watcher::Event::InitDone] {
            events.unbounded_send(Ok(event)).unwrap();
        }
        cache.synced().await;
        cache.wrote(Some(&before), Some(ours.clone()));
        assert_eq!(cache.latest(Arc::new(before.clone())).resource_version().as_deref(), Some("101"), "our write");
        events.unbounded_send(Ok(watcher::Event::Apply(ours))).unwrap();
        events.unbounded_send(Ok(watcher::Event::Apply(edited))).unwrap();
        drop(events);
        drained.await.unwrap();
        assert_eq!(cache.latest(Arc::new(before)).resource_version().as_deref(), Some("102"), "the watch's newer one");
        assert!(cache.written().entries.is_empty(), "the watch delivered our write: the record is gone");
    }

    #[tokio::test]
    async fn controlled_by_follows_applies_deletes_and_relists() {
        use watcher::Event::*;
        let (a, b) = (Foo::test("a").deployment("a1"), Foo::test("b").deployment("b1"));
        let a1 = DeploymentView::owned_by(&a);
        let a2 = DeploymentView::owned_by(&a.clone().deployment("a2"));
        let b1 = DeploymentView::owned_by(&b);
        let (cache, writer) = Cache::new(trim_deployment);
        let (events, stream) = futures::channel::mpsc::unbounded();
        let drained = tokio::spawn(cache.reflect(writer, stream).for_each(|_| async {}));
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
        cache.synced().await;
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
    fn trimmed_deployment_view_keeps_what_a_sync_reads() {
        let f = Foo::test("f").deployment("d").replicas(2);
        let mut full = Deployment::owned_by(&f).replicas(2).available(1);
        full.metadata.annotations =
            Some([("kubectl.kubernetes.io/last-applied-configuration".into(), "{}".into())].into());
        // Decoded from the API server's JSON, as the watch does.
        let mut d: DeploymentView = serde_json::from_value(serde_json::to_value(&full).unwrap()).unwrap();
        trim_deployment(&mut d);
        assert!(crate::deployment::is_controlled_by(&d, &f));
        assert_eq!((d.spec_replicas(), d.available_replicas()), (2, 1));
        assert_eq!(d.resource_version().as_deref(), Some("200"));
        assert!(d.metadata.annotations.is_none() && d.metadata.labels.is_none());
        assert!(d.is_managed(), "that it carried our label is kept without the labels");
        assert!(!serde_json::to_string(&d).unwrap().contains("template"), "the pod template is not kept");
        let mut upstreams = DeploymentView::made_by_upstream(&f);
        trim_deployment(&mut upstreams);
        assert!(!upstreams.is_managed());
    }
}
