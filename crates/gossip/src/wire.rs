//! memberlist's wire format as Docker's libnetwork speaks it: message types, the MessagePack bodies (Go's
//! codec writes structs as maps keyed by field name, and byte slices in the old "raw" string format), the
//! AES-GCM envelope around packets and streams, compound packets, and LZW-compressed payloads (Go's
//! `compress/lzw`, least significant bit first, 8-bit literals: what GIF uses).
//!
//! Pure functions over byte slices; must not depend on IO, clocks or randomness (nonces come in).

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM, AES_256_GCM};
use rmpv::Value;

use crate::GossipError;

/// memberlist's message types (the first byte of a packet or a stream's message).
pub mod kind {
    /// A direct probe.
    pub const PING: u8 = 0;
    /// A probe on another member's behalf.
    pub const INDIRECT_PING: u8 = 1;
    /// The answer to a probe.
    pub const ACK: u8 = 2;
    /// A member is suspected to have failed.
    pub const SUSPECT: u8 = 3;
    /// A member is alive (or joins).
    pub const ALIVE: u8 = 4;
    /// A member failed (or left, when it says so of itself).
    pub const DEAD: u8 = 5;
    /// A full state exchange over a stream.
    pub const PUSH_PULL: u8 = 6;
    /// Several messages in one packet.
    pub const COMPOUND: u8 = 7;
    /// The application's message (libnetwork's network database).
    pub const USER: u8 = 8;
    /// An LZW-compressed message.
    pub const COMPRESS: u8 = 9;
    /// An encrypted stream message.
    pub const ENCRYPT: u8 = 10;
    /// A negative answer to an indirect probe.
    pub const NACK: u8 = 11;
    /// A packet with a CRC32 of the rest.
    pub const HAS_CRC: u8 = 12;
    /// An error answer on a stream.
    pub const ERR: u8 = 13;
}

/// Size of the nonce of the AES-GCM envelope.
pub const NONCE_BYTES: usize = 12;
/// Most bytes a stream message may carry (memberlist's own limit is 20 MiB; a push-pull of 1,024 members is
/// far below this).
pub const MAX_STREAM_BYTES: u32 = 4 << 20;
/// Most bytes a decompressed payload may have.
pub const MAX_DECOMPRESSED_BYTES: usize = 8 << 20;

/// A MessagePack writer in the format Go's codec reads and writes for memberlist: maps keyed by field name,
/// unsigned integers in their smallest form, and byte strings in the raw format (fixstr, str16, str32).
#[derive(Debug, Default)]
pub struct Writer {
    /// What was written so far.
    pub out: Vec<u8>,
}

impl Writer {
    /// A writer whose output starts with `first` (a message type).
    pub fn with_type(first: u8) -> Writer {
        Writer { out: vec![first] }
    }

    /// A map header of `n` entries.
    pub fn map(&mut self, n: usize) -> &mut Self {
        if let Ok(small @ 0..16) = u8::try_from(n) {
            self.out.push(0x80 | small);
        } else {
            // The maps written are structs of a few fields: more than a map16 holds is a bug here.
            let n = u16::try_from(n).expect("a map of at most 65,535 entries");
            self.out.push(0xde);
            self.out.extend_from_slice(&n.to_be_bytes());
        }
        self
    }

    /// A byte string in the raw format (also used for Go strings).
    pub fn raw(&mut self, b: &[u8]) -> &mut Self {
        let n = b.len();
        if let Ok(small @ 0..32) = u8::try_from(n) {
            self.out.push(0xa0 | small);
        } else if let Ok(n) = u16::try_from(n) {
            self.out.push(0xda);
            self.out.extend_from_slice(&n.to_be_bytes());
        } else {
            // Strings are names and messages bounded by MAX_STREAM_BYTES, far under 4 GiB.
            let n = u32::try_from(n).expect("a byte string under 4 GiB");
            self.out.push(0xdb);
            self.out.extend_from_slice(&n.to_be_bytes());
        }
        self.out.extend_from_slice(b);
        self
    }

    /// A map key (a field name).
    pub fn key(&mut self, k: &str) -> &mut Self {
        self.raw(k.as_bytes())
    }

    /// An unsigned integer.
    pub fn uint(&mut self, v: u64) -> &mut Self {
        if let Ok(small @ 0..128) = u8::try_from(v) {
            self.out.push(small);
        } else if let Ok(b) = u8::try_from(v) {
            self.out.extend_from_slice(&[0xcc, b]);
        } else if let Ok(h) = u16::try_from(v) {
            self.out.push(0xcd);
            self.out.extend_from_slice(&h.to_be_bytes());
        } else if let Ok(w) = u32::try_from(v) {
            self.out.push(0xce);
            self.out.extend_from_slice(&w.to_be_bytes());
        } else {
            self.out.push(0xcf);
            self.out.extend_from_slice(&v.to_be_bytes());
        }
        self
    }

    /// A boolean.
    pub fn bool(&mut self, b: bool) -> &mut Self {
        self.out.push(if b { 0xc3 } else { 0xc2 });
        self
    }
}

/// Reads one MessagePack value from the front of `buf`, advancing it.
pub fn read_value(buf: &mut &[u8]) -> Result<Value, GossipError> {
    rmpv::decode::read_value(buf).map_err(|e| GossipError::Malformed(format!("msgpack: {e}")))
}

/// The field `name` of a decoded struct (a map keyed by field name).
pub fn field<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    v.as_map()?.iter().find(|(k, _)| bytes_of(k) == Some(name.as_bytes())).map(|(_, v)| v)
}

/// The bytes of a string or binary value.
pub fn bytes_of(v: &Value) -> Option<&[u8]> {
    match v {
        Value::String(s) => Some(s.as_bytes()),
        Value::Binary(b) => Some(b),
        _ => None,
    }
}

/// Field `name` as bytes (empty when absent or nil).
pub fn field_bytes(v: &Value, name: &str) -> Vec<u8> {
    field(v, name).and_then(bytes_of).map(<[u8]>::to_vec).unwrap_or_default()
}

/// Field `name` as a string (lossy; empty when absent).
pub fn field_str(v: &Value, name: &str) -> String {
    String::from_utf8_lossy(&field_bytes(v, name)).into_owned()
}

/// Field `name` as an unsigned integer (0 when absent or negative).
pub fn field_u64(v: &Value, name: &str) -> u64 {
    field(v, name).and_then(Value::as_u64).unwrap_or(0)
}

/// Field `name` as a boolean (false when absent).
pub fn field_bool(v: &Value, name: &str) -> bool {
    field(v, name).and_then(Value::as_bool).unwrap_or(false)
}

fn key_of(key: &[u8]) -> Result<LessSafeKey, GossipError> {
    let alg = match key.len() {
        16 => &AES_128_GCM,
        32 => &AES_256_GCM,
        n => return Err(GossipError::Key(format!("a gossip key has {n} bytes; 16 or 32 are supported"))),
    };
    let unbound = UnboundKey::new(alg, key).map_err(|_| GossipError::Key("unusable gossip key".into()))?;
    Ok(LessSafeKey::new(unbound))
}

/// memberlist's encrypted payload (version 1: no padding): `[1][nonce][ciphertext and tag]`, authenticating
/// `aad` as well.
pub fn seal(key: &[u8], nonce: [u8; NONCE_BYTES], aad: &[u8], plain: &[u8]) -> Result<Vec<u8>, GossipError> {
    let k = key_of(key)?;
    let mut body = plain.to_vec();
    k.seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), &mut body)
        .map_err(|_| GossipError::Key("encryption failed".into()))?;
    let mut out = Vec::with_capacity(1 + NONCE_BYTES + body.len());
    out.push(1);
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&body);
    Ok(out)
}

/// Opens an encrypted payload with the first of `keys` that authenticates it (versions 0, with PKCS#7
/// padding, and 1).
pub fn open(keys: &[Vec<u8>], msg: &[u8], aad: &[u8]) -> Result<Vec<u8>, GossipError> {
    if msg.len() < 1 + NONCE_BYTES + 16 {
        return Err(GossipError::Malformed("encrypted payload too short".into()));
    }
    let version = msg[0];
    if version > 1 {
        return Err(GossipError::Malformed(format!("unsupported encryption version {version}")));
    }
    let mut nonce = [0u8; NONCE_BYTES];
    nonce.copy_from_slice(&msg[1..1 + NONCE_BYTES]);
    for key in keys {
        let k = key_of(key)?;
        let mut body = msg[1 + NONCE_BYTES..].to_vec();
        if let Ok(plain) = k.open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(aad), &mut body) {
            let mut plain = plain.to_vec();
            if version == 0 {
                let pad = usize::from(*plain.last().unwrap_or(&0));
                if pad == 0 || pad > plain.len() {
                    return Err(GossipError::Malformed("bad padding".into()));
                }
                plain.truncate(plain.len() - pad);
            }
            return Ok(plain);
        }
    }
    Err(GossipError::NoKey)
}

/// A stream message in its encrypted envelope: `[ENCRYPT][length: u32 BE][payload]`, the first five bytes
/// authenticated.
pub fn seal_stream(key: &[u8], nonce: [u8; NONCE_BYTES], plain: &[u8]) -> Result<Vec<u8>, GossipError> {
    let len = u32::try_from(1 + NONCE_BYTES + plain.len() + 16)
        .map_err(|_| GossipError::Malformed(format!("a stream message of {} bytes is too large", plain.len())))?;
    let mut head = vec![kind::ENCRYPT];
    head.extend_from_slice(&len.to_be_bytes());
    let sealed = seal(key, nonce, &head, plain)?;
    head.extend_from_slice(&sealed);
    Ok(head)
}

/// The plaintext of a whole stream frame as `seal_stream` makes it.
pub fn open_stream(keys: &[Vec<u8>], frame: &[u8]) -> Result<Vec<u8>, GossipError> {
    if frame.len() < 5 || frame[0] != kind::ENCRYPT {
        return Err(GossipError::Malformed(
            "the stream is not encrypted; every member must use the cluster's keys".into(),
        ));
    }
    open(keys, &frame[5..], &frame[..5])
}

/// Undoes memberlist's compression: `buf` is the MessagePack body of a COMPRESS message (`{Algo, Buf}`).
pub fn decompress(buf: &mut &[u8]) -> Result<Vec<u8>, GossipError> {
    let v = read_value(buf)?;
    let algo = field_u64(&v, "Algo");
    if algo != 0 {
        return Err(GossipError::Malformed(format!("unknown compression algorithm {algo}")));
    }
    let data = field_bytes(&v, "Buf");
    // Decoded in chunks, so a small payload that expands without end stops at the bound.
    let mut dec = weezl::decode::Decoder::new(weezl::BitOrder::Lsb, 8);
    let mut out = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    let mut inp = data.as_slice();
    loop {
        let r = dec.decode_bytes(inp, &mut chunk);
        inp = &inp[r.consumed_in..];
        out.extend_from_slice(&chunk[..r.consumed_out]);
        if out.len() > MAX_DECOMPRESSED_BYTES {
            return Err(GossipError::Malformed(format!(
                "a compressed payload expands past {MAX_DECOMPRESSED_BYTES} bytes"
            )));
        }
        match r.status {
            Ok(weezl::LzwStatus::Done) => return Ok(out),
            Ok(weezl::LzwStatus::Ok) => {}
            Ok(weezl::LzwStatus::NoProgress) => {
                return Err(GossipError::Malformed("a compressed payload without its end code".into()))
            }
            Err(e) => return Err(GossipError::Malformed(format!("lzw: {e}"))),
        }
    }
}

/// The messages of a COMPOUND body: `[count][lengths: u16 BE each][messages]`.
pub fn split_compound(buf: &[u8]) -> Result<Vec<&[u8]>, GossipError> {
    let Some((&n, rest)) = buf.split_first() else {
        return Err(GossipError::Malformed("empty compound message".into()));
    };
    let n = usize::from(n);
    if rest.len() < 2 * n {
        return Err(GossipError::Malformed("truncated compound header".into()));
    }
    let (lens, mut body) = rest.split_at(2 * n);
    let mut out = Vec::with_capacity(n);
    for c in lens.chunks(2) {
        let len = usize::from(u16::from_be_bytes([c[0], c[1]]));
        if body.len() < len {
            return Err(GossipError::Malformed("truncated compound message".into()));
        }
        let (m, r) = body.split_at(len);
        out.push(m);
        body = r;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_payload_opens_with_any_key_of_the_ring_and_not_with_others() {
        let k1 = vec![1u8; 16];
        let k2 = vec![2u8; 16];
        let sealed = seal(&k2, [7; NONCE_BYTES], b"", b"hello").unwrap();
        assert_eq!(sealed[0], 1);
        assert_eq!(open(&[k1.clone(), k2], &sealed, b"").unwrap(), b"hello");
        assert!(matches!(open(&[k1], &sealed, b""), Err(GossipError::NoKey)));
        let frame = seal_stream(&[3u8; 16], [9; NONCE_BYTES], b"state").unwrap();
        assert_eq!(u32::from_be_bytes([frame[1], frame[2], frame[3], frame[4]]) as usize, frame.len() - 5);
        assert_eq!(open_stream(&[vec![3u8; 16]], &frame).unwrap(), b"state");
        let mut tampered = frame.clone();
        tampered[2] ^= 1;
        assert!(open_stream(&[vec![3u8; 16]], &tampered).is_err(), "the header is authenticated");
    }

    #[test]
    fn messagepack_is_written_as_go_reads_it_and_read_back() {
        let mut w = Writer::with_type(kind::ALIVE);
        w.map(3).key("Node").raw(&[b'x'; 40]).key("Port").uint(7946).key("Join").bool(true);
        assert_eq!(w.out[0], kind::ALIVE);
        assert_eq!(w.out[1], 0x83);
        assert_eq!(&w.out[2..7], b"\xa4Node");
        assert_eq!(&w.out[7..10], &[0xda, 0, 40], "no str8: the old raw format");
        let mut body = &w.out[1..];
        let v = read_value(&mut body).unwrap();
        assert!(body.is_empty());
        assert_eq!(field_str(&v, "Node"), "x".repeat(40));
        assert_eq!(field_u64(&v, "Port"), 7946);
        assert!(field_bool(&v, "Join"));
    }

    #[test]
    fn lzw_payloads_decompress_and_compound_packets_split() {
        let text = b"TOBEORNOTTOBEORTOBEORNOT#".repeat(20);
        let packed = weezl::encode::Encoder::new(weezl::BitOrder::Lsb, 8).encode(&text).unwrap();
        let mut w = Writer::default();
        w.map(2).key("Algo").uint(0).key("Buf").raw(&packed);
        let mut body = w.out.as_slice();
        assert_eq!(decompress(&mut body).unwrap(), text);
        let compound = [2u8, 0, 1, 0, 2, 0xaa, 0xbb, 0xcc];
        assert_eq!(split_compound(&compound).unwrap(), vec![&[0xaa][..], &[0xbb, 0xcc][..]]);
        assert!(split_compound(&[2u8, 0, 5, 0, 1, 0]).is_err());
        // A payload that expands past the bound is refused, not buffered.
        let bomb = weezl::encode::Encoder::new(weezl::BitOrder::Lsb, 8)
            .encode(&vec![0u8; MAX_DECOMPRESSED_BYTES + 1])
            .unwrap();
        let mut w = Writer::default();
        w.map(2).key("Algo").uint(0).key("Buf").raw(&bomb);
        let err = decompress(&mut w.out.as_slice()).unwrap_err();
        assert!(err.to_string().contains("expands past"), "{err}");
        // Without its end code.
        let mut w = Writer::default();
        w.map(2).key("Algo").uint(0).key("Buf").raw(&packed[..packed.len() - 2]);
        assert!(decompress(&mut w.out.as_slice()).is_err());
    }
}
