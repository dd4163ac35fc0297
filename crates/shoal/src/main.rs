//! The `shoal` binary: `shoal daemon` runs a node; every other subcommand is a client of the Engine API on
//! the control socket (see `cli`). Argument parsing and dispatch only.

mod cli;
mod daemon;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// Shoal: a container orchestrator on the design of Docker SwarmKit.
#[derive(Debug, Parser)]
#[command(name = "shoal", version, about, propagate_version = true)]
struct Args {
    /// Control socket of the daemon to talk to (unix:///path or a path).
    #[arg(short = 'H', long = "host", env = "SHOAL_HOST", global = true, default_value = cli::DEFAULT_HOST)]
    host: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a Shoal node (manager and worker).
    Daemon(Box<daemon::DaemonArgs>),
    #[command(flatten)]
    Client(cli::ClientCommand),
}

fn main() {
    // As `Args::parse()`, but a client command keeps clap's command tree rather than freeing it: the process
    // exits right after one request, and freeing the tree of every subcommand and flag cost a fifth of its
    // instructions (callgrind of `shoal service create`). The daemon frees it (its heap lives on).
    let mut cmd = Args::command();
    let matches = cmd.try_get_matches_from_mut(std::env::args_os()).unwrap_or_else(|e| e.exit());
    let args = Args::from_arg_matches(&matches).unwrap_or_else(|e| e.format(&mut cmd).exit());
    drop(matches);
    let code = match args.command {
        Command::Daemon(d) => {
            drop(cmd);
            daemon::run(*d)
        }
        Command::Client(c) => {
            std::mem::forget(cmd);
            cli::run(&args.host, c)
        }
    };
    std::process::exit(code);
}
