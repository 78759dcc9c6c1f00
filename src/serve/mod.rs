//! Serving metrics and probes: the HTTP endpoints ([`http`]), their TLS
//! ([`tls`]) and who may read `/metrics` ([`metrics_auth`]). Knows no Foo.

pub(crate) mod http;
pub(crate) mod metrics_auth;
pub(crate) mod tls;
