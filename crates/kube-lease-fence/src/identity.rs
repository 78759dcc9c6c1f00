//! Who a candidate is.

use k8s_openapi::jiff::Timestamp;

/// A process-unique identity: the pod name (the variable `pod_name_env`,
/// set from the downward API, which the API server's fence needs; else HOSTNAME, the pod
/// name in most pods, but not with `hostNetwork`, `spec.hostname` or a name
/// over 63 characters; else `fallback`), then `_`,
/// the process id and the start time, so a restarted container never
/// mistakes its predecessor's Lease for its own. Pod names have no `_`, so
/// the API server's fence can tell the pod from the rest.
pub fn default_identity(pod_name_env: &str, fallback: &str) -> String {
    let named = |var: &str| std::env::var(var).ok().filter(|h| !h.is_empty());
    let pod = named(pod_name_env).or_else(|| named("HOSTNAME")).unwrap_or_else(|| fallback.into());
    let nanos = Timestamp::now().as_nanosecond();
    format!("{pod}_{:x}{:x}", std::process::id(), nanos & 0xffff_ffff)
}
