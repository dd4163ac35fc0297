//! The overlay gossip member (`shoal_gossip`): packets and stream messages a Docker Engine (or anything
//! holding the cluster's gossip key: every node gets it) sends a manager. The input is the plaintext,
//! sealed here with the member's key so the mutations reach the decoders behind the encryption; selector 2
//! feeds the bytes unsealed.

use std::net::SocketAddr;

use shoal_gossip::member::MAX_MEMBERS;
use shoal_gossip::wire::{seal, seal_stream};
use shoal_gossip::Member;

use super::split_selector;

const KEY: [u8; 16] = [7; 16];

/// Selector 0: a packet's plaintext; 1: a stream message's plaintext; 2: raw bytes as a packet and as a
/// stream. The member's table stays within its bound.
pub fn messages(data: &[u8]) {
    let (sel, rest) = split_selector(data);
    let from: SocketAddr = "10.0.0.2:7946".parse().expect("constant");
    let mut m = Member::new("fuzz".into(), "10.0.0.1:7946".parse().expect("constant"));
    m.set_keys(vec![KEY.to_vec()]);
    let mut nonce = || [2u8; 12];
    match sel % 3 {
        0 => {
            let packet = seal(&KEY, [1; 12], b"", rest).expect("a 16-byte key");
            let _ = m.on_packet(&packet, from, 0, &mut nonce);
        }
        1 => {
            let frame = seal_stream(&KEY, [1; 12], rest).expect("a 16-byte key");
            let _ = m.on_stream(&frame, 0, [2; 12]);
        }
        _ => {
            let _ = m.on_packet(rest, from, 0, &mut nonce);
            let _ = m.on_stream(rest, 0, [2; 12]);
        }
    }
    assert!(m.peers().len() <= MAX_MEMBERS);
}

/// Field names the mutator inserts.
pub const DICT: &[&str] = &[
    "SeqNo",
    "Node",
    "Incarnation",
    "Addr",
    "Port",
    "Meta",
    "Vsn",
    "Nodes",
    "UserStateLen",
    "Join",
    "Name",
    "State",
    "Algo",
    "Buf",
    "From",
];
