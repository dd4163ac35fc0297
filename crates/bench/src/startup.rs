//! `startup`: time from spawning `shoal daemon` to its control socket answering `GET /_ping`, polled every
//! 0.2 ms, in two cases: a first start on a fresh state dir (node identity, root CA and certificates made and
//! written, Raft log created and the cluster bootstrapped through it) and a restart of a daemon stopped with
//! SIGTERM (everything read back from its state dir). RESULT: the median first start over `--runs` daemons.
//! Must not depend on the daemon's internals.

use std::path::Path;

use crate::daemon::BenchDaemon;
use crate::report::{self, fmt_num, BenchError, Table};

/// Flags of `startup`.
#[derive(Debug, clap::Args)]
pub(crate) struct StartupArgs {
    /// Daemons started one after another (each first start is followed by one restart); RESULT is the
    /// median first start.
    #[arg(long, default_value_t = 11)]
    runs: usize,
    /// A size that runs in seconds (3 runs).
    #[arg(long)]
    smoke: bool,
}

fn row(table: &mut Table, what: &str, times: &[f64]) -> f64 {
    let mut sorted = times.to_vec();
    sorted.sort_by(|x, y| x.total_cmp(y));
    let med = report::median(times);
    table.row(vec![
        what.to_string(),
        times.len().to_string(),
        fmt_num(sorted[0]),
        fmt_num(med),
        fmt_num(sorted[sorted.len() - 1]),
    ]);
    med
}

/// Runs the scenario.
pub(crate) fn run(a: StartupArgs, shoal: &Path) -> Result<(), BenchError> {
    let runs = if a.smoke { 3 } else { a.runs.max(1) };
    let mut first = Vec::new();
    let mut restart = Vec::new();
    for _ in 0..runs {
        let mut d = BenchDaemon::start(shoal)?;
        first.push(d.ready_after.as_secs_f64() * 1000.0);
        d.restart()?;
        restart.push(d.ready_after.as_secs_f64() * 1000.0);
    }
    let mut table = Table::new(&["start", "runs", "min ms", "median ms", "max ms"]);
    let med = row(&mut table, "first (fresh state dir)", &first);
    row(&mut table, "restart (same state dir)", &restart);
    report::finish(&table, "startup", med, "ms");
    Ok(())
}
