//! Secrets and configs as users drive them, against a `shoal daemon` (process executor): the stock docker CLI
//! (`docker secret create/inspect/ls/rm`, `docker config ...`, services with `--secret` / `--config`), raw
//! Engine API requests for what the CLI cannot send (a data update), the `shoal` CLI's own `secret` and
//! `config` commands, and a restart (snapshot and log replay) after which the secrets are all there and still
//! never shown, and three managers (written through followers, read through each). Delivery to tasks is tested
//! where it is built (the dispatcher and executors).

use crate::common;

use std::path::Path;

use common::*;
use serde_json::{json, Value};
use shoal_testkit::http;
use shoal_testkit::DaemonOptions;

/// A secret value that appears nowhere but where the test put it.
const PW: &str = "s3cr3t-pw-4242-do-not-show";

fn b64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn docker_stdin(d: &DaemonProcess, args: &[&str], input: &str) -> std::process::Output {
    docker_cli::run_with_stdin(d.socket(), args, input)
}

fn text(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn fails_with(out: std::process::Output, fragment: &str) -> String {
    let t = text(&out);
    assert!(!out.status.success(), "expected a failure with {fragment:?}, got success: {t}");
    assert!(t.contains(fragment), "expected {fragment:?} in: {t}");
    t
}

fn inspect(d: &DaemonProcess, kind: &str, name: &str) -> Value {
    let out = docker(d, &[kind, "inspect", name]);
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{kind} inspect {name}: {e}: {out}"));
    v[0].clone()
}

#[test]
fn the_docker_cli_manages_secrets_and_configs_and_services_that_use_them() {
    if no_docker_cli() {
        return;
    }
    let d = daemon();
    // Create from stdin, as `printf pw | docker secret create db_pw -`.
    let out = docker_stdin(&d, &["secret", "create", "--label", "env=prod", "db_pw", "-"], PW);
    assert!(out.status.success(), "{}", text(&out));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(id.len(), 25, "{id}");
    let out = docker_stdin(&d, &["secret", "create", "api_key", "-"], "k");
    assert!(out.status.success(), "{}", text(&out));

    // Inspect never shows the data.
    let s = inspect(&d, "secret", "db_pw");
    assert_eq!(s["ID"], json!(id));
    assert_eq!(s["Spec"]["Name"], "db_pw");
    assert_eq!(s["Spec"]["Labels"], json!({"env": "prod"}));
    let raw = docker(&d, &["secret", "inspect", &id]);
    assert!(!raw.contains(PW) && !raw.contains(&b64(PW.as_bytes())) && !raw.contains("\"Data\""), "{raw}");
    let pretty = docker(&d, &["secret", "inspect", "--pretty", "db_pw"]);
    assert!(pretty.contains("db_pw") && !pretty.contains(PW), "{pretty}");

    // ls, with filters.
    let ls = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["secret", "ls", "--format", "{{.Name}}"];
        all.extend_from_slice(args);
        docker(&d, &all).lines().map(str::to_string).collect()
    };
    assert_eq!(ls(&[]), ["api_key", "db_pw"]);
    assert_eq!(ls(&["--filter", "name=db"]), ["db_pw"]);
    assert_eq!(ls(&["--filter", "label=env=prod"]), ["db_pw"]);
    assert_eq!(ls(&["--filter", &format!("id={}", &id[..6])]), ["db_pw"]);
    assert_eq!(ls(&["--filter", "label=env=dev"]), Vec::<String>::new());

    // A taken name: 409, which the CLI reports; too much data: 400 naming the limit.
    fails_with(docker_stdin(&d, &["secret", "create", "db_pw", "-"], "other"), "secret db_pw already exists");
    let big = "x".repeat(600 * 1000);
    let t = fails_with(docker_stdin(&d, &["secret", "create", "big", "-"], &big), "less than 512000 bytes");
    assert!(t.contains("got 600000 bytes"), "{t}");
    // An external driver (the CLI then sends no data): Shoal runs no plugins.
    fails_with(
        docker_cli::run(d.socket(), &["secret", "create", "--driver", "vault", "ext"]),
        "secret drivers are not supported",
    );
    fails_with(
        docker_stdin(&d, &["secret", "create", "--template-driver", "jinja", "tpl", "-"], "x"),
        "unknown templating driver \"jinja\"",
    );

    // A config shows its data; templating is kept.
    let conf = "listen 8080\n";
    let out = docker_stdin(&d, &["config", "create", "app.conf", "-"], conf);
    assert!(out.status.success(), "{}", text(&out));
    let c = inspect(&d, "config", "app.conf");
    assert_eq!(c["Spec"]["Data"], json!(b64(conf.as_bytes())), "{c}");
    let shown = docker(&d, &["config", "inspect", "--format", "{{printf \"%s\" .Spec.Data}}", "app.conf"]);
    assert_eq!(shown.trim_end(), conf.trim_end());
    let out =
        docker_stdin(&d, &["config", "create", "--template-driver", "golang", "tpl.conf", "-"], "{{.Service.Name}}");
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(inspect(&d, "config", "tpl.conf")["Spec"]["Templating"], json!({"Name": "golang"}));
    let configs: Vec<String> =
        docker(&d, &["config", "ls", "--format", "{{.Name}}"]).lines().map(str::to_string).collect();
    assert_eq!(configs, ["app.conf", "tpl.conf"]);

    // A service using both: the CLI resolves the names to IDs; the spec holds the references.
    docker(
        &d,
        &[
            "service",
            "create",
            "--detach",
            "--name",
            "web",
            "--secret",
            "db_pw",
            "--config",
            "src=app.conf,target=/etc/app.conf,mode=0400",
            "busybox",
            "sleep",
            "3141",
        ],
    );
    let svc = d.get("/v1.47/services/web");
    let spec = &svc["Spec"]["TaskTemplate"]["ContainerSpec"];
    assert_eq!(
        spec["Secrets"],
        json!([{"File": {"Name": "db_pw", "UID": "0", "GID": "0", "Mode": 0o444}, "SecretID": id,
            "SecretName": "db_pw"}]),
        "{svc}"
    );
    assert_eq!(spec["Configs"][0]["File"], json!({"Name": "/etc/app.conf", "UID": "0", "GID": "0", "Mode": 0o400}));
    // An unknown one: the CLI finds no such secret and says so.
    fails_with(
        docker_cli::run(
            d.socket(),
            &["service", "create", "--detach", "--name", "bad", "--secret", "nope", "busybox", "true"],
        ),
        "secret not found: nope",
    );

    // In use: removal refused, naming the service.
    fails_with(
        docker_cli::run(d.socket(), &["secret", "rm", "db_pw"]),
        "secret 'db_pw' is in use by the following service: web",
    );
    fails_with(
        docker_cli::run(d.socket(), &["config", "rm", "app.conf"]),
        "config 'app.conf' is in use by the following service: web",
    );
    // Dropping the secret from the service is an update the CLI makes (the tasks roll); then it can go.
    docker(&d, &["service", "update", "--detach", "--secret-rm", "db_pw", "web"]);
    let after = d.get("/v1.47/services/web");
    assert!(after["Spec"]["TaskTemplate"]["ContainerSpec"].get("Secrets").is_none(), "{after}");
    assert_ne!(after["Version"], svc["Version"]);
    assert_eq!(docker(&d, &["secret", "rm", "db_pw"]).trim(), "db_pw");
    docker(&d, &["service", "rm", "web"]);
    assert_eq!(docker(&d, &["config", "rm", "app.conf", "tpl.conf"]).lines().count(), 2);
    assert_eq!(ls(&[]), ["api_key"]);
    fails_with(docker_cli::run(d.socket(), &["secret", "inspect", "db_pw"]), "db_pw");
}

#[test]
fn what_the_cli_cannot_send_is_refused_by_the_engine_api() {
    let d = daemon();
    let create = json!({"Name": "pw", "Labels": {"a": "1"}, "Data": b64(PW.as_bytes())}).to_string();
    let r = http::request(d.socket(), "POST", "/v1.47/secrets/create", Some(&create)).unwrap();
    assert_eq!(r.status, 201, "{}", r.body);
    let version = d.get("/v1.47/secrets/pw")["Version"]["Index"].as_u64().unwrap();
    // `docker secret update` does not exist; the API refuses a data change, naming the field.
    let change = json!({"Name": "pw", "Data": b64(b"another-password")}).to_string();
    let r = http::request(d.socket(), "POST", &format!("/v1.47/secrets/pw/update?version={version}"), Some(&change))
        .unwrap();
    assert_eq!(r.status, 400, "{}", r.body);
    let msg = r.body["message"].as_str().unwrap();
    assert!(msg.contains("Data: only updates to Labels are allowed"), "{msg}");
    assert!(!msg.contains("another-password") && !msg.contains(PW), "{msg}");
    // Labels change; the data stays, unseen.
    let relabel = json!({"Name": "pw", "Labels": {"a": "2"}}).to_string();
    let r = http::request(d.socket(), "POST", &format!("/v1.47/secrets/pw/update?version={version}"), Some(&relabel))
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let s = d.get("/v1.47/secrets/pw");
    assert_eq!(s["Spec"]["Labels"], json!({"a": "2"}));
    assert!(s["Spec"].get("Data").is_none(), "{s}");
    // A service naming an unknown secret through the API (no CLI lookup first): 400 naming it.
    let svc = json!({
        "Name": "web",
        "TaskTemplate": {"ContainerSpec": {"Image": "busybox", "Args": ["sleep", "9"],
                         "Secrets": [{"SecretName": "nope", "File": {"Name": "nope", "UID": "0", "GID": "0",
                             "Mode": 292}}]}}
    })
    .to_string();
    let r = http::request(d.socket(), "POST", "/v1.47/services/create", Some(&svc)).unwrap();
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body["message"].as_str().unwrap().contains("secret not found: nope"), "{}", r.body);
    assert!(!d.log().contains(PW), "the daemon logged the secret");
}

fn shoal_ok(socket: &Path, args: &[&str]) -> String {
    let out = shoal_cli(socket, args);
    assert!(out.status.success(), "shoal {args:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_shoal_cli_manages_secrets_and_configs() {
    let d = daemon();
    let s = d.socket();
    let out = process::output_with_stdin(
        &mut shoal_command(s, &["secret", "create", "-l", "env=prod", "db_pw", "-"]),
        PW.as_bytes(),
        "shoal",
    );
    assert!(out.status.success(), "{}", text(&out));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(id.len(), 25, "{id}");
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), "port=80\n").unwrap();
    shoal_ok(s, &["config", "create", "--template-driver", "golang", "app.conf", file.path().to_str().unwrap()]);

    let ls = shoal_ok(s, &["secret", "ls"]);
    let lines: Vec<&str> = ls.lines().collect();
    assert!(lines[0].starts_with("ID") && lines[0].contains("NAME") && lines[0].contains("CREATED"), "{ls}");
    assert!(lines[1].starts_with(&id) && lines[1].contains("db_pw"), "{ls}");
    let inspected = shoal_ok(s, &["secret", "inspect", "db_pw"]);
    assert!(inspected.contains(&id) && !inspected.contains(PW) && !inspected.contains("\"Data\""), "{inspected}");
    let v: Value = serde_json::from_str(&shoal_ok(s, &["config", "inspect", "app.conf"])).unwrap();
    assert_eq!(v[0]["Spec"]["Data"], json!(b64(b"port=80\n")));
    assert_eq!(v[0]["Spec"]["Templating"]["Name"], "golang");

    shoal_ok(
        s,
        &[
            "service",
            "create",
            "--name",
            "web",
            "--secret",
            "src=db_pw,target=pw,mode=0400",
            "--config",
            "app.conf",
            "busybox",
            "sleep",
            "3141",
        ],
    );
    let svc = d.get("/v1.47/services/web");
    let c = &svc["Spec"]["TaskTemplate"]["ContainerSpec"];
    assert_eq!(c["Secrets"][0]["SecretID"], json!(id), "{svc}");
    assert_eq!(c["Secrets"][0]["File"], json!({"Name": "pw", "UID": "0", "GID": "0", "Mode": 0o400}));
    assert_eq!(c["Configs"][0]["ConfigName"], "app.conf");

    // Swapping the secret for another on the same target, and dropping the config: an update (tasks roll).
    let out = process::output_with_stdin(&mut shoal_command(s, &["secret", "create", "db_pw2", "-"]), b"pw2", "shoal");
    assert!(out.status.success(), "{}", text(&out));
    shoal_ok(s, &["service", "update", "--secret-add", "src=db_pw2,target=pw", "--config-rm", "app.conf", "web"]);
    let svc2 = d.get("/v1.47/services/web");
    let c2 = &svc2["Spec"]["TaskTemplate"]["ContainerSpec"];
    assert_eq!(c2["Secrets"].as_array().map(Vec::len), Some(1), "{svc2}");
    assert_eq!(c2["Secrets"][0]["SecretName"], "db_pw2");
    assert!(c2.get("Configs").is_none(), "{svc2}");
    assert_ne!(svc2["Spec"], svc["Spec"]);
    shoal_ok(
        s,
        &["service", "update", "--secret-rm", "db_pw2", "--secret-add", "src=db_pw,target=pw,mode=0400", "web"],
    );
    assert_eq!(
        d.get("/v1.47/services/web")["Spec"]["TaskTemplate"]["ContainerSpec"]["Secrets"][0]["SecretID"],
        json!(id)
    );
    shoal_ok(s, &["secret", "rm", "db_pw2"]);

    // Errors: one line, non-zero exit.
    for (args, fragment) in [
        (vec!["secret", "rm", "db_pw"], "secret 'db_pw' is in use by the following service: web"),
        (vec!["secret", "create", "db_pw", file.path().to_str().unwrap()], "secret db_pw already exists"),
        (vec!["secret", "create", "x", "/nonexistent/file"], "cannot read the secret data from /nonexistent/file"),
        (vec!["service", "create", "--name", "bad", "--secret", "nope", "busybox", "true"], "secret not found: nope"),
        (vec!["config", "inspect", "nope"], "config nope not found"),
    ] {
        let out = shoal_cli(s, &args);
        assert!(!out.status.success(), "shoal {args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "shoal {args:?}: {err}");
        assert!(err.starts_with("shoal: ") && err.contains(fragment), "shoal {args:?}: {err}");
    }
    shoal_ok(s, &["service", "rm", "web"]);
    assert_eq!(shoal_ok(s, &["secret", "rm", "db_pw"]).trim(), "db_pw");
    assert_eq!(shoal_ok(s, &["config", "rm", "app.conf"]).trim(), "app.conf");
    assert_eq!(shoal_ok(s, &["secret", "ls"]).lines().count(), 1, "only the header is left");
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            files_under(&p, out);
        } else {
            out.push(p);
        }
    }
}

#[test]
fn secrets_survive_a_restart_from_snapshot_and_log_and_stay_unseen_and_unreadable_on_disk() {
    let opts = DaemonOptions {
        extra_args: vec!["--raft-snapshot-interval-entries".into(), "20".into()],
        ..DaemonOptions::default()
    };
    let mut d = DaemonProcess::start_with(&shoal_bin(), opts);
    // More writes than the snapshot interval: some secrets are in a snapshot, the last ones only in the log.
    let mut names = Vec::new();
    for i in 0..30 {
        let name = format!("s{i:02}");
        let body = json!({"Name": name, "Data": b64(format!("{PW}-{i:02}").as_bytes())}).to_string();
        let r = http::request(d.socket(), "POST", "/v1.47/secrets/create", Some(&body)).unwrap();
        assert_eq!(r.status, 201, "{}", r.body);
        names.push(name);
    }
    let conf = json!({"Name": "c", "Data": b64(b"config-data")}).to_string();
    assert_eq!(http::request(d.socket(), "POST", "/v1.47/configs/create", Some(&conf)).unwrap().status, 201);
    let before = d.get("/v1.47/secrets");
    // kill -9: nothing is written at a clean stop that could stand in for the log replay.
    d.kill9();
    assert!(d.state_dir().join("raft").join("snapshots").read_dir().unwrap().next().is_some(), "a snapshot was taken");

    // The secret's bytes are in no file of the state dir (the Raft log and snapshots are sealed).
    let mut files = Vec::new();
    files_under(d.state_dir(), &mut files);
    assert!(!files.is_empty());
    for f in &files {
        let bytes = std::fs::read(f).unwrap_or_default();
        assert!(!bytes.windows(PW.len()).any(|w| w == PW.as_bytes()), "the secret is readable in {}", f.display());
    }

    d.restart(&["--raft-snapshot-interval-entries".to_string(), "20".to_string()]);
    let after = wait_until("the secrets listed after the restart", std::time::Duration::from_secs(30), || {
        let r = http::request(d.socket(), "GET", "/v1.47/secrets", None).map_err(|e| e.to_string())?;
        if r.status == 200 {
            Ok(r.body)
        } else {
            Err(format!("{} {}", r.status, r.body))
        }
    });
    assert_eq!(after, before, "the same secrets, versions and times");
    let listed: Vec<&str> = after.as_array().unwrap().iter().map(|s| s["Spec"]["Name"].as_str().unwrap()).collect();
    assert_eq!(listed, names);
    assert_eq!(d.get("/v1.47/configs/c")["Spec"]["Data"], json!(b64(b"config-data")));
    if !no_docker_cli() {
        let raw = docker(&d, &["secret", "inspect", "s00", "s29"]);
        assert!(raw.contains("\"s29\"") && !raw.contains(PW) && !raw.contains("\"Data\""), "{raw}");
    }
    // Still usable: a service references one, and it cannot be removed while used.
    docker_or_api_service(&d);
    let r = http::request(d.socket(), "DELETE", "/v1.47/secrets/s05", None).unwrap();
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(!d.log().contains(PW), "the daemon logged a secret");
}

fn docker_or_api_service(d: &DaemonProcess) {
    let svc = json!({
        "Name": "web",
        "TaskTemplate": {"ContainerSpec": {"Image": "busybox", "Args": ["sleep", "3141"],
                         "Secrets": [{"SecretName": "s05", "File": {"Name": "s05", "UID": "0", "GID": "0",
                             "Mode": 292}}]}}
    })
    .to_string();
    let r = http::request(d.socket(), "POST", "/v1.47/services/create", Some(&svc)).unwrap();
    assert_eq!(r.status, 201, "{}", r.body);
}

#[test]
fn secrets_written_through_a_follower_are_on_every_manager_and_never_shown() {
    use shoal_testkit::managers::{managers_seen_by, sorted_by_id};
    let a = manager_at(171, None);
    let b = manager_at(172, Some(&a));
    let c = manager_at(173, Some(&a));
    for d in [&a, &b, &c] {
        wait_until("three managers, one leader", std::time::Duration::from_secs(30), || {
            let seen = managers_seen_by(d)?;
            let leaders = seen.iter().filter(|(_, s)| s == "Leader").count();
            if seen.len() == 3 && leaders == 1 {
                Ok(())
            } else {
                Err(format!("{seen:?}"))
            }
        });
    }
    // Created through a follower (forwarded to the leader), read through each manager (after its read
    // barrier, so at once).
    let body = json!({"Name": "pw", "Data": b64(PW.as_bytes())}).to_string();
    let r = http::request(c.socket(), "POST", "/v1.47/secrets/create", Some(&body)).unwrap();
    assert_eq!(r.status, 201, "{}", r.body);
    let conf = json!({"Name": "conf", "Data": b64(b"x=1")}).to_string();
    assert_eq!(http::request(b.socket(), "POST", "/v1.47/configs/create", Some(&conf)).unwrap().status, 201);
    let on_a = sorted_by_id(&a, "/v1.47/secrets").unwrap();
    assert_eq!(on_a.len(), 1);
    for d in [&b, &c] {
        assert_eq!(sorted_by_id(d, "/v1.47/secrets").unwrap(), on_a);
        assert_eq!(d.get("/v1.47/configs/conf")["Spec"]["Data"], json!(b64(b"x=1")));
        let s = d.get("/v1.47/secrets/pw");
        assert!(s["Spec"].get("Data").is_none() && !s.to_string().contains(PW), "{s}");
    }
    // Removed through another follower: gone everywhere.
    let r = http::request(b.socket(), "DELETE", "/v1.47/secrets/pw", None).unwrap();
    assert_eq!(r.status, 204, "{}", r.body);
    for d in [&a, &b, &c] {
        assert_eq!(d.get("/v1.47/secrets"), json!([]));
        assert!(!d.log().contains(PW), "a manager logged the secret");
    }
}
