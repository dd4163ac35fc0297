//! Go `text/template` rendering for SwarmKit's templates, bounded so that no template can take the process
//! down: service templates (`{{.Service.Name}}`, `{{.Node.Hostname}}`, `{{.Task.Slot}}` ... in a container
//! spec's env, hostname and mounts) and templated secrets and configs (the same data plus `env`, `secret`
//! and `config`). The engine is gtmpl; around it:
//!
//! - before parsing, `shape` reads the template's structure and refuses recursion (a body that calls
//!   itself, directly or not), computed template names, nesting or call chains deeper than
//!   `Limits::max_depth`, and more than `Limits::max_steps` steps (each `{{range}}` counted as running once
//!   per element of the largest collection the data holds), so the renderer's own recursion is bounded;
//! - the rendering runs on a thread of its own with a stack of `RENDER_STACK_BYTES` (far more than the
//!   depth limit needs), never on the caller's, and is given `Limits::time` to answer;
//! - the output is capped at `Limits::max_output_bytes`, and the bytes the functions produce (`printf`,
//!   `print`, `println`, `urlquery`, `join`, `env`, `secret`, `config`) at `Limits::max_function_bytes`
//!   (a string doubled by `printf "%s%s" $x $x` stops there); `printf` widths and precisions above
//!   `MAX_PRINTF_WIDTH`, or given with `*`, are refused.
//!
//! A refusal or failure is a `TemplateError`, whose message never quotes the template's text (a secret's
//! template may hold secret data) except the names of its definitions. Must not depend on the API types,
//! the agent or the manager: the callers build `Data` and `Payload`.

mod shape;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::time::Duration;

use gtmpl::{FuncError, Value};

/// Stack of the rendering thread: gtmpl recurses per nested action and per `{{template}}` call, and the
/// depth limit keeps that far below this even in a debug build.
pub const RENDER_STACK_BYTES: usize = 64 << 20;
/// Largest `printf` width or precision.
pub const MAX_PRINTF_WIDTH: u64 = 4096;

/// What one rendering may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Deepest nesting of actions (if, range, with, parentheses) plus `{{template}}` calls.
    pub max_depth: u32,
    /// Most steps (text runs and actions, `{{range}}` bodies counted per element, calls per call).
    pub max_steps: u64,
    /// Largest output.
    pub max_output_bytes: usize,
    /// Most bytes the template's functions may produce, all calls together.
    pub max_function_bytes: usize,
    /// Longest a rendering may take.
    pub time: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_depth: 48,
            max_steps: 1_000_000,
            max_output_bytes: 4 << 20,
            max_function_bytes: 16 << 20,
            time: Duration::from_secs(10),
        }
    }
}

/// Why a template was not rendered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateError {
    /// The template calls itself.
    Recursion(String),
    /// The template exceeds a limit (depth, steps, output, function bytes, time).
    Limit(String),
    /// The template is not well formed (found before the engine parses it).
    Syntax(String),
    /// The engine's parse or execution error (it may quote the template's text).
    Engine(String),
}

impl std::error::Error for TemplateError {}

impl std::fmt::Display for TemplateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TemplateError::Recursion(m)
            | TemplateError::Limit(m)
            | TemplateError::Syntax(m)
            | TemplateError::Engine(m) => f.write_str(m),
        }
    }
}

impl TemplateError {
    /// True when the message may quote the template's text (the engine's errors).
    pub fn may_quote_text(&self) -> bool {
        matches!(self, TemplateError::Engine(_))
    }
}

/// SwarmKit's template context: `.Service.{ID,Name,Labels}`, `.Node.{ID,Hostname,Platform.{Architecture,OS}}`,
/// `.Task.{ID,Name,Slot}`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Data {
    /// `.Service.ID`.
    pub service_id: String,
    /// `.Service.Name`.
    pub service_name: String,
    /// `.Service.Labels`.
    pub service_labels: BTreeMap<String, String>,
    /// `.Node.ID`.
    pub node_id: String,
    /// `.Node.Hostname`.
    pub node_hostname: String,
    /// `.Node.Platform.OS`.
    pub node_os: String,
    /// `.Node.Platform.Architecture`.
    pub node_architecture: String,
    /// `.Task.ID`.
    pub task_id: String,
    /// `.Task.Name`.
    pub task_name: String,
    /// `.Task.Slot` (the node ID for slotless tasks).
    pub task_slot: String,
}

/// What a secret's or config's template may also read (SwarmKit's payload functions): `{{env "X"}}` the
/// task's env, `{{secret "t"}}` / `{{config "t"}}` the data of the secret or config the task mounts at
/// target `t`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Payload {
    /// The task's env, by name.
    pub env: BTreeMap<String, String>,
    /// The task's secrets' data, by target.
    pub secrets: BTreeMap<String, Vec<u8>>,
    /// The task's configs' data, by target.
    pub configs: BTreeMap<String, Vec<u8>>,
}

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secrets: Vec<&String> = self.secrets.keys().collect();
        let configs: Vec<&String> = self.configs.keys().collect();
        write!(f, "Payload {{ env: {} entries, secrets: {secrets:?}, configs: {configs:?} }}", self.env.len())
    }
}

/// A template that failed: which of the texts given (its index) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The index of the text in the list rendered.
    pub index: usize,
    /// Why.
    pub error: TemplateError,
}

/// Checks `text` as a create request can: its shape (recursion, computed names, depth, steps with every
/// `{{range}}` running over the smallest collection the data always has). Refuses what every rendering
/// would refuse; leaves syntax the engine reads to the rendering, as Docker does.
pub fn check(text: &str) -> Result<(), TemplateError> {
    if !text.contains("{{") {
        return Ok(());
    }
    let limits = Limits::default();
    shape::Shape::of(text, &limits)?.check(&limits, MIN_COLLECTION_LEN)
}

/// The fields of the context's smallest objects (`.Service`, `.Node`, `.Task`): what a `{{range}}` runs over
/// at least.
const MIN_COLLECTION_LEN: u64 = 3;

/// Renders each of `texts` with `data` (and the payload functions when `payload` is given), within
/// `limits`, on a thread of its own. A text without `{{` is its own rendering. The first failure ends it.
pub fn render_all(
    texts: Vec<String>,
    data: &Data,
    payload: Option<&Payload>,
    limits: Limits,
) -> Result<Vec<String>, Failure> {
    if texts.iter().all(|t| !t.contains("{{")) {
        return Ok(texts);
    }
    let data = data.clone();
    let payload = payload.cloned();
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let spawned =
        std::thread::Builder::new().name("template-render".into()).stack_size(RENDER_STACK_BYTES).spawn(move || {
            let _ = tx.send(render_here(texts, &data, payload, &limits));
        });
    let failure = |error| Failure { index: 0, error };
    if let Err(e) = spawned {
        return Err(failure(TemplateError::Limit(format!("cannot start the template renderer's thread: {e}"))));
    }
    match rx.recv_timeout(limits.time) {
        Ok(r) => r,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            Err(failure(TemplateError::Limit(format!("the template took longer than {:?} to render", limits.time))))
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            Err(failure(TemplateError::Engine("the template renderer stopped without an answer".into())))
        }
    }
}

/// Renders one text (see `render_all`).
pub fn render(text: &str, data: &Data, payload: Option<&Payload>, limits: Limits) -> Result<String, TemplateError> {
    render_all(vec![text.to_string()], data, payload, limits)
        .map(|mut v| v.pop().unwrap_or_default())
        .map_err(|f| f.error)
}

thread_local! {
    /// The payload of the rendering on this (the renderer's) thread: gtmpl's functions are plain `fn`s.
    static PAYLOAD: RefCell<Option<Payload>> = const { RefCell::new(None) };
    /// Bytes the functions may still produce in this rendering.
    static FUNCTION_BYTES_LEFT: Cell<usize> = const { Cell::new(0) };
}

fn render_here(
    texts: Vec<String>,
    data: &Data,
    payload: Option<Payload>,
    limits: &Limits,
) -> Result<Vec<String>, Failure> {
    let range_len = (data.service_labels.len() as u64).max(MIN_COLLECTION_LEN);
    let has_payload = payload.is_some();
    PAYLOAD.with(|p| *p.borrow_mut() = payload);
    FUNCTION_BYTES_LEFT.with(|b| b.set(limits.max_function_bytes));
    let context = context_value(data);
    let mut out = Vec::with_capacity(texts.len());
    for (index, text) in texts.into_iter().enumerate() {
        if !text.contains("{{") {
            out.push(text);
            continue;
        }
        let one = || -> Result<String, TemplateError> {
            shape::Shape::of(&text, limits)?.check(limits, range_len)?;
            let mut tmpl = gtmpl::Template::default();
            let mut funcs: Vec<(&str, gtmpl::Func)> = vec![
                ("printf", printf_bounded),
                ("print", print_bounded),
                ("println", println_bounded),
                ("urlquery", urlquery_bounded),
                ("join", join_func),
            ];
            if has_payload {
                funcs.extend([("env", env_func as gtmpl::Func), ("secret", secret_func), ("config", config_func)]);
            }
            tmpl.add_funcs(&funcs);
            tmpl.parse(text.as_str()).map_err(|e| TemplateError::Engine(e.to_string()))?;
            let mut w = CappedWriter { buf: Vec::new(), max: limits.max_output_bytes, over: false };
            let r = tmpl.execute(&mut w, &gtmpl::Context::from(context.clone()));
            if w.over {
                return Err(TemplateError::Limit(format!(
                    "the template's output is larger than {} bytes",
                    limits.max_output_bytes
                )));
            }
            r.map_err(|e| {
                let msg = e.to_string();
                match msg.strip_prefix(BUDGET_MARK) {
                    Some(m) => TemplateError::Limit(m.to_string()),
                    None => TemplateError::Engine(msg),
                }
            })?;
            String::from_utf8(w.buf).map_err(|_| TemplateError::Engine("the template's output is not UTF-8".into()))
        };
        out.push(one().map_err(|error| Failure { index, error })?);
    }
    Ok(out)
}

/// Refuses writes past `max` bytes.
struct CappedWriter {
    buf: Vec<u8>,
    max: usize,
    over: bool,
}

impl std::io::Write for CappedWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + data.len() > self.max {
            self.over = true;
            return Err(std::io::Error::other("output limit"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn object(entries: Vec<(&str, Value)>) -> Value {
    Value::Object(entries.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

fn string(s: &str) -> Value {
    Value::String(s.to_string())
}

fn context_value(d: &Data) -> Value {
    let labels = d.service_labels.iter().map(|(k, v)| (k.clone(), string(v))).collect();
    object(vec![
        (
            "Service",
            object(vec![
                ("ID", string(&d.service_id)),
                ("Name", string(&d.service_name)),
                ("Labels", Value::Map(labels)),
            ]),
        ),
        (
            "Node",
            object(vec![
                ("ID", string(&d.node_id)),
                ("Hostname", string(&d.node_hostname)),
                ("Platform", object(vec![("Architecture", string(&d.node_architecture)), ("OS", string(&d.node_os))])),
            ]),
        ),
        (
            "Task",
            object(vec![("ID", string(&d.task_id)), ("Name", string(&d.task_name)), ("Slot", string(&d.task_slot))]),
        ),
    ])
}

/// Marks a function's error as a limit (the rendering's error is then a `TemplateError::Limit`).
const BUDGET_MARK: &str = "\u{1}limit:";

fn limit_error(msg: String) -> FuncError {
    FuncError::Generic(format!("{BUDGET_MARK}{msg}"))
}

/// Charges `value`'s length to the rendering's function budget.
fn charge(func: &str, value: Value) -> Result<Value, FuncError> {
    let len = match &value {
        Value::String(s) => s.len(),
        _ => 0,
    };
    let left = FUNCTION_BYTES_LEFT.with(|b| b.get());
    if len > left {
        return Err(limit_error(format!(
            "the template's functions ({func} among them) produce more bytes than the limit allows"
        )));
    }
    FUNCTION_BYTES_LEFT.with(|b| b.set(left - len));
    Ok(value)
}

fn builtin(name: &str) -> gtmpl::Func {
    gtmpl::funcs::BUILTINS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f).expect("gtmpl builtin")
}

/// Refuses `printf` formats whose width or precision is above `MAX_PRINTF_WIDTH` or given by an argument.
fn check_format(format: &str) -> Result<(), FuncError> {
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            continue;
        }
        if chars.peek() == Some(&'%') {
            chars.next();
            continue;
        }
        let mut number: u64 = 0;
        while let Some(&c) = chars.peek() {
            match c {
                '0'..='9' => {
                    number = number.saturating_mul(10).saturating_add(u64::from(c as u8 - b'0'));
                    if number > MAX_PRINTF_WIDTH {
                        return Err(limit_error(format!(
                            "printf: widths and precisions above {MAX_PRINTF_WIDTH} are not supported"
                        )));
                    }
                }
                '*' => {
                    return Err(limit_error(
                        "printf: a width or precision given by an argument (*) is not supported".into(),
                    ))
                }
                '+' | '-' | '#' | ' ' | '.' | '[' | ']' => number = 0,
                _ => break,
            }
            chars.next();
        }
    }
    Ok(())
}

fn printf_bounded(args: &[Value]) -> Result<Value, FuncError> {
    if let Some(Value::String(f)) = args.first() {
        check_format(f)?;
    }
    charge("printf", builtin("printf")(args)?)
}

fn print_bounded(args: &[Value]) -> Result<Value, FuncError> {
    charge("print", builtin("print")(args)?)
}

fn println_bounded(args: &[Value]) -> Result<Value, FuncError> {
    charge("println", builtin("println")(args)?)
}

fn urlquery_bounded(args: &[Value]) -> Result<Value, FuncError> {
    charge("urlquery", builtin("urlquery")(args)?)
}

/// SwarmKit's `join`: `{{join "," "a" "b"}}` is "a,b" (the first argument is the separator).
fn join_func(args: &[Value]) -> Result<Value, FuncError> {
    let strings: Vec<String> = args
        .iter()
        .map(|a| match a {
            Value::String(s) => Ok(s.clone()),
            other => Err(FuncError::Generic(format!("join takes strings, not {other}"))),
        })
        .collect::<Result<_, _>>()?;
    let Some((sep, rest)) = strings.split_first() else {
        return Err(FuncError::Generic("join takes a separator, then the strings to join".into()));
    };
    charge("join", Value::String(rest.join(sep)))
}

fn one_string_arg(name: &str, args: &[Value]) -> Result<String, FuncError> {
    match args {
        [Value::String(s)] => Ok(s.clone()),
        _ => Err(FuncError::Generic(format!("{name} takes one string argument"))),
    }
}

fn env_func(args: &[Value]) -> Result<Value, FuncError> {
    let name = one_string_arg("env", args)?;
    let v = PAYLOAD.with(|p| p.borrow().as_ref().and_then(|p| p.env.get(&name).cloned()));
    charge("env", Value::String(v.unwrap_or_default()))
}

fn lookup(func: &str, args: &[Value], pick: fn(&Payload) -> &BTreeMap<String, Vec<u8>>) -> Result<Value, FuncError> {
    let target = one_string_arg(func, args)?;
    let v = PAYLOAD.with(|p| p.borrow().as_ref().and_then(|p| pick(p).get(&target).cloned()));
    match v {
        Some(data) => charge(func, Value::String(String::from_utf8_lossy(&data).into_owned())),
        None => Err(FuncError::Generic(format!("{func} target {target} not found among the task's references"))),
    }
}

fn secret_func(args: &[Value]) -> Result<Value, FuncError> {
    lookup("secret", args, |p| &p.secrets)
}

fn config_func(args: &[Value]) -> Result<Value, FuncError> {
    lookup("config", args, |p| &p.configs)
}

#[cfg(test)]
mod tests;
