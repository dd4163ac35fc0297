//! The `--listen-metrics` routes, driven as a client would (GET requests through the router).

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use shoal_observe::{router, LiveHub, Metrics, Observed, Recorders, Sources};
use shoal_store::MemoryStore;
use tower::ServiceExt;

fn manager_with_store() -> (axum::Router, Arc<LiveHub>, Arc<MemoryStore>) {
    let store = Arc::new(MemoryStore::default());
    let sources = Sources { node_id: "m1".into(), store: Some(store.clone()), ..Default::default() };
    let hub = LiveHub::new(store.clone());
    (
        router(Observed { metrics: Arc::new(Metrics::new(sources, Recorders::new())), live: Some(hub.clone()) }),
        hub,
        store,
    )
}

fn manager() -> (axum::Router, Arc<LiveHub>) {
    let (r, hub, _) = manager_with_store();
    (r, hub)
}

async fn get(r: &axum::Router, method: &str, path: &str) -> axum::response::Response {
    r.clone().oneshot(Request::builder().method(method).uri(path).body(Body::empty()).unwrap()).await.unwrap()
}

async fn text(resp: axum::response::Response) -> String {
    String::from_utf8(resp.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
}

#[tokio::test]
async fn metrics_page_and_assets_are_served_and_writes_refused() {
    let (r, _) = manager();
    let m = get(&r, "GET", "/metrics").await;
    assert_eq!(m.status(), StatusCode::OK);
    assert!(m.headers()["content-type"].to_str().unwrap().starts_with("application/openmetrics-text"));
    assert!(text(m).await.contains("swarm_manager_tasks_total{state=\"running\"} 0"));
    for (path, kind) in
        [("/", "text/html"), ("/ui", "text/html"), ("/app.js", "text/javascript"), ("/style.css", "text/css")]
    {
        let resp = get(&r, "GET", path).await;
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        assert!(resp.headers()["content-type"].to_str().unwrap().starts_with(kind), "{path}");
    }
    assert!(text(get(&r, "GET", "/").await).await.contains("<script src=\"app.js\">"));
    assert_eq!(get(&r, "POST", "/metrics").await.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(get(&r, "DELETE", "/live").await.status(), StatusCode::METHOD_NOT_ALLOWED);
    let missing = get(&r, "GET", "/nope").await;
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    assert!(text(missing).await.contains("/metrics"));
}

#[tokio::test]
async fn live_starts_with_a_snapshot_and_is_capped() {
    let (r, hub) = manager();
    let resp = get(&r, "GET", "/live").await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.into_body();
    let frame = body.frame().await.unwrap().unwrap().into_data().unwrap();
    let first = String::from_utf8(frame.to_vec()).unwrap();
    assert!(first.starts_with("event: snapshot\ndata: {\"index\":0,"), "{first}");
    assert_eq!(hub.subscribers(), 1);
    let mut open = vec![body];
    for _ in 1..shoal_observe::live::MAX_SUBSCRIBERS {
        open.push(get(&r, "GET", "/live").await.into_body());
    }
    let refused = get(&r, "GET", "/live").await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(text(refused).await.contains("the limit is 64"));
    drop(open);
    assert_eq!(hub.subscribers(), 0, "closed pages give their places back");
}

#[tokio::test]
async fn a_worker_has_metrics_but_no_live_feed() {
    let metrics = Arc::new(Metrics::new(Sources { node_id: "w1".into(), ..Default::default() }, Recorders::new()));
    let r = router(Observed { metrics, live: None });
    assert_eq!(get(&r, "GET", "/metrics").await.status(), StatusCode::OK);
    let live = get(&r, "GET", "/live").await;
    assert_eq!(live.status(), StatusCode::NOT_FOUND);
    assert!(text(live).await.contains("worker"));
}

#[tokio::test]
async fn a_page_that_falls_behind_gets_a_fresh_snapshot() {
    use shoal_api::{Task, TaskStatus};
    let (r, hub, writer) = manager_with_store();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let run = tokio::spawn(hub.clone().run(Recorders::new(), stop));
    let mut body = get(&r, "GET", "/live").await.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert!(first.starts_with(b"event: snapshot\n"));
    // More commits than the queue holds, while the page reads nothing.
    let commits = shoal_observe::live::DELTA_QUEUE as u64 + 50;
    for i in 1..=commits {
        let mut c = shoal_store::Changes::new();
        let status = TaskStatus { state: shoal_api::TaskState::Pending as i32, ..Default::default() };
        c.create(Task {
            id: format!("t{i}"),
            desired_state: shoal_api::TaskState::Running as i32,
            status: Some(status),
            ..Default::default()
        });
        writer.apply(i, c.actions()).unwrap();
    }
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while hub.handled_index() < commits {
        assert!(tokio::time::Instant::now() < deadline, "the feed handled {} of {commits}", hub.handled_index());
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let next = body.frame().await.unwrap().unwrap().into_data().unwrap();
    let next = String::from_utf8(next.to_vec()).unwrap();
    assert!(
        next.starts_with(&format!("event: snapshot\ndata: {{\"index\":{commits},")),
        "a resync, not stale deltas: {}",
        &next[..80]
    );
    stop_tx.send(true).unwrap();
    run.await.unwrap();
    assert!(body.frame().await.is_none(), "the stream ends when the feed stops");
}
