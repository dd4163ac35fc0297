//! Output of a scenario: a small aligned table, then the `RESULT <scenario> <value> <unit>` line that scripts
//! and the smoke test parse; the median of repeated runs; the error type of the benchmarks.
//! Must not depend on any scenario.

use std::fmt::Write as _;

/// Why a benchmark could not run or finish.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BenchError {
    /// The `shoal` binary or a daemon could not be started or did not become ready.
    #[error("daemon: {0}")]
    Daemon(String),
    /// A request the benchmark makes failed.
    #[error("request failed: {0}")]
    Request(String),
    /// The system under test did not reach the expected state in time.
    #[error("timed out: {0}")]
    Timeout(String),
    /// A local resource (runtime, temp dir, file descriptors) was not available, or a flag is out of range.
    #[error("setup: {0}")]
    Setup(String),
}

/// A table printed before the RESULT line.
#[derive(Debug, Default)]
pub(crate) struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column names.
    pub(crate) fn new(header: &[&str]) -> Table {
        Table { header: header.iter().map(|s| s.to_string()).collect(), rows: Vec::new() }
    }

    /// Adds a row (as many cells as columns).
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Renders with columns padded to their widest cell.
    pub(crate) fn render(&self) -> String {
        let cols = self.header.len();
        let mut width = vec![0usize; cols];
        for r in std::iter::once(&self.header).chain(&self.rows) {
            for (i, c) in r.iter().enumerate().take(cols) {
                width[i] = width[i].max(c.len());
            }
        }
        let mut out = String::new();
        for r in std::iter::once(&self.header).chain(&self.rows) {
            let line: Vec<String> =
                r.iter().enumerate().take(cols).map(|(i, c)| format!("{c:<w$}", w = width[i])).collect();
            let _ = writeln!(out, "{}", line.join("  ").trim_end());
        }
        out
    }
}

/// Prints the table, then the RESULT line (last).
pub(crate) fn finish(table: &Table, scenario: &str, value: f64, unit: &str) {
    print!("{}", table.render());
    println!("{}", result_line(scenario, value, unit));
}

/// `RESULT <scenario> <value> <unit>`, the value with up to 3 decimals.
pub(crate) fn result_line(scenario: &str, value: f64, unit: &str) -> String {
    format!("RESULT {scenario} {} {unit}", fmt_num(value))
}

/// A number with at most 3 decimals and no trailing zeros.
pub(crate) fn fmt_num(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() || s == "-" {
        "0".to_string()
    } else {
        s.to_string()
    }
}

/// The median of `values` (the mean of the middle two for an even count); 0 for none.
pub(crate) fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The `p`-quantile (0..=1) of sorted `values`, nearest rank; 0 for none.
pub(crate) fn quantile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    #[expect(clippy::cast_possible_truncation, reason = "p is in 0..=1, so the rank is at most the length")]
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// A multi-threaded tokio runtime for a scenario.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, BenchError> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| BenchError::Setup(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_medians() {
        assert_eq!(fmt_num(2.0), "2");
        assert_eq!(fmt_num(0.1234), "0.123");
        assert_eq!(fmt_num(1500.5), "1500.5");
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0], 0.5), 2.0);
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0], 0.99), 4.0);
        assert_eq!(result_line("startup", 12.5, "ms"), "RESULT startup 12.5 ms");
    }

    #[test]
    fn table_aligns_columns() {
        let mut t = Table::new(&["a", "long header"]);
        t.row(vec!["wide cell".into(), "x".into()]);
        assert_eq!(t.render(), "a          long header\nwide cell  x\n");
    }
}
