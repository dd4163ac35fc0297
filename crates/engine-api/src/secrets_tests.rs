//! In-process tests of `/secrets` and `/configs` and of services that reference them, over the router driven
//! with `tower::ServiceExt::oneshot` (the harness of `tests.rs`).

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use shoal_manager::ClusterState;
use tower::ServiceExt;

use crate::json::secret::data_to_base64;
use crate::router;
use crate::tests::{ctx, test_state};

struct Reply {
    status: StatusCode,
    content_type: Option<String>,
    body: Value,
    text: String,
}

async fn call(state: &ClusterState, method: Method, uri: &str, body: Option<Value>) -> Reply {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(body.map(|b| Body::from(b.to_string())).unwrap_or_else(Body::empty))
        .unwrap();
    let resp = router(ctx(state.clone())).oneshot(req).await.unwrap();
    let status = resp.status();
    let content_type = resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_string());
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    Reply { status, content_type, body: serde_json::from_slice(&bytes).unwrap_or(Value::Null), text }
}

fn assert_error(r: &Reply, status: StatusCode, fragment: &str) {
    assert_eq!(r.status, status, "{}", r.text);
    let msg = r.body["message"].as_str().unwrap_or_else(|| panic!("no JSON message in {:?}", r.text));
    assert!(msg.contains(fragment), "message {msg:?} lacks {fragment:?}");
}

fn filters(f: Value) -> String {
    f.to_string()
        .bytes()
        .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

fn names(r: &Reply) -> Vec<String> {
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    r.body.as_array().unwrap().iter().map(|s| s["Spec"]["Name"].as_str().unwrap().to_string()).collect()
}

const PW: &[u8] = b"correct horse battery staple";

#[tokio::test]
async fn a_secret_is_created_listed_inspected_relabelled_and_removed_without_its_data_ever_shown() {
    let (state, _) = test_state();
    let body = json!({"Name": "db_pw", "Labels": {"env": "prod"}, "Data": data_to_base64(PW)});
    let r = call(&state, Method::POST, "/v1.47/secrets/create", Some(body.clone())).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let id = r.body["ID"].as_str().unwrap().to_string();
    let r = call(&state, Method::POST, "/secrets/create", Some(json!({"Name": "api_key", "Data": "YQ=="}))).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);

    let secret_b64 = data_to_base64(PW);
    for reference in [id.as_str(), "db_pw", &id[..6]] {
        let r = call(&state, Method::GET, &format!("/secrets/{reference}"), None).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        assert_eq!(r.body["ID"], json!(id));
        assert_eq!(r.body["Spec"], json!({"Name": "db_pw", "Labels": {"env": "prod"}}), "{}", r.text);
        assert!(r.body["Version"]["Index"].as_u64().unwrap() > 0);
        assert!(r.body["CreatedAt"].as_str().unwrap().starts_with("2023-11-14T"), "{}", r.text);
        assert!(!r.text.contains(&secret_b64) && !r.text.contains("horse") && !r.text.contains("Data"), "{}", r.text);
    }
    let all = call(&state, Method::GET, "/secrets", None).await;
    assert_eq!(names(&all), ["api_key", "db_pw"]);
    assert!(!all.text.contains(&secret_b64) && !all.text.contains("\"Data\""), "{}", all.text);
    for (f, want) in [
        (json!({"name": {"db": true}}), vec!["db_pw"]),
        (json!({"names": ["db"]}), vec![]),
        (json!({"names": {"db_pw": true}}), vec!["db_pw"]),
        (json!({"id": [&id[..4]]}), vec!["db_pw"]),
        (json!({"label": ["env=prod"]}), vec!["db_pw"]),
        (json!({"label": ["env"], "name": ["api"]}), vec![]),
    ] {
        let r = call(&state, Method::GET, &format!("/secrets?filters={}", filters(f.clone())), None).await;
        assert_eq!(names(&r), want, "{f}");
    }
    let r = call(&state, Method::GET, &format!("/secrets?filters={}", filters(json!({"driver": ["x"]}))), None).await;
    assert_error(&r, StatusCode::BAD_REQUEST, "invalid filter 'driver'");

    // A second secret by that name: 409. Its data is in no answer.
    let r = call(&state, Method::POST, "/secrets/create", Some(body.clone())).await;
    assert_error(&r, StatusCode::CONFLICT, "secret db_pw already exists");
    assert!(!r.text.contains("horse") && !r.text.contains(&secret_b64), "{}", r.text);

    // Labels change with the version read; the data, name, driver or templating do not.
    let version = call(&state, Method::GET, "/secrets/db_pw", None).await.body["Version"]["Index"].as_u64().unwrap();
    let r = call(&state, Method::POST, "/secrets/db_pw/update", Some(json!({"Name": "db_pw"}))).await;
    assert_error(&r, StatusCode::BAD_REQUEST, "version query parameter is required");
    let changed_data = json!({"Name": "db_pw", "Data": data_to_base64(b"n3w-pw")});
    let r = call(&state, Method::POST, &format!("/secrets/db_pw/update?version={version}"), Some(changed_data)).await;
    assert_error(&r, StatusCode::BAD_REQUEST, "Data: only updates to Labels are allowed");
    assert!(!r.text.contains("n3w") && !r.text.contains("horse"), "{}", r.text);
    let templated = json!({"Name": "db_pw", "Templating": {"Name": "golang"}});
    let r = call(&state, Method::POST, &format!("/secrets/db_pw/update?version={version}"), Some(templated)).await;
    assert_error(&r, StatusCode::BAD_REQUEST, "Templating: only updates to Labels are allowed");
    let r = call(&state, Method::POST, &format!("/secrets/db_pw/update?version={version}"), Some(json!({"Name": "x"})))
        .await;
    assert_error(&r, StatusCode::BAD_REQUEST, "Name: only updates to Labels are allowed");
    let relabel = json!({"Name": "db_pw", "Labels": {"env": "dev"}, "Data": data_to_base64(PW)});
    let r = call(&state, Method::POST, &format!("/secrets/{id}/update?version={}", version + 1), Some(relabel.clone()))
        .await;
    assert_error(&r, StatusCode::CONFLICT, "update out of sequence");
    let r = call(&state, Method::POST, &format!("/secrets/{id}/update?version={version}"), Some(relabel)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = call(&state, Method::GET, "/secrets/db_pw", None).await;
    assert_eq!(r.body["Spec"]["Labels"], json!({"env": "dev"}));
    assert!(r.body["Version"]["Index"].as_u64().unwrap() > version);

    let r = call(&state, Method::DELETE, "/secrets/db_pw", None).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text);
    assert_eq!(r.content_type.as_deref(), Some("application/json"), "the media type the API document gives it");
    assert_error(&call(&state, Method::GET, &format!("/secrets/{id}"), None).await, StatusCode::NOT_FOUND, "secret");
    assert_error(&call(&state, Method::DELETE, "/secrets/db_pw", None).await, StatusCode::NOT_FOUND, "db_pw not found");
}

#[tokio::test]
async fn bad_secrets_and_configs_are_400_and_store_nothing() {
    let (state, _) = test_state();
    let big = vec![b'x'; 600 * 1000];
    let cases: Vec<(&str, &str, Value, &str)> = vec![
        (
            "",
            "secrets",
            json!({"Name": "big", "Data": data_to_base64(&big)}),
            "Data: secret data must be larger than 0 and less than 512000 bytes (got 600000 bytes)",
        ),
        ("", "secrets", json!({"Name": "empty"}), "Data: secret data must be larger than 0"),
        ("", "secrets", json!({"Name": "b64", "Data": "cGFzc3dvcmQ!"}), "Data: illegal base64 data at input byte 11"),
        ("", "secrets", json!({"Name": "bad name!", "Data": "YQ=="}), "Name: invalid secret name"),
        (
            "",
            "secrets",
            json!({"Name": "drv", "Data": "YQ==", "Driver": {"Name": "vault"}}),
            "Driver: secret drivers are not supported",
        ),
        (
            "",
            "secrets",
            json!({"Name": "tpl", "Data": "YQ==", "Templating": {"Name": "jinja"}}),
            "Templating.Name: unknown templating driver \"jinja\"",
        ),
        (
            "/v1.36",
            "secrets",
            json!({"Name": "old", "Data": "YQ==", "Templating": {"Name": "golang"}}),
            "secret templating is not supported on the specified API version: 1.36",
        ),
        (
            "/v1.36",
            "configs",
            json!({"Name": "old", "Data": "YQ==", "Templating": {}}),
            "config templating is not supported on the specified API version: 1.36",
        ),
        (
            "",
            "configs",
            json!({"Name": "big", "Data": data_to_base64(&vec![b'x'; 1000 * 1024])}),
            "Data: config data must be larger than 0 and less than 1024000 bytes",
        ),
        ("", "configs", json!({"Name": "c", "Data": 5}), "invalid JSON: Data"),
    ];
    for (prefix, kind, body, fragment) in cases {
        let r = call(&state, Method::POST, &format!("{prefix}/{kind}/create"), Some(body)).await;
        assert_error(&r, StatusCode::BAD_REQUEST, fragment);
        assert!(!r.text.contains("cGFzc3dvcmQ") && !r.text.contains("xxxx"), "{}", r.text);
    }
    assert_eq!(names(&call(&state, Method::GET, "/secrets", None).await), Vec::<String>::new());
    assert_eq!(names(&call(&state, Method::GET, "/configs", None).await), Vec::<String>::new());
    // Templating from 1.37 on, and an empty driver is no driver.
    let r = call(
        &state,
        Method::POST,
        "/v1.37/secrets/create",
        Some(json!({"Name": "tpl", "Data": "YQ==", "Templating": {"Name": "golang"}, "Driver": {}})),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let r = call(&state, Method::GET, "/secrets/tpl", None).await;
    assert_eq!(r.body["Spec"], json!({"Name": "tpl", "Labels": {}, "Templating": {"Name": "golang"}}), "{}", r.text);
    // The largest secret there can be.
    let r = call(
        &state,
        Method::POST,
        "/secrets/create",
        Some(json!({"Name": "max", "Data": data_to_base64(&vec![b'y'; 500 * 1024 - 1])})),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
}

#[tokio::test]
async fn a_config_shows_its_data_and_follows_the_same_rules() {
    let (state, _) = test_state();
    let data = b"listen 8080\n{{.Service.Name}}\n";
    let body = json!({"Name": "app.conf", "Labels": {"a": "b"}, "Data": data_to_base64(data),
        "Templating": {"Name": "golang"}});
    let r = call(&state, Method::POST, "/configs/create", Some(body)).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let id = r.body["ID"].as_str().unwrap().to_string();
    let r = call(&state, Method::GET, "/configs/app.conf", None).await;
    assert_eq!(r.body["ID"], json!(id));
    assert_eq!(
        r.body["Spec"],
        json!({"Name": "app.conf", "Labels": {"a": "b"}, "Data": data_to_base64(data),
            "Templating": {"Name": "golang"}}),
        "{}",
        r.text
    );
    let listed =
        call(&state, Method::GET, &format!("/configs?filters={}", filters(json!({"name": ["app"]}))), None).await;
    assert_eq!(names(&listed), ["app.conf"]);
    assert_eq!(listed.body[0]["Spec"]["Data"], json!(data_to_base64(data)));
    let r = call(&state, Method::POST, "/configs/create", Some(json!({"Name": "app.conf", "Data": "YQ=="}))).await;
    assert_error(&r, StatusCode::CONFLICT, "config app.conf already exists");
    let version = call(&state, Method::GET, "/configs/app.conf", None).await.body["Version"]["Index"].as_u64().unwrap();
    let r = call(
        &state,
        Method::POST,
        &format!("/configs/{id}/update?version={version}"),
        Some(json!({"Name": "app.conf", "Data": "YQ==", "Templating": {"Name": "golang"}})),
    )
    .await;
    assert_error(&r, StatusCode::BAD_REQUEST, "Data: only updates to Labels are allowed");
    let r = call(
        &state,
        Method::POST,
        &format!("/configs/{id}/update?version={version}"),
        Some(json!({"Name": "app.conf", "Labels": {"c": "d"}, "Templating": {"Name": "golang"}})),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(call(&state, Method::GET, "/configs/app.conf", None).await.body["Spec"]["Labels"], json!({"c": "d"}));
    let r = call(&state, Method::DELETE, &format!("/configs/{}", &id[..5]), None).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text);
}

fn service(name: &str, secrets: Value, configs: Value) -> Value {
    json!({
        "Name": name,
        "TaskTemplate": {"ContainerSpec": {"Image": "busybox", "Args": ["sleep", "9"], "Secrets": secrets,
            "Configs": configs}},
        "Mode": {"Replicated": {"Replicas": 1}}
    })
}

#[tokio::test]
async fn services_reference_secrets_and_configs_which_cannot_be_removed_while_used() {
    let (state, _) = test_state();
    let sid = call(&state, Method::POST, "/secrets/create", Some(json!({"Name": "db_pw", "Data": "cHc="}))).await.body
        ["ID"]
        .as_str()
        .unwrap()
        .to_string();
    let cid = call(&state, Method::POST, "/configs/create", Some(json!({"Name": "app.conf", "Data": "YQ=="})))
        .await
        .body["ID"]
        .as_str()
        .unwrap()
        .to_string();
    // As the docker CLI sends them: both the ID and the name, the file name defaulted to the secret's name.
    let secret_ref = json!([{"File": {"Name": "db_pw", "UID": "0", "GID": "0", "Mode": 292}, "SecretID": sid,
        "SecretName": "db_pw"}]);
    let config_ref = json!([{"File": {"Name": "/etc/app.conf", "UID": "1000", "GID": "1000", "Mode": 288},
        "ConfigName": "app.conf"}]);
    let r = call(&state, Method::POST, "/services/create", Some(service("web", secret_ref.clone(), config_ref))).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let svc = call(&state, Method::GET, "/services/web", None).await;
    let c = &svc.body["Spec"]["TaskTemplate"]["ContainerSpec"];
    assert_eq!(c["Secrets"], secret_ref, "{}", svc.text);
    // The config was named only: the control API filled in its ID.
    assert_eq!(
        c["Configs"],
        json!([{"File": {"Name": "/etc/app.conf", "UID": "1000", "GID": "1000", "Mode": 288}, "ConfigID": cid,
                "ConfigName": "app.conf"}]),
        "{}",
        svc.text
    );

    for (secrets, configs, fragment) in [
        (json!([{"File": {"Name": "x"}, "SecretName": "nope"}]), json!([]), "secret not found: nope"),
        (json!([]), json!([{"File": {"Name": "x"}, "ConfigID": "zzz"}]), "config not found: zzz"),
        (
            json!([{"File": {"Name": "t"}, "SecretName": "db_pw"}, {"File": {"Name": "t"}, "SecretID": sid}]),
            json!([]),
            "conflicting target: 't'",
        ),
        (json!([{"SecretName": "db_pw"}]), json!([]), "no target provided"),
        (json!([]), json!([{"ConfigName": "app.conf"}]), "Configs[0]: either File or Runtime should be set"),
        (
            json!([]),
            json!([{"ConfigName": "app.conf", "File": {"Name": "a"}, "Runtime": {}}]),
            "cannot specify both File and Runtime",
        ),
    ] {
        let r = call(&state, Method::POST, "/services/create", Some(service("bad", secrets, configs))).await;
        assert_error(&r, StatusCode::BAD_REQUEST, fragment);
    }

    let r = call(&state, Method::DELETE, "/secrets/db_pw", None).await;
    assert_error(&r, StatusCode::BAD_REQUEST, "secret 'db_pw' is in use by the following service: web");
    let r = call(&state, Method::DELETE, &format!("/configs/{cid}"), None).await;
    assert_error(&r, StatusCode::BAD_REQUEST, "config 'app.conf' is in use by the following service: web");
    assert_eq!(call(&state, Method::DELETE, "/services/web", None).await.status, StatusCode::OK);
    assert_eq!(call(&state, Method::DELETE, "/secrets/db_pw", None).await.status, StatusCode::NO_CONTENT);
    assert_eq!(call(&state, Method::DELETE, "/configs/app.conf", None).await.status, StatusCode::NO_CONTENT);
}
