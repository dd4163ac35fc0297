//! The node's DNS resolver for its tasks. Like Docker's embedded DNS, it listens inside each task's network
//! namespace on `127.0.0.11:53` (UDP and TCP; the sockets are made in the namespace and served by this
//! process, so the resolver knows which task asks) and answers from that task's `Zone`: for every service on
//! the task's networks, `service`, `service.network` and each alias give the VIP (the task addresses in dnsrr
//! mode), `tasks.service` and `tasks.service.network` (and the same of each alias) the task addresses. On a network
//! with IPv6 the same names answer AAAA with the tasks' IPv6 addresses (there is no IPv6 VIP). Other names are
//! forwarded from the node's own namespace to the node's resolvers, unless all the task's networks are internal (then
//! REFUSED).
//!
//! DNS messages are read and written with hickory-proto (no hand-written codec). `zone_for` and `answer` are
//! pure; `Resolver` is the tokio shell. Bounds: `MAX_FORWARDS_IN_FLIGHT` forwarded queries per node (beyond:
//! SERVFAIL), `FORWARD_TIMEOUT` per forwarded query, `MAX_TCP_CONNECTIONS_PER_TASK` connections per task
//! (beyond: closed), `TCP_IDLE_TIMEOUT`, messages of `MAX_MESSAGE_BYTES`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use crate::state::{NodeNetState, TaskState};
use crate::Error;

/// Where the resolver listens in each task namespace.
pub const RESOLVER_ADDR: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 11), 53);
/// TTL of Shoal's answers: short, so clients follow backends that come and go.
pub(crate) const TTL_SECS: u32 = 10;
/// Most forwarded queries in flight on one node.
pub(crate) const MAX_FORWARDS_IN_FLIGHT: usize = 64;
/// How long a forwarded query waits for each upstream resolver.
pub(crate) const FORWARD_TIMEOUT: Duration = Duration::from_secs(2);
/// Most TCP connections one task holds to the resolver.
pub(crate) const MAX_TCP_CONNECTIONS_PER_TASK: usize = 16;
/// A TCP connection idle this long is closed.
pub(crate) const TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest DNS message read or relayed.
pub(crate) const MAX_MESSAGE_BYTES: usize = 4096;
/// Most upstream resolvers tried.
pub(crate) const MAX_UPSTREAMS: usize = 3;
/// Pause after a failed accept.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// The UDP answer size a query without EDNS may get (RFC 1035).
const CLASSIC_UDP_BYTES: usize = 512;

/// The `resolv.conf` of a task served by this resolver.
pub fn resolv_conf() -> String {
    format!("nameserver {}\noptions ndots:0\n", RESOLVER_ADDR.ip())
}

/// The nameservers of a `resolv.conf` text, as upstreams (port 53; IPv4 only; at most `MAX_UPSTREAMS`).
pub fn upstreams_from_resolv_conf(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver")?.trim().parse::<Ipv4Addr>().ok())
        .filter(|ip| *ip != *RESOLVER_ADDR.ip())
        .map(|ip| SocketAddr::V4(SocketAddrV4::new(ip, 53)))
        .take(MAX_UPSTREAMS)
        .collect()
}

/// The names one task resolves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Zone {
    /// Lower-case name (no trailing dot) -> addresses, sorted.
    pub names: BTreeMap<String, Vec<Ipv4Addr>>,
    /// The same names' IPv6 addresses (AAAA), on networks with IPv6, sorted.
    pub names6: BTreeMap<String, Vec<Ipv6Addr>>,
    /// Whether other names are forwarded (some network of the task is not internal).
    pub forward: bool,
}

/// The zone of `task` in `state` (which has passed `validate`).
pub(crate) fn zone_for(state: &NodeNetState, task: &TaskState) -> Zone {
    let mut names: BTreeMap<String, BTreeSet<Ipv4Addr>> = BTreeMap::new();
    let mut names6: BTreeMap<String, BTreeSet<Ipv6Addr>> = BTreeMap::new();
    let mut forward = false;
    for a in &task.attachments {
        let Some(n) = state.network(&a.network_id) else {
            continue;
        };
        forward |= !n.internal;
        let net = n.name.to_ascii_lowercase();
        let v6 = n.ipv6.is_some();
        for s in &n.services {
            let answer: Vec<Ipv4Addr> = match s.vip {
                Some(vip) => vec![vip],
                None => s.backends.clone(),
            };
            // Each name gives the VIP (the tasks in dnsrr mode) for A and the tasks' IPv6 addresses for AAAA (no
            // IPv6 VIP); `tasks.` of the name and of each alias, as libnetwork does (a stack's service
            // `vote_redis` has the compose file's short name `redis` as its alias, and `tasks.redis` gives its
            // tasks), the tasks for both.
            for name in std::iter::once(&s.name).chain(&s.aliases) {
                let name = name.to_ascii_lowercase();
                for (full, a) in [
                    (name.clone(), &answer),
                    (format!("{name}.{net}"), &answer),
                    (format!("tasks.{name}"), &s.backends),
                    (format!("tasks.{name}.{net}"), &s.backends),
                ] {
                    if v6 {
                        names6.entry(full.clone()).or_default().extend(s.backends6.iter().copied());
                    }
                    names.entry(full).or_default().extend(a.iter().copied());
                }
            }
        }
    }
    Zone {
        names: names.into_iter().map(|(k, v)| (k, v.into_iter().collect())).collect(),
        names6: names6.into_iter().map(|(k, v)| (k, v.into_iter().collect())).collect(),
        forward,
    }
}

/// What to do with one query.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Send these bytes back.
    Reply(Vec<u8>),
    /// Not Shoal's name: forward the query as it is.
    Forward,
    /// Not a DNS query: ignore it.
    Drop,
}

/// Answers `query` (wire bytes) from `zone`; `udp` limits the answer's size (truncated answers set TC).
pub(crate) fn answer(zone: &Zone, query: &[u8], udp: bool) -> Answer {
    let Ok(q) = Message::from_vec(query) else {
        return Answer::Drop;
    };
    if q.metadata.message_type != MessageType::Query {
        return Answer::Drop;
    }
    let id = q.metadata.id;
    let reply = |code: ResponseCode, records: Vec<Record>| {
        let mut m = Message::error_msg(id, q.metadata.op_code, code);
        m.metadata.recursion_desired = q.metadata.recursion_desired;
        m.metadata.recursion_available = true;
        m.metadata.authoritative = code == ResponseCode::NoError;
        m.add_queries(q.queries.iter().cloned());
        m.add_answers(records);
        let limit = if udp {
            q.edns.as_ref().map_or(CLASSIC_UDP_BYTES, |e| usize::from(e.max_payload()).max(CLASSIC_UDP_BYTES))
        } else {
            u16::MAX as usize
        };
        let bytes = m.to_vec().unwrap_or_default();
        if bytes.len() > limit {
            return Answer::Reply(m.truncate().to_vec().unwrap_or_default());
        }
        Answer::Reply(bytes)
    };
    if q.metadata.op_code != OpCode::Query || q.queries.len() != 1 {
        return reply(ResponseCode::NotImp, Vec::new());
    }
    let query = &q.queries[0];
    let name = query.name().to_ascii().trim_end_matches('.').to_ascii_lowercase();
    let (addrs, addrs6) = (zone.names.get(&name), zone.names6.get(&name));
    if addrs.is_none() && addrs6.is_none() {
        return if zone.forward { Answer::Forward } else { reply(ResponseCode::Refused, Vec::new()) };
    }
    let a = || addrs.into_iter().flatten().map(|ip| RData::A(A(*ip)));
    let aaaa = || addrs6.into_iter().flatten().map(|ip| RData::AAAA(AAAA(*ip)));
    let data: Vec<RData> = match query.query_type() {
        RecordType::A => a().collect(),
        RecordType::AAAA => aaaa().collect(),
        RecordType::ANY => a().chain(aaaa()).collect(),
        // The name exists but has no records of this type: NOERROR, empty.
        _ => Vec::new(),
    };
    let records = data.into_iter().map(|d| Record::from_rdata(query.name().clone(), TTL_SECS, d)).collect();
    reply(ResponseCode::NoError, records)
}

/// A SERVFAIL answer to `query`, when forwarding is not possible.
fn servfail(query: &[u8]) -> Option<Vec<u8>> {
    let q = Message::from_vec(query).ok()?;
    let mut m = Message::error_msg(q.metadata.id, q.metadata.op_code, ResponseCode::ServFail);
    m.add_queries(q.queries);
    m.to_vec().ok()
}

/// The resolver of one node: see the module doc. Needs a tokio runtime; stops serving a task when it leaves
/// the state and everything on drop.
pub struct Resolver {
    shared: Arc<Shared>,
    tasks: Mutex<HashMap<String, TaskServer>>,
}

struct Shared {
    upstreams: Vec<SocketAddr>,
    forwards: Semaphore,
}

struct TaskServer {
    netns: PathBuf,
    /// The inode of the namespace the sockets were made in: a task whose path now names another one (a
    /// joined container restarted, its namespace named again) is served anew there.
    netns_ino: Option<u64>,
    zone: Arc<RwLock<Arc<Zone>>>,
    loops: Vec<JoinHandle<()>>,
}

impl Drop for TaskServer {
    fn drop(&mut self) {
        for l in &self.loops {
            l.abort();
        }
    }
}

impl Resolver {
    /// A resolver forwarding to `upstreams` (the node's resolvers; at most `MAX_UPSTREAMS` are used).
    pub fn new(mut upstreams: Vec<SocketAddr>) -> Resolver {
        upstreams.truncate(MAX_UPSTREAMS);
        Resolver {
            shared: Arc::new(Shared { upstreams, forwards: Semaphore::new(MAX_FORWARDS_IN_FLIGHT) }),
            tasks: Mutex::new(HashMap::new()),
        }
    }

    /// Serves every task of `state` with its zone: new tasks get their sockets, gone tasks lose them, the
    /// others get their new zone at once. Returns why joined tasks (`TaskState::joined`) could not be
    /// served; any other task's failure is the error.
    pub async fn update(&self, state: &NodeNetState) -> Result<Vec<Error>, Error> {
        let mut unserved = Vec::new();
        state.validate()?;
        let wanted: HashMap<&str, &TaskState> = state.tasks.iter().map(|t| (t.task_id.as_str(), t)).collect();
        let new: Vec<&TaskState> = {
            let mut tasks = self.tasks.lock().expect("resolver lock");
            tasks.retain(|id, s| {
                wanted.get(id.as_str()).is_some_and(|t| t.netns == s.netns && netns_ino(&t.netns) == s.netns_ino)
            });
            for (id, s) in tasks.iter() {
                *s.zone.write().expect("zone lock") = Arc::new(zone_for(state, wanted[id.as_str()]));
            }
            state.tasks.iter().filter(|t| !tasks.contains_key(&t.task_id)).collect()
        };
        for t in new {
            let zone = Arc::new(RwLock::new(Arc::new(zone_for(state, t))));
            let server = match self.serve(t, zone).await {
                Ok(s) => s,
                // A container's own namespace may hold 127.0.0.11:53 itself: it keeps its resolver, the
                // rest of the node's plumbing goes on (tried again at the next update).
                Err(e) if t.joined => {
                    unserved.push(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            self.tasks.lock().expect("resolver lock").insert(t.task_id.clone(), server);
        }
        Ok(unserved)
    }

    /// Makes the task's sockets in its namespace and starts serving them.
    async fn serve(&self, task: &TaskState, zone: Arc<RwLock<Arc<Zone>>>) -> Result<TaskServer, Error> {
        let netns = task.netns.clone();
        let task_id = task.task_id.clone();
        let (udp, tcp) = tokio::task::spawn_blocking(move || bind_in_netns(&netns))
            .await
            .map_err(|e| Error::Dns { task: task_id.clone(), detail: e.to_string() })?
            .map_err(|e| Error::Dns { task: task_id.clone(), detail: e })?;
        let wrap = |e: std::io::Error| Error::Dns { task: task_id.clone(), detail: e.to_string() };
        let udp = Arc::new(UdpSocket::from_std(udp).map_err(wrap)?);
        let tcp = TcpListener::from_std(tcp).map_err(wrap)?;
        let loops = vec![
            tokio::spawn(udp_loop(udp, zone.clone(), self.shared.clone())),
            tokio::spawn(tcp_loop(tcp, zone.clone(), self.shared.clone())),
        ];
        Ok(TaskServer { netns: task.netns.clone(), netns_ino: netns_ino(&task.netns), zone, loops })
    }
}

/// The inode of the namespace `netns` names now (`None`: it names none).
fn netns_ino(netns: &std::path::Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(netns).ok().map(|m| m.ino())
}

/// Binds `RESOLVER_ADDR` (UDP and TCP) inside `netns`, on a thread of its own that enters the namespace.
fn bind_in_netns(netns: &std::path::Path) -> Result<(std::net::UdpSocket, std::net::TcpListener), String> {
    let path = netns.to_path_buf();
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).map_err(|e| format!("open {path:?}: {e}"))?;
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| format!("enter {path:?}: {e}"))?;
        let udp = std::net::UdpSocket::bind(RESOLVER_ADDR).map_err(|e| format!("bind udp {RESOLVER_ADDR}: {e}"))?;
        let tcp = std::net::TcpListener::bind(RESOLVER_ADDR).map_err(|e| format!("bind tcp {RESOLVER_ADDR}: {e}"))?;
        udp.set_nonblocking(true).map_err(|e| e.to_string())?;
        tcp.set_nonblocking(true).map_err(|e| e.to_string())?;
        Ok((udp, tcp))
    })
    .join()
    .map_err(|_| "the namespace thread panicked".to_string())?
}

async fn udp_loop(sock: Arc<UdpSocket>, zone: Arc<RwLock<Arc<Zone>>>, shared: Arc<Shared>) {
    let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
    loop {
        let Ok((len, from)) = sock.recv_from(&mut buf).await else {
            continue;
        };
        let query = buf[..len].to_vec();
        let z = zone.read().expect("zone lock").clone();
        match answer(&z, &query, true) {
            Answer::Reply(bytes) => {
                let _ = sock.send_to(&bytes, from).await;
            }
            Answer::Drop => {}
            Answer::Forward => {
                let (sock, shared) = (sock.clone(), shared.clone());
                tokio::spawn(async move {
                    if let Some(bytes) = forward(&shared, &query).await {
                        let _ = sock.send_to(&bytes, from).await;
                    }
                });
            }
        }
    }
}

async fn tcp_loop(listener: TcpListener, zone: Arc<RwLock<Arc<Zone>>>, shared: Arc<Shared>) {
    let open = Arc::new(Semaphore::new(MAX_TCP_CONNECTIONS_PER_TASK));
    loop {
        let conn = match listener.accept().await {
            Ok((conn, _)) => conn,
            // Out of file descriptors and the like: wait a little instead of spinning.
            Err(_) => {
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            continue;
        };
        let (zone, shared) = (zone.clone(), shared.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let _ = tcp_conn(conn, zone, shared).await;
        });
    }
}

async fn tcp_conn(mut conn: TcpStream, zone: Arc<RwLock<Arc<Zone>>>, shared: Arc<Shared>) -> std::io::Result<()> {
    loop {
        let mut len = [0u8; 2];
        match tokio::time::timeout(TCP_IDLE_TIMEOUT, conn.read_exact(&mut len)).await {
            Ok(Ok(_)) => {}
            _ => return Ok(()),
        }
        let len = usize::from(u16::from_be_bytes(len));
        if len > MAX_MESSAGE_BYTES {
            return Ok(());
        }
        let mut query = vec![0u8; len];
        tokio::time::timeout(TCP_IDLE_TIMEOUT, conn.read_exact(&mut query)).await??;
        let z = zone.read().expect("zone lock").clone();
        let bytes = match answer(&z, &query, false) {
            Answer::Reply(b) => b,
            Answer::Drop => return Ok(()),
            Answer::Forward => match forward(&shared, &query).await {
                Some(b) => b,
                None => return Ok(()),
            },
        };
        let Ok(n) = u16::try_from(bytes.len()) else {
            return Ok(());
        };
        conn.write_all(&n.to_be_bytes()).await?;
        conn.write_all(&bytes).await?;
    }
}

/// Forwards `query` over UDP to the upstreams in turn; the first answer with the query's ID, or SERVFAIL.
async fn forward(shared: &Shared, query: &[u8]) -> Option<Vec<u8>> {
    let Ok(_permit) = shared.forwards.try_acquire() else {
        return servfail(query);
    };
    let id = query.get(..2)?.to_vec();
    for up in &shared.upstreams {
        let Ok(sock) = UdpSocket::bind(SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0))).await else {
            continue;
        };
        if sock.send_to(query, up).await.is_err() {
            continue;
        }
        let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
        let got = tokio::time::timeout(FORWARD_TIMEOUT, async {
            loop {
                let (n, from) = sock.recv_from(&mut buf).await?;
                if from == *up && buf.get(..2) == Some(id.as_slice()) {
                    return Ok::<usize, std::io::Error>(n);
                }
            }
        })
        .await;
        if let Ok(Ok(n)) = got {
            buf.truncate(n);
            return Some(buf);
        }
    }
    servfail(query)
}

/// A query for `name` and `rtype`, as wire bytes (for tests and tools).
#[cfg(any(test, feature = "test-doors"))]
pub fn query_bytes(id: u16, name: &str, rtype: RecordType) -> Vec<u8> {
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    if let Ok(n) = hickory_proto::rr::Name::from_ascii(name) {
        m.add_query(hickory_proto::op::Query::query(n, rtype));
    }
    m.to_vec().unwrap_or_default()
}

/// The AAAA records of a response (for tests and tools).
#[cfg(test)]
pub(crate) fn parse_response6(bytes: &[u8]) -> Option<Vec<Ipv6Addr>> {
    let m = Message::from_vec(bytes).ok()?;
    Some(
        m.answers
            .iter()
            .filter_map(|r| match &r.data {
                RData::AAAA(a) => Some(a.0),
                _ => None,
            })
            .collect(),
    )
}

/// The response code and A records of a response (for tests and tools).
#[cfg(any(test, feature = "test-doors"))]
pub fn parse_response(bytes: &[u8]) -> Option<(ResponseCode, bool, Vec<Ipv4Addr>)> {
    let m = Message::from_vec(bytes).ok()?;
    let addrs = m
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect();
    Some((m.metadata.response_code, m.metadata.truncation, addrs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Attachment, NetworkState, ServiceVip};

    fn state(backends: usize) -> (NodeNetState, TaskState) {
        let ip = |i: usize| Ipv4Addr::new(10, 9, u8::try_from(i / 250).unwrap(), u8::try_from(i % 250 + 2).unwrap());
        let svc = |name: &str, vip: Option<Ipv4Addr>, backends: Vec<Ipv4Addr>| ServiceVip {
            service_id: format!("id-{name}"),
            name: name.into(),
            aliases: if name == "web" { vec!["www".into()] } else { Vec::new() },
            vip,
            backends,
            backends6: Vec::new(),
        };
        let net = NetworkState {
            id: "n1".into(),
            name: "appnet".into(),
            vni: 10,
            subnet: "10.9.0.0/16".parse().unwrap(),
            gateway: Ipv4Addr::new(10, 9, 0, 1),
            more_subnets: Vec::new(),
            internal: false,
            encrypted: false,
            peers: Vec::new(),
            services: vec![
                svc("web", Some(Ipv4Addr::new(10, 9, 200, 1)), (0..backends).map(ip).collect()),
                svc("db", None, vec![ip(0)]),
            ],
            ipv6: None,
        };
        let task = TaskState {
            task_id: "t".into(),
            netns: "/run/netns/t".into(),
            attachments: vec![Attachment { network_id: "n1".into(), address: ip(1), ifname: None, address6: None }],
            joined: false,
        };
        let mut s = NodeNetState::new(Ipv4Addr::new(192, 0, 2, 1));
        s.networks = vec![net];
        s.tasks = vec![task.clone()];
        s.validate().expect("valid");
        (s, task)
    }

    fn check(zone: &Zone, name: &str, rtype: RecordType, want: Option<(ResponseCode, &[Ipv4Addr])>) {
        let got = match answer(zone, &query_bytes(7, name, rtype), true) {
            Answer::Reply(b) => {
                let (code, _, addrs) = parse_response(&b).expect("a response");
                Some((code, addrs))
            }
            Answer::Forward => None,
            Answer::Drop => panic!("{name}: dropped"),
        };
        assert_eq!(got.as_ref().map(|(c, a)| (*c, a.as_slice())), want, "{name} {rtype:?}");
    }

    #[test]
    fn names_of_the_tasks_networks_answer_and_others_are_forwarded() {
        let (s, t) = state(2);
        let z = zone_for(&s, &t);
        let vip: &[Ipv4Addr] = &[Ipv4Addr::new(10, 9, 200, 1)];
        let backends: &[Ipv4Addr] = &[Ipv4Addr::new(10, 9, 0, 2), Ipv4Addr::new(10, 9, 0, 3)];
        let ok = ResponseCode::NoError;
        check(&z, "web", RecordType::A, Some((ok, vip)));
        check(&z, "WEB.appnet.", RecordType::A, Some((ok, vip)));
        check(&z, "www", RecordType::A, Some((ok, vip)));
        check(&z, "tasks.web", RecordType::A, Some((ok, backends)));
        // An alias (a stack service's short name) has its `tasks.` name too, as in Docker.
        check(&z, "tasks.www", RecordType::A, Some((ok, backends)));
        check(&z, "tasks.www.appnet", RecordType::A, Some((ok, backends)));
        check(&z, "db", RecordType::A, Some((ok, &backends[..1])));
        check(&z, "web", RecordType::AAAA, Some((ok, &[])));
        check(&z, "example.org", RecordType::A, None);
        let internal = Zone { forward: false, ..z };
        check(&internal, "example.org", RecordType::A, Some((ResponseCode::Refused, &[])));
        assert_eq!(answer(&internal, b"not dns", true), Answer::Drop);
    }

    #[test]
    fn names_on_an_ipv6_network_answer_aaaa_with_the_tasks_ipv6_addresses() {
        let (mut s, t) = state(2);
        let v6 = |h: u16| Ipv6Addr::new(0xfd00, 9, 0, 0, 0, 0, 0, h);
        s.networks[0].ipv6 = Some(crate::state::Subnet6 { subnet: "fd00:9::/64".parse().unwrap(), gateway: v6(1) });
        s.networks[0].services[0].backends6 = vec![v6(3), v6(2)];
        s.validate().expect("valid");
        let z = zone_for(&s, &t);
        let aaaa = |name: &str| {
            let Answer::Reply(b) = answer(&z, &query_bytes(7, name, RecordType::AAAA), true) else { panic!("{name}") };
            (parse_response(&b).expect("a response").0, parse_response6(&b).expect("a response"))
        };
        let ok = ResponseCode::NoError;
        for name in ["web", "web.appnet", "www", "tasks.web", "tasks.www.appnet"] {
            assert_eq!(aaaa(name), (ok, vec![v6(2), v6(3)]), "{name}");
        }
        // A stays IPv4 (the VIP); a service without IPv6 backends has the name and no AAAA.
        check(&z, "web", RecordType::A, Some((ok, &[Ipv4Addr::new(10, 9, 200, 1)])));
        assert_eq!(aaaa("db"), (ok, vec![]));
        let Answer::Reply(b) = answer(&z, &query_bytes(7, "web", RecordType::ANY), true) else { panic!("ANY") };
        assert_eq!((parse_response(&b).unwrap().2.len(), parse_response6(&b).unwrap().len()), (1, 2));
    }

    #[test]
    fn large_answers_are_truncated_over_udp_only() {
        let (s, t) = state(200);
        let z = zone_for(&s, &t);
        let q = query_bytes(9, "tasks.web", RecordType::A);
        let Answer::Reply(udp) = answer(&z, &q, true) else { panic!("no answer") };
        let (_, tc, addrs) = parse_response(&udp).unwrap();
        assert!(tc && addrs.is_empty() && udp.len() <= CLASSIC_UDP_BYTES, "{} bytes, tc {tc}", udp.len());
        let Answer::Reply(tcp) = answer(&z, &q, false) else { panic!("no answer") };
        let (_, tc, addrs) = parse_response(&tcp).unwrap();
        assert!(!tc && addrs.len() == 200);
    }

    #[test]
    fn upstreams_come_from_resolv_conf() {
        let text = "# x\nnameserver 10.0.0.2\nnameserver ::1\nnameserver 127.0.0.11\nsearch a\nnameserver 1.1.1.1\n";
        let got: Vec<String> = upstreams_from_resolv_conf(text).iter().map(|a| a.to_string()).collect();
        assert_eq!(got, ["10.0.0.2:53", "1.1.1.1:53"]);
    }
}
