//! The newcomer's path (README): a daemon started with the defaults is found by the CLI with no flags; a start
//! that cannot listen names the flag and leaves nothing that changes the next start; one daemon per state dir.

use crate::common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{daemon, no_docker_cli, shoal_bin, DaemonProcess};
use shoal_testkit::{process::wait_exit, wait_until};

/// A `shoal daemon` child that is killed when the test ends, pass or fail.
struct Started(Option<Child>);

impl Drop for Started {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `shoal daemon ARGS` in `dir`, with no Shoal variables from the test's environment.
fn shoal_daemon(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(shoal_bin());
    cmd.current_dir(dir)
        .arg("daemon")
        .args(["--executor", "process"])
        .args(args)
        .env_remove("SHOAL_HOST")
        .env_remove("SHOAL_STATE_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// A start that must fail: its exit code and what it printed.
fn failed_start(mut cmd: Command) -> String {
    let (ok, text) = wait_exit(cmd.spawn().expect("spawn shoal daemon"), Duration::from_secs(20), "shoal daemon");
    assert!(!ok, "the daemon should have refused to start; it printed:\n{text}");
    text
}

/// `shoal info` in `dir` with the given environment; its success and output.
fn info_in(dir: &Path, env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = Command::new(shoal_bin());
    cmd.current_dir(dir).arg("info").env_remove("SHOAL_HOST").env_remove("SHOAL_STATE_DIR");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("shoal info");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
}

#[test]
fn the_cli_finds_a_daemon_started_with_the_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port().to_string();
    let remote = format!("127.0.0.1:{port}");
    let _d = Started(Some(shoal_daemon(dir.path(), &["--listen-remote-api", &remote]).spawn().unwrap()));
    // No -H and no SHOAL_HOST: the CLI looks where the daemon puts its socket by default.
    let text = wait_until("shoal info without -H", Duration::from_secs(30), || match info_in(dir.path(), &[]) {
        (true, text) => Ok(text),
        (false, text) => Err(text),
    });
    assert!(text.contains("Swarm: active"), "{text}");
    assert!(dir.path().join("shoal-state/control.sock").exists());

    // SHOAL_STATE_DIR is read by both sides: a client elsewhere that names the state dir finds the daemon.
    let elsewhere = tempfile::tempdir().unwrap();
    let state = dir.path().join("shoal-state");
    let (ok, text) = info_in(elsewhere.path(), &[("SHOAL_STATE_DIR", state.to_str().unwrap())]);
    assert!(ok, "{text}");
    let (ok, text) = info_in(elsewhere.path(), &[]);
    assert!(!ok && text.contains("cannot connect") && text.contains("SHOAL_HOST"), "{text}");
}

/// The README's daemon as a user starts it, with no `--executor`: beside this machine's Docker Engine it runs
/// the docker executor, and its `/info` merges the engine's, whose empty lists are `null`
/// (`"Authorization": null`). `shoal info` and `shoal version` read it as the docker CLI does (they failed on
/// every host with an engine, "invalid type: null, expected a sequence").
#[test]
fn the_cli_reads_the_info_of_the_default_daemon_beside_a_docker_engine() {
    use shoal_testkit::prerequisites::{skip_unless, Prerequisite};
    if skip_unless(Prerequisite::DockerEngine) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let remote = format!("127.0.0.1:{}", free_port());
    let mut cmd = Command::new(shoal_bin());
    cmd.current_dir(dir.path())
        .args(["daemon", "--listen-remote-api", &remote])
        .env_remove("SHOAL_HOST")
        .env_remove("SHOAL_STATE_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut d = Started(Some(cmd.spawn().unwrap()));
    let text =
        wait_until("shoal info on the default daemon", Duration::from_secs(30), || match info_in(dir.path(), &[]) {
            (true, text) if text.contains("Swarm: active") => Ok(text),
            (_, text) => Err(text),
        });
    assert!(text.contains("Executor: docker"), "the default daemon beside an engine runs docker: {text}");
    let socket = dir.path().join("shoal-state/control.sock");
    let raw = shoal_testkit::http::request(&socket, "GET", "/v1.47/info", None).unwrap();
    assert!(raw.body["Plugins"].is_object(), "the engine's plugins are merged in: {}", raw.body);
    let out = Command::new(shoal_bin()).current_dir(dir.path()).arg("version").env_remove("SHOAL_HOST").output();
    let out = out.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // SIGTERM, the daemon's clean stop: it runs in the host's namespace, where its data plane must not stay.
    let child = d.0.take().unwrap();
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let (stopped, text) = wait_exit(child, Duration::from_secs(30), "shoal daemon");
    assert!(stopped, "a clean stop: {text}");
}

#[test]
fn a_start_on_a_taken_address_names_the_flag_and_leaves_nothing_behind() {
    let first = daemon();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let socket = dir.path().join("control.sock");
    let args = |remote: &str| {
        let mut cmd = shoal_daemon(dir.path(), &["--listen-remote-api", remote]);
        cmd.arg("--state-dir").arg(&state).arg("--listen-control-api").arg(&socket);
        cmd
    };
    let text = failed_start(args(&first.remote_addr()));
    assert!(text.contains("--listen-remote-api") && text.contains(&first.remote_addr()), "{text}");
    assert!(text.to_lowercase().contains("in use"), "{text}");
    let left: Vec<_> = std::fs::read_dir(&state).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, vec![std::ffi::OsString::from("shoal.lock")], "a failed first start left files behind");

    // The next start, on a free address, is an ordinary first start: a new one-node cluster.
    let mut next = DaemonProcess::start_with(
        &shoal_bin(),
        shoal_testkit::DaemonOptions { state_dir: Some(state.clone()), ..Default::default() },
    );
    let swarm = next.get("/v1.47/swarm");
    assert!(swarm["ID"].as_str().is_some_and(|id| !id.is_empty()), "{swarm}");
    assert_ne!(swarm["ID"], first.get("/v1.47/swarm")["ID"]);
    next.stop();
}

#[test]
fn a_second_daemon_on_the_same_state_dir_is_refused() {
    let first = daemon();
    let dir = tempfile::tempdir().unwrap();
    let remote = format!("127.0.0.1:{}", free_port());
    let mut cmd = shoal_daemon(dir.path(), &["--listen-remote-api", &remote]);
    cmd.arg("--state-dir").arg(first.state_dir()).arg("--listen-control-api").arg(dir.path().join("c.sock"));
    let text = failed_start(cmd);
    assert!(text.contains("in use by another shoal daemon") && text.contains(&first.pid().to_string()), "{text}");
    // The first daemon still serves on its own socket.
    assert!(first.get("/v1.47/swarm")["ID"].as_str().is_some_and(|id| !id.is_empty()));
}

#[test]
fn a_setting_the_process_executor_cannot_honour_rejects_the_task_with_the_reason() {
    if no_docker_cli() {
        return;
    }
    let d = daemon();
    let out = shoal_testkit::docker_cli::run(
        d.socket(),
        &["service", "create", "--detach", "--name", "asuser", "--user", "nobody", "busybox", "sleep", "3011"],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The task is REJECTED with the setting named, never run without it.
    let text = wait_until("a rejected task", Duration::from_secs(30), || {
        let out = shoal_testkit::docker_cli::run(d.socket(), &["service", "ps", "--no-trunc", "asuser"]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if text.contains("Rejected") {
            Ok(text)
        } else {
            Err(text)
        }
    });
    assert!(text.contains("ContainerSpec.User") && text.contains("docker executor"), "{text}");
    assert!(shoal_testkit::process::pids_with_cmdline(&["sleep", "3011"]).is_empty(), "the task ran without its user");
}

/// A daemon started as the README's first command starts it (`--state-dir ./shoal-state`, relative), run in a
/// network namespace of its own so that its data plane is its own, and SIGTERMed when the test ends (before
/// the namespace goes: fields drop after `drop`).
struct DefaultNode {
    child: Option<Child>,
    net: shoal_testkit::netns::Net,
}

impl Drop for DefaultNode {
    fn drop(&mut self) {
        // `ip netns exec` execs the daemon: the child's PID is the daemon's. SIGTERM is its clean stop.
        if let Some(c) = self.child.take() {
            let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
            let (stopped, _) = wait_exit(c, Duration::from_secs(30), "shoal daemon");
            assert!(stopped || std::thread::panicking(), "the daemon did not stop cleanly on SIGTERM");
        }
    }
}

/// The README's stack walkthrough, as written: the default daemon (relative state dir, process executor, its
/// data plane on), `docker stack deploy` of examples/stack-app, `curl` of a front task's address from the node,
/// a redeploy with a changed greeting, `docker stack rm`; a clean stop leaves no task namespace. (A relative
/// state dir once failed every task on a network: the task's child resolved its resolv.conf from `/`.)
#[test]
fn the_readme_stack_walkthrough_runs_on_a_daemon_started_with_the_defaults() {
    if no_docker_cli() {
        return;
    }
    let dir = tempfile::tempdir_in(shoal_testkit::scratch_dir()).unwrap();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/stack-app");
    let app = dir.path().join("examples/stack-app");
    std::fs::create_dir_all(&app).unwrap();
    for f in ["compose.yml", "front.py", "api.py", "store.py", "store_token.txt"] {
        std::fs::copy(example.join(f), app.join(f)).unwrap();
    }
    let net = shoal_testkit::netns::Net::new("readme", 1);
    let mut cmd = Command::new("ip");
    cmd.current_dir(dir.path())
        .args(["netns", "exec", net.ns(0)])
        .arg(shoal_bin())
        .args(["daemon", "--state-dir", "./shoal-state", "--executor", "process"])
        .env_remove("SHOAL_HOST")
        .env_remove("SHOAL_STATE_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("daemon.log")).unwrap());
    let node = DefaultNode { child: Some(cmd.spawn().unwrap()), net };
    let socket = dir.path().join("shoal-state/control.sock");
    let docker = |args: &[&str]| -> String {
        let out = shoal_testkit::docker_cli::command(&socket, args).current_dir(dir.path()).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "docker {args:?}: {text}{}", String::from_utf8_lossy(&out.stderr));
        text
    };
    wait_until("the daemon's socket", Duration::from_secs(30), || {
        let out = shoal_testkit::docker_cli::command(&socket, &["info"]).output().unwrap();
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).to_string())
        }
    });
    let compose = "examples/stack-app/compose.yml";
    docker(&["stack", "deploy", "-c", compose, "app"]);
    wait_until("app_front 2/2, app_api 2/2, app_store 1/1", Duration::from_secs(60), || {
        let text = docker(&["stack", "services", "app", "--format", "{{.Name}} {{.Replicas}}"]);
        let mut v: Vec<&str> = text.lines().collect();
        v.sort();
        if v == ["app_api 2/2", "app_front 2/2", "app_store 1/1"] {
            Ok(())
        } else {
            Err(text.clone())
        }
    });
    // The README's `docker inspect` of a front task, then `curl` of its address, from the node.
    let get = |greeting: &str| -> Vec<u32> {
        let task = docker(&["service", "ps", "app_front", "--filter", "desired-state=running", "--format", "{{.ID}}"]);
        let task = task.lines().next().unwrap().to_string();
        let addrs = docker(&["inspect", "--format", "{{range .NetworksAttachments}}{{.Addresses}}{{end}}", &task]);
        let ip = addrs.trim().trim_matches(|c| c == '[' || c == ']').split('/').next().unwrap().to_string();
        // Each request is tried again while it fails: a task RUNNING may not listen yet (the example has no
        // health check), and the front then drops the connection; such a try reaches no store, so the counts
        // of the three answers still follow one another.
        let script = format!(
            "import time, urllib.request\ndef get():\n    for i in range(100):\n        try:\n            return \
             urllib.request.urlopen('http://{ip}/', timeout=5).read().decode()\n        except Exception:\n            \
             time.sleep(0.1)\n    return urllib.request.urlopen('http://{ip}/', timeout=5).read().decode()\nfor i in \
             range(3):\n    print(get())\n"
        );
        let out =
            Command::new("ip").args(["netns", "exec", node.net.ns(0), "python3", "-c", &script]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "GET http://{ip}/: {text}{}", String::from_utf8_lossy(&out.stderr));
        text.lines()
            .map(|l| {
                l.strip_prefix(&format!("front: {greeting} #"))
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("not the app's answer with {greeting}: {text}"))
            })
            .collect()
    };
    let first = get("hello");
    assert_eq!(first.windows(2).filter(|w| w[1] == w[0] + 1).count(), 2, "one more per request: {first:?}");
    // The README's `curl http://<the node's address>:8080/`: the published port, through the routing mesh.
    let url = format!("http://{}:8080/", node.net.ip(0));
    let script = format!("import urllib.request\nprint(urllib.request.urlopen('{url}', timeout=5).read().decode())");
    let out = Command::new("ip").args(["netns", "exec", node.net.ns(0), "python3", "-c", &script]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("front: hello #"), "{url}: {text}{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(app.join("compose.yml")).unwrap();
    std::fs::write(app.join("compose.yml"), text.replace("GREETING: hello", "GREETING: bonjour")).unwrap();
    docker(&["stack", "deploy", "-c", compose, "app"]);
    let then = wait_until("the api answering bonjour", Duration::from_secs(60), || {
        let text = docker(&["service", "inspect", "app_api", "--format", "{{.UpdateStatus.State}}"]);
        if text.trim() == "completed" {
            Ok(get("bonjour"))
        } else {
            Err(text)
        }
    });
    assert!(then[0] > first[2], "the store kept counting: {then:?} after {first:?}");
    // Every task the stack ran, to look for their namespaces (named after them, in /run/netns) at the end.
    let tasks = shoal_testkit::http::request(&socket, "GET", "/v1.47/tasks", None).unwrap().body;
    let ids: Vec<String> = tasks.as_array().unwrap().iter().map(|t| t["ID"].as_str().unwrap().to_string()).collect();
    assert!(ids.len() >= 7, "five tasks, then two api tasks replaced: {ids:?}");
    docker(&["stack", "rm", "app"]);
    wait_until("the stack removed", Duration::from_secs(30), || {
        let text = docker(&["service", "ls", "-q"]);
        if text.trim().is_empty() {
            Ok(())
        } else {
            Err(text)
        }
    });
    // A clean stop leaves none of them.
    drop(node);
    let left: Vec<&String> =
        ids.iter().filter(|id| Path::new("/run/netns").join(format!("shl-task-{id}")).exists()).collect();
    assert!(
        left.is_empty(),
        "task namespaces left after a clean stop: {left:?}; the daemon's log:\n{}",
        std::fs::read_to_string(dir.path().join("daemon.log")).unwrap_or_default()
    );
}

/// `shoal daemon` runs `shoald` from its own folder, as the same process; a `shoal` copied somewhere alone
/// says where the daemon binary should be, and arguments are checked before that (exit 2, nothing run).
#[test]
fn shoal_daemon_runs_shoald_beside_it_and_says_so_when_it_is_missing() {
    let alone = tempfile::Builder::new().prefix("shoal-alone-").tempdir().unwrap();
    let copy = alone.path().join("shoal");
    std::fs::copy(shoal_bin(), &copy).unwrap();
    let run = |args: &[&str]| {
        Command::new(&copy).args(args).current_dir(alone.path()).env_remove("SHOAL_STATE_DIR").output().unwrap()
    };
    let out = run(&["daemon", "--state-dir", "./s"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let expected = alone.path().join("shoald");
    assert!(err.contains(&format!("cannot run the daemon binary {}", expected.display())), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    let out = run(&["daemon", "--no-such-flag"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "a usage error, from shoal itself: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!alone.path().join("s").exists(), "nothing made");

    // Beside its shoald, the daemon is the process `shoal daemon` started (same PID, same command line).
    let dir = tempfile::Builder::new().prefix("shoal-exec-").tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut child = Started(Some(
        shoal_daemon(dir.path(), &["--state-dir", "./s", "--listen-remote-api", &listen]).spawn().unwrap(),
    ));
    let pid = child.0.as_ref().unwrap().id();
    let exe = wait_until("the process runs shoald", Duration::from_secs(10), || {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).map_err(|e| e.to_string())?;
        if exe.file_name().is_some_and(|n| n == "shoald") {
            Ok(exe)
        } else {
            Err(format!("{}", exe.display()))
        }
    });
    assert_eq!(exe, shoal_bin().with_file_name("shoald"));
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let argv0 = cmdline.split(|&b| b == 0).next().unwrap();
    assert_eq!(argv0, shoal_bin().as_os_str().as_encoded_bytes(), "argv[0] kept");
    let socket = dir.path().join("s/control.sock");
    wait_until("the daemon answers", Duration::from_secs(30), || {
        let r = shoal_testkit::http::request(&socket, "GET", "/v1.47/info", None).map_err(|e| e.to_string())?;
        if r.body["Swarm"]["LocalNodeState"] == "active" {
            Ok(())
        } else {
            Err(format!("{}", r.body))
        }
    });
    // SIGTERM to the PID `shoal daemon` had: the daemon's clean stop.
    assert!(Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap().success());
    let (stopped, text) = wait_exit(child.0.take().unwrap(), Duration::from_secs(30), "shoal daemon");
    assert!(stopped, "a clean stop: {text}");
}
