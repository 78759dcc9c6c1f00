//! How many Foos a replica's memory limit holds, and saying so before the
//! kernel does. A replica's memory grows with the Foos it caches (each with
//! its Deployment), not with what is written in them (`crate::cache`), and
//! its highest point is a start or a takeover syncing every one of them:
//! [`PEAK_PER_FOO`] each above [`PEAK_BASE`]. Where the container has a
//! memory limit (its cgroup's, or `--memory-limit`), the Foos it holds are
//! a gauge beside the Foos cached (`sample_controller_memory_limit_foos`,
//! `sample_controller_cached_foos`); past it, a WARN, and the alert
//! SampleControllerMemoryLimitTooLow, while the replica still runs: the
//! next restart's peak would not fit (docs/sizing.md).

use std::path::Path;

/// A replica's peak with no Foo: the process, its runtime, its clients'
/// buffers and TLS, the metrics server (measured: docs/sizing.md).
pub const PEAK_BASE: u64 = 24 << 20;
/// What each Foo and its Deployment add to a replica's peak: at rest,
/// about 1.1 to 1.5 KiB (keys, stores, indices); at the peak of a start
/// that syncs every Foo, up to 1.3 times that (docs/sizing.md).
pub const PEAK_PER_FOO: u64 = 2 << 10;

/// The Foos a replica whose memory is limited to `limit` bytes holds at its
/// peak.
pub(crate) fn foos_held(limit: u64) -> u64 {
    limit.saturating_sub(PEAK_BASE) / PEAK_PER_FOO
}

/// This process's memory limit, from its cgroup (v2, else v1); `None`
/// when it has none.
pub(crate) fn cgroup_memory_limit() -> Option<u64> {
    let read = |path: &str| std::fs::read_to_string(Path::new(path)).ok();
    let own = read("/proc/self/cgroup").and_then(|c| unified_path(&c).map(str::to_owned));
    // A container's own cgroup is the root of its cgroup namespace.
    let v2 = own.iter().map(|p| format!("/sys/fs/cgroup{}/memory.max", p.trim_end_matches('/')));
    v2.chain(["/sys/fs/cgroup/memory.max".to_owned()])
        .find_map(|path| read(&path))
        .map(|text| v2_limit(&text))
        .or_else(|| read("/sys/fs/cgroup/memory/memory.limit_in_bytes").map(|text| v1_limit(&text)))
        .flatten()
}

/// The cgroup v2 path in `/proc/self/cgroup` (its `0::` line).
fn unified_path(proc_cgroup: &str) -> Option<&str> {
    proc_cgroup.lines().find_map(|line| line.strip_prefix("0::"))
}

/// cgroup v2's `memory.max`: bytes, or `max` for none.
fn v2_limit(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// cgroup v1's `memory.limit_in_bytes`: bytes, or a page-rounded
/// `i64::MAX` for none.
fn v1_limit(text: &str) -> Option<u64> {
    text.trim().parse().ok().filter(|&bytes: &u64| bytes < 1 << 62)
}

/// Where a replica stands against its memory limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fit {
    /// No limit known.
    Unlimited,
    /// The Foos cached fit: the limit holds this many.
    Holds(u64),
    /// More Foos cached than the limit holds at a peak.
    Over(u64),
}

impl Fit {
    pub(crate) fn of(cached: usize, limit: Option<u64>) -> Fit {
        match limit.map(foos_held) {
            None => Fit::Unlimited,
            Some(held) if cached as u64 > held => Fit::Over(held),
            Some(held) => Fit::Holds(held),
        }
    }
}

/// A memory quantity as Kubernetes writes one (`128Mi`, `1G`, `134217728`),
/// for `--memory-limit`.
pub(crate) fn parse_quantity(text: &str) -> Result<u64, String> {
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, suffix) = text.split_at(split);
    let factor: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        other => return Err(format!("unknown unit {other:?}: use bytes or Ki, Mi, Gi, Ti, k, M, G, T")),
    };
    let n: u64 = digits.parse().map_err(|_| format!("{text:?} is not a memory quantity such as 128Mi"))?;
    n.checked_mul(factor).filter(|&b| b > 0).ok_or_else(|| format!("{text:?} is out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deploys_limit_holds_tens_of_thousands_of_foos_and_a_limit_below_the_base_none() {
        assert_eq!(foos_held(128 << 20), (104 << 20) / 2048);
        assert_eq!(foos_held(PEAK_BASE), 0);
        assert_eq!(foos_held(1 << 20), 0);
    }

    #[test]
    fn a_cgroups_limit_is_read_in_either_version_and_none_is_none() {
        assert_eq!(v2_limit("134217728\n"), Some(128 << 20));
        assert_eq!(v2_limit("max\n"), None);
        assert_eq!(v1_limit("134217728\n"), Some(128 << 20));
        assert_eq!(v1_limit("9223372036854771712\n"), None, "v1's unlimited");
        let proc = "12:memory:/kubepods/pod1\n0::/kubepods.slice/pod1/c1\n";
        assert_eq!(unified_path(proc), Some("/kubepods.slice/pod1/c1"));
        assert_eq!(unified_path("4:memory:/docker/abc\n"), None, "v1 only");
    }

    #[test]
    fn past_the_foos_its_limit_holds_a_replica_is_over() {
        let limit = Some(PEAK_BASE + 10 * PEAK_PER_FOO);
        assert_eq!(Fit::of(10, limit), Fit::Holds(10));
        assert_eq!(Fit::of(11, limit), Fit::Over(10));
        assert_eq!(Fit::of(1_000_000, None), Fit::Unlimited);
    }

    #[test]
    fn a_memory_limit_is_written_as_kubernetes_writes_it() {
        assert_eq!(parse_quantity("128Mi"), Ok(128 << 20));
        assert_eq!(parse_quantity("1G"), Ok(1_000_000_000));
        assert_eq!(parse_quantity("4096"), Ok(4096));
        assert!(parse_quantity("128MB").unwrap_err().contains("unknown unit"));
        assert!(parse_quantity("Mi").is_err() && parse_quantity("0").is_err());
        assert!(parse_quantity("99999999999Ti").unwrap_err().contains("out of range"));
    }
}
