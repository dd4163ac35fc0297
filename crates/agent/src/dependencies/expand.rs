//! Service templates in a task's container spec (SwarmKit's `template.ExpandContainerSpec`): `Env` values,
//! `Hostname`, each mount's `Source` and `Target`, and a volume mount's labels and driver options are
//! rendered with SwarmKit's context (`{{.Service.Name}}`, `{{.Node.Hostname}}`, `{{.Task.Slot}}` ...) by
//! the bounded engine (`shoal_template`), once, before the executor sees the task; the error messages are
//! SwarmKit's ("expanding env failed: expanding env \"X={{...}}\": ..."). Both executors get the expanded
//! task. Must not depend on the executors.

use shoal_api::{task_spec, Task};

use super::{template_data, NodeFacts};

/// Where a templated string of the container spec came from, for the error message.
enum Field {
    Env(usize, String),
    Hostname,
    MountSource(usize),
    MountTarget(usize),
    VolumeLabel(usize, String),
    DriverOption(usize, String),
}

/// `task` with its container spec's templates expanded for `node`; the task itself when it has none. An
/// error is SwarmKit's message, for rejecting the task.
pub(crate) fn expand_container_spec(task: &Task, node: &NodeFacts) -> Result<Task, String> {
    let Some(task_spec::Runtime::Container(c)) = task.spec.as_ref().and_then(|s| s.runtime.as_ref()) else {
        return Ok(task.clone());
    };
    let mut fields = Vec::new();
    let mut texts = Vec::new();
    for (i, kv) in c.env.iter().enumerate() {
        if let Some((_, v)) = kv.split_once('=') {
            fields.push(Field::Env(i, kv.clone()));
            texts.push(v.to_string());
        }
    }
    for (i, m) in c.mounts.iter().enumerate() {
        fields.push(Field::MountSource(i));
        texts.push(m.source.clone());
        fields.push(Field::MountTarget(i));
        texts.push(m.target.clone());
        if let Some(v) = &m.volume_options {
            let mut labels: Vec<_> = v.labels.iter().collect();
            labels.sort();
            for (k, val) in labels {
                fields.push(Field::VolumeLabel(i, k.clone()));
                texts.push(val.clone());
            }
            let mut options: Vec<_> = v.driver_config.iter().flat_map(|d| d.options.iter()).collect();
            options.sort();
            for (k, val) in options {
                fields.push(Field::DriverOption(i, k.clone()));
                texts.push(val.clone());
            }
        }
    }
    fields.push(Field::Hostname);
    texts.push(c.hostname.clone());
    if texts.iter().all(|t| !t.contains("{{")) {
        return Ok(task.clone());
    }
    let data = template_data(task, node);
    let rendered =
        shoal_template::render_all(texts.clone(), &data, None, shoal_template::Limits::default()).map_err(|f| {
            let e = f.error;
            match &fields[f.index] {
                Field::Env(_, kv) => format!("expanding env failed: expanding env {kv:?}: {e}"),
                Field::Hostname => format!("expanding hostname failed: {e}"),
                Field::MountSource(_) => {
                    format!("expanding mounts failed: expanding mount source {:?}: {e}", texts[f.index])
                }
                Field::MountTarget(_) => {
                    format!("expanding mounts failed: expanding mount target {:?}: {e}", texts[f.index])
                }
                Field::VolumeLabel(_, k) => format!(
                    "expanding mounts failed: expanding volume labels: expanding map entry {k:?}={:?}: {e}",
                    texts[f.index]
                ),
                Field::DriverOption(_, k) => format!(
                    "expanding mounts failed: expanding volume driver config: expanding map entry {k:?}={:?}: {e}",
                    texts[f.index]
                ),
            }
        })?;
    let mut out = task.clone();
    let Some(task_spec::Runtime::Container(c)) = out.spec.as_mut().and_then(|s| s.runtime.as_mut()) else {
        return Ok(out);
    };
    for (field, value) in fields.into_iter().zip(rendered) {
        match field {
            Field::Env(i, kv) => {
                let name = kv.split_once('=').map_or(kv.as_str(), |(k, _)| k);
                c.env[i] = format!("{name}={value}");
            }
            Field::Hostname => c.hostname = value,
            Field::MountSource(i) => c.mounts[i].source = value,
            Field::MountTarget(i) => c.mounts[i].target = value,
            Field::VolumeLabel(i, k) => {
                if let Some(v) = c.mounts[i].volume_options.as_mut() {
                    v.labels.insert(k, value);
                }
            }
            Field::DriverOption(i, k) => {
                if let Some(d) = c.mounts[i].volume_options.as_mut().and_then(|v| v.driver_config.as_mut()) {
                    d.options.insert(k, value);
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_api::{mount, Annotations, ContainerSpec, Driver, Mount, TaskSpec};

    fn task(c: ContainerSpec) -> Task {
        Task {
            id: "t1".into(),
            service_id: "s1".into(),
            node_id: "n1".into(),
            slot: 3,
            service_annotations: Some(Annotations { name: "web".into(), ..Default::default() }.into()),
            spec: Some(TaskSpec { runtime: Some(task_spec::Runtime::Container(c)), ..Default::default() }.into()),
            ..Default::default()
        }
    }

    fn node() -> NodeFacts {
        NodeFacts { id: "n1".into(), hostname: "vm1".into(), os: "linux".into(), architecture: "x86_64".into() }
    }

    fn container(t: &Task) -> &ContainerSpec {
        match t.spec.as_ref().and_then(|s| s.runtime.as_ref()) {
            Some(task_spec::Runtime::Container(c)) => c,
            _ => panic!("no container"),
        }
    }

    #[test]
    fn env_hostname_and_mounts_are_expanded_as_swarmkit_does() {
        let t = task(ContainerSpec {
            env: vec!["X={{.Service.Name}}".into(), "PLAIN=1".into(), "BARE".into(), "S={{.Task.Slot}}".into()],
            hostname: "{{.Node.Hostname}}-{{.Task.Slot}}".into(),
            mounts: vec![Mount {
                r#type: mount::Type::Volume as i32,
                source: "data-{{.Task.Slot}}".into(),
                target: "/data/{{.Service.Name}}".into(),
                volume_options: Some(mount::VolumeOptions {
                    labels: [("owner".to_string(), "{{.Task.Name}}".to_string())].into(),
                    driver_config: Some(Driver {
                        name: "local".into(),
                        options: [("device".to_string(), "{{.Node.ID}}".to_string())].into(),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        });
        let e = expand_container_spec(&t, &node()).unwrap();
        let c = container(&e);
        assert_eq!(c.env, ["X=web", "PLAIN=1", "BARE", "S=3"]);
        assert_eq!(c.hostname, "vm1-3");
        assert_eq!((c.mounts[0].source.as_str(), c.mounts[0].target.as_str()), ("data-3", "/data/web"));
        let v = c.mounts[0].volume_options.as_ref().unwrap();
        assert_eq!(v.labels["owner"], "web.3.t1");
        assert_eq!(v.driver_config.as_ref().unwrap().options["device"], "n1");
    }

    #[test]
    fn errors_name_the_field_as_swarmkit_does() {
        for (c, want) in [
            (
                ContainerSpec { env: vec!["X={{.Nope".into()], ..Default::default() },
                "expanding env failed: expanding env \"X={{.Nope\"",
            ),
            (
                ContainerSpec {
                    hostname: "{{template \"h\"}}{{define \"h\"}}{{template \"h\"}}{{end}}".into(),
                    ..Default::default()
                },
                "expanding hostname failed: ",
            ),
            (
                ContainerSpec {
                    mounts: vec![Mount { source: "{{env \"X\"}}".into(), target: "/t".into(), ..Default::default() }],
                    ..Default::default()
                },
                "expanding mounts failed: expanding mount source \"{{env \\\"X\\\"}}\"",
            ),
        ] {
            let e = expand_container_spec(&task(c), &node()).unwrap_err();
            assert!(e.starts_with(want), "{e}");
        }
    }
}
