//! Serving metrics and probes: the HTTP endpoints ([`http`]), their TLS
//! ([`tls`]) and who may read `/metrics` ([`metrics_auth`]). Knows no Foo.

pub mod http;
pub mod metrics_auth;
pub mod tls;
