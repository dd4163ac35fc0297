//! Process figures from Linux's /proc: resident memory (VmRSS, and its anonymous and file-backed parts) and CPU time
//! (utime + stime) of a PID or one of its threads, and raising this process's open-file limit. Must not depend on any
//! scenario.

use crate::report::BenchError;

/// Resident set size of `pid` in KiB (VmRSS of /proc/<pid>/status).
pub(crate) fn rss_kib(pid: i32) -> Result<u64, BenchError> {
    status_kib(pid, "VmRSS")
}

/// The two parts of the resident set of `pid`, in KiB: anonymous memory (heap, stacks: RssAnon) and
/// file-backed pages (the mapped binary and libraries: RssFile).
pub(crate) fn rss_parts_kib(pid: i32) -> Result<(u64, u64), BenchError> {
    Ok((status_kib(pid, "RssAnon")?, status_kib(pid, "RssFile")?))
}

fn status_kib(pid: i32, field: &str) -> Result<u64, BenchError> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).map_err(|e| BenchError::Setup(format!("read {path}: {e}")))?;
    text.lines()
        .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| BenchError::Setup(format!("no {field} in {path}")))
}

/// CPU time (user + system) thread `tid` of process `pid` has used, in seconds.
pub(crate) fn thread_cpu_seconds(pid: i32, tid: i32) -> Result<f64, BenchError> {
    stat_cpu_seconds(&format!("/proc/{pid}/task/{tid}/stat"))
}

/// CPU time (user + system) all threads of process `pid` have used, in seconds.
pub(crate) fn process_cpu_seconds(pid: i32) -> Result<f64, BenchError> {
    stat_cpu_seconds(&format!("/proc/{pid}/stat"))
}

fn stat_cpu_seconds(path: &str) -> Result<f64, BenchError> {
    let text = std::fs::read_to_string(path).map_err(|e| BenchError::Setup(format!("read {path}: {e}")))?;
    // The command name (field 2) may hold spaces; fields after its closing parenthesis are plain.
    let rest = text.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ')': state is field 3, so utime (14) and stime (15) are at offsets 11 and 12.
    let parse = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
    let (Some(utime), Some(stime)) = (parse(11), parse(12)) else {
        return Err(BenchError::Setup(format!("cannot parse {path}")));
    };
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100).max(1);
    Ok((utime + stime) as f64 / ticks as f64)
}

/// Raises the soft open-file limit to the hard limit (many sockets for simulated agents). Returns the new
/// soft limit.
pub(crate) fn raise_nofile_limit() -> Result<u64, BenchError> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(|e| BenchError::Setup(format!("getrlimit: {e}")))?;
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(|e| BenchError::Setup(format!("setrlimit: {e}")))?;
    Ok(hard)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_process() {
        let pid = std::process::id() as i32;
        assert!(rss_kib(pid).unwrap() > 0);
        let (anon, file) = rss_parts_kib(pid).unwrap();
        assert!(anon > 0 && file > 0);
        assert!(thread_cpu_seconds(pid, pid).unwrap() >= 0.0);
        assert!(rss_kib(i32::MAX).is_err());
    }
}
