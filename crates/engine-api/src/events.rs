//! `GET /events`: Docker's swarm events (types `service`, `node`, `secret`, `config`; actions create, update,
//! remove; scope `swarm`), made as dockerd makes them from SwarmKit's Watch stream: this node's `EventLog`
//! consumes `shoal_manager::WatchService` (the same stream `swarmctl`'s clients get, with old
//! objects) and turns each event into Docker's `events.Message`, with the attributes dockerd adds for
//! updates (`replicas.old/new`, `image.old/new`, `updatestate.old/new` for services; `availability`,
//! `role`, `state`, `leader`, `reachability` `.old/.new` for nodes). Times are the object's `updated_at`
//! (`created_at` for a create), the log's time for a remove, as dockerd does.
//!
//! The log keeps the last `KEPT_EVENTS` events (Docker keeps its last 1,024) for `since`/`until`; live
//! events go to each subscriber through a queue of `SUBSCRIBER_QUEUE_EVENTS`: a subscriber that falls
//! further behind is disconnected (it can ask again with `since`). A watch that ends (a lagging log, a
//! manager stopping its stream) is taken again, resuming from the last version seen.
//!
//! Filters, as moby's `daemon/events` filter: `type`, `event` (the action), `scope`, `label` (`key` or
//! `key=value` on the attributes), and `service`, `node`, `secret`, `config`, `network` (ID or name,
//! prefixes match); `container`, `image`, `volume`, `plugin` and `daemon` are accepted and match no
//! swarm event, as in Docker.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use shoal_api::{object, service_spec, task_spec, watch_message, Node, Service, WatchActionKind, WatchRequest};
use shoal_manager::WatchService;
use std::sync::Mutex;
use tokio::sync::broadcast;
use tokio_stream::StreamExt;

use crate::error::ApiError;
use crate::ApiContext;

/// Events kept for `since`/`until`.
pub const KEPT_EVENTS: usize = 1024;
/// Live events queued for one `/events` client.
pub const SUBSCRIBER_QUEUE_EVENTS: usize = 256;
/// Wait before taking the watch again after it ended.
const REWATCH_DELAY: Duration = Duration::from_secs(1);

/// Docker's `events.Actor`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ActorJson {
    /// The object's ID.
    #[serde(rename = "ID")]
    pub id: String,
    /// `name` and the changed fields; Go writes a map's keys sorted.
    #[serde(rename = "Attributes")]
    pub attributes: BTreeMap<String, String>,
}

/// Docker's `events.Message`, as a swarm event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EventJson {
    /// `service`, `node`, `secret` or `config`.
    #[serde(rename = "Type")]
    pub kind: String,
    /// `create`, `update` or `remove`.
    #[serde(rename = "Action")]
    pub action: String,
    /// What it happened to.
    #[serde(rename = "Actor")]
    pub actor: ActorJson,
    /// Always `swarm`.
    pub scope: String,
    /// Seconds since the epoch.
    pub time: i64,
    /// Nanoseconds since the epoch.
    #[serde(rename = "timeNano")]
    pub time_nano: i64,
}

fn lower(s: &str) -> String {
    s.to_ascii_lowercase()
}

fn changed(attrs: &mut BTreeMap<String, String>, key: &str, old: String, new: String) {
    if old != new {
        attrs.insert(format!("{key}.old"), old);
        attrs.insert(format!("{key}.new"), new);
    }
}

fn node_attributes(n: &Node, old: Option<&Node>) -> BTreeMap<String, String> {
    let mut a = BTreeMap::from([("name".to_string(), shoal_manager::controlapi::node_name(n).to_string())]);
    let Some(o) = old else { return a };
    let availability = |n: &Node| lower(n.spec.clone().unwrap_or_default().availability().as_str_name());
    changed(&mut a, "availability", availability(o), availability(n));
    changed(&mut a, "role", lower(o.role().as_str_name()), lower(n.role().as_str_name()));
    let state = |n: &Node| lower(n.status.clone().unwrap_or_default().state().as_str_name());
    changed(&mut a, "state", state(o), state(n));
    if let (Some(m), Some(om)) = (&n.manager_status, &o.manager_status) {
        changed(&mut a, "leader", om.leader.to_string(), m.leader.to_string());
        changed(&mut a, "reachability", lower(om.reachability().as_str_name()), lower(m.reachability().as_str_name()));
    }
    a
}

fn image(s: &Service) -> Option<&str> {
    match s.spec.as_ref()?.task.as_ref()?.runtime.as_ref()? {
        task_spec::Runtime::Container(c) => Some(&c.image),
        task_spec::Runtime::Attachment(_) => None,
    }
}

fn replicas(s: &Service) -> Option<u64> {
    match s.spec.as_ref()?.mode.as_ref()? {
        service_spec::Mode::Replicated(r) => Some(r.replicas),
        _ => None,
    }
}

fn service_attributes(s: &Service, old: Option<&Service>) -> BTreeMap<String, String> {
    let name = s.spec.as_ref().and_then(|s| s.annotations.as_ref()).map(|a| a.name.clone()).unwrap_or_default();
    let mut a = BTreeMap::from([("name".to_string(), name)]);
    let Some(o) = old else { return a };
    if let (Some(new), Some(old)) = (image(s), image(o)) {
        changed(&mut a, "image", old.to_string(), new.to_string());
    }
    if let (Some(new), Some(old)) = (replicas(s), replicas(o)) {
        changed(&mut a, "replicas", old.to_string(), new.to_string());
    }
    if let Some(u) = &s.update_status {
        let state = lower(u.state().as_str_name());
        match &o.update_status {
            None => {
                a.insert("updatestate.new".into(), state);
            }
            Some(ou) => changed(&mut a, "updatestate", lower(ou.state().as_str_name()), state),
        }
    }
    a
}

fn nanos(t: Option<&shoal_api::prost_types::Timestamp>) -> Option<i64> {
    t.map(|t| t.seconds.saturating_mul(1_000_000_000).saturating_add(i64::from(t.nanos)))
}

fn now_nanos() -> i64 {
    i64::try_from(time::OffsetDateTime::now_utc().unix_timestamp_nanos()).unwrap_or(i64::MAX)
}

/// Docker's message for one Watch event (`None` for kinds Docker does not report: tasks, the cluster).
pub fn event_json(e: &watch_message::Event) -> Option<EventJson> {
    let action = WatchActionKind::try_from(e.action).ok()?;
    let old = e.old_object.as_ref().and_then(|o| o.object.as_ref());
    let (kind, id, meta, attributes) = match e.object.as_ref()?.object.as_ref()? {
        object::Object::Service(s) => {
            let old = match old {
                Some(object::Object::Service(o)) => Some(o),
                _ => None,
            };
            ("service", &s.id, &s.meta, service_attributes(s, old))
        }
        object::Object::Node(n) => {
            let old = match old {
                Some(object::Object::Node(o)) => Some(o),
                _ => None,
            };
            ("node", &n.id, &n.meta, node_attributes(n, old))
        }
        object::Object::Secret(s) => {
            let name = s.spec.as_ref().and_then(|s| s.annotations.as_ref()).map(|a| a.name.clone()).unwrap_or_default();
            ("secret", &s.id, &s.meta, BTreeMap::from([("name".to_string(), name)]))
        }
        object::Object::Config(c) => {
            let name = c.spec.as_ref().and_then(|s| s.annotations.as_ref()).map(|a| a.name.clone()).unwrap_or_default();
            ("config", &c.id, &c.meta, BTreeMap::from([("name".to_string(), name)]))
        }
        object::Object::Network(n) => {
            let name = n.spec.as_ref().and_then(|s| s.annotations.as_ref()).map(|a| a.name.clone()).unwrap_or_default();
            ("network", &n.id, &n.meta, BTreeMap::from([("name".to_string(), name)]))
        }
        // Docker reports no swarm event for a cluster volume either.
        object::Object::Task(_) | object::Object::Cluster(_) | object::Object::Volume(_) => return None,
    };
    let (action, at) = match action {
        WatchActionKind::WatchActionCreate => ("create", nanos(meta.as_ref().and_then(|m| m.created_at.as_ref()))),
        WatchActionKind::WatchActionUpdate => ("update", nanos(meta.as_ref().and_then(|m| m.updated_at.as_ref()))),
        WatchActionKind::WatchActionRemove => ("remove", None),
        WatchActionKind::WatchActionUnknown => return None,
    };
    let time_nano = at.unwrap_or_else(now_nanos);
    Some(EventJson {
        kind: kind.into(),
        action: action.into(),
        actor: ActorJson { id: id.clone(), attributes },
        scope: "swarm".into(),
        time: time_nano.div_euclid(1_000_000_000),
        time_nano,
    })
}

/// Adds `e` to the `KEPT_EVENTS` last events, kept in time order for replays and their time window: an
/// object's time is stamped when its write is made, and writes made at once may commit in another order (a
/// few milliseconds apart), so an event can be older than the last one kept. Live subscribers get events in
/// commit order.
fn keep(events: &mut VecDeque<Arc<EventJson>>, e: Arc<EventJson>) {
    if events.len() == KEPT_EVENTS {
        events.pop_front();
    }
    let at = events.iter().rposition(|kept| kept.time_nano <= e.time_nano).map_or(0, |i| i + 1);
    events.insert(at, e);
}

struct Kept {
    events: VecDeque<Arc<EventJson>>,
    live: broadcast::Sender<Arc<EventJson>>,
}

/// This node's record of swarm events, fed by the Watch stream (see the module doc).
pub struct EventLog {
    watch: WatchService,
    kept: Mutex<Kept>,
    started: std::sync::Once,
}

impl std::fmt::Debug for EventLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kept = self.kept.lock().map(|k| k.events.len()).unwrap_or_default();
        f.debug_struct("EventLog").field("kept", &kept).finish()
    }
}

impl EventLog {
    /// A log fed by `watch`, once `start` runs (the first `/events` request starts it otherwise).
    pub fn new(watch: WatchService) -> Arc<EventLog> {
        let (live, _) = broadcast::channel(SUBSCRIBER_QUEUE_EVENTS);
        Arc::new(EventLog {
            watch,
            kept: Mutex::new(Kept { events: VecDeque::new(), live }),
            started: std::sync::Once::new(),
        })
    }

    /// Starts recording (on the current runtime); later calls do nothing.
    pub fn start(self: &Arc<Self>) {
        self.started.call_once(|| {
            tokio::spawn(Arc::clone(self).record());
        });
    }

    fn push(&self, e: EventJson) {
        let e = Arc::new(e);
        let mut k = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        keep(&mut k.events, e.clone());
        let _ = k.live.send(e);
    }

    /// The kept events and a receiver of those that follow, taken together so none is missed or doubled.
    fn subscribe(&self) -> (Vec<Arc<EventJson>>, broadcast::Receiver<Arc<EventJson>>) {
        let k = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        (k.events.iter().cloned().collect(), k.live.subscribe())
    }

    async fn record(self: Arc<Self>) {
        let entry =
            |kind: &str| shoal_api::watch_request::WatchEntry { kind: kind.into(), action: 7, filters: Vec::new() };
        let mut resume_from: Option<u64> = None;
        loop {
            if self.watch.stopping() {
                return;
            }
            let req = WatchRequest {
                entries: ["node", "service", "secret", "config", "network"].iter().map(|k| entry(k)).collect(),
                resume_from: resume_from.map(|index| shoal_api::Version { index }),
                include_old_object: true,
            };
            use shoal_api::watch_server::Watch;
            match self.watch.watch(tonic::Request::new(req)).await {
                Ok(stream) => {
                    let mut stream = stream.into_inner();
                    while let Some(msg) = stream.next().await {
                        match msg {
                            Ok(m) => {
                                for e in &m.events {
                                    if let Some(j) = event_json(e) {
                                        self.push(j);
                                    }
                                }
                                if let Some(v) = m.version {
                                    resume_from = Some(v.index);
                                }
                            }
                            Err(status) => {
                                if status.code() == tonic::Code::OutOfRange {
                                    // Too far behind to resume: some events are lost; start again from now.
                                    resume_from = None;
                                }
                                tracing::debug!(error = %status, "the events watch ended; watching again");
                                break;
                            }
                        }
                    }
                }
                Err(status) => tracing::debug!(error = %status, "the events watch could not start; retrying"),
            }
            tokio::time::sleep(REWATCH_DELAY).await;
        }
    }
}

/// A `since`/`until` value: Docker's `seconds[.nanoseconds]` (the docker CLI turns `5m`, `0s` and dates
/// into this form), in nanoseconds since the epoch.
fn parse_time(name: &str, v: &str) -> Result<i64, ApiError> {
    let bad = || {
        ApiError::BadRequest(format!(
            "invalid {name} {v:?}: expected a Unix timestamp in seconds, optionally with nanoseconds (1700000000.5)"
        ))
    };
    let (secs, frac) = v.split_once('.').unwrap_or((v, ""));
    let secs: i64 = secs.parse().map_err(|_| bad())?;
    if frac.len() > 9 || !frac.chars().all(|c| c.is_ascii_digit()) {
        return Err(bad());
    }
    let frac_nanos: i64 = if frac.is_empty() { 0 } else { format!("{frac:0<9}").parse().map_err(|_| bad())? };
    secs.checked_mul(1_000_000_000).and_then(|n| n.checked_add(frac_nanos)).ok_or_else(bad)
}

/// The filters of `GET /events`.
#[derive(Debug, Default)]
struct EventFilters {
    f: crate::filters::RawFilters,
}

const EVENT_FILTERS: &[&str] = &[
    "config",
    "container",
    "daemon",
    "event",
    "image",
    "label",
    "network",
    "node",
    "plugin",
    "scope",
    "secret",
    "service",
    "type",
    "volume",
];

impl EventFilters {
    fn values(&self, key: &str) -> &[String] {
        self.f.get(key).map(Vec::as_slice).unwrap_or(&[])
    }

    fn exact(&self, key: &str, v: &str) -> bool {
        let vals = self.values(key);
        vals.is_empty() || vals.iter().any(|x| x == v)
    }

    /// moby's `FuzzyMatch`: no values, an equal one, or one that is a prefix.
    fn fuzzy(&self, key: &str, v: &str) -> bool {
        let vals = self.values(key);
        vals.is_empty() || vals.iter().any(|x| v.starts_with(x.as_str()))
    }

    fn name_or_id(&self, key: &str, e: &EventJson) -> bool {
        let name = e.actor.attributes.get("name").map(String::as_str).unwrap_or("");
        self.values(key).is_empty()
            || self.fuzzy(key, &e.actor.id) && !e.actor.id.is_empty()
            || (!name.is_empty() && self.fuzzy(key, name))
    }

    fn labels(&self, e: &EventJson) -> bool {
        self.values("label").iter().all(|l| match l.split_once('=') {
            Some((k, v)) => e.actor.attributes.get(k).is_some_and(|have| have == v),
            None => e.actor.attributes.contains_key(l.as_str()),
        })
    }

    fn include(&self, e: &EventJson) -> bool {
        self.exact("event", &e.action)
            && self.exact("type", &e.kind)
            && self.exact("scope", &e.scope)
            && ["config", "container", "daemon", "image", "network", "node", "plugin", "secret", "service", "volume"]
                .iter()
                .all(|k| self.name_or_id(k, e))
            && self.labels(e)
    }
}

fn line(e: &EventJson) -> axum::body::Bytes {
    let mut v = serde_json::to_vec(e).unwrap_or_default();
    v.push(b'\n');
    v.into()
}

/// `GET /events[?since=&until=&filters=]`.
pub async fn events(
    State(ctx): State<Arc<ApiContext>>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let since = q.get("since").filter(|v| !v.is_empty()).map(|v| parse_time("since", v)).transpose()?;
    let until = q.get("until").filter(|v| !v.is_empty()).map(|v| parse_time("until", v)).transpose()?;
    if let (Some(s), Some(u)) = (since, until) {
        if u < s {
            return Err(ApiError::BadRequest(format!(
                "`since` time ({}) cannot be after `until` time ({})",
                q["since"], q["until"]
            )));
        }
    }
    let filters = EventFilters { f: crate::filters::parse(q.get("filters").map(String::as_str), EVENT_FILTERS)? };
    ctx.events.start();
    let (kept, live) = ctx.events.subscribe();
    let now = now_nanos();
    // As dockerd: kept events are replayed only when a time bound is given.
    let replay: Vec<axum::body::Bytes> = if since.is_some() || until.is_some() {
        kept.iter()
            .filter(|e| since.is_none_or(|s| e.time_nano >= s) && until.is_none_or(|u| e.time_nano <= u))
            .filter(|e| filters.include(e))
            .map(|e| line(e))
            .collect()
    } else {
        Vec::new()
    };
    let only_past = until.is_some_and(|u| u < now);
    let deadline =
        until.map(|u| tokio::time::Instant::now() + Duration::from_nanos(u.saturating_sub(now).max(0) as u64));
    let live_stream = live_lines(filters, live, deadline, ctx.events.watch.shutdown_signal());
    let stream = tokio_stream::iter(replay.into_iter().map(Ok::<_, std::convert::Infallible>));
    let body = if only_past { Body::from_stream(stream) } else { Body::from_stream(stream.chain(live_stream)) };
    let mut r = body.into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(r)
}

/// The live part of an `/events` answer: matching events until `deadline` (if any), until the node stops
/// (`shutdown`), or until the client falls `SUBSCRIBER_QUEUE_EVENTS` behind.
fn live_lines(
    filters: EventFilters,
    live: broadcast::Receiver<Arc<EventJson>>,
    deadline: Option<tokio::time::Instant>,
    shutdown: Option<tokio::sync::watch::Receiver<bool>>,
) -> impl tokio_stream::Stream<Item = Result<axum::body::Bytes, std::convert::Infallible>> {
    futures::stream::unfold((filters, live, shutdown), move |(filters, mut live, mut shutdown)| async move {
        loop {
            let stopping = async {
                match shutdown.as_mut() {
                    Some(rx) => shoal_manager::stopped(rx).await,
                    None => std::future::pending().await,
                }
            };
            let until_deadline = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            let next = tokio::select! {
                r = live.recv() => r,
                _ = until_deadline => return None,
                _ = stopping => return None,
            };
            match next {
                Ok(e) if filters.include(&e) => return Some((Ok(line(&e)), (filters, live, shutdown))),
                Ok(_) => continue,
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::info!(
                        missed = n,
                        "an /events client fell behind and was disconnected; it may ask again with since"
                    );
                    return None;
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_as_docker_sends_them() {
        assert_eq!(parse_time("since", "1700000000").unwrap(), 1_700_000_000_000_000_000);
        assert_eq!(parse_time("since", "1700000000.5").unwrap(), 1_700_000_000_500_000_000);
        assert_eq!(parse_time("since", "1700000000.000000001").unwrap(), 1_700_000_000_000_000_001);
        for bad in ["5m", "1.2.3", "1.0000000001", "x", "1.-1"] {
            assert!(parse_time("since", bad).is_err(), "{bad}");
        }
    }

    fn ev(kind: &str, action: &str, id: &str, name: &str) -> EventJson {
        EventJson {
            kind: kind.into(),
            action: action.into(),
            actor: ActorJson { id: id.into(), attributes: BTreeMap::from([("name".into(), name.into())]) },
            scope: "swarm".into(),
            time: 1,
            time_nano: 1_000_000_000,
        }
    }

    #[test]
    fn kept_events_are_in_time_order_when_writes_commit_out_of_it() {
        let at = |t: i64| Arc::new(EventJson { time_nano: t, ..ev("service", "update", "s", "web") });
        let mut kept = VecDeque::new();
        for t in [391, 391, 375, 413, 100, 439] {
            keep(&mut kept, at(t));
        }
        let times: Vec<i64> = kept.iter().map(|e| e.time_nano).collect();
        assert_eq!(times, [100, 375, 391, 391, 413, 439]);
        for t in 0..KEPT_EVENTS as i64 {
            keep(&mut kept, at(1000 + t));
        }
        assert_eq!(kept.len(), KEPT_EVENTS);
        assert_eq!(kept.front().map(|e| e.time_nano), Some(1000), "the oldest go first");
    }

    #[test]
    fn filters_follow_mobys_rules() {
        let f = |raw: &str| EventFilters { f: crate::filters::parse(Some(raw), EVENT_FILTERS).unwrap() };
        let web = ev("service", "update", "abc123", "web");
        let node = ev("node", "update", "n1", "box");
        assert!(f(r#"{"type":{"service":true}}"#).include(&web));
        assert!(!f(r#"{"type":{"service":true}}"#).include(&node));
        assert!(f(r#"{"service":{"we":true}}"#).include(&web));
        assert!(f(r#"{"service":{"abc":true}}"#).include(&web));
        assert!(!f(r#"{"service":{"web":true}}"#).include(&node));
        assert!(!f(r#"{"container":{"x":true}}"#).include(&web));
        assert!(f(r#"{"event":{"update":true},"scope":{"swarm":true}}"#).include(&web));
        assert!(!f(r#"{"scope":{"local":true}}"#).include(&web));
        assert!(f(r#"{"label":{"name=web":true}}"#).include(&web));
        assert!(crate::filters::parse(Some(r#"{"bogus":{"x":true}}"#), EVENT_FILTERS).is_err());
    }

    #[test]
    fn a_scale_reports_the_old_and_new_replicas_as_dockerd_does() {
        use shoal_api::*;
        let svc = |replicas: u64, image: &str| Service {
            id: "s1".into(),
            spec: Some(ServiceSpec {
                annotations: Some(Annotations { name: "web".into(), ..Default::default() }),
                task: Some(TaskSpec {
                    runtime: Some(task_spec::Runtime::Container(ContainerSpec {
                        image: image.into(),
                        ..Default::default()
                    })),
                    ..Default::default()
                }),
                mode: Some(service_spec::Mode::Replicated(ReplicatedService { replicas })),
                ..Default::default()
            }),
            meta: Some(Meta {
                updated_at: Some(prost_types::Timestamp { seconds: 1_700_000_000, nanos: 5 }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = watch_message::Event {
            action: WatchActionKind::WatchActionUpdate as i32,
            object: Some(Object { object: Some(object::Object::Service(svc(5, "busybox:2"))) }),
            old_object: Some(Object { object: Some(object::Object::Service(svc(3, "busybox"))) }),
        };
        let j = event_json(&e).unwrap();
        let text = serde_json::to_string(&j).unwrap();
        assert_eq!(
            text,
            r#"{"Type":"service","Action":"update","Actor":{"ID":"s1","Attributes":{"image.new":"busybox:2","image.old":"busybox","name":"web","replicas.new":"5","replicas.old":"3"}},"scope":"swarm","time":1700000000,"timeNano":1700000000000000005}"#
        );
    }
}
