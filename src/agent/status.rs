//! What `/status`, `/history`, `/model` and the usage figures show of a session.

use super::memory;
use super::session::StoredMessage;
use super::usage::DayUsage;
use super::{Agent, TurnError};
use crate::provider::Role;

/// A session's figures for `/status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionStatus {
    /// The model its turns use (the `/model` override or the configured one).
    pub model: String,
    /// Messages since its checkpoint.
    pub messages: usize,
    /// Whether older messages were consolidated into a checkpoint.
    pub consolidated: bool,
    /// Estimated tokens of its next prompt (system prompt, tools, history).
    pub estimated_tokens: usize,
    /// `[agent] context_tokens`.
    pub context_tokens: usize,
    /// Today's usage (local date), all sessions.
    pub today: DayUsage,
    /// `[agent] daily_token_budget`, 0 = unlimited.
    pub daily_budget: u64,
    /// Sub-agents running for this session.
    pub subagents: usize,
    /// Who answered the session's last turn, when a fallback chain said so.
    pub answered: Option<crate::provider::Route>,
    /// The providers of a fallback chain and their state (empty for one provider).
    pub providers: Vec<String>,
    /// MCP servers: state, transport, tool count (empty without `[[mcp.server]]`).
    pub mcp: Vec<String>,
}

impl std::fmt::Display for SessionStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "model: {}", self.model)?;
        // With one provider there is no one else to have answered.
        if let Some(r) = self.answered.as_ref().filter(|_| !self.providers.is_empty()) {
            match &r.fallback {
                Some(why) => writeln!(f, "last answer: {} (fallback: {why})", r.label())?,
                None => writeln!(f, "last answer: {}", r.label())?,
            }
        }
        for line in &self.providers {
            writeln!(f, "  {line}")?;
        }
        writeln!(
            f,
            "session: {} messages{}, prompt ≈ {} of {} tokens",
            self.messages,
            if self.consolidated { " (older ones consolidated)" } else { "" },
            self.estimated_tokens,
            self.context_tokens
        )?;
        let budget =
            if self.daily_budget == 0 { "no budget".to_string() } else { format!("budget {}", self.daily_budget) };
        write!(f, "tokens today: {} ({budget})", self.today.total())?;
        if self.subagents > 0 {
            write!(f, "\nsub-agents running: {}", self.subagents)?;
        }
        if !self.mcp.is_empty() {
            write!(f, "\nMCP servers:")?;
            for line in &self.mcp {
                write!(f, "\n  {line}")?;
            }
        }
        Ok(())
    }
}

impl Agent {
    /// The model a session's turns use.
    pub fn session_model(&self, key: &str) -> String {
        self.live.model(key).unwrap_or_else(|| self.settings.model.clone())
    }

    /// `provider/model` for a model name, when there are several providers.
    pub fn model_label(&self, model: &str) -> String {
        match self.provider.ready() {
            Some(p) => p.label(model),
            None => model.to_string(),
        }
    }

    /// The provider chain's state, one line per provider (empty for one provider).
    pub fn provider_health(&self) -> Vec<String> {
        self.provider.ready().map(|p| p.health()).unwrap_or_default()
    }

    /// `/model [name]`: use `model` for this session's turns (until restart);
    /// `None` goes back to the configured one. Returns the model now in use.
    pub fn set_session_model(&self, key: &str, model: Option<&str>) -> String {
        let model = model.map(str::trim).filter(|m| !m.is_empty() && *m != self.settings.model);
        self.live.set_model(key, model.map(str::to_string));
        self.session_model(key)
    }

    /// `/history [n]`: the last `n` (at most 50) user and assistant messages, as text.
    pub fn history(&self, key: &str, n: usize) -> Result<String, TurnError> {
        let session_err = |source| TurnError::Session { key: key.to_string(), source };
        let session = self.sessions.load(key).map_err(session_err)?;
        let n = n.clamp(1, 50);
        let shown: Vec<&StoredMessage> = session
            .messages
            .iter()
            .filter(|m| {
                matches!(m.message.role, Role::User | Role::Assistant) && !m.message.text_content().trim().is_empty()
            })
            .collect();
        let shown = &shown[shown.len().saturating_sub(n)..];
        if shown.is_empty() {
            return Ok(if session.checkpoint.is_some() {
                "No messages since the last consolidation.".to_string()
            } else {
                "No messages in this session yet.".to_string()
            });
        }
        let tz = self.context.timezone();
        let mut out = String::new();
        for m in shown {
            let when = m
                .timestamp
                .parse::<jiff::Timestamp>()
                .map(|t| t.to_zoned(tz.tz().clone()).strftime("%m-%d %H:%M").to_string())
                .unwrap_or_default();
            let who = if m.message.role == Role::User { "you" } else { "bramble" };
            let text = crate::tools::truncate_middle(m.message.text_content().trim(), 300);
            out.push_str(&format!("[{when}] {who}: {text}\n"));
        }
        Ok(out.trim_end().to_string())
    }

    /// `/status`: the session's figures.
    pub async fn session_status(&self, key: &str) -> Result<SessionStatus, TurnError> {
        let session_err = |source| TurnError::Session { key: key.to_string(), source };
        let session = self.sessions.load(key).map_err(session_err)?;
        let history = self.sessions.history(key, self.settings.history_messages).map_err(session_err)?;
        let answered = self.live.answered(key);
        Ok(SessionStatus {
            model: self.model_label(&self.session_model(key)),
            answered,
            providers: self.provider.ready().map(|p| p.health()).unwrap_or_default(),
            messages: session.messages.len() + session.skipped,
            consolidated: session.checkpoint.is_some(),
            estimated_tokens: self.base_prompt_tokens().await + memory::estimate_tokens(&history),
            context_tokens: self.settings.context_tokens,
            today: self.usage.today(),
            daily_budget: self.settings.daily_token_budget,
            subagents: self.subagents.as_ref().map_or(0, |h| h.running(Some(key))),
            mcp: self.tools.sources_status(),
        })
    }

    /// Today's token usage (local date), all sessions.
    pub fn usage_today(&self) -> DayUsage {
        self.usage.today()
    }
}
