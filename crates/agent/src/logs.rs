//! The agent's side of SwarmKit's log broker: listen for the manager's log subscriptions
//! (`LogBroker.ListenSubscriptions`), and for each one publish the matching lines of this node's tasks
//! (`LogBroker.PublishLogs`), read through the executor. A subscription without `follow` ends with a
//! `close` message once every matching task's output is sent; a followed one also picks up tasks assigned
//! later (a task whose output cannot be read yet is retried every `OPEN_RETRY`) and runs until the manager
//! closes it.
//!
//! Bounds: at most `MAX_SUBSCRIPTIONS` subscriptions run at once (more are refused with a close); at most
//! `PUBLISH_BATCH` lines per message and `PUBLISH_QUEUE` messages wait for the manager; a failed listen
//! is retried every `LISTEN_RETRY` for as long as the session lasts. Must not depend on the store.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::stream::{SelectAll, StreamExt};
use shoal_api::log_broker_client::LogBrokerClient;
use shoal_api::{
    ListenSubscriptionsRequest, LogContext, LogMessage, LogSelector, LogStream as WireStream, LogSubscriptionOptions,
    PublishLogsMessage, SubscriptionMessage, Task,
};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use crate::exec::{Executor, LogOptions};
use crate::session::NODE_ID_METADATA_KEY;
use crate::worker::AssignedTasks;

/// Most log subscriptions served at once.
pub const MAX_SUBSCRIPTIONS: usize = 64;
/// Most lines in one published message.
pub const PUBLISH_BATCH: usize = 128;
/// Published messages waiting for the manager.
pub const PUBLISH_QUEUE: usize = 16;
/// Pause before listening again after the subscription stream failed.
pub const LISTEN_RETRY: Duration = Duration::from_secs(1);
/// How often a followed subscription retries tasks whose output could not be opened yet.
pub const OPEN_RETRY: Duration = Duration::from_millis(500);

fn request<T>(node_id: &str, msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    if let Ok(v) = node_id.parse() {
        r.metadata_mut().insert(NODE_ID_METADATA_KEY, v);
    }
    r
}

/// True when `task` (on node `node_id`) is selected.
pub fn selects(sel: &LogSelector, node_id: &str, task: &Task) -> bool {
    sel.task_ids.contains(&task.id)
        || sel.service_ids.contains(&task.service_id)
        || sel.node_ids.iter().any(|n| n == node_id)
}

/// The executor's reading options for the wire options (SwarmKit's tail: 0 = all, -n-1 = the last n).
pub fn log_options(o: &LogSubscriptionOptions) -> LogOptions {
    let wants = |s: WireStream| o.streams.is_empty() || o.streams.contains(&(s as i32));
    LogOptions {
        follow: o.follow,
        tail: (o.tail < 0).then(|| (-(o.tail + 1)) as usize),
        since: o.since.as_ref().map(|t| {
            SystemTime::UNIX_EPOCH + Duration::new(t.seconds.max(0) as u64, t.nanos.clamp(0, 999_999_999) as u32)
        }),
        stdout: wants(WireStream::Stdout),
        stderr: wants(WireStream::Stderr),
    }
}

/// Listens for subscriptions on `channel` until aborted (the session owns this task).
pub async fn run_listener(
    channel: Channel,
    node_id: String,
    tasks: watch::Receiver<AssignedTasks>,
    executor: Arc<dyn Executor>,
) {
    let mut client = LogBrokerClient::new(channel);
    let mut running = Running(HashMap::new());
    let running = &mut running.0;
    loop {
        let stream = client.listen_subscriptions(request(&node_id, ListenSubscriptionsRequest {})).await;
        let mut stream = match stream {
            Ok(s) => s.into_inner(),
            Err(status) => {
                tracing::debug!(node = %node_id, "cannot listen for log subscriptions: {}", status.message());
                tokio::time::sleep(LISTEN_RETRY).await;
                continue;
            }
        };
        while let Ok(Some(sub)) = stream.message().await {
            running.retain(|_, h| !h.is_finished());
            if sub.close {
                if let Some(h) = running.remove(&sub.id) {
                    h.abort();
                }
                continue;
            }
            if running.contains_key(&sub.id) {
                continue;
            }
            let publisher = Publisher {
                client: client.clone(),
                node_id: node_id.clone(),
                tasks: tasks.clone(),
                executor: executor.clone(),
            };
            if running.len() >= MAX_SUBSCRIPTIONS {
                tracing::warn!(node = %node_id, subscription = %sub.id, "too many log subscriptions: refusing one");
                tokio::spawn(publisher.refuse(sub.id));
                continue;
            }
            running.insert(sub.id.clone(), tokio::spawn(publisher.run(sub)));
        }
        tokio::time::sleep(LISTEN_RETRY).await;
    }
}

/// Aborts the publishers when the listener ends (the session ended).
struct Running(HashMap<String, JoinHandle<()>>);

impl Drop for Running {
    fn drop(&mut self) {
        for h in self.0.values() {
            h.abort();
        }
    }
}

/// Publishes one subscription's lines.
struct Publisher {
    client: LogBrokerClient<Channel>,
    node_id: String,
    tasks: watch::Receiver<AssignedTasks>,
    executor: Arc<dyn Executor>,
}

impl Publisher {
    async fn refuse(mut self, id: String) {
        let msg = PublishLogsMessage { subscription_id: id, messages: vec![], close: true };
        let _ = self.client.publish_logs(request(&self.node_id, futures::stream::iter([msg]))).await;
    }

    /// Publishes the subscription's lines until done (or the manager stops taking them).
    async fn run(mut self, sub: SubscriptionMessage) {
        let sel = sub.selector.clone().unwrap_or_default();
        let opts = log_options(&sub.options.clone().unwrap_or_default());
        let (tx, rx) = mpsc::channel::<PublishLogsMessage>(PUBLISH_QUEUE);
        let mut call = {
            let mut client = self.client.clone();
            let req = request(&self.node_id, tokio_stream::wrappers::ReceiverStream::new(rx));
            tokio::spawn(async move { client.publish_logs(req).await })
        };
        let mut lines = SelectAll::new();
        let mut opened: HashSet<String> = HashSet::new();
        let mut delivered: HashSet<String> = HashSet::new();
        let mut retry_later: HashSet<String> = HashSet::new();
        let mut retry = tokio::time::interval(OPEN_RETRY);
        let send = |messages: Vec<LogMessage>, close: bool| PublishLogsMessage {
            subscription_id: sub.id.clone(),
            messages,
            close,
        };
        loop {
            // Open the output of every selected task not opened yet.
            let tasks = self.tasks.borrow_and_update().clone();
            for task in tasks.values().filter(|t| selects(&sel, &self.node_id, t)) {
                if opened.contains(&task.id) {
                    continue;
                }
                if let Ok(stream) = self.executor.logs(task, &opts) {
                    opened.insert(task.id.clone());
                    let ctx = LogContext {
                        service_id: task.service_id.clone(),
                        node_id: self.node_id.clone(),
                        task_id: task.id.clone(),
                    };
                    // `None` marks the end of this task's stream.
                    let items = stream.map(Some).chain(futures::stream::once(async { None }));
                    lines.push(items.map(move |r| (ctx.clone(), r)).boxed());
                }
            }
            if !opts.follow {
                break;
            }
            tokio::select! {
                batch = lines.next(), if !lines.is_empty() => {
                    let Some(first) = batch else { continue };
                    let mut items = vec![first];
                    while items.len() < PUBLISH_BATCH {
                        match futures::FutureExt::now_or_never(lines.next()) {
                            Some(Some(next)) => items.push(next),
                            _ => break,
                        }
                    }
                    let mut messages = vec![];
                    for (ctx, item) in items {
                        let nothing_yet = !delivered.contains(&ctx.task_id);
                        match item {
                            Some(Ok(line)) => {
                                delivered.insert(ctx.task_id.clone());
                                push_line(&mut messages, (ctx, Ok(line)));
                            }
                            // Nothing read yet (its container may not exist or run yet): open it again later.
                            Some(Err(e)) => {
                                if nothing_yet {
                                    retry_later.insert(ctx.task_id.clone());
                                }
                                push_line(&mut messages, (ctx, Err(e)));
                            }
                            None => {
                                if nothing_yet {
                                    retry_later.insert(ctx.task_id);
                                }
                            }
                        }
                    }
                    if !messages.is_empty() && tx.send(send(messages, false)).await.is_err() {
                        return;
                    }
                }
                r = self.tasks.changed() => if r.is_err() { return },
                _ = retry.tick() => {
                    for id in retry_later.drain() {
                        opened.remove(&id);
                    }
                }
                _ = &mut call => return,
            }
        }
        // Without follow: send everything the opened streams hold, then close.
        let mut chunks = lines.ready_chunks(PUBLISH_BATCH);
        while let Some(chunk) = chunks.next().await {
            let mut messages = vec![];
            for (ctx, item) in chunk {
                if let Some(line) = item {
                    push_line(&mut messages, (ctx, line));
                }
            }
            if !messages.is_empty() && tx.send(send(messages, false)).await.is_err() {
                return;
            }
        }
        let _ = tx.send(send(vec![], true)).await;
        drop(tx);
        if let Ok(Err(status)) = call.await {
            tracing::debug!(subscription = %sub.id, "publishing logs ended: {}", status.message());
        }
    }
}

fn push_line(
    out: &mut Vec<LogMessage>,
    (ctx, line): (LogContext, Result<crate::exec::LogLine, crate::exec::ExecutorError>),
) {
    match line {
        Ok(l) => out.push(LogMessage {
            context: Some(ctx),
            timestamp: Some(shoal_api::timestamp_from_system_time(l.timestamp)),
            stream: if l.stderr { WireStream::Stderr } else { WireStream::Stdout } as i32,
            data: l.data,
            attrs: vec![],
        }),
        Err(e) => tracing::debug!(task = %ctx.task_id, "reading the task's logs failed: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_options_map_to_reading_options() {
        let o = log_options(&LogSubscriptionOptions { tail: -11, follow: true, ..Default::default() });
        assert_eq!((o.tail, o.follow, o.stdout, o.stderr), (Some(10), true, true, true));
        let o = log_options(&LogSubscriptionOptions {
            tail: 0,
            streams: vec![WireStream::Stderr as i32],
            ..Default::default()
        });
        assert_eq!((o.tail, o.stdout, o.stderr), (None, false, true));
        let t = Task { id: "t".into(), service_id: "s".into(), ..Default::default() };
        assert!(selects(&LogSelector { service_ids: vec!["s".into()], ..Default::default() }, "n", &t));
        assert!(selects(&LogSelector { node_ids: vec!["n".into()], ..Default::default() }, "n", &t));
        assert!(!selects(&LogSelector { task_ids: vec!["u".into()], ..Default::default() }, "n", &t));
    }
}
