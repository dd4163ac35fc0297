//! The standard `process_*` metrics of this process, read from Linux's `/proc/self` at scrape time: CPU
//! seconds, resident and virtual memory, open and maximum file descriptors, start time. A figure that cannot be
//! read (no `/proc`) is left out of the scrape, never reported as zero. Must not depend on the store.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// The `process_*` collector.
#[derive(Debug, Clone, Copy)]
pub struct ProcessCollector;

/// What `/proc/self/stat` gives (fields after the command name).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stat {
    /// User plus system CPU time, in seconds.
    pub cpu_seconds: f64,
    /// Start time after boot, in seconds.
    pub start_after_boot_seconds: f64,
    /// Virtual memory size, in bytes.
    pub virtual_bytes: u64,
    /// Resident pages.
    pub rss_pages: u64,
}

/// Clock ticks per second of `/proc` times: Linux reports them in USER_HZ, which is 100 on every
/// architecture Linux supports.
const USER_HZ: f64 = 100.0;

/// Parses `/proc/<pid>/stat` (see proc(5)): the command name is in parentheses and may hold spaces, so
/// fields are counted after its closing parenthesis.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After ")": state is field 3 of proc(5), so field n is f[n - 3].
    let field = |n: usize| f.get(n - 3).and_then(|v| v.parse::<u64>().ok());
    Some(Stat {
        cpu_seconds: (field(14)? + field(15)?) as f64 / USER_HZ,
        start_after_boot_seconds: field(22)? as f64 / USER_HZ,
        virtual_bytes: field(23)?,
        rss_pages: field(24)?,
    })
}

fn boot_time_seconds() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines().find_map(|l| l.strip_prefix("btime ")).and_then(|v| v.trim().parse().ok())
}

fn max_fds() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

fn open_fds() -> Option<u64> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as u64)
}

/// Resident memory from `VmRSS` of `/proc/self/status` (in kB, so no page size is needed).
fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: u64 = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.split_whitespace().next()?.parse().ok()?;
    Some(kb * 1024)
}

fn gauge_f64(enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: f64) -> Result<(), std::fmt::Error> {
    let g = ConstGauge::new(v);
    g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok().as_deref().and_then(parse_stat);
        if let Some(s) = stat {
            let c = ConstCounter::new(s.cpu_seconds);
            c.encode(enc.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                c.metric_type(),
            )?)?;
            gauge_f64(
                &mut enc,
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                s.virtual_bytes as f64,
            )?;
            if let Some(boot) = boot_time_seconds() {
                gauge_f64(
                    &mut enc,
                    "process_start_time_seconds",
                    "Start time of the process since unix epoch in seconds",
                    boot as f64 + s.start_after_boot_seconds,
                )?;
            }
        }
        if let Some(rss) = rss_bytes() {
            gauge_f64(&mut enc, "process_resident_memory_bytes", "Resident memory size in bytes", rss as f64)?;
        }
        if let Some(n) = open_fds() {
            gauge_f64(&mut enc, "process_open_fds", "Number of open file descriptors", n as f64)?;
        }
        if let Some(n) = max_fds() {
            gauge_f64(&mut enc, "process_max_fds", "Maximum number of open file descriptors", n as f64)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        // A command name with spaces and parentheses; utime 250 + stime 50 ticks, start 1000 ticks, 8 MiB, 300 pages.
        let line = "4242 (my (odd) cmd) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 1000 8388608 300 \
                    18446744073709551615";
        let s = parse_stat(line).expect("parsed");
        assert_eq!(
            s,
            Stat { cpu_seconds: 3.0, start_after_boot_seconds: 10.0, virtual_bytes: 8 << 20, rss_pages: 300 }
        );
        assert_eq!(parse_stat("garbage"), None);
    }
}
