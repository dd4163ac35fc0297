//! Output helpers for the client commands: docker-like borderless tables (comfy-table), pretty JSON, short
//! IDs, capitalized states and "5 seconds ago" ages. Must not depend on cluster logic.

use std::io::Write;
use std::time::{Duration, SystemTime};

use comfy_table::{presets, ContentArrangement, Table};

use super::client::CliError;

/// How `ls`, `ps` and `inspect` print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A table (inspect: indented JSON).
    Table,
    /// The API objects as indented JSON.
    Json,
}

/// Writes `rows` under `header` as columns separated by three spaces, without borders, like `docker ls`.
pub(super) fn table(out: &mut dyn Write, header: &[&str], rows: Vec<Vec<String>>) -> Result<(), CliError> {
    let mut t = Table::new();
    t.load_preset(presets::NOTHING).set_content_arrangement(ContentArrangement::Disabled);
    t.set_header(header.to_vec());
    for r in rows {
        t.add_row(r);
    }
    for c in t.column_iter_mut() {
        c.set_padding((0, 3));
    }
    for line in t.lines() {
        writeln!(out, "{}", line.trim_end()).map_err(io)?;
    }
    Ok(())
}

/// Writes `v` as indented JSON.
pub(super) fn json(out: &mut dyn Write, v: &impl serde::Serialize) -> Result<(), CliError> {
    let s = serde_json::to_string_pretty(v).map_err(|e| CliError::Usage(e.to_string()))?;
    writeln!(out, "{s}").map_err(io)
}

/// Maps a write error (e.g. a closed pipe).
pub(super) fn io(e: std::io::Error) -> CliError {
    CliError::Usage(format!("cannot write the output: {e}"))
}

/// The first 12 characters of an ID, as docker prints them.
pub(super) fn short_id(id: &str) -> String {
    id.chars().take(12).collect()
}

/// "running" -> "Running".
pub(super) fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

/// How long ago an RFC 3339 time was, in docker's words ("less than a second", "5 seconds", "2 minutes").
pub(super) fn ago(rfc3339: &str, now: SystemTime) -> String {
    let Ok(t) = time::OffsetDateTime::parse(rfc3339, &time::format_description::well_known::Rfc3339) else {
        return String::new();
    };
    // Nanoseconds past u64 (after the year 2554) saturate rather than wrap into the past.
    let nanos = u64::try_from(t.unix_timestamp_nanos().max(0)).unwrap_or(u64::MAX);
    let then = SystemTime::UNIX_EPOCH + Duration::from_nanos(nanos);
    let secs = now.duration_since(then).unwrap_or_default().as_secs();
    let unit = |n: u64, one: &str| {
        if n == 1 {
            format!("{} {one}", if one == "hour" { "an" } else { "a" })
        } else {
            format!("{n} {one}s")
        }
    };
    let text = match secs {
        0 => "less than a second".to_string(),
        1..=59 => unit(secs, "second"),
        60..=3599 => unit(secs / 60, "minute"),
        3600..=86_399 => unit(secs / 3600, "hour"),
        _ => unit(secs / 86_400, "day"),
    };
    format!("{text} ago")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_have_no_borders_and_three_space_gaps() {
        let mut buf = Vec::new();
        table(&mut buf, &["ID", "NAME"], vec![vec!["abc".into(), "web".into()]]).unwrap();
        assert_eq!(String::from_utf8(buf).unwrap(), "ID    NAME\nabc   web\n");
    }

    #[test]
    fn ages_read_like_docker() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_100);
        assert_eq!(ago("2023-11-14T22:13:20Z", now), "a minute ago");
        assert_eq!(ago("2023-11-14T22:14:55Z", now), "5 seconds ago");
        assert_eq!(ago("2023-11-14T22:15:00Z", now), "less than a second ago");
        assert_eq!(ago("garbage", now), "");
    }
}
