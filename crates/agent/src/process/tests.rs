//! ProcessExecutor tests: real processes, bounded waits, nothing left running (controllers kill their
//! process group on drop).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use shoal_api::{task_spec, ContainerSpec, Task, TaskSpec};

use super::*;

fn task(id: &str, command: &[&str], args: &[&str], grace_ms: Option<u64>) -> Task {
    Task {
        id: id.into(),
        spec: Some(
            TaskSpec {
                runtime: Some(task_spec::Runtime::Container(ContainerSpec {
                    image: "busybox".into(),
                    command: command.iter().map(|s| s.to_string()).collect(),
                    args: args.iter().map(|s| s.to_string()).collect(),
                    env: vec!["GREETING=hi".into()],
                    stop_grace_period: grace_ms.map(|ms| shoal_api::duration_to_proto(Duration::from_millis(ms))),
                    ..Default::default()
                })),
                ..Default::default()
            }
            .into(),
        ),
        ..Default::default()
    }
}

async fn started(exec: &ProcessExecutor, t: &Task) -> Box<dyn Controller> {
    let mut c = exec.controller(t, Vec::new()).unwrap();
    c.prepare().await.unwrap();
    let pid = c.start().await.unwrap();
    assert!(pid > 0);
    c
}

#[tokio::test]
async fn a_failing_command_reports_its_exit_code_and_logs_its_output() {
    let dir = tempfile::tempdir().unwrap();
    let exec = ProcessExecutor::new(dir.path(), "h", HashMap::new());
    let t = task("t1", &["sh", "-c"], &["echo $GREETING; exit 3"], None);
    let mut c = started(&exec, &t).await;
    let exit = tokio::time::timeout(Duration::from_secs(10), c.wait()).await.unwrap().unwrap();
    assert_eq!(exit.code, 3);
    let log = std::fs::read_to_string(exec.task_dir("t1").join("stdout.log")).unwrap();
    assert!(log.contains("hi"), "log: {log:?}");
    c.remove().await.unwrap();
    assert!(!exec.task_dir("t1").exists());
}

#[tokio::test]
async fn shutdown_stops_a_sleeping_process_quickly() {
    let dir = tempfile::tempdir().unwrap();
    let exec = ProcessExecutor::new(dir.path(), "h", HashMap::new());
    let mut c = started(&exec, &task("t2", &["sleep"], &["30"], None)).await;
    let t0 = Instant::now();
    c.shutdown().await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(5), "took {:?}", t0.elapsed());
    let exit = c.wait().await.unwrap();
    assert_eq!(exit.code, 128 + libc::SIGTERM);
}

#[tokio::test]
async fn a_process_ignoring_sigterm_is_killed_after_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let exec = ProcessExecutor::new(dir.path(), "h", HashMap::new());
    let t = task("t3", &["sh", "-c"], &["trap '' TERM; echo ready; while :; do sleep 0.05; done"], Some(200));
    let mut c = started(&exec, &t).await;
    // Wait (bounded) until the trap is installed, so SIGTERM really is ignored.
    let log = exec.task_dir("t3").join("stdout.log");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("ready") {
        assert!(Instant::now() < deadline, "the process never became ready");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let t0 = Instant::now();
    c.shutdown().await.unwrap();
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(200) && took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(c.wait().await.unwrap().code, 128 + libc::SIGKILL);
}

#[tokio::test]
async fn no_command_and_a_missing_workdir_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let exec = ProcessExecutor::new(dir.path(), "h", HashMap::new());
    let err = exec.controller(&task("t4", &[], &[], None), Vec::new()).err().unwrap();
    assert_eq!(err.to_string(), "image busybox has no command: the process executor needs a command or args");
    let mut t = task("t5", &["true"], &[], None);
    if let Some(task_spec::Runtime::Container(c)) = t.spec.as_mut().unwrap().runtime.as_mut() {
        c.dir = "/does/not/exist".into();
    }
    let err = exec.controller(&t, Vec::new()).unwrap().prepare().await.unwrap_err();
    assert!(matches!(err, ExecutorError::InvalidSpec(_)), "{err:?}");
}

#[test]
fn describe_reports_platform_resources_and_engine() {
    let dir = tempfile::tempdir().unwrap();
    let labels = HashMap::from([("zone".to_string(), "a".to_string())]);
    let d = ProcessExecutor::new(dir.path(), "host-1", labels).describe();
    assert_eq!(d.hostname, "host-1");
    assert_eq!(d.platform.as_ref().unwrap().os, "linux");
    assert!(!d.platform.as_ref().unwrap().architecture.is_empty());
    let r = d.resources.unwrap();
    assert!(r.nano_cpus >= 1_000_000_000);
    assert!(r.memory_bytes > 0);
    let e = d.engine.unwrap();
    assert_eq!(e.engine_version, "shoal-process");
    assert_eq!(e.labels.get("zone").map(String::as_str), Some("a"));
}

/// Set in the re-executed test binary that plays the daemon in `task_processes_die_with_the_daemon`.
const DAEMON_ROLE_ENV: &str = "SHOAL_TEST_PDEATHSIG_DAEMON";

fn process_gone(pid: i32) -> bool {
    // Gone, or a zombie waiting for whoever adopted it to reap it: either way it no longer runs.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

#[test]
fn task_processes_die_with_the_daemon_even_on_sigkill() {
    if let Some(dir) = std::env::var_os(DAEMON_ROLE_ENV) {
        // The "daemon": start a long task, say its pid, then wait to be killed.
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let exec = ProcessExecutor::new(PathBuf::from(dir), "h", HashMap::new());
            let mut c = exec.controller(&task("orphan", &["sleep"], &["30"], None), Vec::new()).unwrap();
            c.prepare().await.unwrap();
            let pid = c.start().await.unwrap();
            println!("TASKPID {pid}");
            tokio::time::sleep(Duration::from_secs(60)).await;
        });
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "process::tests::task_processes_die_with_the_daemon_even_on_sigkill", "--nocapture"])
        .env(DAEMON_ROLE_ENV, dir.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = daemon.stdout.take().unwrap();
    let pid = std::io::BufRead::lines(std::io::BufReader::new(stdout))
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("TASKPID ").and_then(|p| p.trim().parse::<i32>().ok()))
        .expect("the daemon never reported its task's pid");
    assert!(!process_gone(pid));
    daemon.kill().unwrap(); // SIGKILL: no cleanup code runs in the daemon.
    daemon.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !process_gone(pid) {
        if Instant::now() >= deadline {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
            panic!("task process {pid} outlived its daemon");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn settings_a_process_cannot_have_reject_the_task_naming_each() {
    let dir = tempfile::tempdir().unwrap();
    let exec = ProcessExecutor::new(dir.path(), "h", HashMap::new());
    let check = |edit: &dyn Fn(&mut Task), named: &[&str]| {
        let mut t = task("t", &["sleep"], &["1"], None);
        edit(&mut t);
        match exec.controller(&t, Vec::new()) {
            Ok(_) if named.is_empty() => {}
            Ok(_) => panic!("expected {named:?} to be refused"),
            Err(e) => {
                let msg = e.to_string();
                assert!(!named.is_empty(), "refused a plain task: {msg}");
                for n in named {
                    assert!(msg.contains(n), "{msg:?} does not name {n}");
                }
                assert!(msg.contains("docker executor"), "{msg}");
            }
        }
    };
    fn container(t: &mut Task) -> &mut ContainerSpec {
        match t.spec.as_mut().unwrap().runtime.as_mut().unwrap() {
            task_spec::Runtime::Container(c) => c,
            _ => panic!("not a container"),
        }
    }
    check(&|_| {}, &[]);
    check(&|t| container(t).user = "nobody".into(), &["ContainerSpec.User"]);
    check(
        &|t| {
            container(t).mounts = vec![shoal_api::Mount { target: "/data".into(), ..Default::default() }];
            container(t).healthcheck =
                Some(shoal_api::HealthConfig { test: vec!["CMD".into(), "true".into()], ..Default::default() });
        },
        &["ContainerSpec.Healthcheck"],
    );
    check(
        &|t| {
            t.spec.as_mut().unwrap().resources = Some(shoal_api::ResourceRequirements {
                limits: Some(shoal_api::Resources { memory_bytes: 1 << 20, ..Default::default() }),
                ..Default::default()
            })
        },
        &["Resources.Limits.MemoryBytes"],
    );
    // Reservations are the scheduler's: a process can be placed by them.
    check(
        &|t| {
            t.spec.as_mut().unwrap().resources = Some(shoal_api::ResourceRequirements {
                reservations: Some(shoal_api::Resources { memory_bytes: 1 << 20, ..Default::default() }),
                ..Default::default()
            })
        },
        &[],
    );
}

fn file(kind: crate::dependencies::FileKind, target: &str, data: &str) -> crate::dependencies::TaskFile {
    crate::dependencies::TaskFile {
        kind,
        source: format!("src-{target}"),
        target: target.into(),
        uid: String::new(),
        gid: String::new(),
        mode: 0o444,
        data: crate::dependencies::Sensitive::new(data.as_bytes().to_vec()),
    }
}

#[tokio::test]
async fn a_task_reads_its_secrets_and_configs_from_its_directories_on_tmpfs_until_it_is_removed() {
    use crate::dependencies::FileKind::{Config, Secret};
    let dir = tempfile::tempdir().unwrap();
    let shm = tempfile::Builder::new().prefix("shoal-process-test-").tempdir_in("/dev/shm").unwrap();
    let root = FilesRoot::new(shm.path().join("node"));
    let exec = ProcessExecutor::new(dir.path(), "h", HashMap::new()).with_files_root(root.clone());
    let t = task(
        "t9",
        &["sh", "-c"],
        &["cat $SHOAL_SECRETS_DIR/db_pw; echo; cat $SHOAL_SECRETS_DIR/sub/k; echo; cat $SHOAL_CONFIGS_DIR/app.conf"],
        None,
    );
    let files =
        vec![file(Secret, "db_pw", "pw"), file(Secret, "/run/secrets/sub/k", "key"), file(Config, "app.conf", "x=1")];
    let mut c = exec.controller(&t, files).unwrap();
    c.prepare().await.unwrap();
    c.start().await.unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(10), c.wait()).await.unwrap().unwrap();
    assert_eq!(exit.code, 0);
    let log = std::fs::read_to_string(exec.task_dir("t9").join("stdout.log")).unwrap();
    let lines: Vec<&str> = log.lines().map(|l| l.split_once(' ').map_or(l, |(_, rest)| rest)).collect();
    assert_eq!(lines, ["pw", "key", "x=1"], "log: {log:?}");
    assert!(root.task_dir("t9").is_dir());
    c.remove().await.unwrap();
    assert!(!root.task_dir("t9").exists(), "the task's secrets outlived it");
    assert!(!dir.path().join("tasks/t9").exists());

    // Dropping a controller (the agent stopping) removes the files too.
    let mut c = exec.controller(&t, vec![file(Secret, "db_pw", "pw")]).unwrap();
    c.prepare().await.unwrap();
    assert!(root.task_dir("t9").is_dir());
    drop(c);
    assert!(!root.task_dir("t9").exists());
}

#[test]
fn secrets_a_process_cannot_have_reject_the_task() {
    use crate::dependencies::FileKind::{Config, Secret};
    let dir = tempfile::tempdir().unwrap();
    let t = task("t10", &["true"], &[], None);
    let without_root = ProcessExecutor::new(dir.path(), "h", HashMap::new());
    let err = without_root.controller(&t, vec![file(Secret, "db_pw", "pw")]).err().unwrap();
    assert!(err.to_string().contains("no tmpfs"), "{err}");
    let shm = tempfile::Builder::new().prefix("shoal-process-test-").tempdir_in("/dev/shm").unwrap();
    let exec = ProcessExecutor::new(dir.path(), "h", HashMap::new()).with_files_root(FilesRoot::new(shm.path()));
    let err = exec.controller(&t, vec![file(Config, "/etc/app.conf", "x")]).err().unwrap();
    assert!(err.to_string().contains("cannot put a file at the absolute path /etc/app.conf"), "{err}");
    let disk = tempfile::tempdir().unwrap();
    if crate::task_files::check_in_memory(disk.path()).is_err() {
        let on_disk =
            ProcessExecutor::new(dir.path(), "h", HashMap::new()).with_files_root(FilesRoot::new(disk.path()));
        let err = on_disk.controller(&t, vec![file(Secret, "db_pw", "pw")]).err().unwrap();
        assert!(err.to_string().contains("is not on a tmpfs"), "{err}");
    }
}

#[tokio::test]
async fn a_process_publishes_a_host_port_only_as_itself_and_joins_no_network() {
    use shoal_api::port_config::PublishMode;
    let dir = tempfile::tempdir().unwrap();
    let exec = ProcessExecutor::new(dir.path(), "h", HashMap::new());
    let with_port = |published: u32, mode: PublishMode| {
        let mut t = task("t6", &["true"], &[], None);
        t.endpoint = Some(
            shoal_api::Endpoint {
                ports: vec![shoal_api::PortConfig {
                    target_port: 9000,
                    published_port: published,
                    publish_mode: mode as i32,
                    ..Default::default()
                }],
                ..Default::default()
            }
            .into(),
        );
        t
    };
    assert!(exec.controller(&with_port(9000, PublishMode::Host), Vec::new()).is_ok());
    let err = exec.controller(&with_port(9001, PublishMode::Host), Vec::new()).err().unwrap().to_string();
    assert!(err.contains("cannot map host port 9001 to port 9000"), "{err}");
    let err = exec.controller(&with_port(0, PublishMode::Host), Vec::new()).err().unwrap().to_string();
    assert!(err.contains("cannot map host port 0 to port 9000"), "{err}");
    let err = exec.controller(&with_port(8080, PublishMode::Ingress), Vec::new()).err().unwrap().to_string();
    assert!(err.contains("routing mesh"), "{err}");
    let mut attached = task("t7", &["true"], &[], None);
    attached.networks = vec![shoal_api::NetworkAttachment::default()];
    let err = exec.controller(&attached, Vec::new()).err().unwrap().to_string();
    assert!(err.contains("cannot attach a task to a network"), "{err}");
}

#[tokio::test]
async fn a_process_gets_its_ulimits_oom_score_no_new_privileges_and_dropped_capabilities() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let euid = status.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|l| l.split_whitespace().nth(1));
    if euid != Some("0") {
        eprintln!("skipped: needs root (raising limits and dropping capabilities)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exec = ProcessExecutor::new(dir.path(), "h", HashMap::new());
    let mut t = task(
        "tlim",
        &["sh", "-c"],
        &["ulimit -n; ulimit -Hn; cat /proc/self/oom_score_adj; grep -E '^(CapEff|CapBnd|NoNewPrivs)' \
           /proc/self/status"],
        None,
    );
    let mut spec = TaskSpec::clone(t.spec.as_ref().unwrap());
    if let Some(task_spec::Runtime::Container(c)) = spec.runtime.as_mut() {
        c.ulimits = vec![shoal_api::container_spec::Ulimit { name: "nofile".into(), soft: 321, hard: 654 }];
        c.oom_score_adj = 432;
        c.capability_add = vec!["NET_ADMIN".into()];
        c.capability_drop = vec!["CAP_CHOWN".into(), "net_raw".into()];
        c.privileges = Some(shoal_api::Privileges { no_new_privileges: true, ..Default::default() });
    }
    t.spec = Some(spec.into());
    let mut c = started(&exec, &t).await;
    let exit = tokio::time::timeout(Duration::from_secs(10), c.wait()).await.unwrap().unwrap();
    assert_eq!(exit.code, 0);
    let log = std::fs::read_to_string(exec.task_dir("tlim").join("stdout.log")).unwrap();
    let text: Vec<&str> = log.lines().map(|l| l.split_once(' ').map_or(l, |(_, rest)| rest)).collect();
    let text = text.join("\n");
    assert!(text.contains("321\n654\n432\n"), "{text}");
    assert!(text.contains("NoNewPrivs:\t1"), "{text}");
    let eff = super::privileges::status_mask(&text, "CapEff").unwrap();
    let bnd = super::privileges::status_mask(&text, "CapBnd").unwrap();
    // CHOWN (0) and NET_RAW (13) gone from both, NET_ADMIN (12) kept.
    assert_eq!((eff & 1, eff & (1 << 13), bnd & 1, bnd & (1 << 13)), (0, 0, 0, 0), "{text}");
    assert_ne!(eff & (1 << 12), 0, "{text}");
    c.remove().await.unwrap();

    // What a process cannot have rejects the task, named.
    let mut spec = TaskSpec::clone(t.spec.as_ref().unwrap());
    if let Some(task_spec::Runtime::Container(c)) = spec.runtime.as_mut() {
        c.sysctls = [("net.core.somaxconn".to_string(), "1".to_string())].into();
    }
    t.spec = Some(spec.into());
    let err = exec.controller(&t, Vec::new()).err().expect("rejected").to_string();
    assert!(err.contains("ContainerSpec.Sysctls"), "{err}");
}

/// A bind mount (what a cluster mount becomes) is made for the process only: it reads the source's file at the
/// target, a read-only one cannot write there, and the node's own target stays empty.
#[tokio::test]
async fn a_bind_mount_is_the_process_s_own_and_read_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let exec = ProcessExecutor::new(dir.path(), "h", HashMap::new());
    let (source, target) = (dir.path().join("source"), dir.path().join("target"));
    std::fs::create_dir_all(&source).unwrap();
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(source.join("f"), "from-the-source\n").unwrap();
    let script = format!(
        "cat {t}/f; echo more > {t}/rw; (echo no > {t}/../ro/g) 2>/dev/null && echo wrote || echo read-only",
        t = target.display()
    );
    let mut t = task("tb", &["sh", "-c"], &[&script], None);
    let ro_target = dir.path().join("ro");
    std::fs::create_dir_all(&ro_target).unwrap();
    if let Some(task_spec::Runtime::Container(c)) = t.spec.as_mut().unwrap().runtime.as_mut() {
        let bind = |s: &Path, t: &Path, readonly: bool| shoal_api::Mount {
            r#type: shoal_api::mount::Type::Bind as i32,
            source: s.display().to_string(),
            target: t.display().to_string(),
            readonly,
            ..Default::default()
        };
        c.mounts = vec![bind(&source, &target, false), bind(&source, &ro_target, true)];
    }
    let mut c = started(&exec, &t).await;
    let exit = tokio::time::timeout(Duration::from_secs(10), c.wait()).await.unwrap().unwrap();
    let log = std::fs::read_to_string(exec.task_dir("tb").join("stdout.log")).unwrap();
    assert_eq!(exit.code, 0, "{log}");
    assert!(log.contains("from-the-source") && log.contains("read-only"), "{log}");
    assert_eq!(std::fs::read_to_string(source.join("rw")).unwrap(), "more\n", "written through the mount");
    assert!(!source.join("g").exists());
    assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0, "the node's own target is untouched");
    c.remove().await.unwrap();
}
