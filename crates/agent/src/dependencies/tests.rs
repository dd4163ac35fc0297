//! Unit tests of the dependencies module: the secrets and configs a node holds, and the files resolved from them.

use super::*;
use shoal_api::{
    Annotations, ConfigReference, ConfigSpec, Driver, FileTarget, RuntimeTarget, SecretReference, SecretSpec, TaskSpec,
};

fn secret(id: &str, name: &str, data: &str, templated: bool) -> Secret {
    Secret {
        id: id.into(),
        spec: Some(SecretSpec {
            annotations: Some(Annotations { name: name.into(), ..Default::default() }),
            data: data.as_bytes().to_vec(),
            templating: templated.then(|| Driver { name: "golang".into(), ..Default::default() }),
            driver: None,
        }),
        ..Default::default()
    }
}

fn config(id: &str, name: &str, data: &str, templating: Option<&str>) -> Config {
    Config {
        id: id.into(),
        spec: Some(ConfigSpec {
            annotations: Some(Annotations { name: name.into(), ..Default::default() }),
            data: data.as_bytes().to_vec(),
            templating: templating.map(|n| Driver { name: n.into(), ..Default::default() }),
        }),
        ..Default::default()
    }
}

fn file(name: &str) -> FileTarget {
    FileTarget { name: name.into(), uid: "0".into(), gid: "0".into(), mode: 0o444 }
}

fn sref(id: &str, target: &str) -> SecretReference {
    SecretReference {
        secret_id: id.into(),
        secret_name: format!("name-{id}"),
        target: Some(secret_reference::Target::File(file(target))),
    }
}

fn cref(id: &str, target: &str) -> ConfigReference {
    ConfigReference {
        config_id: id.into(),
        config_name: format!("name-{id}"),
        target: Some(config_reference::Target::File(file(target))),
    }
}

fn task(secrets: Vec<SecretReference>, configs: Vec<ConfigReference>) -> Task {
    Task {
        id: "task1".into(),
        service_id: "svc1".into(),
        node_id: "node1".into(),
        slot: 3,
        service_annotations: Some(
            Annotations {
                name: "web".into(),
                labels: [("tier".to_string(), "front".to_string())].into(),
                ..Default::default()
            }
            .into(),
        ),
        spec: Some(
            TaskSpec {
                runtime: Some(task_spec::Runtime::Container(ContainerSpec {
                    env: vec!["GREETING=hello".into(), "EMPTY=".into()],
                    secrets,
                    configs,
                    ..Default::default()
                })),
                ..Default::default()
            }
            .into(),
        ),
        ..Default::default()
    }
}

fn node() -> NodeFacts {
    NodeFacts { id: "node1".into(), hostname: "host-a".into(), os: "linux".into(), architecture: "x86_64".into() }
}

fn held(secrets: Vec<Secret>, configs: Vec<Config>) -> Dependencies {
    let mut d = Dependencies::new();
    for s in secrets {
        assert!(d.apply(&assignment::Item::Secret(s), false));
    }
    for c in configs {
        assert!(d.apply(&assignment::Item::Config(c), false));
    }
    d
}

/// Renders config `template` (with secret `s1` = "pw" at target "db_pw" and config `c0` = "base" at
/// target "base.conf" also referenced) for the test task, and compares with `expected`.
fn check(template: &str, expected: Result<&str, &str>) {
    let deps = held(
        vec![secret("s1", "db_pw", "pw", false)],
        vec![config("c0", "base", "base", None), config("c1", "tmpl", template, Some("golang"))],
    );
    let t = task(vec![sref("s1", "db_pw")], vec![cref("c0", "base.conf"), cref("c1", "app.conf")]);
    let got = deps.files_for(&t, &node()).map(|f| String::from_utf8(f[2].data.expose().to_vec()).unwrap());
    match expected {
        Ok(want) => assert_eq!(got.as_deref(), Ok(want), "template {template:?}"),
        Err(fragment) => {
            let e = got.expect_err(template);
            assert!(e.contains(fragment), "template {template:?}: error {e:?} lacks {fragment:?}");
            assert!(!e.contains("pw\"") && !e.contains(" pw"), "a secret value in {e:?}");
        }
    }
}

#[test]
fn templates_see_swarmkits_placeholders() {
    check("{{.Service.Name}}-{{.Task.Slot}}", Ok("web-3"));
    check("{{.Service.ID}} {{.Service.Labels.tier}}", Ok("svc1 front"));
    check("{{.Node.ID}} {{.Node.Hostname}} {{.Node.Platform.OS}}", Ok("node1 host-a linux"));
    check("{{.Task.ID}} {{.Task.Name}}", Ok("task1 web.3.task1"));
    check(r#"{{env "GREETING"}}/{{env "NOPE"}}/{{env "EMPTY"}}"#, Ok("hello//"));
    check(r#"pass={{secret "db_pw"}} base={{config "base.conf"}}"#, Ok("pass=pw base=base"));
    check("plain text, no placeholders", Ok("plain text, no placeholders"));
}

#[test]
fn template_errors_name_the_config_and_never_show_a_secret() {
    check(r#"{{secret "other"}}"#, Err("config name-c1: its golang template did not render"));
    check(r#"{{secret "name-s1"}}"#, Err("secret target name-s1 not found"));
    check("{{.Service.Name", Err("config name-c1"));
    check(r#"{{nosuchfunc "x"}}"#, Err("config name-c1"));
}

#[test]
fn a_templated_secret_renders_and_its_errors_are_withheld() {
    let deps = held(
        vec![
            secret("s1", "db_pw", "pw", false),
            secret("s2", "dsn", r#"user:{{secret "db_pw"}}@{{.Node.Hostname}}"#, true),
        ],
        vec![],
    );
    let t = task(vec![sref("s1", "db_pw"), sref("s2", "dsn")], vec![]);
    let files = deps.files_for(&t, &node()).unwrap();
    assert_eq!(files[1].data.expose(), b"user:pw@host-a");
    assert_eq!(format!("{:?}", files[1].data), "<14 bytes>", "Debug never shows data");

    let deps = held(vec![secret("s3", "bad", "topsecret {{.Nope", true)], vec![]);
    let e = deps.files_for(&task(vec![sref("s3", "bad")], vec![]), &node()).unwrap_err();
    assert!(e.starts_with("secret name-s3: its golang template did not render"), "{e}");
    assert!(!e.contains("topsecret"), "{e}");
}

#[test]
fn references_that_cannot_be_honoured_are_errors_naming_them() {
    let deps = held(vec![secret("s1", "db_pw", "pw", false)], vec![config("c1", "cfg", "x", Some("jinja"))]);
    let missing = deps.files_for(&task(vec![sref("gone", "x")], vec![]), &node()).unwrap_err();
    assert!(missing.contains("secret name-gone (gone) was not sent to this node"), "{missing}");
    let bad_driver = deps.files_for(&task(vec![], vec![cref("c1", "c")]), &node()).unwrap_err();
    assert!(bad_driver.contains("config name-c1: unknown templating driver \"jinja\""), "{bad_driver}");
    let runtime = ConfigReference {
        config_id: "c1".into(),
        config_name: "cfg".into(),
        target: Some(config_reference::Target::Runtime(RuntimeTarget {})),
    };
    let e = deps.files_for(&task(vec![], vec![runtime]), &node()).unwrap_err();
    assert!(e.contains("config cfg has a runtime target"), "{e}");
    let mut with_driver = secret("s9", "ext", "", false);
    with_driver.spec.as_mut().unwrap().driver = Some(Driver { name: "vault".into(), ..Default::default() });
    let deps = held(vec![with_driver], vec![]);
    let e = deps.files_for(&task(vec![sref("s9", "ext")], vec![]), &node()).unwrap_err();
    assert!(e.contains("secret driver \"vault\""), "{e}");
}

#[test]
fn removes_drop_what_is_held_and_the_view_shows_names_only() {
    let mut deps = held(vec![secret("s1", "db_pw", "hunter2", false)], vec![config("c1", "cfg", "x", None)]);
    assert_eq!(
        deps.held(),
        Held { secrets: vec![("s1".into(), "db_pw".into())], configs: vec![("c1".into(), "cfg".into())] }
    );
    assert!(!format!("{deps:?}").contains("hunter2"), "{deps:?}");
    deps.apply(&assignment::Item::Secret(Secret { id: "s1".into(), ..Default::default() }), true);
    assert!(deps.held().secrets.is_empty());
    assert!(!deps.apply(&assignment::Item::Task(Task::default()), false));
    deps.clear();
    assert_eq!(deps.held(), Held::default());
}
