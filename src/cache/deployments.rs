//! The Deployments' store, our own: what a sync reads of each Deployment in
//! fixed fields, and the index by controller uid folded into it.
//!
//! kube-runtime's reflector store keeps every object whole, `ObjectMeta`
//! and all (360 bytes of mostly empty `Option`s), under a key copying four
//! of its strings; our index by controller kept two more keys and two uid
//! strings. Measured at 10 000 Foos (`benches/cache_memory.rs`), that was
//! 1 358 bytes per Deployment. Here a Deployment is one entry: a uid and a
//! resourceVersion in fixed bytes ([`Token`]), its controller reference with
//! the owner's apiVersion and kind shared, the replicas asked and available,
//! its deletion and its shard labels (a map its shard's Deployments share).
//! A sync is handed the [`DeploymentView`] rebuilt from it: the same view
//! the trim left ([`super::trim_deployment`]). The Foos are kept the same
//! way ([`super::FooStore`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use parking_lot::{Mutex, RwLock};

use super::token::Token;
use super::{Keep, key_from_ref, key_of, object_ref, split_key};
use crate::api::deployment::controller_of;
use crate::api::deployment_view::{DeploymentView, ViewSpec, ViewStatus};
use crate::api::shard::FollowedLabels;

/// The Deployments the watch delivered, kept small, by name and by the uid
/// of their controller.
#[derive(Default)]
pub struct DeploymentStore {
    state: RwLock<State>,
    /// Filled by a relist until it is complete, then swapped in whole: the
    /// Deployments deleted while the watch was down leave with the old one.
    relist: Mutex<Option<State>>,
}

#[derive(Default)]
struct State {
    /// By `namespace/name`, the key shared with `by_controller`. Boxed: a
    /// map's slots are a third to half empty after it grows, and a slot is
    /// the size of what it holds.
    by_name: HashMap<Arc<str>, Box<Kept>>,
    /// A controller has one Deployment, or a few while a rename settles.
    by_controller: HashMap<Token, Names>,
    /// The owners' apiVersion and kind: a handful of pairs, shared.
    kinds: HashSet<Arc<OwnerKind>>,
}

/// What a sync reads of one Deployment.
struct Kept {
    uid: Option<Token>,
    version: Option<Token>,
    controller: Option<Controller>,
    deleting: Option<Time>,
    spec: Option<ViewSpec>,
    status: Option<ViewStatus>,
    shard_labels: Option<Arc<FollowedLabels>>,
    managed: bool,
}

/// The controller ownerReference (`controller: true` is implied).
struct Controller {
    kind: Arc<OwnerKind>,
    name: Box<str>,
    uid: Token,
    block_owner_deletion: Option<bool>,
}

#[derive(PartialEq, Eq, Hash)]
struct OwnerKind {
    api_version: String,
    kind: String,
}

enum Names {
    One(Arc<str>),
    Many(Vec<Arc<str>>),
}

impl Keep<DeploymentView> for DeploymentStore {
    fn apply(&self, event: &watcher::Event<DeploymentView>) {
        match event {
            watcher::Event::Apply(d) => self.state.write().insert(d),
            watcher::Event::Delete(d) => self.state.write().remove(&key_of(d)),
            watcher::Event::Init => *self.relist.lock() = Some(State::default()),
            watcher::Event::InitApply(d) => self.relist.lock().get_or_insert_default().insert(d),
            watcher::Event::InitDone => {
                if let Some(listed) = self.relist.lock().take() {
                    *self.state.write() = listed;
                }
            }
        }
    }

    fn get(&self, key: &ObjectRef<DeploymentView>) -> Option<DeploymentView> {
        let key = key_from_ref(key);
        let state = self.state.read();
        state.by_name.get_key_value(key.as_str()).map(|(key, kept)| kept.view(key))
    }

    fn filter_map<T>(&self, mut f: impl FnMut(DeploymentView) -> Option<T>) -> Vec<T> {
        let state = self.state.read();
        state.by_name.iter().filter_map(|(key, kept)| f(kept.view(key))).collect()
    }

    fn count(&self) -> usize {
        self.state.read().by_name.len()
    }
}

impl DeploymentStore {
    /// The keys of the Deployments whose controller has `uid`.
    pub(super) fn controlled_by(&self, uid: &str) -> Vec<ObjectRef<DeploymentView>> {
        let state = self.state.read();
        let names = match state.by_controller.get(&Token::new(uid)) {
            None => return Vec::new(),
            Some(Names::One(key)) => std::slice::from_ref(key),
            Some(Names::Many(keys)) => keys.as_slice(),
        };
        names.iter().map(|key| object_ref(key)).collect()
    }
}

impl State {
    fn insert(&mut self, d: &DeploymentView) {
        let key: Arc<str> = key_of(d).into();
        self.remove(&key);
        let controller = controller_of(d).map(|owner| {
            let kind = OwnerKind { api_version: owner.api_version.clone(), kind: owner.kind.clone() };
            let kind = match self.kinds.get(&kind) {
                Some(shared) => shared.clone(),
                None => {
                    let shared = Arc::new(kind);
                    self.kinds.insert(shared.clone());
                    shared
                }
            };
            let uid = Token::new(&owner.uid);
            let name = owner.name.as_str().into();
            Controller { kind, name, uid, block_owner_deletion: owner.block_owner_deletion }
        });
        if let Some(controller) = &controller {
            self.index(controller.uid.clone(), key.clone());
        }
        let meta = &d.metadata;
        let kept = Kept {
            uid: meta.uid.as_deref().map(Token::new),
            version: meta.resource_version.as_deref().map(Token::new),
            controller,
            deleting: meta.deletion_timestamp.clone(),
            spec: d.spec.clone(),
            status: d.status.clone(),
            shard_labels: d.shard_labels.clone(),
            managed: d.managed,
        };
        self.by_name.insert(key, Box::new(kept));
    }

    fn remove(&mut self, key: &str) {
        let Some((key, kept)) = self.by_name.remove_entry(key) else { return };
        let Some(controller) = kept.controller else { return };
        self.unindex(&controller.uid, &key);
        // Two holders left, the set and this one: no other Deployment has
        // an owner of that kind.
        if Arc::strong_count(&controller.kind) == 2 {
            self.kinds.remove(&*controller.kind);
        }
    }

    fn index(&mut self, uid: Token, key: Arc<str>) {
        match self.by_controller.remove(&uid) {
            None => self.by_controller.insert(uid, Names::One(key)),
            Some(Names::One(first)) => self.by_controller.insert(uid, Names::Many(vec![first, key])),
            Some(Names::Many(mut keys)) => {
                keys.push(key);
                self.by_controller.insert(uid, Names::Many(keys))
            }
        };
    }

    fn unindex(&mut self, uid: &Token, key: &Arc<str>) {
        let Some(names) = self.by_controller.remove(uid) else { return };
        let left = match names {
            Names::One(_) => return,
            Names::Many(mut keys) => {
                keys.retain(|k| k != key);
                match keys.len() {
                    0 => return,
                    1 => Names::One(keys.remove(0)),
                    _ => Names::Many(keys),
                }
            }
        };
        self.by_controller.insert(uid.clone(), left);
    }
}

impl Kept {
    /// The view the trim left, rebuilt.
    fn view(&self, key: &str) -> DeploymentView {
        let (namespace, name) = split_key(key);
        let owner = self.controller.as_ref().map(|c| OwnerReference {
            api_version: c.kind.api_version.clone(),
            kind: c.kind.kind.clone(),
            name: c.name.to_string(),
            uid: c.uid.to_string(),
            controller: Some(true),
            block_owner_deletion: c.block_owner_deletion,
        });
        DeploymentView {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: namespace.map(str::to_owned),
                uid: self.uid.as_ref().map(Token::to_string),
                resource_version: self.version.as_ref().map(Token::to_string),
                deletion_timestamp: self.deleting.clone(),
                owner_references: owner.map(|o| vec![o]),
                ..ObjectMeta::default()
            },
            spec: self.spec.clone(),
            status: self.status.clone(),
            managed: self.managed,
            shard_labels: self.shard_labels.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::foo::Foo;
    use crate::api::shard::Shard;
    use crate::cache::trim_deployment;
    use crate::testing::{DeploymentFixture, FooFixture};
    use k8s_openapi::api::apps::v1::Deployment;
    use watcher::Event::*;

    fn trimmed(mut d: DeploymentView) -> DeploymentView {
        trim_deployment(&Shard::parse("shard in (a,b)").unwrap())(&mut d);
        d
    }

    fn applied(events: impl IntoIterator<Item = watcher::Event<DeploymentView>>) -> DeploymentStore {
        let store = DeploymentStore::default();
        events.into_iter().for_each(|e| store.apply(&e));
        store
    }

    #[test]
    fn a_sync_reads_back_the_view_the_trim_left() {
        let foo = Foo::test("f").deployment("d").label("shard", "a");
        let mut ours = Deployment::owned_by(&foo).replicas(3).available(2);
        ours.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        ours.metadata.labels.get_or_insert_default().insert("shard".into(), "a".into());
        let mut theirs = DeploymentView::foreign("x");
        theirs.metadata.uid = Some("not-a-uuid".into());
        theirs.metadata.resource_version = Some("0042".into());
        let mut bare = DeploymentView::foreign("bare");
        bare.metadata.owner_references = None;
        bare.spec = None;
        for d in [DeploymentView::from(ours), theirs, bare] {
            let d = trimmed(d);
            let store = applied([Apply(d.clone())]);
            assert_eq!(store.get(&ObjectRef::from_obj(&d)), Some(d));
        }
    }

    #[test]
    fn a_deployment_whose_controller_changes_moves_in_the_index() {
        let a = Foo::test("a").deployment("a1");
        let a1 = trimmed(DeploymentView::owned_by(&a));
        let a2 = trimmed(DeploymentView::owned_by(&a.clone().deployment("a2")));
        let b1 = trimmed(DeploymentView::owned_by(&Foo::test("b").deployment("b1")));
        let store = applied([Apply(a1.clone()), Apply(a2), Apply(b1.clone())]);
        let names = |uid: &str| {
            let mut names: Vec<_> = store.controlled_by(uid).into_iter().map(|k| k.name).collect();
            names.sort();
            names
        };
        let mut moved = b1;
        moved.metadata.owner_references.as_mut().unwrap()[0].uid = "uid-a".into();
        store.apply(&Apply(moved));
        assert_eq!((names("uid-a"), names("uid-b")), (vec!["a1".to_owned(), "a2".into(), "b1".into()], vec![]));
        store.apply(&Delete(a1));
        assert_eq!(names("uid-a"), vec!["a2".to_owned(), "b1".into()]);
    }

    #[test]
    fn owner_kinds_are_shared_and_leave_with_their_last_deployment() {
        let a = trimmed(DeploymentView::owned_by(&Foo::test("a")));
        let b = trimmed(DeploymentView::owned_by(&Foo::test("b")));
        let foreign = trimmed(DeploymentView::foreign("x"));
        let store = applied([Apply(a.clone()), Apply(b.clone()), Apply(foreign.clone())]);
        assert_eq!(store.state.read().kinds.len(), 2, "Foo and the foreign owner's kind");
        store.apply(&Delete(a));
        store.apply(&Delete(foreign));
        assert_eq!(store.state.read().kinds.len(), 1);
        store.apply(&Delete(b));
        assert!(store.state.read().kinds.is_empty() && store.state.read().by_controller.is_empty());
    }
}
