//! The mutator of the seeded runner: from a corpus input (and a second one to splice with), one to four of
//! bit flips, byte sets, interesting integers (as bytes and as decimal text, so JSON numbers reach their
//! limits too), dictionary tokens, truncations, deletions, duplications, random insertions and splices.
//! Outputs are capped at `MAX_INPUT_BYTES`. Deterministic for a given RNG.

use rand::rngs::SmallRng;
use rand::Rng;

/// Largest input the mutator makes.
pub const MAX_INPUT_BYTES: usize = 64 * 1024;

const INTERESTING_TEXT: &[&str] = &[
    "0",
    "-1",
    "1",
    "255",
    "65535",
    "2147483647",
    "-2147483648",
    "4294967295",
    "9223372036854775807",
    "-9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "1e308",
    "1e309",
    "-0",
    "0.5",
    "NaN",
    "null",
    "true",
    "false",
    "\"\"",
    "[]",
    "{}",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "1000000000",
];

const INTERESTING_U64: &[u64] =
    &[0, 1, 0x7f, 0x80, 0xff, 0xffff, 0x7fff_ffff, 0xffff_ffff, i64::MAX as u64, u64::MAX, 1 << 31, 1 << 32];

/// `input` mutated by `rng`, `other` being another corpus input to splice from.
pub fn mutate(input: &[u8], other: &[u8], dictionary: &[&str], rng: &mut SmallRng) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..rng.random_range(1..=4) {
        mutate_once(&mut out, other, dictionary, rng);
    }
    out.truncate(MAX_INPUT_BYTES);
    out
}

fn insert(out: &mut Vec<u8>, at: usize, bytes: &[u8]) {
    let at = at.min(out.len());
    out.splice(at..at, bytes.iter().copied());
}

fn mutate_once(out: &mut Vec<u8>, other: &[u8], dictionary: &[&str], rng: &mut SmallRng) {
    let len = out.len();
    let pos = if len == 0 { 0 } else { rng.random_range(0..len) };
    match rng.random_range(0..12u8) {
        0 if len > 0 => out[pos] ^= 1 << rng.random_range(0..8),
        1 if len > 0 => out[pos] = rng.random(),
        2 => {
            let v = INTERESTING_U64[rng.random_range(0..INTERESTING_U64.len())];
            let width = [1usize, 2, 4, 8][rng.random_range(0..4)];
            let bytes = if rng.random() { v.to_le_bytes() } else { v.to_be_bytes() };
            let chunk = if bytes[0] == 0 && width < 8 { &bytes[8 - width..] } else { &bytes[..width] };
            if pos + width <= len {
                out[pos..pos + width].copy_from_slice(chunk);
            } else {
                insert(out, pos, chunk);
            }
        }
        3 => {
            // Replace a run of ASCII digits (a JSON number, most often) or insert at a random place.
            let t = INTERESTING_TEXT[rng.random_range(0..INTERESTING_TEXT.len())].as_bytes();
            let start = (pos..len).find(|&i| out[i].is_ascii_digit());
            match start {
                Some(s) => {
                    let end = (s..len).find(|&i| !out[i].is_ascii_digit()).unwrap_or(len);
                    out.splice(s..end, t.iter().copied());
                }
                None => insert(out, pos, t),
            }
        }
        4 if !dictionary.is_empty() => {
            let t = dictionary[rng.random_range(0..dictionary.len())];
            insert(out, pos, t.as_bytes());
        }
        5 => out.truncate(pos),
        6 if len > 0 => {
            let end = (pos + rng.random_range(1..=16)).min(len);
            out.drain(pos..end);
        }
        7 if len > 0 => {
            let end = (pos + rng.random_range(1..=64)).min(len);
            let chunk = out[pos..end].to_vec();
            let at = rng.random_range(0..=len);
            insert(out, at, &chunk);
        }
        8 => {
            let n = rng.random_range(1..=8);
            let bytes: Vec<u8> = (0..n).map(|_| rng.random()).collect();
            insert(out, pos, &bytes);
        }
        9 if !other.is_empty() => {
            let from = rng.random_range(0..other.len());
            let to = rng.random_range(from..=other.len());
            out.truncate(pos);
            out.extend_from_slice(&other[from..to]);
        }
        10 if len > 1 => {
            // A protobuf varint or a length prefix made huge.
            out[pos] |= 0x80;
        }
        _ if len > 0 => out[pos] = out[pos].wrapping_add(rng.random_range(1..=35)),
        _ => insert(out, 0, &[rng.random()]),
    }
}
