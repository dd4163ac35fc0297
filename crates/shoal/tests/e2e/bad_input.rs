//! Bad input to the Engine API gets a 4xx with a clear JSON message, the daemon keeps running, and nothing
//! stored changes.

use crate::common;

use common::*;
use shoal_testkit::http::request;

fn check(d: &DaemonProcess, method: &str, path: &str, body: Option<&str>, status: u16, message_has: &str) {
    let before = d.get("/v1.47/services");
    let r = request(d.socket(), method, path, body).unwrap();
    assert_eq!(r.status, status, "{method} {path} {body:?} -> {} {}", r.status, r.body);
    let msg = r.body["message"].as_str().unwrap_or_else(|| panic!("no JSON message in {}", r.body));
    assert!(
        msg.to_lowercase().contains(&message_has.to_lowercase()),
        "{method} {path}: message {msg:?} should mention {message_has:?}"
    );
    assert_eq!(d.get("/v1.47/services"), before, "{method} {path} changed the services");
}

#[test]
fn bad_requests_are_refused_and_change_nothing() {
    let d = daemon();
    let good = r#"{"Name":"web","TaskTemplate":{"ContainerSpec":{"Image":"busybox","Args":["sleep","3161"]}},"Mode":{"Replicated":{"Replicas":1}}}"#;
    let r = request(d.socket(), "POST", "/v1.47/services/create", Some(good)).unwrap();
    assert_eq!(r.status, 201, "{}", r.body);
    let id = r.body["ID"].as_str().unwrap().to_string();
    let version = d.get(&format!("/v1.47/services/{id}"))["Version"]["Index"].as_u64().unwrap();

    check(&d, "POST", "/v1.47/services/create", Some("{not json"), 400, "");
    check(&d, "POST", "/v1.47/services/create", Some(good), 409, "web");
    check(
        &d,
        "POST",
        "/v1.47/services/create",
        Some(
            r#"{"Name":"neg","TaskTemplate":{"ContainerSpec":{"Image":"busybox"}},"Mode":{"Replicated":{"Replicas":-1}}}"#,
        ),
        400,
        "",
    );
    check(
        &d,
        "POST",
        "/v1.47/services/create",
        Some(
            r#"{"Name":"c","TaskTemplate":{"ContainerSpec":{"Image":"busybox"},"Placement":{"Constraints":["node.color==red"]}},"Mode":{"Replicated":{"Replicas":1}}}"#,
        ),
        400,
        "constraint",
    );
    check(&d, "GET", "/v1.47/services/nosuchservice", None, 404, "nosuchservice");
    check(&d, "GET", "/v1.47/tasks/nosuchtask", None, 404, "nosuchtask");
    check(&d, "GET", "/v1.47/nodes/nosuchnode", None, 404, "nosuchnode");
    check(&d, "DELETE", "/v1.47/services/nosuchservice", None, 404, "nosuchservice");
    let stale = format!("/v1.47/services/{id}/update?version={}", version.saturating_sub(1));
    check(&d, "POST", &stale, Some(good), 409, "out of sequence");
    check(&d, "GET", "/v1.47/tasks?filters=%7Bbroken", None, 400, "");

    // Still serving, and the good service is untouched.
    assert_eq!(d.get(&format!("/v1.47/services/{id}"))["Version"]["Index"].as_u64().unwrap(), version);
}

/// Mounts Docker's executor would reject on every task, and SCTP ports no node forwards, are refused at
/// create and update (issue 32: they got a 201 and then rejected tasks forever).
#[test]
fn bad_mounts_and_unforwardable_sctp_ports_are_refused_at_the_api() {
    let d = daemon();
    let spec = |extra: &str| {
        format!(
            r#"{{"Name":"m","TaskTemplate":{{"ContainerSpec":{{"Image":"busybox","Args":["sleep","3162"]{extra}}}}},"Mode":{{"Replicated":{{"Replicas":1}}}}}}"#
        )
    };
    let mounts = |m: &str| spec(&format!(r#","Mounts":[{m}]"#));
    for (body, says) in [
        (mounts(r#"{"Type":"tmpfs"}"#), "invalid mount target, must be an absolute path"),
        (mounts(r#"{"Type":"tmpfs","Target":"rel/dir"}"#), "invalid mount target, must be an absolute path"),
        (mounts(r#"{"Type":"tmpfs","Target":"/t"},{"Type":"volume","Target":"/t"}"#), "\"/t\" is duplicated"),
        (mounts(r#"{"Type":"tmpfs","Source":"x","Target":"/t"}"#), "invalid tmpfs source, source must be empty"),
        (mounts(r#"{"Type":"bind","Source":"tmp","Target":"/t"}"#), "invalid bind mount source, must be an absolute"),
        (mounts(r#"{"Type":"volume","Source":"/tmp","Target":"/t"}"#), "invalid volume mount source"),
        (mounts(r#"{"Type":"npipe","Source":"\\\\.\\pipe\\x","Target":"/t"}"#), "invalid mount type: npipe"),
    ] {
        check(&d, "POST", "/v1.47/services/create", Some(&body), 400, says);
    }
    let sctp = |mode: &str, networks: &str| {
        format!(
            r#"{{"Name":"s","TaskTemplate":{{"ContainerSpec":{{"Image":"busybox","Args":["sleep","3162"]}}{networks}}},"Mode":{{"Replicated":{{"Replicas":1}}}},"EndpointSpec":{{"Ports":[{{"Protocol":"sctp","TargetPort":80,"PublishedPort":8090,"PublishMode":"{mode}"}}]}}}}"#
        )
    };
    check(
        &d,
        "POST",
        "/v1.47/services/create",
        Some(&sctp("ingress", "")),
        400,
        "the nodes' data plane does not forward",
    );
    // A host-mode SCTP port off networks is the engine's to bind: accepted.
    let r = request(d.socket(), "POST", "/v1.47/services/create", Some(&sctp("host", ""))).unwrap();
    assert_eq!(r.status, 201, "{}", r.body);

    // An update is checked as a create is.
    let ok = mounts(r#"{"Type":"tmpfs","Target":"/t"}"#);
    let r = request(d.socket(), "POST", "/v1.47/services/create", Some(&ok)).unwrap();
    assert_eq!(r.status, 201, "{}", r.body);
    let id = r.body["ID"].as_str().unwrap().to_string();
    let version = d.get(&format!("/v1.47/services/{id}"))["Version"]["Index"].as_u64().unwrap();
    let update = format!("/v1.47/services/{id}/update?version={version}");
    check(&d, "POST", &update, Some(&mounts(r#"{"Type":"tmpfs","Target":"t"}"#)), 400, "must be an absolute path");
}

#[test]
fn the_docker_cli_prints_the_daemon_error_and_exits_non_zero() {
    if no_docker_cli() {
        return;
    }
    let d = daemon();
    let out = docker_cli::run(d.socket(), &["service", "inspect", "nope"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nope"), "stderr: {err}");
    let out = docker_cli::run(
        d.socket(),
        &["service", "create", "--detach", "--name", "x", "--constraint", "node.role=manager", "busybox", "true"],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("Error response from daemon"), "{:?}", out);
}

#[test]
fn a_log_filter_that_cannot_be_read_stops_the_daemon_with_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(shoal_bin())
        .args(["daemon", "--state-dir"])
        .arg(dir.path().join("state"))
        .args(["--log-level", "shoal=loud"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A daemon that ignored the bad filter would keep running: give it a deadline, then kill it and fail.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the daemon started with --log-level shoal=loud instead of refusing it");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(2), "stderr: {err}");
    assert!(err.contains("--log-level") && err.contains("shoal=loud"), "stderr: {err}");
    assert!(!dir.path().join("state").exists(), "nothing may be created on a usage error");
}
