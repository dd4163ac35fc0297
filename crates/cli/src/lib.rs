//! `shoal-cli`, the client side of Shoal: the `shoal` binary's command line and its `service`, `node`, `task`,
//! `secret`, `config`, `network`, `ca`, `swarm`, `info` and `version` commands, which talk to a daemon's
//! Engine API over its control unix socket (`-H/--host` or `SHOAL_HOST`; by default the socket `shoal daemon`
//! makes by default, see [`default_host`]). Tables look like docker's; `--format json` prints the API objects.
//! Errors print one line, `shoal: <message>`, on stderr and exit 1 (usage errors exit 2, from clap).
//! `shoal daemon`'s flags are here too (`daemon_args`): the client checks them before it runs `shoald`.
//!
//! Must not know cluster logic or depend on any daemon crate (node, manager, agent, raft, store, ca,
//! engine-api): it speaks HTTP/JSON, with the Engine API's documents from `shoal_engine_json`. A test in
//! testkit checks its dependencies.

mod ca;
mod client;
mod daemon_args;
mod network;
mod node;
mod output;
mod secret;
mod service;
mod swarm;
mod swarm_lock;
#[cfg(test)]
mod tests;

use std::io::Write;

use clap::{Parser, Subcommand};
use shoal_engine_json::{InfoJson, SystemVersionJson};

pub use client::{CliError, Client};
pub use daemon_args::{DaemonArgs, ExecutorChoice, GenericResources};
use node::{NodeCommand, TaskCommand};
use service::ServiceCommand;

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
    Daemon(Box<DaemonArgs>),
    #[command(flatten)]
    Client(ClientCommand),
}

/// Parses the command line and runs it: `shoal daemon` through `daemon` (given its flags, already checked:
/// the client runs `shoald`, which parses them again; `shoald` runs the daemon), every other subcommand as a
/// client. The process's exit code.
pub fn main_with(daemon: impl FnOnce(DaemonArgs) -> i32) -> i32 {
    let args = Args::parse();
    match args.command {
        Command::Daemon(d) => daemon(*d),
        Command::Client(c) => run(&args.host.unwrap_or_else(default_host), c),
    }
}

/// The state dir `shoal daemon` uses when neither `--state-dir` nor `SHOAL_STATE_DIR` is given.
pub const DEFAULT_STATE_DIR: &str = "./shoal-state";

/// Where the client looks for the daemon when neither `-H` nor `SHOAL_HOST` is given: where `shoal daemon`
/// puts its control socket by default, `<state dir>/control.sock`, with the state dir from `SHOAL_STATE_DIR`
/// as the daemon reads it, else `./shoal-state`. So a client run where the daemon was started finds it, as
/// docker's client finds its engine.
pub fn default_host() -> String {
    let state_dir = std::env::var_os("SHOAL_STATE_DIR")
        .filter(|d| !d.is_empty())
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| DEFAULT_STATE_DIR.into());
    format!("unix://{}", state_dir.join("control.sock").display())
}

/// The client commands (flattened into the top level of `shoal`).
#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum ClientCommand {
    /// Manage services.
    #[command(subcommand)]
    Service(ServiceCommand),
    /// Manage nodes.
    #[command(subcommand)]
    Node(NodeCommand),
    /// List and inspect tasks.
    #[command(subcommand)]
    Task(TaskCommand),
    /// The cluster's certificate authority (operator client certificates).
    #[command(subcommand)]
    Ca(ca::CaCommand),
    /// Manage secrets (sensitive data services use as files; never shown back).
    #[command(subcommand)]
    Secret(secret::SecretCommand),
    /// Manage configs (files services use).
    #[command(subcommand)]
    Config(secret::SecretCommand),
    /// Manage overlay networks.
    #[command(subcommand)]
    Network(network::NetworkCommand),
    /// Manage the swarm (join tokens, autolock).
    #[command(subcommand)]
    Swarm(swarm::SwarmCommand),
    /// Show information about the node and the cluster.
    Info,
    /// Show the client and daemon versions.
    Version,
}

/// Runs a client command against `host`; prints results on stdout and errors on stderr. Returns the exit
/// code (0 or 1).
pub fn run(host: &str, cmd: ClientCommand) -> i32 {
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    let mut out = stdout.lock();
    let mut err = stderr.lock();
    let result = Client::new(host).and_then(|c| execute(&c, cmd, &mut out, &mut err));
    let _ = out.flush();
    exit_code(result, &mut err)
}

/// Prints an error as one `shoal: ...` line and returns the exit code.
fn exit_code(result: Result<(), CliError>, err: &mut dyn Write) -> i32 {
    match result {
        Ok(()) => 0,
        Err(CliError::AlreadyReported) => 1,
        Err(e) => {
            let _ = writeln!(err, "shoal: {e}");
            1
        }
    }
}

/// Runs a command with a client, writing to `out` and per-item errors to `err`.
pub fn execute(c: &Client, cmd: ClientCommand, out: &mut dyn Write, err: &mut dyn Write) -> Result<(), CliError> {
    match cmd {
        ClientCommand::Service(s) => service::run(c, s, out, err),
        ClientCommand::Node(n) => node::run_node(c, n, out),
        ClientCommand::Task(t) => node::run_task(c, t, out),
        ClientCommand::Secret(s) => secret::run(c, secret::Kind::Secret, s, out, err),
        ClientCommand::Config(s) => secret::run(c, secret::Kind::Config, s, out, err),
        ClientCommand::Network(n) => network::run(c, n, out, err),
        ClientCommand::Swarm(s) => swarm::run(c, s, out),
        ClientCommand::Ca(cmd) => ca::run(c, cmd, out),
        ClientCommand::Info => {
            let i: InfoJson = c.get("/info")?;
            let sw = &i.swarm;
            let executor = i.labels.iter().find_map(|l| l.strip_prefix("shoal.executor=")).unwrap_or("");
            let cluster = sw.cluster.as_ref();
            let lines = [
                format!("Server Version: {}", i.server_version),
                format!("Name: {}", i.name),
                format!("Executor: {executor}"),
                format!("Swarm: {}", sw.local_node_state),
                format!(" NodeID: {}", sw.node_id),
                format!(" Is Manager: {}", sw.control_available),
                format!(" ClusterID: {}", cluster.map(|c| c.id.as_str()).unwrap_or("")),
                format!(" Managers: {}", sw.managers),
                format!(" Nodes: {}", sw.nodes),
                format!(" Node Address: {}", sw.node_addr),
                format!(
                    " Task History Retention Limit: {}",
                    cluster.and_then(|c| c.spec.orchestration.task_history_retention_limit).unwrap_or(0)
                ),
                format!("Operating System: {}", i.operating_system),
                format!("Architecture: {}", i.architecture),
                format!("CPUs: {}", i.ncpu),
                format!("Total Memory: {} bytes", i.mem_total),
            ];
            for l in lines {
                writeln!(out, "{l}").map_err(output::io)?;
            }
            Ok(())
        }
        ClientCommand::Version => {
            writeln!(out, "Client:\n Version: {}", env!("CARGO_PKG_VERSION")).map_err(output::io)?;
            let v: SystemVersionJson = c.get("/version")?;
            writeln!(
                out,
                "Server: {}\n Version: {}\n API version: {} (minimum {})\n OS/Arch: {}/{}",
                v.platform.name, v.version, v.api_version, v.min_api_version, v.os, v.arch
            )
            .map_err(output::io)
        }
    }
}
