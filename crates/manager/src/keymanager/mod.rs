//! The key manager (SwarmKit's manager/keymanager, leader-only): the cluster's network encryption keys.
//! Two subsystems, `networking:gossip` and `networking:ipsec` (the keys Docker's overlay driver uses for its
//! control gossip and for encrypted data paths, `docker network create --opt encrypted`), each with a
//! keyring of the `KEYRING_SIZE` newest AES-128-GCM keys (16 random bytes). Every key carries a Lamport
//! time: the cluster's `encryption_key_lamport_clock` is raised by one for each new key, so agents (and a
//! new leader) order keys without trusting any wall clock. The keys live in the cluster object
//! (`network_bootstrap_keys`), so they are Raft-replicated and survive failovers; the dispatcher sends them
//! to agents in session messages and resends them when they change.
//!
//! `Keyring` is the sans-IO core (what the cluster holds, completed and rotated with an injected RNG);
//! `runner.rs` is the loop: on gaining leadership it completes the keyring (a new cluster gets its keys),
//! then rotates every `ROTATION_INTERVAL_MS` on `ClusterState.timer` (as SwarmKit, the interval counts from
//! the leadership gain). A rotation drops each subsystem's oldest key and adds a new one, so the two
//! newest keys of the last rotation are still there: agents switch keys without a gap.
//!
//! Keys are secrets: neither API returns them (`swarmkit_api` clears them as SwarmKit's redaction does, the
//! Engine API never writes them), and `EncryptionKey`'s `Debug` shows a key's length only.
//!
//! Must not depend on other subsystems; only on `ClusterState`.

mod runner;
#[cfg(test)]
mod tests;

use rand::RngCore;
use shoal_api::encryption_key::Algorithm;
use shoal_api::{Cluster, EncryptionKey};

pub(crate) use runner::KeyManager;

/// The length of a key: AES-128.
pub(crate) const KEY_LEN_BYTES: usize = 16;
/// Keys kept per subsystem: the newest and the ones before it, so a rotation never strands an agent.
pub(crate) const KEYRING_SIZE: usize = 3;
/// How often the keys rotate (SwarmKit's default).
pub const ROTATION_INTERVAL_MS: u64 = 12 * 60 * 60 * 1000;
/// The subsystem of the overlay control plane's gossip keys.
pub const SUBSYSTEM_GOSSIP: &str = "networking:gossip";
/// The subsystem of the encrypted data path's keys (IPsec in Docker's overlay driver).
pub(crate) const SUBSYSTEM_IPSEC: &str = "networking:ipsec";
/// Every subsystem the key manager keeps keys for, in the order the keys are stored.
pub(crate) const SUBSYSTEMS: [&str; 2] = [SUBSYSTEM_GOSSIP, SUBSYSTEM_IPSEC];

/// The network keys and the Lamport clock a cluster object holds.
#[derive(Clone, PartialEq, Eq, Default, Debug)]
pub struct Keyring {
    /// The keys, grouped by subsystem (in `SUBSYSTEMS` order), oldest first within one.
    pub keys: Vec<EncryptionKey>,
    /// The Lamport time of the newest key (never lower than any key's).
    pub lamport_clock: u64,
}

/// True for a key the key manager would have made: a known subsystem, AES-128-GCM, 16 bytes.
fn usable(k: &EncryptionKey) -> bool {
    SUBSYSTEMS.contains(&k.subsystem.as_str())
        && k.algorithm == Algorithm::Aes128Gcm as i32
        && k.key.len() == KEY_LEN_BYTES
}

impl Keyring {
    /// The keyring `cluster` holds.
    pub fn of(cluster: &Cluster) -> Keyring {
        Keyring { keys: cluster.network_bootstrap_keys.clone(), lamport_clock: cluster.encryption_key_lamport_clock }
    }

    /// Writes this keyring into `cluster`.
    pub fn store_in(&self, cluster: &mut Cluster) {
        cluster.network_bootstrap_keys = self.keys.clone();
        cluster.encryption_key_lamport_clock = self.lamport_clock;
    }

    /// The keys of `subsystem`, oldest first.
    pub fn keys_of(&self, subsystem: &str) -> Vec<&EncryptionKey> {
        let mut keys: Vec<&EncryptionKey> = self.keys.iter().filter(|k| k.subsystem == subsystem).collect();
        keys.sort_by_key(|k| k.lamport_time);
        keys
    }

    /// A keyring in which every subsystem has between one and `KEYRING_SIZE` usable keys, or `None` when
    /// this one already is one. A cluster without keys gets `KEYRING_SIZE` per subsystem, its clock
    /// starting at a random offset below 65,536 (SwarmKit's skew); keys that are not usable are dropped,
    /// a subsystem left without keys gets a full ring, one with too many keeps its newest.
    pub fn completed(&self, rng: &mut dyn RngCore) -> Option<Keyring> {
        let mut clock = self.lamport_clock.max(self.keys.iter().map(|k| k.lamport_time).max().unwrap_or(0));
        if self.keys.is_empty() && clock == 0 {
            clock = u64::from(rng.next_u32() & 0xffff);
        }
        let mut next = Keyring { keys: Vec::new(), lamport_clock: clock };
        for subsystem in SUBSYSTEMS {
            let mut keys: Vec<EncryptionKey> =
                self.keys_of(subsystem).into_iter().filter(|k| usable(k)).cloned().collect();
            if keys.len() > KEYRING_SIZE {
                keys.drain(..keys.len() - KEYRING_SIZE);
            }
            if keys.is_empty() {
                for _ in 0..KEYRING_SIZE {
                    keys.push(next.new_key(subsystem, rng));
                }
            }
            next.keys.extend(keys);
        }
        (next != *self).then_some(next)
    }

    /// This keyring (completed first if it needs to be) after one rotation: in every subsystem the oldest
    /// key goes when the ring is full, and a new key with the next Lamport time is added.
    pub fn rotated(&self, rng: &mut dyn RngCore) -> Keyring {
        let base = self.completed(rng).unwrap_or_else(|| self.clone());
        let mut next = Keyring { keys: Vec::new(), lamport_clock: base.lamport_clock };
        for subsystem in SUBSYSTEMS {
            let mut keys: Vec<EncryptionKey> = base.keys_of(subsystem).into_iter().cloned().collect();
            if keys.len() >= KEYRING_SIZE {
                keys.drain(..keys.len() + 1 - KEYRING_SIZE);
            }
            keys.push(next.new_key(subsystem, rng));
            next.keys.extend(keys);
        }
        next
    }

    /// A new random key of `subsystem`, stamped with the next Lamport time.
    fn new_key(&mut self, subsystem: &str, rng: &mut dyn RngCore) -> EncryptionKey {
        let mut key = vec![0u8; KEY_LEN_BYTES];
        rng.fill_bytes(&mut key);
        self.lamport_clock += 1;
        EncryptionKey {
            subsystem: subsystem.to_string(),
            algorithm: Algorithm::Aes128Gcm as i32,
            key,
            lamport_time: self.lamport_clock,
        }
    }
}
