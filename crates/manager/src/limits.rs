//! The bounds on what a request can make the cluster hold or do, and the checks that enforce them. Every
//! service, cluster, secret, config and cluster volume spec passes these before anything is written; each
//! error names the field, the value and the limit. Where Docker (moby's daemon, SwarmKit's controlapi) has a
//! rule, the same rule applies (negative durations and counts refused, health-check durations of 0 or at
//! least 1 ms, a dispatcher heartbeat of at least 1 s, a node certificate of at least 1 h, secret data under
//! 500 KiB and config data under 1000 KiB); where Docker has none, the upper bound is the one named on each
//! constant, chosen so no valid spec can exhaust a manager or outlive its removal.
//! What nodes report about themselves (descriptions, task statuses) is bounded here too, and checked by the
//! dispatcher before anything is written; so are node specs (labels as a secret's).
//!
//! Must not depend on HTTP, JSON or the store.

use std::time::Duration;

use shoal_api::prost::Message;
use shoal_api::prost_types::Duration as ProtoDuration;
use shoal_api::ServiceSpec;

use crate::error::ControlError;

/// Most replicas of one replicated service. SwarmKit has no bound; one manager holds every task in memory
/// and sends each to an agent, at about 3.1 KiB of resident memory per task (`shoal-bench memory --tasks
/// 100000`: 309 MiB with 100,000 tasks). 250,000 tasks are about 760 MiB, 2.5 times the largest service
/// the benchmarks run, which keeps a manager with a few such services within a few GiB. A spec beyond it
/// (written by an older version) is clamped by the orchestrator (see `orchestrator::replicated`).
pub const MAX_REPLICAS: u64 = 250_000;

/// Largest encoded service spec. A task carries a copy of the spec's task template and annotations, and an
/// updated service holds the spec and the previous one: 3 MiB keeps a service (two specs) within Raft's
/// 8 MiB proposal limit, and one task within a write of the orchestrator (`write::MAX_BYTES_PER_WRITE`).
pub const MAX_SPEC_BYTES: usize = 3 << 20;

/// Most bytes of task copies of the spec one replicated service may ask for (replicas x encoded spec): the
/// two bounds above allow 250,000 tasks of 3 MiB each, which no manager holds. 1 GiB is the full
/// 250,000 replicas of a 4 KiB spec, or 341 replicas of a 3 MiB one.
pub const MAX_SERVICE_TASK_BYTES: u64 = 1 << 30;

/// Most placement preferences in a spec: each is one level of the scheduler's decision tree (SwarmKit sets no
/// bound; Docker's docs show one or two levels).
pub const MAX_PLACEMENT_PREFERENCES: usize = 16;

/// Most tasks all services together may ask for (replicas, job completions, and a task per node for each
/// global service): about 3 GB of a manager's memory. SwarmKit has no bound; its scheduler takes 20 s for 100k.
pub const MAX_CLUSTER_TASKS: u64 = 1_000_000;

/// Most bytes of task specs all those tasks may carry together.
pub const MAX_CLUSTER_TASK_BYTES: u64 = 2 << 30;

/// Checks what the cluster's services ask for in all once `old` (the service's current contribution, zero for a
/// new one) is replaced by `new`, with `nodes` nodes for the global services.
pub(crate) fn check_cluster_totals(
    totals: shoal_store::ServiceTotals,
    old: shoal_store::ServiceTotals,
    new: shoal_store::ServiceTotals,
    nodes: u64,
) -> Result<(), ControlError> {
    let after = |f: fn(&shoal_store::ServiceTotals) -> u64| f(&totals).saturating_sub(f(&old)).saturating_add(f(&new));
    let tasks = after(|t| t.tasks).saturating_add(after(|t| t.global_services).saturating_mul(nodes));
    let bytes = after(|t| t.task_bytes).saturating_add(after(|t| t.global_task_bytes).saturating_mul(nodes));
    if tasks > MAX_CLUSTER_TASKS {
        return Err(invalid(format!(
            "the cluster's services would ask for {tasks} tasks in all, over the limit of {MAX_CLUSTER_TASKS}: scale \
             other services down or remove some first"
        )));
    }
    if bytes > MAX_CLUSTER_TASK_BYTES {
        return Err(invalid(format!(
            "the cluster's tasks would carry {bytes} bytes of specs in all, over the limit of {MAX_CLUSTER_TASK_BYTES} \
             bytes (2 GiB): make the specs smaller, or scale other services down or remove some first"
        )));
    }
    Ok(())
}

/// Most generic resource kinds a task may reserve.
pub const MAX_GENERIC_RESERVATIONS: usize = 64;

/// Most units of one generic kind a task may reserve (a node offers at most 1,024 named units).
pub const MAX_GENERIC_UNITS: i64 = 1_000_000;

/// Highest process count limit (Linux's largest `pid_max`).
pub const MAX_PIDS_LIMIT: i64 = 4_194_304;

/// Longest stop grace period: the time a task may take to stop before it is killed, also on service
/// removal. Docker has no bound; an hour covers databases flushing to disk and keeps a removed service's
/// tasks from running on for ever.
pub const MAX_STOP_GRACE_PERIOD: Duration = Duration::from_secs(3600);

/// Longest restart delay, restart window, update or rollback delay and monitor period (Docker: none).
pub const MAX_POLICY_DURATION: Duration = Duration::from_secs(24 * 3600);

/// Most restart attempts of a task (Docker: none; 0 means unlimited).
pub const MAX_RESTART_ATTEMPTS: u64 = 1_000_000;

/// Longest health-check interval, timeout, start period and start interval (Docker: none above, 1 ms below).
pub const MAX_HEALTH_DURATION: Duration = Duration::from_secs(24 * 3600);

/// Shortest non-zero health-check duration (moby's `containertypes.MinimumDuration`).
pub const MIN_HEALTH_DURATION: Duration = Duration::from_millis(1);

/// Most health-check retries (Docker: no upper bound, negative refused).
pub const MAX_HEALTH_RETRIES: i32 = 1000;

/// Shortest dispatcher heartbeat period (SwarmKit's minimum): shorter ones make nodes flap down and ready.
pub const MIN_HEARTBEAT_PERIOD: Duration = Duration::from_secs(1);

/// Longest dispatcher heartbeat period: a node is marked down after 3 missed periods, so this bounds how
/// long a dead node's tasks wait to be replaced.
pub const MAX_HEARTBEAT_PERIOD: Duration = Duration::from_secs(300);

/// Most old tasks kept per slot (`--task-history-limit`; Docker: no upper bound). Each is a task in memory
/// on every manager, per slot of every service.
pub const MAX_TASK_HISTORY: i64 = 100;

/// Longest node certificate lifetime: the root CA's own (20 years); a longer one could not be verified.
pub const MAX_NODE_CERT_EXPIRY: Duration = Duration::from_secs(20 * 365 * 24 * 3600);

/// Most Raft ticks between leader heartbeats.
pub const MAX_RAFT_HEARTBEAT_TICK: u32 = 100;

/// Most Raft ticks without a leader before an election.
pub const MAX_RAFT_ELECTION_TICK: u32 = 1000;

/// Most log entries between snapshots: the log since the last snapshot is replayed on restart.
pub const MAX_SNAPSHOT_INTERVAL: u64 = 1_000_000;

/// Most log entries kept after a snapshot for slow followers.
pub const MAX_LOG_ENTRIES_FOR_SLOW_FOLLOWERS: u64 = 1_000_000;

/// Most old snapshots kept.
pub const MAX_KEEP_OLD_SNAPSHOTS: u64 = 100;

/// Secret data is shorter than this many bytes (SwarmKit's `validation.MaxSecretSize`, 500 KiB): it lives in
/// every manager's memory and in the assignment of every node whose tasks use it.
pub const MAX_SECRET_DATA_BYTES: usize = 500 * 1024;

/// Config data is shorter than this many bytes (SwarmKit's `controlapi.MaxConfigSize`, 1000 KiB).
pub const MAX_CONFIG_DATA_BYTES: usize = 1000 * 1024;

/// Longest secret or config name (SwarmKit's rule: 64 characters of `[a-zA-Z0-9-_.]`).
pub const MAX_SECRET_NAME_LEN: usize = 64;

/// Most bytes of labels (keys and values) on one secret or config, and of options on its templating or
/// secret driver (Docker: none). The data bound above is the object's payload; this keeps what comes with it
/// small beside it.
pub const MAX_SECRET_LABEL_BYTES: usize = 64 * 1024;

/// Most bytes of labels (keys and values) on one node's spec (`docker node update --label-add`): the same
/// bound as a secret's labels. A node's spec travels in every session message to that node and in every
/// copy of the node object in the store's watch queue.
pub const MAX_NODE_LABEL_BYTES: usize = MAX_SECRET_LABEL_BYTES;

/// Most bytes of IPAM options (keys and values) on one network (`docker network create --ipam-opt`; Docker:
/// none): the same bound as a secret's labels. A network travels in every task attached to it.
pub const MAX_IPAM_OPTION_BYTES: usize = MAX_SECRET_LABEL_BYTES;

/// Most IPv4 subnets (`IPAM.Config` entries) of one overlay network (Docker: none). Each takes a VXLAN ID
/// of its own, and each node carrying the network makes a bridge and a VXLAN device per subnet.
pub const MAX_OVERLAY_SUBNETS: usize = 16;
/// Shortest IPv6 prefix of an `--ipv6` network's subnet (the data plane's bound too): a shorter one is not worth
/// having, since tasks take their addresses from the range's first 2^16 only (`allocator::ipam`).
pub const MIN_IPV6_PREFIX_LEN: u8 = 48;
/// Longest IPv6 prefix of an `--ipv6` network's subnet: 256 addresses at least, so a network is not too small to
/// allocate from (an IPv4 subnet's bound is /30, but IPv6 prefixes are not short of room).
pub const MAX_IPV6_PREFIX_LEN: u8 = 120;

/// Longest node name in a node's spec (a DNS name's 253 characters; Docker: none).
pub const MAX_NODE_NAME_BYTES: usize = 253;

/// Largest encoded description a node may report (`Dispatcher.Session`; SwarmKit: none). A node's own
/// description is a few KiB (hostname, platform, resources, engine labels, plugins, TLS info): 64 KiB leaves
/// room for a thousand named generic resources, and a hostile worker writing its description as often as
/// `dispatcher::registrations` lets it adds at most a few MiB an hour to the Raft log.
pub const MAX_NODE_DESCRIPTION_BYTES: usize = 64 * 1024;

/// Longest hostname a node may report (DNS's 253 characters; Linux allows 64).
pub const MAX_NODE_HOSTNAME_BYTES: usize = 253;

/// Most bytes of engine labels (keys and values) a node may report (`dockerd --label`).
pub const MAX_ENGINE_LABEL_BYTES: usize = 16 * 1024;

/// Most plugins a node may report.
pub const MAX_NODE_PLUGINS: usize = 256;

/// Most generic resources (named units and discrete kinds) a node may offer.
pub const MAX_NODE_GENERIC_RESOURCES: usize = 1024;

/// Longest message and longest error text in one task status an agent reports: an agent's own texts are a
/// line or two (an executor's error); every write of the task carries them.
pub const MAX_TASK_STATUS_TEXT_BYTES: usize = 8 * 1024;

/// Largest encoded task status an agent may report (texts, container status, port status).
pub const MAX_TASK_STATUS_BYTES: usize = 32 * 1024;

/// Longest target file name of a secret or config reference (Linux's `PATH_MAX`).
pub const MAX_TARGET_NAME_BYTES: usize = 4096;

/// Most secret references, and most config references, in one service's container spec (Docker: none; the
/// spec size bound would allow tens of thousands). Each is a file the agent writes for every task.
pub const MAX_REFERENCES_PER_SERVICE: usize = 1000;

/// Most bytes of a cluster volume's driver: its plugin's name and the options passed to the plugin's
/// CreateVolume as parameters (Docker: none). A volume travels in every task that mounts it (layer 2), and the
/// CSI spec bounds a parameter map by nothing smaller: 64 KiB as a secret's labels.
pub const MAX_VOLUME_DRIVER_BYTES: usize = MAX_SECRET_LABEL_BYTES;

/// Longest CSI plugin name (the CSI spec's 63 characters; Docker: none): 255 bytes leaves room for a
/// reverse-DNS name.
pub const MAX_VOLUME_DRIVER_NAME_BYTES: usize = 255;

/// Most secrets a cluster volume passes to its plugin (Docker: none; a plugin takes a handful of credentials).
pub const MAX_VOLUME_SECRETS: usize = 64;

/// Longest key of a secret a cluster volume passes to its plugin.
pub const MAX_VOLUME_SECRET_KEY_BYTES: usize = 256;

/// Most topologies in each of a cluster volume's `Requisite` and `Preferred` lists (Docker: none; a
/// topology is a zone or a node, and a cluster of 64 zones is beyond what the scheduler's filter will try).
pub const MAX_VOLUME_TOPOLOGIES: usize = 64;

/// Most bytes of one topology's segments, keys and values (the CSI spec: a key of at most 63 characters with a
/// 63-character prefix, a value of at most 63; 16 such segments fit in 4 KiB).
pub const MAX_VOLUME_TOPOLOGY_BYTES: usize = 4096;

/// Most bytes of a cluster volume's mount flags (the CSI spec's own bound on `mount_flags`: 4 KiB), and
/// of its file system type.
pub const MAX_VOLUME_MOUNT_FLAGS_BYTES: usize = 4096;

/// Largest encoded cluster volume spec: every bound above together stays under it, so it is the last guard
/// against a shape no single bound names (256 KiB; one volume per Raft write stays far from the proposal limit).
pub const MAX_VOLUME_SPEC_BYTES: usize = 256 * 1024;

pub(crate) fn invalid(msg: impl Into<String>) -> ControlError {
    ControlError::InvalidArgument(msg.into())
}

/// A duration as Docker's CLI writes it, shortest first: `1h`, `30m`, `5s`, `250ms`, else nanoseconds.
pub fn human(d: Duration) -> String {
    let (s, n) = (d.as_secs(), d.subsec_nanos());
    if n == 0 && s > 0 {
        if s % 3600 == 0 {
            return format!("{}h", s / 3600);
        }
        if s % 60 == 0 {
            return format!("{}m", s / 60);
        }
        return format!("{s}s");
    }
    if n % 1_000_000 == 0 {
        return format!("{}ms", d.as_millis());
    }
    format!("{}ns", d.as_nanos())
}

fn proto_human(d: &ProtoDuration) -> String {
    if d.seconds < 0 || d.nanos < 0 {
        return format!("{}ns", i128::from(d.seconds) * 1_000_000_000 + i128::from(d.nanos));
    }
    human(Duration::new(d.seconds as u64, d.nanos.clamp(0, 999_999_999) as u32))
}

/// Checks that `d` (when set) is not negative and at most `max`; `min` (when given) applies to non-zero
/// values.
pub(crate) fn check_duration(
    field: &str,
    d: Option<&ProtoDuration>,
    min_nonzero: Option<Duration>,
    max: Duration,
) -> Result<(), ControlError> {
    let Some(d) = d else { return Ok(()) };
    if d.seconds < 0 || d.nanos < 0 {
        return Err(invalid(format!("{field} must not be negative (got {})", proto_human(d))));
    }
    let v = Duration::new(d.seconds as u64, 0).saturating_add(Duration::from_nanos(d.nanos as u64));
    if v > max {
        return Err(invalid(format!("{field} {} is too long: the limit is {}", proto_human(d), human(max))));
    }
    if let Some(min) = min_nonzero {
        if !v.is_zero() && v < min {
            return Err(invalid(format!(
                "{field} {} is too short: use 0 (the default) or at least {}",
                proto_human(d),
                human(min)
            )));
        }
    }
    Ok(())
}

/// Checks that a count is at most `max`.
pub(crate) fn check_count(field: &str, v: u64, max: u64) -> Result<(), ControlError> {
    if v > max {
        return Err(invalid(format!("{field} {v} is too large: the limit is {max}")));
    }
    Ok(())
}

/// Checks the encoded size of a service spec against `MAX_SPEC_BYTES`, and what its replicas hold against
/// `MAX_SERVICE_TASK_BYTES`.
pub(crate) fn check_spec_size(spec: &ServiceSpec) -> Result<(), ControlError> {
    let len = spec.encoded_len();
    // A replicated job keeps one completed task per completion of its current iteration.
    let counted = match &spec.mode {
        Some(shoal_api::service_spec::Mode::Replicated(r)) => Some(("Mode.Replicated.Replicas", r.replicas)),
        Some(shoal_api::service_spec::Mode::ReplicatedJob(j)) => {
            Some(("Mode.ReplicatedJob.TotalCompletions", j.total_completions))
        }
        _ => None,
    };
    if let Some((field, count)) = counted {
        let total = count.saturating_mul(len as u64);
        if total > MAX_SERVICE_TASK_BYTES {
            return Err(invalid(format!(
                "{field} {count} x a spec of {len} bytes is {total} bytes of tasks, over the limit of \
                 {MAX_SERVICE_TASK_BYTES} bytes (1 GiB): run fewer tasks or make the spec smaller"
            )));
        }
    }
    if len > MAX_SPEC_BYTES {
        return Err(invalid(format!(
            "the service spec is {len} bytes encoded, over the limit of {MAX_SPEC_BYTES} bytes ({} MiB): every task \
             carries a copy of it; move large data (labels, env, args) into a config or the image",
            MAX_SPEC_BYTES >> 20
        )));
    }
    Ok(())
}

fn map_bytes(m: &std::collections::HashMap<String, String>) -> usize {
    m.iter().map(|(k, v)| k.len() + v.len()).sum()
}

/// Checks a description a node reports about itself against the bounds above. The error names the part
/// and its limit (the dispatcher refuses the session with it).
pub fn check_node_description(d: &shoal_api::NodeDescription) -> Result<(), ControlError> {
    let len = d.encoded_len();
    if len > MAX_NODE_DESCRIPTION_BYTES {
        return Err(invalid(format!(
            "the node description is {len} bytes encoded, over the limit of {MAX_NODE_DESCRIPTION_BYTES} bytes: \
             report fewer engine labels, plugins or generic resources"
        )));
    }
    if d.hostname.len() > MAX_NODE_HOSTNAME_BYTES {
        return Err(invalid(format!(
            "Description.Hostname is {} bytes, over the limit of {MAX_NODE_HOSTNAME_BYTES}",
            d.hostname.len()
        )));
    }
    if let Some(engine) = &d.engine {
        let labels = map_bytes(&engine.labels);
        if labels > MAX_ENGINE_LABEL_BYTES {
            return Err(invalid(format!(
                "Description.Engine.Labels are {labels} bytes, over the limit of {MAX_ENGINE_LABEL_BYTES} bytes"
            )));
        }
        check_count("Description.Engine.Plugins: the count", engine.plugins.len() as u64, MAX_NODE_PLUGINS as u64)?;
    }
    if let Some(r) = &d.resources {
        check_count(
            "Description.Resources.Generic: the count",
            r.generic.len() as u64,
            MAX_NODE_GENERIC_RESOURCES as u64,
        )?;
    }
    Ok(())
}

/// Checks the labels and name of a node's spec (`docker node update`).
pub fn check_node_spec(spec: &shoal_api::NodeSpec) -> Result<(), ControlError> {
    let Some(a) = &spec.annotations else { return Ok(()) };
    if a.name.len() > MAX_NODE_NAME_BYTES {
        return Err(invalid(format!("Name: {} bytes, over the limit of {MAX_NODE_NAME_BYTES}", a.name.len())));
    }
    let labels = map_bytes(&a.labels);
    if labels > MAX_NODE_LABEL_BYTES {
        return Err(invalid(format!(
            "Labels: the node's labels are {labels} bytes, over the limit of {MAX_NODE_LABEL_BYTES} bytes (64 KiB)"
        )));
    }
    Ok(())
}

/// Checks a task status an agent reports for `task_id` (`Dispatcher.UpdateTaskStatus`).
pub fn check_task_status(task_id: &str, s: &shoal_api::TaskStatus) -> Result<(), ControlError> {
    for (field, text) in [("Message", &s.message), ("Err", &s.err), ("AppliedBy", &s.applied_by)] {
        if text.len() > MAX_TASK_STATUS_TEXT_BYTES {
            return Err(invalid(format!(
                "the status of task {task_id}: {field} is {} bytes, over the limit of {MAX_TASK_STATUS_TEXT_BYTES}",
                text.len()
            )));
        }
    }
    let len = s.encoded_len();
    if len > MAX_TASK_STATUS_BYTES {
        return Err(invalid(format!(
            "the status of task {task_id} is {len} bytes encoded, over the limit of {MAX_TASK_STATUS_BYTES}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_written_as_docker_writes_them() {
        assert_eq!(human(Duration::from_secs(3600)), "1h");
        assert_eq!(human(Duration::from_secs(300)), "5m");
        assert_eq!(human(Duration::from_secs(61)), "61s");
        assert_eq!(human(Duration::from_millis(250)), "250ms");
        assert_eq!(human(Duration::from_nanos(10)), "10ns");
        assert_eq!(proto_human(&ProtoDuration { seconds: -1, nanos: -500 }), "-1000000500ns");
        assert_eq!(proto_human(&ProtoDuration { seconds: 0, nanos: -1 }), "-1ns");
    }
}
