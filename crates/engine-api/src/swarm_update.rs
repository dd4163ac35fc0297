//! `POST /swarm/update?version=N` (`docker swarm update`): the posted `SwarmSpec` is merged into the
//! cluster's spec (only the fields the Engine API carries change) and written through
//! `controlapi::update_cluster`, which validates it.
//!
//! `rotateManagerUnlockKey=true` (`docker swarm unlock-key --rotate`) replaces the unlock key in the same
//! write; it is refused (400, nothing changes) when the updated spec has autolock off.
//!
//! Must not depend on Raft or the executors.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use shoal_api::{ClusterSpec, Driver};
use shoal_manager::controlapi;

use crate::error::ApiError;
use crate::json::objects::{ExternalCaJson, SwarmSpecJson};
use crate::request::parse_bool_param;
use crate::ApiContext;

fn duration_from_ns(ns: i64) -> Option<shoal_api::prost_types::Duration> {
    (ns != 0).then(|| shoal_api::prost_types::Duration {
        seconds: ns.div_euclid(1_000_000_000),
        nanos: i32::try_from(ns.rem_euclid(1_000_000_000)).expect("under 10^9 nanoseconds"),
    })
}

/// `current` with the fields of `j` applied as the engine applies them (`MergeSwarmSpecToGRPC`): a field that
/// is zero, empty or absent in `j` keeps its current value (so a client may send only what it changes, as the
/// Python SDK does); `ForceRotate` and `AutoLockManagers` are always taken. Fields the Engine API does not
/// carry are kept.
pub fn merge_spec(current: &ClusterSpec, j: &SwarmSpecJson) -> ClusterSpec {
    let mut s = current.clone();
    let ann = s.annotations.get_or_insert_with(Default::default);
    if !j.name.is_empty() {
        ann.name = j.name.clone();
    }
    if !j.labels.is_empty() {
        ann.labels = j.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    }
    if let Some(limit) = j.orchestration.task_history_retention_limit {
        s.orchestration.get_or_insert_with(Default::default).task_history_retention_limit = limit;
    }
    if let Some(on) = j.orchestration.shoal_rebalance {
        s.orchestration.get_or_insert_with(Default::default).shoal_rebalance = on;
    }
    let raft = s.raft.get_or_insert_with(Default::default);
    let set = |field: &mut u64, v: u64| {
        if v != 0 {
            *field = v;
        }
    };
    set(&mut raft.snapshot_interval, j.raft.snapshot_interval);
    if let Some(keep) = j.raft.keep_old_snapshots {
        raft.keep_old_snapshots = keep;
    }
    set(&mut raft.log_entries_for_slow_followers, j.raft.log_entries_for_slow_followers);
    if j.raft.election_tick != 0 {
        raft.election_tick = j.raft.election_tick;
    }
    if j.raft.heartbeat_tick != 0 {
        raft.heartbeat_tick = j.raft.heartbeat_tick;
    }
    if let Some(hb) = duration_from_ns(j.dispatcher.heartbeat_period) {
        s.dispatcher.get_or_insert_with(Default::default).heartbeat_period = Some(hb);
    }
    let ca = s.ca_config.get_or_insert_with(Default::default);
    if let Some(expiry) = duration_from_ns(j.ca_config.node_cert_expiry) {
        ca.node_cert_expiry = Some(expiry);
    }
    ca.force_rotate = j.ca_config.force_rotate;
    // As the engine: the root to rotate to is passed through (the control API takes it and stores neither),
    // and the external CAs are the ones sent.
    ca.signing_ca_cert = j.ca_config.signing_ca_cert.as_bytes().to_vec();
    ca.signing_ca_key = j.ca_config.signing_ca_key.as_bytes().to_vec();
    ca.external_cas = j.ca_config.external_cas.iter().map(ExternalCaJson::to_api).collect();
    s.encryption_config.get_or_insert_with(Default::default).auto_lock_managers =
        j.encryption_config.auto_lock_managers;
    if let Some(d) = j.task_defaults.log_driver.as_ref() {
        s.task_defaults.get_or_insert_with(Default::default).log_driver = Some(Driver {
            name: d.name.clone(),
            options: d.options.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        });
    }
    s
}

/// `POST /swarm/update?version=N`.
pub async fn update_swarm(
    State(ctx): State<Arc<ApiContext>>,
    Query(q): Query<HashMap<String, String>>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let version: u64 = q
        .get("version")
        .ok_or_else(|| {
            ApiError::BadRequest("the version query parameter is required: pass the swarm's Version.Index".into())
        })?
        .parse()
        .map_err(|_| ApiError::BadRequest("invalid version: expected a non-negative integer".into()))?;
    // Read as the engine reads them (strconv.ParseBool: a bad value is a 400).
    let rotate_unlock_key = parse_bool_param(&q, "rotateManagerUnlockKey")?;
    // `docker swarm join-token --rotate worker|manager`: fresh secrets, same root CA digest.
    let rotate = shoal_manager::RotateTokens {
        worker: parse_bool_param(&q, "rotateWorkerToken")?,
        manager: parse_bool_param(&q, "rotateManagerToken")?,
    };
    let cluster = controlapi::get_cluster(&ctx.state)?;
    let current = cluster.spec.clone().unwrap_or_default();
    // The engine reads an empty body as no spec at all (moby's `ReadJSON`): a request that only rotates
    // (`?rotateManagerUnlockKey=true`, a join token) with no body leaves the spec as it is.
    let spec = if body.is_empty() {
        current.clone()
    } else {
        let j: SwarmSpecJson = crate::request::json_body(&headers, &body, "swarm spec")?;
        for e in &j.ca_config.external_cas {
            e.check()?;
        }
        merge_spec(&current, &j)
    };
    if rotate_unlock_key && !controlapi::autolock_on(Some(&spec)) {
        return Err(ApiError::BadRequest(
            "cannot rotate the unlock key: autolock is not turned on (docker swarm update --autolock=true)".into(),
        ));
    }
    controlapi::update_cluster_rotating(&ctx.state, &cluster.id, version, spec, rotate_unlock_key).await?;
    shoal_manager::rotate_join_tokens(&ctx.state, rotate).await.map_err(|e| ApiError::Unavailable(e.to_string()))?;
    Ok(StatusCode::OK.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_posted_spec_round_trips_and_keeps_what_the_api_does_not_carry() {
        let mut current = shoal_node_like_spec();
        current.ca_config.as_mut().unwrap().node_cert_expiry =
            Some(shoal_api::prost_types::Duration { seconds: 7_776_000, nanos: 0 });
        let cluster = shoal_api::Cluster { id: "c".into(), spec: Some(current.clone()), ..Default::default() };
        let mut j = crate::handlers::swarm_json(&cluster).cluster.spec;
        j.orchestration.task_history_retention_limit = Some(3);
        j.ca_config.node_cert_expiry = 48 * 3600 * 1_000_000_000;
        let merged = merge_spec(&current, &j);
        assert_eq!(merged.orchestration.as_ref().unwrap().task_history_retention_limit, 3);
        assert_eq!(merged.ca_config.as_ref().unwrap().node_cert_expiry.as_ref().unwrap().seconds, 48 * 3600);
        // Unchanged fields come back as they were.
        let back = merge_spec(&current, &crate::handlers::swarm_json(&cluster).cluster.spec);
        assert_eq!(back, current);
        // A partial spec (the Python SDK's Swarm.update) changes only what it sets.
        let body = br#"{"Name": null, "Raft": {"SnapshotInterval": 5000},
                        "Orchestration": {"TaskHistoryRetentionLimit": null}}"#;
        let partial: SwarmSpecJson = crate::json::decode(body).unwrap();
        let merged = merge_spec(&current, &partial);
        let mut want = current.clone();
        want.raft.as_mut().unwrap().snapshot_interval = 5000;
        assert_eq!(merged, want);
    }

    fn shoal_node_like_spec() -> ClusterSpec {
        ClusterSpec {
            annotations: Some(shoal_api::Annotations { name: "default".into(), ..Default::default() }),
            orchestration: Some(shoal_api::OrchestrationConfig {
                task_history_retention_limit: 5,
                ..Default::default()
            }),
            raft: Some(shoal_api::RaftConfig {
                snapshot_interval: 10_000,
                election_tick: 10,
                heartbeat_tick: 1,
                ..Default::default()
            }),
            dispatcher: Some(shoal_api::DispatcherConfig {
                heartbeat_period: Some(shoal_api::prost_types::Duration { seconds: 5, nanos: 0 }),
            }),
            ca_config: Some(Default::default()),
            encryption_config: Some(Default::default()),
            // Left unset: the merge must not invent it.
            ..Default::default()
        }
    }
}
