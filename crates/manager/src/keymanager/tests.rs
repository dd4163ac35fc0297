//! The key manager: the keyring's rules (completion, rotation, the Lamport clock) as pure functions, and
//! the leader-only loop against a real store with a stepped timer, rotating after 12 hours and not before.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::SeedableRng;
use shoal_api::encryption_key::Algorithm;
use shoal_api::{Cluster, EncryptionKey};
use shoal_raft::LocalProposer;
use shoal_store::{Changes, ManualClock, MemoryStore};
use tokio::sync::watch;

use super::*;
use crate::state::{ClusterState, RandomIds};
use crate::{ManualTimer, Subsystem};

fn rng() -> StdRng {
    StdRng::seed_from_u64(42)
}

fn lamports(ring: &Keyring, subsystem: &str) -> Vec<u64> {
    ring.keys_of(subsystem).iter().map(|k| k.lamport_time).collect()
}

#[test]
fn a_cluster_without_keys_gets_a_full_ring_per_subsystem() {
    let ring = Keyring::default().completed(&mut rng()).expect("keys to add");
    assert_eq!(ring.keys.len(), KEYRING_SIZE * SUBSYSTEMS.len());
    assert!(ring.lamport_clock < 65_536 + 6, "the clock starts at a skew below 65,536: {}", ring.lamport_clock);
    for subsystem in SUBSYSTEMS {
        let times = lamports(&ring, subsystem);
        assert_eq!(times.len(), KEYRING_SIZE);
        assert!(times.windows(2).all(|w| w[0] < w[1]), "{times:?}");
    }
    assert_eq!(ring.keys.iter().map(|k| k.lamport_time).max(), Some(ring.lamport_clock));
    assert!(ring.keys.iter().all(|k| k.key.len() == KEY_LEN_BYTES && k.algorithm == Algorithm::Aes128Gcm as i32));
    let distinct: std::collections::BTreeSet<&Vec<u8>> = ring.keys.iter().map(|k| &k.key).collect();
    assert_eq!(distinct.len(), ring.keys.len(), "every key is new random bytes");
    assert_eq!(ring.completed(&mut rng()), None, "a complete ring is left alone");
}

#[test]
fn a_rotation_drops_the_oldest_key_of_each_subsystem_and_adds_a_newer_one() {
    let first = Keyring::default().completed(&mut rng()).unwrap();
    let second = first.rotated(&mut rng());
    assert_eq!(second.lamport_clock, first.lamport_clock + SUBSYSTEMS.len() as u64);
    for subsystem in SUBSYSTEMS {
        let (before, after) = (lamports(&first, subsystem), lamports(&second, subsystem));
        assert_eq!(after.len(), KEYRING_SIZE);
        assert_eq!(&after[..KEYRING_SIZE - 1], &before[1..], "the two newest keys stay: {before:?} -> {after:?}");
        assert!(after[KEYRING_SIZE - 1] > before[KEYRING_SIZE - 1]);
        assert!(after[KEYRING_SIZE - 1] <= second.lamport_clock);
    }
    let third = second.rotated(&mut rng());
    assert!(
        third.keys.iter().all(|k| first.keys_of(&k.subsystem).first().is_none_or(|oldest| oldest.key != k.key)),
        "two rotations later the first ring's oldest keys are gone"
    );
}

#[test]
fn damaged_or_foreign_keys_are_replaced_and_the_clock_never_goes_back() {
    let good = |t: u64| EncryptionKey {
        subsystem: SUBSYSTEM_GOSSIP.into(),
        algorithm: Algorithm::Aes128Gcm as i32,
        key: vec![u8::try_from(t).unwrap(); KEY_LEN_BYTES],
        lamport_time: t,
    };
    let short = EncryptionKey { key: vec![1; 5], ..good(90) };
    let foreign = EncryptionKey { subsystem: "swarm-manager".into(), ..good(91) };
    // Gossip has 4 good keys (one too many) and a short one; IPsec has none. The clock lags behind the keys.
    let ring = Keyring { keys: vec![good(10), good(11), good(12), good(13), short, foreign], lamport_clock: 5 };
    let fixed = ring.completed(&mut rng()).unwrap();
    assert_eq!(lamports(&fixed, SUBSYSTEM_GOSSIP), vec![11, 12, 13], "the newest three usable keys stay");
    assert_eq!(lamports(&fixed, SUBSYSTEM_IPSEC), vec![92, 93, 94], "new keys come after every key seen");
    assert_eq!(fixed.lamport_clock, 94);
    assert_eq!(fixed.keys.len(), 6);
}

struct Fx {
    state: ClusterState,
    timer: Arc<ManualTimer>,
    _stop: watch::Sender<bool>,
}

fn keyring(state: &ClusterState) -> Keyring {
    state.store.view(|t| t.clusters().get("c1").map(|c| Keyring::of(c)).unwrap_or_default())
}

/// Waits (tokio time, 10 s, every 5 ms) until the cluster's keyring passes `f`; returns it.
async fn wait_for(state: &ClusterState, what: &str, f: impl Fn(&Keyring) -> bool) -> Keyring {
    crate::wait::wait_until_async(what, Duration::from_secs(10), Duration::from_millis(5), || {
        let ring = keyring(state);
        if f(&ring) {
            Ok(ring)
        } else {
            Err(format!("{ring:?}"))
        }
    })
    .await
}

/// Waits until the loop sleeps on the timer (so a step of time is seen by that sleep).
async fn asleep(fx: &Fx) {
    let sleeping = crate::wait::holds(|| fx.timer.pending_sleeps() > 0);
    crate::wait::wait_until_async(
        "the key manager to wait on the timer",
        Duration::from_secs(10),
        Duration::from_millis(1),
        sleeping,
    )
    .await
}

fn start(ring: Keyring) -> Fx {
    let store = Arc::new(MemoryStore::default());
    let mut cluster = Cluster { id: "c1".into(), ..Default::default() };
    ring.store_in(&mut cluster);
    store.apply(1, Changes::new().create(cluster).actions()).unwrap();
    let timer = Arc::new(ManualTimer::default());
    let state = ClusterState::new(
        store.clone(),
        Arc::new(LocalProposer::new(store)),
        Arc::new(ManualClock::new(1_700_000_000_000)),
        Arc::new(RandomIds::seeded(1)),
    )
    .with_timer(timer.clone());
    let (stop_tx, stop_rx) = watch::channel(false);
    let km = KeyManager::with_rng(Box::new(rng()), ROTATION_INTERVAL_MS);
    tokio::spawn(km.run(state.clone(), stop_rx));
    Fx { state, timer, _stop: stop_tx }
}

#[tokio::test]
async fn the_leader_makes_the_keys_then_rotates_them_every_12_hours() {
    let fx = start(Keyring::default());
    let first = wait_for(&fx.state, "the first keys", |r| r.keys.len() == 6).await;
    asleep(&fx).await;
    // Just short of 12 hours: the loop is woken, looks, and goes back to sleep without rotating.
    fx.timer.advance_ms(ROTATION_INTERVAL_MS - 1);
    asleep(&fx).await;
    assert_eq!(keyring(&fx.state), first, "no rotation before 12 hours");
    fx.timer.advance_ms(1);
    let second = wait_for(&fx.state, "the first rotation", |r| r.lamport_clock > first.lamport_clock).await;
    assert_eq!(second.lamport_clock, first.lamport_clock + 2);
    for subsystem in SUBSYSTEMS {
        assert_eq!(&lamports(&second, subsystem)[..2], &lamports(&first, subsystem)[1..]);
    }
    asleep(&fx).await;
    fx.timer.advance_ms(ROTATION_INTERVAL_MS);
    let third = wait_for(&fx.state, "the second rotation", |r| r.lamport_clock > second.lamport_clock).await;
    assert_eq!(third.lamport_clock, first.lamport_clock + 4);
}

#[tokio::test]
async fn a_new_leader_keeps_the_keys_it_finds() {
    let existing = Keyring::default().completed(&mut StdRng::seed_from_u64(9)).unwrap();
    let fx = start(existing.clone());
    asleep(&fx).await;
    // The loop found a complete ring: it wrote nothing before sleeping.
    assert_eq!(keyring(&fx.state), existing);
    fx.timer.advance_ms(ROTATION_INTERVAL_MS);
    let rotated = wait_for(&fx.state, "a rotation", |r| r.lamport_clock > existing.lamport_clock).await;
    for subsystem in SUBSYSTEMS {
        assert_eq!(&lamports(&rotated, subsystem)[..2], &lamports(&existing, subsystem)[1..]);
    }
}
