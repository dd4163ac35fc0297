//! The `shoal` binary: `shoal daemon` runs a node; every other subcommand is a client of the Engine API on
//! the control socket (see `cli`). Argument parsing and dispatch only.

mod mimalloc_setup;
mod cli;
mod daemon;

use clap::{Parser, Subcommand};

/// mimalloc for every process: the daemon's allocation-heavy paths (the store, the scheduler, gRPC) are
/// faster on it than on glibc's malloc, and its options are set by [`mimalloc_setup::set_up`].
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Shoal: a container orchestrator on the design of Docker SwarmKit.
#[derive(Debug, Parser)]
#[command(name = "shoal", version, about, propagate_version = true)]
struct Args {
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

fn main() {
    mimalloc_setup::set_up();
    let args = Args::parse();
    let code = match args.command {
        Command::Daemon(d) => daemon::run(*d),
        Command::Client(c) => cli::run(&args.host.unwrap_or_else(cli::default_host), c),
    };
    std::process::exit(code);
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
