//! `ClusterState`: what every manager subsystem holds. The store to read and watch, the proposer to write
//! through, the clock and the ID source. Subsystems talk to each other only through this.

use std::sync::Arc;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shoal_raft::{LeaderState, ProposeError, Proposer};
use shoal_store::{ids, Changes, Clock, Commit, IdSource, MemoryStore, Tables};

/// IDs from a seeded RNG: replayable in tests, random in production (seeded from the OS).
#[derive(Debug)]
pub struct RandomIds {
    rng: Mutex<StdRng>,
}

impl RandomIds {
    /// IDs from a fixed seed.
    pub fn seeded(seed: u64) -> RandomIds {
        RandomIds { rng: Mutex::new(StdRng::seed_from_u64(seed)) }
    }

    /// IDs seeded from the operating system.
    pub fn from_os() -> RandomIds {
        RandomIds { rng: Mutex::new(StdRng::from_os_rng()) }
    }
}

impl IdSource for RandomIds {
    fn new_id(&self) -> String {
        let mut rng = self.rng.lock();
        ids::id_from_bits(rng.random(), rng.random())
    }
}

/// The handles a subsystem needs. Cheap to clone.
#[derive(Clone)]
pub struct ClusterState {
    /// The replicated state: read with `view`, follow with `watch`/`view_and_watch`.
    pub store: Arc<MemoryStore>,
    /// Where writes go (Raft in production).
    pub proposer: Arc<dyn Proposer>,
    /// The injected clock.
    pub clock: Arc<dyn Clock>,
    /// The injected ID source.
    pub ids: Arc<dyn IdSource>,
    /// This manager's log broker (log subscriptions between API clients and agents; not replicated).
    pub logs: crate::logbroker::LogBroker,
}

impl std::fmt::Debug for ClusterState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterState").field("store", &self.store).finish()
    }
}

/// Why a `ClusterState::write` failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError<E> {
    /// The closure refused (validation failed); nothing was proposed.
    #[error(transparent)]
    Rejected(E),
    /// The proposal failed.
    #[error(transparent)]
    Propose(#[from] ProposeError),
}

impl ClusterState {
    /// A state over `store` and `proposer` with the given clock and IDs.
    pub fn new(
        store: Arc<MemoryStore>,
        proposer: Arc<dyn Proposer>,
        clock: Arc<dyn Clock>,
        ids: Arc<dyn IdSource>,
    ) -> ClusterState {
        ClusterState { store, proposer, clock, ids, logs: Default::default() }
    }

    /// Reads a consistent view, builds a list of changes in `f`, and proposes it as one atomic write.
    /// Returns `f`'s value once the write is applied locally. If `f` adds no change, nothing is proposed.
    /// A version conflict comes back as `ProposeError::Store(StoreError::VersionConflict)`: read again.
    pub async fn write<R, E>(
        &self,
        f: impl FnOnce(&Tables, &mut Changes) -> Result<R, E>,
    ) -> Result<(R, Option<Arc<Commit>>), WriteError<E>> {
        let mut changes = Changes::new();
        let value = self.store.view(|t| f(t, &mut changes)).map_err(WriteError::Rejected)?;
        if changes.is_empty() {
            return Ok((value, None));
        }
        let commit = self.proposer.propose(changes.into_actions()).await?;
        Ok((value, Some(commit)))
    }

    /// Proposes a prepared list of changes.
    pub async fn propose(&self, changes: Changes) -> Result<Arc<Commit>, ProposeError> {
        self.proposer.propose(changes.into_actions()).await
    }

    /// Waits until the local store holds every write committed before the call (Raft ReadIndex), so that a
    /// read that follows is linearizable on a follower too; fails (503 at the API) without a leader.
    pub async fn read_barrier(&self) -> Result<(), ProposeError> {
        self.proposer.read_barrier().await
    }

    /// Current leadership as this node sees it.
    pub fn leader_state(&self) -> LeaderState {
        *self.proposer.leadership().borrow()
    }

    /// Now, from the injected clock, as a protobuf timestamp.
    pub fn now(&self) -> shoal_api::prost_types::Timestamp {
        shoal_api::timestamp_from_unix_ms(self.clock.now_unix_ms())
    }
}
