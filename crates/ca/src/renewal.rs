//! When a node renews its certificate: at a random point between `RENEW_AT_MIN_FRACTION` and
//! `RENEW_AT_MAX_FRACTION` of the certificate's issued life, so a cluster's nodes do not all renew at once.
//!
//! The issued life runs from signing time (`not_before + BACKDATE`) to `not_after`; the backdate is for
//! clock skew and does not count, so a one-hour certificate renews 30 to 48 minutes after it was issued.

use std::time::{Duration, SystemTime};

use rand::Rng;

use crate::cert::{CertInfo, BACKDATE};

/// Earliest renewal point, as a fraction of the issued life.
pub const RENEW_AT_MIN_FRACTION: f64 = 0.5;
/// Latest renewal point, as a fraction of the issued life.
pub const RENEW_AT_MAX_FRACTION: f64 = 0.8;

/// How long from `now` until `cert` should be renewed (zero when that point has passed, e.g. after the
/// node was down for a while). Draws the point from `rng`.
pub fn renewal_delay(cert: &CertInfo, now: SystemTime, rng: &mut impl Rng) -> Duration {
    let issued = cert.not_before.checked_add(BACKDATE).filter(|t| *t < cert.not_after).unwrap_or(cert.not_before);
    let life = cert.not_after.duration_since(issued).unwrap_or_default();
    let fraction = rng.random_range(RENEW_AT_MIN_FRACTION..=RENEW_AT_MAX_FRACTION);
    let at = issued + life.mul_f64(fraction);
    at.duration_since(now).unwrap_or_default()
}
