//! `shoal service ...`: create, ls, ps, inspect, update, rollback, scale, rm, over the Engine API. Specs are built and
//! edited as the API's JSON documents (`shoal_engine_json`). Must not depend on cluster logic.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::time::SystemTime;

use clap::{Args, Subcommand};
use shoal_engine_json::spec::{
    ConfigReferenceJson, ContainerSpecJson, FileTargetJson, ModeJson, PlacementJson, ReplicatedJson,
    ResourceValuesJson, ResourcesJson, RestartPolicyJson, SecretReferenceJson, UpdateConfigJson,
};
use shoal_engine_json::{
    NodeJson, ServiceCreateResponse, ServiceJson, ServiceSpecJson, ServiceUpdateResponse, TaskJson,
};

use super::client::{enc, filters_query, CliError, Client};
use super::output::{self, ago, capitalize, short_id, Format};

/// Service commands.
#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum ServiceCommand {
    /// Create a service; prints its ID.
    Create(Box<CreateArgs>),
    /// List services.
    #[command(alias = "list")]
    Ls {
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// List the tasks of a service.
    Ps {
        /// Service ID or name.
        service: String,
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Show services as JSON.
    Inspect {
        /// Service IDs or names.
        #[arg(required = true)]
        services: Vec<String>,
        /// Output format (JSON either way).
        #[arg(long, value_enum, default_value = "json")]
        format: Format,
    },
    /// Change a service.
    Update(Box<UpdateArgs>),
    /// Roll a service back to its previous spec (the update supervisor rolls the tasks back).
    Rollback {
        /// Service ID or name.
        service: String,
    },
    /// Set replica counts: `shoal service scale web=5 db=2`.
    Scale {
        /// SERVICE=REPLICAS pairs.
        #[arg(required = true)]
        pairs: Vec<String>,
    },
    /// Remove services.
    #[command(alias = "remove")]
    Rm {
        /// Service IDs or names.
        #[arg(required = true)]
        services: Vec<String>,
    },
}

/// Flags of `service create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Service name.
    #[arg(long)]
    name: Option<String>,
    /// Number of tasks.
    #[arg(long)]
    replicas: Option<u64>,
    /// Environment variable (KEY=VALUE), repeatable.
    #[arg(long = "env", short = 'e')]
    env: Vec<String>,
    /// Working directory of the command.
    #[arg(long, short = 'w')]
    workdir: Option<String>,
    /// Placement constraint (e.g. node.labels.zone==east), repeatable.
    #[arg(long)]
    constraint: Vec<String>,
    /// Restart when: none, on-failure or any.
    #[arg(long, value_parser = ["none", "on-failure", "any"])]
    restart_condition: Option<String>,
    /// Delay between restarts (e.g. 5s, 1m30s).
    #[arg(long, value_parser = parse_duration_ns)]
    restart_delay: Option<i64>,
    /// Most restarts within the window (0: unlimited).
    #[arg(long)]
    restart_max_attempts: Option<u64>,
    /// Window over which restarts are counted.
    #[arg(long, value_parser = parse_duration_ns)]
    restart_window: Option<i64>,
    /// CPU limit, in CPUs (e.g. 0.5).
    #[arg(long, value_parser = parse_cpus)]
    limit_cpu: Option<i64>,
    /// Memory limit, in bytes (k, m, g suffixes accepted).
    #[arg(long, value_parser = parse_bytes)]
    limit_memory: Option<i64>,
    /// CPU reservation, in CPUs.
    #[arg(long, value_parser = parse_cpus)]
    reserve_cpu: Option<i64>,
    /// Memory reservation, in bytes (k, m, g suffixes accepted).
    #[arg(long, value_parser = parse_bytes)]
    reserve_memory: Option<i64>,
    /// Time to wait for a task to stop before killing it.
    #[arg(long, value_parser = parse_duration_ns)]
    stop_grace_period: Option<i64>,
    /// Tasks updated at once (0: all).
    #[arg(long)]
    update_parallelism: Option<u64>,
    /// Delay between update batches.
    #[arg(long, value_parser = parse_duration_ns)]
    update_delay: Option<i64>,
    /// Update order: stop-first or start-first.
    #[arg(long, value_parser = ["stop-first", "start-first"])]
    update_order: Option<String>,
    /// Service label (KEY=VALUE), repeatable.
    #[arg(long = "label", short = 'l')]
    label: Vec<String>,
    /// A secret the tasks get as a file: NAME, or source=NAME[,target=FILE][,uid=N][,gid=N][,mode=0400]
    /// (the target defaults to the name, under /run/secrets/), repeatable.
    #[arg(long, value_parser = parse_secret_ref)]
    secret: Vec<SecretReferenceJson>,
    /// A config the tasks get as a file: as --secret (a relative target is under /), repeatable.
    #[arg(long, value_parser = parse_config_ref)]
    config: Vec<ConfigReferenceJson>,
    /// Image to run.
    image: String,
    /// Command and arguments (become the container's Args, as with docker).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

/// Flags of `service update`.
#[derive(Debug, Args)]
pub struct UpdateArgs {
    /// New image.
    #[arg(long)]
    image: Option<String>,
    /// New arguments, as one shell-like string (e.g. "sleep 2718").
    #[arg(long, allow_hyphen_values = true)]
    args: Option<String>,
    /// New replica count.
    #[arg(long)]
    replicas: Option<u64>,
    /// Add or replace an environment variable (KEY=VALUE), repeatable.
    #[arg(long)]
    env_add: Vec<String>,
    /// Remove an environment variable (KEY), repeatable.
    #[arg(long)]
    env_rm: Vec<String>,
    /// Add a placement constraint, repeatable.
    #[arg(long)]
    constraint_add: Vec<String>,
    /// Remove a placement constraint, repeatable.
    #[arg(long)]
    constraint_rm: Vec<String>,
    /// Add a secret (as `create --secret`; one on the same target is replaced), repeatable.
    #[arg(long, value_parser = parse_secret_ref)]
    secret_add: Vec<SecretReferenceJson>,
    /// Remove a secret (its name), repeatable.
    #[arg(long)]
    secret_rm: Vec<String>,
    /// Add a config (as `create --config`; one on the same target is replaced), repeatable.
    #[arg(long, value_parser = parse_config_ref)]
    config_add: Vec<ConfigReferenceJson>,
    /// Remove a config (its name), repeatable.
    #[arg(long)]
    config_rm: Vec<String>,
    /// Redeploy the tasks even if nothing changed.
    #[arg(long)]
    force: bool,
    /// Tasks updated at once (0: all).
    #[arg(long)]
    update_parallelism: Option<u64>,
    /// Delay between update batches.
    #[arg(long, value_parser = parse_duration_ns)]
    update_delay: Option<i64>,
    /// Update order: stop-first or start-first.
    #[arg(long, value_parser = ["stop-first", "start-first"])]
    update_order: Option<String>,
    /// What to do when too many new tasks fail: pause, continue or rollback.
    #[arg(long, value_parser = ["pause", "continue", "rollback"])]
    update_failure_action: Option<String>,
    /// How long a new task is watched for failure after it starts.
    #[arg(long, value_parser = parse_duration_ns)]
    update_monitor: Option<i64>,
    /// Fraction of tasks that may fail before the failure action runs (0 to 1).
    #[arg(long)]
    update_max_failure_ratio: Option<f32>,
    /// Service ID or name.
    service: String,
}

/// Parses a `--secret` / `--config` value as the docker CLI does: `NAME`, or comma-separated `source=`
/// (`src=`), `target=`, `uid=`, `gid=`, `mode=` (0-prefixed: octal, else decimal, as Go's `ParseUint(v, 0,
/// 32)`). Returns (name, file target) with docker's defaults: target = the name, uid and gid "0", mode 0444.
fn parse_file_ref(flag: &str, v: &str) -> Result<(String, FileTargetJson), String> {
    let mut name = String::new();
    let mut file = FileTargetJson { uid: "0".into(), gid: "0".into(), mode: 0o444, ..Default::default() };
    if !v.contains('=') {
        name = v.to_string();
    } else {
        for part in v.split(',') {
            let (k, val) = part
                .split_once('=')
                .ok_or_else(|| format!("invalid field {part:?} in {flag} {v:?}: expected KEY=VALUE"))?;
            match k.trim().to_ascii_lowercase().as_str() {
                "source" | "src" => name = val.to_string(),
                "target" => file.name = val.to_string(),
                "uid" => file.uid = val.to_string(),
                "gid" => file.gid = val.to_string(),
                "mode" => {
                    let parsed = if let Some(hex) = val.strip_prefix("0x").or_else(|| val.strip_prefix("0X")) {
                        u32::from_str_radix(hex, 16)
                    } else if let Some(oct) =
                        val.strip_prefix("0o").or_else(|| val.strip_prefix('0')).filter(|o| !o.is_empty())
                    {
                        u32::from_str_radix(oct, 8)
                    } else {
                        val.parse()
                    };
                    file.mode = parsed.map_err(|_| format!("invalid mode {val:?} in {flag} {v:?}: e.g. 0400"))?;
                }
                other => {
                    return Err(format!("invalid field {other:?} in {flag} {v:?}: use source, target, uid, gid, mode"))
                }
            }
        }
    }
    if name.is_empty() {
        return Err(format!("invalid {flag} {v:?}: source is required"));
    }
    if file.name.is_empty() {
        file.name = name.clone();
    }
    Ok((name, file))
}

fn parse_secret_ref(v: &str) -> Result<SecretReferenceJson, String> {
    let (name, file) = parse_file_ref("--secret", v)?;
    Ok(SecretReferenceJson { file: Some(file), secret_name: name, ..Default::default() })
}

fn parse_config_ref(v: &str) -> Result<ConfigReferenceJson, String> {
    let (name, file) = parse_file_ref("--config", v)?;
    Ok(ConfigReferenceJson { file: Some(file), config_name: name, ..Default::default() })
}

/// Parses "5s", "1m30s" into nanoseconds.
pub(super) fn parse_duration_ns(s: &str) -> Result<i64, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("invalid duration {s:?}: {e} (e.g. 5s, 1m30s)"))?;
    i64::try_from(d.as_nanos()).map_err(|_| format!("duration {s:?} is too long"))
}

/// Parses a CPU count ("0.5") into nano-CPUs.
pub(super) fn parse_cpus(s: &str) -> Result<i64, String> {
    let f: f64 = s.parse().map_err(|_| format!("invalid CPU count {s:?}: expected a number like 0.5"))?;
    if !f.is_finite() || f < 0.0 {
        return Err(format!("invalid CPU count {s:?}: must be 0 or more"));
    }
    let nanos = (f * 1e9).round();
    // 2^63 as f64: at or past it the count does not fit nano-CPUs in an i64 (a cast would saturate).
    if nanos >= 9_223_372_036_854_775_808.0 {
        return Err(format!("invalid CPU count {s:?}: too large"));
    }
    #[expect(clippy::cast_possible_truncation, reason = "finite, not negative, and checked under 2^63 just above")]
    let nanos = nanos as i64;
    Ok(nanos)
}

/// Parses a byte count with an optional k/m/g suffix (powers of 1024).
pub(super) fn parse_bytes(s: &str) -> Result<i64, String> {
    let lower = s.trim().to_ascii_lowercase();
    let lower = lower.trim_end_matches('b');
    let (num, mult) = match lower.chars().last() {
        Some('k') => (&lower[..lower.len() - 1], 1i64 << 10),
        Some('m') => (&lower[..lower.len() - 1], 1 << 20),
        Some('g') => (&lower[..lower.len() - 1], 1 << 30),
        _ => (lower, 1),
    };
    let n: i64 = num.parse().map_err(|_| format!("invalid size {s:?}: expected bytes, e.g. 104857600 or 100m"))?;
    n.checked_mul(mult).filter(|v| *v >= 0).ok_or_else(|| format!("invalid size {s:?}"))
}

fn check_kv(what: &str, v: &str) -> Result<(), CliError> {
    match v.split_once('=') {
        Some((k, _)) if !k.is_empty() => Ok(()),
        _ => Err(CliError::Usage(format!("invalid {what} {v:?}: expected KEY=VALUE"))),
    }
}

/// Splits a shell-like string into words, honoring single and double quotes and backslashes.
pub(super) fn split_words(s: &str) -> Result<Vec<String>, CliError> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some('"'), '\\') | (None, '\\') => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
                in_word = true;
            }
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            (None, c) => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if quote.is_some() {
        return Err(CliError::Usage(format!("unterminated quote in {s:?}")));
    }
    if in_word {
        words.push(cur);
    }
    Ok(words)
}

fn build_spec(a: CreateArgs) -> Result<ServiceSpecJson, CliError> {
    for e in &a.env {
        check_kv("--env", e)?;
    }
    let mut labels = BTreeMap::new();
    for l in &a.label {
        check_kv("--label", l)?;
        let (k, v) = l.split_once('=').unwrap_or((l, ""));
        labels.insert(k.to_string(), v.to_string());
    }
    let resources = |cpu: Option<i64>, mem: Option<i64>| {
        (cpu.is_some() || mem.is_some()).then(|| ResourceValuesJson {
            nano_cpus: cpu.unwrap_or(0),
            memory_bytes: mem.unwrap_or(0),
            ..Default::default()
        })
    };
    let limits = resources(a.limit_cpu, a.limit_memory);
    let reservations = resources(a.reserve_cpu, a.reserve_memory);
    let restart = (a.restart_condition.is_some()
        || a.restart_delay.is_some()
        || a.restart_max_attempts.is_some()
        || a.restart_window.is_some())
    .then(|| RestartPolicyJson {
        condition: a.restart_condition.clone().unwrap_or_default(),
        delay: a.restart_delay,
        max_attempts: a.restart_max_attempts,
        window: a.restart_window,
    });
    let update = (a.update_parallelism.is_some() || a.update_delay.is_some() || a.update_order.is_some()).then(|| {
        UpdateConfigJson {
            parallelism: a.update_parallelism.unwrap_or(1),
            delay: a.update_delay,
            order: a.update_order.clone().unwrap_or_default(),
            ..Default::default()
        }
    });
    let mut spec = ServiceSpecJson {
        name: a.name.unwrap_or_default(),
        labels,
        mode: ModeJson {
            replicated: Some(ReplicatedJson { replicas: Some(a.replicas.unwrap_or(1) as i64) }),
            ..Default::default()
        },
        update_config: update,
        ..Default::default()
    };
    let t = &mut spec.task_template;
    t.container_spec = Some(ContainerSpecJson {
        image: a.image,
        args: a.args,
        env: a.env,
        dir: a.workdir.unwrap_or_default(),
        stop_grace_period: a.stop_grace_period,
        secrets: a.secret,
        configs: a.config,
        ..Default::default()
    });
    if limits.is_some() || reservations.is_some() {
        t.resources = Some(ResourcesJson { limits, reservations });
    }
    t.restart_policy = restart;
    if !a.constraint.is_empty() {
        t.placement = Some(PlacementJson { constraints: a.constraint, ..Default::default() });
    }
    Ok(spec)
}

fn get_service(c: &Client, reference: &str) -> Result<ServiceJson, CliError> {
    c.get(&format!("/services/{}", enc(reference)))
}

fn push_update(c: &Client, svc: &ServiceJson, spec: &ServiceSpecJson) -> Result<(), CliError> {
    let path = format!("/services/{}/update?version={}", enc(&svc.id), svc.version.index);
    c.post::<ServiceUpdateResponse>(&path, spec).map(|_| ())
}

/// The REPLICAS column as the docker CLI writes it; a job also shows its completions of the current
/// iteration out of its total (a global job's total: the tasks still to complete plus those completed).
fn replicas_text(s: &ServiceJson) -> String {
    let st = s.service_status.unwrap_or_default();
    let (running, desired, completed) = (st.running_tasks, st.desired_tasks, st.completed_tasks);
    match &s.spec.mode {
        ModeJson { replicated_job: Some(j), .. } => {
            format!("{running}/{desired} ({completed}/{} completed)", j.total_completions.unwrap_or(0))
        }
        ModeJson { global_job: Some(_), .. } => {
            format!("{running}/{desired} ({completed}/{} completed)", desired + completed)
        }
        _ => format!("{running}/{desired}"),
    }
}

fn mode_text(m: &ModeJson) -> &'static str {
    if m.replicated.is_some() {
        "replicated"
    } else if m.global.is_some() {
        "global"
    } else if m.replicated_job.is_some() {
        "replicated job"
    } else if m.global_job.is_some() {
        "global job"
    } else {
        ""
    }
}

fn image_of(spec: &shoal_engine_json::TaskSpecJson) -> String {
    let image = spec.container_spec.as_ref().map(|c| c.image.as_str()).unwrap_or("");
    // Hide a pinned digest, as docker does.
    image.split('@').next().unwrap_or(image).to_string()
}

/// Prints tasks as `service ps` / `task ls` do: history tasks of a slot indented under the newest.
pub(super) fn print_tasks(
    c: &Client,
    out: &mut dyn Write,
    mut tasks: Vec<TaskJson>,
    format: Format,
) -> Result<(), CliError> {
    if format == Format::Json {
        return output::json(out, &tasks);
    }
    let nodes: Vec<NodeJson> = c.get("/nodes")?;
    let hostnames: HashMap<String, String> =
        nodes.into_iter().map(|n| (n.id.clone(), n.description.hostname.clone())).collect();
    let mut service_names: HashMap<String, String> = HashMap::new();
    for t in &tasks {
        if !service_names.contains_key(&t.service_id) {
            let name = get_service(c, &t.service_id).map(|s| s.spec.name).unwrap_or_else(|_| short_id(&t.service_id));
            service_names.insert(t.service_id.clone(), name);
        }
    }
    let slot_key = |t: &TaskJson| {
        if t.slot != 0 {
            t.slot.to_string()
        } else {
            t.node_id.clone()
        }
    };
    // Newest first within a slot.
    tasks.sort_by(|a, b| {
        (&a.service_id, a.slot, &a.node_id)
            .cmp(&(&b.service_id, b.slot, &b.node_id))
            .then(b.created_at.cmp(&a.created_at))
    });
    let now = SystemTime::now();
    let mut rows = Vec::with_capacity(tasks.len());
    let mut prev: Option<(String, String)> = None;
    for t in &tasks {
        let key = (t.service_id.clone(), slot_key(t));
        let history = prev.as_ref() == Some(&key);
        prev = Some(key);
        let base = t.name.clone();
        let name = if base.is_empty() {
            format!("{}.{}", service_names.get(&t.service_id).cloned().unwrap_or_default(), slot_key(t))
        } else {
            base
        };
        let state = format!("{} {}", capitalize(&t.status.state), ago(&t.status.timestamp, now));
        rows.push(vec![
            short_id(&t.id),
            if history { format!(" \\_ {name}") } else { name },
            image_of(&t.spec),
            hostnames.get(&t.node_id).cloned().unwrap_or_default(),
            capitalize(&t.desired_state),
            state.trim().to_string(),
            t.status.err.clone(),
        ]);
    }
    output::table(out, &["ID", "NAME", "IMAGE", "NODE", "DESIRED STATE", "CURRENT STATE", "ERROR"], rows)
}

/// Runs a service command.
pub(super) fn run(c: &Client, cmd: ServiceCommand, out: &mut dyn Write, err: &mut dyn Write) -> Result<(), CliError> {
    match cmd {
        ServiceCommand::Create(a) => {
            let spec = build_spec(*a)?;
            let r: ServiceCreateResponse = c.post("/services/create", &spec)?;
            writeln!(out, "{}", r.id).map_err(output::io)
        }
        ServiceCommand::Ls { format } => list(c, out, format),
        ServiceCommand::Ps { service, format } => {
            let svc = get_service(c, &service)?;
            let tasks: Vec<TaskJson> = c.get(&format!("/tasks?filters={}", filters_query(&[("service", &svc.id)])))?;
            print_tasks(c, out, tasks, format)
        }
        ServiceCommand::Inspect { services, .. } => {
            let found = services.iter().map(|s| get_service(c, s)).collect::<Result<Vec<_>, _>>()?;
            output::json(out, &found)
        }
        ServiceCommand::Update(a) => {
            let svc = get_service(c, &a.service)?;
            let mut spec = svc.spec.clone();
            let service = a.service.clone();
            apply_update(&mut spec, *a)?;
            push_update(c, &svc, &spec)?;
            writeln!(out, "{service}").map_err(output::io)
        }
        ServiceCommand::Rollback { service } => {
            let svc = get_service(c, &service)?;
            let path = format!("/services/{}/update?version={}&rollback=previous", enc(&svc.id), svc.version.index);
            c.post::<ServiceUpdateResponse>(&path, &svc.spec)?;
            writeln!(out, "{service}").map_err(output::io)
        }
        ServiceCommand::Scale { pairs } => {
            let mut failed = false;
            for pair in pairs {
                match scale(c, &pair) {
                    Ok(line) => writeln!(out, "{line}").map_err(output::io)?,
                    Err(e) => {
                        failed = true;
                        writeln!(err, "shoal: {pair}: {e}").map_err(output::io)?;
                    }
                }
            }
            if failed {
                return Err(CliError::AlreadyReported);
            }
            Ok(())
        }
        ServiceCommand::Rm { services } => {
            let mut failed = false;
            for s in services {
                match c.delete(&format!("/services/{}", enc(&s))) {
                    Ok(()) => writeln!(out, "{s}").map_err(output::io)?,
                    Err(e) => {
                        failed = true;
                        writeln!(err, "shoal: {e}").map_err(output::io)?;
                    }
                }
            }
            if failed {
                return Err(CliError::AlreadyReported);
            }
            Ok(())
        }
    }
}

/// `service ls`.
fn list(c: &Client, out: &mut dyn Write, format: Format) -> Result<(), CliError> {
    let services: Vec<ServiceJson> = c.get("/services?status=true")?;
    if format == Format::Json {
        return output::json(out, &services);
    }
    let rows = services
        .iter()
        .map(|s| {
            vec![
                short_id(&s.id),
                s.spec.name.clone(),
                mode_text(&s.spec.mode).to_string(),
                replicas_text(s),
                image_of(&s.spec.task_template),
            ]
        })
        .collect();
    output::table(out, &["ID", "NAME", "MODE", "REPLICAS", "IMAGE"], rows)
}

/// Applies the flags of `service update` to `spec`.
fn apply_update(spec: &mut ServiceSpecJson, a: UpdateArgs) -> Result<(), CliError> {
    let cs = spec.task_template.container_spec.get_or_insert_with(Default::default);
    if let Some(i) = a.image {
        cs.image = i;
    }
    if let Some(args) = a.args {
        cs.args = split_words(&args)?;
    }
    for kv in &a.env_add {
        check_kv("--env-add", kv)?;
        let key = kv.split('=').next().unwrap_or_default();
        cs.env.retain(|e| e.split('=').next() != Some(key));
        cs.env.push(kv.clone());
    }
    for k in &a.env_rm {
        cs.env.retain(|e| e.split('=').next() != Some(k.as_str()) && e != k);
    }
    let target = |f: &Option<FileTargetJson>| f.as_ref().map(|f| f.name.clone());
    cs.secrets.retain(|r| !a.secret_rm.contains(&r.secret_name));
    for r in a.secret_add {
        cs.secrets.retain(|x| target(&x.file) != target(&r.file));
        cs.secrets.push(r);
    }
    cs.configs.retain(|r| !a.config_rm.contains(&r.config_name));
    for r in a.config_add {
        cs.configs.retain(|x| target(&x.file) != target(&r.file));
        cs.configs.push(r);
    }
    if !a.constraint_add.is_empty() || !a.constraint_rm.is_empty() {
        let p = spec.task_template.placement.get_or_insert_with(Default::default);
        p.constraints.retain(|x| !a.constraint_rm.contains(x));
        for x in a.constraint_add {
            if !p.constraints.contains(&x) {
                p.constraints.push(x);
            }
        }
    }
    if let Some(n) = a.replicas {
        match spec.mode.replicated.as_mut() {
            Some(r) => r.replicas = Some(n as i64),
            None => {
                return Err(CliError::Usage(format!(
                    "--replicas applies to replicated services only; {} is {}",
                    spec.name,
                    mode_text(&spec.mode)
                )))
            }
        }
    }
    if a.force {
        spec.task_template.force_update += 1;
    }
    let update_flags = a.update_parallelism.is_some()
        || a.update_delay.is_some()
        || a.update_order.is_some()
        || a.update_failure_action.is_some()
        || a.update_monitor.is_some()
        || a.update_max_failure_ratio.is_some();
    if update_flags {
        // Unset fields keep what the service has (SwarmKit's defaults when it has none).
        let u = spec.update_config.get_or_insert_with(|| UpdateConfigJson { parallelism: 1, ..Default::default() });
        if let Some(n) = a.update_parallelism {
            u.parallelism = n;
        }
        if let Some(d) = a.update_delay {
            u.delay = Some(d);
        }
        if let Some(o) = a.update_order {
            u.order = o;
        }
        if let Some(f) = a.update_failure_action {
            u.failure_action = f;
        }
        if let Some(m) = a.update_monitor {
            u.monitor = Some(m);
        }
        if let Some(r) = a.update_max_failure_ratio {
            u.max_failure_ratio = r;
        }
    }
    Ok(())
}

/// `service scale` of one `SERVICE=REPLICAS` pair; returns the line to print.
fn scale(c: &Client, pair: &str) -> Result<String, CliError> {
    let (name, n) = pair
        .split_once('=')
        .ok_or_else(|| CliError::Usage(format!("invalid scale specifier {pair:?}: expected SERVICE=REPLICAS")))?;
    let n: u64 = n
        .parse()
        .map_err(|_| CliError::Usage(format!("invalid replica count {n:?} in {pair:?}: expected a number")))?;
    let svc = get_service(c, name)?;
    let mut spec = svc.spec.clone();
    match spec.mode.replicated.as_mut() {
        Some(r) => r.replicas = Some(n as i64),
        None => return Err(CliError::Usage(format!("scale can only be used with replicated mode: {name}"))),
    }
    push_update(c, &svc, &spec)?;
    Ok(format!("{name} scaled to {n}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_and_config_flags_parse_as_the_docker_clis() {
        let r = parse_secret_ref("db_pw").unwrap();
        assert_eq!(r.secret_name, "db_pw");
        assert_eq!(
            r.file,
            Some(FileTargetJson { name: "db_pw".into(), uid: "0".into(), gid: "0".into(), mode: 0o444 })
        );
        let r = parse_secret_ref("src=db_pw,target=/etc/pw,uid=1000,gid=100,mode=0400").unwrap();
        assert_eq!(
            r.file,
            Some(FileTargetJson { name: "/etc/pw".into(), uid: "1000".into(), gid: "100".into(), mode: 0o400 })
        );
        // Without a leading 0 the mode is decimal, as Go's ParseUint(v, 0, 32) reads it.
        assert_eq!(parse_config_ref("source=c,mode=292").unwrap().file.unwrap().mode, 0o444);
        assert_eq!(parse_config_ref("source=app.conf").unwrap().file.unwrap().name, "app.conf");
        for bad in ["target=/x", "src=a,colour=red", "src=a,mode=rw", "src=a,oops"] {
            assert!(parse_secret_ref(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn value_parsers() {
        assert_eq!(parse_duration_ns("1m30s").unwrap(), 90_000_000_000);
        assert!(parse_duration_ns("soon").is_err());
        assert_eq!(parse_cpus("0.5").unwrap(), 500_000_000);
        assert!(parse_cpus("-1").is_err());
        assert_eq!(parse_cpus("9e9").unwrap(), 9_000_000_000_000_000_000);
        assert!(parse_cpus("1e10").unwrap_err().contains("too large"));
        assert_eq!(parse_bytes("100m").unwrap(), 100 << 20);
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert!(parse_bytes("lots").is_err());
        assert_eq!(split_words(r#"sh -c "echo hi there" 'a b'"#).unwrap(), ["sh", "-c", "echo hi there", "a b"]);
        assert!(split_words("'open").is_err());
    }
}
