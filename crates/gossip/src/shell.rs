//! The member's IO: one UDP socket and one TCP listener on the same address (memberlist's transport), the
//! keys from a watch channel, the clock and the nonces. Bounds: at most `MAX_STREAMS` streams at once, each
//! one message of at most `wire::MAX_STREAM_BYTES` read within `STREAM_TIMEOUT`; packets of at most 64 KiB.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ring::rand::{SecureRandom, SystemRandom};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;

use crate::member::{Entries, Event, Member, Peer};
use crate::wire::{kind, MAX_STREAM_BYTES, NONCE_BYTES};

/// The port Docker Engines gossip on, and join the managers' members at.
pub const GOSSIP_PORT: u16 = 7946;
/// Most streams served at once (memberlist's own limit on concurrent push-pulls is 128).
pub const MAX_STREAMS: usize = 64;
/// How long a stream may take to send its message.
pub const STREAM_TIMEOUT: Duration = Duration::from_secs(10);

/// The running member; dropping it stops it.
#[derive(Debug)]
pub struct GossipHandle {
    member: Arc<Mutex<Member>>,
    task: JoinHandle<()>,
    addr: SocketAddr,
}

impl GossipHandle {
    /// The members known, by name.
    pub fn peers(&self) -> BTreeMap<String, Peer> {
        self.member.lock().unwrap_or_else(PoisonError::into_inner).peers().clone()
    }

    /// The address it serves on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for GossipHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn nonce(rng: &SystemRandom) -> [u8; NONCE_BYTES] {
    let mut n = [0u8; NONCE_BYTES];
    // The system's random source does not fail on the systems Shoal runs on; a zero nonce would only weaken
    // the one message.
    let _ = rng.fill(&mut n);
    n
}

fn log_events(member: &mut Member) {
    for e in member.take_events() {
        match e {
            Event::Joined(name, addr) => tracing::info!(member = %name, %addr, "gossip: member joined"),
            Event::Gone(name) => tracing::info!(member = %name, "gossip: member gone"),
        }
    }
}

/// Serves member `name` on `addr` (UDP and TCP), with the keys `keys` holds (primary first), publishing
/// the entries `entries` holds (`Member::publish`).
pub async fn serve(
    name: String,
    addr: SocketAddr,
    mut keys: watch::Receiver<Vec<Vec<u8>>>,
    mut entries: watch::Receiver<Entries>,
) -> std::io::Result<GossipHandle> {
    // TCP first: with port 0 (tests) the UDP socket takes the port the listener got.
    let tcp = TcpListener::bind(addr).await?;
    let addr = SocketAddr::new(addr.ip(), tcp.local_addr()?.port());
    let udp = Arc::new(UdpSocket::bind(addr).await?);
    let mut m = Member::new(name, addr);
    m.set_keys(keys.borrow_and_update().clone());
    // The entries held at the start are published as the first change (a restarted manager's included).
    entries.mark_changed();
    let member = Arc::new(Mutex::new(m));
    let shared = member.clone();
    let task = tokio::spawn(async move {
        let epoch = Instant::now();
        let rng = SystemRandom::new();
        let streams = Arc::new(Semaphore::new(MAX_STREAMS));
        let mut buf = vec![0u8; 65_536];
        let mut entries_open = true;
        loop {
            tokio::select! {
                r = udp.recv_from(&mut buf) => {
                    let Ok((n, from)) = r else { continue };
                    let now_ms = u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
                    let (out, relays) = {
                        let mut m = shared.lock().unwrap_or_else(PoisonError::into_inner);
                        let out = m.on_packet(&buf[..n], from, now_ms, &mut || nonce(&rng));
                        log_events(&mut m);
                        (out, m.take_relays(&mut || nonce(&rng)))
                    };
                    match out {
                        Ok(out) => send_all(&udp, out).await,
                        Err(e) => tracing::debug!(%from, "gossip packet dropped: {e}"),
                    }
                    send_all(&udp, relays.unwrap_or_default()).await;
                }
                r = tcp.accept() => {
                    let Ok((conn, from)) = r else { continue };
                    let Ok(permit) = streams.clone().try_acquire_owned() else {
                        tracing::warn!(%from, "gossip: {MAX_STREAMS} streams open already; connection closed");
                        continue;
                    };
                    let member = shared.clone();
                    let udp = udp.clone();
                    let n = nonce(&rng);
                    let now_ms = u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
                    tokio::spawn(async move {
                        let _permit = permit;
                        match tokio::time::timeout(STREAM_TIMEOUT, stream(conn, &member, &udp, now_ms, n)).await {
                            Ok(Ok(())) => {}
                            Ok(Err(e)) => tracing::debug!(%from, "gossip stream: {e}"),
                            Err(_) => tracing::debug!(%from, "gossip stream timed out"),
                        }
                    });
                }
                r = entries.changed(), if entries_open => {
                    if r.is_err() {
                        entries_open = false;
                        continue;
                    }
                    let e = entries.borrow_and_update().clone();
                    let epoch = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_secs())
                        .unwrap_or(0);
                    let relays = {
                        let mut m = shared.lock().unwrap_or_else(PoisonError::into_inner);
                        m.publish(e, epoch);
                        m.take_relays(&mut || nonce(&rng))
                    };
                    send_all(&udp, relays.unwrap_or_default()).await;
                }
                r = keys.changed() => {
                    if r.is_err() {
                        return;
                    }
                    let k = keys.borrow_and_update().clone();
                    shared.lock().unwrap_or_else(PoisonError::into_inner).set_keys(k);
                }
            }
        }
    });
    Ok(GossipHandle { member, task, addr })
}

/// Sends each packet to its destination (a lost UDP packet is gossip's normal weather).
async fn send_all(udp: &UdpSocket, packets: Vec<(SocketAddr, Vec<u8>)>) {
    for (to, bytes) in packets {
        let _ = udp.send_to(&bytes, to).await;
    }
}

/// Reads one encrypted message from `conn`, writes the member's answer, and passes on over `udp` the news
/// it brought.
async fn stream(
    mut conn: TcpStream,
    member: &Mutex<Member>,
    udp: &UdpSocket,
    now_ms: u64,
    nonce: [u8; NONCE_BYTES],
) -> std::io::Result<()> {
    let mut head = [0u8; 5];
    conn.read_exact(&mut head[..1]).await?;
    if head[0] != kind::ENCRYPT {
        return Err(std::io::Error::other("an unencrypted stream (the cluster's members all encrypt)"));
    }
    conn.read_exact(&mut head[1..]).await?;
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]);
    if len > MAX_STREAM_BYTES {
        return Err(std::io::Error::other(format!("a stream message of {len} bytes")));
    }
    let mut frame = head.to_vec();
    frame.resize(5 + len as usize, 0);
    conn.read_exact(&mut frame[5..]).await?;
    let (reply, relays, streams) = {
        let mut m = member.lock().unwrap_or_else(PoisonError::into_inner);
        let reply = m.on_stream(&frame, now_ms, nonce);
        log_events(&mut m);
        let rng = SystemRandom::new();
        (reply, m.take_relays(&mut || self::nonce(&rng)), m.take_streams(&mut || self::nonce(&rng)))
    };
    send_all(udp, relays.unwrap_or_default()).await;
    let answered = match reply {
        Ok(Some(bytes)) => conn.write_all(&bytes).await,
        Ok(None) => Ok(()),
        Err(e) => Err(std::io::Error::other(e.to_string())),
    };
    drop(conn);
    // Answers that go on a connection of their own (bulk syncs), within the caller's stream timeout.
    for (to, bytes) in streams.unwrap_or_default() {
        let sent = async {
            let mut c = TcpStream::connect(to).await?;
            c.write_all(&bytes).await?;
            c.shutdown().await
        };
        if let Err(e) = sent.await {
            tracing::debug!(%to, "gossip: bulk sync answer not sent: {e}");
        }
    }
    answered
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{self, Writer};

    fn join_frame(key: &[u8]) -> Vec<u8> {
        let mut w = Writer::with_type(kind::PUSH_PULL);
        w.map(3).key("Nodes").uint(1).key("UserStateLen").uint(0).key("Join").bool(true);
        w.map(7).key("Name").raw(b"engine-a").key("Addr").raw(&[127, 0, 0, 1]).key("Port").uint(9);
        w.key("Meta").raw(&[]).key("Incarnation").uint(1).key("State").uint(0).key("Vsn").raw(&[1, 5, 2, 0, 0, 0]);
        wire::seal_stream(key, [4; NONCE_BYTES], &w.out).unwrap()
    }

    /// A push-pull over TCP: the reply's plaintext, or None when the member closed without one.
    async fn push_pull(addr: SocketAddr, key: &[u8]) -> Option<Vec<u8>> {
        let mut conn = TcpStream::connect(addr).await.unwrap();
        conn.write_all(&join_frame(key)).await.unwrap();
        let mut reply = Vec::new();
        conn.read_to_end(&mut reply).await.ok()?;
        if reply.is_empty() {
            return None;
        }
        Some(wire::open_stream(&[key.to_vec()], &reply).unwrap())
    }

    /// An engine's periodic bulk sync: the member answers on a connection of its own to the engine's
    /// gossip port, with the entries it publishes in the networks the engine named.
    #[tokio::test]
    async fn a_bulk_sync_is_answered_on_a_connection_to_the_engine() {
        let key = vec![7u8; 16];
        let engine = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = engine.local_addr().unwrap().port();
        let entries = Entries::from([(("net1".into(), crate::PEER_TABLE.into(), "t1".into()), b"r1".to_vec())]);
        let (_entries, entries_rx) = watch::channel(entries);
        let (_keys, keys_rx) = watch::channel(vec![key.clone()]);
        let h = serve("shoal-m".into(), "127.0.0.1:0".parse().unwrap(), keys_rx, entries_rx).await.unwrap();
        // The engine joins (its push-pull names its gossip port), then asks for a bulk sync of net1.
        let mut w = Writer::with_type(kind::PUSH_PULL);
        w.map(3).key("Nodes").uint(1).key("UserStateLen").uint(0).key("Join").bool(true);
        w.map(7).key("Name").raw(b"engine-a").key("Addr").raw(&[127, 0, 0, 1]).key("Port").uint(u64::from(port));
        w.key("Meta").raw(&[]).key("Incarnation").uint(1).key("State").uint(0).key("Vsn").raw(&[1, 5, 2, 0, 0, 0]);
        let mut conn = TcpStream::connect(h.addr()).await.unwrap();
        conn.write_all(&wire::seal_stream(&key, [4; NONCE_BYTES], &w.out).unwrap()).await.unwrap();
        conn.read_to_end(&mut Vec::new()).await.unwrap();
        let bsm = crate::member::tests::bulk_sync("engine-a", &["net1"]);
        let mut sync = Writer::with_type(kind::USER);
        sync.map(1).key("UserMsgLen").uint(bsm.len() as u64);
        sync.out.extend_from_slice(&bsm);
        let mut conn = TcpStream::connect(h.addr()).await.unwrap();
        conn.write_all(&wire::seal_stream(&key, [5; NONCE_BYTES], &sync.out).unwrap()).await.unwrap();
        drop(conn);
        let (mut answer, _) = tokio::time::timeout(Duration::from_secs(10), engine.accept()).await.unwrap().unwrap();
        let mut frame = Vec::new();
        answer.read_to_end(&mut frame).await.unwrap();
        let (from, networks, events) = crate::member::tests::read_bulk_sync_answer(&frame, &key);
        assert_eq!((from.as_str(), networks.as_slice()), ("shoal-m", ["net1".to_string()].as_slice()));
        assert_eq!(events.iter().map(|e| e.1.as_str()).collect::<Vec<_>>(), ["t1"]);
    }

    #[tokio::test]
    async fn the_member_answers_on_its_sockets_and_follows_a_key_rotation() {
        let (k1, k2) = (vec![1u8; 16], vec![2u8; 16]);
        let (keys, rx) = watch::channel(vec![k1.clone()]);
        let h = serve("shoal-m".into(), "127.0.0.1:0".parse().unwrap(), rx, watch::channel(Default::default()).1)
            .await
            .unwrap();
        let addr = h.addr();
        assert_ne!(addr.port(), 0);
        let reply = push_pull(addr, &k1).await.expect("an answer");
        assert_eq!(reply[0], kind::PUSH_PULL);
        assert!(h.peers().contains_key("engine-a"));
        // A probe over UDP is acked to its source.
        let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let mut ping = Writer::with_type(kind::PING);
        ping.map(2).key("SeqNo").uint(41).key("Node").raw(b"shoal-m");
        udp.send_to(&wire::seal(&k1, [5; NONCE_BYTES], b"", &ping.out).unwrap(), addr).await.unwrap();
        let mut buf = [0u8; 1500];
        let (n, _) = tokio::time::timeout(Duration::from_secs(10), udp.recv_from(&mut buf)).await.unwrap().unwrap();
        let ack = wire::open(std::slice::from_ref(&k1), &buf[..n], b"").unwrap();
        assert_eq!(ack[0], kind::ACK);
        // The key manager rotates: the new key is taken, the old one no longer opens anything.
        keys.send(vec![k2.clone()]).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while push_pull(addr, &k2).await.is_none() {
            assert!(tokio::time::Instant::now() < deadline, "the member never took the new key");
            tokio::task::yield_now().await;
        }
        assert!(push_pull(addr, &k1).await.is_none(), "the old key is refused");
        // Dropped, it stops serving.
        drop(h);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(addr).await.is_ok() {
            assert!(tokio::time::Instant::now() < deadline, "still serving after drop");
            tokio::task::yield_now().await;
        }
    }
}
