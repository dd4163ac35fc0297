//! Unit tests of secrets, configs and a service's references to them, over the same harness as `tests.rs`.

use shoal_api::{
    config_reference, secret_reference, task_spec, Annotations, ConfigReference, ConfigSpec, ContainerSpec, Driver,
    FileTarget, RuntimeTarget, SecretReference, SecretSpec, ServiceSpec,
};
use shoal_store::StoreObject;

use super::tests::{cluster, spec};
use super::*;
use crate::limits::{MAX_CONFIG_DATA_BYTES, MAX_SECRET_DATA_BYTES};

fn ann(name: &str, labels: &[(&str, &str)]) -> Option<Annotations> {
    Some(Annotations {
        name: name.into(),
        labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..Default::default()
    })
}

fn secret_spec(name: &str, data: &[u8]) -> SecretSpec {
    SecretSpec { annotations: ann(name, &[]), data: data.to_vec(), ..Default::default() }
}

fn config_spec(name: &str, data: &[u8]) -> ConfigSpec {
    ConfigSpec { annotations: ann(name, &[]), data: data.to_vec(), ..Default::default() }
}

fn golang() -> Option<Driver> {
    Some(Driver { name: "golang".into(), ..Default::default() })
}

fn invalid_message<T: std::fmt::Debug>(r: Result<T, ControlError>) -> String {
    match r {
        Err(ControlError::InvalidArgument(m)) => m,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

fn file(name: &str) -> FileTarget {
    FileTarget { name: name.into(), uid: "0".into(), gid: "0".into(), mode: 0o444 }
}

fn secret_ref(id: &str, name: &str, target: &str) -> SecretReference {
    SecretReference {
        secret_id: id.into(),
        secret_name: name.into(),
        target: Some(secret_reference::Target::File(file(target))),
    }
}

fn config_ref(id: &str, name: &str, target: &str) -> ConfigReference {
    ConfigReference {
        config_id: id.into(),
        config_name: name.into(),
        target: Some(config_reference::Target::File(file(target))),
    }
}

fn with_refs(name: &str, secrets: Vec<SecretReference>, configs: Vec<ConfigReference>) -> ServiceSpec {
    let mut s = spec(name, 1);
    let Some(task_spec::Runtime::Container(c)) = s.task.as_mut().unwrap().runtime.as_mut() else { unreachable!() };
    c.secrets = secrets;
    c.configs = configs;
    s
}

fn container(s: &shoal_api::Service) -> &ContainerSpec {
    match s.spec.as_ref().unwrap().task.as_ref().unwrap().runtime.as_ref().unwrap() {
        task_spec::Runtime::Container(c) => c,
        _ => panic!("not a container"),
    }
}

#[test]
fn secret_and_config_specs_follow_swarmkits_rules_and_name_the_field() {
    assert!(validate_secret_spec(&secret_spec("db.pw_1-a", b"pw")).is_ok());
    assert!(validate_config_spec(&config_spec("a", b"x")).is_ok());
    let cases: Vec<(SecretSpec, &str)> = vec![
        (secret_spec("", b"pw"), "Name: a secret name must be provided"),
        (secret_spec("-pw", b"pw"), "Name: invalid secret name \"-pw\""),
        (secret_spec("pw.", b"pw"), "the start and end character must be [a-zA-Z0-9]"),
        (secret_spec("p w", b"pw"), "invalid secret name"),
        (secret_spec(&"a".repeat(65), b"pw"), "only 64 [a-zA-Z0-9-_.] characters allowed"),
        (secret_spec("pw", b""), "Data: secret data must be larger than 0 and less than 512000 bytes (got 0 bytes)"),
        (secret_spec("pw", &vec![b'x'; MAX_SECRET_DATA_BYTES]), "(got 512000 bytes)"),
        (
            SecretSpec {
                driver: Some(Driver { name: "vault".into(), ..Default::default() }),
                ..secret_spec("pw", b"x")
            },
            "Driver: secret drivers are not supported",
        ),
        (
            SecretSpec {
                templating: Some(Driver { name: "jinja".into(), ..Default::default() }),
                ..secret_spec("pw", b"x")
            },
            "Templating.Name: unknown templating driver \"jinja\"",
        ),
        (
            SecretSpec {
                templating: Some(Driver {
                    name: "golang".into(),
                    options: [("a".to_string(), "b".to_string())].into(),
                }),
                ..secret_spec("pw", b"x")
            },
            "Templating.Options",
        ),
        (
            SecretSpec { annotations: ann("pw", &[("k", &"v".repeat(70_000))]), ..secret_spec("pw", b"x") },
            "Labels: the secret's labels are 70001 bytes, over the limit of 65536 bytes",
        ),
    ];
    for (spec, fragment) in cases {
        let m = invalid_message(validate_secret_spec(&spec));
        assert!(m.contains(fragment), "{fragment:?} not in {m:?}");
    }
    assert!(validate_secret_spec(&SecretSpec { templating: golang(), ..secret_spec("pw", b"x") }).is_ok());
    assert!(validate_secret_spec(&secret_spec("pw", &vec![b'x'; MAX_SECRET_DATA_BYTES - 1])).is_ok());
    assert!(validate_config_spec(&config_spec("c", &vec![b'x'; MAX_CONFIG_DATA_BYTES - 1])).is_ok());
    let m = invalid_message(validate_config_spec(&config_spec("c", &vec![b'x'; MAX_CONFIG_DATA_BYTES])));
    assert!(m.contains("Data: config data must be larger than 0 and less than 1024000 bytes"), "{m}");
    let m = invalid_message(validate_config_spec(&config_spec("c", b"")));
    assert!(m.contains("(got 0 bytes)"), "{m}");
}

#[test]
fn no_error_about_a_secret_carries_its_data() {
    let data = b"hunter2-is-the-password";
    let mut specs = vec![
        SecretSpec { driver: Some(Driver::default()), ..secret_spec("pw", data) },
        SecretSpec { templating: Some(Driver::default()), ..secret_spec("pw", data) },
        secret_spec("-x", data),
    ];
    specs.push(SecretSpec { annotations: ann("pw", &[("k", &"v".repeat(70_000))]), ..secret_spec("pw", data) });
    for s in specs {
        let m = invalid_message(validate_secret_spec(&s));
        assert!(!m.contains("hunter2"), "{m}");
    }
}

#[tokio::test]
async fn secrets_are_created_listed_and_read_without_their_data() {
    let (state, _) = cluster();
    let s =
        create_secret(&state, SecretSpec { annotations: ann("db_pw", &[("env", "prod")]), ..secret_spec("", b"pw") })
            .await
            .unwrap();
    assert_eq!(s.id.len(), 25);
    assert_eq!(s.version(), 1);
    assert!(s.spec.as_ref().unwrap().data.is_empty(), "create returns no data");
    // The store has the data; every read leaves it out.
    let stored = state.store.view(|t| t.secrets().get(&s.id).cloned()).unwrap();
    assert_eq!(stored.spec.as_ref().unwrap().data, b"pw");
    for r in [s.id.as_str(), "db_pw", &s.id[..5]] {
        let got = get_secret(&state, r).unwrap();
        assert_eq!(got.id, s.id);
        assert!(got.spec.unwrap().data.is_empty());
    }
    create_secret(&state, secret_spec("db_user", b"admin")).await.unwrap();
    create_secret(&state, secret_spec("api_key", b"k")).await.unwrap();

    let names = |f: SecretFilters| -> Vec<String> {
        list_secrets(&state, &f)
            .into_iter()
            .inspect(|s| assert!(s.spec.as_ref().unwrap().data.is_empty()))
            .map(|s| s.spec.unwrap().annotations.unwrap().name)
            .collect()
    };
    assert_eq!(names(SecretFilters::default()), ["api_key", "db_pw", "db_user"]);
    assert_eq!(names(SecretFilters { name_prefixes: vec!["db".into()], ..Default::default() }), ["db_pw", "db_user"]);
    assert_eq!(names(SecretFilters { names: vec!["db".into(), "db_user".into()], ..Default::default() }), ["db_user"]);
    // names, name prefixes and ID prefixes are alternatives, as in SwarmKit.
    assert_eq!(
        names(SecretFilters { names: vec!["api_key".into()], id_prefixes: vec![s.id.clone()], ..Default::default() }),
        ["api_key", "db_pw"]
    );
    assert_eq!(names(SecretFilters { labels: vec!["env=prod".into()], ..Default::default() }), ["db_pw"]);
    assert_eq!(names(SecretFilters { labels: vec!["env=dev".into()], ..Default::default() }), Vec::<String>::new());

    match create_secret(&state, secret_spec("db_pw", b"s3cr3t-data")).await.unwrap_err() {
        ControlError::AlreadyExists(m) => {
            assert!(m.contains("secret db_pw already exists") && !m.contains("s3cr3t"), "{m}")
        }
        other => panic!("{other:?}"),
    }
    // Names are unique per kind: a config may share a secret's name.
    create_config(&state, config_spec("db_pw", b"not secret")).await.unwrap();
}

#[tokio::test]
async fn only_labels_change_on_update_with_the_version_read() {
    let (state, _) = cluster();
    let s = create_secret(&state, SecretSpec { templating: golang(), ..secret_spec("pw", b"old") }).await.unwrap();
    let v = s.version();
    let base = SecretSpec { annotations: ann("pw", &[("a", "1")]), templating: golang(), ..Default::default() };
    for (spec, field) in [
        (SecretSpec { annotations: ann("pw2", &[]), ..base.clone() }, "Name: only updates to Labels are allowed"),
        (SecretSpec { data: b"n3w-data".to_vec(), ..base.clone() }, "Data: only updates to Labels are allowed"),
        (SecretSpec { templating: None, ..base.clone() }, "Templating: only updates to Labels are allowed"),
        (
            SecretSpec { driver: Some(Driver { name: "x".into(), ..Default::default() }), ..base.clone() },
            "Driver: only updates to Labels are allowed",
        ),
    ] {
        let m = invalid_message(update_secret(&state, "pw", v, spec).await);
        assert!(m.contains(field), "{m}");
        assert!(!m.contains("n3w"), "{m}");
    }
    match update_secret(&state, "pw", v + 7, base.clone()).await.unwrap_err() {
        ControlError::Conflict(m) => assert!(m.ends_with(": update out of sequence"), "{m}"),
        other => panic!("{other:?}"),
    }
    // The same data sent back is no change; an empty one means "unchanged".
    let updated = update_secret(&state, &s.id, v, SecretSpec { data: b"old".to_vec(), ..base.clone() }).await.unwrap();
    assert!(updated.spec.as_ref().unwrap().data.is_empty());
    assert_eq!(updated.spec.as_ref().unwrap().annotations.as_ref().unwrap().labels["a"], "1");
    assert!(updated.version() > v);
    let stored = state.store.view(|t| t.secrets().get(&s.id).cloned()).unwrap();
    assert_eq!(stored.spec.as_ref().unwrap().data, b"old", "the data stays");

    let c = create_config(&state, config_spec("conf", b"x=1")).await.unwrap();
    let m = invalid_message(update_config(&state, "conf", c.version(), config_spec("conf", b"x=2")).await);
    assert!(m.contains("Data: only updates to Labels are allowed"), "{m}");
    let c2 = update_config(
        &state,
        "conf",
        c.version(),
        ConfigSpec { annotations: ann("conf", &[("k", "v")]), ..Default::default() },
    )
    .await
    .unwrap();
    assert_eq!(c2.spec.as_ref().unwrap().data, b"x=1", "a config's data is returned");
    assert_eq!(c2.spec.as_ref().unwrap().annotations.as_ref().unwrap().labels["k"], "v");
}

#[tokio::test]
async fn services_reference_existing_secrets_and_configs_by_id_or_name() {
    let (state, _) = cluster();
    let pw = create_secret(&state, secret_spec("db_pw", b"pw")).await.unwrap();
    let conf = create_config(&state, config_spec("app.conf", b"x=1")).await.unwrap();

    // By name only (in any case: names are unique ignoring it): the ID and the stored name are filled in; by
    // ID only: the name is.
    let svc = create_service(
        &state,
        with_refs("web", vec![secret_ref("", "DB_PW", "db_pw")], vec![config_ref(&conf.id, "", "/etc/app.conf")]),
    )
    .await
    .unwrap();
    let c = container(&svc);
    assert_eq!((c.secrets[0].secret_id.as_str(), c.secrets[0].secret_name.as_str()), (pw.id.as_str(), "db_pw"));
    assert_eq!((c.configs[0].config_id.as_str(), c.configs[0].config_name.as_str()), (conf.id.as_str(), "app.conf"));

    for (spec, fragment) in [
        (with_refs("a", vec![secret_ref("", "nope", "x")], vec![]), "secret not found: nope"),
        (
            with_refs("a", vec![secret_ref("", "nope", "x"), secret_ref("zzz", "", "y")], vec![]),
            "secrets not found: nope, zzz",
        ),
        // An ID with another object's name is not that object (SwarmKit checks the name matches).
        (with_refs("a", vec![secret_ref(&pw.id, "other", "x")], vec![]), "secret not found: other"),
        (with_refs("a", vec![], vec![config_ref("", "db_pw", "x")]), "config not found: db_pw"),
    ] {
        let m = invalid_message(create_service(&state, spec).await);
        assert!(m.contains(fragment), "{fragment:?} not in {m:?}");
    }

    // An update that adds an unknown reference is refused and changes nothing.
    let m = invalid_message(
        update_service(&state, "web", svc.version(), with_refs("web", vec![secret_ref("", "gone", "g")], vec![])).await,
    );
    assert!(m.contains("secret not found: gone"), "{m}");
    assert_eq!(get_service(&state, "web").unwrap().version(), svc.version());

    // Removal is refused while a service uses it, naming the services; allowed once none does.
    create_service(&state, with_refs("api", vec![secret_ref(&pw.id, "db_pw", "pw")], vec![])).await.unwrap();
    let m = invalid_message(remove_secret(&state, "db_pw").await);
    assert_eq!(m, "secret 'db_pw' is in use by the following services: api, web");
    let m = invalid_message(remove_config(&state, &conf.id).await);
    assert_eq!(m, "config 'app.conf' is in use by the following service: web");
    remove_service(&state, "api").await.unwrap();
    let web = get_service(&state, "web").unwrap();
    // Dropping the references is a spec change: the spec version moves, so tasks roll.
    let updated = update_service(&state, "web", web.version(), with_refs("web", vec![], vec![])).await.unwrap();
    assert_ne!(updated.spec_version, web.spec_version);
    remove_secret(&state, "db_pw").await.unwrap();
    remove_config(&state, "app.conf").await.unwrap();
    assert!(matches!(get_secret(&state, "db_pw"), Err(ControlError::NotFound { .. })));
    assert!(matches!(remove_config(&state, "app.conf").await, Err(ControlError::NotFound { .. })));
}

#[test]
fn reference_shapes_are_checked_as_swarmkit_does_and_bounded() {
    let check = |secrets: Vec<SecretReference>, configs: Vec<ConfigReference>, fragment: &str| {
        let m = invalid_message(validate_service_spec(&with_refs("web", secrets, configs)));
        assert!(m.contains(fragment), "{fragment:?} not in {m:?}");
    };
    assert!(validate_service_spec(&with_refs(
        "web",
        vec![secret_ref("id", "a", "a"), secret_ref("id2", "b", "/run/secrets/b")],
        vec![config_ref("id", "a", "a")]
    ))
    .is_ok());
    check(vec![secret_ref("", "", "a")], vec![], "ContainerSpec.Secrets[0]: malformed secret reference");
    check(
        vec![SecretReference { secret_name: "a".into(), ..Default::default() }],
        vec![],
        "Secrets[0]: malformed secret reference, no target provided",
    );
    check(vec![secret_ref("", "a", "")], vec![], "Secrets[0].File.Name: malformed file secret reference");
    check(
        vec![secret_ref("", "a", "t"), secret_ref("", "b", "t")],
        vec![],
        "Secrets[1]: secret references 'a' and 'b' have a conflicting target: 't'",
    );
    check(
        vec![],
        vec![config_ref("", "a", "t"), config_ref("", "b", "t")],
        "config references 'a' and 'b' have a conflicting target: 't'",
    );
    check(vec![secret_ref("", "a", "../etc/passwd")], vec![], "must not contain a '..' component");
    check(vec![secret_ref("", "a", &"x".repeat(4097))], vec![], "over the limit of 4096 bytes");
    let mut r = secret_ref("", "a", "t");
    if let Some(secret_reference::Target::File(f)) = r.target.as_mut() {
        f.uid = "root".into();
    }
    check(vec![r], vec![], "Secrets[0].File.UID \"root\" is not a numeric ID");
    let mut r = config_ref("", "a", "t");
    if let Some(config_reference::Target::File(f)) = r.target.as_mut() {
        f.mode = 0o4755;
    }
    check(vec![], vec![r], "Configs[0].File.Mode 0o4755 has bits beyond the permission bits");
    let runtime = ConfigReference {
        config_name: "cred".into(),
        target: Some(config_reference::Target::Runtime(RuntimeTarget {})),
        ..Default::default()
    };
    check(vec![], vec![runtime], "Configs[0].Runtime is not supported");
    let many = (0..1001).map(|i| secret_ref("", "a", &format!("t{i}"))).collect();
    check(many, vec![], "1001 secret references, over the limit of 1000");
}

#[test]
fn templates_that_no_rendering_can_finish_are_refused_at_create_and_syntax_is_left_to_the_agent() {
    let recursive = br#"{{define "a"}}{{template "a" .}}{{end}}{{template "a" .}}"#;
    let mut exponential = String::from(r#"{{define "t0"}}xxxxxxxx{{end}}"#);
    for i in 1..40 {
        exponential.push_str(&format!(
            r#"{{{{define "t{i}"}}}}{{{{template "t{0}"}}}}{{{{template "t{0}"}}}}{{{{end}}}}"#,
            i - 1
        ));
    }
    exponential.push_str(r#"{{template "t39"}}"#);
    for (data, fragment) in
        [(&recursive[..], "recursive templates are not supported"), (exponential.as_bytes(), "steps to render")]
    {
        let m = invalid_message(validate_secret_spec(&SecretSpec { templating: golang(), ..secret_spec("pw", data) }));
        assert!(
            m.starts_with("Data: the secret's golang template cannot be rendered: ") && m.contains(fragment),
            "{m}"
        );
        let m = invalid_message(validate_config_spec(&ConfigSpec { templating: golang(), ..config_spec("c", data) }));
        assert!(
            m.starts_with("Data: the config's golang template cannot be rendered: ") && m.contains(fragment),
            "{m}"
        );
        // Without a templating driver, the same bytes are plain data.
        assert!(validate_config_spec(&config_spec("c", data)).is_ok());
    }
    // A template the engine cannot parse is Docker's business at render time (the task is rejected with it).
    assert!(validate_config_spec(&ConfigSpec { templating: golang(), ..config_spec("c", b"{{.Service.Name") }).is_ok());
    // A service template that calls itself is refused naming the field.
    let mut s = with_refs("web", vec![], vec![]);
    if let Some(task_spec::Runtime::Container(c)) = s.task.as_mut().and_then(|t| t.runtime.as_mut()) {
        c.env = vec!["OK={{.Service.Name}}".into(), format!("X={}", std::str::from_utf8(recursive).unwrap())];
    }
    let m = invalid_message(validate_service_spec(&s));
    assert!(m.starts_with("ContainerSpec.Env[1]: the template cannot be expanded: "), "{m}");
}
