//! `shoal swarm join-token [-q] [--rotate] worker|manager`: prints (and optionally rotates) a join token,
//! through the Engine API like `docker swarm join-token` (`GET /swarm`, `POST /swarm/update?rotate...`,
//! `GET /info` for the manager address to show in the join command); `update --autolock`, `unlock-key` and
//! `unlock` are in `swarm_lock`.

use std::io::Write;

use clap::{Subcommand, ValueEnum};
use serde_json::Value;

use super::client::{CliError, Client};

/// Which token.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum TokenRole {
    /// The worker token.
    Worker,
    /// The manager token.
    Manager,
}

/// `shoal swarm ...`.
#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum SwarmCommand {
    /// Print (or rotate) the token other nodes join with: `shoal daemon --join-addr ADDR --join-token TOKEN`.
    JoinToken {
        /// Print the token only.
        #[arg(short, long)]
        quiet: bool,
        /// Replace the token with a new one first (the old one stops working; joined nodes are unaffected).
        #[arg(long)]
        rotate: bool,
        /// worker or manager.
        role: TokenRole,
    },
    /// Change swarm settings: autolock (managers restart locked until given the unlock key), rebalancing.
    Update {
        /// Turn autolock on or off (--autolock=true|false); turning it on prints the unlock key.
        #[arg(long, num_args = 0..=1, default_missing_value = "true")]
        autolock: Option<bool>,
        /// Turn rebalancing on or off (--rebalance=true|false): replicated tasks move to nodes that joined later
        /// when a service's spread is uneven by more than one task per node (Shoal's own; off by default).
        #[arg(long, num_args = 0..=1, default_missing_value = "true")]
        rebalance: Option<bool>,
    },
    /// Print (or rotate) the key that unlocks a manager restarted with autolock on.
    UnlockKey {
        /// Print the key only.
        #[arg(short, long)]
        quiet: bool,
        /// Replace the key with a new one first (managers rewrap their keys; the old key stops working).
        #[arg(long)]
        rotate: bool,
    },
    /// Unlock a locked manager: the key is read from --key-file, else from one line of stdin.
    Unlock {
        /// A file holding the unlock key (SWMKEY-1-...).
        #[arg(long)]
        key_file: Option<std::path::PathBuf>,
    },
}

/// Runs a swarm command.
pub(super) fn run(c: &Client, cmd: SwarmCommand, out: &mut dyn Write) -> Result<(), CliError> {
    let (quiet, rotate, role) = match cmd {
        SwarmCommand::JoinToken { quiet, rotate, role } => (quiet, rotate, role),
        SwarmCommand::Update { autolock, rebalance } => return super::swarm_lock::update(c, autolock, rebalance, out),
        SwarmCommand::UnlockKey { quiet, rotate } => return super::swarm_lock::show_key(c, quiet, rotate, out),
        SwarmCommand::Unlock { key_file } => {
            return super::swarm_lock::unlock(c, key_file.as_deref(), &mut std::io::stdin().lock(), out)
        }
    };
    let (key, flag) = match role {
        TokenRole::Worker => ("Worker", "rotateWorkerToken"),
        TokenRole::Manager => ("Manager", "rotateManagerToken"),
    };
    if rotate {
        let swarm: Value = c.get("/swarm")?;
        let version = swarm["Version"]["Index"].as_u64().unwrap_or(0);
        let _: Value = c.post(&format!("/swarm/update?version={version}&{flag}=true"), &swarm["Spec"])?;
        if !quiet {
            writeln!(out, "Successfully rotated {} join token.\n", key.to_lowercase()).map_err(super::output::io)?;
        }
    }
    let swarm: Value = c.get("/swarm")?;
    let token = swarm["JoinTokens"][key].as_str().unwrap_or("").to_string();
    if token.is_empty() {
        return Err(CliError::Api("the cluster has no join token yet; retry in a moment".into()));
    }
    if quiet {
        writeln!(out, "{token}").map_err(super::output::io)?;
        return Ok(());
    }
    let info: Value = c.get("/info")?;
    let addr = info["Swarm"]["NodeAddr"].as_str().unwrap_or("").to_string();
    writeln!(
        out,
        "To add a {} to this swarm, run the following command:\n\n    shoal daemon --join-addr {addr} --join-token \
         {token}\n",
        key.to_lowercase()
    )
    .map_err(super::output::io)
}
