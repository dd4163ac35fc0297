//! The container settings of issue 32's "refused today, to honour" list, driven through the stock docker CLI
//! (`--cap-add`, `--cap-drop`, `--sysctl`, `--ulimit`, `--init`, `--log-driver`/`--log-opt`, `--mount` with
//! bind and tmpfs options) and the Engine API where the CLI has no flag (`OomScoreAdj`, `Privileges`: no new
//! privileges, seccomp unconfined or a custom profile, AppArmor disabled, SELinux labels; the cluster's
//! `TaskDefaults.LogDriver`), on the docker executor. Each case is checked on the running container: `docker
//! inspect` (HostConfig) and, where the kernel shows it, /proc inside (CapEff, the sysctl, the limits, the
//! OOM score, NoNewPrivs and Seccomp of PID 1, the tmpfs's size and mode in /proc/mounts, a submount made on
//! the node after the start reaching the container through rslave propagation); `docker service logs` reads
//! json-file and local back and says why for `none`. What this engine (API 1.41) is too old for
//! (`CreateMountpoint` 1.42, tmpfs `Options` 1.46) rejects the task naming the engine's version.
//!
//! One daemon runs every case at once; `check` is the one helper every case goes through. Needs root, the
//! engine and the locally built test image; without them the test says so and passes. The containers and the
//! node's mounts it made are removed when it ends.

use crate::common;

use std::time::Duration;

use common::container_checks::{check_container, container_of_task, Check};
use common::*;
use serde_json::{json, Value};
use shoal_testkit::docker_engine::{self, engine_ok, EngineDaemon};

const WAIT: Duration = Duration::from_secs(90);

/// How a case's service is made.
enum Create {
    /// `docker service create` with these flags before the image.
    Cli(Vec<String>),
    /// `POST /services/create` with these members merged into the container spec, and this task template.
    Api { container: Value, template: Value },
}

/// What is checked once the case's task runs, or the error that rejects it.
enum Expect {
    Runs(Vec<Check>),
    Rejected(String),
}

struct Case {
    name: &'static str,
    create: Create,
    expect: Expect,
}

fn flags(v: &[&str]) -> Create {
    Create::Cli(v.iter().map(|s| s.to_string()).collect())
}

fn api(container: Value) -> Create {
    Create::Api { container, template: json!({}) }
}

/// Unmounts and removes the node-side folders the bind cases use when the test ends.
struct NodeMounts(std::path::PathBuf);

impl Drop for NodeMounts {
    fn drop(&mut self) {
        let sub = self.0.join("shared/sub");
        let _ = std::process::Command::new("umount").arg(&sub).status();
        let _ = std::process::Command::new("umount").arg(self.0.join("shared")).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A mask of /proc/<pid>/status (`CapEff:\t00000000a80435fb`).
fn status_mask(status: &str, key: &str) -> u64 {
    let v = status.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(':')).unwrap_or_else(|| panic!("{status}"));
    u64::from_str_radix(v.trim(), 16).unwrap()
}

fn create(d: &EngineDaemon, image: &str, case: &Case) {
    let cmd = format!("echo hello-from-{}; exec sleep 100000", case.name);
    match &case.create {
        Create::Cli(extra) => {
            let mut args: Vec<&str> =
                vec!["service", "create", "--detach", "--name", case.name, "--restart-condition", "none"];
            args.extend(extra.iter().map(String::as_str));
            args.extend([image, "sh", "-c", &cmd]);
            docker(d, &args);
        }
        Create::Api { container, template } => {
            let mut c = json!({"Image": image, "Command": ["sh", "-c", &cmd]});
            for (k, v) in container.as_object().unwrap() {
                c[k] = v.clone();
            }
            let mut t = json!({"ContainerSpec": c, "RestartPolicy": {"Condition": "none"}});
            for (k, v) in template.as_object().unwrap() {
                t[k] = v.clone();
            }
            let spec = json!({"Name": case.name, "TaskTemplate": t});
            let r = shoal_testkit::http::request(d.socket(), "POST", "/v1.47/services/create", Some(&spec.to_string()))
                .unwrap();
            assert_eq!(r.status, 201, "{}: {}", case.name, r.body);
        }
    }
}

/// Waits for `case`'s task to run (or be rejected) and checks it.
fn check(d: &EngineDaemon, case: &Case) {
    let name = case.name;
    match &case.expect {
        Expect::Rejected(want) => {
            let err = wait_until(&format!("{name}'s task rejected"), WAIT, || {
                let tasks = tasks_of(d, name);
                match tasks.iter().find(|t| state(t) == "rejected") {
                    Some(t) => Ok(t["Status"]["Err"].as_str().unwrap_or_default().to_string()),
                    None => Err(format!("{tasks:?}")),
                }
            });
            assert!(err.contains(want.as_str()), "{name}: {err}");
        }
        Expect::Runs(checks) => {
            let t = wait_until(&format!("{name}'s task running"), WAIT, || {
                let tasks = tasks_of(d, name);
                tasks.iter().find(|t| state(t) == "running").cloned().ok_or_else(|| format!("{tasks:?}"))
            });
            let container = container_of_task(t["ID"].as_str().unwrap());
            check_container(d, name, name, &container, checks);
        }
    }
}

#[test]
fn container_settings_reach_the_running_container_as_docker_applies_them() {
    let Some(image) = docker_engine::test_image_or_skip() else { return };
    let d = EngineDaemon::start(&shoal_bin());
    let api_version = engine_ok(&["version", "--format", "{{.Server.APIVersion}}"]).trim().to_string();
    let minor: u32 = api_version.split('.').nth(1).and_then(|m| m.parse().ok()).unwrap_or(0);

    // Node-side folders: a plain one, and one that is a shared mount of its own (rslave needs a shared source).
    let root = tempfile::Builder::new().prefix("shoal-fields-").tempdir_in(shoal_testkit::scratch_dir()).unwrap();
    let mounts = NodeMounts(root.keep());
    let shared = mounts.0.join("shared");
    std::fs::create_dir_all(shared.join("sub")).unwrap();
    std::fs::create_dir_all(mounts.0.join("plain")).unwrap();
    for args in [
        vec!["--bind", shared.to_str().unwrap(), shared.to_str().unwrap()],
        vec!["--make-shared", shared.to_str().unwrap()],
    ] {
        let st = std::process::Command::new("mount").args(&args).status().unwrap();
        assert!(st.success(), "mount {args:?}");
    }

    // The cluster's default log driver, for tasks whose spec names none (the docker CLI has no flag for it).
    let swarm = d.get("/v1.47/swarm");
    let mut spec = swarm["Spec"].clone();
    spec["TaskDefaults"] = json!({"LogDriver": {"Name": "local", "Options": {"max-size": "2m"}}});
    let version = swarm["Version"]["Index"].as_u64().unwrap();
    let r = shoal_testkit::http::request(
        d.socket(),
        "POST",
        &format!("/v1.47/swarm/update?version={version}"),
        Some(&spec.to_string()),
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);

    let profile =
        r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["mkdir","mkdirat"],"action":"SCMP_ACT_ERRNO"}]}"#;
    let profile_b64 = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(profile)
    };
    let shared_bind = format!("type=bind,source={},target=/shared,bind-propagation=rslave", shared.display());
    let plain = mounts.0.join("plain").display().to_string();
    let cases = vec![
        Case {
            name: "caps",
            create: flags(&["--cap-add", "NET_ADMIN", "--cap-drop", "CHOWN"]),
            expect: Expect::Runs(vec![
                // The CLI sends the names with their CAP_ prefix.
                Check::Inspect("/HostConfig/CapAdd", json!(["CAP_NET_ADMIN"])),
                Check::Inspect("/HostConfig/CapDrop", json!(["CAP_CHOWN"])),
                // Checked below from /proc/1/status: NET_ADMIN (12) in, CHOWN (0) out.
                Check::Exec("grep CapEff /proc/1/status", "CapEff".into()),
            ]),
        },
        Case {
            name: "sysctl",
            create: flags(&["--sysctl", "net.core.somaxconn=1234"]),
            expect: Expect::Runs(vec![
                Check::Inspect("/HostConfig/Sysctls", json!({"net.core.somaxconn": "1234"})),
                Check::Exec("cat /proc/sys/net/core/somaxconn", "1234".into()),
            ]),
        },
        Case {
            name: "ulimit",
            create: flags(&["--ulimit", "nofile=1111:2222"]),
            expect: Expect::Runs(vec![
                Check::Inspect("/HostConfig/Ulimits", json!([{"Name": "nofile", "Hard": 2222, "Soft": 1111}])),
                // The task's own process (PID 1), not a shell `docker exec` starts beside it: an exec'd
                // process's soft limit is the engine's doing, and once read 2222 in a loaded full run.
                Check::Exec("awk '/open files/ {print $4, $5}' /proc/1/limits", "1111 2222".into()),
            ]),
        },
        Case {
            name: "oomscore",
            create: api(json!({"OomScoreAdj": 345})),
            expect: Expect::Runs(vec![
                Check::Inspect("/HostConfig/OomScoreAdj", json!(345)),
                Check::Exec("cat /proc/1/oom_score_adj", "345".into()),
            ]),
        },
        Case {
            name: "init",
            create: flags(&["--init"]),
            expect: Expect::Runs(vec![
                Check::Inspect("/HostConfig/Init", json!(true)),
                Check::Exec("cat /proc/1/comm", "init".into()),
            ]),
        },
        Case {
            name: "nonewprivs",
            create: api(json!({"Privileges": {
                "NoNewPrivileges": true,
                "Seccomp": {"Mode": "unconfined"},
                "AppArmor": {"Mode": "disabled"},
                "SELinuxContext": {"User": "system_u", "Level": "s0"},
            }})),
            expect: Expect::Runs(vec![
                Check::Inspect(
                    "/HostConfig/SecurityOpt",
                    json!([
                        "label=user:system_u",
                        "label=level:s0",
                        "seccomp=unconfined",
                        "apparmor=unconfined",
                        "no-new-privileges=true"
                    ]),
                ),
                Check::Exec("grep -E '^(NoNewPrivs|Seccomp):' /proc/1/status", "NoNewPrivs:\t1\nSeccomp:\t0".into()),
            ]),
        },
        Case {
            name: "seccomp",
            create: api(json!({"Privileges": {"Seccomp": {"Mode": "custom", "Profile": profile_b64}}})),
            expect: Expect::Runs(vec![
                Check::Inspect("/HostConfig/SecurityOpt", json!([format!("seccomp={profile}")])),
                Check::Exec("grep '^Seccomp:' /proc/1/status", "Seccomp:\t2".into()),
                Check::Exec("mkdir /tmp/denied 2>&1; echo rc=$?", "rc=1".into()),
            ]),
        },
        Case {
            name: "logjson",
            create: flags(&["--log-driver", "json-file", "--log-opt", "max-size=1m", "--log-opt", "max-file=2"]),
            expect: Expect::Runs(vec![
                Check::Inspect(
                    "/HostConfig/LogConfig",
                    json!({"Type": "json-file", "Config": {"max-size": "1m", "max-file": "2"}}),
                ),
                Check::Logs(Ok("hello-from-logjson")),
            ]),
        },
        Case {
            name: "logdefault",
            create: flags(&[]),
            expect: Expect::Runs(vec![
                Check::Inspect("/HostConfig/LogConfig", json!({"Type": "local", "Config": {"max-size": "2m"}})),
                Check::Logs(Ok("hello-from-logdefault")),
            ]),
        },
        Case {
            name: "lognone",
            create: flags(&["--log-driver", "none"]),
            expect: Expect::Runs(vec![
                Check::Inspect("/HostConfig/LogConfig/Type", json!("none")),
                Check::Logs(Err("configured logging driver does not support reading")),
            ]),
        },
        Case {
            name: "mounts",
            create: flags(&[
                "--mount",
                &shared_bind,
                "--mount",
                &format!("type=bind,source={plain},target=/plain,bind-nonrecursive=true,readonly,consistency=cached"),
                "--mount",
                "type=tmpfs,target=/scratch,tmpfs-size=2097152,tmpfs-mode=1770",
            ]),
            expect: Expect::Runs(vec![
                Check::Inspect("/HostConfig/Mounts/0/BindOptions", json!({"Propagation": "rslave"})),
                Check::Inspect(
                    "/HostConfig/Mounts/1/BindOptions",
                    json!({"Propagation": "rprivate", "NonRecursive": true}),
                ),
                // A compose file's `:cached`: the engine keeps it and, on Linux, applies nothing for it.
                Check::Inspect("/HostConfig/Mounts/1/Consistency", json!("cached")),
                Check::Inspect("/HostConfig/Mounts/2/TmpfsOptions", json!({"SizeBytes": 2097152, "Mode": 1016})),
                Check::Exec("grep ' /scratch ' /proc/mounts", "size=2048k,mode=1770".into()),
            ]),
        },
        Case {
            name: "mountpoint",
            create: api(json!({"Mounts": [{
                "Type": "bind", "Source": format!("{plain}/missing"), "Target": "/m",
                "BindOptions": {"CreateMountpoint": true},
            }]})),
            expect: Expect::Rejected(format!(
                "Mounts[0].BindOptions.CreateMountpoint needs Docker Engine API 1.42 or later; this node's engine \
                 speaks API {api_version}"
            )),
        },
        Case {
            name: "tmpfsopts",
            create: api(json!({"Mounts": [
                {"Type": "tmpfs", "Target": "/t", "TmpfsOptions": {"Options": [["noexec"]]}}
            ]})),
            expect: Expect::Rejected(format!(
                "Mounts[0].TmpfsOptions.Options needs Docker Engine API 1.46 or later; this node's engine speaks API \
                 {api_version}"
            )),
        },
    ];
    let cases: Vec<Case> = cases
        .into_iter()
        .filter(|c| match c.name {
            "mountpoint" => minor < 42,
            "tmpfsopts" => minor < 46,
            _ => true,
        })
        .collect();
    for case in &cases {
        create(&d, image, case);
    }
    for case in &cases {
        check(&d, case);
    }

    // The capabilities, bit by bit, and the service's spec shown back as sent.
    let caps = docker_engine::running_with_label(d.node_id(), "com.docker.swarm.service.name", "caps");
    let status = engine_ok(&["exec", &caps[0], "cat", "/proc/1/status"]);
    let eff = status_mask(&status, "CapEff");
    assert!(eff & (1 << 12) != 0 && eff & 1 == 0, "NET_ADMIN in, CHOWN out: {eff:x}");
    let spec = docker(&d, &["service", "inspect", "caps", "--format", "{{json .Spec.TaskTemplate.ContainerSpec}}"]);
    let spec: Value = serde_json::from_str(spec.trim()).unwrap();
    assert_eq!((&spec["CapabilityAdd"], &spec["CapabilityDrop"]), (&json!(["CAP_NET_ADMIN"]), &json!(["CAP_CHOWN"])));

    // rslave: a mount made on the node under the shared source after the start reaches the container.
    let sub = shared.join("sub");
    let st =
        std::process::Command::new("mount").args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"]).arg(&sub).status().unwrap();
    assert!(st.success());
    let m = docker_engine::running_with_label(d.node_id(), "com.docker.swarm.service.name", "mounts");
    wait_until("the node's new submount seen in the container", WAIT, || {
        let out = engine_ok(&["exec", &m[0], "cat", "/proc/mounts"]);
        if out.lines().any(|l| l.split_whitespace().nth(1) == Some("/shared/sub")) {
            Ok(())
        } else {
            Err(out)
        }
    });

    for case in &cases {
        docker(&d, &["service", "rm", case.name]);
    }
    drop(d);
    drop(mounts);
}
