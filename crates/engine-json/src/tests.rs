//! Round trips JSON -> api -> JSON for each object kind, plus the error cases of the conversions.

use serde_json::{json, Value};

use super::*;

/// Parses `doc` as `T`, converts to the API type and back, and checks the JSON is unchanged.
fn round_trip<T, A>(doc: Value, to_api: impl Fn(&T) -> A, from_api: impl Fn(&A) -> T)
where
    T: serde::de::DeserializeOwned + serde::Serialize,
{
    let parsed: T = serde_json::from_value(doc.clone()).expect("parse");
    let back = serde_json::to_value(from_api(&to_api(&parsed))).unwrap();
    assert_eq!(back, doc, "\nexpected {doc:#}\n     got {back:#}");
}

fn full_service_spec() -> Value {
    json!({
        "Name": "web",
        "Labels": {"tier": "front"},
        "TaskTemplate": {
            "ContainerSpec": {
                "Image": "busybox:latest",
                "Labels": {"a": "b"},
                "Command": ["/bin/sh"],
                "Args": ["-c", "sleep 3141"],
                "Hostname": "h",
                "Env": ["A=1", "B=2"],
                "Dir": "/tmp",
                "User": "nobody",
                "Groups": ["wheel"],
                "TTY": true,
                "OpenStdin": true,
                "ReadOnly": true,
                "Mounts": [{"Type": "bind", "Source": "/src", "Target": "/dst", "ReadOnly": true}],
                "StopSignal": "SIGINT",
                "StopGracePeriod": 10_000_000_000i64,
                "Healthcheck": {"Test": ["CMD", "true"], "Interval": 1_000_000_000i64, "Timeout": 2_000_000_000i64,
                                "Retries": 3, "StartPeriod": 5_000_000_000i64, "StartInterval": 500_000_000i64},
                "Hosts": ["10.0.0.1 db"],
                "DNSConfig": {"Nameservers": ["8.8.8.8"], "Search": ["example.com"], "Options": ["ndots:2"]},
                "Init": false,
                "Secrets": [{"File": {"Name": "db_pw", "UID": "0", "GID": "0", "Mode": 292},
                             "SecretID": "3ep2ryqmmp6xa4nd2wdwuxn1c", "SecretName": "db_pw"}],
                "Configs": [{"File": {"Name": "/etc/app.conf", "UID": "1000", "GID": "100", "Mode": 256},
                             "ConfigID": "8ll4n2zmuqbt7yoe3p7rxiw3e", "ConfigName": "app.conf"}]
            },
            "Resources": {"Limits": {"NanoCPUs": 500_000_000i64, "MemoryBytes": 104_857_600i64},
                          "Reservations": {"NanoCPUs": 100_000_000i64, "MemoryBytes": 1024}},
            "RestartPolicy": {"Condition": "on-failure", "Delay": 5_000_000_000i64, "MaxAttempts": 3,
                              "Window": 60_000_000_000i64},
            "Placement": {"Constraints": ["node.role==manager"],
                          "Preferences": [{"Spread": {"SpreadDescriptor": "node.labels.zone"}}],
                          "Platforms": [{"Architecture": "amd64", "OS": "linux"}], "MaxReplicas": 2},
            "LogDriver": {"Name": "json-file", "Options": {"max-size": "1m"}},
            "ForceUpdate": 4,
            "Runtime": "container"
        },
        "Mode": {"Replicated": {"Replicas": 3}},
        "UpdateConfig": {"Parallelism": 2, "Delay": 1_000_000_000i64, "FailureAction": "rollback",
                         "Monitor": 15_000_000_000i64, "MaxFailureRatio": 0.5, "Order": "start-first"},
        "RollbackConfig": {"Parallelism": 1, "FailureAction": "pause", "MaxFailureRatio": 0.0, "Order": "stop-first"},
        "EndpointSpec": {"Mode": "dnsrr", "Ports": [{"Name": "http", "Protocol": "udp", "TargetPort": 80,
                                                      "PublishedPort": 8080, "PublishMode": "host"}]}
    })
}

#[test]
fn service_spec_round_trips() {
    round_trip::<ServiceSpecJson, _>(full_service_spec(), |j| j.to_api().unwrap(), ServiceSpecJson::from_api);
    for mode in [
        json!({"Global": {}}),
        json!({"ReplicatedJob": {"MaxConcurrent": 2, "TotalCompletions": 5}}),
        json!({"GlobalJob": {}}),
    ] {
        let mut doc = full_service_spec();
        doc["Mode"] = mode;
        round_trip::<ServiceSpecJson, _>(doc, |j| j.to_api().unwrap(), ServiceSpecJson::from_api);
    }
}

#[test]
fn service_round_trips() {
    let doc = json!({
        "ID": "9mnpnzenvg8p8tdbtq4wvbkcz",
        "Version": {"Index": 19},
        "CreatedAt": "2016-06-07T21:05:51.880065305Z",
        "UpdatedAt": "2016-06-07T21:07:29.962229872Z",
        "Spec": full_service_spec(),
        "PreviousSpec": full_service_spec(),
        "Endpoint": {"Spec": {"Mode": "vip"}, "Ports": [{"Protocol": "tcp", "TargetPort": 80, "PublishedPort": 30000,
                                                         "PublishMode": "ingress"}]},
        "UpdateStatus": {"State": "updating", "StartedAt": "2016-06-07T21:07:29.962229872Z",
                         "CompletedAt": "0001-01-01T00:00:00Z", "Message": "update in progress"}
    });
    round_trip::<ServiceJson, _>(doc.clone(), |j| j.to_api().unwrap(), ServiceJson::from_api);
    let mut job = doc;
    job["Spec"]["Mode"] = json!({"ReplicatedJob": {"MaxConcurrent": 2, "TotalCompletions": 5}});
    job["JobStatus"] = json!({"JobIteration": {"Index": 3}, "LastExecution": "2016-06-07T21:07:29.962229872Z"});
    round_trip::<ServiceJson, _>(job, |j| j.to_api().unwrap(), ServiceJson::from_api);
}

#[test]
fn a_service_with_nothing_allocated_shows_its_endpoint_spec_as_docker_does() {
    let mut spec = serde_json::from_value::<ServiceSpecJson>(full_service_spec()).unwrap().to_api().unwrap();
    spec.endpoint = Some(shoal_api::EndpointSpec {
        mode: shoal_api::endpoint_spec::ResolutionMode::Dnsrr as i32,
        ports: Vec::new(),
    });
    let s = shoal_api::Service { id: "s".into(), spec: Some(spec), ..Default::default() };
    let doc = serde_json::to_value(ServiceJson::from_api(&s)).unwrap();
    assert_eq!(doc["Endpoint"], json!({"Spec": {"Mode": "dnsrr"}}), "{doc}");
}

#[test]
fn a_replicated_job_takes_the_engines_defaults() {
    let mode = |m: serde_json::Value| {
        let mut doc = full_service_spec();
        doc["Mode"] = m;
        serde_json::from_value::<ServiceSpecJson>(doc).unwrap().to_api().unwrap().mode.unwrap()
    };
    let rj = |max_concurrent, total_completions| {
        shoal_api::service_spec::Mode::ReplicatedJob(shoal_api::ReplicatedJob { max_concurrent, total_completions })
    };
    assert_eq!(mode(json!({"ReplicatedJob": {}})), rj(1, 1));
    assert_eq!(mode(json!({"ReplicatedJob": {"MaxConcurrent": 3}})), rj(3, 3));
    assert_eq!(mode(json!({"ReplicatedJob": {"TotalCompletions": 7}})), rj(1, 7));
}

#[test]
fn task_round_trips() {
    let doc = json!({
        "ID": "0kzzo1i0y4jz6027t0k7aezc7",
        "Version": {"Index": 71},
        "CreatedAt": "2016-06-07T21:07:31.171892745Z",
        "UpdatedAt": "2016-06-07T21:07:31.376370513Z",
        "Name": "web.1",
        "Labels": {"x": "y"},
        "Spec": {"ContainerSpec": {"Image": "busybox"}, "ForceUpdate": 0, "Runtime": "container"},
        "ServiceID": "9mnpnzenvg8p8tdbtq4wvbkcz",
        "Slot": 1,
        "NodeID": "60gvrl6tm78dmak4yl7srz94v",
        "Status": {"Timestamp": "2016-06-07T21:07:31.290032978Z", "State": "failed", "Message": "started",
                   "Err": "exit status 1",
                   "ContainerStatus": {
                       "ContainerID": "e5d62702a1b48d01c3e02ca1e0212a250801fa8d67caca0b6f35919ebc12f035",
                                       "PID": 677, "ExitCode": 1},
                   "PortStatus": {"Ports": [{"Protocol": "tcp", "TargetPort": 80, "PublishedPort": 8080,
                                             "PublishMode": "host"}]}},
        "DesiredState": "shutdown",
        "AssignedGenericResources": [{"NamedResourceSpec": {"Kind": "gpu", "Value": "UUID1"}},
                                     {"DiscreteResourceSpec": {"Kind": "ssd", "Value": 2}}]
    });
    round_trip::<TaskJson, _>(doc.clone(), |j| j.to_api().unwrap(), TaskJson::from_api);
    let mut job = doc;
    job["DesiredState"] = json!("complete");
    job["JobIteration"] = json!({"Index": 2});
    round_trip::<TaskJson, _>(job, |j| j.to_api().unwrap(), TaskJson::from_api);
}

#[test]
fn node_round_trips() {
    let doc = json!({
        "ID": "24ifsmvkjbyhk",
        "Version": {"Index": 373531},
        "CreatedAt": "2016-08-18T10:44:24.496525531Z",
        "UpdatedAt": "2017-08-09T07:09:37.632105588Z",
        "Spec": {"Name": "node-name", "Labels": {"foo": "bar"}, "Role": "manager", "Availability": "drain"},
        "Description": {
            "Hostname": "bf3067039e47",
            "Platform": {"Architecture": "x86_64", "OS": "linux"},
            "Resources": {"NanoCPUs": 4_000_000_000i64, "MemoryBytes": 8_272_408_576i64},
            "Engine": {"EngineVersion": "0.1.0", "Labels": {"foo": "bar"},
                       "Plugins": [{"Type": "Log", "Name": "json-file"}]},
            "TLSInfo": {"TrustRoot": "-----BEGIN CERTIFICATE-----\n"}
        },
        "Status": {"State": "ready", "Message": "ok", "Addr": "172.17.0.2"},
        "ManagerStatus": {"Leader": true, "Reachability": "reachable", "Addr": "10.0.0.46:2377"}
    });
    round_trip::<NodeJson, _>(doc, |j| j.to_api().unwrap(), NodeJson::from_api);
}

#[test]
fn unknown_fields_are_ignored_and_defaults_apply() {
    let spec: ServiceSpecJson = serde_json::from_value(json!({
        "Name": "web", "Bogus": 1,
        "TaskTemplate": {"ContainerSpec": {"Image": "busybox", "Privileges": {}}, "Networks": []}
    }))
    .unwrap();
    let api = spec.to_api().unwrap();
    assert_eq!(api.mode, Some(shoal_api::service_spec::Mode::Replicated(shoal_api::ReplicatedService { replicas: 1 })));
    let restart: spec::RestartPolicyJson = serde_json::from_value(json!({})).unwrap();
    let doc = ServiceSpecJson {
        task_template: TaskSpecJson { restart_policy: Some(restart), ..spec.task_template.clone() },
        ..spec
    };
    let api = doc.to_api().unwrap();
    assert_eq!(api.task.unwrap().restart.unwrap().condition(), shoal_api::restart_policy::RestartCondition::Any);
}

#[test]
fn bad_values_are_reported_with_the_field() {
    let check = |patch: Value, fragment: &str| {
        let mut doc = full_service_spec();
        json_patch(&mut doc, patch);
        let parsed: ServiceSpecJson = serde_json::from_value(doc).unwrap();
        let err = parsed.to_api().unwrap_err();
        assert!(err.0.contains(fragment), "{err}");
    };
    check(json!({"Mode": {"Replicated": {"Replicas": -1}}}), "Replicas -1");
    check(json!({"TaskTemplate": {"RestartPolicy": {"Condition": "always"}}}), "RestartPolicy.Condition");
    check(json!({"UpdateConfig": {"Order": "sideways"}}), "UpdateConfig.Order");
    check(json!({"EndpointSpec": {"Mode": "magic"}}), "EndpointSpec.Mode");
    check(json!({"TaskTemplate": {"Runtime": "plugin"}}), "Runtime");
    let node = NodeSpecJson { role: "boss".into(), availability: "active".into(), ..Default::default() };
    assert!(node.to_api(shoal_api::node_spec::Membership::Accepted).unwrap_err().0.contains("NodeSpec.Role"));
}

/// Merges `patch` into `doc` (objects recursively, everything else replaced).
fn json_patch(doc: &mut Value, patch: Value) {
    match (doc, patch) {
        (Value::Object(d), Value::Object(p)) => {
            for (k, v) in p {
                json_patch(d.entry(k).or_insert(Value::Null), v);
            }
        }
        (d, p) => *d = p,
    }
}

// ---- Decoding as Go's encoding/json does (json::decode) ----

/// Object members whose value is a Go map: their keys are data, sent and kept as they are.
const MAP_MEMBERS: &[&str] = &["Labels", "Options"];

/// `doc` with every struct key passed through `f` (map keys untouched).
fn recase(doc: &Value, f: &dyn Fn(&str) -> String) -> Value {
    match doc {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let v = if MAP_MEMBERS.contains(&k.as_str()) { v.clone() } else { recase(v, f) };
                    (f(k), v)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(|v| recase(v, f)).collect()),
        other => other.clone(),
    }
}

fn mixed_case(k: &str) -> String {
    k.chars()
        .enumerate()
        .map(|(i, c)| if i % 2 == 0 { c.to_ascii_lowercase() } else { c.to_ascii_uppercase() })
        .collect()
}

/// Every path to a struct member of `doc` (map members are data, not fields).
fn member_paths(doc: &Value, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    if let Value::Object(m) = doc {
        for (k, v) in m {
            prefix.push(k.clone());
            out.push(prefix.clone());
            if !MAP_MEMBERS.contains(&k.as_str()) {
                member_paths(v, prefix, out);
            }
            prefix.pop();
        }
    }
}

fn member_mut<'a>(doc: &'a mut Value, path: &[String]) -> &'a mut serde_json::Map<String, Value> {
    let mut at = doc;
    for k in &path[..path.len() - 1] {
        at = &mut at[k.as_str()];
    }
    at.as_object_mut().expect("an object")
}

/// `input` decodes, as Go would, to what `expected` decodes to with exact keys and no nulls.
fn check<T: serde::de::DeserializeOwned + std::fmt::Debug>(input: &Value, expected: &Value) {
    let got: T = decode(input.to_string().as_bytes()).unwrap_or_else(|e| panic!("{input}: {e}"));
    let want: T = serde_json::from_value(expected.clone()).expect("the expected document parses");
    assert_eq!(format!("{got:?}"), format!("{want:?}"), "\ninput {input:#}");
}

/// Checks `doc` sent with lower-case, upper-case and mixed-case keys, and with each member (in turn) null.
fn check_go_decoding<T: serde::de::DeserializeOwned + std::fmt::Debug>(doc: Value) {
    check::<T>(&doc, &doc);
    check::<T>(&recase(&doc, &|k| k.to_ascii_lowercase()), &doc);
    check::<T>(&recase(&doc, &|k| k.to_ascii_uppercase()), &doc);
    check::<T>(&recase(&doc, &mixed_case), &doc);
    let mut paths = Vec::new();
    member_paths(&doc, &mut Vec::new(), &mut paths);
    assert!(!paths.is_empty());
    for path in paths {
        let last = path.last().unwrap().clone();
        let (mut with_null, mut without) = (doc.clone(), doc.clone());
        member_mut(&mut with_null, &path).insert(last.clone(), Value::Null);
        member_mut(&mut without, &path).remove(&last);
        check::<T>(&with_null, &without);
        check::<T>(&recase(&with_null, &|k| k.to_ascii_lowercase()), &without);
    }
}

#[test]
fn every_request_body_decodes_as_go_would() {
    check_go_decoding::<ServiceSpecJson>(full_service_spec());
    for mode in [json!({"Global": {}}), json!({"ReplicatedJob": {"MaxConcurrent": 2, "TotalCompletions": 5}})] {
        let mut doc = full_service_spec();
        doc["Mode"] = mode;
        check_go_decoding::<ServiceSpecJson>(doc);
    }
    check_go_decoding::<SecretSpecJson>(json!({
        "Name": "db_pw", "Labels": {"env": "prod"}, "Data": "cHc=", "Templating": {"Name": "golang"},
        "Driver": {"Name": "vault", "Options": {"path": "a/b"}}
    }));
    check_go_decoding::<ConfigSpecJson>(json!({
        "Name": "app.conf", "Labels": {"a": "b"}, "Data": "bGlzdGVuIDgwODAK", "Templating": {"Name": "golang"}
    }));
    check_go_decoding::<NodeSpecJson>(
        json!({"Name": "n1", "Labels": {"Zone": "a"}, "Role": "manager", "Availability": "drain"}),
    );
    check_go_decoding::<objects::SwarmSpecJson>(json!({
        "Name": "default", "Labels": {"Env": "prod"},
        "Orchestration": {"TaskHistoryRetentionLimit": 5},
        "Raft": {"SnapshotInterval": 10000, "KeepOldSnapshots": 0, "LogEntriesForSlowFollowers": 500,
                 "ElectionTick": 10, "HeartbeatTick": 1},
        "Dispatcher": {"HeartbeatPeriod": 5_000_000_000i64},
        "CAConfig": {"NodeCertExpiry": 7_776_000_000_000_000i64, "ForceRotate": 1},
        "EncryptionConfig": {"AutoLockManagers": true},
        "TaskDefaults": {"LogDriver": {"Name": "json-file", "Options": {"max-file": "3"}}}
    }));
}

#[test]
fn go_decoding_details() {
    // What the Python SDK sends for ServiceMode('replicated', replicas=5).
    check::<ServiceSpecJson>(
        &json!({"Name": "web", "Mode": {"replicated": {"Replicas": 5}}}),
        &json!({"Name": "web", "Mode": {"Replicated": {"Replicas": 5}}}),
    );
    // An exact match wins over a folded one, whatever their order.
    check::<NodeSpecJson>(&json!({"name": "b", "Name": "a", "NAME": "c"}), &json!({"Name": "a"}));
    // Unknown keys are ignored; map keys are data and kept as sent.
    check::<NodeSpecJson>(
        &json!({"Colour": "red", "labels": {"Zone": "a", "zone": "b"}}),
        &json!({"Labels": {"Zone": "a", "zone": "b"}}),
    );
    // null in an array or as a map value is the zero value of the element.
    check::<ServiceSpecJson>(
        &json!({"TaskTemplate": {"ContainerSpec": {"Env": [null, "A=1"], "Labels": {"a": null}}}}),
        &json!({"TaskTemplate": {"ContainerSpec": {"Env": ["", "A=1"], "Labels": {"a": ""}}}}),
    );
    // A whole document of null is the zero value.
    check::<ServiceSpecJson>(&json!(null), &json!({}));
    // Errors name where they are.
    let e = decode::<ServiceSpecJson>(br#"{"mode": {"replicated": {"replicas": "five"}}}"#).unwrap_err();
    assert!(e.to_string().contains("Mode.Replicated.Replicas: invalid type: string \"five\""), "{e}");
    let e = decode::<ServiceSpecJson>(br#"{"TaskTemplate": {"ContainerSpec": {"Env": ["A=1", 2]}}}"#).unwrap_err();
    assert!(e.to_string().contains("TaskTemplate.ContainerSpec.Env[1]"), "{e}");
    let e = decode::<ServiceSpecJson>(b"{\"Name\": ").unwrap_err();
    assert!(e.to_string().starts_with("invalid JSON: "), "{e}");
}

#[test]
fn secrets_and_configs_convert_both_ways_and_a_secret_never_shows_its_data() {
    use secret::{data_from_base64, data_to_base64};
    let spec: SecretSpecJson = decode(
        br#"{"Name": "pw", "Labels": {"a": "b"}, "Data": "cHc=\n", "Templating": {"Name": "golang"}, "Driver": {}}"#,
    )
    .unwrap();
    let api = spec.to_api().unwrap();
    assert_eq!(api.data, b"pw");
    assert_eq!(api.templating.as_ref().map(|t| t.name.as_str()), Some("golang"));
    assert_eq!(api.driver, None, "an empty driver is no driver");
    let secret = shoal_api::Secret { id: "s1".into(), spec: Some(api), ..Default::default() };
    let shown = serde_json::to_value(SecretJson::from_api(&secret)).unwrap();
    assert_eq!(
        shown,
        json!({"ID": "s1", "Version": {"Index": 0}, "CreatedAt": "0001-01-01T00:00:00Z",
            "UpdatedAt": "0001-01-01T00:00:00Z",
               "Spec": {"Name": "pw", "Labels": {"a": "b"}, "Templating": {"Name": "golang"}}})
    );
    let doc = json!({"ID": "c1", "Version": {"Index": 4}, "CreatedAt": "2017-07-20T13:55:28.678958722Z",
                     "UpdatedAt": "2017-07-20T13:55:28.678958722Z",
                     "Spec": {"Name": "app.conf", "Labels": {}, "Data": "bGlzdGVuIDgwODAK"}});
    let parsed: ConfigJson = serde_json::from_value(doc.clone()).unwrap();
    let spec = parsed.spec.to_api().unwrap();
    assert_eq!(spec.data, b"listen 8080\n");
    let config = shoal_api::Config {
        id: "c1".into(),
        meta: Some(shoal_api::Meta {
            version: Some(shoal_api::Version { index: 4 }),
            created_at: common::time_from_json("CreatedAt", &parsed.created_at).unwrap(),
            updated_at: common::time_from_json("UpdatedAt", &parsed.updated_at).unwrap(),
        }),
        spec: Some(spec),
    };
    assert_eq!(serde_json::to_value(ConfigJson::from_api(&config)).unwrap(), doc);
    // Go's []byte: standard base64 with padding; line breaks ignored; the error says where, not what.
    assert_eq!(data_from_base64("YWJj\r\nZA==").unwrap(), b"abcd");
    assert_eq!(data_to_base64(b"abcd"), "YWJjZA==");
    for bad in ["YWJjZA", "YW*j", "cGFzc3dvcmQ!"] {
        let e = data_from_base64(bad).unwrap_err().0;
        assert!(e.starts_with("Data: illegal base64 data at input byte "), "{e}");
        assert!(!e.contains("cGFz") && !e.contains('*') && !e.contains('!'), "{e}");
    }
}
