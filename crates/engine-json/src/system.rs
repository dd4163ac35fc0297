//! The Engine API's `GET /info` (`SystemInfo` with its `Swarm` section) and `GET /version` JSON.
//! Must not depend on HTTP or the store.

use serde::{Deserialize, Serialize};

use super::objects::ClusterInfoJson;

/// `SystemInfo`: the fields the docker CLI prints, and the swarm section.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct InfoJson {
    /// Daemon ID (the node ID).
    #[serde(rename = "ID")]
    pub id: String,
    /// Host name.
    pub name: String,
    /// Containers (always 0: Shoal runs tasks, not containers of its own).
    pub containers: u64,
    /// Running containers.
    pub containers_running: u64,
    /// Paused containers.
    pub containers_paused: u64,
    /// Stopped containers.
    pub containers_stopped: u64,
    /// Images.
    pub images: u64,
    /// Storage driver (empty).
    pub driver: String,
    /// Operating system description.
    pub operating_system: String,
    /// "linux".
    #[serde(rename = "OSType")]
    pub os_type: String,
    /// e.g. "x86_64".
    pub architecture: String,
    /// CPUs.
    #[serde(rename = "NCPU")]
    pub ncpu: u64,
    /// Memory, in bytes.
    pub mem_total: i64,
    /// Kernel version.
    pub kernel_version: String,
    /// Shoal's version.
    pub server_version: String,
    /// Root directory (the state dir is not exposed).
    pub docker_root_dir: String,
    /// Engine labels.
    pub labels: Vec<String>,
    /// Experimental features.
    pub experimental_build: bool,
    /// The daemon's clock, RFC 3339 with nanoseconds (`docker info` compares it with the client's).
    pub system_time: String,
    /// Debug mode.
    pub debug: bool,
    /// Open file descriptors of the daemon.
    #[serde(rename = "NFd")]
    pub n_fd: u64,
    /// Goroutines (0: Shoal has none).
    pub n_goroutines: u64,
    /// The default log driver ("json-file", as Docker).
    pub logging_driver: String,
    /// The cgroup driver ("cgroupfs").
    pub cgroup_driver: String,
    /// The cgroup version ("2" or "1").
    pub cgroup_version: String,
    /// The OS version (`VERSION_ID` of os-release).
    #[serde(rename = "OSVersion")]
    pub os_version: String,
    /// Where images come from by default.
    pub index_server_address: String,
    /// Plugins by kind (empty lists: Shoal has none).
    pub plugins: PluginsJson,
    /// Security options (none).
    pub security_options: Vec<String>,
    /// Live restore (false).
    pub live_restore_enabled: bool,
    /// Isolation (Windows only: left out on Linux, as the engine leaves it out).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub isolation: String,
    /// Warnings for `docker info` to print.
    pub warnings: Vec<String>,
    /// `"<not supported>"` for clients of API 1.24, which read it (`versions::adjust_info`); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution_driver: Option<String>,
    /// The swarm section.
    pub swarm: SwarmInfoJson,
}

/// `SystemInfo.Plugins`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct PluginsJson {
    /// Volume plugins.
    pub volume: Vec<String>,
    /// Network plugins.
    pub network: Vec<String>,
    /// Authorization plugins.
    pub authorization: Vec<String>,
    /// Log plugins.
    pub log: Vec<String>,
}

/// `SwarmInfo`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct SwarmInfoJson {
    /// This node's ID.
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// This node's advertised address.
    pub node_addr: String,
    /// "active".
    pub local_node_state: String,
    /// True: this node is a manager.
    pub control_available: bool,
    /// Error, if the node is in error.
    pub error: String,
    /// Managers: `{"NodeID", "Addr"}`.
    pub remote_managers: Vec<PeerJson>,
    /// Node count.
    pub nodes: u64,
    /// Manager count.
    pub managers: u64,
    /// The cluster (absent until it is initialized).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterInfoJson>,
}

/// `PeerNode`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct PeerJson {
    /// Node ID.
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// Address.
    pub addr: String,
}

/// `SystemVersion`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct SystemVersionJson {
    /// `{"Name": "Shoal"}`.
    pub platform: PlatformNameJson,
    /// Components and their versions.
    pub components: Vec<ComponentJson>,
    /// Shoal's version.
    pub version: String,
    /// Engine API version served ("1.47").
    pub api_version: String,
    /// Oldest API version accepted.
    #[serde(rename = "MinAPIVersion")]
    pub min_api_version: String,
    /// Source revision (empty).
    pub git_commit: String,
    /// Compiler (Docker reports its Go version; Shoal reports "rust").
    pub go_version: String,
    /// "linux".
    pub os: String,
    /// e.g. "amd64".
    pub arch: String,
    /// Kernel version.
    pub kernel_version: String,
}

/// `{"Name": ...}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct PlatformNameJson {
    /// Platform name.
    pub name: String,
}

/// `{"Name", "Version"}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ComponentJson {
    /// Component name.
    pub name: String,
    /// Its version.
    pub version: String,
}
