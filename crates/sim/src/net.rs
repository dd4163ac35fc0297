//! The simulated network between managers and agents. Endpoints are managers (`Endpoint::Manager`) and
//! agents (`Endpoint::Agent`). A partition puts every endpoint on one of two sides; a message crosses only
//! between endpoints on the same side that are both up, at send time and at delivery.
//!
//! Raft messages (`Lane::Datagram`) are delayed independently, so they reorder, and each is lost with the
//! current loss rate. Agent traffic (`Lane::Stream`) models a gRPC connection: in order per direction;
//! a lost message breaks the connection (the sender's side is told with `Broken` after a delay, as a
//! keepalive would notice), so nothing is silently skipped inside a stream.
//!
//! Bounds: at most `MAX_IN_FLIGHT` messages in flight; beyond it new ones are dropped (a full queue).

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::Rng;

/// Most messages in flight at once.
pub const MAX_IN_FLIGHT: usize = 100_000;

/// One end of a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Endpoint {
    /// A manager, by Raft ID.
    Manager(u64),
    /// An agent, by index.
    Agent(usize),
}

/// How a message travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// Independently delayed and lost (Raft).
    Datagram,
    /// In order; a loss breaks the connection (agent sessions).
    Stream,
}

/// A message in flight.
#[derive(Debug)]
pub struct Envelope<M> {
    /// Sender.
    pub from: Endpoint,
    /// Receiver.
    pub to: Endpoint,
    /// How it travels.
    pub lane: Lane,
    /// Tell the sender when it is lost (`lost_notices`), as a transport reports a failed snapshot send.
    pub notify_loss: bool,
    /// The message.
    pub msg: M,
}

/// The network: in-flight messages by delivery step, partitions, loss rates.
#[derive(Debug)]
pub struct Network<M> {
    in_flight: BTreeMap<(u64, u64), Envelope<M>>,
    seq: u64,
    /// Side of each endpoint in the current partition (absent: side 0).
    side: BTreeMap<Endpoint, u8>,
    /// Endpoints that are down (crashed).
    down: BTreeMap<Endpoint, bool>,
    /// Last delivery step per stream direction (to keep streams in order).
    stream_tail: BTreeMap<(Endpoint, Endpoint), u64>,
    /// Chance of losing one message.
    pub loss: f64,
    /// Most steps a message is delayed.
    pub max_delay_steps: u64,
    /// Messages lost (loss, partition, endpoint down).
    pub lost: u64,
    /// Messages delivered.
    pub delivered: u64,
    /// Connections broken by a loss: (the side to tell, the peer), told at a later step.
    broken: BTreeMap<(u64, u64), (Endpoint, Endpoint)>,
    /// Lost messages whose sender asked to know: (sender, receiver).
    pub lost_notices: Vec<(Endpoint, Endpoint)>,
}

impl<M> Network<M> {
    /// A healed, lossless network.
    pub fn new() -> Network<M> {
        Network {
            in_flight: BTreeMap::new(),
            seq: 0,
            side: BTreeMap::new(),
            down: BTreeMap::new(),
            stream_tail: BTreeMap::new(),
            loss: 0.0,
            max_delay_steps: 1,
            lost: 0,
            delivered: 0,
            broken: BTreeMap::new(),
            lost_notices: Vec::new(),
        }
    }

    /// True when `a` and `b` are up and on the same side.
    pub fn connected(&self, a: Endpoint, b: Endpoint) -> bool {
        let up = |e: &Endpoint| !self.down.get(e).copied().unwrap_or(false);
        let side = |e: &Endpoint| self.side.get(e).copied().unwrap_or(0);
        up(&a) && up(&b) && side(&a) == side(&b)
    }

    /// True when `a` and `b` are on the same side of any partition (up or not).
    pub fn same_side(&self, a: Endpoint, b: Endpoint) -> bool {
        let side = |e: &Endpoint| self.side.get(e).copied().unwrap_or(0);
        side(&a) == side(&b)
    }

    /// Marks an endpoint down or up.
    pub fn set_down(&mut self, e: Endpoint, down: bool) {
        self.down.insert(e, down);
    }

    /// Puts each endpoint on the side given (a partition), or heals with an empty map.
    pub fn partition(&mut self, sides: BTreeMap<Endpoint, u8>) {
        self.side = sides;
    }

    /// True while some endpoints are cut from others.
    pub fn partitioned(&self) -> bool {
        self.side.values().any(|s| *s != 0)
    }

    /// Sends a message at step `now`.
    #[allow(clippy::too_many_arguments)]
    pub fn send(
        &mut self,
        rng: &mut StdRng,
        now: u64,
        lane: Lane,
        from: Endpoint,
        to: Endpoint,
        msg: M,
        notify_loss: bool,
    ) {
        let lost = self.in_flight.len() >= MAX_IN_FLIGHT || !self.connected(from, to) || rng.random_bool(self.loss);
        if lost {
            self.lost += 1;
            if notify_loss {
                self.lost_notices.push((from, to));
            }
            if lane == Lane::Stream {
                self.break_stream(rng, now, from, to);
            }
            return;
        }
        let mut at = now + 1 + rng.random_range(0..=self.max_delay_steps);
        if lane == Lane::Stream {
            let tail = self.stream_tail.entry((from, to)).or_insert(0);
            at = at.max(*tail);
            *tail = at;
        }
        self.seq += 1;
        self.in_flight.insert((at, self.seq), Envelope { from, to, lane, notify_loss, msg });
    }

    fn break_stream(&mut self, rng: &mut StdRng, now: u64, from: Endpoint, to: Endpoint) {
        let told = now + 1 + rng.random_range(0..=self.max_delay_steps * 4);
        self.seq += 1;
        self.broken.insert((told, self.seq), (from, to));
    }

    /// The messages due at step `now`, in delivery order; those whose link broke meanwhile are lost.
    pub fn due(&mut self, rng: &mut StdRng, now: u64) -> Vec<Envelope<M>> {
        let mut out = Vec::new();
        while let Some(entry) = self.in_flight.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let env = entry.remove();
            if self.connected(env.from, env.to) {
                self.delivered += 1;
                out.push(env);
            } else {
                self.lost += 1;
                if env.notify_loss {
                    self.lost_notices.push((env.from, env.to));
                }
                if env.lane == Lane::Stream {
                    self.break_stream(rng, now, env.from, env.to);
                }
            }
        }
        out
    }

    /// Connections found broken by step `now`: (the sender that learns it, its peer).
    pub fn broken_due(&mut self, now: u64) -> Vec<(Endpoint, Endpoint)> {
        let mut out = Vec::new();
        while let Some(entry) = self.broken.first_entry() {
            if entry.key().0 > now {
                break;
            }
            out.push(entry.remove());
        }
        out
    }
}

impl<M> Default for Network<M> {
    fn default() -> Self {
        Network::new()
    }
}
