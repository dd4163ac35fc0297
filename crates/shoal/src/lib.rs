//! The `shoal` package: the command line both binaries parse (`Args`), the client commands (`cli`: clients
//! of the Engine API on the control socket) and the daemon (`daemon`). Two binaries share it, as `docker`
//! and `dockerd`: `shoal` (src/main.rs), the client, which runs `shoal daemon` by executing `shoald`; and
//! `shoald` (src/bin/shoald.rs), the daemon, which runs the client commands too. The client links none of
//! the daemon (no Raft, store, TLS or OpenSSL): it starts in a fraction of the daemon's time, which is what a
//! script creating services one process at a time waits on (BENCHMARKS.md, "Two binaries").

pub mod cli;
pub mod daemon;

use clap::{Parser, Subcommand};

/// Shoal: a container orchestrator on the design of Docker SwarmKit.
#[derive(Debug, Parser)]
#[command(name = "shoal", version, about, propagate_version = true)]
pub struct Args {
    /// Control socket of the daemon to talk to (unix:///path or a path) [default: the socket `shoal daemon`
    /// makes by default: $SHOAL_STATE_DIR/control.sock, else ./shoal-state/control.sock]
    #[arg(short = 'H', long = "host", env = "SHOAL_HOST", global = true)]
    host: Option<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
#[command(defer = true)]
enum Command {
    /// Run a Shoal node (manager and worker).
    Daemon(Box<daemon::DaemonArgs>),
    #[command(flatten)]
    Client(cli::ClientCommand),
}

/// Parses the command line and runs it: `shoal daemon` through `daemon` (given its arguments, already
/// checked), every other subcommand as a client. The process's exit code.
pub fn main_with(daemon: impl FnOnce(daemon::DaemonArgs) -> i32) -> i32 {
    let args = Args::parse();
    match args.command {
        Command::Daemon(d) => daemon(*d),
        Command::Client(c) => cli::run(&args.host.unwrap_or_else(cli::default_host), c),
    }
}

#[cfg(test)]
mod tests {
    use super::Args;
    use clap::CommandFactory;

    /// The subcommands are built lazily (`defer`), so a mistake in one would only show when it is used:
    /// build and check the whole tree.
    #[test]
    fn the_whole_command_tree_is_valid() {
        Args::command().debug_assert();
    }
}
