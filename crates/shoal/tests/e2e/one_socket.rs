//! One socket, as dockerd gives it: with the docker executor, Shoal's control socket serves the whole Docker
//! Engine API, the engine's paths relayed to the node's Docker Engine (`shoal_engine_api::relay`). Driven
//! with the stock docker CLI with `DOCKER_HOST` set to Shoal's socket only, and with the Python SDK: `docker
//! ps` shows the service's containers, `docker exec` with and without a TTY (through a pty, by `script`),
//! `docker logs -f` delivers lines as they come, `docker run --rm` prints, images, volumes and networks (the
//! engine's and the swarm's) are listed, `docker events` delivers container and service events filtered
//! by type. A process-executor node answers the engine's paths with a clear error; a docker node in no swarm
//! answers them as the engine does.
//!
//! Skipped (with a message) where the docker CLI or engine is missing. What a test creates on the engine is
//! removed when it ends, however it ends.

use crate::common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use shoal_testkit::daemon::DaemonOptions;
use shoal_testkit::docker_engine::{self, engine, engine_ok, EngineDaemon};

/// A name no other test run on this machine uses.
fn unique(what: &str) -> String {
    format!("relay-{what}-{}", std::process::id())
}

/// Removes engine containers and volumes by name when dropped.
#[derive(Default)]
struct Cleanup {
    containers: Vec<String>,
    volumes: Vec<String>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for c in &self.containers {
            let _ = engine(&["rm", "-f", c]);
        }
        for v in &self.volumes {
            let _ = engine(&["volume", "rm", "-f", v]);
        }
    }
}

/// The environment a user's docker CLI runs in: `DOCKER_HOST` names Shoal's socket, nothing else.
fn user_env(d: &DaemonProcess) -> Vec<(String, String)> {
    let config = shoal_testkit::scratch_dir().join("docker-config");
    let _ = std::fs::create_dir_all(&config);
    vec![
        ("DOCKER_HOST".into(), format!("unix://{}", d.socket().display())),
        ("DOCKER_CONFIG".into(), config.display().to_string()),
    ]
}

/// The docker CLI as a user runs it (`user_env`).
fn user_docker(d: &DaemonProcess, args: &[&str]) -> Command {
    let mut cmd = Command::new("docker");
    cmd.args(args).envs(user_env(d)).env_remove("DOCKER_CONTEXT").stdin(Stdio::null());
    cmd
}

fn user_ok(d: &DaemonProcess, args: &[&str]) -> String {
    let out = user_docker(d, args).output().expect("run docker");
    assert!(
        out.status.success(),
        "docker {args:?} failed ({}):\nstdout: {}\nstderr: {}\ndaemon log:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `user_docker` started, its output lines arriving on the channel as it prints them; killed when dropped.
struct Lines {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Drop for Lines {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn user_lines(d: &DaemonProcess, args: &[&str]) -> Lines {
    use std::io::BufRead;
    let mut child = user_docker(d, args).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("docker");
    let out = child.stdout.take().expect("stdout");
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    Lines { child, lines }
}

/// Waits for a line containing every one of `needles` on `lines`; returns it.
fn wait_line(
    lines: &std::sync::mpsc::Receiver<String>,
    needles: &[&str],
    deadline: Duration,
    seen: &mut Vec<String>,
) -> String {
    let end = Instant::now() + deadline;
    loop {
        if let Some(l) = seen.iter().find(|l| needles.iter().all(|n| l.contains(n))) {
            return l.clone();
        }
        let left = end.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(l) => seen.push(l),
            Err(_) => panic!("no line with {needles:?} within {deadline:?}; seen: {seen:#?}"),
        }
    }
}

#[test]
fn the_docker_cli_on_shoals_socket_reaches_containers_images_volumes_networks_and_events() {
    let Some(image) = docker_engine::test_image_or_skip() else { return };
    let d = EngineDaemon::start(&shoal_bin());
    let mut cleanup = Cleanup::default();
    let svc = unique("web");

    // Both event streams first, so that they see what follows.
    let fmt = "{{.Type}} {{.Action}} {{.Actor.Attributes.name}}";
    let container_events = user_lines(&d, &["events", "--filter", "type=container", "--format", fmt]);
    let service_events = user_lines(&d, &["events", "--filter", "type=service", "--format", fmt]);
    let (container_lines, service_lines) = (&container_events.lines, &service_events.lines);
    // `docker events` prints nothing until something happens: wait until both have their stream open, seen
    // from the daemon's side as a swarm write both receive.
    let probe = unique("probe");
    user_ok(&d, &["service", "create", "--detach", "--name", &probe, "--replicas", "0", image, "true"]);
    let mut seen_services: Vec<String> = Vec::new();
    // A stream the CLI opened after the create missed it: the probe is updated (another event) until the
    // service stream shows one of its events.
    let end = Instant::now() + Duration::from_secs(60);
    for i in 0.. {
        let seen = seen_services.iter().any(|l| l.starts_with("service ") && l.contains(probe.as_str()));
        if seen {
            break;
        }
        assert!(Instant::now() < end, "the service event stream never showed the probe: {seen_services:#?}");
        if i > 0 {
            user_ok(&d, &["service", "update", "--detach", "--label-add", &format!("try={i}"), &probe]);
        }
        if let Ok(l) = service_lines.recv_timeout(Duration::from_secs(2)) {
            seen_services.push(l);
        }
    }

    // `docker ps` shows the service's containers.
    user_ok(&d, &["service", "create", "--detach", "--name", &svc, image, "sleep", "1000"]);
    let container = wait_until("the service's container in docker ps", Duration::from_secs(60), || {
        let ps = user_ok(&d, &["ps", "--no-trunc", "--format", "{{.ID}} {{.Names}}"]);
        let running = docker_engine::running_with_label(d.node_id(), "com.docker.swarm.service.name", &svc);
        match running.first() {
            Some(id) if ps.lines().any(|l| l.starts_with(id.as_str()) && l.contains(&format!(" {svc}.1."))) => {
                Ok(id.clone())
            }
            _ => Err(format!("engine runs {running:?}; docker ps says:\n{ps}")),
        }
    });

    // exec without a TTY.
    let hostname = engine_ok(&["inspect", "--format", "{{.Config.Hostname}}", &container]);
    assert_eq!(user_ok(&d, &["exec", &container, "cat", "/etc/hostname"]).trim(), hostname.trim());
    // exec with stdin and no TTY: the hijacked stream carries input both ways.
    let mut cat = user_docker(&d, &["exec", "-i", &container, "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("docker exec -i");
    cat.stdin.take().expect("stdin").write_all(b"through the relay\n").expect("write stdin");
    let out = cat.wait_with_output().expect("docker exec -i");
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "through the relay\n");

    // exec -it through a pty (`script` gives the CLI one): a shell whose stdin is a terminal.
    let mut child = Command::new("script")
        .args(["-qec", &format!("docker exec -it {container} sh"), "/dev/null"])
        .envs(user_env(&d))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script (util-linux) runs docker exec -it in a pty");
    child.stdin.take().expect("stdin").write_all(b"tty; echo $((6*7))\nexit\n").expect("write to the pty");
    let (ok, text) = shoal_testkit::process::wait_exit(child, Duration::from_secs(30), "docker exec -it");
    assert!(ok, "docker exec -it failed: {text}");
    assert!(text.contains("/dev/pts/") && text.contains("42"), "the shell ran on a terminal: {text:?}");

    // logs -f delivers lines as they are written, and goes on following.
    let ticker = unique("ticker");
    cleanup.containers.push(ticker.clone());
    user_ok(
        &d,
        &[
            "run",
            "-d",
            "--name",
            &ticker,
            image,
            "sh",
            "-c",
            "i=0; while :; do echo tick$i; i=$((i+1)); sleep 0.2; done",
        ],
    );
    let mut logs = user_lines(&d, &["logs", "-f", &ticker]);
    let mut seen_logs = Vec::new();
    wait_line(&logs.lines, &["tick0"], Duration::from_secs(20), &mut seen_logs);
    let newest = seen_logs.iter().filter_map(|l| l.strip_prefix("tick")?.parse::<u64>().ok()).max().unwrap_or(0);
    wait_line(&logs.lines, &[&format!("tick{}", newest + 5)], Duration::from_secs(20), &mut seen_logs);
    assert!(logs.child.try_wait().expect("docker logs -f").is_none(), "docker logs -f is still following");
    drop(logs);

    // run --rm prints and leaves nothing.
    let once = unique("once");
    cleanup.containers.push(once.clone());
    assert_eq!(user_ok(&d, &["run", "--rm", "--name", &once, image, "echo", "hi"]), "hi\n");
    wait_until("the --rm container is gone", Duration::from_secs(20), || {
        let left = engine_ok(&["ps", "-aq", "--filter", &format!("name=^{once}$")]);
        if left.trim().is_empty() {
            Ok(())
        } else {
            Err(left)
        }
    });

    // images, volumes.
    let images = user_ok(&d, &["images", "--format", "{{.Repository}}:{{.Tag}}"]);
    assert!(images.lines().any(|l| l == image), "docker images lists {image}: {images}");
    let volume = unique("vol");
    cleanup.volumes.push(volume.clone());
    user_ok(&d, &["volume", "create", &volume]);
    assert!(engine(&["volume", "inspect", &volume]).status.success(), "the volume is the engine's");
    assert!(user_ok(&d, &["volume", "ls", "-q"]).lines().any(|l| l == volume));
    user_ok(&d, &["volume", "rm", &volume]);
    assert!(!engine(&["volume", "inspect", &volume]).status.success(), "removed through Shoal's socket");

    // networks: the engine's local ones and the swarm's overlays in one list.
    let overlay = unique("net");
    user_ok(&d, &["network", "create", "-d", "overlay", &overlay]);
    assert!(!engine(&["network", "inspect", &overlay]).status.success(), "an overlay is the swarm's, not the engine's");
    let nets = user_ok(&d, &["network", "ls", "--format", "{{.Name}} {{.Scope}}"]);
    for want in ["bridge local", "host local", "none local", "ingress swarm", &format!("{overlay} swarm")] {
        assert!(nets.lines().any(|l| l == want), "docker network ls has {want:?}:\n{nets}");
    }
    // A one-off container on a swarm network that is not attachable is refused, saying what to do (an
    // attachable one runs: attachable_networks.rs).
    let out = user_docker(&d, &["run", "--rm", "--network", &overlay, image, "true"]).output().expect("docker run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains(&format!("network {overlay} is not manually attachable"))
            && err.contains("--attachable"),
        "{err}"
    );
    assert_eq!(user_ok(&d, &["network", "inspect", "--format", "{{.Scope}}", "bridge"]).trim(), "local");
    assert_eq!(user_ok(&d, &["network", "inspect", "--format", "{{.Scope}}", &overlay]).trim(), "swarm");

    // info and version: the engine's counts, the swarm's section.
    let info: serde_json::Value =
        serde_json::from_str(&user_ok(&d, &["info", "--format", "{{json .}}"])).expect("info");
    assert_eq!(info["Swarm"]["NodeID"], d.node_id());
    assert!(info["ContainersRunning"].as_u64().unwrap_or(0) >= 2, "the engine's count: {info}");
    assert!(info["Images"].as_u64().unwrap_or(0) >= 1, "{info}");
    let components = user_ok(&d, &["version", "--format", "{{range .Server.Components}}{{.Name}},{{end}}"]);
    assert!(components.contains("Shoal,") && components.contains("Engine,"), "{components}");

    // The event streams: each its type only, both delivered.
    let mut seen_containers = Vec::new();
    wait_line(container_lines, &["container start", &ticker], Duration::from_secs(20), &mut seen_containers);
    wait_line(container_lines, &["container destroy", &once], Duration::from_secs(20), &mut seen_containers);
    wait_line(
        container_lines,
        &["container start", &format!("{svc}.1.")],
        Duration::from_secs(20),
        &mut seen_containers,
    );
    wait_line(service_lines, &["service create", &svc], Duration::from_secs(20), &mut seen_services);
    assert!(seen_containers.iter().all(|l| l.starts_with("container ")), "{seen_containers:#?}");
    assert!(seen_services.iter().all(|l| l.starts_with("service ")), "{seen_services:#?}");
    drop((container_events, service_events));

    user_ok(&d, &["service", "rm", &svc, &probe]);
    user_ok(&d, &["network", "rm", &overlay]);
}

#[test]
fn the_python_sdk_uses_images_containers_exec_and_the_swarm_in_one_client() {
    let Some(image) = docker_engine::test_image_or_skip() else { return };
    let d = EngineDaemon::start(&shoal_bin());
    let svc = unique("py");
    docker(&d, &["service", "create", "--detach", "--name", &svc, image, "sleep", "1000"]);
    wait_until("the service's container runs", Duration::from_secs(60), || {
        let n = docker_engine::running_with_label(d.node_id(), "com.docker.swarm.service.name", &svc).len();
        if n == 1 {
            Ok(())
        } else {
            Err(format!("{n} containers"))
        }
    });
    let script = r#"
import os, docker
client = docker.DockerClient(base_url="unix://" + os.environ["SHOAL_SOCKET"])
svc, image = os.environ["SERVICE"], os.environ["IMAGE"]
assert client.images.get(image).tags == [image], client.images.get(image).tags
found = client.containers.list(filters={"label": "com.docker.swarm.service.name=" + svc})
assert len(found) == 1, found
code, out = found[0].exec_run(["cat", "/etc/hostname"])
assert code == 0 and out.decode().strip() == found[0].attrs["Config"]["Hostname"], (code, out)
assert [s.name for s in client.services.list(filters={"name": svc})] == [svc]
assert client.swarm.attrs["ID"], client.swarm.attrs
print("OK")
"#;
    let socket = d.socket().to_string_lossy().into_owned();
    let out = shoal_testkit::python::run_script(
        script,
        &[("SHOAL_SOCKET", &socket), ("SERVICE", &svc), ("IMAGE", image)],
        Duration::from_secs(150),
    );
    let text = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("OK"), "the SDK script failed:\n{text}\ndaemon log:\n{}", d.log());
    docker(&d, &["service", "rm", &svc]);
}

#[test]
fn a_process_executor_node_says_it_has_no_container_engine() {
    if no_docker_cli() {
        return;
    }
    let d = daemon();
    let out = user_docker(&d, &["ps"]).output().expect("docker ps");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "docker ps fails");
    assert!(err.contains("runs its tasks as processes") && err.contains("--executor docker"), "{err}");
    let r = shoal_testkit::http::request(d.socket(), "GET", "/v1.47/images/json", None).expect("GET /images/json");
    assert_eq!(r.status, 501, "{:?}", r.body);
    assert!(r.body["message"].as_str().is_some_and(|m| m.contains("no container engine")), "{:?}", r.body);
    let r = shoal_testkit::http::request(d.socket(), "GET", "/v1.47/no/such/path", None).expect("GET");
    assert_eq!(r.status, 404, "{:?}", r.body);
    // The swarm's paths are unchanged.
    user_ok(&d, &["service", "ls"]);
    let nets = user_ok(&d, &["network", "ls", "--format", "{{.Name}}"]);
    assert_eq!(nets.trim(), "ingress");
}

#[test]
fn a_docker_node_in_no_swarm_answers_the_engines_paths_as_the_engine_does() {
    let Some(image) = docker_engine::test_image_or_skip() else { return };
    let d = DaemonProcess::start_with(
        &shoal_bin(),
        DaemonOptions {
            executor: Some("docker".into()),
            extra_args: vec!["--no-init".into()],
            ..DaemonOptions::default()
        },
    );
    let images = user_ok(&d, &["images", "--format", "{{.Repository}}:{{.Tag}}"]);
    assert!(images.lines().any(|l| l == image), "{images}");
    let nets = user_ok(&d, &["network", "ls", "--format", "{{.Name}}"]);
    for want in ["bridge", "host", "none"] {
        assert!(nets.lines().any(|l| l == want), "{nets}");
    }
    assert_eq!(user_ok(&d, &["info", "--format", "{{.Swarm.LocalNodeState}}"]).trim(), "inactive");
    let out = user_docker(&d, &["service", "ls"]).output().expect("docker service ls");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("This node is not a swarm manager"));
    // An unknown path is the engine's 404, not "not a swarm manager".
    let r = shoal_testkit::http::request(d.socket(), "GET", "/v1.41/no/such/path", None).expect("GET");
    assert_eq!(r.status, 404, "{:?}", r.body);
}
