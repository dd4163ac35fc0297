//! `desired`: the node's wanted data-plane state from plumbed tasks, assignments and the manager's view.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::sync::Arc;

use shoal_api::shoal_v1::{NetworkPeers, NodeNetworkView, RemotePeer, ServiceBackends};
use shoal_api::{
    Annotations, Driver, IpamConfig, IpamOptions, Network, NetworkAttachment, NetworkSpec, Task, TaskState, TaskStatus,
};
use shoal_netplane::{mac_for, Attachment, Peer, ServiceVip};

use super::{
    attachments, desired, network_state, overlap_reason, ports_unforwardable, task_support, PlumbedTask,
    VXLAN_ID_OPTION,
};

fn network(id: &str, name: &str, vni: u32, octet: u8, internal: bool, encrypted: bool) -> Network {
    let mut opts = HashMap::new();
    if encrypted {
        opts.insert("encrypted".to_string(), String::new());
    }
    Network {
        id: id.into(),
        spec: Some(NetworkSpec {
            annotations: Some(Annotations { name: name.into(), ..Default::default() }),
            driver_config: Some(Driver { name: "overlay".into(), options: opts }),
            internal,
            ..Default::default()
        }),
        driver_state: Some(Driver {
            name: "overlay".into(),
            options: HashMap::from([(VXLAN_ID_OPTION.to_string(), vni.to_string())]),
        }),
        ipam: Some(IpamOptions {
            driver: None,
            configs: vec![IpamConfig {
                subnet: format!("10.0.{octet}.0/24"),
                gateway: format!("10.0.{octet}.1"),
                ..Default::default()
            }],
        }),
        ..Default::default()
    }
}

fn task(id: &str, state: TaskState, nets: &[(&Network, u8)]) -> Task {
    let mut t = Task {
        id: id.into(),
        status: Some(TaskStatus { state: state as i32, ..Default::default() }),
        networks: nets
            .iter()
            .map(|(n, host)| NetworkAttachment {
                network: Some((*n).clone()),
                addresses: vec![format!("{}.{host}/24", prefix(n))],
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    t.set_desired_state(TaskState::Running);
    t
}

/// `t` as plumbed by its executor, in `/run/netns/shl-task-<id>`.
fn plumbed(t: &Task) -> BTreeMap<String, PlumbedTask> {
    let netns = format!("/run/netns/shl-task-{}", t.id).into();
    BTreeMap::from([(t.id.clone(), PlumbedTask { netns, attachments: attachments(t).unwrap(), joined: false })])
}

/// A published port of target 80.
fn port(
    mode: shoal_api::port_config::PublishMode,
    proto: shoal_api::port_config::Protocol,
    published: u32,
) -> shoal_api::PortConfig {
    shoal_api::PortConfig {
        protocol: proto as i32,
        target_port: 80,
        published_port: published,
        publish_mode: mode as i32,
        ..Default::default()
    }
}

fn prefix(n: &Network) -> String {
    let s = &n.ipam.as_ref().unwrap().configs[0].subnet;
    s.rsplit_once('.').unwrap().0.to_string()
}

fn ip(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

#[test]
fn networks_come_from_assignments_tasks_from_namespaces_peers_and_services_from_the_view() {
    let app = network("net-app", "appnet", 4097, 1, false, false);
    let other = network("net-other", "other", 4098, 2, true, false);
    let web = task("web1", TaskState::Running, &[(&app, 2)]);
    // Assigned, namespace not made yet: its network is carried, the task is not.
    let starting = task("db1", TaskState::Assigned, &[(&other, 5)]);
    // Stopped: its network is not carried for it.
    let gone = task("old", TaskState::Failed, &[(&network("net-gone", "gone", 4099, 3, false, false), 2)]);
    let assigned: HashMap<String, Arc<Task>> =
        [&web, &starting, &gone].iter().map(|t| (t.id.clone(), Arc::new((*t).clone()))).collect();
    let plumbed = plumbed(&web);
    let view = NodeNetworkView {
        node_addr: "192.168.0.1".into(),
        networks: vec![
            NetworkPeers {
                network_id: "net-app".into(),
                peers: vec![
                    RemotePeer { address: "10.0.1.3".into(), node_addr: "192.168.0.2".into(), ..Default::default() },
                    // Outside the subnet, or claiming this node: ignored.
                    RemotePeer { address: "10.9.9.9".into(), node_addr: "192.168.0.2".into(), ..Default::default() },
                    RemotePeer { address: "10.0.1.4".into(), node_addr: "192.168.0.1".into(), ..Default::default() },
                ],
                services: vec![ServiceBackends {
                    service_id: "s1".into(),
                    name: "web".into(),
                    vip: "10.0.1.200".into(),
                    backends: vec!["10.0.1.2".into(), "10.0.1.3".into()],
                    aliases: vec!["www".into()],
                    ingress_ports: vec![],
                    backends6: vec![],
                }],
            },
            NetworkPeers { network_id: "net-other".into(), ..Default::default() },
            // Listed by the view, used by no task of this node: not carried.
            NetworkPeers { network_id: "net-unused".into(), ..Default::default() },
        ],
        ingress: None,
        ..Default::default()
    };
    let s = desired(Some(ip("192.168.0.1")), &plumbed, &assigned, &view);
    s.validate().unwrap();
    assert_eq!(s.underlay_ip, Some(ip("192.168.0.1")));
    assert_eq!(s.networks.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["appnet", "other"]);
    let a = &s.networks[0];
    assert_eq!(
        (a.vni, a.subnet.to_string(), a.gateway, a.internal),
        (4097, "10.0.1.0/24".into(), ip("10.0.1.1"), false)
    );
    assert_eq!(
        a.peers,
        vec![Peer {
            address: ip("10.0.1.3"),
            mac: mac_for(ip("10.0.1.3")),
            node_ip: ip("192.168.0.2"),
            address6: None
        }]
    );
    assert_eq!(
        a.services,
        vec![ServiceVip {
            service_id: "s1".into(),
            name: "web".into(),
            aliases: vec!["www".into()],
            vip: Some(ip("10.0.1.200")),
            backends: vec![ip("10.0.1.2"), ip("10.0.1.3")],
            backends6: Vec::new(),
        }]
    );
    assert!(s.networks[1].internal);
    assert_eq!(s.tasks.len(), 1);
    assert_eq!(s.tasks[0].task_id, "web1");
    assert_eq!(
        s.tasks[0].attachments,
        vec![Attachment { network_id: "net-app".into(), address: ip("10.0.1.2"), ifname: None, address6: None }]
    );
}

#[test]
fn without_the_node_address_nothing_is_carried() {
    let app = network("net-app", "appnet", 4097, 1, false, false);
    let web = task("web1", TaskState::Running, &[(&app, 2)]);
    let assigned = HashMap::from([("web1".to_string(), Arc::new(web.clone()))]);
    let plumbed = plumbed(&web);
    let s = desired(None, &plumbed, &assigned, &NodeNetworkView::default());
    assert!(s.networks.is_empty() && s.tasks.is_empty(), "{s:?}");
    s.validate().unwrap();
}

#[test]
fn encrypted_networks_and_incomplete_ones_are_refused_by_name() {
    let enc = network("net-enc", "secure", 4097, 1, false, true);
    let t = task("t1", TaskState::Assigned, &[(&enc, 2)]);
    let err = task_support(&t, false).unwrap_err();
    assert!(err.contains("network secure is encrypted") && err.contains("without --opt encrypted"), "{err}");
    // Not carried even when assigned.
    let assigned = HashMap::from([("t1".to_string(), Arc::new(t))]);
    let s = desired(Some(ip("192.168.0.1")), &BTreeMap::new(), &assigned, &NodeNetworkView::default());
    assert!(s.networks.is_empty());

    let mut bare = network("net-bare", "bare", 4097, 1, false, false);
    bare.driver_state = None;
    let err = task_support(&task("t2", TaskState::Assigned, &[(&bare, 2)]), false).unwrap_err();
    assert!(err.contains("network bare has no VXLAN ID"), "{err}");
}

#[test]
fn the_mesh_forwards_ingress_ports_to_the_backends_and_host_ports_to_the_local_task() {
    use shoal_api::port_config::{Protocol as P, PublishMode};
    use shoal_api::shoal_v1::MeshPort;
    use shoal_netplane::{NodeIngress, Protocol, PublishedPort};
    let ingress = network("net-ing", "ingress", 4096, 0, false, false);
    let app = network("net-app", "appnet", 4097, 1, false, false);
    let closed = network("net-closed", "closed", 4098, 2, true, false);
    let mut web = task("web1", TaskState::Running, &[(&closed, 7), (&app, 2)]);
    web.endpoint = Some(
        shoal_api::Endpoint {
            ports: vec![
                port(PublishMode::Host, P::Tcp, 8081),
                // Taken by the mesh already: not forwarded twice.
                port(PublishMode::Host, P::Tcp, 8080),
                port(PublishMode::Host, P::Sctp, 8083),
            ],
            ..Default::default()
        }
        .into(),
    );
    let assigned = HashMap::from([("web1".to_string(), Arc::new(web.clone()))]);
    let plumbed = plumbed(&web);
    let view = NodeNetworkView {
        node_addr: "192.168.0.1".into(),
        networks: vec![NetworkPeers {
            network_id: "net-ing".into(),
            peers: vec![RemotePeer {
                address: "10.0.0.3".into(),
                node_addr: "192.168.0.2".into(),
                ..Default::default()
            }],
            services: vec![ServiceBackends {
                service_id: "s2".into(),
                name: "front".into(),
                vip: "10.0.0.200".into(),
                backends: vec!["10.0.0.3".into(), "10.0.0.4".into()],
                aliases: vec![],
                ingress_ports: vec![
                    MeshPort { protocol: P::Tcp as i32, published_port: 8080, target_port: 80 },
                    MeshPort { protocol: P::Udp as i32, published_port: 5353, target_port: 53 },
                ],
                backends6: vec![],
            }],
        }]
        .into_iter()
        .chain(["net-app", "net-closed"].map(|id| NetworkPeers { network_id: id.into(), ..Default::default() }))
        .collect(),
        ingress: Some(NetworkAttachment {
            network: Some(ingress.clone()),
            addresses: vec!["10.0.0.9/24".into()],
            ..Default::default()
        }),
        ..Default::default()
    };
    let s = desired(Some(ip("192.168.0.1")), &plumbed, &assigned, &view);
    s.validate().unwrap();
    assert_eq!(s.ingress, Some(NodeIngress { network_id: "net-ing".into(), address: ip("10.0.0.9") }));
    assert!(s.network("net-ing").is_some(), "the node carries ingress without a task on it");
    let p = |protocol, port, target_port, backends: &[&str]| PublishedPort {
        protocol,
        port,
        target_port,
        backends: backends.iter().map(|b| ip(b)).collect(),
    };
    assert_eq!(
        s.published,
        vec![
            p(Protocol::Tcp, 8080, 80, &["10.0.0.3", "10.0.0.4"]),
            // The host-mode port goes to the task's address on its first non-internal network.
            p(Protocol::Tcp, 8081, 80, &["10.0.1.2"]),
            p(Protocol::Udp, 5353, 53, &["10.0.0.3", "10.0.0.4"]),
        ]
    );
    // The task told to stop: its host port goes at once; without the ingress attachment, no mesh.
    let mut stopping = web.clone();
    stopping.set_desired_state(TaskState::Shutdown);
    let assigned = HashMap::from([("web1".to_string(), Arc::new(stopping))]);
    let view = NodeNetworkView { ingress: None, ..view };
    let s = desired(Some(ip("192.168.0.1")), &plumbed, &assigned, &view);
    assert!(s.ingress.is_none() && s.published.is_empty(), "{s:?}");
}

#[test]
fn what_the_node_table_cannot_forward_is_named_and_the_rest_passes() {
    use shoal_api::port_config::{Protocol as P, PublishMode};
    let app = network("net-app", "appnet", 4097, 1, false, false);
    let closed = network("net-closed", "closed", 4098, 2, true, false);
    let with = |nets: &[(&Network, u8)], ports: Vec<shoal_api::PortConfig>| {
        let mut t = task("t", TaskState::Running, nets);
        t.endpoint = Some(shoal_api::Endpoint { ports, ..Default::default() }.into());
        ports_unforwardable(&t)
    };
    let ok = [
        port(PublishMode::Ingress, P::Tcp, 8080),
        port(PublishMode::Ingress, P::Udp, 0),
        port(PublishMode::Host, P::Tcp, 8081),
    ];
    assert_eq!(with(&[(&closed, 3), (&app, 2)], ok.to_vec()), None);
    let sctp = with(&[(&app, 2)], vec![port(PublishMode::Ingress, P::Sctp, 8080)]).unwrap();
    assert!(sctp.contains("EndpointSpec.Ports") && sctp.contains("sctp"), "{sctp}");
    let unnumbered = with(&[(&app, 2)], vec![port(PublishMode::Host, P::Tcp, 0)]).unwrap();
    assert!(unnumbered.contains("EndpointSpec.Ports.PublishedPort"), "{unnumbered}");
    let internal = with(&[(&closed, 3)], vec![port(PublishMode::Host, P::Tcp, 8081)]).unwrap();
    assert!(internal.contains("--internal") && internal.contains("8081"), "{internal}");
    // An ingress port of a task only on internal networks goes through its ingress attachment.
    assert_eq!(with(&[(&closed, 3)], vec![port(PublishMode::Ingress, P::Tcp, 8080)]), None);
}

#[test]
fn a_network_whose_subnet_holds_a_nodes_address_is_not_carried_and_the_node_keeps_its_underlay() {
    let app = network("net-app", "appnet", 4097, 1, false, false);
    let fine = network("net-fine", "fine", 4098, 2, false, false);
    let web = task("web1", TaskState::Running, &[(&app, 2)]);
    let other = task("web2", TaskState::Running, &[(&fine, 2)]);
    let assigned: HashMap<String, Arc<Task>> =
        [&web, &other].iter().map(|t| (t.id.clone(), Arc::new((*t).clone()))).collect();
    let mut plumbed_tasks = plumbed(&web);
    plumbed_tasks.extend(plumbed(&other));
    let view = |node_addr: &str, overlapping: &[&str]| NodeNetworkView {
        node_addr: node_addr.into(),
        networks: vec![
            NetworkPeers { network_id: "net-app".into(), ..Default::default() },
            NetworkPeers { network_id: "net-fine".into(), ..Default::default() },
        ],
        overlapping_node_addrs: overlapping.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    };
    let carried = |underlay: &str, v: &NodeNetworkView| {
        let s = desired(Some(ip(underlay)), &plumbed_tasks, &assigned, v);
        s.validate().unwrap();
        (
            s.networks.iter().map(|n| n.name.clone()).collect::<Vec<_>>(),
            s.tasks.iter().map(|t| t.task_id.clone()).collect::<Vec<_>>(),
        )
    };
    // No overlap: both carried.
    assert_eq!(carried("192.168.0.1", &view("192.168.0.1", &[])).0, ["appnet", "fine"]);
    // This node's own address inside 10.0.1.0/24: appnet and its task are left out, the other stays.
    let own = view("10.0.1.77", &["10.0.1.77"]);
    assert_eq!(carried("10.0.1.77", &own), (vec!["fine".to_string()], vec!["web2".to_string()]));
    // Another node's address there (a manager's, say): the same.
    let theirs = view("192.168.0.1", &["10.0.1.9"]);
    assert_eq!(carried("192.168.0.1", &theirs).0, ["fine"]);
    let why = overlap_reason(&network_state(&app).unwrap(), Some(ip("192.168.0.1")), &theirs).unwrap();
    assert!(why.contains("appnet") && why.contains("10.0.1.0/24") && why.contains("10.0.1.9"), "{why}");
    assert!(why.contains("create it again with a subnet outside"), "{why}");
    // The overlap gone (the node moved, or the network was removed and made again elsewhere): carried again.
    assert_eq!(carried("192.168.0.1", &view("192.168.0.1", &[])).0, ["appnet", "fine"]);
}

#[test]
fn an_assigned_tasks_network_is_carried_only_once_the_view_lists_it() {
    let app = network("net-app", "appnet", 4097, 1, false, false);
    let web = task("web1", TaskState::Assigned, &[(&app, 2)]);
    let assigned = HashMap::from([(web.id.clone(), Arc::new(web.clone()))]);
    let mut view = NodeNetworkView { node_addr: "192.168.0.1".into(), ..Default::default() };
    // The assignment came first: the view that would name an overlap has not arrived.
    let s = desired(Some(ip("192.168.0.1")), &plumbed(&web), &assigned, &view);
    assert!(s.networks.is_empty() && s.tasks.is_empty(), "{s:?}");
    view.networks.push(NetworkPeers { network_id: "net-app".into(), ..Default::default() });
    let s = desired(Some(ip("192.168.0.1")), &plumbed(&web), &assigned, &view);
    assert_eq!(s.networks.len(), 1);
    assert_eq!(s.tasks.len(), 1);
}

#[test]
fn the_vxlan_devices_use_the_port_the_view_names() {
    let app = network("net-app", "appnet", 4097, 1, false, false);
    let web = task("web1", TaskState::Running, &[(&app, 2)]);
    let assigned = HashMap::from([(web.id.clone(), Arc::new(web.clone()))]);
    let mut view = NodeNetworkView {
        node_addr: "192.168.0.1".into(),
        networks: vec![NetworkPeers { network_id: "net-app".into(), ..Default::default() }],
        ..Default::default()
    };
    let s = desired(Some(ip("192.168.0.1")), &plumbed(&web), &assigned, &view);
    assert_eq!(s.vxlan_port, 4789, "a view without a port: the default");
    view.vxlan_udp_port = 7789;
    let s = desired(Some(ip("192.168.0.1")), &plumbed(&web), &assigned, &view);
    assert_eq!((s.vxlan_port, s.networks.len()), (7789, 1));
    s.validate().unwrap();
}

/// A network of two subnets as the manager writes it (docs/design/overlay-subnets.md): `vxlanid_list` gives a
/// VXLAN ID per IPAM config, in order; the view's peers and backends on either subnet are kept; a list that
/// does not match the configs is not carried, with the reason; an internal one of several subnets is carried.
#[test]
fn a_network_of_two_subnets_carries_a_vni_gateway_and_peers_per_subnet() {
    let mut two = network("net-two", "two", 4097, 1, false, false);
    two.driver_state.as_mut().unwrap().options.insert(VXLAN_ID_OPTION.into(), "4097,4099".into());
    two.ipam.as_mut().unwrap().configs.push(IpamConfig {
        subnet: "10.0.9.0/24".into(),
        gateway: "10.0.9.254".into(),
        ..Default::default()
    });
    let s = network_state(&two).unwrap();
    assert_eq!((s.vni, s.subnet.to_string(), s.gateway), (4097, "10.0.1.0/24".to_string(), ip("10.0.1.1")));
    assert_eq!(s.more_subnets.len(), 1);
    let second = s.more_subnets[0];
    assert_eq!(
        (second.vni, second.subnet.to_string(), second.gateway),
        (4099, "10.0.9.0/24".to_string(), ip("10.0.9.254"))
    );
    let t = task("t1", TaskState::Running, &[(&two, 2)]);
    task_support(&t, false).unwrap();
    let view = NodeNetworkView {
        node_addr: "192.0.2.1".into(),
        networks: vec![NetworkPeers {
            network_id: "net-two".into(),
            peers: ["10.0.1.7", "10.0.9.7", "10.0.5.7"]
                .iter()
                .map(|a| RemotePeer { address: a.to_string(), node_addr: "192.0.2.2".into(), ..Default::default() })
                .collect(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let assigned: HashMap<String, Arc<Task>> = [(t.id.clone(), Arc::new(t.clone()))].into();
    let state = desired(Some(ip("192.0.2.1")), &plumbed(&t), &assigned, &view);
    let peers: Vec<Ipv4Addr> = state.networks[0].peers.iter().map(|p| p.address).collect();
    assert_eq!(peers, [ip("10.0.1.7"), ip("10.0.9.7")], "10.0.5.7 is in neither subnet");
    state.validate().unwrap();
    // One VXLAN ID for two subnets: the allocation is incomplete.
    let mut short = two.clone();
    short.driver_state.as_mut().unwrap().options.insert(VXLAN_ID_OPTION.into(), "4097".into());
    let e = network_state(&short).unwrap_err();
    assert!(e.contains("has 2 subnets but 1 VXLAN IDs"), "{e}");
    // Internal with two subnets: carried (routed in the network's namespace).
    two.spec.as_mut().unwrap().internal = true;
    task_support(&task("t2", TaskState::Running, &[(&two, 3)]), false).unwrap();
    assert!(network_state(&two).unwrap().internal);
}

/// An IPv6 network (`--ipv6`): its IPv6 config is the network's IPv6 subnet (no VXLAN ID of its own, the
/// gateway the subnet's first address when none is given), the task's second address its IPv6 one, and the
/// view's IPv6 peer and backend addresses are kept when they are in the subnet.
#[test]
fn an_ipv6_network_gives_the_subnet_the_tasks_ipv6_address_and_the_peers_and_backends_ipv6_ones() {
    let mut dual = network("net-dual", "dual", 4100, 7, false, false);
    dual.ipam.as_mut().unwrap().configs.push(IpamConfig { subnet: "fd00:7::/64".into(), ..Default::default() });
    let s = network_state(&dual).expect("an IPv6 network is carried");
    assert_eq!((s.vni, s.more_subnets.len()), (4100, 0), "the IPv6 config has no VXLAN ID");
    let v6 = |h: u16| std::net::Ipv6Addr::new(0xfd00, 7, 0, 0, 0, 0, 0, h);
    assert_eq!(s.ipv6.map(|x| (x.subnet.to_string(), x.gateway)), Some(("fd00:7::/64".into(), v6(1))));
    let mut t = task("web1", TaskState::Running, &[(&dual, 2)]);
    t.networks[0].addresses.push("fd00:7::2/64".into());
    let a = attachments(&t).unwrap();
    assert_eq!((a[0].1.address, a[0].1.address6), (ip("10.0.7.2"), Some(v6(2))));

    let view = NodeNetworkView {
        node_addr: "192.168.0.1".into(),
        networks: vec![NetworkPeers {
            network_id: "net-dual".into(),
            peers: vec![
                RemotePeer {
                    address: "10.0.7.3".into(),
                    node_addr: "192.168.0.2".into(),
                    address6: "fd00:7::3".into(),
                },
                // An IPv6 address outside the subnet is dropped, the peer kept.
                RemotePeer {
                    address: "10.0.7.4".into(),
                    node_addr: "192.168.0.2".into(),
                    address6: "fd00:8::4".into(),
                },
            ],
            services: vec![ServiceBackends {
                service_id: "s1".into(),
                name: "web".into(),
                vip: "10.0.7.200".into(),
                backends: vec!["10.0.7.2".into(), "10.0.7.3".into()],
                backends6: vec!["fd00:7::2".into(), "fd00:7::3".into(), "fd00:9::1".into()],
                ..Default::default()
            }],
        }],
        ..Default::default()
    };
    let got = desired(Some(ip("192.168.0.1")), &plumbed(&t), &HashMap::new(), &view);
    got.validate().expect("valid");
    let n = got.network("net-dual").expect("carried");
    let peers: Vec<_> = n.peers.iter().map(|p| (p.address, p.address6)).collect();
    assert_eq!(peers, [(ip("10.0.7.3"), Some(v6(3))), (ip("10.0.7.4"), None)]);
    assert_eq!(n.services[0].backends6, [v6(2), v6(3)]);
    assert_eq!(got.tasks[0].attachments[0].address6, Some(v6(2)));
}
