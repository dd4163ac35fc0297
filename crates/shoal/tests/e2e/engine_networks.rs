//! Swarm networks of each node's engine (issue 32): a macvlan network made as swarm users make one, with the
//! stock docker CLI on the daemon's socket, in this machine's own namespace beside its Docker Engine (the
//! README's daemon with the docker executor). A config-only network on the node (`docker network create
//! --config-only --subnet --ip-range -o parent=`, which the socket gives to the engine), a swarm network
//! taking its settings from it (`-d macvlan --scope swarm --config-from`, which Shoal keeps), and a service of
//! two replicas on it: each container runs on the engine's `macnet` with an address of the node's range, and
//! one reaches the other over macvlan. What such a network cannot do is refused by name; once the service is
//! removed the engine's `macnet` goes, and the test removes its config-only network and the parent link.
//!
//! An ipvlan network given its own parent, mode and subnet (`-d ipvlan --scope swarm -o parent= --subnet`) is
//! made on the engine with them; on a kernel without ipvlan (this machine's) its tasks are rejected with the
//! engine's reason and none loses the network to another's removal.
//!
//! The parent is one end of a veth pair made by the test (macvlan children of one parent reach each other in
//! bridge mode without any wire; this kernel has no `dummy` links). Needs root, the engine and the test image; without
//! the engine the test says so and passes.

use crate::common;

use std::ops::Range;
use std::process::Command;
use std::time::Duration;

use common::container_checks::container_of_task;
use common::*;
use shoal_testkit::docker_engine::{self, engine, engine_ok, EngineDaemon};

const WAIT: Duration = Duration::from_secs(90);

/// The parent link (with its veth peer), removed when dropped. Its name is not Shoal's (`shl*`): it lives in the
/// host's namespace, where the host data-plane tests running beside it count Shoal's links as leftovers.
struct Parent(String);

impl Parent {
    fn new() -> Parent {
        let name = format!("tstpar{}", std::process::id() % 100_000);
        let peer = format!("{name}x");
        let _ = Command::new("ip").args(["link", "del", &name]).output();
        let ok = |args: &[&str]| assert!(Command::new("ip").args(args).status().unwrap().success(), "ip {args:?}");
        ok(&["link", "add", &name, "type", "veth", "peer", "name", &peer]);
        ok(&["link", "set", &name, "up"]);
        ok(&["link", "set", &peer, "up"]);
        Parent(name)
    }
}

impl Drop for Parent {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.0]).output();
    }
}

/// The engine's network `name` and the config-only one, removed when dropped (a failed test leaves neither).
struct EngineNetworks(Vec<String>);

impl Drop for EngineNetworks {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = engine(&["network", "rm", n]);
        }
    }
}

fn fails(d: &EngineDaemon, args: &[&str], fragment: &str) {
    let out = docker_cli::command(d.socket(), args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success() && err.contains(fragment), "docker {args:?}: {err}");
}

#[test]
fn a_macvlan_swarm_network_from_each_nodes_config_only_network_runs_tasks_on_the_engine() {
    let Some(image) = docker_engine::test_image_or_skip() else { return };
    let tag = std::process::id() % 100_000;
    let (cfg, net) = (format!("shlt-maccfg-{tag}"), format!("shlt-macnet-{tag}"));
    let parent = Parent::new();
    let _cleanup = EngineNetworks(vec![net.clone(), cfg.clone()]);
    let d = EngineDaemon::start(&shoal_bin());

    // The node's settings: its engine's config-only network (given to the engine by the socket).
    let parent_opt = format!("parent={}", parent.0);
    docker(
        &d,
        &[
            "network",
            "create",
            "--config-only",
            "--subnet",
            "192.168.231.0/24",
            "--ip-range",
            "192.168.231.128/26",
            "-o",
            &parent_opt,
            &cfg,
        ],
    );
    assert_eq!(engine_ok(&["network", "inspect", &cfg, "--format", "{{.ConfigOnly}}"]).trim(), "true");
    // The swarm network takes them; what it cannot do is refused by name, and nothing is made.
    fails(
        &d,
        &[
            "network",
            "create",
            "-d",
            "macvlan",
            "--scope",
            "swarm",
            "--config-from",
            &cfg,
            "--subnet",
            "10.9.0.0/24",
            "x",
        ],
        "holds the settings",
    );
    fails(
        &d,
        &["network", "create", "-d", "macvlan", "--scope", "swarm", "--attachable", "--config-from", &cfg, "x"],
        "--attachable is not supported on a macvlan network",
    );
    fails(&d, &["network", "create", "-d", "overlay", "--config-from", &cfg, "x"], "--config-from is for the drivers");
    docker(&d, &["network", "create", "-d", "macvlan", "--scope", "swarm", "--config-from", &cfg, &net]);
    let shown = docker(&d, &["network", "inspect", &net, "--format", "{{.Driver}} {{.Scope}} {{.ConfigFrom.Network}}"]);
    assert_eq!(shown.trim(), format!("macvlan swarm {cfg}"));
    // Such a network is each node's own: it is taken alone, and publishes nothing through the routing mesh.
    fails(&d, &["service", "create", "-d", "--name", "x", "--network", &net, "-p", "8080:80", image], "routing mesh");

    two_tasks_reach_each_other(&d, image, &net, "192.168.231.", 128..192);
    let made = engine_ok(&["network", "inspect", &net, "--format", "{{.Driver}} {{.ConfigFrom.Network}}"]);
    assert_eq!(made.trim(), format!("macvlan {cfg}"), "the engine's {net} is made from the node's config");
    remove_service_and_its_engine_network(&d, &net);
    docker(&d, &["network", "rm", &net]);
    docker(&d, &["network", "rm", &cfg]);
}

/// Runs a service `two` of two replicas on `net` and checks each container's address on the engine's `net` (in
/// `prefix` with a last octet in `last`) and that the first task fetches the second's page (its hostname).
fn two_tasks_reach_each_other(d: &EngineDaemon, image: &str, net: &str, prefix: &str, last: Range<u8>) {
    let web = "mkdir -p /www; hostname > /www/index.html; exec httpd -f -p 80 -h /www";
    docker(
        d,
        &["service", "create", "-d", "--name", "two", "--network", net, "--replicas", "2", image, "sh", "-c", web],
    );
    let tasks = wait_until("two's two tasks running", WAIT, || {
        let ts = tasks_of(d, "two");
        let running: Vec<String> =
            ts.iter().filter(|t| state(t) == "running").map(|t| t["ID"].as_str().unwrap().to_string()).collect();
        if running.len() == 2 {
            Ok(running)
        } else {
            Err(format!("{:?}", ts.iter().map(|t| (state(t), t["Status"]["Err"].clone())).collect::<Vec<_>>()))
        }
    });
    let containers: Vec<String> = tasks.iter().map(|t| container_of_task(t)).collect();
    let format = format!("{{{{(index .NetworkSettings.Networks \"{net}\").IPAddress}}}}");
    let addrs: Vec<String> =
        containers.iter().map(|c| engine_ok(&["inspect", "--format", &format, c]).trim().to_string()).collect();
    for a in &addrs {
        let octet: u8 = a.rsplit('.').next().and_then(|o| o.parse().ok()).unwrap_or(0);
        assert!(a.starts_with(prefix) && last.contains(&octet), "{a} is in the node's range: {addrs:?}");
    }
    page_is_the_others_hostname(&containers, &format!("http://{}/", addrs[1]));
}

/// Waits for `containers[0]` to fetch `url` (the second container's page), which is its hostname.
fn page_is_the_others_hostname(containers: &[String], url: &str) {
    let page = wait_until(&format!("a page from the other task at {url}"), WAIT, || {
        let out = engine(&["exec", &containers[0], "wget", "-q", "-O", "-", url]);
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if out.status.success() && !text.is_empty() {
            Ok(text)
        } else {
            Err(String::from_utf8_lossy(&out.stderr).to_string())
        }
    });
    let host = engine_ok(&["inspect", "--format", "{{.Config.Hostname}}", &containers[1]]);
    assert_eq!(page, host.trim());
}

/// Removes the service `two`: its containers go, then the engine's network `net` with the last of them.
fn remove_service_and_its_engine_network(d: &EngineDaemon, net: &str) {
    docker(d, &["service", "rm", "two"]);
    wait_until("the engine's network removed with the last task", WAIT, || {
        let out = engine(&["network", "inspect", net]);
        if out.status.success() {
            Err("still there".into())
        } else {
            Ok(())
        }
    });
}

#[test]
fn an_ipvlan_swarm_network_with_its_own_parent_and_subnet_runs_tasks_on_the_engine() {
    let Some(image) = docker_engine::test_image_or_skip() else { return };
    let net = format!("shlt-ipvnet-{}", std::process::id() % 100_000);
    let parent = Parent::new();
    let _cleanup = EngineNetworks(vec![net.clone()]);
    let d = EngineDaemon::start(&shoal_bin());

    // The second form: the swarm network carries the settings itself (`-o parent=`, its subnet and range), as
    // a one-node swarm or nodes with the same parent name make it.
    let parent_opt = format!("parent={}", parent.0);
    let create = |extra: &[&str], name: &str| {
        let mut args = vec!["network", "create", "-d", "ipvlan", "--scope", "swarm", "--subnet", "192.168.233.0/24"];
        args.extend(["--ip-range", "192.168.233.64/26", "-o", &parent_opt, "-o", "ipvlan_mode=l2"]);
        args.extend(extra);
        args.push(name);
        args.into_iter().map(str::to_string).collect::<Vec<_>>()
    };
    let refused = create(&["--attachable"], "x");
    fails(
        &d,
        &refused.iter().map(String::as_str).collect::<Vec<_>>(),
        "--attachable is not supported on an ipvlan network",
    );
    let made = create(&[], &net);
    docker(&d, &made.iter().map(String::as_str).collect::<Vec<_>>());
    let shown =
        docker(&d, &["network", "inspect", &net, "--format", "{{.Driver}} {{.Scope}} {{.Options.ipvlan_mode}}"]);
    assert_eq!(shown.trim(), "ipvlan swarm l2");

    if kernel_has_ipvlan(&parent.0) {
        two_tasks_reach_each_other(&d, image, &net, "192.168.233.", 64..128);
    } else {
        // This machine's kernel is built without ipvlan (`CONFIG_IPVLAN` unset), so its engine makes the network
        // and cannot put a container on it: each task is rejected with the engine's own reason, as under a
        // Docker manager, and never loses the network to another task's removal ("network ... not found").
        eprintln!("this kernel has no ipvlan links: checking the network made on the engine and the engine's refusal");
        let web = "exec httpd -f -p 80 -h /";
        docker(
            &d,
            &["service", "create", "-d", "--name", "two", "--network", &net, "--replicas", "2", image, "sh", "-c", web],
        );
        wait_until("the engine's refusal on tasks of both slots", WAIT, || {
            let ts = tasks_of(&d, "two");
            let errors: Vec<String> =
                ts.iter().filter_map(|t| t["Status"]["Err"].as_str().map(str::to_string)).collect();
            let lost = errors.iter().find(|e| e.contains("not found"));
            assert!(lost.is_none(), "a task lost the engine's network to another's removal: {errors:?}");
            let refused = errors.iter().filter(|e| e.contains("failed to create the ipvlan port")).count();
            if refused >= 4 {
                Ok(())
            } else {
                Err(format!("{errors:?}"))
            }
        });
    }
    let on_engine = "{{.Driver}} {{.Options.parent}} {{.Options.ipvlan_mode}} {{(index .IPAM.Config 0).Subnet}}";
    let on_engine = engine_ok(&["network", "inspect", &net, "--format", on_engine]);
    assert_eq!(on_engine.trim(), format!("ipvlan {} l2 192.168.233.0/24", parent.0), "the engine's {net}");
    remove_service_and_its_engine_network(&d, &net);
    docker(&d, &["network", "rm", &net]);
}

/// Whether this kernel makes ipvlan links (a child of `parent`, removed at once).
fn kernel_has_ipvlan(parent: &str) -> bool {
    let child = format!("{parent}i");
    let made =
        Command::new("ip").args(["link", "add", "link", parent, &child, "type", "ipvlan", "mode", "l2"]).status();
    let _ = Command::new("ip").args(["link", "del", &child]).output();
    made.is_ok_and(|s| s.success())
}

/// A macvlan swarm network with its own parent and an IPv6 subnet beside its IPv4 one (`--ipv6`): the engine's
/// network is made with both, each task's container has an address in each, and one task fetches the other's
/// page over IPv6. `--ipv6` without an IPv6 subnet, or beside `--config-from`, is refused by name.
#[test]
fn a_macvlan_swarm_network_with_ipv6_gives_tasks_both_addresses_on_the_engine() {
    let Some(image) = docker_engine::test_image_or_skip() else { return };
    let net = format!("shlt-mac6-{}", std::process::id() % 100_000);
    let parent = Parent::new();
    let _cleanup = EngineNetworks(vec![net.clone()]);
    let d = EngineDaemon::start(&shoal_bin());
    let parent_opt = format!("parent={}", parent.0);
    let base = ["network", "create", "-d", "macvlan", "--scope", "swarm", "--ipv6", "-o", &parent_opt];
    fn with<'a>(base: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        base.iter().chain(extra).copied().collect()
    }
    fails(&d, &with(&base, &["--subnet", "192.168.234.0/24", "x"]), "--ipv6 without an IPv6 subnet is not supported");
    fails(
        &d,
        &["network", "create", "-d", "macvlan", "--scope", "swarm", "--ipv6", "--config-from", "cfg", "x"],
        "holds the settings",
    );
    docker(&d, &with(&base, &["--subnet", "192.168.234.0/24", "--subnet", "fd00:234::/64", &net]));

    two_tasks_reach_each_other(&d, image, &net, "192.168.234.", 2..255);
    let on_engine = engine_ok(&["network", "inspect", &net, "--format", "{{.EnableIPv6}} {{json .IPAM.Config}}"]);
    assert!(on_engine.starts_with("true ") && on_engine.contains("fd00:234::/64"), "the engine's {net}: {on_engine}");
    let containers: Vec<String> = tasks_of(&d, "two")
        .iter()
        .filter(|t| state(t) == "running")
        .map(|t| container_of_task(t["ID"].as_str().unwrap()))
        .collect();
    let format = format!("{{{{(index .NetworkSettings.Networks \"{net}\").GlobalIPv6Address}}}}");
    let addrs: Vec<String> =
        containers.iter().map(|c| engine_ok(&["inspect", "--format", &format, c]).trim().to_string()).collect();
    assert!(addrs.len() == 2 && addrs.iter().all(|a| a.starts_with("fd00:234::")), "{addrs:?}");
    page_is_the_others_hostname(&containers, &format!("http://[{}]/", addrs[1]));
    remove_service_and_its_engine_network(&d, &net);
    docker(&d, &["network", "rm", &net]);
}
