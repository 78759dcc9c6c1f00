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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::metric_value;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A one-request HTTP server on loopback: answers 200 and hands back
    /// the request head it read.
    async fn one_request_server() -> (String, tokio::task::JoinHandle<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let served = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = conn.read(&mut buf).await.unwrap();
                head.extend_from_slice(&buf[..n]);
            }
            conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok").await.unwrap();
            String::from_utf8_lossy(&head).into_owned()
        });
        (addr, served)
    }

    #[tokio::test]
    async fn every_request_names_the_operator_and_is_counted_by_code_and_method() {
        let (addr, served) = one_request_server().await;
        let requests = Family::<RestLabels, Counter>::default();
        let client = build(Config::new(format!("http://{addr}").parse().unwrap()), requests.clone()).unwrap();
        let get = || http::Request::get("/healthz").body(Vec::new()).unwrap();
        assert_eq!(client.request_text(get()).await.unwrap(), "ok");
        let head = served.await.unwrap().to_ascii_lowercase();
        assert!(head.contains(&format!("\r\nuser-agent: {USER_AGENT}\r\n")), "{head}");
        // The server is gone: no response, counted as client-go does.
        assert!(client.request_text(get()).await.is_err());

        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("rest_client_requests", "", requests);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let series = |code: &str| format!(r#"rest_client_requests_total{{code="{code}",method="GET",host="{addr}"}}"#);
        assert_eq!(metric_value(&text, &series("200")), Some(1.0), "{text}");
        assert_eq!(metric_value(&text, &series("<error>")), Some(1.0), "{text}");
    }
}
