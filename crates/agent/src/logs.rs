//! The agent's side of SwarmKit's log broker: listen for the manager's log subscriptions
//! (`LogBroker.ListenSubscriptions`), and for each one publish the matching lines of this node's tasks
//! (`LogBroker.PublishLogs`), read through the executor. A subscription without `follow` ends with a
//! `close` message once every matching task's output is sent; a followed one also picks up tasks assigned
//! later (a task whose output cannot be read yet is retried every `OPEN_RETRY`) and runs until the manager
//! closes it.
//!
//! Bounds: at most `MAX_SUBSCRIPTIONS` subscriptions run at once (more are refused with a close); at most
//! `PUBLISH_BATCH` lines and `PUBLISH_BATCH_BYTES` bytes per message (a line longer than
//! `PUBLISH_LINE_BYTES` is sent in parts), and at most `PUBLISH_QUEUE` messages holding `PUBLISH_QUEUE_BYTES`
//! wait for the manager per subscription; a failed listen is retried every `LISTEN_RETRY` for as long as the
//! session lasts. Must not depend on the store.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::stream::{SelectAll, StreamExt};
use shoal_api::log_broker_client::LogBrokerClient;
use shoal_api::{
    ListenSubscriptionsRequest, LogContext, LogMessage, LogSelector, LogStream as WireStream, LogSubscriptionOptions,
    PublishLogsMessage, SubscriptionMessage, Task,
};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use crate::assigned::AssignedTasks;
use crate::exec::{Executor, LogOptions};
use crate::rpc::NODE_ID_METADATA_KEY;

/// Most log subscriptions served at once.
pub(crate) const MAX_SUBSCRIPTIONS: usize = 64;
/// Most lines in one published message.
pub(crate) const PUBLISH_BATCH: usize = 128;
/// Published messages waiting for the manager.
pub(crate) const PUBLISH_QUEUE: usize = 16;
/// Most bytes of line data in one published message (one line more than it at most, and no line is longer
/// than `PUBLISH_LINE_BYTES`), well within a gRPC message.
pub(crate) const PUBLISH_BATCH_BYTES: usize = 256 << 10;
/// Most bytes of line data in published messages waiting for the manager, per subscription.
pub(crate) const PUBLISH_QUEUE_BYTES: usize = 1 << 20;
/// Longest line data in one log message: a longer line is sent as consecutive parts of this size.
pub(crate) const PUBLISH_LINE_BYTES: usize = 64 << 10;
/// Pause before listening again after the subscription stream failed.
pub(crate) const LISTEN_RETRY: Duration = Duration::from_secs(1);
/// How often a followed subscription retries tasks whose output could not be opened yet.
pub(crate) const OPEN_RETRY: Duration = Duration::from_millis(500);

fn request<T>(node_id: &str, msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    if let Ok(v) = node_id.parse() {
        r.metadata_mut().insert(NODE_ID_METADATA_KEY, v);
    }
    r
}

/// True when `task` (on node `node_id`) is selected.
pub(crate) fn selects(sel: &LogSelector, node_id: &str, task: &Task) -> bool {
    sel.task_ids.contains(&task.id)
        || sel.service_ids.contains(&task.service_id)
        || sel.node_ids.iter().any(|n| n == node_id)
}

/// The executor's reading options for the wire options (SwarmKit's tail: 0 = all, -n-1 = the last n).
pub(crate) fn log_options(o: &LogSubscriptionOptions) -> LogOptions {
    let wants = |s: WireStream| o.streams.is_empty() || o.streams.contains(&(s as i32));
    LogOptions {
        follow: o.follow,
        tail: (o.tail < 0).then(|| usize::try_from(-(o.tail + 1)).unwrap_or(usize::MAX)),
        since: o.since.as_ref().map(|t| {
            SystemTime::UNIX_EPOCH + Duration::new(t.seconds.max(0) as u64, t.nanos.clamp(0, 999_999_999) as u32)
        }),
        stdout: wants(WireStream::Stdout),
        stderr: wants(WireStream::Stderr),
    }
}

/// Listens for subscriptions on `channel` until aborted (the session owns this task).
pub(crate) async fn run_listener(
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
        let (tx, rx) = mpsc::channel::<(PublishLogsMessage, OwnedSemaphorePermit)>(PUBLISH_QUEUE);
        // The bytes queued for the manager: a message holds its data's worth of permits until gRPC takes it.
        let queued_bytes = Arc::new(Semaphore::new(PUBLISH_QUEUE_BYTES));
        let mut call = {
            let mut client = self.client.clone();
            let messages = tokio_stream::wrappers::ReceiverStream::new(rx).map(|(m, _permit)| m);
            let req = request(&self.node_id, messages);
            tokio::spawn(async move { client.publish_logs(req).await })
        };
        let queue = |msg: PublishLogsMessage| {
            let (tx, queued_bytes) = (tx.clone(), queued_bytes.clone());
            async move {
                let bytes = msg.messages.iter().map(|m| m.data.len()).sum::<usize>().clamp(1, PUBLISH_QUEUE_BYTES);
                let bytes = u32::try_from(bytes).expect("clamped to PUBLISH_QUEUE_BYTES, 1 MiB");
                let permit = queued_bytes.acquire_many_owned(bytes).await.map_err(|_| ())?;
                tx.send((msg, permit)).await.map_err(|_| ())
            }
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
                    let items = ready_batch(first, &mut lines);
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
                    if !messages.is_empty() && queue(send(messages, false)).await.is_err() {
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
        while let Some(first) = lines.next().await {
            let mut messages = vec![];
            for (ctx, item) in ready_batch(first, &mut lines) {
                if let Some(line) = item {
                    push_line(&mut messages, (ctx, line));
                }
            }
            if !messages.is_empty() && queue(send(messages, false)).await.is_err() {
                return;
            }
        }
        let _ = queue(send(vec![], true)).await;
        drop(tx);
        if let Ok(Err(status)) = call.await {
            tracing::debug!(subscription = %sub.id, "publishing logs ended: {}", status.message());
        }
    }
}

/// One item of a subscription's merged streams: a task's line (or its reading error), `None` at its end.
type Item = (LogContext, Option<Result<crate::exec::LogLine, crate::exec::ExecutorError>>);

/// `first` and the items `lines` holds ready now, up to `PUBLISH_BATCH` items and `PUBLISH_BATCH_BYTES` bytes
/// of line data (the item that reaches the byte bound is the last one).
fn ready_batch<S>(first: Item, lines: &mut S) -> Vec<Item>
where
    S: futures::Stream<Item = Item> + Unpin,
{
    let size = |item: &Item| match &item.1 {
        Some(Ok(l)) => l.data.len(),
        _ => 0,
    };
    let mut bytes = size(&first);
    let mut items = vec![first];
    while items.len() < PUBLISH_BATCH && bytes < PUBLISH_BATCH_BYTES {
        match futures::FutureExt::now_or_never(lines.next()) {
            Some(Some(next)) => {
                bytes += size(&next);
                items.push(next);
            }
            _ => break,
        }
    }
    items
}

fn push_line(
    out: &mut Vec<LogMessage>,
    (ctx, line): (LogContext, Result<crate::exec::LogLine, crate::exec::ExecutorError>),
) {
    match line {
        Ok(l) => {
            let timestamp = Some(shoal_api::timestamp_from_system_time(l.timestamp));
            let stream = if l.stderr { WireStream::Stderr } else { WireStream::Stdout } as i32;
            let message =
                |data: Vec<u8>| LogMessage { context: Some(ctx.clone()), timestamp, stream, data, attrs: vec![] };
            if l.data.len() <= PUBLISH_LINE_BYTES {
                out.push(message(l.data));
            } else {
                out.extend(l.data.chunks(PUBLISH_LINE_BYTES).map(|part| message(part.to_vec())));
            }
        }
        Err(e) => tracing::debug!(task = %ctx.task_id, "reading the task's logs failed: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(bytes: usize) -> Item {
        let ctx = LogContext { task_id: "t".into(), ..Default::default() };
        let l = crate::exec::LogLine { timestamp: SystemTime::UNIX_EPOCH, stderr: false, data: vec![b'x'; bytes] };
        (ctx, Some(Ok(l)))
    }

    /// A batch stops at `PUBLISH_BATCH` lines or once it holds `PUBLISH_BATCH_BYTES`, whichever comes first;
    /// nothing is lost between batches.
    #[test]
    fn batches_are_bounded_in_lines_and_in_bytes() {
        let check = |line_bytes: usize, lines: usize, want_batches: &[usize]| {
            let mut stream = futures::stream::iter((0..lines).map(|_| line(line_bytes)));
            let mut got = vec![];
            while let Some(first) = futures::FutureExt::now_or_never(stream.next()).flatten() {
                let batch = ready_batch(first, &mut stream);
                let bytes: usize = batch.iter().map(|(_, l)| l.as_ref().unwrap().as_ref().unwrap().data.len()).sum();
                assert!(batch.len() <= PUBLISH_BATCH);
                assert!(
                    bytes < PUBLISH_BATCH_BYTES + line_bytes,
                    "{bytes} bytes in a batch of {line_bytes}-byte lines"
                );
                got.push(batch.len());
            }
            assert_eq!(got, want_batches, "lines of {line_bytes} bytes");
        };
        check(10, 300, &[128, 128, 44]);
        // 16 KiB lines: 16 make 256 KiB.
        check(16 << 10, 40, &[16, 16, 8]);
        check(1 << 20, 2, &[1, 1]);
    }

    /// A line longer than `PUBLISH_LINE_BYTES` is published as consecutive parts, each within the bound.
    #[test]
    fn long_lines_are_sent_in_parts() {
        let mut out = vec![];
        let (ctx, l) = line(PUBLISH_LINE_BYTES * 2 + 5);
        push_line(&mut out, (ctx, l.unwrap()));
        let sizes: Vec<usize> = out.iter().map(|m| m.data.len()).collect();
        assert_eq!(sizes, [PUBLISH_LINE_BYTES, PUBLISH_LINE_BYTES, 5]);
    }

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
