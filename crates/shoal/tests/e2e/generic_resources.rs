//! Generic resources driven by the stock docker CLI on a real daemon (process executor): a node offers named
//! GPUs and a count of SSDs with `--generic-node-resources`; `docker service create --generic-resource gpu=1`
//! gets one distinct GPU per task in `DOCKER_RESOURCE_GPU` (read from the task processes' environment), a task
//! that finds no free unit stays pending with the scheduler's reason, and removing a task frees its unit. A
//! process-count limit, which a plain process cannot honour, rejects the task naming the setting.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use shoal_testkit::daemon::DaemonOptions;

const DEADLINE: Duration = Duration::from_secs(60);

/// The value of `name` in the environment of process `pid`.
fn env_of(pid: i32, name: &str) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    raw.split(|&b| b == 0).find_map(|kv| {
        let kv = String::from_utf8_lossy(kv);
        kv.strip_prefix(&format!("{name}=")).map(str::to_string)
    })
}

#[test]
fn tasks_get_distinct_units_of_what_the_node_offers() {
    if no_docker_cli() {
        return;
    }
    let d = DaemonProcess::start_with(
        &shoal_bin(),
        DaemonOptions {
            executor: Some("process".into()),
            extra_args: vec!["--generic-node-resources".into(), "gpu=GPU-a,gpu=GPU-b,ssd=3".into()],
            ..DaemonOptions::default()
        },
    );
    let offer =
        docker(&d, &["node", "inspect", "self", "--format", "{{json .Description.Resources.GenericResources}}"]);
    let offer: serde_json::Value = serde_json::from_str(offer.trim()).expect("JSON");
    assert_eq!(
        offer,
        serde_json::json!([
            {"NamedResourceSpec": {"Kind": "gpu", "Value": "GPU-a"}},
            {"NamedResourceSpec": {"Kind": "gpu", "Value": "GPU-b"}},
            {"DiscreteResourceSpec": {"Kind": "ssd", "Value": 3}}
        ])
    );

    // Three replicas of one GPU each on a node with two: two run with distinct GPUs, one waits.
    let argv = ["sleep", "7171"];
    docker(
        &d,
        &[
            "service",
            "create",
            "--detach",
            "--name",
            "gpus",
            "--replicas",
            "3",
            "--generic-resource",
            "gpu=1",
            "busybox",
            "sleep",
            "7171",
        ],
    );
    let running = wait_running(&d, "gpus", 2, &argv, DEADLINE);
    assert_eq!(running.len(), 2);
    let gpus: BTreeSet<String> =
        process::pids_with_cmdline(&argv).into_iter().filter_map(|pid| env_of(pid, "DOCKER_RESOURCE_GPU")).collect();
    assert_eq!(gpus, ["GPU-a".to_string(), "GPU-b".to_string()].into());
    wait_until("the third task explains why it waits", DEADLINE, || {
        let ps = docker(&d, &["service", "ps", "gpus", "--no-trunc", "--format", "{{.CurrentState}} {{.Error}}"]);
        if ps.lines().any(|l| l.starts_with("Pending") && l.contains("insufficient resources on 1 node")) {
            Ok(())
        } else {
            Err(ps)
        }
    });
    let reservations =
        docker(&d, &["service", "inspect", "gpus", "--format", "{{json .Spec.TaskTemplate.Resources.Reservations}}"]);
    assert_eq!(reservations.trim(), r#"{"GenericResources":[{"DiscreteResourceSpec":{"Kind":"gpu","Value":1}}]}"#);

    // Scaling down to one frees a unit: still one GPU per running task, never shared.
    docker(&d, &["service", "scale", "--detach", "gpus=1"]);
    wait_running(&d, "gpus", 1, &argv, DEADLINE);
    docker(
        &d,
        &["service", "create", "--detach", "--name", "gpu2", "--generic-resource", "gpu=1", "busybox", "sleep", "7272"],
    );
    wait_running(&d, "gpu2", 1, &["sleep", "7272"], DEADLINE);
    let a = env_of(process::pids_with_cmdline(&argv)[0], "DOCKER_RESOURCE_GPU");
    let b = env_of(process::pids_with_cmdline(&["sleep", "7272"])[0], "DOCKER_RESOURCE_GPU");
    assert!(a.is_some() && b.is_some() && a != b, "{a:?} {b:?}");

    // Counted kinds: two units of ssd out of three.
    docker(
        &d,
        &["service", "create", "--detach", "--name", "ssd", "--generic-resource", "ssd=2", "busybox", "sleep", "7373"],
    );
    wait_running(&d, "ssd", 1, &["sleep", "7373"], DEADLINE);
    assert_eq!(env_of(process::pids_with_cmdline(&["sleep", "7373"])[0], "DOCKER_RESOURCE_SSD").as_deref(), Some("2"));

    // A named unit cannot be reserved by name: the CLI gets the control API's 400 and nothing is created.
    let out = docker_cli::run(
        d.socket(),
        &[
            "service",
            "create",
            "--detach",
            "--name",
            "byname",
            "--generic-resource",
            "gpu=GPU-a",
            "busybox",
            "sleep",
            "1",
        ],
    );
    assert!(!out.status.success());
    assert!(!service_names(&d).iter().any(|n| n == "byname"));

    // A process cannot have a process count limit: the task is rejected naming it, never run without it.
    docker(&d, &["service", "create", "--detach", "--name", "pids", "--limit-pids", "10", "busybox", "sleep", "7474"]);
    wait_until("the pids task is rejected naming the setting", DEADLINE, || {
        let ps = docker(&d, &["service", "ps", "pids", "--no-trunc", "--format", "{{.CurrentState}} {{.Error}}"]);
        if ps.lines().any(|l| l.starts_with("Rejected") && l.contains("Resources.Limits.Pids")) {
            Ok(())
        } else {
            Err(ps)
        }
    });
    assert!(process::pids_with_cmdline(&["sleep", "7474"]).is_empty());

    for s in ["gpus", "gpu2", "ssd", "pids"] {
        docker(&d, &["service", "rm", s]);
    }
    wait_until("every task process stopped", DEADLINE, || {
        let left: usize =
            ["7171", "7272", "7373"].iter().map(|n| process::pids_with_cmdline(&["sleep", n]).len()).sum();
        if left == 0 {
            Ok(())
        } else {
            Err(format!("{left} processes"))
        }
    });
}
