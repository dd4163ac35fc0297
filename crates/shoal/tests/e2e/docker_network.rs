//! Docker tasks on overlay networks, as users drive them: three `shoal daemon --executor docker`s (one
//! manager, two workers), each in its own network namespace (`shoal_testkit::netns`), so each carries its
//! own data plane, all sharing this machine's Docker Engine (their containers told apart by their node
//! label). Needs root, the engine and Debian's static busybox (the test image is built from it, never
//! pulled); without the engine the tests say so and pass.
//!
//! `web` (2 replicas of busybox httpd answering with its hostname, off node-2) and `client` (on node-2) on
//! `appnet`: each web container's first instruction records its interfaces (its allocated address is there:
//! the namespace was plumbed before the app started), its resolv.conf names the node's resolver, `web`
//! resolves to the VIP and `tasks.web` to both tasks from the client, and 100 requests to `http://web/` are
//! answered by both.
//!
//! The kill -9: with the client requesting the VIP in a loop (each request retried up to 30 times, 100 ms
//! apart), both workers' daemons are killed, 40 requests go through while they are dead, and they are started
//! again: no request fails after its retries, every Shoal link on the workers is the same (same interface
//! index: nothing was removed and made again), the same containers and holders run (adopted, not replaced)
//! and names resolve again (one web task's holder was removed by hand before the kill: its namespace is found
//! through its container). A service `solo` on node-1, removed while the daemon was dead, loses its container,
//! holder, veth and namespace when it is back, and nothing else.
//!
//! After the restart, `web` scaled to 4 (the new tasks resolve from the client) and back to 2 (the tasks
//! leaving are drained out of the VIP first): the loop records no failure. A task whose container exits
//! loses its holder and namespace at once.
//!
//! Published ports: `web` (2 replicas off node-2, `-p 8080:80`) answers on every node's address, from another
//! node and from the node itself, and on every node's 127.0.0.1, both containers over 40 requests, the engine binding
//! nothing (the data plane forwards into the holders' namespaces); a host-mode port answers on its task's node only; a
//! host-mode port of a task only on an `--internal` network is rejected naming the field; scaled to 0, the
//! port is refused everywhere.
//!
//! Cleanup: `docker swarm leave --force` on node-2 removes its containers and holders and its whole data plane
//! (no Shoal link, no task namespace); removing `web` removes its containers, holders and namespaces, and
//! node-1's data plane goes with its last task; a clean stop of the daemons then leaves nothing of any node.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::netcluster::{address_on, Cluster};
use common::*;
use serde_json::{json, Value};
use shoal_testkit::docker_engine::{self, engine, engine_ok};
use shoal_testkit::managers::post_service;

const WAIT: Duration = Duration::from_secs(90);
/// The label of a network-namespace holder (`shoal_agent::LABEL_HOLDER_TASK_ID`).
const HOLDER_LABEL: &str = "com.shoal.netns-holder.task.id";

/// The web task: its first line is its interfaces (`FIRST ...`), then busybox httpd serves its hostname.
const WEB: &str = "echo FIRST $(ip -4 -o addr show | tr '\\n' ' '); mkdir -p /www; hostname > /www/index.html; \
                   exec httpd -f -p 80 -h /www";

/// The client: resolves `web` and `tasks.web` once `tasks.web` has two addresses, 100 GETs of http://web/
/// counted by answer, then GETs of http://$VIP/ in a loop, each retried up to 30 times 100 ms apart, with a
/// `RESULT LOOP <requests> retried <n> failed <n>` line every 20 requests. (`timeout`, not wget's `-T`, which
/// crashes Debian's static busybox 1.35.)
const CLIENT: &str = r#"
res() { nslookup "$1" 2>/dev/null | sed -n 's/^Address:[[:space:]]*\([0-9.]*\)$/\1/p' | sort | tr '\n' ' '; }
i=0
while [ "$(res tasks.web | wc -w)" -lt 2 ] && [ $i -lt 250 ]; do sleep 0.2; i=$((i+1)); done
echo "RESULT VIP $(res web)"
echo "RESULT TASKS $(res tasks.web)"
i=0; errors=0
while [ $i -lt 100 ]; do
  if a=$(timeout 3 wget -q -O - http://web/); then echo "ANSWER $a"; else errors=$((errors+1)); fi
  i=$((i+1))
done
echo "RESULT ANSWERS errors $errors"
n=0; retried=0; failed=0
while true; do
  t=0
  until timeout 2 wget -q -O /dev/null "http://$VIP/"; do
    t=$((t+1))
    if [ $t -ge 30 ]; then failed=$((failed+1)); echo "RESULT FAIL $n"; break; fi
    sleep 0.1
  done
  [ $t -gt 0 ] && retried=$((retried+1))
  n=$((n+1))
  [ $((n % 20)) -eq 0 ] && echo "RESULT LOOP $n retried $retried failed $failed"
done
"#;

fn service(name: &str, image: &str, constraint: &str, replicas: u64, script: &str, env: &[String]) -> Value {
    json!({
        "Name": name,
        "TaskTemplate": {
            "ContainerSpec": {"Image": image, "Command": ["sh", "-c", script], "Env": env},
            "Networks": [{"Target": "appnet"}],
            "Placement": {"Constraints": [constraint]},
            "RestartPolicy": {"Condition": "none"},
        },
        "Mode": {"Replicated": {"Replicas": replicas}},
    })
}

/// The engine container running task `t`.
fn container_of(t: &Value) -> String {
    let filter = format!("label=com.docker.swarm.task.id={}", t["ID"].as_str().unwrap());
    let ids = engine_ok(&["ps", "-q", "--no-trunc", "--filter", &filter]);
    let id = ids.lines().next().unwrap_or_else(|| panic!("no running container for task {}", t["ID"]));
    id.to_string()
}

/// The engine holder of task `t`.
fn holder_of(t: &Value) -> String {
    let filter = format!("label={HOLDER_LABEL}={}", t["ID"].as_str().unwrap());
    let ids = engine_ok(&["ps", "-q", "--no-trunc", "--filter", &filter]);
    ids.lines().next().unwrap_or_else(|| panic!("no running holder for task {}", t["ID"])).to_string()
}

/// The container's log lines so far.
fn logs(container: &str) -> Vec<String> {
    let out = engine(&["logs", container]);
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

/// The client's last `RESULT LOOP` line, as (requests, retried, failed), and its `RESULT FAIL` lines.
fn loop_state(client: &str) -> ((u64, u64, u64), Vec<String>) {
    let lines = logs(client);
    let fails = lines.iter().filter(|l| l.starts_with("RESULT FAIL")).cloned().collect();
    let last = lines.iter().rev().find_map(|l| {
        let w: Vec<&str> = l.strip_prefix("RESULT LOOP ")?.split_whitespace().collect();
        Some((w[0].parse().ok()?, w[2].parse().ok()?, w[4].parse().ok()?))
    });
    (last.unwrap_or((0, 0, 0)), fails)
}

/// `loop_state` once the client's loop has made `requests` requests (waiting up to `WAIT` for `what`).
fn loop_past(client: &str, requests: u64, what: &str) -> ((u64, u64, u64), Vec<String>) {
    wait_until(what, WAIT, || {
        let ((n, _, _), _) = loop_state(client);
        if n >= requests {
            Ok(())
        } else {
            Err(format!("{n} of {requests}"))
        }
    });
    loop_state(client)
}

#[test]
fn docker_tasks_reach_a_service_by_name_survive_a_daemon_kill_and_leave_nothing() {
    let Some(image) = docker_engine::test_image_or_skip() else { return };
    // The executor imports its holder image when a task first needs it: every run goes through that.
    let _ = engine(&["image", "rm", "shoal-netns-holder:1"]);
    let mut c = Cluster::start_docker("dn");
    c.docker(&["network", "create", "-d", "overlay", "appnet"]);

    let t0 = std::time::Instant::now();
    post_service(c.manager(), &service("web", image, "node.hostname!=node-2", 2, WEB, &[])).unwrap();
    let web = c.running("web", 2);
    println!("RESULT web created to 2 running (holder image import included): {:?}", t0.elapsed());
    let mut web_addrs: Vec<String> = web.iter().map(|t| address_on(t, "appnet")).collect();
    web_addrs.sort();
    let vip = c.vip("web");

    // Each web container: plumbed before its first instruction, the node's resolver, its own hostname.
    let mut hostnames = BTreeSet::new();
    let mut before: BTreeMap<String, (String, String)> = BTreeMap::new();
    for t in &web {
        let (container, holder) = (container_of(t), holder_of(t));
        let addr = address_on(t, "appnet");
        let first = wait_until("the web task's first line", WAIT, || {
            logs(&container).into_iter().find(|l| l.starts_with("FIRST")).ok_or_else(|| "no line yet".to_string())
        });
        assert!(
            first.contains(&format!("inet {addr}/")),
            "the app's first instruction sees its address {addr}: {first}"
        );
        let resolv = engine_ok(&["exec", &container, "cat", "/etc/resolv.conf"]);
        assert!(resolv.lines().any(|l| l.trim() == "nameserver 127.0.0.11"), "{resolv}");
        assert!(!resolv.lines().any(|l| l.starts_with("nameserver") && !l.contains("127.0.0.11")), "{resolv}");
        let mode = engine_ok(&["inspect", "-f", "{{.HostConfig.NetworkMode}}", &container]);
        assert!(mode.trim().starts_with("container:"), "the task's container joins its holder: {mode}");
        hostnames.insert(engine_ok(&["exec", &container, "hostname"]).trim().to_string());
        before.insert(t["ID"].as_str().unwrap().to_string(), (container, holder));
    }
    assert_eq!(hostnames.len(), 2, "each task has its own hostname: {hostnames:?}");
    // The README's `docker ps --filter label=com.docker.swarm.service.name=web` (on these nodes) lists the task
    // containers only, not their holders.
    let mut listed: BTreeSet<String> = BTreeSet::new();
    for id in &c.node_ids {
        let out = engine_ok(&[
            "ps",
            "-q",
            "--no-trunc",
            "--filter",
            "label=com.docker.swarm.service.name=web",
            "--filter",
            &format!("label=com.docker.swarm.node.id={id}"),
        ]);
        listed.extend(out.lines().map(str::to_string));
    }
    let containers: BTreeSet<String> = before.values().map(|(c, _)| c.clone()).collect();
    assert_eq!(listed, containers, "only web's task containers carry its label");

    // The client on node-2: by name, through the VIP, over VXLAN; then the VIP in a loop.
    post_service(c.manager(), &service("client", image, "node.hostname==node-2", 1, CLIENT, &[format!("VIP={vip}")]))
        .unwrap();
    let client_task = c.running("client", 1).remove(0);
    let client = container_of(&client_task);
    let lines = wait_until("the client's first requests", WAIT, || {
        let l = logs(&client);
        if l.iter().any(|l| l.starts_with("RESULT ANSWERS")) {
            Ok(l)
        } else {
            Err(format!("{l:?}"))
        }
    });
    let result = |p: &str| lines.iter().find(|l| l.starts_with(p)).cloned().unwrap_or_default();
    assert_eq!(result("RESULT VIP").trim(), format!("RESULT VIP {vip}"), "web resolves to its VIP: {lines:?}");
    assert_eq!(result("RESULT TASKS").trim(), format!("RESULT TASKS {}", web_addrs.join(" ")), "{lines:?}");
    let mut answers: BTreeMap<&str, u32> = BTreeMap::new();
    for a in lines.iter().filter_map(|l| l.strip_prefix("ANSWER ")) {
        *answers.entry(a).or_default() += 1;
    }
    assert_eq!(
        answers.keys().map(|s| s.to_string()).collect::<BTreeSet<_>>(),
        hostnames,
        "both tasks answer: {lines:?}"
    );
    assert!(answers.values().all(|&n| n >= 20), "each answers at least 20 of 100: {answers:?}");
    assert!(result("RESULT ANSWERS").ends_with("errors 0"), "{lines:?}");

    // kill -9 both workers' daemons while the client requests the VIP, and start them again.
    loop_past(&client, 40, "the request loop running");
    // `solo` on node-1, removed while its daemon is dead: the restarted daemon removes its container, holder,
    // veth and namespace, and nothing else.
    let without_solo = c.shoal_links_with_index(1);
    post_service(c.manager(), &service("solo", image, "node.hostname==node-1", 1, "exec sleep 100000", &[])).unwrap();
    let solo_id = c.running("solo", 1)[0]["ID"].as_str().unwrap().to_string();
    let solo_veth: Vec<String> = wait_until("solo's veth on node-1", WAIT, || {
        let v: Vec<String> = c.shoal_links_with_index(1).difference(&without_solo).cloned().collect();
        if v.len() == 1 {
            Ok(v)
        } else {
            Err(format!("{v:?}"))
        }
    });
    let links_before: Vec<BTreeSet<String>> = (1..3).map(|i| c.shoal_links_with_index(i)).collect();
    assert!(links_before.iter().all(|l| l.len() >= 3), "a bridge, a VXLAN device and a veth on each: {links_before:?}");
    // One web task's holder removed behind Shoal's back: its namespace lives on with its container, through
    // which the restarted daemon finds it.
    let lost_holder = web[0]["ID"].as_str().unwrap().to_string();
    engine_ok(&["rm", "-f", &before[&lost_holder].1]);
    let killed = std::time::Instant::now();
    for i in 1..3 {
        c.ds[i].kill9();
    }
    c.docker(&["service", "rm", "solo"]);
    let killed_at = loop_state(&client).0 .0;
    // While no worker daemon runs: the data path is the kernel's alone.
    wait_until("40 requests while the workers' daemons are dead", WAIT, || {
        let ((n, _, f), _) = loop_state(&client);
        if n >= killed_at + 40 || f > 0 {
            Ok(())
        } else {
            Err(format!("{n} of {}", killed_at + 40))
        }
    });
    for i in 1..3 {
        c.ds[i].restart(&[]);
    }
    wait_until("the workers ready again", WAIT, || {
        let nodes = c.manager().get("/v1.47/nodes");
        let ready = nodes.as_array().into_iter().flatten().filter(|n| n["Status"]["State"] == "ready").count();
        if ready == 3 {
            Ok(())
        } else {
            Err(format!("{ready} ready"))
        }
    });
    for i in 1..3 {
        wait_until("the restarted daemon adopted its tasks' namespaces", WAIT, || {
            let log = c.ds[i].log();
            if log.contains("tasks outlived the agent: keeping their data plane")
                && log.contains("adopted the task's network namespace")
                && log.contains("every task that outlived the agent is adopted")
            {
                Ok(())
            } else {
                Err("not yet".to_string())
            }
        });
    }
    let restarted_at = loop_state(&client).0 .0;
    println!("RESULT kill -9 to both workers ready and adopted: {:?}", killed.elapsed());
    let ((n, retried, failed), fails) = loop_past(&client, restarted_at + 100, "100 more requests after the restart");
    println!(
        "RESULT kill9 loop: {n} requests ({killed_at} before the kill, {restarted_at} at the restart), retried \
              {retried}, failed {failed}"
    );
    assert_eq!((failed, fails.len()), (0, 0), "no request failed after its retries: {fails:?}");
    // The same links (none removed and made again), containers and holders (adopted, not replaced), and names
    // resolve again.
    wait_until("solo's container, holder and namespace removed by the restarted daemon", WAIT, || {
        let filter = format!("label={HOLDER_LABEL}={solo_id}");
        let holders = engine_ok(&["ps", "-aq", "--filter", &filter]);
        let filter = format!("label=com.docker.swarm.task.id={solo_id}");
        let containers = engine_ok(&["ps", "-aq", "--filter", &filter]);
        let ns = std::path::Path::new("/run/netns").join(format!("shl-task-{solo_id}")).exists();
        let veth = c.shoal_links_with_index(1).contains(&solo_veth[0]);
        if holders.trim().is_empty() && containers.trim().is_empty() && !ns && !veth {
            Ok(())
        } else {
            Err(format!("holders {holders:?}, containers {containers:?}, namespace {ns}, veth {veth}"))
        }
    });
    let mut links_expected = links_before.clone();
    links_expected[0].remove(&solo_veth[0]);
    let links_after: Vec<BTreeSet<String>> = (1..3).map(|i| c.shoal_links_with_index(i)).collect();
    assert_eq!(links_expected, links_after, "the restarted daemons kept every link but solo's");
    let web_after = c.running("web", 2);
    for t in &web_after {
        let id = t["ID"].as_str().unwrap();
        let (container, holder) = before.get(id).unwrap_or_else(|| panic!("task {id} replaced after the restart"));
        assert_eq!(&container_of(t), container, "task {id} keeps its container");
        if id != lost_holder {
            assert_eq!(&holder_of(t), holder, "task {id} keeps its holder");
        }
    }
    let tasks_web = wait_until("tasks.web resolves again on the client's node", WAIT, || {
        let out = engine(&["exec", &client, "nslookup", "tasks.web"]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if web_addrs.iter().all(|a| text.contains(&format!("Address: {a}"))) {
            Ok(text)
        } else {
            Err(text)
        }
    });
    println!("tasks.web after the restart: {tasks_web}");

    // New tasks after the restart are connected too, and scaling back down drains them out of the VIP first.
    c.docker(&["service", "scale", "web=4"]);
    let four = c.running("web", 4);
    let addrs: Vec<String> = four.iter().map(|t| address_on(t, "appnet")).collect();
    wait_until("tasks.web lists the four tasks on the client's node", WAIT, || {
        let out = engine(&["exec", &client, "nslookup", "tasks.web"]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if addrs.iter().all(|a| text.contains(&format!("Address: {a}"))) {
            Ok(())
        } else {
            Err(text)
        }
    });
    c.docker(&["service", "scale", "web=2"]);
    c.running("web", 2);
    wait_until("the tasks scaled away stopped, their holders and namespaces gone", WAIT, || {
        let left: Vec<String> = tasks_of(c.manager(), "web")
            .iter()
            .filter(|t| desired(t) != "running")
            .filter_map(|t| {
                let id = t["ID"].as_str().unwrap_or_default();
                let filter = format!("label={HOLDER_LABEL}={id}");
                let holder = !engine_ok(&["ps", "-aq", "--filter", &filter]).trim().is_empty();
                let ns = std::path::Path::new("/run/netns").join(format!("shl-task-{id}")).exists();
                (holder || ns || state(t) == "running").then(|| format!("{id}: {} holder {holder} ns {ns}", state(t)))
            })
            .collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    });
    let at = loop_state(&client).0 .0;
    let ((n, retried, failed), fails) = loop_past(&client, at + 50, "50 more requests after the scaling");
    println!("RESULT scaling loop: {n} requests, retried {retried}, failed {failed}");
    assert_eq!((failed, fails.len()), (0, 0), "no request failed while scaling 2 -> 4 -> 2: {fails:?}");

    // A task whose container exits: its holder and namespace go at once (the task stays listed).
    post_service(c.manager(), &service("once", image, "node.hostname==node-1", 1, "exit 0", &[])).unwrap();
    let once = wait_until("the one-shot task complete", WAIT, || {
        let tasks = tasks_of(c.manager(), "once");
        tasks.into_iter().find(|t| state(t) == "complete").ok_or_else(|| "not yet".to_string())
    });
    let once_id = once["ID"].as_str().unwrap().to_string();
    c.tasks_seen.insert(once_id.clone());
    wait_until("the exited task's holder and namespace gone", WAIT, || {
        let filter = format!("label={HOLDER_LABEL}={once_id}");
        let holders = engine_ok(&["ps", "-aq", "--filter", &filter]);
        let ns = std::path::Path::new("/run/netns").join(format!("shl-task-{once_id}")).exists();
        if holders.trim().is_empty() && !ns {
            Ok(())
        } else {
            Err(format!("holders {holders:?}, namespace {ns}"))
        }
    });

    // Leave on node-2: its containers, holders and whole data plane go.
    let client_id = client_task["ID"].as_str().unwrap().to_string();
    docker_cli::ok(c.ds[2].socket(), &["swarm", "leave", "--force"]);
    wait_until("node-2 left with nothing behind", WAIT, || {
        let left = (c.containers(2), c.shoal_links(2));
        let ns = std::path::Path::new("/run/netns").join(format!("shl-task-{client_id}")).exists();
        if left.0.is_empty() && left.1.is_empty() && !ns {
            Ok(())
        } else {
            Err(format!("{left:?}, namespace {ns}"))
        }
    });

    // Removing web: its containers, holders and namespaces go, and node-1's data plane with its last task.
    c.docker(&["service", "rm", "web", "client", "once"]);
    wait_until("web's containers, holders, namespaces and links gone", WAIT, || {
        let left = (c.containers(0), c.containers(1), c.task_namespaces(), c.shoal_links(0), c.shoal_links(1));
        if left.0.is_empty() && left.1.is_empty() && left.2.is_empty() && left.3.is_empty() && left.4.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    });
    // A clean stop then leaves nothing of any node.
    for i in [0, 1, 2] {
        assert!(c.ds[i].stop(), "daemon {i} stops cleanly");
    }
    for i in 0..3 {
        assert!(c.containers(i).is_empty() && c.shoal_links(i).is_empty());
    }
    assert!(c.task_namespaces().is_empty(), "{:?}", c.task_namespaces());
}

/// Busybox httpd on port 80 answering with its container's hostname (no newline: one word per answer).
const HTTPD: &str = "mkdir -p /www; printf %s \"$(hostname)\" > /www/index.html; exec httpd -f -p 80 -h /www";

/// `answers` has `n` answers, none failed, each given at least `least` times.
fn spread(answers: &BTreeMap<String, u32>, n: usize, least: u32) -> Result<(), String> {
    if answers.len() == n && answers.iter().all(|(k, &c)| !k.starts_with("error:") && c >= least) {
        Ok(())
    } else {
        Err(format!("{answers:?}: want {n} answers, each at least {least} times"))
    }
}

#[test]
fn docker_tasks_publish_ports_through_the_routing_mesh_and_in_host_mode() {
    let Some(image) = docker_engine::test_image_or_skip() else { return };
    let mut c = Cluster::start_docker("dp");
    let create = |c: &Cluster, args: &[&str]| {
        let mut all = vec!["service", "create", "--detach", "--no-resolve-image", "--restart-condition", "none"];
        all.extend_from_slice(args);
        all.extend_from_slice(&[image, "sh", "-c", HTTPD]);
        c.docker(&all);
    };
    create(&c, &["--name", "web", "--replicas", "2", "--constraint", "node.hostname!=node-2", "-p", "8080:80"]);
    let web = c.running("web", 2);
    assert!(web.iter().all(|t| c.node_of(t) != 2), "placed off node-2");

    // The routing mesh: every node's address (node-2's too, which runs no web task), from the next node
    // (prerouting) and from the node itself (output); over 40 requests both containers answer.
    let mut names = BTreeSet::new();
    for i in 0..3 {
        let addr = c.net.ip(i);
        for from in [(i + 1) % 3, i] {
            let answers = wait_until(&format!("{addr}:8080 from node-{from} answered by both web tasks"), WAIT, || {
                let answers = c.get(from, &addr, 8080, 40);
                spread(&answers, 2, 10).map(|()| answers)
            });
            names.extend(answers.into_keys());
        }
        let answers = c.get(i, "127.0.0.1", 8080, 40);
        spread(&answers, 2, 10).unwrap_or_else(|e| panic!("127.0.0.1:8080 on node-{i}: {e}"));
        names.extend(answers.into_keys());
    }
    assert_eq!(names.len(), 2, "the same two containers answer on every node: {names:?}");
    // The engine bound nothing: the data plane forwards into the holders' namespaces.
    for t in &web {
        let ports = engine_ok(&["port", &container_of(t)]);
        assert!(ports.trim().is_empty(), "the engine published {ports}");
    }

    // Host mode: on its task's node only.
    c.docker(&["network", "create", "-d", "overlay", "appnet"]);
    create(
        &c,
        &[
            "--name",
            "hostweb",
            "--network",
            "appnet",
            "--constraint",
            "node.hostname==node-1",
            "--publish",
            "mode=host,published=8081,target=80",
        ],
    );
    c.running("hostweb", 1);
    let node1 = c.net.ip(1);
    let own = wait_until("host-mode port 8081 answers on node-1", WAIT, || {
        let answers = c.get(0, &node1, 8081, 4);
        spread(&answers, 1, 4).map(|()| answers)
    });
    assert!(own.keys().all(|k| !names.contains(k)), "8081 is answered by hostweb, not web: {own:?}");
    for i in [0, 2] {
        let answers = c.get(1, &c.net.ip(i), 8081, 1);
        assert_eq!(
            answers.keys().collect::<Vec<_>>(),
            ["error:ConnectionRefusedError"],
            "8081 on node-{i}: {answers:?}"
        );
    }

    // What the data plane cannot forward is refused on the task, the field named, as for processes.
    c.docker(&["network", "create", "-d", "overlay", "--internal", "closed"]);
    create(&c, &["--name", "closedweb", "--network", "closed", "--publish", "mode=host,published=8082,target=80"]);
    let err = wait_until("closedweb's task rejected", WAIT, || {
        let tasks = tasks_of(c.manager(), "closedweb");
        for t in &tasks {
            c.tasks_seen.insert(t["ID"].as_str().unwrap_or_default().to_string());
        }
        tasks
            .iter()
            .find(|t| state(t) == "rejected")
            .map(|t| t["Status"]["Err"].as_str().unwrap_or_default().to_string())
            .ok_or_else(|| format!("{tasks:?}"))
    });
    assert!(err.contains("EndpointSpec.Ports") && err.contains("8082") && err.contains("--internal"), "{err}");

    // Scaled to 0, the port is refused on every node.
    c.docker(&["service", "scale", "--detach", "web=0"]);
    for i in 0..3 {
        let addr = c.net.ip(i);
        wait_until(&format!("{addr}:8080 refused once web has no task"), WAIT, || {
            let answers = c.get((i + 1) % 3, &addr, 8080, 1);
            match answers.keys().next().map(String::as_str) {
                Some("error:ConnectionRefusedError") => Ok(()),
                _ => Err(format!("{answers:?}")),
            }
        });
    }
    c.docker(&["service", "rm", "web", "hostweb", "closedweb"]);
    wait_until("the services' containers, holders and namespaces gone", WAIT, || {
        let left: Vec<String> = (0..3).flat_map(|i| c.containers(i)).chain(c.task_namespaces()).collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    });
    for i in 0..3 {
        assert!(c.ds[i].stop(), "daemon {i} stops cleanly");
    }
    for i in 0..3 {
        assert!(c.containers(i).is_empty() && c.shoal_links(i).is_empty());
    }
    assert!(c.task_namespaces().is_empty(), "{:?}", c.task_namespaces());
}
