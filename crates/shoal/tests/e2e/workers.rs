//! Workers when managers or the network fail, with real daemon processes on 127.0.0.x (process executor,
//! so every task is a real `sleep` process, counted with `pids_with_cmdline`).
//!
//! - Losing the manager it joined through: 3 managers, a worker joined through manager 1 (the leader)
//!   runs a service's tasks; manager 1 is killed with SIGKILL. The worker opens a new session with the new
//!   leader (it knows every manager from its session messages), stays READY as the survivors see it, keeps
//!   its task processes, gets a newly scaled-up task, and, restarted while manager 1 is still gone, comes
//!   back through the other managers (from the list saved in its state dir).
//! - A worker cut off (its daemon stopped with SIGSTOP; its task processes are separate and keep running):
//!   the manager marks it DOWN after the heartbeat time to live and the replicated orchestrator replaces its
//!   task on the other worker; on SIGCONT the worker is READY again and stops its stale task, so the slot
//!   runs once. A guard resumes the daemon whatever happens, before the daemon itself is dropped.
//!
//! Short heartbeat periods (`docker swarm update --dispatcher-heartbeat`) keep the timings small.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn post(d: &DaemonProcess, path: &str, body: &Value) -> Result<Value, String> {
    let r = shoal_testkit::http::request(d.socket(), "POST", path, Some(&body.to_string()))?;
    if (200..300).contains(&r.status) {
        Ok(r.body)
    } else {
        Err(format!("POST {path}: {} {}", r.status, r.body))
    }
}

/// Sets the agents' heartbeat period (what `docker swarm update --dispatcher-heartbeat` sends).
fn set_heartbeat_period(m: &DaemonProcess, period: Duration) {
    let swarm = m.get("/v1.47/swarm");
    let mut spec = swarm["Spec"].clone();
    spec["Dispatcher"]["HeartbeatPeriod"] = u64::try_from(period.as_nanos()).unwrap().into();
    let path = format!("/v1.47/swarm/update?version={}", swarm["Version"]["Index"]);
    post(m, &path, &spec).expect("swarm update");
}

/// Creates a replicated service of `replicas` `argv` processes placed on workers only.
fn create_on_workers(m: &DaemonProcess, name: &str, replicas: u64, argv: &[&str]) -> String {
    let body = serde_json::json!({
        "Name": name,
        "TaskTemplate": {
            "ContainerSpec": {"Image": "busybox", "Args": argv},
            "Placement": {"Constraints": ["node.role==worker"]},
        },
        "Mode": {"Replicated": {"Replicas": replicas}},
    });
    post(m, "/v1.47/services/create", &body).expect("create service")["ID"].as_str().unwrap().to_string()
}

/// Sets the replicas of a service (`docker service scale`), retrying while a leader is being elected.
fn scale(m: &DaemonProcess, id: &str, replicas: u64) {
    wait_until("the scale-up written", Duration::from_secs(20), || {
        let s = m.get(&format!("/v1.47/services/{id}"));
        let mut spec = s["Spec"].clone();
        spec["Mode"]["Replicated"]["Replicas"] = replicas.into();
        post(m, &format!("/v1.47/services/{id}/update?version={}", s["Version"]["Index"]), &spec).map(|_| ())
    });
}

/// The node named `host` as `m` sees it.
fn node_named(m: &DaemonProcess, host: &str) -> Value {
    m.get("/v1.47/nodes")
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["Description"]["Hostname"] == host)
        .cloned()
        .unwrap_or_else(|| panic!("no node {host}"))
}

/// GET `path` from `d`: the JSON body, or the error (a manager answers 503 while no leader is elected).
fn try_get(d: &DaemonProcess, path: &str) -> Result<Value, String> {
    let r = shoal_testkit::http::request(d.socket(), "GET", path, None)?;
    if (200..300).contains(&r.status) {
        Ok(r.body)
    } else {
        Err(format!("GET {path}: {} {}", r.status, r.body))
    }
}

/// "ready", "down", ... of the node named `host` as `m` sees it ("absent" before it registered; the error
/// text while `m` cannot answer).
fn node_state(m: &DaemonProcess, host: &str) -> String {
    let nodes = match try_get(m, "/v1.47/nodes") {
        Ok(n) => n,
        Err(e) => return e,
    };
    match nodes.as_array().unwrap().iter().find(|n| n["Description"]["Hostname"] == host) {
        Some(n) => n["Status"]["State"].as_str().unwrap_or("").to_string(),
        None => "absent".to_string(),
    }
}

/// Tasks of `service` that are running with desired state running.
fn running(m: &DaemonProcess, service: &str) -> Vec<Value> {
    tasks_of(m, service).into_iter().filter(|t| state(t) == "running" && desired(t) == "running").collect()
}

/// How many times the daemon logged that its agent opened a session.
fn sessions_opened(d: &DaemonProcess) -> usize {
    d.log().matches("session with the manager established").count()
}

/// The PIDs of the `argv` processes, sorted.
fn sorted_pids(argv: &[&str]) -> Vec<i32> {
    let mut pids = shoal_testkit::process::pids_with_cmdline(argv);
    pids.sort();
    pids
}

/// True while `pid` is a live (not zombie) process.
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| !rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

/// The parent PID of `pid`.
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
}

/// Sends `signal` (e.g. "STOP") to `pid` with kill(1).
fn signal(pid: i32, signal: &str) {
    let ok = std::process::Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).status().unwrap();
    assert!(ok.success(), "kill -{signal} {pid}");
}

/// Keeps a daemon stopped (SIGSTOP) and resumes it (SIGCONT) when dropped, so a failing test leaves no
/// stopped process behind (the daemon's own guard then stops it and its tasks).
struct Stopped(i32);

impl Stopped {
    fn stop(pid: i32) -> Stopped {
        signal(pid, "STOP");
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill").arg("-CONT").arg(self.0.to_string()).status();
    }
}

#[test]
fn a_worker_survives_losing_the_manager_it_joined_through() {
    let argv = ["sleep", "4271"];
    let m1 = node_at(81, "manager-81", None);
    let m2 = node_at(82, "manager-82", Some((&m1, "Manager")));
    let m3 = node_at(83, "manager-83", Some((&m1, "Manager")));
    // DOWN after 6 s without a heartbeat (12 s after a new leader is elected): tighter than the default 15 s.
    set_heartbeat_period(&m1, Duration::from_secs(2));
    let mut w = node_at(84, "worker-84", Some((&m1, "Worker")));
    let mut ms = [m1, m2, m3];
    let m1 = &ms[0];
    wait_until("the worker ready", Duration::from_secs(30), || match node_state(m1, "worker-84").as_str() {
        "ready" => Ok(()),
        other => Err(other.to_string()),
    });
    let service = create_on_workers(m1, "on-the-worker", 2, &argv);
    let ids = |tasks: &[Value]| -> Vec<String> {
        let mut v: Vec<String> = tasks.iter().map(|t| t["ID"].as_str().unwrap_or("").to_string()).collect();
        v.sort();
        v
    };
    let task_ids = ids(&wait_running(m1, "on-the-worker", 2, &argv, Duration::from_secs(30)));
    let pids = sorted_pids(&argv);
    assert!(pids.iter().all(|p| parent_of(*p) == Some(w.pid())), "the worker runs both tasks: {pids:?}");
    // The worker learned every manager and saved the list.
    let saved = w.state_dir().join("managers.json");
    wait_until("the worker's saved manager list", Duration::from_secs(20), || {
        let text = std::fs::read_to_string(&saved).map_err(|e| e.to_string())?;
        let all = ms.iter().all(|m| text.contains(&m.remote_addr()));
        if all {
            Ok(())
        } else {
            Err(text)
        }
    });

    // kill -9 manager 1, the leader and the manager the worker joined through.
    let before = sessions_opened(&w);
    ms[0].kill9();
    let killed = Instant::now();
    let (m2, m3) = (&ms[1], &ms[2]);
    wait_until("the worker's new session", Duration::from_secs(30), || {
        // Meanwhile the survivors never see the worker down.
        for m in [m2, m3] {
            let s = node_state(m, "worker-84");
            assert_ne!(s, "down", "a survivor marked the worker down");
        }
        if sessions_opened(&w) > before {
            Ok(())
        } else {
            Err("no new session yet".into())
        }
    });
    let new_session = killed.elapsed();
    println!("MEASURE worker's new session {new_session:?} after kill -9 of manager 1 (the leader)");
    assert!(new_session < Duration::from_secs(15), "{new_session:?}");
    // Its tasks kept running (the same tasks, the same processes), and it is ready on both survivors.
    assert_eq!(sorted_pids(&argv), pids, "the task processes are the same");
    for m in [m2, m3] {
        wait_until("the same tasks running on a survivor", Duration::from_secs(10), || {
            let filters = urlencode(r#"{"service":{"on-the-worker":true}}"#);
            let tasks = try_get(m, &format!("/v1.47/tasks?filters={filters}"))?;
            let run: Vec<Value> = tasks
                .as_array()
                .unwrap()
                .iter()
                .filter(|t| state(t) == "running" && desired(t) == "running")
                .cloned()
                .collect();
            if ids(&run) == task_ids {
                Ok(())
            } else {
                Err(format!("{:?}", ids(&run)))
            }
        });
        wait_until("the worker ready on a survivor", Duration::from_secs(10), || {
            match node_state(m, "worker-84").as_str() {
                "ready" => Ok(()),
                other => Err(other.to_string()),
            }
        });
    }

    // A scaled-up task reaches it through the new leader.
    scale(m2, &service, 3);
    wait_running(m2, "on-the-worker", 3, &argv, Duration::from_secs(30));
    let pids = shoal_testkit::process::pids_with_cmdline(&argv);
    assert!(pids.iter().all(|p| parent_of(*p) == Some(w.pid())), "{pids:?}");
    assert_eq!(running(m2, "on-the-worker").len(), 3);

    // Restarted while manager 1 is still gone, without --join-addr: it comes back through the others.
    assert!(w.stop(), "the worker stops cleanly");
    let restarted = Instant::now();
    w.restart(&[]);
    wait_until("the restarted worker's session", Duration::from_secs(30), || {
        if sessions_opened(&w) > before + 1 {
            Ok(())
        } else {
            Err(format!("{} sessions", sessions_opened(&w)))
        }
    });
    println!("MEASURE restarted worker's session {:?} after its restart (manager 1 gone)", restarted.elapsed());
    wait_running(m2, "on-the-worker", 3, &argv, Duration::from_secs(45));
    let pids = shoal_testkit::process::pids_with_cmdline(&argv);
    assert!(pids.iter().all(|p| parent_of(*p) == Some(w.pid())), "{pids:?}");
    assert_eq!(node_state(m3, "worker-84"), "ready");
}

#[test]
fn a_cut_off_worker_is_replaced_and_stops_its_stale_task_when_it_returns() {
    let argv = ["sleep", "4281"];
    let m = node_at(91, "manager-91", None);
    // A node is DOWN after 3 periods without a heartbeat: 3 s (1 s is the shortest period accepted).
    set_heartbeat_period(&m, Duration::from_secs(1));
    let a = node_at(92, "worker-92", Some((&m, "Worker")));
    let b = node_at(93, "worker-93", Some((&m, "Worker")));
    wait_until("two ready workers", Duration::from_secs(30), || {
        let states = (node_state(&m, "worker-92"), node_state(&m, "worker-93"));
        if states.0 == "ready" && states.1 == "ready" {
            Ok(())
        } else {
            Err(format!("{states:?}"))
        }
    });
    let a_id = node_named(&m, "worker-92")["ID"].as_str().unwrap().to_string();
    let b_id = node_named(&m, "worker-93")["ID"].as_str().unwrap().to_string();
    create_on_workers(&m, "cut-off", 2, &argv);
    let tasks = wait_running(&m, "cut-off", 2, &argv, Duration::from_secs(30));
    let on_a: Vec<&Value> = tasks.iter().filter(|t| t["NodeID"] == a_id.as_str()).collect();
    assert_eq!(on_a.len(), 1, "one task per worker: {tasks:?}");
    let (stale_task, stale_slot) = (on_a[0]["ID"].as_str().unwrap().to_string(), on_a[0]["Slot"].clone());
    let stale_pid = shoal_testkit::process::pids_with_cmdline(&argv)
        .into_iter()
        .find(|p| parent_of(*p) == Some(a.pid()))
        .expect("worker A's task process");

    // Cut worker A off: its daemon stops, its task process does not.
    let stopped = Stopped::stop(a.pid());
    let cut = Instant::now();
    wait_until("worker A down", Duration::from_secs(20), || match node_state(&m, "worker-92").as_str() {
        "down" => Ok(()),
        other => Err(other.to_string()),
    });
    let to_down = cut.elapsed();
    wait_until("the slot's replacement running on worker B", Duration::from_secs(30), || {
        let run = running(&m, "cut-off");
        let on_b = run.iter().filter(|t| t["NodeID"] == b_id.as_str()).count();
        let pids = shoal_testkit::process::pids_with_cmdline(&argv);
        if run.len() == 2 && on_b == 2 && pids.len() == 3 {
            Ok(())
        } else {
            Err(format!("{} running ({on_b} on B), {} processes", run.len(), pids.len()))
        }
    });
    let to_replaced = cut.elapsed();
    println!("MEASURE worker A down {to_down:?} after SIGSTOP; its slot's replacement running on B {to_replaced:?}");
    // 1.5 s time to live, plus the dispatcher's expiry tick and the write.
    assert!(to_down < Duration::from_secs(6), "{to_down:?}");
    assert!(alive(stale_pid), "the cut-off worker's task process keeps running");
    let stale = m.get(&format!("/v1.47/tasks/{stale_task}"));
    assert_eq!(desired(&stale), "shutdown", "the stale task is told to shut down: {stale}");

    // Back: A is ready again and stops the stale task; the slot runs once.
    drop(stopped);
    let back = Instant::now();
    wait_until("worker A ready again", Duration::from_secs(20), || match node_state(&m, "worker-92").as_str() {
        "ready" => Ok(()),
        other => Err(other.to_string()),
    });
    let to_ready = back.elapsed();
    wait_until("the stale task process to exit", Duration::from_secs(20), || {
        if alive(stale_pid) {
            Err(format!("pid {stale_pid} alive"))
        } else {
            Ok(())
        }
    });
    let to_stopped = back.elapsed();
    println!("MEASURE after SIGCONT: worker A ready {to_ready:?}, its stale task process gone {to_stopped:?}");
    assert!(to_stopped < Duration::from_secs(10), "{to_stopped:?}");
    wait_until("the stale task reported shut down", Duration::from_secs(20), || {
        let t = m.get(&format!("/v1.47/tasks/{stale_task}"));
        if state(&t) == "shutdown" {
            Ok(())
        } else {
            Err(format!("{}", t["Status"]))
        }
    });
    let run = running(&m, "cut-off");
    assert_eq!(run.len(), 2, "{run:?}");
    let in_slot = run.iter().filter(|t| t["Slot"] == stale_slot).count();
    assert_eq!(in_slot, 1, "the slot runs once: {run:?}");
    let pids = shoal_testkit::process::pids_with_cmdline(&argv);
    assert_eq!(pids.len(), 2, "{pids:?}");
    assert!(pids.iter().all(|p| parent_of(*p) == Some(b.pid())), "both on worker B: {pids:?}");
}
