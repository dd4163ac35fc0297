//! What a docker-executor daemon leaves behind when it stops or leaves in the middle of things (issue 30,
//! item 4), and what a second daemon in the same network namespace says about the data plane it cannot take
//! (item 5). Each test runs one `shoal daemon` in a network namespace of its own prepared like a Docker host
//! (`netcluster::Cluster::start_one`), its containers in this machine's Docker Engine.
//!
//! - A stop while removed tasks' containers are in their stop grace: the stop waits for their removal
//!   (bounded) and leaves no task namespace, container or holder of theirs.
//! - A `docker swarm leave --force` while the node's containers are being created: no container of the node
//!   is left (none in state `created`), and the engine creates none after the leave answered.
//! - A second daemon in the namespace of the first (a separate one-node swarm): `docker info` warns that it has
//!   no data plane, naming the first daemon's PID and state dir, and its networked task stays pending with
//!   that reason.

use crate::common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::netcluster::{options, Cluster, PORT};
use common::{docker_cli, shoal_bin, tasks_of, wait_until, DaemonProcess};
use shoal_testkit::docker_engine::{engine_ok, test_image_or_skip};

const WAIT: Duration = Duration::from_secs(90);

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// Now as `docker events --since` reads a fraction of a second (`<seconds>.<nanoseconds>`): a whole second
/// would also take in what happened earlier within that second.
fn unix_now_precise() -> String {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    format!("{}.{:09}", d.as_secs(), d.subsec_nanos())
}

/// The engine's events of `kind` since `since` (unix seconds) for containers labelled `label`: one
/// `<container ID> <signal or ->` line each.
fn events(since: impl ToString, kind: &str, label: &str) -> Vec<String> {
    let (since, until) = (since.to_string(), (unix_now() + 1).to_string());
    let filters = ["--filter", "type=container", "--filter"];
    let event = format!("event={kind}");
    let label = format!("label={label}");
    let mut args = vec!["events", "--since", &since, "--until", &until];
    args.extend(filters);
    args.extend([
        event.as_str(),
        "--filter",
        &label,
        "--format",
        "{{.Actor.ID}} {{index .Actor.Attributes \"signal\"}}",
    ]);
    engine_ok(&args).lines().map(str::to_string).collect()
}

#[test]
fn a_stop_during_a_removals_stop_grace_leaves_no_task_namespace_container_or_holder() {
    let Some(image) = test_image_or_skip() else { return };
    let mut c = Cluster::start_one("sg", "docker");
    c.docker(&["network", "create", "--driver", "overlay", "gnet"]);
    // `sleep` as its container's PID 1 ignores SIGTERM: each stop takes the whole grace.
    let create = ["service", "create", "--detach", "--no-resolve-image", "--name", "slow", "--network", "gnet"];
    let mut args = create.to_vec();
    args.extend(["--replicas", "2", "--stop-grace-period", "6s", image, "sleep", "100000"]);
    c.docker(&args);
    let tasks = c.running("slow", 2);
    assert_eq!(c.task_namespaces().len(), 2, "each task has its namespace: {tasks:?}");
    let containers = c.containers(0);
    assert_eq!(containers.len(), 4, "two containers and two holders: {containers:?}");

    let since = unix_now();
    c.docker(&["service", "rm", "slow"]);
    // Both containers were sent SIGTERM: their stop grace runs.
    wait_until("both containers told to stop", WAIT, || {
        let kills: std::collections::BTreeSet<String> = events(since, "kill", "com.docker.swarm.service.name=slow")
            .into_iter()
            .filter(|l| l.ends_with(" 15"))
            .collect();
        if kills.len() == 2 {
            Ok(())
        } else {
            Err(format!("{kills:?}"))
        }
    });
    let t0 = std::time::Instant::now();
    assert!(c.ds[0].stop(), "a clean stop on SIGTERM:\n{}", c.ds[0].log());
    eprintln!("the stop took {:?}", t0.elapsed());
    assert_eq!(c.task_namespaces(), Vec::<String>::new(), "task namespaces left by the stop:\n{}", c.ds[0].log());
    assert_eq!(c.containers(0), Vec::<String>::new(), "containers or holders left by the stop:\n{}", c.ds[0].log());
}

#[test]
fn a_leave_during_container_creation_leaves_no_container() {
    let Some(image) = test_image_or_skip() else { return };
    let mut c = Cluster::start_one("lc", "docker");
    c.docker(&["network", "create", "--driver", "overlay", "cnet"]);
    let create = ["service", "create", "--detach", "--no-resolve-image", "--name", "many", "--network", "cnet"];
    let mut args = create.to_vec();
    args.extend(["--replicas", "8", image, "sleep", "100000"]);
    c.docker(&args);
    // The first of the node's 16 containers (holders and tasks) exists: the rest are being created.
    let seen = wait_until("the node's first container created", WAIT, || {
        let n = c.containers(0).len();
        if n > 0 {
            Ok(n)
        } else {
            Err("none yet".to_string())
        }
    });
    for t in tasks_of(c.manager(), "many") {
        c.tasks_seen.insert(t["ID"].as_str().unwrap_or_default().to_string());
    }
    c.docker(&["swarm", "leave", "--force"]);
    let answered = unix_now_precise();
    eprintln!("the leave began with {seen} of the node's 16 containers created");
    let left = c.containers(0);
    assert!(left.is_empty(), "containers left by the leave (it began with {seen} of 16): {left:?}\n{}", c.ds[0].log());
    assert_eq!(c.task_namespaces(), Vec::<String>::new(), "task namespaces left by the leave");
    assert_eq!(c.shoal_links(0), Vec::<String>::new(), "the data plane left by the leave");
    assert!(c.ds[0].stop(), "a clean stop after the leave");
    // Nothing was created for the node after the leave answered (a creation it cut short would land later).
    let node = format!("com.docker.swarm.node.id={}", c.node_ids[0]);
    let late = events(answered, "create", &node);
    assert!(late.is_empty(), "containers created after the leave: {late:?}");
    assert_eq!(c.containers(0), Vec::<String>::new());
}

#[test]
fn a_second_daemon_in_the_namespace_says_why_it_has_no_data_plane() {
    if !docker_cli::available() {
        eprintln!("skipped: no docker CLI");
        return;
    }
    let c = Cluster::start_one("sd", "process");
    let first = c.manager();
    let mut opts = options(&c.net, 0, "process", vec![]);
    opts.port = Some(PORT + 1);
    opts.hostname = Some("second".into());
    let mut second = DaemonProcess::start_with(&shoal_bin(), opts);
    let holder = format!("another Shoal daemon (pid {}, state dir {})", first.pid(), first.state_dir().display());
    // (Once the node's agent described itself.)
    let warning = wait_until("docker info names the daemon holding the data plane", WAIT, || {
        let info = docker_cli::run(second.socket(), &["info"]);
        let text = String::from_utf8_lossy(&info.stderr).into_owned() + &String::from_utf8_lossy(&info.stdout);
        match text.lines().find(|l| l.contains("WARNING: no overlay data plane on this node: ")) {
            Some(l) if l.contains(&holder) => Ok(l.to_string()),
            _ => Err(format!("{holder} not in:\n{text}")),
        }
    });
    eprintln!("docker info: {warning}");
    docker_cli::ok(second.socket(), &["network", "create", "--driver", "overlay", "snet"]);
    let args = ["service", "create", "--detach", "--name", "api", "--network", "snet", "busybox", "sleep", "1000"];
    docker_cli::ok(second.socket(), &args);
    let err = wait_until("the task pending with the reason", WAIT, || {
        let t = tasks_of(&second, "api");
        let err = t.first().and_then(|t| t["Status"]["Err"].as_str()).unwrap_or_default().to_string();
        if err.contains("no data plane on node second: ") && err.contains(&holder) {
            Ok(err)
        } else {
            Err(format!("{t:?}"))
        }
    });
    eprintln!("the pending task says: {err}");
    assert!(second.stop(), "the second daemon stops cleanly");
}
