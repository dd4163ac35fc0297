//! Waiting for a condition with a deadline, polling at a short interval.

use std::time::{Duration, Instant};

/// Polls `check` every 20 ms until it returns `Some`, or panics with `what` and the last observation after
/// `deadline`.
pub fn wait_until<T>(what: &str, deadline: Duration, mut check: impl FnMut() -> Result<T, String>) -> T {
    let start = Instant::now();
    loop {
        let last = match check() {
            Ok(v) => return v,
            Err(e) => e,
        };
        if start.elapsed() > deadline {
            panic!("timed out after {deadline:?} waiting for {what}; last observation: {last}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
