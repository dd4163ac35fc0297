//! `idle`: the CPU an idle one-node `shoal daemon` (manager and worker, no services) uses, in clock ticks
//! (utime + stime of the whole process, 1/100 s each) per 120 s and as a share of one core. Each run starts a
//! fresh daemon, lets its start-up settle for `SETTLE`, then reads the process's CPU time before and after
//! `--seconds` of idling. SwarmKit's swarmd measured 27-29 ticks per 120 s on this machine (0.225% of a core).
//! Must not depend on the daemon's internals.

use std::path::Path;
use std::time::Duration;

use crate::daemon::BenchDaemon;
use crate::procstat;
use crate::report::{self, fmt_num, BenchError, Table};

/// Time left to start-up work (the first certificate and session set-up, the first heartbeats) before the
/// measured window opens.
pub(crate) const SETTLE: Duration = Duration::from_secs(5);

/// Flags of `idle`.
#[derive(Debug, clap::Args)]
pub(crate) struct IdleArgs {
    /// Length of the measured window, in seconds.
    #[arg(long, default_value_t = 120)]
    seconds: u64,
    /// Runs (a fresh daemon each); RESULT is the median.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// A size that runs in seconds (1 s to settle, a 2 s window, 1 run).
    #[arg(long)]
    smoke: bool,
}

/// Runs the scenario.
pub(crate) fn run(a: IdleArgs, shoal: &Path) -> Result<(), BenchError> {
    let (settle, seconds, runs) =
        if a.smoke { (Duration::from_secs(1), 2, 1) } else { (SETTLE, a.seconds.max(1), a.runs.max(1)) };
    let mut table = Table::new(&["run", "window s", "CPU ms", "ticks per 120 s", "% of a core"]);
    let mut figures = Vec::new();
    for r in 1..=runs {
        let daemon = BenchDaemon::start(shoal)?;
        std::thread::sleep(settle);
        let before = procstat::process_cpu_seconds(daemon.pid())?;
        std::thread::sleep(Duration::from_secs(seconds));
        let used = procstat::process_cpu_seconds(daemon.pid())? - before;
        let per_120_s = used * 100.0 * 120.0 / seconds as f64;
        table.row(vec![
            r.to_string(),
            seconds.to_string(),
            fmt_num(used * 1000.0),
            fmt_num(per_120_s),
            fmt_num(used * 100.0 / seconds as f64),
        ]);
        figures.push(per_120_s);
    }
    report::finish(&table, "idle", report::median(&figures), "ticks/120s");
    Ok(())
}
