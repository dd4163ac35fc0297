//! Test harness shared by the end-to-end tests and later multi-node and fault tests:
//! - `api_server`: the Engine API alone on a temp socket over an in-memory state (API and client tests);
//! - `cdp`: headless Chromium driven over the DevTools Protocol (evaluate, wait, screenshot), for web pages;
//! - `cluster`: a whole cluster in one process (real manager subsystems and dispatcher, fake executors);
//! - `daemon`: a `shoal daemon` process under test, on a temporary state dir, control socket and port, stopped
//!   (and its task processes with it) when dropped, even when the test fails;
//! - `history`: a recorder of client operations and a linearizability checker (fault tests);
//! - `http`: a minimal Engine API client over the control socket;
//! - `managers`: manager statuses, the leader and store comparison across the daemons of a cluster;
//! - `netns`: network namespaces for daemons, partitions and delays between them (fault tests);
//! - `python`: a venv under the target dir with the Docker SDK and schemathesis, made on first use, and a
//!   runner for Python scripts in it;
//! - `wait`: wait for a condition with a deadline (never a fixed sleep), the one copy in the tree;
//! - `docker_cli`: the stock docker CLI pointed at a Shoal control socket;
//! - `docker_engine`: the local Docker Engine: the test image, daemons with `--executor docker` whose
//!   containers are removed on drop;
//! - `second_engine`: a second, stock Docker Engine in a network namespace of its own, to join a Shoal cluster
//!   as a worker (`docker swarm join`), cleaned up on drop;
//! - [`scratch_dir`]: where files shared by test processes live (in the build's target dir, not /tmp).

pub mod api_server;
pub mod cdp;
pub mod cluster;
pub mod csi_plugin;
pub mod daemon;
pub mod docker_cli;
pub mod docker_engine;
pub mod history;
pub mod http;
pub mod managers;
pub mod netns;
pub mod prerequisites;
pub mod process;
pub mod python;
pub mod second_engine;
pub mod swarmkit;
pub mod wait;
#[cfg(test)]
mod wait_tests;

pub use api_server::ApiServer;
pub use cluster::{ClusterOptions, TestCluster, TestWorker};
pub use daemon::{DaemonOptions, DaemonProcess};
pub use wait::wait_until;

/// A directory for files that test processes share and keep between runs (the test image's build lock,
/// the docker CLI's empty config): `shoal-test-scratch` beside the test executables' `deps` folder, i.e. in
/// cargo's target dir, so that tests leave nothing in /tmp and `cargo clean` removes it.
pub fn scratch_dir() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let profile_dir =
        exe.ancestors().find(|d| d.join("deps").is_dir()).unwrap_or_else(|| exe.parent().expect("a folder"));
    let dir = profile_dir.join("shoal-test-scratch");
    std::fs::create_dir_all(&dir).expect("create the test scratch dir");
    dir
}
