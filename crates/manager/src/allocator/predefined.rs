//! The predefined networks (`host`, `bridge`): store objects that let a service run on each node's own
//! network (`docker service create --network host`), as SwarmKit's managers make them. The allocator gives
//! their attachments no address and their services no VIP; the nodes run such tasks in their own network
//! namespace (`host`) or on their engine's default bridge (`bridge`, docker executor only).
//!
//! Must not depend on other subsystems or on IO.

use std::collections::HashMap;

use shoal_api::{Annotations, Driver, Meta, Network, NetworkSpec};
use shoal_store::{IdSource, Tables};

/// The predefined networks (`host`, `bridge`) a cluster has so that services can run on each node's own
/// networks (`docker service create --network host`), as SwarmKit's managers make them: labelled
/// `com.docker.swarm.predefined`, the driver named as the network, no subnet, no VXLAN ID. Those of
/// `PREDEFINED_NETWORKS` whose name `t` does not hold yet (a user network with such a name, from before
/// the names were reserved, keeps it: that predefined network is then missing, with a warning).
pub(crate) fn missing_predefined_networks(
    t: &Tables,
    ids: &dyn IdSource,
    now: shoal_api::prost_types::Timestamp,
) -> Vec<Network> {
    shoal_api::PREDEFINED_NETWORKS
        .iter()
        .filter(|name| {
            let held = t.networks().by_name(name);
            if held.is_some_and(|n| n.predefined_driver().is_none()) {
                tracing::warn!(
                    network = name,
                    "a user network holds the name of a predefined network: services cannot \
                                                use the node's own {name} network until it is renamed"
                );
            }
            held.is_none()
        })
        .map(|name| Network {
            id: ids.new_id(),
            meta: Some(Meta { version: None, created_at: Some(now), updated_at: Some(now) }),
            spec: Some(NetworkSpec {
                annotations: Some(Annotations {
                    name: name.to_string(),
                    labels: HashMap::from([(shoal_api::PREDEFINED_NETWORK_LABEL.to_string(), "true".to_string())]),
                    ..Default::default()
                }),
                driver_config: Some(Driver { name: name.to_string(), ..Default::default() }),
                ..Default::default()
            }),
            ..Default::default()
        })
        .collect()
}
