//! The secrets and configs this node received from the dispatcher, and the files one task gets from them.
//!
//! `Dependencies` holds them in memory only, as the dispatcher sends them (UPDATE adds or replaces, REMOVE
//! drops, a COMPLETE set replaces all): they are never written to the state dir and never logged (`Debug`
//! shows IDs and names only). `Dependencies::files_for` resolves one task's references into `TaskFile`s:
//! the target name, owner, mode and the data, rendered per task when the object has a `golang` templating
//! driver (SwarmKit's placeholders, see `render`). A reference that cannot be honoured (the object was not
//! sent, a secret driver, a runtime target, an unknown templating driver, a template error) is an error whose
//! message names the object and never carries secret data: the task is then rejected with it.
//!
//! Bound: one entry per secret and config referenced by a task assigned to this node. Must not depend on the
//! executors, gRPC or the session.

use std::collections::HashMap;
use std::sync::Arc;

use shoal_api::{assignment, config_reference, secret_reference, task_spec, Config, ContainerSpec, Secret, Task};

/// Bytes that must not be shown: `Debug` prints their length only.
#[derive(Clone, PartialEq, Eq)]
pub struct Sensitive(Vec<u8>);

impl Sensitive {
    /// Wraps `data`.
    pub fn new(data: Vec<u8>) -> Sensitive {
        Sensitive(data)
    }

    /// The bytes.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Sensitive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{} bytes>", self.0.len())
    }
}

/// Whether a task file comes from a secret or a config (they are exposed in different places).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// From a secret.
    Secret,
    /// From a config.
    Config,
}

/// One file a task gets: where (the reference's `FileTarget.name`, relative or absolute, as sent), owner,
/// mode and contents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskFile {
    /// Secret or config.
    pub kind: FileKind,
    /// The name of the secret or config (for messages).
    pub source: String,
    /// The target name (`FileTarget.name`).
    pub target: String,
    /// Owner user ID (numeric string; empty means 0).
    pub uid: String,
    /// Owner group ID (numeric string; empty means 0).
    pub gid: String,
    /// Permission bits.
    pub mode: u32,
    /// The contents (rendered when templated).
    pub data: Sensitive,
}

/// All the files one task gets, secrets first, in reference order.
pub(crate) type TaskFiles = Vec<TaskFile>;

/// What templates may read about the node (SwarmKit's `{{.Node.*}}`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct NodeFacts {
    /// This node's ID (the task's `node_id` is used when set).
    pub id: String,
    /// The hostname.
    pub hostname: String,
    /// The platform's OS ("linux").
    pub os: String,
    /// The platform's architecture.
    pub architecture: String,
}

/// IDs and names of what the agent holds (never the data): the debug view.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// Secrets as `(ID, name)`, sorted.
    pub secrets: Vec<(String, String)>,
    /// Configs as `(ID, name)`, sorted.
    pub configs: Vec<(String, String)>,
}

/// The secrets and configs this node holds, by ID.
#[derive(Default)]
pub(crate) struct Dependencies {
    secrets: HashMap<String, Arc<Secret>>,
    configs: HashMap<String, Arc<Config>>,
}

impl std::fmt::Debug for Dependencies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Dependencies {:?}", self.held())
    }
}

fn secret_name(s: &Secret) -> &str {
    s.spec.as_ref().and_then(|s| s.annotations.as_ref()).map_or("", |a| a.name.as_str())
}

fn config_name(c: &Config) -> &str {
    c.spec.as_ref().and_then(|s| s.annotations.as_ref()).map_or("", |a| a.name.as_str())
}

fn container(task: &Task) -> Option<&ContainerSpec> {
    match task.spec.as_ref()?.runtime.as_ref()? {
        task_spec::Runtime::Container(c) => Some(c),
        task_spec::Runtime::Attachment(_) => None,
    }
}

/// True when `task` references any secret or config.
pub(crate) fn has_references(task: &Task) -> bool {
    container(task).is_some_and(|c| !c.secrets.is_empty() || !c.configs.is_empty())
}

impl Dependencies {
    /// Nothing held.
    pub(crate) fn new() -> Dependencies {
        Dependencies::default()
    }

    /// Applies one assignment item if it is a secret or config (`remove` for a REMOVE change); returns
    /// false for other items (tasks).
    pub(crate) fn apply(&mut self, item: &assignment::Item, remove: bool) -> bool {
        match item {
            assignment::Item::Secret(s) if remove => {
                self.secrets.remove(&s.id);
            }
            assignment::Item::Secret(s) => {
                self.secrets.insert(s.id.clone(), Arc::new(s.clone()));
            }
            assignment::Item::Config(c) if remove => {
                self.configs.remove(&c.id);
            }
            assignment::Item::Config(c) => {
                self.configs.insert(c.id.clone(), Arc::new(c.clone()));
            }
            // Tasks, and cluster volumes (the worker hands those to its `Volumes`).
            assignment::Item::Task(_) | assignment::Item::Volume(_) => return false,
        }
        true
    }

    /// The data of secret `id`, if this node holds it.
    pub(crate) fn secret_data(&self, id: &str) -> Option<&[u8]> {
        self.secrets.get(id).and_then(|s| s.spec.as_ref()).map(|s| s.data.as_slice())
    }

    /// Drops everything (a COMPLETE set starts from nothing).
    pub(crate) fn clear(&mut self) {
        self.secrets.clear();
        self.configs.clear();
    }

    /// IDs and names of what is held.
    pub(crate) fn held(&self) -> Held {
        let mut secrets: Vec<(String, String)> =
            self.secrets.values().map(|s| (s.id.clone(), secret_name(s).to_string())).collect();
        let mut configs: Vec<(String, String)> =
            self.configs.values().map(|c| (c.id.clone(), config_name(c).to_string())).collect();
        secrets.sort();
        configs.sort();
        Held { secrets, configs }
    }

    /// The files `task` gets from its secret and config references, rendered for it on `node`. An error
    /// names what cannot be honoured and never carries secret data.
    pub(crate) fn files_for(&self, task: &Task, node: &NodeFacts) -> Result<TaskFiles, String> {
        let Some(c) = container(task) else { return Ok(Vec::new()) };
        let mut files = Vec::with_capacity(c.secrets.len() + c.configs.len());
        for r in &c.secrets {
            let label = if r.secret_name.is_empty() { &r.secret_id } else { &r.secret_name };
            let Some(secret_reference::Target::File(target)) = &r.target else {
                return Err(format!("secret {label}: the reference has no file target; give it a target name"));
            };
            let secret = self.secrets.get(&r.secret_id).ok_or_else(|| {
                format!(
                    "secret {label} ({}) was not sent to this node: it no longer exists in the cluster; create it \
                     again and update the service",
                    r.secret_id
                )
            })?;
            let spec = secret.spec.clone().unwrap_or_default();
            if let Some(d) = spec.driver.as_ref().filter(|d| !d.name.is_empty()) {
                return Err(format!(
                    "secret {label} uses the secret driver {:?}, which Shoal does not support",
                    d.name
                ));
            }
            let data = match spec.templating.as_ref().filter(|t| !t.name.is_empty()) {
                None => spec.data,
                Some(t) => {
                    render(&t.name, &spec.data, true, task, node, self).map_err(|e| format!("secret {label}: {e}"))?
                }
            };
            files.push(TaskFile {
                kind: FileKind::Secret,
                source: label.clone(),
                target: target.name.clone(),
                uid: target.uid.clone(),
                gid: target.gid.clone(),
                mode: target.mode,
                data: Sensitive(data),
            });
        }
        for r in &c.configs {
            let label = if r.config_name.is_empty() { &r.config_id } else { &r.config_name };
            let target = match &r.target {
                Some(config_reference::Target::File(f)) => f,
                Some(config_reference::Target::Runtime(_)) => {
                    return Err(format!(
                        "config {label} has a runtime target (a credential spec), which Shoal does not support"
                    ))
                }
                None => return Err(format!("config {label}: the reference has no file target; give it a target name")),
            };
            let config = self.configs.get(&r.config_id).ok_or_else(|| {
                format!(
                    "config {label} ({}) was not sent to this node: it no longer exists in the cluster; create it \
                     again and update the service",
                    r.config_id
                )
            })?;
            let spec = config.spec.clone().unwrap_or_default();
            let data = match spec.templating.as_ref().filter(|t| !t.name.is_empty()) {
                None => spec.data,
                Some(t) => {
                    render(&t.name, &spec.data, false, task, node, self).map_err(|e| format!("config {label}: {e}"))?
                }
            };
            files.push(TaskFile {
                kind: FileKind::Config,
                source: label.clone(),
                target: target.name.clone(),
                uid: target.uid.clone(),
                gid: target.gid.clone(),
                mode: target.mode,
                data: Sensitive(data),
            });
        }
        Ok(files)
    }
}

/// SwarmKit's template context for `task` on `node` (`.Task.Slot` is the node ID for slotless tasks).
pub(crate) fn template_data(task: &Task, node: &NodeFacts) -> shoal_template::Data {
    let service = task.service_annotations.clone().unwrap_or_default();
    let node_id = if task.node_id.is_empty() { node.id.as_str() } else { task.node_id.as_str() };
    let slot = if task.slot != 0 { task.slot.to_string() } else { node_id.to_string() };
    shoal_template::Data {
        service_id: task.service_id.clone(),
        service_name: service.name.clone(),
        service_labels: service.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        node_id: node_id.to_string(),
        node_hostname: node.hostname.clone(),
        node_os: node.os.clone(),
        node_architecture: node.architecture.clone(),
        task_id: task.id.clone(),
        task_name: crate::naming::task_name(task),
        task_slot: slot,
    }
}

/// Renders `payload` with the templating driver `driver` (only `golang`) for `task` on `node`, within the
/// template engine's limits (`shoal_template`: a recursive, too deep or too costly template is refused,
/// never run). `sensitive` (a secret's own template) withholds the engine's message, which may quote the
/// template text; otherwise the message is shown with every secret value the task could read replaced.
fn render(
    driver: &str,
    payload: &[u8],
    sensitive: bool,
    task: &Task,
    node: &NodeFacts,
    deps: &Dependencies,
) -> Result<Vec<u8>, String> {
    if driver != "golang" {
        return Err(format!("unknown templating driver {driver:?}; the only one is \"golang\""));
    }
    let text = std::str::from_utf8(payload).map_err(|_| "the template is not UTF-8 text".to_string())?;
    let c = container(task).cloned().unwrap_or_default();
    let mut scope = shoal_template::Payload::default();
    for kv in &c.env {
        if let Some((k, v)) = kv.split_once('=') {
            scope.env.insert(k.to_string(), v.to_string());
        }
    }
    for r in &c.secrets {
        if let (Some(secret_reference::Target::File(f)), Some(s)) = (&r.target, deps.secrets.get(&r.secret_id)) {
            scope.secrets.insert(f.name.clone(), s.spec.as_ref().map(|s| s.data.clone()).unwrap_or_default());
        }
    }
    for r in &c.configs {
        if let (Some(config_reference::Target::File(f)), Some(s)) = (&r.target, deps.configs.get(&r.config_id)) {
            scope.configs.insert(f.name.clone(), s.spec.as_ref().map(|s| s.data.clone()).unwrap_or_default());
        }
    }
    let secret_values: Vec<Vec<u8>> = scope.secrets.values().filter(|v| !v.is_empty()).cloned().collect();
    let data = template_data(task, node);
    match shoal_template::render(text, &data, Some(&scope), shoal_template::Limits::default()) {
        Ok(out) => Ok(out.into_bytes()),
        Err(e) if sensitive && e.may_quote_text() => Err("its golang template did not render (the template error \
                                                          is withheld because it may quote secret data; check \
                                                          the template with a config of the same text)"
            .into()),
        Err(e) => {
            let mut msg = e.to_string();
            for v in &secret_values {
                let v = String::from_utf8_lossy(v);
                msg = msg.replace(v.as_ref(), "[secret redacted]");
            }
            Err(format!("its golang template did not render: {msg}"))
        }
    }
}

pub(crate) mod expand;

#[cfg(test)]
mod tests;
