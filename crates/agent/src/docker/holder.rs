//! The network-namespace holder of a docker task on overlay networks: a first container, with network mode
//! `none`, whose namespace the node's data plane plumbs before the task's own container is created with
//! network mode `container:<holder>` (Kubernetes' "pause" sandbox, built here without a registry).
//!
//! Why a holder: the Docker Engine cannot take a namespace path as network mode, and a container's own
//! namespace exists only once its process runs, so the app would run unconnected for a while. The holder's
//! namespace is plumbed first; the app's container joins it when it starts, connected from its first
//! instruction. The holder also carries what Docker only lets the namespace's first container set: the
//! hostname, the resolv.conf (`nameserver 127.0.0.11`, the node's resolver) and the extra hosts, which the
//! task's container then shares.
//!
//! The holder runs `/pause` of the image `HOLDER_IMAGE`: a 129-byte static x86-64 program (written below)
//! that waits for signals forever (`pause(2)` in a loop; as the PID 1 of its namespace it ignores SIGTERM, and
//! is always removed with a kill). The image is loaded into the engine from memory (`POST /images/load` with
//! an archive as `docker save` writes it, every byte fixed, so its ID is the same on every load), once per
//! engine, never pulled. The task's image may contain nothing but the app.
//!
//! Holders are named `shl-netns.<task id>` and carry `LABEL_NODE_ID` (so everything that removes a node's
//! containers removes them) and `LABEL_HOLDER_TASK_ID`, and none of a task's swarm labels (not the task's
//! nor the service's: a holder is not a task's container, and `docker ps --filter
//! label=com.docker.swarm.service.name=web`, as tools that count a service's containers use it, must match
//! only the task containers). Pure but for `ensure_image`.

use std::collections::HashMap;

use bollard::models::{ContainerCreateBody, HostConfig, RestartPolicy, RestartPolicyNameEnum};
use bollard::query_parameters::ImportImageOptionsBuilder;
use bollard::Docker;
use futures::StreamExt;
use shoal_api::Task;

use super::spec;

/// The holder image (its tag changes whenever the program or the tarball does).
pub(crate) const HOLDER_IMAGE: &str = "shoal-netns-holder:1";
/// Longest the engine may take to load the holder image (a 5 KiB tarball).
pub(crate) const IMPORT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// Label: the task whose network namespace a holder keeps.
pub const LABEL_HOLDER_TASK_ID: &str = "com.shoal.netns-holder.task.id";
/// The node's resolver, as every task on a network sees it.
pub(crate) const RESOLVER: &str = "127.0.0.11";

/// The holder's program: a static x86-64 ELF executable, one loadable segment at 0x400000 holding this
/// header and the code at 0x400078: `mov eax, 34` (`pause`), `syscall`, `jmp` back.
pub(crate) const PAUSE_X86_64: [u8; 129] = {
    let mut b = [0u8; 129];
    let ident = [0x7f, b'E', b'L', b'F', 2, 1, 1, 0];
    let mut i = 0;
    while i < ident.len() {
        b[i] = ident[i];
        i += 1;
    }
    // e_type EXEC, e_machine x86-64, e_version 1.
    b[16] = 2;
    b[18] = 0x3e;
    b[20] = 1;
    // e_entry 0x400078.
    b[24] = 0x78;
    b[26] = 0x40;
    // e_phoff 64, e_ehsize 64, e_phentsize 56, e_phnum 1.
    b[32] = 64;
    b[52] = 64;
    b[54] = 56;
    b[56] = 1;
    // Program header: PT_LOAD, flags R+X, offset 0, vaddr = paddr = 0x400000, filesz = memsz = 129, align 4 KiB.
    b[64] = 1;
    b[68] = 5;
    b[82] = 0x40;
    b[90] = 0x40;
    b[96] = 129;
    b[104] = 129;
    b[113] = 0x10;
    let code = [0xb8, 34, 0, 0, 0, 0x0f, 0x05, 0xeb, 0xf7];
    let mut j = 0;
    while j < code.len() {
        b[120 + j] = code[j];
        j += 1;
    }
    b
};

/// Whether this machine can run the holder's program (`Err`: why, for the task's rejection).
pub(crate) fn supported() -> Result<(), String> {
    if std::env::consts::ARCH == "x86_64" {
        Ok(())
    } else {
        Err(format!(
            "the docker executor's network-namespace holder is built for x86_64 only, and this node is {}; run \
             tasks on networks with the process executor here",
            std::env::consts::ARCH
        ))
    }
}

/// A tar archive (ustar) of regular files `(path, mode, data)`, owned by root, dated 1970.
pub(crate) fn tar(files: &[(&str, u32, &[u8])]) -> Vec<u8> {
    fn octal(field: &mut [u8], value: u64) {
        let s = format!("{value:0width$o}", width = field.len() - 1);
        field[..s.len()].copy_from_slice(s.as_bytes());
    }
    let mut out = Vec::new();
    for (name, mode, data) in files {
        assert!(name.len() < 100, "a tar member name of {} bytes", name.len());
        let mut h = [0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        octal(&mut h[100..108], u64::from(*mode));
        octal(&mut h[108..116], 0);
        octal(&mut h[116..124], 0);
        octal(&mut h[124..136], data.len() as u64);
        octal(&mut h[136..148], 0);
        h[156] = b'0';
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].copy_from_slice(b"        ");
        let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
        h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        out.extend_from_slice(&h);
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

/// The holder image as `docker save` writes one (what `POST /images/load` takes): one layer holding
/// `/pause`, a config whose every field is fixed, so the image ID (the config's digest) is the same wherever
/// and however often it is loaded: daemons sharing an engine that load it at once make one image.
pub(crate) fn image_archive() -> Vec<u8> {
    let layer = tar(&[("pause", 0o755, &PAUSE_X86_64)]);
    let layer_id = sha256_hex(&layer);
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {"Cmd": ["/pause"], "Labels": {"com.shoal.netns-holder": "1"}},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_id}")]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "shoal: the network-namespace holder"}],
    })
    .to_string();
    let config_id = sha256_hex(config.as_bytes());
    let manifest = serde_json::json!([{
        "Config": format!("{config_id}.json"),
        "RepoTags": [HOLDER_IMAGE],
        "Layers": [format!("{layer_id}/layer.tar")],
    }])
    .to_string();
    tar(&[
        (&format!("{layer_id}/layer.tar"), 0o644, &layer),
        (&format!("{config_id}.json"), 0o644, config.as_bytes()),
        ("manifest.json", 0o644, manifest.as_bytes()),
    ])
}

/// Loads `HOLDER_IMAGE` into the engine unless it has it.
pub(crate) async fn ensure_image(docker: &Docker) -> Result<(), String> {
    match docker.inspect_image(HOLDER_IMAGE).await {
        Ok(_) => return Ok(()),
        Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {}
        Err(e) => return Err(format!("cannot inspect image {HOLDER_IMAGE}: {e}")),
    }
    let opts = ImportImageOptionsBuilder::default().quiet(true).build();
    let body = bollard::body_full(image_archive().into());
    let load = async {
        let mut progress = docker.import_image(opts, body, None);
        while let Some(item) = progress.next().await {
            let item =
                item.map_err(|e| format!("cannot load the network-namespace holder image {HOLDER_IMAGE}: {e}"))?;
            if let Some(e) = item.error_detail.and_then(|d| d.message) {
                return Err(format!("cannot load the network-namespace holder image {HOLDER_IMAGE}: {e}"));
            }
        }
        Ok::<(), String>(())
    };
    tokio::time::timeout(IMPORT_TIMEOUT, load).await.map_err(|_| {
        format!("the engine did not load the network-namespace holder image {HOLDER_IMAGE} within {IMPORT_TIMEOUT:?}")
    })??;
    tracing::info!(image = HOLDER_IMAGE, "loaded the network-namespace holder image");
    Ok(())
}

/// The name of task `task_id`'s holder.
pub(crate) fn name(task_id: &str) -> String {
    format!("{NAME_PREFIX}{task_id}")
}

const NAME_PREFIX: &str = "shl-netns.";

/// The create body of `task`'s holder: network mode `none`, the task's hostname, the node's resolver and the
/// task's extra hosts (which the task's container shares), no restart (a holder that dies is replaced with
/// its task).
pub(crate) fn create_body(task: &Task, node_id: &str) -> ContainerCreateBody {
    let c = spec::container_spec(task);
    let dns = c.dns_config.clone().unwrap_or_default();
    let mut options = vec!["ndots:0".to_string()];
    options.extend(dns.options.iter().filter(|o| !o.starts_with("ndots:")).cloned());
    let labels: HashMap<String, String> =
        [(spec::LABEL_NODE_ID.to_string(), node_id.to_string()), (LABEL_HOLDER_TASK_ID.to_string(), task.id.clone())]
            .into();
    ContainerCreateBody {
        image: Some(HOLDER_IMAGE.to_string()),
        cmd: Some(vec!["/pause".to_string()]),
        hostname: (!c.hostname.is_empty()).then(|| c.hostname.clone()),
        labels: Some(labels),
        host_config: Some(HostConfig {
            network_mode: Some("none".into()),
            dns: Some(vec![RESOLVER.to_string()]),
            dns_search: (!dns.search.is_empty()).then(|| dns.search.clone()),
            dns_options: Some(options),
            extra_hosts: spec::extra_hosts(&c),
            restart_policy: Some(RestartPolicy { name: Some(RestartPolicyNameEnum::NO), maximum_retry_count: None }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_program_waits_until_killed() {
        if supported().is_err() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pause");
        std::fs::write(&path, PAUSE_X86_64).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut child = std::process::Command::new(&path).spawn().unwrap();
        let stat = format!("/proc/{}/stat", child.id());
        // Sleeping in pause(2) (state S), not exited.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let s = std::fs::read_to_string(&stat).unwrap_or_default();
            if s.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('S')) {
                break;
            }
            assert!(child.try_wait().unwrap().is_none(), "the pause program exited");
            assert!(std::time::Instant::now() < deadline, "the pause program never slept: {s}");
            std::thread::yield_now();
        }
        child.kill().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(child.wait().unwrap().signal(), Some(9));
    }

    #[test]
    fn the_image_archive_is_the_same_every_time() {
        assert_eq!(image_archive(), image_archive());
    }

    #[test]
    fn the_tarball_is_ustar_with_a_valid_checksum() {
        let t = tar(&[("pause", 0o755, &PAUSE_X86_64)]);
        assert_eq!(t.len(), 512 + 512 + 1024);
        assert_eq!(&t[257..262], b"ustar");
        let stored = u64::from_str_radix(std::str::from_utf8(&t[148..154]).unwrap(), 8).unwrap();
        let mut h = t[..512].to_vec();
        h[148..156].copy_from_slice(b"        ");
        assert_eq!(stored, h.iter().map(|&b| u64::from(b)).sum::<u64>());
        assert_eq!(&t[512..512 + 129], &PAUSE_X86_64[..]);
        assert_eq!(u64::from_str_radix(std::str::from_utf8(&t[124..135]).unwrap(), 8).unwrap(), 129);
    }

    #[test]
    fn the_holder_carries_the_resolver_hostname_and_hosts_and_no_network() {
        let task = Task {
            id: "t1".into(),
            spec: Some(
                shoal_api::TaskSpec {
                    runtime: Some(shoal_api::task_spec::Runtime::Container(shoal_api::ContainerSpec {
                        image: "app".into(),
                        hostname: "web-1".into(),
                        hosts: vec!["10.0.0.9 db".into()],
                        ..Default::default()
                    })),
                    ..Default::default()
                }
                .into(),
            ),
            ..Default::default()
        };
        let b = create_body(&task, "n1");
        let h = b.host_config.unwrap();
        assert_eq!(h.network_mode.as_deref(), Some("none"));
        assert_eq!(h.dns, Some(vec!["127.0.0.11".to_string()]));
        assert_eq!(h.dns_options, Some(vec!["ndots:0".to_string()]));
        assert_eq!(h.extra_hosts, Some(vec!["db:10.0.0.9".to_string()]));
        assert_eq!(b.hostname.as_deref(), Some("web-1"));
        let l = b.labels.unwrap();
        assert_eq!(l[LABEL_HOLDER_TASK_ID], "t1");
        assert!(!l.contains_key(spec::LABEL_TASK_ID), "a holder is not the task's container");
        assert!(!l.contains_key(spec::LABEL_SERVICE_NAME), "a holder is not one of the service's containers");
    }
}
