//! Cached objects by the uid of their controller, so a sync finds the
//! Deployments its Foo controls without a scan.

use std::collections::HashMap;
use std::sync::Arc;

use kube::Resource;
use kube::runtime::reflector::ObjectRef;

use super::by_name;
use crate::api::deployment::controller_of;

/// The uid of `obj`'s controller, if it has one.
pub(super) fn controller_uid<K: Resource>(obj: &K) -> Option<&str> {
    controller_of(obj).map(|o| o.uid.as_str())
}

/// Cached objects by the uid of their controller.
pub(super) struct ByController<K: Resource<DynamicType = ()>> {
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
    pub(super) fn of(objects: Vec<Arc<K>>) -> Self {
        let mut index = Self::default();
        objects.iter().for_each(|obj| index.apply(obj));
        index
    }

    pub(super) fn apply(&mut self, obj: &K) {
        let key = by_name(obj);
        self.remove(&key);
        if let Some(uid) = controller_uid(obj) {
            self.keys.entry(uid.to_owned()).or_insert_with(|| Vec::with_capacity(1)).push(key.clone());
            self.controller.insert(key, uid.to_owned());
        }
    }

    pub(super) fn remove(&mut self, key: &ObjectRef<K>) {
        let Some(uid) = self.controller.remove(key) else { return };
        if let Some(keys) = self.keys.get_mut(&uid) {
            keys.retain(|k| k != key);
            if keys.is_empty() {
                self.keys.remove(&uid);
            }
        }
    }

    pub(super) fn keys(&self, uid: &str) -> Vec<ObjectRef<K>> {
        self.keys.get(uid).cloned().unwrap_or_default()
    }
}
