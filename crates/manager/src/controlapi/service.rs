//! Services: validation of a spec, create, update (compare-and-swap on the version the caller read),
//! remove, lookup, list with filters, and the running/desired task counts `service ls` shows.
//! Must not depend on HTTP or JSON.

use std::sync::Arc;

use shoal_api::{service_spec, task_spec, Service, ServiceSpec, TaskState, Version};
use shoal_store::{Changes, ServiceTotals, StoreObject, Tables};

use super::references::{resolve_references, validate_references};
use super::{any_prefix, find_service, labels_match, ControlError};
use crate::limits::{
    check_cluster_totals, check_count, check_duration, check_spec_size, invalid, MAX_HEALTH_DURATION,
    MAX_HEALTH_RETRIES, MAX_PIDS_LIMIT, MAX_POLICY_DURATION, MAX_REPLICAS, MAX_RESTART_ATTEMPTS, MAX_STOP_GRACE_PERIOD,
    MIN_HEALTH_DURATION,
};
use crate::scheduler::constraint;
use crate::state::ClusterState;
use crate::write::{MAX_ACTIONS_PER_WRITE, MAX_BYTES_PER_WRITE};
use shoal_api::prost::Message;
use shoal_store::ACTION_OVERHEAD_BYTES;

/// Longest service name accepted (a DNS label).
pub(super) const MAX_NAME_LEN: usize = 63;

/// How many times `remove_service` re-reads and retries when a task changed under it; after that it removes
/// the service alone (the orchestrator marks its tasks), which only the service itself changing can stop.
const REMOVE_RETRIES: usize = 3;

/// How many times the service-only removal is retried when the service itself changed under it.
const REMOVE_SERVICE_ONLY_RETRIES: usize = 3;

fn validate_name(name: &str) -> Result<(), ControlError> {
    if name.is_empty() {
        return Err(invalid("service name is required: pass a name (e.g. --name web)"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(invalid(format!("service name {name:?} is longer than {MAX_NAME_LEN} characters; shorten it")));
    }
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if !first_ok || !rest_ok {
        return Err(invalid(format!(
            "invalid service name {name:?}: use letters, digits, '_', '.' and '-', starting with a letter or digit"
        )));
    }
    Ok(())
}

/// The service templates of a container spec (`Env` values, `Hostname`, mount `Source`/`Target`, volume
/// labels and driver options, expanded by the agent): one that calls itself, nests too deep or would take
/// too many steps (`shoal_template::check`) is refused, naming the field; syntax is left to the agent, whose
/// rejection carries the engine's message (as Docker does).
fn validate_service_templates(c: &shoal_api::ContainerSpec) -> Result<(), ControlError> {
    let mut fields: Vec<(String, &str)> = Vec::new();
    for (i, kv) in c.env.iter().enumerate() {
        fields.push((format!("ContainerSpec.Env[{i}]"), kv.split_once('=').map_or("", |(_, v)| v)));
    }
    fields.push(("ContainerSpec.Hostname".into(), &c.hostname));
    for (i, m) in c.mounts.iter().enumerate() {
        fields.push((format!("ContainerSpec.Mounts[{i}].Source"), &m.source));
        fields.push((format!("ContainerSpec.Mounts[{i}].Target"), &m.target));
        if let Some(v) = &m.volume_options {
            for (k, val) in &v.labels {
                fields.push((format!("ContainerSpec.Mounts[{i}].VolumeOptions.Labels[{k}]"), val));
            }
            for (k, val) in v.driver_config.iter().flat_map(|d| d.options.iter()) {
                fields.push((format!("ContainerSpec.Mounts[{i}].VolumeOptions.DriverConfig.Options[{k}]"), val));
            }
        }
    }
    for (field, text) in fields {
        if let Err(e @ (shoal_template::TemplateError::Recursion(_) | shoal_template::TemplateError::Limit(_))) =
            shoal_template::check(text)
        {
            return Err(invalid(format!("{field}: the template cannot be expanded: {e}; simplify it")));
        }
    }
    Ok(())
}

/// Checks a container's mounts as SwarmKit and Docker's executor do, before anything is written (a bad mount
/// would otherwise be stored and every task rejected): each target absolute and given once; a bind's source
/// absolute, a volume's not; a tmpfs without a source; no Windows named pipes (every node here is Linux). A
/// path holding a service template (`{{...}}`) is judged by the agent once expanded.
fn validate_mounts(mounts: &[shoal_api::Mount]) -> Result<(), ControlError> {
    use shoal_api::mount::Type;
    let templated = |p: &str| p.contains("{{");
    let mut targets = std::collections::HashSet::new();
    for (i, m) in mounts.iter().enumerate() {
        let field = format!("ContainerSpec.Mounts[{i}]");
        if !targets.insert(m.target.as_str()) {
            return Err(invalid(format!("invalid Mounts: {:?} is duplicated ({field}.Target)", m.target)));
        }
        if !m.target.starts_with('/') && !templated(&m.target) {
            return Err(invalid(format!(
                "invalid mount target, must be an absolute path: {:?} ({field}.Target)",
                m.target
            )));
        }
        match Type::try_from(m.r#type).unwrap_or(Type::Bind) {
            Type::Bind if !m.source.starts_with('/') && !templated(&m.source) => {
                return Err(invalid(format!(
                    "invalid bind mount source, must be an absolute path: {:?} ({field}.Source)",
                    m.source
                )))
            }
            Type::Volume if m.source.starts_with('/') => {
                return Err(invalid(format!(
                    "invalid volume mount source, must not be an absolute path: {:?} ({field}.Source); use \
                     type=bind for a path on the node",
                    m.source
                )))
            }
            Type::Tmpfs if !m.source.is_empty() => {
                return Err(invalid(format!(
                    "invalid tmpfs source, source must be empty ({field}.Source is {:?}); leave it out",
                    m.source
                )))
            }
            Type::Npipe => {
                return Err(invalid(format!(
                    "invalid mount type: npipe ({field}): named pipes exist only on Windows nodes, and every \
                     node of this swarm is Linux; use type=bind for a socket"
                )))
            }
            _ => {}
        }
    }
    Ok(())
}

/// Checks a service spec: a valid name, a container spec with an image, a mode, valid constraints, and
/// every count, duration and the encoded size within `limits` (each error names the field and the limit).
pub fn validate_service_spec(spec: &ServiceSpec) -> Result<(), ControlError> {
    let name = spec.annotations.as_ref().map(|a| a.name.as_str()).unwrap_or("");
    validate_name(name)?;
    let task = spec.task.as_ref().ok_or_else(|| invalid("the service has no task template: give it an image"))?;
    match &task.runtime {
        Some(task_spec::Runtime::Container(c)) => {
            if c.image.trim().is_empty() {
                return Err(invalid("ContainerSpec.Image is required: give the service an image"));
            }
            check_duration("ContainerSpec.StopGracePeriod", c.stop_grace_period.as_ref(), None, MAX_STOP_GRACE_PERIOD)?;
            if let Some(h) = &c.healthcheck {
                for (field, d) in [
                    ("Interval", &h.interval),
                    ("Timeout", &h.timeout),
                    ("StartPeriod", &h.start_period),
                    ("StartInterval", &h.start_interval),
                ] {
                    check_duration(
                        &format!("ContainerSpec.Healthcheck.{field}"),
                        d.as_ref(),
                        Some(MIN_HEALTH_DURATION),
                        MAX_HEALTH_DURATION,
                    )?;
                }
                if h.retries < 0 {
                    return Err(invalid(format!(
                        "ContainerSpec.Healthcheck.Retries must not be negative (got {})",
                        h.retries
                    )));
                }
                check_count("ContainerSpec.Healthcheck.Retries", h.retries as u64, MAX_HEALTH_RETRIES as u64)?;
            }
            validate_references(c)?;
            validate_mounts(&c.mounts)?;
            validate_service_templates(c)?;
        }
        Some(task_spec::Runtime::Attachment(_)) => {
            return Err(invalid(
                "a service's task template cannot be a network attachment (those are made by AttachNetwork): \
                 give the service a container spec with an image",
            ))
        }
        None => return Err(invalid("the task template has no container spec: give the service an image")),
    }
    match &spec.mode {
        Some(service_spec::Mode::Replicated(r)) => check_count("Mode.Replicated.Replicas", r.replicas, MAX_REPLICAS)?,
        Some(service_spec::Mode::Global(_)) => {}
        Some(service_spec::Mode::ReplicatedJob(j)) => {
            check_count("Mode.ReplicatedJob.TotalCompletions", j.total_completions, MAX_REPLICAS)?;
            check_count("Mode.ReplicatedJob.MaxConcurrent", j.max_concurrent, MAX_REPLICAS)?;
            if j.max_concurrent == 0 && j.total_completions > 0 {
                // SwarmKit would store it and never run a task.
                return Err(invalid(format!(
                    "Mode.ReplicatedJob.MaxConcurrent is 0: no task could run towards the {} completions asked for; \
                     leave it out (1) or set at least 1",
                    j.total_completions
                )));
            }
        }
        Some(service_spec::Mode::GlobalJob(_)) => {}
        None => return Err(invalid("the service mode is required: replicated (with a replica count) or global")),
    }
    if is_job_spec(spec) {
        // As SwarmKit (jobs have no update config) and the docker CLI (nor a rollback config).
        for (what, set) in [("UpdateConfig", spec.update.is_some()), ("RollbackConfig", spec.rollback.is_some())] {
            if set {
                return Err(invalid(format!(
                    "{what}: jobs (replicated-job, global-job) are not rolled out: a spec update runs the job again; \
                     leave it out"
                )));
            }
        }
    }
    if let Some(p) = &task.placement {
        constraint::parse(&p.constraints).map_err(|e| invalid(e.to_string()))?;
        check_preferences(&p.preferences)?;
    }
    if let Some(r) = &task.restart {
        check_duration("RestartPolicy.Delay", r.delay.as_ref(), None, MAX_POLICY_DURATION)?;
        check_duration("RestartPolicy.Window", r.window.as_ref(), None, MAX_POLICY_DURATION)?;
        check_count("RestartPolicy.MaxAttempts", r.max_attempts, MAX_RESTART_ATTEMPTS)?;
    }
    if let Some(res) = &task.resources {
        for (what, r) in [("Limits", &res.limits), ("Reservations", &res.reservations)] {
            if let Some(r) = r {
                if r.nano_cpus < 0 || r.memory_bytes < 0 {
                    return Err(invalid(format!("Resources.{what}: CPU and memory must not be negative")));
                }
            }
        }
        if res.limits.as_ref().is_some_and(|l| !l.generic.is_empty()) {
            return Err(invalid(
                "Resources.Limits.GenericResources: generic resources are reserved, not limited; set them under \
                 Reservations",
            ));
        }
        if let Some(r) = &res.reservations {
            check_generic_reservations(&r.generic)?;
        }
    }
    if let Some(task_spec::Runtime::Container(c)) = &task.runtime {
        if !(0..=MAX_PIDS_LIMIT).contains(&c.pids_limit) {
            return Err(invalid(format!(
                "Resources.Limits.Pids: {} is out of range; use 1 to {MAX_PIDS_LIMIT}, or 0 for no limit",
                c.pids_limit
            )));
        }
    }
    for (what, u) in [("UpdateConfig", &spec.update), ("RollbackConfig", &spec.rollback)] {
        if let Some(u) = u {
            check_duration(&format!("{what}.Delay"), u.delay.as_ref(), None, MAX_POLICY_DURATION)?;
            check_duration(&format!("{what}.Monitor"), u.monitor.as_ref(), None, MAX_POLICY_DURATION)?;
            check_count(&format!("{what}.Parallelism"), u.parallelism, MAX_REPLICAS)?;
            if !(0.0..=1.0).contains(&u.max_failure_ratio) {
                return Err(invalid(format!("{what}.MaxFailureRatio must be between 0 and 1")));
            }
        }
    }
    check_spec_size(spec)
}

/// A job runs again on every spec write (an update, `--force`, a rollback): a new iteration, whose tasks
/// replace the earlier ones (those become history). Nothing for a service.
fn next_job_iteration(next: &mut Service, now: shoal_api::prost_types::Timestamp) {
    if !next.spec.as_ref().is_some_and(is_job_spec) {
        return;
    }
    let j = next.job_status.get_or_insert_with(Default::default);
    let index = j.job_iteration.map_or(0, |v| v.index).saturating_add(1);
    j.job_iteration = Some(Version { index });
    j.last_execution = Some(now);
}

/// True for a replicated-job or global-job spec.
pub fn is_job_spec(spec: &ServiceSpec) -> bool {
    matches!(spec.mode, Some(service_spec::Mode::ReplicatedJob(_)) | Some(service_spec::Mode::GlobalJob(_)))
}

fn container_mut(spec: Option<&mut ServiceSpec>) -> Option<&mut shoal_api::ContainerSpec> {
    match spec?.task.as_mut()?.runtime.as_mut()? {
        task_spec::Runtime::Container(c) => Some(c),
        task_spec::Runtime::Attachment(_) => None,
    }
}

/// Validates `spec` and creates a service with a new ID. Fails with `Conflict` when the name is taken, and
/// with a 400 naming any secret or config it references that does not exist.
pub async fn create_service(state: &ClusterState, spec: ServiceSpec) -> Result<Service, ControlError> {
    validate_service_spec(&spec)?;
    let now = state.now();
    // A job starts at iteration 0 (as SwarmKit); each update runs it again (see `update_service`).
    let job_status = is_job_spec(&spec)
        .then_some(shoal_api::JobStatus { job_iteration: Some(Version { index: 0 }), last_execution: Some(now) });
    let service = Service {
        id: state.ids.new_id(),
        meta: Some(shoal_api::Meta { version: None, created_at: Some(now), updated_at: Some(now) }),
        spec: Some(spec),
        spec_version: Some(Version { index: 0 }),
        job_status,
        ..Default::default()
    };
    let id = service.id.clone();
    let mut service = service;
    state
        .write(|t: &Tables, c: &mut Changes| {
            let name = service.unique_name().unwrap_or_default();
            if let Some(owner) = t.services().by_name(name) {
                return Err(name_taken(name, &owner.id));
            }
            if let Some(c) = container_mut(service.spec.as_mut()) {
                resolve_references(t, c)?;
            }
            if let Some(spec) = service.spec.as_mut() {
                super::network::resolve_service_networks(t, spec)?;
                super::network::check_endpoint(t, &service.id, spec)?;
            }
            let nodes = t.nodes().len() as u64;
            check_cluster_totals(t.service_totals(), ServiceTotals::default(), ServiceTotals::of(&service), nodes)?;
            c.create(service);
            Ok(())
        })
        .await?;
    state.store.view(|t| t.services().get(&id).map(|s| (**s).clone())).ok_or_else(|| {
        ControlError::Unavailable(format!("service {id} was created but removed right after; list services"))
    })
}

fn name_taken(name: &str, owner: &str) -> ControlError {
    ControlError::AlreadyExists(format!(
        "service name {name} is already in use by service {owner}; choose another name or remove that service"
    ))
}

/// Replaces the spec of service `reference` (ID, name or prefix). `version` must be the service's current
/// version (the one the caller read), else `Conflict` ("update out of sequence").
pub async fn update_service(
    state: &ClusterState,
    reference: &str,
    version: u64,
    spec: ServiceSpec,
) -> Result<Service, ControlError> {
    validate_service_spec(&spec)?;
    let now = state.now();
    let mut spec = spec;
    let (id, _) = state
        .write(|t: &Tables, c: &mut Changes| {
            let current = find_service(t, reference)?;
            if current.version() != version {
                return Err(ControlError::out_of_sequence(
                    &format!("service {}", current.id),
                    "update",
                    current.version(),
                    version,
                ));
            }
            let old_mode = current.spec.as_ref().map(mode_name).unwrap_or_default();
            if !old_mode.is_empty() && old_mode != mode_name(&spec) {
                // As SwarmKit: each mode has its own orchestrator and its own task layout (slots or nodes).
                return Err(invalid(format!(
                    "Mode: service mode change is not allowed ({old_mode} -> {}); remove the service and create it \
                     again",
                    mode_name(&spec)
                )));
            }
            let new_name = spec.annotations.as_ref().map(|a| a.name.as_str()).unwrap_or_default();
            if let Some(owner) = t.services().by_name(new_name) {
                if owner.id != current.id {
                    return Err(name_taken(new_name, &owner.id));
                }
            }
            if let Some(c) = container_mut(Some(&mut spec)) {
                resolve_references(t, c)?;
            }
            super::network::resolve_service_networks(t, &mut spec)?;
            super::network::check_endpoint(t, &current.id, &spec)?;
            let mut next = (**current).clone();
            next.previous_spec = next.spec.take();
            next.previous_spec_version = next.spec_version.take();
            next.spec = Some(spec);
            next.spec_version = Some(Version { index: current.version() });
            // As SwarmKit: a new spec starts a new update (a paused one resumes with it).
            next.update_status = None;
            write_spec(t, c, current, next, now)
        })
        .await?;
    read_service(state, &id, reference)
}

/// Rolls service `reference` back to its previous spec (`docker service rollback`, the Engine API's
/// `?rollback=previous`): the previous spec and spec version become current and the current ones previous,
/// and the update status says ROLLBACK_STARTED, "manually requested rollback"; the orchestrator rolls the
/// tasks back with the service's rollback config. `version` as for `update_service`. Fails with
/// `InvalidArgument` when the service has no previous spec, or when the previous spec would take the
/// cluster's tasks over their bounds (`limits::check_cluster_totals`).
pub async fn rollback_service(state: &ClusterState, reference: &str, version: u64) -> Result<Service, ControlError> {
    let now = state.now();
    let (id, _) = state
        .write(|t: &Tables, c: &mut Changes| {
            let current = find_service(t, reference)?;
            if current.version() != version {
                return Err(ControlError::out_of_sequence(
                    &format!("service {}", current.id),
                    "rollback",
                    current.version(),
                    version,
                ));
            }
            let mut next = (**current).clone();
            let Some(previous) = next.previous_spec.take() else {
                return Err(ControlError::InvalidArgument(format!(
                    "service {} does not have a previous spec to roll back to",
                    current.id
                )));
            };
            let previous_version = next.previous_spec_version.take();
            next.previous_spec = next.spec.replace(previous);
            next.previous_spec_version = std::mem::replace(&mut next.spec_version, previous_version);
            next.update_status = Some(shoal_api::UpdateStatus {
                state: shoal_api::update_status::UpdateState::RollbackStarted as i32,
                started_at: Some(now),
                completed_at: None,
                message: crate::orchestrator::update::MANUAL_ROLLBACK_MESSAGE.to_string(),
            });
            write_spec(t, c, current, next, now)
        })
        .await?;
    read_service(state, &id, reference)
}

/// The end of every spec write (update, rollback): stamps `next`, starts a job's next iteration, checks the
/// cluster's task totals with `next` in place of `current`, and writes it. Returns the service ID.
fn write_spec(
    t: &Tables,
    c: &mut Changes,
    current: &Service,
    mut next: Service,
    now: shoal_api::prost_types::Timestamp,
) -> Result<String, ControlError> {
    next.meta_mut().updated_at = Some(now);
    next_job_iteration(&mut next, now);
    let nodes = t.nodes().len() as u64;
    check_cluster_totals(t.service_totals(), ServiceTotals::of(current), ServiceTotals::of(&next), nodes)?;
    c.update(next);
    Ok(current.id.clone())
}

/// The service `id` as the store holds it after a write (`reference` names it in the error).
fn read_service(state: &ClusterState, id: &str, reference: &str) -> Result<Service, ControlError> {
    state
        .store
        .view(|t| t.services().get(id).map(|s| (**s).clone()))
        .ok_or_else(|| ControlError::not_found("service", reference))
}

/// Removes a service and marks its tasks for removal (desired state REMOVE), in one write bounded like the
/// orchestrator's (`MAX_ACTIONS_PER_WRITE`, `MAX_BYTES_PER_WRITE`): the tasks that do not fit, or that keep
/// changing under the write (see `REMOVE_RETRIES`), are marked by the orchestrator when it sees the service
/// gone.
pub async fn remove_service(state: &ClusterState, reference: &str) -> Result<(), ControlError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let res = state
            .write(|t: &Tables, c: &mut Changes| {
                let svc = find_service(t, reference)?;
                // As many task updates as one write holds; the orchestrator marks the rest once it sees
                // the service gone. Tasks that keep changing (a busy scheduler) would make every attempt
                // conflict: the last attempts leave them all to the orchestrator.
                let with_tasks = attempt <= REMOVE_RETRIES;
                let mut bytes = 0;
                for task in t.tasks().by_service(&svc.id).filter(|_| with_tasks) {
                    if task.desired_state < TaskState::Remove as i32 {
                        let len = task.encoded_len() + ACTION_OVERHEAD_BYTES;
                        if c.len() + 1 >= MAX_ACTIONS_PER_WRITE || bytes + len > MAX_BYTES_PER_WRITE {
                            break;
                        }
                        bytes += len;
                        let mut task = (**task).clone();
                        task.set_desired_state(TaskState::Remove);
                        c.update(task);
                    }
                }
                c.remove(svc.clone());
                Ok(())
            })
            .await
            .map_err(ControlError::from);
        match res {
            // A task changed between our read and the commit, or the reaper deleted it: read again (a delete
            // of an existing service never fails on its tasks; issue 32 saw a 404 "task ... not found").
            Err(ControlError::Conflict(_) | ControlError::NotFound { kind: "task", .. })
                if attempt < REMOVE_RETRIES + REMOVE_SERVICE_ONLY_RETRIES =>
            {
                continue
            }
            other => return other.map(|_| ()),
        }
    }
}

/// The service with this ID, name or unique ID prefix.
pub fn get_service(state: &ClusterState, reference: &str) -> Result<Arc<Service>, ControlError> {
    state.store.view(|t| find_service(t, reference).cloned())
}

/// Which services to list. Empty fields match everything; entries within a field are alternatives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceFilters {
    /// ID prefixes.
    pub id_prefixes: Vec<String>,
    /// Name prefixes (Docker's `name` filter matches prefixes).
    pub name_prefixes: Vec<String>,
    /// `key` or `key=value` service labels; all must match.
    pub labels: Vec<String>,
    /// "replicated" or "global" (and the job modes).
    pub modes: Vec<String>,
}

fn mode_name(spec: &ServiceSpec) -> &'static str {
    match spec.mode {
        Some(service_spec::Mode::Replicated(_)) => "replicated",
        Some(service_spec::Mode::Global(_)) => "global",
        Some(service_spec::Mode::ReplicatedJob(_)) => "replicated-job",
        Some(service_spec::Mode::GlobalJob(_)) => "global-job",
        None => "",
    }
}

/// Services matching `filters`, sorted by name.
pub fn list_services(state: &ClusterState, filters: &ServiceFilters) -> Vec<Arc<Service>> {
    let mut out: Vec<Arc<Service>> = state.store.view(|t| {
        t.services()
            .iter()
            .filter(|s| {
                let spec = s.spec.clone().unwrap_or_default();
                let ann = spec.annotations.clone().unwrap_or_default();
                any_prefix(&filters.id_prefixes, &s.id)
                    && any_prefix(&filters.name_prefixes, &ann.name)
                    && labels_match(&ann.labels, &filters.labels)
                    && (filters.modes.is_empty() || filters.modes.iter().any(|m| m == mode_name(&spec)))
            })
            .cloned()
            .collect()
    });
    out.sort_by(|a, b| a.unique_name().cmp(&b.unique_name()).then_with(|| a.id.cmp(&b.id)));
    out
}

/// Task counts of a service, as `service ls` shows them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServiceStatus {
    /// Tasks observed running whose desired state is running (a job: tasks of its current iteration
    /// observed running).
    pub running_tasks: u64,
    /// Replicas asked for (replicated), or tasks meant to run (global: tasks with desired state running;
    /// replicated job: its max concurrency; global job: its current iteration's tasks meant to complete that
    /// have not yet).
    pub desired_tasks: u64,
    /// Tasks of a job's current iteration that completed.
    pub completed_tasks: u64,
}

/// Counts a job's current iteration as SwarmKit's `ListServiceStatuses` does (the docker CLI prints
/// `running/desired (completed/total completed)` from it).
fn job_status_counts(tables: &Tables, service: &Service) -> ServiceStatus {
    use crate::orchestrator::jobs::{current_iteration, in_iteration};
    let iteration = current_iteration(service);
    let mut st = ServiceStatus::default();
    let mut unfinished = 0;
    for task in tables.tasks().by_service(&service.id).filter(|t| in_iteration(t, iteration)) {
        let observed = task.status.as_ref().map(|s| s.state).unwrap_or(0);
        if observed == TaskState::Complete as i32 {
            st.completed_tasks += 1;
        } else if task.desired_state == TaskState::Complete as i32 {
            unfinished += 1;
        }
        if observed == TaskState::Running as i32 {
            st.running_tasks += 1;
        }
    }
    st.desired_tasks = match service.spec.as_ref().and_then(|s| s.mode.as_ref()) {
        Some(service_spec::Mode::ReplicatedJob(j)) => j.max_concurrent,
        _ => unfinished,
    };
    st
}

/// Counts a service's tasks (through the service index) for `ServiceStatus`.
pub fn service_status(tables: &Tables, service: &Service) -> ServiceStatus {
    if service.spec.as_ref().is_some_and(is_job_spec) {
        return job_status_counts(tables, service);
    }
    let mut st = ServiceStatus::default();
    let mut desired_running = 0;
    for task in tables.tasks().by_service(&service.id) {
        let observed = task.status.as_ref().map(|s| s.state).unwrap_or(0);
        if task.desired_state == TaskState::Running as i32 {
            desired_running += 1;
            if observed == TaskState::Running as i32 {
                st.running_tasks += 1;
            }
        }
        if observed == TaskState::Complete as i32 {
            st.completed_tasks += 1;
        }
    }
    st.desired_tasks = match service.spec.as_ref().and_then(|s| s.mode.as_ref()) {
        Some(service_spec::Mode::Replicated(r)) => r.replicas,
        _ => desired_running,
    };
    st
}

/// Placement preferences: at most `MAX_PLACEMENT_PREFERENCES`, each a spread over `node.labels.<name>` or
/// `engine.labels.<name>` (the scheduler's decision tree groups nodes by nothing else).
fn check_preferences(prefs: &[shoal_api::PlacementPreference]) -> Result<(), ControlError> {
    use crate::limits::MAX_PLACEMENT_PREFERENCES;
    if prefs.len() > MAX_PLACEMENT_PREFERENCES {
        return Err(invalid(format!(
            "Placement.Preferences: {} preferences; at most {MAX_PLACEMENT_PREFERENCES} are allowed",
            prefs.len()
        )));
    }
    for (i, p) in prefs.iter().enumerate() {
        // Any descriptor is accepted, as the engine accepts it: node and engine labels and the node attributes
        // constraints name are spread over (`scheduler::preferences::Descriptor`); SwarmKit's scheduler skips
        // any other level, and so does this one.
        if p.preference.is_none() {
            return Err(invalid(format!("Placement.Preferences[{i}]: a preference needs a Spread")));
        }
    }
    Ok(())
}

/// A task's generic resource reservations: counts of distinct valid kinds (the scheduler picks named units; a
/// task cannot ask for one by name, as in SwarmKit), at most `MAX_GENERIC_RESERVATIONS` kinds of at most
/// `MAX_GENERIC_UNITS` units each.
fn check_generic_reservations(generic: &[shoal_api::GenericResource]) -> Result<(), ControlError> {
    use crate::limits::{MAX_GENERIC_RESERVATIONS, MAX_GENERIC_UNITS};
    use shoal_api::generic_resource::Resource;
    const FIELD: &str = "Resources.Reservations.GenericResources";
    if generic.len() > MAX_GENERIC_RESERVATIONS {
        return Err(invalid(format!(
            "{FIELD}: {} kinds; at most {MAX_GENERIC_RESERVATIONS} are allowed",
            generic.len()
        )));
    }
    let mut kinds = std::collections::BTreeSet::new();
    for (i, g) in generic.iter().enumerate() {
        let d = match &g.resource {
            Some(Resource::DiscreteResourceSpec(d)) => d,
            Some(Resource::NamedResourceSpec(n)) => {
                return Err(invalid(format!(
                    "{FIELD}[{i}]: a task reserves a count of {:?} (DiscreteResourceSpec), not a named unit; the \
                     scheduler picks the units",
                    n.kind
                )))
            }
            None => return Err(invalid(format!("{FIELD}[{i}]: empty"))),
        };
        let name_ok = !d.kind.is_empty()
            && d.kind.len() <= shoal_api::generic::MAX_GENERIC_NAME_BYTES
            && d.kind.chars().all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c));
        if !name_ok {
            return Err(invalid(format!(
                "{FIELD}[{i}]: invalid kind {:?} (letters, digits, '-', '_', '.', ':'; at most {} bytes)",
                d.kind,
                shoal_api::generic::MAX_GENERIC_NAME_BYTES
            )));
        }
        if !(1..=MAX_GENERIC_UNITS).contains(&d.value) {
            return Err(invalid(format!(
                "{FIELD}[{i}]: {} units of {:?}; use 1 to {MAX_GENERIC_UNITS}",
                d.value, d.kind
            )));
        }
        if !kinds.insert(d.kind.as_str()) {
            return Err(invalid(format!("{FIELD}[{i}]: {:?} is reserved twice", d.kind)));
        }
    }
    Ok(())
}
