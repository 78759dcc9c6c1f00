//! The Kubernetes client every part of the operator shares: it names itself
//! (`User-Agent: sample-controller/<version>`, so the API server's audit log
//! and API Priority and Fairness can tell it apart) and counts every request
//! as client-go's `rest_client_requests_total{code,method,host}`.

use std::task::{Context, Poll};

use futures::FutureExt;
use futures::future::BoxFuture;
use http::{Request, Response};
use kube::client::{Body, ClientBuilder};
use kube::{Client, Config};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tower::{Layer, Service};

use crate::constants::USER_AGENT;
use crate::metrics::RestLabels;
use crate::{Error, Result};

/// A client for `config`, counting its requests into `requests`.
pub fn build(mut config: Config, requests: Family<RestLabels, Counter>) -> Result<Client> {
    config.headers.push((http::header::USER_AGENT, http::HeaderValue::from_static(USER_AGENT)));
    let host = config.cluster_url.authority().map(|a| a.to_string()).unwrap_or_default();
    let builder = ClientBuilder::try_from(config).map_err(Error::Client)?;
    Ok(builder.with_layer(&CountRequests { requests, host }).build())
}

/// Counts each request by response code (`<error>` when none came, as
/// client-go), method and API server.
struct CountRequests {
    requests: Family<RestLabels, Counter>,
    host: String,
}

impl<S> Layer<S> for CountRequests {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted { inner, requests: self.requests.clone(), host: self.host.clone() }
    }
}

struct Counted<S> {
    inner: S,
    requests: Family<RestLabels, Counter>,
    host: String,
}

impl<S, B> Service<Request<Body>> for Counted<S>
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Future: Send + 'static,
{
    type Response = Response<B>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response<B>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let method = request.method().to_string();
        let (requests, host) = (self.requests.clone(), self.host.clone());
        self.inner
            .call(request)
            .map(move |response| {
                let code = response.as_ref().map_or_else(|_| "<error>".to_owned(), |r| r.status().as_u16().to_string());
                requests.get_or_create(&RestLabels { code, method, host }).inc();
                response
            })
            .boxed()
    }
}
