//! Autolock from the shoal CLI, through the Engine API as the docker CLI does it:
//! `shoal swarm update --autolock=true|false` (`GET /swarm`, `POST /swarm/update?version=N` with
//! `EncryptionConfig.AutoLockManagers`, then the key when it was turned on), `shoal swarm unlock-key
//! [-q] [--rotate]` (`GET /swarm/unlockkey`, `POST /swarm/update?rotateManagerUnlockKey=true`) and
//! `shoal swarm unlock [--key-file F]` (the key from the file, else one line of stdin; `GET /info` first:
//! only a locked node is asked). Must not depend on cluster logic.

use std::io::{BufRead, Write};
use std::path::Path;

use serde_json::{json, Value};

use super::client::{CliError, Client};
use super::output::io;

fn unlock_key(c: &Client) -> Result<String, CliError> {
    let v: Value = c.get("/swarm/unlockkey")?;
    let key = v["UnlockKey"].as_str().unwrap_or("").to_string();
    if key.is_empty() {
        return Err(CliError::Api(
            "no unlock key is set: turn autolock on with `shoal swarm update --autolock=true`".into(),
        ));
    }
    Ok(key)
}

fn print_key(out: &mut dyn Write, key: &str, quiet: bool) -> Result<(), CliError> {
    if quiet {
        return writeln!(out, "{key}").map_err(io);
    }
    writeln!(
        out,
        "To unlock a swarm manager after it restarts, run the `docker swarm unlock` (or `shoal swarm unlock`)\n\
         command and provide the following key:\n\n    {key}\n\n\
         Remember to store this key in a password manager, since without it you\n\
         will not be able to restart the manager."
    )
    .map_err(io)
}

/// `shoal swarm update --autolock=BOOL`.
pub(super) fn update(
    c: &Client,
    autolock: Option<bool>,
    rebalance: Option<bool>,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    if autolock.is_none() && rebalance.is_none() {
        return Err(CliError::Usage("nothing to update: pass --autolock=true|false or --rebalance=true|false".into()));
    }
    let mut swarm: Value = c.get("/swarm")?;
    let version = swarm["Version"]["Index"].as_u64().unwrap_or(0);
    let was_on = swarm["Spec"]["EncryptionConfig"]["AutoLockManagers"].as_bool().unwrap_or(false);
    if let Some(on) = autolock {
        swarm["Spec"]["EncryptionConfig"] = json!({ "AutoLockManagers": on });
    }
    if let Some(on) = rebalance {
        swarm["Spec"]["Orchestration"]["ShoalRebalance"] = json!(on);
    }
    let _: Value = c.post(&format!("/swarm/update?version={version}"), &swarm["Spec"])?;
    writeln!(out, "Swarm updated.").map_err(io)?;
    if autolock == Some(true) && !was_on {
        print_key(out, &unlock_key(c)?, false)?;
    }
    Ok(())
}

/// `shoal swarm unlock-key [-q] [--rotate]`.
pub(super) fn show_key(c: &Client, quiet: bool, rotate: bool, out: &mut dyn Write) -> Result<(), CliError> {
    if rotate {
        let swarm: Value = c.get("/swarm")?;
        if !swarm["Spec"]["EncryptionConfig"]["AutoLockManagers"].as_bool().unwrap_or(false) {
            return Err(CliError::Api("cannot rotate because autolock is not turned on".into()));
        }
        let version = swarm["Version"]["Index"].as_u64().unwrap_or(0);
        let _: Value =
            c.post(&format!("/swarm/update?version={version}&rotateManagerUnlockKey=true"), &swarm["Spec"])?;
        if !quiet {
            writeln!(out, "Successfully rotated manager unlock key.\n").map_err(io)?;
        }
    }
    print_key(out, &unlock_key(c)?, quiet)
}

/// `shoal swarm unlock [--key-file F]`: `input` is stdin unless a key file is given.
pub(super) fn unlock(
    c: &Client,
    key_file: Option<&Path>,
    input: &mut dyn BufRead,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let info: Value = c.get("/info")?;
    match info["Swarm"]["LocalNodeState"].as_str().unwrap_or("") {
        "locked" => {}
        "inactive" | "" => return Err(CliError::Api("this node is not part of a swarm".into())),
        _ => return Err(CliError::Api("swarm is not locked".into())),
    }
    let key = match key_file {
        Some(p) => std::fs::read_to_string(p)
            .map_err(|e| CliError::Usage(format!("cannot read the unlock key file {}: {e}", p.display())))?,
        None => {
            let mut line = String::new();
            input
                .read_line(&mut line)
                .map_err(|e| CliError::Usage(format!("cannot read the unlock key from stdin: {e}")))?;
            line
        }
    };
    let _: Value = c.post("/swarm/unlock", &json!({ "UnlockKey": key.trim() }))?;
    writeln!(out, "Swarm unlocked.").map_err(io)
}
