//! The docker executor against the local Docker Engine, driven by the stock docker CLI: tasks are labelled
//! containers visible to `docker ps`, scale and rm converge, a killed container's task is replaced, an
//! unhealthy container never runs, a missing image rejects the task with the engine's reason, and
//! containers survive a restart of the Shoal daemon without loss or duplicates.
//!
//! Skipped (with a message) where the docker CLI or engine is missing. Every test's containers are removed
//! when it ends, however it ends (`EngineDaemon`).

use crate::common;

use std::time::Duration;

use common::*;
use shoal_testkit::docker_engine::{self, EngineDaemon};

fn engine_daemon() -> Option<(EngineDaemon, &'static str)> {
    let image = docker_engine::test_image_or_skip()?;
    Some((EngineDaemon::start(&shoal_bin()), image))
}

/// Waits until the engine runs exactly `n` containers of `service` for this node and the service has `n`
/// running tasks; returns the container IDs.
fn wait_containers(d: &EngineDaemon, service: &str, n: usize) -> Vec<String> {
    wait_until(&format!("{n} running containers of {service}"), Duration::from_secs(60), || {
        let running = tasks_of(d, service).iter().filter(|t| state(t) == "running" && desired(t) == "running").count();
        let ids = docker_engine::running_with_label(d.node_id(), "com.docker.swarm.service.name", service);
        if ids.len() == n && running == n {
            Ok(ids)
        } else {
            let errs: Vec<String> =
                tasks_of(d, service).iter().map(|t| format!("{}: {}", state(t), t["Status"]["Err"])).collect();
            Err(format!("{} containers, {running} running tasks ({errs:?})", ids.len()))
        }
    })
}

#[test]
fn services_run_as_labelled_containers_that_scale_are_replaced_and_removed() {
    let Some((d, image)) = engine_daemon() else { return };
    let info = docker(&d, &["info", "--format", "{{json .}}"]);
    assert!(info.contains("shoal.executor=docker"), "docker info names the executor: {info}");

    // The executor is an engine label a constraint can match (issue 32: it was in `docker info` only).
    let on_docker = ["--constraint", "engine.labels.shoal.executor==docker"];
    let args = ["service", "create", "--detach", "--name", "web", "--replicas", "2"];
    let sid = docker(&d, &[&args[..], &on_docker[..], &[image, "sleep", "1000"]].concat());
    let sid = sid.trim().lines().last().unwrap_or_default().to_string();
    let ids = wait_containers(&d, "web", 2);
    for id in &ids {
        let labels = docker_engine::engine_ok(&["inspect", "--format", "{{json .Config.Labels}}", id]);
        let l: serde_json::Value = serde_json::from_str(&labels).expect("labels JSON");
        assert_eq!(l["com.docker.swarm.service.id"], sid.as_str());
        assert_eq!(l["com.docker.swarm.service.name"], "web");
        assert_eq!(l["com.docker.swarm.node.id"], d.node_id());
        let task_id = l["com.docker.swarm.task.id"].as_str().expect("task id label");
        let name = docker_engine::engine_ok(&["inspect", "--format", "{{.Name}}", id]);
        assert!(name.trim().trim_start_matches('/').starts_with("web.") && name.trim().ends_with(task_id), "{name}");
        let cmd = docker_engine::engine_ok(&["inspect", "--format", "{{json .Config.Cmd}}", id]);
        assert_eq!(cmd.trim(), r#"["sleep","1000"]"#);
    }

    docker(&d, &["service", "scale", "--detach", "web=5"]);
    wait_containers(&d, "web", 5);
    docker(&d, &["service", "scale", "--detach", "web=3"]);
    let ids = wait_containers(&d, "web", 3);

    // A killed container fails its task; the orchestrator replaces it with a new container.
    docker_engine::engine_ok(&["kill", &ids[0]]);
    wait_until("the killed container's task failed and was replaced", Duration::from_secs(60), || {
        let now = docker_engine::running_with_label(d.node_id(), "com.docker.swarm.service.name", "web");
        let failed = tasks_of(&d, "web").iter().filter(|t| state(t) == "failed").count();
        if now.len() == 3 && !now.contains(&ids[0]) && failed == 1 {
            Ok(())
        } else {
            Err(format!("{} running containers, {failed} failed tasks", now.len()))
        }
    });

    docker(&d, &["service", "rm", "web"]);
    wait_until("no container of web left", Duration::from_secs(60), || {
        let left = docker_engine::containers_of_node(d.node_id());
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{} containers", left.len()))
        }
    });
}

#[test]
fn an_unhealthy_container_never_runs_and_is_replaced() {
    let Some((d, image)) = engine_daemon() else { return };
    let args = [
        "service",
        "create",
        "--detach",
        "--name",
        "sick",
        "--health-cmd",
        "false",
        "--health-interval",
        "200ms",
        "--health-retries",
        "1",
        "--restart-delay",
        "100ms",
        image,
        "sleep",
        "1000",
    ];
    docker(&d, &args);
    wait_until("two failed attempts of sick", Duration::from_secs(60), || {
        let tasks = tasks_of(&d, "sick");
        let failed: Vec<_> = tasks.iter().filter(|t| state(t) == "failed").collect();
        if let Some(t) = tasks.iter().find(|t| state(t) == "running") {
            panic!("an unhealthy task reached RUNNING: {t}");
        }
        if failed.len() >= 2 {
            let err = failed[0]["Status"]["Err"].as_str().unwrap_or_default();
            assert!(err.contains("unhealthy"), "the failure says why: {err}");
            Ok(())
        } else {
            Err(format!("{} failed tasks", failed.len()))
        }
    });

    // A healthy one runs.
    docker(
        &d,
        &[
            "service",
            "create",
            "--detach",
            "--name",
            "fine",
            "--health-cmd",
            "true",
            "--health-interval",
            "200ms",
            image,
            "sleep",
            "1000",
        ],
    );
    wait_containers(&d, "fine", 1);
}

#[test]
fn a_missing_image_rejects_the_task_with_the_engines_reason() {
    let Some((d, _)) = engine_daemon() else { return };
    let args = ["service", "create", "--detach", "--name", "ghost", "--restart-delay", "1500ms"];
    docker(&d, &[&args[..], &["shoal-test-no-such-image:1", "sleep", "1"]].concat());
    let rejected = wait_until("four rejected tasks", Duration::from_secs(60), || {
        let tasks = tasks_of(&d, "ghost");
        let rejected: Vec<serde_json::Value> = tasks.iter().filter(|t| state(t) == "rejected").cloned().collect();
        if rejected.len() >= 4 {
            Ok(rejected)
        } else {
            Err(format!("states: {:?}", tasks.iter().map(state).collect::<Vec<_>>()))
        }
    });
    let err = rejected[0]["Status"]["Err"].as_str().unwrap_or_default().to_string();
    assert!(err.contains("shoal-test-no-such-image:1") && err.contains("pulling it failed"), "{err}");
    // The first task is replaced at once; each replacement waits its restart delay before it is replaced in
    // turn: no burst of retries (issue 32 saw 4-6 within 5 s).
    let mut created: Vec<u64> = rejected.iter().map(|t| chrono_ms(t["CreatedAt"].as_str().unwrap()).unwrap()).collect();
    created.sort_unstable();
    for pair in created.windows(2).skip(1) {
        assert!(
            pair[1] - pair[0] >= 1_400,
            "retries {} ms apart, under the 1.5 s restart delay: {created:?}",
            pair[1] - pair[0]
        );
    }
}

#[test]
fn containers_survive_a_daemon_restart_without_loss_or_duplicates() {
    let Some((mut d, image)) = engine_daemon() else { return };
    docker(&d, &["service", "create", "--detach", "--name", "web", "--replicas", "3", image, "sleep", "1000"]);
    let mut before = wait_containers(&d, "web", 3);
    before.sort();
    let tasks_before: Vec<String> =
        tasks_of(&d, "web").iter().map(|t| t["ID"].as_str().unwrap_or_default().to_string()).collect();

    assert!(d.stop(), "the daemon stops cleanly");
    // Containers outlive the daemon.
    let mut during = docker_engine::running_with_label(d.node_id(), "com.docker.swarm.service.name", "web");
    during.sort();
    assert_eq!(during, before, "containers keep running while the daemon is down");

    // A leftover container of a task the manager does not know is removed on restart.
    let stray = docker_engine::engine_ok(&[
        "run",
        "-d",
        "--label",
        &format!("com.docker.swarm.node.id={}", d.node_id()),
        "--label",
        "com.docker.swarm.task.id=notataskofthiscluster0000",
        image,
        "sleep",
        "1000",
    ]);
    let stray = stray.trim().to_string();

    d.restart(&[]);
    let mut after = wait_containers(&d, "web", 3);
    after.sort();
    assert_eq!(after, before, "the same containers, adopted: none lost, none duplicated");
    let mut tasks_after: Vec<String> = tasks_of(&d, "web")
        .iter()
        .filter(|t| state(t) == "running")
        .map(|t| t["ID"].as_str().unwrap_or_default().to_string())
        .collect();
    tasks_after.sort();
    let mut tasks_before = tasks_before;
    tasks_before.sort();
    assert_eq!(tasks_after, tasks_before, "the same tasks keep running");
    wait_until("the stray container is removed", Duration::from_secs(30), || {
        if docker_engine::containers_of_node(d.node_id()).contains(&stray) {
            Err("still there".into())
        } else {
            Ok(())
        }
    });

    // And the service still converges.
    docker(&d, &["service", "scale", "--detach", "web=4"]);
    wait_containers(&d, "web", 4);
}

#[test]
fn auto_picks_docker_when_the_engine_answers_and_processes_otherwise() {
    if shoal_testkit::prerequisites::skip_unless(shoal_testkit::prerequisites::Prerequisite::DockerEngine) {
        return;
    }
    let executor_of = |extra: &[&str]| {
        let d = shoal_testkit::DaemonProcess::start_with(
            &shoal_bin(),
            shoal_testkit::DaemonOptions {
                executor: Some("auto".into()),
                extra_args: extra.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            },
        );
        let labels = d.get("/v1.47/info")["Labels"].clone();
        labels
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l.as_str()?.strip_prefix("shoal.executor=").map(str::to_string))
            .next()
    };
    assert_eq!(executor_of(&[]).as_deref(), Some("docker"));
    let missing = std::env::temp_dir().join("shoal-no-engine-here.sock");
    let addr = format!("unix://{}", missing.display());
    assert_eq!(executor_of(&["--engine-addr", &addr]).as_deref(), Some("process"));
}

#[test]
fn the_container_carries_the_task_spec() {
    let Some((d, image)) = engine_daemon() else { return };
    let vol = tempfile::tempdir().expect("bind source");
    let bind = format!("type=bind,source={},target=/host,readonly", vol.path().display());
    let volume_name = format!("shoal-test-{}", d.node_id());
    let volume = format!("type=volume,source={volume_name},target=/data");
    docker(
        &d,
        &[
            "service",
            "create",
            "--detach",
            "--name",
            "spec",
            "--env",
            "GREETING=hi",
            "--user",
            "nobody",
            "--workdir",
            "/tmp",
            "--hostname",
            "box",
            "--limit-cpu",
            "0.5",
            "--limit-memory",
            "64M",
            "--reserve-memory",
            "32M",
            "--limit-pids",
            "50",
            "--stop-signal",
            "SIGINT",
            "--stop-grace-period",
            "7s",
            "--init",
            "--mount",
            &bind,
            "--mount",
            "type=tmpfs,target=/scratch",
            "--mount",
            &volume,
            "--entrypoint",
            "sleep",
            image,
            "1000",
        ],
    );
    let ids = wait_containers(&d, "spec", 1);
    let c: serde_json::Value =
        serde_json::from_str(&docker_engine::engine_ok(&["inspect", &ids[0]])).expect("inspect JSON");
    let c = &c[0];
    let cfg = &c["Config"];
    assert!(cfg["Env"].as_array().unwrap().iter().any(|e| e == "GREETING=hi"), "{}", cfg["Env"]);
    assert_eq!(
        (cfg["User"].as_str(), cfg["WorkingDir"].as_str(), cfg["Hostname"].as_str()),
        (Some("nobody"), Some("/tmp"), Some("box"))
    );
    assert_eq!(cfg["Entrypoint"], serde_json::json!(["sleep"]));
    assert_eq!(cfg["Cmd"], serde_json::json!(["1000"]));
    assert_eq!((cfg["StopSignal"].as_str(), cfg["StopTimeout"].as_i64()), (Some("SIGINT"), Some(7)));
    let host = &c["HostConfig"];
    assert_eq!(
        (host["NanoCpus"].as_i64(), host["Memory"].as_i64(), host["Init"].as_bool()),
        (Some(500_000_000), Some(64 << 20), Some(true))
    );
    assert_eq!(
        (host["MemoryReservation"].as_i64(), host["PidsLimit"].as_i64()),
        (Some(32 << 20), Some(50)),
        "the reservation and the process count limit reach the container"
    );
    let mounts: Vec<(String, String)> = c["Mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["Type"].as_str().unwrap_or("").to_string(), m["Destination"].as_str().unwrap_or("").to_string()))
        .collect();
    for want in [("bind", "/host"), ("tmpfs", "/scratch"), ("volume", "/data")] {
        assert!(
            mounts.iter().any(|(t, dst)| t == want.0 && dst == want.1)
                || host["Mounts"]
                    .as_array()
                    .is_some_and(|ms| ms.iter().any(|m| m["Type"] == want.0 && m["Target"] == want.1)),
            "mount {want:?} in {mounts:?}"
        );
    }
    drop(d);
    let _ = docker_engine::engine(&["volume", "rm", "-f", &volume_name]);
}

#[test]
fn leaving_the_swarm_removes_the_nodes_containers() {
    let Some((d, image)) = engine_daemon() else { return };
    docker(&d, &["service", "create", "--detach", "--name", "leaving", "--replicas", "2", image, "sleep", "1000"]);
    wait_containers(&d, "leaving", 2);
    let out = docker(&d, &["swarm", "leave", "--force"]);
    assert!(out.contains("Node left the swarm."), "{out}");
    let left = docker_engine::containers_of_node(d.node_id());
    assert!(left.is_empty(), "the node's containers are removed with its swarm state: {left:?}");
    assert_eq!(docker(&d, &["info", "--format", "{{.Swarm.LocalNodeState}}"]).trim(), "inactive");
}

/// `docker service ps` and `GET /tasks` show what Docker's show for a running container: its container ID,
/// and its host-mode ports with the host port the engine chose (issue 32).
#[test]
fn a_running_task_reports_its_container_id_and_the_host_port_the_engine_chose() {
    let Some((d, image)) = engine_daemon() else { return };
    let args = ["service", "create", "--detach", "--name", "ported", "--publish", "mode=host,target=8080"];
    docker(&d, &[&args[..], &[image, "sleep", "1000"]].concat());
    let ids = wait_containers(&d, "ported", 1);
    let task = tasks_of(&d, "ported").into_iter().find(|t| state(t) == "running").expect("a running task");
    assert_eq!(task["Status"]["ContainerStatus"]["ContainerID"], ids[0].as_str(), "{task}");
    // The engine's own record of the binding it chose.
    let bound = docker_engine::engine_ok(&["port", &ids[0], "8080/tcp"]);
    let host_port: u64 = bound
        .lines()
        .find_map(|l| l.rsplit(':').next()?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no host port in `docker port`: {bound}"));
    assert!(host_port > 0);
    let ports = task["Status"]["PortStatus"]["Ports"].as_array().cloned().unwrap_or_default();
    assert_eq!(ports.len(), 1, "one port, whatever addresses the engine bound: {task}");
    assert_eq!(
        (&ports[0]["Protocol"], &ports[0]["TargetPort"], &ports[0]["PublishedPort"], &ports[0]["PublishMode"]),
        (
            &serde_json::json!("tcp"),
            &serde_json::json!(8080),
            &serde_json::json!(host_port),
            &serde_json::json!("host")
        ),
        "{task}"
    );
    let ps = docker(&d, &["service", "ps", "--no-trunc", "--format", "{{.Ports}}", "ported"]);
    assert!(ps.contains(&format!("*:{host_port}->8080/tcp")), "docker service ps shows the port: {ps}");
}

/// `--health-start-interval` reaches the container where the engine applies it (API 1.44+); an older engine
/// would drop it silently, so the task is rejected naming both versions (issue 32).
#[test]
fn a_health_start_interval_is_refused_on_an_engine_too_old_to_apply_it() {
    let Some((d, image)) = engine_daemon() else { return };
    let args = ["service", "create", "--detach", "--name", "startint", "--health-cmd", "true"];
    let args = [&args[..], &["--health-start-interval", "1s", "--health-start-period", "5s", image, "sleep", "1000"]];
    docker(&d, &args.concat());
    let api = docker_engine::engine_ok(&["version", "--format", "{{.Server.APIVersion}}"]);
    let api: Vec<usize> = api.trim().split('.').filter_map(|p| p.parse().ok()).collect();
    if (api[0], api[1]) >= (1, 44) {
        let ids = wait_containers(&d, "startint", 1);
        let set = docker_engine::engine_ok(&["inspect", "--format", "{{.Config.Healthcheck.StartInterval}}", &ids[0]]);
        assert_eq!(set.trim(), "1000000000", "the engine applies it");
        return;
    }
    let t = wait_until("a rejected task", Duration::from_secs(60), || {
        let tasks = tasks_of(&d, "startint");
        tasks.into_iter().find(|t| state(t) == "rejected").ok_or_else(|| "no rejected task yet".to_string())
    });
    let err = t["Status"]["Err"].as_str().unwrap_or_default();
    let engine = format!("this node's engine speaks API {}.{}", api[0], api[1]);
    assert!(err.contains("HealthCheck.StartInterval needs Docker Engine API 1.44") && err.contains(&engine), "{err}");
    assert!(docker_engine::containers_of_node(d.node_id()).is_empty(), "no container was made");
}

/// A registry on 127.0.0.1 (an insecure registry by default, so the engine falls back to plain HTTP) that
/// asks for Basic credentials and records every `Authorization` header it is sent; it serves no image.
struct FakeRegistry {
    addr: std::net::SocketAddr,
    seen: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeRegistry {
    fn start() -> FakeRegistry {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the fake registry");
        let addr = listener.local_addr().unwrap();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (seen2, stop2) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let Ok(mut conn) = conn else { continue };
                conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                    if head.first() == Some(&0x16) {
                        break; // A TLS handshake: the engine tries HTTPS first.
                    }
                }
                let head = String::from_utf8_lossy(&head).to_string();
                if !head.starts_with("GET ") && !head.starts_with("HEAD ") {
                    continue;
                }
                let auth = head.lines().find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("authorization").then(|| v.trim().to_string())
                });
                let response = match auth {
                    None => "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"shoal-test\"\r\n\
                             Docker-Distribution-API-Version: registry/2.0\r\nContent-Length: 0\r\nConnection: \
                             close\r\n\r\n"
                        .to_string(),
                    Some(a) => {
                        seen2.lock().unwrap().push(a);
                        let body = r#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#;
                        format!(
                            "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n\
                             Docker-Distribution-API-Version: registry/2.0\r\nContent-Length: {}\r\nConnection: \
                             close\r\n\r\n{body}",
                            body.len()
                        )
                    }
                };
                let _ = conn.write_all(response.as_bytes());
            }
        });
        FakeRegistry { addr, seen, stop, thread: Some(thread) }
    }
}

impl Drop for FakeRegistry {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        // Wakes the accept so the thread sees the stop.
        let _ = std::net::TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `docker service create --with-registry-auth`: the credentials the CLI sends (`X-Registry-Auth`, from its
/// config's `auths`) are what the engine's pull of the missing image authenticates with (issue 32: they were
/// accepted and dropped).
#[test]
fn with_registry_auth_the_engine_pulls_a_missing_image_with_the_clients_credentials() {
    let Some((d, _)) = engine_daemon() else { return };
    let registry = FakeRegistry::start();
    let config = tempfile::tempdir().unwrap();
    let host = registry.addr.to_string();
    // base64("shoal-user:s3cret")
    let auths = serde_json::json!({"auths": {host.clone(): {"auth": "c2hvYWwtdXNlcjpzM2NyZXQ="}}});
    std::fs::write(config.path().join("config.json"), auths.to_string()).unwrap();
    let image = format!("{host}/private/app:1");
    let cfg = config.path().to_str().unwrap();
    let args = ["--config", cfg, "service", "create", "--detach", "--no-resolve-image", "--with-registry-auth"];
    docker(&d, &[&args[..], &["--name", "private", "--restart-condition", "none", &image, "sleep", "1"]].concat());
    let err = wait_until("the pull refused by the registry", Duration::from_secs(60), || {
        let tasks = tasks_of(&d, "private");
        let t = tasks.iter().find(|t| state(t) == "rejected").ok_or("no rejected task yet")?;
        Ok::<_, String>(t["Status"]["Err"].as_str().unwrap_or_default().to_string())
    });
    assert!(err.contains("pulling it failed"), "{err}");
    let seen = registry.seen.lock().unwrap().clone();
    assert!(
        seen.iter().any(|a| a == "Basic c2hvYWwtdXNlcjpzM2NyZXQ="),
        "the engine authenticated with the client's credentials: {seen:?}"
    );
    // An update without the flag keeps them (`registryAuthFrom=spec`, as Docker): the new task's pull sends
    // them again.
    let before = seen.len();
    docker(&d, &["service", "update", "--detach", "--no-resolve-image", "--force", "private"]);
    wait_until("the updated task's pull with the same credentials", Duration::from_secs(60), || {
        let seen = registry.seen.lock().unwrap().clone();
        let again = seen[before..].iter().filter(|a| *a == "Basic c2hvYWwtdXNlcjpzM2NyZXQ=").count();
        if again > 0 {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    });
    // The credentials are never shown back.
    let spec = docker(&d, &["service", "inspect", "private"]);
    assert!(!spec.contains("s3cret") && !spec.contains("c2hvYWwtdXNlcjpzM2NyZXQ"), "{spec}");
}

/// A task's anonymous volume (a volume mount without a source) goes with its container, as Docker's executor
/// removes it; a named volume stays (issue 32: anonymous volumes outlived their task).
#[test]
fn an_anonymous_volume_is_removed_with_its_task() {
    let Some((d, image)) = engine_daemon() else { return };
    let named = format!("shoal-test-keep-{}", d.node_id());
    let keep = format!("type=volume,source={named},target=/keep");
    let args = ["service", "create", "--detach", "--name", "anon", "--mount", "type=volume,target=/data"];
    docker(&d, &[&args[..], &["--mount", &keep, image, "sleep", "1000"]].concat());
    let ids = wait_containers(&d, "anon", 1);
    let mounts = docker_engine::engine_ok(&["inspect", "--format", "{{json .Mounts}}", &ids[0]]);
    let mounts: serde_json::Value = serde_json::from_str(mounts.trim()).unwrap();
    let anonymous = mounts
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["Destination"] == "/data")
        .and_then(|m| m["Name"].as_str())
        .unwrap_or_else(|| panic!("no volume at /data: {mounts}"))
        .to_string();
    docker(&d, &["service", "rm", "anon"]);
    wait_until("the container and its anonymous volume removed", Duration::from_secs(60), || {
        let left = docker_engine::containers_of_node(d.node_id());
        let volume = docker_engine::engine(&["volume", "inspect", &anonymous]);
        if left.is_empty() && !volume.status.success() {
            Ok(())
        } else {
            Err(format!("containers {left:?}, volume there: {}", volume.status.success()))
        }
    });
    assert!(docker_engine::engine(&["volume", "inspect", &named]).status.success(), "the named volume stays");
    let _ = docker_engine::engine(&["volume", "rm", "-f", &named]);
}
