//! Services on a node's own networks, as compose files and users ask for them (`docker service create
//! --network host`, a stack's external network `host`): the managers keep the predefined `host` and `bridge`
//! networks (SwarmKit's), which only services name; `docker network ls` shows the node's own networks, and
//! `docker network rm host` is refused.
//!
//! - Process executor, daemon in the test's own namespace: a task on `host` runs in the node's namespace (its
//!   `/proc/self/ns/net` is the test's) and answers on the node's loopback on the port it listens on; a task
//!   on `bridge` waits, explaining that no node has that network; `host` with another network, or with a
//!   routing-mesh port, is refused naming why.
//! - Docker executor, daemon in the test's own namespace on this machine's engine: a task on `host` is a
//!   container in the engine's host namespace (`NetworkMode` host), a task on `bridge` is one on the engine's
//!   default bridge whose host-mode port answers on the machine's loopback.

use crate::common;

use std::time::Duration;

use common::*;
use shoal_testkit::docker_engine::{self, EngineDaemon};

const WAIT: Duration = Duration::from_secs(60);

/// The network namespace of this test process (the daemons here run in it).
fn own_netns() -> String {
    std::fs::read_link("/proc/self/ns/net").unwrap().display().to_string()
}

/// The docker CLI on the daemon's socket: (success, stdout, stderr).
fn docker_out(d: &DaemonProcess, args: &[&str]) -> (bool, String, String) {
    let out = docker_cli::run(d.socket(), args);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A free TCP port on 127.0.0.1.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// An HTTP GET of `http://127.0.0.1:{port}/`: the body, once something answers.
fn get(port: u16) -> Result<String, String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(3))).map_err(|e| e.to_string())?;
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    out.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).ok_or(out)
}

#[test]
fn a_process_task_on_the_host_network_runs_in_the_nodes_namespace() {
    let d = DaemonProcess::start(&shoal_bin());
    let dir = tempfile::tempdir().unwrap();
    let seen = dir.path().join("netns");
    let port = free_port();
    // The task writes its namespace, then serves its answer on the node's loopback.
    let script = format!(
        "import os, socket\nopen({seen:?}, 'w').write(os.readlink('/proc/self/ns/net'))\n\
         s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
         s.bind(('127.0.0.1', {port})); s.listen(8)\n\
         while True:\n    c, _ = s.accept(); c.recv(4096); c.sendall(b'HTTP/1.0 200 OK\\r\\n\\r\\nfrom-host-network'); \
         c.close()\n",
        seen = seen.display().to_string()
    );
    let published = format!("mode=host,target={port},published={port}");
    docker(
        &d,
        &[
            "service",
            "create",
            "--detach",
            "--name",
            "hostnet",
            "--network",
            "host",
            "--publish",
            &published,
            "python",
            "/usr/bin/python3",
            "-S",
            "-c",
            &script,
        ],
    );
    wait_until("the task's namespace written", WAIT, || std::fs::read_to_string(&seen).map_err(|e| e.to_string()));
    assert_eq!(std::fs::read_to_string(&seen).unwrap(), own_netns(), "the node's own namespace");
    let body = wait_until("the task answers on the node's loopback", WAIT, || get(port));
    assert_eq!(body, "from-host-network");
    let inspect = docker(&d, &["service", "inspect", "--format", "{{json .Spec.TaskTemplate.Networks}}", "hostnet"]);
    let host_id = d.get("/v1.47/networks/host?scope=swarm")["Id"].as_str().unwrap().to_string();
    assert!(inspect.contains(&host_id), "the service names the predefined network: {inspect}");

    // A stack's service on the external network `host`, as compose files put node agents there (the CLI
    // adds the service's name as an alias, which the host network has no use for, as Docker's).
    let compose = dir.path().join("stack.yml");
    std::fs::write(
        &compose,
        "version: \"3.8\"\nservices:\n  agent:\n    image: python\n    command: [\"/bin/sleep\", \"1000\"]\n    \
         networks: [hostnet]\nnetworks:\n  hostnet:\n    external: true\n    name: host\n",
    )
    .unwrap();
    docker(&d, &["stack", "deploy", "-c", compose.to_str().unwrap(), "st"]);
    wait_until("the stack's agent running on the host network", WAIT, || {
        let tasks = tasks_of(&d, "st_agent");
        match tasks.first() {
            Some(t) if state(t) == "running" => Ok(()),
            Some(t) => Err(format!("{}: {}", state(t), t["Status"]["Err"])),
            None => Err("no task yet".into()),
        }
    });
    docker(&d, &["stack", "rm", "st"]);

    // The node's own networks are not listed as the swarm's, and stay.
    let listed = docker(&d, &["network", "ls", "--format", "{{.Name}}"]);
    assert!(!listed.lines().any(|l| l == "host" || l == "bridge"), "{listed}");
    let (ok, _, err) = docker_out(&d, &["network", "rm", "host"]);
    assert!(!ok && err.contains("host is a pre-defined network and cannot be removed"), "{err}");
    let (ok, _, err) = docker_out(&d, &["network", "create", "-d", "overlay", "bridge"]);
    assert!(!ok && err.contains("predefined network"), "{err}");

    // What cannot be: host with another network, or a routing-mesh port.
    docker(&d, &["network", "create", "-d", "overlay", "app"]);
    let (ok, _, err) = docker_out(
        &d,
        &["service", "create", "--name", "two", "--network", "host", "--network", "app", "python", "/bin/true"],
    );
    assert!(!ok && err.contains("cannot be combined with other networks"), "{err}");
    let (ok, _, err) = docker_out(
        &d,
        &["service", "create", "--name", "meshed", "--network", "host", "-p", "8080:80", "python", "/bin/true"],
    );
    assert!(!ok && err.contains("routing mesh"), "{err}");

    // `bridge` is an engine's network: a process node does not take the task, and says why.
    docker(
        &d,
        &["service", "create", "--detach", "--name", "bridged", "--network", "bridge", "python", "/bin/sleep", "100"],
    );
    wait_until("the bridged task pending with the reason", WAIT, || {
        let tasks = tasks_of(&d, "bridged");
        let t = tasks.first().ok_or("no task yet")?;
        let err = t["Status"]["Err"].as_str().unwrap_or_default();
        if state(t) == "pending" && err.contains("missing plugin") {
            Ok(())
        } else {
            Err(format!("{}: {err}", state(t)))
        }
    });
}

#[test]
fn docker_tasks_on_host_and_bridge_run_on_the_engines_own_networks() {
    let Some(image) = docker_engine::test_image_or_skip() else { return };
    let d = EngineDaemon::start(&shoal_bin());
    docker(
        &d,
        &[
            "service",
            "create",
            "--detach",
            "--no-resolve-image",
            "--name",
            "onhost",
            "--network",
            "host",
            image,
            "sleep",
            "1000",
        ],
    );
    let port = free_port();
    let published = format!("mode=host,target=80,published={port}");
    let web = "mkdir -p /www; echo from-bridge > /www/index.html; exec httpd -f -p 80 -h /www";
    docker(
        &d,
        &[
            "service",
            "create",
            "--detach",
            "--no-resolve-image",
            "--name",
            "onbridge",
            "--network",
            "bridge",
            "--publish",
            &published,
            image,
            "sh",
            "-c",
            web,
        ],
    );
    let container = |service: &str| {
        wait_until(&format!("a running container of {service}"), WAIT, || {
            let ids = docker_engine::running_with_label(d.node_id(), "com.docker.swarm.service.name", service);
            let tasks = tasks_of(&d, service);
            match ids.first() {
                Some(id) if tasks.iter().any(|t| state(t) == "running") => Ok(id.clone()),
                _ => Err(format!("{tasks:?}")),
            }
        })
    };
    let on_host = container("onhost");
    let mode = docker_engine::engine_ok(&["inspect", "--format", "{{.HostConfig.NetworkMode}}", &on_host]);
    assert_eq!(mode.trim(), "host");
    let pid = docker_engine::engine_ok(&["inspect", "--format", "{{.State.Pid}}", &on_host]);
    let ns = std::fs::read_link(format!("/proc/{}/ns/net", pid.trim())).unwrap().display().to_string();
    let engine_pid = std::process::Command::new("pgrep").args(["-o", "dockerd"]).output().unwrap();
    let engine_pid = String::from_utf8_lossy(&engine_pid.stdout).trim().to_string();
    let engine_ns = std::fs::read_link(format!("/proc/{engine_pid}/ns/net")).unwrap().display().to_string();
    assert_eq!(ns, engine_ns, "the engine's host namespace");

    let on_bridge = container("onbridge");
    let mode = docker_engine::engine_ok(&["inspect", "--format", "{{.HostConfig.NetworkMode}}", &on_bridge]);
    assert_eq!(mode.trim(), "bridge");
    let body = wait_until("the bridged task's host-mode port answers", WAIT, || get(port));
    assert_eq!(body.trim(), "from-bridge");
    docker(&d, &["service", "rm", "onhost", "onbridge"]);
}
