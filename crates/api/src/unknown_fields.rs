//! Finds the fields an encoded message carries that Shoal's protos do not define. prost drops such fields
//! silently when it decodes; a server that must refuse what it cannot honour (SwarmKit's Control API, where
//! a newer client may send fields Shoal's subset lacks) checks the raw bytes first with `unknown_fields`.
//!
//! It walks the protobuf wire format against the descriptors `build.rs` saved (`FILE_DESCRIPTOR_SET`),
//! recursing into known message fields; types it has no descriptor for are taken as opaque. An unknown field
//! that holds its zero value (a 0 varint or fixed number, an empty string, bytes or message) is not reported:
//! proto3 reads it as absent, so nothing is lost (Go's gogoproto writes non-nullable embedded messages even
//! when empty, e.g. SwarmKit's deprecated `ClusterSpec.acceptance_policy`). Bounded: at most
//! `MAX_DEPTH` levels of nesting and `MAX_REPORTED` reported fields.
//!
//! Knows nothing but the wire format and the descriptors.

use std::collections::HashMap;
use std::sync::OnceLock;

use prost::Message;
use prost_types::field_descriptor_proto::Type;
use prost_types::FileDescriptorSet;

/// The encoded `FileDescriptorSet` of every proto this crate is built from (and their imports).
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/swarmkit_descriptor.bin"));

/// Deepest nesting walked; deeper messages are refused as malformed.
pub const MAX_DEPTH: usize = 64;

/// At most this many unknown fields are reported for one message.
pub const MAX_REPORTED: usize = 16;

/// One field of a message: its name and, for a message-typed field, the full name of that type.
struct Field {
    name: String,
    message_type: Option<String>,
}

/// Message full name (".docker.swarmkit.v1.Node") -> field number -> field.
type Descriptors = HashMap<String, HashMap<u32, Field>>;

fn descriptors() -> &'static Descriptors {
    static D: OnceLock<Descriptors> = OnceLock::new();
    D.get_or_init(|| {
        let mut out = Descriptors::new();
        let set = FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).unwrap_or_default();
        fn add(out: &mut Descriptors, prefix: &str, m: &prost_types::DescriptorProto) {
            let full = format!("{prefix}.{}", m.name());
            let fields = m
                .field
                .iter()
                .map(|f| {
                    let message_type = (f.r#type() == Type::Message).then(|| f.type_name().to_string());
                    (f.number() as u32, Field { name: f.name().to_string(), message_type })
                })
                .collect();
            for nested in &m.nested_type {
                add(out, &full, nested);
            }
            out.insert(full, fields);
        }
        for file in &set.file {
            let prefix = if file.package().is_empty() { String::new() } else { format!(".{}", file.package()) };
            for m in &file.message_type {
                add(&mut out, &prefix, m);
            }
        }
        out
    })
}

/// True when the protos define message `type_name` (full name with a leading dot).
pub fn is_known_type(type_name: &str) -> bool {
    descriptors().contains_key(type_name)
}

/// Why a message could not be walked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed protobuf message: {0}")]
pub struct Malformed(String);

/// The unknown fields of `bytes`, decoded as message `type_name` (full name with a leading dot, e.g.
/// ".docker.swarmkit.v1.CreateServiceRequest"), each as "path.to.message: field N" (path by field names
/// from the top message). Empty when every field is known.
pub fn unknown_fields(type_name: &str, bytes: &[u8]) -> Result<Vec<String>, Malformed> {
    let mut out = Vec::new();
    walk(descriptors(), type_name, bytes, "", 0, &mut out)?;
    Ok(out)
}

fn varint(b: &[u8], pos: &mut usize) -> Result<u64, Malformed> {
    let mut v: u64 = 0;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*pos).ok_or_else(|| Malformed("truncated varint".into()))?;
        *pos += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(Malformed("varint longer than 10 bytes".into()))
}

fn walk(
    d: &Descriptors,
    type_name: &str,
    b: &[u8],
    path: &str,
    depth: usize,
    out: &mut Vec<String>,
) -> Result<(), Malformed> {
    if depth > MAX_DEPTH {
        return Err(Malformed(format!("nested deeper than {MAX_DEPTH} messages")));
    }
    let Some(fields) = d.get(type_name) else {
        return Ok(());
    };
    let mut pos = 0;
    while pos < b.len() {
        let tag = varint(b, &mut pos)?;
        // Protobuf field numbers fit 29 bits: a larger one is refused, not truncated onto a known field.
        let number =
            u32::try_from(tag >> 3).map_err(|_| Malformed(format!("field number {} is too large", tag >> 3)))?;
        let wire = tag & 7;
        let start = pos;
        let zero = match wire {
            0 => varint(b, &mut pos)? == 0,
            1 => {
                pos += 8;
                b.get(start..pos).is_some_and(|v| v.iter().all(|x| *x == 0))
            }
            5 => {
                pos += 4;
                b.get(start..pos).is_some_and(|v| v.iter().all(|x| *x == 0))
            }
            2 => {
                let len = usize::try_from(varint(b, &mut pos)?)
                    .map_err(|_| Malformed("length does not fit this machine's address space".into()))?;
                pos = pos.checked_add(len).ok_or_else(|| Malformed("length overflows".into()))?;
                len == 0
            }
            other => return Err(Malformed(format!("wire type {other} (groups are not used by these protos)"))),
        };
        if pos > b.len() {
            return Err(Malformed("field runs past the end of the message".into()));
        }
        match fields.get(&number) {
            None if zero => {}
            None => {
                if out.len() < MAX_REPORTED {
                    let at =
                        if path.is_empty() { type_name.trim_start_matches('.').to_string() } else { path.to_string() };
                    out.push(format!("{at}: field {number}"));
                }
            }
            Some(f) => {
                if let (Some(t), 2) = (&f.message_type, wire) {
                    let mut inner = start;
                    // Checked above: this length was read and bounded by the message's end.
                    let len = usize::try_from(varint(b, &mut inner)?).expect("checked when the field was read");
                    let sub = &b[inner..inner + len];
                    let p = if path.is_empty() { f.name.clone() } else { format!("{path}.{}", f.name) };
                    walk(d, t, sub, &p, depth + 1, out)?;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Annotations, ServiceSpec};

    #[test]
    fn known_fields_pass_and_unknown_ones_are_named_with_their_path() {
        let spec = ServiceSpec {
            annotations: Some(Annotations { name: "web".into(), ..Default::default() }),
            ..Default::default()
        };
        let mut bytes = spec.encode_to_vec();
        assert_eq!(unknown_fields(".docker.swarmkit.v1.ServiceSpec", &bytes).unwrap(), Vec::<String>::new());
        // Fields Shoal lacks holding their zero value lose nothing: not reported.
        prost::encoding::encode_key(99, prost::encoding::WireType::LengthDelimited, &mut bytes);
        bytes.push(0);
        bytes.extend_from_slice(&[12 << 3, 0]);
        assert_eq!(unknown_fields(".docker.swarmkit.v1.ServiceSpec", &bytes).unwrap(), Vec::<String>::new());
        // A field number no ServiceSpec defines, holding one byte.
        prost::encoding::encode_key(99, prost::encoding::WireType::LengthDelimited, &mut bytes);
        bytes.extend_from_slice(&[1, 0]);
        // Annotations field 9, a varint, inside a second annotations message.
        bytes.extend_from_slice(&[1 << 3 | 2, 2, 9 << 3, 1]);
        assert_eq!(
            unknown_fields(".docker.swarmkit.v1.ServiceSpec", &bytes).unwrap(),
            vec!["docker.swarmkit.v1.ServiceSpec: field 99".to_string(), "annotations: field 9".to_string()]
        );
    }

    #[test]
    fn malformed_bytes_are_an_error_not_a_panic() {
        assert!(unknown_fields(".docker.swarmkit.v1.ServiceSpec", &[0x0a, 0x05, 1]).is_err());
        assert!(unknown_fields(".docker.swarmkit.v1.ServiceSpec", &[0x0b]).is_err());
        assert!(unknown_fields(".docker.swarmkit.v1.ServiceSpec", &[0xff; 11]).is_err());
        // Field number 2^32 + 1 (a varint, value 0) is refused rather than read as field 1, annotations.
        let mut huge = Vec::new();
        prost::encoding::encode_varint(((1u64 << 32) + 1) << 3, &mut huge);
        huge.push(0);
        let err = unknown_fields(".docker.swarmkit.v1.ServiceSpec", &huge).unwrap_err();
        assert!(err.to_string().contains("field number 4294967297 is too large"), "{err}");
    }
}
