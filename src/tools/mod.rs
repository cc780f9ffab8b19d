//! Tools the model can call, and the registry that runs them.
//!
//! A tool is a name, a description, a JSON schema and an async `execute` that
//! returns text. The registry is the one place where a model's tool call meets
//! the real world, so it owns the rules that keep a bad call from hurting the
//! daemon: arguments that are not JSON, an unknown tool name, a failing tool —
//! each becomes an `Error: …` string the model reads on its next step. Nothing
//! a model sends can panic or abort a turn.
//!
//! - [`fs`]: `read_file`, `write_file`, `edit_file`, `list_dir`, confined to the workspace.
//! - [`exec`]: `exec`, a shell command through [`crate::sandbox`].
//! - [`web`]: `web_fetch` with an SSRF guard.
//! - [`message`]: `message`, a report to a delivery target.
//! - [`mqtt`]: `mqtt_publish`, limited to `[mqtt] publish_allow` topics.
//! - [`homeassistant`]: `ha_call_service` and `ha_get_state`, limited to `[homeassistant] allow`.
//!
//! ## Who is asking: [`Origin`]
//!
//! A turn's tools act with bramble's own rights, outside the sandbox, so what
//! they may do depends on who started the turn. The origin is decided once,
//! from the channel the turn came in on, when the turn's [`ToolContext`] is
//! made ([`ToolContext::new`]), and the tools ask it ([`Origin::may_manage_jobs`],
//! [`Origin::check_delivery`], [`Origin::searches_all_sessions`]). MQTT is not
//! trusted: anyone who can publish to `<prefix>/in`, a command in the sandbox
//! included, starts such a turn. Unknown channels count as untrusted too.

pub mod cron;
pub mod exec;
pub mod fs;
pub mod homeassistant;
pub mod message;
pub mod mqtt;
pub mod search;
pub mod web;

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::bus::Conversation;
use crate::provider::{ToolCall, ToolSpec};
use crate::util::BoxFuture;

/// Who started a turn, and so what its tools may do (see the module header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The local terminal (`bramble agent`): the owner at the keyboard.
    Cli,
    /// A Telegram chat, started by an `allow_from` user.
    Telegram,
    /// The scheduler: the heartbeat, and job runs whose job was made by a trusted origin.
    System,
    /// `<prefix>/in` and MQTT triggers: whoever can publish to the broker.
    Mqtt,
    /// `[[homeassistant.trigger]]` turns: their text carries entity states and
    /// attributes, which any device or integration in Home Assistant can set.
    HomeAssistant,
    /// A channel this build does not know: treated like MQTT.
    Unknown,
}

impl Origin {
    /// The origin of a turn that came in on `channel` (`cli`, `telegram`, `system`, `mqtt`).
    pub fn of_channel(channel: &str) -> Origin {
        match channel {
            "cli" => Origin::Cli,
            "telegram" => Origin::Telegram,
            "system" => Origin::System,
            "mqtt" => Origin::Mqtt,
            "homeassistant" => Origin::HomeAssistant,
            _ => Origin::Unknown,
        }
    }

    /// Whether the origin is the owner (or acts for them). Untrusted turns may
    /// not schedule work nor reach Telegram chats.
    pub fn trusted(self) -> bool {
        matches!(self, Origin::Cli | Origin::Telegram | Origin::System)
    }

    /// The name used in refusals and logs.
    pub fn name(self) -> &'static str {
        match self {
            Origin::Cli => "the terminal",
            Origin::Telegram => "Telegram",
            Origin::System => "the scheduler",
            Origin::Mqtt => "MQTT",
            Origin::HomeAssistant => "a Home Assistant trigger",
            Origin::Unknown => "an unknown channel",
        }
    }

    /// Creating, changing or removing jobs: trusted origins only.
    pub fn may_manage_jobs(self) -> Result<(), ToolError> {
        if self.trusted() {
            return Ok(());
        }
        Err(ToolError::new(format!(
            "this turn came from {} (an untrusted origin): it cannot create, change or remove jobs",
            self.name()
        )))
    }

    /// Whether a turn may send to `target` (the `message` tool, a job's
    /// `deliver` list). A Telegram chat must be an `allow_from` user's chat
    /// (`chats`), or the very chat the turn came from; untrusted origins reach
    /// no Telegram chat and no Home Assistant notify service (the owner's
    /// phone) at all. Blocking (reads the username pins): call it off the
    /// runtime thread.
    pub fn check_delivery(
        self,
        ctx: &ToolContext,
        target: &crate::bus::Target,
        chats: &crate::policy::AllowedChats,
    ) -> Result<(), ToolError> {
        if let crate::bus::Target::HomeAssistant(_) = target {
            return match self.trusted() {
                true => Ok(()),
                false => Err(ToolError::new(format!(
                    "this turn came from {} (an untrusted origin): it cannot send to {target}",
                    self.name()
                ))),
            };
        }
        let crate::bus::Target::Telegram(chat) = target else { return Ok(()) };
        if !self.trusted() {
            return Err(ToolError::new(format!(
                "this turn came from {} (an untrusted origin): it cannot send to Telegram chats",
                self.name()
            )));
        }
        // The chat the turn came from (a group an allowed user wrote in) is its own reply target.
        if self == Origin::Telegram && *chat == ctx.conversation.chat_id {
            return Ok(());
        }
        if chats.contains(chat) {
            return Ok(());
        }
        Err(ToolError::new(format!(
            "telegram:{chat} is not the chat of a user in [telegram] allow_from: messages go only to allowed users"
        )))
    }

    /// Whether `memory_search` may look at every session's journal entries
    /// (the local terminal), or only at the turn's own session (everyone else).
    pub fn searches_all_sessions(self) -> bool {
        self == Origin::Cli
    }
}

/// Where a tool call comes from: which session, which chat, and how to stop it.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The turn's conversation: its channel (`cli`, `telegram`, `mqtt`,
    /// `system`), chat and session (`cli:direct`, `telegram:42`, `heartbeat`, `cron:<job>`).
    pub conversation: Conversation,
    /// True while a scheduled job runs the turn: tools that would schedule more
    /// work refuse (no feedback loops).
    pub in_job: bool,
    /// Cancelled by `/stop` or shutdown; long-running tools watch it.
    pub cancel: CancellationToken,
    /// Who started the turn ([`Origin::of_channel`] of its channel).
    pub origin: Origin,
}

impl ToolContext {
    /// The context of a turn; its [`Origin`] follows from the conversation's channel.
    pub fn new(conversation: Conversation, in_job: bool, cancel: CancellationToken) -> Self {
        ToolContext { origin: Origin::of_channel(&conversation.channel), conversation, in_job, cancel }
    }

    /// The same context as seen from `channel`/`chat_id` (tests).
    pub fn from_chat(mut self, channel: &str, chat_id: &str) -> Self {
        self.conversation.channel = channel.to_string();
        self.conversation.chat_id = chat_id.to_string();
        self.origin = Origin::of_channel(channel);
        self
    }

    /// A context for a turn with no particular chat (tests, one-off runs).
    pub fn detached(session_key: impl Into<String>) -> Self {
        ToolContext::new(Conversation::cli(session_key), false, CancellationToken::new())
    }

    /// The turn's session key.
    pub fn session_key(&self) -> &str {
        &self.conversation.session_key
    }
}

/// A failure the model should read. The text is shown to the model after `Error: `.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ToolError(pub String);

impl ToolError {
    pub fn new(msg: impl Into<String>) -> Self {
        ToolError(msg.into())
    }
}

/// One callable tool.
pub trait Tool: Send + Sync {
    /// The name the model calls it by (`read_file`).
    fn name(&self) -> &'static str;
    /// What it does, for the model.
    fn description(&self) -> &'static str;
    /// JSON schema of the arguments object.
    fn parameters(&self) -> Value;
    /// Run it. `args` is always a JSON object (the registry checks).
    fn execute<'a>(&'a self, args: Value, ctx: &'a ToolContext) -> BoxFuture<'a, Result<String, ToolError>>;
}

/// Deserialize a tool's arguments, turning serde's complaint into a message the model can act on.
pub fn parse_args<T: DeserializeOwned>(tool: &str, args: Value) -> Result<T, ToolError> {
    serde_json::from_value(args).map_err(|e| ToolError(format!("invalid arguments for {tool}: {e}")))
}

/// The result of one call as the model will see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutcome {
    pub text: String,
    pub is_error: bool,
}

/// The set of tools offered in a turn.
pub struct ToolRegistry {
    tools: Vec<Arc<dyn Tool>>,
    max_result_chars: usize,
}

impl ToolRegistry {
    /// An empty registry; results longer than `max_result_chars` are cut (head and tail kept).
    pub fn new(max_result_chars: usize) -> Self {
        ToolRegistry { tools: Vec::new(), max_result_chars: max_result_chars.max(256) }
    }

    /// Add a tool; a tool with the same name replaces the earlier one.
    pub fn register(&mut self, tool: Arc<dyn Tool>) {
        self.tools.retain(|t| t.name() != tool.name());
        self.tools.push(tool);
    }

    /// A copy without the named tools (sub-agents, job runs).
    pub fn without(&self, names: &[&str]) -> ToolRegistry {
        ToolRegistry {
            tools: self.tools.iter().filter(|t| !names.contains(&t.name())).cloned().collect(),
            max_result_chars: self.max_result_chars,
        }
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.tools.iter().map(|t| t.name()).collect()
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.iter().find(|t| t.name() == name)
    }

    /// The specs offered to the model.
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools
            .iter()
            .map(|t| ToolSpec {
                name: t.name().to_string(),
                description: t.description().to_string(),
                parameters: t.parameters(),
            })
            .collect()
    }

    /// Run one call. Never fails: every problem becomes an `Error: …` outcome.
    pub async fn execute(&self, call: &ToolCall, ctx: &ToolContext) -> ToolOutcome {
        let name = call.function.name.as_str();
        let Some(tool) = self.get(name) else {
            return error_outcome(format!(
                "there is no tool named `{name}`. Available tools: {}.",
                self.names().join(", ")
            ));
        };
        let args = match parse_arguments(&call.function.arguments) {
            Ok(args) => args,
            Err(why) => {
                return error_outcome(format!(
                    "the arguments of this `{name}` call are {why}. Call it again with a JSON object that matches its schema."
                ))
            }
        };
        let result = tokio::select! {
            r = tool.execute(args, ctx) => r,
            _ = ctx.cancel.cancelled() => Err(ToolError::new("the call was cancelled (stop requested)")),
        };
        match result {
            Ok(text) => ToolOutcome { text: truncate_middle(&text, self.max_result_chars), is_error: false },
            Err(e) => {
                tracing::debug!(tool = name, error = %e, "tool call failed");
                error_outcome(truncate_middle(&e.0, self.max_result_chars))
            }
        }
    }
}

fn error_outcome(msg: String) -> ToolOutcome {
    ToolOutcome { text: format!("Error: {msg}"), is_error: true }
}

/// Parse a model's raw argument text into a JSON object. Empty text means `{}`
/// (several servers send that for argument-less calls).
fn parse_arguments(raw: &str) -> Result<Value, String> {
    let raw = raw.trim();
    if raw.is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    match serde_json::from_str::<Value>(raw) {
        Ok(v @ Value::Object(_)) => Ok(v),
        // Some models double-encode: a JSON string holding the object.
        Ok(Value::String(inner)) => match serde_json::from_str::<Value>(&inner) {
            Ok(v @ Value::Object(_)) => Ok(v),
            _ => Err("a JSON string, not an object".to_string()),
        },
        Ok(other) => Err(format!("a JSON {}, not an object", json_kind(&other))),
        Err(e) => Err(format!("not valid JSON ({e})")),
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Cut `text` to at most `max` characters, keeping the head and the tail and
/// saying how much was left out in between (the end of a log is often what matters).
pub fn truncate_middle(text: &str, max: usize) -> String {
    let total = text.chars().count();
    if total <= max {
        return text.to_string();
    }
    let keep = max.saturating_sub(60) / 2;
    let head: String = text.chars().take(keep).collect();
    let tail_start = text.char_indices().nth(total - keep).map(|(i, _)| i).unwrap_or(text.len());
    let omitted = total - 2 * keep;
    format!("{head}\n... ({omitted} characters truncated) ...\n{}", &text[tail_start..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct Echo;
    impl Tool for Echo {
        fn name(&self) -> &'static str {
            "echo"
        }
        fn description(&self) -> &'static str {
            "echo the text"
        }
        fn parameters(&self) -> Value {
            json!({"type":"object","properties":{"text":{"type":"string"}},"required":["text"]})
        }
        fn execute<'a>(&'a self, args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<String, ToolError>> {
            Box::pin(async move {
                #[derive(serde::Deserialize)]
                struct A {
                    text: String,
                }
                let a: A = parse_args("echo", args)?;
                if a.text == "fail" {
                    return Err(ToolError::new("asked to fail"));
                }
                Ok(a.text)
            })
        }
    }

    fn registry() -> ToolRegistry {
        let mut r = ToolRegistry::new(1000);
        r.register(Arc::new(Echo));
        r
    }

    async fn call(raw_name: &str, raw_args: &str) -> ToolOutcome {
        registry().execute(&ToolCall::new("c1", raw_name, raw_args), &ToolContext::detached("t")).await
    }

    #[tokio::test]
    async fn good_call_returns_text() {
        let out = call("echo", r#"{"text":"hi"}"#).await;
        assert_eq!(out, ToolOutcome { text: "hi".into(), is_error: false });
    }

    #[tokio::test]
    async fn malformed_json_is_an_error_string() {
        for raw in [r#"{"text":"hi""#, "not json", "{'text': 'x'}", "\u{0}"] {
            let out = call("echo", raw).await;
            assert!(out.is_error, "{raw}");
            assert!(
                out.text.starts_with("Error: the arguments of this `echo` call are not valid JSON"),
                "{}",
                out.text
            );
        }
        let out = call("echo", "[1,2]").await;
        assert!(out.text.contains("a JSON array, not an object"), "{}", out.text);
    }

    #[tokio::test]
    async fn double_encoded_arguments_are_accepted() {
        let out = call("echo", r#""{\"text\":\"hi\"}""#).await;
        assert_eq!(out.text, "hi");
    }

    #[tokio::test]
    async fn unknown_tool_lists_the_known_ones() {
        let out = call("rm_rf", "{}").await;
        assert!(out.is_error);
        assert_eq!(out.text, "Error: there is no tool named `rm_rf`. Available tools: echo.");
    }

    #[tokio::test]
    async fn tool_failures_and_schema_mismatches_are_error_strings() {
        let out = call("echo", r#"{"text":"fail"}"#).await;
        assert_eq!(out.text, "Error: asked to fail");
        let out = call("echo", r#"{"txt":"x"}"#).await;
        assert!(out.text.contains("invalid arguments for echo: missing field `text`"), "{}", out.text);
        let out = call("echo", "").await;
        assert!(out.text.contains("missing field `text`"), "{}", out.text);
    }

    #[test]
    fn truncation_keeps_head_and_tail() {
        let text: String = (0..5000).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
        let cut = truncate_middle(&text, 500);
        assert!(cut.chars().count() <= 500);
        assert!(cut.starts_with(&text[..100]));
        assert!(cut.ends_with(&text[text.len() - 100..]));
        assert!(cut.contains("characters truncated"));
        assert_eq!(truncate_middle("short", 500), "short");
        // multi-byte characters are never split
        let wide = "é".repeat(2000);
        assert!(truncate_middle(&wide, 300).chars().count() <= 300);
    }
}
