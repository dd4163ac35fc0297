//! `shoal secret ...` and `shoal config ...`: create (from a file or stdin), ls, inspect, rm, over the Engine
//! API's `/secrets` and `/configs`. A secret's data is read from the file and sent, never printed (the API
//! never returns it); a config's is shown by `inspect`. Must not depend on cluster logic.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::SystemTime;

use clap::Subcommand;
use shoal_engine_json::secret::data_to_base64;
use shoal_engine_json::spec::DriverJson;
use shoal_engine_json::{ConfigJson, ConfigSpecJson, IdResponse, SecretJson, SecretSpecJson};

use super::client::{enc, CliError, Client};
use super::output::{self, ago, Format};

/// Which of the two kinds a command is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// `/secrets`.
    Secret,
    /// `/configs`.
    Config,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Secret => "secret",
            Kind::Config => "config",
        }
    }
}

/// The most a client reads from a file or stdin for one secret or config: a little more than the API takes
/// (1000 KiB for a config), so that an oversized one gets the API's error rather than being read in full.
const MAX_READ_BYTES: u64 = 1000 * 1024 + 1;

/// Secret and config commands.
#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum SecretCommand {
    /// Create one from a file, or from stdin with `-`; prints its ID.
    Create {
        /// Label (KEY=VALUE), repeatable.
        #[arg(long = "label", short = 'l')]
        label: Vec<String>,
        /// Templating driver (golang) to render the data per task.
        #[arg(long)]
        template_driver: Option<String>,
        /// Its name.
        name: String,
        /// The file holding the data, or `-` for stdin.
        file: String,
    },
    /// List them.
    #[command(alias = "list")]
    Ls {
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Show them as JSON (a secret's data never: the API does not return it).
    Inspect {
        /// IDs or names.
        #[arg(required = true)]
        names: Vec<String>,
        /// Output format (JSON either way).
        #[arg(long, value_enum, default_value = "json")]
        format: Format,
    },
    /// Remove them (refused while a service uses one).
    #[command(alias = "remove")]
    Rm {
        /// IDs or names.
        #[arg(required = true)]
        names: Vec<String>,
    },
}

fn read_data(kind: Kind, file: &str) -> Result<Vec<u8>, CliError> {
    let mut data = Vec::new();
    let read = if file == "-" {
        std::io::stdin().lock().take(MAX_READ_BYTES).read_to_end(&mut data)
    } else {
        std::fs::File::open(file).and_then(|f| f.take(MAX_READ_BYTES).read_to_end(&mut data))
    };
    read.map_err(|e| {
        let from = if file == "-" { "stdin".to_string() } else { file.to_string() };
        CliError::Usage(format!("cannot read the {} data from {from}: {e}", kind.name()))
    })?;
    Ok(data)
}

fn labels(label: &[String]) -> Result<BTreeMap<String, String>, CliError> {
    let mut out = BTreeMap::new();
    for l in label {
        match l.split_once('=') {
            Some((k, v)) if !k.is_empty() => {
                out.insert(k.to_string(), v.to_string());
            }
            None if !l.is_empty() => {
                out.insert(l.to_string(), String::new());
            }
            _ => return Err(CliError::Usage(format!("invalid --label {l:?}: expected KEY=VALUE"))),
        }
    }
    Ok(out)
}

/// Runs a secret (`kind` Secret) or config command.
pub(super) fn run(
    c: &Client,
    kind: Kind,
    cmd: SecretCommand,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), CliError> {
    let base = format!("/{}s", kind.name());
    match cmd {
        SecretCommand::Create { label, template_driver, name, file } => {
            let labels = labels(&label)?;
            let data = data_to_base64(&read_data(kind, &file)?);
            let templating = template_driver.map(|name| DriverJson { name, ..Default::default() });
            let created: IdResponse = match kind {
                Kind::Secret => {
                    c.post(&format!("{base}/create"), &SecretSpecJson { name, labels, data, templating, driver: None })?
                }
                Kind::Config => {
                    c.post(&format!("{base}/create"), &ConfigSpecJson { name, labels, data, templating })?
                }
            };
            writeln!(out, "{}", created.id).map_err(output::io)
        }
        SecretCommand::Ls { format } => {
            let now = SystemTime::now();
            let row = |id: &str, name: &str, created: &str, updated: &str| {
                vec![id.to_string(), name.to_string(), ago(created, now), ago(updated, now)]
            };
            match kind {
                Kind::Secret => {
                    let all: Vec<SecretJson> = c.get(&base)?;
                    if format == Format::Json {
                        return output::json(out, &all);
                    }
                    let rows = all.iter().map(|s| row(&s.id, &s.spec.name, &s.created_at, &s.updated_at)).collect();
                    output::table(out, &["ID", "NAME", "CREATED", "UPDATED"], rows)
                }
                Kind::Config => {
                    let all: Vec<ConfigJson> = c.get(&base)?;
                    if format == Format::Json {
                        return output::json(out, &all);
                    }
                    let rows = all.iter().map(|s| row(&s.id, &s.spec.name, &s.created_at, &s.updated_at)).collect();
                    output::table(out, &["ID", "NAME", "CREATED", "UPDATED"], rows)
                }
            }
        }
        SecretCommand::Inspect { names, .. } => {
            match kind {
                Kind::Secret => {
                    let found = names
                        .iter()
                        .map(|n| c.get::<SecretJson>(&format!("{base}/{}", enc(n))))
                        .collect::<Result<Vec<_>, _>>()?;
                    output::json(out, &found)
                }
                Kind::Config => {
                    let found = names
                        .iter()
                        .map(|n| c.get::<ConfigJson>(&format!("{base}/{}", enc(n))))
                        .collect::<Result<Vec<_>, _>>()?;
                    output::json(out, &found)
                }
            }
        }
        SecretCommand::Rm { names } => {
            let mut failed = false;
            for n in names {
                match c.delete(&format!("{base}/{}", enc(&n))) {
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
