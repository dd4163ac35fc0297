//! Logs on a follower manager: the control API's `LeaderLogs` over the leader's `Logs.SubscribeLogs`,
//! reached through this node's mutual-TLS channel factory at the address of the Raft leader-address watch.
//! The relayed stream ends cleanly when the leader changes (the client may ask again) or when the
//! connection fails. Must not depend on HTTP routing or the executors.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::StreamExt;
use shoal_api::logs_client::LogsClient;
use shoal_api::{LogSelector, LogSubscriptionOptions, SubscribeLogsRequest};
use shoal_engine_api::logs::{LeaderLogs, LogBatches};
use shoal_raft::grpc::ChannelFactory;
use tokio::sync::watch;

/// How long connecting to the leader and opening the subscription may take.
pub(crate) const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Subscribes at the leader for the control API of a manager that does not lead.
pub(crate) struct RemoteLeaderLogs {
    factory: Arc<dyn ChannelFactory>,
    /// The leader's address as `http://host:port`; this manager's own address when no leader is known.
    leader: watch::Receiver<String>,
    /// This manager's own address as the watch spells it.
    own: String,
}

impl std::fmt::Debug for RemoteLeaderLogs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteLeaderLogs").field("leader", &*self.leader.borrow()).finish()
    }
}

impl RemoteLeaderLogs {
    /// Relays from the leader named by `leader` (the dispatcher-address watch: `http://` + address, or
    /// `own_addr` when no leader is known), over channels from `factory`.
    pub(crate) fn new(
        factory: Arc<dyn ChannelFactory>,
        leader: watch::Receiver<String>,
        own_addr: &str,
    ) -> RemoteLeaderLogs {
        RemoteLeaderLogs { factory, leader, own: format!("http://{own_addr}") }
    }
}

impl LeaderLogs for RemoteLeaderLogs {
    fn subscribe(
        &self,
        selector: LogSelector,
        options: LogSubscriptionOptions,
    ) -> BoxFuture<'static, Result<LogBatches, String>> {
        let mut leader = self.leader.clone();
        let current = leader.borrow_and_update().clone();
        let own = self.own.clone();
        let factory = self.factory.clone();
        Box::pin(async move {
            if current == own {
                return Err("no leader manager is known right now (an election may be under way)".into());
            }
            let addr = current.trim_start_matches("http://").to_string();
            let endpoint = factory.endpoint(&addr).map_err(|e| e.to_string())?;
            let open = async {
                let channel =
                    endpoint.connect().await.map_err(|e| format!("cannot reach the leader at {addr}: {e}"))?;
                LogsClient::new(channel)
                    .subscribe_logs(SubscribeLogsRequest { selector: Some(selector), options: Some(options) })
                    .await
                    .map_err(|s| format!("the leader at {addr} refused the log subscription: {}", s.message()))
            };
            let stream = tokio::time::timeout(SUBSCRIBE_TIMEOUT, open)
                .await
                .map_err(|_| format!("the leader at {addr} did not answer within {SUBSCRIBE_TIMEOUT:?}"))??
                .into_inner();
            let leader_changed = async move {
                // Ends when the leader's address changes, or when the watch goes away with the node.
                let _ = leader.changed().await;
            };
            let batches = stream
                .take_while(move |item| {
                    if let Err(status) = item {
                        tracing::warn!(leader = %addr, error = %status, "the leader's log stream failed; ending the \
                                                                         relay");
                    }
                    futures::future::ready(item.is_ok())
                })
                .filter_map(|item| futures::future::ready(item.ok().map(|m| m.messages)))
                .take_until(leader_changed);
            Ok(Box::pin(batches) as LogBatches)
        })
    }
}
