//! The allocator (SwarmKit's manager/allocator, leader-only): network resources are given out before the
//! scheduler sees a task. `ipam`: address pools per network subnet and the choice of a new network's subnet
//! from the cluster's pools; `ports`: ingress published ports, unique cluster-wide, with the dynamic range;
//! `predefined`: the `host` and `bridge` networks every cluster has; `core`: the sans-IO allocator (pools in
//! step with the store, one pass that allocates service endpoints and moves NEW tasks to PENDING with their
//! attachments); `runner`: the loop around it.
//!
//! The hand-off with the orchestrators: a task of a service that needs allocation (`needs_allocation`:
//! networks, or published ports) is created NEW and only the allocator moves it to PENDING; other tasks are
//! created PENDING directly, so services without networks cost the allocator nothing.
//!
//! Must not depend on other subsystems or on IO other than `ClusterState`.

pub(crate) mod core;
pub(crate) mod ipam;
pub(crate) mod ports;
pub(crate) mod predefined;
mod runner;
#[cfg(test)]
mod tests;

pub(crate) use self::core::needs_allocation;
#[cfg(test)]
pub(crate) use self::core::AllocatePass;
pub(crate) use runner::AllocatorLoop;

use crate::subsystem::Subsystem;

/// The allocator as a leader-only subsystem.
pub(crate) fn subsystem() -> Box<dyn Subsystem> {
    Box::new(AllocatorLoop)
}
