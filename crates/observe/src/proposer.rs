//! `TimedProposer`: a `Proposer` around another that records each write's latency (proposal until applied to
//! the local store) and its failures in the metrics. It changes nothing about the write. Must not know what
//! the writes hold.

use std::sync::Arc;
use std::time::Instant;

use shoal_raft::{LeaderState, ProposeFuture, Proposer, ReadBarrierFuture};
use shoal_store::Action;
use tokio::sync::watch;

use crate::metrics::Recorders;

/// Times the writes of `inner`.
pub struct TimedProposer {
    inner: Arc<dyn Proposer>,
    recorders: Recorders,
}

impl TimedProposer {
    /// Wraps `inner`; its writes are recorded in `recorders`.
    pub fn new(inner: Arc<dyn Proposer>, recorders: Recorders) -> TimedProposer {
        TimedProposer { inner, recorders }
    }
}

impl Proposer for TimedProposer {
    fn propose(&self, actions: Vec<Action>) -> ProposeFuture {
        let started = Instant::now();
        let fut = self.inner.propose(actions);
        let recorders = self.recorders.clone();
        Box::pin(async move {
            let result = fut.await;
            match &result {
                Ok(_) => recorders.write_latency.observe(started.elapsed().as_secs_f64()),
                Err(_) => {
                    recorders.write_failures.inc();
                }
            }
            result
        })
    }

    fn leadership(&self) -> watch::Receiver<LeaderState> {
        self.inner.leadership()
    }

    fn read_barrier(&self) -> ReadBarrierFuture {
        self.inner.read_barrier()
    }

    fn unhealthy(&self) -> Option<String> {
        self.inner.unhealthy()
    }
}
