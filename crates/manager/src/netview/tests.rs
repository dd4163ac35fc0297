//! `node_view` over hand-made store contents: which networks a node is on, its peers, services, VIPs,
//! aliases and backends, and what moves them.

use shoal_api::shoal_v1::{NetworkPeers, RemotePeer, ServiceBackends};
use shoal_api::{
    endpoint, endpoint_spec::ResolutionMode, Annotations, Endpoint, EndpointSpec, Network, NetworkAttachment,
    NetworkAttachmentConfig, Node, NodeStatus, Service, ServiceSpec, Task, TaskSpec, TaskState, TaskStatus,
};
use shoal_store::{Changes, MemoryStore};

use super::node_view;

struct Fx {
    store: MemoryStore,
    index: u64,
}

impl Fx {
    fn new() -> Fx {
        let fx = Fx { store: MemoryStore::default(), index: 0 };
        let mut fx = fx;
        for (id, addr) in [("n1", "192.168.1.1"), ("n2", "192.168.1.2"), ("n3", "192.168.1.3")] {
            fx.create(Node {
                id: id.into(),
                status: Some(NodeStatus { state: 2, message: String::new(), addr: addr.into() }),
                ..Default::default()
            });
        }
        for (id, vni) in [("net1", 4097), ("net2", 4098)] {
            fx.create(Network {
                id: id.into(),
                spec: Some(shoal_api::NetworkSpec {
                    annotations: Some(Annotations { name: format!("{id}-name"), ..Default::default() }),
                    ..Default::default()
                }),
                driver_state: Some(shoal_api::Driver {
                    name: "overlay".into(),
                    options: [(shoal_store::VXLAN_ID_OPTION.to_string(), vni.to_string())].into(),
                }),
                ipam: Some(shoal_api::IpamOptions {
                    driver: None,
                    configs: vec![shoal_api::IpamConfig {
                        subnet: format!("10.0.{}.0/24", net_octet(id)),
                        gateway: format!("10.0.{}.1", net_octet(id)),
                        ..Default::default()
                    }],
                }),
                ..Default::default()
            });
        }
        fx
    }

    fn create<T: shoal_store::StoreObject>(&mut self, obj: T) {
        let mut c = Changes::new();
        c.create(obj);
        self.index += 1;
        self.store.apply(self.index, c.actions()).unwrap();
    }

    fn update<T: shoal_store::StoreObject>(&mut self, obj: T) {
        let mut c = Changes::new();
        c.update(obj);
        self.index += 1;
        self.store.apply(self.index, c.actions()).unwrap();
    }

    fn view(&self, node: &str) -> shoal_api::shoal_v1::NodeNetworkView {
        self.store.view(|t| node_view(t, node))
    }
}

/// A service on `networks` (`(id, aliases)`), with a VIP per network unless `dnsrr`.
fn service(id: &str, name: &str, networks: &[(&str, &[&str])], dnsrr: bool) -> Service {
    let mode = if dnsrr { ResolutionMode::Dnsrr } else { ResolutionMode::Vip } as i32;
    Service {
        id: id.into(),
        spec: Some(ServiceSpec {
            annotations: Some(Annotations { name: name.into(), ..Default::default() }),
            task: Some(TaskSpec {
                networks: networks
                    .iter()
                    .map(|(n, a)| NetworkAttachmentConfig {
                        target: n.to_string(),
                        aliases: a.iter().map(|s| s.to_string()).collect(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            endpoint: Some(EndpointSpec { mode, ports: vec![] }),
            ..Default::default()
        }),
        endpoint: Some(Endpoint {
            spec: None,
            ports: vec![],
            virtual_ips: if dnsrr {
                vec![]
            } else {
                networks
                    .iter()
                    .enumerate()
                    .map(|(i, (n, _))| endpoint::VirtualIp {
                        network_id: n.to_string(),
                        addr: format!("10.0.{}.{}/24", net_octet(n), 200 + i),
                    })
                    .collect()
            },
        }),
        ..Default::default()
    }
}

fn net_octet(n: &str) -> u8 {
    n.trim_start_matches("net").parse().unwrap_or(9)
}

/// A task of `service` on `node` in `state`, with address `.host` on each of `networks`.
fn task(id: &str, service: &str, node: &str, state: TaskState, networks: &[&str], host: u8) -> Task {
    let mut t = Task {
        id: id.into(),
        service_id: service.into(),
        node_id: node.into(),
        status: Some(TaskStatus { state: state as i32, ..Default::default() }),
        networks: networks
            .iter()
            .map(|n| NetworkAttachment {
                network: Some(Network { id: n.to_string(), ..Default::default() }),
                addresses: vec![format!("10.0.{}.{host}/24", net_octet(n))],
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    t.set_desired_state(TaskState::Running);
    t
}

fn peer(address: &str, node_addr: &str) -> RemotePeer {
    RemotePeer { address: address.into(), node_addr: node_addr.into(), address6: String::new() }
}

fn backends(id: &str, name: &str, vip: &str, b: &[&str], aliases: &[&str]) -> ServiceBackends {
    ServiceBackends {
        service_id: id.into(),
        name: name.into(),
        vip: vip.into(),
        backends: b.iter().map(|s| s.to_string()).collect(),
        aliases: aliases.iter().map(|s| s.to_string()).collect(),
        ingress_ports: vec![],
        backends6: vec![],
    }
}

#[test]
fn a_node_without_networked_tasks_gets_only_its_address() {
    let mut fx = Fx::new();
    fx.create(service("s1", "web", &[("net1", &[])], false));
    fx.create(task("t1", "s1", "n2", TaskState::Running, &["net1"], 2));
    let v = fx.view("n1");
    assert_eq!(v.node_addr, "192.168.1.1");
    assert!(v.networks.is_empty(), "{v:?}");
    // A node the store does not know has no address.
    assert_eq!(fx.view("nope").node_addr, "");
}

#[test]
fn peers_are_the_networks_tasks_on_other_nodes_and_backends_the_running_ones() {
    let mut fx = Fx::new();
    fx.create(service("s1", "web", &[("net1", &["www"])], false));
    fx.create(service("s2", "client", &[("net1", &[])], false));
    fx.create(service("s3", "other", &[("net2", &[])], false));
    fx.create(task("w1", "s1", "n1", TaskState::Running, &["net1"], 2));
    fx.create(task("w2", "s1", "n2", TaskState::Running, &["net1"], 3));
    // Assigned but not running yet: a peer (its address lives on n3), not a backend.
    fx.create(task("c1", "s2", "n3", TaskState::Assigned, &["net1"], 4));
    fx.create(task("o1", "s3", "n2", TaskState::Running, &["net2"], 2));
    // Not placed yet, and stopped: neither peer nor backend.
    fx.create(task("w3", "s1", "", TaskState::Pending, &["net1"], 5));
    fx.create(task("w4", "s1", "n3", TaskState::Failed, &["net1"], 6));

    let v = fx.view("n1");
    assert_eq!(
        v.networks,
        vec![NetworkPeers {
            network_id: "net1".into(),
            peers: vec![peer("10.0.1.3", "192.168.1.2"), peer("10.0.1.4", "192.168.1.3")],
            services: vec![
                backends("s2", "client", "10.0.1.200", &[], &[]),
                backends("s1", "web", "10.0.1.200", &["10.0.1.2", "10.0.1.3"], &["www"]),
            ],
        }]
    );
    // n2 is on both networks; net2's service is there, with no peer elsewhere.
    let v2 = fx.view("n2");
    assert_eq!(v2.networks.iter().map(|n| n.network_id.as_str()).collect::<Vec<_>>(), ["net1", "net2"]);
    assert_eq!(v2.networks[0].peers, vec![peer("10.0.1.2", "192.168.1.1"), peer("10.0.1.4", "192.168.1.3")]);
    assert_eq!(v2.networks[1].peers, vec![]);
    assert_eq!(v2.networks[1].services, vec![backends("s3", "other", "10.0.2.200", &["10.0.2.2"], &[])]);
}

#[test]
fn a_task_told_to_stop_leaves_the_backends_at_once_and_the_peers_when_it_stopped() {
    let mut fx = Fx::new();
    fx.create(service("s1", "web", &[("net1", &[])], false));
    fx.create(task("w1", "s1", "n1", TaskState::Running, &["net1"], 2));
    fx.create(task("w2", "s1", "n2", TaskState::Running, &["net1"], 3));
    assert_eq!(fx.view("n1").networks[0].services[0].backends, ["10.0.1.2", "10.0.1.3"]);

    let mut w2 = fx.store.view(|t| (**t.tasks().get("w2").unwrap()).clone());
    w2.set_desired_state(TaskState::Shutdown);
    fx.update(w2);
    let v = fx.view("n1");
    assert_eq!(v.networks[0].services[0].backends, ["10.0.1.2"]);
    assert_eq!(v.networks[0].peers, vec![peer("10.0.1.3", "192.168.1.2")], "still running there");

    let mut w2 = fx.store.view(|t| (**t.tasks().get("w2").unwrap()).clone());
    w2.status = Some(TaskStatus { state: TaskState::Shutdown as i32, ..Default::default() });
    fx.update(w2);
    assert_eq!(fx.view("n1").networks[0].peers, vec![]);
}

#[test]
fn dnsrr_services_have_no_vip_and_a_vip_is_per_network() {
    let mut fx = Fx::new();
    fx.create(service("s1", "db", &[("net1", &[]), ("net2", &["pg"])], false));
    fx.create(service("s2", "rr", &[("net1", &[])], true));
    fx.create(task("d1", "s1", "n1", TaskState::Running, &["net1", "net2"], 7));
    fx.create(task("r1", "s2", "n2", TaskState::Running, &["net1"], 8));
    let v = fx.view("n1");
    assert_eq!(v.networks.len(), 2);
    assert_eq!(
        v.networks[0].services,
        vec![backends("s1", "db", "10.0.1.200", &["10.0.1.7"], &[]), backends("s2", "rr", "", &["10.0.1.8"], &[]),]
    );
    assert_eq!(v.networks[1].services, vec![backends("s1", "db", "10.0.2.201", &["10.0.2.7"], &["pg"])]);
}

#[test]
fn a_node_moving_to_another_address_moves_its_peers() {
    let mut fx = Fx::new();
    fx.create(service("s1", "web", &[("net1", &[])], false));
    fx.create(task("w1", "s1", "n1", TaskState::Running, &["net1"], 2));
    fx.create(task("w2", "s1", "n2", TaskState::Running, &["net1"], 3));
    let mut n2 = fx.store.view(|t| (**t.nodes().get("n2").unwrap()).clone());
    n2.status.as_mut().unwrap().addr = "192.168.9.9".into();
    fx.update(n2);
    assert_eq!(fx.view("n1").networks[0].peers, vec![peer("10.0.1.3", "192.168.9.9")]);
}

#[test]
fn a_node_reporting_a_data_path_address_is_reached_there_and_sees_it_as_its_own() {
    let mut fx = Fx::new();
    fx.create(service("s1", "web", &[("net1", &[])], false));
    fx.create(task("w1", "s1", "n1", TaskState::Running, &["net1"], 2));
    fx.create(task("w2", "s1", "n2", TaskState::Running, &["net1"], 3));
    let mut n2 = fx.store.view(|t| (**t.nodes().get("n2").unwrap()).clone());
    let engine = n2.description.get_or_insert_with(Default::default).engine.get_or_insert_with(Default::default);
    engine.labels.insert(shoal_api::SHOAL_DATA_PATH_ADDR_LABEL.into(), "172.30.0.2".into());
    fx.update(n2);
    assert_eq!(fx.view("n1").networks[0].peers, vec![peer("10.0.1.3", "172.30.0.2")]);
    assert_eq!(fx.view("n2").node_addr, "172.30.0.2");
    // A label that is no address is not used: the session's address stands.
    let mut n2 = fx.store.view(|t| (**t.nodes().get("n2").unwrap()).clone());
    let engine = n2.description.as_mut().unwrap().engine.as_mut().unwrap();
    engine.labels.insert(shoal_api::SHOAL_DATA_PATH_ADDR_LABEL.into(), "eth1".into());
    fx.update(n2);
    assert_ne!(fx.view("n2").node_addr, "eth1");
    assert!(!fx.view("n2").node_addr.is_empty());
}

#[test]
fn once_a_port_is_published_every_node_carries_ingress_with_its_address_and_the_mesh_ports() {
    let mut fx = Fx::new();
    let ingress = Network {
        id: "ing".into(),
        spec: Some(shoal_api::NetworkSpec { ingress: true, ..Default::default() }),
        ..Default::default()
    };
    fx.create(ingress.clone());
    for (id, host) in [("n1", 21), ("n2", 22), ("n3", 23)] {
        let mut n = fx.store.view(|t| (**t.nodes().get(id).unwrap()).clone());
        n.attachments = vec![NetworkAttachment {
            network: Some(ingress.clone()),
            addresses: vec![format!("10.0.9.{host}/24")],
            ..Default::default()
        }];
        fx.update(n);
    }
    // No service publishes a port: no node carries ingress.
    let v = fx.view("n1");
    assert!(v.ingress.is_none() && v.networks.is_empty(), "{v:?}");

    let mut web = service("s1", "web", &[], false);
    let port = |mode: shoal_api::port_config::PublishMode, published: u32| shoal_api::PortConfig {
        protocol: 0,
        target_port: 80,
        published_port: published,
        publish_mode: mode as i32,
        ..Default::default()
    };
    let e = web.endpoint.as_mut().unwrap();
    e.ports = vec![
        port(shoal_api::port_config::PublishMode::Ingress, 8080),
        port(shoal_api::port_config::PublishMode::Host, 9090),
    ];
    e.virtual_ips = vec![endpoint::VirtualIp { network_id: "ing".into(), addr: "10.0.9.200/24".into() }];
    fx.create(web);
    fx.create(task("t1", "s1", "n2", TaskState::Running, &["ing"], 5));
    fx.create(task("t2", "s1", "n3", TaskState::Running, &["ing"], 6));
    fx.create(task("t3", "s1", "n3", TaskState::Starting, &["ing"], 7));

    // n1 runs no task of web and still forwards 8080 (not the host-mode port) to both running tasks.
    let v = fx.view("n1");
    assert_eq!(v.ingress.as_ref().map(|a| a.addresses.clone()), Some(vec!["10.0.9.21/24".to_string()]));
    let mut want = backends("s1", "web", "10.0.9.200", &["10.0.9.5", "10.0.9.6"], &[]);
    want.ingress_ports = vec![shoal_api::shoal_v1::MeshPort { protocol: 0, published_port: 8080, target_port: 80 }];
    assert_eq!(
        v.networks,
        vec![NetworkPeers {
            network_id: "ing".into(),
            peers: vec![
                peer("10.0.9.5", "192.168.1.2"),
                peer("10.0.9.6", "192.168.1.3"),
                peer("10.0.9.7", "192.168.1.3"),
                peer("10.0.9.22", "192.168.1.2"),
                peer("10.0.9.23", "192.168.1.3"),
            ],
            services: vec![want],
        }]
    );
    // A node without an ingress address (not allocated yet) carries no mesh.
    let mut n1 = fx.store.view(|t| (**t.nodes().get("n1").unwrap()).clone());
    n1.attachments.clear();
    fx.update(n1);
    let v = fx.view("n1");
    assert!(v.ingress.is_none() && v.networks.is_empty(), "{v:?}");
    assert!(!fx.view("n2").networks[0].peers.iter().any(|p| p.address == "10.0.9.21"));
}

#[test]
fn node_addresses_inside_a_viewed_networks_subnet_are_listed_so_the_node_does_not_carry_it() {
    let mut fx = Fx::new();
    fx.create(service("s1", "web", &[("net1", &[])], false));
    fx.create(task("w1", "s1", "n1", TaskState::Running, &["net1"], 2));
    assert!(fx.view("n1").overlapping_node_addrs.is_empty());
    // A node joins with an address inside net1's 10.0.1.0/24, and a manager advertises one inside net2's
    // (which n1 is not on, so it is not listed).
    fx.create(Node {
        id: "n4".into(),
        status: Some(NodeStatus { state: 2, message: String::new(), addr: "10.0.1.50".into() }),
        ..Default::default()
    });
    fx.create(Node {
        id: "n5".into(),
        status: Some(NodeStatus { state: 2, message: String::new(), addr: "192.168.1.5".into() }),
        manager_status: Some(shoal_api::ManagerStatus { addr: "10.0.2.7:4242".into(), ..Default::default() }),
        ..Default::default()
    });
    assert_eq!(fx.view("n1").overlapping_node_addrs, ["10.0.1.50"]);
    fx.create(task("o1", "s1", "n1", TaskState::Running, &["net2"], 3));
    assert_eq!(fx.view("n1").overlapping_node_addrs, ["10.0.1.50", "10.0.2.7"]);
    // A node without networks gets no list.
    assert!(fx.view("n2").overlapping_node_addrs.is_empty());
}

#[test]
fn the_view_carries_the_clusters_data_path_port() {
    let mut fx = Fx::new();
    assert_eq!(fx.view("n1").vxlan_udp_port, 0, "no cluster object: the agent keeps its default");
    fx.create(shoal_api::Cluster { id: "c1".into(), ..Default::default() });
    assert_eq!(fx.view("n1").vxlan_udp_port, 4789);
    let mut c: shoal_api::Cluster = fx.store.view(|t| (**t.clusters().get("c1").unwrap()).clone());
    c.vxlan_udp_port = 7789;
    fx.update(c);
    assert_eq!(fx.view("n1").vxlan_udp_port, 7789);
}

/// On an `--ipv6` network each peer carries its task's IPv6 address (the attachment's second) and each service
/// its running tasks' IPv6 addresses; a network without IPv6 has neither.
#[test]
fn an_ipv6_network_gives_peers_and_backends_their_ipv6_addresses() {
    let mut fx = Fx::new();
    fx.create(service("s1", "web", &[("net1", &[])], false));
    let with6 = |mut t: Task, h: u8| {
        t.networks[0].addresses.push(format!("fd00:1::{h}/64"));
        t
    };
    fx.create(with6(task("w1", "s1", "n1", TaskState::Running, &["net1"], 2), 2));
    fx.create(with6(task("w2", "s1", "n2", TaskState::Running, &["net1"], 3), 3));
    fx.create(with6(task("w3", "s1", "n3", TaskState::Assigned, &["net1"], 4), 4));
    let v = fx.view("n1");
    let n = &v.networks[0];
    let peers: Vec<(&str, &str)> = n.peers.iter().map(|p| (p.address.as_str(), p.address6.as_str())).collect();
    assert_eq!(peers, [("10.0.1.3", "fd00:1::3"), ("10.0.1.4", "fd00:1::4")]);
    assert_eq!(n.services[0].backends, ["10.0.1.2", "10.0.1.3"]);
    assert_eq!(n.services[0].backends6, ["fd00:1::2", "fd00:1::3"], "the running ones");
    fx.create(service("s3", "other", &[("net2", &[])], false));
    fx.create(task("o1", "s3", "n2", TaskState::Running, &["net2"], 2));
    fx.create(task("o2", "s3", "n1", TaskState::Running, &["net2"], 3));
    let n2 = fx.view("n1").networks.into_iter().find(|n| n.network_id == "net2").unwrap();
    assert_eq!((n2.peers[0].address6.as_str(), n2.services[0].backends6.len()), ("", 0));
}
