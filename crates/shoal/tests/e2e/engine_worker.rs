//! A stock Docker Engine (Debian's dockerd, started by the test in a network namespace of its own:
//! `shoal_testkit::second_engine`) joins a Shoal cluster as a worker with `docker swarm join` and runs its
//! tasks: Shoal sees it Ready with the engine's hostname and version, services constrained to it run as its
//! containers, their logs come back through the LogBroker, a killed container is replaced, scale to 0 and drain
//! empty it, it survives a leader failover and Shoal sees it leave. docs/engine-worker.md says what the engine
//! calls and what Shoal answers.
//!
//! Needs root, the docker CLI, dockerd (docker.io) and the main engine running (its storage driver and the test
//! image are reused); fails where the engine is missing, unless `SHOAL_TEST_SKIP_MISSING` names it
//! (`shoal_testkit::prerequisites`).

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::Value;
use shoal_testkit::docker_engine;
use shoal_testkit::second_engine::{EngineOptions, SecondEngine};
use shoal_testkit::DaemonOptions;

/// How long the engine may take to join and be seen Ready.
const JOIN_LIMIT: Duration = Duration::from_secs(90);
/// How long tasks may take to reach a state on the engine.
const TASK_LIMIT: Duration = Duration::from_secs(90);

/// Starts the second engine (tag `tag`, hostname `engine-<tag>`, `managers` addresses for Shoal managers),
/// or `None` (with a message) where there is no engine to copy from.
fn engine(tag: &str, managers: usize) -> Option<SecondEngine> {
    if shoal_testkit::prerequisites::skip_unless(shoal_testkit::prerequisites::Prerequisite::Dockerd) {
        return None;
    }
    Some(SecondEngine::start(EngineOptions {
        tag: tag.to_string(),
        hostname: format!("engine-{tag}"),
        manager_ips: managers,
    }))
}

/// A Shoal manager listening on the engine's `i`-th manager address; with `join`, joining that manager's
/// cluster as a manager.
fn shoal_manager(eng: &SecondEngine, i: usize, join: Option<&DaemonProcess>) -> DaemonProcess {
    let mut opts = DaemonOptions {
        listen_ip: Some(eng.manager_ip(i)),
        hostname: Some(format!("shoal-{i}")),
        ..DaemonOptions::default()
    };
    if let Some(j) = join {
        opts.extra_args = vec![
            "--join-addr".into(),
            j.remote_addr(),
            "--join-token".into(),
            shoal_testkit::managers::join_token(j, "Manager"),
        ];
    }
    DaemonProcess::start_with(&shoal_bin(), opts)
}

/// `kill -9` of the leader of `managers` (manager i is `shoal-{i}`: `shoal_manager`); waits until a survivor
/// sees a new leader and returns that survivor's index.
fn kill_the_leader(managers: &mut [DaemonProcess; 3]) -> usize {
    let leader = shoal_testkit::managers::leader_seen_by(&managers[0]).expect("a leader");
    let li: usize =
        leader.strip_prefix("shoal-").and_then(|i| i.parse().ok()).expect("the leader is a shoal-i manager");
    managers[li].kill9();
    let survivor = (li + 1) % 3;
    wait_until("a new leader", JOIN_LIMIT, || {
        let l = shoal_testkit::managers::leader_seen_by(&managers[survivor])?;
        if l != leader {
            Ok(())
        } else {
            Err(format!("still {l}"))
        }
    });
    survivor
}

/// `docker` against a Shoal manager's control socket.
fn shoal(d: &DaemonProcess, args: &[&str]) -> String {
    docker_cli::ok(d.socket(), args)
}

/// The engine joins `d`'s cluster as a worker; waits until `d` lists it Ready and returns its node ID.
fn join(eng: &SecondEngine, d: &DaemonProcess) -> String {
    let token = shoal_testkit::managers::join_token(d, "Worker");
    let out = eng.docker(&["swarm", "join", "--token", &token, "--advertise-addr", &eng.ip(), &d.remote_addr()]);
    assert!(
        out.status.success(),
        "docker swarm join failed: {}{}\ndockerd log:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        eng.log_tail()
    );
    let node_id = eng.docker_ok(&["info", "--format", "{{.Swarm.NodeID}}"]).trim().to_string();
    assert!(!node_id.is_empty(), "the engine names no node ID after joining");
    wait_until(&format!("node {node_id} Ready on Shoal"), JOIN_LIMIT, || {
        let ls = shoal(d, &["node", "ls", "--format", "{{.ID}} {{.Hostname}} {{.Status}}"]);
        if ls.lines().any(|l| l == format!("{node_id} {} Ready", eng.hostname())) {
            Ok(())
        } else {
            Err(ls)
        }
    });
    node_id
}

/// Tasks of `service` as `docker service ps` shows them: (node hostname, desired state, current state) lines;
/// none once the service is removed.
fn service_ps(d: &DaemonProcess, service: &str) -> Vec<(String, String, String)> {
    let format = "{{.Node}}|{{.DesiredState}}|{{.CurrentState}}";
    let out = docker_cli::run(d.socket(), &["service", "ps", "--no-trunc", "--format", format, service]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() || err.contains("no such service"), "docker service ps {service}: {err}");
    text.lines()
        .filter_map(|l| {
            let mut p = l.split('|');
            Some((p.next()?.to_string(), p.next()?.to_string(), p.next()?.to_string()))
        })
        .collect()
}

/// Waits until the engine runs exactly `n` containers of `service` and `docker service ps` shows `n` tasks
/// running on the engine; returns the container IDs.
fn wait_engine_containers(eng: &SecondEngine, d: &DaemonProcess, service: &str, n: usize) -> Vec<String> {
    wait_until(&format!("{n} containers of {service} on the engine"), TASK_LIMIT, || {
        let ids = eng.running_with_label("com.docker.swarm.service.name", service);
        let ps = service_ps(d, service);
        let running = ps
            .iter()
            .filter(|(node, want, now)| node == eng.hostname() && want == "Running" && now.starts_with("Running"))
            .count();
        if ids.len() == n && running == n {
            Ok(ids)
        } else {
            Err(format!("{} containers, service ps: {ps:?}", ids.len()))
        }
    })
}

#[test]
fn a_stock_engine_joins_and_is_ready_with_its_hostname_and_version() {
    let Some(eng) = engine("j", 1) else { return };
    let d = shoal_manager(&eng, 0, None);
    let node_id = join(&eng, &d);
    let version = eng.docker_ok(&["version", "--format", "{{.Server.Version}}"]).trim().to_string();
    let node: Value =
        serde_json::from_str(&shoal(&d, &["node", "inspect", "--format", "{{json .}}", &node_id])).expect("node JSON");
    assert_eq!(node["Description"]["Hostname"], eng.hostname(), "{node}");
    assert_eq!(node["Description"]["Engine"]["EngineVersion"], version.as_str(), "{node}");
    assert_eq!(node["Spec"]["Role"], "worker", "{node}");
    assert_eq!(node["Status"]["Addr"], eng.ip().as_str(), "{node}");
    let ls = shoal(&d, &["node", "ls", "--format", "{{.Hostname}} {{.EngineVersion}}"]);
    assert!(ls.lines().any(|l| l == format!("{} {version}", eng.hostname())), "{ls}");
    // The engine sees itself in Shoal's swarm, as a worker.
    let info: Value =
        serde_json::from_str(&eng.docker_ok(&["info", "--format", "{{json .Swarm}}"])).expect("engine's swarm info");
    assert_eq!(info["LocalNodeState"], "active", "{info}");
    assert_eq!(info["ControlAvailable"], false, "{info}");
    let cluster_id = d.get("/v1.47/swarm")["ID"].as_str().unwrap_or_default().to_string();
    assert_eq!(info["Cluster"]["ID"].as_str().unwrap_or(&cluster_id), cluster_id, "{info}");

    // Promoting it is refused: as a manager the engine would join Shoal's Raft without being able to take
    // part (docs/engine-worker.md), and this one-manager cluster would lose quorum.
    let out = docker_cli::run(d.socket(), &["node", "promote", &node_id]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "docker node promote of the engine succeeded");
    assert!(err.contains(&format!("runs Docker Engine {version}, not Shoal")), "{err}");
    let node: Value =
        serde_json::from_str(&shoal(&d, &["node", "inspect", "--format", "{{json .}}", &node_id])).expect("node JSON");
    assert_eq!(node["Spec"]["Role"], "worker", "{node}");
    assert_eq!(shoal_testkit::managers::leader_seen_by(&d).expect("a leader"), "shoal-0");
}

/// The command of the tests' containers: a numbered line a second, leaving at once on SIGTERM (a shell as PID 1
/// ignores it otherwise, and the engine would wait its 10 s grace period on every stop).
const TALKER: &str = "trap 'exit 0' TERM; i=0; while :; do echo line-$i; i=$((i+1)); sleep 1; done";

/// The command of a web server task: answers its hostname on port 80, leaving at once on SIGTERM.
const WEB: &str = "mkdir -p /www && hostname > /www/index.html && trap 'exit 0' TERM; httpd -f -p 80 -h /www & wait";

/// Creates service `name` of `replicas` talkers constrained to the engine; returns its ID.
fn create_on_engine(d: &DaemonProcess, eng: &SecondEngine, name: &str, replicas: u32) -> String {
    let constraint = format!("node.hostname=={}", eng.hostname());
    let replicas = replicas.to_string();
    let out = shoal(
        d,
        &[
            "service",
            "create",
            "--detach",
            "--name",
            name,
            "--replicas",
            &replicas,
            "--constraint",
            &constraint,
            docker_engine::TEST_IMAGE,
            "sh",
            "-c",
            TALKER,
        ],
    );
    out.trim().lines().last().unwrap_or_default().to_string()
}

/// Waits until the engine runs no container of `service` (with `removed`, has none left at all: a removed
/// task's container is removed, a shut down one's stays as the task's history, as under a Docker manager) and
/// no task of it runs.
fn wait_engine_empty(eng: &SecondEngine, d: &DaemonProcess, service: &str, removed: bool) {
    wait_until(&format!("no container of {service} on the engine"), TASK_LIMIT, || {
        let filter = format!("label=com.docker.swarm.service.name={service}");
        let all = eng.docker_ok(&["ps", if removed { "-aq" } else { "-q" }, "--filter", &filter]);
        let ps = service_ps(d, service);
        let running = ps.iter().filter(|(_, _, now)| now.starts_with("Running")).count();
        if all.trim().is_empty() && running == 0 {
            Ok(())
        } else {
            Err(format!("containers: {all:?}, service ps: {ps:?}"))
        }
    });
}

#[test]
fn services_run_on_the_engine_with_logs_restarts_scale_and_drain() {
    let Some(eng) = engine("t", 1) else { return };
    let d = shoal_manager(&eng, 0, None);
    let node_id = join(&eng, &d);
    let sid = create_on_engine(&d, &eng, "web", 2);
    let ids = wait_engine_containers(&eng, &d, "web", 2);

    // Created as under a Docker manager: swarm's name and labels, the service's command.
    for id in &ids {
        let labels: Value =
            serde_json::from_str(&eng.docker_ok(&["inspect", "--format", "{{json .Config.Labels}}", id]))
                .expect("labels");
        assert_eq!(labels["com.docker.swarm.service.id"], sid.as_str(), "{labels}");
        assert_eq!(labels["com.docker.swarm.service.name"], "web", "{labels}");
        assert_eq!(labels["com.docker.swarm.node.id"], node_id.as_str(), "{labels}");
        let task_id = labels["com.docker.swarm.task.id"].as_str().expect("a task id label").to_string();
        let name = eng.docker_ok(&["inspect", "--format", "{{.Name}}", id]);
        let name = name.trim().trim_start_matches('/');
        assert!(name.starts_with("web.") && name.ends_with(&task_id), "container name {name}");
        assert_eq!(labels["com.docker.swarm.task.name"], name, "{labels}");
        let cmd = eng.docker_ok(&["inspect", "--format", "{{json .Config.Cmd}}", id]);
        let cmd: Value = serde_json::from_str(&cmd).expect("cmd");
        assert_eq!(cmd, serde_json::json!(["sh", "-c", TALKER]));
        // And Shoal's task names the container the engine made.
        let task = d.get(&format!("/v1.47/tasks/{task_id}"));
        assert_eq!(task["Status"]["ContainerStatus"]["ContainerID"], id.as_str(), "{task}");
    }

    // `docker service logs`: the engine's agent answers the LogBroker's subscription with the containers' output.
    wait_until("the service's logs from the engine", TASK_LIMIT, || {
        let out = docker_cli::run(d.socket(), &["service", "logs", "--raw", "--no-trunc", "web"]);
        let text = String::from_utf8_lossy(&out.stdout);
        let lines = text.lines().filter(|l| l.starts_with("line-")).count();
        if out.status.success() && lines >= 4 {
            Ok(())
        } else {
            Err(format!("{} {text}{}", out.status, String::from_utf8_lossy(&out.stderr)))
        }
    });
    let out = shoal(&d, &["service", "logs", "--no-trunc", "web"]);
    assert!(
        out.lines().any(|l| l.starts_with("web.") && l.contains(&format!("@{}", eng.hostname()))),
        "log lines name the engine's node: {out}"
    );

    // A killed container: its task fails, a new container replaces it.
    eng.docker_ok(&["kill", &ids[0]]);
    let after = wait_until("a replacement container", TASK_LIMIT, || {
        let now = eng.running_with_label("com.docker.swarm.service.name", "web");
        let ps = service_ps(&d, "web");
        let failed = ps.iter().any(|(_, want, now)| want == "Shutdown" && now.starts_with("Failed"));
        let running = ps.iter().filter(|(_, want, now)| want == "Running" && now.starts_with("Running")).count();
        if now.len() == 2 && !now.contains(&ids[0]) && failed && running == 2 {
            Ok(now)
        } else {
            Err(format!("containers {now:?}, service ps {ps:?}"))
        }
    });
    assert!(after.contains(&ids[1]), "the other container kept running: {after:?}");

    // Scale to 0 removes the containers.
    shoal(&d, &["service", "scale", "--detach", "web=0"]);
    wait_engine_empty(&eng, &d, "web", true);

    // Drain empties the node; back to active, the tasks come back.
    shoal(&d, &["service", "scale", "--detach", "web=2"]);
    wait_engine_containers(&eng, &d, "web", 2);
    shoal(&d, &["node", "update", "--availability", "drain", &node_id]);
    wait_engine_empty(&eng, &d, "web", false);
    let ps = service_ps(&d, "web");
    // The replacements wait for a node (desired Ready until their restart delay has passed, then Running).
    assert!(
        ps.iter().any(|(node, want, now)| node.is_empty() && want != "Shutdown" && now.starts_with("Pending")),
        "{ps:?}"
    );
    shoal(&d, &["node", "update", "--availability", "active", &node_id]);
    wait_engine_containers(&eng, &d, "web", 2);
    shoal(&d, &["service", "rm", "web"]);
    wait_engine_empty(&eng, &d, "web", true);
}

/// The managers the engine's agent knows (`docker info`'s `Swarm.RemoteManagers`): their addresses, sorted.
fn remote_managers(eng: &SecondEngine) -> Vec<String> {
    let raw = eng.docker_ok(&["info", "--format", "{{json .Swarm.RemoteManagers}}"]);
    let list: Value = serde_json::from_str(&raw).unwrap_or(Value::Null);
    let mut addrs: Vec<String> = list
        .as_array()
        .map(|a| a.iter().filter_map(|m| m["Addr"].as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    addrs.sort();
    addrs
}

#[test]
fn the_engine_survives_a_leader_failover_and_shoal_sees_it_leave() {
    let Some(eng) = engine("f", 3) else { return };
    let m0 = shoal_manager(&eng, 0, None);
    let m1 = shoal_manager(&eng, 1, Some(&m0));
    let m2 = shoal_manager(&eng, 2, Some(&m0));
    let mut managers = [m0, m1, m2];
    wait_until("three reachable managers", JOIN_LIMIT, || {
        let seen = shoal_testkit::managers::managers_seen_by(&managers[0])?;
        let up = seen.iter().filter(|(_, s)| s == "Leader" || s == "reachable").count();
        if up == 3 {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    });
    let node_id = join(&eng, &managers[0]);
    create_on_engine(&managers[0], &eng, "web", 2);
    let ids = wait_engine_containers(&eng, &managers[0], "web", 2);
    // The engine learns every manager from its session messages (the weighted list).
    let mut want: Vec<String> = managers.iter().map(DaemonProcess::remote_addr).collect();
    want.sort();
    wait_until("the engine knows the three managers", JOIN_LIMIT, || {
        let known = remote_managers(&eng);
        if known == want {
            Ok(())
        } else {
            Err(format!("{known:?}"))
        }
    });

    let survivor = kill_the_leader(&mut managers);
    let survivor = &managers[survivor];

    // The engine's containers kept running through the failover.
    let now = eng.running_with_label("com.docker.swarm.service.name", "web");
    assert_eq!(sorted(now), sorted(ids.clone()), "the containers survived the failover");
    // The engine reconnected: the new leader gets its task statuses and sends it work (a killed container is
    // replaced on the engine, through the new leader's dispatcher).
    eng.docker_ok(&["kill", &ids[0]]);
    wait_until("a replacement through the new leader", TASK_LIMIT, || {
        let now = eng.running_with_label("com.docker.swarm.service.name", "web");
        let ps = service_ps(survivor, "web");
        let failed = ps.iter().any(|(_, want, now)| want == "Shutdown" && now.starts_with("Failed"));
        let running = ps
            .iter()
            .filter(|(node, want, now)| node == eng.hostname() && want == "Running" && now.starts_with("Running"))
            .count();
        if now.len() == 2 && !now.contains(&ids[0]) && failed && running == 2 {
            Ok(())
        } else {
            Err(format!("containers {now:?}, service ps {ps:?}"))
        }
    });
    let ls = shoal(survivor, &["node", "ls", "--format", "{{.ID}} {{.Status}}"]);
    assert!(ls.lines().any(|l| l == format!("{node_id} Ready")), "{ls}");

    // `docker swarm leave` on the engine: it stops its tasks and Shoal sees the node go down.
    eng.docker_ok(&["swarm", "leave"]);
    assert_eq!(eng.docker_ok(&["info", "--format", "{{.Swarm.LocalNodeState}}"]).trim(), "inactive");
    wait_until("the engine's node Down on Shoal", JOIN_LIMIT, || {
        let ls = shoal(survivor, &["node", "ls", "--format", "{{.ID}} {{.Status}}"]);
        if ls.lines().any(|l| l == format!("{node_id} Down")) {
            Ok(())
        } else {
            Err(ls)
        }
    });
    wait_until("no container of web running on the engine", TASK_LIMIT, || {
        let now = eng.running_with_label("com.docker.swarm.service.name", "web");
        if now.is_empty() {
            Ok(())
        } else {
            Err(format!("{now:?}"))
        }
    });
}

/// Creates service `name` of `WEB` tasks on network `net`, placed as `placement` says.
fn create_web(d: &DaemonProcess, name: &str, net: &str, placement: &[&str]) {
    let mut args = vec!["service", "create", "--detach", "--name", name, "--network", net];
    args.extend_from_slice(placement);
    args.extend_from_slice(&[docker_engine::TEST_IMAGE, "sh", "-c", WEB]);
    shoal(d, &args);
}

/// The IPv4 addresses the engine's DNS answers for `name` inside container `id`, sorted.
fn nslookup(eng: &SecondEngine, id: &str, name: &str) -> Vec<String> {
    let out = eng.docker(&["exec", id, "nslookup", name]);
    let out = String::from_utf8_lossy(&out.stdout);
    let mut v: Vec<String> = out
        .split("Non-authoritative answer:")
        .skip(1)
        .flat_map(|part| part.lines().filter_map(|l| l.strip_prefix("Address:")).map(|a| a.trim().to_string()))
        .filter(|a| !a.contains(':'))
        .collect();
    v.sort();
    v.dedup();
    v
}

/// The address container `id` holds on its (one) network.
fn container_ip(eng: &SecondEngine, id: &str) -> String {
    let f = "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}";
    eng.docker_ok(&["inspect", "--format", f, id]).trim().to_string()
}

/// Waits until container `from` on `eng` gets `want` (a hostname) from `url`.
fn wait_page(eng: &SecondEngine, from: &str, url: &str, want: &str) {
    wait_until(&format!("{url} answers {want} from {from}"), TASK_LIMIT, || {
        let out = eng.docker(&["exec", from, "timeout", "5", "wget", "-q", "-O", "-", url]);
        let page = String::from_utf8_lossy(&out.stdout);
        if out.status.success() && page.trim() == want {
            Ok(())
        } else {
            Err(format!("{}: {page}{}", out.status, String::from_utf8_lossy(&out.stderr)))
        }
    });
}

/// The addresses Shoal gave the running tasks of `service` on network `net` (without their prefix length).
fn task_addresses(d: &DaemonProcess, service: &str, net: &str) -> Vec<String> {
    let filter = format!("{{\"service\":[\"{service}\"],\"desired-state\":[\"running\"]}}");
    let tasks = d.get(&format!("/v1.47/tasks?filters={}", urlencode(&filter)));
    let mut out = Vec::new();
    for t in tasks.as_array().into_iter().flatten() {
        for a in t["NetworksAttachments"].as_array().into_iter().flatten() {
            if a["Network"]["ID"] == net {
                out.extend(
                    a["Addresses"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|x| x.as_str())
                        .map(|x| x.split('/').next().unwrap_or(x).to_string()),
                );
            }
        }
    }
    out.sort();
    out
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[test]
fn tasks_on_an_overlay_network_run_on_the_engine_with_the_addresses_shoal_gave() {
    let Some(eng) = engine("o", 1) else { return };
    let d = shoal_manager(&eng, 0, None);
    join(&eng, &d);
    let net = shoal(&d, &["network", "create", "--driver", "overlay", "appnet"]).trim().to_string();
    let constraint = format!("node.hostname=={}", eng.hostname());
    create_web(&d, "ov", "appnet", &["--replicas", "2", "--constraint", &constraint]);
    // Before, the engine rejected such tasks after 30 s: "node is missing network attachments".
    let ids = wait_engine_containers(&eng, &d, "ov", 2);
    let given = task_addresses(&d, "ov", &net);
    assert_eq!(given.len(), 2, "{given:?}");

    // The engine made the swarm network with Shoal's ID, and its containers hold the addresses Shoal gave.
    let inspect = eng.docker_ok(&["network", "inspect", "appnet"]);
    let inspect: Value = serde_json::from_str(&inspect).expect("network inspect");
    let n = &inspect[0];
    assert_eq!(n["Id"], net.as_str(), "{n}");
    assert_eq!(n["Driver"], "overlay", "{n}");
    assert_eq!(n["Scope"], "swarm", "{n}");
    let held: Vec<String> = ids.iter().map(|id| container_ip(&eng, id)).collect();
    let mut sorted_held = held.clone();
    sorted_held.sort();
    assert_eq!(sorted_held, given, "the containers' addresses on appnet");
    // The node's own address on the network (its load-balancer endpoint) is one Shoal gave no task.
    let endpoints: Vec<String> = n["Containers"]
        .as_object()
        .map(|m| m.values().filter_map(|c| c["IPv4Address"].as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    let lb: Vec<&String> =
        endpoints.iter().filter(|e| !given.iter().any(|g| e.starts_with(&format!("{g}/")))).collect();
    assert_eq!(lb.len(), 1, "one endpoint besides the tasks': {endpoints:?}");

    // The two tasks reach each other over the overlay, by address and through the engine's DNS: `tasks.ov`
    // answers the tasks' addresses and `ov` the service's VIP on appnet, both as Shoal gave them.
    for (from, to) in [(0, 1), (1, 0)] {
        let url = format!("http://{}/", held[to]);
        let host = eng.docker_ok(&["exec", &ids[to], "hostname"]);
        wait_page(&eng, &ids[from], &url, host.trim());
    }
    let lookup = |name: &str| nslookup(&eng, &ids[0], name);
    assert_eq!(lookup("tasks.ov"), given, "tasks.ov");
    let service = d.get("/v1.47/services/ov");
    let vip = service["Endpoint"]["VirtualIPs"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["NetworkID"] == net.as_str())
        .and_then(|v| v["Addr"].as_str())
        .map(|a| a.split('/').next().unwrap_or(a).to_string())
        .expect("a VIP on appnet");
    assert_eq!(lookup("ov"), [vip], "ov");

    shoal(&d, &["service", "rm", "ov"]);
    wait_engine_empty(&eng, &d, "ov", true);
    // The network goes with the engine's last task on it, and Shoal can remove it.
    wait_until("appnet gone from the engine", TASK_LIMIT, || {
        let ls = eng.docker_ok(&["network", "ls", "--format", "{{.Name}}"]);
        if ls.lines().any(|l| l == "appnet") {
            Err(ls)
        } else {
            Ok(())
        }
    });
    shoal(&d, &["network", "rm", "appnet"]);
}

#[test]
fn tasks_on_two_engines_reach_each_other_over_an_overlay_through_shoals_gossip() {
    let Some(a) = engine("a", 1) else { return };
    let Some(b) = engine("b", 0) else { return };
    // Two machines on one network: each engine reaches the other's address (gossip on 7946, VXLAN on 4789).
    let _forwarding = a.forward_with(&b);
    let d = shoal_manager(&a, 0, None);
    for eng in [&a, &b] {
        let id = join(eng, &d);
        shoal(&d, &["node", "update", "--label-add", "engine=yes", &id]);
    }
    let net = shoal(&d, &["network", "create", "--driver", "overlay", "crossnet"]).trim().to_string();
    create_web(&d, "cross", "crossnet", &["--mode", "global", "--constraint", "node.labels.engine==yes"]);
    // The engines found each other through Shoal's manager (its gossip member at 7946; before, the engines'
    // join was refused there), so each learns where the other's endpoints live: a task on one engine
    // reaches the task on the other across the overlay, and each engine's DNS knows both tasks.
    let (on_a, on_b) = cross_reach(&a, &b, &d, "cross");
    let (ip_a, ip_b) = (container_ip(&a, &on_a), container_ip(&b, &on_b));
    let mut given = task_addresses(&d, "cross", &net);
    assert_eq!(given, sorted(vec![ip_a, ip_b]), "the addresses Shoal gave");

    given.sort();
    for (eng, c) in [(&a, &on_a), (&b, &on_b)] {
        wait_until(&format!("tasks.cross from {}", eng.hostname()), TASK_LIMIT, || {
            let seen = nslookup(eng, c, "tasks.cross");
            if seen == given {
                Ok(())
            } else {
                Err(format!("{seen:?}"))
            }
        });
    }
    let log = std::fs::read_to_string(b.log_path()).unwrap_or_default();
    assert!(
        log.lines().any(|l| l.contains("joined gossip cluster") && l.contains(&format!("/{}", a.manager_ip(0)))),
        "the engine names Shoal's manager among its gossip members"
    );
    shoal(&d, &["service", "rm", "cross"]);
    wait_engine_empty(&a, &d, "cross", true);
    wait_engine_empty(&b, &d, "cross", true);
}

/// The containers of `service` on engines `a` and `b` (one each) reach each other across the overlay by the
/// addresses they hold; returns their IDs.
fn cross_reach(a: &SecondEngine, b: &SecondEngine, d: &DaemonProcess, service: &str) -> (String, String) {
    let on_a = wait_engine_containers(a, d, service, 1).remove(0);
    let on_b = wait_engine_containers(b, d, service, 1).remove(0);
    let (ip_a, ip_b) = (container_ip(a, &on_a), container_ip(b, &on_b));
    let host_a = a.docker_ok(&["exec", &on_a, "hostname"]);
    let host_b = b.docker_ok(&["exec", &on_b, "hostname"]);
    wait_page(a, &on_a, &format!("http://{ip_b}/"), host_b.trim());
    wait_page(b, &on_b, &format!("http://{ip_a}/"), host_a.trim());
    (on_a, on_b)
}

/// Three managers: each engine's broadcasts go to random members, mostly managers, so this is the test that
/// needs the managers' gossip members to pass news on (docs/design/gossip.md).
#[test]
fn engines_keep_their_overlay_through_a_leader_kill_and_new_tasks_join_it() {
    let Some(a) = engine("k", 3) else { return };
    let Some(b) = engine("l", 0) else { return };
    let _forwarding = a.forward_with(&b);
    let m0 = shoal_manager(&a, 0, None);
    let m1 = shoal_manager(&a, 1, Some(&m0));
    let m2 = shoal_manager(&a, 2, Some(&m0));
    let mut managers = [m0, m1, m2];
    for eng in [&a, &b] {
        let id = join(eng, &managers[0]);
        shoal(&managers[0], &["node", "update", "--label-add", "engine=yes", &id]);
    }
    shoal(&managers[0], &["network", "create", "--driver", "overlay", "meshnet"]);
    create_web(&managers[0], "mesh", "meshnet", &["--mode", "global", "--constraint", "node.labels.engine==yes"]);
    let before = cross_reach(&a, &b, &managers[0], "mesh");

    let survivor = kill_the_leader(&mut managers);
    let survivor = &managers[survivor];
    // The same containers still reach each other (the engines gossip directly once they found each other).
    let (ip_a, ip_b) = (container_ip(&a, &before.0), container_ip(&b, &before.1));
    let host_b = b.docker_ok(&["exec", &before.1, "hostname"]);
    wait_page(&a, &before.0, &format!("http://{ip_b}/"), host_b.trim());
    let host_a = a.docker_ok(&["exec", &before.0, "hostname"]);
    wait_page(&b, &before.1, &format!("http://{ip_a}/"), host_a.trim());
    // New tasks, placed and addressed by the new leader, join the overlay across the engines too.
    shoal(survivor, &["service", "update", "--detach", "--force", "mesh"]);
    wait_until("the old containers replaced", TASK_LIMIT, || {
        let now_a = a.running_with_label("com.docker.swarm.service.name", "mesh");
        let now_b = b.running_with_label("com.docker.swarm.service.name", "mesh");
        if now_a.len() == 1 && now_b.len() == 1 && now_a[0] != before.0 && now_b[0] != before.1 {
            Ok(())
        } else {
            Err(format!("{now_a:?} {now_b:?}"))
        }
    });
    cross_reach(&a, &b, survivor, "mesh");
}

#[test]
fn a_stack_with_two_overlays_a_secret_and_a_host_port_runs_across_two_engines() {
    let Some(a) = engine("s", 1) else { return };
    let Some(b) = engine("t", 0) else { return };
    let _forwarding = a.forward_with(&b);
    let d = shoal_manager(&a, 0, None);
    join(&a, &d);
    join(&b, &d);
    // `web` on engine a (both networks, the secret, a host-mode port), `client` on engine b (front only), `db`
    // on engine b (back only). DNS round robin: the engines' VIPs need IPVS, which these machines lack.
    let dir = tempfile::tempdir().expect("a temporary dir");
    std::fs::write(dir.path().join("token.txt"), "s3cret-token").expect("the secret's file");
    let web = "mkdir -p /www && cat /run/secrets/token > /www/index.html && trap 'exit 0' TERM; \
               httpd -f -p 80 -h /www & wait";
    let on = |eng: &SecondEngine| format!("node.hostname=={}", eng.hostname());
    let compose = serde_json::json!({
        "version": "3.8",
        "services": {
            "web": {"image": docker_engine::TEST_IMAGE, "entrypoint": ["sh", "-c"], "command": [web.replace('$', "$$")],
                    "networks": ["front", "back"], "secrets": ["token"],
                    "ports": [{"target": 80, "published": 18080, "protocol": "tcp", "mode": "host"}],
                    "deploy": {"endpoint_mode": "dnsrr", "placement": {"constraints": [on(&a)]}}},
            "client": {"image": docker_engine::TEST_IMAGE, "entrypoint": ["sh", "-c"],
                       "command": [TALKER.replace('$', "$$")], "networks": ["front"],
                       "deploy": {"endpoint_mode": "dnsrr", "placement": {"constraints": [on(&b)]}}},
            "db": {"image": docker_engine::TEST_IMAGE, "entrypoint": ["sh", "-c"], "command": [WEB.replace('$', "$$")],
                   "networks": ["back"], "deploy": {"endpoint_mode": "dnsrr", "placement": {"constraints": [on(&b)]}}},
        },
        "networks": {"front": {"driver": "overlay"}, "back": {"driver": "overlay"}},
        "secrets": {"token": {"file": "./token.txt"}},
    });
    let file = dir.path().join("stack.yml");
    std::fs::write(&file, compose.to_string()).expect("the stack file");
    shoal(&d, &["stack", "deploy", "--resolve-image", "never", "-c", file.to_str().unwrap(), "app"]);
    let web_c = wait_engine_containers(&a, &d, "app_web", 1).remove(0);
    let client_c = wait_engine_containers(&b, &d, "app_client", 1).remove(0);
    let db_c = wait_engine_containers(&b, &d, "app_db", 1).remove(0);

    // The secret reads back in the container on the engine; the client on the other engine reaches web by
    // its name on front, across the overlay, and gets the secret's content.
    assert_eq!(a.docker_ok(&["exec", &web_c, "cat", "/run/secrets/token"]), "s3cret-token");
    wait_page(&b, &client_c, "http://web/", "s3cret-token");
    // db reaches web on back, and the client (not on back) does not resolve db.
    wait_page(&b, &db_c, "http://web/", "s3cret-token");
    assert!(nslookup(&b, &client_c, "db").is_empty(), "db resolves from a network the client is not on");
    // The host-mode port answers on engine a's address, from outside the engines.
    wait_until("web's host port on engine a", TASK_LIMIT, || {
        let addr = format!("{}:18080", a.ip());
        let mut conn = std::net::TcpStream::connect(&addr).map_err(|e| format!("{addr}: {e}"))?;
        use std::io::{Read, Write};
        conn.write_all(b"GET / HTTP/1.0\r\n\r\n").map_err(|e| e.to_string())?;
        let mut page = String::new();
        conn.read_to_string(&mut page).map_err(|e| e.to_string())?;
        if page.ends_with("s3cret-token") {
            Ok(())
        } else {
            Err(page)
        }
    });
    shoal(&d, &["stack", "rm", "app"]);
    wait_engine_empty(&a, &d, "app_web", true);
    wait_engine_empty(&b, &d, "app_client", true);
    wait_engine_empty(&b, &d, "app_db", true);
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[test]
fn a_failing_test_leaves_no_engine_behind() {
    let Some(eng) = engine("c", 1) else { return };
    let (ns, dir, pid) = (eng.netns().to_string(), eng.data_root(), eng.dockerd_pid().expect("dockerd's PID"));
    eng.docker_ok(&["run", "-d", "--name", "left", docker_engine::TEST_IMAGE, "sleep", "1000"]);
    let container_pid =
        eng.docker_ok(&["inspect", "--format", "{{.State.Pid}}", "left"]).trim().parse::<i32>().unwrap();
    // A test that panics while it holds the engine.
    let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _held = eng;
        panic!("a test failure");
    }));
    assert!(failed.is_err());
    let netns = std::process::Command::new("ip").args(["netns", "list"]).output().expect("ip netns list");
    assert!(!String::from_utf8_lossy(&netns.stdout).contains(&ns), "namespace {ns} is left");
    assert!(!dir.exists(), "{} is left", dir.display());
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "dockerd {pid} is left");
    assert!(!std::path::Path::new(&format!("/proc/{container_pid}")).exists(), "the container's process is left");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let parent = dir.parent().expect("the engine's dir").to_string_lossy().to_string();
    assert!(!mounts.contains(&parent), "mounts under {parent} are left");
}

/// Issue 35, point 2: a Shoal node's own agent (process executor, its data plane on) runs a task on an
/// overlay network beside a task on a Docker Engine worker, and the two reach each other both ways by
/// address. The Shoal node lives in a namespace of its own, linked to the host as the engine's is (a second
/// engine's namespace, whose dockerd never joins the swarm: it prepares the namespace as a Docker host's
/// firewall is). The engine learns where the Shoal task lives from the manager's gossip member, which joins
/// the network and publishes the task's peer record (docs/design/gossip.md); before, the engine's container
/// could not resolve the Shoal task's address, and neither direction worked.
#[test]
fn a_shoal_task_and_an_engine_task_on_one_overlay_reach_each_other() {
    shoal_and_engine_tasks_reach_each_other(("m", "n"), &[], |_| {});
}

/// The key manager's rotations reach the engine: with the network keys rotating every 4 s, once four
/// rotations have passed since the engine joined (none of the keys it was given then is left), the engine
/// and Shoal's node still gossip (the engine learns the Shoal task's records from Shoal's member, which
/// reads and writes only the current keys), and their tasks reach each other by address and by name while
/// the keys go on rotating.
#[test]
fn a_shoal_task_and_an_engine_task_reach_each_other_after_the_network_keys_rotated() {
    let rotations = |d: &DaemonProcess| d.log().matches("network encryption keys written (rotate)").count();
    shoal_and_engine_tasks_reach_each_other(("q", "u"), &["--network-key-rotation-interval", "4s"], |d| {
        let before = rotations(d);
        wait_until("four network key rotations", Duration::from_secs(60), || {
            let now = rotations(d);
            if now >= before + 4 {
                Ok(())
            } else {
                Err(format!("{} so far", now - before))
            }
        });
    });
}

/// A Shoal node (docker executor, in the namespace of second engine `tags.1`, its own engine) and engine
/// `tags.0` as its worker, on one overlay; `after_join` runs once the engine joined, before the services.
fn shoal_and_engine_tasks_reach_each_other(
    tags: (&str, &str),
    daemon_args: &[&str],
    after_join: impl Fn(&DaemonProcess),
) {
    let Some(eng) = engine(tags.0, 0) else { return };
    let Some(host) = engine(tags.1, 0) else { return };
    let _forwarding = eng.forward_with(&host);
    let d = DaemonProcess::start_with(
        &shoal_bin(),
        DaemonOptions {
            netns: Some(host.netns().to_string()),
            listen_ip: Some(host.ip()),
            port: Some(common::netcluster::PORT),
            hostname: Some("shoal-0".into()),
            extra_args: daemon_args.iter().map(|a| a.to_string()).collect(),
            ..DaemonOptions::default()
        },
    );
    join(&eng, &d);
    after_join(&d);
    let net = shoal(&d, &["network", "create", "--driver", "overlay", "mixnet"]).trim().to_string();
    create_web(&d, "engweb", "mixnet", &["--constraint", &format!("node.hostname=={}", eng.hostname())]);
    let server = common::netcluster::SERVER;
    shoal(
        &d,
        &[
            "service",
            "create",
            "--detach",
            "--name",
            "shoalweb",
            "--network",
            "mixnet",
            "--constraint",
            "node.hostname==shoal-0",
            docker_engine::TEST_IMAGE,
            common::netcluster::PYTHON,
            "-S",
            "-c",
            server,
        ],
    );
    let on_engine = wait_engine_containers(&eng, &d, "engweb", 1).remove(0);
    let engine_ip = container_ip(&eng, &on_engine);
    let shoal_task = wait_until("shoalweb running on shoal-0", TASK_LIMIT, || {
        let filter = "{\"service\":[\"shoalweb\"],\"desired-state\":[\"running\"]}";
        let tasks = d.get(&format!("/v1.47/tasks?filters={}", urlencode(filter)));
        let t = tasks.as_array().and_then(|a| a.first()).cloned().unwrap_or(Value::Null);
        if t["Status"]["State"] == "running" {
            Ok(t)
        } else {
            Err(format!("{t}"))
        }
    });
    let shoal_ip = task_addresses(&d, "shoalweb", &net).remove(0);
    let task_ns = format!("shl-task-{}", shoal_task["ID"].as_str().unwrap_or_default());
    let host_e = eng.docker_ok(&["exec", &on_engine, "hostname"]);

    // Shoal to engine: the Shoal node knows the engine task's address and node from the store.
    let poll = shoal_testkit::wait::POLL;
    let shoal_to_engine = shoal_testkit::wait::poll_until(Duration::from_secs(60), poll, || {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &task_ns, "timeout", "5", common::netcluster::PYTHON, "-S", "-c"])
            .arg(common::netcluster::CLIENT)
            .args([&engine_ip, "80", "1"])
            .output()
            .expect("ip netns exec");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        // (The engine's page ends with a newline, which the client's count keeps.)
        if text.starts_with(host_e.trim()) && text.contains("=1") {
            Ok(())
        } else {
            Err(format!("{text}{}", String::from_utf8_lossy(&out.stderr)))
        }
    });
    // Engine to Shoal: the engine must learn the Shoal task's peer record from the gossip.
    let engine_to_shoal = shoal_testkit::wait::poll_until(Duration::from_secs(60), poll, || {
        let url = format!("http://{shoal_ip}/");
        let out = eng.docker(&["exec", &on_engine, "timeout", "5", "wget", "-q", "-O", "-", &url]);
        let page = String::from_utf8_lossy(&out.stdout);
        if out.status.success() && page.trim() == shoal_ip {
            Ok(())
        } else {
            Err(format!("{}{}", page, String::from_utf8_lossy(&out.stderr)))
        }
    });
    // And by name: the engine's DNS answers the Shoal task's name, `tasks.<service>` and the service's VIP
    // from the endpoint record the member publishes for the running task.
    let vip = d.get("/v1.47/services/shoalweb")["Endpoint"]["VirtualIPs"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["NetworkID"] == net.as_str())
        .and_then(|v| v["Addr"].as_str())
        .map(|a| a.split('/').next().unwrap_or_default().to_string())
        .unwrap_or_default();
    let task_name = format!("shoalweb.{}.{}", shoal_task["Slot"], shoal_task["ID"].as_str().unwrap_or_default());
    let by_name = shoal_testkit::wait::poll_until(Duration::from_secs(60), poll, || {
        let out = eng.docker(&["exec", &on_engine, "timeout", "5", "wget", "-q", "-O", "-", "http://tasks.shoalweb/"]);
        let page = String::from_utf8_lossy(&out.stdout);
        if !(out.status.success() && page.trim() == shoal_ip) {
            return Err(format!("tasks.shoalweb: {}{}", page, String::from_utf8_lossy(&out.stderr)));
        }
        for (name, want) in [(task_name.as_str(), shoal_ip.as_str()), ("shoalweb", vip.as_str())] {
            let answers = nslookup(&eng, &on_engine, name);
            if answers != [want] {
                return Err(format!("{name}: want {want}, got {answers:?}"));
            }
        }
        Ok(())
    });
    shoal(&d, &["service", "rm", "engweb", "shoalweb"]);
    wait_engine_empty(&eng, &d, "engweb", true);
    assert!(shoal_to_engine.is_ok(), "Shoal to engine: {shoal_to_engine:?}");
    assert!(engine_to_shoal.is_ok(), "engine to Shoal: {engine_to_shoal:?}");
    assert!(!vip.is_empty(), "shoalweb has no VIP on {net}");
    assert!(by_name.is_ok(), "engine to Shoal by name: {by_name:?}");
}

/// An overlay of two subnets (docs/design/overlay-subnets.md) on an engine worker: the engine reads one
/// VXLAN ID per subnet from the network's `vxlanid_list`, as a Docker manager writes it, and its containers
/// hold the addresses Shoal gave in both subnets and reach each other across them.
#[test]
fn tasks_on_an_overlay_of_two_subnets_run_on_the_engine_and_reach_each_other_across_them() {
    let Some(eng) = engine("2s", 1) else { return };
    let d = shoal_manager(&eng, 0, None);
    join(&eng, &d);
    // Through the Engine API, which keeps the configs' order; the first range holds four addresses (the VIP
    // and the engine's own endpoint take two of them), so the tasks spill into the second subnet.
    let body = r#"{"Name": "twonet", "Driver": "overlay", "IPAM": {"Config": [
        {"Subnet": "10.215.0.0/24", "IPRange": "10.215.0.8/30"}, {"Subnet": "10.216.0.0/24"}]}}"#;
    let created = shoal_testkit::http::request(d.socket(), "POST", "/v1.47/networks/create", Some(body))
        .expect("POST /networks/create");
    assert_eq!(created.status, 201, "{}", created.body);
    let net = created.body["Id"].as_str().expect("the network's ID").to_string();
    let constraint = format!("node.hostname=={}", eng.hostname());
    create_web(&d, "two", "twonet", &["--replicas", "4", "--constraint", &constraint]);
    let ids = wait_engine_containers(&eng, &d, "two", 4);
    let given = task_addresses(&d, "two", &net);
    let mut held: Vec<String> = ids.iter().map(|id| container_ip(&eng, id)).collect();
    held.sort();
    assert_eq!(held, given, "the containers' addresses on twonet");
    let first = ids.iter().find(|id| container_ip(&eng, id).starts_with("10.215.0.")).expect("a task in 10.215.0.0/24");
    let second =
        ids.iter().find(|id| container_ip(&eng, id).starts_with("10.216.0.")).expect("a task in 10.216.0.0/24");
    for (from, to) in [(first, second), (second, first)] {
        let url = format!("http://{}/", container_ip(&eng, to));
        let host = eng.docker_ok(&["exec", to, "hostname"]);
        wait_page(&eng, from, &url, host.trim());
    }
    shoal(&d, &["service", "rm", "two"]);
    wait_engine_empty(&eng, &d, "two", true);
}
