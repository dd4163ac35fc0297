//! `ClusterState`: what every manager subsystem holds. The store to read and watch, the proposer to write
//! through, the clock, the ID source and the timer its loops wait on. Subsystems talk to each other only
//! through this.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

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

/// The future `Timer::sleep_ms` returns.
pub type SleepFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Monotonic time for the waits of the leader-only loops (retry backoff, debounce and flush windows,
/// restart timers): tokio's clock in production (`TokioTimer`), the simulation's own in `shoal-sim`, so
/// the same loops run there without a runtime. Decisions that read wall-clock time use `Clock` instead.
pub trait Timer: Send + Sync + std::fmt::Debug {
    /// Monotonic now, in milliseconds since an arbitrary origin.
    fn now_ms(&self) -> u64;
    /// Resolves once `ms` milliseconds have passed.
    fn sleep_ms(&self, ms: u64) -> SleepFuture;
}

/// `tokio::time` (so tests that pause tokio's clock pause these waits too).
#[derive(Debug, Default)]
pub struct TokioTimer {
    origin: OnceLock<tokio::time::Instant>,
}

impl Timer for TokioTimer {
    fn now_ms(&self) -> u64 {
        let origin = *self.origin.get_or_init(tokio::time::Instant::now);
        u64::try_from(tokio::time::Instant::now().saturating_duration_since(origin).as_millis()).unwrap_or(u64::MAX)
    }

    fn sleep_ms(&self, ms: u64) -> SleepFuture {
        Box::pin(tokio::time::sleep(std::time::Duration::from_millis(ms)))
    }
}

/// A timer that moves only when told to (`advance_ms`), waking the sleeps it passed. For tests and the
/// simulation.
#[derive(Debug, Default)]
pub struct ManualTimer {
    now_ms: Arc<std::sync::atomic::AtomicU64>,
    /// Wakers of sleeps not yet due (at most one per distinct waker).
    wakers: Arc<Mutex<Vec<std::task::Waker>>>,
}

impl ManualTimer {
    /// How many tasks wait in a sleep not yet due (each woken by `advance_ms` and counted again once it
    /// waits again): a test steps time only once the loop it drives is asleep.
    pub fn pending_sleeps(&self) -> usize {
        self.wakers.lock().len()
    }

    /// Moves time forward by `ms` and wakes every sleep.
    pub fn advance_ms(&self, ms: u64) {
        self.now_ms.fetch_add(ms, std::sync::atomic::Ordering::SeqCst);
        for w in std::mem::take(&mut *self.wakers.lock()) {
            w.wake();
        }
    }
}

impl Timer for ManualTimer {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn sleep_ms(&self, ms: u64) -> SleepFuture {
        let (now, wakers) = (self.now_ms.clone(), self.wakers.clone());
        let until = now.load(std::sync::atomic::Ordering::SeqCst).saturating_add(ms);
        Box::pin(std::future::poll_fn(move |cx| {
            if now.load(std::sync::atomic::Ordering::SeqCst) >= until {
                return std::task::Poll::Ready(());
            }
            let mut w = wakers.lock();
            if !w.iter().any(|k| k.will_wake(cx.waker())) {
                w.push(cx.waker().clone());
            }
            std::task::Poll::Pending
        }))
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
    /// What the leader-only loops wait on (`TokioTimer` unless replaced with `with_timer`).
    pub timer: Arc<dyn Timer>,
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
        ClusterState { store, proposer, clock, ids, logs: Default::default(), timer: Arc::new(TokioTimer::default()) }
    }

    /// The same state with the loops' waits on `timer` (the simulation's clock).
    pub fn with_timer(mut self, timer: Arc<dyn Timer>) -> ClusterState {
        self.timer = timer;
        self
    }

    /// Waits `ms` milliseconds on this state's timer.
    pub fn sleep_ms(&self, ms: u64) -> SleepFuture {
        self.timer.sleep_ms(ms)
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

    /// Why this manager cannot serve for a reason of its own (its disk is full), for `/_ping` and `/info`;
    /// `None` when healthy.
    pub fn unhealthy(&self) -> Option<String> {
        self.proposer.unhealthy()
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
