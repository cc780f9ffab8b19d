//! Decisions as tool calls: "anything to report?" answered by calling
//! `report(text)` or `nothing_to_report()`.
//!
//! A turn that must decide whether to bother the user (the heartbeat) used to
//! read a magic reply, `HEARTBEAT_OK`. Small models garble it ("HEARTBEAT_OK.
//! All systems normal!"), and a garbled token is delivered as a report. A
//! tool call is what models are trained to produce exactly: the pair is
//! offered in such a turn only, a call of either ends the turn with that
//! decision, and a plain text answer still counts as it did before (the
//! caller reads it), so a model that never calls tools loses nothing.

use serde_json::{json, Value};

use crate::provider::{ToolCall, ToolSpec};

/// The tool that delivers a report.
pub const REPORT: &str = "report";
/// The tool that says there is nothing to report.
pub const NOTHING: &str = "nothing_to_report";

/// What a decision call decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decided {
    Report(String),
    Nothing,
}

/// The two specs, offered after the turn's own tools.
pub(crate) fn specs() -> [ToolSpec; 2] {
    [
        ToolSpec {
            name: REPORT.into(),
            description: "Finish: deliver this report to the user. Call it when something is worth telling.".into(),
            parameters: json!({
                "type": "object",
                "properties": {"text": {"type": "string", "description": "The report, as the user should read it"}},
                "required": ["text"]
            }),
        },
        ToolSpec {
            name: NOTHING.into(),
            description: "Finish: there is nothing worth reporting; nothing is sent.".into(),
            parameters: json!({"type": "object", "properties": {}}),
        },
    ]
}

/// Whether `name` is one of the pair.
pub(crate) fn is_decision(name: &str) -> bool {
    name == REPORT || name == NOTHING
}

/// A `report` call without its text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "Error: `report` needs a non-empty `text` (the report). Call `nothing_to_report` if there is nothing to report."
)]
pub(crate) struct EmptyReport;

/// The decision of one call of the pair, or why it is not one (told to the
/// model as the call's result, and the turn goes on).
pub(crate) fn read(call: &ToolCall) -> Result<Decided, EmptyReport> {
    if call.function.name == NOTHING {
        return Ok(Decided::Nothing);
    }
    let args: Value = serde_json::from_str(call.function.arguments.trim()).unwrap_or(Value::Null);
    match args.get("text").and_then(Value::as_str).map(str::trim) {
        Some(text) if !text.is_empty() => Ok(Decided::Report(text.to_string())),
        _ => Err(EmptyReport),
    }
}

/// The decision of a round of calls: the first good `report`, else a
/// `nothing_to_report`; `None` when the round decided nothing.
pub(crate) fn of_round(calls: &[ToolCall]) -> Option<Decided> {
    let decided: Vec<Decided> =
        calls.iter().filter(|c| is_decision(&c.function.name)).filter_map(|c| read(c).ok()).collect();
    decided.iter().find(|d| matches!(d, Decided::Report(_))).or(decided.first()).cloned()
}

/// The result a decision call gets in the conversation.
pub(crate) fn result_text(call: &ToolCall) -> String {
    match read(call) {
        Ok(Decided::Report(_)) => "Reported.".into(),
        Ok(Decided::Nothing) => "Noted: nothing is reported.".into(),
        Err(why) => why.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_needs_text_and_wins_over_nothing() {
        let c = |n: &str, a: &str| ToolCall::new("1", n, a);
        assert_eq!(read(&c(REPORT, r#"{"text":" Disk 97% full "}"#)), Ok(Decided::Report("Disk 97% full".into())));
        assert_eq!(read(&c(NOTHING, "")), Ok(Decided::Nothing));
        assert!(read(&c(REPORT, r#"{"text":"  "}"#)).unwrap_err().to_string().contains("non-empty"));
        assert!(read(&c(REPORT, "not json")).is_err());
        let round = [c("exec", "{}"), c(NOTHING, "{}"), c(REPORT, r#"{"text":"x"}"#)];
        assert_eq!(of_round(&round), Some(Decided::Report("x".into())));
        assert_eq!(of_round(&round[..2]), Some(Decided::Nothing));
        assert_eq!(of_round(&[c(REPORT, "{}")]), None, "a bad report decides nothing");
        assert_eq!(of_round(&round[..1]), None);
    }
}
