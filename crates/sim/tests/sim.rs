//! The simulation in the test suite: `SHOAL_SIM_SEEDS` seeds (default 200) from `SHOAL_SIM_FIRST_SEED`
//! (default 1), each a fault phase of `SHOAL_SIM_STEPS` steps (default 400) and a heal phase; or the one
//! seed `SHOAL_SIM_SEED` to replay a failure. A failing seed prints itself and how to replay it.

use shoal_sim::{run, SimConfig};

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| v.parse().unwrap_or_else(|_| panic!("{name} must be a number, got {v:?}")))
}

fn config() -> SimConfig {
    let mut cfg = SimConfig::default();
    if let Some(steps) = env_u64("SHOAL_SIM_STEPS") {
        cfg.fault_steps = steps;
    }
    cfg
}

#[test]
fn sim_seeds() {
    let cfg = config();
    let seeds: Vec<u64> = match env_u64("SHOAL_SIM_SEED") {
        Some(seed) => vec![seed],
        None => {
            let first = env_u64("SHOAL_SIM_FIRST_SEED").unwrap_or(1);
            (first..first + env_u64("SHOAL_SIM_SEEDS").unwrap_or(200)).collect()
        }
    };
    let (mut steps, mut acked, mut faults) = (0, 0, 0);
    let mut failures = Vec::new();
    for seed in &seeds {
        match run(*seed, &cfg) {
            Ok(r) => {
                steps += r.steps;
                acked += r.acked;
                faults += r.faults;
            }
            Err(f) => {
                eprintln!("{f}");
                failures.push(f.seed);
            }
        }
    }
    eprintln!("{} seeds, {steps} steps, {acked} acknowledged writes, {faults} faults; failed: {failures:?}", seeds.len());
    assert!(failures.is_empty(), "failing seeds: {failures:?} (replay one with SHOAL_SIM_SEED=<seed> cargo nextest run -p shoal-sim sim)");
}

/// One seed twice gives the same run, event for event.
#[test]
fn sim_replays_exactly() {
    let cfg = SimConfig { fault_steps: 300, ..SimConfig::default() };
    for seed in [7, 8] {
        let a = run(seed, &cfg);
        let b = run(seed, &cfg);
        assert_eq!(a, b, "seed {seed} did not replay exactly");
    }
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
