//! Object IDs in SwarmKit's form: 25 characters of base 36 from 128 random bits, from an injected RNG.

const ALPHABET: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";

/// Length of a generated ID.
pub const ID_LEN: usize = 25;

/// Makes an ID from 128 random bits (`hi`, `lo`); callers draw them from their seeded RNG.
pub fn id_from_bits(hi: u64, lo: u64) -> String {
    let mut n = ((hi as u128) << 64) | lo as u128;
    let mut out = [b'0'; ID_LEN];
    for slot in out.iter_mut().rev() {
        *slot = ALPHABET[(n % 36) as usize];
        n /= 36;
    }
    String::from_utf8(out.to_vec()).expect("alphabet is ASCII")
}

/// A source of IDs. Implementations hold their own seeded RNG.
pub trait IdSource: Send + Sync + std::fmt::Debug {
    /// A new, unique ID.
    fn new_id(&self) -> String;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_25_base36_chars() {
        let id = id_from_bits(u64::MAX, u64::MAX);
        assert_eq!(id.len(), ID_LEN);
        assert!(id.bytes().all(|b| b.is_ascii_digit() || b.is_ascii_lowercase()));
        assert_ne!(id_from_bits(1, 2), id_from_bits(2, 1));
    }
}
