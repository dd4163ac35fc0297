//! The local Docker Engine for tests of the docker executor: whether it answers, a test image built
//! without any registry (`shoal-test-busybox:latest`: Debian's static busybox in an otherwise empty
//! rootfs, `docker import`ed), and `EngineDaemon`, a daemon under test with `--executor docker` whose
//! containers are removed when it is dropped, even when the test fails.
//!
//! The image is built once per machine: a file lock serialises test processes, and a present image is
//! reused. Nothing here ever pulls. Talks to the engine through the docker CLI (at its default socket).

use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::daemon::{DaemonOptions, DaemonProcess};

/// The test image.
pub const TEST_IMAGE: &str = "shoal-test-busybox:latest";
/// Where a static busybox is looked for (Debian's busybox-static package).
pub const BUSYBOX_PATHS: [&str; 2] = ["/bin/busybox", "/usr/bin/busybox"];
/// The lock file that serialises image builds between test processes.
const BUILD_LOCK: &str = "shoal-test-busybox.lock";

/// Runs `docker ARGS...` against the local engine (never a Shoal socket).
pub fn engine(args: &[&str]) -> Output {
    Command::new("docker")
        .args(args)
        .env_remove("DOCKER_HOST")
        .env_remove("DOCKER_CONTEXT")
        .stdin(Stdio::null())
        .output()
        .expect("run docker")
}

/// Runs `docker ARGS...` against the local engine and returns stdout, panicking with stderr on failure.
pub fn engine_ok(args: &[&str]) -> String {
    let out = engine(args);
    assert!(out.status.success(), "docker {args:?} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// True when the docker CLI is installed and the local engine answers.
pub fn available() -> bool {
    crate::prerequisites::Prerequisite::DockerEngine.present()
}

/// The label the built image carries, `shoal.test-image=<recipe>`: an image of that tag without it (built by an
/// older recipe, or another image imported under the same name) is built again.
const RECIPE_LABEL: &str = "shoal.test-image";
/// The recipe's version: raised whenever `build_test_image` changes what the image holds.
const RECIPE: &str = "2";

/// Builds `TEST_IMAGE` unless the engine has it from this recipe. Safe to call from parallel test processes.
pub fn ensure_test_image() -> &'static str {
    let lock_path = crate::scratch_dir().join(BUILD_LOCK);
    let lock = std::fs::OpenOptions::new().create(true).append(true).open(&lock_path).expect("image build lock file");
    // Blocks until no other test process is building; released when `lock` is closed.
    nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .map(|guard| {
            let format = format!("{{{{index .Config.Labels \"{RECIPE_LABEL}\"}}}}");
            let have = engine(&["image", "inspect", "--format", &format, TEST_IMAGE]);
            if !have.status.success() || String::from_utf8_lossy(&have.stdout).trim() != RECIPE {
                build_test_image();
            }
            drop(guard);
        })
        .expect("lock the image build");
    TEST_IMAGE
}

/// The test image, for a test that needs the Docker Engine. When no engine answers on this machine the test
/// fails, or is skipped (`None`) where `SHOAL_TEST_SKIP_MISSING` says so (`crate::prerequisites`).
pub fn test_image_or_skip() -> Option<&'static str> {
    if crate::prerequisites::skip_unless(crate::prerequisites::Prerequisite::DockerEngine) {
        return None;
    }
    Some(ensure_test_image())
}

fn build_test_image() {
    let busybox = BUSYBOX_PATHS.iter().map(Path::new).find(|p| p.is_file()).unwrap_or_else(|| {
        panic!(
            "no static busybox at {BUSYBOX_PATHS:?}: install Debian's busybox-static package (apt-get install \
                busybox-static)"
        )
    });
    let root = tempfile::Builder::new().prefix("shoal-rootfs-").tempdir().expect("rootfs dir");
    let r = root.path();
    for dir in ["bin", "etc", "tmp", "proc", "sys", "dev", "data"] {
        std::fs::create_dir_all(r.join(dir)).expect("rootfs dir");
    }
    std::fs::copy(busybox, r.join("bin/busybox")).expect("copy busybox");
    let list = Command::new(busybox).arg("--list").output().expect("busybox --list");
    for applet in String::from_utf8_lossy(&list.stdout).lines().filter(|a| !a.is_empty() && *a != "busybox") {
        std::os::unix::fs::symlink("busybox", r.join("bin").join(applet)).expect("applet link");
    }
    std::fs::write(r.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n")
        .expect("passwd");
    std::fs::write(r.join("etc/group"), "root:x:0:\nnogroup:x:65534:\n").expect("group");
    let tar = Command::new("tar").arg("-C").arg(r).args(["-c", "."]).output().expect("tar the rootfs");
    assert!(tar.status.success(), "tar failed: {}", String::from_utf8_lossy(&tar.stderr));
    let out = crate::process::output_with_stdin(
        Command::new("docker")
            .args(["import", "--change", "ENV PATH=/bin", "--change", "CMD [\"sh\"]"])
            .args(["--change", &format!("LABEL {RECIPE_LABEL}={RECIPE}"), "-", TEST_IMAGE])
            .env_remove("DOCKER_HOST"),
        &tar.stdout,
        "docker import",
    );
    assert!(out.status.success(), "docker import failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// IDs of the engine's containers (running or not) labelled with node `node_id`.
pub fn containers_of_node(node_id: &str) -> Vec<String> {
    let filter = format!("label=com.docker.swarm.node.id={node_id}");
    engine_ok(&["ps", "-aq", "--no-trunc", "--filter", &filter]).lines().map(str::to_string).collect()
}

/// IDs of running containers of node `node_id` whose label `key` equals `value`.
pub fn running_with_label(node_id: &str, key: &str, value: &str) -> Vec<String> {
    let node = format!("label=com.docker.swarm.node.id={node_id}");
    let other = format!("label={key}={value}");
    engine_ok(&["ps", "-q", "--no-trunc", "--filter", &node, "--filter", &other]).lines().map(str::to_string).collect()
}

/// A daemon under test running tasks as containers. Dropping it stops the daemon, then force-removes every
/// container labelled with its node ID and the node's task files (`/dev/shm/shoal-<node id>`).
pub struct EngineDaemon {
    daemon: Option<DaemonProcess>,
    node_id: String,
}

impl EngineDaemon {
    /// Starts `binary daemon --executor docker` on a fresh state dir.
    pub fn start(binary: &Path) -> EngineDaemon {
        EngineDaemon::start_with_args(binary, Vec::new())
    }

    /// Starts `binary daemon --executor docker` with `extra_args` on a fresh state dir.
    pub fn start_with_args(binary: &Path, extra_args: Vec<String>) -> EngineDaemon {
        EngineDaemon::start_with(binary, DaemonOptions { extra_args, ..DaemonOptions::default() })
    }

    /// Starts `binary daemon --executor docker` with these options (their executor is replaced).
    pub fn start_with(binary: &Path, opts: DaemonOptions) -> EngineDaemon {
        let daemon = DaemonProcess::start_with(binary, DaemonOptions { executor: Some("docker".into()), ..opts });
        let info = daemon.get("/v1.47/info");
        let node_id = info["Swarm"]["NodeID"].as_str().unwrap_or_default().to_string();
        assert!(!node_id.is_empty(), "/info has no Swarm.NodeID: {info}");
        EngineDaemon { daemon: Some(daemon), node_id }
    }

    /// This node's ID (the value of its containers' com.docker.swarm.node.id label).
    pub fn node_id(&self) -> &str {
        &self.node_id
    }
}

impl Deref for EngineDaemon {
    type Target = DaemonProcess;
    fn deref(&self) -> &DaemonProcess {
        self.daemon.as_ref().expect("daemon")
    }
}

impl DerefMut for EngineDaemon {
    fn deref_mut(&mut self) -> &mut DaemonProcess {
        self.daemon.as_mut().expect("daemon")
    }
}

impl Drop for EngineDaemon {
    fn drop(&mut self) {
        // The daemon first, so that nothing recreates containers while they are removed.
        drop(self.daemon.take());
        let filter = format!("label=com.docker.swarm.node.id={}", self.node_id);
        if let Ok(out) = Command::new("docker").args(["ps", "-aq", "--filter", &filter]).output() {
            let ids: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect();
            if !ids.is_empty() {
                let _ = Command::new("docker").arg("rm").arg("-f").args(&ids).output();
            }
        }
        // The node's secret and config files (on /dev/shm), which the removed containers had mounted.
        let _ = std::fs::remove_dir_all(format!("/dev/shm/shoal-{}", self.node_id));
    }
}
