//! The simulation in the test suite. By default 200 seeds (1..=200) in four tests of 50 that nextest runs
//! in parallel, each seed a fault phase of 400 steps (40 s of simulated time) and a heal phase. The
//! environment changes that: `SHOAL_SIM_SEED` replays one seed (in `sim_seeds_0`; the other chunks skip),
//! `SHOAL_SIM_SEEDS` and `SHOAL_SIM_FIRST_SEED` choose how many from where, `SHOAL_SIM_STEPS` the length of
//! the fault phase, `SHOAL_SIM_MEMBERSHIP=0` keeps the Raft voters fixed. A failing seed prints itself,
//! its last events and the command that replays it.

use std::sync::Arc;

use rand::SeedableRng;
use shoal_manager::{ClusterState, RandomIds};
use shoal_manager::{Dispatcher, DispatcherConfig};
use shoal_raft::LocalProposer;
use shoal_sim::{failover_steps, run, SimConfig};
use shoal_store::{ManualClock, MemoryStore};

/// Test chunks the default seeds are split into.
const CHUNKS: u64 = 4;
/// Seeds run by default.
const DEFAULT_SEEDS: u64 = 200;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| v.parse().unwrap_or_else(|_| panic!("{name} must be a number, got {v:?}")))
}

fn config() -> SimConfig {
    let mut cfg = SimConfig::default();
    if let Some(steps) = env_u64("SHOAL_SIM_STEPS") {
        cfg.fault_steps = steps;
    }
    if let Some(on) = env_u64("SHOAL_SIM_MEMBERSHIP") {
        cfg.membership_changes = on != 0;
    }
    cfg
}

/// Runs chunk `chunk` of the seeds the environment asks for.
fn seeds(chunk: u64) {
    let cfg = config();
    let seeds: Vec<u64> = match env_u64("SHOAL_SIM_SEED") {
        Some(seed) if chunk == 0 => vec![seed],
        Some(_) => Vec::new(),
        None => {
            let first = env_u64("SHOAL_SIM_FIRST_SEED").unwrap_or(1);
            let count = env_u64("SHOAL_SIM_SEEDS").unwrap_or(DEFAULT_SEEDS);
            (first..first + count).filter(|s| (s - first) % CHUNKS == chunk).collect()
        }
    };
    let (mut steps, mut acked, mut reads, mut forwarded, mut faults, mut addresses) = (0, 0, 0, 0, 0, 0);
    let (mut published, mut unpublished) = (0, 0);
    let mut membership_changes = 0;
    let mut failures = Vec::new();
    for seed in &seeds {
        match run(*seed, &cfg) {
            Ok(r) => {
                steps += r.steps;
                acked += r.acked;
                reads += r.reads;
                forwarded += r.forwarded;
                addresses = addresses.max(r.most_addresses);
                faults += r.faults;
                published += r.volume_publications.0;
                unpublished += r.volume_publications.1;
                membership_changes += r.membership_changes;
            }
            Err(f) => {
                eprintln!("{f}");
                failures.push(f.seed);
            }
        }
    }
    eprintln!(
        "{} seeds, {steps} steps, {acked} acknowledged requests ({reads} reads through a barrier), {forwarded} writes \
         forwarded by followers, at most {addresses} network addresses held at once, {faults} faults, \
         {published} cluster volume publications and {unpublished} unpublications, {membership_changes} raft \
         membership changes; failed: {failures:?}",
        seeds.len()
    );
    if seeds.len() >= 10 && failures.is_empty() {
        assert!(published > 0 && unpublished > 0, "the workload's cluster volume was never published and unpublished");
        assert!(!cfg.membership_changes || membership_changes > 0, "the raft membership never changed");
    }
    assert!(
        failures.is_empty(),
        "failing seeds: {failures:?} (replay one with SHOAL_SIM_SEED=<seed> cargo nextest run \
                                  -p shoal-sim sim_seeds_0)"
    );
}

#[test]
fn sim_seeds_0() {
    seeds(0);
}

#[test]
fn sim_seeds_1() {
    seeds(1);
}

#[test]
fn sim_seeds_2() {
    seeds(2);
}

#[test]
fn sim_seeds_3() {
    seeds(3);
}

/// One seed twice gives the same run, event for event.
#[test]
fn sim_replays_exactly() {
    let cfg = SimConfig { fault_steps: 300, ..SimConfig::default() };
    for seed in [7, 8] {
        let a = run(seed, &cfg);
        let b = run(seed, &cfg);
        assert_eq!(a, b, "seed {seed} did not replay exactly");
        let r = a.unwrap_or_else(|f| panic!("{f}"));
        assert!(r.acked > 0 && r.faults > 0, "seed {seed} did too little to show anything: {r:?}");
    }
}

/// The leader-only loops the daemon runs (`shoal_manager::leader_subsystems`), by name.
fn daemon_leader_loops() -> Vec<&'static str> {
    let store = Arc::new(MemoryStore::default());
    let proposer = Arc::new(LocalProposer::new(store.clone()));
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let state = ClusterState::new(store, proposer, clock, Arc::new(RandomIds::seeded(1)));
    let dispatcher = Dispatcher::new(state, DispatcherConfig::default());
    let rng = Box::new(rand::rngs::StdRng::seed_from_u64(1));
    shoal_manager::leader_subsystems(&dispatcher, rng, &shoal_manager::LeaderConfig::default())
        .iter()
        .map(|s| s.name())
        .collect()
}

/// The simulation's leaders run every leader-only loop the daemon runs, none left out.
#[test]
fn sim_leaders_run_the_daemons_leader_only_list() {
    let cfg = SimConfig { fault_steps: 100, ..SimConfig::default() };
    let r = run(3, &cfg).unwrap_or_else(|f| panic!("{f}"));
    let want = daemon_leader_loops();
    assert!(want.contains(&"allocator") && want.contains(&"keymanager") && want.contains(&"root-rotation"), "{want:?}");
    assert_eq!(r.leader_loops, want);
}

/// Where two runs of `SHOAL_SIM_SEED` part (a debugging aid; ignored in the suite).
#[test]
#[ignore]
fn sim_divergence() {
    let seed = env_u64("SHOAL_SIM_SEED").unwrap_or(1);
    let cfg = config();
    let (_, a) = shoal_sim::run_traced(seed, &cfg);
    let (_, b) = shoal_sim::run_traced(seed, &cfg);
    for (x, y) in a.iter().zip(b.iter()) {
        if x != y {
            panic!("runs part:\n  {x}\n  {y}");
        }
    }
    assert_eq!(a.len(), b.len());
}

/// Prints every event of `SHOAL_SIM_SEED` (a debugging aid; ignored in the suite).
#[test]
#[ignore]
fn sim_trace() {
    let seed = env_u64("SHOAL_SIM_SEED").unwrap_or(1);
    let (result, events) = shoal_sim::run_traced(seed, &config());
    for e in events.iter().filter(|e| !e.contains("] leader ")) {
        eprintln!("{e}");
    }
    eprintln!("{result:?}");
}

/// A crashed leader's followers find its port refusing connections (the daemon's transport probes a leader
/// silent for `PROBE_SILENT_LEADER_TICKS`) and end its lease instead of waiting out the election timeout: over
/// 40 crashes of a formed cluster's leader, the ticks to a new leader with the probe against the same seeds
/// without it (the sim's messages take whole steps, so both include several steps of round trips).
#[test]
fn a_crashed_leaders_followers_elect_sooner_when_its_port_refuses_connections() {
    let median = |probe_leaders: bool| {
        let cfg = SimConfig { faults: false, probe_leaders, ..SimConfig::default() };
        let mut steps: Vec<u64> =
            (1..=40).map(|seed| failover_steps(seed, &cfg).unwrap_or_else(|f| panic!("{f}"))).collect();
        steps.sort_unstable();
        eprintln!("ticks from the crash to a new leader, probing {probe_leaders}: {steps:?}");
        steps[steps.len() / 2]
    };
    let (with, without) = (median(true), median(false));
    // The lease ends at the probe (3 ticks) instead of at the election timeout (10): about 7 ticks sooner.
    assert!(with + 5 <= without, "median {with} ticks with the probe, {without} without");
}
