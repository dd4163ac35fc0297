//! Request bodies decoded as the Docker Engine decodes them with Go's `encoding/json`, for every type through
//! one mechanism: the body is parsed into a `serde_json::Value`, then the target type is deserialized through
//! `GoValue`, a `Deserializer` over that value which, for each struct serde asks for, maps every JSON key to the
//! struct field it names (an exact match first, else an ASCII case-insensitive one), drops keys whose value is
//! `null` (the field keeps its default), and reads a `null` anywhere else (an array element, a map value) as the
//! zero value of the type asked for. Map keys (labels, options) are kept as sent; unknown keys are ignored.
//!
//! Differences from Go, by design or by cost: Go folds keys with Unicode simple folding (so `ſ` matches `s` and
//! the Kelvin sign `K`), we fold ASCII only; when a document names one field twice (`"Name"` and `"name"`), Go
//! keeps the later one in document order and we keep the exact match (serde_json's map does not keep order).
//! Struct types decoded here must not use `#[serde(flatten)]` (serde then asks for a map and no field list, so
//! the keys of the flattened part would not be folded): `tests.rs` checks the request types.
//!
//! Must not depend on HTTP or the store.

use serde::de::{self, DeserializeOwned, Deserializer, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Why a body could not be decoded; the message is the one the client sees (after "invalid JSON: ").
#[derive(Debug, thiserror::Error)]
#[error("invalid JSON: {0}")]
pub struct DecodeError(String);

/// Decodes `body` into `T` as Go's `encoding/json` would decode it into the matching Go struct.
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, DecodeError> {
    let doc: Value = serde_json::from_slice(body).map_err(|e| DecodeError(e.to_string()))?;
    from_value(doc)
}

/// Decodes an already parsed document into `T`, as `decode` does.
pub fn from_value<T: DeserializeOwned>(doc: Value) -> Result<T, DecodeError> {
    T::deserialize(GoValue::root(doc)).map_err(|e| DecodeError(e.to_string()))
}

/// A JSON value with the path that led to it (for error messages), deserialized the way Go decodes.
pub struct GoValue {
    value: Value,
    path: String,
}

impl GoValue {
    fn root(value: Value) -> GoValue {
        GoValue { value, path: String::new() }
    }

    fn child(&self, segment: &str) -> String {
        if self.path.is_empty() {
            segment.to_string()
        } else {
            format!("{}.{segment}", self.path)
        }
    }

    /// An error raised at this value, naming where it is.
    fn at(&self, e: serde_json::Error) -> serde_json::Error {
        if self.path.is_empty() {
            e
        } else {
            de::Error::custom(format!("{}: {e}", self.path))
        }
    }
}

/// The struct field `key` names: the exact field, else the one equal to it ignoring ASCII case.
fn field_for(key: &str, fields: &'static [&'static str]) -> Option<&'static str> {
    fields.iter().find(|f| **f == key).or_else(|| fields.iter().find(|f| f.eq_ignore_ascii_case(key))).copied()
}

/// The members of an object as a struct with `fields` sees them: keys renamed to the fields they match, null
/// members dropped; of two members naming the same field, the exact match wins.
fn fold_struct(path: &str, map: Map<String, Value>, fields: &'static [&'static str]) -> Vec<(String, GoValue)> {
    let mut out: Vec<(String, GoValue, bool)> = Vec::with_capacity(map.len());
    for (key, value) in map {
        if value.is_null() {
            continue;
        }
        let (name, exact) = match field_for(&key, fields) {
            Some(f) => (f.to_string(), f == key),
            None => (key, true),
        };
        let child_path = if path.is_empty() { name.clone() } else { format!("{path}.{name}") };
        let member = GoValue { value, path: child_path };
        match out.iter_mut().find(|(n, _, _)| *n == name) {
            Some(slot) if exact || !slot.2 => *slot = (name, member, exact),
            Some(_) => {}
            None => out.push((name, member, exact)),
        }
    }
    out.into_iter().map(|(n, v, _)| (n, v)).collect()
}

struct Members(std::vec::IntoIter<(String, GoValue)>, Option<GoValue>);

impl<'de> MapAccess<'de> for Members {
    type Error = serde_json::Error;

    fn next_key_seed<K: de::DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, Self::Error> {
        match self.0.next() {
            Some((k, v)) => {
                self.1 = Some(v);
                seed.deserialize(k.into_deserializer()).map(Some)
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: de::DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Self::Error> {
        let v = self.1.take().ok_or_else(|| de::Error::custom("a map value was asked before its key"))?;
        seed.deserialize(v)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

struct Elements(std::vec::IntoIter<GoValue>);

impl<'de> SeqAccess<'de> for Elements {
    type Error = serde_json::Error;

    fn next_element_seed<T: de::DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, Self::Error> {
        self.0.next().map(|v| seed.deserialize(v)).transpose()
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

impl GoValue {
    /// The value, and this position without it (to build children and errors from).
    fn split(self) -> (Value, GoValue) {
        (self.value, GoValue { value: Value::Null, path: self.path })
    }

    /// An object's members with their keys as sent (a Go map).
    fn map_members(self, map: Map<String, Value>) -> Members {
        let members: Vec<_> = map
            .into_iter()
            .map(|(k, value)| {
                let path = self.child(&k);
                (k, GoValue { value, path })
            })
            .collect();
        Members(members.into_iter(), None)
    }

    fn elements(&self, a: Vec<Value>) -> Elements {
        let items: Vec<_> = a
            .into_iter()
            .enumerate()
            .map(|(i, value)| GoValue { value, path: format!("{}[{i}]", self.path) })
            .collect();
        Elements(items.into_iter())
    }

    fn empty_map() -> Members {
        Members(Vec::new().into_iter(), None)
    }
}

/// Scalars: `null` is the zero value, anything else is read by serde_json (with the path on its error).
macro_rules! scalar {
    ($($method:ident => $zero:expr),* $(,)?) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
            if self.value.is_null() {
                #[allow(clippy::redundant_closure_call)]
                return ($zero)(visitor);
            }
            let (value, at) = self.split();
            value.$method(visitor).map_err(|e| at.at(e))
        }
    )*};
}

impl<'de> Deserializer<'de> for GoValue {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        let (value, at) = self.split();
        match value {
            Value::Object(m) => visitor.visit_map(at.map_members(m)),
            Value::Array(a) => visitor.visit_seq(at.elements(a)),
            other => other.deserialize_any(visitor).map_err(|e| at.at(e)),
        }
    }

    scalar! {
        deserialize_bool => |v: V| v.visit_bool(false),
        deserialize_i8 => |v: V| v.visit_u64(0),
        deserialize_i16 => |v: V| v.visit_u64(0),
        deserialize_i32 => |v: V| v.visit_u64(0),
        deserialize_i64 => |v: V| v.visit_u64(0),
        deserialize_i128 => |v: V| v.visit_u64(0),
        deserialize_u8 => |v: V| v.visit_u64(0),
        deserialize_u16 => |v: V| v.visit_u64(0),
        deserialize_u32 => |v: V| v.visit_u64(0),
        deserialize_u64 => |v: V| v.visit_u64(0),
        deserialize_u128 => |v: V| v.visit_u64(0),
        deserialize_f32 => |v: V| v.visit_f64(0.0),
        deserialize_f64 => |v: V| v.visit_f64(0.0),
        deserialize_str => |v: V| v.visit_str(""),
        deserialize_string => |v: V| v.visit_str(""),
        deserialize_bytes => |v: V| v.visit_bytes(&[]),
        deserialize_byte_buf => |v: V| v.visit_bytes(&[]),
        deserialize_unit => |v: V| v.visit_unit(),
        deserialize_char => |v: V| v.visit_char('\0'),
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        if self.value.is_null() {
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, name: &'static str, visitor: V) -> Result<V::Value, Self::Error> {
        if self.value.is_null() {
            return visitor.visit_unit();
        }
        let (value, at) = self.split();
        value.deserialize_unit_struct(name, visitor).map_err(|e| at.at(e))
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        let (value, at) = self.split();
        match value {
            Value::Null => visitor.visit_seq(Elements(Vec::new().into_iter())),
            Value::Array(a) => visitor.visit_seq(at.elements(a)),
            other => other.deserialize_seq(visitor).map_err(|e| at.at(e)),
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, Self::Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        let (value, at) = self.split();
        match value {
            Value::Null => visitor.visit_map(GoValue::empty_map()),
            Value::Object(m) => visitor.visit_map(at.map_members(m)),
            other => other.deserialize_map(visitor).map_err(|e| at.at(e)),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        let (value, at) = self.split();
        match value {
            Value::Null => visitor.visit_map(GoValue::empty_map()),
            Value::Object(m) => visitor.visit_map(Members(fold_struct(&at.path, m, fields).into_iter(), None)),
            other => other.deserialize_struct(name, fields, visitor).map_err(|e| at.at(e)),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        let (value, at) = self.split();
        value.deserialize_enum(name, variants, visitor).map_err(|e| at.at(e))
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        self.value.deserialize_identifier(visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_unit()
    }
}
