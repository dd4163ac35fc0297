//! The simulation's executor: futures are polled with a no-op waker, once per step each, in a fixed order,
//! so nothing runs unless the simulation loop polls it and every run of a seed polls the same futures in
//! the same order. (The monotonic time the leader-only loops wait on is a `shoal_manager::ManualTimer`
//! that the loop advances one step at a time; it never jumps.)
//!
//! No threads, no runtime, no wall-clock reads.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

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
