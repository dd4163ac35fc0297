//! The manager's member of Docker's overlay gossip (`shoal_gossip`), served on the manager's advertised
//! address, port 7946, with the cluster's `networking:gossip` keys as the key manager rotates them: Docker
//! Engine workers join it through the managers' addresses and find each other there (docs/engine-worker.md).
//! It publishes the peer and endpoint records of tasks on Shoal's own agents (`peer_entries`, from the
//! store), so the engines reach those tasks on an overlay and their DNS answers the tasks' names.
//! A port already taken (a Docker manager on the same address, another Shoal manager on 127.0.0.1) is
//! logged and leaves the rest of the node running.

use std::net::SocketAddr;
use std::sync::Arc;

use shoal_api::TaskState;
use shoal_store::{MemoryStore, Object};
use tokio::sync::watch;

use crate::authz::{EntryPoints, Guard};

/// The cluster's gossip keys, the one to seal with first: the second by Lamport time when there are several,
/// as libnetwork picks its primary key (of the keyring's three, the middle one: a key every node has had
/// for a rotation's time), then the others.
fn gossip_keys(store: &MemoryStore) -> Vec<Vec<u8>> {
    let mut keys = store.view(|t| {
        t.clusters()
            .iter()
            .flat_map(|c| c.network_bootstrap_keys.clone())
            .filter(|k| k.subsystem == shoal_manager::SUBSYSTEM_GOSSIP)
            .collect::<Vec<_>>()
    });
    keys.sort_by_key(|k| k.lamport_time);
    if keys.len() > 1 {
        keys.swap(0, 1);
    }
    keys.into_iter().map(|k| k.key).collect()
}

/// What the member publishes for Shoal's own agents, so that engines reach their tasks and find them by
/// name. For each address a task on a Shoal agent holds on an overlay network, keyed by the task's ID:
/// - from ASSIGNED to RUNNING, a `shoal_gossip::PEER_TABLE` entry: the address behind its node's underlay
///   address, with the MAC of Shoal's data plane (`02:42` and the IPv4 address, as the engines' overlay
///   driver makes them too);
/// - while RUNNING, a `shoal_gossip::ENDPOINT_TABLE` entry: its name, its service's name, ID, virtual IP on
///   that network and aliases there, and on the ingress network the service's routing-mesh ports, which an
///   engine's DNS answers `<task name>`, `<service>` and `tasks.<service>` from.
fn peer_entries(store: &MemoryStore) -> shoal_gossip::Entries {
    store.view(|t| {
        let mut out = shoal_gossip::Entries::new();
        let live = TaskState::Assigned as i32..=TaskState::Running as i32;
        for task in t.tasks().iter() {
            let Some(state) = task.status.as_ref().map(|s| s.state).filter(|s| live.contains(s)) else { continue };
            let Some(node) = t.nodes().get(&task.node_id) else { continue };
            let shoal_agent = node
                .description
                .as_ref()
                .and_then(|d| d.engine.as_ref())
                .is_some_and(|e| e.labels.contains_key(shoal_api::SHOAL_AGENT_LABEL));
            // Where its VXLAN traffic goes: its data path address (`--data-path-addr`), else its session's.
            let vtep = node.underlay_addr().map(|ip| ip.to_string()).unwrap_or_default();
            if !shoal_agent || vtep.is_empty() {
                continue;
            }
            let service = t.services().get(&task.service_id).map(|s| &**s);
            for a in &task.networks {
                let Some(n) = &a.network else { continue };
                if n.driver_state.as_ref().is_none_or(|d| d.name != "overlay") {
                    continue;
                }
                for addr in &a.addresses {
                    let Some(std::net::IpAddr::V4(ip)) = addr.split('/').next().and_then(|i| i.parse().ok()) else {
                        continue;
                    };
                    let o = ip.octets();
                    let mac = format!("02:42:{:02x}:{:02x}:{:02x}:{:02x}", o[0], o[1], o[2], o[3]);
                    let value = shoal_gossip::peer_record(addr, &mac, &vtep);
                    out.insert((n.id.clone(), shoal_gossip::PEER_TABLE.to_string(), task.id.clone()), value);
                    if state == TaskState::Running as i32 && !task.service_id.is_empty() {
                        let e = endpoint(task, service, n, a, ip);
                        let key = (n.id.clone(), shoal_gossip::ENDPOINT_TABLE.to_string(), task.id.clone());
                        out.insert(key, shoal_gossip::endpoint_record(&e));
                    }
                }
            }
        }
        out
    })
}

/// A running service task's endpoint on network `n` (its attachment `a`, its address `ip` there), as
/// Docker's executor describes its container's to libnetwork.
fn endpoint(
    task: &shoal_api::Task,
    service: Option<&shoal_api::Service>,
    n: &shoal_api::Network,
    a: &shoal_api::NetworkAttachment,
    ip: std::net::Ipv4Addr,
) -> shoal_gossip::Endpoint {
    let service_endpoint = service.and_then(|s| s.endpoint.as_ref());
    let virtual_ip = service_endpoint
        .into_iter()
        .flat_map(|e| e.virtual_ips.iter())
        .find(|v| v.network_id == n.id)
        .map(|v| v.addr.split('/').next().unwrap_or_default().to_string())
        .unwrap_or_default();
    let ingress = n.spec.as_ref().is_some_and(|s| s.ingress);
    let ingress_ports = service_endpoint
        .into_iter()
        .flat_map(|e| e.ports.iter())
        .filter(|p| ingress && p.publish_mode == shoal_api::port_config::PublishMode::Ingress as i32)
        .map(|p| shoal_gossip::IngressPort {
            name: p.name.clone(),
            protocol: p.protocol,
            target_port: p.target_port,
            published_port: p.published_port,
        })
        .collect();
    shoal_gossip::Endpoint {
        name: shoal_agent::task_name(task),
        service_name: shoal_agent::service_name(task),
        service_id: task.service_id.clone(),
        virtual_ip,
        endpoint_ip: ip.to_string(),
        ingress_ports,
        aliases: a.aliases.clone(),
        task_aliases: Vec::new(),
    }
}

/// Serves the member named `name` on `addr` until `stop`.
pub(crate) async fn run(
    name: String,
    addr: SocketAddr,
    store: Arc<MemoryStore>,
    entry_points: EntryPoints,
    mut stop: watch::Receiver<bool>,
) {
    // Subscribed before the first read, so no key rotation is missed.
    let ((), mut events) = store.view_and_watch(|_| ());
    let (keys, rx) = watch::channel(gossip_keys(&store));
    let (entries, entries_rx) = watch::channel(peer_entries(&store));
    let handle = match shoal_gossip::serve(name, addr, rx, entries_rx).await {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(
                %addr,
                "cannot serve the overlay gossip ({e}): Docker Engine workers will not find each other through \
                 this manager (free the port, or let another manager serve it)"
            );
            return;
        }
    };
    entry_points.register("overlay-gossip", handle.addr(), Guard::GossipKey);
    loop {
        tokio::select! {
            _ = shoal_manager::stopped(&mut stop) => return,
            r = events.recv() => match r {
                Ok(commit)
                    if !commit.changes.iter().any(|c| {
                        matches!(c.object, Object::Cluster(_) | Object::Task(_) | Object::Node(_) | Object::Service(_))
                    }) =>
                {
                    continue
                }
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    let now = gossip_keys(&store);
                    keys.send_if_modified(|k| if *k == now { false } else { *k = now; true });
                    let now = peer_entries(&store);
                    entries.send_if_modified(|e| if *e == now { false } else { *e = now; true });
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use shoal_api::{Cluster, EncryptionKey};
    use shoal_store::Changes;

    use super::*;

    #[test]
    fn only_tasks_on_shoal_agents_get_peer_records_while_they_hold_their_addresses_and_names_while_they_run() {
        use shoal_api::{Driver, EngineDescription, Network, NetworkAttachment, Node, NodeDescription, NodeStatus};
        let node = |id: &str, addr: &str, shoal: bool| Node {
            id: id.into(),
            description: Some(NodeDescription {
                engine: Some(EngineDescription {
                    labels: if shoal {
                        [(shoal_api::SHOAL_AGENT_LABEL.to_string(), "0.1".to_string())].into()
                    } else {
                        Default::default()
                    },
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: Some(NodeStatus { addr: addr.into(), ..Default::default() }),
            ..Default::default()
        };
        let on = |driver: &str, net: &str, addr: &str| NetworkAttachment {
            network: Some(Network {
                id: net.into(),
                driver_state: Some(Driver { name: driver.into(), ..Default::default() }),
                ..Default::default()
            }),
            addresses: vec![addr.into()],
            ..Default::default()
        };
        let task = |id: &str, node: &str, state: TaskState, nets: Vec<NetworkAttachment>| shoal_api::Task {
            id: id.into(),
            node_id: node.into(),
            status: Some(shoal_api::TaskStatus { state: state as i32, ..Default::default() }),
            networks: nets,
            ..Default::default()
        };
        let store = MemoryStore::default();
        let mut c = Changes::new();
        let mut t1 = task("t1", "shoal-node", TaskState::Running, vec![on("overlay", "n1", "10.0.1.6/24")]);
        (t1.service_id, t1.slot) = ("s1".into(), 1);
        t1.service_annotations = Some(shoal_api::Annotations { name: "web".into(), ..Default::default() }.into());
        t1.networks[0].aliases = vec!["www".into()];
        let mut starting = task("t5", "shoal-node", TaskState::Starting, vec![on("overlay", "n1", "10.0.1.8/24")]);
        starting.service_id = "s1".into();
        c.create(shoal_api::Service {
            id: "s1".into(),
            endpoint: Some(shoal_api::Endpoint {
                virtual_ips: vec![shoal_api::endpoint::VirtualIp {
                    network_id: "n1".into(),
                    addr: "10.0.1.2/24".into(),
                }],
                ..Default::default()
            }),
            ..Default::default()
        });
        c.create(t1);
        c.create(starting);
        c.create(node("shoal-node", "10.79.1.2", true));
        c.create(node("engine-node", "10.79.2.2", false));
        c.create(task("t2", "engine-node", TaskState::Running, vec![on("overlay", "n1", "10.0.1.3/24")]));
        c.create(task("t3", "shoal-node", TaskState::Complete, vec![on("overlay", "n1", "10.0.1.7/24")]));
        c.create(task("t4", "shoal-node", TaskState::Running, vec![on("bridge", "b", "172.17.0.2/16")]));
        store.apply(1, c.actions()).unwrap();
        let key = |table: &str, task: &str| ("n1".to_string(), table.to_string(), task.to_string());
        let peer = shoal_gossip::peer_record("10.0.1.6/24", "02:42:0a:00:01:06", "10.79.1.2");
        // A starting task is reached already, and named once it runs.
        let starting = shoal_gossip::peer_record("10.0.1.8/24", "02:42:0a:00:01:08", "10.79.1.2");
        let endpoint = shoal_gossip::endpoint_record(&shoal_gossip::Endpoint {
            name: "web.1.t1".into(),
            service_name: "web".into(),
            service_id: "s1".into(),
            virtual_ip: "10.0.1.2".into(),
            endpoint_ip: "10.0.1.6".into(),
            aliases: vec!["www".into()],
            ..Default::default()
        });
        let want = [
            (key(shoal_gossip::ENDPOINT_TABLE, "t1"), endpoint),
            (key(shoal_gossip::PEER_TABLE, "t1"), peer),
            (key(shoal_gossip::PEER_TABLE, "t5"), starting),
        ];
        assert_eq!(peer_entries(&store), want.into());
    }

    #[test]
    fn the_member_seals_with_the_key_libnetwork_makes_primary_and_opens_with_all() {
        let store = MemoryStore::default();
        let key = |subsystem: &str, t: u64| EncryptionKey {
            subsystem: subsystem.into(),
            key: vec![u8::try_from(t).unwrap(); 16],
            lamport_time: t,
            ..Default::default()
        };
        let mut c = Changes::new();
        c.create(Cluster {
            id: "c".into(),
            network_bootstrap_keys: vec![
                key("networking:gossip", 7),
                key("networking:ipsec", 8),
                key("networking:gossip", 5),
                key("networking:gossip", 9),
            ],
            ..Default::default()
        });
        store.apply(1, c.actions()).unwrap();
        // The middle of the three by Lamport time first (libnetwork's primary), then the others; no IPsec key.
        assert_eq!(gossip_keys(&store), [vec![7u8; 16], vec![5u8; 16], vec![9u8; 16]]);
    }
}
