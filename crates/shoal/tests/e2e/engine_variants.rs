//! The docker executor next to engines set up otherwise than the default (issue 30, item 6): a stock
//! `dockerd --iptables=false` (`shoal_testkit::second_engine`, in a network namespace of its own joined to the
//! host by a veth), with a `shoal daemon --executor docker` in the engine's namespace using it, as on a host
//! whose engine was told to leave the firewall alone. The engine then makes no chain and leaves the FORWARD
//! policy as it was: Shoal's tasks, whose namespaces are their holders' (network mode `none`) and whose ports
//! the data plane forwards, need nothing of the engine's firewall. `web` (two busybox httpd) on an overlay
//! network answers by name from inside a task, and its published port answers from the host (north-south,
//! through the engine namespace's FORWARD chain) and on the namespace's 127.0.0.1.
//!
//! A stock engine with its defaults spelled out, `--userland-proxy=true` (as this machine's engine, which
//! `host_data_plane.rs` runs beside, and most hosts): the engine sets its chains in its namespace (the FORWARD
//! policy DROP is set by the test, as Docker sets it when it turns forwarding on itself), and a plain `docker run -p
//! 9090:80` container of its own has its `docker-proxy` listening. The userland proxy binds only the ports of Docker's
//! own port bindings (the docker executor asks for none): Shoal's ingress port (8080) and a host-mode port (8081)
//! answer from the host and on 127.0.0.1, tasks reach each other by name both ways, and Docker's own published port
//! still answers, through its proxy too. The same with `--userland-proxy=false` (Docker then DNATs its own port on
//! 127.0.0.1 as well, and runs no proxy).

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{docker_cli, shoal_bin, wait_until, DaemonProcess};
use shoal_testkit::daemon::DaemonOptions;
use shoal_testkit::second_engine::{EngineOptions, SecondEngine};

const WAIT: Duration = Duration::from_secs(90);
const PUBLISHED: u16 = 8080;
/// The host-mode port of the userland-proxy variant.
const HOST_PORT: u16 = 8081;
/// The port of Docker's own container (`docker run -p`) in the userland-proxy variant.
const DOCKER_PORT: u16 = 9090;

/// Leaves the swarm (removing the node's containers and its data plane) before the daemon stops, even when the
/// test failed: the data plane's network namespaces are named in the host's /run/netns.
struct Leaving(DaemonProcess);

impl Drop for Leaving {
    fn drop(&mut self) {
        if self.0.is_running() {
            let _ = docker_cli::run(self.0.socket(), &["swarm", "leave", "--force"]);
        }
        self.0.stop();
    }
}

impl Leaving {
    fn docker(&self, args: &[&str]) -> String {
        docker_cli::ok(self.0.socket(), args)
    }

    /// Waits until `service` shows `want` replicas.
    fn converged(&self, service: &str, want: &str) {
        wait_until(&format!("{service} {want}"), WAIT, || {
            let filter = format!("name={service}");
            let r = self.docker(&["service", "ls", "--filter", &filter, "--format", "{{.Replicas}}"]);
            if r.trim() == want {
                Ok(())
            } else {
                Err(r)
            }
        });
    }
}

/// Runs `args` in the engine's namespace: stdout and stderr.
fn in_engine_ns(eng: &SecondEngine, args: &[&str]) -> String {
    let out = std::process::Command::new("ip").args(["netns", "exec", eng.netns()]).args(args).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// A Shoal daemon with the docker executor in the engine's namespace, using that engine, once its node has the
/// overlay plugin.
fn shoal_beside(eng: &SecondEngine, hostname: &str) -> Leaving {
    let engine_addr = format!("unix://{}", eng.socket().display());
    let d = Leaving(DaemonProcess::start_with(
        &shoal_bin(),
        DaemonOptions {
            listen_ip: Some(eng.ip()),
            port: Some(4242),
            netns: Some(eng.netns().to_string()),
            hostname: Some(hostname.into()),
            executor: Some("docker".into()),
            extra_args: vec!["--engine-addr".into(), engine_addr],
            ..DaemonOptions::default()
        },
    ));
    wait_until("the node with the overlay plugin", WAIT, || {
        let p = d.docker(&["node", "inspect", "self", "--format", "{{json .Description.Engine.Plugins}}"]);
        if p.contains("\"overlay\"") {
            Ok(())
        } else {
            Err(format!("{p}\n{}", d.0.log()))
        }
    });
    d
}

/// busybox httpd on port 80 answering with its hostname.
const WEB: &str = "mkdir -p /www; hostname > /www/index.html; exec httpd -f -p 80 -h /www";

/// `docker service create` of `name` on overlay `inet`, running `WEB`, with more `flags`.
fn create_web(d: &Leaving, image: &str, name: &str, flags: &[&str]) {
    let mut args = vec!["service", "create", "--detach", "--no-resolve-image", "--name", name, "--network", "inet"];
    args.extend_from_slice(flags);
    args.extend([image, "sh", "-c", WEB]);
    d.docker(&args);
}

/// A GET of `http://host:port/` with curl, from the host's namespace or from `ns`: the body, or the error.
fn get(ns: Option<&str>, host: &str, port: u16) -> Result<String, String> {
    let url = format!("http://{host}:{port}/");
    let mut cmd = match ns {
        Some(ns) => {
            let mut c = std::process::Command::new("ip");
            c.args(["netns", "exec", ns, "curl"]);
            c
        }
        None => std::process::Command::new("curl"),
    };
    let out = cmd.args(["-s", "-m", "3", &url]).output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!("curl {url}: {}", out.status))
    }
}

/// Waits until 20 GETs (`get`) give exactly the answers `want`.
fn answered_by(what: &str, mut get: impl FnMut() -> Result<String, String>, want: &BTreeSet<String>) {
    wait_until(what, WAIT, || {
        let mut seen = BTreeSet::new();
        for _ in 0..20 {
            seen.insert(get()?);
        }
        if &seen == want {
            Ok(())
        } else {
            Err(format!("{seen:?}, want {want:?}"))
        }
    });
}

/// A GET from inside container `c` (busybox wget): the body, or the error.
fn get_from_task(eng: &SecondEngine, c: &str, url: &str) -> Result<String, String> {
    let out = eng.docker(&["exec", c, "timeout", "3", "wget", "-q", "-O", "-", url]);
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!("wget {url}: {}", String::from_utf8_lossy(&out.stderr)))
    }
}

/// The hostnames of containers `ids`, as `hostname` prints inside each (what `WEB` answers).
fn hostnames(eng: &SecondEngine, ids: &[String]) -> BTreeSet<String> {
    let names: BTreeSet<String> =
        ids.iter().map(|c| eng.docker_ok(&["exec", c, "hostname"]).trim().to_string()).collect();
    assert_eq!(names.len(), ids.len(), "containers {ids:?} have distinct hostnames: {names:?}");
    names
}

#[test]
fn the_docker_executor_carries_an_overlay_beside_an_engine_without_iptables() {
    let Some(image) = shoal_testkit::docker_engine::test_image_or_skip() else { return };
    let eng = SecondEngine::start_with_flags(
        EngineOptions { tag: "ipt".into(), hostname: "engine-ipt".into(), manager_ips: 0 },
        &["--iptables=false"],
    );
    let forward = in_engine_ns(&eng, &["iptables", "-w", "-S", "FORWARD"]);
    assert!(!forward.contains("DOCKER"), "the engine made its chains despite --iptables=false:\n{forward}");

    let d = shoal_beside(&eng, "node-ipt");
    d.docker(&["network", "create", "--driver", "overlay", "inet"]);
    create_web(&d, image, "web", &["--replicas", "2", "--publish", &format!("{PUBLISHED}:80")]);
    d.converged("web", "2/2");
    let containers = eng.running_with_label("com.docker.swarm.service.name", "web");
    assert_eq!(containers.len(), 2, "{containers:?}");
    let webs = hostnames(&eng, &containers);

    // East-west, from inside a task: both tasks answer `http://web/` (the VIP).
    answered_by(
        "both tasks answer http://web/ from inside a task",
        || get_from_task(&eng, &containers[0], "http://web/"),
        &webs,
    );

    // North-south: the published port from the host's namespace (over the veth, through the engine
    // namespace's FORWARD chain) and on the engine namespace's loopback.
    answered_by("the published port from the host", || get(None, &eng.ip(), PUBLISHED), &webs);
    answered_by("the published port on 127.0.0.1", || get(Some(eng.netns()), "127.0.0.1", PUBLISHED), &webs);
    let forward = in_engine_ns(&eng, &["iptables", "-w", "-S", "FORWARD"]);
    eprintln!("the engine namespace's FORWARD chain:\n{forward}");
}

#[test]
fn the_docker_executor_publishes_ports_beside_an_engine_with_its_userland_proxy() {
    ports_beside_an_engine("ulp", true);
}

/// The same beside `dockerd --userland-proxy=false`: Docker's own port is then DNATed on 127.0.0.1 too
/// (`route_localnet` on its bridge), with no proxy listening.
#[test]
fn the_docker_executor_publishes_ports_beside_an_engine_without_its_userland_proxy() {
    ports_beside_an_engine("nup", false);
}

fn ports_beside_an_engine(tag: &str, userland_proxy: bool) {
    let Some(image) = shoal_testkit::docker_engine::test_image_or_skip() else { return };
    let eng = SecondEngine::start_with_flags(
        EngineOptions { tag: tag.into(), hostname: format!("engine-{tag}"), manager_ips: 0 },
        &[&format!("--userland-proxy={userland_proxy}")],
    );
    // Docker's own firewall and a container of its own publishing 9090 (through its proxy when it runs one).
    let plain = "mkdir -p /www; echo plain > /www/index.html; exec httpd -f -p 80 -h /www";
    eng.docker_ok(&["run", "-d", "--name", "plain", "-p", &format!("{DOCKER_PORT}:80"), image, "sh", "-c", plain]);
    // Docker sets the FORWARD policy to DROP when it turns IP forwarding on itself; the namespace inherited
    // forwarding on from the host (whose engine did that), so the policy is set here as Docker sets it.
    in_engine_ns(&eng, &["iptables", "-w", "-P", "FORWARD", "DROP"]);
    let forward = in_engine_ns(&eng, &["iptables", "-w", "-S", "FORWARD"]);
    assert!(
        forward.contains("-P FORWARD DROP") && forward.contains("-j DOCKER-USER"),
        "the engine set its firewall:\n{forward}"
    );
    let plain_answers = BTreeSet::from(["plain".to_string()]);
    answered_by(
        "Docker's own published port on 127.0.0.1",
        || get(Some(eng.netns()), "127.0.0.1", DOCKER_PORT),
        &plain_answers,
    );
    let listening = in_engine_ns(&eng, &["ss", "-ltnp"]);
    assert_eq!(
        listening.lines().any(|l| l.contains(&format!(":{DOCKER_PORT} ")) && l.contains("docker-proxy")),
        userland_proxy,
        "whether the engine's userland proxy listens on {DOCKER_PORT}:\n{listening}"
    );

    let d = shoal_beside(&eng, &format!("node-{tag}"));
    d.docker(&["network", "create", "--driver", "overlay", "inet"]);
    create_web(&d, image, "web", &["--replicas", "2", "--publish", &format!("{PUBLISHED}:80")]);
    create_web(&d, image, "hostweb", &["--publish", &format!("mode=host,published={HOST_PORT},target=80")]);
    d.converged("web", "2/2");
    d.converged("hostweb", "1/1");
    let web = eng.running_with_label("com.docker.swarm.service.name", "web");
    let hostweb = eng.running_with_label("com.docker.swarm.service.name", "hostweb");
    assert_eq!((web.len(), hostweb.len()), (2, 1), "{web:?} {hostweb:?}");
    let (webs, hostwebs) = (hostnames(&eng, &web), hostnames(&eng, &hostweb));

    // Tasks reach each other by name, both ways.
    answered_by("http://web/ from inside hostweb's task", || get_from_task(&eng, &hostweb[0], "http://web/"), &webs);
    answered_by(
        "http://hostweb/ from inside a web task",
        || get_from_task(&eng, &web[0], "http://hostweb/"),
        &hostwebs,
    );

    // The ingress port and the host-mode port, from the host and on the namespace's 127.0.0.1, next to the
    // engine's proxy and its DNAT rules.
    for (what, port, want) in [("ingress", PUBLISHED, &webs), ("host-mode", HOST_PORT, &hostwebs)] {
        answered_by(&format!("the {what} port {port} from the host"), || get(None, &eng.ip(), port), want);
        answered_by(
            &format!("the {what} port {port} on 127.0.0.1"),
            || get(Some(eng.netns()), "127.0.0.1", port),
            want,
        );
    }
    // Docker's own port still answers, from the host (its DNAT) and on 127.0.0.1 (its proxy).
    answered_by("Docker's own published port from the host", || get(None, &eng.ip(), DOCKER_PORT), &plain_answers);
    answered_by(
        "Docker's own published port on 127.0.0.1",
        || get(Some(eng.netns()), "127.0.0.1", DOCKER_PORT),
        &plain_answers,
    );
    let listening = in_engine_ns(&eng, &["ss", "-ltnp"]);
    for port in [PUBLISHED, HOST_PORT] {
        assert!(
            !listening.lines().any(|l| l.contains(&format!(":{port} ")) && l.contains("docker-proxy")),
            "the engine's userland proxy took Shoal's port {port}:\n{listening}"
        );
    }
}
