//! `shoal node ...` and `shoal task ...`: list, inspect and update nodes; list and inspect tasks.
//! Must not depend on cluster logic.

use std::io::Write;

use clap::Subcommand;
use shoal_engine_json::{InfoJson, NodeJson, TaskJson};

use super::client::{enc, filters_query, CliError, Client};
use super::output::{self, capitalize, Format};
use super::service::print_tasks;

/// Node commands.
#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum NodeCommand {
    /// List nodes (`*` marks the node you are talking to).
    #[command(alias = "list")]
    Ls {
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Show nodes as JSON.
    Inspect {
        /// Node IDs or names.
        #[arg(required = true)]
        nodes: Vec<String>,
        /// Output format (JSON either way).
        #[arg(long, value_enum, default_value = "json")]
        format: Format,
    },
    /// Change a node's availability or labels.
    Update {
        /// active, pause or drain.
        #[arg(long, value_parser = ["active", "pause", "drain"])]
        availability: Option<String>,
        /// Add or replace a label (KEY=VALUE), repeatable.
        #[arg(long)]
        label_add: Vec<String>,
        /// Remove a label (KEY), repeatable.
        #[arg(long)]
        label_rm: Vec<String>,
        /// Node ID or name.
        node: String,
    },
}

/// Task commands.
#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum TaskCommand {
    /// List tasks.
    #[command(alias = "list")]
    Ls {
        /// Only tasks of this service (ID or name).
        #[arg(long)]
        service: Option<String>,
        /// Only tasks on this node (ID or name).
        #[arg(long)]
        node: Option<String>,
        /// Only tasks with this desired state (running, shutdown, ...).
        #[arg(long)]
        desired_state: Option<String>,
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Show a task as JSON.
    Inspect {
        /// Task IDs.
        #[arg(required = true)]
        tasks: Vec<String>,
        /// Output format (JSON either way).
        #[arg(long, value_enum, default_value = "json")]
        format: Format,
    },
}

fn manager_status(n: &NodeJson) -> String {
    match &n.manager_status {
        Some(m) if m.leader => "Leader".into(),
        Some(m) => capitalize(&m.reachability),
        None => String::new(),
    }
}

/// Runs a node command.
pub(super) fn run_node(c: &Client, cmd: NodeCommand, out: &mut dyn Write) -> Result<(), CliError> {
    match cmd {
        NodeCommand::Ls { format } => {
            let nodes: Vec<NodeJson> = c.get("/nodes")?;
            if format == Format::Json {
                return output::json(out, &nodes);
            }
            let info: InfoJson = c.get("/info")?;
            let rows = nodes
                .iter()
                .map(|n| {
                    let me = if n.id == info.swarm.node_id { " *" } else { "" };
                    vec![
                        format!("{}{me}", n.id),
                        n.description.hostname.clone(),
                        capitalize(&n.status.state),
                        capitalize(&n.spec.availability),
                        manager_status(n),
                        n.description.engine.engine_version.clone(),
                    ]
                })
                .collect();
            output::table(out, &["ID", "HOSTNAME", "STATUS", "AVAILABILITY", "MANAGER STATUS", "ENGINE VERSION"], rows)
        }
        NodeCommand::Inspect { nodes, .. } => {
            let found = nodes
                .iter()
                .map(|n| c.get::<NodeJson>(&format!("/nodes/{}", enc(n))))
                .collect::<Result<Vec<_>, _>>()?;
            output::json(out, &found)
        }
        NodeCommand::Update { availability, label_add, label_rm, node } => {
            let n: NodeJson = c.get(&format!("/nodes/{}", enc(&node)))?;
            let mut spec = n.spec.clone();
            if let Some(a) = availability {
                spec.availability = a;
            }
            for kv in &label_add {
                let (k, v) = kv.split_once('=').unwrap_or((kv.as_str(), ""));
                if k.is_empty() {
                    return Err(CliError::Usage(format!("invalid --label-add {kv:?}: expected KEY=VALUE")));
                }
                spec.labels.insert(k.to_string(), v.to_string());
            }
            for k in &label_rm {
                spec.labels.remove(k);
            }
            let path = format!("/nodes/{}/update?version={}", enc(&n.id), n.version.index);
            c.post::<serde_json::Value>(&path, &spec)?;
            writeln!(out, "{node}").map_err(output::io)
        }
    }
}

/// Runs a task command.
pub(super) fn run_task(c: &Client, cmd: TaskCommand, out: &mut dyn Write) -> Result<(), CliError> {
    match cmd {
        TaskCommand::Ls { service, node, desired_state, format } => {
            let mut f: Vec<(&str, &str)> = Vec::new();
            if let Some(s) = &service {
                f.push(("service", s));
            }
            if let Some(n) = &node {
                f.push(("node", n));
            }
            if let Some(d) = &desired_state {
                f.push(("desired-state", d));
            }
            let tasks: Vec<TaskJson> = c.get(&format!("/tasks?filters={}", filters_query(&f)))?;
            print_tasks(c, out, tasks, format)
        }
        TaskCommand::Inspect { tasks, .. } => {
            let found = tasks
                .iter()
                .map(|t| c.get::<TaskJson>(&format!("/tasks/{}", enc(t))))
                .collect::<Result<Vec<_>, _>>()?;
            output::json(out, &found)
        }
    }
}
