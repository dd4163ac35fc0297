//! The Engine API endpoints: request parsing (path, query, JSON body), a call into `controlapi` or a read of
//! the store, and the JSON answer. Every write goes through `controlapi`. Must not depend on Raft or the
//! executors.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use shoal_api::NodeRole;
use shoal_manager::controlapi;

use crate::error::ApiError;
use crate::filters;
use crate::json::system::{ComponentJson, PeerJson, PlatformNameJson};
use crate::json::{
    InfoJson, NodeJson, NodeSpecJson, ServiceCreateResponse, ServiceJson, ServiceSpecJson, ServiceStatusJson,
    ServiceUpdateResponse, SwarmInfoJson, SwarmJson, SystemVersionJson, TaskJson,
};
use crate::request::{json_body, parse_bool_param, ApiVersion, MIN_API_VERSION};
use crate::versions::{self, SpecWrite};
use crate::{ApiContext, API_VERSION};

type Ctx = State<Arc<ApiContext>>;
type Params = Query<HashMap<String, String>>;
type ApiResult = Result<Response, ApiError>;

use crate::request::bool_param as flag;

pub(crate) fn version_param(q: &HashMap<String, String>) -> Result<u64, ApiError> {
    let v = q.get("version").ok_or_else(|| {
        ApiError::BadRequest("the version query parameter is required: pass the Version.Index you inspected".into())
    })?;
    v.parse().map_err(|_| ApiError::BadRequest(format!("invalid version {v:?}: expected a non-negative integer")))
}

fn json<T: serde::Serialize>(v: T) -> ApiResult {
    Ok(Json(v).into_response())
}

/// `GET|HEAD /_ping`.
pub(crate) async fn ping() -> Response {
    let mut r = "OK".into_response();
    let h = r.headers_mut();
    h.insert("OSType", HeaderValue::from_static("linux"));
    h.insert("Docker-Experimental", HeaderValue::from_static("false"));
    h.insert("Swarm", HeaderValue::from_static("active/manager"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache, no-store, must-revalidate"));
    h.insert(header::PRAGMA, HeaderValue::from_static("no-cache"));
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

/// Around the manager's routes: `/_ping` (with or without a version prefix) answers 500 with the reason while
/// this manager is unhealthy for a reason of its own (its disk is full), with the `Swarm: error` header, as the
/// spec lets a ping fail; the docker client still reads the headers of a 500 ping.
pub(crate) async fn unhealthy_ping(
    State(state): State<shoal_manager::ClusterState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let path = req.uri().path();
    let is_ping = path == "/_ping"
        || path.strip_prefix("/v").and_then(|rest| rest.split_once('/')).is_some_and(|(_, rest)| rest == "_ping");
    let Some(message) = is_ping.then(|| state.unhealthy()).flatten() else {
        return next.run(req).await;
    };
    let mut r = (StatusCode::INTERNAL_SERVER_ERROR, Json(crate::json::ErrorResponse { message })).into_response();
    let h = r.headers_mut();
    h.insert("API-Version", HeaderValue::from_static(API_VERSION));
    h.insert("Server", HeaderValue::from_static(concat!("Shoal/", env!("CARGO_PKG_VERSION"))));
    h.insert("OSType", HeaderValue::from_static("linux"));
    h.insert("Docker-Experimental", HeaderValue::from_static("false"));
    h.insert("Swarm", HeaderValue::from_static("error"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache, no-store, must-revalidate"));
    h.insert(header::PRAGMA, HeaderValue::from_static("no-cache"));
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

pub(crate) fn kernel_version() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_default()
}

pub(crate) fn os_description() -> String {
    std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("PRETTY_NAME=").map(|v| v.trim_matches('"').to_string())))
        .unwrap_or_else(|| "linux".into())
}

pub(crate) fn mem_total_bytes() -> i64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:")?.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// `GET /version`.
pub(crate) async fn version() -> ApiResult {
    let v = env!("CARGO_PKG_VERSION");
    json(SystemVersionJson {
        platform: PlatformNameJson { name: "Shoal".into() },
        components: vec![ComponentJson { name: "Shoal".into(), version: v.into() }],
        version: v.into(),
        api_version: API_VERSION.into(),
        min_api_version: format!("{}.{}", MIN_API_VERSION.0, MIN_API_VERSION.1),
        git_commit: String::new(),
        go_version: "rust".into(),
        os: "linux".into(),
        arch: go_arch().into(),
        kernel_version: kernel_version(),
    })
}

/// `GET /info`. The swarm part is read after a read barrier, as the other reads are; when no leader confirms
/// it, the answer still comes (`docker info` must work in a cluster that lost its quorum) with this manager's
/// last known state and the reason in `Swarm.Error`, as Docker reports an unreachable control plane.
pub(crate) async fn info(State(ctx): Ctx, v: ApiVersion) -> ApiResult {
    let unhealthy = ctx.state.unhealthy();
    let error = match (&unhealthy, read_barrier(&ctx).await) {
        (Some(reason), _) => reason.clone(),
        (None, Ok(())) => String::new(),
        (None, Err(e)) => e.to_string(),
    };
    let (swarm, no_data_plane) = ctx.state.store.view(|t| {
        // Why this node has no data plane, as its agent described it (its networked tasks go elsewhere).
        let no_data_plane = t
            .nodes()
            .get(&ctx.node_id)
            .and_then(|n| n.description.as_ref()?.engine.as_ref()?.labels.get(shoal_api::SHOAL_NO_DATA_PLANE_LABEL))
            .cloned();
        let managers: Vec<_> = t.nodes().iter().filter(|n| n.role() == NodeRole::Manager).collect();
        let mut remote: Vec<PeerJson> = managers
            .iter()
            .map(|n| PeerJson {
                node_id: n.id.clone(),
                addr: n
                    .manager_status
                    .as_ref()
                    .map(|m| m.addr.clone())
                    .filter(|a| !a.is_empty())
                    .unwrap_or_else(|| if n.id == ctx.node_id { ctx.node_addr.clone() } else { String::new() }),
            })
            .collect();
        remote.sort_by(|a, b| a.node_id.cmp(&b.node_id));
        let swarm = SwarmInfoJson {
            node_id: ctx.node_id.clone(),
            node_addr: ctx.node_addr.clone(),
            local_node_state: "active".into(),
            control_available: true,
            error,
            remote_managers: remote,
            nodes: t.nodes().len() as u64,
            managers: managers.len() as u64,
            cluster: first_cluster(t).map(|c| swarm_json(c).cluster),
        };
        (swarm, no_data_plane)
    });
    let mut info = InfoJson {
        labels: vec![format!("shoal.executor={}", ctx.executor)],
        swarm,
        warnings: unhealthy.map(|reason| format!("WARNING: this manager is unhealthy: {reason}")).into_iter().collect(),
        ..host_info(&ctx.node_id, &ctx.hostname)
    };
    if let Some(why) = no_data_plane {
        info.warnings.push(no_data_plane_warning(&why));
    }
    versions::adjust_info(v, &mut info);
    json(info)
}

/// The `docker info` warning of a node without a data plane.
pub(crate) fn no_data_plane_warning(why: &str) -> String {
    format!("WARNING: no overlay data plane on this node: {why}; tasks on overlay networks are not placed here")
}

/// The host part of `GET /info`, the same on every kind of node (manager, worker, locked manager).
pub(crate) fn host_info(node_id: &str, hostname: &str) -> InfoJson {
    let os_release = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    let os_version = os_release
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_ID="))
        .map(|v| v.trim_matches('"').to_string())
        .unwrap_or_default();
    let cgroup_version = if std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() { "2" } else { "1" };
    InfoJson {
        id: node_id.to_string(),
        name: hostname.to_string(),
        operating_system: os_description(),
        os_type: "linux".into(),
        os_version,
        architecture: std::env::consts::ARCH.into(),
        ncpu: std::thread::available_parallelism().map(|n| n.get() as u64).unwrap_or(1),
        mem_total: mem_total_bytes(),
        kernel_version: kernel_version(),
        server_version: env!("CARGO_PKG_VERSION").into(),
        system_time: time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
        n_fd: std::fs::read_dir("/proc/self/fd").map(|d| d.count() as u64).unwrap_or(0),
        logging_driver: "json-file".into(),
        cgroup_driver: "cgroupfs".into(),
        cgroup_version: cgroup_version.into(),
        index_server_address: "https://index.docker.io/v1/".into(),
        ..Default::default()
    }
}

fn first_cluster(t: &shoal_store::Tables) -> Option<&shoal_api::Cluster> {
    // One cluster object per cluster; pick deterministically if a bug ever made two.
    t.clusters().iter().min_by(|a, b| a.id.cmp(&b.id)).map(|c| &**c)
}

/// The swarm's document for a cluster object, with what the daemon's rules derive from it: the root CA's
/// issuer (the CA's parsing) and the data path port (the network's rule).
pub(crate) fn swarm_json(c: &shoal_api::Cluster) -> SwarmJson {
    let issuer = c.root_ca.as_ref().and_then(|r| shoal_ca::root_issuer_info(&r.ca_cert).ok()).unwrap_or_default();
    let derived = crate::json::ClusterDerived {
        root_issuer_subject: issuer.subject,
        root_issuer_public_key: issuer.public_key,
        data_path_port: shoal_manager::controlapi::network::data_path_port(c),
    };
    SwarmJson::from_api(c, &derived)
}

/// `GET /swarm`, linearizable like the other reads (503 when no leader confirms it).
pub(crate) async fn swarm(State(ctx): Ctx) -> ApiResult {
    read_barrier(&ctx).await?;
    let found = ctx.state.store.view(|t| first_cluster(t).map(swarm_json));
    match found {
        Some(s) => json(s),
        None => Err(ApiError::Unavailable(
            "the cluster is not initialized yet: wait for the node to finish starting, then retry".into(),
        )),
    }
}

/// Makes the read that follows linearizable: on any manager it sees every write acknowledged before the
/// request (Raft ReadIndex); 503 when no leader confirms within a bounded time.
pub(crate) async fn read_barrier(ctx: &ApiContext) -> Result<(), ApiError> {
    ctx.state.read_barrier().await.map_err(|e| ApiError::from(controlapi::ControlError::from(e)))
}

/// `GET /services`.
pub(crate) async fn list_services(State(ctx): Ctx, v: ApiVersion, Query(q): Params) -> ApiResult {
    let f = filters::services(q.get("filters").map(String::as_str))?;
    let with_status = versions::services_status_param_read(v) && parse_bool_param(&q, "status")?;
    read_barrier(&ctx).await?;
    let services = controlapi::list_services(&ctx.state, &f);
    let out: Vec<ServiceJson> = ctx.state.store.view(|t| {
        services
            .iter()
            .map(|s| {
                let mut j = ServiceJson::from_api(s);
                if with_status {
                    let st = controlapi::service_status(t, s);
                    j.service_status = Some(ServiceStatusJson {
                        running_tasks: st.running_tasks,
                        desired_tasks: st.desired_tasks,
                        completed_tasks: st.completed_tasks,
                    });
                }
                j
            })
            .collect()
    });
    json(out)
}

/// The `X-Registry-Auth` header of a service write (`docker service create/update --with-registry-auth`), if any.
fn registry_auth_header(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    match headers.get("x-registry-auth") {
        None => Ok(None),
        Some(v) if v.is_empty() => Ok(None),
        Some(v) => v
            .to_str()
            .map(|s| Some(s.to_string()))
            .map_err(|_| ApiError::BadRequest("X-Registry-Auth: the header is not base64url text".into())),
    }
}

/// Carries registry credentials in the task's container spec as Docker does (`PullOptions.RegistryAuth`, what
/// the docker executor pulls a missing image with): the request's `X-Registry-Auth`, or else, on an update,
/// those of the service's current spec (`registryAuthFrom=spec`, the default) or previous spec
/// (`previous-spec`). Never shown back: the Engine API's container spec has no such field.
fn carry_registry_auth(
    spec: &mut shoal_api::ServiceSpec,
    header: Option<String>,
    kept: Option<&shoal_api::ServiceSpec>,
) {
    let container = |s: &shoal_api::ServiceSpec| match s.task.as_ref().and_then(|t| t.runtime.as_ref()) {
        Some(shoal_api::task_spec::Runtime::Container(c)) => c.pull_options.clone(),
        _ => None,
    };
    let pull = match header {
        Some(auth) => Some(shoal_api::container_spec::PullOptions { registry_auth: auth }),
        None => kept.and_then(container),
    };
    if let Some(shoal_api::task_spec::Runtime::Container(c)) = spec.task.as_mut().and_then(|t| t.runtime.as_mut()) {
        c.pull_options = pull;
    }
}

/// `POST /services/create`.
pub(crate) async fn create_service(State(ctx): Ctx, v: ApiVersion, headers: HeaderMap, body: Bytes) -> ApiResult {
    let mut spec = service_spec_body(v, &headers, &body, SpecWrite::Create)?;
    carry_registry_auth(&mut spec, registry_auth_header(&headers)?, None);
    let svc = controlapi::create_service(&ctx.state, spec).await?;
    Ok((StatusCode::CREATED, Json(ServiceCreateResponse { id: svc.id, warnings: Vec::new() })).into_response())
}

/// A service spec from a request body at API version `v`: decoded as Go would, what `v` did not have dropped
/// (`versions`), converted (refused as the engine refuses it), then what Shoal cannot honour refused
/// (`json::unsupported`).
fn service_spec_body(
    v: ApiVersion,
    headers: &HeaderMap,
    body: &[u8],
    write: SpecWrite,
) -> Result<shoal_api::ServiceSpec, ApiError> {
    let mut spec: ServiceSpecJson = json_body(headers, body, "service spec")?;
    versions::adjust_service_spec(v, &mut spec, write);
    let converted = spec.to_api()?;
    crate::json::unsupported::refuse_unsupported(&spec)?;
    Ok(converted)
}

/// `GET /services/{id}[?insertDefaults=true]`.
pub(crate) async fn get_service(State(ctx): Ctx, Path(id): Path<String>, Query(q): Params) -> ApiResult {
    let insert_defaults = parse_bool_param(&q, "insertDefaults")?;
    read_barrier(&ctx).await?;
    let s = controlapi::get_service(&ctx.state, &id)?;
    let mut j = ServiceJson::from_api(&s);
    if insert_defaults {
        j.spec = j.spec.with_defaults();
        j.previous_spec = j.previous_spec.map(ServiceSpecJson::with_defaults);
    }
    json(j)
}

/// `DELETE /services/{id}`.
pub(crate) async fn remove_service(State(ctx): Ctx, Path(id): Path<String>) -> ApiResult {
    controlapi::remove_service(&ctx.state, &id).await?;
    Ok(StatusCode::OK.into_response())
}

/// `POST /services/{id}/update?version=N[&rollback=previous]`.
pub(crate) async fn update_service(
    State(ctx): Ctx,
    v: ApiVersion,
    Path(id): Path<String>,
    Query(q): Params,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult {
    let version = version_param(&q)?;
    match q.get("rollback").map(String::as_str) {
        // As the engine: the body's spec is ignored; the previous spec becomes current.
        Some("previous") => {
            controlapi::rollback_service(&ctx.state, &id, version).await?;
        }
        Some(other) if !other.is_empty() && other != "none" => {
            return Err(ApiError::BadRequest(format!(
                "unrecognized rollback option {other:?}: use \"previous\" (or \"none\")"
            )));
        }
        _ => {
            let mut spec = service_spec_body(v, &headers, &body, SpecWrite::Update)?;
            let header = registry_auth_header(&headers)?;
            let current = if header.is_none() { Some(controlapi::get_service(&ctx.state, &id)?) } else { None };
            let kept = match q.get("registryAuthFrom").map(String::as_str) {
                None | Some("") | Some("spec") => current.as_ref().and_then(|s| s.spec.as_ref()),
                Some("previous-spec") => current.as_ref().and_then(|s| s.previous_spec.as_ref()),
                Some(other) => {
                    return Err(ApiError::BadRequest(format!(
                        "unsupported registryAuthFrom value {other:?}: use \"spec\" or \"previous-spec\""
                    )))
                }
            };
            carry_registry_auth(&mut spec, header, kept);
            controlapi::update_service(&ctx.state, &id, version, spec).await?;
        }
    }
    json(ServiceUpdateResponse { warnings: Vec::new() })
}

/// `GET /tasks`.
pub(crate) async fn list_tasks(State(ctx): Ctx, Query(q): Params) -> ApiResult {
    let f = filters::tasks(q.get("filters").map(String::as_str))?;
    read_barrier(&ctx).await?;
    let tasks = controlapi::list_tasks(&ctx.state, &f);
    json(tasks.iter().map(|t| TaskJson::from_api(t)).collect::<Vec<_>>())
}

/// `GET /tasks/{id}`.
pub(crate) async fn get_task(State(ctx): Ctx, Path(id): Path<String>) -> ApiResult {
    read_barrier(&ctx).await?;
    let t = controlapi::get_task(&ctx.state, &id)?;
    json(TaskJson::from_api(&t))
}

/// `GET /nodes`.
pub(crate) async fn list_nodes(State(ctx): Ctx, Query(q): Params) -> ApiResult {
    let f = filters::nodes(q.get("filters").map(String::as_str))?;
    read_barrier(&ctx).await?;
    let nodes = controlapi::list_nodes(&ctx.state, &f);
    json(nodes.iter().map(|n| NodeJson::from_api(n)).collect::<Vec<_>>())
}

/// `GET /nodes/{id}`.
pub(crate) async fn get_node(State(ctx): Ctx, Path(id): Path<String>) -> ApiResult {
    read_barrier(&ctx).await?;
    let n = controlapi::get_node(&ctx.state, &id)?;
    json(NodeJson::from_api(&n))
}

/// `POST /nodes/{id}/update?version=N`.
pub(crate) async fn update_node(
    State(ctx): Ctx,
    Path(id): Path<String>,
    Query(q): Params,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult {
    let version = version_param(&q)?;
    let spec: NodeSpecJson = json_body(&headers, &body, "node spec")?;
    let current = controlapi::get_node(&ctx.state, &id)?;
    let membership = current.spec.as_ref().map(|s| s.membership()).unwrap_or_default();
    controlapi::update_node(&ctx.state, &current.id, version, spec.to_api(membership)?).await?;
    Ok(StatusCode::OK.into_response())
}

/// `DELETE /nodes/{id}?force=`.
pub(crate) async fn remove_node(State(ctx): Ctx, Path(id): Path<String>, Query(q): Params) -> ApiResult {
    controlapi::remove_node(&ctx.state, &id, flag(&q, "force")).await?;
    Ok(StatusCode::OK.into_response())
}

/// `GET /distribution/{name}/json`: Shoal does not talk to registries. The docker CLI warns that the
/// digest could not be recorded and goes on with the reference as given.
pub(crate) async fn distribution() -> ApiResult {
    Err(ApiError::NotImplemented(
        "Shoal does not query registries: the image reference is used as given (pass --no-resolve-image to skip this)"
            .into(),
    ))
}

/// Any other path.
pub(crate) async fn not_found(uri: axum::http::Uri) -> ApiResult {
    Err(ApiError::NotFound(format!("page not found: {} is not an endpoint of the Shoal Engine API", uri.path())))
}
