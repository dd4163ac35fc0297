//! The log broker (SwarmKit's LogBroker): a subscriber (the Engine API's `/services/{id}/logs`) asks for
//! the logs of some services, tasks or nodes; the broker sends the subscription to every connected node's
//! listener (`ListenSubscriptions`), nodes publish the matching lines (`PublishLogs`), and the broker
//! forwards them to the subscriber. Without `follow` the subscription ends once every node it was sent to
//! has closed its part; with `follow` it lasts until the subscriber goes away, and nodes that connect later
//! get it too. Dropping a `Subscription` closes it on every node.
//!
//! The broker reads nothing from the store: each agent decides which of its tasks a selector matches.
//! A node publishes only lines whose context names it (as SwarmKit's broker checks); that the named task
//! is on that node is the subscriber's check, with the store (the Engine API's). Bounds: `LISTENER_QUEUE`
//! subscription messages wait per node (a node whose queue is full is skipped for that subscription);
//! `SUBSCRIBER_QUEUE` batches wait per subscriber (publishers wait for a slow subscriber: backpressure to
//! the agent, whose batches are bounded in lines and bytes); a subscription without `follow` that hears
//! nothing from its remaining nodes for `SILENT_NODES_TIMEOUT` ends (a node that listens and never
//! answers, or is stuck, cannot hold every `docker service logs` open). Its gRPC faces are in `logrpc`.
//!
//! Must not depend on HTTP, executors, gRPC servers or any other module of this crate: `ClusterState`
//! holds a broker.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use parking_lot::Mutex;
use shoal_api::{LogMessage, LogSelector, LogSubscriptionOptions, PublishLogsMessage, SubscriptionMessage};
use tokio::sync::mpsc;
use tonic::Status;

/// Subscription messages queued per connected node.
pub(crate) const LISTENER_QUEUE: usize = 64;
/// Batches of lines queued per subscriber.
pub(crate) const SUBSCRIBER_QUEUE: usize = 16;
/// How long a subscription without `follow` waits for a line or a close from the nodes that have not
/// finished their part before it ends without them.
pub(crate) const SILENT_NODES_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

struct Listener {
    serial: u64,
    tx: mpsc::Sender<SubscriptionMessage>,
}

struct Sub {
    msg: SubscriptionMessage,
    out: mpsc::Sender<Vec<LogMessage>>,
    /// Nodes the subscription was sent to (only they may publish to it).
    nodes: HashSet<String>,
    /// Nodes that have not closed their part yet (without follow).
    pending: HashSet<String>,
}

#[derive(Default)]
struct BrokerState {
    listeners: HashMap<String, Listener>,
    subs: HashMap<String, Sub>,
}

/// The broker. Clones share state.
#[derive(Clone, Default)]
pub struct LogBroker {
    state: Arc<Mutex<BrokerState>>,
    serial: Arc<AtomicU64>,
}

impl std::fmt::Debug for LogBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state.lock();
        f.debug_struct("LogBroker")
            .field("listeners", &s.listeners.len())
            .field("subscriptions", &s.subs.len())
            .finish()
    }
}

/// The lines of one subscription, in batches; ends when every node has sent its part (without follow).
/// Dropping it ends the subscription on every node.
pub struct Subscription {
    id: String,
    broker: LogBroker,
    rx: mpsc::Receiver<Vec<LogMessage>>,
    /// Without `follow`: when the subscription gives up on silent nodes (made on first poll, reset by each
    /// batch).
    silence: Option<Pin<Box<tokio::time::Sleep>>>,
    follow: bool,
}

impl Subscription {
    /// The subscription's ID.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl Stream for Subscription {
    type Item = Vec<LogMessage>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        match this.rx.poll_recv(cx) {
            Poll::Ready(Some(batch)) => {
                if let Some(s) = this.silence.as_mut() {
                    s.as_mut().reset(tokio::time::Instant::now() + SILENT_NODES_TIMEOUT);
                }
                Poll::Ready(Some(batch))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending if this.follow => Poll::Pending,
            Poll::Pending => {
                let silence = this.silence.get_or_insert_with(|| Box::pin(tokio::time::sleep(SILENT_NODES_TIMEOUT)));
                if silence.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let silent = this.broker.pending_nodes(&this.id);
                tracing::warn!(
                    subscription = %this.id,
                    nodes = ?silent,
                    "log subscription ends without the nodes that sent nothing for {SILENT_NODES_TIMEOUT:?}"
                );
                this.broker.close(&this.id);
                this.rx.close();
                Poll::Ready(None)
            }
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.broker.close(&self.id);
    }
}

/// A node's stream of subscriptions; unregisters the node's listener when dropped (the node went away).
pub struct ListenerStream {
    node_id: String,
    serial: u64,
    broker: LogBroker,
    rx: mpsc::Receiver<SubscriptionMessage>,
}

impl Stream for ListenerStream {
    type Item = Result<SubscriptionMessage, Status>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx).map(|m| m.map(Ok))
    }
}

impl Drop for ListenerStream {
    fn drop(&mut self) {
        self.broker.unlisten(&self.node_id, self.serial);
    }
}

impl LogBroker {
    /// A broker with no nodes and no subscriptions.
    pub fn new() -> LogBroker {
        LogBroker::default()
    }

    fn next_serial(&self) -> u64 {
        self.serial.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Starts a subscription: sends it to every connected node (those named by the selector's `node_ids`
    /// when it names nodes only).
    pub fn subscribe(&self, selector: LogSelector, options: LogSubscriptionOptions) -> Subscription {
        let id = format!("logs-{}", self.next_serial());
        let (out, rx) = mpsc::channel(SUBSCRIBER_QUEUE);
        let follow = options.follow;
        let only_nodes =
            selector.service_ids.is_empty() && selector.task_ids.is_empty() && !selector.node_ids.is_empty();
        let msg =
            SubscriptionMessage { id: id.clone(), selector: Some(selector), options: Some(options), close: false };
        let mut st = self.state.lock();
        let mut nodes = HashSet::new();
        for (node, l) in &st.listeners {
            if only_nodes && !msg.selector.as_ref().is_some_and(|s| s.node_ids.contains(node)) {
                continue;
            }
            match l.tx.try_send(msg.clone()) {
                Ok(()) => {
                    nodes.insert(node.clone());
                }
                Err(_) => tracing::warn!(node = %node, "the node's log subscription queue is full: skipping it"),
            }
        }
        let pending = if follow { HashSet::new() } else { nodes.clone() };
        let done = !follow && pending.is_empty();
        if !done {
            st.subs.insert(id.clone(), Sub { msg, out, nodes, pending });
        }
        // When done, `out` is dropped here and the subscription ends at once.
        drop(st);
        Subscription { id, broker: self.clone(), rx, silence: None, follow }
    }

    /// The nodes that have not finished their part of subscription `id` (sorted).
    fn pending_nodes(&self, id: &str) -> Vec<String> {
        let st = self.state.lock();
        let mut nodes: Vec<String> = st.subs.get(id).map(|s| s.pending.iter().cloned().collect()).unwrap_or_default();
        nodes.sort();
        nodes
    }

    /// Ends a subscription on every node it was sent to.
    fn close(&self, id: &str) {
        let mut st = self.state.lock();
        let Some(sub) = st.subs.remove(id) else { return };
        let close = SubscriptionMessage { id: id.to_string(), close: true, ..Default::default() };
        for node in &sub.nodes {
            if let Some(l) = st.listeners.get(node) {
                let _ = l.tx.try_send(close.clone());
            }
        }
    }

    /// Registers `node_id`'s listener (replacing an older one) and queues the followed subscriptions.
    pub fn listen(&self, node_id: &str) -> ListenerStream {
        let (tx, rx) = mpsc::channel(LISTENER_QUEUE);
        let serial = self.next_serial();
        let mut st = self.state.lock();
        for sub in st.subs.values_mut() {
            let follow = sub.msg.options.as_ref().is_some_and(|o| o.follow);
            if follow && tx.try_send(sub.msg.clone()).is_ok() {
                sub.nodes.insert(node_id.to_string());
            }
        }
        st.listeners.insert(node_id.to_string(), Listener { serial, tx });
        ListenerStream { node_id: node_id.to_string(), serial, broker: self.clone(), rx }
    }

    fn unlisten(&self, node_id: &str, serial: u64) {
        let mut st = self.state.lock();
        if st.listeners.get(node_id).is_some_and(|l| l.serial == serial) {
            st.listeners.remove(node_id);
        }
        // The node will not finish its part of the subscriptions waiting for it.
        let mut finished = vec![];
        for (id, sub) in st.subs.iter_mut() {
            if sub.pending.remove(node_id) && sub.pending.is_empty() {
                finished.push(id.clone());
            }
        }
        for id in finished {
            st.subs.remove(&id);
        }
    }

    /// Takes one published message from `node_id`. Fails when the subscription is unknown (ended) or was
    /// not sent to that node.
    pub async fn publish(&self, node_id: &str, msg: PublishLogsMessage) -> Result<(), Status> {
        let out = {
            let st = self.state.lock();
            let sub = st
                .subs
                .get(&msg.subscription_id)
                .ok_or_else(|| Status::not_found(format!("log subscription {} has ended", msg.subscription_id)))?;
            if !sub.nodes.contains(node_id) {
                return Err(Status::permission_denied(format!(
                    "log subscription {} was not sent to node {node_id}",
                    msg.subscription_id
                )));
            }
            // As SwarmKit's broker: a node publishes its own lines only.
            if let Some(other) = msg
                .messages
                .iter()
                .filter_map(|m| m.context.as_ref())
                .find(|c| c.node_id != node_id)
                .map(|c| c.node_id.clone())
            {
                return Err(Status::permission_denied(format!(
                    "node {node_id} may not publish logs for node {other:?}: a node publishes the lines of its own \
                     tasks only"
                )));
            }
            sub.out.clone()
        };
        if !msg.messages.is_empty() && out.send(msg.messages).await.is_err() {
            return Err(Status::not_found(format!("log subscription {} has ended", msg.subscription_id)));
        }
        if msg.close {
            let mut st = self.state.lock();
            if let Some(sub) = st.subs.get_mut(&msg.subscription_id) {
                if sub.pending.remove(node_id) && sub.pending.is_empty() {
                    st.subs.remove(&msg.subscription_id);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn line(task: &str, data: &str) -> LogMessage {
        line_of("n1", task, data)
    }

    fn line_of(node: &str, task: &str, data: &str) -> LogMessage {
        LogMessage {
            context: Some(shoal_api::LogContext { task_id: task.into(), node_id: node.into(), ..Default::default() }),
            data: data.as_bytes().to_vec(),
            ..Default::default()
        }
    }

    fn publish(id: &str, lines: Vec<LogMessage>, close: bool) -> PublishLogsMessage {
        PublishLogsMessage { subscription_id: id.into(), messages: lines, close }
    }

    #[tokio::test]
    async fn a_subscription_reaches_every_node_and_ends_when_all_have_closed() {
        let b = LogBroker::new();
        let mut n1 = b.listen("n1");
        let mut n2 = b.listen("n2");
        let mut sub =
            b.subscribe(LogSelector { service_ids: vec!["s".into()], ..Default::default() }, Default::default());
        let m1 = n1.next().await.unwrap().unwrap();
        let m2 = n2.next().await.unwrap().unwrap();
        assert_eq!((m1.id.as_str(), m2.id.as_str()), (sub.id(), sub.id()));
        b.publish("n1", publish(sub.id(), vec![line("t1", "a")], true)).await.unwrap();
        assert_eq!(sub.next().await.unwrap()[0].data, b"a");
        // A node the subscription was not sent to may not publish to it.
        assert!(b.publish("n3", publish(sub.id(), vec![], true)).await.is_err());
        // A node may not publish lines as another node's (nor lines that name no node).
        let forged = b.publish("n2", publish(sub.id(), vec![line_of("n1", "t1", "forged")], false)).await;
        assert_eq!(forged.unwrap_err().code(), tonic::Code::PermissionDenied);
        let anonymous = b.publish("n2", publish(sub.id(), vec![line_of("", "t1", "forged")], false)).await;
        assert_eq!(anonymous.unwrap_err().code(), tonic::Code::PermissionDenied);
        b.publish("n2", publish(sub.id(), vec![line_of("n2", "t2", "b")], true)).await.unwrap();
        assert_eq!(sub.next().await.unwrap()[0].data, b"b");
        assert!(sub.next().await.is_none(), "ends once both nodes closed");
    }

    #[tokio::test]
    async fn a_followed_subscription_reaches_late_nodes_and_closes_on_drop() {
        let b = LogBroker::new();
        let opts = LogSubscriptionOptions { follow: true, ..Default::default() };
        let sub = b.subscribe(LogSelector { task_ids: vec!["t".into()], ..Default::default() }, opts);
        let id = sub.id().to_string();
        let mut late = b.listen("n1");
        assert_eq!(late.next().await.unwrap().unwrap().id, id);
        drop(sub);
        let close = late.next().await.unwrap().unwrap();
        assert!(close.close && close.id == id);
        assert!(b.publish("n1", publish(&id, vec![line("t", "x")], false)).await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_that_never_answers_holds_a_subscription_only_until_the_silence_timeout() {
        let b = LogBroker::new();
        let mut answering = b.listen("n1");
        let _silent = b.listen("n2"); // listens, never reads, never publishes
        let mut sub =
            b.subscribe(LogSelector { service_ids: vec!["s".into()], ..Default::default() }, Default::default());
        assert_eq!(answering.next().await.unwrap().unwrap().id, sub.id());
        b.publish("n1", publish(sub.id(), vec![line("t1", "a")], true)).await.unwrap();
        assert_eq!(sub.next().await.unwrap()[0].data, b"a");
        let started = tokio::time::Instant::now();
        assert!(sub.next().await.is_none(), "ends without the silent node");
        assert!(started.elapsed() >= SILENT_NODES_TIMEOUT, "{:?}", started.elapsed());
        // A followed subscription is not cut by silence.
        let opts = LogSubscriptionOptions { follow: true, ..Default::default() };
        let mut followed = b.subscribe(LogSelector { service_ids: vec!["s".into()], ..Default::default() }, opts);
        let waited = tokio::time::timeout(SILENT_NODES_TIMEOUT * 3, followed.next()).await;
        assert!(waited.is_err(), "a followed subscription stays open: {waited:?}");
    }

    #[tokio::test]
    async fn without_nodes_or_when_a_node_leaves_the_subscription_ends() {
        let b = LogBroker::new();
        let mut empty = b.subscribe(LogSelector::default(), Default::default());
        assert!(empty.next().await.is_none());
        let n1 = b.listen("n1");
        let mut sub = b.subscribe(LogSelector::default(), Default::default());
        drop(n1);
        assert!(sub.next().await.is_none());
    }
}
