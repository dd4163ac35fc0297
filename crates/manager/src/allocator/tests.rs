//! The allocator core against a real store: endpoints and attachments allocated, exhaustion explained on the
//! task, addresses freed when a task stops, and a core rebuilt from the store (a new leader) never giving an
//! address twice.

use std::collections::BTreeSet;
use std::sync::Arc;

use shoal_api::{
    endpoint_spec, port_config, Annotations, EndpointSpec, IpamConfig, IpamOptions, NetworkAttachmentConfig,
    PortConfig, Service, ServiceSpec, Task, TaskSpec, TaskState, TaskStatus,
};
use shoal_store::{ActionKind, Change, Changes, MemoryStore, Object, StoreObject};

use super::core::{Allocator, ALLOCATED_MESSAGE};
use crate::controlapi::network::ingress_network;

struct Fx {
    store: MemoryStore,
    index: u64,
    alloc: Allocator,
}

fn ts() -> shoal_api::prost_types::Timestamp {
    shoal_api::timestamp_from_unix_ms(1_000)
}

impl Fx {
    fn new() -> Fx {
        let mut fx = Fx { store: MemoryStore::default(), index: 0, alloc: Allocator::default() };
        fx.write(|c| {
            c.create(ingress_network("ingress".into(), ts()));
        });
        fx.alloc = fx.store.view(Allocator::build);
        fx
    }

    /// Applies a write and feeds its commit to the allocator, as the loop does.
    fn write(&mut self, f: impl FnOnce(&mut Changes)) {
        let mut c = Changes::new();
        f(&mut c);
        self.index += 1;
        let commit = self.store.apply(self.index, c.actions()).unwrap();
        self.alloc.apply_commit(&commit);
    }

    fn network(&mut self, id: &str, subnet: &str) {
        let mut n = ingress_network(id.into(), ts());
        let spec = n.spec.as_mut().unwrap();
        spec.ingress = false;
        spec.annotations = Some(Annotations { name: id.into(), ..Default::default() });
        n.ipam = Some(IpamOptions {
            driver: None,
            configs: vec![IpamConfig {
                subnet: subnet.into(),
                gateway: subnet.replace(".0/", ".1/").split('/').next().unwrap().into(),
                ..Default::default()
            }],
        });
        n.driver_state = None;
        self.write(|c| {
            c.create(n);
        });
    }

    fn service(&mut self, id: &str, nets: &[&str], ports: Vec<PortConfig>) {
        let spec = ServiceSpec {
            annotations: Some(Annotations { name: id.into(), ..Default::default() }),
            task: Some(TaskSpec {
                networks: nets
                    .iter()
                    .map(|n| NetworkAttachmentConfig { target: n.to_string(), ..Default::default() })
                    .collect(),
                ..Default::default()
            }),
            endpoint: Some(EndpointSpec { mode: endpoint_spec::ResolutionMode::Vip as i32, ports }),
            ..Default::default()
        };
        self.write(|c| {
            c.create(Service { id: id.into(), spec: Some(spec), ..Default::default() });
        });
    }

    fn tasks(&mut self, service: &str, n: usize) {
        let spec = self.store.view(|t| t.services().get(service).unwrap().spec.clone().unwrap().task);
        self.write(|c| {
            for i in 0..n {
                let mut t = Task {
                    id: format!("{service}.{i}"),
                    service_id: service.into(),
                    slot: i as u64,
                    spec: spec.clone().map(Into::into),
                    status: Some(TaskStatus { state: TaskState::New as i32, ..Default::default() }),
                    ..Default::default()
                };
                t.set_desired_state(TaskState::Running);
                c.create(t);
            }
        });
    }

    /// An `--ipv6` network `id`, made by the control API as `docker network create` makes it.
    fn ipv6_network(&mut self, id: &str, subnet: &str, subnet6: &str, range6: &str) {
        let spec = shoal_api::NetworkSpec {
            annotations: Some(Annotations { name: id.into(), ..Default::default() }),
            ipv6_enabled: true,
            ipam: Some(IpamOptions {
                driver: None,
                configs: vec![
                    IpamConfig { subnet: subnet.into(), ..Default::default() },
                    IpamConfig { subnet: subnet6.into(), range: range6.into(), ..Default::default() },
                ],
            }),
            ..Default::default()
        };
        let (_, c) = self.store.view(|t| {
            let mut c = Changes::new();
            let n = crate::controlapi::network::create_overlay(t, &mut c, id.into(), ts(), &spec, 16).unwrap();
            (n, c)
        });
        self.index += 1;
        let commit = self.store.apply(self.index, c.actions()).unwrap();
        self.alloc.apply_commit(&commit);
    }

    /// One pass over everything, its writes applied.
    fn pass(&mut self) -> bool {
        let out = self.store.view(|t| {
            let services: BTreeSet<String> = t.services().iter().map(|s| s.id.clone()).collect();
            self.alloc.pass(t, &services, &BTreeSet::new(), true, ts())
        });
        let blocked = out.blocked;
        if !out.services.is_empty() {
            self.write(|c| {
                for s in out.services {
                    c.update(s);
                }
            });
        }
        if !out.tasks.is_empty() {
            self.write(|c| {
                for t in out.tasks {
                    c.update(t);
                }
            });
        }
        blocked
    }

    fn task(&self, id: &str) -> Arc<Task> {
        self.store.view(|t| t.tasks().get(id).cloned()).unwrap()
    }

    fn set_state(&mut self, id: &str, state: TaskState) {
        let mut t = (*self.task(id)).clone();
        t.status.as_mut().unwrap().state = state as i32;
        self.write(|c| {
            c.update(t);
        });
    }

    /// Every address held in the store: service VIPs, and task addresses of tasks not stopped.
    fn held(&self) -> Vec<String> {
        self.store.view(|t| {
            let vips = t.services().iter().flat_map(|s| {
                s.endpoint
                    .iter()
                    .flat_map(|e| e.virtual_ips.iter())
                    .map(|v| format!("{}:{}", v.network_id, v.addr))
                    .collect::<Vec<_>>()
            });
            let tasks =
                t.tasks().iter().filter(|task| crate::tasks::observed_state(task) <= TaskState::Running).flat_map(
                    |task| {
                        task.networks
                            .iter()
                            .flat_map(|a| {
                                a.addresses.iter().map(move |x| format!("{}:{x}", a.network.as_ref().unwrap().id))
                            })
                            .collect::<Vec<_>>()
                    },
                );
            vips.chain(tasks).collect()
        })
    }
}

fn assert_unique(held: &[String]) {
    let set: BTreeSet<&String> = held.iter().collect();
    assert_eq!(set.len(), held.len(), "an address is held twice: {held:?}");
}

#[test]
fn a_service_gets_a_vip_and_its_tasks_addresses_in_the_subnet_then_pending() {
    let mut fx = Fx::new();
    fx.network("appnet", "10.0.1.0/24");
    fx.service("web", &["appnet"], vec![]);
    fx.tasks("web", 3);
    assert!(!fx.pass());
    let s = fx.store.view(|t| t.services().get("web").cloned()).unwrap();
    let ep = s.endpoint.as_ref().unwrap();
    assert_eq!(ep.virtual_ips.len(), 1);
    assert_eq!(ep.virtual_ips[0].network_id, "appnet");
    assert_eq!(ep.virtual_ips[0].addr, "10.0.1.2/24", "the gateway is .1");
    for i in 0..3 {
        let t = fx.task(&format!("web.{i}"));
        assert_eq!(t.status.as_ref().unwrap().state(), TaskState::Pending);
        assert_eq!(t.status.as_ref().unwrap().message, ALLOCATED_MESSAGE);
        assert_eq!(t.endpoint.as_deref(), Some(ep));
        assert_eq!(t.networks.len(), 1);
        assert_eq!(t.networks[0].network.as_ref().unwrap().id, "appnet");
        assert!(t.networks[0].addresses[0].starts_with("10.0.1."), "{:?}", t.networks[0].addresses);
    }
    assert_unique(&fx.held());
    // Nothing left to do: a second pass writes nothing.
    let out = fx
        .store
        .view(|t| fx.alloc.pass(t, &t.services().iter().map(|s| s.id.clone()).collect(), &BTreeSet::new(), true, ts()));
    assert!(out.services.is_empty() && out.tasks.is_empty());
}

#[test]
fn exhaustion_is_explained_on_the_task_and_freed_addresses_are_given_again() {
    let mut fx = Fx::new();
    fx.network("small", "10.0.9.0/29");
    fx.service("web", &["small"], vec![]);
    fx.tasks("web", 6);
    assert!(fx.pass(), "some task waits for an address");
    // A /29 has 5 host addresses beside the gateway: one VIP, four tasks.
    let states: Vec<TaskState> =
        (0..6).map(|i| fx.task(&format!("web.{i}")).status.as_ref().unwrap().state()).collect();
    assert_eq!(states.iter().filter(|s| **s == TaskState::Pending).count(), 4, "{states:?}");
    let waiting: Vec<_> = (0..6)
        .map(|i| fx.task(&format!("web.{i}")))
        .filter(|t| t.status.as_ref().unwrap().state() == TaskState::New)
        .collect();
    assert_eq!(waiting.len(), 2);
    for t in &waiting {
        assert_eq!(t.status.as_ref().unwrap().err, "no IP address left in network small");
    }
    // A task that stops frees its address; the next pass gives it to a waiting task.
    let running = (0..6)
        .map(|i| format!("web.{i}"))
        .find(|id| fx.task(id).status.as_ref().unwrap().state() == TaskState::Pending)
        .unwrap();
    fx.set_state(&running, TaskState::Failed);
    assert!(fx.pass());
    let count = |fx: &Fx, s: TaskState| {
        (0..6).filter(|i| fx.task(&format!("web.{i}")).status.as_ref().unwrap().state() == s).count()
    };
    assert_eq!((count(&fx, TaskState::Pending), count(&fx, TaskState::New)), (4, 1));
    assert_unique(&fx.held());
}

#[test]
fn a_core_rebuilt_from_the_store_continues_without_giving_an_address_twice() {
    let mut fx = Fx::new();
    fx.network("appnet", "10.0.1.0/24");
    fx.service("a", &["appnet"], vec![]);
    fx.tasks("a", 10);
    fx.pass();
    // A new leader: the core comes from the store alone.
    fx.alloc = fx.store.view(Allocator::build);
    fx.service("b", &["appnet"], vec![]);
    fx.tasks("b", 10);
    fx.pass();
    let held = fx.held();
    assert_eq!(held.len(), 22);
    assert_unique(&held);
}

#[test]
fn ingress_ports_are_held_once_and_missing_ones_come_from_the_dynamic_range() {
    let mut fx = Fx::new();
    let port = |published: u32, mode: port_config::PublishMode| PortConfig {
        protocol: port_config::Protocol::Tcp as i32,
        target_port: 80,
        published_port: published,
        publish_mode: mode as i32,
        ..Default::default()
    };
    fx.service(
        "a",
        &[],
        vec![port(8080, port_config::PublishMode::Ingress), port(0, port_config::PublishMode::Ingress)],
    );
    fx.service("h", &[], vec![port(9000, port_config::PublishMode::Host)]);
    fx.tasks("a", 1);
    fx.tasks("h", 1);
    fx.pass();
    let a = fx.store.view(|t| t.services().get("a").cloned()).unwrap();
    let ep = a.endpoint.as_ref().unwrap();
    assert_eq!(ep.ports.iter().map(|p| p.published_port).collect::<Vec<_>>(), [8080, 30000]);
    assert_eq!(ep.virtual_ips.len(), 1, "a VIP on ingress");
    assert_eq!(ep.virtual_ips[0].network_id, "ingress");
    let t = fx.task("a.0");
    assert_eq!(t.networks[0].network.as_ref().unwrap().id, "ingress", "attached to ingress");
    let h = fx.task("h.0");
    assert_eq!(h.status.as_ref().unwrap().state(), TaskState::Pending);
    assert!(h.networks.is_empty(), "host-mode ports need no network");
    assert_eq!(h.endpoint.as_ref().unwrap().ports[0].published_port, 9000);
    // A second service asking for 8080 (racing the control API's check) is not given it.
    fx.service("b", &[], vec![port(8080, port_config::PublishMode::Ingress)]);
    fx.tasks("b", 1);
    fx.pass();
    let b = fx.task("b.0");
    assert_eq!(b.status.as_ref().unwrap().state(), TaskState::New);
    assert_eq!(b.status.as_ref().unwrap().err, "port 8080 is already in use by service a as an ingress port");
    // Removing a frees its ports: b gets 8080 on the next pass.
    let a = fx.store.view(|t| t.services().get("a").cloned()).unwrap();
    fx.write(|c| {
        c.remove(a);
    });
    fx.pass();
    assert_eq!(fx.task("b.0").status.as_ref().unwrap().state(), TaskState::Pending);
    assert!(fx.store.view(|t| t.services().get("b").unwrap().version()) > 0);
}

#[test]
fn every_node_gets_one_ingress_address_kept_across_leaders_and_freed_with_the_node() {
    let mut fx = Fx::new();
    fx.write(|c| {
        for i in 0..3 {
            c.create(shoal_api::Node { id: format!("node{i}"), ..Default::default() });
        }
    });
    let nodes_pass = |fx: &mut Fx| {
        let mut out = super::AllocatePass::default();
        fx.store.view(|t| fx.alloc.allocate_nodes(t, &BTreeSet::new(), true, &mut out));
        let written = out.nodes.len();
        if written > 0 {
            fx.write(|c| {
                for n in out.nodes {
                    c.update(n);
                }
            });
        }
        written
    };
    assert_eq!(nodes_pass(&mut fx), 3);
    let addr = |fx: &Fx, id: &str| {
        fx.store.view(|t| {
            let n = t.nodes().get(id).unwrap().clone();
            assert_eq!(n.attachments.len(), 1, "{n:?}");
            assert_eq!(n.attachments[0].network.as_ref().unwrap().id, "ingress");
            n.attachments[0].addresses[0].clone()
        })
    };
    let first: Vec<String> = (0..3).map(|i| addr(&fx, &format!("node{i}"))).collect();
    assert_unique(&first);
    assert!(first.iter().all(|a| a.starts_with("10.0.0.") && a.ends_with("/24")), "{first:?}");
    assert_eq!(nodes_pass(&mut fx), 0, "nothing to do twice");
    // A new leader keeps them and gives tasks other addresses.
    fx.alloc = fx.store.view(Allocator::build);
    assert_eq!(nodes_pass(&mut fx), 0);
    let port = PortConfig {
        protocol: port_config::Protocol::Tcp as i32,
        target_port: 80,
        published_port: 8080,
        publish_mode: port_config::PublishMode::Ingress as i32,
        ..Default::default()
    };
    fx.service("web", &[], vec![port]);
    fx.tasks("web", 3);
    fx.pass();
    let mut held = fx.held();
    held.extend(first.iter().map(|a| format!("ingress:{a}")));
    assert_eq!(held.len(), 3 + 3 + 1);
    assert_unique(&held);
    // A removed node frees its address (as the next leader's pools, built from the store, agree).
    let free = |fx: &Fx| fx.alloc.free_addresses("ingress").unwrap();
    let before = free(&fx);
    let gone = fx.store.view(|t| t.nodes().get("node1").unwrap().clone());
    fx.write(|c| {
        c.remove(gone);
    });
    assert_eq!(free(&fx), before + 1);
    assert_eq!(fx.store.view(Allocator::build).free_addresses("ingress"), Some(before + 1));
    // The ingress network removed: the nodes' attachments to it go.
    let web = fx.store.view(|t| t.services().get("web").unwrap().clone());
    let ingress = fx.store.view(|t| t.networks().get("ingress").unwrap().clone());
    fx.write(|c| {
        c.remove(web);
        c.remove(ingress);
    });
    assert_eq!(nodes_pass(&mut fx), 2);
    assert!(fx.store.view(|t| t.nodes().iter().all(|n| n.attachments.is_empty())));
}

#[test]
fn a_task_on_a_predefined_network_gets_its_attachment_without_an_address_and_its_service_no_vip() {
    let mut fx = Fx::new();
    let made = fx.store.view(|t| super::predefined::missing_predefined_networks(t, &NoIds, ts()));
    let names: Vec<&str> = made.iter().filter_map(|n| n.unique_name()).collect();
    assert_eq!(names, ["host", "bridge"]);
    assert_eq!(made.iter().map(|n| n.predefined_driver()).collect::<Vec<_>>(), [Some("host"), Some("bridge")]);
    let host_id = made[0].id.clone();
    fx.write(|c| {
        for n in made {
            c.create(n);
        }
    });
    assert!(fx.store.view(|t| super::predefined::missing_predefined_networks(t, &NoIds, ts())).is_empty(), "made once");
    fx.service("agent", &[&host_id], vec![]);
    fx.tasks("agent", 2);
    assert!(!fx.pass());
    let s = fx.store.view(|t| t.services().get("agent").cloned()).unwrap();
    assert!(s.endpoint.as_ref().is_none_or(|e| e.virtual_ips.is_empty()), "no VIP on the host network: {s:?}");
    for i in 0..2 {
        let t = fx.task(&format!("agent.{i}"));
        assert_eq!(t.status.as_ref().unwrap().state(), TaskState::Pending);
        assert_eq!(t.networks.len(), 1);
        assert_eq!(t.networks[0].predefined_driver(), Some("host"));
        assert!(t.networks[0].addresses.is_empty());
        assert!(!t.on_overlay());
    }
}

#[test]
fn a_node_gets_an_address_on_each_network_of_its_running_tasks_until_the_last_one_ends() {
    let mut fx = Fx::new();
    fx.network("front", "10.1.0.0/24");
    fx.network("back", "10.2.0.0/24");
    fx.write(|c| {
        for i in 0..2 {
            c.create(shoal_api::Node { id: format!("node{i}"), ..Default::default() });
        }
    });
    fx.service("web", &["front", "back"], vec![]);
    fx.tasks("web", 3);
    fx.pass();
    // The scheduler's turn: web.0 and web.1 on node0, web.2 on node1; node0's changes revisit only node0.
    let mut revisit = BTreeSet::new();
    for (task, node) in [("web.0", "node0"), ("web.1", "node0"), ("web.2", "node1")] {
        let mut t = (*fx.task(task)).clone();
        t.node_id = node.into();
        t.status.as_mut().unwrap().state = TaskState::Assigned as i32;
        let before = Object::Task(fx.task(task));
        let ch = Change { kind: ActionKind::Update, object: Object::Task(Arc::new(t.clone())), old: Some(before) };
        revisit.extend(super::core::nodes_to_revisit(&ch));
        fx.write(|c| {
            c.update(t);
        });
    }
    assert_eq!(revisit, BTreeSet::from(["node0".to_string(), "node1".to_string()]));
    let nodes_pass = |fx: &mut Fx| {
        let mut out = super::AllocatePass::default();
        fx.store.view(|t| fx.alloc.allocate_nodes(t, &BTreeSet::new(), true, &mut out));
        let written = out.nodes.len();
        fx.write(|c| {
            for n in out.nodes {
                c.update(n);
            }
        });
        written
    };
    let attached = |fx: &Fx, node: &str| -> Vec<(String, String)> {
        fx.store.view(|t| {
            let n = t.nodes().get(node).unwrap().clone();
            let mut v: Vec<(String, String)> =
                n.attachments.iter().map(|a| (a.network.as_ref().unwrap().id.clone(), a.addresses.join(","))).collect();
            v.sort();
            v
        })
    };
    assert_eq!(nodes_pass(&mut fx), 2);
    let node0 = attached(&fx, "node0");
    assert_eq!(node0.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["back", "front", "ingress"]);
    assert!(node0[0].1.starts_with("10.2.0.") && node0[0].1.ends_with("/24"), "{node0:?}");
    assert!(node0[1].1.starts_with("10.1.0."), "{node0:?}");
    // The attachment carries the whole network (its driver state and IPAM), as a Docker Engine reads it.
    let carried = fx.store.view(|t| t.nodes().get("node0").unwrap().attachments.clone());
    let front = carried.iter().find(|a| a.network.as_ref().unwrap().id == "front").unwrap();
    assert_eq!(front.network.as_ref().unwrap().ipam.as_ref().unwrap().configs[0].subnet, "10.1.0.0/24");
    assert_eq!(nodes_pass(&mut fx), 0, "nothing to do twice");
    // No address is held twice, by tasks, VIPs or nodes, and a new leader agrees.
    let mut held = fx.held();
    for node in ["node0", "node1"] {
        held.extend(attached(&fx, node).into_iter().map(|(n, a)| format!("{n}:{a}")));
    }
    assert_unique(&held);
    let rebuilt = fx.store.view(Allocator::build);
    for net in ["front", "back"] {
        assert_eq!(rebuilt.free_addresses(net), fx.alloc.free_addresses(net), "{net}");
    }
    // One of node0's tasks ends: it keeps its attachments; the last one ends: they go, and their addresses
    // are free again.
    fx.set_state("web.0", TaskState::Complete);
    assert_eq!(nodes_pass(&mut fx), 0);
    let free_before = fx.alloc.free_addresses("front").unwrap();
    fx.set_state("web.1", TaskState::Failed);
    assert_eq!(nodes_pass(&mut fx), 1);
    assert_eq!(attached(&fx, "node0").iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["ingress"]);
    assert_eq!(fx.alloc.free_addresses("front").unwrap(), free_before + 2, "the task's and the node's");
    assert_eq!(attached(&fx, "node1").len(), 3);
}

/// IDs for `missing_predefined_networks` in a test: the name's own.
#[derive(Debug)]
struct NoIds;

impl shoal_store::IdSource for NoIds {
    fn new_id(&self) -> String {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        format!("predefined-{}", N.fetch_add(1, std::sync::atomic::Ordering::SeqCst))
    }
}

/// An overlay of two subnets (docs/design/overlay-subnets.md, part 1), made by the control API's write: the
/// VIP and the tasks take addresses from the first subnet while its small IP range has room, then from the
/// second, each with its own subnet's prefix; a freed address of the first is the next one given; and a core
/// rebuilt from the store agrees.
#[test]
fn a_network_of_two_subnets_fills_the_first_range_then_the_second() {
    let mut fx = Fx::new();
    let spec = shoal_api::NetworkSpec {
        annotations: Some(Annotations { name: "two".into(), ..Default::default() }),
        ipam: Some(IpamOptions {
            driver: None,
            configs: vec![
                IpamConfig { subnet: "10.30.0.0/24".into(), range: "10.30.0.8/30".into(), ..Default::default() },
                IpamConfig { subnet: "10.31.0.0/24".into(), ..Default::default() },
            ],
        }),
        ..Default::default()
    };
    let net = fx.store.view(|t| {
        let mut c = Changes::new();
        let n = crate::controlapi::network::create_overlay(
            t,
            &mut c,
            "two".into(),
            ts(),
            &spec,
            crate::limits::MAX_OVERLAY_SUBNETS,
        )
        .unwrap();
        (n, c)
    });
    let (n, c) = net;
    fx.index += 1;
    let commit = fx.store.apply(fx.index, c.actions()).unwrap();
    fx.alloc.apply_commit(&commit);
    assert_eq!(crate::controlapi::network::vxlan_ids(&n).len(), 2);
    fx.service("web", &["two"], vec![]);
    fx.tasks("web", 5);
    assert!(!fx.pass());
    let s = fx.store.view(|t| t.services().get("web").cloned()).unwrap();
    assert_eq!(s.endpoint.as_ref().unwrap().virtual_ips[0].addr, "10.30.0.8/24", "the VIP from the first pool");
    let mut got: Vec<String> = (0..5).map(|i| fx.task(&format!("web.{i}")).networks[0].addresses[0].clone()).collect();
    got.sort();
    assert_eq!(got, ["10.30.0.10/24", "10.30.0.11/24", "10.30.0.9/24", "10.31.0.2/24", "10.31.0.3/24"]);
    assert_unique(&fx.held());
    let rebuilt = fx.store.view(Allocator::build);
    assert_eq!(rebuilt.free_addresses("two"), fx.alloc.free_addresses("two"));
    assert_eq!(fx.alloc.free_addresses("two"), Some(253 - 2));
    // A task on the first subnet ends: its address is the next one a new task gets.
    let first = (0..5).find(|i| fx.task(&format!("web.{i}")).networks[0].addresses[0] == "10.30.0.9/24").unwrap();
    fx.set_state(&format!("web.{first}"), TaskState::Failed);
    let spec_task = fx.task("web.0").spec.clone();
    fx.write(|c| {
        let mut t = Task {
            id: "web.new".into(),
            service_id: "web".into(),
            slot: 9,
            spec: spec_task,
            status: Some(TaskStatus { state: TaskState::New as i32, ..Default::default() }),
            ..Default::default()
        };
        t.set_desired_state(TaskState::Running);
        c.create(t);
    });
    assert!(!fx.pass());
    assert_eq!(fx.task("web.new").networks[0].addresses[0], "10.30.0.9/24");
}

/// An `--ipv6` network made by the control API: each task gets its IPv4 address and its IPv6 one, second; the
/// VIP is IPv4 only; a core rebuilt from the store gives no IPv6 address twice; a small IPv6 range runs out
/// and the task waits, naming it.
#[test]
fn a_task_on_an_ipv6_network_gets_an_ipv4_and_an_ipv6_address_and_the_vip_stays_ipv4() {
    let mut fx = Fx::new();
    fx.ipv6_network("dual", "10.40.0.0/24", "fd00:40::/64", "fd00:40::10/126");
    fx.service("web", &["dual"], vec![]);
    fx.tasks("web", 3);
    assert!(!fx.pass());
    let s = fx.store.view(|t| t.services().get("web").cloned()).unwrap();
    let vips = &s.endpoint.as_ref().unwrap().virtual_ips;
    assert_eq!((vips.len(), vips[0].addr.as_str()), (1, "10.40.0.2/24"), "one IPv4 VIP");
    let mut got: Vec<Vec<String>> =
        (0..3).map(|i| fx.task(&format!("web.{i}")).networks[0].addresses.clone()).collect();
    got.sort();
    assert_eq!(
        got,
        [["10.40.0.3/24", "fd00:40::10/64"], ["10.40.0.4/24", "fd00:40::11/64"], ["10.40.0.5/24", "fd00:40::12/64"]]
    );
    assert_unique(&fx.held());
    // A new leader's core, rebuilt from the store, continues past the held IPv6 addresses; the range's
    // fourth is the last.
    fx.alloc = fx.store.view(Allocator::build);
    let spec_task = fx.task("web.0").spec.clone();
    fx.write(|c| {
        for i in 3..5 {
            let mut t = Task {
                id: format!("web.{i}"),
                service_id: "web".into(),
                slot: i,
                spec: spec_task.clone(),
                status: Some(TaskStatus { state: TaskState::New as i32, ..Default::default() }),
                ..Default::default()
            };
            t.set_desired_state(TaskState::Running);
            c.create(t);
        }
    });
    assert!(fx.pass(), "a task waits for an IPv6 address");
    let mut states: Vec<(TaskState, String, Vec<String>)> = (3..5)
        .map(|i| {
            let t = fx.task(&format!("web.{i}"));
            let st = t.status.as_ref().unwrap();
            (st.state(), st.err.clone(), t.networks.first().map(|a| a.addresses.clone()).unwrap_or_default())
        })
        .collect();
    states.sort_by_key(|s| s.0 as i32);
    assert_eq!(states[0].0, TaskState::New);
    assert_eq!(states[0].1, "no IPv6 address left in network dual");
    assert_eq!(states[1].2, ["10.40.0.6/24", "fd00:40::13/64"]);
    assert_unique(&fx.held());
}

/// On an `--ipv6` network a task that ends frees both its addresses (the IPv6 one is given again), a node's own
/// attachment there (its load-balancer endpoint) is IPv4 only, and a core rebuilt from the store counts the same
/// free IPv6 addresses.
#[test]
fn an_ended_task_frees_its_ipv6_address_and_a_nodes_attachment_stays_ipv4() {
    let mut fx = Fx::new();
    fx.ipv6_network("dual", "10.41.0.0/24", "fd00:41::/64", "fd00:41::/126");
    fx.write(|c| {
        c.create(shoal_api::Node { id: "node0".into(), ..Default::default() });
    });
    fx.service("web", &["dual"], vec![]);
    fx.tasks("web", 3);
    assert!(fx.pass(), "one task waits for an IPv6 address");
    // The range's four addresses less the subnet-router anycast one (fd00:41::) and the gateway (fd00:41::1).
    assert_eq!(fx.alloc.free6_addresses("dual"), Some(0), "two tasks took the range's last two");
    let ended = fx.task("web.0").networks[0].addresses.clone();
    assert!(ended[1].starts_with("fd00:41::") && ended[1].ends_with("/64"), "{ended:?}");
    let waiting: Vec<String> =
        (0..3).map(|i| format!("web.{i}")).filter(|id| fx.task(id).networks.is_empty()).collect();
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    fx.set_state("web.0", TaskState::Complete);
    assert_eq!(fx.alloc.free6_addresses("dual"), Some(1));
    assert!(!fx.pass());
    let got = fx.task(&waiting[0]).networks[0].addresses.clone();
    assert_eq!(got[1], ended[1], "the freed IPv6 address is given again");
    assert_unique(&fx.held());
    // A task placed on node0: the node's attachment on the network has one address, an IPv4 one.
    let mut t = (*fx.task("web.1")).clone();
    t.node_id = "node0".into();
    t.status.as_mut().unwrap().state = TaskState::Assigned as i32;
    fx.write(|c| {
        c.update(t);
    });
    let mut out = super::AllocatePass::default();
    fx.store.view(|t| fx.alloc.allocate_nodes(t, &BTreeSet::new(), true, &mut out));
    let node = out.nodes.iter().find(|n| n.id == "node0").expect("node0 gets attachments");
    let dual = node.attachments.iter().find(|a| a.network.as_ref().unwrap().id == "dual").unwrap();
    assert_eq!(dual.addresses.len(), 1, "{dual:?}");
    assert!(dual.addresses[0].starts_with("10.41.0.") && dual.addresses[0].ends_with("/24"), "{dual:?}");
    fx.write(|c| {
        for n in out.nodes {
            c.update(n);
        }
    });
    let rebuilt = fx.store.view(Allocator::build);
    assert_eq!(rebuilt.free6_addresses("dual"), fx.alloc.free6_addresses("dual"));
    assert_eq!(rebuilt.free_addresses("dual"), fx.alloc.free_addresses("dual"));
}
