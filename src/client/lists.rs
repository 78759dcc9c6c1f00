//! Paged lists that cost what the caches keep, not what the API server
//! sends. kube-runtime's watcher lists a page with kube's `Api::list`, which
//! holds the whole response as bytes and as text before it decodes a single
//! object: a page of 500 Foos with a megabyte of finalizers each held 500
//! MiB, and a replica started among a tenant's big objects peaked at 453
//! MiB where the same objects arriving by watch cost it 4. Streaming lists
//! (`--streaming-lists`) hand objects over one event at a time; paged lists
//! are what any API server serves, and what a bare run uses.
//!
//! So the caches' watches get a client of their own ([`decoding_lists`])
//! that answers a LIST by decoding the page as it streams in
//! ([`super::decode_streamed`]), into the type the cache decodes (which
//! skips what no sync reads: [`crate::api::wire`]), and hands kube-runtime
//! that page re-encoded: a few hundred bytes an object whatever the object
//! carries. Every other request (the watches) passes as it is; the requests
//! themselves are the same, on the same connections.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Method, Request, Response};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use kube::Client;
use kube::client::Body;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use tower::{BoxError, Service};

use super::decode_streamed;

/// A client that sends every request through `client` and answers a LIST
/// with its page as `K` decodes it, re-encoded: for a watch of `K` only.
pub(crate) fn decoding_lists<K>(client: &Client) -> Client
where
    K: DeserializeOwned + Serialize + Send + 'static,
{
    let default_namespace = client.default_namespace().to_owned();
    Client::new(DecodingLists::<K> { client: client.clone(), kind: PhantomData }, default_namespace)
}

/// A page of a list, as much of it as kube-runtime's watcher reads.
#[derive(Deserialize, Serialize)]
#[serde(rename_all = "camelCase", bound(deserialize = "K: Deserialize<'de>", serialize = "K: Serialize"))]
struct Page<K> {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kind: Option<String>,
    #[serde(default)]
    metadata: ListMeta,
    // An empty list's items come as `null` (Go's nil slice), not `[]`.
    #[serde(default, deserialize_with = "null_as_empty")]
    items: Vec<K>,
}

fn null_as_empty<'de, D: Deserializer<'de>, K: Deserialize<'de>>(d: D) -> Result<Vec<K>, D::Error> {
    Ok(Option::deserialize(d)?.unwrap_or_default())
}

/// True for the requests a watcher makes that are LISTs: a GET of a
/// collection without `watch`.
fn is_list<B>(request: &Request<B>) -> bool {
    let watch = request.uri().query().is_some_and(|q| q.split('&').any(|p| p.starts_with("watch=")));
    request.method() == Method::GET && !watch
}

struct DecodingLists<K> {
    client: Client,
    kind: PhantomData<fn() -> K>,
}

impl<K> Service<Request<Body>> for DecodingLists<K>
where
    K: DeserializeOwned + Serialize + Send + 'static,
{
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let client = self.client.clone();
        Box::pin(async move {
            let list = is_list(&request);
            let response = client.send(request).await?;
            if !list || response.status() != http::StatusCode::OK {
                return Ok(response);
            }
            let (mut parts, body) = response.into_parts();
            let page: Page<K> = decode_streamed(body).await?;
            let encoded = serde_json::to_vec(&page)?;
            parts.headers.remove(http::header::CONTENT_LENGTH);
            Ok(Response::from_parts(parts, Body::from(encoded)))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use futures::StreamExt;
    use kube::Api;
    use kube::runtime::watcher;
    use serde_json::json;

    use super::*;
    use crate::api::foo::Foo;
    use crate::api::wire::FooWire;
    use crate::testing::FooFixture;

    /// A client whose API server answers every LIST with `pages` in turn
    /// and every watch with an empty stream; the requests it saw.
    fn serving(pages: Vec<serde_json::Value>) -> (Client, Arc<Mutex<Vec<String>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (log, pages) = (seen.clone(), Arc::new(Mutex::new(pages.into_iter())));
        let service = tower::service_fn(move |request: Request<Body>| {
            let (log, pages) = (log.clone(), pages.clone());
            async move {
                log.lock().unwrap().push(request.uri().to_string());
                let body = match is_list(&request) {
                    true => serde_json::to_vec(&pages.lock().unwrap().next().expect("a page")).unwrap(),
                    false => Vec::new(),
                };
                Ok::<_, std::convert::Infallible>(Response::new(Body::from(body)))
            }
        });
        (Client::new(service, "default"), seen)
    }

    fn big_foo(name: &str) -> serde_json::Value {
        let mut foo = serde_json::to_value(Foo::test(name)).unwrap();
        foo["metadata"]["finalizers"] = json!(vec!["example.com/keep"; 20_000]);
        foo["metadata"]["annotations"] = json!({ "notes": "n".repeat(200_000) });
        foo
    }

    #[tokio::test]
    async fn a_listed_page_reaches_the_watcher_as_small_as_the_cache_keeps_it_and_every_page_is_followed() {
        let first = json!({ "apiVersion": "samplecontroller.k8s.io/v1alpha1", "kind": "FooList",
            "metadata": { "continue": "next", "resourceVersion": "7" }, "items": [big_foo("a"), big_foo("b")] });
        let last = json!({ "kind": "FooList", "metadata": { "resourceVersion": "7" }, "items": null });
        let (server, seen) = serving(vec![first, last]);
        let api: Api<FooWire> = Api::all(decoding_lists::<FooWire>(&server));
        let config = watcher::Config::default().page_size(2);
        let mut events = Box::pin(watcher::watcher(api, config));
        let mut listed = Vec::new();
        while let Some(event) = events.next().await {
            match event.expect("no error") {
                watcher::Event::InitApply(foo) => listed.push(Foo::from(foo)),
                watcher::Event::InitDone => break,
                _ => {}
            }
        }
        let names: Vec<_> = listed.iter().map(|f| f.metadata.name.clone().unwrap()).collect();
        assert_eq!(names, ["a", "b"]);
        assert!(listed.iter().all(|f| f.metadata.finalizers.is_none() && f.metadata.annotations.is_none()));
        assert_eq!(listed[0].spec, Foo::test("a").spec, "the spec as sent");
        let seen = seen.lock().unwrap();
        assert!(seen[1].contains("continue=next"), "the second page asked for: {seen:?}");
    }

    #[tokio::test]
    async fn a_page_reencoded_is_what_the_cache_decodes_from_the_page_as_sent() {
        let page = json!({ "kind": "FooList", "metadata": { "resourceVersion": "9" },
            "items": [big_foo("a"), serde_json::to_value(Foo::test("b").replicas(3)).unwrap()] });
        let decoded: Page<FooWire> = serde_json::from_value(page).unwrap();
        let again: Page<FooWire> = serde_json::from_slice(&serde_json::to_vec(&decoded).unwrap()).unwrap();
        let foos = |p: Page<FooWire>| p.items.into_iter().map(Foo::from).collect::<Vec<_>>();
        assert_eq!(again.metadata.resource_version.as_deref(), Some("9"));
        assert_eq!(foos(again), foos(decoded));
    }

    #[test]
    fn only_a_get_without_watch_is_a_list() {
        let request = |method: Method, uri: &str| Request::builder().method(method).uri(uri).body(()).unwrap();
        assert!(is_list(&request(Method::GET, "/apis/g/v1/foos?limit=500")));
        assert!(is_list(&request(Method::GET, "/apis/g/v1/foos")));
        assert!(!is_list(&request(Method::GET, "/apis/g/v1/foos?limit=500&watch=true&resourceVersion=1")));
        assert!(!is_list(&request(Method::GET, "/apis/g/v1/foos?watch=true")));
        assert!(!is_list(&request(Method::POST, "/apis/g/v1/foos")));
    }
}
