//! Reads and validated updates of the cluster object (`docker swarm update`): task history retention,
//! certificate expiry, heartbeat period, Raft settings, labels, autolock. The name never changes.
//!
//! Autolock (SwarmKit's rule): while `Spec.EncryptionConfig.AutoLockManagers` is on, the cluster holds one
//! unlock key (`unlock_keys`, subsystem `swarm-manager`, 32 random bytes), made when autolock is turned on,
//! replaced only when a rotation is asked for, and dropped when autolock is turned off. Managers watch it
//! and rewrap their keys (see `shoal-node`).
//!
//! Must not depend on HTTP or JSON.

use std::sync::Arc;
use std::time::Duration;

use shoal_api::{Cluster, ClusterSpec};
use shoal_store::{Changes, StoreObject, Tables};

use super::ControlError;
use crate::limits::{
    check_count, check_duration, human, invalid, MAX_HEARTBEAT_PERIOD, MAX_KEEP_OLD_SNAPSHOTS,
    MAX_LOG_ENTRIES_FOR_SLOW_FOLLOWERS, MAX_NODE_CERT_EXPIRY, MAX_RAFT_ELECTION_TICK, MAX_RAFT_HEARTBEAT_TICK,
    MAX_SNAPSHOT_INTERVAL, MAX_TASK_HISTORY, MIN_HEARTBEAT_PERIOD,
};
use crate::state::ClusterState;

/// The shortest node certificate lifetime accepted (SwarmKit's minimum).
pub const MIN_NODE_CERT_EXPIRY: Duration = Duration::from_secs(3600);

/// The cluster object (there is one).
pub fn get_cluster(state: &ClusterState) -> Result<Arc<Cluster>, ControlError> {
    state.store.view(|t| t.clusters().iter().min_by(|a, b| a.id.cmp(&b.id)).cloned()).ok_or_else(|| {
        ControlError::Unavailable("the cluster is not initialized yet: wait for the node to finish starting".into())
    })
}

/// Checks a cluster spec against the current one.
pub fn validate_cluster_spec(current: &ClusterSpec, spec: &ClusterSpec) -> Result<(), ControlError> {
    let name = |s: &ClusterSpec| s.annotations.as_ref().map(|a| a.name.clone()).unwrap_or_default();
    if name(spec) != name(current) {
        return Err(ControlError::InvalidArgument(format!(
            "the cluster name cannot be changed (it is {:?}); keep Spec.Name as it is",
            name(current)
        )));
    }
    let limit = spec.orchestration.as_ref().map_or(0, |o| o.task_history_retention_limit);
    if !(0..=MAX_TASK_HISTORY).contains(&limit) {
        return Err(invalid(format!(
            "invalid task history limit {limit}: use 0 to {MAX_TASK_HISTORY} tasks per slot (--task-history-limit)"
        )));
    }
    if let Some(expiry) = spec.ca_config.as_ref().and_then(|c| c.node_cert_expiry.as_ref()) {
        check_duration("CAConfig.NodeCertExpiry", Some(expiry), None, MAX_NODE_CERT_EXPIRY)
            .map_err(|e| invalid(format!("invalid certificate expiry: {e} (--cert-expiry)")))?;
        let d = shoal_api::duration_from_proto(expiry);
        if d < MIN_NODE_CERT_EXPIRY {
            return Err(invalid(format!(
                "invalid certificate expiry {}: it must be at least {} (e.g. --cert-expiry 2160h)",
                human(d),
                human(MIN_NODE_CERT_EXPIRY)
            )));
        }
    }
    if let Some(hb) = spec.dispatcher.as_ref().and_then(|d| d.heartbeat_period.as_ref()) {
        check_duration("Dispatcher.HeartbeatPeriod", Some(hb), None, MAX_HEARTBEAT_PERIOD)
            .map_err(|e| invalid(format!("invalid dispatcher heartbeat period: {e} (--dispatcher-heartbeat)")))?;
        let d = shoal_api::duration_from_proto(hb);
        if d < MIN_HEARTBEAT_PERIOD {
            return Err(invalid(format!(
                "invalid dispatcher heartbeat period {}: it must be at least {} and at most {} (e.g. \
                 --dispatcher-heartbeat 5s)",
                human(d),
                human(MIN_HEARTBEAT_PERIOD),
                human(MAX_HEARTBEAT_PERIOD)
            )));
        }
    }
    if let Some(r) = spec.raft.as_ref() {
        check_count("Raft.HeartbeatTick", r.heartbeat_tick.into(), MAX_RAFT_HEARTBEAT_TICK.into())?;
        check_count("Raft.ElectionTick", r.election_tick.into(), MAX_RAFT_ELECTION_TICK.into())?;
        check_count("Raft.SnapshotInterval", r.snapshot_interval, MAX_SNAPSHOT_INTERVAL)?;
        check_count(
            "Raft.LogEntriesForSlowFollowers",
            r.log_entries_for_slow_followers,
            MAX_LOG_ENTRIES_FOR_SLOW_FOLLOWERS,
        )?;
        check_count("Raft.KeepOldSnapshots", r.keep_old_snapshots, MAX_KEEP_OLD_SNAPSHOTS)?;
        if r.heartbeat_tick != 0 && r.election_tick != 0 && r.election_tick <= r.heartbeat_tick {
            return Err(invalid(format!(
                "invalid raft settings: the election tick ({}) must exceed the heartbeat tick ({})",
                r.election_tick, r.heartbeat_tick
            )));
        }
    }
    Ok(())
}

/// The `subsystem` of the managers' unlock key in `Cluster.unlock_keys`.
pub const MANAGER_UNLOCK_SUBSYSTEM: &str = "swarm-manager";

/// True when the spec asks for autolock.
pub fn autolock_on(spec: Option<&ClusterSpec>) -> bool {
    spec.and_then(|s| s.encryption_config.as_ref()).is_some_and(|e| e.auto_lock_managers)
}

/// The managers' unlock key (raw bytes) when autolock is on.
pub fn manager_unlock_key(cluster: &Cluster) -> Option<&[u8]> {
    if !autolock_on(cluster.spec.as_ref()) {
        return None;
    }
    cluster.unlock_keys.iter().find(|k| k.subsystem == MANAGER_UNLOCK_SUBSYSTEM).map(|k| k.key.as_slice())
}

/// The unlock keys `next` should hold after an update (see the module doc).
fn next_unlock_keys(next: &Cluster, rotate: bool) -> Vec<shoal_api::EncryptionKey> {
    let on = autolock_on(next.spec.as_ref());
    let mut keys: Vec<_> =
        next.unlock_keys.iter().filter(|k| on || k.subsystem != MANAGER_UNLOCK_SUBSYSTEM).cloned().collect();
    if !on {
        return keys;
    }
    let fresh = || shoal_ca::UnlockKey::generate(&mut rand::rng()).as_bytes().to_vec();
    match keys.iter_mut().find(|k| k.subsystem == MANAGER_UNLOCK_SUBSYSTEM) {
        Some(k) if rotate => k.key = fresh(),
        Some(_) => {}
        None => keys.push(shoal_api::EncryptionKey {
            subsystem: MANAGER_UNLOCK_SUBSYSTEM.into(),
            key: fresh(),
            ..Default::default()
        }),
    }
    keys
}

/// Replaces the cluster's spec. `version` must be the cluster's current version.
pub async fn update_cluster(
    state: &ClusterState,
    id: &str,
    version: u64,
    spec: ClusterSpec,
) -> Result<Cluster, ControlError> {
    update_cluster_rotating(state, id, version, spec, false).await
}

/// Like `update_cluster`; with `rotate_unlock_key` the managers' unlock key is replaced too (when autolock
/// is on; without autolock there is none and nothing else changes, as in SwarmKit).
pub async fn update_cluster_rotating(
    state: &ClusterState,
    id: &str,
    version: u64,
    spec: ClusterSpec,
    rotate_unlock_key: bool,
) -> Result<Cluster, ControlError> {
    let now = state.now();
    // A root CA change (docker swarm ca --rotate) is planned from the version the update is based on, outside
    // the write (it may make a key); the write checks that version again.
    let mut spec = spec;
    crate::ca::rotation::check_external_cas(&spec).map_err(invalid)?;
    let planned = state.store.view(|t| t.clusters().get(id).cloned());
    let change = match planned.filter(|c| c.version() == version) {
        Some(c) => {
            let at = std::time::SystemTime::UNIX_EPOCH + Duration::from_millis(state.clock.now_unix_ms());
            crate::ca::rotation::plan_root_change(&c, &spec, at).map_err(invalid)?
        }
        None => crate::ca::rotation::RootChange::Keep,
    };
    // The root given to rotate to is taken by this update and never stored in the spec.
    if let Some(ca) = spec.ca_config.as_mut() {
        ca.signing_ca_cert.clear();
        ca.signing_ca_key.clear();
    }
    let force_rotate = spec.ca_config.as_ref().map_or(0, |c| c.force_rotate);
    state
        .write(|t: &Tables, c: &mut Changes| {
            let current = t.clusters().get(id).ok_or_else(|| ControlError::not_found("swarm", id))?;
            if current.version() != version {
                return Err(ControlError::out_of_sequence("the swarm", "update", current.version(), version));
            }
            validate_cluster_spec(&current.spec.clone().unwrap_or_default(), &spec)?;
            let mut next = (**current).clone();
            next.spec = Some(spec.clone());
            next.unlock_keys = next_unlock_keys(&next, rotate_unlock_key);
            if let Some(rc) = next.root_ca.as_mut() {
                if change != crate::ca::rotation::RootChange::Keep {
                    tracing::info!(
                        cancel = matches!(change, crate::ca::rotation::RootChange::Cancel),
                        "root CA rotation requested"
                    );
                }
                crate::ca::rotation::apply_root_change(rc, change.clone(), force_rotate);
            }
            next.meta_mut().updated_at = Some(now);
            c.update(next);
            Ok(())
        })
        .await?;
    state
        .store
        .view(|t| t.clusters().get(id).map(|c| (**c).clone()))
        .ok_or_else(|| ControlError::not_found("swarm", id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_api::{Annotations, CaConfig, OrchestrationConfig, RaftConfig};

    fn spec(limit: i64, expiry_s: i64) -> ClusterSpec {
        ClusterSpec {
            annotations: Some(Annotations { name: "default".into(), ..Default::default() }),
            orchestration: Some(OrchestrationConfig { task_history_retention_limit: limit, ..Default::default() }),
            ca_config: Some(CaConfig {
                node_cert_expiry: Some(shoal_api::prost_types::Duration { seconds: expiry_s, nanos: 0 }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn check(next: ClusterSpec, expect_err: Option<&str>) {
        let r = validate_cluster_spec(&spec(5, 7_776_000), &next);
        match expect_err {
            None => assert!(r.is_ok(), "{r:?}"),
            Some(part) => assert!(r.as_ref().err().is_some_and(|e| e.to_string().contains(part)), "{r:?}"),
        }
    }

    #[test]
    fn cluster_specs_are_validated() {
        check(spec(3, 172_800), None);
        check(spec(-1, 172_800), Some("task history limit"));
        check(spec(3, 60), Some("certificate expiry"));
        let mut renamed = spec(3, 172_800);
        renamed.annotations.as_mut().unwrap().name = "other".into();
        check(renamed, Some("cannot be changed"));
        let mut raft = spec(3, 172_800);
        raft.raft = Some(RaftConfig { heartbeat_tick: 10, election_tick: 5, ..Default::default() });
        check(raft, Some("election tick"));
        let with = |f: &dyn Fn(&mut ClusterSpec)| {
            let mut s = spec(3, 172_800);
            f(&mut s);
            s
        };
        let hb = |seconds: i64, nanos: i32| {
            with(&|s: &mut ClusterSpec| {
                s.dispatcher = Some(shoal_api::DispatcherConfig {
                    heartbeat_period: Some(shoal_api::prost_types::Duration { seconds, nanos }),
                })
            })
        };
        check(hb(0, 1_000_000), Some("at least 1s"));
        check(hb(-5, 0), Some("must not be negative"));
        check(hb(i64::MAX / 1_000_000_000, 0), Some("the limit is 5m"));
        check(hb(1, 0), None);
        check(hb(300, 0), None);
        check(spec(101, 172_800), Some("0 to 100"));
        check(spec(3, i64::MAX / 1_000_000_000), Some("the limit is"));
        let raft = |r: RaftConfig| with(&|s: &mut ClusterSpec| s.raft = Some(r));
        check(
            raft(RaftConfig { heartbeat_tick: 1, election_tick: u32::MAX, ..Default::default() }),
            Some("Raft.ElectionTick"),
        );
        check(
            raft(RaftConfig { heartbeat_tick: 500, election_tick: 900, ..Default::default() }),
            Some("Raft.HeartbeatTick"),
        );
        check(
            raft(RaftConfig { snapshot_interval: u64::MAX, ..Default::default() }),
            Some("Raft.SnapshotInterval 18446744073709551615 is too large: the limit is 1000000"),
        );
        check(
            raft(RaftConfig { log_entries_for_slow_followers: u64::MAX, ..Default::default() }),
            Some("Raft.LogEntriesForSlowFollowers"),
        );
        check(raft(RaftConfig { keep_old_snapshots: 1000, ..Default::default() }), Some("Raft.KeepOldSnapshots"));
        check(
            raft(RaftConfig {
                snapshot_interval: 10_000,
                log_entries_for_slow_followers: 500,
                heartbeat_tick: 1,
                election_tick: 10,
                keep_old_snapshots: 0,
            }),
            None,
        );
    }

    #[test]
    fn the_unlock_key_exists_exactly_while_autolock_is_on_and_changes_only_on_rotation() {
        let with_autolock = |on: bool, keys: Vec<shoal_api::EncryptionKey>| Cluster {
            spec: Some(ClusterSpec {
                encryption_config: Some(shoal_api::EncryptionConfig { auto_lock_managers: on }),
                ..Default::default()
            }),
            unlock_keys: keys,
            ..Default::default()
        };
        assert!(next_unlock_keys(&with_autolock(false, vec![]), true).is_empty());
        let first = next_unlock_keys(&with_autolock(true, vec![]), false);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].subsystem, MANAGER_UNLOCK_SUBSYSTEM);
        assert_eq!(first[0].key.len(), 32);
        let on = with_autolock(true, first.clone());
        assert_eq!(manager_unlock_key(&on), Some(first[0].key.as_slice()));
        assert_eq!(next_unlock_keys(&on, false), first, "kept without a rotation");
        let rotated = next_unlock_keys(&on, true);
        assert_eq!(rotated.len(), 1);
        assert_ne!(rotated[0].key, first[0].key);
        assert!(next_unlock_keys(&with_autolock(false, first.clone()), false).is_empty(), "dropped when off");
        assert_eq!(manager_unlock_key(&with_autolock(false, first)), None);
    }
}
