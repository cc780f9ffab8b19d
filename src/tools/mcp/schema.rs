//! What an MCP server says about its tools, made acceptable to every provider.
//!
//! Servers name tools freely (`files/read.v2`) and describe their arguments
//! with any JSON Schema their framework emits (pydantic's `$defs`/`$ref`,
//! `format: "uri"`, `additionalProperties: false`, `title` on every field).
//! OpenAI accepts function names of `[A-Za-z0-9_-]{1,64}` only and rejects
//! some schemas outright (a top level that is not an object, `format` values
//! it does not know); other OpenAI-compatible servers (llama.cpp, Gemini's
//! endpoint) are stricter still about `$ref` and `additionalProperties`. A
//! rejected schema fails the whole request, every tool with it, so every
//! schema is cleaned once when the tools are listed:
//!
//! - local `$ref`s (`#/$defs/X`, `#/definitions/X`) are inlined (8 levels deep
//!   at most: a recursive type ends in `{"type": "object"}`), and `$defs`,
//!   `$schema`, `$id`, `$comment`, `title` and boolean `additionalProperties`
//!   are dropped (they only restrict or annotate; the server still checks);
//! - `format` is kept only where OpenAI knows it;
//! - the top level is always `{"type": "object", "properties": {…}}`.
//!
//! Names become `<server>__<tool>`, characters outside `[A-Za-z0-9_-]`
//! replaced by `_`; a name over 64 characters is refused (and said so),
//! never cut: a cut name could collide with another tool's.

use serde_json::{Map, Value};

/// OpenAI's limit on a function name.
pub const MAX_NAME: usize = 64;

/// `format` values OpenAI accepts (its structured outputs' list).
const FORMATS: [&str; 9] = ["date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"];

/// Keywords dropped everywhere.
const DROPPED: [&str; 6] = ["$schema", "$id", "$comment", "$defs", "definitions", "title"];

/// How deep `$ref`s are followed.
const MAX_REF_DEPTH: usize = 8;

/// The name the model calls `tool` of `server` by, or why there is none.
pub fn exposed_name(server: &str, tool: &str) -> Result<String, String> {
    if tool.is_empty() {
        return Err("the server gave a tool with an empty name".into());
    }
    let clean: String =
        tool.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect();
    let name = format!("{server}__{clean}");
    if name.len() > MAX_NAME {
        return Err(format!(
            "`{name}` would be {} characters; providers accept at most {MAX_NAME} (use a shorter server name)",
            name.len()
        ));
    }
    Ok(name)
}

/// A provider-safe copy of a tool's `inputSchema`.
pub fn clean(schema: &Value) -> Value {
    let defs = definitions(schema);
    let mut out = match schema {
        Value::Object(_) => clean_node(schema, &defs, 0),
        _ => Value::Object(Map::new()),
    };
    let Value::Object(top) = &mut out else { return empty_object() };
    // OpenAI wants an object at the top, and nothing that could make it something else.
    for key in ["anyOf", "oneOf", "allOf", "not", "enum", "const", "if", "then", "else"] {
        top.remove(key);
    }
    top.insert("type".into(), Value::String("object".into()));
    if !top.get("properties").is_some_and(Value::is_object) {
        top.insert("properties".into(), Value::Object(Map::new()));
    }
    if top.get("required").is_some_and(|r| !r.is_array()) {
        top.remove("required");
    }
    out
}

fn empty_object() -> Value {
    serde_json::json!({"type": "object", "properties": {}})
}

/// `$defs` and `definitions` of the top level, by name.
fn definitions(schema: &Value) -> Map<String, Value> {
    let mut defs = Map::new();
    for key in ["definitions", "$defs"] {
        if let Some(Value::Object(m)) = schema.get(key) {
            defs.extend(m.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
    }
    defs
}

/// Clean one schema node (an object in a schema position).
fn clean_node(node: &Value, defs: &Map<String, Value>, depth: usize) -> Value {
    let Value::Object(map) = node else {
        return node.clone(); // `true`/`false` schemas and odd values pass through
    };
    if let Some(Value::String(reference)) = map.get("$ref") {
        let target = reference.strip_prefix("#/$defs/").or_else(|| reference.strip_prefix("#/definitions/"));
        let resolved = match target.and_then(|name| defs.get(name)) {
            Some(def) if depth < MAX_REF_DEPTH => clean_node(def, defs, depth + 1),
            // Too deep (a recursive type) or not a local definition: any object.
            _ => serde_json::json!({"type": "object"}),
        };
        // Keywords beside the `$ref` (a description) win over the definition's.
        let mut merged = match resolved {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        for (k, v) in map {
            if k != "$ref" && !DROPPED.contains(&k.as_str()) {
                merged.insert(k.clone(), clean_value(k, v, defs, depth));
            }
        }
        return Value::Object(merged);
    }
    let mut out = Map::new();
    for (k, v) in map {
        if DROPPED.contains(&k.as_str()) {
            continue;
        }
        match (k.as_str(), v) {
            ("additionalProperties", Value::Bool(_)) => continue,
            ("format", Value::String(f)) if !FORMATS.contains(&f.as_str()) => continue,
            _ => {}
        }
        out.insert(k.clone(), clean_value(k, v, defs, depth));
    }
    Value::Object(out)
}

/// The value of keyword `key`: schemas are cleaned, maps of schemas and lists of them too.
fn clean_value(key: &str, v: &Value, defs: &Map<String, Value>, depth: usize) -> Value {
    match key {
        "properties" | "patternProperties" => match v {
            Value::Object(props) => {
                Value::Object(props.iter().map(|(name, s)| (name.clone(), clean_node(s, defs, depth))).collect())
            }
            other => other.clone(),
        },
        "items" | "additionalProperties" | "not" | "contains" | "propertyNames" | "if" | "then" | "else" => match v {
            Value::Array(list) => Value::Array(list.iter().map(|s| clean_node(s, defs, depth)).collect()),
            other => clean_node(other, defs, depth),
        },
        "anyOf" | "oneOf" | "allOf" | "prefixItems" => match v {
            Value::Array(list) => Value::Array(list.iter().map(|s| clean_node(s, defs, depth)).collect()),
            other => other.clone(),
        },
        _ => v.clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn names_are_prefixed_sanitised_and_bounded() {
        assert_eq!(exposed_name("ha", "HassTurnOn").unwrap(), "ha__HassTurnOn");
        assert_eq!(exposed_name("py", "files/read.v2").unwrap(), "py__files_read_v2");
        assert_eq!(exposed_name("py", "../../etc/passwd").unwrap(), "py________etc_passwd");
        assert_eq!(exposed_name("py", "grüße").unwrap(), "py__gr__e");
        assert!(exposed_name("py", "").is_err());
        let long = "t".repeat(60);
        let err = exposed_name("server", &long).unwrap_err();
        assert!(err.contains("would be 68 characters; providers accept at most 64"), "{err}");
        assert_eq!(exposed_name("s", &"t".repeat(61)).unwrap().len(), 64);
    }

    #[test]
    fn pydantic_schemas_are_flattened() {
        // What the Python SDK emits for `def f(target: Target, note: str = "")`.
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "files_readArguments",
            "type": "object",
            "properties": {
                "target": {"$ref": "#/$defs/Target", "description": "what to read"},
                "note": {"default": "", "title": "Note", "type": "string"},
                "title": {"type": "string", "format": "uri"}
            },
            "required": ["target"],
            "additionalProperties": false,
            "$defs": {"Target": {
                "title": "Target",
                "type": "object",
                "properties": {
                    "url": {"format": "uri", "minLength": 1, "title": "Url", "type": "string"},
                    "when": {"format": "date-time", "type": "string"},
                    "tags": {"type": "object", "additionalProperties": {"type": "integer", "title": "T"}}
                },
                "required": ["url"]
            }}
        });
        let want = json!({
            "type": "object",
            "properties": {
                "target": {
                    "type": "object",
                    "description": "what to read",
                    "properties": {
                        "url": {"minLength": 1, "type": "string"},
                        "when": {"format": "date-time", "type": "string"},
                        "tags": {"type": "object", "additionalProperties": {"type": "integer"}}
                    },
                    "required": ["url"]
                },
                "note": {"default": "", "type": "string"},
                // a property *named* title is a property, not the keyword
                "title": {"type": "string"}
            },
            "required": ["target"]
        });
        assert_eq!(clean(&schema), want);
    }

    #[test]
    fn the_top_level_is_always_an_object() {
        assert_eq!(clean(&json!(null)), json!({"type": "object", "properties": {}}));
        assert_eq!(clean(&json!({})), json!({"type": "object", "properties": {}}));
        assert_eq!(
            clean(&json!({"anyOf": [{"type": "string"}], "required": "x"})),
            json!({"type": "object", "properties": {}})
        );
        let nested = clean(
            &json!({"type": "object", "properties": {"a": {"anyOf": [{"$ref": "#/definitions/N"}, {"type": "null"}]}}, "definitions": {"N": {"type": "number", "title": "N"}}}),
        );
        assert_eq!(
            nested,
            json!({"type": "object", "properties": {"a": {"anyOf": [{"type": "number"}, {"type": "null"}]}}})
        );
    }

    #[test]
    fn recursive_refs_end() {
        let schema = json!({
            "type": "object",
            "properties": {"tree": {"$ref": "#/$defs/Node"}},
            "$defs": {"Node": {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}}
        });
        let cleaned = clean(&schema);
        let text = cleaned.to_string();
        assert!(!text.contains("$ref") && !text.contains("$defs"), "{text}");
        assert!(text.len() < 4000, "bounded: {}", text.len());
        // A reference to somewhere else is any object.
        let other = clean(&json!({"type": "object", "properties": {"x": {"$ref": "https://example.com/s.json"}}}));
        assert_eq!(other["properties"]["x"], json!({"type": "object"}));
    }
}
