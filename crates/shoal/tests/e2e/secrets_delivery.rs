//! Secrets and configs reach the tasks that use them, and only those, driven by the stock docker CLI:
//!
//! - process executor: `printf pw | docker secret create db_pw -` and `docker service create --secret db_pw`:
//!   the task reads exactly `pw` from `$SHOAL_SECRETS_DIR/db_pw` (mode 0444, its directory 0700), and the
//!   task's directory on the tmpfs is gone once the service is removed;
//! - docker executor: the container reads `/run/secrets/db_pw` and a config at an absolute target, read-only,
//!   with the mode asked for; the files on the node's tmpfs stay through a daemon restart (the container runs
//!   on, adopted) while those of a task no longer assigned are swept, and go with the container;
//! - 1 manager + 2 workers: a one-replica service constrained to worker A; worker B never holds the secret
//!   (its `/debug/dependencies` view stays empty, nothing under its files root), A holds it while the task
//!   runs and drops it when the service is removed, and a long random secret's bytes are in no file of any
//!   node's state dir;
//! - a config created with `--template-driver golang` holding `{{.Service.Name}}-{{.Task.Slot}}` renders per
//!   task (3 replicas, each sees its own slot).
//!
//! Every daemon is stopped and its task files root removed when a test ends, however it ends (`Node`).

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use serde_json::Value;
use shoal_testkit::docker_engine::{self, EngineDaemon};

const WAIT: Duration = Duration::from_secs(60);

/// A daemon and its node's task files root (`/dev/shm/shoal-<node id>`): dropping it stops the daemon first,
/// then removes the root, so nothing is left on the tmpfs even when the test fails.
struct Node<D: std::ops::DerefMut<Target = DaemonProcess>> {
    daemon: Option<D>,
    files_root: PathBuf,
}

impl<D: std::ops::DerefMut<Target = DaemonProcess>> Node<D> {
    fn new(daemon: D) -> Node<D> {
        let id = node_id(&daemon);
        Node { daemon: Some(daemon), files_root: PathBuf::from(format!("/dev/shm/shoal-{id}")) }
    }
}

impl<D: std::ops::DerefMut<Target = DaemonProcess>> Node<D> {
    fn daemon_mut(&mut self) -> &mut DaemonProcess {
        self.daemon.as_mut().expect("daemon")
    }

    /// Stops the daemon (SIGTERM), keeping the files root for the test to look at.
    fn stop_daemon(&mut self) {
        drop(self.daemon.take());
    }
}

impl<D: std::ops::DerefMut<Target = DaemonProcess>> std::ops::Deref for Node<D> {
    type Target = DaemonProcess;
    fn deref(&self) -> &DaemonProcess {
        self.daemon.as_ref().expect("daemon")
    }
}

impl<D: std::ops::DerefMut<Target = DaemonProcess>> Drop for Node<D> {
    fn drop(&mut self) {
        drop(self.daemon.take());
        let _ = std::fs::remove_dir_all(&self.files_root);
    }
}

/// `DaemonProcess` as a `DerefMut` to itself, so `Node` takes plain daemons and `EngineDaemon`s alike.
struct Plain(DaemonProcess);

impl std::ops::Deref for Plain {
    type Target = DaemonProcess;
    fn deref(&self) -> &DaemonProcess {
        &self.0
    }
}

impl std::ops::DerefMut for Plain {
    fn deref_mut(&mut self) -> &mut DaemonProcess {
        &mut self.0
    }
}

fn node_id(d: &DaemonProcess) -> String {
    let id = d.get("/v1.47/info")["Swarm"]["NodeID"].as_str().unwrap_or_default().to_string();
    assert!(!id.is_empty(), "no Swarm.NodeID in /info");
    id
}

/// `docker secret create NAME -` / `docker config create [FLAGS] NAME -` with `data` on stdin.
fn create_from_stdin(d: &DaemonProcess, args: &[&str], data: &str) {
    let out = docker_cli::run_with_stdin(d.socket(), args, data);
    assert!(out.status.success(), "docker {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Waits until `docker service logs SERVICE` prints `n` lines containing `needle`; returns those lines.
fn wait_logs(d: &DaemonProcess, service: &str, needle: &str, n: usize) -> Vec<String> {
    wait_until(&format!("{n} log lines of {service} with {needle:?}"), WAIT, || {
        let out = docker_cli::run(d.socket(), &["service", "logs", "--raw", service]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let lines: Vec<String> = text.lines().filter(|l| l.contains(needle)).map(str::to_string).collect();
        if lines.len() >= n {
            Ok(lines)
        } else {
            Err(format!("{} such lines; logs: {text:?} {}", lines.len(), String::from_utf8_lossy(&out.stderr)))
        }
    })
}

/// The task directories under a node's files root.
fn task_dirs(root: &Path) -> Vec<String> {
    match std::fs::read_dir(root) {
        Ok(entries) => entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => Vec::new(),
    }
}

fn wait_no_task_dirs(root: &Path) {
    wait_until(&format!("no task files left under {}", root.display()), WAIT, || {
        let left = task_dirs(root);
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    });
}

/// Every regular file under `dir` (recursively) that contains `needle`.
fn files_containing(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() {
                if let Ok(bytes) = std::fs::read(e.path()) {
                    if bytes.windows(needle.len()).any(|w| w == needle) {
                        found.push(e.path());
                    }
                }
            }
        }
    }
    found
}

fn hex(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}

/// The secrets and configs a worker's agent holds, from its `/debug/dependencies`, as names.
fn held_names(worker: &DaemonProcess) -> (Vec<String>, Vec<String>) {
    let v = worker.get("/v1.47/debug/dependencies");
    let names = |k: &str| -> Vec<String> {
        v[k].as_array().expect(k).iter().map(|o| o["Name"].as_str().unwrap_or_default().to_string()).collect()
    };
    (names("Secrets"), names("Configs"))
}

#[test]
fn a_process_task_reads_exactly_its_secret_from_its_directory_on_tmpfs() {
    if no_docker_cli() {
        return;
    }
    let mut d = Node::new(Plain(daemon()));
    create_from_stdin(&d, &["secret", "create", "db_pw", "-"], "pw");
    let script = r#"printf '[%s] %s %s\n' "$(cat "$SHOAL_SECRETS_DIR/db_pw")" "$(stat -c %a "$SHOAL_SECRETS_DIR/db_pw")" "$(stat -c %a "$SHOAL_SECRETS_DIR")"; exec sleep 3171"#;
    docker(
        &d,
        &["service", "create", "--detach", "--name", "reader", "--secret", "db_pw", "busybox", "sh", "-c", script],
    );
    let lines = wait_logs(&d, "reader", "[", 1);
    assert_eq!(lines, ["[pw] 444 700"], "the task read its secret file");
    assert_eq!(task_dirs(&d.files_root).len(), 1, "one task directory on the tmpfs");
    // Another service's task has no directory of its own and no variable pointing at one.
    docker(
        &d,
        &[
            "service",
            "create",
            "--detach",
            "--name",
            "other",
            "busybox",
            "sh",
            "-c",
            r#"echo "other:[${SHOAL_SECRETS_DIR-unset}]"; exec sleep 3172"#,
        ],
    );
    assert_eq!(wait_logs(&d, "other", "other:", 1), ["other:[unset]"]);
    assert_eq!(task_dirs(&d.files_root).len(), 1);

    docker(&d, &["service", "rm", "reader", "other"]);
    wait_no_task_dirs(&d.files_root);
    let out = docker_cli::run(d.socket(), &["secret", "rm", "db_pw"]);
    assert!(out.status.success(), "secret rm once unused: {}", String::from_utf8_lossy(&out.stderr));

    // A daemon stopping with a task still using a secret leaves nothing on the tmpfs.
    create_from_stdin(&d, &["secret", "create", "db_pw2", "-"], "pw2");
    docker(
        &d,
        &["service", "create", "--detach", "--name", "again", "--secret", "db_pw2", "busybox", "sh", "-c", script],
    );
    wait_until("a task directory for the new task", WAIT, || {
        if task_dirs(&d.files_root).len() == 1 {
            Ok(())
        } else {
            Err("none yet".to_string())
        }
    });
    d.stop_daemon();
    assert!(!d.files_root.exists(), "{} outlived the daemon", d.files_root.display());
}

#[test]
fn a_container_reads_its_secret_and_config_mounted_read_only_at_their_targets() {
    let Some(image) = docker_engine::test_image_or_skip() else { return };
    let mut d = Node::new(EngineDaemon::start(&shoal_bin()));
    create_from_stdin(&d, &["secret", "create", "db_pw", "-"], "pw");
    create_from_stdin(&d, &["config", "create", "app", "-"], "x=1");
    let script = r#"printf '[%s] %s [%s] %s ' "$(cat /run/secrets/db_pw)" "$(stat -c %a /run/secrets/db_pw)" "$(cat /etc/app.conf)" "$(stat -c %a /etc/app.conf)"; if echo x > /run/secrets/db_pw 2>/dev/null; then echo writable; else echo read-only; fi; exec sleep 3173"#;
    docker(
        &d,
        &[
            "service",
            "create",
            "--detach",
            "--name",
            "boxed",
            "--secret",
            "db_pw",
            "--config",
            "src=app,target=/etc/app.conf,mode=0440",
            image,
            "sh",
            "-c",
            script,
        ],
    );
    let lines = wait_logs(&d, "boxed", "[", 1);
    assert_eq!(lines, ["[pw] 444 [x=1] 440 read-only"]);
    let dirs = task_dirs(&d.files_root);
    assert_eq!(dirs.len(), 1, "the container's files are on the node's tmpfs: {dirs:?}");
    let task_id = tasks_of(&d, "boxed")[0]["ID"].as_str().unwrap_or_default().to_string();
    assert_eq!(dirs, std::slice::from_ref(&task_id));

    // The container outlives a daemon restart with its files; files of a task not assigned any more are swept.
    assert!(d.daemon_mut().stop(), "the daemon stops cleanly");
    assert_eq!(task_dirs(&d.files_root), std::slice::from_ref(&task_id), "the running container's files stay");
    std::fs::create_dir_all(d.files_root.join("notataskofthiscluster0000/secrets")).unwrap();
    d.daemon_mut().restart(&[]);
    wait_until("the stray task files swept, the container's kept", WAIT, || {
        let dirs = task_dirs(&d.files_root);
        let running = tasks_of(&d, "boxed").iter().filter(|t| state(t) == "running").count();
        if dirs == std::slice::from_ref(&task_id) && running == 1 {
            Ok(())
        } else {
            Err(format!("{dirs:?}, {running} running"))
        }
    });
    docker(&d, &["service", "rm", "boxed"]);
    wait_no_task_dirs(&d.files_root);
}

#[test]
fn only_the_worker_running_the_task_holds_the_secret_and_no_state_dir_has_its_bytes() {
    if no_docker_cli() {
        return;
    }
    use rand::Rng;
    let token: String = rand::rng().sample_iter(rand::distr::Alphanumeric).take(48).map(char::from).collect();
    let m = Node::new(Plain(node_at(1, "manager-1", None)));
    let a = Node::new(Plain(node_at(2, "worker-a", Some((&m, "Worker")))));
    let b = Node::new(Plain(node_at(3, "worker-b", Some((&m, "Worker")))));
    wait_until("both workers ready", WAIT, || {
        let nodes = m.get("/v1.47/nodes");
        let ready = nodes.as_array().unwrap().iter().filter(|n| n["Status"]["State"] == "ready").count();
        if ready == 3 {
            Ok(())
        } else {
            Err(format!("{ready} ready"))
        }
    });
    create_from_stdin(&m, &["secret", "create", "token", "-"], &token);
    // The task shows what it read as hex, so its log (in worker A's state dir) never holds the secret itself.
    let script = r#"echo "read:$(od -An -tx1 "$SHOAL_SECRETS_DIR/token" | tr -d ' \n')"; exec sleep 3174"#;
    docker(
        &m,
        &[
            "service",
            "create",
            "--detach",
            "--name",
            "pinned",
            "--secret",
            "token",
            "--constraint",
            "node.hostname==worker-a",
            "busybox",
            "sh",
            "-c",
            script,
        ],
    );
    let lines = wait_logs(&m, "pinned", "read:", 1);
    assert_eq!(lines, [format!("read:{}", hex(token.as_bytes()))]);
    let tasks: Vec<Value> = tasks_of(&m, "pinned");
    let on_a = node_id(&a);
    assert!(tasks.iter().all(|t| t["NodeID"] == on_a.as_str()), "the task runs on worker A: {tasks:?}");

    assert_eq!(held_names(&a), (vec!["token".to_string()], vec![]), "worker A holds the secret");
    assert_eq!(held_names(&b), (vec![], vec![]), "worker B never received it");
    assert!(task_dirs(&b.files_root).is_empty(), "worker B has no task files");
    assert_eq!(task_dirs(&a.files_root).len(), 1);
    for (name, node) in [("manager", &m), ("worker A", &a), ("worker B", &b)] {
        let found = files_containing(node.state_dir(), token.as_bytes());
        assert!(found.is_empty(), "the secret's bytes are in {name}'s state dir: {found:?}");
    }

    docker(&m, &["service", "rm", "pinned"]);
    wait_until("worker A to drop the secret", WAIT, || {
        let held = held_names(&a);
        if held == (vec![], vec![]) {
            Ok(())
        } else {
            Err(format!("{held:?}"))
        }
    });
    wait_no_task_dirs(&a.files_root);
    assert_eq!(held_names(&b), (vec![], vec![]));
    for (name, node) in [("manager", &m), ("worker A", &a), ("worker B", &b)] {
        let found = files_containing(node.state_dir(), token.as_bytes());
        assert!(found.is_empty(), "the secret's bytes are in {name}'s state dir: {found:?}");
    }
}

#[test]
fn a_golang_templated_config_renders_per_task() {
    if no_docker_cli() {
        return;
    }
    let d = Node::new(Plain(daemon()));
    create_from_stdin(
        &d,
        &["config", "create", "--template-driver", "golang", "tmpl", "-"],
        "{{.Service.Name}}-{{.Task.Slot}}",
    );
    let script = r#"echo "conf:$(cat "$SHOAL_CONFIGS_DIR/app.conf")"; exec sleep 3175"#;
    docker(
        &d,
        &[
            "service",
            "create",
            "--detach",
            "--name",
            "templ",
            "--replicas",
            "3",
            "--config",
            "src=tmpl,target=app.conf",
            "busybox",
            "sh",
            "-c",
            script,
        ],
    );
    let mut lines = wait_logs(&d, "templ", "conf:", 3);
    lines.sort();
    assert_eq!(lines, ["conf:templ-1", "conf:templ-2", "conf:templ-3"]);
    docker(&d, &["service", "rm", "templ"]);
    wait_no_task_dirs(&d.files_root);
}
