//! The one list of leader-only subsystems, in start order, that every manager runs while it leads: the
//! daemon (`shoal-node`, which adds only the loop that needs its `RaftNode`, the managers' status) and the
//! deterministic simulation (`shoal-sim`) both take it from here, so the simulation checks the loops the
//! daemon runs. Nothing in the manager imports this module; it imports the subsystems.

use std::sync::Arc;

use rand::RngCore;

use crate::dispatcher::Dispatcher;
use crate::subsystem::Subsystem;
use crate::volumes::{ControllerPlugins, NoPlugins, VolumeManager};

/// What a manager's leader-only subsystems are given beyond the cluster state.
#[derive(Debug, Clone)]
pub struct LeaderConfig {
    /// How often the key manager rotates the network keys (`keymanager::ROTATION_INTERVAL_MS` unless the
    /// daemon was told otherwise).
    pub key_rotation_ms: u64,
    /// The CSI plugins the volume manager calls (`NoPlugins` unless the daemon names some).
    pub volume_plugins: Arc<dyn ControllerPlugins>,
}

impl Default for LeaderConfig {
    fn default() -> Self {
        LeaderConfig { key_rotation_ms: crate::keymanager::ROTATION_INTERVAL_MS, volume_plugins: Arc::new(NoPlugins) }
    }
}

/// The leader-only subsystems: the orchestrators, reaper, constraint enforcer and rebalancer, the allocator,
/// the key manager (its key material from `key_rng`: the OS's in the daemon, a seeded one in the
/// simulation; rotating every `cfg.key_rotation_ms`), the scheduler, the dispatcher's loop, the
/// root-rotation reconciler and the volume manager (calling `cfg.volume_plugins`).
pub fn leader_subsystems(
    dispatcher: &Arc<Dispatcher>,
    key_rng: Box<dyn RngCore + Send>,
    cfg: &LeaderConfig,
) -> Vec<Box<dyn Subsystem>> {
    let mut list = crate::orchestrator::subsystems();
    list.push(crate::allocator::subsystem());
    list.push(Box::new(crate::keymanager::KeyManager::with_rng(key_rng, cfg.key_rotation_ms)));
    list.push(crate::scheduler::subsystem());
    list.push(dispatcher.subsystem());
    list.push(Box::new(crate::ca::rotation::RootRotationReconciler));
    list.push(Box::new(VolumeManager::new(cfg.volume_plugins.clone())));
    list
}
