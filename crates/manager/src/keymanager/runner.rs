//! The key manager's loop: completes the cluster's keyring when this manager becomes leader, then rotates
//! it every rotation interval, waiting only on `ClusterState.timer` (a `ManualTimer` in tests, so a test
//! advances 12 hours in a step). A write that fails (no quorum, a concurrent update of the cluster object)
//! is retried `RETRY_MS` later with the keyring read again; the key material comes from the injected RNG
//! (seeded from the operating system in `KeyManager::new`).
//!
//! Must not depend on other subsystems; only on `ClusterState`.

use std::sync::Arc;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use tokio::sync::watch;

use super::{Keyring, ROTATION_INTERVAL_MS};
use crate::state::ClusterState;
use crate::subsystem::{stopped, Subsystem, SubsystemFuture};

/// How long the loop waits before trying a failed write again.
pub(super) const RETRY_MS: u64 = 1_000;

/// The key manager as a leader-only subsystem.
pub(crate) struct KeyManager {
    rotation_interval_ms: u64,
    rng: Arc<Mutex<Box<dyn RngCore + Send>>>,
}

impl std::fmt::Debug for KeyManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyManager").field("rotation_interval_ms", &self.rotation_interval_ms).finish()
    }
}

impl Default for KeyManager {
    fn default() -> Self {
        KeyManager::new()
    }
}

impl KeyManager {
    /// Keys from a CSPRNG seeded by the operating system, rotated every `ROTATION_INTERVAL_MS`.
    pub(crate) fn new() -> KeyManager {
        KeyManager::with_rng(Box::new(StdRng::from_os_rng()), ROTATION_INTERVAL_MS)
    }

    /// Keys from `rng`, rotated every `rotation_interval_ms` (tests: a seeded RNG).
    pub(crate) fn with_rng(rng: Box<dyn RngCore + Send>, rotation_interval_ms: u64) -> KeyManager {
        KeyManager { rotation_interval_ms: rotation_interval_ms.max(1), rng: Arc::new(Mutex::new(rng)) }
    }
}

impl Subsystem for KeyManager {
    fn name(&self) -> &'static str {
        "keymanager"
    }

    fn run(&self, state: ClusterState, stop: watch::Receiver<bool>) -> SubsystemFuture {
        Box::pin(run(state, stop, self.rng.clone(), self.rotation_interval_ms))
    }
}

/// Waits `ms` on the state's timer; false when told to stop first.
async fn wait(state: &ClusterState, stop: &mut watch::Receiver<bool>, ms: u64) -> bool {
    tokio::select! {
        biased;
        _ = stopped(stop) => false,
        _ = state.sleep_ms(ms) => true,
    }
}

async fn run(
    state: ClusterState,
    mut stop: watch::Receiver<bool>,
    rng: Arc<Mutex<Box<dyn RngCore + Send>>>,
    interval_ms: u64,
) {
    let complete = |ring: &Keyring| ring.completed(&mut **rng.lock());
    while !write_keyring(&state, "complete", complete).await {
        if !wait(&state, &mut stop, RETRY_MS).await {
            return;
        }
    }
    loop {
        if !wait(&state, &mut stop, interval_ms).await {
            return;
        }
        let rotate = |ring: &Keyring| Some(ring.rotated(&mut **rng.lock()));
        while !write_keyring(&state, "rotate", rotate).await {
            if !wait(&state, &mut stop, RETRY_MS).await {
                return;
            }
        }
    }
}

/// Writes the cluster's keyring as `next` makes it from the stored one (`None`: nothing to write). True when
/// it was written or there was nothing to write (no cluster object yet counts as nothing).
async fn write_keyring(state: &ClusterState, what: &str, next: impl Fn(&Keyring) -> Option<Keyring>) -> bool {
    let written = state
        .write(|t, c| {
            let Some(cluster) = t.clusters().iter().next() else {
                return Ok::<_, std::convert::Infallible>(None);
            };
            let Some(ring) = next(&Keyring::of(cluster)) else { return Ok(None) };
            let mut updated = (**cluster).clone();
            ring.store_in(&mut updated);
            c.update(updated);
            Ok(Some(ring.lamport_clock))
        })
        .await;
    match written {
        Ok((Some(clock), _)) => {
            tracing::info!(lamport_clock = clock, "network encryption keys written ({what})");
            true
        }
        Ok((None, _)) => true,
        Err(e) => {
            tracing::warn!(error = %e, "cannot write the network encryption keys ({what}); retrying");
            false
        }
    }
}
