//! Small conveniences on the generated types: time conversions, the task-state order, whether a network is
//! encrypted, and the `Debug` of `SecretSpec` and `EncryptionKey` that never shows the data or the key.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::TaskState;

/// The engine label every Shoal agent puts in the node description it sends (its value: Shoal's version). A
/// node that described itself without it is a stock Docker Engine that joined as a worker (`docker swarm
/// join`), which cannot be made a manager of a Shoal cluster.
pub const SHOAL_AGENT_LABEL: &str = "shoal.agent";

/// The engine label a Shoal agent without a data plane puts in its node description, its value saying why
/// (e.g. another Shoal daemon holds the network namespace's data plane): the scheduler names it on the tasks
/// it cannot place for want of the `overlay` plugin, and `docker info` shows it among its warnings.
pub const SHOAL_NO_DATA_PLANE_LABEL: &str = "shoal.no-data-plane";

/// Converts milliseconds since the Unix epoch to a protobuf timestamp.
pub fn timestamp_from_unix_ms(ms: u64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: (ms / 1000) as i64,
        nanos: i32::try_from((ms % 1000) * 1_000_000).expect("under 10^9 nanoseconds"),
    }
}

/// Converts a protobuf timestamp to milliseconds since the Unix epoch (0 for times before it).
pub fn timestamp_to_unix_ms(ts: &prost_types::Timestamp) -> u64 {
    if ts.seconds < 0 {
        return 0;
    }
    ts.seconds as u64 * 1000 + (ts.nanos.max(0) as u64) / 1_000_000
}

/// Converts a `SystemTime` to a protobuf timestamp.
pub fn timestamp_from_system_time(t: SystemTime) -> prost_types::Timestamp {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    prost_types::Timestamp { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}

/// Converts a protobuf duration to a std duration (negative durations become zero).
pub fn duration_from_proto(d: &prost_types::Duration) -> Duration {
    if d.seconds < 0 || (d.seconds == 0 && d.nanos < 0) {
        return Duration::ZERO;
    }
    Duration::new(d.seconds as u64, d.nanos.max(0) as u32)
}

/// Converts a std duration to a protobuf duration.
pub fn duration_to_proto(d: Duration) -> prost_types::Duration {
    prost_types::Duration { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}

impl TaskState {
    /// Every task state, in SwarmKit's order.
    pub const ALL: [TaskState; 14] = [
        TaskState::New,
        TaskState::Pending,
        TaskState::Assigned,
        TaskState::Accepted,
        TaskState::Preparing,
        TaskState::Ready,
        TaskState::Starting,
        TaskState::Running,
        TaskState::Complete,
        TaskState::Shutdown,
        TaskState::Failed,
        TaskState::Rejected,
        TaskState::Remove,
        TaskState::Orphaned,
    ];

    /// True for states a task never leaves: it has stopped running for good.
    pub fn is_terminal(self) -> bool {
        self as i32 > TaskState::Running as i32
    }

    /// Decodes a wire value, mapping unknown values to `New`.
    pub fn from_wire(v: i32) -> TaskState {
        TaskState::try_from(v).unwrap_or(TaskState::New)
    }

    /// The name Docker's API uses for this state ("running", "shutdown", ...).
    pub fn docker_name(self) -> &'static str {
        match self {
            TaskState::New => "new",
            TaskState::Pending => "pending",
            TaskState::Assigned => "assigned",
            TaskState::Accepted => "accepted",
            TaskState::Preparing => "preparing",
            TaskState::Ready => "ready",
            TaskState::Starting => "starting",
            TaskState::Running => "running",
            TaskState::Complete => "complete",
            TaskState::Shutdown => "shutdown",
            TaskState::Failed => "failed",
            TaskState::Rejected => "rejected",
            TaskState::Remove => "remove",
            TaskState::Orphaned => "orphaned",
        }
    }

    /// Parses Docker's lower-case state name.
    pub fn from_docker_name(s: &str) -> Option<TaskState> {
        TaskState::ALL.into_iter().find(|st| st.docker_name() == s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_states_keep_swarmkit_values_and_order() {
        assert_eq!(TaskState::New as i32, 0);
        assert_eq!(TaskState::Pending as i32, 64);
        assert_eq!(TaskState::Running as i32, 512);
        assert_eq!(TaskState::Orphaned as i32, 832);
        assert!(!TaskState::Running.is_terminal());
        assert!(TaskState::Complete.is_terminal());
        assert_eq!(TaskState::from_docker_name("shutdown"), Some(TaskState::Shutdown));
    }

    #[test]
    fn time_round_trips() {
        let ts = timestamp_from_unix_ms(1_234_567);
        assert_eq!(timestamp_to_unix_ms(&ts), 1_234_567);
        let d = duration_to_proto(Duration::from_millis(1500));
        assert_eq!(duration_from_proto(&d), Duration::from_millis(1500));
    }
}

/// Everything but the data, which is shown as its length: a secret's bytes never reach a log or an error
/// through `{:?}` (prost's generated `Debug` is skipped for this type in `build.rs`).
impl std::fmt::Debug for crate::SecretSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretSpec")
            .field("annotations", &self.annotations)
            .field("data", &format_args!("<{} bytes redacted>", self.data.len()))
            .field("templating", &self.templating)
            .field("driver", &self.driver)
            .finish()
    }
}

/// Everything but the key, which is shown as its length (the unlock key, the network keys).
impl std::fmt::Debug for crate::EncryptionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncryptionKey")
            .field("subsystem", &self.subsystem)
            .field("algorithm", &self.algorithm)
            .field("key", &format_args!("<{} bytes redacted>", self.key.len()))
            .field("lamport_time", &self.lamport_time)
            .finish()
    }
}

/// The driver option that asks for an encrypted data path (`docker network create --opt encrypted`).
pub const ENCRYPTED_OPTION: &str = "encrypted";

/// The endpoint driver option (`--network name=...,driver-opt=...`) that names the task's interface on the
/// network, as Docker Engines from API 1.45 read it.
pub const ENDPOINT_IFNAME_OPTION: &str = "com.docker.network.endpoint.ifname";

/// The engine label a Shoal node reports its data path address in (`--data-path-addr`): the address its
/// overlay (VXLAN) traffic leaves from and arrives at, when it is not the address the managers know the node by.
pub const SHOAL_DATA_PATH_ADDR_LABEL: &str = "shoal.data-path-addr";

/// The label of the networks the managers make so that services can run on every node's own predefined
/// networks (`docker service create --network host`), as SwarmKit labels them.
pub const PREDEFINED_NETWORK_LABEL: &str = "com.docker.swarm.predefined";

/// The predefined networks (name = driver), as Docker's managers make them.
pub const PREDEFINED_NETWORKS: [&str; 2] = ["host", "bridge"];

/// The drivers of swarm networks that live on each node's engine rather than on an overlay (`docker network
/// create -d macvlan --scope swarm --config-from <each node's config-only network>`): the manager gives their
/// tasks no address and their services no VIP; each node's engine makes the network and addresses its tasks.
pub const NODE_LOCAL_DRIVERS: [&str; 2] = ["macvlan", "ipvlan"];

impl crate::Network {
    /// True when the network was created with `--opt encrypted` (the option in its spec's driver
    /// configuration, whatever its value, as libnetwork reads it).
    pub fn is_encrypted(&self) -> bool {
        self.spec
            .as_ref()
            .and_then(|s| s.driver_config.as_ref())
            .is_some_and(|d| d.options.contains_key(ENCRYPTED_OPTION))
    }

    /// The driver of a predefined network (`host` or `bridge`: the node's own network, no overlay, no
    /// address from the swarm), None for any other network.
    pub fn predefined_driver(&self) -> Option<&str> {
        let spec = self.spec.as_ref()?;
        let labelled = spec
            .annotations
            .as_ref()
            .is_some_and(|a| a.labels.get(PREDEFINED_NETWORK_LABEL).is_some_and(|v| v == "true"));
        let driver = spec.driver_config.as_ref().map(|d| d.name.as_str())?;
        (labelled && PREDEFINED_NETWORKS.contains(&driver)).then_some(driver)
    }
}

impl crate::Network {
    /// The driver of a network that lives on each node rather than on an overlay: a predefined one (`host`,
    /// `bridge`) or one of `NODE_LOCAL_DRIVERS`; None for an overlay network.
    pub fn node_local_driver(&self) -> Option<&str> {
        self.predefined_driver().or_else(|| {
            let driver = self.spec.as_ref()?.driver_config.as_ref()?.name.as_str();
            NODE_LOCAL_DRIVERS.contains(&driver).then_some(driver)
        })
    }
}

impl crate::Volume {
    /// Whether its CSI plugin has created it: its `VolumeInfo` carries the plugin's ID of it.
    pub fn created_by_plugin(&self) -> bool {
        self.volume_info.as_ref().is_some_and(|i| !i.volume_id.is_empty())
    }
}

impl crate::Node {
    /// The data path address the node reports (`SHOAL_DATA_PATH_ADDR_LABEL`), when it reports a valid one.
    pub fn data_path_addr(&self) -> Option<std::net::IpAddr> {
        let engine = self.description.as_ref()?.engine.as_ref()?;
        engine.labels.get(SHOAL_DATA_PATH_ADDR_LABEL)?.parse().ok()
    }

    /// Where the node's overlay (VXLAN) traffic goes: its data path address, else the address its session
    /// comes from (`NodeStatus.addr`); None when the store knows neither.
    pub fn underlay_addr(&self) -> Option<std::net::IpAddr> {
        self.data_path_addr().or_else(|| self.status.as_ref()?.addr.parse().ok())
    }
}

impl crate::NetworkAttachment {
    /// The driver of the attachment's network when it is a predefined one (see `Network::predefined_driver`).
    pub fn predefined_driver(&self) -> Option<&str> {
        self.network.as_ref()?.predefined_driver()
    }

    /// The driver of the attachment's network when it lives on each node (see `Network::node_local_driver`).
    pub fn node_local_driver(&self) -> Option<&str> {
        self.network.as_ref()?.node_local_driver()
    }
}

impl crate::Task {
    /// The task's attachments to overlay networks (every one but the node-local networks': predefined,
    /// macvlan, ipvlan).
    pub fn overlay_attachments(&self) -> impl Iterator<Item = &crate::NetworkAttachment> {
        self.networks.iter().filter(|a| a.node_local_driver().is_none())
    }

    /// The task's attachment to a swarm network of the node's engine (`NODE_LOCAL_DRIVERS`), if any.
    pub fn engine_network(&self) -> Option<&crate::NetworkAttachment> {
        self.networks.iter().find(|a| a.predefined_driver().is_none() && a.node_local_driver().is_some())
    }

    /// True when the task is attached to an overlay network (it needs the node's data plane).
    pub fn on_overlay(&self) -> bool {
        self.overlay_attachments().next().is_some()
    }

    /// The predefined network the task runs on (`host` or `bridge`), if any.
    pub fn predefined_network(&self) -> Option<&str> {
        self.networks.iter().find_map(|a| a.predefined_driver())
    }
}

#[cfg(test)]
mod secret_debug_tests {
    #[test]
    fn a_keys_debug_shows_its_length_never_its_bytes() {
        let key = crate::EncryptionKey { key: b"0123456789abcdef".to_vec(), lamport_time: 7, ..Default::default() };
        let cluster =
            crate::Cluster { network_bootstrap_keys: vec![key.clone()], unlock_keys: vec![key], ..Default::default() };
        let shown = format!("{cluster:?}");
        assert!(!shown.contains("0123456789") && !shown.contains("48, 49"), "{shown}");
        assert!(shown.contains("<16 bytes redacted>"), "{shown}");
    }

    #[test]
    fn a_secrets_debug_shows_the_length_of_its_data_never_the_data() {
        let spec = crate::SecretSpec { data: b"hunter2-pw".to_vec(), ..Default::default() };
        let secret = crate::Secret { spec: Some(spec), ..Default::default() };
        let assignment = crate::Assignment { item: Some(crate::assignment::Item::Secret(secret)) };
        for shown in [format!("{assignment:?}"), format!("{assignment:#?}")] {
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(!shown.contains("104, 117"), "{shown}"); // the bytes as a list of numbers
            assert!(shown.contains("<10 bytes redacted>"), "{shown}");
        }
    }
}
