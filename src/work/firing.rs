//! What every kind of trigger shares (`[[mqtt.trigger]]`,
//! `[[homeassistant.trigger]]`): rendering a `message` template from an
//! event's fields, and one run — a turn or a command — through [`Runner`],
//! its report to the trigger's targets through the outbox.
//!
//! The channels decide *when* a trigger fires (topic filters, entity globs,
//! `for`, `min_interval`); this decides *what firing does*, once, so the two
//! cannot drift apart.

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::{Runner, Work, WorkError};
use crate::bus::{Conversation, ReportSource, Target};
use crate::config::TriggerAction;

/// What running a trigger needs.
pub struct TriggerDeps {
    pub runner: Runner,
    pub reports: crate::delivery::Reports,
}

/// One firing, as the channel describes it.
pub struct Firing<'a> {
    pub action: &'a TriggerAction,
    /// The turn's conversation (its channel decides the turn's origin).
    pub conversation: Conversation,
    /// The rendered `message` (for a turn).
    pub text: String,
    /// What an `exec` trigger's command reads on stdin.
    pub stdin: Vec<u8>,
    pub deliver: &'a [Target],
    /// The trigger, for logs and failure reports (`zigbee/+/door`, `binary_sensor.*_door`).
    pub label: &'a str,
    /// The report's source (`trigger:<topic>`, `trigger:<entity>`).
    pub source: ReportSource,
}

/// Run one firing and queue its report (or its failure) for the targets;
/// `log` when there are none. Nothing is reported when `abort` stopped it.
pub async fn fire(f: Firing<'_>, deps: &TriggerDeps, abort: &CancellationToken) {
    let work = match f.action {
        TriggerAction::Message(_) => Work::Turn {
            conversation: f.conversation,
            text: f.text,
            model: None,
            // Whoever set the state or published the message: nobody in particular.
            principal: crate::bus::Principal::Anonymous,
        },
        TriggerAction::Exec(command) => Work::Shell { command: command.clone(), stdin: Some(f.stdin) },
    };
    let report = match deps.runner.run(work, abort).await {
        Err(WorkError::Cancelled) => return,
        Ok(done) => {
            tracing::info!(trigger = %f.label, source = %f.source, "trigger ran");
            done.text
        }
        Err(e) => {
            tracing::warn!(trigger = %f.label, source = %f.source, error = %e, "trigger failed");
            format!("Trigger `{}` failed: {e}", f.label)
        }
    };
    let targets = if f.deliver.is_empty() { vec![Target::Log] } else { f.deliver.to_vec() };
    deps.reports.send(&targets, &report, f.source).await;
}

/// Render a template: each `{name}` is replaced by `field(name)`; a name it
/// does not know (`None`) stays as written, braces included, as does an
/// unclosed `{`.
pub fn render(template: &str, mut field: impl FnMut(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(template.len() + 64);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else {
            out.push_str(&rest[open..]);
            return out;
        };
        let name = &after[..close];
        match field(name) {
            Some(value) => out.push_str(&value),
            None => {
                out.push('{');
                out.push_str(name);
                out.push('}');
            }
        }
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    out
}

/// `a.b.0` in a JSON value: object keys and array indexes.
pub fn lookup<'a>(mut v: &'a Value, path: &str) -> Option<&'a Value> {
    for key in path.split('.') {
        v = match v {
            Value::Object(map) => map.get(key)?,
            Value::Array(items) => items.get(key.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(v)
}

/// A JSON value as template text: strings without their quotes.
pub fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_and_unclosed_braces_stay() {
        let f = |n: &str| (n == "x").then(|| "X".to_string());
        assert_eq!(render("a{x}b{y}c{", f), "aXb{y}c{");
        let v = serde_json::json!({"a": [1, {"b": "two"}]});
        assert_eq!(lookup(&v, "a.1.b").map(text_of).as_deref(), Some("two"));
        assert!(lookup(&v, "a.9").is_none());
    }
}
