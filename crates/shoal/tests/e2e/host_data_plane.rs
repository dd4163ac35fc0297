//! The data plane in the machine's own network namespace, next to its Docker Engine (issue 30): the README's
//! daemon (`shoal daemon --state-dir ./shoal-state`, root, its data plane on; with each executor), as a user
//! runs it on a swarm host, where Docker left the FORWARD policy at DROP and `br_netfilter` on. No namespace of the
//! test's own hides the host's firewall here, except the "outside" one: a namespace beside the host, linked by a veth,
//! standing for the world beyond it (what the host forwards to it meets the host's FORWARD chain).
//!
//! Only one daemon per network namespace carries the data plane (`/run/shoal/netplane-<inode>.lock`): this
//! test and the newcomer tests whose daemons take the host's share the nextest group `host-data-plane`
//! (`.config/nextest.toml`), one at a time. A daemon of another test run on the same machine holding the lock
//! makes this test fail with that reason (rerun it).

use crate::common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::acceptance_stack::{self, Outside};
use common::netcluster::SERVER;
use common::{docker_cli, shoal_bin, wait_until};
use shoal_testkit::process::wait_exit;

const WAIT: Duration = Duration::from_secs(90);

fn run(args: &[&str]) -> String {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn free_port() -> u16 {
    TcpListener::bind("0.0.0.0:0").unwrap().local_addr().unwrap().port()
}

/// The inode of the host's network namespace (the key of its networks' namespaces' names).
fn host_netns_key() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/net").unwrap().ino()
}

/// What Shoal's data plane has in the host's namespace: `shl*` links, networks' namespaces of this namespace,
/// the `ip shoal` table, FORWARD rules with Shoal's comment (both back ends).
fn host_leftovers() -> Vec<String> {
    let mut left: Vec<String> = run(&["ip", "-o", "link", "show"])
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).to_string())
        .filter(|n| n.starts_with("shl"))
        .collect();
    let prefix = format!("shl-net-{}-", host_netns_key());
    left.extend(
        std::fs::read_dir("/run/netns")
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with(&prefix)),
    );
    if run(&["nft", "list", "tables"]).lines().any(|l| l.trim() == "table ip shoal") {
        left.push("table ip shoal".into());
    }
    for ipt in ["iptables-nft", "iptables-legacy"] {
        let out = Command::new(ipt).args(["-w", "-S", "FORWARD"]).output();
        let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
        left.extend(text.lines().filter(|l| l.contains("shoal-netplane")).map(|l| format!("{ipt}: {l}")));
    }
    left
}

/// The README's daemon, SIGTERMed when dropped (its clean stop).
struct Daemon {
    child: Option<Child>,
    dir: PathBuf,
}

impl Daemon {
    fn socket(&self) -> PathBuf {
        self.dir.join("shoal-state/control.sock")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    fn docker(&self, args: &[&str]) -> String {
        let out = docker_cli::command(&self.socket(), args).current_dir(&self.dir).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "docker {args:?}: {text}{}", String::from_utf8_lossy(&out.stderr));
        text
    }

    fn stop(&mut self) -> bool {
        let Some(c) = self.child.take() else { return true };
        let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
        wait_exit(c, Duration::from_secs(30), "shoal daemon").0
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // A failed test still leaves nothing: `docker swarm leave --force` removes the node's containers and
        // holders and clears its data plane (a docker executor's stop keeps what running containers use).
        if std::thread::panicking() && self.child.is_some() {
            let _ = docker_cli::command(&self.socket(), &["swarm", "leave", "--force"]).output();
        }
        let stopped = self.stop();
        assert!(stopped || std::thread::panicking(), "the daemon did not stop cleanly on SIGTERM");
    }
}

/// The `RESULT` lines of task `id` (its stdout in the process executor's task directory, or its container's
/// log), once it printed DONE.
fn results(tasks: &Tasks, state: &Path, id: &str) -> Vec<String> {
    let log = state.join("tasks").join(id).join("stdout.log");
    wait_until(&format!("task {id} done"), WAIT, || {
        let text = if tasks.executor == "docker" {
            let filter = format!("label=com.docker.swarm.task.id={id}");
            let c = shoal_testkit::docker_engine::engine_ok(&["ps", "-q", "--filter", &filter]);
            let c = c.lines().next().ok_or("no container yet")?.to_string();
            let out = shoal_testkit::docker_engine::engine(&["logs", &c]);
            String::from_utf8_lossy(&out.stdout).into_owned()
        } else {
            std::fs::read_to_string(&log).map_err(|e| format!("{}: {e}", log.display()))?
        };
        let lines: Vec<String> =
            text.lines().filter_map(|l| l.split_once("RESULT ").map(|(_, r)| r.trim_end().to_string())).collect();
        if lines.iter().any(|l| l == "DONE") {
            Ok(lines)
        } else {
            Err(format!("{lines:?} {}", std::fs::read_to_string(log.with_file_name("stderr.log")).unwrap_or_default()))
        }
    })
}

/// How the tasks of one executor are written: `web`'s and `client`'s image and command.
struct Tasks {
    executor: &'static str,
    image: String,
    web: Vec<String>,
    client: Vec<String>,
}

impl Tasks {
    fn process() -> Tasks {
        let py = |script: &str| ["/usr/bin/python3", "-S", "-c", script].map(String::from).to_vec();
        Tasks {
            executor: "process",
            image: "python:latest".into(),
            web: py(SERVER),
            client: py(acceptance_stack::CLIENT),
        }
    }

    fn docker(image: &str) -> Tasks {
        let sh = |script: &str| ["sh", "-c", script].map(String::from).to_vec();
        Tasks { executor: "docker", image: image.into(), web: sh(DOCKER_WEB), client: sh(DOCKER_CLIENT) }
    }
}

/// The docker executor's `web`: busybox httpd answering with its hostname.
const DOCKER_WEB: &str = "mkdir -p /www; hostname > /www/index.html; exec httpd -f -p 80 -h /www";

/// The docker executor's `client`: the same `RESULT` lines as `acceptance_stack::CLIENT`, with busybox's nslookup and
/// wget. (`timeout`, not wget's `-T`, which crashes Debian's static busybox 1.35.)
const DOCKER_CLIENT: &str = r#"
res() { nslookup "$1" 2>/dev/null | sed -n 's/^Address:[[:space:]]*\([0-9.]*\)$/\1/p' | sort | tr '
' ',' | sed 's/,$//'; }
i=0
until [ "$(res tasks.web | tr ',' '\n' | grep -c .)" -ge 2 ] || [ $i -ge 300 ]; do i=$((i+1)); sleep 0.2; done
echo "RESULT web $(res web)"
echo "RESULT tasks.web $(res tasks.web)"
echo "RESULT db $(res db)"
VIP="${VIP:-$(res web)}"
for t in "name http://web/" "vip http://$VIP/" "outside http://$OUTSIDE:8099/"; do
  set -- $t
  i=0
  until timeout 3 wget -q -O /dev/null "$2"; do i=$((i+1)); [ $i -ge 100 ] && break; sleep 0.1; done
  c=$(for i in $(seq 40); do timeout 3 wget -q -O - "$2" || echo "error:wget"; echo; done | grep -v '^$' | sort | uniq -c | awk '{printf "%s=%s ", $2, $1}')
  echo "RESULT $1 $c"
done
echo "RESULT DONE"
sleep 100000
"#;

#[test]
fn the_readme_daemon_carries_an_overlay_in_the_hosts_namespace_beside_dockers_firewall() {
    if shoal_testkit::prerequisites::skip_unless(shoal_testkit::prerequisites::Prerequisite::DockerCli) {
        return;
    }
    readme_daemon_on_the_host(Tasks::process());
}

/// The same with `--executor docker` (the engine's containers in their holders' namespaces).
#[test]
fn the_readme_daemon_with_the_docker_executor_carries_an_overlay_in_the_hosts_namespace() {
    let Some(image) = shoal_testkit::docker_engine::test_image_or_skip() else { return };
    readme_daemon_on_the_host(Tasks::docker(image));
}

/// An attachment that names the task's interface (`--network name=...,driver-opt=` Docker's
/// `com.docker.network.endpoint.ifname`): the task's namespace has that interface with the task's address on the
/// network, and the other attachment keeps its `eth<i>` name. Service `named` stays for the removal below.
fn named_interface(d: &Daemon, kind: &Tasks) {
    let front = "name=app_front,driver-opt=com.docker.network.endpoint.ifname=front0";
    d.docker(&[
        "service",
        "create",
        "-d",
        "--name",
        "named",
        "--network",
        front,
        "--network",
        "app_back",
        &kind.image,
        "/bin/sleep",
        "100000",
    ]);
    let task = wait_until("named's task running", WAIT, || {
        let t = d.docker(&["service", "ps", "named", "--format", "{{.ID}} {{.CurrentState}}", "--no-trunc"]);
        match t.lines().next() {
            Some(l) if l.contains("Running") => Ok(l.split(' ').next().unwrap().to_string()),
            _ => Err(t),
        }
    });
    let addr = |network: &str| {
        let format = format!(
            "{{{{range .NetworksAttachments}}}}{{{{if eq .Network.Spec.Name \"{network}\"}}}}{{{{index .Addresses \
             0}}}}{{{{end}}}}{{{{end}}}}"
        );
        d.docker(&["inspect", "--format", &format, &task]).trim().to_string()
    };
    let (front_addr, back_addr) = (addr("app_front"), addr("app_back"));
    let ns = format!("shl-task-{task}");
    let ifaces = run(&["ip", "netns", "exec", &ns, "ip", "-o", "-4", "addr", "show"]);
    let name_of = |a: &str| {
        let l = ifaces.lines().find(|l| l.contains(&format!(" {a} ")));
        l.and_then(|l| l.split_whitespace().nth(1)).unwrap_or_default().to_string()
    };
    // (The CLI sorts a service's networks, so `app_back` may come first: eth0 or eth1.)
    let back_if = name_of(&back_addr);
    assert!(
        name_of(&front_addr) == "front0" && ["eth0", "eth1"].contains(&back_if.as_str()),
        "{front_addr} {back_addr}:\n{ifaces}"
    );
    let opts = d.docker(&["service", "inspect", "named", "--format", "{{json .Spec.TaskTemplate.Networks}}"]);
    assert!(opts.contains(r#""DriverOpts":{"com.docker.network.endpoint.ifname":"front0"}"#), "{opts}");
}

/// The README's daemon (`shoal daemon --state-dir ./shoal-state`) with `executor`, in a scratch directory, once
/// its node is ready with the overlay plugin (its data plane carries networks).
fn start_readme_daemon(executor: &str) -> (tempfile::TempDir, Daemon) {
    let dir = tempfile::tempdir_in(shoal_testkit::scratch_dir()).unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut cmd = Command::new(shoal_bin());
    cmd.current_dir(dir.path())
        .args(["daemon", "--state-dir", "./shoal-state", "--executor", executor, "--listen-remote-api", &listen])
        .env_remove("SHOAL_HOST")
        .env_remove("SHOAL_STATE_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("daemon.log")).unwrap());
    let d = Daemon { child: Some(cmd.spawn().unwrap()), dir: dir.path().to_path_buf() };
    wait_until("the node ready with the overlay plugin", WAIT, || {
        let out = docker_cli::command(
            &d.socket(),
            &["node", "inspect", "self", "--format", "{{json .Description.Engine.Plugins}}"],
        )
        .output()
        .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if text.contains("\"overlay\"") {
            return Ok(());
        }
        let log = d.log();
        assert!(
            !log.contains("another Shoal daemon carries this network namespace"),
            "another daemon holds the host's data plane (another test run on this machine?): rerun\n{log}"
        );
        Err(format!("{text}{}", String::from_utf8_lossy(&out.stderr)))
    });

    (dir, d)
}

fn readme_daemon_on_the_host(kind: Tasks) {
    let forward = run(&["iptables", "-w", "-S", "FORWARD"]);
    eprintln!("the host's FORWARD chain:\n{forward}");
    assert_eq!(host_leftovers(), Vec::<String>::new(), "Shoal's data plane is already in the host's namespace");
    let outside = Outside::beside_host();

    let (dir, mut d) = start_readme_daemon(kind.executor);

    // The acceptance's stack (issue 30): `web` (2 replicas, a published port) on two overlay networks, `client`
    // on `front` with it, `db` on `back` with it, deployed with `docker stack deploy` as a user would.
    let published = free_port();
    let compose = acceptance_stack::compose(&kind.image, &kind.web, &kind.client, &outside.ip, published);
    std::fs::write(dir.path().join("stack.yml"), compose.to_string()).unwrap();
    d.docker(&["stack", "deploy", "--resolve-image", "never", "-c", "stack.yml", "app"]);
    for (service, want) in [("app_web", "2/2"), ("app_db", "1/1")] {
        wait_until(&format!("{service} {want}"), WAIT, || {
            let filter = format!("name={service}");
            let text = d.docker(&["service", "ls", "--filter", &filter, "--format", "{{.Replicas}}"]);
            if text.trim() == want {
                Ok(())
            } else {
                Err(text)
            }
        });
    }
    // The VIP on front (the service has one on back and on the ingress network too).
    let vip = acceptance_stack::vip_on(|a| d.docker(a), "app_web", "app_front");
    let tasks = d.docker(&[
        "service",
        "ps",
        "app_web",
        "--filter",
        "desired-state=running",
        "--format",
        "{{.ID}}",
        "--no-trunc",
    ]);
    // Each task's address on a network (the server answers with the address a connection arrived at).
    let addrs_on = |network: &str| -> Vec<String> {
        let format = format!(
            "{{{{range .NetworksAttachments}}}}{{{{if eq .Network.Spec.Name \"{network}\"}}}}{{{{index .Addresses \
             0}}}}{{{{end}}}}{{{{end}}}}"
        );
        let mut v: Vec<String> = tasks
            .lines()
            .map(|t| d.docker(&["inspect", "--format", &format, t]).trim().split('/').next().unwrap().to_string())
            .collect();
        v.sort();
        v
    };
    let (web_addrs, web_ingress) = (addrs_on("app_front"), addrs_on("ingress"));
    assert_eq!(web_addrs.len(), 2, "{web_addrs:?}");

    let client = wait_until("the client running", WAIT, || {
        let t = d.docker(&[
            "service",
            "ps",
            "app_client",
            "--filter",
            "desired-state=running",
            "--format",
            "{{.ID}} {{.CurrentState}}",
            "--no-trunc",
        ]);
        match t.lines().next() {
            Some(l) if l.contains("Running") => Ok(l.split(' ').next().unwrap().to_string()),
            _ => Err(format!("{t}{}", d.docker(&["service", "ps", "--no-trunc", "app_client"]))),
        }
    });
    let r = results(&kind, &dir.path().join("shoal-state"), &client);
    eprintln!("the client saw: {r:?}");
    // From inside the task: `web` is the VIP, `tasks.web` the two tasks, both answer through the name and the
    // VIP, `db` has no name there, and the outside world answers (masqueraded through the host's FORWARD chain).
    acceptance_stack::check_client(&r, &vip, &web_addrs);

    // The published port from outside the host (prerouting, then the host's FORWARD chain) and on the host's
    // own loopback: both tasks answer.
    for (what, host) in [("from outside", outside.host_ip.as_str()), ("on 127.0.0.1", "127.0.0.1")] {
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..20 {
            let body = if host == "127.0.0.1" {
                let mut c = TcpStream::connect_timeout(
                    &SocketAddr::new(Ipv4Addr::LOCALHOST.into(), published),
                    Duration::from_secs(3),
                )
                .unwrap_or_else(|e| panic!("127.0.0.1:{published}: {e}"));
                c.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
                let mut s = String::new();
                c.read_to_string(&mut s).unwrap();
                s.split("\r\n\r\n").nth(1).unwrap_or("").to_string()
            } else {
                outside.get(host, published).unwrap_or_else(|e| panic!("{what}: {host}:{published}: {e}"))
            };
            seen.insert(body);
        }
        // (Each answers with its address on ingress, or its hostname: two answers.)
        assert!(seen.len() == 2, "{what}: both tasks answer through the mesh: {seen:?} ({web_ingress:?})");
    }
    // Shoal's rules are in the host's FORWARD chain, after the jump to DOCKER-USER when Docker made one.
    let forward = run(&["iptables", "-w", "-S", "FORWARD"]);
    let ours = forward.lines().position(|l| l.contains("shoal-netplane"));
    assert!(ours.is_some(), "no Shoal rule in the host's FORWARD chain:\n{forward}");
    if let Some(user) = forward.lines().position(|l| l == "-A FORWARD -j DOCKER-USER") {
        assert!(ours.unwrap() > user, "Shoal's rules come before DOCKER-USER's jump:\n{forward}");
    }

    named_interface(&d, &kind);

    // Removing everything, then a clean stop, leaves nothing of Shoal's in the host's namespace.
    let ids =
        d.docker(&["service", "ps", "app_web", "app_client", "app_db", "named", "--format", "{{.ID}}", "--no-trunc"]);
    let node = d.docker(&["info", "--format", "{{.Swarm.NodeID}}"]).trim().to_string();
    // `stack rm` removes the services, then tries the networks (which may still hold tasks being removed).
    let _ = docker_cli::command(&d.socket(), &["stack", "rm", "app"]).output().unwrap();
    let _ = docker_cli::command(&d.socket(), &["service", "rm", "named"]).output().unwrap();
    // The engine's containers and holders of this node go with the services (docker executor).
    let filter = format!("label=com.docker.swarm.node.id={node}");
    wait_until("the node's containers removed", WAIT, || {
        let left = shoal_testkit::docker_engine::engine_ok(&["ps", "-aq", "--filter", &filter]);
        if left.trim().is_empty() {
            Ok(())
        } else {
            Err(left)
        }
    });
    wait_until("the stack's networks removed", WAIT, || {
        let all = d.docker(&["network", "ls", "--format", "{{.Name}}"]);
        let left: Vec<&str> = all.lines().filter(|n| n.starts_with("app_")).collect();
        for n in &left {
            let _ = docker_cli::command(&d.socket(), &["network", "rm", n]).output();
        }
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    });
    // The last reconcile without a network (a docker executor's clean stop keeps what running tasks use:
    // there is none left).
    wait_until("nothing of Shoal's left in the host's namespace", WAIT, || {
        let left = host_leftovers();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    });
    let ids: Vec<&str> = ids.lines().collect();
    wait_task_namespaces_released(&ids);
    assert!(d.stop(), "a clean stop on SIGTERM");
    let left = host_leftovers();
    assert!(left.is_empty(), "left in the host's namespace: {left:?}\n{}", d.log());
    let still = task_namespaces_left(&ids);
    assert!(ids.len() >= 4 && still.is_empty(), "task namespaces left: {still:?} of {ids:?}");
}

/// The tasks of `ids` whose network namespace (`shl-task-<id>`) still exists.
fn task_namespaces_left(ids: &[&str]) -> Vec<String> {
    ids.iter()
        .filter(|id| Path::new("/run/netns").join(format!("shl-task-{id}")).exists())
        .map(|id| id.to_string())
        .collect()
}

/// Waits until the agent has released the namespaces of the removed tasks `ids` (once their containers are
/// gone; a stop before that leaves them to the next start: issue 30, item 4).
fn wait_task_namespaces_released(ids: &[&str]) {
    wait_until("the removed tasks' namespaces released", WAIT, || {
        let left = task_namespaces_left(ids);
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    });
}

/// From inside a task's namespace (`ip netns exec`, the host's python3): one HTTP GET of `addr`:80, printing
/// the answer's body (the process executor's server answers with the address it was reached at, the docker
/// executor's busybox httpd with its hostname).
const GET: &str = r#"
import socket, sys
c = socket.create_connection((sys.argv[1], 80), timeout=3)
c.sendall(b'GET / HTTP/1.0\r\n\r\n')
d = b''
while True:
    b = c.recv(4096)
    if not b:
        break
    d += b
print(d.split(b'\r\n\r\n', 1)[1].decode().strip())
"#;

/// An overlay of two IPv4 subnets (docs/design/overlay-subnets.md, part 1) in the host's own namespace with the
/// README's daemon: a network whose IPAM configs are A with an IP range of 4 addresses, then B (made through the
/// Engine API, as an SDK makes it). The VIP and three tasks fill the first range, so of five tasks two are on the
/// second subnet; each running task reaches every task of the other subnet (an HTTP GET from inside its namespace,
/// routed through its subnet's gateway and the host), and a task of the second subnet reaches the service's VIP on
/// the first. Removing the service and the network, then a clean stop, leaves nothing of Shoal's in the host's
/// namespace.
#[test]
fn the_readme_daemon_routes_between_the_subnets_of_an_overlay_in_the_hosts_namespace() {
    if shoal_testkit::prerequisites::skip_unless(shoal_testkit::prerequisites::Prerequisite::DockerCli) {
        return;
    }
    two_subnets_on_the_host(Tasks::process(), false);
}

/// The same on an `--internal` network: no gateway end on the host; each subnet's gateway is on its bridge in
/// the network's namespace, which routes between them.
#[test]
fn the_readme_daemon_routes_between_the_subnets_of_an_internal_overlay_in_the_hosts_namespace() {
    if shoal_testkit::prerequisites::skip_unless(shoal_testkit::prerequisites::Prerequisite::DockerCli) {
        return;
    }
    two_subnets_on_the_host(Tasks::process(), true);
}

/// The same with `--executor docker` (the engine's containers in their holders' namespaces).
#[test]
fn the_readme_daemon_with_the_docker_executor_routes_between_the_subnets_of_an_overlay() {
    let Some(image) = shoal_testkit::docker_engine::test_image_or_skip() else { return };
    two_subnets_on_the_host(Tasks::docker(image), false);
}

fn two_subnets_on_the_host(kind: Tasks, internal: bool) {
    assert_eq!(host_leftovers(), Vec::<String>::new(), "Shoal's data plane is already in the host's namespace");
    let (_dir, mut d) = start_readme_daemon(kind.executor);
    let (first, second) = ("10.213.0.", "10.214.0.");
    // Through the Engine API, as an SDK sends it: the configs in order (`docker network create --subnet A
    // --subnet B` sends them in the order of a Go map, so either may come first, and a compose file's
    // schema has no `ip_range`).
    let body = format!(
        r#"{{"Name": "two_subnets", "Driver": "overlay", "Internal": {internal}, "IPAM": {{"Config": [
        {{"Subnet": "10.213.0.0/24", "IPRange": "10.213.0.8/30"}}, {{"Subnet": "10.214.0.0/24"}}]}}}}"#
    );
    let socket = d.socket();
    let created = run(&[
        "curl",
        "-sS",
        "--fail-with-body",
        "--unix-socket",
        socket.to_str().unwrap(),
        "-H",
        "Content-Type: application/json",
        "-d",
        &body,
        "http://localhost/v1.41/networks/create",
    ]);
    assert!(created.contains("\"Id\""), "{created}");
    // One VXLAN ID per subnet, in order, as a Docker Engine worker reads them.
    let vnis = d.docker(&[
        "network",
        "inspect",
        "two_subnets",
        "--format",
        "{{index .Options \"com.docker.network.driver.overlay.vxlanid_list\"}}",
    ]);
    assert_eq!(vnis.trim().split(',').count(), 2, "{vnis}");
    let mut args =
        vec!["service", "create", "-d", "--name", "two_spread", "--network", "two_subnets", "--replicas", "5"];
    args.push(&kind.image);
    args.extend(kind.web.iter().map(String::as_str));
    d.docker(&args);
    wait_until("two_spread 5/5", WAIT, || {
        let text = d.docker(&["service", "ls", "--filter", "name=two_spread", "--format", "{{.Replicas}}"]);
        if text.trim() == "5/5" {
            Ok(())
        } else {
            Err(format!("{text}{}", d.docker(&["service", "ps", "--no-trunc", "two_spread"])))
        }
    });
    let ids = d.docker(&[
        "service",
        "ps",
        "two_spread",
        "--filter",
        "desired-state=running",
        "--format",
        "{{.ID}}",
        "--no-trunc",
    ]);
    let format = "{{range .NetworksAttachments}}{{if eq .Network.Spec.Name \"two_subnets\"}}{{index .Addresses \
                  0}}{{end}}{{end}}";
    // (task ID, its address without the prefix); each address with its subnet's /24.
    let tasks: Vec<(String, String)> = ids
        .lines()
        .map(|id| {
            let a = d.docker(&["inspect", "--format", format, id]).trim().to_string();
            assert!(a.ends_with("/24"), "{id}: {a}");
            (id.to_string(), a.trim_end_matches("/24").to_string())
        })
        .collect();
    let on = |prefix: &str| -> Vec<&(String, String)> { tasks.iter().filter(|(_, a)| a.starts_with(prefix)).collect() };
    let (on_first, on_second) = (on(first), on(second));
    let network = d.docker(&["network", "inspect", "two_subnets", "--format", "{{json .IPAM}}"]);
    assert_eq!((on_first.len(), on_second.len()), (3, 2), "{tasks:?}\n{network}");
    let vip = acceptance_stack::vip_on(|a| d.docker(a), "two_spread", "two_subnets");
    assert_eq!(vip, "10.213.0.8", "the VIP is the first pool's first free address");

    // From inside each running task: every task of the other subnet answers, through the task's gateway and
    // the host (the first answer may wait for the data plane's reconcile of the last task).
    let get = |from: &str, addr: &str| -> Result<String, String> {
        let out = Command::new("ip")
            .args(["netns", "exec", &format!("shl-task-{from}"), "/usr/bin/python3", "-S", "-c", GET, addr])
            .output()
            .map_err(|e| e.to_string())?;
        let body = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if out.status.success() && !body.is_empty() {
            Ok(body)
        } else {
            Err(format!("{from} -> {addr}: {body}{}", String::from_utf8_lossy(&out.stderr)))
        }
    };
    for (from, mine) in &tasks {
        let (others, gateway, other_subnet) = if mine.starts_with(first) {
            (&on_second, "10.213.0.1", "10.214.0.0/24")
        } else {
            (&on_first, "10.214.0.1", "10.213.0.0/24")
        };
        // The route to the other subnet, through the task's own subnet's gateway (libnetwork's static route).
        let ns = format!("shl-task-{from}");
        let route = run(&["ip", "netns", "exec", &ns, "ip", "route", "show", other_subnet]);
        assert!(route.contains(&format!("via {gateway} ")), "{mine}: {route}");
        if internal {
            let default = run(&["ip", "netns", "exec", &ns, "ip", "route", "show", "default"]);
            assert_eq!(default.trim(), "", "{mine}: an internal network's task has a default route");
            assert!(!run(&["ip", "-o", "link", "show"]).contains("shlg"), "an internal network has a gateway end");
        }
        for (_, addr) in others {
            let body = wait_until(&format!("{mine} reaches {addr}"), WAIT, || get(from, addr));
            if kind.executor == "process" {
                assert_eq!(&body, addr, "{mine} -> {addr}: the server answers with the address it was reached at");
            }
        }
    }
    let body = wait_until("a task of the second subnet reaches the VIP", WAIT, || get(&on_second[0].0, &vip));
    if kind.executor == "process" {
        assert!(tasks.iter().any(|(_, a)| *a == body), "the VIP answered from {body}, no task of {tasks:?}");
    }

    // Removing the service and the network leaves nothing of Shoal's in the host's namespace.
    remove_service_and_network(&d, &kind, "two_spread", "two_subnets");
    wait_task_namespaces_released(&tasks.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>());
    assert!(d.stop(), "a clean stop on SIGTERM");
    let left = host_leftovers();
    assert!(left.is_empty(), "left in the host's namespace: {left:?}\n{}", d.log());
}

/// Removes `service` and then `network` (retried while the service's tasks still hold addresses), and waits
/// until the service's containers are gone and nothing of Shoal's is left in the host's namespace.
fn remove_service_and_network(d: &Daemon, kind: &Tasks, service: &str, network: &str) {
    d.docker(&["service", "rm", service]);
    wait_until("the network removed", WAIT, || {
        let all = d.docker(&["network", "ls", "--format", "{{.Name}}"]);
        if !all.lines().any(|n| n == network) {
            return Ok(());
        }
        let out = docker_cli::command(&d.socket(), &["network", "rm", network]).output().unwrap();
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    });
    let filter = format!("label=com.docker.swarm.service.name={service}");
    wait_until("the service's containers removed", WAIT, || {
        let left = if kind.executor == "docker" {
            shoal_testkit::docker_engine::engine_ok(&["ps", "-aq", "--filter", &filter])
        } else {
            String::new()
        };
        if left.trim().is_empty() {
            Ok(())
        } else {
            Err(left)
        }
    });
    wait_until("nothing of Shoal's left in the host's namespace", WAIT, || {
        let left = host_leftovers();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    });
}

/// `AAAA name`: asks the task's resolver (127.0.0.11) for `name`'s AAAA records; prints them sorted, one a line.
const AAAA: &str = r#"
import socket, struct, sys
q = struct.pack('>HHHHHH', 7, 0x100, 1, 0, 0, 0)
for l in sys.argv[1].split('.'):
    q += bytes([len(l)]) + l.encode()
q += b'\0' + struct.pack('>HH', 28, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2)
s.sendto(q, ('127.0.0.11', 53))
r = s.recv(4096)
an = struct.unpack('>H', r[6:8])[0]
i = len(q)
out = []
for _ in range(an):
    i += 2
    t, _, _, n = struct.unpack('>HHIH', r[i:i + 10])
    i += 10
    if t == 28:
        out.append(socket.inet_ntop(socket.AF_INET6, r[i:i + n]))
    i += n
print('\n'.join(sorted(out)))
"#;

/// An IPv6 overlay (`docker network create --ipv6`, docs/design/overlay-subnets.md part 2) in the host's own
/// namespace with the README's daemon, made with the stock docker CLI: the network shows `EnableIPv6` and both
/// subnets, each task has an IPv4 and an IPv6 address on it, every task reaches every other over IPv6 (an HTTP
/// GET from inside its namespace), `tasks.<service>` answers AAAA with the tasks' IPv6 addresses, and removing
/// the service and the network leaves nothing of Shoal's in the host's namespace.
#[test]
fn the_readme_daemon_carries_an_ipv6_overlay_in_the_hosts_namespace() {
    if shoal_testkit::prerequisites::skip_unless(shoal_testkit::prerequisites::Prerequisite::DockerCli) {
        return;
    }
    // The process executor's server, on `[::]:80` (IPv4 too: the socket is dual stack by default).
    let server6 = SERVER.replace("socket.socket()", "socket.socket(socket.AF_INET6)").replace("'0.0.0.0'", "'::'");
    let py = |script: &str| ["/usr/bin/python3", "-S", "-c", script].map(String::from).to_vec();
    ipv6_on_the_host(Tasks { web: py(&server6), ..Tasks::process() });
}

/// The same with `--executor docker` (busybox httpd listens on IPv6 too).
#[test]
fn the_readme_daemon_with_the_docker_executor_carries_an_ipv6_overlay() {
    let Some(image) = shoal_testkit::docker_engine::test_image_or_skip() else { return };
    ipv6_on_the_host(Tasks::docker(image));
}

fn ipv6_on_the_host(kind: Tasks) {
    assert_eq!(host_leftovers(), Vec::<String>::new(), "Shoal's data plane is already in the host's namespace");
    let (_dir, mut d) = start_readme_daemon(kind.executor);
    d.docker(&[
        "network",
        "create",
        "-d",
        "overlay",
        "--ipv6",
        "--subnet",
        "10.216.0.0/24",
        "--subnet",
        "fd00:216::/64",
        "dual6",
    ]);
    let shown = d.docker(&["network", "inspect", "dual6", "--format", "{{.EnableIPv6}} {{json .IPAM.Config}}"]);
    assert!(
        shown.starts_with("true ") && shown.contains("fd00:216::/64") && shown.contains("10.216.0.0/24"),
        "{shown}"
    );
    let mut args = vec!["service", "create", "-d", "--name", "web6", "--network", "dual6", "--replicas", "3"];
    args.push(&kind.image);
    args.extend(kind.web.iter().map(String::as_str));
    d.docker(&args);
    wait_until("web6 3/3", WAIT, || {
        let text = d.docker(&["service", "ls", "--filter", "name=web6", "--format", "{{.Replicas}}"]);
        if text.trim() == "3/3" {
            Ok(())
        } else {
            Err(format!("{text}{}", d.docker(&["service", "ps", "--no-trunc", "web6"])))
        }
    });
    let ids =
        d.docker(&["service", "ps", "web6", "--filter", "desired-state=running", "--format", "{{.ID}}", "--no-trunc"]);
    let format =
        "{{range .NetworksAttachments}}{{if eq .Network.Spec.Name \"dual6\"}}{{json .Addresses}}{{end}}{{end}}";
    // (task ID, its IPv6 address without the prefix).
    let tasks: Vec<(String, String)> = ids
        .lines()
        .map(|id| {
            let a: Vec<String> = serde_json::from_str(d.docker(&["inspect", "--format", format, id]).trim()).unwrap();
            assert!(a.len() == 2 && a[0].starts_with("10.216.0.") && a[1].starts_with("fd00:216::"), "{id}: {a:?}");
            (id.to_string(), a[1].trim_end_matches("/64").to_string())
        })
        .collect();
    assert_eq!(tasks.len(), 3, "{tasks:?}");
    let in_task = |from: &str, script: &str, arg: &str| -> Result<String, String> {
        let out = Command::new("ip")
            .args(["netns", "exec", &format!("shl-task-{from}"), "/usr/bin/python3", "-S", "-c", script, arg])
            .output()
            .map_err(|e| e.to_string())?;
        let body = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if out.status.success() && !body.is_empty() {
            Ok(body)
        } else {
            Err(format!("{from} {arg}: {body}{}", String::from_utf8_lossy(&out.stderr)))
        }
    };
    for (from, mine) in &tasks {
        for (_, addr) in tasks.iter().filter(|(_, a)| a != mine) {
            let body = wait_until(&format!("{mine} reaches {addr} over IPv6"), WAIT, || in_task(from, GET, addr));
            if kind.executor == "process" {
                assert_eq!(&body, addr, "{mine} -> {addr}: the server answers with the address it was reached at");
            }
        }
    }
    let mut want: Vec<String> = tasks.iter().map(|(_, a)| a.clone()).collect();
    want.sort();
    let got = wait_until("tasks.web6 answers AAAA", WAIT, || {
        let got = in_task(&tasks[0].0, AAAA, "tasks.web6")?;
        if got.lines().count() == 3 {
            Ok(got)
        } else {
            Err(got)
        }
    });
    assert_eq!(got.lines().collect::<Vec<_>>(), want);

    remove_service_and_network(&d, &kind, "web6", "dual6");
    assert!(d.stop(), "a clean stop on SIGTERM");
    let left = host_leftovers();
    assert!(left.is_empty(), "left in the host's namespace: {left:?}\n{}", d.log());
}
