//! `shoal network ...`: create, ls, inspect, rm of swarm-scope overlay networks over the Engine API's
//! `/networks` (the daemon refuses what it cannot make, naming it). Must not depend on cluster logic.

use std::io::Write;

use clap::Subcommand;
use shoal_engine_json::network::{IpamConfigJson, IpamJson, NetworkCreateJson, NetworkCreateResponse, NetworkJson};

use super::client::{enc, CliError, Client};
use super::output::{self, Format};

/// Network commands.
#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum NetworkCommand {
    /// Create an overlay network; prints its ID.
    Create {
        /// The driver (only overlay).
        #[arg(long, short = 'd', default_value = "overlay")]
        driver: String,
        /// The subnet (CIDR); default: the next free block of the cluster's address pool.
        #[arg(long)]
        subnet: Option<String>,
        /// The gateway (default: the subnet's first address).
        #[arg(long)]
        gateway: Option<String>,
        /// The range addresses are given from (CIDR inside the subnet).
        #[arg(long)]
        ip_range: Option<String>,
        /// Standalone containers may attach.
        #[arg(long)]
        attachable: bool,
        /// No access from outside the network.
        #[arg(long)]
        internal: bool,
        /// Label (KEY=VALUE), repeatable.
        #[arg(long = "label")]
        label: Vec<String>,
        /// Its name.
        name: String,
    },
    /// List networks.
    #[command(alias = "list")]
    Ls {
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Show networks as JSON.
    Inspect {
        /// IDs or names.
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Remove networks (refused while a service uses one).
    #[command(alias = "remove")]
    Rm {
        /// IDs or names.
        #[arg(required = true)]
        names: Vec<String>,
    },
}

/// Runs a network command.
pub(super) fn run(c: &Client, cmd: NetworkCommand, out: &mut dyn Write, err: &mut dyn Write) -> Result<(), CliError> {
    match cmd {
        NetworkCommand::Create { driver, subnet, gateway, ip_range, attachable, internal, label, name } => {
            let mut labels = std::collections::BTreeMap::new();
            for l in &label {
                let (k, v) = l.split_once('=').unwrap_or((l.as_str(), ""));
                if k.is_empty() {
                    return Err(CliError::Usage(format!("invalid --label {l:?}: expected KEY=VALUE")));
                }
                labels.insert(k.to_string(), v.to_string());
            }
            let ipam = (subnet.is_some() || gateway.is_some() || ip_range.is_some()).then(|| IpamJson {
                driver: "default".into(),
                config: vec![IpamConfigJson {
                    subnet: subnet.unwrap_or_default(),
                    ip_range: ip_range.unwrap_or_default(),
                    gateway: gateway.unwrap_or_default(),
                    ..Default::default()
                }],
                options: None,
            });
            let body = NetworkCreateJson { name, driver, attachable, internal, ipam, labels, ..Default::default() };
            let created: NetworkCreateResponse = c.post("/networks/create", &body)?;
            writeln!(out, "{}", created.id).map_err(output::io)
        }
        NetworkCommand::Ls { format } => {
            let all: Vec<NetworkJson> = c.get("/networks")?;
            if format == Format::Json {
                return output::json(out, &all);
            }
            let rows = all
                .iter()
                .map(|n| {
                    let subnet = n.ipam.config.first().map(|c| c.subnet.clone()).unwrap_or_default();
                    vec![n.id.clone(), n.name.clone(), n.driver.clone(), n.scope.clone(), subnet]
                })
                .collect();
            output::table(out, &["NETWORK ID", "NAME", "DRIVER", "SCOPE", "SUBNET"], rows)
        }
        NetworkCommand::Inspect { names } => {
            let found = names
                .iter()
                .map(|n| c.get::<NetworkJson>(&format!("/networks/{}", enc(n))))
                .collect::<Result<Vec<_>, _>>()?;
            output::json(out, &found)
        }
        NetworkCommand::Rm { names } => {
            let mut failed = false;
            for n in names {
                match c.delete(&format!("/networks/{}", enc(&n))) {
                    Ok(()) => writeln!(out, "{n}").map_err(output::io)?,
                    Err(e) => {
                        failed = true;
                        writeln!(err, "shoal: {e}").map_err(output::io)?;
                    }
                }
            }
            if failed {
                return Err(CliError::AlreadyReported);
            }
            Ok(())
        }
    }
}
