//! In-process tests of every endpoint and error class: the router driven with `tower::ServiceExt::oneshot`
//! over a `ClusterState` with a `LocalProposer`, a `ManualClock` and seeded IDs.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use shoal_api::{
    node_status, Cluster, ClusterSpec, Node, NodeDescription, NodeRole, NodeSpec, NodeStatus, Task, TaskState,
    TaskStatus,
};
use shoal_manager::{ClusterState, RandomIds};
use shoal_raft::LocalProposer;
use shoal_store::{Changes, ManualClock, MemoryStore};
use tower::ServiceExt;

use crate::{router, ApiContext};

pub(crate) fn test_state() -> (ClusterState, Arc<LocalProposer>) {
    let store = Arc::new(MemoryStore::default());
    let proposer = Arc::new(LocalProposer::new(store.clone()));
    let state = ClusterState::new(
        store,
        proposer.clone(),
        Arc::new(ManualClock::new(1_700_000_000_000)),
        Arc::new(RandomIds::seeded(42)),
    );
    (state, proposer)
}

pub(crate) fn ctx(state: ClusterState) -> ApiContext {
    ApiContext {
        events: crate::events::EventLog::new(shoal_manager::WatchService::new(state.clone(), None, None)),
        state,
        node_id: "node1".into(),
        node_addr: "127.0.0.1:4242".into(),
        executor: "process".into(),
        hostname: "box1".into(),
        leader_logs: None,
        lifecycle: Default::default(),
    }
}

struct Api {
    state: ClusterState,
    proposer: Arc<LocalProposer>,
}

struct Reply {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Value,
    text: String,
}

impl Api {
    fn new() -> Api {
        let (state, proposer) = test_state();
        Api { state, proposer }
    }

    async fn call(&self, method: Method, uri: &str, body: Option<Value>) -> Reply {
        self.raw(method, uri, body.map(|b| b.to_string())).await
    }

    async fn raw(&self, method: Method, uri: &str, body: Option<String>) -> Reply {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", "application/json")
            .body(body.map(Body::from).unwrap_or_else(Body::empty))
            .unwrap();
        let resp = router(ctx(self.state.clone())).oneshot(req).await.unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Reply { status, headers, body, text }
    }

    async fn create(&self, name: &str, replicas: i64) -> String {
        let r = self.call(Method::POST, "/services/create", Some(spec(name, replicas))).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
        r.body["ID"].as_str().unwrap().to_string()
    }

    async fn seed(&self, f: impl FnOnce(&mut Changes)) {
        let mut c = Changes::new();
        f(&mut c);
        self.state.propose(c).await.unwrap();
    }
}

fn spec(name: &str, replicas: i64) -> Value {
    json!({
        "Name": name,
        "Labels": {},
        "TaskTemplate": {"ContainerSpec": {"Image": "busybox:latest", "Args": ["sleep", "3141"], "Init": false,
                                           "DNSConfig": {}},
                         "Resources": {"Limits": {}, "Reservations": {}}, "Placement": {}, "ForceUpdate": 0},
        "Mode": {"Replicated": {"Replicas": replicas}},
        "EndpointSpec": {"Mode": "vip"}
    })
}

/// A task of `svc` in slot 1 on `node`, running and meant to run.
fn running_task(svc: &shoal_api::Service, id: &str, node: &str) -> Task {
    let mut t = Task {
        id: id.into(),
        service_id: svc.id.clone(),
        slot: 1,
        node_id: node.into(),
        spec: svc.spec.as_ref().unwrap().task.clone().map(Into::into),
        status: Some(TaskStatus { state: TaskState::Running as i32, message: "started".into(), ..Default::default() }),
        ..Default::default()
    };
    t.set_desired_state(TaskState::Running);
    t
}

fn node(id: &str, host: &str, role: NodeRole) -> Node {
    let mut n = Node {
        id: id.into(),
        spec: Some(NodeSpec::default()),
        description: Some(NodeDescription { hostname: host.into(), ..Default::default() }),
        status: Some(NodeStatus { addr: "127.0.0.1".into(), ..Default::default() }),
        ..Default::default()
    };
    n.set_role(role);
    n.spec.as_mut().unwrap().set_desired_role(role);
    n.status.as_mut().unwrap().set_state(node_status::State::Ready);
    n
}

fn assert_error(r: &Reply, status: StatusCode, fragment: &str) {
    assert_eq!(r.status, status, "{}", r.text);
    let msg = r.body["message"].as_str().unwrap_or_else(|| panic!("no JSON message in {:?}", r.text));
    assert!(msg.contains(fragment), "message {msg:?} lacks {fragment:?}");
}

#[tokio::test]
async fn ping_version_and_headers_with_and_without_prefix() {
    let api = Api::new();
    for uri in ["/_ping", "/v1.47/_ping", "/v1.24/_ping"] {
        let r = api.raw(Method::GET, uri, None).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.text, "OK");
        assert_eq!(r.headers["API-Version"], "1.47");
        assert_eq!(r.headers["OSType"], "linux");
        assert!(r.headers["Server"].to_str().unwrap().starts_with("Shoal/"));
    }
    let head = api.raw(Method::HEAD, "/_ping", None).await;
    assert_eq!(head.status, StatusCode::OK);
    assert_eq!(head.headers["API-Version"], "1.47");

    let v = api.call(Method::GET, "/v1.47/version", None).await;
    assert_eq!(v.body["ApiVersion"], "1.47");
    assert_eq!(v.body["Os"], "linux");
    assert_eq!(v.headers["API-Version"], "1.47");
}

#[tokio::test]
async fn unknown_paths_are_404_json_with_headers() {
    let api = Api::new();
    for uri in ["/containers/json", "/v1.47/containers/json", "/vx.y/services"] {
        let r = api.call(Method::GET, uri, None).await;
        assert_error(&r, StatusCode::NOT_FOUND, "page not found");
        assert_eq!(r.headers["API-Version"], "1.47");
    }
    let d = api.call(Method::GET, "/distribution/library/busybox:latest/json", None).await;
    assert_error(&d, StatusCode::NOT_IMPLEMENTED, "registries");
}

#[tokio::test]
async fn info_and_swarm_describe_the_node_and_cluster() {
    let api = Api::new();
    let r = api.call(Method::GET, "/swarm", None).await;
    assert_error(&r, StatusCode::SERVICE_UNAVAILABLE, "not initialized");

    let mut cluster = Cluster {
        id: "cluster1".into(),
        spec: Some(ClusterSpec {
            annotations: Some(shoal_api::Annotations { name: "default".into(), ..Default::default() }),
            orchestration: Some(shoal_api::OrchestrationConfig {
                task_history_retention_limit: 5,
                ..Default::default()
            }),
            dispatcher: Some(shoal_api::DispatcherConfig {
                heartbeat_period: Some(shoal_api::prost_types::Duration { seconds: 5, nanos: 0 }),
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    cluster.root_ca = Some(shoal_api::RootCa {
        join_tokens: Some(shoal_api::JoinTokens { worker: "SWMTKN-w".into(), manager: "SWMTKN-m".into() }),
        ..Default::default()
    });
    api.seed(|c| {
        c.create(cluster);
        c.create(node("node1", "box1", NodeRole::Manager));
        c.create(node("node2", "box2", NodeRole::Worker));
    })
    .await;

    let s = api.call(Method::GET, "/swarm", None).await;
    assert_eq!(s.status, StatusCode::OK, "{}", s.text);
    assert_eq!(s.body["ID"], "cluster1");
    assert_eq!(s.body["Spec"]["Orchestration"]["TaskHistoryRetentionLimit"], 5);
    assert_eq!(s.body["Spec"]["Dispatcher"]["HeartbeatPeriod"], 5_000_000_000i64);
    assert_eq!(s.body["JoinTokens"]["Worker"], "SWMTKN-w");

    let i = api.call(Method::GET, "/info", None).await;
    let sw = &i.body["Swarm"];
    assert_eq!(i.body["Name"], "box1");
    assert_eq!(i.body["OSType"], "linux");
    assert_eq!(sw["NodeID"], "node1");
    assert_eq!(sw["NodeAddr"], "127.0.0.1:4242");
    assert_eq!(sw["LocalNodeState"], "active");
    assert_eq!(sw["ControlAvailable"], true);
    assert_eq!(sw["Nodes"], 2);
    assert_eq!(sw["Managers"], 1);
    assert_eq!(sw["RemoteManagers"][0]["Addr"], "127.0.0.1:4242");
    assert_eq!(sw["Cluster"]["ID"], "cluster1");
    // What `docker info` and the SDKs read besides.
    for (doc, field, want) in [
        (&s.body, "DataPathPort", json!(4789)),
        (&s.body, "DefaultAddrPool", json!(["10.0.0.0/8"])),
        (&s.body, "SubnetSize", json!(24)),
        (&sw["Cluster"], "DataPathPort", json!(4789)),
        (&i.body, "LoggingDriver", json!("json-file")),
        (&i.body, "CgroupDriver", json!("cgroupfs")),
        (&i.body, "IndexServerAddress", json!("https://index.docker.io/v1/")),
        (&i.body, "Warnings", json!([])),
        (&i.body, "SecurityOptions", json!([])),
        (&i.body, "Plugins", json!({"Volume": [], "Network": [], "Authorization": [], "Log": []})),
    ] {
        assert_eq!(doc[field], want, "{field}");
    }
    assert!(i.body["NFd"].as_u64().is_some_and(|n| n > 0), "{}", i.text);
    assert!(matches!(i.body["CgroupVersion"].as_str(), Some("1" | "2")), "{}", i.text);
    let now = time::OffsetDateTime::now_utc();
    let t = time::OffsetDateTime::parse(
        i.body["SystemTime"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .expect("SystemTime is RFC 3339");
    assert!((now - t).abs() < time::Duration::minutes(1), "{t} vs {now}");
}

#[tokio::test]
async fn service_lifecycle_create_inspect_list_update_remove() {
    let api = Api::new();
    let id = api.create("web", 3).await;
    assert_eq!(id.len(), 25);

    let g = api.call(Method::GET, "/v1.47/services/web?insertDefaults=false", None).await;
    assert_eq!(g.status, StatusCode::OK);
    assert_eq!(g.body["Spec"]["UpdateConfig"], Value::Null, "{}", g.text);
    // insertDefaults fills in SwarmKit's defaults, as `docker service inspect` shows them.
    let d = api.call(Method::GET, "/services/web?insertDefaults=true", None).await;
    let with_defaults = &d.body["Spec"];
    for (path, want) in [
        (
            "/UpdateConfig",
            json!({"Parallelism": 1, "FailureAction": "pause", "Monitor": 5_000_000_000i64,
                                 "MaxFailureRatio": 0.0, "Order": "stop-first"}),
        ),
        ("/RollbackConfig/Order", json!("stop-first")),
        ("/TaskTemplate/ContainerSpec/StopGracePeriod", json!(10_000_000_000i64)),
        ("/TaskTemplate/RestartPolicy", json!({"Condition": "any", "Delay": 5_000_000_000i64})),
    ] {
        assert_eq!(with_defaults.pointer(path), Some(&want), "{path}: {}", d.text);
    }
    assert_eq!(g.body["ID"], id.as_str());
    assert_eq!(g.body["Spec"]["Name"], "web");
    assert_eq!(g.body["Spec"]["Mode"]["Replicated"]["Replicas"], 3);
    assert_eq!(g.body["Spec"]["TaskTemplate"]["ContainerSpec"]["Args"], json!(["sleep", "3141"]));
    assert_eq!(g.body["CreatedAt"], "2023-11-14T22:13:20Z");
    let version = g.body["Version"]["Index"].as_u64().unwrap();

    // A running task makes RunningTasks 1.
    let svc = shoal_manager::controlapi::get_service(&api.state, &id).unwrap();
    api.seed(|c| {
        c.create(running_task(&svc, "task1", "node1"));
    })
    .await;
    let l = api.call(Method::GET, "/services?status=true", None).await;
    assert_eq!(l.body[0]["ServiceStatus"], json!({"RunningTasks": 1, "DesiredTasks": 3, "CompletedTasks": 0}));
    let plain = api.call(Method::GET, "/services", None).await;
    assert!(plain.body[0].get("ServiceStatus").is_none());
    let by_name = api.call(Method::GET, "/services?filters=%7B%22name%22%3A%7B%22we%22%3Atrue%7D%7D", None).await;
    assert_eq!(by_name.body.as_array().unwrap().len(), 1);
    let none = api.call(Method::GET, "/services?filters=%7B%22id%22%3A%5B%22zzz%22%5D%7D", None).await;
    assert_eq!(none.body, json!([]));

    let u = api.call(Method::POST, &format!("/services/{id}/update?version={version}"), Some(spec("web", 5))).await;
    assert_eq!(u.status, StatusCode::OK, "{}", u.text);
    assert_eq!(u.body, json!({"Warnings": []}));
    let g2 = api.call(Method::GET, &format!("/services/{id}"), None).await;
    assert_eq!(g2.body["Spec"]["Mode"]["Replicated"]["Replicas"], 5);
    assert_eq!(g2.body["PreviousSpec"]["Mode"]["Replicated"]["Replicas"], 3);

    // Stale version -> 409.
    let stale = api.call(Method::POST, &format!("/services/{id}/update?version={version}"), Some(spec("web", 6))).await;
    assert_error(&stale, StatusCode::CONFLICT, "update out of sequence");
    // Clients' retry helpers match Docker's words as the message's suffix.
    assert!(stale.body["message"].as_str().unwrap().ends_with("update out of sequence"), "{}", stale.text);
    // Rollback to the previous spec.
    let v2 = g2.body["Version"]["Index"].as_u64().unwrap();
    let rb = api.call(Method::POST, &format!("/services/{id}/update?version={v2}&rollback=previous"), None).await;
    assert_eq!(rb.status, StatusCode::OK, "{}", rb.text);
    let g3 = api.call(Method::GET, &format!("/services/{id}"), None).await;
    assert_eq!(g3.body["Spec"]["Mode"]["Replicated"]["Replicas"], 3);
    assert_eq!(g3.body["PreviousSpec"]["Mode"]["Replicated"]["Replicas"], 5);
    assert_eq!(g3.body["UpdateStatus"]["State"], "rollback_started");
    assert_eq!(g3.body["UpdateStatus"]["Message"], "manually requested rollback");
    // Another rollback value is refused and changes nothing.
    let v3 = g3.body["Version"]["Index"].as_u64().unwrap();
    let bad = api
        .call(Method::POST, &format!("/services/{id}/update?version={v3}&rollback=next"), Some(spec("web", 7)))
        .await;
    assert_error(&bad, StatusCode::BAD_REQUEST, "unrecognized rollback option");
    let g4 = api.call(Method::GET, &format!("/services/{id}"), None).await;
    assert_eq!(g4.body["Version"], g3.body["Version"]);

    let t = api.call(Method::GET, "/tasks?filters=%7B%22service%22%3A%7B%22web%22%3Atrue%7D%7D", None).await;
    assert_eq!(t.body[0]["ID"], "task1");
    assert_eq!(t.body[0]["Status"]["State"], "running");
    assert_eq!(t.body[0]["DesiredState"], "running");
    assert_eq!(t.body[0]["Slot"], 1);
    let t1 = api.call(Method::GET, "/tasks/task1", None).await;
    assert_eq!(t1.body["ServiceID"], id.as_str());
    assert_error(&api.call(Method::GET, "/tasks/nope", None).await, StatusCode::NOT_FOUND, "task nope not found");

    let d = api.call(Method::DELETE, "/services/web", None).await;
    assert_eq!(d.status, StatusCode::OK, "{}", d.text);
    assert_error(&api.call(Method::GET, "/services/web", None).await, StatusCode::NOT_FOUND, "service web not found");
    assert_error(&api.call(Method::DELETE, "/services/web", None).await, StatusCode::NOT_FOUND, "not found");
    let t1 = api.call(Method::GET, "/tasks/task1", None).await;
    assert_eq!(t1.body["DesiredState"], "remove");
}

#[tokio::test]
async fn bad_service_requests_are_400_and_conflicts_409() {
    let api = Api::new();
    api.create("web", 1).await;
    let dup = api.call(Method::POST, "/services/create", Some(spec("web", 1))).await;
    assert_error(&dup, StatusCode::CONFLICT, "service name web is already in use");

    let neg = api.call(Method::POST, "/services/create", Some(spec("neg", -1))).await;
    assert_error(&neg, StatusCode::BAD_REQUEST, "Replicas -1");
    let malformed = api.raw(Method::POST, "/services/create", Some("{not json".into())).await;
    assert_error(&malformed, StatusCode::BAD_REQUEST, "invalid JSON: key must be a string");
    let wrong_type = api.call(Method::POST, "/services/create", Some(json!({"Name": 5}))).await;
    assert_error(&wrong_type, StatusCode::BAD_REQUEST, "invalid type");
    let empty = api.raw(Method::POST, "/services/create", None).await;
    assert_error(&empty, StatusCode::BAD_REQUEST, "body is empty");
    let mut bad_constraint = spec("bc", 1);
    bad_constraint["TaskTemplate"]["Placement"]["Constraints"] = json!(["node.colour==red"]);
    let r = api.call(Method::POST, "/services/create", Some(bad_constraint)).await;
    assert_error(&r, StatusCode::BAD_REQUEST, "unknown key");
    let mut nulls = spec("nulls", 1);
    nulls["Labels"] = Value::Null;
    nulls["TaskTemplate"]["ContainerSpec"]["Env"] = Value::Null;
    let r = api.call(Method::POST, "/services/create", Some(nulls)).await;
    assert_eq!(r.status, StatusCode::CREATED, "Go's null maps and slices are accepted: {}", r.text);
    let no_image = api.call(Method::POST, "/services/create", Some(json!({"Name": "x"}))).await;
    assert_error(&no_image, StatusCode::BAD_REQUEST, "image");
    let bad_name = api.call(Method::POST, "/services/create", Some(spec("-x", 1))).await;
    assert_error(&bad_name, StatusCode::BAD_REQUEST, "invalid service name");

    let no_version = api.call(Method::POST, "/services/web/update", Some(spec("web", 2))).await;
    assert_error(&no_version, StatusCode::BAD_REQUEST, "version query parameter is required");
    let bad_filter = api.call(Method::GET, "/services?filters=%7Bnope", None).await;
    assert_error(&bad_filter, StatusCode::BAD_REQUEST, "invalid filter");
    let unknown_filter = api.call(Method::GET, "/tasks?filters=%7B%22colour%22%3A%5B%22x%22%5D%7D", None).await;
    assert_error(&unknown_filter, StatusCode::BAD_REQUEST, "invalid filter 'colour'");
    let nf = api.call(Method::POST, "/services/nope/update?version=1", Some(spec("nope", 1))).await;
    assert_error(&nf, StatusCode::NOT_FOUND, "service nope not found");
}

#[tokio::test]
async fn writes_on_a_follower_are_503() {
    let api = Api::new();
    api.proposer.set_leader(false);
    let r = api.call(Method::POST, "/services/create", Some(spec("web", 1))).await;
    assert_error(&r, StatusCode::SERVICE_UNAVAILABLE, "not the leader");
}

#[tokio::test]
async fn nodes_list_inspect_update_remove() {
    let api = Api::new();
    api.seed(|c| {
        c.create(node("node1", "box1", NodeRole::Manager));
        c.create(node("node2", "box2", NodeRole::Worker));
    })
    .await;
    let l = api.call(Method::GET, "/nodes", None).await;
    assert_eq!(l.body.as_array().unwrap().len(), 2);
    assert_eq!(l.body[0]["Description"]["Hostname"], "box1");
    assert_eq!(l.body[0]["Status"]["State"], "ready");
    assert_eq!(l.body[0]["Spec"]["Role"], "manager");
    let w = api.call(Method::GET, "/nodes?filters=%7B%22role%22%3A%7B%22worker%22%3Atrue%7D%7D", None).await;
    assert_eq!(w.body[0]["ID"], "node2");

    let n = api.call(Method::GET, "/nodes/box2", None).await;
    let v = n.body["Version"]["Index"].as_u64().unwrap();
    let body = json!({"Labels": {"zone": "east"}, "Role": "worker", "Availability": "drain"});
    let u = api.call(Method::POST, &format!("/nodes/node2/update?version={v}"), Some(body.clone())).await;
    assert_eq!(u.status, StatusCode::OK, "{}", u.text);
    let n2 = api.call(Method::GET, "/nodes/node2", None).await;
    assert_eq!(n2.body["Spec"]["Availability"], "drain");
    assert_eq!(n2.body["Spec"]["Labels"]["zone"], "east");
    let stale = api.call(Method::POST, &format!("/nodes/node2/update?version={v}"), Some(body)).await;
    assert_eq!(stale.status, StatusCode::CONFLICT, "{}", stale.text);
    let bad = api
        .call(Method::POST, "/nodes/node2/update?version=1", Some(json!({"Role": "boss", "Availability": "active"})))
        .await;
    assert_error(&bad, StatusCode::BAD_REQUEST, "NodeSpec.Role");

    let v1 = api.call(Method::GET, "/nodes/node1", None).await.body["Version"]["Index"].as_u64().unwrap();
    let demote = api
        .call(
            Method::POST,
            &format!("/nodes/node1/update?version={v1}"),
            Some(json!({"Role": "worker", "Availability": "active"})),
        )
        .await;
    assert_error(&demote, StatusCode::BAD_REQUEST, "last manager");

    assert_error(&api.call(Method::DELETE, "/nodes/node2", None).await, StatusCode::BAD_REQUEST, "force");
    assert_eq!(api.call(Method::DELETE, "/nodes/node2?force=true", None).await.status, StatusCode::OK);
    assert_error(&api.call(Method::GET, "/nodes/node2", None).await, StatusCode::NOT_FOUND, "node node2 not found");
}

#[tokio::test]
async fn swarm_update_rotates_join_tokens_at_the_current_version() {
    let api = Api::new();
    let mut cluster = Cluster { id: "cluster1".into(), ..Default::default() };
    cluster.root_ca = Some(shoal_manager::new_root_ca(std::time::SystemTime::now()).unwrap());
    api.seed(|c| {
        c.create(cluster);
    })
    .await;
    let before = api.call(Method::GET, "/swarm", None).await;
    let version = before.body["Version"]["Index"].as_u64().unwrap();
    let (w0, m0) = (before.body["JoinTokens"]["Worker"].clone(), before.body["JoinTokens"]["Manager"].clone());
    assert!(w0.as_str().unwrap().starts_with("SWMTKN-1-"), "{w0}");

    let stale = api
        .call(Method::POST, &format!("/swarm/update?version={}&rotateWorkerToken=true", version + 7), Some(json!({})))
        .await;
    assert_eq!(stale.status, StatusCode::CONFLICT, "{}", stale.text);

    let r = api
        .call(
            Method::POST,
            &format!("/v1.47/swarm/update?version={version}&rotateWorkerToken=true&rotateManagerToken=false"),
            Some(before.body["Spec"].clone()),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let after = api.call(Method::GET, "/swarm", None).await;
    assert_ne!(after.body["JoinTokens"]["Worker"], w0, "worker token rotated");
    assert_eq!(after.body["JoinTokens"]["Manager"], m0, "manager token kept");
    assert!(after.body["Version"]["Index"].as_u64().unwrap() > version);
}

#[tokio::test]
async fn api_versions_from_1_24_to_1_47_and_the_engine_message_outside() {
    let api = Api::new();
    for (uri, status, fragment) in [
        ("/v1.24/info", StatusCode::OK, ""),
        ("/v1.41/services", StatusCode::OK, ""),
        ("/v1.47/nodes", StatusCode::OK, ""),
        (
            "/v1.23/info",
            StatusCode::BAD_REQUEST,
            "client version 1.23 is too old. Minimum supported API version is 1.24, please upgrade your client to a \
             newer version",
        ),
        ("/v1.12/_ping", StatusCode::BAD_REQUEST, "client version 1.12 is too old"),
        (
            "/v1.48/info",
            StatusCode::BAD_REQUEST,
            "client version 1.48 is too new. Maximum supported API version is \
                                                  1.47",
        ),
    ] {
        let r = api.call(Method::GET, uri, None).await;
        if fragment.is_empty() {
            assert_eq!(r.status, status, "{uri}: {}", r.text);
        } else {
            assert_error(&r, status, fragment);
            assert_eq!(r.headers["content-type"], "application/json", "{uri}");
        }
    }
}

#[tokio::test]
async fn every_error_answer_is_json() {
    let api = Api::new();
    for (method, uri, body, status) in [
        (Method::PUT, "/services/create", None, StatusCode::METHOD_NOT_ALLOWED),
        (Method::DELETE, "/v1.47/info", None, StatusCode::METHOD_NOT_ALLOWED),
        (Method::GET, "/plugins", None, StatusCode::NOT_FOUND),
        (Method::GET, "/services/%FF", None, StatusCode::BAD_REQUEST),
        (Method::POST, "/services/create", Some("{\"Name\": 1}".to_string()), StatusCode::BAD_REQUEST),
        (Method::POST, "/services/create", Some("[]".to_string()), StatusCode::BAD_REQUEST),
        (Method::POST, "/nodes/x/update?version=1", Some("{}".to_string()), StatusCode::NOT_FOUND),
    ] {
        let r = api.raw(method.clone(), uri, body).await;
        assert_eq!(r.status, status, "{method} {uri}: {}", r.text);
        assert_eq!(r.headers["content-type"], "application/json", "{method} {uri}");
        assert!(r.body["message"].as_str().is_some_and(|m| !m.is_empty()), "{method} {uri}: {}", r.text);
    }
    // A body that is not JSON is refused as the engine refuses it.
    let req = Request::builder()
        .method(Method::POST)
        .uri("/services/create")
        .header("content-type", "text/plain")
        .body(Body::from(spec("web", 1).to_string()))
        .unwrap();
    let resp = router(ctx(api.state.clone())).oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&bytes)
        .contains("unsupported Content-Type header (text/plain): must be 'application/json'"));
}

#[tokio::test]
async fn service_specs_are_decoded_as_go_would_and_bad_combinations_refused() {
    let api = Api::new();
    // The Python SDK's casing: {"Mode": {"replicated": {"Replicas": 5}}}, and nulls for what it leaves unset.
    let r = api
        .call(
            Method::POST,
            "/services/create",
            Some(json!({"name": "web", "labels": null, "taskTemplate": {"containerSpec": {"image": "busybox",
                "args": null}},
                        "mode": {"replicated": {"Replicas": 5}}, "UpdateConfig": null, "endpointSpec": null})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let g = api.call(Method::GET, "/services/web", None).await;
    assert_eq!(g.body["Spec"]["Mode"]["Replicated"]["Replicas"], 5, "{}", g.text);
    assert_eq!(g.body["Spec"]["TaskTemplate"]["ContainerSpec"]["Image"], "busybox");
    // Scale through an update with lower-case keys.
    let version = g.body["Version"]["Index"].as_u64().unwrap();
    let mut upd = g.body["Spec"].clone();
    upd["Mode"] = json!({"REPLICATED": {"replicas": 3}});
    let r = api.call(Method::POST, &format!("/services/web/update?version={version}"), Some(upd)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let g = api.call(Method::GET, "/services/web", None).await;
    assert_eq!(g.body["Spec"]["Mode"]["Replicated"]["Replicas"], 3, "{}", g.text);

    let mut both = spec("two", 1);
    both["Mode"]["Global"] = json!({});
    let mut dup = spec("dup", 1);
    dup["EndpointSpec"]["Ports"] =
        json!([{"TargetPort": 80, "PublishedPort": 8080}, {"TargetPort": 81, "PublishedPort": 8080}]);
    let mut dnsrr = spec("dnsrr", 1);
    dnsrr["EndpointSpec"] = json!({"Mode": "dnsrr", "Ports": [{"TargetPort": 80, "PublishedPort": 8080}]});
    for (doc, fragment) in [
        (both, "must specify only one service mode"),
        (dup, "duplicate published ports provided (8080/tcp)"),
        (dnsrr, "can't be used with dnsrr mode"),
    ] {
        assert_error(&api.call(Method::POST, "/services/create", Some(doc)).await, StatusCode::BAD_REQUEST, fragment);
    }
    // Same port on two protocols, or unpublished twice: not a duplicate.
    let mut ok = spec("ok", 1);
    ok["EndpointSpec"]["Ports"] = json!([{"TargetPort": 53, "PublishedPort": 5353, "Protocol": "udp"},
                                          {"TargetPort": 53, "PublishedPort": 5353, "Protocol": "tcp"},
                                          {"TargetPort": 80}, {"TargetPort": 81}]);
    let r = api.call(Method::POST, "/services/create", Some(ok)).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    // Nothing was written by the refused ones.
    let list = api.call(Method::GET, "/services", None).await;
    assert_eq!(list.body.as_array().map(Vec::len), Some(2), "{}", list.text);
}

#[tokio::test]
async fn filters_of_the_wrong_shape_are_400() {
    let api = Api::new();
    for (filters, status, fragment) in [
        (r#"{"name":{"web":true}}"#, StatusCode::OK, ""),
        (r#"{"name":["web"]}"#, StatusCode::OK, ""),
        (r#"{"name":{"web":"yes"}}"#, StatusCode::BAD_REQUEST, "invalid filter"),
        (r#"{"colour":{"red":true}}"#, StatusCode::BAD_REQUEST, "invalid filter 'colour'"),
        (r#"{"name":"web"}"#, StatusCode::BAD_REQUEST, "invalid filter"),
    ] {
        for path in ["/services", "/tasks", "/nodes"] {
            let uri = format!("{path}?filters={}", urlencode(filters));
            let r = api.call(Method::GET, &uri, None).await;
            if fragment.is_empty() {
                assert_eq!(r.status, status, "{uri}: {}", r.text);
            } else {
                assert_error(&r, status, fragment);
            }
        }
    }
}

fn urlencode(s: &str) -> String {
    s.bytes().map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") }).collect()
}

/// `spec(name, 1)` with `value` set at `pointer` (a JSON pointer; objects on the way are made).
fn spec_with(name: &str, pointer: &str, value: Value) -> Value {
    let mut doc = spec(name, 1);
    let mut at = &mut doc;
    for key in pointer.trim_start_matches('/').split('/') {
        if at.get(key).is_none() {
            at[key] = json!({});
        }
        at = &mut at[key];
    }
    *at = value;
    doc
}

/// What one API version difference gives: at `old` and at `new`, the same request; each side either creates
/// the service and shows `want` at `shown` in its inspect (None: absent), or is refused with a 400 holding the
/// fragment.
enum Outcome {
    Shows(&'static str, Option<Value>),
    Refused(&'static str),
}

#[tokio::test]
async fn service_specs_lose_what_the_api_version_did_not_have_as_the_engine_does() {
    use Outcome::*;
    let health = json!({"Test": ["CMD", "true"], "Interval": 1_000_000_000i64, "StartInterval": 500_000_000i64});
    let cases: Vec<(&str, Value, &str, Outcome, &str, Outcome)> = vec![
        // (what, field set at pointer, old version, outcome, new version, outcome)
        (
            "MaxReplicas",
            json!(["/TaskTemplate/Placement/MaxReplicas", 2]),
            "1.39",
            Shows("/Spec/TaskTemplate/Placement/MaxReplicas", None),
            "1.40",
            Shows("/Spec/TaskTemplate/Placement/MaxReplicas", Some(json!(2))),
        ),
        (
            "Sysctls",
            json!(["/TaskTemplate/ContainerSpec/Sysctls", {"net.core.somaxconn": "1024"}]),
            "1.39",
            Shows("/Spec/TaskTemplate/ContainerSpec/Sysctls", None),
            "1.40",
            Shows("/Spec/TaskTemplate/ContainerSpec/Sysctls", Some(json!({"net.core.somaxconn": "1024"}))),
        ),
        (
            "ReplicatedJob",
            json!(["/Mode", {"ReplicatedJob": {"MaxConcurrent": 1, "TotalCompletions": 1}}]),
            "1.40",
            Shows("/Spec/Mode", Some(json!({"Replicated": {"Replicas": 1}}))),
            "1.41",
            Shows("/Spec/Mode", Some(json!({"ReplicatedJob": {"MaxConcurrent": 1, "TotalCompletions": 1}}))),
        ),
        (
            "GlobalJob",
            json!(["/Mode", {"GlobalJob": {}}]),
            "1.40",
            Shows("/Spec/Mode", Some(json!({"Replicated": {"Replicas": 1}}))),
            "1.41",
            Shows("/Spec/Mode", Some(json!({"GlobalJob": {}}))),
        ),
        (
            "Ulimits",
            json!(["/TaskTemplate/ContainerSpec/Ulimits", [{"Name": "nofile", "Soft": 1024, "Hard": 2048}]]),
            "1.40",
            Shows("/Spec/TaskTemplate/ContainerSpec/Ulimits", None),
            "1.41",
            Shows(
                "/Spec/TaskTemplate/ContainerSpec/Ulimits",
                Some(json!([{"Name": "nofile", "Hard": 2048, "Soft": 1024}])),
            ),
        ),
        (
            "CapabilityAdd",
            json!(["/TaskTemplate/ContainerSpec/CapabilityAdd", ["CAP_NET_ADMIN"]]),
            "1.40",
            Shows("/Spec/TaskTemplate/ContainerSpec/CapabilityAdd", None),
            "1.41",
            Shows("/Spec/TaskTemplate/ContainerSpec/CapabilityAdd", Some(json!(["CAP_NET_ADMIN"]))),
        ),
        (
            "CapabilityDrop",
            json!(["/TaskTemplate/ContainerSpec/CapabilityDrop", ["CAP_CHOWN"]]),
            "1.40",
            Shows("/Spec/TaskTemplate/ContainerSpec/CapabilityDrop", None),
            "1.41",
            Shows("/Spec/TaskTemplate/ContainerSpec/CapabilityDrop", Some(json!(["CAP_CHOWN"]))),
        ),
        (
            "Pids",
            json!(["/TaskTemplate/Resources/Limits/Pids", 100]),
            "1.40",
            Shows("/Spec/TaskTemplate/Resources/Limits/Pids", None),
            "1.41",
            Shows("/Spec/TaskTemplate/Resources/Limits/Pids", Some(json!(100))),
        ),
        (
            "StartInterval",
            json!(["/TaskTemplate/ContainerSpec/Healthcheck", health]),
            "1.43",
            Shows("/Spec/TaskTemplate/ContainerSpec/Healthcheck/StartInterval", None),
            "1.44",
            Shows("/Spec/TaskTemplate/ContainerSpec/Healthcheck/StartInterval", Some(json!(500_000_000i64))),
        ),
        (
            "Configs[].Runtime",
            json!(["/TaskTemplate/ContainerSpec/Configs", [{"ConfigName": "c", "Runtime": {}}]]),
            "1.39",
            Refused("Configs[0]: either File or Runtime should be set"),
            "1.40",
            Refused("TaskTemplate.ContainerSpec.Configs[0].Runtime is not supported yet"),
        ),
        (
            "NoNewPrivileges",
            json!(["/TaskTemplate/ContainerSpec/Privileges", {"NoNewPrivileges": true}]),
            "1.43",
            Shows(
                "/Spec/TaskTemplate/ContainerSpec/Privileges",
                Some(json!({"CredentialSpec": null, "SELinuxContext": null, "NoNewPrivileges": false})),
            ),
            "1.44",
            Shows(
                "/Spec/TaskTemplate/ContainerSpec/Privileges",
                Some(json!({"CredentialSpec": null, "SELinuxContext": null, "NoNewPrivileges": true})),
            ),
        ),
    ];
    let api = Api::new();
    for (n, (what, set, old, old_outcome, new, new_outcome)) in cases.into_iter().enumerate() {
        for (side, version, outcome) in [("old", old, old_outcome), ("new", new, new_outcome)] {
            let name = format!("s{n}-{side}");
            let doc = spec_with(&name, set[0].as_str().unwrap(), set[1].clone());
            let r = api.call(Method::POST, &format!("/v{version}/services/create"), Some(doc)).await;
            match outcome {
                Shows(pointer, want) => {
                    assert_eq!(r.status, StatusCode::CREATED, "{what} at {version}: {}", r.text);
                    let g = api.call(Method::GET, &format!("/v{version}/services/{name}"), None).await;
                    assert_eq!(g.body.pointer(pointer), want.as_ref(), "{what} at {version}: {}", g.text);
                }
                Refused(fragment) => assert_error(&r, StatusCode::BAD_REQUEST, fragment),
            }
        }
    }
    // StartInterval is dropped on create only: an update at 1.43 keeps it, as the engine's update path does.
    let doc = spec_with("upd", "/TaskTemplate/ContainerSpec/Healthcheck", health);
    assert_eq!(api.call(Method::POST, "/services/create", Some(doc.clone())).await.status, StatusCode::CREATED);
    let version = api.call(Method::GET, "/services/upd", None).await.body["Version"]["Index"].as_u64().unwrap();
    let r = api.call(Method::POST, &format!("/v1.43/services/upd/update?version={version}"), Some(doc)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let g = api.call(Method::GET, "/services/upd", None).await;
    let got = g.body.pointer("/Spec/TaskTemplate/ContainerSpec/Healthcheck/StartInterval");
    assert_eq!(got, Some(&json!(500_000_000i64)), "{}", g.text);
}

#[tokio::test]
async fn query_parameters_and_answers_by_api_version() {
    let api = Api::new();
    api.create("web", 2).await;
    // `status` on GET /services: read from 1.41 (ParseBool: a bad value is a 400); older versions ignore it.
    for (version, query, want) in [
        ("1.40", "status=true", Ok(false)),
        ("1.40", "status=bogus", Ok(false)),
        ("1.41", "status=true", Ok(true)),
        ("1.41", "status=1", Ok(true)),
        ("1.41", "status=0", Ok(false)),
        ("1.41", "status=bogus", Err("invalid value for status: bogus")),
        ("1.47", "status=yes", Err("invalid value for status: yes")),
    ] {
        let r = api.call(Method::GET, &format!("/v{version}/services?{query}"), None).await;
        match want {
            Ok(with_status) => {
                assert_eq!(r.status, StatusCode::OK, "{version} {query}: {}", r.text);
                assert_eq!(r.body[0].get("ServiceStatus").is_some(), with_status, "{version} {query}: {}", r.text);
            }
            Err(fragment) => assert_error(&r, StatusCode::BAD_REQUEST, fragment),
        }
    }
    // `insertDefaults` is read with ParseBool at every version.
    let r = api.call(Method::GET, "/v1.24/services/web?insertDefaults=maybe", None).await;
    assert_error(&r, StatusCode::BAD_REQUEST, "invalid value for insertDefaults: maybe");
    let r = api.call(Method::GET, "/v1.24/services/web?insertDefaults=True", None).await;
    assert!(r.body["Spec"]["UpdateConfig"].is_object(), "{}", r.text);
    // /info: ExecutionDriver for clients of 1.24 only.
    for (version, want) in [("1.24", Some(json!("<not supported>"))), ("1.25", None), ("1.47", None)] {
        let r = api.call(Method::GET, &format!("/v{version}/info"), None).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body.get("ExecutionDriver").cloned(), want, "{version}: {}", r.text);
    }
}

#[tokio::test]
async fn fields_shoal_cannot_honour_are_refused_by_name() {
    let api = Api::new();
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "/TaskTemplate/ContainerSpec/Configs",
            json!([{"ConfigID": "x", "ConfigName": "c", "Runtime": {}}]),
            "ContainerSpec.Configs[0].Runtime is not supported yet",
        ),
        (
            "/TaskTemplate/ContainerSpec/Privileges",
            json!({"CredentialSpec": {"File": "spec.json"}}),
            "ContainerSpec.Privileges.CredentialSpec is not supported yet: credential specs are for Windows",
        ),
        (
            "/TaskTemplate/ContainerSpec/Privileges",
            json!({"Seccomp": {"Mode": "custom"}}),
            "custom seccomp mode requires a profile",
        ),
        ("/TaskTemplate/ContainerSpec/Privileges", json!({"Seccomp": {"Mode": "strict"}}), "Privileges.Seccomp.Mode"),
        ("/TaskTemplate/ContainerSpec/Isolation", json!("hyperv"), "ContainerSpec.Isolation is not supported yet"),
        (
            "/TaskTemplate/ContainerSpec/Mounts",
            json!([{"Type": "bind", "Source": "/a", "Target": "/v", "VolumeOptions": {"NoCopy": true}}]),
            "VolumeOptions must not be specified on mount type \"bind\"",
        ),
        (
            "/TaskTemplate/ContainerSpec/Mounts",
            json!([{"Type": "volume", "Source": "a", "Target": "/b", "BindOptions": {"Propagation": "rshared"}}]),
            "BindOptions must not be specified on mount type \"volume\"",
        ),
        (
            "/TaskTemplate/ContainerSpec/Mounts",
            json!([{"Type": "bind", "Source": "/a", "Target": "/b", "BindOptions": {"Propagation": "sideways"}}]),
            "BindOptions.Propagation",
        ),
        (
            "/TaskTemplate/ContainerSpec/Mounts",
            json!([{"Type": "bind", "Source": "/a", "Target": "/t", "TmpfsOptions": {"SizeBytes": 1024}}]),
            "TmpfsOptions must not be specified on mount type \"bind\"",
        ),
        (
            "/TaskTemplate/ContainerSpec/Mounts",
            json!([{"Type": "tmpfs", "Target": "/t", "TmpfsOptions": {"Options": [["a", "b", "c"]]}}]),
            "TmpfsOptions.Options: invalid option",
        ),
        (
            "/TaskTemplate/ContainerSpec/Mounts",
            json!([{"Type": "bind", "Source": "/a", "Target": "/b", "Consistency": "sideways"}]),
            "Mount.Consistency",
        ),
        (
            "/TaskTemplate/Resources/Limits/GenericResources",
            json!([{"DiscreteResourceSpec": {"Kind": "gpu", "Value": 1}}]),
            "TaskTemplate.Resources.Limits.GenericResources is not supported yet",
        ),
        (
            "/TaskTemplate/Resources/Reservations/Pids",
            json!(10),
            "TaskTemplate.Resources.Reservations.Pids is not supported yet",
        ),
        ("/TaskTemplate/PluginSpec", json!({"Name": "p"}), "TaskTemplate.PluginSpec is not supported yet"),
    ];
    for (n, (pointer, value, fragment)) in cases.into_iter().enumerate() {
        let r = api.call(Method::POST, "/services/create", Some(spec_with(&format!("r{n}"), pointer, value))).await;
        assert_error(&r, StatusCode::BAD_REQUEST, fragment);
    }
    // Their zero values, as the CLI and the SDKs send them by default, go through, in any case of key.
    let zero: Vec<(&str, Value)> = vec![
        ("/Networks", json!([])),
        ("/TaskTemplate/Networks", Value::Null),
        (
            "/TaskTemplate/ContainerSpec/Privileges",
            json!({"CredentialSpec": null, "SELinuxContext": null, "NoNewPrivileges": false}),
        ),
        ("/TaskTemplate/ContainerSpec/isolation", json!("default")),
        ("/TaskTemplate/ContainerSpec/Secrets", json!([])),
        (
            "/TaskTemplate/ContainerSpec/Mounts",
            json!([{"Type": "bind", "Source": "/a", "Target": "/b", "consistency": "default", "BindOptions": null}]),
        ),
        ("/TaskTemplate/Resources/Limits/Pids", json!(0)),
        ("/TaskTemplate/LogDriver", Value::Null),
        ("/EndpointSpec/Ports", json!([])),
    ];
    for (n, (pointer, value)) in zero.into_iter().enumerate() {
        let r = api.call(Method::POST, "/services/create", Some(spec_with(&format!("z{n}"), pointer, value))).await;
        assert_eq!(r.status, StatusCode::CREATED, "{pointer}: {}", r.text);
    }
    // An update is refused the same way, and changes nothing.
    let g = api.call(Method::GET, "/services/z0", None).await;
    let version = g.body["Version"]["Index"].as_u64().unwrap();
    let mut upd = g.body["Spec"].clone();
    upd["TaskTemplate"]["ContainerSpec"]["Isolation"] = json!("process");
    let r = api.call(Method::POST, &format!("/services/z0/update?version={version}"), Some(upd)).await;
    assert_error(&r, StatusCode::BAD_REQUEST, "ContainerSpec.Isolation is not supported yet");
    let after = api.call(Method::GET, "/services/z0", None).await;
    assert_eq!(after.body["Version"], g.body["Version"], "{}", after.text);
}

#[tokio::test]
async fn swarm_update_reads_its_flags_as_the_engine_and_refuses_what_it_cannot_honour() {
    let api = Api::new();
    api.seed(|c| {
        c.create(Cluster { id: "cluster1".into(), spec: Some(ClusterSpec::default()), ..Default::default() });
    })
    .await;
    let swarm = api.call(Method::GET, "/swarm", None).await;
    assert_eq!(swarm.status, StatusCode::OK, "{}", swarm.text);
    let version = swarm.body["Version"]["Index"].as_u64().unwrap();
    let spec = swarm.body["Spec"].clone();
    for (query, fragment) in [
        ("rotateWorkerToken=yes", "invalid value for rotateWorkerToken: yes"),
        ("rotateManagerToken=2", "invalid value for rotateManagerToken: 2"),
        ("rotateManagerUnlockKey=on", "invalid value for rotateManagerUnlockKey: on"),
    ] {
        let r = api.call(Method::POST, &format!("/swarm/update?version={version}&{query}"), Some(spec.clone())).await;
        assert_error(&r, StatusCode::BAD_REQUEST, fragment);
    }
    for (ca, fragment) in [
        (
            json!({"ExternalCAs": [{"Protocol": "acme", "URL": "https://ca.example"}]}),
            "invalid CAConfig.ExternalCAs.Protocol \"acme\": use one of cfssl",
        ),
        (json!({"ExternalCAs": [{"Protocol": "cfssl", "URL": "http://ca.example"}]}), "must be an https:// URL"),
        (
            json!({"ExternalCAs": [{"Protocol": "cfssl", "URL": "https://ca.example", "Options": {"profile": "x"}}]}),
            "options [\"profile\"] are not supported",
        ),
        (
            json!({"SigningCACert": "-----BEGIN CERTIFICATE-----", "ForceRotate": 1}),
            "CAConfig.SigningCACert: invalid certificate",
        ),
        (json!({"signingCAKey": "-----BEGIN EC PRIVATE KEY-----"}), "CAConfig.SigningCAKey without SigningCACert"),
    ] {
        let mut doc = spec.clone();
        doc["CAConfig"] = ca;
        let r = api.call(Method::POST, &format!("/swarm/update?version={version}"), Some(doc)).await;
        assert_error(&r, StatusCode::BAD_REQUEST, fragment);
    }
    // Nothing changed; the spec as inspected goes back through.
    let again = api.call(Method::GET, "/swarm", None).await;
    assert_eq!(again.body["Version"], swarm.body["Version"], "{}", again.text);
    let r =
        api.call(Method::POST, &format!("/swarm/update?version={version}&rotateWorkerToken=False"), Some(spec)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // A default log driver for the cluster's tasks is stored and shown back.
    let swarm = api.call(Method::GET, "/swarm", None).await;
    let version = swarm.body["Version"]["Index"].as_u64().unwrap();
    let mut with_driver = swarm.body["Spec"].clone();
    with_driver["TaskDefaults"] = json!({"LogDriver": {"Name": "json-file", "Options": {"max-size": "1m"}}});
    let r = api.call(Method::POST, &format!("/swarm/update?version={version}"), Some(with_driver)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let after = api.call(Method::GET, "/swarm", None).await;
    assert_eq!(
        after.body["Spec"]["TaskDefaults"],
        json!({"LogDriver": {"Name": "json-file", "Options": {"max-size": "1m"}}}),
        "{}",
        after.text
    );
}

#[tokio::test]
async fn security_and_resource_settings_and_mount_options_are_stored_and_shown_back_as_docker_does() {
    let api = Api::new();
    let profile = r#"{"defaultAction":"SCMP_ACT_ALLOW"}"#;
    let profile_b64 = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(profile)
    };
    let container = json!({
        "Image": "busybox",
        "CapabilityAdd": ["NET_ADMIN"],
        "CapabilityDrop": ["CHOWN"],
        "Sysctls": {"net.core.somaxconn": "1024"},
        "Ulimits": [{"Name": "nofile", "Soft": 1000, "Hard": 2000}],
        "OomScoreAdj": 300,
        "Init": true,
        "Privileges": {
            "CredentialSpec": null,
            "SELinuxContext": {"Disable": false, "User": "u", "Role": "r", "Type": "t", "Level": "s0"},
            "Seccomp": {"Mode": "custom", "Profile": profile_b64},
            "AppArmor": {"Mode": "disabled"},
            "NoNewPrivileges": true,
        },
        "Mounts": [
            {"Type": "bind", "Source": "/a", "Target": "/b", "Consistency": "cached",
             "BindOptions": {"Propagation": "rslave", "NonRecursive": true, "CreateMountpoint": true}},
            {"Type": "tmpfs", "Target": "/t",
             "TmpfsOptions": {"SizeBytes": 1 << 20, "Mode": 0o1777, "Options": [["noexec"], ["nr_inodes", "1k"]]}},
        ],
    });
    let spec = json!({
        "Name": "secure",
        "TaskTemplate": {"ContainerSpec": container, "LogDriver": {"Name": "local", "Options": {"max-size": "5m"}}},
    });
    let r = api.call(Method::POST, "/services/create", Some(spec)).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let got = api.call(Method::GET, "/services/secure", None).await;
    let t = &got.body["Spec"]["TaskTemplate"];
    let c = &t["ContainerSpec"];
    for key in ["CapabilityAdd", "CapabilityDrop", "Sysctls", "Ulimits", "OomScoreAdj", "Init", "Privileges", "Mounts"]
    {
        assert_eq!(c[key], container[key], "{key}: {}", got.text);
    }
    assert_eq!(t["LogDriver"], json!({"Name": "local", "Options": {"max-size": "5m"}}), "{}", got.text);
    // And in the store, in SwarmKit's form.
    let stored = api.state.store.view(|v| v.services().iter().next().cloned()).unwrap();
    let Some(shoal_api::task_spec::Runtime::Container(cs)) =
        stored.spec.as_ref().and_then(|s| s.task.as_ref()).and_then(|t| t.runtime.as_ref())
    else {
        panic!("no container spec")
    };
    let p = cs.privileges.as_ref().unwrap();
    assert_eq!(p.seccomp.as_ref().unwrap().profile, profile.as_bytes());
    assert_eq!(cs.mounts[1].tmpfs_options.as_ref().unwrap().options, "noexec,nr_inodes=1k");
    assert_eq!(
        cs.mounts[0].bind_options.as_ref().unwrap().propagation(),
        shoal_api::mount::bind_options::Propagation::Rslave
    );
}

#[tokio::test]
async fn generic_resources_and_the_pids_limit_are_stored_and_shown_as_docker_does() {
    let api = Api::new();
    let mut doc = spec_with(
        "gr",
        "/TaskTemplate/Resources",
        json!({
            "limits": {"Pids": 64, "MemoryBytes": 1048576},
            "Reservations": {"GenericResources": [{"DiscreteResourceSpec": {"Kind": "gpu", "Value": 2}},
                                                 {"discreteResourceSpec": {"kind": "ssd", "value": 1}}]}
        }),
    );
    doc["TaskTemplate"]["ContainerSpec"]["Image"] = json!("busybox");
    let r = api.call(Method::POST, "/services/create", Some(doc)).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let g = api.call(Method::GET, "/services/gr", None).await;
    assert_eq!(
        g.body["Spec"]["TaskTemplate"]["Resources"],
        json!({
            "Limits": {"MemoryBytes": 1048576, "Pids": 64},
            "Reservations": {"GenericResources": [{"DiscreteResourceSpec": {"Kind": "gpu", "Value": 2}},
                                                  {"DiscreteResourceSpec": {"Kind": "ssd", "Value": 1}}]}
        }),
        "{}",
        g.text
    );

    // What a task cannot reserve is refused, naming the entry; nothing is created.
    let cases: Vec<(Value, &str)> = vec![
        (
            json!({"Reservations": {"GenericResources": [{"NamedResourceSpec": {"Kind": "gpu", "Value": "UUID1"}}]}}),
            "Resources.Reservations.GenericResources[0]: a task reserves a count",
        ),
        (
            json!({"Reservations": {"GenericResources": [{}]}}),
            "GenericResources: each entry needs exactly one of NamedResourceSpec and DiscreteResourceSpec",
        ),
        (
            json!({"Reservations": {"GenericResources": [{"DiscreteResourceSpec": {"Kind": "gpu", "Value": 0}}]}}),
            "0 units of \"gpu\"",
        ),
        (
            json!({"Reservations": {"GenericResources": [{"DiscreteResourceSpec": {"Kind": "g p u", "Value": 1}}]}}),
            "invalid kind",
        ),
        (
            json!({"Reservations": {"GenericResources": [{"DiscreteResourceSpec": {"Kind": "gpu", "Value": 1}},
                                                      {"DiscreteResourceSpec": {"Kind": "gpu", "Value": 1}}]}}),
            "reserved twice",
        ),
        (json!({"Limits": {"Pids": -5}}), "Resources.Limits.Pids: -5 is out of range"),
    ];
    for (n, (resources, fragment)) in cases.into_iter().enumerate() {
        let r = api
            .call(
                Method::POST,
                "/services/create",
                Some(spec_with(&format!("bad{n}"), "/TaskTemplate/Resources", resources)),
            )
            .await;
        assert_error(&r, StatusCode::BAD_REQUEST, fragment);
        let g = api.call(Method::GET, &format!("/services/bad{n}"), None).await;
        assert_eq!(g.status, StatusCode::NOT_FOUND);
    }
}

/// Issue 31 (5): a worker cannot pass its lines off as another node's task. The broker refuses lines that
/// name another node; a line that names the publishing node with a task of another node is left out of
/// `docker service logs`, while the task's own node's lines come through.
#[tokio::test]
async fn service_logs_show_a_line_only_as_published_by_its_tasks_node() {
    use futures::StreamExt;
    use shoal_api::{LogContext, LogMessage, PublishLogsMessage};
    let api = Api::new();
    let id = api.create("web", 1).await;
    let svc = shoal_manager::controlapi::get_service(&api.state, &id).unwrap();
    api.seed(|c| {
        c.create(running_task(&svc, "task1", "node1"));
    })
    .await;
    let mut n1 = api.state.logs.listen("node1");
    let mut n2 = api.state.logs.listen("node2");
    let logs = tokio::spawn({
        let state = api.state.clone();
        let uri = format!("/services/{id}/logs?stdout=1&stderr=1");
        async move {
            let req = Request::builder().method(Method::GET).uri(uri).body(Body::empty()).unwrap();
            let resp = router(ctx(state)).oneshot(req).await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
            String::from_utf8_lossy(&resp.into_body().collect().await.unwrap().to_bytes()).into_owned()
        }
    });
    let sub = n1.next().await.unwrap().unwrap().id;
    assert_eq!(n2.next().await.unwrap().unwrap().id, sub);
    let line = |node: &str, data: &str| LogMessage {
        context: Some(LogContext { service_id: svc.id.clone(), node_id: node.into(), task_id: "task1".into() }),
        data: data.as_bytes().to_vec(),
        ..Default::default()
    };
    let publish = |node: &str, data: &str, close: bool| PublishLogsMessage {
        subscription_id: sub.clone(),
        messages: vec![line(node, data)],
        close,
    };
    let forged = api.state.logs.publish("node2", publish("node1", "forged-as-node1", false)).await;
    assert_eq!(forged.unwrap_err().code(), tonic::Code::PermissionDenied);
    api.state.logs.publish("node2", publish("node2", "forged-task-of-node1", true)).await.unwrap();
    api.state.logs.publish("node1", publish("node1", "genuine", true)).await.unwrap();
    let body = tokio::time::timeout(std::time::Duration::from_secs(10), logs).await.unwrap().unwrap();
    assert!(body.contains("genuine"), "{body:?}");
    assert!(!body.contains("forged"), "{body:?}");
}

/// The unlock and client-certificate requests decode as Go's `encoding/json` would: keys in any case, null
/// members as absent (the JSON crate's own test covers its documents the same way).
#[test]
fn the_unlock_and_client_cert_requests_decode_keys_in_any_case() {
    for doc in
        [r#"{"UnlockKey": "SWMKEY-1-abc"}"#, r#"{"unlockkey": "SWMKEY-1-abc"}"#, r#"{"UNLOCKKEY": "SWMKEY-1-abc"}"#]
    {
        let u: crate::unlock::UnlockRequestJson = crate::json::decode(doc.as_bytes()).unwrap();
        assert_eq!(u.unlock_key, "SWMKEY-1-abc", "{doc}");
    }
    let null: crate::unlock::UnlockRequestJson = crate::json::decode(br#"{"UnlockKey": null}"#).unwrap();
    assert_eq!(null.unlock_key, "");
    for doc in [r#"{"Name": "alice", "CSR": "-----BEGIN"}"#, r#"{"name": "alice", "csr": "-----BEGIN"}"#] {
        let r: crate::ca::ClientCertRequest = crate::json::decode(doc.as_bytes()).unwrap();
        assert_eq!((r.name.as_str(), r.csr.as_str()), ("alice", "-----BEGIN"), "{doc}");
    }
}
