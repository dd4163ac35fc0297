//! Ingress published ports (SwarmKit's portallocator, our own code): each (protocol, published port) is held
//! by at most one service cluster-wide; a port published without a number gets the next free one of the
//! dynamic range 30000-32767 (next-fit, as the address pools). Host-mode ports are not held here: the
//! scheduler keeps them apart per node (`HostPortFilter`).
//!
//! Rebuilt from the services of a view, as the address pools. Pure.

use std::collections::HashMap;

/// First port of the dynamic range.
pub(crate) const DYNAMIC_PORT_START: u32 = 30000;
/// Last port of the dynamic range.
pub(crate) const DYNAMIC_PORT_END: u32 = 32767;

/// Which service holds each ingress port.
#[derive(Clone, Debug, Default)]
pub(crate) struct PortSpace {
    held: HashMap<(i32, u32), String>,
    cursor: u32,
}

impl PortSpace {
    /// The service holding `port` of `protocol`, if any.
    pub(crate) fn holder(&self, protocol: i32, port: u32) -> Option<&str> {
        self.held.get(&(protocol, port)).map(String::as_str)
    }

    /// Marks the port held by `service` (idempotent). False when another service holds it.
    pub(crate) fn reserve(&mut self, protocol: i32, port: u32, service: &str) -> bool {
        match self.held.get(&(protocol, port)) {
            Some(s) => s == service,
            None => {
                self.held.insert((protocol, port), service.to_string());
                true
            }
        }
    }

    /// Frees the port if `service` holds it.
    pub(crate) fn release(&mut self, protocol: i32, port: u32, service: &str) {
        if self.held.get(&(protocol, port)).is_some_and(|s| s == service) {
            self.held.remove(&(protocol, port));
        }
    }

    /// The next free port of the dynamic range for `protocol`, now held by `service`.
    pub(crate) fn allocate(&mut self, protocol: i32, service: &str) -> Option<u32> {
        let span = DYNAMIC_PORT_END - DYNAMIC_PORT_START + 1;
        for step in 0..span {
            let port = DYNAMIC_PORT_START + (self.cursor + step) % span;
            if let std::collections::hash_map::Entry::Vacant(e) = self.held.entry((protocol, port)) {
                e.insert(service.to_string());
                self.cursor = (port - DYNAMIC_PORT_START + 1) % span;
                return Some(port);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_held_once_per_protocol_and_dynamic_ones_come_from_the_range() {
        let mut p = PortSpace::default();
        assert!(p.reserve(0, 8080, "a"));
        assert!(p.reserve(0, 8080, "a"));
        assert!(!p.reserve(0, 8080, "b"));
        assert!(p.reserve(1, 8080, "b"), "udp 8080 is another port");
        assert_eq!(p.holder(0, 8080), Some("a"));
        p.release(0, 8080, "b");
        assert_eq!(p.holder(0, 8080), Some("a"));
        assert!(p.reserve(0, 30000, "c"));
        assert_eq!(p.allocate(0, "d"), Some(30001));
        assert_eq!(p.allocate(0, "d"), Some(30002));
        let mut full = PortSpace::default();
        for _ in DYNAMIC_PORT_START..=DYNAMIC_PORT_END {
            assert!(full.allocate(2, "x").is_some());
        }
        assert_eq!(full.allocate(2, "x"), None);
        assert_eq!(full.allocate(0, "x"), Some(30000));
    }
}
