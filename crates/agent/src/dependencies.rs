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

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
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
pub type TaskFiles = Vec<TaskFile>;

/// What templates may read about the node (SwarmKit's `{{.Node.*}}`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeFacts {
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
pub struct Dependencies {
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
pub fn has_references(task: &Task) -> bool {
    container(task).is_some_and(|c| !c.secrets.is_empty() || !c.configs.is_empty())
}

impl Dependencies {
    /// Nothing held.
    pub fn new() -> Dependencies {
        Dependencies::default()
    }

    /// Applies one assignment item if it is a secret or config (`remove` for a REMOVE change); returns
    /// false for other items (tasks).
    pub fn apply(&mut self, item: &assignment::Item, remove: bool) -> bool {
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
            assignment::Item::Task(_) => return false,
        }
        true
    }

    /// Drops everything (a COMPLETE set starts from nothing).
    pub fn clear(&mut self) {
        self.secrets.clear();
        self.configs.clear();
    }

    /// IDs and names of what is held.
    pub fn held(&self) -> Held {
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
    pub fn files_for(&self, task: &Task, node: &NodeFacts) -> Result<TaskFiles, String> {
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

/// What the template functions of one rendering may read: the task's env, and the raw data of the
/// secrets and configs the task references, by target name (SwarmKit's rule: `{{secret "x"}}` is the
/// secret the task mounts at target `x`).
#[derive(Default)]
struct Scope {
    env: BTreeMap<String, String>,
    secrets: BTreeMap<String, Vec<u8>>,
    configs: BTreeMap<String, Vec<u8>>,
}

thread_local! {
    /// gtmpl's functions are plain `fn` pointers: the scope of the rendering in progress on this thread.
    static SCOPE: RefCell<Option<Scope>> = const { RefCell::new(None) };
}

/// Clears the thread's scope when the rendering ends, however it ends.
struct ScopeGuard;

impl Drop for ScopeGuard {
    fn drop(&mut self) {
        SCOPE.with(|s| s.borrow_mut().take());
    }
}

fn one_string_arg(name: &str, args: &[gtmpl::Value]) -> Result<String, gtmpl::FuncError> {
    match args {
        [gtmpl::Value::String(s)] => Ok(s.clone()),
        _ => Err(gtmpl::FuncError::Generic(format!("{name} takes one string argument"))),
    }
}

fn env_func(args: &[gtmpl::Value]) -> Result<gtmpl::Value, gtmpl::FuncError> {
    let name = one_string_arg("env", args)?;
    let v = SCOPE.with(|s| s.borrow().as_ref().and_then(|s| s.env.get(&name).cloned()));
    Ok(gtmpl::Value::String(v.unwrap_or_default()))
}

fn lookup_func(
    func: &str,
    args: &[gtmpl::Value],
    pick: fn(&Scope) -> &BTreeMap<String, Vec<u8>>,
) -> Result<gtmpl::Value, gtmpl::FuncError> {
    let target = one_string_arg(func, args)?;
    let v = SCOPE.with(|s| s.borrow().as_ref().and_then(|s| pick(s).get(&target).cloned()));
    match v {
        Some(data) => Ok(gtmpl::Value::String(String::from_utf8_lossy(&data).into_owned())),
        None => Err(gtmpl::FuncError::Generic(format!("{func} target {target} not found among the task's references"))),
    }
}

fn secret_func(args: &[gtmpl::Value]) -> Result<gtmpl::Value, gtmpl::FuncError> {
    lookup_func("secret", args, |s| &s.secrets)
}

fn config_func(args: &[gtmpl::Value]) -> Result<gtmpl::Value, gtmpl::FuncError> {
    lookup_func("config", args, |s| &s.configs)
}

fn object(entries: Vec<(&str, gtmpl::Value)>) -> gtmpl::Value {
    gtmpl::Value::Object(entries.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

fn string(s: &str) -> gtmpl::Value {
    gtmpl::Value::String(s.to_string())
}

/// The template data SwarmKit gives a payload: `.Service.{ID,Name,Labels}`, `.Node.{ID,Hostname,Platform}`,
/// `.Task.{ID,Name,Slot}` (the slot is the node ID for slotless tasks).
fn template_data(task: &Task, node: &NodeFacts) -> gtmpl::Value {
    let service = task.service_annotations.clone().unwrap_or_default();
    let labels: HashMap<String, gtmpl::Value> = service.labels.iter().map(|(k, v)| (k.clone(), string(v))).collect();
    let node_id = if task.node_id.is_empty() { node.id.as_str() } else { task.node_id.as_str() };
    let slot = if task.slot != 0 { task.slot.to_string() } else { node_id.to_string() };
    object(vec![
        (
            "Service",
            object(vec![
                ("ID", string(&task.service_id)),
                ("Name", string(&service.name)),
                ("Labels", gtmpl::Value::Map(labels)),
            ]),
        ),
        (
            "Node",
            object(vec![
                ("ID", string(node_id)),
                ("Hostname", string(&node.hostname)),
                ("Platform", object(vec![("Architecture", string(&node.architecture)), ("OS", string(&node.os))])),
            ]),
        ),
        (
            "Task",
            object(vec![
                ("ID", string(&task.id)),
                ("Name", string(&crate::docker::spec::task_name(task))),
                ("Slot", string(&slot)),
            ]),
        ),
    ])
}

/// Renders `payload` with the templating driver `driver` (only `golang`) for `task` on `node`. `sensitive`
/// (a secret's own template) withholds the template engine's message, which may quote the template text;
/// otherwise the message is shown with every secret value the task could read replaced.
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
    let mut scope = Scope::default();
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
    let mut tmpl = gtmpl::Template::default();
    tmpl.add_funcs(&[
        ("env", env_func as gtmpl::Func),
        ("secret", secret_func as gtmpl::Func),
        ("config", config_func as gtmpl::Func),
    ]);
    let result = tmpl.parse(text).map_err(|e| e.to_string()).and_then(|()| {
        SCOPE.with(|s| *s.borrow_mut() = Some(scope));
        let _guard = ScopeGuard;
        tmpl.render(&gtmpl::Context::from(template_data(task, node))).map_err(|e| e.to_string())
    });
    match result {
        Ok(out) => Ok(out.into_bytes()),
        Err(_) if sensitive => Err("its golang template did not render (the template error is withheld because it \
                                    may quote secret data; check the template with a config of the same text)"
            .into()),
        Err(mut msg) => {
            for v in &secret_values {
                let v = String::from_utf8_lossy(v);
                msg = msg.replace(v.as_ref(), "[secret redacted]");
            }
            Err(format!("its golang template did not render: {msg}"))
        }
    }
}

#[cfg(test)]
mod tests;
