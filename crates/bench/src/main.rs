//! `shoal-bench`: Shoal's benchmarks and load generators, one subcommand per scenario (see BENCHMARKS.md at
//! the repository root for the figures and how they compare with SwarmKit). Every scenario prints a short
//! table and, as its last line, `RESULT <scenario> <value> <unit>`; `--smoke` runs a size that takes
//! seconds, which the test suite runs through the built binary so the benchmarks keep working.
//!
//! Scenarios that need a real daemon start `shoal daemon` from the `shoal` binary next to this one (or
//! `--shoal PATH` / `SHOAL_BIN`) on a temporary state dir, and stop it when done, even on failure.
//! This crate is a client of the other crates; nothing in the workspace depends on it.

mod agents;
mod daemon;
mod e2e;
mod engine_client;
mod failover;
mod idle;
mod memory;
mod procstat;
mod report;
mod scheduler;
mod startup;
mod writes;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[path = "../../shoal/src/mimalloc_setup.rs"]
mod mimalloc_setup;

/// The allocator `shoal daemon` uses, set up (`mimalloc_setup::set_up`) as the daemon sets it up, so that
/// in-process scenarios (scheduler, agents) measure the same.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Shoal benchmarks. Each prints a table, then `RESULT <scenario> <value> <unit>` as its last line.
#[derive(Debug, Parser)]
#[command(name = "shoal-bench", about)]
struct Args {
    /// The `shoal` binary to start daemons from (default: `shoal` next to this binary).
    #[arg(long, env = "SHOAL_BIN", global = true)]
    shoal: Option<PathBuf>,
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Debug, Subcommand)]
enum Scenario {
    /// The scheduler core in memory: time from "tasks pending" to "all assigned and written to the store".
    Scheduler(scheduler::SchedulerArgs),
    /// Service creates per second through the Engine API (or the `shoal` CLI) of a real daemon.
    Writes(writes::WritesArgs),
    /// One service with R replicas on N simulated nodes (fake executors, real gRPC, real Raft) until all
    /// are RUNNING.
    E2e(e2e::E2eArgs),
    /// Simulated agents: N fake nodes with real dispatcher sessions and heartbeats against an in-process
    /// manager.
    Agents(agents::AgentsArgs),
    /// Manager RSS: idle, and with N tasks.
    Memory(memory::MemoryArgs),
    /// Process start to the control API answering.
    Startup(startup::StartupArgs),
    /// Three managers: kill -9 the leader, time until a write succeeds through a survivor.
    Failover(failover::FailoverArgs),
    /// CPU of an idle one-node daemon (ticks per 120 s).
    Idle(idle::IdleArgs),
}

fn main() {
    mimalloc_setup::set_up();
    let args = Args::parse();
    let shoal = args.shoal.clone();
    let result = match args.scenario {
        Scenario::Scheduler(a) => scheduler::run(a),
        Scenario::Writes(a) => writes::run(a, &daemon::shoal_binary(shoal)),
        Scenario::E2e(a) => e2e::run(a),
        Scenario::Agents(a) => agents::run(a),
        Scenario::Memory(a) => memory::run(a, &daemon::shoal_binary(shoal)),
        Scenario::Startup(a) => startup::run(a, &daemon::shoal_binary(shoal)),
        Scenario::Failover(a) => failover::run(a, &daemon::shoal_binary(shoal)),
        Scenario::Idle(a) => idle::run(a, &daemon::shoal_binary(shoal)),
    };
    if let Err(e) = result {
        eprintln!("shoal-bench: {e}");
        std::process::exit(1);
    }
}
