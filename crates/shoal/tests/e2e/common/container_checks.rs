//! One data-driven check of a running task's container, for the tests of service fields and stack files:
//! `docker inspect` values at JSON pointers, the output of a shell line run inside (`docker exec`), and what
//! `docker service logs` answers.

use std::time::Duration;

use serde_json::Value;
use shoal_testkit::docker_engine::engine_ok;

use super::{docker_cli, wait_until, DaemonProcess};

const WAIT: Duration = Duration::from_secs(90);

/// One thing checked on a task's container.
pub(crate) enum Check {
    /// `docker inspect` of the container: the value at this JSON pointer.
    Inspect(&'static str, Value),
    /// `docker exec` of this shell line in the container: its output contains the text.
    Exec(&'static str, String),
    /// `docker service logs` of the container's service contains the text (`Ok`), or fails with an error
    /// containing it (`Err`).
    Logs(Result<&'static str, &'static str>),
}

/// The running container of task `task_id` (all nodes share the machine's engine).
pub(crate) fn container_of_task(task_id: &str) -> String {
    let filter = format!("label=com.docker.swarm.task.id={task_id}");
    wait_until(&format!("the running container of task {task_id}"), WAIT, || {
        let id = engine_ok(&["ps", "-q", "--no-trunc", "--filter", &filter]).trim().to_string();
        if id.is_empty() {
            Err("none".into())
        } else {
            Ok(id)
        }
    })
}

/// Runs `checks` on `container`, a container of `service`; `what` names it in failures.
pub(crate) fn check_container(d: &DaemonProcess, what: &str, service: &str, container: &str, checks: &[Check]) {
    let inspect: Value = serde_json::from_str(&engine_ok(&["inspect", container])).unwrap();
    let inspect = &inspect[0];
    for c in checks {
        match c {
            Check::Inspect(pointer, want) => {
                let got = inspect.pointer(pointer).cloned().unwrap_or(Value::Null);
                assert_eq!(&got, want, "{what}: {pointer} of {}", inspect["HostConfig"]);
            }
            Check::Exec(line, want) => {
                let out = engine_ok(&["exec", container, "sh", "-c", line]);
                assert!(out.contains(want.as_str()), "{what}: `{line}` printed {out:?}, not {want:?}");
            }
            Check::Logs(Ok(line)) => {
                // The line may need a moment to reach the engine's log and the broker.
                wait_until(&format!("{what}: {line:?} in the service's logs"), WAIT, || {
                    let out = docker_cli::run(d.socket(), &["service", "logs", service]);
                    let text = String::from_utf8_lossy(&out.stdout).to_string();
                    if out.status.success() && text.contains(line) {
                        Ok(())
                    } else {
                        Err(format!("{text}{}", String::from_utf8_lossy(&out.stderr)))
                    }
                });
            }
            Check::Logs(Err(why)) => {
                let out = docker_cli::run(d.socket(), &["service", "logs", service]);
                let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
                assert!(!out.status.success() && text.contains(why), "{what}: {text}");
            }
        }
    }
}
