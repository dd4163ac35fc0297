//! One session with the dispatcher, and the backoff between sessions. A session is: connect, open the
//! Session stream (its first message carries the session ID), then run together the heartbeat loop (at the
//! period the manager returns), the Assignments stream (fed to the `Worker`) and the status reporter
//! (batches of at most `STATUS_BATCH_MAX` statuses; a failed batch is put back and resent by the next
//! session). Every session message (the first one too) goes to the agent's `on_message`, which learns the
//! manager list from it. Any failure ends the session; the agent then backs off and opens a new one, with the
//! next manager it knows (see `remotes`).
//!
//! Must not depend on the store or the manager: it speaks only the Dispatcher gRPC protocol.

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use shoal_api::dispatcher_client::DispatcherClient;
use shoal_api::update_task_status_request::TaskStatusUpdate;
use shoal_api::{
    AssignmentsRequest, HeartbeatRequest, NodeDescription, SessionMessage, SessionRequest, UpdateTaskStatusRequest,
};
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint};

use crate::rpc::req;
use crate::runner::StatusReporter;
use crate::worker::Worker;

pub use crate::rpc::NODE_ID_METADATA_KEY;
/// Most statuses per UpdateTaskStatus request.
pub(crate) const STATUS_BATCH_MAX: usize = 100;
/// Largest message the agent accepts (a COMPLETE assignment set of a busy node).
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;
/// Timeout of one unary call (heartbeat, status update) and of connecting.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a session ended.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The manager address is not a valid URI.
    #[error("invalid manager address {addr:?}: {reason}; use a URI such as http://127.0.0.1:4242")]
    BadAddress {
        /// The address.
        addr: String,
        /// The parser's message.
        reason: String,
    },
    /// Connecting failed.
    #[error("cannot connect to the manager at {addr}: {source}")]
    Connect {
        /// The address.
        addr: String,
        /// The transport error.
        source: tonic::transport::Error,
    },
    /// An RPC failed.
    #[error("{call} failed: {} ({:?})", status.message(), status.code())]
    Rpc {
        /// Which call.
        call: &'static str,
        /// The status.
        status: tonic::Status,
    },
    /// The manager closed a stream.
    #[error("the manager closed the {0} stream")]
    StreamEnded(&'static str),
    /// This node's description changed (its certificate or trusted roots): a new session sends it.
    #[error("this node's certificate or trusted roots changed; reconnecting to report them")]
    DescriptionChanged,
}

/// gRPC metadata key in which a manager that is not the Raft leader names the leader's address (the
/// dispatcher sets it; same key as the managers' own redirects).
pub(crate) const LEADER_ADDR_METADATA_KEY: &str = "x-shoal-leader-addr";

impl SessionError {
    /// The leader's address (`host:port`) when the manager refused because it is not the leader and named
    /// the leader.
    pub fn leader_hint(&self) -> Option<String> {
        match self {
            SessionError::Rpc { status, .. } if status.code() == tonic::Code::Unavailable => status
                .metadata()
                .get(LEADER_ADDR_METADATA_KEY)
                .and_then(|v| v.to_str().ok())
                .filter(|a| !a.is_empty())
                .map(str::to_string),
            _ => None,
        }
    }

    /// Whether the manager refused the session because this node was removed from the swarm (its
    /// certificate is refused until it expires: SwarmKit's blacklist).
    pub fn node_removed(&self) -> bool {
        matches!(self, SessionError::Rpc { status, .. }
            if status.code() == tonic::Code::PermissionDenied && status.message().contains("was removed from the \
                                                                                            cluster"))
    }
}

fn rpc(call: &'static str) -> impl FnOnce(tonic::Status) -> SessionError {
    move |status| SessionError::Rpc { call, status }
}

/// Bounded, jittered exponential backoff between sessions.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    /// From `min` doubling up to `max`.
    pub fn new(min: Duration, max: Duration) -> Backoff {
        Backoff { min, max, attempt: 0 }
    }

    /// The next delay: the capped exponential value, jittered down to as little as half of it.
    pub fn next_delay(&mut self, rng: &mut impl Rng) -> Duration {
        let exp = self.min.saturating_mul(1u32 << self.attempt.min(16)).min(self.max);
        self.attempt = self.attempt.saturating_add(1);
        let half = exp / 2;
        half + Duration::from_nanos(rng.random_range(0..=u64::try_from(half.as_nanos()).unwrap_or(u64::MAX)))
    }

    /// Back to the minimum (after a session was established).
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// Makes the gRPC endpoint for a manager address (the node injects one with mutual TLS). Errors are
/// messages saying what is wrong with the address or the TLS material.
pub type EndpointFactory = std::sync::Arc<dyn Fn(&str) -> Result<Endpoint, String> + Send + Sync>;

/// Everything one session needs.
pub(crate) struct SessionContext<'a> {
    /// Manager URI.
    pub manager_addr: &'a str,
    /// How to reach it (plain HTTP/2 from the URI when `None`).
    pub endpoint_factory: Option<&'a EndpointFactory>,
    /// This node's ID.
    pub node_id: &'a str,
    /// What this node offers.
    pub description: NodeDescription,
    /// The task runners.
    pub worker: &'a mut Worker,
    /// Statuses waiting to be sent.
    pub reporter: Arc<StatusReporter>,
    /// Reset once the session is established.
    pub backoff: &'a mut Backoff,
    /// When set, receives this node's Node object from every session message that carries one (its role,
    /// desired role, availability as the managers see them).
    pub node_sink: Option<&'a watch::Sender<Option<shoal_api::Node>>>,
    /// Called with every session message (the first one too): the agent learns the manager list from it.
    pub on_message: &'a mut (dyn FnMut(&SessionMessage) + Send),
    /// When set, the session ends (`DescriptionChanged`) as soon as this changes: the node's TLS information,
    /// which the next session's description carries.
    pub tls_info: Option<watch::Receiver<shoal_api::NodeTlsInfo>>,
    /// When set, the node's data plane, fed the manager's network view over this session's connection.
    pub network: Option<Arc<crate::network::NetworkPlane>>,
    /// When set, told this session's connection (attach and detach requests go over it).
    pub attacher: Option<Arc<dyn crate::exec::EngineAttachments>>,
    /// When set, the node's cluster volumes: those it unpublished are reported (`UpdateVolumeStatus`).
    pub volumes: Option<crate::volumes::Volumes>,
    /// When set, the session ends (`DescriptionChanged`) as soon as this changes: what the node's CSI plugins
    /// say of it, which the next session's description carries.
    pub csi_info: Option<watch::Receiver<Vec<shoal_api::NodeCsiInfo>>>,
}

/// Aborts a spawned helper task when the session ends, however it ends.
struct AbortOnDrop(tokio::task::JoinHandle<Result<(), SessionError>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs one session until it fails (`Err`) or `shutdown` turns true (`Ok`).
pub(crate) async fn run_session(
    ctx: SessionContext<'_>,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), SessionError> {
    let addr = ctx.manager_addr.to_string();
    let mut tls_info = ctx.tls_info;
    let mut csi_info = ctx.csi_info;
    let channel = connect(ctx.endpoint_factory, addr).await?;
    let client_channel = channel.clone();
    let mut client = DispatcherClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES);
    let node_id = ctx.node_id.to_string();

    let mut session = client
        .session(req(&node_id, SessionRequest { description: Some(ctx.description), session_id: String::new() }, None))
        .await
        .map_err(rpc("Session"))?
        .into_inner();
    let first = session.message().await.map_err(rpc("Session"))?.ok_or(SessionError::StreamEnded("session"))?;
    let session_id = first.session_id.clone();
    let on_message = ctx.on_message;
    let node_sink = ctx.node_sink;
    let mut publish = |msg: SessionMessage| {
        on_message(&msg);
        if let (Some(sink), Some(node)) = (node_sink, msg.node) {
            sink.send_replace(Some(node));
        }
    };
    publish(first);
    tracing::info!(node = %node_id, session = %session_id, "session with the manager established");

    let mut assignments = client
        .assignments(req(&node_id, AssignmentsRequest { session_id: session_id.clone() }, None))
        .await
        .map_err(rpc("Assignments"))?
        .into_inner();
    ctx.backoff.reset();

    let heartbeat = spawn_heartbeat(client.clone(), node_id.clone(), session_id.clone());
    let reporter = spawn_status_reporter(client.clone(), node_id.clone(), session_id.clone(), ctx.reporter.clone());
    let (mut heartbeat, mut reporter) = (AbortOnDrop(heartbeat), AbortOnDrop(reporter));
    let mut volume_reports = AbortOnDrop(match ctx.volumes.clone() {
        Some(v) => spawn_volume_reporter(client.clone(), node_id.clone(), session_id.clone(), v),
        None => tokio::spawn(std::future::pending()),
    });
    // Log subscriptions ride on the same connection and end with the session.
    let _logs = AbortOnDrop(tokio::spawn({
        let listener = crate::logs::run_listener(
            client_channel.clone(),
            node_id.clone(),
            ctx.worker.assigned(),
            ctx.worker.executor(),
        );
        async move {
            listener.await;
            Ok(())
        }
    }));

    if let Some(att) = &ctx.attacher {
        att.set_channel(Some(client_channel.clone()));
    }
    // The data plane's view of this node's networks rides on the same connection and ends with the session
    // (the plane keeps the last view meanwhile).
    let _network_view = ctx.network.clone().map(|plane| {
        let follow = crate::network::follow_view(client_channel.clone(), node_id.clone(), plane);
        AbortOnDrop(tokio::spawn(async move {
            follow.await;
            Ok(())
        }))
    });

    loop {
        if *shutdown.borrow() {
            return Ok(());
        }
        tokio::select! {
            r = shutdown.changed() => if r.is_err() { return Ok(()) },
            m = session.message() => match m {
                Ok(Some(update)) => publish(update),
                Ok(None) => return Err(SessionError::StreamEnded("session")),
                Err(status) => return Err(SessionError::Rpc { call: "Session", status }),
            },
            m = assignments.message() => match m {
                Ok(Some(msg)) => ctx.worker.apply(msg),
                Ok(None) => return Err(SessionError::StreamEnded("assignments")),
                Err(status) => return Err(SessionError::Rpc { call: "Assignments", status }),
            },
            r = &mut heartbeat.0 => return Err(joined(r)),
            r = &mut reporter.0 => return Err(joined(r)),
            r = &mut volume_reports.0 => return Err(joined(r)),
            _ = changed(&mut tls_info) => return Err(SessionError::DescriptionChanged),
            _ = changed(&mut csi_info) => return Err(SessionError::DescriptionChanged),
        }
    }
}

/// A channel to the manager at `addr` (through `endpoint_factory` when set, for TLS).
async fn connect(endpoint_factory: Option<&EndpointFactory>, addr: String) -> Result<Channel, SessionError> {
    let endpoint = match endpoint_factory {
        Some(make) => make(&addr).map_err(|reason| SessionError::BadAddress { addr: addr.clone(), reason })?,
        None => Endpoint::from_shared(addr.clone())
            .map_err(|e| SessionError::BadAddress { addr: addr.clone(), reason: e.to_string() })?,
    }
    .connect_timeout(CALL_TIMEOUT)
    .tcp_nodelay(true);
    endpoint.connect().await.map_err(|source| SessionError::Connect { addr, source })
}

/// Sends the session's heartbeats at the period the manager asks for; ends with the first failure.
fn spawn_heartbeat(
    mut client: DispatcherClient<Channel>,
    node_id: String,
    session_id: String,
) -> tokio::task::JoinHandle<Result<(), SessionError>> {
    tokio::spawn(async move {
        loop {
            let resp = client
                .heartbeat(req(&node_id, HeartbeatRequest { session_id: session_id.clone() }, Some(CALL_TIMEOUT)))
                .await
                .map_err(rpc("Heartbeat"))?
                .into_inner();
            let period = resp.period.as_ref().map(shoal_api::duration_from_proto).unwrap_or(Duration::from_secs(5));
            tokio::time::sleep(period.max(Duration::from_millis(10))).await;
        }
    })
}

/// Sends the statuses `reporter` collects, in batches of at most `STATUS_BATCH_MAX`; a batch that fails is
/// put back for the next session, and ends this one.
fn spawn_status_reporter(
    mut client: DispatcherClient<Channel>,
    node_id: String,
    session_id: String,
    reporter: Arc<StatusReporter>,
) -> tokio::task::JoinHandle<Result<(), SessionError>> {
    tokio::spawn(async move {
        loop {
            let batch = reporter.take_batch(STATUS_BATCH_MAX);
            if batch.is_empty() {
                reporter.changed().await;
                continue;
            }
            let updates = batch
                .iter()
                .map(|(id, st)| TaskStatusUpdate { task_id: id.clone(), status: Some(st.clone()) })
                .collect();
            let r = client
                .update_task_status(req(
                    &node_id,
                    UpdateTaskStatusRequest { session_id: session_id.clone(), updates },
                    Some(CALL_TIMEOUT),
                ))
                .await;
            if let Err(status) = r {
                reporter.put_back(batch);
                return Err(SessionError::Rpc { call: "UpdateTaskStatus", status });
            }
        }
    })
}

/// Reports the cluster volumes this node unpublished (`UpdateVolumeStatus`), so the manager has the plugin's
/// controller unpublish them; a report that fails is put back for the next session, and ends this one.
fn spawn_volume_reporter(
    mut client: DispatcherClient<Channel>,
    node_id: String,
    session_id: String,
    volumes: crate::volumes::Volumes,
) -> tokio::task::JoinHandle<Result<(), SessionError>> {
    use shoal_api::update_volume_status_request::VolumeStatusUpdate;
    tokio::spawn(async move {
        loop {
            let ids = volumes.take_unpublished();
            if ids.is_empty() {
                volumes.reports_changed().await;
                continue;
            }
            let updates = ids.iter().map(|id| VolumeStatusUpdate { id: id.clone(), unpublished: true }).collect();
            let request = shoal_api::UpdateVolumeStatusRequest { session_id: session_id.clone(), updates };
            if let Err(status) = client.update_volume_status(req(&node_id, request, Some(CALL_TIMEOUT))).await {
                volumes.put_back(ids);
                return Err(SessionError::Rpc { call: "UpdateVolumeStatus", status });
            }
        }
    })
}

/// Resolves when `rx` (when set) has a value not seen yet; never when unset or its sender is gone.
async fn changed<T>(rx: &mut Option<watch::Receiver<T>>) {
    match rx.as_mut() {
        Some(rx) => {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending::<()>().await,
    }
}

fn joined(r: Result<Result<(), SessionError>, tokio::task::JoinError>) -> SessionError {
    match r {
        Ok(Err(e)) => e,
        Ok(Ok(())) => SessionError::StreamEnded("helper"),
        Err(e) => SessionError::Rpc { call: "helper task", status: tonic::Status::internal(e.to_string()) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn backoff_grows_to_the_cap_with_jitter_and_resets() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let first = b.next_delay(&mut rng);
        assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100), "{first:?}");
        for _ in 0..20 {
            let d = b.next_delay(&mut rng);
            assert!(d <= Duration::from_secs(5), "{d:?}");
        }
        let late = b.next_delay(&mut rng);
        assert!(late >= Duration::from_millis(2500), "{late:?}");
        b.reset();
        assert!(b.next_delay(&mut rng) <= Duration::from_millis(100));
    }
}
