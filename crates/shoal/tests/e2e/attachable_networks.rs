//! Attachable overlay networks on the control socket, as a user drives them (issue 33, item 3): with
//! `DOCKER_HOST` naming Shoal's socket only, `docker run --rm --network <attachable overlay> busybox wget
//! http://web/` reaches a service by name from a one-off container of the node's engine: the container gets
//! an address on the overlay from the swarm's allocator (a network attachment task), its namespace is
//! plumbed by the node's data plane and its resolver answers the service's name with its VIP; once the
//! container is gone, the attachment task is gone (its address back in the pool) and so is the holder. A
//! network that is not attachable is refused, naming it and saying to create it with --attachable. After a
//! crash of the daemon, an attachment whose container went meanwhile is detached at the next start. A
//! container the engine's restart policy (or `docker restart`) restarts keeps its attachment until it stops
//! for good. `docker network connect` puts a running container of the default bridge on the overlay (its
//! own namespace plumbed, the service by VIP and name), through its restarts, until `docker network
//! disconnect` or its removal.
//!
//! One docker-executor node in a namespace prepared like a Docker host (`netcluster::Cluster::start_one`),
//! on this machine's engine; and the same from a worker's socket, the service on the manager's node (two
//! such nodes, sharing the engine). Skipped (with a message) where the docker CLI or engine is missing.

use crate::common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::netcluster::Cluster;
use common::wait_until;
use serde_json::Value;
use shoal_testkit::docker_engine::{engine, engine_ok};

const WAIT: Duration = Duration::from_secs(90);

/// busybox httpd on port 80 answering with its hostname.
const WEB: &str = "mkdir -p /www; hostname > /www/index.html; exec httpd -f -p 80 -h /www";

/// Removes the engine containers named when dropped (containers of the user's own, which carry no node label).
struct Cleanup(Vec<String>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for c in &self.0 {
            let _ = engine(&["rm", "-f", c]);
        }
    }
}

/// An attachable overlay `net` on `subnet` and the service `web` on it, serving `WEB` (`extra`: more flags
/// for `docker service create`).
fn attachable_with_web(c: &Cluster, net: &str, subnet: &str, image: &str, extra: &[&str]) {
    c.docker(&["network", "create", "-d", "overlay", "--attachable", "--subnet", subnet, net]);
    let mut args = vec!["service", "create", "--detach", "--no-resolve-image", "--name", "web"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--network", net, image, "sh", "-c", WEB]);
    c.docker(&args);
}

/// The docker CLI as a user runs it: `DOCKER_HOST` names Shoal's control socket (the manager's), nothing else.
fn user_docker(c: &Cluster, args: &[&str]) -> std::process::Output {
    user_docker_on(c, 0, args)
}

/// As `user_docker`, on node `i`'s socket.
fn user_docker_on(c: &Cluster, i: usize, args: &[&str]) -> std::process::Output {
    let config = shoal_testkit::scratch_dir().join("docker-config");
    let _ = std::fs::create_dir_all(&config);
    Command::new("docker")
        .args(args)
        .env("DOCKER_HOST", format!("unix://{}", c.ds[i].socket().display()))
        .env("DOCKER_CONFIG", &config)
        .env_remove("DOCKER_CONTEXT")
        .stdin(Stdio::null())
        .output()
        .expect("run docker")
}

/// The network attachment tasks the manager holds (tasks of no service whose runtime is an attachment).
fn attachments(c: &Cluster) -> Vec<Value> {
    let tasks = c.manager().get("/v1.47/tasks");
    tasks.as_array().into_iter().flatten().filter(|t| !t["Spec"]["NetworkAttachmentSpec"].is_null()).cloned().collect()
}

/// The attachment holders of the engine (running or not) of node `node`.
fn holders(node: &str) -> Vec<String> {
    let node = format!("label=com.docker.swarm.node.id={node}");
    engine_ok(&["ps", "-aq", "--filter", &node, "--filter", "label=com.shoal.attach.holds"])
        .lines()
        .map(str::to_string)
        .collect()
}

fn gone(c: &Cluster, what: &str) {
    gone_on(c, 0, what)
}

/// No attachment task left, and no holder of node `i`.
fn gone_on(c: &Cluster, i: usize, what: &str) {
    let node = c.node_ids[i].clone();
    wait_until(what, WAIT, || {
        let (a, h) = (attachments(c), holders(&node));
        if a.is_empty() && h.is_empty() {
            Ok(())
        } else {
            Err(format!("attachment tasks {a:#?}, holders {h:?}"))
        }
    });
}

#[test]
fn docker_run_on_an_attachable_overlay_reaches_a_service_by_name_and_gives_its_address_back() {
    let Some(image) = shoal_testkit::docker_engine::test_image_or_skip() else { return };
    let mut c = Cluster::start_one("attach", "docker");
    let mut cleanup = Cleanup(Vec::new());
    attachable_with_web(&c, "anet", "10.231.7.0/24", image, &[]);
    c.docker(&["network", "create", "-d", "overlay", "closed"]);
    let web = c.running("web", 1);
    let web_ip = web[0]["NetworksAttachments"][0]["Addresses"][0].as_str().unwrap_or_default().to_string();
    let vip = c.vip("web");

    // The one-off container: its address on the overlay, the service's VIP for its name, the page by name.
    let script = "i=0; until wget -qO- http://web/ >/dev/null 2>&1 || [ $i -ge 100 ]; do i=$((i+1)); sleep 0.1; done; \
        echo \"ADDR $(ip -o -4 addr show | grep -o '10\\.231\\.7\\.[0-9]*' | head -1)\"; \
        echo \"WEB $(nslookup web 2>/dev/null | sed -n 's/^Address:[[:space:]]*\\([0-9.]*\\)$/\\1/p' | grep -v \
        127.0.0.11)\"; \
        echo \"PAGE $(wget -qO- http://web/)\"";
    let name = format!("attach-once-{}", std::process::id());
    cleanup.0.push(name.clone());
    let out = user_docker(&c, &["run", "--rm", "--name", &name, "--network", "anet", image, "sh", "-c", script]);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "docker run failed: {stdout}{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        c.manager().log()
    );
    let line =
        |key: &str| stdout.lines().find_map(|l| l.strip_prefix(key)).map(str::trim).unwrap_or_default().to_string();
    assert!(line("ADDR").starts_with("10.231.7."), "an address on the overlay: {stdout}");
    assert_ne!(line("ADDR"), web_ip.split('/').next().unwrap_or_default(), "{stdout}");
    assert_eq!(line("WEB"), vip, "the service's name is its VIP: {stdout}");
    assert!(!line("PAGE").is_empty(), "the page by name: {stdout}");

    // Gone with the container: the attachment task (its address back in the pool) and the holder.
    gone(&c, "the attachment and its holder gone with the container");

    // A network that is not attachable is refused, saying what to do; nothing is left behind.
    let out = user_docker(&c, &["run", "--rm", "--network", "closed", image, "true"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("closed") && err.contains("--attachable"), "{err}");
    assert!(holders(&c.node_ids[0]).is_empty() && attachments(&c).is_empty());

    // After a crash: the container of a live attachment is removed while the daemon is down; the next start
    // detaches it and removes its holder.
    let kept = format!("attach-kept-{}", std::process::id());
    cleanup.0.push(kept.clone());
    let out = user_docker(&c, &["run", "-d", "--name", &kept, "--network", "anet", image, "sleep", "1000"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let held = wait_until("the attachment running", WAIT, || {
        let a = attachments(&c);
        match a.first() {
            Some(t) if t["Status"]["State"] == "running" => Ok(t.clone()),
            _ => Err(format!("{a:#?}")),
        }
    });
    assert!(held["NetworksAttachments"][0]["Addresses"][0].as_str().unwrap_or_default().starts_with("10.231.7."));
    c.ds[0].kill9();
    engine_ok(&["rm", "-f", &kept]);
    c.ds[0].restart(&[]);
    gone(&c, "the attachment of the container removed meanwhile detached at the restart");

    c.docker(&["service", "rm", "web"]);
}

/// The lines of container `name`'s log (all its runs) that start with `key`, each without it.
fn log_lines(c: &Cluster, name: &str, key: &str) -> Vec<String> {
    let out = user_docker(c, &["logs", name]);
    String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.strip_prefix(key)).map(str::to_string).collect()
}

/// `docker inspect -f <format> <name>` on the socket.
fn inspect(c: &Cluster, name: &str, format: &str) -> String {
    let out = user_docker(c, &["inspect", "-f", format, name]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The shell of a run that reaches `web` on `prefix` (e.g. `10.231.9`): waits (bounded) until the page
/// answers by name, then prints `RUN <its address on the overlay> <the page>`.
fn reach_web(prefix: &str) -> String {
    let dotted = prefix.replace('.', "\\.");
    format!(
        "i=0; until wget -qO- http://web/ >/dev/null 2>&1 || [ $i -ge 100 ]; do i=$((i+1)); sleep 0.1; done; \
         echo \"RUN $(ip -o -4 addr show | grep -o '{dotted}\\.[0-9]*' | head -1) $(wget -qO- http://web/)\""
    )
}

/// Each `RUN` line has the same address on the overlay (the attachment kept) and a page (the service
/// reached by name); returns the address.
fn same_address_and_a_page(runs: &[String], prefix: &str) -> String {
    let addr = runs[0].split(' ').next().unwrap_or_default().to_string();
    assert!(addr.starts_with(prefix), "an address on the overlay: {runs:?}");
    for r in runs {
        let (a, page) = r.split_once(' ').unwrap_or((r.as_str(), ""));
        assert_eq!(a, addr, "the same attachment in every run: {runs:?}");
        assert!(!page.trim().is_empty(), "the service by name in every run: {runs:?}");
    }
    addr
}

/// Issue 33: a container that the engine's own restart policy restarts keeps its attachment (the `die`
/// comes with the container marked restarting), and so does one restarted with `docker restart` through
/// the socket; each run reaches the service by name from the same address. The attachment goes (its
/// address back in the pool) when the container stops for good: `on-failure` retries exhausted, `docker
/// stop` of an `always` container; its holder with `docker rm`.
#[test]
fn a_container_restarted_by_the_engine_keeps_its_attachment_until_it_stops_for_good() {
    let Some(image) = shoal_testkit::docker_engine::test_image_or_skip() else { return };
    let mut c = Cluster::start_one("attachrs", "docker");
    let mut cleanup = Cleanup(Vec::new());
    let prefix = "10.231.9.";
    attachable_with_web(&c, "anet3", "10.231.9.0/24", image, &[]);
    c.running("web", 1);

    // on-failure:2: three runs, each failing after it reached the service; then it stays stopped.
    let failing = format!("attach-failing-{}", std::process::id());
    cleanup.0.push(failing.clone());
    let script = format!("{}; exit 1", reach_web("10.231.9"));
    let out = user_docker(
        &c,
        &[
            "run",
            "-d",
            "--name",
            &failing,
            "--restart",
            "on-failure:2",
            "--network",
            "anet3",
            image,
            "sh",
            "-c",
            &script,
        ],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    wait_until("the on-failure retries exhausted", WAIT, || {
        match inspect(&c, &failing, "{{.State.Status}} {{.RestartCount}}").as_str() {
            "exited 2" => Ok(()),
            other => Err(other.to_string()),
        }
    });
    let runs = log_lines(&c, &failing, "RUN ");
    assert_eq!(runs.len(), 3, "three runs: {runs:?}\n{}", c.manager().log());
    same_address_and_a_page(&runs, prefix);
    // Stopped for good: the attachment goes, the holder stays with the container until it is removed.
    wait_until("the exhausted container's attachment detached", WAIT, || {
        let a = attachments(&c);
        if a.is_empty() {
            Ok(())
        } else {
            Err(format!("{a:#?}"))
        }
    });
    assert_eq!(holders(&c.node_ids[0]).len(), 1);
    let out = user_docker(&c, &["rm", &failing]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    gone(&c, "the exhausted container's holder gone with it");

    // always: the first run exits 0 and the engine restarts it; the second stays up; `docker restart`
    // through the socket makes a third; `docker stop` ends it for good.
    let always = format!("attach-always-{}", std::process::id());
    cleanup.0.push(always.clone());
    let script = format!(
        "{}; n=$(cat /runs 2>/dev/null || echo 0); echo $((n+1)) > /runs; [ $n -ge 1 ] || exit 0; \
         trap 'exit 0' TERM; sleep 1000 & wait",
        reach_web("10.231.9")
    );
    let out = user_docker(
        &c,
        &["run", "-d", "--name", &always, "--restart", "always", "--network", "anet3", image, "sh", "-c", &script],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let runs = wait_until("two runs of the always container", WAIT, || {
        let runs = log_lines(&c, &always, "RUN ");
        if runs.len() >= 2 {
            Ok(runs)
        } else {
            Err(format!("{runs:?}"))
        }
    });
    assert_eq!(inspect(&c, &always, "{{.RestartCount}}"), "1", "{runs:?}");
    let addr = same_address_and_a_page(&runs, prefix);
    let held = attachments(&c);
    assert_eq!(held.len(), 1, "{held:#?}");
    let out = user_docker(&c, &["restart", "-t", "1", &always]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let runs = wait_until("a third run after docker restart", WAIT, || {
        let runs = log_lines(&c, &always, "RUN ");
        if runs.len() >= 3 {
            Ok(runs)
        } else {
            Err(format!("{runs:?}"))
        }
    });
    assert_eq!(same_address_and_a_page(&runs, prefix), addr);
    let now = attachments(&c);
    assert_eq!(now.len(), 1, "{now:#?}");
    assert_eq!(now[0]["ID"], held[0]["ID"], "the same attachment through the restart");
    let out = user_docker(&c, &["stop", "-t", "1", &always]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    wait_until("the stopped container's attachment detached", WAIT, || {
        let a = attachments(&c);
        if a.is_empty() {
            Ok(())
        } else {
            Err(format!("{a:#?}"))
        }
    });
    let out = user_docker(&c, &["rm", &always]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    gone(&c, "the always container's holder gone with it");
    cleanup.0.clear();
    c.docker(&["service", "rm", "web"]);
}

/// `docker exec <name> sh -c <script>` on the socket: its stdout (empty when it failed).
fn exec(c: &Cluster, name: &str, script: &str) -> String {
    let out = user_docker(c, &["exec", name, "sh", "-c", script]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// What container `name` sees of the overlay `prefix` (e.g. `10.231.10.`): its interface and address
/// there, its default route, the service `web` by name (the page) and by DNS (the address), and `vip`.
fn overlay_seen_from(c: &Cluster, name: &str, prefix: &str, vip: &str) -> Result<(String, String), String> {
    let addrs = exec(c, name, "ip -o -4 addr show");
    let line =
        addrs.lines().find(|l| l.contains(prefix)).ok_or_else(|| format!("no address on the overlay: {addrs}"))?;
    let ifname = line.split_whitespace().nth(1).unwrap_or_default().to_string();
    let addr = line.split_whitespace().nth(3).unwrap_or_default().split('/').next().unwrap_or_default().to_string();
    // (This busybox's `wget -T` crashes: `timeout` bounds it.)
    if exec(c, name, &format!("timeout 5 wget -qO- http://{vip}/")).is_empty() {
        return Err(format!("the VIP {vip} does not answer; {addrs}; routes {}", exec(c, name, "ip route")));
    }
    if exec(c, name, "timeout 5 wget -qO- http://web/").is_empty() {
        return Err(format!("web does not answer by name; resolv.conf: {}", exec(c, name, "cat /etc/resolv.conf")));
    }
    let looked_up = exec(c, name, "nslookup web 2>/dev/null | sed -n 's/^Address:[[:space:]]*\\([0-9.]*\\)$/\\1/p'");
    if !looked_up.lines().any(|l| l == vip) {
        return Err(format!("web resolves to {looked_up:?}, not its VIP {vip}"));
    }
    Ok((ifname, addr))
}

/// Issue 33: `docker network connect <attachable overlay> <container>` on the socket connects a running
/// container of the default bridge through the same attachment path (an address from the swarm, a new
/// interface plumbed into the container's own namespace, the service by VIP and by name through the
/// swarm's resolver), keeps its bridge interface and default route; the engine's restart policy and a
/// `docker restart` through the socket keep the connection (its new namespace plumbed again, the same
/// address); `docker network disconnect` takes it off (address back in the pool, the container running on
/// as before, its resolv.conf put back); bad input is refused with dockerd's words and changes nothing;
/// `docker rm -f` of a connected container gives its address back.
#[test]
fn docker_network_connect_puts_a_running_container_on_an_attachable_overlay_until_disconnect() {
    let Some(image) = shoal_testkit::docker_engine::test_image_or_skip() else { return };
    let mut c = Cluster::start_one("attachcn", "docker");
    let mut cleanup = Cleanup(Vec::new());
    let prefix = "10.231.10.";
    attachable_with_web(&c, "anet4", "10.231.10.0/24", image, &[]);
    c.docker(&["network", "create", "-d", "overlay", "closed4"]);
    c.running("web", 1);
    let vip = c.vip("web");

    // A container of the engine's default bridge, restarted by the engine whenever it exits.
    let name = format!("attach-connect-{}", std::process::id());
    cleanup.0.push(name.clone());
    let out = user_docker(
        &c,
        &[
            "run",
            "-d",
            "--name",
            &name,
            "--restart",
            "always",
            image,
            "sh",
            "-c",
            "trap 'exit 0' TERM; sleep 1000 & wait",
        ],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = inspect(&c, &name, "{{.Id}}");
    let bridge_addr = inspect(&c, &name, "{{.NetworkSettings.IPAddress}}");
    let bridge_gw = inspect(&c, &name, "{{.NetworkSettings.Gateway}}");
    assert!(!bridge_addr.is_empty() && !bridge_gw.is_empty(), "on the default bridge");
    let resolv_before = exec(&c, &name, "cat /etc/resolv.conf");

    // Bad input: refused with a clear message, nothing changes.
    let refused = |args: &[&str], wants: &[&str]| {
        let out = user_docker(&c, args);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(!out.status.success(), "{args:?} succeeded");
        for w in wants {
            assert!(err.contains(w), "{args:?}: {err}");
        }
        assert!(attachments(&c).is_empty(), "{args:?} left an attachment");
    };
    refused(&["network", "connect", "closed4", &name], &["closed4", "not manually attachable", "--attachable"]);
    refused(&["network", "connect", "anet4", "no-such-container-here"], &["No such container: no-such-container-here"]);
    refused(&["network", "connect", "--ip", "10.231.10.77", "anet4", &name], &["IPAMConfig", "--ip"]);
    refused(&["network", "disconnect", "anet4", &name], &["is not connected to network anet4"]);
    assert!(!exec(&c, &name, "ip -o -4 addr show").contains(prefix));

    // Connected: a new interface (eth1) on the overlay, the bridge's eth0 and default route kept.
    let out = user_docker(&c, &["network", "connect", "anet4", &name]);
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stderr), c.manager().log());
    let (ifname, addr) = overlay_seen_from(&c, &name, prefix, &vip).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ifname, "eth1");
    assert!(exec(&c, &name, "ip -o -4 addr show eth0").contains(&bridge_addr));
    assert!(exec(&c, &name, "ip route show default").contains(&bridge_gw), "the default route stays the bridge's");
    let held = attachments(&c);
    assert_eq!(held.len(), 1, "{held:#?}");
    assert_eq!(held[0]["Spec"]["NetworkAttachmentSpec"]["ContainerID"], id.as_str());
    assert_eq!(held[0]["NetworksAttachments"][0]["Addresses"][0].as_str().unwrap_or_default(), format!("{addr}/24"));
    refused_again(&c, &name);

    // The engine restarts it (its main process exits): the same attachment, plumbed into its new namespace.
    let _ = user_docker(&c, &["exec", &name, "kill", "-TERM", "1"]);
    wait_until("the engine restarted the connected container", WAIT, || {
        match inspect(&c, &name, "{{.State.Status}} {{.RestartCount}}").as_str() {
            "running 1" => Ok(()),
            other => Err(other.to_string()),
        }
    });
    let seen =
        wait_until("the restarted container connected again", WAIT, || overlay_seen_from(&c, &name, prefix, &vip));
    assert_eq!(seen.1, addr, "the same address after the engine's restart");
    // And `docker restart` through the socket.
    let out = user_docker(&c, &["restart", "-t", "1", &name]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let seen = wait_until("the container connected again after docker restart", WAIT, || {
        overlay_seen_from(&c, &name, prefix, &vip)
    });
    assert_eq!(seen.1, addr, "the same address after docker restart");
    let now = attachments(&c);
    assert_eq!(now.len(), 1, "{now:#?}");
    assert_eq!(now[0]["ID"], held[0]["ID"], "the same attachment through both restarts");

    // Disconnected: the interface goes, the address returns, the container runs on as it was.
    let out = user_docker(&c, &["network", "disconnect", "anet4", &name]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let addrs = exec(&c, &name, "ip -o -4 addr show");
    assert!(!addrs.contains(prefix) && addrs.contains(&bridge_addr), "{addrs}");
    assert_eq!(exec(&c, &name, "cat /etc/resolv.conf"), resolv_before, "its resolv.conf put back");
    assert_eq!(inspect(&c, &name, "{{.State.Status}}"), "running");
    wait_until("the disconnected container's attachment gone", WAIT, || {
        let a = attachments(&c);
        if a.is_empty() {
            Ok(())
        } else {
            Err(format!("{a:#?}"))
        }
    });
    let pid = inspect(&c, &name, "{{.State.Pid}}");
    let tables = Command::new("nsenter").args(["-t", &pid, "-n", "nft", "list", "tables"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&tables.stdout).contains("shoal"), "Shoal's table left the container");

    // Connected again, then removed: its address comes back to the pool.
    let out = user_docker(&c, &["network", "connect", "anet4", &name]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(attachments(&c).len(), 1);
    let out = user_docker(&c, &["rm", "-f", &name]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    gone(&c, "the removed connected container's attachment gone");
    cleanup.0.clear();
    c.docker(&["service", "rm", "web"]);
}

/// A second connect of a connected container: dockerd's 403 `endpoint with name ... already exists`.
fn refused_again(c: &Cluster, name: &str) {
    let out = user_docker(c, &["network", "connect", "anet4", name]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(&format!("endpoint with name {name} already exists in network anet4")),
        "{err}"
    );
    assert_eq!(attachments(c).len(), 1, "the second connect changed nothing");
}

/// On a worker's socket: the worker cannot look the network up (it has no store), so the manager decides at
/// the attach; the container, on node-1, reaches the service's task on node-0 across the underlay (VXLAN),
/// by name through the VIP, and its address comes back to the pool when it is gone.
#[test]
fn docker_run_on_a_workers_socket_reaches_a_service_on_another_node() {
    let Some(image) = shoal_testkit::docker_engine::test_image_or_skip() else { return };
    let mut c = Cluster::start_first("attach2", "docker", 2);
    c.join(1);
    let _cleanup = Cleanup(Vec::new());
    attachable_with_web(&c, "anet2", "10.231.8.0/24", image, &["--constraint", "node.hostname==node-0"]);
    let web = c.running("web", 1);
    assert_eq!(c.node_of(&web[0]), 0);
    let name = format!("attach-worker-{}", std::process::id());
    let mut cleanup = Cleanup(vec![name.clone()]);
    let script = "i=0; until wget -qO- http://web/ >/dev/null 2>&1 || [ $i -ge 100 ]; do i=$((i+1)); sleep 0.1; done; \
        echo \"ADDR $(ip -o -4 addr show | grep -o '10\\.231\\.8\\.[0-9]*' | head -1)\"; \
        echo \"PAGE $(wget -qO- http://web/)\"";
    let out = user_docker_on(&c, 1, &["run", "--rm", "--name", &name, "--network", "anet2", image, "sh", "-c", script]);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "docker run on the worker failed: {stdout}{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        c.ds[1].log()
    );
    let line =
        |key: &str| stdout.lines().find_map(|l| l.strip_prefix(key)).map(str::trim).unwrap_or_default().to_string();
    assert!(line("ADDR").starts_with("10.231.8."), "an address on the overlay: {stdout}");
    // The page is the task's hostname on node-0 (busybox httpd serves `hostname`).
    assert!(!line("PAGE").is_empty(), "the page by name, across nodes: {stdout}");
    gone_on(&c, 1, "the worker's attachment and holder gone with the container");
    cleanup.0.clear();
    c.docker(&["service", "rm", "web"]);
}
