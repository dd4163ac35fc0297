//! `startup`: time from spawning `shoal daemon` on a fresh state dir (first start: node identity, Raft log
//! created and the cluster bootstrapped through it) to its control socket answering `GET /_ping`, polled
//! every 0.2 ms. RESULT: the median over `--runs` daemons.
//! Must not depend on the daemon's internals.

use std::path::Path;

use crate::daemon::BenchDaemon;
use crate::report::{self, fmt_num, BenchError, Table};

/// Flags of `startup`.
#[derive(Debug, clap::Args)]
pub struct StartupArgs {
    /// Daemons started one after another; RESULT is the median.
    #[arg(long, default_value_t = 11)]
    runs: usize,
    /// A size that runs in seconds (3 runs).
    #[arg(long)]
    smoke: bool,
}

/// Runs the scenario.
pub fn run(a: StartupArgs, shoal: &Path) -> Result<(), BenchError> {
    let runs = if a.smoke { 3 } else { a.runs.max(1) };
    let mut times = Vec::new();
    for _ in 0..runs {
        let d = BenchDaemon::start(shoal)?;
        times.push(d.ready_after.as_secs_f64() * 1000.0);
    }
    let mut sorted = times.clone();
    sorted.sort_by(|x, y| x.total_cmp(y));
    let mut table = Table::new(&["runs", "min ms", "median ms", "max ms"]);
    let med = report::median(&times);
    table.row(vec![runs.to_string(), fmt_num(sorted[0]), fmt_num(med), fmt_num(sorted[sorted.len() - 1])]);
    report::finish(&table, "startup", med, "ms");
    Ok(())
}
