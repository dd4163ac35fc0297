//! Templates, as users write them with the stock docker CLI, against real daemons.
//!
//! Service templates (issue 32): `--hostname "{{.Node.Hostname}}-{{.Task.Slot}}"`, `--env
//! "X={{.Service.Name}}"` and a volume named `tmplsvc-{{.Task.Slot}}` reach a docker-executor task expanded:
//! `docker inspect` of the container and `hostname` inside show them; on the process executor the expanded
//! env is in the process's `/proc/<pid>/environ`; a template that cannot be expanded rejects the task with
//! SwarmKit's message.
//!
//! Hostile templates (issue 31 item 3: a recursive template aborted every daemon that rendered it, a 1.8 KB
//! exponential one was OOM-killed): both are refused at `docker config create` / `docker secret create`
//! with the reason; templates that only a rendering can find too costly (a string doubled by `printf`, loops
//! over 200 service labels nested three deep) reject their task with the reason while the daemon keeps
//! answering, before and after a restart, and the service can be removed.

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::Value;
use shoal_testkit::docker_engine::{self, engine, engine_ok, EngineDaemon};

const WAIT: Duration = Duration::from_secs(60);

fn node_hostname(d: &DaemonProcess) -> String {
    docker(d, &["node", "inspect", "self", "--format", "{{.Description.Hostname}}"]).trim().to_string()
}

fn create(d: &DaemonProcess, args: &[&str]) {
    let mut all = vec!["service", "create", "--detach", "--no-resolve-image"];
    all.extend_from_slice(args);
    docker(d, &all);
}

/// The running tasks of `service`, once there are `n`.
fn running(d: &DaemonProcess, service: &str, n: usize) -> Vec<Value> {
    wait_until(&format!("{n} running tasks of {service}"), WAIT, || {
        let tasks = tasks_of(d, service);
        let running: Vec<Value> =
            tasks.iter().filter(|t| state(t) == "running" && desired(t) == "running").cloned().collect();
        if running.len() == n {
            Ok(running)
        } else {
            Err(format!("{tasks:?}"))
        }
    })
}

/// `service`'s rejected tasks (ID, error), once there is one whose ID is not in `seen`.
fn rejected_beyond(d: &DaemonProcess, service: &str, seen: &[String]) -> Vec<(String, String)> {
    wait_until(&format!("a new rejected task of {service}"), WAIT, || {
        let tasks = tasks_of(d, service);
        let rejected: Vec<(String, String)> = tasks
            .iter()
            .filter(|t| state(t) == "rejected")
            .map(|t| {
                (
                    t["ID"].as_str().unwrap_or_default().to_string(),
                    t["Status"]["Err"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect();
        if rejected.iter().any(|(id, _)| !seen.contains(id)) {
            Ok(rejected)
        } else {
            Err(format!("{rejected:?}"))
        }
    })
}

/// Removes the engine volume when the test ends, however it ends.
struct Volume(String);

impl Drop for Volume {
    fn drop(&mut self) {
        let _ = engine(&["volume", "rm", "-f", &self.0]);
    }
}

#[test]
fn service_templates_are_expanded_in_the_container_on_the_docker_executor() {
    let Some(image) = docker_engine::test_image_or_skip() else { return };
    let volume = Volume("tmplsvc-1".into());
    let _ = engine(&["volume", "rm", "-f", &volume.0]);
    let d = EngineDaemon::start(&shoal_bin());
    let host = node_hostname(&d);
    create(
        &d,
        &[
            "--name",
            "tmplsvc",
            "--hostname",
            "{{.Node.Hostname}}-{{.Task.Slot}}",
            "--env",
            "X={{.Service.Name}}",
            "--env",
            "T={{.Task.Name}}",
            "--env",
            "P={{.Node.Platform.OS}}",
            "--mount",
            "type=volume,source=tmplsvc-{{.Task.Slot}},target=/v",
            "--restart-condition",
            "none",
            image,
            "sleep",
            "100000",
        ],
    );
    let t = running(&d, "tmplsvc", 1).remove(0);
    let task_id = t["ID"].as_str().unwrap();
    let filter = format!("label=com.docker.swarm.task.id={task_id}");
    let container = engine_ok(&["ps", "-q", "--no-trunc", "--filter", &filter]).trim().to_string();
    assert!(!container.is_empty(), "no container for {t}");
    let inspect: Value = serde_json::from_str(&engine_ok(&["inspect", &container])).unwrap();
    let config = &inspect[0]["Config"];
    assert_eq!(config["Hostname"], format!("{host}-1"), "{config}");
    let env: Vec<&str> = config["Env"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(env.contains(&"X=tmplsvc"), "{env:?}");
    assert!(env.contains(&format!("T=tmplsvc.1.{task_id}").as_str()), "{env:?}");
    assert!(env.contains(&"P=linux"), "{env:?}");
    let mounts = inspect[0]["Mounts"].as_array().cloned().unwrap_or_default();
    assert!(mounts.iter().any(|m| m["Name"] == "tmplsvc-1" && m["Destination"] == "/v"), "{mounts:?}");
    assert_eq!(engine_ok(&["exec", &container, "hostname"]).trim(), format!("{host}-1"));
    // The spec keeps the templates: only the task's container is expanded.
    let spec_host =
        docker(&d, &["service", "inspect", "tmplsvc", "--format", "{{.Spec.TaskTemplate.ContainerSpec.Hostname}}"]);
    assert_eq!(spec_host.trim(), "{{.Node.Hostname}}-{{.Task.Slot}}");
    docker(&d, &["service", "rm", "tmplsvc"]);
    wait_until("the container removed", WAIT, || {
        let left = docker_engine::containers_of_node(d.node_id());
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    });
}

#[test]
fn service_templates_reach_a_process_and_bad_ones_reject_the_task_with_swarmkits_message() {
    if no_docker_cli() {
        return;
    }
    let d = daemon();
    let host = node_hostname(&d);
    create(
        &d,
        &[
            "--name",
            "tmplproc",
            "--env",
            "X={{.Service.Name}}-{{.Task.Slot}}",
            "--env",
            "N={{.Node.Hostname}}",
            "busybox",
            "sleep",
            "100311",
        ],
    );
    let t = running(&d, "tmplproc", 1).remove(0);
    let pid = t["Status"]["ContainerStatus"]["PID"].as_i64().unwrap_or_else(|| panic!("no PID: {t}"));
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let vars: Vec<String> = environ.split(|b| *b == 0).map(|v| String::from_utf8_lossy(v).into_owned()).collect();
    assert!(vars.contains(&"X=tmplproc-1".to_string()), "{vars:?}");
    assert!(vars.contains(&format!("N={host}")), "{vars:?}");

    create(
        &d,
        &[
            "--name",
            "tmplbad",
            "--env",
            "Y={{.Service.Name",
            "--restart-condition",
            "none",
            "busybox",
            "sleep",
            "100312",
        ],
    );
    let (_, err) = rejected_beyond(&d, "tmplbad", &[]).remove(0);
    assert!(err.starts_with("expanding env failed: expanding env \"Y={{.Service.Name\""), "{err}");
}

/// The issue's recursive template.
const RECURSIVE: &str = r#"{{define "loop"}}{{template "loop" .}}{{end}}{{template "loop" .}}"#;

/// An exponential template of about 1.8 KB: each definition calls the one before twice (2^40 copies).
fn exponential() -> String {
    let mut t = String::from(r#"{{define "l0"}}0123456789abcdef0123456789abcdef{{end}}"#);
    for i in 1..40 {
        t.push_str(&format!(
            r#"{{{{define "l{i}"}}}}{{{{template "l{0}"}}}}{{{{template "l{0}"}}}}{{{{end}}}}"#,
            i - 1
        ));
    }
    t.push_str(r#"{{template "l39"}}"#);
    t
}

fn create_object(d: &DaemonProcess, kind: &str, name: &str, data: &str) -> std::process::Output {
    docker_cli::run_with_stdin(d.socket(), &[kind, "create", "--template-driver", "golang", name, "-"], data)
}

#[test]
fn hostile_templates_are_refused_or_reject_their_task_and_the_daemon_keeps_answering() {
    if no_docker_cli() {
        return;
    }
    let mut d = daemon();
    let exp = exponential();
    assert!(exp.len() < 2500, "{}", exp.len());
    for kind in ["config", "secret"] {
        for (name, data, why) in
            [("rec", RECURSIVE, "recursive templates are not supported"), ("exp", exp.as_str(), "steps to render")]
        {
            let out = create_object(&d, kind, &format!("{kind}-{name}"), data);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{kind} {name} accepted");
            assert!(
                stderr.contains("golang template cannot be rendered") && stderr.contains(why),
                "{kind} {name}: {stderr}"
            );
        }
    }
    let names = docker(&d, &["config", "ls", "--format", "{{.Name}}"])
        + &docker(&d, &["secret", "ls", "--format", "{{.Name}}"]);
    assert!(names.trim().is_empty(), "nothing was created: {names}");

    // Found costly only when rendering: a string doubled 40 times, and three nested loops over 200 labels.
    let doubling = format!("{{{{$x := \"ab\"}}}}{}{{{{len $x}}}}", "{{$x := printf \"%s%s\" $x $x}}".repeat(40));
    let out = create_object(&d, "config", "doubling", &doubling);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let loops = "{{range .Service.Labels}}{{range $.Service.Labels}}{{range $.Service.Labels}}x{{end}}{{end}}{{end}}";
    let out = create_object(&d, "secret", "loops", loops);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Retried after the restart delay: each attempt renders again.
    create(
        &d,
        &[
            "--name",
            "doubling",
            "--config",
            "source=doubling,target=/etc/doubling",
            "--restart-delay",
            "1s",
            "busybox",
            "sleep",
            "100313",
        ],
    );
    let mut labelled = vec!["--name", "loops", "--secret", "source=loops,target=loops", "--restart-delay", "1s"];
    let labels: Vec<String> = (0..200).map(|i| format!("l{i}=v")).collect();
    for l in &labels {
        labelled.extend_from_slice(&["--label", l]);
    }
    labelled.extend_from_slice(&["busybox", "sleep", "100314"]);
    create(&d, &labelled);
    // Each service's rejected task IDs, checked; the daemon answers.
    let check = |d: &DaemonProcess, seen: &[String]| -> Vec<String> {
        let mut ids = Vec::new();
        for (id, err) in rejected_beyond(d, "doubling", seen) {
            assert!(
                err.starts_with("config doubling: its golang template did not render: ")
                    && err.contains("more bytes than the limit"),
                "{err}"
            );
            ids.push(id);
        }
        for (id, err) in rejected_beyond(d, "loops", seen) {
            assert!(
                err.starts_with("secret loops: its golang template did not render: ")
                    && err.contains("steps to render"),
                "{err}"
            );
            ids.push(id);
        }
        assert_eq!(docker(d, &["service", "ls", "--format", "{{.Name}}"]).lines().count(), 2);
        ids
    };
    let first = check(&d, &[]);
    // Retried: rendered again, rejected again.
    let seen = check(&d, &first);
    let pid = d.pid();
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists(), "the daemon is alive");
    d.stop();
    d.restart(&[]);
    wait_until("the daemon answers after its restart", WAIT, || {
        let out = docker_cli::run(d.socket(), &["node", "ls"]);
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    });
    // Rendered again after the restart (new attempts), rejected again, the daemon still up.
    check(&d, &seen);
    create(&d, &["--name", "fine", "busybox", "sleep", "100315"]);
    running(&d, "fine", 1);
    docker(&d, &["service", "rm", "doubling", "loops", "fine"]);
    assert!(docker(&d, &["service", "ls", "-q"]).trim().is_empty());
}
