//! Named volumes as compose files declare them (issue 32: any named volume makes the docker CLI send
//! `Mounts[].VolumeOptions`, which five of six published compose files have): `docker stack deploy` of a
//! file whose volume has a driver, driver options (a tmpfs of the engine's `local` driver) and labels, on
//! three docker-executor nodes (each in its own network namespace, so the stack's overlay network has a data
//! plane; all share this machine's Docker Engine). Checked on the engine: `docker volume inspect` shows the
//! driver, its options and the labels (the stack's namespace label included), `docker inspect` of the
//! running container shows the volume mounted at its target, and inside the container the target is the
//! tmpfs the options asked for; the file's templated `hostname: "{{.Node.Hostname}}-{{.Task.Slot}}"` and
//! environment are expanded in the container. A `Subpath` (Engine API 1.45+) is refused task by task naming
//! the engine's version; volume options on a bind mount are a 400 at the API.
//!
//! Needs root, the engine and Debian's static busybox (the test image is built from it, never pulled);
//! without the engine the test says so and passes. The volumes it made are removed when it ends.

use crate::common;

use std::time::Duration;

use common::netcluster::Cluster;
use common::*;
use serde_json::{json, Value};
use shoal_testkit::docker_engine::{self, engine, engine_ok};

const WAIT: Duration = Duration::from_secs(90);
const STACK: &str = "tmplvol";

/// Removes the engine volumes named here when the test ends, however it ends (after the cluster, whose
/// containers hold them: declared first, dropped last).
struct Volumes(Vec<String>);

impl Drop for Volumes {
    fn drop(&mut self) {
        for v in &self.0 {
            let _ = engine(&["volume", "rm", "-f", v]);
        }
    }
}

fn compose(image: &str) -> String {
    format!(
        r#"
version: "3.8"
services:
  db:
    image: {image}
    command: ["sh", "-c", "grep ' /data ' /proc/mounts; echo kept > /data/file; exec sleep 100000"]
    hostname: "{{{{.Node.Hostname}}}}-{{{{.Task.Slot}}}}"
    environment:
      SERVICE: "{{{{.Service.Name}}}}"
    volumes:
      - data:/data
      - cache:/cache:ro
    deploy:
      replicas: 1
      restart_policy: {{condition: none}}
volumes:
  data:
    driver: local
    driver_opts:
      type: tmpfs
      device: tmpfs
      o: size=16m
    labels:
      owner: templates-test
  cache: {{}}
"#
    )
}

#[test]
fn a_stack_with_a_named_volume_with_driver_options_and_labels_deploys_and_runs() {
    let Some(image) = docker_engine::test_image_or_skip() else { return };
    let volumes = Volumes(vec![format!("{STACK}_data"), format!("{STACK}_cache"), "tmplvol-sub".into()]);
    for v in &volumes.0 {
        let _ = engine(&["volume", "rm", "-f", v]);
    }
    let mut c = Cluster::start_docker("tvol");
    let dir = tempfile::tempdir_in(shoal_testkit::scratch_dir()).unwrap();
    let file = dir.path().join("compose.yml");
    std::fs::write(&file, compose(image)).unwrap();
    c.docker(&["stack", "deploy", "-c", file.to_str().unwrap(), STACK]);

    // What the CLI sent is stored and shown back as Docker shows it.
    let service = format!("{STACK}_db");
    let mounts =
        c.docker(&["service", "inspect", &service, "--format", "{{json .Spec.TaskTemplate.ContainerSpec.Mounts}}"]);
    let mounts: Value = serde_json::from_str(mounts.trim()).unwrap();
    let data = mounts.as_array().unwrap().iter().find(|m| m["Target"] == "/data").unwrap_or_else(|| panic!("{mounts}"));
    assert_eq!(data["Source"], format!("{STACK}_data"), "{mounts}");
    assert_eq!(data["VolumeOptions"]["DriverConfig"]["Name"], "local", "{mounts}");
    assert_eq!(data["VolumeOptions"]["DriverConfig"]["Options"]["type"], "tmpfs", "{mounts}");
    assert_eq!(data["VolumeOptions"]["Labels"]["owner"], "templates-test", "{mounts}");

    // The running container, on the engine.
    let t = c.running(&service, 1).remove(0);
    let filter = format!("label=com.docker.swarm.task.id={}", t["ID"].as_str().unwrap());
    let container = engine_ok(&["ps", "-q", "--no-trunc", "--filter", &filter]).trim().to_string();
    assert!(!container.is_empty(), "no running container for {t}");
    let inspect: Value = serde_json::from_str(&engine_ok(&["inspect", &container])).unwrap();
    let engine_mounts = inspect[0]["Mounts"].as_array().cloned().unwrap_or_default();
    let on_data =
        engine_mounts.iter().find(|m| m["Destination"] == "/data").unwrap_or_else(|| panic!("{engine_mounts:?}"));
    assert_eq!(
        (on_data["Type"].as_str(), on_data["Name"].as_str()),
        (Some("volume"), Some(format!("{STACK}_data").as_str()))
    );
    assert_eq!(on_data["Driver"], "local");
    let on_cache =
        engine_mounts.iter().find(|m| m["Destination"] == "/cache").unwrap_or_else(|| panic!("{engine_mounts:?}"));
    assert_eq!(
        (on_cache["Name"].as_str(), on_cache["RW"].as_bool()),
        (Some(format!("{STACK}_cache").as_str()), Some(false))
    );

    // The compose file's templated hostname and environment, expanded for the task (issue 32).
    let node = t["NodeID"].as_str().unwrap();
    let host =
        c.manager().get(&format!("/v1.47/nodes/{node}"))["Description"]["Hostname"].as_str().unwrap().to_string();
    assert_eq!(engine_ok(&["exec", &container, "hostname"]).trim(), format!("{host}-1"));
    let env: Vec<&str> = inspect[0]["Config"]["Env"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(env.contains(&format!("SERVICE={service}").as_str()), "{env:?}");

    let volume: Value = serde_json::from_str(&engine_ok(&["volume", "inspect", &format!("{STACK}_data")])).unwrap();
    let v = &volume[0];
    assert_eq!(v["Driver"], "local", "{v}");
    assert_eq!(v["Options"], json!({"type": "tmpfs", "device": "tmpfs", "o": "size=16m"}), "{v}");
    assert_eq!(v["Labels"]["owner"], "templates-test", "{v}");
    assert_eq!(v["Labels"]["com.docker.stack.namespace"], STACK, "{v}");

    // Inside, /data is the tmpfs of 16 MiB the options asked for, and writable.
    let proc_mounts = engine_ok(&["exec", &container, "cat", "/proc/mounts"]);
    let line = proc_mounts
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("/data"))
        .unwrap_or_else(|| panic!("{proc_mounts}"));
    assert!(line.starts_with("tmpfs /data tmpfs") && line.contains("size=16384k"), "{line}");
    assert_eq!(engine_ok(&["exec", &container, "cat", "/data/file"]).trim(), "kept");

    // A Subpath needs API 1.45: the task is rejected naming the engine's version (this engine speaks 1.41).
    let api = engine_ok(&["version", "--format", "{{.Server.APIVersion}}"]).trim().to_string();
    let minor: u32 = api.split('.').nth(1).and_then(|m| m.parse().ok()).unwrap_or(0);
    if minor < 45 {
        let spec = json!({
            "Name": "subpath",
            "TaskTemplate": {
                "ContainerSpec": {"Image": image, "Command": ["sleep", "100000"], "Mounts": [
                    {"Type": "volume", "Source": "tmplvol-sub", "Target": "/s", "VolumeOptions": {"Subpath": "dir"}}
                ]},
                "RestartPolicy": {"Condition": "none"},
            },
        });
        let r = shoal_testkit::http::request(
            c.manager().socket(),
            "POST",
            "/v1.47/services/create",
            Some(&spec.to_string()),
        )
        .unwrap();
        assert_eq!(r.status, 201, "{}", r.body);
        let err = wait_until("the subpath task rejected", WAIT, || {
            let tasks = tasks_of(c.manager(), "subpath");
            match tasks.iter().find(|t| state(t) == "rejected") {
                Some(t) => Ok(t["Status"]["Err"].as_str().unwrap_or_default().to_string()),
                None => Err(format!("{tasks:?}")),
            }
        });
        assert!(
            err.contains("Mounts[0].VolumeOptions.Subpath needs Docker Engine API 1.45")
                && err.contains(&format!("API {api}")),
            "{err}"
        );
    }

    // Volume options on a bind mount: a 400 naming the field, nothing created.
    let bad = json!({
        "Name": "badvol",
        "TaskTemplate": {"ContainerSpec": {"Image": image, "Mounts": [
            {"Type": "bind", "Source": "/tmp", "Target": "/t", "VolumeOptions": {"NoCopy": true}}
        ]}},
    });
    let r =
        shoal_testkit::http::request(c.manager().socket(), "POST", "/v1.47/services/create", Some(&bad.to_string()))
            .unwrap();
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("VolumeOptions must not be specified on mount type \"bind\""),
        "{}",
        r.body
    );

    c.docker(&["stack", "rm", STACK]);
    drop(c);
    drop(volumes);
}
