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
                "Init": false
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
    round_trip::<ServiceSpecJson, _>(
        full_service_spec(),
        |j| j.to_api().unwrap(),
        ServiceSpecJson::from_api,
    );
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
    round_trip::<ServiceJson, _>(doc, |j| j.to_api().unwrap(), ServiceJson::from_api);
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
                   "ContainerStatus": {"ContainerID": "e5d62702a1b48d01c3e02ca1e0212a250801fa8d67caca0b6f35919ebc12f035",
                                       "PID": 677, "ExitCode": 1},
                   "PortStatus": {"Ports": [{"Protocol": "tcp", "TargetPort": 80, "PublishedPort": 8080,
                                             "PublishMode": "host"}]}},
        "DesiredState": "shutdown"
    });
    round_trip::<TaskJson, _>(doc, |j| j.to_api().unwrap(), TaskJson::from_api);
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
    assert_eq!(
        api.mode,
        Some(shoal_api::service_spec::Mode::Replicated(
            shoal_api::ReplicatedService { replicas: 1 }
        ))
    );
    let restart: spec::RestartPolicyJson = serde_json::from_value(json!({})).unwrap();
    let doc = ServiceSpecJson {
        task_template: TaskSpecJson {
            restart_policy: Some(restart),
            ..spec.task_template.clone()
        },
        ..spec
    };
    let api = doc.to_api().unwrap();
    assert_eq!(
        api.task.unwrap().restart.unwrap().condition(),
        shoal_api::restart_policy::RestartCondition::Any
    );
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
    check(
        json!({"Mode": {"Replicated": {"Replicas": -1}}}),
        "Replicas -1",
    );
    check(
        json!({"TaskTemplate": {"RestartPolicy": {"Condition": "always"}}}),
        "RestartPolicy.Condition",
    );
    check(
        json!({"UpdateConfig": {"Order": "sideways"}}),
        "UpdateConfig.Order",
    );
    check(
        json!({"EndpointSpec": {"Mode": "magic"}}),
        "EndpointSpec.Mode",
    );
    check(json!({"TaskTemplate": {"Runtime": "plugin"}}), "Runtime");
    let node = NodeSpecJson {
        role: "boss".into(),
        availability: "active".into(),
        ..Default::default()
    };
    assert!(node
        .to_api(shoal_api::node_spec::Membership::Accepted)
        .unwrap_err()
        .0
        .contains("NodeSpec.Role"));
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
