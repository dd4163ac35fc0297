//! The docker CLI against a `shoal daemon`, for the service flags Shoal cannot honour yet: each is refused
//! with the daemon's 400 naming the field (`Error response from daemon: X is not supported yet: ...`) and
//! nothing is created; what Shoal does honour with the same flags' neighbours (bind and tmpfs mounts with
//! their options, a volume with a driver, options and labels, capabilities, ulimits, sysctls, a log driver,
//! `--replicas-max-per-node`) goes through. An older client
//! (`DOCKER_API_VERSION=1.40`) gets the engine's differences by version: MaxReplicas is kept from 1.40 on.

use crate::common;

use common::*;
use shoal_testkit::docker_cli;

#[test]
fn the_docker_cli_gets_a_400_naming_each_field_shoal_cannot_honour() {
    if no_docker_cli() {
        return;
    }
    let d = daemon();
    let create = |name: &str, flags: &[&str]| {
        let mut args = vec!["service", "create", "--detach", "--no-resolve-image", "--name", name];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["busybox", "sleep", "3141"]);
        docker_cli::run(d.socket(), &args)
    };
    for (flags, field) in [
        (&["--isolation", "hyperv"][..], "TaskTemplate.ContainerSpec.Isolation"),
        (&["--credential-spec", "file://spec.json"][..], "TaskTemplate.ContainerSpec.Privileges.CredentialSpec"),
    ] {
        let out = create("refused", flags);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?} accepted");
        assert!(stderr.contains(&format!("{field} is not supported yet")), "{flags:?}: the CLI printed {stderr}");
    }
    assert!(!service_names(&d).iter().any(|n| n == "refused"), "{:?}", service_names(&d));

    // Their honoured neighbours go through.
    let out = create(
        "mounts",
        &[
            "--mount",
            "type=volume,source=v,target=/v,volume-driver=local,volume-opt=type=tmpfs,volume-label=a=b",
            "--mount",
            "type=tmpfs,target=/t",
            "--mount",
            "type=bind,source=/tmp,target=/h,readonly",
            "--mount",
            "type=tmpfs,target=/s,tmpfs-size=1m",
            "--mount",
            "type=bind,source=/tmp,target=/p,bind-propagation=rshared",
            "--cap-add",
            "NET_ADMIN",
            "--cap-drop",
            "CHOWN",
            "--ulimit",
            "nofile=10:20",
            "--sysctl",
            "net.core.somaxconn=1024",
            "--log-driver",
            "syslog",
            "--replicas-max-per-node",
            "2",
        ],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mounts =
        docker(&d, &["service", "inspect", "mounts", "--format", "{{json .Spec.TaskTemplate.ContainerSpec.Mounts}}"]);
    let mounts: serde_json::Value = serde_json::from_str(mounts.trim()).unwrap();
    assert_eq!(mounts.as_array().map(Vec::len), Some(5), "{mounts}");
    assert_eq!(mounts[3]["TmpfsOptions"]["SizeBytes"], 1 << 20, "{mounts}");
    assert_eq!(mounts[4]["BindOptions"]["Propagation"], "rshared", "{mounts}");

    // MaxReplicas from an API 1.40 client is kept (1.40 introduced it; the engine drops it below).
    let mut old = docker_cli::command(
        d.socket(),
        &[
            "service",
            "create",
            "--detach",
            "--no-resolve-image",
            "--name",
            "old",
            "--replicas-max-per-node",
            "3",
            "busybox",
            "sleep",
            "3141",
        ],
    );
    let out = old.env("DOCKER_API_VERSION", "1.40").output().expect("run docker");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let max = docker(&d, &["service", "inspect", "old", "--format", "{{.Spec.TaskTemplate.Placement.MaxReplicas}}"]);
    assert_eq!(max.trim(), "3");
}
