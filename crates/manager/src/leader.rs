//! The one list of leader-only subsystems, in start order, that every manager runs while it leads: the
//! daemon (`shoal-node`, which adds only the loop that needs its `RaftNode`, the managers' status) and the
//! deterministic simulation (`shoal-sim`) both take it from here, so the simulation checks the loops the
//! daemon runs. Nothing in the manager imports this module; it imports the subsystems.

use std::sync::Arc;

use rand::RngCore;

use crate::dispatcher::Dispatcher;
use crate::subsystem::Subsystem;

/// The leader-only subsystems: the orchestrators, reaper, constraint enforcer and rebalancer, the allocator,
/// the key manager (its key material from `key_rng`: the OS's in the daemon, a seeded one in the
/// simulation; rotating every `key_rotation_ms`, `keymanager::ROTATION_INTERVAL_MS` unless the daemon was
/// told otherwise), the scheduler, the dispatcher's loop and the root-rotation reconciler.
pub fn leader_subsystems(
    dispatcher: &Arc<Dispatcher>,
    key_rng: Box<dyn RngCore + Send>,
    key_rotation_ms: u64,
) -> Vec<Box<dyn Subsystem>> {
    let mut list = crate::orchestrator::subsystems();
    list.push(crate::allocator::subsystem());
    list.push(Box::new(crate::keymanager::KeyManager::with_rng(key_rng, key_rotation_ms)));
    list.push(crate::scheduler::subsystem());
    list.push(dispatcher.subsystem());
    list.push(Box::new(crate::ca::rotation::RootRotationReconciler));
    list
}
