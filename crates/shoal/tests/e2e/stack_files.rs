//! Issue 32's acceptance: compose files of the kind people publish deploy unchanged with `docker stack
//! deploy` (the stock docker CLI) and run as they say. The files are `tests/e2e/stacks/*.yml`, deployed from the
//! repository as they are: a web tier (json-file logging with rotation options, a health check, a hostname
//! templated per node and slot, two replicas, an update config of parallelism 2 with a delay), a cache (added
//! and dropped capabilities, net sysctls, nofile and nproc ulimits, a tmpfs with a size) and a database (a
//! named volume of the local driver with driver options and labels, an init process, the local log driver).
//!
//! Three docker-executor nodes, each in its own network namespace (the stacks' overlay networks need the data
//! plane), sharing this machine's Docker Engine. Every running container is checked with `docker inspect` and
//! inside (/proc, `hostname`, `ulimit`), through the one helper of `common/container_checks.rs`; the CLI must
//! not print "Ignoring unsupported options" for any of the files. Needs root, the engine and the locally
//! built test image (the files name it); without them the test says so and passes. The stacks and their
//! volumes are removed when it ends.

use crate::common;

use std::path::PathBuf;

use common::container_checks::{check_container, container_of_task, Check};
use common::netcluster::Cluster;
use common::*;
use serde_json::{json, Value};
use shoal_testkit::docker_engine::{self, engine, engine_ok};

/// One stack file and what its services must show.
struct StackFile {
    file: &'static str,
    stack: &'static str,
    services: Vec<ServiceExpect>,
}

/// One service of a stack: its running replicas, its spec (pointers into `docker service inspect`'s
/// `Spec`), and the checks of each running container (made per task: its node's hostname and its slot).
struct ServiceExpect {
    name: &'static str,
    replicas: usize,
    spec: Vec<(&'static str, Value)>,
    checks: fn(node_hostname: &str, slot: u64) -> Vec<Check>,
}

/// Removes the engine volumes the stacks made, after the cluster (declared first, dropped last).
struct Volumes(Vec<String>);

impl Drop for Volumes {
    fn drop(&mut self) {
        for v in &self.0 {
            let _ = engine(&["volume", "rm", "-f", v]);
        }
    }
}

fn stack_path(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/stacks").join(file)
}

fn web_checks(node: &str, slot: u64) -> Vec<Check> {
    vec![
        Check::Inspect(
            "/HostConfig/LogConfig",
            json!({"Type": "json-file", "Config": {"max-size": "10m", "max-file": "3"}}),
        ),
        Check::Inspect(
            "/Config/Healthcheck/Test",
            json!(["CMD-SHELL", "wget -q -O- http://127.0.0.1:8080/ || exit 1"]),
        ),
        // RUNNING only once healthy (the docker executor waits for it).
        Check::Inspect("/State/Health/Status", json!("healthy")),
        Check::Exec("hostname", format!("{node}-{slot}")),
        Check::Logs(Ok("web-started")),
    ]
}

fn cache_checks(_: &str, _: u64) -> Vec<Check> {
    vec![
        Check::Inspect("/HostConfig/CapAdd", json!(["CAP_NET_ADMIN", "CAP_SYS_NICE"])),
        Check::Inspect("/HostConfig/CapDrop", json!(["CAP_MKNOD"])),
        Check::Inspect("/HostConfig/Sysctls", json!({"net.core.somaxconn": "1024", "net.ipv4.tcp_syncookies": "0"})),
        Check::Exec("cat /proc/sys/net/core/somaxconn /proc/sys/net/ipv4/tcp_syncookies", "1024\n0".into()),
        // The task's own process (PID 1): processes, then open files, soft and hard (the order of /proc/1/limits).
        Check::Exec(
            "awk '/open files/ {print $4, $5} /Max processes/ {print $3, $4}' /proc/1/limits",
            "65535 65535\n10000 20000".into(),
        ),
        // NET_ADMIN (12) and SYS_NICE (23) in, MKNOD (27) out: 0x801000 set, 0x8000000 clear.
        Check::Exec(
            "m=$(grep CapEff /proc/1/status | cut -f2); echo $(( 0x$m & 0x801000 )) $(( 0x$m & 0x8000000 ))",
            format!("{} 0", 0x80_1000),
        ),
        Check::Exec("grep ' /data ' /proc/mounts", "size=65536k".into()),
        Check::Logs(Ok("cache-ready")),
    ]
}

fn db_checks(_: &str, slot: u64) -> Vec<Check> {
    vec![
        Check::Inspect("/HostConfig/Init", json!(true)),
        Check::Inspect("/HostConfig/LogConfig", json!({"Type": "local", "Config": {"max-size": "5m"}})),
        Check::Exec("cat /proc/1/comm", "init".into()),
        Check::Exec("hostname", format!("db-{slot}")),
        Check::Exec("grep ' /var/lib/db ' /proc/mounts", "size=32768k".into()),
        Check::Exec("echo kept > $PGDATA/file && cat /var/lib/db/file", "kept".into()),
        Check::Logs(Ok("db-ready")),
    ]
}

#[test]
fn published_style_stack_files_deploy_unchanged_and_run_as_they_say() {
    let Some(_image) = docker_engine::test_image_or_skip() else { return };
    let files = vec![
        StackFile {
            file: "web.yml",
            stack: "sfweb",
            services: vec![ServiceExpect {
                name: "web",
                replicas: 2,
                spec: vec![
                    ("/UpdateConfig/Parallelism", json!(2)),
                    ("/UpdateConfig/Delay", json!(10_000_000_000u64)),
                    ("/TaskTemplate/LogDriver/Name", json!("json-file")),
                    ("/TaskTemplate/ContainerSpec/Hostname", json!("{{.Node.Hostname}}-{{.Task.Slot}}")),
                ],
                checks: web_checks,
            }],
        },
        StackFile {
            file: "cache.yml",
            stack: "sfcache",
            services: vec![ServiceExpect {
                name: "cache",
                replicas: 1,
                spec: vec![
                    ("/TaskTemplate/ContainerSpec/Ulimits/0", json!({"Name": "nofile", "Hard": 20000, "Soft": 10000})),
                    ("/TaskTemplate/ContainerSpec/Mounts/0/TmpfsOptions/SizeBytes", json!(67108864)),
                ],
                checks: cache_checks,
            }],
        },
        StackFile {
            file: "db.yml",
            stack: "sfdb",
            services: vec![ServiceExpect {
                name: "db",
                replicas: 1,
                spec: vec![
                    ("/UpdateConfig/Parallelism", json!(2)),
                    ("/UpdateConfig/Delay", json!(5_000_000_000u64)),
                    ("/TaskTemplate/ContainerSpec/Mounts/0/VolumeOptions/DriverConfig/Options/type", json!("tmpfs")),
                ],
                checks: db_checks,
            }],
        },
    ];
    let volumes = Volumes(vec!["sfdb_dbdata".into()]);
    for v in &volumes.0 {
        let _ = engine(&["volume", "rm", "-f", v]);
    }
    let mut c = Cluster::start_docker("stkf");
    for f in &files {
        let path = stack_path(f.file);
        let out = docker_cli::run(c.manager().socket(), &["stack", "deploy", "-c", path.to_str().unwrap(), f.stack]);
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{}: {text}", f.file);
        assert!(!text.contains("Ignoring unsupported options"), "{}: the CLI dropped keys: {text}", f.file);
    }
    for f in &files {
        for s in &f.services {
            let service = format!("{}_{}", f.stack, s.name);
            let spec = c.docker(&["service", "inspect", &service, "--format", "{{json .Spec}}"]);
            let spec: Value = serde_json::from_str(spec.trim()).unwrap();
            for (pointer, want) in &s.spec {
                assert_eq!(spec.pointer(pointer), Some(want), "{service}: {pointer} of {spec}");
            }
            for t in c.running(&service, s.replicas) {
                let node = t["NodeID"].as_str().unwrap();
                let hostname = c.manager().get(&format!("/v1.47/nodes/{node}"))["Description"]["Hostname"]
                    .as_str()
                    .unwrap()
                    .to_string();
                let slot = t["Slot"].as_u64().unwrap();
                let container = container_of_task(t["ID"].as_str().unwrap());
                let what = format!("{} {service}.{slot}", f.file);
                check_container(c.manager(), &what, &service, &container, &(s.checks)(&hostname, slot));
            }
        }
    }
    // The database's volume, on the engine, as the file declares it.
    let v: Value = serde_json::from_str(&engine_ok(&["volume", "inspect", "sfdb_dbdata"])).unwrap();
    assert_eq!(v[0]["Options"], json!({"type": "tmpfs", "device": "tmpfs", "o": "size=32m,uid=999"}), "{v}");
    assert_eq!(v[0]["Labels"]["backup"], "nightly", "{v}");

    for f in &files {
        c.docker(&["stack", "rm", f.stack]);
    }
    drop(c);
    drop(volumes);
}
