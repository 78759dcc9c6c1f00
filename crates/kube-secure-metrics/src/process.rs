//! client-go's (Prometheus') process metrics, read from /proc at scrape
//! time: `process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! `process_virtual_memory_bytes`, `process_virtual_memory_max_bytes`,
//! `process_open_fds`, `process_max_fds`, `process_start_time_seconds`.

/// The collector, to register in a `prometheus_client` registry
/// (`register_collector`). Nothing is reported where /proc is missing.
#[derive(Debug)]
pub struct ProcessMetrics;

/// Linux's USER_HZ: the unit of times in /proc/self/stat.
const TICKS_PER_SECOND: f64 = 100.0;

impl prometheus_client::collector::Collector for ProcessMetrics {
    fn encode(&self, mut encoder: prometheus_client::encoding::DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        let Some(p) = ProcStat::read() else { return Ok(()) };
        let cpu = ConstCounter::new(p.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            cpu.metric_type(),
        )?)?;
        let gauges = [
            ("process_resident_memory_bytes", "Resident memory size in bytes.", p.resident_bytes),
            ("process_virtual_memory_bytes", "Virtual memory size in bytes.", p.virtual_bytes),
            (
                "process_virtual_memory_max_bytes",
                "Maximum amount of virtual memory available in bytes.",
                p.max_virtual_bytes,
            ),
            ("process_open_fds", "Number of open file descriptors.", p.open_fds),
            ("process_max_fds", "Maximum number of open file descriptors.", p.max_fds),
            ("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", p.start_time),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

struct ProcStat {
    cpu_seconds: f64,
    resident_bytes: f64,
    virtual_bytes: f64,
    max_virtual_bytes: f64,
    open_fds: f64,
    max_fds: f64,
    start_time: f64,
}

impl ProcStat {
    fn read() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name, which may hold spaces: state is field 3.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3)?.parse::<f64>().ok();
        let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
        let boot_time = std::fs::read_to_string("/proc/stat")
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<f64>().ok())?;
        Some(ProcStat {
            cpu_seconds: (field(14)? + field(15)?) / TICKS_PER_SECOND,
            virtual_bytes: field(23)?,
            // VmRSS is in kB whatever the page size (4 KiB on x86-64, often
            // 64 KiB on arm64), where stat's rss counts pages.
            resident_bytes: resident_kib()? * 1024.0,
            start_time: boot_time + field(22)? / TICKS_PER_SECOND,
            max_virtual_bytes: soft_limit(&limits, "Max address space")?,
            open_fds: std::fs::read_dir("/proc/self/fd").map(|d| d.count() as f64).unwrap_or(0.0),
            max_fds: soft_limit(&limits, "Max open files")?,
        })
    }
}

/// The soft limit named `name` in /proc/self/limits; "unlimited" as the
/// largest u64, as client-go's collector (Prometheus' procfs) reports it.
fn soft_limit(limits: &str, name: &str) -> Option<f64> {
    let soft = limits.lines().find_map(|l| l.strip_prefix(name))?.split_whitespace().next()?;
    if soft == "unlimited" { Some(u64::MAX as f64) } else { soft.parse().ok() }
}

fn resident_kib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value in kB from a /proc file's `name:` line.
    fn kib(file: &str, name: &str) -> f64 {
        let text = std::fs::read_to_string(file).unwrap();
        text.lines().find_map(|l| l.strip_prefix(name)?.trim().strip_suffix("kB")?.trim().parse().ok()).unwrap()
    }

    #[test]
    fn resident_memory_is_in_bytes_whatever_the_page_size() {
        // statm counts pages; the kernel's page size comes from smaps, read
        // first: reading smaps allocates, and the two readings compared
        // must come back to back.
        let page_bytes = kib("/proc/self/smaps", "KernelPageSize:") * 1024.0;
        let ours = resident_kib().unwrap() * 1024.0;
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
        let pages: f64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
        let theirs = pages * page_bytes;
        // Read a moment apart: equal within a MiB (a unit error is a factor
        // of 1024, or of the page size).
        assert!((ours - theirs).abs() < 1024.0 * 1024.0, "ours {ours} B, statm's {theirs} B");
    }

    #[test]
    fn limits_are_the_soft_ones_and_unlimited_is_the_largest_u64() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units
Max address space         unlimited            unlimited            bytes
Max open files            1024                 1048576              files
";
        assert_eq!(soft_limit(limits, "Max open files"), Some(1024.0));
        assert_eq!(soft_limit(limits, "Max address space"), Some(u64::MAX as f64));
        assert_eq!(soft_limit(limits, "Max processes"), None);
        let read = ProcStat::read().unwrap();
        assert!(read.max_fds >= read.open_fds && read.max_fds > 0.0, "{} of {}", read.open_fds, read.max_fds);
    }

    #[test]
    fn cpu_time_grows_with_work_in_seconds() {
        let before = ProcStat::read().unwrap().cpu_seconds;
        // Ticks are 10 ms: work until 100 ms show, however busy the machine
        // (wall time would count the other processes' turns too).
        let start = std::time::Instant::now();
        let spent = loop {
            std::hint::black_box((0..100_000u64).sum::<u64>());
            let spent = ProcStat::read().unwrap().cpu_seconds - before;
            if spent >= 0.1 || start.elapsed() > std::time::Duration::from_secs(10) {
                break spent;
            }
        };
        assert!((0.1..5.0).contains(&spent), "{spent} s of CPU after {:?} of work", start.elapsed());
    }
}
