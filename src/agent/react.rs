//! The ReAct loop: call the model, run the tool calls it asks for, give back
//! the results, until it answers in text or a limit is reached. Shared by
//! turns and sub-agents.

use super::decision::{self, Decided};
use super::{textcall, TurnEnd};
use crate::config::TextToolCalls;
use crate::provider::{ChatRequest, ChatResponse, Message, Provider, ProviderError, Role, ToolCall, ToolSpec, Usage};
use crate::tools::{ToolContext, ToolRegistry};

/// Extra model calls when it answers with nothing at all.
const EMPTY_ANSWER_RETRIES: u32 = 2;

/// What one ReAct loop runs with: a turn's or a sub-agent's.
pub(crate) struct LoopSpec<'a> {
    pub provider: &'a dyn Provider,
    pub tools: &'a ToolRegistry,
    pub specs: &'a [ToolSpec],
    pub model: &'a str,
    pub max_tokens: u32,
    pub temperature: Option<f32>,
    pub max_iterations: u32,
    /// The setting that sets `max_iterations`, for the message at the limit.
    pub limit_setting: &'static str,
    /// Its `cancel` stops the loop.
    pub tool_ctx: &'a ToolContext,
    /// For logs.
    pub label: &'a str,
    /// Told about each tool call before it runs (a chat's status message).
    pub progress: Option<&'a dyn ProgressSink>,
    /// The model can see images: those tools return are shown to it.
    pub vision: bool,
    /// A decision turn: `specs` include [`decision::specs`], and a call of
    /// either ends the loop with that decision.
    pub decide: bool,
}

/// What a loop spent, kept even when it fails.
#[derive(Debug, Default, Clone)]
pub(crate) struct LoopStats {
    pub usage: Usage,
    pub model_calls: u32,
    pub tool_calls: u32,
    /// The usage again, per provider that answered (a fallback chain's route).
    pub providers: Vec<(String, Usage)>,
    /// Who answered the last call, when a chain said so.
    pub route: Option<crate::provider::Route>,
    /// Images were taken out because the model refused them.
    pub blind: bool,
}

impl LoopStats {
    /// Count one model call's answer.
    pub fn count(&mut self, usage: Usage, route: Option<crate::provider::Route>) {
        self.model_calls += 1;
        self.usage.add(usage);
        if let Some(route) = &route {
            match self.providers.iter_mut().find(|(name, _)| *name == route.provider) {
                Some((_, u)) => u.add(usage),
                None => self.providers.push((route.provider.clone(), usage)),
            }
        }
        if route.is_some() {
            self.route = route;
        }
    }
}

/// Why a loop ended without an answer.
pub(crate) enum LoopFail {
    Provider(ProviderError),
    /// Cancelled. `messages` is consistent: every tool call has a result.
    Cancelled,
}

/// Call the model and run its tool calls until it answers in text, appending
/// every message to `messages`.
pub(crate) async fn run_loop(
    spec: &LoopSpec<'_>,
    messages: &mut Vec<Message>,
    stats: &mut LoopStats,
) -> Result<(String, TurnEnd), LoopFail> {
    let cancel = &spec.tool_ctx.cancel;
    let mut empty_answers = 0;
    let mut rounds = 0;
    loop {
        if rounds >= spec.max_iterations {
            let n = spec.max_iterations;
            return Ok((
                format!(
                    "I stopped after {n} rounds of tool calls without reaching a final answer \
                     (the limit is {} = {n}). Ask me to continue, or split the task.",
                    spec.limit_setting
                ),
                TurnEnd::MaxIterations,
            ));
        }
        let request = ChatRequest {
            model: spec.model,
            messages,
            tools: spec.specs,
            max_tokens: spec.max_tokens,
            temperature: spec.temperature,
            tool_choice: None,
            // Nobody waits on a scheduled turn or a sub-agent: the provider's `job_timeout` applies.
            scheduled: spec.tool_ctx.in_job,
        };
        let answer = tokio::select! {
            r = spec.provider.chat(request) => r,
            _ = cancel.cancelled() => return Err(LoopFail::Cancelled),
        };
        let response: ChatResponse = match answer {
            Ok(r) => r,
            // A model that cannot see refuses image parts: the same call again without them.
            Err(e) if messages.iter().any(|m| !m.images.is_empty()) && super::input::refused_images(&e) => {
                tracing::warn!(session = %spec.label, model = %spec.model, error = %e, "the model refused the images; asking again without them");
                messages.iter_mut().for_each(|m| m.images.clear());
                stats.blind = true;
                continue;
            }
            Err(e) => return Err(LoopFail::Provider(e)),
        };
        stats.count(response.usage, response.route.clone());

        let (calls, content) = calls_of(spec, messages, response);
        if !calls.is_empty() {
            rounds += 1;
            messages.push(Message::assistant_tool_calls(content, calls.clone()));
            run_tools(spec, &calls, messages, stats).await?;
            match decision::of_round(&calls).filter(|_| spec.decide) {
                Some(Decided::Report(text)) => return Ok((text, TurnEnd::Reported)),
                Some(Decided::Nothing) => return Ok((String::new(), TurnEnd::NothingToReport)),
                None => continue,
            }
        }

        let text = content.unwrap_or_default();
        if text.trim().is_empty() {
            empty_answers += 1;
            if empty_answers > EMPTY_ANSWER_RETRIES {
                return Ok((
                    "The model returned an empty answer several times in a row. Please try again or rephrase."
                        .to_string(),
                    TurnEnd::EmptyAnswer,
                ));
            }
            tracing::warn!(session = %spec.label, attempt = empty_answers, "the model returned an empty answer; asking again");
            continue;
        }
        return Ok((text.trim().to_string(), TurnEnd::Answered));
    }
}

/// The tool calls of an answer and its text: the calls the API carried, else
/// those the text spells ([`textcall::recover`], logged; not with `[provider]
/// text_tool_calls = "off"`), which then has no text.
fn calls_of(spec: &LoopSpec<'_>, messages: &[Message], response: ChatResponse) -> (Vec<ToolCall>, Option<String>) {
    let content = response.content.filter(|c| !c.trim().is_empty());
    if !response.tool_calls.is_empty() {
        return (response.tool_calls, content);
    }
    let Some(text) = content.as_deref() else { return (Vec::new(), None) };
    if response.text_tool_calls == TextToolCalls::Off {
        return (Vec::new(), content);
    }
    // Only the model's own text: a call found in a tool's result is an echo of it.
    let results: Vec<&str> = messages.iter().filter(|m| m.role == Role::Tool).map(Message::text_content).collect();
    match textcall::recover(text, spec.specs, &results) {
        Ok(calls) => {
            for call in &calls {
                tracing::info!(
                    session = %spec.label, model = %spec.model, tool = %call.function.name,
                    "recovered a tool call the model wrote as text"
                );
            }
            (calls, None)
        }
        Err(why) => {
            if why.looked_like_one() {
                tracing::info!(session = %spec.label, model = %spec.model, "an answer shaped like a tool call stays text: it {why}");
            }
            (Vec::new(), content)
        }
    }
}

/// Run one round of tool calls, appending each result to `messages`; every
/// call gets a result even when the turn is stopped halfway.
async fn run_tools(
    spec: &LoopSpec<'_>,
    calls: &[crate::provider::ToolCall],
    messages: &mut Vec<Message>,
    stats: &mut LoopStats,
) -> Result<(), LoopFail> {
    let cancel = &spec.tool_ctx.cancel;
    let mut shown: Vec<(String, Vec<crate::provider::Image>)> = Vec::new();
    for (i, call) in calls.iter().enumerate() {
        if cancel.is_cancelled() {
            // Every call gets a result, so the saved turn has no orphan call.
            for c in &calls[i..] {
                messages.push(Message::tool_result(&c.id, &c.function.name, "Error: not run: the turn was stopped"));
            }
            return Err(LoopFail::Cancelled);
        }
        if spec.decide && decision::is_decision(&call.function.name) {
            messages.push(Message::tool_result(&call.id, &call.function.name, decision::result_text(call)));
            continue;
        }
        stats.tool_calls += 1;
        if let Some(p) = spec.progress {
            p.step(&spec.tool_ctx.conversation, &describe_call(call));
        }
        // `/stop` ends any tool at once (a dropped exec kills its process group).
        let outcome = tokio::select! {
            o = spec.tools.execute(call, spec.tool_ctx) => o,
            _ = cancel.cancelled() => {
                messages.push(Message::tool_result(&call.id, &call.function.name, "Error: cancelled: the turn was stopped while this was running"));
                for c in &calls[i + 1..] {
                    messages.push(Message::tool_result(&c.id, &c.function.name, "Error: not run: the turn was stopped"));
                }
                return Err(LoopFail::Cancelled);
            }
        };
        tracing::debug!(
            session = %spec.label, tool = %call.function.name, error = outcome.is_error,
            "tool call finished"
        );
        messages.push(Message::tool_result(&call.id, &call.function.name, outcome.text));
        if spec.vision && !outcome.images.is_empty() {
            shown.push((call.function.name.clone(), outcome.images));
        }
    }
    if cancel.is_cancelled() {
        return Err(LoopFail::Cancelled);
    }
    // Tool messages cannot carry images (OpenAI): they follow in a user message.
    if !shown.is_empty() {
        let names: Vec<&str> = shown.iter().map(|(n, _)| n.as_str()).collect();
        let mut note = Message::user(format!("[The images returned by {} follow.]", names.join(", ")));
        note.images = shown.into_iter().flat_map(|(_, i)| i).collect();
        messages.push(note);
    }
    Ok(())
}

/// Where a chat turn says what it is doing while it runs tools (Telegram's
/// status message). Called on the runtime thread: it must not wait.
pub trait ProgressSink: Send + Sync {
    /// The turn in `conversation` is about to do `what` (`running `df -h /`…`).
    fn step(&self, conversation: &crate::bus::Conversation, what: &str);
}

/// What a tool call does, in a few words for a status line.
pub(crate) fn describe_call(call: &crate::provider::ToolCall) -> String {
    let args: serde_json::Value = serde_json::from_str(&call.function.arguments).unwrap_or_default();
    let arg = |k: &str| {
        args.get(k).and_then(serde_json::Value::as_str).map(|v| {
            let v = v.lines().next().unwrap_or("").trim();
            if v.chars().count() > 60 {
                format!("{}…", v.chars().take(59).collect::<String>())
            } else {
                v.to_string()
            }
        })
    };
    let name = call.function.name.as_str();
    match name {
        "exec" => arg("command").map(|c| format!("running `{c}`…")),
        "read_file" | "list_dir" => arg("path").map(|p| format!("reading {p}…")),
        "write_file" | "edit_file" => arg("path").map(|p| format!("writing {p}…")),
        "web_fetch" => arg("url").map(|u| format!("fetching {u}…")),
        "web_search" => arg("query").map(|q| format!("searching the web for “{q}”…")),
        _ => None,
    }
    .unwrap_or_else(|| format!("using {name}…"))
}

#[cfg(test)]
mod describe_tests {
    use super::*;

    #[test]
    fn calls_are_described_in_a_few_words() {
        let c = |n: &str, a: &str| describe_call(&crate::provider::ToolCall::new("1", n, a));
        assert_eq!(c("exec", r#"{"command":"df -h /\nrm x"}"#), "running `df -h /`…");
        assert_eq!(c("read_file", r#"{"path":"notes.md"}"#), "reading notes.md…");
        assert_eq!(c("cron", "not json"), "using cron…");
        let long = c("exec", &format!(r#"{{"command":"{}"}}"#, "x".repeat(100)));
        assert!(long.chars().count() < 75, "{long}");
    }
}
