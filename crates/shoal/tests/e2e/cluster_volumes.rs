//! Cluster volumes (issue 37, docs/design/cluster-volumes.md), as a user drives them against a `shoal daemon`.
//! Layers 1 and 2 speak the Engine API's `/volumes` with `curl` on the control socket (every bound and
//! malformed body is checked byte for byte that way) and use the stock docker CLI for `docker volume
//! ls/inspect/rm/create` of a local volume: the volume is created, listed (beside the engine's local volumes on
//! a docker-executor node), inspected by name and ID, its availability updated (any other change refused with a
//! 400 naming the field), its removal refused while a service mounts it with `type=cluster` (naming the
//! service), and it survives a daemon restart (Raft log and snapshot). Every bound and every malformed request
//! is a 400 with a JSON `message`, and nothing is written.
//!
//! Without `--csi-plugin` no plugin is called: the volume is only stored. With it, the suite's plugin creates
//! and deletes volumes and publishes them to the nodes of the tasks that mount them, whose containers write
//! into them. The last test is the issue's acceptance with the docker CLI of Docker 23 or later (its
//! cluster-volume flags, `--mount type=cluster`) on two nodes.

use crate::common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use shoal_testkit::prerequisites::{self, Prerequisite};
use shoal_testkit::DaemonOptions;

const WAIT: Duration = Duration::from_secs(30);

/// `curl` on the control socket: status and JSON body (`Value::Null` for an empty one).
fn curl(d: &DaemonProcess, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "30", "--unix-socket"])
        .arg(d.socket())
        .args(["-X", method, "-w", "\n%{http_code}"])
        .arg(format!("http://localhost/v1.47{path}"));
    if let Some(b) = body {
        cmd.args(["-H", "Content-Type: application/json", "--data-binary", b]);
    }
    let out = cmd.stdin(Stdio::null()).output().expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "curl {method} {path}: {}{text}", String::from_utf8_lossy(&out.stderr));
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    let status: u16 = status.trim().parse().unwrap_or_else(|_| panic!("no status from curl: {text}"));
    let body = if body.trim().is_empty() { Value::Null } else { serde_json::from_str(body).unwrap_or(json!(body)) };
    (status, body)
}

fn create_body(name: &str) -> Value {
    json!({
        "Name": name,
        "Driver": "csi.example.com",
        "DriverOpts": {"size": "1G"},
        "Labels": {"tier": "gold"},
        "ClusterVolumeSpec": {
            "Group": "db",
            "AccessMode": {"Scope": "single", "Sharing": "onewriter", "MountVolume": {}},
            "AccessibilityRequirements": {"Requisite": [{"Segments": {"zone": "z1"}}]},
            "CapacityRange": {"RequiredBytes": 1073741824, "LimitBytes": 0},
            "Availability": "active"
        }
    })
}

/// The cluster volumes listed (name, ID, version, availability), sorted by name.
fn cluster_volumes(d: &DaemonProcess) -> Vec<(String, String, u64, String)> {
    let (status, list) = curl(d, "GET", "/volumes", None);
    assert_eq!(status, 200, "{list}");
    let mut out: Vec<_> = list["Volumes"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|v| !v["ClusterVolume"].is_null())
        .map(|v| {
            let c = &v["ClusterVolume"];
            (
                v["Name"].as_str().unwrap_or("").to_string(),
                c["ID"].as_str().unwrap_or("").to_string(),
                c["Version"]["Index"].as_u64().unwrap_or(0),
                c["Spec"]["Availability"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

fn inspect(d: &DaemonProcess, name: &str) -> Value {
    let (status, v) = curl(d, "GET", &format!("/volumes/{name}"), None);
    assert_eq!(status, 200, "GET /volumes/{name}: {v}");
    v
}

fn refused(d: &DaemonProcess, method: &str, path: &str, body: &str, status: u16, fragment: &str) {
    let (got, answer) = curl(d, method, path, Some(body));
    let message = answer["message"].as_str().unwrap_or_else(|| panic!("no JSON message in {answer}"));
    assert_eq!(got, status, "{method} {path}: {answer}");
    assert!(message.contains(fragment), "{method} {path}: {message:?} should contain {fragment:?}");
}

#[test]
fn a_cluster_volume_is_created_bounded_updated_held_by_its_service_and_kept_across_a_restart() {
    // A snapshot every 5 entries: the restart below restores the volume from a snapshot and the log after it.
    let snapshots = vec!["--raft-snapshot-interval-entries".to_string(), "5".to_string()];
    let mut d =
        DaemonProcess::start_with(&shoal_bin(), DaemonOptions { extra_args: snapshots.clone(), ..Default::default() });
    let (status, created) = curl(&d, "POST", "/volumes/create", Some(&create_body("data").to_string()));
    assert_eq!(status, 201, "{created}");
    assert_eq!((created["Name"].as_str(), created["Scope"].as_str()), (Some("data"), Some("global")));
    assert_eq!(created["Driver"], "csi.example.com");
    assert_eq!(created["Options"], json!({"size": "1G"}));
    assert_eq!(created["Labels"], json!({"tier": "gold"}));
    let id = created["ClusterVolume"]["ID"].as_str().unwrap().to_string();
    assert_eq!(id.len(), 25);
    assert_eq!(created["ClusterVolume"]["Spec"], create_body("data")["ClusterVolumeSpec"], "the spec as given");
    assert!(created["ClusterVolume"]["Info"].is_null(), "no plugin was called: {created}");

    // Bad input and the bounds: a 400 naming what is wrong, and nothing written.
    let before = cluster_volumes(&d);
    let with = |edit: &dyn Fn(&mut Value)| {
        let mut b = create_body("bad");
        edit(&mut b);
        b.to_string()
    };
    fn spec(b: &mut Value) -> &mut Value {
        &mut b["ClusterVolumeSpec"]
    }
    let cases: Vec<(String, u16, &str)> = vec![
        (with(&|b| b["Driver"] = json!("")), 400, "Driver: a cluster volume needs the name of the CSI plugin"),
        (with(&|b| spec(b)["AccessMode"] = json!({"Scope": "single"})), 400, "either MountVolume or BlockVolume"),
        (with(&|b| spec(b)["AccessMode"]["Sharing"] = json!("some")), 400, "AccessMode.Sharing"),
        (with(&|b| spec(b)["Availability"] = json!("sometimes")), 400, "Availability"),
        (with(&|b| b["Name"] = json!("a/b")), 400, "invalid volume name"),
        (with(&|b| b["Name"] = json!("x".repeat(65))), 400, "invalid volume name"),
        (with(&|b| b["DriverOpts"] = json!({"o": "x".repeat(70 * 1024)})), 400, "DriverOpts: the driver options are"),
        (with(&|b| b["Labels"] = json!({"l": "x".repeat(70 * 1024)})), 400, "Labels: the volume's labels are"),
        (
            with(&|b| {
                let zones: Vec<Value> = (0..65).map(|i| json!({"Segments": {"zone": format!("z{i}")}})).collect();
                spec(b)["AccessibilityRequirements"] = json!({ "Requisite": zones });
            }),
            400,
            "AccessibilityRequirements.Requisite: 65 topologies, over the limit of 64",
        ),
        (
            with(&|b| {
                let secrets: Vec<Value> = (0..65).map(|i| json!({"Key": format!("k{i}"), "Secret": "s"})).collect();
                spec(b)["Secrets"] = json!(secrets);
            }),
            400,
            "over the limit of 64 per volume",
        ),
        (
            with(&|b| spec(b)["Secrets"] = json!([{"Key": "password", "Secret": "missing"}])),
            400,
            "secret not found: missing",
        ),
        (
            with(&|b| spec(b)["CapacityRange"] = json!({"RequiredBytes": 10, "LimitBytes": 5})),
            400,
            "LimitBytes (5) is less than RequiredBytes (10)",
        ),
        ("{\"Name\": ".to_string(), 400, "invalid JSON"),
        (create_body("DATA").to_string(), 409, "volume DATA already exists"),
    ];
    for (body, status, fragment) in &cases {
        refused(&d, "POST", "/volumes/create", body, *status, fragment);
    }
    assert_eq!(cluster_volumes(&d), before, "a refused create writes nothing");

    // Lookups by exact name or ID; filters; a name the swarm does not have is the engine's (none here).
    assert_eq!(inspect(&d, "data")["ClusterVolume"]["ID"], id.as_str());
    assert_eq!(inspect(&d, &id)["Name"], "data");
    let (status, missing) = curl(&d, "GET", "/volumes/nope", None);
    assert_eq!(status, 404, "{missing}");
    let (status, listed) =
        curl(&d, "GET", &format!("/volumes?filters={}", urlencode(r#"{"driver":{"other":true}}"#)), None);
    assert_eq!((status, listed["Volumes"].as_array().map(Vec::len)), (200, Some(0)), "{listed}");
    let (_, listed) = curl(&d, "GET", &format!("/volumes?filters={}", urlencode(r#"{"label":["tier=gold"]}"#)), None);
    assert_eq!(listed["Volumes"][0]["Name"], "data", "{listed}");
    // A local volume needs the node's engine; this node runs processes.
    let (status, local) = curl(&d, "POST", "/volumes/create", Some(r#"{"Name": "local1"}"#));
    assert_eq!(status, 501, "{local}");
    assert!(local["message"].as_str().unwrap().contains("needs a container engine"), "{local}");

    // Update: what `docker volume update --availability drain` sends (the inspected spec, availability
    // changed) is taken; any other change is refused naming the field; the version is compare-and-swap.
    let v = inspect(&d, "data");
    let version = v["ClusterVolume"]["Version"]["Index"].as_u64().unwrap();
    let mut drained = v["ClusterVolume"]["Spec"].clone();
    drained["Availability"] = json!("drain");
    let put = |version: u64, spec: &Value| {
        curl(&d, "PUT", &format!("/volumes/data?version={version}"), Some(&json!({ "Spec": spec }).to_string()))
    };
    let (status, answer) = put(version, &drained);
    assert_eq!(status, 200, "{answer}");
    let after = inspect(&d, "data");
    assert_eq!(after["ClusterVolume"]["Spec"]["Availability"], "drain");
    let version = after["ClusterVolume"]["Version"]["Index"].as_u64().unwrap();
    let mut regrouped = drained.clone();
    regrouped["Group"] = json!("elsewhere");
    let path = format!("/volumes/data?version={version}");
    refused(&d, "PUT", &path, &json!({ "Spec": regrouped }).to_string(), 400, "Group: a cluster volume's Group cannot");
    let mut bigger = drained.clone();
    bigger["CapacityRange"]["RequiredBytes"] = json!(2147483648u64);
    refused(&d, "PUT", &path, &json!({ "Spec": bigger }).to_string(), 400, "CapacityRange: a cluster volume's");
    refused(
        &d,
        "PUT",
        "/volumes/data?version=1",
        &json!({ "Spec": drained }).to_string(),
        409,
        "update out of sequence",
    );
    refused(&d, "PUT", "/volumes/data", &json!({ "Spec": drained }).to_string(), 400, "version query parameter");
    refused(&d, "PUT", &path, r#"{"Spec": {"Availability": "off"}}"#, 400, "Availability");
    assert_eq!(cluster_volumes(&d), vec![("data".to_string(), id.clone(), version, "drain".to_string())]);
    let (status, answer) = put(version, &json!({"Availability": "pause"}));
    assert_eq!(status, 200, "a field left out stays as it is: {answer}");

    // A service mounting it (type=cluster) holds it; with no plugin to create
    // the volume, its task stays pending, saying why.
    let service = json!({
        "Name": "db",
        "TaskTemplate": {"ContainerSpec": {
            "Image": "busybox", "Command": ["sleep", "1000"],
            "Mounts": [{"Type": "cluster", "Source": "data", "Target": "/data"}]
        }}
    });
    let (status, svc) = curl(&d, "POST", "/services/create", Some(&service.to_string()));
    assert_eq!(status, 201, "{svc}");
    let svc_id = svc["ID"].as_str().unwrap().to_string();
    let (_, mounted) = curl(&d, "GET", &format!("/services/{svc_id}"), None);
    assert_eq!(mounted["Spec"]["TaskTemplate"]["ContainerSpec"]["Mounts"][0]["Type"], "cluster");
    wait_until("the task mounting the cluster volume to wait with its reason", WAIT, || {
        let errs: Vec<String> =
            tasks_of(&d, "db").iter().filter_map(|t| t["Status"]["Err"].as_str().map(str::to_string)).collect();
        let why = "no suitable node (no created cluster volume named \"data\" on 1 node)";
        errs.iter().find(|e| e.as_str() == why).cloned().ok_or_else(|| format!("{errs:?}"))
    });
    refused(&d, "DELETE", "/volumes/data", "", 400, "volume 'data' is in use by the following service: db");
    refused(&d, "DELETE", "/volumes/data?force=1", "", 400, "in use by the following service: db");

    // A restart keeps it, from the snapshot and the log.
    let kept = cluster_volumes(&d);
    assert_eq!(kept[0].3, "pause");
    assert!(d.stop(), "the daemon stops cleanly");
    let snapshots_taken = std::fs::read_dir(d.state_dir().join("raft").join("snapshots")).map(|r| r.count());
    assert!(snapshots_taken.unwrap_or(0) > 0, "a snapshot was taken after the volume was written");
    d.restart(&snapshots);
    assert_eq!(cluster_volumes(&d), kept);
    assert_eq!(inspect(&d, &id)["ClusterVolume"]["Spec"], {
        let mut s = create_body("data")["ClusterVolumeSpec"].clone();
        s["Availability"] = json!("pause");
        s
    });

    // Once the service is gone, the volume goes.
    let (status, _) = curl(&d, "DELETE", &format!("/services/{svc_id}"), None);
    assert_eq!(status, 200);
    let (status, answer) = curl(&d, "DELETE", "/volumes/data", None);
    assert_eq!(status, 204, "{answer}");
    assert_eq!(curl(&d, "GET", "/volumes/data", None).0, 404);
    assert!(cluster_volumes(&d).is_empty());
}

/// Removes an engine volume when the test ends, however it ends.
struct EngineVolume(String);

impl Drop for EngineVolume {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["volume", "rm", "-f", &self.0]).env_remove("DOCKER_HOST").output();
    }
}

#[test]
fn cluster_volumes_are_listed_beside_the_engine_s_local_volumes() {
    if prerequisites::skip_unless(Prerequisite::DockerEngine) {
        return;
    }
    let d = shoal_testkit::docker_engine::EngineDaemon::start(&shoal_bin());
    let local = EngineVolume(format!("shoal-test-local-{}", std::process::id()));
    let cluster = format!("shoal-test-cv-{}", std::process::id());
    // A local volume through Shoal's socket is the engine's (relayed), as dockerd's socket would make it.
    docker_cli::ok(d.socket(), &["volume", "create", &local.0]);
    let (status, created) = curl(&d, "POST", "/volumes/create", Some(&create_body(&cluster).to_string()));
    assert_eq!(status, 201, "{created}");

    let ls = docker_cli::ok(d.socket(), &["volume", "ls", "--format", "{{.Name}} {{.Driver}} {{.Scope}}"]);
    let lines: Vec<&str> = ls.lines().collect();
    assert!(lines.contains(&format!("{} local local", local.0).as_str()), "{ls}");
    assert!(lines.contains(&format!("{cluster} csi.example.com global").as_str()), "{ls}");
    assert_eq!(cluster_volumes(&d).iter().map(|v| v.0.as_str()).collect::<Vec<_>>(), [cluster.as_str()]);

    // Inspect finds each where it lives.
    let scope = |name: &str| docker_cli::ok(d.socket(), &["volume", "inspect", "--format", "{{.Scope}}", name]);
    assert_eq!(scope(&local.0).trim(), "local");
    assert_eq!(scope(&cluster).trim(), "global");
    assert_eq!(inspect(&d, &cluster)["ClusterVolume"]["Spec"]["AccessMode"]["Sharing"], "onewriter");

    // `docker volume rm` removes each from where it lives.
    docker_cli::ok(d.socket(), &["volume", "rm", &cluster]);
    assert!(cluster_volumes(&d).is_empty());
    let ls = docker_cli::ok(d.socket(), &["volume", "ls", "--format", "{{.Name}}"]);
    assert!(ls.lines().any(|l| l == local.0) && !ls.lines().any(|l| l == cluster), "{ls}");
    docker_cli::ok(d.socket(), &["volume", "rm", &local.0]);
    let gone = docker_cli::run(d.socket(), &["volume", "inspect", &local.0]);
    assert!(!gone.status.success());
}

/// The cluster volume `name` as inspected, or `None` once it is gone (a 404).
fn inspect_if_any(d: &DaemonProcess, name: &str) -> Option<Value> {
    match curl(d, "GET", &format!("/volumes/{name}"), None) {
        (200, v) => Some(v),
        (404, _) => None,
        (status, v) => panic!("GET /volumes/{name}: {status} {v}"),
    }
}

/// Layer 2: with `--csi-plugin`, the leader has the plugin create each new volume and delete each removed one.
/// The test plugin (`shoal_testkit::csi_plugin`) makes a volume a directory and records every call.
#[test]
fn a_csi_plugin_creates_and_deletes_cluster_volumes_retried_until_it_answers_and_across_a_restart() {
    use shoal_testkit::csi_plugin::{CsiCall, TestCsiPlugin};
    let bad = Command::new(shoal_bin()).args(["daemon", "--csi-plugin", "csi.shoal.test"]).output().unwrap();
    assert!(!bad.status.success());
    let said = String::from_utf8_lossy(&bad.stderr);
    assert!(said.contains("use NAME=unix:///path/to/plugin.sock"), "a flag without a socket is refused: {said}");
    let plugin = TestCsiPlugin::start();
    let flags = vec!["--csi-plugin".to_string(), format!("csi.shoal.test=unix://{}", plugin.socket().display())];
    let mut d =
        DaemonProcess::start_with(&shoal_bin(), DaemonOptions { extra_args: flags.clone(), ..Default::default() });
    let secret = json!({"Name": "db-pass", "Data": "czNjcmV0"}); // base64 of "s3cret"
    let (status, answer) = curl(&d, "POST", "/secrets/create", Some(&secret.to_string()));
    assert_eq!(status, 201, "{answer}");
    let body = |name: &str| {
        let mut b = create_body(name);
        b["Driver"] = json!("csi.shoal.test");
        b["ClusterVolumeSpec"]["Secrets"] = json!([{"Key": "password", "Secret": "db-pass"}]);
        b.to_string()
    };

    // Created by the plugin: its ID, capacity, context and topology in `ClusterVolume.Info`.
    let (status, created) = curl(&d, "POST", "/volumes/create", Some(&body("data")));
    assert_eq!(status, 201, "{created}");
    let info = wait_until("the plugin to create the volume", WAIT, || {
        let v = inspect(&d, "data");
        let info = v["ClusterVolume"]["Info"].clone();
        if info["VolumeID"].is_string() {
            Ok(info)
        } else {
            Err(format!("{v}"))
        }
    });
    assert_eq!(info["VolumeID"], "csi-data");
    assert_eq!(info["CapacityBytes"], 1073741824);
    assert_eq!(info["VolumeContext"]["path"], plugin.volume_dir("csi-data").display().to_string());
    assert_eq!(info["AccessibleTopology"], json!([{"Segments": {"zone": "z1"}}]));
    assert!(plugin.volume_dir("csi-data").is_dir(), "the plugin made the volume");
    let create = CsiCall::Create {
        name: "data".into(),
        parameters: [("size".into(), "1G".into())].into(),
        secrets: [("password".into(), "s3cret".into())].into(),
        required_bytes: 1073741824,
        modes: vec![1], // SINGLE_NODE_WRITER, for a single-node, one-writer volume
    };
    assert_eq!(plugin.calls(), vec![create.clone()], "one CreateVolume, with the secret's data");

    // A plugin that fails: the removal waits (the volume is still listed) and is retried until it answers.
    plugin.set_failing(true);
    let (status, answer) = curl(&d, "DELETE", "/volumes/data", None);
    assert_eq!(status, 204, "{answer}");
    wait_until("a refused DeleteVolume", WAIT, || {
        let calls = plugin.calls();
        if calls.len() >= 2 {
            Ok(())
        } else {
            Err(format!("{calls:?}"))
        }
    });
    assert!(inspect_if_any(&d, "data").is_some(), "kept while its plugin has not deleted it");
    assert!(plugin.volume_dir("csi-data").is_dir());

    // A volume created while the plugin fails, and a restart meanwhile: the new leader creates it.
    let (status, created) = curl(&d, "POST", "/volumes/create", Some(&body("logs")));
    assert_eq!(status, 201, "{created}");
    assert!(d.stop(), "the daemon stops cleanly");
    d.restart(&flags);
    plugin.set_failing(false);
    wait_until("the removed volume deleted by its plugin", WAIT, || match inspect_if_any(&d, "data") {
        None => Ok(()),
        Some(v) => Err(format!("{v}")),
    });
    assert!(!plugin.volume_dir("csi-data").exists(), "the plugin deleted the volume");
    wait_until("the second volume created by its plugin", WAIT, || {
        let v = inspect(&d, "logs");
        if v["ClusterVolume"]["Info"]["VolumeID"] == "csi-logs" {
            Ok(())
        } else {
            Err(format!("{v}"))
        }
    });
    let calls = plugin.calls();
    let delete =
        CsiCall::Delete { volume_id: "csi-data".into(), secrets: [("password".into(), "s3cret".into())].into() };
    let creates_logs = |c: &CsiCall| matches!(c, CsiCall::Create { name, .. } if name == "logs");
    assert!(calls[1..].iter().all(|c| *c == delete || creates_logs(c)), "only those two, retried: {calls:?}");
    assert!(calls.contains(&delete) && calls.iter().any(creates_logs), "{calls:?}");

    // A volume whose plugin no manager has: never created, removed at once (nothing to ask of a plugin);
    // `--force` removes a created one without asking its plugin.
    let mut other = create_body("elsewhere");
    other["Driver"] = json!("csi.not.here");
    let (status, created) = curl(&d, "POST", "/volumes/create", Some(&other.to_string()));
    assert_eq!(status, 201, "{created}");
    assert!(inspect(&d, "elsewhere")["ClusterVolume"]["Info"].is_null());
    assert_eq!(curl(&d, "DELETE", "/volumes/elsewhere", None).0, 204);
    assert!(inspect_if_any(&d, "elsewhere").is_none(), "removed at once");
    let before = plugin.calls().len();
    assert_eq!(curl(&d, "DELETE", "/volumes/logs?force=1", None).0, 204);
    assert!(inspect_if_any(&d, "logs").is_none(), "a forced removal is at once");
    assert_eq!(plugin.calls().len(), before, "and asks nothing of the plugin");
    assert!(plugin.volume_dir("csi-logs").is_dir(), "so the plugin's volume stays");
}

/// Layer 3, end to end on the README's default path (the host's namespace, the docker executor): a service
/// mounting a cluster volume (`Mounts: [{Type: cluster}]`, as Docker 23's `--mount type=cluster` sends it) is
/// placed on the node that runs the plugin; the manager publishes the volume there (`ControllerPublishVolume`
/// with the plugin's ID of the node), the node stages and publishes it, and the container writes into the
/// plugin's volume. The removal is refused while it is in use. When the service goes, the node unpublishes
/// it, then the manager (`ControllerUnpublishVolume`), and the volume can be removed.
#[test]
fn a_task_writes_into_its_cluster_volume_which_is_unpublished_when_the_task_ends() {
    use shoal_testkit::csi_plugin::{CsiCall, TestCsiPlugin};
    if prerequisites::skip_unless(Prerequisite::DockerEngine) {
        return;
    }
    let image = shoal_testkit::docker_engine::ensure_test_image();
    let plugin = TestCsiPlugin::start();
    let flags = vec!["--csi-plugin".to_string(), format!("csi.shoal.test=unix://{}", plugin.socket().display())];
    let d = shoal_testkit::docker_engine::EngineDaemon::start_with_args(&shoal_bin(), flags);
    let node_id = d.node_id().to_string();

    // The node reports the plugin (its NodeGetInfo) in its description.
    let csi_node = wait_until("the node to report its CSI plugin", WAIT, || {
        let (status, node) = curl(&d, "GET", &format!("/nodes/{node_id}"), None);
        assert_eq!(status, 200, "{node}");
        let info = &node["Description"]["CSIInfo"][0];
        match (info["PluginName"].as_str(), info["NodeID"].as_str()) {
            (Some("csi.shoal.test"), Some(id)) if !id.is_empty() => Ok(id.to_string()),
            _ => Err(format!("{node}")),
        }
    });

    create_single_writer(&d, "data");
    wait_until("the plugin to create the volume", WAIT, || {
        let v = inspect(&d, "data");
        if v["ClusterVolume"]["Info"]["VolumeID"] == "csi-data" {
            Ok(())
        } else {
            Err(format!("{v}"))
        }
    });

    let write = "echo written-by-the-task > /data/hello && exec sleep 3600";
    create_volume_user(&d, "volume-user", (image, write), ("data", "/data"), None);
    let hello = plugin.volume_dir("csi-data").join("hello");
    wait_until(
        "the task to write into the plugin's volume",
        Duration::from_secs(60),
        || match std::fs::read_to_string(&hello) {
            Ok(text) if text.trim() == "written-by-the-task" => Ok(()),
            other => Err(format!("{other:?}; volume {}", inspect(&d, "data"))),
        },
    );
    // The stock docker CLI sees the service running on this node.
    let ps = docker_cli::ok(d.socket(), &["service", "ps", "volume-user", "--format", "{{.CurrentState}} {{.Node}}"]);
    assert!(ps.lines().any(|l| l.starts_with("Running")), "{ps}");
    let published = inspect(&d, "data")["ClusterVolume"]["PublishStatus"].clone();
    assert_eq!(published[0]["NodeID"], json!(node_id), "{published}");
    assert_eq!(published[0]["State"], "published", "{published}");
    assert_eq!(published[0]["PublishContext"]["published-to"], json!(csi_node), "{published}");
    let published_to_node = |c: &CsiCall| {
        matches!(c, CsiCall::ControllerPublish { volume_id, node_id, .. }
            if volume_id == "csi-data" && *node_id == csi_node)
    };
    assert!(plugin.calls().iter().any(published_to_node), "{:?}", plugin.calls());
    let (_, tasks) = curl(&d, "GET", "/tasks?filters=%7B%22service%22%3A%5B%22volume-user%22%5D%7D", None);
    assert_eq!(tasks[0]["Volumes"][0]["Source"], "data", "{tasks}");

    // In use: the removal is refused, naming the service.
    refused(&d, "DELETE", "/volumes/data", "", 400, "volume-user");

    // The service goes: the node unpublishes the volume, then the plugin's controller does.
    let (status, answer) = curl(&d, "DELETE", "/services/volume-user", None);
    assert_eq!(status, 200, "{answer}");
    wait_until("the volume unpublished", Duration::from_secs(60), || {
        let v = inspect(&d, "data");
        let unpublished = plugin
            .calls()
            .iter()
            .any(|c| matches!(c, CsiCall::ControllerUnpublish { volume_id, .. } if volume_id == "csi-data"));
        if v["ClusterVolume"]["PublishStatus"].as_array().is_none_or(|a| a.is_empty()) && unpublished {
            Ok(())
        } else {
            Err(format!("{v} {:?}", plugin.calls()))
        }
    });
    // The node's side, in order: stage (with the controller's publish context), publish at the node's path,
    // and the reverse.
    let node_calls: Vec<String> = plugin
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            CsiCall::NodeStage { volume_id, publish_context, .. } => {
                Some(format!("stage {volume_id} {:?}", publish_context.get("published-to")))
            }
            CsiCall::NodePublish { volume_id, target_path, readonly, .. } => {
                let under_state_dir = target_path.ends_with("/publish") && target_path.contains("/csi/");
                Some(format!("publish {volume_id} {under_state_dir} {readonly}"))
            }
            CsiCall::NodeUnpublish { volume_id, .. } => Some(format!("unpublish {volume_id}")),
            CsiCall::NodeUnstage { volume_id, .. } => Some(format!("unstage {volume_id}")),
            _ => None,
        })
        .collect();
    let staged = format!("stage csi-data {:?}", Some(&csi_node));
    assert_eq!(
        node_calls,
        [staged.as_str(), "publish csi-data true false", "unpublish csi-data", "unstage csi-data"],
        "{:?}",
        plugin.calls()
    );
    assert_eq!(curl(&d, "DELETE", "/volumes/data", None).0, 204);
    wait_until("the volume deleted", WAIT, || match inspect_if_any(&d, "data") {
        None => Ok(()),
        Some(v) => Err(format!("{v}")),
    });
    assert!(!plugin.volume_dir("csi-data").exists(), "the plugin deleted the volume");
}

/// Creates (201) a single-node, single-writer cluster volume of the suite's plugin (`csi.shoal.test`).
fn create_single_writer(d: &DaemonProcess, name: &str) {
    let volume = json!({
        "Name": name,
        "Driver": "csi.shoal.test",
        "ClusterVolumeSpec": {"AccessMode": {"Scope": "single", "Sharing": "onewriter", "MountVolume": {}}}
    });
    let (status, created) = curl(d, "POST", "/volumes/create", Some(&volume.to_string()));
    assert_eq!(status, 201, "{created}");
}

/// Creates (201) service `name`: one replica of `(image, sh -c script)` with the cluster volume `(source,
/// target)` mounted, held by a placement constraint if given.
fn create_volume_user(d: &DaemonProcess, name: &str, run: (&str, &str), mount: (&str, &str), held: Option<&str>) {
    let service = json!({
        "Name": name,
        "TaskTemplate": {
            "ContainerSpec": {
                "Image": run.0,
                "Command": ["sh", "-c", run.1],
                "Mounts": [{"Type": "cluster", "Source": mount.0, "Target": mount.1}]
            },
            "Placement": {"Constraints": held.into_iter().collect::<Vec<_>>()}
        },
        "Mode": {"Replicated": {"Replicas": 1}}
    });
    let (status, answer) = curl(d, "POST", "/services/create", Some(&service.to_string()));
    assert_eq!(status, 201, "{answer}");
}

/// The node IDs of the service's tasks that should run and do (`docker service ps`'s view, through the API).
fn running_nodes(d: &DaemonProcess, service: &str) -> Vec<String> {
    let filter = urlencode(&json!({"service": [service], "desired-state": ["running"]}).to_string());
    let (status, tasks) = curl(d, "GET", &format!("/tasks?filters={filter}"), None);
    assert_eq!(status, 200, "{tasks}");
    let mut nodes: Vec<String> = tasks
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["Status"]["State"] == "running")
        .map(|t| t["NodeID"].as_str().unwrap_or("").to_string())
        .collect();
    nodes.sort();
    nodes
}

/// The stock CLI's one-line refusal: the command fails and says `fragment`.
fn cli_refused(d: &DaemonProcess, args: &[&str], fragment: &str) {
    let out = docker_cli::run(d.socket(), args);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains(fragment), "docker {args:?}: {said:?} should contain {fragment:?}");
}

/// A node that reports the plugin, with the plugin's ID of it.
fn wait_csi_node(d: &DaemonProcess, node_id: &str) -> String {
    wait_until("the node to report its CSI plugin", WAIT, || {
        let (_, node) = curl(d, "GET", &format!("/nodes/{node_id}"), None);
        let info = &node["Description"]["CSIInfo"][0];
        match (node["Status"]["State"].as_str(), info["NodeID"].as_str()) {
            (Some("ready"), Some(id)) if !id.is_empty() => Ok(id.to_string()),
            _ => Err(format!("{node}")),
        }
    })
}

/// The plugin's calls about one volume's publications, one line each, in order: the controller's
/// publish/unpublish and each node's stage/publish/unpublish/unstage, with the plugin's ID of the node.
fn publication_calls(plugin: &shoal_testkit::csi_plugin::TestCsiPlugin, volume: &str) -> Vec<String> {
    use shoal_testkit::csi_plugin::CsiCall;
    plugin
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            CsiCall::ControllerPublish { volume_id, node_id, .. } => Some((volume_id, format!("publish to {node_id}"))),
            CsiCall::ControllerUnpublish { volume_id, node_id } => {
                Some((volume_id, format!("unpublish from {node_id}")))
            }
            CsiCall::NodeStage { node, volume_id, .. } => Some((volume_id, format!("{node}: stage"))),
            CsiCall::NodePublish { node, volume_id, .. } => Some((volume_id, format!("{node}: publish"))),
            CsiCall::NodeUnpublish { node, volume_id } => Some((volume_id, format!("{node}: unpublish"))),
            CsiCall::NodeUnstage { node, volume_id } => Some((volume_id, format!("{node}: unstage"))),
            _ => None,
        })
        .filter(|(v, _)| v == volume)
        .map(|(_, line)| line)
        .collect()
}

/// Issue 37's acceptance, with the stock docker CLI of Docker 23 or later on two nodes (the docker executor,
/// the host's engine, the README's default path): `docker volume create` of a cluster volume; a service of one
/// replica with `--mount type=cluster` writes into it on the first node; `docker volume rm` is refused naming
/// the service; the first node is drained and the task moves to the second: the volume is unpublished from the
/// first node (node, then controller) before it is published on the second, and the file is there. A volume
/// whose topology allows only the second node keeps its task there, and when that node is drained the pending
/// task says why. The plugin plays both nodes over one root, as network storage would be.
#[test]
fn a_cluster_volume_follows_its_task_to_another_node_and_its_topology_keeps_a_task_where_it_is_allowed() {
    use shoal_testkit::csi_plugin::{PluginNode, TestCsiPlugin};
    if prerequisites::skip_unless(Prerequisite::DockerEngine) || prerequisites::skip_unless(Prerequisite::DockerCli23) {
        return;
    }
    let image = shoal_testkit::docker_engine::ensure_test_image();
    let plugin = TestCsiPlugin::start_nodes(&[
        PluginNode { node_id: "csi-node-a".into(), zone: Some("z1".into()) },
        PluginNode { node_id: "csi-node-b".into(), zone: Some("z2".into()) },
    ]);
    let flag = |i: usize| {
        vec!["--csi-plugin".to_string(), format!("csi.shoal.test=unix://{}", plugin.node_socket(i).display())]
    };
    let m = shoal_testkit::docker_engine::EngineDaemon::start_with_args(&shoal_bin(), flag(0));
    let (a, b_join) = (m.node_id().to_string(), shoal_testkit::managers::join_token(&m, "Worker"));
    assert_eq!(wait_csi_node(&m, &a), "csi-node-a");
    let cli = |args: &[&str]| docker_cli::ok(m.socket(), args);

    let created = |name: &str| {
        wait_until("the plugin to create the volume", WAIT, || {
            let v = inspect(&m, name);
            if v["ClusterVolume"]["Info"]["VolumeID"] == format!("csi-{name}") {
                Ok(v)
            } else {
                Err(format!("{v}"))
            }
        })
    };
    cli(&["volume", "create", "--driver", "csi.shoal.test", "--type", "mount", "--scope", "single"]
        .into_iter()
        .chain(["--sharing", "onewriter", "--availability", "active", "--required-bytes", "1G", "data"])
        .collect::<Vec<_>>());
    created("data");
    let mount = "type=cluster,src=data,dst=/data";
    let write = "hostname >> /data/log && exec sleep 3600";
    cli(&["service", "create", "--detach", "--name", "volume-owner", "--mount", mount, image, "sh", "-c", write]);
    let log = plugin.volume_dir("csi-data").join("log");
    let written_on = |nodes: &[&str], lines: usize| {
        let what = format!("the task running on {nodes:?}, {lines} lines written into the volume");
        wait_until(&what, Duration::from_secs(90), || {
            let written = std::fs::read_to_string(&log).unwrap_or_default().lines().count();
            let running = running_nodes(&m, "volume-owner");
            if running == nodes && written == lines {
                Ok(())
            } else {
                Err(format!("on {running:?}, {written} lines; {}; {:?}", inspect(&m, "data"), plugin.calls()))
            }
        })
    };
    written_on(&[&a], 1);
    cli_refused(&m, &["volume", "rm", "data"], "volume-owner");

    // A second node joins with the plugin; the first is drained: the task moves, and so does the volume.
    let mut join = vec!["--join-addr".to_string(), m.remote_addr(), "--join-token".to_string(), b_join];
    join.extend(flag(1));
    let w = shoal_testkit::docker_engine::EngineDaemon::start_with_args(&shoal_bin(), join);
    let b = w.node_id().to_string();
    assert_eq!(wait_csi_node(&m, &b), "csi-node-b");
    cli(&["node", "update", "--availability", "drain", &a]);
    written_on(&[&b], 2);
    let status = cli(&["volume", "inspect", "data", "--format", "{{json .ClusterVolume.PublishStatus}}"]);
    let status: Value = serde_json::from_str(&status).expect("PublishStatus as JSON");
    assert_eq!(status, json!([{"NodeID": b, "State": "published", "PublishContext": {"published-to": "csi-node-b"}}]));
    let first = plugin.calls().into_iter().next();
    let created_first =
        matches!(&first, Some(shoal_testkit::csi_plugin::CsiCall::Create { name, .. }) if name == "data");
    assert!(created_first, "the first call creates the volume: {first:?}");
    let expected = ["publish to csi-node-a", "csi-node-a: stage", "csi-node-a: publish", "csi-node-a: unpublish"]
        .into_iter()
        .chain(["csi-node-a: unstage", "unpublish from csi-node-a"])
        .chain(["publish to csi-node-b", "csi-node-b: stage", "csi-node-b: publish"]);
    assert_eq!(publication_calls(&plugin, "csi-data"), expected.collect::<Vec<_>>(), "{:?}", plugin.calls());

    // `docker volume ls --cluster` lists it; `docker volume update --availability drain` stops its task (the
    // replacement waits), and `active` lets the task run again, on the node the volume is published to.
    assert!(cli(&["volume", "ls", "--cluster", "-q"]).lines().any(|l| l == "data"));
    cli(&["volume", "update", "--availability", "drain", "data"]);
    wait_until("the task stopped by the drained volume", Duration::from_secs(60), || {
        match running_nodes(&m, "volume-owner") {
            nodes if nodes.is_empty() => Ok(()),
            nodes => Err(format!("{nodes:?}")),
        }
    });
    cli(&["volume", "update", "--availability", "active", "data"]);
    written_on(&[&b], 3);

    // Once the service is gone the volume is unpublished and can be removed.
    cli(&["service", "rm", "volume-owner"]);
    wait_until("the volume unpublished from the second node", Duration::from_secs(60), || {
        let calls = publication_calls(&plugin, "csi-data");
        if calls.last().map(String::as_str) == Some("unpublish from csi-node-b") {
            Ok(())
        } else {
            Err(format!("{calls:?}"))
        }
    });
    cli(&["volume", "rm", "data"]);
    wait_until("the plugin to delete the volume", WAIT, || match plugin.volume_dir("csi-data").exists() {
        false => Ok(()),
        true => Err(format!("{:?}", inspect_if_any(&m, "data"))),
    });

    // Topology: a volume accessible only in zone z2 (the second node) takes all three of its tasks there,
    // though the first node is active again and empty; with the second node drained they wait, saying why.
    cli(&["node", "update", "--availability", "active", &a]);
    cli(&["volume", "create", "--driver", "csi.shoal.test", "--type", "mount", "--scope", "multi"]
        .into_iter()
        .chain(["--sharing", "all", "--topology-required", "zone=z2", "pinned"])
        .collect::<Vec<_>>());
    let pinned = created("pinned");
    assert_eq!(pinned["ClusterVolume"]["Info"]["AccessibleTopology"], json!([{"Segments": {"zone": "z2"}}]));
    let mount = "type=cluster,src=pinned,dst=/data";
    cli(&["service", "create", "--detach", "--name", "pinned-owner", "--replicas", "3", "--mount", mount, image]
        .into_iter()
        .chain(["sleep", "3600"])
        .collect::<Vec<_>>());
    wait_until("three tasks running on the second node", Duration::from_secs(60), || {
        match running_nodes(&m, "pinned-owner") {
            nodes if nodes == [b.as_str(); 3] => Ok(()),
            nodes => Err(format!("{nodes:?}")),
        }
    });
    cli(&["node", "update", "--availability", "drain", &b]);
    let why = "outside the accessible topology of the cluster volume \"pinned\"";
    wait_until("the tasks pending, saying why", Duration::from_secs(60), || {
        let ps = cli(&["service", "ps", "pinned-owner", "--no-trunc", "--filter", "desired-state=running"]
            .into_iter()
            .chain(["--format", "{{.CurrentState}}|{{.Error}}"])
            .collect::<Vec<_>>());
        let pending = ps.lines().filter(|l| l.starts_with("Pending") && l.contains(why)).count();
        if pending == 3 {
            Ok(())
        } else {
            Err(ps)
        }
    });
    assert!(running_nodes(&m, "pinned-owner").is_empty());
    drop(w);
}

/// A plugin that starts after the daemon (its socket is not there yet): the volume waits to be created and
/// the task to be placed, the pending task saying so; once the plugin serves, the manager creates the volume,
/// the node asks `NodeGetInfo` again and opens a new session to report it, and the task is placed and writes.
#[test]
fn a_plugin_started_after_the_daemon_is_found_and_the_waiting_task_placed() {
    use shoal_testkit::csi_plugin::TestCsiPlugin;
    if prerequisites::skip_unless(Prerequisite::DockerEngine) {
        return;
    }
    let image = shoal_testkit::docker_engine::ensure_test_image();
    let dir = tempfile::tempdir().expect("tempdir");
    let link = dir.path().join("plugin.sock");
    // Declared before the daemon so that it is dropped after it (its mounts go once no container holds them).
    let mut plugin: Option<TestCsiPlugin> = None;
    let flags = vec!["--csi-plugin".to_string(), format!("csi.shoal.test=unix://{}", link.display())];
    let d = shoal_testkit::docker_engine::EngineDaemon::start_with_args(&shoal_bin(), flags);
    create_single_writer(&d, "late");
    let write = "echo placed > /data/hello && exec sleep 3600";
    create_volume_user(&d, "late-user", (image, write), ("late", "/data"), None);
    wait_until("the task pending, saying why", WAIT, || {
        let (_, tasks) = curl(&d, "GET", "/tasks", None);
        let task = &tasks[0];
        match (task["Status"]["State"].as_str(), task["Status"]["Err"].as_str()) {
            (Some("pending"), Some(why)) if why.contains("late") => Ok(()),
            _ => Err(format!("{tasks}")),
        }
    });

    let started = plugin.insert(TestCsiPlugin::start());
    std::os::unix::fs::symlink(started.socket(), &link).expect("link the plugin's socket");
    let hello = started.volume_dir("csi-late").join("hello");
    wait_until("the task placed, writing into the volume", Duration::from_secs(90), || {
        match std::fs::read_to_string(&hello) {
            Ok(text) if text.trim() == "placed" => Ok(()),
            other => Err(format!("{other:?}; {}", curl(&d, "GET", "/tasks", None).1)),
        }
    });
    let (_, node) = curl(&d, "GET", &format!("/nodes/{}", d.node_id()), None);
    assert_eq!(node["Description"]["CSIInfo"][0]["NodeID"], "csi-node-1", "{node}");
    drop(d);
}

/// Issue 37's last acceptance: the leader is killed (`kill -9`) while the plugin's controller is publishing a
/// single-writer volume for a task on another manager. The new leader publishes it again (to the same node),
/// the task runs and writes into it, and the plugin never had the volume published to two nodes.
#[test]
fn a_leader_killed_during_a_publish_leaves_the_new_leader_to_finish_it_on_one_node() {
    use shoal_testkit::csi_plugin::{CsiCall, PluginNode, TestCsiPlugin};
    use shoal_testkit::docker_engine::EngineDaemon;
    if prerequisites::skip_unless(Prerequisite::DockerEngine) {
        return;
    }
    let image = shoal_testkit::docker_engine::ensure_test_image();
    let nodes: Vec<PluginNode> = (1..=3).map(|i| PluginNode { node_id: format!("csi-node-{i}"), zone: None }).collect();
    let plugin = TestCsiPlugin::start_nodes(&nodes);
    let start = |i: usize, join: Option<&EngineDaemon>| {
        let mut extra_args =
            vec!["--csi-plugin".to_string(), format!("csi.shoal.test=unix://{}", plugin.node_socket(i).display())];
        if let Some(leader) = join {
            let token = shoal_testkit::managers::join_token(leader, "Manager");
            extra_args.extend(["--join-addr".to_string(), leader.remote_addr(), "--join-token".to_string(), token]);
        }
        let opts = DaemonOptions {
            listen_ip: Some(format!("127.0.0.{}", 61 + i)),
            hostname: Some(format!("volume-manager-{}", i + 1)),
            extra_args,
            ..Default::default()
        };
        EngineDaemon::start_with(&shoal_bin(), opts)
    };
    let mut m1 = start(0, None);
    let m2 = start(1, Some(&m1));
    let m3 = start(2, Some(&m1));
    for (m, csi) in [(&m1, "csi-node-1"), (&m2, "csi-node-2"), (&m3, "csi-node-3")] {
        assert_eq!(wait_csi_node(&m1, m.node_id()), csi);
    }
    let (_, leader) = curl(&m1, "GET", &format!("/nodes/{}", m1.node_id()), None);
    assert_eq!(leader["ManagerStatus"]["Leader"], true, "the first manager leads: {leader}");

    create_single_writer(&m1, "shared");
    wait_until("the plugin to create the volume", WAIT, || match plugin.volume_dir("csi-shared").is_dir() {
        true => Ok(()),
        false => Err(format!("{:?}", plugin.calls())),
    });
    plugin.set_publish_delay(Duration::from_secs(3));
    let held = format!("node.id=={}", m2.node_id());
    let write = "echo survived > /data/hello && exec sleep 3600";
    create_volume_user(&m1, "survivor", (image, write), ("shared", "/data"), Some(&held));
    let publishes = || {
        plugin
            .calls()
            .into_iter()
            .filter_map(|c| match c {
                CsiCall::ControllerPublish { volume_id, node_id, .. } if volume_id == "csi-shared" => Some(node_id),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    wait_until("the leader to call ControllerPublishVolume", WAIT, || match publishes().len() {
        0 => Err(format!("{:?}", plugin.calls())),
        _ => Ok(()),
    });
    m1.kill9();
    plugin.set_publish_delay(Duration::ZERO);

    let hello = plugin.volume_dir("csi-shared").join("hello");
    wait_until("the task to run on the second manager and write", Duration::from_secs(90), || {
        match std::fs::read_to_string(&hello) {
            Ok(text) if text.trim() == "survived" => Ok(()),
            other => Err(format!("{other:?}; {:?}", plugin.calls())),
        }
    });
    let published = publishes();
    assert!(published.len() >= 2, "the new leader published it again: {published:?}");
    assert!(published.iter().all(|n| n == "csi-node-2"), "only ever to the task's node: {published:?}");
    assert_eq!(plugin.most_nodes_published_at_once("csi-shared"), 1);
    let status = inspect(&m2, "shared")["ClusterVolume"]["PublishStatus"].clone();
    assert_eq!(status.as_array().map(Vec::len), Some(1), "{status}");
    assert_eq!((status[0]["NodeID"].as_str(), status[0]["State"].as_str()), (Some(m2.node_id()), Some("published")));
    drop((m2, m3));
}

/// The process executor: a task's cluster mount is made in the process's own mount namespace over an existing
/// directory of the node, the process writes into the plugin's volume through it, the node's directory stays
/// empty, and the volume is unpublished when the service goes.
#[test]
fn a_process_task_writes_into_its_cluster_volume_through_its_own_mount() {
    use shoal_testkit::csi_plugin::{CsiCall, TestCsiPlugin};
    let plugin = TestCsiPlugin::start();
    let target = tempfile::tempdir().expect("the mount's target on the node");
    let flags = vec!["--csi-plugin".to_string(), format!("csi.shoal.test=unix://{}", plugin.socket().display())];
    let d = DaemonProcess::start_with(&shoal_bin(), DaemonOptions { extra_args: flags, ..Default::default() });
    create_single_writer(&d, "pv");
    let dir = target.path().display().to_string();
    let write = format!("echo from-a-process > {dir}/hello && exec sleep 3600");
    create_volume_user(&d, "process-volume-user", ("none", &write), ("pv", &dir), None);
    let hello = plugin.volume_dir("csi-pv").join("hello");
    wait_until("the process to write into the plugin's volume", Duration::from_secs(60), || {
        match std::fs::read_to_string(&hello) {
            Ok(text) if text.trim() == "from-a-process" => Ok(()),
            other => Err(format!("{other:?}; {}", curl(&d, "GET", "/tasks", None).1)),
        }
    });
    assert_eq!(std::fs::read_dir(target.path()).unwrap().count(), 0, "the node's own directory is untouched");
    assert_eq!(curl(&d, "DELETE", "/services/process-volume-user", None).0, 200);
    wait_until("the volume unpublished", Duration::from_secs(60), || {
        match plugin
            .calls()
            .iter()
            .any(|c| matches!(c, CsiCall::ControllerUnpublish { volume_id, .. } if volume_id == "csi-pv"))
        {
            true => Ok(()),
            false => Err(format!("{:?}", plugin.calls())),
        }
    });
}
