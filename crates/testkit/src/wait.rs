//! Waiting for a condition with a deadline, polling at a short interval: the one copy of this helper in the
//! tree. A check returns `Ok(value)` once the condition holds, else `Err(what it saw)`. `wait_until` (a
//! thread; every 20 ms) and `wait_until_every` (another interval) block and panic at the deadline with the
//! description, the deadline and the last observation; in a tokio test, `wait_until_async` sleeps between
//! polls and reads its deadline in tokio time (a test on a paused clock waits in its own time), and
//! `await_until` does so with a check that awaits. `poll_until` and `poll_until_async` return the last
//! observation instead of panicking, for a caller that adds to the failure (a log, a kill). `holds` makes a
//! check of a boolean condition.
//!
//! The tests of the crates this one depends on (raft, manager, agent, netplane) cannot depend on it without a
//! cycle, so they include this file by path (`#[path = "../../testkit/src/wait.rs"]`) instead of copying it.
//! Hence it must use nothing but std and tokio's `time`, and name no workspace crate. Its tests are in
//! `wait_tests.rs`.

use std::future::Future;
use std::time::{Duration, Instant};

/// How often `wait_until` polls.
pub const POLL: Duration = Duration::from_millis(20);

/// Polls `check` every 20 ms until it returns `Ok`, or panics with `what` and the last observation after
/// `deadline`.
pub fn wait_until<T>(what: &str, deadline: Duration, check: impl FnMut() -> Result<T, String>) -> T {
    wait_until_every(what, deadline, POLL, check)
}

/// `wait_until`, polling every `every`.
pub fn wait_until_every<T>(
    what: &str,
    deadline: Duration,
    every: Duration,
    check: impl FnMut() -> Result<T, String>,
) -> T {
    poll_until(deadline, every, check).unwrap_or_else(|last| timed_out(what, deadline, &last))
}

/// Polls `check` every `every` until it returns `Ok`; after `deadline`, the last observation as `Err`.
pub fn poll_until<T>(
    deadline: Duration,
    every: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    let start = Instant::now();
    loop {
        let last = match check() {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if start.elapsed() > deadline {
            return Err(last);
        }
        std::thread::sleep(every);
    }
}

/// Polls `check` every `every` (a tokio sleep) until it returns `Ok`, or panics with `what` and the last
/// observation once `deadline` has passed in tokio time.
pub async fn wait_until_async<T>(
    what: &str,
    deadline: Duration,
    every: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> T {
    await_until(what, deadline, every, || std::future::ready(check())).await
}

/// `wait_until_async` with a check that awaits (a request, say).
pub async fn await_until<T, F: Future<Output = Result<T, String>>>(
    what: &str,
    deadline: Duration,
    every: Duration,
    check: impl FnMut() -> F,
) -> T {
    poll_until_async(deadline, every, check).await.unwrap_or_else(|last| timed_out(what, deadline, &last))
}

/// `poll_until` in a tokio task, with a check that awaits: sleeps between polls, reads the deadline in tokio
/// time.
pub async fn poll_until_async<T, F: Future<Output = Result<T, String>>>(
    deadline: Duration,
    every: Duration,
    mut check: impl FnMut() -> F,
) -> Result<T, String> {
    let start = tokio::time::Instant::now();
    loop {
        let last = match check().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if start.elapsed() > deadline {
            return Err(last);
        }
        tokio::time::sleep(every).await;
    }
}

/// A check of the boolean condition `cond`: `Ok(())` once it holds.
pub fn holds(mut cond: impl FnMut() -> bool) -> impl FnMut() -> Result<(), String> {
    move || if cond() { Ok(()) } else { Err("the condition does not hold".to_string()) }
}

fn timed_out(what: &str, deadline: Duration, last: &str) -> ! {
    panic!("timed out after {deadline:?} waiting for {what}; last observation: {last}")
}
