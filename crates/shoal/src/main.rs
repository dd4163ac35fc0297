//! The `shoal` binary: `shoal daemon` runs a node; every other subcommand is a client of the Engine API on
//! the control socket (see `cli`). Argument parsing and dispatch only.

mod alloc;
mod mimalloc_setup;
mod cli;
mod daemon;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

#[global_allocator]
static ALLOC: alloc::ShoalAlloc = alloc::ShoalAlloc;

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
#[command(defer = true)]
enum Command {
    /// Run a Shoal node (manager and worker).
    Daemon(Box<daemon::DaemonArgs>),
    #[command(flatten)]
    Client(cli::ClientCommand),
}

/// True when the first argument that is not a global option is `daemon`. It only picks the allocator (a
/// wrong guess costs speed, not correctness), so it needs no full parse.
fn runs_daemon(mut args: impl Iterator<Item = std::ffi::OsString>) -> bool {
    while let Some(a) = args.next() {
        match a.to_str() {
            Some("-H" | "--host") => {
                args.next();
            }
            Some(s) if s.starts_with('-') => {}
            _ => return a == "daemon",
        }
    }
    false
}

fn main() {
    if runs_daemon(std::env::args_os().skip(1)) {
        alloc::use_general();
    }
    // As `Args::parse()`, but a client command keeps clap's command tree rather than dropping it: the process
    // exits right after one request, and dropping the tree cost a fifth of its instructions (callgrind of
    // `shoal service create`). The daemon drops it (its heap lives on). Every subcommand enum is
    // `defer = true`: clap builds the arguments of only the subcommands on the command line.
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

#[cfg(test)]
mod tests {
    use super::{runs_daemon, Args};
    use clap::CommandFactory;

    /// The subcommands are built lazily (`defer`), so a mistake in one would only show when it is used:
    /// build and check the whole tree.
    #[test]
    fn the_whole_command_tree_is_valid() {
        Args::command().debug_assert();
    }

    fn daemon(args: &[&str]) -> bool {
        runs_daemon(args.iter().map(std::ffi::OsString::from))
    }

    #[test]
    fn the_first_positional_argument_picks_the_daemon() {
        assert!(daemon(&["daemon", "--state-dir", "x"]));
        assert!(daemon(&["-H", "unix:///s", "daemon"]));
        assert!(daemon(&["--host", "daemon", "daemon"]));
        assert!(!daemon(&["service", "create", "--name", "daemon", "busybox"]));
        assert!(!daemon(&["-H", "daemon", "service", "ls"]));
        assert!(!daemon(&["--version"]));
        assert!(!daemon(&[]));
    }
}
