//! Swarm networks that live on each node's engine (`shoal_api::NODE_LOCAL_DRIVERS`: macvlan, ipvlan), as a
//! Docker worker runs them: before a task's container is created, the node's engine gets a network of the
//! swarm network's name and driver, with its settings taken from the node's config-only network that the
//! swarm network names (`--config-from`) or from the swarm network's own options and subnet; the container
//! runs on it (network mode = its name) and the engine addresses it. The network is labelled with the swarm
//! network's ID (one made from a config-only network takes no label: the engine refuses any other setting
//! there, so its driver and config-only network identify it), so a network of the same name that is not this
//! one's is never used: the task is rejected naming it. Once a task's container is removed, the network is removed too
//! when no container uses it any more (the engine refuses while one does).
//!
//! Must not know the data plane: these tasks never touch the overlay.

use std::collections::HashMap;
use std::sync::Arc;

use bollard::models::{ConfigReference, Ipam, IpamConfig, NetworkCreateRequest};
use bollard::Docker;
use shoal_api::{network_spec::ConfigFrom, Network, Task};

use super::{engine_message, engine_status};

/// The label of an engine network made for a swarm network: the swarm network's ID.
pub(crate) const LABEL_SWARM_NETWORK: &str = "com.shoal.swarm.network.id";

/// A task's network on its node's engine.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct EngineNetwork {
    /// The swarm network's ID.
    id: String,
    /// How the engine makes it (its name is the swarm network's).
    create: NetworkCreateRequest,
}

impl EngineNetwork {
    /// The engine network task `task` runs on, when it is attached to a node-local swarm network.
    pub(crate) fn of_task(task: &Task) -> Option<EngineNetwork> {
        let n = task.engine_network()?.network.as_ref()?;
        Some(EngineNetwork::of(n))
    }

    fn of(n: &Network) -> EngineNetwork {
        let spec = n.spec.clone().unwrap_or_default();
        let driver = spec.driver_config.clone().unwrap_or_default();
        let name = spec.annotations.as_ref().map_or(n.id.clone(), |a| a.name.clone());
        let config_from =
            spec.config_from.as_ref().map(|ConfigFrom::Network(from)| ConfigReference { network: Some(from.clone()) });
        let ipam_options = spec.ipam.as_ref().and_then(|i| i.driver.as_ref()).map(|d| d.options.clone());
        let ipam_options = ipam_options.filter(|o| !o.is_empty());
        let ipam = spec.ipam.as_ref().filter(|i| !i.configs.is_empty() || ipam_options.is_some()).map(|i| Ipam {
            driver: Some("default".into()),
            config: Some(
                i.configs
                    .iter()
                    .map(|c| IpamConfig {
                        subnet: Some(c.subnet.clone()).filter(|s| !s.is_empty()),
                        ip_range: Some(c.range.clone()).filter(|s| !s.is_empty()),
                        gateway: Some(c.gateway.clone()).filter(|s| !s.is_empty()),
                        auxiliary_addresses: Some(c.reserved.clone()).filter(|r| !r.is_empty()),
                    })
                    .collect(),
            )
            .filter(|c: &Vec<IpamConfig>| !c.is_empty()),
            // The engine's IPAM driver gets them as Docker's executor gives them.
            options: ipam_options,
        });
        // The engine takes no other setting, labels included, beside a config-only network.
        let labels = config_from.is_none().then(|| HashMap::from([(LABEL_SWARM_NETWORK.to_string(), n.id.clone())]));
        EngineNetwork {
            id: n.id.clone(),
            create: NetworkCreateRequest {
                name,
                driver: Some(driver.name),
                internal: spec.internal.then_some(true),
                enable_ipv6: spec.ipv6_enabled.then_some(true),
                config_from,
                ipam,
                options: Some(driver.options).filter(|o| !o.is_empty()),
                labels,
                ..Default::default()
            },
        }
    }

    /// Whether the engine's network `found` (of this one's name) is this one: labelled with the swarm network's
    /// ID, or, for one made from a config-only network (which takes no label), of the same driver and config.
    fn is_this(&self, found: &bollard::models::NetworkInspect) -> bool {
        match found.labels.as_ref().and_then(|l| l.get(LABEL_SWARM_NETWORK)) {
            Some(id) => *id == self.id,
            None => {
                self.create.config_from.is_some()
                    && found.driver == self.create.driver
                    && found.config_from.as_ref().and_then(|c| c.network.as_ref())
                        == self.create.config_from.as_ref().and_then(|c| c.network.as_ref())
            }
        }
    }

    /// Its name on the engine (the container's network mode).
    pub(crate) fn name(&self) -> &str {
        &self.create.name
    }

    /// Makes the network on the engine unless it is there already (made for this swarm network: by its label).
    pub(crate) async fn ensure(&self, docker: &Docker) -> Result<(), String> {
        for _ in 0..2 {
            match docker.inspect_network(self.name(), None).await {
                Ok(found) => {
                    return match self.is_this(&found) {
                        true => Ok(()),
                        false => Err(format!(
                            "the engine has a network named {} that is not swarm network {}: rename or remove the \
                             engine's network, or give the swarm network another name",
                            self.name(),
                            self.id
                        )),
                    };
                }
                Err(e) if engine_status(&e) == Some(404) => {}
                Err(e) => {
                    return Err(format!("cannot inspect the engine's network {}: {}", self.name(), engine_message(&e)))
                }
            }
            match docker.create_network(self.create.clone()).await {
                Ok(_) => return Ok(()),
                // Made meanwhile (another task of the network): inspect it again.
                Err(e) if engine_status(&e) == Some(409) => continue,
                Err(e) => {
                    let from = match &self.create.config_from {
                        Some(ConfigReference { network: Some(f) }) => {
                            format!(" (from the node's config-only network {f}: create it on this node's engine)")
                        }
                        _ => String::new(),
                    };
                    return Err(format!(
                        "cannot create network {} on the node's engine{from}: {}",
                        self.name(),
                        engine_message(&e)
                    ));
                }
            }
        }
        Err(format!("network {} appeared and vanished on the node's engine while it was made; retry", self.name()))
    }

    /// Removes the network from the engine when no container uses it (the engine refuses while one does, and
    /// that refusal is the answer: another task still runs on it). A network of that name that is not this
    /// one stays.
    pub(crate) async fn release(&self, docker: &Docker) {
        match docker.inspect_network(self.name(), None).await {
            Ok(found) if self.is_this(&found) => {}
            _ => return,
        }
        match docker.remove_network(self.name()).await {
            Ok(()) => {}
            Err(e) if matches!(engine_status(&e), Some(403) | Some(404) | Some(409)) => {}
            Err(e) => {
                tracing::warn!(network = %self.name(), "cannot remove the engine's network: {}", engine_message(&e))
            }
        }
    }
}

/// The node's tasks on each engine network, counted from a task's prepare to its container's removal, with
/// the engine calls that make and remove those networks made under one lock: a network is removed only when
/// the last task counted on it is removed, so a task between its container's creation and its start (the
/// engine counts only started containers as the network's users) never loses it to another task's removal.
#[derive(Clone, Default)]
pub(crate) struct EngineNetworkUsers(Arc<tokio::sync::Mutex<HashMap<String, usize>>>);

impl EngineNetworkUsers {
    /// Makes `net` on the engine unless it is there, and counts one more task on it.
    pub(crate) async fn hold(&self, net: &EngineNetwork, docker: &Docker) -> Result<(), String> {
        let mut users = self.0.lock().await;
        net.ensure(docker).await?;
        *users.entry(net.name().to_string()).or_default() += 1;
        Ok(())
    }

    /// Counts one task fewer on `net` when `held` (it was counted), and removes the network from the engine
    /// once none is left (an uncounted task's removal, such as a container adopted at a restart that never
    /// prepared, removes it only when no task of this agent holds it).
    pub(crate) async fn let_go(&self, net: &EngineNetwork, docker: &Docker, held: bool) {
        let mut users = self.0.lock().await;
        let left = match users.get_mut(net.name()) {
            Some(n) if held => {
                *n = n.saturating_sub(1);
                *n
            }
            Some(n) => *n,
            None => 0,
        };
        if left == 0 {
            users.remove(net.name());
            net.release(docker).await;
        }
    }

    /// How many tasks are counted on the network named `name`.
    #[cfg(test)]
    async fn users_of(&self, name: &str) -> usize {
        self.0.lock().await.get(name).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_api::{Annotations, Driver, IpamConfig as SwarmIpamConfig, IpamOptions, NetworkAttachment, NetworkSpec};

    fn macvlan(config_from: Option<&str>, parent: Option<&str>) -> Network {
        Network {
            id: "net1".into(),
            spec: Some(NetworkSpec {
                annotations: Some(Annotations { name: "macnet".into(), ..Default::default() }),
                driver_config: Some(Driver {
                    name: "macvlan".into(),
                    options: parent.map(|p| HashMap::from([("parent".to_string(), p.to_string())])).unwrap_or_default(),
                }),
                ipam: parent.map(|_| IpamOptions {
                    configs: vec![SwarmIpamConfig { subnet: "192.168.50.0/24".into(), ..Default::default() }],
                    driver: Some(Driver {
                        name: "default".into(),
                        options: HashMap::from([("site".to_string(), "lab".to_string())]),
                    }),
                }),
                config_from: config_from.map(|f| ConfigFrom::Network(f.into())),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_task_on_a_macvlan_network_gets_the_engine_network_made_as_the_swarm_network_says() {
        let mut task = Task::default();
        assert_eq!(EngineNetwork::of_task(&task), None);
        task.networks =
            vec![NetworkAttachment { network: Some(macvlan(Some("macnet-cfg"), None)), ..Default::default() }];
        let n = EngineNetwork::of_task(&task).unwrap();
        assert_eq!(n.name(), "macnet");
        assert_eq!(n.create.driver.as_deref(), Some("macvlan"));
        assert_eq!(n.create.config_from, Some(ConfigReference { network: Some("macnet-cfg".into()) }));
        assert_eq!((n.create.ipam.as_ref(), n.create.options.as_ref()), (None, None));
        assert_eq!(n.create.labels, None, "the engine takes no label beside a config-only network");
        // Settings given on the swarm network itself go to the engine as they are.
        task.networks[0].network = Some(macvlan(None, Some("eth9")));
        let n = EngineNetwork::of_task(&task).unwrap();
        assert_eq!(n.create.options.as_ref().unwrap()["parent"], "eth9");
        let subnet = n.create.ipam.as_ref().and_then(|i| i.config.as_ref()).map(|c| c[0].subnet.clone());
        assert_eq!(subnet, Some(Some("192.168.50.0/24".into())));
        let ipam_options = n.create.ipam.as_ref().and_then(|i| i.options.as_ref());
        assert_eq!(ipam_options.map(|o| o["site"].as_str()), Some("lab"));
        assert_eq!(n.create.config_from, None);
        assert_eq!(n.create.labels.as_ref().unwrap()[LABEL_SWARM_NETWORK], "net1");
    }

    /// A network the engine makes without any link of the host's: a bridge, labelled as the swarm network's.
    fn bridge(name: &str) -> EngineNetwork {
        let mut n = macvlan(None, None);
        n.spec.as_mut().unwrap().annotations.as_mut().unwrap().name = name.into();
        n.spec.as_mut().unwrap().driver_config.as_mut().unwrap().name = "bridge".into();
        EngineNetwork::of(&n)
    }

    struct Removed(String);

    impl Drop for Removed {
        fn drop(&mut self) {
            let _ = std::process::Command::new("docker").args(["network", "rm", &self.0]).output();
        }
    }

    #[tokio::test]
    async fn an_engine_network_stays_while_a_task_holds_it_and_goes_with_the_last() {
        let docker = Docker::connect_with_unix_defaults().expect("this test needs the Docker Engine's socket");
        let name = format!("shlt-users-{}", std::process::id());
        let net = bridge(&name);
        let _cleanup = Removed(name.clone());
        let exists = |docker: Docker, name: String| async move { docker.inspect_network(&name, None).await.is_ok() };
        let users = EngineNetworkUsers::default();
        users.hold(&net, &docker).await.expect("the engine makes the network");
        users.hold(&net, &docker).await.unwrap();
        assert!(exists(docker.clone(), name.clone()).await);
        assert_eq!(users.users_of(&name).await, 2);
        // The first task's removal leaves it to the second (whose container may be created and not started).
        users.let_go(&net, &docker, true).await;
        assert!(exists(docker.clone(), name.clone()).await, "removed while a task still holds it");
        // An uncounted removal (an adopted container) leaves it too while a task holds it.
        users.let_go(&net, &docker, false).await;
        assert!(exists(docker.clone(), name.clone()).await, "removed by an uncounted task while one holds it");
        users.let_go(&net, &docker, true).await;
        assert!(!exists(docker.clone(), name.clone()).await, "still there after the last task's removal");
        assert_eq!(users.users_of(&name).await, 0);
        // Made again for the next task.
        users.hold(&net, &docker).await.unwrap();
        assert!(exists(docker.clone(), name.clone()).await);
        users.let_go(&net, &docker, true).await;
        assert!(!exists(docker, name).await);
    }
}
