//! Consolidation: a session whose prompt grows past `context_tokens` is
//! summarised into `memory/` (the long-term MEMORY.md and the history journal)
//! and cut to its recent part; `/new` archives it whole.
//!
//! MEMORY.md goes into every system prompt, of every session: what a
//! consolidation writes there, the owner's next Telegram turn (with `exec`)
//! reads as its own memory. So only a session whose source may write memory
//! (`[policy.<source>] memory`, off for mqtt and trigger by default) is
//! summarised into it, and the lines it adds carry that source
//! ([`memory::mark_source`]). Any other session is archived verbatim in the
//! history journal (its entry carries the source too): nothing is lost,
//! nothing reaches a prompt it did not come from, and no model is asked.
//!
//! With a known context window ([`crate::provider::window`]), consolidation
//! starts before the prompt overflows it: the threshold is the smaller of
//! `context_tokens` and the window's prompt budget (three quarters of it).

use super::react::LoopStats;
use super::sessions::SessionLock;
use super::{memory, session};
use super::{Agent, TurnError};
use crate::provider::{Message, Provider};
use crate::tools::policy::Source;

/// How much of a session a consolidation keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Keep {
    /// The recent part: at most this many messages and (estimated) tokens, at least the last turn.
    Recent { messages: usize, tokens: usize },
    /// Nothing: the session starts afresh (`/new`).
    Nothing,
}

/// What a consolidation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Consolidation {
    /// Nothing old enough to consolidate.
    Nothing,
    /// `messages` were summarised into journal entry `cursor`; whether MEMORY.md changed.
    Summarised { messages: usize, cursor: u64, memory_updated: bool },
    /// Summarising failed (`reason`): `messages` were archived verbatim as journal entry `cursor`.
    Archived { messages: usize, cursor: u64, reason: String },
    /// The session's source may not write long-term memory: `messages` were
    /// archived verbatim as journal entry `cursor`, MEMORY.md is untouched.
    NotRemembered { messages: usize, cursor: u64, source: &'static str },
}

impl std::fmt::Display for Consolidation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Consolidation::Nothing => f.write_str("Nothing to consolidate."),
            Consolidation::Summarised { messages, cursor, memory_updated } => write!(
                f,
                "{messages} messages summarised into the history journal (entry {cursor}){}.",
                if *memory_updated { "; MEMORY.md updated" } else { "" }
            ),
            Consolidation::Archived { messages, cursor, reason } => write!(
                f,
                "Summarising failed ({reason}); {messages} messages were archived verbatim in the history journal (entry {cursor})."
            ),
            Consolidation::NotRemembered { messages, cursor, source } => write!(
                f,
                "Conversations from {source} are not added to long-term memory ([policy.{source}] memory = false): \
                 {messages} messages were archived verbatim in the history journal (entry {cursor})."
            ),
        }
    }
}

impl Agent {
    /// Estimated tokens above which a session is consolidated:
    /// `[agent] context_tokens`, or less when the context window is smaller.
    pub(super) fn consolidation_threshold(&self) -> usize {
        let budget = self.context.prompt_budget().unwrap_or(usize::MAX);
        self.settings.context_tokens.min(budget)
    }

    /// Estimated tokens of the tool specs a prompt carries: those of a chat
    /// from the terminal (the largest set), as the profile writes them.
    fn spec_tokens(&self) -> usize {
        memory::estimate_spec_tokens(&self.tools.specs_for(Source::Terminal))
    }

    /// A turn's first messages fitted to the context window with the specs
    /// it is offered ([`super::context::ContextBuilder::fit`]).
    pub(super) fn fit_to_window(&self, req: &super::TurnRequest, messages: Vec<Message>) -> Vec<Message> {
        let specs = self.tools.specs_for(req.tool_context().grant());
        self.context.fit(messages, memory::estimate_spec_tokens(&specs))
    }

    /// Whether the prompt passes [`Self::consolidation_threshold`], or the
    /// session has more messages than the history window holds (they would
    /// drop out of the prompt without being remembered).
    ///
    /// `prompt` may have been fitted to the window already (its oldest turns
    /// left out): the estimate counts the session's whole history window, so
    /// what fitting left out is consolidated, not lost.
    pub(super) fn needs_consolidation(&self, key: &str, prompt: &[Message]) -> bool {
        let count = self.sessions.load(key).map(|s| s.messages.len() + s.skipped).unwrap_or(0);
        let history = self.sessions.history(key, self.settings.history_messages).unwrap_or_default();
        let around = prompt.first().into_iter().chain(prompt.iter().rev().take(2).filter(|_| prompt.len() > 2));
        let around: Vec<Message> = around.cloned().collect();
        let estimate = memory::estimate_tokens(&around) + memory::estimate_tokens(&history) + self.spec_tokens();
        count > self.settings.history_messages || estimate > self.consolidation_threshold()
    }

    /// Consolidate the older part of a session before a turn. Failures are
    /// logged; the turn goes on with the session as it is.
    pub(super) async fn auto_consolidate(
        &self,
        provider: &dyn Provider,
        model: &str,
        (key, source): (&str, Source),
        prompt: &[Message],
    ) {
        // What every prompt carries besides the history: system prompt, tools, runtime context, the new text.
        let fixed = prompt.first().map_or(0, |m| memory::estimate_tokens(std::slice::from_ref(m)))
            + prompt.iter().rev().take(2).map(|m| memory::estimate_tokens(std::slice::from_ref(m))).sum::<usize>()
            + self.spec_tokens();
        let keep = Keep::Recent {
            messages: (self.settings.history_messages / 2).max(1),
            tokens: self.consolidation_threshold().saturating_sub(fixed) / 2,
        };
        tracing::info!(session = %key, "consolidating the session's older part");
        match self.consolidate_locked(Some(provider), model, (key, source), keep).await {
            Ok(c) => tracing::info!(session = %key, "{c}"),
            Err(e) => tracing::error!(session = %key, "consolidation failed, the session is unchanged: {e}"),
        }
    }

    /// Estimated tokens of what every prompt carries: the system prompt and the tool specs.
    pub(super) async fn base_prompt_tokens(&self) -> usize {
        memory::estimate_tokens(&[Message::system(self.system_prompt().await)]) + self.spec_tokens()
    }

    /// Estimated tokens of the part of a terminal turn's prompt that every
    /// turn carries: the system prompt and the tool specs, as the profile
    /// writes them. Blocking (it reads the workspace): for `check` and `doctor`.
    pub fn fixed_prompt_tokens(&self) -> usize {
        let names = self.tools.names_for(Source::Terminal);
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        memory::estimate_tokens(&[Message::system(self.context.system_prompt(&names))]) + self.spec_tokens()
    }

    /// Summarise the part of the session before the boundary `keep` picks and
    /// replace it by a checkpoint (no checkpoint for [`Keep::Nothing`]). A
    /// session whose `source` may not write memory is archived verbatim
    /// instead. The caller holds the session's lock.
    pub(super) async fn consolidate_locked(
        &self,
        provider: Option<&dyn Provider>,
        model: &str,
        (key, source): (&str, Source),
        keep: Keep,
    ) -> Result<Consolidation, TurnError> {
        let session_err = |source| TurnError::Session { key: key.to_string(), source };
        let session = self.sessions.load_all(key).map_err(session_err)?;
        let all = &session.messages;
        let boundary = match keep {
            Keep::Recent { messages, tokens } => memory::pick_boundary(all, messages, tokens),
            Keep::Nothing => all.len(),
        };
        if boundary == 0 {
            if keep == Keep::Nothing && session.checkpoint.is_some() {
                self.sessions.replace_prefix(key, 0, &[], None).map_err(session_err)?;
            }
            return Ok(Consolidation::Nothing);
        }
        let chunk = &all[..boundary];
        let archived = session.checkpoint.as_ref().map_or(0, |c| c.archived) + boundary as u64;
        if !self.tools.policy().remembers(source) {
            return self.archive_unremembered(key, source, chunk, archived, keep).await;
        }
        let workspace = self.context.workspace().to_path_buf();
        let current = {
            let workspace = workspace.clone();
            tokio::task::spawn_blocking(move || memory::read_memory(&workspace)).await.unwrap_or_default()
        };
        let result = match provider {
            Some(p) => {
                let summary = memory::summarise(p, model, self.settings.max_tokens, &current, chunk).await;
                let mut stats = LoopStats::default();
                stats.count(summary.usage, summary.route.clone());
                self.record_usage(&stats);
                summary.result
            }
            None => Err(memory::SummaryError::NoProvider(self.provider_problem().unwrap_or("no provider").to_string())),
        };
        let journal_err = |e: std::io::Error| TurnError::Session {
            key: key.to_string(),
            source: std::io::Error::new(e.kind(), format!("cannot write {}: {e}", self.journal.path().display())),
        };
        // The journal first: once the old messages are in it, the session may drop them.
        let (checkpoint, outcome) = match result {
            Ok(saved) => {
                let cursor = self
                    .append_journal(key, source, "summary", saved.history_entry.trim())
                    .await
                    .map_err(journal_err)?;
                let update = saved.memory_update.clone();
                let written = tokio::task::spawn_blocking(move || {
                    memory::apply_memory_update(&workspace, &current, &update, source.name())
                })
                .await
                .unwrap_or_else(|e| Err(std::io::Error::other(e)));
                let memory_updated = written.unwrap_or_else(|e| {
                    tracing::error!("cannot write {}: {e}", memory::MEMORY_FILE);
                    false
                });
                let checkpoint = session::Checkpoint {
                    summary: saved.history_entry.trim().to_string(),
                    timestamp: session::now_rfc3339(),
                    archived,
                };
                (checkpoint, Consolidation::Summarised { messages: boundary, cursor, memory_updated })
            }
            Err(reason) => {
                tracing::warn!(session = %key, messages = boundary, "summarising failed ({reason}); archiving the messages verbatim");
                let raw = format!("[RAW] {boundary} messages\n{}", memory::transcript(chunk, false));
                let cursor = self.append_journal(key, source, "raw", &raw).await.map_err(journal_err)?;
                (
                    memory::raw_checkpoint(boundary, archived, cursor),
                    Consolidation::Archived { messages: boundary, cursor, reason: reason.to_string() },
                )
            }
        };
        let checkpoint = (keep != Keep::Nothing).then_some(checkpoint);
        let replaced = self.sessions.replace_prefix(key, boundary, chunk, checkpoint).map_err(session_err)?;
        if replaced.is_none() {
            tracing::warn!(session = %key, "the session changed during consolidation; it is left as it is (the journal has the entry)");
        }
        Ok(outcome)
    }

    /// Archive `chunk` of a session whose `source` may not write memory:
    /// verbatim in the journal (entry marked with the source), MEMORY.md and
    /// the model untouched; the session keeps a checkpoint naming the entry.
    async fn archive_unremembered(
        &self,
        key: &str,
        source: Source,
        chunk: &[session::StoredMessage],
        archived: u64,
        keep: Keep,
    ) -> Result<Consolidation, TurnError> {
        let boundary = chunk.len();
        tracing::info!(session = %key, source = source.name(), messages = boundary, "the source may not write long-term memory; archiving the messages verbatim");
        let raw = format!("[RAW] {boundary} messages\n{}", memory::transcript(chunk, false));
        let cursor = self.append_journal(key, source, "raw", &raw).await.map_err(|e| TurnError::Session {
            key: key.to_string(),
            source: std::io::Error::new(e.kind(), format!("cannot write {}: {e}", self.journal.path().display())),
        })?;
        let checkpoint = (keep != Keep::Nothing).then(|| memory::raw_checkpoint(boundary, archived, cursor));
        let replaced = self
            .sessions
            .replace_prefix(key, boundary, chunk, checkpoint)
            .map_err(|source| TurnError::Session { key: key.to_string(), source })?;
        if replaced.is_none() {
            tracing::warn!(session = %key, "the session changed during archiving; it is left as it is (the journal has the entry)");
        }
        Ok(Consolidation::NotRemembered { messages: boundary, cursor, source: source.name() })
    }

    /// Append to the history journal off the runtime thread (a command may hold a lock on it).
    pub(super) async fn append_journal(
        &self,
        key: &str,
        source: Source,
        kind: &'static str,
        content: &str,
    ) -> std::io::Result<u64> {
        let journal = self.journal.clone();
        let (key, content) = (key.to_string(), content.to_string());
        tokio::task::spawn_blocking(move || journal.append(&key, source.name(), kind, &content))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)))
    }

    /// `/compact`: consolidate everything but the last turn now. `source`
    /// is where the session's turns come from (`[policy.<source>] memory`).
    pub async fn consolidate(&self, key: &str, source: Source) -> Result<Consolidation, TurnError> {
        let lock = SessionLock::new(&self.live, key);
        let _in_session = lock.lock.lock().await;
        let model = self.session_model(key);
        let provider = self.provider.ready().cloned();
        let keep = Keep::Recent { messages: 1, tokens: 0 };
        self.consolidate_locked(provider.as_deref(), &model, (key, source), keep).await
    }

    /// `/new`: consolidate the whole session into memory (when `source` may
    /// write it) and start it afresh. Without a provider, or when the source
    /// may not write memory, the messages are archived verbatim.
    pub async fn reset_session(&self, key: &str, source: Source) -> Result<Consolidation, TurnError> {
        let lock = SessionLock::new(&self.live, key);
        let _in_session = lock.lock.lock().await;
        let model = self.session_model(key);
        let provider = self.provider.ready().cloned();
        self.consolidate_locked(provider.as_deref(), &model, (key, source), Keep::Nothing).await
    }
}
