//! How the elector watches its Lease and its fence: through [`Watches`],
//! which the user may pace as it paces its other watches.

use std::fmt::Debug;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

/// Opens the elector's watches. The events of a watch narrowed to one
/// object's name; errors are passed on, and the stream retries them at its
/// own pace, for ever.
pub trait Watches: Clone + Send + Sync + 'static {
    /// A watch of `api`'s objects as `config` narrows them.
    fn watch<K>(&self, api: Api<K>, config: watcher::Config) -> BoxStream<'static, watcher::Result<watcher::Event<K>>>
    where
        K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static;
}

/// kube-runtime's `watcher` with its default backoff.
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultBackoff;

impl Watches for DefaultBackoff {
    fn watch<K>(&self, api: Api<K>, config: watcher::Config) -> BoxStream<'static, watcher::Result<watcher::Event<K>>>
    where
        K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    {
        watcher(api, config).default_backoff().boxed()
    }
}

/// The one object a watch narrowed to a name follows, after each change:
/// `Ok(None)` while there is none. Nothing is yielded before the watch's
/// first full list; errors are passed on (the watch retries them, as
/// the [`Watches`] pace them).
pub(crate) fn states<K, W: Watches>(
    watches: &W,
    api: Api<K>,
    wc: watcher::Config,
) -> impl Stream<Item = Result<Option<K>, watcher::Error>> + Send + use<K, W>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let mut listing = None;
    watches.watch(api, wc).filter_map(move |ev| {
        let state = match ev {
            Ok(watcher::Event::Init) => {
                listing = None;
                None
            }
            Ok(watcher::Event::InitApply(obj)) => {
                listing = Some(obj);
                None
            }
            Ok(watcher::Event::InitDone) => Some(Ok(listing.take())),
            Ok(watcher::Event::Apply(obj)) => Some(Ok(Some(obj))),
            Ok(watcher::Event::Delete(_)) => Some(Ok(None)),
            Err(e) => Some(Err(e)),
        };
        std::future::ready(state)
    })
}
