//! Per-source-address bounds on the connections of a listener reachable before authentication (the remote
//! gRPC port): how many handshakes and how many connections (handshaking or established) one IP address may
//! hold at once, with a guard per connection that gives its places back when it closes; and a log limiter
//! so a flood of refused connections writes a bounded number of lines.
//!
//! Pure bookkeeping over a mutex: no sockets, no TLS, no async. Time comes in as an `Instant` parameter.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The source already has `max_handshakes` handshakes in progress.
    Handshakes,
    /// The source already holds `max_connections` connections.
    Connections,
}

#[derive(Debug, Default, Clone, Copy)]
struct Held {
    handshakes: usize,
    connections: usize,
}

/// The counts per source address. Entries exist only while a source holds a connection, so the map holds
/// at most as many entries as there are open connections.
#[derive(Debug, Clone)]
pub(crate) struct SourceLimits {
    max_handshakes: usize,
    max_connections: usize,
    held: Arc<Mutex<HashMap<IpAddr, Held>>>,
}

impl SourceLimits {
    /// Limits of `max_handshakes` handshakes and `max_connections` connections per source address.
    pub(crate) fn new(max_handshakes: usize, max_connections: usize) -> SourceLimits {
        // A refused `admit` then always finds a non-empty entry, so no empty entry is ever left behind.
        assert!(max_handshakes >= 1 && max_connections >= 1, "limits of at least one connection");
        SourceLimits { max_handshakes, max_connections, held: Arc::default() }
    }

    /// Takes a handshake place and a connection place for a new connection from `ip`.
    pub(crate) fn admit(&self, ip: IpAddr) -> Result<SourceGuard, Refused> {
        let mut held = self.held.lock();
        let h = held.entry(ip).or_default();
        if h.connections >= self.max_connections {
            return Err(Refused::Connections);
        }
        if h.handshakes >= self.max_handshakes {
            return Err(Refused::Handshakes);
        }
        h.connections += 1;
        h.handshakes += 1;
        Ok(SourceGuard { limits: self.clone(), ip, handshaking: true })
    }

    /// Connections `ip` holds now (handshaking or established).
    #[cfg(test)]
    pub(crate) fn connections(&self, ip: IpAddr) -> usize {
        self.held.lock().get(&ip).map_or(0, |h| h.connections)
    }

    /// Handshakes `ip` has in progress now.
    #[cfg(test)]
    pub(crate) fn handshakes(&self, ip: IpAddr) -> usize {
        self.held.lock().get(&ip).map_or(0, |h| h.handshakes)
    }

    fn release(&self, ip: IpAddr, handshaking: bool) {
        let mut held = self.held.lock();
        if let Some(h) = held.get_mut(&ip) {
            h.connections = h.connections.saturating_sub(1);
            if handshaking {
                h.handshakes = h.handshakes.saturating_sub(1);
            }
            if h.connections == 0 {
                held.remove(&ip);
            }
        }
    }
}

/// One connection's places; dropping it gives them back.
#[derive(Debug)]
pub(crate) struct SourceGuard {
    limits: SourceLimits,
    ip: IpAddr,
    handshaking: bool,
}

impl SourceGuard {
    /// The handshake finished: the connection keeps only its connection place.
    pub(crate) fn established(&mut self) {
        if self.handshaking {
            self.handshaking = false;
            let mut held = self.limits.held.lock();
            if let Some(h) = held.get_mut(&self.ip) {
                h.handshakes = h.handshakes.saturating_sub(1);
            }
        }
    }
}

impl Drop for SourceGuard {
    fn drop(&mut self) {
        self.limits.release(self.ip, self.handshaking);
    }
}

/// At most one line per `every`; the lines left out in between are counted into the next one.
#[derive(Debug)]
pub(crate) struct LogLimiter {
    every: Duration,
    state: Mutex<(Option<Instant>, u64)>,
}

impl LogLimiter {
    /// A limiter writing at most one line per `every`.
    pub(crate) fn new(every: Duration) -> LogLimiter {
        LogLimiter { every, state: Mutex::new((None, 0)) }
    }

    /// `Some(n)` when a line should be written now, `n` being the lines suppressed since the last one;
    /// `None` when this one is suppressed.
    pub(crate) fn allow(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock();
        match s.0 {
            Some(last) if now.saturating_duration_since(last) < self.every => {
                s.1 += 1;
                None
            }
            _ => {
                let suppressed = s.1;
                *s = (Some(now), 0);
                Some(suppressed)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn each_source_is_bounded_in_handshakes_and_connections_and_gets_its_places_back() {
        let limits = SourceLimits::new(2, 3);
        let mut a = limits.admit(ip(9)).unwrap();
        let _b = limits.admit(ip(9)).unwrap();
        assert_eq!(limits.admit(ip(9)).unwrap_err(), Refused::Handshakes);
        let _other = limits.admit(ip(8)).expect("another source is not affected");
        a.established();
        assert_eq!(limits.handshakes(ip(9)), 1);
        let c = limits.admit(ip(9)).unwrap();
        drop(c);
        let mut c = limits.admit(ip(9)).unwrap();
        c.established();
        assert_eq!(limits.connections(ip(9)), 3);
        assert_eq!(limits.admit(ip(9)).unwrap_err(), Refused::Connections);
        drop((a, c));
        assert_eq!(limits.connections(ip(9)), 1);
        assert_eq!(limits.handshakes(ip(9)), 1);
        drop(_b);
        assert_eq!(limits.connections(ip(9)), 0);
        assert_eq!(limits.held.lock().len(), 1, "only the source still holding a connection has an entry");
    }

    #[test]
    fn the_log_limiter_writes_one_line_per_period_and_counts_the_rest() {
        let l = LogLimiter::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(l.allow(t0), Some(0));
        for i in 1..=5 {
            assert_eq!(l.allow(t0 + Duration::from_secs(i)), None);
        }
        assert_eq!(l.allow(t0 + Duration::from_secs(10)), Some(5));
        assert_eq!(l.allow(t0 + Duration::from_secs(11)), None);
    }
}
