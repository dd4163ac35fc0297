//! JSON building blocks shared by the Engine API objects: `Version`, timestamps (RFC 3339 with nanoseconds,
//! Go's zero time for unset), durations (integer nanoseconds), labels, and the conversion error.
//! Must not depend on HTTP or the store.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use shoal_api::prost_types;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Go's zero `time.Time`, which Docker prints for unset times.
pub const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// Why a JSON document cannot become an API object. Reported as 400 with this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConvertError(pub String);

impl ConvertError {
    /// An unknown enum value for `field`, listing the accepted ones.
    pub fn bad_value(field: &str, got: &str, accepted: &[&str]) -> ConvertError {
        ConvertError(format!("invalid {field} {got:?}: use one of {}", accepted.join(", ")))
    }
}

/// `{"Index": N}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct VersionJson {
    /// The object's version (the Raft index of its last write).
    #[serde(default)]
    pub index: u64,
}

impl VersionJson {
    /// From an optional API version.
    pub fn from_api(v: Option<&shoal_api::Version>) -> VersionJson {
        VersionJson { index: v.map(|v| v.index).unwrap_or(0) }
    }
    /// To an API version.
    pub fn to_api(self) -> shoal_api::Version {
        shoal_api::Version { index: self.index }
    }
}

/// Formats a timestamp as RFC 3339 with nanoseconds; unset becomes Go's zero time.
pub fn time_to_json(ts: Option<&prost_types::Timestamp>) -> String {
    let Some(ts) = ts else {
        return ZERO_TIME.to_string();
    };
    let nanos = ts.seconds as i128 * 1_000_000_000 + ts.nanos as i128;
    OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| ZERO_TIME.to_string())
}

/// Parses an RFC 3339 time; Go's zero time and the empty string become unset.
pub fn time_from_json(field: &str, s: &str) -> Result<Option<prost_types::Timestamp>, ConvertError> {
    if s.is_empty() || s == ZERO_TIME {
        return Ok(None);
    }
    let t = OffsetDateTime::parse(s, &Rfc3339)
        .map_err(|e| ConvertError(format!("invalid {field} {s:?}: expected an RFC 3339 time ({e})")))?;
    let nanos = t.unix_timestamp_nanos();
    let seconds = i64::try_from(nanos.div_euclid(1_000_000_000))
        .map_err(|_| ConvertError(format!("invalid {field} {s:?}: out of range")))?;
    Ok(Some(prost_types::Timestamp {
        seconds,
        nanos: i32::try_from(nanos.rem_euclid(1_000_000_000)).expect("under 10^9 nanoseconds"),
    }))
}

/// A protobuf duration as integer nanoseconds.
pub fn duration_to_ns(d: &prost_types::Duration) -> i64 {
    d.seconds.saturating_mul(1_000_000_000).saturating_add(d.nanos as i64)
}

/// Integer nanoseconds as a protobuf duration (negative values keep their sign, for validation to refuse).
pub fn duration_from_ns(ns: i64) -> prost_types::Duration {
    prost_types::Duration { seconds: ns / 1_000_000_000, nanos: (ns % 1_000_000_000) as i32 }
}

/// An optional protobuf duration as optional nanoseconds.
pub fn opt_ns(d: Option<&prost_types::Duration>) -> Option<i64> {
    d.map(duration_to_ns)
}

/// Labels in a stable order.
pub fn labels_to_json(m: &HashMap<String, String>) -> BTreeMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// Labels back to the API's map.
pub fn labels_from_json(m: &BTreeMap<String, String>) -> HashMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// Maps a string to an enum value through a table, or fails naming the field and the accepted values.
/// The empty string maps to `default`.
pub fn enum_from_str<T: Copy>(field: &str, s: &str, table: &[(&str, T)], default: T) -> Result<T, ConvertError> {
    if s.is_empty() {
        return Ok(default);
    }
    table
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(s))
        .map(|(_, v)| *v)
        .ok_or_else(|| ConvertError::bad_value(field, s, &table.iter().map(|(n, _)| *n).collect::<Vec<_>>()))
}

/// Maps an enum value back to its string through the same table.
pub fn enum_to_str<T: Copy + PartialEq>(v: T, table: &[(&'static str, T)]) -> &'static str {
    table.iter().find(|(_, x)| *x == v).map(|(n, _)| *n).unwrap_or("")
}

/// Serde helper: true when a map is empty.
pub fn is_empty_map<K, V>(m: &BTreeMap<K, V>) -> bool {
    m.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_with_nanoseconds_and_zero() {
        let ts = prost_types::Timestamp { seconds: 1_465_333_651, nanos: 171_892_745 };
        let s = time_to_json(Some(&ts));
        assert_eq!(s, "2016-06-07T21:07:31.171892745Z");
        assert_eq!(time_from_json("CreatedAt", &s).unwrap(), Some(ts));
        assert_eq!(time_to_json(None), ZERO_TIME);
        assert_eq!(time_from_json("CreatedAt", ZERO_TIME).unwrap(), None);
        assert!(time_from_json("CreatedAt", "yesterday").unwrap_err().0.contains("CreatedAt"));
    }

    #[test]
    fn durations_are_nanoseconds() {
        let d = duration_from_ns(1_500_000_000);
        assert_eq!((d.seconds, d.nanos), (1, 500_000_000));
        assert_eq!(duration_to_ns(&d), 1_500_000_000);
        assert!(duration_from_ns(-5).nanos < 0);
    }
}
