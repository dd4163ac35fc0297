//! `GET /services/{id}/logs` and `GET /tasks/{id}/logs`: a log broker subscription streamed in Docker's
//! log format. Each line is `[<RFC 3339 time> ][<details> ]<data>\n`, where details are
//! `com.docker.swarm.node.id=..,com.docker.swarm.service.id=..,com.docker.swarm.task.id=..` (the docker
//! CLI needs them to name the task); without a TTY every line is a multiplexed frame (8-byte header:
//! stream 1 or 2, three zero bytes, big-endian length).
//!
//! Query: `stdout`, `stderr`, `follow`, `timestamps`, `details`, `tail` (`all` or N), `since` (Unix time,
//! `seconds[.nanoseconds]`). Agents keep their session, and so their log listener, with the leader: the
//! leader answers from its own broker; another manager relays the leader's stream through `LeaderLogs`
//! (the node wires it to the leader's `Logs.SubscribeLogs`). Must not depend on Raft or the executors.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::StreamExt;
use shoal_api::{task_spec, LogMessage, LogSelector, LogStream, LogSubscriptionOptions, TaskSpec};
use shoal_manager::controlapi;
use time::OffsetDateTime;

use crate::error::ApiError;
use crate::ApiContext;

type Ctx = State<Arc<ApiContext>>;
type Params = Query<HashMap<String, String>>;

/// Batches of log lines relayed from the leader.
pub type LogBatches = BoxStream<'static, Vec<LogMessage>>;

/// How a manager that does not lead reads logs: a subscription at the leader (the node implements it over
/// the leader's `Logs.SubscribeLogs`).
pub trait LeaderLogs: Send + Sync + std::fmt::Debug {
    /// Subscribes at the current leader. The stream ends when the subscription does (without follow),
    /// when the leader changes, or when the connection to the leader fails. The error says why the leader
    /// could not be asked.
    fn subscribe(
        &self,
        selector: LogSelector,
        options: LogSubscriptionOptions,
    ) -> BoxFuture<'static, Result<LogBatches, String>>;
}

/// How the response writes each line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LineFormat {
    /// Prefix the time.
    pub timestamps: bool,
    /// Prefix the swarm details.
    pub details: bool,
    /// Raw lines (TTY) instead of multiplexed frames.
    pub tty: bool,
}

use crate::request::bool_param as flag;

/// The subscription options and line format for the query.
pub fn parse_query(q: &HashMap<String, String>, tty: bool) -> Result<(LogSubscriptionOptions, LineFormat), ApiError> {
    let (stdout, stderr) = (flag(q, "stdout"), flag(q, "stderr"));
    if !stdout && !stderr {
        return Err(ApiError::BadRequest("choose at least one stream: pass stdout=1 and/or stderr=1".into()));
    }
    let mut streams = vec![];
    if stdout {
        streams.push(LogStream::Stdout as i32);
    }
    if stderr {
        streams.push(LogStream::Stderr as i32);
    }
    let tail = match q.get("tail").map(String::as_str) {
        None | Some("") | Some("all") => 0,
        Some(n) => {
            let n: i64 = n.parse().map_err(|_| {
                ApiError::BadRequest(format!("invalid tail {n:?}: expected \"all\" or a number of lines"))
            })?;
            if n < 0 {
                0
            } else {
                // Saturating: tail=9223372036854775807 overflowed here (found by shoal-fuzz).
                -n.saturating_add(1)
            }
        }
    };
    let since = match q.get("since").map(String::as_str) {
        None | Some("") | Some("0") => None,
        Some(s) => Some(parse_since(s)?),
    };
    let opts = LogSubscriptionOptions { streams, follow: flag(q, "follow"), tail, since };
    Ok((opts, LineFormat { timestamps: flag(q, "timestamps"), details: flag(q, "details"), tty }))
}

fn parse_since(s: &str) -> Result<shoal_api::prost_types::Timestamp, ApiError> {
    let bad = || ApiError::BadRequest(format!("invalid since {s:?}: expected a Unix time such as 1700000000.5"));
    let (secs, frac) = s.split_once('.').unwrap_or((s, ""));
    let seconds: i64 = secs.parse().map_err(|_| bad())?;
    let nanos: i32 = if frac.is_empty() {
        0
    } else if frac.len() <= 9 && frac.bytes().all(|b| b.is_ascii_digit()) {
        format!("{frac:0<9}").parse().map_err(|_| bad())?
    } else {
        return Err(bad());
    };
    Ok(shoal_api::prost_types::Timestamp { seconds, nanos })
}

/// Go's RFC3339Nano with all nine digits, as Docker prints log times.
fn log_time(ts: Option<&shoal_api::prost_types::Timestamp>) -> String {
    let ts = ts.cloned().unwrap_or_default();
    let nanos = ts.seconds as i128 * 1_000_000_000 + ts.nanos as i128;
    let t = OffsetDateTime::from_unix_timestamp_nanos(nanos).unwrap_or(OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:09}Z",
        t.year(),
        t.month() as u8,
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.nanosecond()
    )
}

/// Query-escapes a details value as Go's url.QueryEscape does (the CLI unescapes it).
fn escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            b' ' => "+".to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One log message in the response format.
pub fn encode(m: &LogMessage, f: LineFormat) -> Vec<u8> {
    let mut line = Vec::with_capacity(m.data.len() + 128);
    if f.timestamps {
        line.extend(log_time(m.timestamp.as_ref()).into_bytes());
        line.push(b' ');
    }
    if f.details {
        let c = m.context.clone().unwrap_or_default();
        let mut pairs: Vec<(String, String)> = m.attrs.iter().map(|a| (a.key.clone(), a.value.clone())).collect();
        pairs.push(("com.docker.swarm.node.id".into(), c.node_id));
        pairs.push(("com.docker.swarm.service.id".into(), c.service_id));
        pairs.push(("com.docker.swarm.task.id".into(), c.task_id));
        pairs.sort();
        let details: Vec<String> = pairs.iter().map(|(k, v)| format!("{}={}", escape(k), escape(v))).collect();
        line.extend(details.join(",").into_bytes());
        line.push(b' ');
    }
    line.extend_from_slice(&m.data);
    if line.last() != Some(&b'\n') {
        line.push(b'\n');
    }
    if f.tty {
        return line;
    }
    let stream = if m.stream == LogStream::Stderr as i32 { 2u8 } else { 1u8 };
    let mut frame = Vec::with_capacity(line.len() + 8);
    frame.extend([stream, 0, 0, 0]);
    // A line is one log message's data, which came in one gRPC message: far under 4 GiB.
    frame.extend(u32::try_from(line.len()).expect("a log line under 4 GiB").to_be_bytes());
    frame.extend(line);
    frame
}

fn tty_of(spec: Option<&TaskSpec>) -> bool {
    match spec.and_then(|s| s.runtime.as_ref()) {
        Some(task_spec::Runtime::Container(c)) => c.tty,
        _ => false,
    }
}

async fn stream_response(
    ctx: &ApiContext,
    selector: LogSelector,
    q: &HashMap<String, String>,
    tty: bool,
    v: crate::request::ApiVersion,
) -> Result<Response, ApiError> {
    let (opts, format) = parse_query(q, tty)?;
    let is_leader = ctx.state.proposer.leadership().borrow().is_leader;
    let batches: LogBatches = if is_leader {
        Box::pin(ctx.state.logs.subscribe(selector, opts))
    } else {
        // Agents publish their logs to the leader's broker (they keep their session with the leader).
        let Some(leader) = &ctx.leader_logs else {
            return Err(ApiError::Unavailable(
                "logs are served by the leader manager: run the command against the leader (docker node ls marks it)"
                    .into(),
            ));
        };
        leader.subscribe(selector, opts).await.map_err(|e| {
            ApiError::Unavailable(format!(
                "cannot read the logs from the leader manager: {e}; retry, or run the command against the leader"
            ))
        })?
    };
    let store = ctx.state.store.clone();
    let body = batches.map(move |batch| {
        let mut out = Vec::new();
        // A line is shown only as the task's own: the broker lets a node publish lines naming itself, and
        // here the task must be that node's, of that service (a worker cannot pass its lines off as another
        // node's task).
        store.view(|t| {
            for m in batch.iter().filter(|m| published_by_its_task_node(t, m)) {
                out.extend(encode(m, format));
            }
        });
        Ok::<Bytes, std::convert::Infallible>(Bytes::from(out))
    });
    let content_type = crate::versions::log_stream_content_type(v, tty);
    let mut resp = (StatusCode::OK, Body::from_stream(body)).into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    Ok(resp)
}

/// Why the engine cannot read back the output of containers logging through `driver` (Docker's message first),
/// if it cannot: `none` keeps nothing, and a driver other than the engine's readable ones (json-file, local,
/// journald) with its dual-logging cache turned off (`cache-disabled=true`) keeps nothing on the node.
pub fn unreadable_log_driver(driver: Option<&shoal_api::Driver>) -> Option<String> {
    let d = driver.filter(|d| !d.name.is_empty())?;
    let readable = matches!(d.name.as_str(), "json-file" | "local" | "journald");
    let cache_off = d.options.get("cache-disabled").is_some_and(|v| v == "true");
    if d.name == "none" {
        Some(
            "configured logging driver does not support reading: the tasks log through the \"none\" driver, which \
              keeps nothing; use json-file, local or journald (--log-driver) to read them back"
                .into(),
        )
    } else if !readable && cache_off {
        Some(format!(
            "configured logging driver does not support reading: the tasks log through {:?} with the engine's \
             local cache turned off (cache-disabled=true); read them where that driver sends them, or drop the option",
            d.name
        ))
    } else {
        None
    }
}

/// True when the line's context names a task of the store that is on the context's node and of its service.
fn published_by_its_task_node(t: &shoal_store::Tables, m: &LogMessage) -> bool {
    let Some(c) = m.context.as_ref() else { return false };
    t.tasks().get(&c.task_id).is_some_and(|task| task.node_id == c.node_id && task.service_id == c.service_id)
}

/// `GET /services/{id}/logs`.
pub async fn service_logs(
    State(ctx): Ctx,
    v: crate::request::ApiVersion,
    Path(id): Path<String>,
    Query(q): Params,
) -> Result<Response, ApiError> {
    crate::handlers::read_barrier(&ctx).await?;
    let s = controlapi::get_service(&ctx.state, &id)?;
    let task = s.spec.as_ref().and_then(|s| s.task.as_ref());
    // The driver its tasks are given: the spec's, else the cluster's default (as the orchestrator does).
    let driver = match task.and_then(|t| t.log_driver.clone()) {
        Some(d) => Some(d),
        None => controlapi::get_cluster(&ctx.state)
            .ok()
            .and_then(|c| c.spec.as_ref()?.task_defaults.as_ref()?.log_driver.clone()),
    };
    if let Some(why) = unreadable_log_driver(driver.as_ref()) {
        return Err(ApiError::NotImplemented(why));
    }
    let tty = tty_of(task);
    stream_response(&ctx, LogSelector { service_ids: vec![s.id.clone()], ..Default::default() }, &q, tty, v).await
}

/// `GET /tasks/{id}/logs`.
pub async fn task_logs(
    State(ctx): Ctx,
    v: crate::request::ApiVersion,
    Path(id): Path<String>,
    Query(q): Params,
) -> Result<Response, ApiError> {
    crate::handlers::read_barrier(&ctx).await?;
    let t = controlapi::get_task(&ctx.state, &id)?;
    if let Some(why) = unreadable_log_driver(t.log_driver.as_deref()) {
        return Err(ApiError::NotImplemented(why));
    }
    let tty = tty_of(t.spec.as_deref());
    stream_response(&ctx, LogSelector { task_ids: vec![t.id.clone()], ..Default::default() }, &q, tty, v).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn the_query_maps_to_swarmkit_options() {
        let (o, f) = parse_query(
            &q(&[
                ("stdout", "1"),
                ("stderr", "1"),
                ("tail", "10"),
                ("follow", "1"),
                ("since", "1700000000.5"),
                ("timestamps", "1"),
            ]),
            false,
        )
        .unwrap();
        assert_eq!((o.tail, o.follow, o.streams.len()), (-11, true, 2));
        assert_eq!(o.since, Some(shoal_api::prost_types::Timestamp { seconds: 1_700_000_000, nanos: 500_000_000 }));
        assert!(f.timestamps && !f.details && !f.tty);
        let (o, _) = parse_query(&q(&[("stdout", "true"), ("tail", "all")]), false).unwrap();
        assert_eq!((o.tail, o.streams), (0, vec![LogStream::Stdout as i32]));
        assert!(parse_query(&q(&[]), false).is_err(), "no stream chosen");
        assert!(parse_query(&q(&[("stdout", "1"), ("tail", "x")]), false).is_err());
        assert!(parse_query(&q(&[("stdout", "1"), ("since", "yesterday")]), false).is_err());
    }

    #[test]
    fn drivers_the_engine_cannot_read_back_are_named() {
        let d = |name: &str, opts: &[(&str, &str)]| shoal_api::Driver {
            name: name.into(),
            options: opts.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        };
        for (driver, unreadable) in [
            (d("json-file", &[("max-size", "1m")]), false),
            (d("local", &[("cache-disabled", "true")]), false),
            (d("journald", &[]), false),
            (d("syslog", &[]), false),
            (d("", &[]), false),
            (d("none", &[]), true),
            (d("syslog", &[("cache-disabled", "true")]), true),
        ] {
            let why = unreadable_log_driver(Some(&driver));
            assert_eq!(why.is_some(), unreadable, "{driver:?}: {why:?}");
            if let Some(why) = why {
                assert!(why.starts_with("configured logging driver does not support reading"), "{why}");
            }
        }
        assert_eq!(unreadable_log_driver(None), None);
    }

    #[test]
    fn the_largest_tail_means_all_lines_without_overflow() {
        let (o, _) = parse_query(&q(&[("stdout", "1"), ("tail", "9223372036854775807")]), false).unwrap();
        assert_eq!(o.tail, -i64::MAX);
    }

    #[test]
    fn lines_are_framed_with_details_and_times_as_the_cli_expects() {
        let m = LogMessage {
            context: Some(shoal_api::LogContext { service_id: "s".into(), node_id: "n".into(), task_id: "t".into() }),
            timestamp: Some(shoal_api::prost_types::Timestamp { seconds: 1_700_000_000, nanos: 5 }),
            stream: LogStream::Stderr as i32,
            data: b"hello".to_vec(),
            attrs: vec![],
        };
        let f = encode(&m, LineFormat { timestamps: true, details: true, tty: false });
        let line = b"2023-11-14T22:13:20.000000005Z \
                     com.docker.swarm.node.id=n,com.docker.swarm.service.id=s,com.docker.swarm.task.id=t hello\n";
        assert_eq!(&f[..8], &[2, 0, 0, 0, 0, 0, 0, u8::try_from(line.len()).unwrap()]);
        assert_eq!(&f[8..], &line[..]);
        let raw = encode(&m, LineFormat { timestamps: false, details: false, tty: true });
        assert_eq!(raw, b"hello\n");
    }
}
