//! What wakes a sync: the Foo watch's events (a Foo first seen, or changed
//! where a sync reads it), the Deployment watch's (a change or deletion of
//! one a Foo owns), and a Deployment name freed for the Foo that waited for
//! it. Each waits in the backlog ([`crate::controller::backlog`]) in its
//! lane: a change a watch reports before what a list finds.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use futures::{Stream, StreamExt};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use crate::api::deployment::controlling_foo;
use crate::api::deployment_view::DeploymentView;
use crate::api::foo::Foo;
use crate::cache::FooCache;
use crate::controller::backlog::{Backlog, Lane, first_sync_lane};

/// What makes a Foo worth a sync: its identity, its generation, and the
/// labels its Deployment follows (all the cache keeps). A status write
/// changes none of them.
fn sync_worthy(foo: &Foo) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    (&foo.metadata.uid, foo.metadata.generation, &foo.metadata.labels).hash(&mut hasher);
    hasher.finish()
}

/// The Foos to sync, from the Foo watch's events: each the first time it is
/// seen and whenever [`sync_worthy`] changes — kube-runtime's generation
/// predicate, but one that forgets a Foo the watch deletes (or a relist no
/// longer holds): a Foo that leaves this shard and comes back is synced
/// again, where the predicate would remember it for an hour. Each with its
/// lane: a change a watch reports goes now; one a relist finds, soon; a
/// Foo listed for the first time by its [`first_sync_lane`].
pub(crate) fn changed_foos(
    events: impl Stream<Item = watcher::Result<watcher::Event<Foo>>> + Send + 'static,
) -> impl Stream<Item = watcher::Result<(Foo, Lane)>> + Send + 'static {
    use watcher::Event;
    // During a relist, what it holds goes into a map of its own, which
    // replaces the last at its end: what it no longer holds is forgotten.
    let (mut seen, mut relist) = (Seen::new(), None::<Seen>);
    events.filter_map(move |event| {
        let out = match event {
            Err(e) => Some(Err(e)),
            Ok(Event::Init) => {
                relist = Some(HashMap::new());
                None
            }
            Ok(Event::InitDone) => {
                seen = relist.take().unwrap_or_default();
                None
            }
            Ok(Event::Delete(foo)) => {
                seen.remove(&named(&foo));
                None
            }
            Ok(Event::Apply(foo)) => remember(&mut seen, relist.as_mut(), foo, Lane::Now).map(Ok),
            Ok(Event::InitApply(foo)) => {
                let lane = if seen.contains_key(&named(&foo)) { Lane::Soon } else { first_sync_lane(&foo) };
                remember(&mut seen, relist.as_mut(), foo, lane).map(Ok)
            }
        };
        std::future::ready(out)
    })
}

/// What each Foo seen was worth ([`sync_worthy`]), by [`named`].
type Seen = HashMap<u64, u64>;

/// A Foo's name and namespace, hashed: 16 bytes a Foo in [`Seen`] where an
/// `ObjectRef` key took 104 and two strings. Two Foos whose keys collide
/// (one chance in 2^64 a pair) would cost a sync too many, never a change
/// missed: what is kept under the key, `sync_worthy`, has the uid in it, so
/// the other Foo's value never matches. The uid is in that value, not the
/// key, so a Foo deleted and made again under its name is new.
fn named(foo: &Foo) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    (&foo.metadata.namespace, &foo.metadata.name).hash(&mut hasher);
    hasher.finish()
}

/// Note what `foo` is worth (into the relist's map while one runs), and
/// give it back with its lane if that changed.
fn remember(seen: &mut Seen, relist: Option<&mut Seen>, foo: Foo, lane: Lane) -> Option<(Foo, Lane)> {
    let (key, now) = (named(&foo), sync_worthy(&foo));
    let before = seen.get(&key).copied();
    relist.unwrap_or(seen).insert(key, now);
    (before != Some(now)).then_some((foo, lane))
}

/// The Deployment watch's events: a change or a deletion is passed on (its
/// Foo waits as a change); a listed Deployment (a start, a relist)
/// sends its Foo to wait in `backlog`, as the Foo's own listing does (one a
/// relist finds changed too: nothing here says which changed while the
/// watch was down; the backlog still syncs it within seconds).
pub(crate) fn changed_deployments(
    events: impl Stream<Item = watcher::Result<watcher::Event<DeploymentView>>> + Send + 'static,
    backlog: Arc<Backlog>,
) -> impl Stream<Item = watcher::Result<DeploymentView>> + Send + 'static {
    use watcher::Event;
    events.filter_map(move |event| {
        std::future::ready(match event {
            Err(e) => Some(Err(e)),
            Ok(Event::Apply(d) | Event::Delete(d)) => Some(Ok(d)),
            Ok(Event::InitApply(d)) => {
                controlling_foo(&d).into_iter().for_each(|foo| backlog.push(foo, Lane::Later));
                None
            }
            Ok(Event::Init | Event::InitDone) => None,
        })
    })
}

/// The Foos that name a Deployment of ours which was just deleted: one
/// refused because another Foo held the name can take it now, rather than
/// when its error backoff (up to 1000 s) runs out.
pub(crate) fn waiting_for(
    foos: Arc<FooCache>,
    freed: impl futures::Stream<Item = ObjectRef<DeploymentView>> + Send + 'static,
) -> impl futures::Stream<Item = ObjectRef<Foo>> + Send + 'static {
    freed.flat_map(move |d| futures::stream::iter(foos.naming(d.namespace.as_deref().unwrap_or_default(), &d.name)))
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;
    use watcher::Event;

    use super::*;
    use crate::observe::queue_metrics::QueueMetrics;
    use crate::testing::FooFixture;

    /// What `backlog` lets in now, without waiting.
    fn let_in(backlog: &Arc<Backlog>) -> Vec<String> {
        let mut stream = Box::pin(backlog.clone().stream());
        std::iter::from_fn(|| stream.next().now_or_never().flatten()).map(|foo| foo.name).collect()
    }

    /// The Foos `events` trigger syncs of, each as the watch reported it
    /// (which Foo, by namespace and name, and which version of it), and
    /// their lanes.
    async fn lanes(events: Vec<Event<Foo>>) -> Vec<(Foo, Lane)> {
        let stream = changed_foos(futures::stream::iter(events.into_iter().map(Ok)));
        stream.map(Result::unwrap).collect().await
    }

    async fn triggered(events: Vec<Event<Foo>>) -> Vec<Foo> {
        lanes(events).await.into_iter().map(|(foo, _)| foo).collect()
    }

    #[tokio::test]
    async fn a_foo_is_synced_when_first_seen_and_when_its_spec_or_shard_labels_change_not_on_status() {
        let foo = Foo::test("a");
        let mut status_written = foo.clone();
        status_written.metadata.resource_version = Some("101".into());
        let relabelled = foo.clone().label("shard", "b");
        let edited = relabelled.clone().generation(2);
        let events = vec![
            Event::Apply(foo.clone()),
            Event::Apply(status_written),
            Event::Apply(relabelled.clone()),
            Event::Apply(edited.clone()),
        ];
        assert_eq!(triggered(events).await, [foo, relabelled, edited]);
    }

    #[tokio::test]
    async fn a_foo_that_leaves_the_shard_and_comes_back_is_synced_again_and_one_that_stayed_is_not() {
        let (a, b) = (Foo::test("a"), Foo::test("b"));
        // Its namesake in another namespace is another Foo.
        let mut elsewhere = a.clone();
        elsewhere.metadata.namespace = Some("other".into());
        let mut b_status_written = b.clone();
        b_status_written.metadata.resource_version = Some("101".into());
        let events = vec![
            Event::Apply(a.clone()),
            Event::Apply(b.clone()),
            Event::Apply(elsewhere.clone()),
            Event::Delete(a.clone()),
            Event::Apply(b_status_written),
            Event::Apply(elsewhere.clone()),
            Event::Apply(a.clone()),
        ];
        assert_eq!(triggered(events).await, [a.clone(), b, elsewhere, a]);
    }

    #[tokio::test]
    async fn a_relist_syncs_only_what_changed_or_came_back_and_forgets_what_it_no_longer_holds() {
        let (a, b) = (Foo::test("a"), Foo::test("b"));
        let events = vec![
            Event::Init,
            Event::InitApply(a.clone()),
            Event::InitApply(b.clone()),
            Event::InitDone,
            // A relist after a watch gap: a unchanged, b gone.
            Event::Init,
            Event::InitApply(a.clone()),
            Event::InitDone,
            Event::Apply(b.clone()),
            Event::Apply(a.clone()),
        ];
        assert_eq!(triggered(events).await, [a, b.clone(), b]);
    }

    #[tokio::test]
    async fn a_listed_foo_in_sync_waits_behind_an_unsynced_one_or_one_a_relist_finds_changed_and_a_watched_change_waits_for_none()
     {
        let mut synced = Foo::test("synced").generation(2);
        synced.status = Some(crate::api::foo::FooStatus { observed_generation: Some(2), ..Default::default() });
        let edited = synced.clone().generation(3);
        // Relabelled while the watch was down; its status still in sync.
        let relabelled = synced.clone().label("shard", "b");
        let new = Foo::test("new");
        let events = vec![
            Event::Init,
            Event::InitApply(synced.clone()),
            Event::InitApply(new.clone()),
            Event::InitDone,
            Event::Init,
            Event::InitApply(relabelled.clone()),
            Event::InitDone,
            Event::Apply(edited.clone()),
        ];
        let expected = [(synced, Lane::Later), (new, Lane::Soon), (relabelled, Lane::Soon), (edited, Lane::Now)];
        assert_eq!(lanes(events).await, expected);
    }

    #[tokio::test]
    async fn a_listed_deployment_sends_its_foo_to_the_backlog_and_a_changed_or_deleted_one_goes_now() {
        use crate::testing::DeploymentFixture;
        let [listed, changed, deleted] = ["a", "b", "c"].map(|name| DeploymentView::owned_by(&Foo::test(name)));
        let backlog = Arc::new(Backlog::new(1, Arc::new(QueueMetrics::default())));
        let events =
            [Event::Init, Event::InitApply(listed), Event::InitDone, Event::Apply(changed), Event::Delete(deleted)];
        let now = changed_deployments(futures::stream::iter(events.map(Ok)), backlog.clone());
        let now: Vec<String> = now.map(|d| d.unwrap().metadata.name.unwrap()).collect().await;
        assert_eq!(now, ["b", "c"], "the change and the deletion go now");
        assert_eq!(let_in(&backlog), ["a"], "the listed one waits");
    }
}
