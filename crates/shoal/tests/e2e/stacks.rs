//! `docker stack deploy / ls / services / ps / rm` (the stock docker CLI) against `shoal daemon`, with compose
//! files written as people write them: what the CLI makes of the file (networks, secrets, configs, services
//! labelled `com.docker.stack.namespace`) lands in Shoal as in Docker, a redeploy updates only what changed,
//! `--prune` removes the services no longer in the file, `stack rm` removes everything the stack made and
//! nothing else, and a key Shoal cannot honour fails the deploy with a message naming it.
//!
//! Every service of a stack is attached to an overlay network (the stack's `default` at least); these daemons
//! share the host's network namespace without a data plane, so such tasks stay pending here and these tests
//! check what the API holds and shows. `stack_app.rs` runs a stack's app on nodes with their data plane.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(30);

/// A folder for a stack's compose file and the files it names, removed on drop.
fn stack_dir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("stack-").tempdir_in(shoal_testkit::scratch_dir()).expect("tempdir")
}

fn out_text(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn deploy(d: &DaemonProcess, compose: &Path, extra: &[&str]) -> String {
    let file = compose.to_str().unwrap();
    let mut args = vec!["stack", "deploy", "-c", file];
    args.extend_from_slice(extra);
    args.push("app");
    docker(d, &args)
}

fn lines(d: &DaemonProcess, args: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = docker(d, args).lines().map(str::to_string).filter(|l| !l.is_empty()).collect();
    v.sort();
    v
}

fn inspect(d: &DaemonProcess, kind: &str, name: &str) -> Value {
    let out = docker(d, &[kind, "inspect", name]);
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{kind} inspect {name}: {e}: {out}"));
    v[0].clone()
}

const COMPOSE: &str = r#"
version: "3.8"
services:
  web:
    image: busybox
    command: ["httpd", "-f", "-p", "80"]
    environment:
      - GREETING=hello
    env_file: web.env
    labels:
      tier: front
    ports:
      - "8080:80"
      - target: 9000
        published: 9000
        protocol: tcp
        mode: host
    deploy:
      replicas: 2
      labels:
        owner: team-a
      placement:
        constraints: [node.role == manager]
        preferences:
          - spread: node.labels.zone
      resources:
        limits: {cpus: "0.5", memory: 64M}
        reservations: {cpus: "0.1", memory: 16M}
      restart_policy: {condition: on-failure, delay: 5s, max_attempts: 3, window: 60s}
      update_config: {parallelism: 1, delay: 1s, order: start-first, failure_action: rollback}
      rollback_config: {parallelism: 1, order: stop-first}
    healthcheck:
      test: ["CMD", "true"]
      interval: 10s
      timeout: 2s
      retries: 3
    secrets:
      - source: db_password
        target: db_pw
    configs: [site]
    networks:
      appnet:
        aliases: [frontend]
    volumes:
      - type: tmpfs
        target: /cache
      - type: bind
        source: /tmp
        target: /hosttmp
  worker:
    image: busybox
    command: sleep 1000
    deploy:
      mode: global
  migrate:
    image: busybox
    entrypoint: ["sh", "-c"]
    command: ["echo migrated"]
    deploy:
      mode: replicated-job
secrets:
  db_password:
    file: ./db_password.txt
configs:
  site:
    file: ./site.conf
networks:
  appnet:
    driver: overlay
    attachable: true
"#;

#[test]
fn a_stack_deploys_redeploys_prunes_and_is_removed_through_the_docker_cli() {
    if no_docker_cli() {
        return;
    }
    let d = daemon();
    let dir = stack_dir();
    std::fs::write(dir.path().join("db_password.txt"), "s3cret\n").unwrap();
    std::fs::write(dir.path().join("site.conf"), "listen 80\n").unwrap();
    std::fs::write(dir.path().join("web.env"), "FROM_FILE=yes\n").unwrap();
    let compose = dir.path().join("compose.yml");
    std::fs::write(&compose, COMPOSE).unwrap();

    // What exists before the stack stays after it.
    docker(&d, &["network", "create", "-d", "overlay", "keepnet"]);
    docker_cli::run_with_stdin(d.socket(), &["secret", "create", "keep", "-"], "k");
    docker(&d, &["service", "create", "--name", "keep", "--detach", "busybox", "sleep", "1000"]);

    let out = deploy(&d, &compose, &[]);
    assert!(out.contains("Creating service app_web"), "{out}");
    assert_eq!(lines(&d, &["stack", "ls", "--format", "{{.Name}} {{.Services}}"]), ["app 3"]);
    assert_eq!(
        lines(&d, &["stack", "services", "app", "--format", "{{.Name}} {{.Mode}}"]),
        ["app_migrate replicated job", "app_web replicated", "app_worker global"]
    );
    assert_eq!(
        lines(&d, &["network", "ls", "--filter", "label=com.docker.stack.namespace=app", "--format", "{{.Name}}"]),
        ["app_appnet", "app_default"]
    );

    // The file's keys, as the CLI sends them, are all in the spec.
    let web = inspect(&d, "service", "app_web");
    let spec = &web["Spec"];
    let c = &spec["TaskTemplate"]["ContainerSpec"];
    assert_eq!(spec["Labels"]["com.docker.stack.namespace"], "app");
    assert_eq!(spec["Labels"]["owner"], "team-a");
    assert_eq!(c["Labels"]["tier"], "front");
    assert_eq!(c["Args"], serde_json::json!(["httpd", "-f", "-p", "80"]));
    let env: Vec<&str> = c["Env"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(env.contains(&"GREETING=hello") && env.contains(&"FROM_FILE=yes"), "{env:?}");
    assert_eq!(c["Secrets"][0]["SecretName"], "app_db_password");
    assert_eq!(c["Secrets"][0]["File"]["Name"], "db_pw");
    assert_eq!(c["Configs"][0]["ConfigName"], "app_site");
    assert_eq!(c["Healthcheck"]["Retries"], 3);
    assert_eq!(c["Mounts"][0]["Type"], "tmpfs");
    assert_eq!(c["Mounts"][1]["Source"], "/tmp");
    assert_eq!(spec["TaskTemplate"]["Resources"]["Limits"]["MemoryBytes"], 64 << 20);
    assert_eq!(spec["TaskTemplate"]["RestartPolicy"]["MaxAttempts"], 3);
    assert_eq!(spec["TaskTemplate"]["Placement"]["Preferences"][0]["Spread"]["SpreadDescriptor"], "node.labels.zone");
    assert_eq!(spec["UpdateConfig"]["Order"], "start-first");
    assert_eq!(spec["UpdateConfig"]["FailureAction"], "rollback");
    assert_eq!(spec["RollbackConfig"]["Order"], "stop-first");
    let appnet = inspect(&d, "network", "app_appnet");
    assert_eq!(appnet["Attachable"], true);
    let net = &spec["TaskTemplate"]["Networks"][0];
    assert_eq!(net["Target"], appnet["Id"]);
    assert!(net["Aliases"].as_array().unwrap().iter().any(|a| a == "frontend"), "{net}");
    let ports: Vec<(u64, &str)> = spec["EndpointSpec"]["Ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["PublishedPort"].as_u64().unwrap(), p["PublishMode"].as_str().unwrap()))
        .collect();
    assert_eq!(ports, [(8080, "ingress"), (9000, "host")]);
    assert_eq!(inspect(&d, "secret", "app_db_password")["Spec"]["Labels"]["com.docker.stack.namespace"], "app");

    // `stack ps` finds the stack's tasks by its services' label.
    let tasks = wait_until("the stack's tasks listed by `docker stack ps`", WAIT, || {
        let names = lines(&d, &["stack", "ps", "app", "--format", "{{.Name}}"]);
        if names.iter().filter(|n| n.starts_with("app_web.")).count() == 2
            && names.iter().any(|n| n.starts_with("app_worker."))
            && names.iter().any(|n| n.starts_with("app_migrate."))
        {
            Ok(names)
        } else {
            Err(format!("{names:?}"))
        }
    });
    assert!(tasks.iter().all(|n| n.starts_with("app_")), "{tasks:?}");

    // A redeploy with one environment variable changed updates only that service. (The CLI sends an update
    // for every service of the file; one whose spec is unchanged rolls nothing. A job's update runs it again,
    // as in Docker, so the job is left out here.)
    let task_ids = |service: &str| -> Vec<String> {
        let mut v: Vec<String> = tasks_of(&d, service).iter().map(|t| t["ID"].as_str().unwrap().to_string()).collect();
        v.sort();
        v
    };
    let worker_tasks = task_ids("app_worker");
    let worker_spec = inspect(&d, "service", "app_worker")["Spec"].clone();
    std::fs::write(&compose, COMPOSE.replace("GREETING=hello", "GREETING=bonjour")).unwrap();
    deploy(&d, &compose, &[]);
    let env = inspect(&d, "service", "app_web")["Spec"]["TaskTemplate"]["ContainerSpec"]["Env"].clone();
    assert!(env.as_array().unwrap().iter().any(|e| e == "GREETING=bonjour"), "{env}");
    wait_until("app_web's update started", WAIT, || {
        let s = inspect(&d, "service", "app_web");
        if s["UpdateStatus"]["State"].is_string() {
            Ok(())
        } else {
            Err(format!("{}", s["UpdateStatus"]))
        }
    });
    let worker = inspect(&d, "service", "app_worker");
    assert_eq!(worker["Spec"], worker_spec);
    assert!(worker["UpdateStatus"].is_null(), "app_worker rolled: {}", worker["UpdateStatus"]);
    assert_eq!(task_ids("app_worker"), worker_tasks);

    // --prune removes a service no longer in the file; --with-registry-auth and --resolve-image behave as
    // against an engine without registry access.
    let without_worker = COMPOSE
        .replace("GREETING=hello", "GREETING=bonjour")
        .replace("  worker:\n    image: busybox\n    command: sleep 1000\n    deploy:\n      mode: global\n", "");
    std::fs::write(&compose, without_worker).unwrap();
    deploy(&d, &compose, &["--prune", "--with-registry-auth", "--resolve-image", "always"]);
    assert_eq!(lines(&d, &["stack", "services", "app", "--format", "{{.Name}}"]), ["app_migrate", "app_web"]);

    // `stack rm` removes the stack's services, networks, secrets and configs, and nothing else.
    let out = docker_cli::run(d.socket(), &["stack", "rm", "app"]);
    assert!(out.status.success(), "stack rm: {}", out_text(&out));
    wait_until("the stack removed", WAIT, || {
        let left = (
            lines(&d, &["service", "ls", "--format", "{{.Name}}"]),
            lines(&d, &["network", "ls", "--format", "{{.Name}}"]),
            lines(&d, &["secret", "ls", "--format", "{{.Name}}"]),
            lines(&d, &["config", "ls", "--format", "{{.Name}}"]),
        );
        if left.0 == ["keep"] && left.1 == ["ingress", "keepnet"] && left.2 == ["keep"] && left.3.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    });
    assert_eq!(lines(&d, &["stack", "ls", "--format", "{{.Name}}"]), Vec::<String>::new());
}

#[test]
fn a_compose_key_shoal_cannot_honour_fails_the_deploy_naming_it() {
    if no_docker_cli() {
        return;
    }
    let d = daemon();
    let dir = stack_dir();
    let compose = dir.path().join("compose.yml");
    // `b` sets a credential spec, which only Windows containers have.
    std::fs::write(
        &compose,
        "version: \"3.8\"\nservices:\n  a:\n    image: busybox\n    command: sleep 1000\n  b:\n    image: \
         busybox\n    command: sleep 1000\n    credential_spec:\n      file: spec.json\n",
    )
    .unwrap();
    let out = docker_cli::run(d.socket(), &["stack", "deploy", "-c", compose.to_str().unwrap(), "app"]);
    let text = out_text(&out);
    assert!(!out.status.success(), "deploy succeeded: {text}");
    assert!(text.contains("Privileges.CredentialSpec is not supported yet"), "{text}");
    // `b` was never made; what the CLI made before the refusal stays, as against an engine that refuses (the
    // CLI walks the file's services in map order, so `a` may come before or after `b`).
    let names = lines(&d, &["service", "ls", "--format", "{{.Name}}"]);
    assert!(names.is_empty() || names == ["app_a"], "{names:?}");
}
