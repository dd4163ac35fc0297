//! Key encryption for encryption at rest and autolock: a 256-bit `SecretKey`, an authenticated envelope
//! (`seal` / `open`, ChaCha20-Poly1305 through `ring`, a random 96-bit nonce per message, associated data
//! that names what the bytes are so one sealed blob cannot stand in for another), the swarm unlock key in
//! SwarmKit's human-readable form (`SWMKEY-1-<32 bytes, base64 without padding>`) and the key-encryption key
//! (KEK) derived from it with HKDF-SHA256.
//!
//! Envelope layout: `b"SHE" | version (1) | key id (u32 BE) | nonce (12) | ciphertext | tag (16)`. The key
//! id is written in the clear so a reader holding several keys (data keys across a rotation) picks the
//! right one; it is covered by the tag. Pure functions: the nonce comes from the caller's CSPRNG, no IO.

use base64::Engine as _;
use rand::CryptoRng;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};

/// The prefix of an unlock key.
pub const UNLOCK_KEY_PREFIX: &str = "SWMKEY-1-";
/// The magic bytes every sealed envelope starts with.
const MAGIC: &[u8; 3] = b"SHE";
/// The envelope format version.
const VERSION: u8 = 1;
/// Bytes of the envelope before the ciphertext: magic, version, key id, nonce.
pub const HEADER_LEN: usize = 3 + 1 + 4 + NONCE_LEN;
/// Bytes the envelope adds to the plaintext.
pub const OVERHEAD: usize = HEADER_LEN + 16;
/// HKDF `info` of the key-encryption key derived from an unlock key.
const KEK_INFO: &[u8] = b"shoal autolock kek v1";

/// Why sealed bytes could not be opened, or an unlock key not parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncryptionError {
    /// The bytes are not an envelope of this format (too short, wrong magic or version).
    #[error("not an encrypted envelope: {0}")]
    NotSealed(String),
    /// The envelope names a key id this reader does not hold.
    #[error("encrypted with key {0}, which is not available")]
    UnknownKey(u32),
    /// Wrong key, wrong associated data, or the bytes were altered.
    #[error("decryption failed: wrong key, or the data was altered")]
    Authentication,
    /// The unlock key is not in the `SWMKEY-1-...` format.
    #[error("invalid unlock key: expected SWMKEY-1- followed by 43 base64 characters (32 bytes)")]
    BadUnlockKey,
}

/// A 256-bit symmetric key. Its `Debug` output is redacted; it is never logged.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretKey([u8; 32]);

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretKey(<redacted>)")
    }
}

impl SecretKey {
    /// A key of the given bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> SecretKey {
        SecretKey(bytes)
    }

    /// A fresh random key.
    pub fn generate(rng: &mut impl CryptoRng) -> SecretKey {
        let mut b = [0u8; 32];
        rng.fill_bytes(&mut b);
        SecretKey(b)
    }

    /// The raw bytes (to store the key where it is itself protected).
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    fn aead(&self) -> LessSafeKey {
        LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, &self.0).expect("32-byte ChaCha20-Poly1305 key"))
    }
}

/// Encrypts `plaintext` under `key` (announced as `key_id`), binding `aad` (what the bytes are).
pub fn seal(key: &SecretKey, key_id: u32, aad: &[u8], plaintext: &[u8], rng: &mut impl CryptoRng) -> Vec<u8> {
    let mut nonce = [0u8; NONCE_LEN];
    rng.fill_bytes(&mut nonce);
    let mut out = Vec::with_capacity(plaintext.len() + OVERHEAD);
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.extend_from_slice(&key_id.to_be_bytes());
    out.extend_from_slice(&nonce);
    let mut body = plaintext.to_vec();
    key.aead()
        .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(full_aad(key_id, aad)), &mut body)
        .expect("ChaCha20-Poly1305 seals any length we write");
    out.extend_from_slice(&body);
    out
}

/// The key id an envelope announces (to pick the key before `open`).
pub fn sealed_key_id(sealed: &[u8]) -> Result<u32, EncryptionError> {
    if sealed.len() < OVERHEAD {
        return Err(EncryptionError::NotSealed(format!("{} bytes is too short", sealed.len())));
    }
    if &sealed[..3] != MAGIC {
        return Err(EncryptionError::NotSealed("wrong magic bytes".into()));
    }
    if sealed[3] != VERSION {
        return Err(EncryptionError::NotSealed(format!("unknown version {}", sealed[3])));
    }
    Ok(u32::from_be_bytes(sealed[4..8].try_into().expect("4 bytes")))
}

/// True when `bytes` start like an envelope of this format.
pub fn looks_sealed(bytes: &[u8]) -> bool {
    sealed_key_id(bytes).is_ok()
}

/// Decrypts an envelope made by `seal` with the same key and `aad`.
pub fn open(key: &SecretKey, aad: &[u8], sealed: &[u8]) -> Result<Vec<u8>, EncryptionError> {
    let key_id = sealed_key_id(sealed)?;
    let nonce: [u8; NONCE_LEN] = sealed[8..HEADER_LEN].try_into().expect("nonce length");
    let mut body = sealed[HEADER_LEN..].to_vec();
    let plain_len = key
        .aead()
        .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(full_aad(key_id, aad)), &mut body)
        .map_err(|_| EncryptionError::Authentication)?
        .len();
    body.truncate(plain_len);
    Ok(body)
}

fn full_aad(key_id: u32, aad: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(4 + aad.len());
    v.extend_from_slice(&key_id.to_be_bytes());
    v.extend_from_slice(aad);
    v
}

/// The swarm's unlock key: 32 random bytes, shown as `SWMKEY-1-...`. `Debug` is redacted.
#[derive(Clone, PartialEq, Eq)]
pub struct UnlockKey([u8; 32]);

impl std::fmt::Debug for UnlockKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UnlockKey(<redacted>)")
    }
}

impl UnlockKey {
    /// A fresh random unlock key.
    pub fn generate(rng: &mut impl CryptoRng) -> UnlockKey {
        let mut b = [0u8; 32];
        rng.fill_bytes(&mut b);
        UnlockKey(b)
    }

    /// The key from its raw bytes (as stored in the cluster object); `None` unless exactly 32 bytes.
    pub fn from_raw(bytes: &[u8]) -> Option<UnlockKey> {
        bytes.try_into().ok().map(UnlockKey)
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Parses `SWMKEY-1-<base64>` (surrounding white space is ignored).
    pub fn parse(s: &str) -> Result<UnlockKey, EncryptionError> {
        let b64 = s.trim().strip_prefix(UNLOCK_KEY_PREFIX).ok_or(EncryptionError::BadUnlockKey)?;
        let bytes =
            base64::engine::general_purpose::STANDARD_NO_PAD.decode(b64).map_err(|_| EncryptionError::BadUnlockKey)?;
        UnlockKey::from_raw(&bytes).ok_or(EncryptionError::BadUnlockKey)
    }

    /// The human-readable form, `SWMKEY-1-<base64>`.
    pub fn to_human(&self) -> String {
        format!("{UNLOCK_KEY_PREFIX}{}", base64::engine::general_purpose::STANDARD_NO_PAD.encode(self.0))
    }

    /// The key-encryption key derived from this unlock key (HKDF-SHA256).
    pub fn kek(&self) -> SecretKey {
        let prk = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, b"").extract(&self.0);
        let okm = prk.expand(&[KEK_INFO], ring::hkdf::HKDF_SHA256).expect("32 bytes from HKDF-SHA256");
        let mut out = [0u8; 32];
        okm.fill(&mut out).expect("32 bytes from HKDF-SHA256");
        SecretKey(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> SecretKey {
        SecretKey::from_bytes([b; 32])
    }

    #[test]
    fn seal_then_open_round_trips_and_hides_the_plaintext() {
        let mut rng = rand::rng();
        for len in [0usize, 1, 17, 4096] {
            let plain: Vec<u8> = (0..len).map(|i| u8::try_from(i % 251).unwrap()).collect();
            let sealed = seal(&key(1), 7, b"entry", &plain, &mut rng);
            assert_eq!(sealed.len(), len + OVERHEAD);
            assert_eq!(sealed_key_id(&sealed), Ok(7));
            assert_eq!(open(&key(1), b"entry", &sealed).unwrap(), plain);
        }
        let marker = b"a-very-recognizable-marker";
        let sealed = seal(&key(1), 1, b"", marker, &mut rng);
        assert!(!sealed.windows(marker.len()).any(|w| w == marker));
        // Two seals of the same bytes differ (fresh nonce).
        assert_ne!(sealed, seal(&key(1), 1, b"", marker, &mut rng));
    }

    #[test]
    fn wrong_key_wrong_context_and_tampering_are_refused() {
        let mut rng = rand::rng();
        let sealed = seal(&key(1), 3, b"snapshot", b"cluster state", &mut rng);
        assert_eq!(open(&key(2), b"snapshot", &sealed), Err(EncryptionError::Authentication));
        assert_eq!(open(&key(1), b"entry", &sealed), Err(EncryptionError::Authentication));
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 0x01;
            assert!(open(&key(1), b"snapshot", &bad).is_err(), "flipping byte {i} went unnoticed");
        }
        assert!(open(&key(1), b"snapshot", &sealed[..sealed.len() - 1]).is_err());
        assert!(matches!(open(&key(1), b"", b"plain text"), Err(EncryptionError::NotSealed(_))));
        assert!(!looks_sealed(b"-----BEGIN PRIVATE KEY-----"));
        assert!(looks_sealed(&sealed));
    }

    #[test]
    fn unlock_keys_print_and_parse_in_swarmkit_form() {
        let k = UnlockKey::generate(&mut rand::rng());
        let human = k.to_human();
        assert!(human.starts_with("SWMKEY-1-"), "{human}");
        assert_eq!(human.len(), 9 + 43);
        assert_eq!(UnlockKey::parse(&format!("  {human}\n")).unwrap(), k);
        for bad in ["", "SWMKEY-1-", "SWMKEY-2-abc", "SWMTKN-1-abc", &human[..human.len() - 1], &format!("{human}AA")] {
            assert_eq!(UnlockKey::parse(bad), Err(EncryptionError::BadUnlockKey), "{bad:?}");
        }
        assert!(!format!("{k:?}").contains(&human[9..]));
        // The KEK is a function of the key, and differs between keys.
        assert_eq!(k.kek(), k.kek());
        assert_ne!(k.kek(), UnlockKey::generate(&mut rand::rng()).kek());
        assert_ne!(k.kek().as_bytes(), k.as_bytes());
    }
}
