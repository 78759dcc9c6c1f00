//! Our own writes that the watch has not delivered yet: what the API server
//! returned to a write stands in for the cached object until the watch has
//! caught up with it (see [`super`] for why).

use std::collections::HashMap;
use std::sync::Arc;

use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

/// Our writes that the watch has not delivered yet, by object.
pub(super) struct OwnWrites<K: Resource<DynamicType = ()>> {
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
    pub(super) fn record(&mut self, before: Option<&K>, after: Option<Arc<K>>) {
        let Some(named) = after.as_deref().or(before) else { return };
        let key = ObjectRef::from_obj(named);
        let uid = named.uid();
        let replaced = before.and_then(|b| b.resource_version());
        self.entries.insert(key, Entry { uid, replaced, result: after });
    }

    /// The watch delivered `obj`: once that is our write or anything after
    /// it, the cache knows better than our record.
    pub(super) fn observe(&mut self, obj: &K) {
        let key = ObjectRef::from_obj(obj);
        if self.entries.get(&key).is_some_and(|e| Self::supersedes(e, obj)) {
            self.entries.remove(&key);
        }
    }

    pub(super) fn resolve(&self, key: &ObjectRef<K>, cached: Option<Arc<K>>) -> Option<Arc<K>> {
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

    /// Whether a write of ours to the object `key` names waits for the
    /// watch.
    pub(super) fn holds(&self, key: &ObjectRef<K>) -> bool {
        self.entries.contains_key(key)
    }

    /// True when no write waits for the watch.
    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// True when `seen` is the written object at or after our write: same
    /// uid, and not the version the write replaced. (A different uid is an
    /// older object of the same name, whose deletion is still on its way.)
    fn supersedes(entry: &Entry<K>, seen: &K) -> bool {
        seen.uid() == entry.uid && seen.resource_version() != entry.replaced
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::foo::Foo;
    use crate::testing::{DeploymentFixture, FooFixture};
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
        assert!(w.is_empty());
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
}
