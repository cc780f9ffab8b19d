//! Every key `config.toml` accepts, read from the config types themselves.
//!
//! The user guide's configuration reference (docs/configuration.md) is
//! checked against this list by a test, so a field added to a config struct
//! and not documented fails it: there is no second list to keep in step.
//! The list comes from serde: a deserializer that walks down one path of
//! keys and records the field names `#[derive(Deserialize)]` hands to
//! `deserialize_struct` where the path ends. Every walk ends in an error
//! (no value is ever built); only what was recorded on the way counts.

use std::cell::Cell;

use serde::de::value::{Error, StrDeserializer};
use serde::de::{self, DeserializeSeed, Visitor};
use serde::Deserialize;

/// Every key, as a dotted path: `agent.model`; `mqtt.trigger.topic` for an
/// array of tables; `policy.*.tools` where the user names the table. A key
/// whose value is a table of the user's own keys (`extra_headers`) is listed
/// once, by itself. Sorted.
pub fn reference_keys() -> Vec<String> {
    let mut keys = Vec::new();
    let mut todo: Vec<Vec<&'static str>> = vec![Vec::new()];
    while let Some(path) = todo.pop() {
        match probe(&path) {
            Node::Struct(fields) => todo.extend(fields.iter().map(|f| [path.as_slice(), &[*f]].concat())),
            Node::Map => {
                let entry = [path.as_slice(), &["*"]].concat();
                match probe(&entry) {
                    Node::Leaf => keys.push(path.join(".")),
                    _ => todo.push(entry),
                }
            }
            Node::Leaf => keys.push(path.join(".")),
        }
    }
    keys.sort();
    keys
}

#[derive(Clone, Copy)]
enum Node {
    Struct(&'static [&'static str]),
    Map,
    Leaf,
}

/// What the value at the end of `path` is.
fn probe(path: &[&'static str]) -> Node {
    let found = Cell::new(Node::Leaf);
    let _ = super::Config::deserialize(Walk { path, depth: 0, in_any: false, found: &found });
    found.get()
}

struct Walk<'a> {
    path: &'a [&'static str],
    depth: usize,
    /// Inside `deserialize_any`'s one-element sequence: a second
    /// `deserialize_any` is a leaf (serde's buffering of untagged enums would
    /// otherwise recurse for ever).
    in_any: bool,
    found: &'a Cell<Node>,
}

impl<'a> Walk<'a> {
    fn at_end(&self) -> bool {
        self.depth == self.path.len()
    }
    fn deeper(&self) -> Walk<'a> {
        Walk { path: self.path, depth: self.depth + 1, in_any: false, found: self.found }
    }
    fn same(&self, in_any: bool) -> Walk<'a> {
        Walk { path: self.path, depth: self.depth, in_any, found: self.found }
    }
    /// The one entry of the table on the path: its next key, then the walk below it.
    fn entry<'de, V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_map(Entry { key: Some(self.path[self.depth]), value: Some(self.deeper()) })
    }
}

fn end() -> Error {
    de::Error::custom("end of the walk")
}

struct Entry<'a> {
    key: Option<&'static str>,
    value: Option<Walk<'a>>,
}

impl<'de> de::MapAccess<'de> for Entry<'_> {
    type Error = Error;
    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, Error> {
        self.key.take().map(|k| seed.deserialize(StrDeserializer::new(k))).transpose()
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        seed.deserialize(self.value.take().ok_or_else(end)?)
    }
}

/// A sequence of one element: the same walk (an array of tables, or a key
/// that takes a table or an array of them).
struct One<'a>(Option<Walk<'a>>);

impl<'de> de::SeqAccess<'de> for One<'_> {
    type Error = Error;
    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, Error> {
        self.0.take().map(|w| seed.deserialize(w)).transpose()
    }
}

macro_rules! leaves {
    ($($method:ident)*) => {$(
        fn $method<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Error> { Err(end()) }
    )*};
}

impl<'de> de::Deserializer<'de> for Walk<'_> {
    type Error = Error;
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        if name.starts_with("$__") {
            return Err(end()); // a wrapper such as toml's `Spanned`: a leaf
        }
        if self.at_end() {
            self.found.set(Node::Struct(fields));
            return Err(end());
        }
        self.entry(visitor)
    }
    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        if self.at_end() {
            self.found.set(Node::Map);
            return Err(end());
        }
        self.entry(visitor)
    }
    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        if self.in_any {
            return Err(end());
        }
        visitor.visit_seq(One(Some(self.same(true))))
    }
    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let in_any = self.in_any;
        visitor.visit_seq(One(Some(self.same(in_any))))
    }
    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_some(self)
    }
    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _: &'static str, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }
    fn deserialize_unit_struct<V: Visitor<'de>>(self, _: &'static str, _: V) -> Result<V::Value, Error> {
        Err(end())
    }
    fn deserialize_tuple<V: Visitor<'de>>(self, _: usize, _: V) -> Result<V::Value, Error> {
        Err(end())
    }
    fn deserialize_tuple_struct<V: Visitor<'de>>(self, _: &'static str, _: usize, _: V) -> Result<V::Value, Error> {
        Err(end())
    }
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Error> {
        Err(end())
    }
    leaves! {
        deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64 deserialize_u8
        deserialize_u16 deserialize_u32 deserialize_u64 deserialize_f32 deserialize_f64 deserialize_char
        deserialize_str deserialize_string deserialize_bytes deserialize_byte_buf deserialize_unit
        deserialize_identifier deserialize_ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::reference_keys;

    /// The walk finds keys at every kind of place: a plain section, the
    /// `[provider]`/`[[provider]]` either-or, arrays of tables behind
    /// `try_from`, a renamed field, user-named tables, a map of the user's keys.
    #[test]
    fn finds_keys_of_every_shape() {
        let keys = reference_keys();
        for key in [
            "agent.model",
            "provider.name",
            "provider.extra_headers",
            "mqtt.trigger.topic",
            "mqtt.trigger.exec",
            "homeassistant.trigger.for",
            "mcp.server.command",
            "policy.*.memory",
            "service.members",
        ] {
            assert!(keys.iter().any(|k| k == key), "{key} not in {keys:?}");
        }
        assert!(!keys.iter().any(|k| k == "mqtt.trigger" || k == "provider.extra_headers.*"), "{keys:?}");
    }
}
