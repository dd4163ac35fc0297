//! The docker executor next to engines set up otherwise than the default (issue 30, item 6): a stock
//! `dockerd --iptables=false` (`shoal_testkit::second_engine`, in a network namespace of its own joined to the
//! host by a veth), with a `shoal daemon --executor docker` in the engine's namespace using it, as on a host
//! whose engine was told to leave the firewall alone. The engine then makes no chain and leaves the FORWARD
//! policy as it was: Shoal's tasks, whose namespaces are their holders' (network mode `none`) and whose ports
//! the data plane forwards, need nothing of the engine's firewall. `web` (two busybox httpd) on an overlay
//! network answers by name from inside a task, and its published port answers from the host (north-south,
//! through the engine namespace's FORWARD chain) and on the namespace's 127.0.0.1.
//!
//! The engine's userland proxy (on by default, as on this machine's engine, which `host_data_plane.rs` runs
//! beside) binds only the ports of Docker's own port bindings: the docker executor asks for none.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{docker_cli, shoal_bin, wait_until, DaemonProcess};
use shoal_testkit::daemon::DaemonOptions;
use shoal_testkit::second_engine::{EngineOptions, SecondEngine};

const WAIT: Duration = Duration::from_secs(90);
const PUBLISHED: u16 = 8080;

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

#[test]
fn the_docker_executor_carries_an_overlay_beside_an_engine_without_iptables() {
    let Some(image) = shoal_testkit::docker_engine::test_image_or_skip() else { return };
    let eng = SecondEngine::start_with_flags(
        EngineOptions { tag: "ipt".into(), hostname: "engine-ipt".into(), manager_ips: 0 },
        &["--iptables=false"],
    );
    let in_engine_ns = |args: &[&str]| -> String {
        let out = std::process::Command::new("ip").args(["netns", "exec", eng.netns()]).args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    };
    let forward = in_engine_ns(&["iptables", "-w", "-S", "FORWARD"]);
    assert!(!forward.contains("DOCKER"), "the engine made its chains despite --iptables=false:\n{forward}");

    let engine_addr = format!("unix://{}", eng.socket().display());
    let d = Leaving(DaemonProcess::start_with(
        &shoal_bin(),
        DaemonOptions {
            listen_ip: Some(eng.ip()),
            port: Some(4242),
            netns: Some(eng.netns().to_string()),
            hostname: Some("node-ipt".into()),
            executor: Some("docker".into()),
            extra_args: vec!["--engine-addr".into(), engine_addr],
            ..DaemonOptions::default()
        },
    ));
    let docker = |args: &[&str]| docker_cli::ok(d.0.socket(), args);
    wait_until("the node with the overlay plugin", WAIT, || {
        let p = docker(&["node", "inspect", "self", "--format", "{{json .Description.Engine.Plugins}}"]);
        if p.contains("\"overlay\"") {
            Ok(())
        } else {
            Err(format!("{p}\n{}", d.0.log()))
        }
    });
    docker(&["network", "create", "--driver", "overlay", "inet"]);
    let web = "mkdir -p /www; hostname > /www/index.html; exec httpd -f -p 80 -h /www";
    let publish = format!("{PUBLISHED}:80");
    let args = ["service", "create", "--detach", "--no-resolve-image", "--name", "web", "--network", "inet"];
    let mut args = args.to_vec();
    args.extend(["--replicas", "2", "--publish", &publish, image, "sh", "-c", web]);
    docker(&args);
    wait_until("web 2/2", WAIT, || {
        let r = docker(&["service", "ls", "--filter", "name=web", "--format", "{{.Replicas}}"]);
        if r.trim() == "2/2" {
            Ok(())
        } else {
            Err(r)
        }
    });
    let containers = eng.running_with_label("com.docker.swarm.service.name", "web");
    assert_eq!(containers.len(), 2, "{containers:?}");

    // East-west, from inside a task: both tasks answer `http://web/` (the VIP).
    let answers = wait_until("both tasks answer http://web/ from inside a task", WAIT, || {
        let mut seen = BTreeSet::new();
        for _ in 0..20 {
            let out = eng.docker(&["exec", &containers[0], "timeout", "3", "wget", "-q", "-O", "-", "http://web/"]);
            if !out.status.success() {
                return Err(format!("wget: {}", String::from_utf8_lossy(&out.stderr)));
            }
            seen.insert(String::from_utf8_lossy(&out.stdout).trim().to_string());
        }
        if seen.len() == 2 {
            Ok(seen)
        } else {
            Err(format!("{seen:?}"))
        }
    });
    eprintln!("http://web/ answered by {answers:?}");

    // North-south: the published port from the host's namespace (over the veth, through the engine
    // namespace's FORWARD chain) and on the engine namespace's loopback.
    let get = |ns: Option<&str>, host: &str| -> Result<String, String> {
        let url = format!("http://{host}:{PUBLISHED}/");
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
    };
    for (what, ns, host) in [("from the host", None, eng.ip()), ("on 127.0.0.1", Some(eng.netns()), "127.0.0.1".into())]
    {
        let seen = wait_until(&format!("the published port {what}"), WAIT, || {
            let mut seen = BTreeSet::new();
            for _ in 0..20 {
                seen.insert(get(ns, &host)?);
            }
            if seen.len() == 2 {
                Ok(seen)
            } else {
                Err(format!("{seen:?}"))
            }
        });
        assert_eq!(seen, answers, "{what}: both tasks answer through the mesh");
    }
    let forward = in_engine_ns(&["iptables", "-w", "-S", "FORWARD"]);
    eprintln!("the engine namespace's FORWARD chain:\n{forward}");
}
