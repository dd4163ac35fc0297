//! `shoal swarm join-token [-q] [--rotate] worker|manager`: prints (and optionally rotates) a join token,
//! through the Engine API like `docker swarm join-token` (`GET /swarm`, `POST /swarm/update?rotate...`,
//! `GET /info` for the manager address to show in the join command).

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
}

/// Runs a swarm command.
pub fn run(c: &Client, cmd: SwarmCommand, out: &mut dyn Write) -> Result<(), CliError> {
    let SwarmCommand::JoinToken { quiet, rotate, role } = cmd;
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
        "To add a {} to this swarm, run the following command:\n\n    shoal daemon --join-addr {addr} --join-token {token}\n",
        key.to_lowercase()
    )
    .map_err(super::output::io)
}
