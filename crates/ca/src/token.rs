//! Join tokens in SwarmKit's v1 format: `SWMTKN-1-<digest>-<secret>`, where `<digest>` is the SHA-256 of the
//! root CA certificate's PEM bytes in base 36, left-padded with zeros to 50 characters, and `<secret>` is 16
//! random bytes in base 36, left-padded to 25 characters. The digest lets a joining node check the root CA it
//! downloads before trusting it; the secret is what the CA compares (in constant time).

use rand::{CryptoRng, Rng};
use subtle::ConstantTimeEq;

use crate::CaError;

/// The prefix of every v1 token.
pub const TOKEN_PREFIX: &str = "SWMTKN-1-";
const DIGEST_CHARS: usize = 50;
const SECRET_CHARS: usize = 25;
const SECRET_BYTES: usize = 16;

/// A parsed token: the root CA digest it pins, and the secret part as written.
#[derive(Clone, PartialEq, Eq)]
pub struct ParsedToken {
    /// SHA-256 of the root CA certificate's PEM bytes.
    pub ca_digest: [u8; 32],
}

impl std::fmt::Debug for ParsedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParsedToken").finish_non_exhaustive()
    }
}

/// Big-endian bytes in base 36 (lowercase), left-padded with '0' to `width`.
fn to_base36(bytes: &[u8], width: usize) -> String {
    let mut num: Vec<u8> = bytes.to_vec();
    let mut digits = Vec::new();
    while num.iter().any(|&b| b != 0) {
        let mut rem: u32 = 0;
        for b in num.iter_mut() {
            let cur = (rem << 8) | u32::from(*b);
            *b = u8::try_from(cur / 36).expect("rem < 36, so cur < 36 * 256");
            rem = cur % 36;
        }
        digits.push(char::from_digit(rem, 36).expect("digit < 36"));
    }
    while digits.len() < width {
        digits.push('0');
    }
    digits.iter().rev().collect()
}

/// Base 36 text into `N` big-endian bytes; `None` when it has a non-digit or does not fit.
fn from_base36<const N: usize>(text: &str) -> Option<[u8; N]> {
    let mut out = [0u8; N];
    for c in text.chars() {
        let d = c.to_digit(36)?;
        let mut carry = d;
        for b in out.iter_mut().rev() {
            let cur = u32::from(*b) * 36 + carry;
            *b = (cur & 0xff) as u8;
            carry = cur >> 8;
        }
        if carry != 0 {
            return None;
        }
    }
    Some(out)
}

/// A new token pinning the root CA with digest `ca_digest`, with a fresh secret from `rng`.
pub fn generate_join_token(ca_digest: &[u8; 32], rng: &mut (impl Rng + CryptoRng)) -> String {
    let mut secret = [0u8; SECRET_BYTES];
    rng.fill(&mut secret);
    format!("{TOKEN_PREFIX}{}-{}", to_base36(ca_digest, DIGEST_CHARS), to_base36(&secret, SECRET_CHARS))
}

/// Checks a token's shape and reads the root CA digest it pins.
pub fn parse_join_token(token: &str) -> Result<ParsedToken, CaError> {
    let rest = token
        .strip_prefix(TOKEN_PREFIX)
        .ok_or_else(|| CaError::BadToken(format!("it does not start with {TOKEN_PREFIX:?}")))?;
    let (digest, secret) =
        rest.split_once('-').ok_or_else(|| CaError::BadToken("it has no secret part after the CA digest".into()))?;
    if digest.len() != DIGEST_CHARS || secret.len() != SECRET_CHARS {
        return Err(CaError::BadToken(format!(
            "its parts have {} and {} characters, expected {DIGEST_CHARS} and {SECRET_CHARS}",
            digest.len(),
            secret.len()
        )));
    }
    let ca_digest =
        from_base36::<32>(digest).ok_or_else(|| CaError::BadToken("the CA digest is not base 36".into()))?;
    from_base36::<SECRET_BYTES>(secret).ok_or_else(|| CaError::BadToken("the secret is not base 36".into()))?;
    Ok(ParsedToken { ca_digest })
}

/// Whether `candidate` equals `expected`, compared in constant time (for equal lengths). An empty
/// `expected` never matches.
pub fn token_matches(candidate: &str, expected: &str) -> bool {
    !expected.is_empty() && bool::from(candidate.as_bytes().ct_eq(expected.as_bytes()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn base36_round_trips_and_pads() {
        for bytes in [[0u8; 16], [0xff; 16], [1; 16]] {
            let s = to_base36(&bytes, 25);
            assert_eq!(s.len(), 25, "{s}");
            assert_eq!(from_base36::<16>(&s), Some(bytes));
        }
        assert_eq!(to_base36(&[0, 36], 3), "010");
        assert_eq!(to_base36(&[0xff; 32], 50).len(), 50, "a 256-bit digest fits 50 base-36 digits");
        assert_eq!(from_base36::<1>("zz"), None, "1295 does not fit a byte");
    }
}
