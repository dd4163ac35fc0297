//! A slog drain that forwards raft-rs's log records to `tracing`, so raft-rs logs with the rest of Shoal.
//!
//! raft-rs logs routine events (elections, resets) at info; they are forwarded at debug so the node's
//! own one-line leadership messages stay the visible ones. Depends only on slog and tracing.

use std::fmt::Write as _;

/// Forwards slog records to tracing events (target `raft`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TracingDrain;

/// Collects a record's key-value pairs as ` key=value` text.
struct KvText(String);

impl slog::Serializer for KvText {
    fn emit_arguments(&mut self, key: slog::Key, val: &std::fmt::Arguments<'_>) -> slog::Result {
        let _ = write!(self.0, " {key}={val}");
        Ok(())
    }
}

impl slog::Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &slog::Record<'_>, values: &slog::OwnedKVList) -> Result<(), slog::Never> {
        let mut kv = KvText(String::new());
        let _ = slog::KV::serialize(&record.kv(), record, &mut kv);
        let _ = slog::KV::serialize(values, record, &mut kv);
        let msg = record.msg();
        let kv = kv.0;
        match record.level() {
            slog::Level::Critical | slog::Level::Error => tracing::error!(target: "raft", "{msg}{kv}"),
            slog::Level::Warning => tracing::warn!(target: "raft", "{msg}{kv}"),
            slog::Level::Info | slog::Level::Debug => tracing::debug!(target: "raft", "{msg}{kv}"),
            slog::Level::Trace => tracing::trace!(target: "raft", "{msg}{kv}"),
        }
        Ok(())
    }
}

/// A raft-rs logger tagged with this member's Raft ID.
pub(crate) fn raft_logger(raft_id: u64) -> slog::Logger {
    slog::Logger::root(TracingDrain, slog::o!("raft_id" => raft_id))
}
