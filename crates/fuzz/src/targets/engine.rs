//! Engine API inputs: request bodies decoded as Go's encoding/json does (`json::decode`), converted to the
//! wire types and validated against `controlapi::limits` exactly as the handlers do before anything is
//! written, and the query strings the handlers parse (filters, log options).

use std::collections::HashMap;

use shoal_api::{node_spec, ClusterSpec};
use shoal_engine_api::json::objects::SwarmSpecJson;
use shoal_engine_api::json::volume::{VolumeCreateJson, VolumeJson, VolumeUpdateJson};
use shoal_engine_api::json::{
    decode, ConfigJson, ConfigSpecJson, NodeSpecJson, SecretJson, SecretSpecJson, ServiceSpecJson,
};
use shoal_engine_api::unlock::UnlockRequestJson;
use shoal_engine_api::{ca::ClientCertRequest, filters, logs, swarm_update};
use shoal_manager::controlapi;

use super::split_selector;

/// Field names of a service spec, for the mutator.
pub const SERVICE_DICT: &[&str] = &[
    "\"Name\"",
    "\"Labels\"",
    "\"TaskTemplate\"",
    "\"ContainerSpec\"",
    "\"Image\"",
    "\"Args\"",
    "\"Command\"",
    "\"Env\"",
    "\"Mode\"",
    "\"Replicated\"",
    "\"Replicas\"",
    "\"Global\"",
    "\"ReplicatedJob\"",
    "\"MaxConcurrent\"",
    "\"TotalCompletions\"",
    "\"UpdateConfig\"",
    "\"Parallelism\"",
    "\"Delay\"",
    "\"FailureAction\"",
    "\"Monitor\"",
    "\"MaxFailureRatio\"",
    "\"Order\"",
    "\"RollbackConfig\"",
    "\"RestartPolicy\"",
    "\"Condition\"",
    "\"MaxAttempts\"",
    "\"Window\"",
    "\"Placement\"",
    "\"Constraints\"",
    "\"Preferences\"",
    "\"Spread\"",
    "\"SpreadDescriptor\"",
    "\"Platforms\"",
    "\"Resources\"",
    "\"Limits\"",
    "\"Reservations\"",
    "\"NanoCPUs\"",
    "\"MemoryBytes\"",
    "\"Pids\"",
    "\"StopGracePeriod\"",
    "\"Healthcheck\"",
    "\"Test\"",
    "\"Interval\"",
    "\"Timeout\"",
    "\"Retries\"",
    "\"StartPeriod\"",
    "\"EndpointSpec\"",
    "\"Ports\"",
    "\"PublishedPort\"",
    "\"TargetPort\"",
    "\"Protocol\"",
    "\"Mounts\"",
    "\"ForceUpdate\"",
    "\"Hostname\"",
    "\"User\"",
    "\"Dir\"",
    "\"TTY\"",
    "\"DNSConfig\"",
    "\"Nameservers\"",
    "\"Hosts\"",
    "\"Init\"",
    "\"node.role==manager\"",
    "\"node.labels.a!=b\"",
    "\"pause\"",
    "\"rollback\"",
    "\"start-first\"",
    "\"Secrets\"",
    "\"Configs\"",
    "\"SecretID\"",
    "\"SecretName\"",
    "\"ConfigID\"",
    "\"ConfigName\"",
    "\"File\"",
    "\"UID\"",
    "\"GID\"",
    "\"Mode\"",
    "\"Runtime\"",
];

/// Field names of secret and config specs.
pub const SECRET_DICT: &[&str] = &[
    "\"Name\"",
    "\"Labels\"",
    "\"Data\"",
    "\"Driver\"",
    "\"Templating\"",
    "\"Options\"",
    "\"golang\"",
    "\"cHc=\"",
    "\"=\"",
    "\\n",
];

/// Field names of a node spec.
pub const NODE_DICT: &[&str] =
    &["\"Name\"", "\"Labels\"", "\"Role\"", "\"Availability\"", "\"worker\"", "\"manager\"", "\"drain\"", "\"active\""];

/// Field names of a swarm spec.
pub const SWARM_DICT: &[&str] = &[
    "\"Name\"",
    "\"Labels\"",
    "\"Orchestration\"",
    "\"TaskHistoryRetentionLimit\"",
    "\"Raft\"",
    "\"SnapshotInterval\"",
    "\"KeepOldSnapshots\"",
    "\"LogEntriesForSlowFollowers\"",
    "\"ElectionTick\"",
    "\"HeartbeatTick\"",
    "\"Dispatcher\"",
    "\"HeartbeatPeriod\"",
    "\"CAConfig\"",
    "\"NodeCertExpiry\"",
    "\"ExternalCAs\"",
    "\"EncryptionConfig\"",
    "\"AutoLockManagers\"",
    "\"TaskDefaults\"",
    "\"LogDriver\"",
];

/// Field names of the small bodies.
pub const SMALL_DICT: &[&str] =
    &["\"UnlockKey\"", "\"Name\"", "\"CSR\"", "SWMKEY-1-", "-----BEGIN CERTIFICATE REQUEST-----"];

/// Filter keys and values.
pub const FILTER_DICT: &[&str] = &[
    "\"id\"",
    "\"name\"",
    "\"label\"",
    "\"mode\"",
    "\"role\"",
    "\"membership\"",
    "\"service\"",
    "\"node\"",
    "\"desired-state\"",
    "\"names\"",
    "\"replicated\"",
    "\"global\"",
    "\"running\"",
    "\"shutdown\"",
    "\"accepted\"",
    "true",
];

/// Log query keys.
pub const LOGS_DICT: &[&str] =
    &["stdout=1", "stderr=1", "tail=", "since=", "follow=1", "timestamps=1", "details=1", "all"];

/// `POST /services/create` and `/services/{id}/update`: the body decoded, converted and validated; a spec
/// that passes is also converted back (what `GET /services/{id}` does) and its encoded size computed (what
/// the orchestrator does per task).
pub fn service_spec(data: &[u8]) {
    let Ok(spec) = decode::<ServiceSpecJson>(data) else { return };
    let _ = spec.clone().with_defaults();
    let Ok(api) = spec.to_api() else { return };
    if controlapi::validate_service_spec(&api).is_ok() {
        let back = ServiceSpecJson::from_api(&api);
        let _ = back.with_defaults();
        let _ = shoal_api::prost::Message::encoded_len(&api);
    }
}

/// `POST /secrets/create` and `/configs/create` (the first byte chooses which): the body decoded (the data
/// from base64), converted, validated as `controlapi` does, and shown back as inspect shows it.
pub fn secret_spec(data: &[u8]) {
    let (sel, body) = split_selector(data);
    if sel & 1 == 0 {
        let Ok(spec) = decode::<SecretSpecJson>(body) else { return };
        let Ok(api) = spec.to_api() else { return };
        if controlapi::validate_secret_spec(&api).is_ok() {
            let secret = shoal_api::Secret { spec: Some(api), ..Default::default() };
            assert!(SecretJson::from_api(&secret).spec.data.is_empty(), "a secret's data is never shown");
        }
    } else {
        let Ok(spec) = decode::<ConfigSpecJson>(body) else { return };
        let Ok(api) = spec.to_api() else { return };
        if controlapi::validate_config_spec(&api).is_ok() {
            let config = shoal_api::Config { spec: Some(api.clone()), ..Default::default() };
            let back = ConfigJson::from_api(&config).spec;
            assert_eq!(back.to_api().ok(), Some(api), "a config's spec round-trips");
        }
    }
}

/// Field names of a cluster volume's create and update bodies.
pub const VOLUME_DICT: &[&str] = &[
    "\"Name\"",
    "\"Driver\"",
    "\"DriverOpts\"",
    "\"Labels\"",
    "\"ClusterVolumeSpec\"",
    "\"Spec\"",
    "\"Group\"",
    "\"AccessMode\"",
    "\"Scope\"",
    "\"Sharing\"",
    "\"MountVolume\"",
    "\"BlockVolume\"",
    "\"FsType\"",
    "\"MountFlags\"",
    "\"AccessibilityRequirements\"",
    "\"Requisite\"",
    "\"Preferred\"",
    "\"Segments\"",
    "\"CapacityRange\"",
    "\"RequiredBytes\"",
    "\"LimitBytes\"",
    "\"Secrets\"",
    "\"Key\"",
    "\"Secret\"",
    "\"Availability\"",
    "\"onewriter\"",
    "\"drain\"",
];

/// `POST /volumes/create` with a `ClusterVolumeSpec`, and `PUT /volumes/{name}` (the first byte chooses
/// which): the body decoded, converted (an update applied onto the created spec, as the handler does),
/// validated as `controlapi` does, and shown back as inspect shows it, which must apply as no change.
pub fn volume_create(data: &[u8]) {
    let (sel, body) = split_selector(data);
    let base = || {
        let req: VolumeCreateJson =
            decode(br#"{"Name":"v","Driver":"csi","ClusterVolumeSpec":{"AccessMode":{"MountVolume":{}}}}"#)
                .expect("the base volume decodes");
        req.to_api().expect("the base volume converts")
    };
    let api = if sel & 1 == 0 {
        let Ok(req) = decode::<VolumeCreateJson>(body) else { return };
        let Ok(api) = req.to_api() else { return };
        api
    } else {
        let Ok(req) = decode::<VolumeUpdateJson>(body) else { return };
        let mut api = base();
        if req.spec.map(|s| s.apply_to(&mut api)).transpose().is_err() {
            return;
        }
        api
    };
    if controlapi::validate_volume_spec(&api).is_ok() {
        let volume = shoal_api::Volume { spec: Some(api.clone()), ..Default::default() };
        let shown = VolumeJson::from_api(&volume).cluster_volume.expect("a cluster volume shows its part").spec;
        let mut again = api.clone();
        shown.apply_to(&mut again).expect("what inspect shows applies");
        assert_eq!(again, api, "an inspected spec sent back changes nothing");
    }
}

/// `POST /nodes/{id}/update`: the body decoded and converted (membership as the stored node has it).
pub fn node_spec(data: &[u8]) {
    let Ok(spec) = decode::<NodeSpecJson>(data) else { return };
    for membership in [node_spec::Membership::Accepted, node_spec::Membership::Pending] {
        if let Ok(api) = spec.to_api(membership) {
            let _ = NodeSpecJson::from_api(&api);
        }
    }
}

/// `POST /swarm/update`: the body decoded, merged into the current spec (default and a typical one) and
/// validated as `controlapi::update_cluster` does.
pub fn swarm_spec(data: &[u8]) {
    let Ok(j) = decode::<SwarmSpecJson>(data) else { return };
    let current = ClusterSpec::default();
    let merged = swarm_update::merge_spec(&current, &j);
    let _ = controlapi::validate_cluster_spec(&current, &merged);
    let again = swarm_update::merge_spec(&merged, &j);
    let _ = controlapi::validate_cluster_spec(&merged, &again);
}

/// The other bodies a client sends: `POST /swarm/unlock` (then the key parsed), the operator client
/// certificate request (the name check; the CSR has its own target), `POST /swarm/init` and `/swarm/join`
/// (decoded and checked as the handlers do, addresses, token and the init spec merged and validated), and
/// any JSON document through the Go-style decoder into a generic value.
pub fn small_bodies(data: &[u8]) {
    let (sel, body) = split_selector(data);
    match sel % 5 {
        3 => {
            if let Ok(req) = decode::<shoal_engine_api::lifecycle::InitRequestJson>(body) {
                let _ = shoal_engine_api::lifecycle::check_init(req, &ClusterSpec::default());
            }
        }
        4 => {
            if let Ok(req) = decode::<shoal_engine_api::lifecycle::JoinRequestJson>(body) {
                let _ = shoal_engine_api::lifecycle::check_join(req);
            }
        }
        0 => {
            if let Ok(req) = decode::<UnlockRequestJson>(body) {
                let _ = shoal_ca::UnlockKey::parse(&req.unlock_key);
            }
        }
        1 => {
            if let Ok(req) = decode::<ClientCertRequest>(body) {
                let _ = (req.name.len(), req.csr.len());
            }
        }
        _ => {
            let _ = decode::<serde_json::Value>(body);
        }
    }
}

/// `filters=` of `GET /services`, `/nodes`, `/tasks` and `/secrets` (the same string through each parser).
pub fn filters(data: &[u8]) {
    let raw = String::from_utf8_lossy(data);
    let _ = filters::services(Some(&raw));
    let _ = filters::nodes(Some(&raw));
    let _ = filters::tasks(Some(&raw));
    let _ = filters::secrets(Some(&raw));
    let _ = filters::parse(Some(&raw), &["id", "name", "label"]);
}

/// The query of `GET /services/{id}/logs` and `/tasks/{id}/logs`, as `key=value&...` (percent-decoded as
/// axum's `Query` does); the first byte chooses whether the task has a TTY.
pub fn logs_query(data: &[u8]) {
    let (sel, rest) = split_selector(data);
    let raw = String::from_utf8_lossy(rest);
    let mut q = HashMap::new();
    for pair in raw.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let (Ok(k), Ok(v)) = (urlencoding::decode(k), urlencoding::decode(v)) else { continue };
        q.insert(k.into_owned(), v.into_owned());
    }
    let _ = logs::parse_query(&q, sel & 1 == 1);
}
