//! The control API: validated reads and writes of services, tasks and nodes, on `ClusterState`. This is what
//! the Engine API (`shoal-engine-api`) calls for every request; it holds the rules (names, versions, specs,
//! last-manager protection) and none of the HTTP/JSON.
//!
//! Lookups take a reference that is a full ID, then an exact name, then a unique ID prefix (an ambiguous
//! prefix is an error). Prefix and name lookups of nodes scan the node table: they run once per request,
//! never per event.
//!
//! `Service.spec_version` (coordinated with the orchestrator): it changes exactly when the spec is written
//! and only grows. `create_service` sets it to `Version { index: 0 }`; `update_service` sets it to the
//! service's `meta.version` read before the update (SwarmKit does the same). It is therefore not comparable
//! to `meta.version`: compare a task's `spec_version` with its service's `spec_version` for equality only.
//! `previous_spec_version` keeps the one before.
//!
//! Service removal deletes the service and, in the same write, sets the desired state of its tasks to
//! REMOVE (the reaper deletes them once they no longer run) — as many as one bounded write holds; the
//! orchestrator marks the others when it sees the service gone.
//!
//! `limits` holds every bound a spec is checked against (replicas, sizes, durations, counts, cluster
//! settings).
//!
//! The cluster object (`docker swarm update`) is read and updated through `cluster`.
//!
//! Secrets and configs (`secret`, `config`): created, listed, their labels updated and removed with
//! SwarmKit's rules; a secret's data is never returned. A service's references to them are checked with its
//! spec and, in the write that stores it, for existence (`references`); removing one that a service
//! references is refused, naming the services.
//!
//! Networks (`network`): swarm-scope overlay networks created (subnet, gateway and VXLAN ID chosen in the
//! write), listed and removed (refused while a service or a running task uses one); a service's networks
//! resolved to IDs and its published ports checked (an ingress port another service holds is refused,
//! naming it).
//!
//! Cluster volumes (`volume`): created, listed, their availability and labels updated, and removed (refused
//! while a service mounts one with `type=cluster`, naming the services); layer 1 calls no CSI plugin
//! (docs/design/cluster-volumes.md).
//!
//! Must not depend on HTTP, JSON, processes or Docker.

mod cluster;
mod config;
pub mod network;
mod node;
pub(crate) mod references;
mod secret;
#[cfg(test)]
mod secret_tests;
mod service;
mod task;
#[cfg(test)]
pub(crate) mod tests;
mod volume;
#[cfg(test)]
mod volume_tests;

pub use cluster::{
    autolock_on, get_cluster, manager_unlock_key, update_cluster, update_cluster_rotating, validate_cluster_spec,
    MANAGER_UNLOCK_SUBSYSTEM, MIN_NODE_CERT_EXPIRY,
};
pub use config::{
    create_config, get_config, list_configs, remove_config, update_config, validate_config_spec, ConfigFilters,
};
pub use network::{
    create_network, find_network, get_network, list_networks, remove_network, validate_network_spec, NetworkFilters,
};
pub(crate) use node::docker_engine_version;
pub use node::{get_node, list_nodes, node_name, remove_node, update_node, NodeFilters};
pub use secret::{
    create_secret, get_secret, list_secrets, remove_secret, update_secret, validate_secret_spec, SecretFilters,
    TEMPLATING_DRIVER,
};
pub use service::{
    create_service, get_service, is_job_spec, list_services, remove_service, rollback_service, service_status,
    update_service, validate_service_spec, ServiceFilters, ServiceStatus,
};
pub use task::{get_task, list_tasks, task_name, TaskFilters};
pub use volume::{
    create_volume, find_volume_exact, get_volume, list_volumes, remove_volume, update_volume, validate_volume_spec,
    VolumeFilters,
};

pub use crate::ca::is_blacklisted;
pub use crate::error::ControlError;
/// The bounds on what a request can make the cluster hold or do (the crate's `limits`, which this API enforces).
pub mod limits {
    pub use crate::limits::*;
}

use std::sync::Arc;

use shoal_store::{StoreObject, Tables};

/// Finds an object by full ID, then by `by_name`, then by unique ID prefix.
/// `get` looks up by ID, `all` lists every object (for the prefix search).
pub(crate) fn resolve<'a, T: StoreObject + 'a, I: Iterator<Item = &'a Arc<T>>>(
    kind: &'static str,
    reference: &str,
    get: impl FnOnce(&str) -> Option<&'a Arc<T>>,
    by_name: impl FnOnce(&str) -> Option<&'a Arc<T>>,
    all: I,
) -> Result<&'a Arc<T>, ControlError> {
    if reference.is_empty() {
        return Err(ControlError::InvalidArgument(format!("a {kind} ID or name is required")));
    }
    if let Some(o) = get(reference) {
        return Ok(o);
    }
    if let Some(o) = by_name(reference) {
        return Ok(o);
    }
    let mut found = all.filter(|o| o.id().starts_with(reference));
    match (found.next(), found.next()) {
        (Some(o), None) => Ok(o),
        // Docker's message (clients match it).
        (Some(_), Some(_)) => Err(ControlError::InvalidArgument(format!(
            "{kind} {reference} is ambiguous ({} matches found)",
            2 + found.count()
        ))),
        (None, _) => Err(ControlError::not_found(kind, reference)),
    }
}

/// True when `labels` has every `key` or `key=value` of `wanted`.
pub(crate) fn labels_match(labels: &std::collections::HashMap<String, String>, wanted: &[String]) -> bool {
    wanted.iter().all(|w| match w.split_once('=') {
        Some((k, v)) => labels.get(k).is_some_and(|have| have == v),
        None => labels.contains_key(w.as_str()),
    })
}

/// True when `filter` is empty or some entry is a prefix of `value`.
pub(crate) fn any_prefix(filter: &[String], value: &str) -> bool {
    filter.is_empty() || filter.iter().any(|p| value.starts_with(p.as_str()))
}

/// The service with this ID, name or unique ID prefix, in a view.
pub(crate) fn find_service<'a>(t: &'a Tables, reference: &str) -> Result<&'a Arc<shoal_api::Service>, ControlError> {
    resolve("service", reference, |id| t.services().get(id), |n| t.services().by_name(n), t.services().iter())
}
