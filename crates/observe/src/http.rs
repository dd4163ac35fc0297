//! The routes of `--listen-metrics`, all read-only (GET and HEAD): `/metrics` (Prometheus scrape), `/` (the
//! live page, also `/ui`; its script and style are embedded in the binary), `/live` (the page's
//! Server-Sent Events: `snapshot` first, then `delta` per commit, `snapshot` again after a lag). The
//! listener and its connection bounds are the node's; this module only answers requests.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures::Stream;
use tokio::sync::broadcast::error::RecvError;

use crate::live::{LiveEvent, LiveHub, Refused, SubscriberSlot, MAX_SUBSCRIBERS};
use crate::metrics::{Metrics, CONTENT_TYPE};

const INDEX_HTML: &str = include_str!("page/index.html");
const APP_JS: &str = include_str!("page/app.js");
const STYLE_CSS: &str = include_str!("page/style.css");

/// How often an idle event stream sends a comment, so proxies and the browser keep it open.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// What the routes serve.
#[derive(Debug, Clone)]
pub struct Observed {
    /// The node's metrics.
    pub metrics: Arc<Metrics>,
    /// The live feed (managers only: a worker has no store to show).
    pub live: Option<Arc<LiveHub>>,
}

/// The router of `--listen-metrics`.
pub fn router(observed: Observed) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/", get(page))
        .route("/ui", get(page))
        .route("/app.js", get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }))
        .route("/style.css", get(|| async { asset("text/css; charset=utf-8", STYLE_CSS) }))
        .route("/live", get(live))
        .fallback(|| async {
            plain(StatusCode::NOT_FOUND, "not found: this listener serves /metrics, / (the live page) and /live".into())
        })
        .with_state(observed)
}

fn plain(status: StatusCode, text: String) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text + "\n").into_response()
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache")], body).into_response()
}

async fn metrics(State(o): State<Observed>) -> Response {
    // Encoding reads the store under its read lock for O(nodes + task states): short.
    let text = o.metrics.encode();
    ([(header::CONTENT_TYPE, CONTENT_TYPE), (header::CACHE_CONTROL, "no-store")], text).into_response()
}

async fn page() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

/// A subscriber's stream: the snapshot, then the deltas after it; a fresh snapshot when it lagged.
struct Subscription {
    _slot: SubscriberSlot,
    hub: Arc<LiveHub>,
    rx: tokio::sync::broadcast::Receiver<LiveEvent>,
    /// The index the page is at: deltas up to it are already in what it has.
    index: u64,
    first: Option<Event>,
}

fn snapshot_event(snap: &crate::live::Snapshot) -> (u64, Event) {
    let json = serde_json::to_string(snap).unwrap_or_else(|_| "{}".into());
    (snap.index, Event::default().event("snapshot").data(json))
}

fn events(sub: Subscription) -> impl Stream<Item = Result<Event, Infallible>> {
    futures::stream::unfold(sub, |mut sub| async move {
        if let Some(first) = sub.first.take() {
            return Some((Ok(first), sub));
        }
        loop {
            match sub.rx.recv().await {
                Ok(LiveEvent::Delta { index, json }) => {
                    if index <= sub.index {
                        continue;
                    }
                    sub.index = index;
                    return Some((Ok(Event::default().event("delta").data(&*json)), sub));
                }
                Ok(LiveEvent::Resync) | Err(RecvError::Lagged(_)) => {
                    let snap = sub.hub.snapshot();
                    let (index, event) = snapshot_event(&snap);
                    sub.index = index;
                    return Some((Ok(event), sub));
                }
                Err(RecvError::Closed) => return None,
            }
        }
    })
}

async fn live(State(o): State<Observed>) -> Response {
    let Some(hub) = o.live else {
        return plain(
            StatusCode::NOT_FOUND,
            "this node is a worker: the live page is served by the managers' --listen-metrics".into(),
        );
    };
    match hub.subscribe() {
        Ok((slot, rx, snap)) => {
            let (index, first) = snapshot_event(&snap);
            let sub = Subscription { _slot: slot, hub, rx, index, first: Some(first) };
            let mut resp = Sse::new(events(sub)).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)).into_response();
            resp.headers_mut().insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-store"));
            resp
        }
        Err(Refused::Full) => plain(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("too many live pages open on this node (the limit is {MAX_SUBSCRIBERS}): close some and retry"),
        ),
        Err(Refused::Stopping) => plain(StatusCode::SERVICE_UNAVAILABLE, "this node is stopping".into()),
    }
}
