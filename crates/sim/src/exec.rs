//! The simulation's executor and timer: futures are polled with a no-op waker, once per step each, in a
//! fixed order, so nothing runs unless the simulation loop polls it and every run of a seed polls the same
//! futures in the same order. `SimTimer` is the monotonic time the leader-only loops wait on
//! (`shoal_manager::Timer`): the simulation's step clock, which never jumps.
//!
//! No threads, no runtime, no wall-clock reads.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use shoal_manager::{SleepFuture, Timer};

/// A boxed future the simulation polls.
pub type SimFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Polls `f` once; `Some` with its output once it is done.
pub fn poll_once<T>(f: &mut SimFuture<T>) -> Option<T> {
    let mut cx = Context::from_waker(Waker::noop());
    match f.as_mut().poll(&mut cx) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

/// The simulation's monotonic time, in milliseconds since the run began.
#[derive(Debug, Default)]
pub struct SimTimer {
    now_ms: Arc<AtomicU64>,
}

impl SimTimer {
    /// Moves time forward.
    pub fn advance(&self, ms: u64) {
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Timer for SimTimer {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }

    fn sleep_ms(&self, ms: u64) -> SleepFuture {
        let now = self.now_ms.clone();
        let until = now.load(Ordering::SeqCst).saturating_add(ms);
        Box::pin(std::future::poll_fn(move |_| {
            if now.load(Ordering::SeqCst) >= until {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }))
    }
}
