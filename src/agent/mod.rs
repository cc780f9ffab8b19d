//! The agent: a ReAct loop over an LLM and tools.
//!
//! One turn: build the context (system prompt, history, runtime context, the
//! user's text) → call the model → run the tool calls it asks for → append
//! their results → call again, until it answers in text or `max_iterations`
//! rounds have passed (then it says so plainly instead of failing).
//!
//! Invariants:
//! - A model's bad output never ends a turn with a panic: bad tool arguments,
//!   unknown tools and failing tools come back to it as `Error: …` text (see
//!   [`crate::tools::ToolRegistry::execute`]); an empty answer is retried, then
//!   reported.
//! - One turn per session at a time (a per-session async lock), different
//!   sessions concurrently, at most [`MAX_CONCURRENT_TURNS`] in flight.
//! - A turn is atomic (bub's idea): its messages reach the session file in one
//!   append when it ends. A turn stopped by the user (`/stop`, Ctrl-C) is
//!   committed with its finished tool results, unfinished calls answered by a
//!   synthetic "not run" result, and a closing note — never an orphan tool
//!   call. A failed turn, a turn cut off by shutdown, and a crash leave the
//!   session exactly as before; the user's message survives in a pending
//!   record ([`pending`]) and is reported (or re-run) at the next start.
//! - A session's prompt stays bounded: past `[agent] context_tokens` (or the
//!   history window), its older part is consolidated into memory ([`memory`]).
//! - Token usage is recorded per day; past `[agent] daily_token_budget`, job
//!   and trigger turns refuse to start and chat answers carry a warning.

pub mod commands;
mod consolidate;
pub mod context;
mod decision;
mod inflight;
pub mod input;
pub mod memory;
pub mod pending;
mod react;
mod serve;
pub mod session;
mod sessions;
pub mod skills;
mod status;
pub mod subagent;
mod textcall;
mod turn;
mod unanswered;
pub mod usage;

use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::bus::Conversation;
use crate::provider::{ProviderSlot, Usage};
use crate::tools::{ToolContext, ToolRegistry};
use context::ContextBuilder;
use memory::Journal;
use pending::PendingStore;
use session::SessionStore;
use sessions::Sessions;
use usage::UsageLedger;

pub use commands::CommandContext;
pub use consolidate::Consolidation;
pub use inflight::{InFlight, InFlightGuard};
pub use react::ProgressSink;
pub(crate) use react::{run_loop, LoopFail, LoopSpec, LoopStats};
pub use serve::{Announcements, BusServer, ServeBus};
pub use status::SessionStatus;

/// Turns running at once across all sessions (each holds a prompt in memory).
pub const MAX_CONCURRENT_TURNS: usize = 4;

/// The loop's knobs, from `[agent]`.
#[derive(Debug, Clone)]
pub struct AgentSettings {
    pub model: String,
    pub max_iterations: u32,
    pub max_tokens: u32,
    pub temperature: Option<f32>,
    pub history_messages: usize,
    /// Estimated prompt tokens above which a session is consolidated.
    pub context_tokens: usize,
    /// Tokens per local day; 0 = unlimited.
    pub daily_token_budget: u64,
    pub unanswered: crate::config::Unanswered,
    /// When an answer names the model that gave it.
    pub model_footer: crate::config::ModelFooter,
    /// Whether the turn's model can see images (`[agent] vision`).
    pub vision: bool,
    /// The model for turns that carry an image (`[agent] vision_model`).
    pub vision_model: Option<String>,
}

/// What a channel may know of the agent besides the bus: whether a session
/// has a turn running or queued (Telegram's typing indicator). Channels get
/// this, never the `Agent`.
pub trait SessionActivity: Send + Sync {
    fn session_busy(&self, session_key: &str) -> bool;
}

impl SessionActivity for Agent {
    fn session_busy(&self, session_key: &str) -> bool {
        Agent::session_busy(self, session_key)
    }
}

/// One turn to run.
#[derive(Debug, Clone)]
pub struct TurnRequest {
    pub conversation: Conversation,
    pub text: String,
    /// Set for scheduled job runs: tools that would schedule more work refuse.
    pub in_job: bool,
    /// The model for this turn (a job's `--model`), instead of the session's.
    pub model: Option<String>,
    pub cancel: CancellationToken,
    /// Files that came with the message (voice notes, photos, documents).
    pub attachments: Vec<crate::bus::Attachment>,
    /// Who the turn acts for: the message's sender, or the job's creator (a
    /// job's turn gets no tool its creator may not use).
    pub principal: crate::bus::Principal,
}

impl TurnRequest {
    /// A turn from the local terminal.
    pub fn cli(session_key: impl Into<String>, text: impl Into<String>) -> Self {
        TurnRequest::new(Conversation::cli(session_key), text)
    }

    /// A turn in `conversation`, not as a job, stopped only by its own token.
    pub fn new(conversation: Conversation, text: impl Into<String>) -> Self {
        TurnRequest {
            principal: crate::tools::presumed(&conversation),
            conversation,
            text: text.into(),
            in_job: false,
            model: None,
            cancel: CancellationToken::new(),
            attachments: Vec::new(),
        }
    }

    /// The context its tool calls run in: its source, and who it acts for.
    fn tool_context(&self) -> ToolContext {
        ToolContext::new(self.conversation.clone(), self.in_job, self.cancel.clone()).acting_for(self.principal.clone())
    }
}

/// How a turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnEnd {
    /// The model answered in text.
    Answered,
    /// `max_iterations` rounds of tool calls without a final answer.
    MaxIterations,
    /// The model kept answering with nothing.
    EmptyAnswer,
    /// A decision turn ([`Agent::decide`]): the model called `report`; the text is the report.
    Reported,
    /// A decision turn: the model called `nothing_to_report`.
    NothingToReport,
}

/// The result of a turn.
#[derive(Debug, Clone)]
pub struct TurnReport {
    /// What to show the user.
    pub text: String,
    pub end: TurnEnd,
    pub usage: Usage,
    /// Model calls made.
    pub model_calls: u32,
    /// Tool calls run.
    pub tool_calls: u32,
    /// Who answered (`provider/model`), when a fallback chain said so.
    pub route: Option<crate::provider::Route>,
}

/// Why a turn produced no answer.
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    #[error(transparent)]
    Provider(#[from] crate::provider::ProviderError),
    #[error("cannot use the session file of `{key}`: {source}")]
    Session { key: String, source: std::io::Error },
    #[error("the turn was stopped")]
    Cancelled,
    #[error(
        "today's token budget is used up ({used} of {budget} tokens, [agent] daily_token_budget): \
         scheduled and triggered turns resume tomorrow"
    )]
    Budget { used: u64, budget: u64 },
    /// What came with the message cannot be used (a voice note that cannot be
    /// transcribed): the text is the whole answer, and the model is not asked.
    #[error("{0}")]
    Input(String),
}

/// The agent: the turn engine. Provider, tools, session files, the context
/// builder, and the live state of each session ([`sessions`]); what the
/// slash commands alone need is in its [`CommandContext`].
pub struct Agent {
    provider: ProviderSlot,
    tools: ToolRegistry,
    sessions: SessionStore,
    context: ContextBuilder,
    settings: AgentSettings,
    /// Each session's lock, turns, `/model` and last answerer: one map.
    live: Sessions,
    turn_slots: Semaphore,
    inflight: InFlight,
    journal: Journal,
    usage: UsageLedger,
    pending: PendingStore,
    /// Voice notes to text: `Ok(None)` not configured, `Err` configured but unusable (why).
    transcriber: Result<Option<Arc<crate::provider::transcribe::Transcriber>>, crate::provider::Unconfigured>,
    /// Where chat turns say what they are doing (Telegram's status message).
    progress: Option<Arc<dyn ProgressSink>>,
    subagents: Option<Arc<subagent::Hub>>,
    /// The job store, the scheduler and `[exec]`, for `/jobs`, `/run` and `/status`.
    commands: CommandContext,
}

/// Everything an agent is made of, handed over whole by the composition root
/// (`daemon::assemble`): an agent is complete when it is made, nothing is set
/// on it afterwards.
pub struct AgentParts {
    /// [`ProviderSlot::Unconfigured`] when no provider can be used: turns then
    /// fail with its reason, everything else (exec jobs, status) still works.
    pub provider: ProviderSlot,
    pub tools: ToolRegistry,
    pub sessions: SessionStore,
    pub context: ContextBuilder,
    pub settings: AgentSettings,
    /// The job store and the zone times are shown in, for `/jobs` and `/run`.
    pub jobs: Option<(crate::scheduler::JobStore, jiff::tz::TimeZone)>,
    /// `[exec]` and its sandbox, for the sandbox line of `/status` (`None`: exec is off).
    pub exec: Option<(crate::config::ExecConfig, Arc<crate::sandbox::Sandbox>)>,
    /// The daemon's scheduler, for `/run` (`None` outside the daemon).
    pub scheduler: Option<crate::scheduler::SchedulerHandle>,
    /// Shared with the sub-agent hub, which stops at its shutdown signal.
    pub inflight: InFlight,
    pub subagents: Option<Arc<subagent::Hub>>,
    /// The usage ledger, when the provider chain shares it (per-provider
    /// budgets); `None`: the agent opens its state directory's.
    pub usage: Option<UsageLedger>,
    /// `[transcription]`: `Ok(None)` when off, `Err(why)` when it cannot work.
    pub transcriber: Result<Option<Arc<crate::provider::transcribe::Transcriber>>, crate::provider::Unconfigured>,
    /// Where chat turns say what they are doing, if a channel shows it.
    pub progress: Option<Arc<dyn ProgressSink>>,
    /// The journal of unanswered messages (`<state>/pending/` of the session
    /// store's state directory): its turns' records, and the orphans taken at start.
    pub pending: PendingStore,
}

impl AgentParts {
    /// The parts every agent needs; the optional ones start empty.
    pub fn new(
        provider: ProviderSlot,
        tools: ToolRegistry,
        sessions: SessionStore,
        context: ContextBuilder,
        settings: AgentSettings,
    ) -> AgentParts {
        let pending = PendingStore::new(sessions.state_dir());
        AgentParts {
            provider,
            tools,
            sessions,
            context,
            settings,
            jobs: None,
            exec: None,
            scheduler: None,
            inflight: InFlight::default(),
            subagents: None,
            usage: None,
            transcriber: Ok(None),
            progress: None,
            pending,
        }
    }
}

impl Agent {
    /// An agent from its parts.
    pub fn new(parts: AgentParts) -> Agent {
        let AgentParts {
            provider,
            tools,
            sessions,
            context,
            settings,
            jobs,
            exec,
            scheduler,
            inflight,
            subagents,
            usage,
            transcriber,
            progress,
            pending,
        } = parts;
        let state_dir = sessions.state_dir().to_path_buf();
        Agent {
            provider,
            tools,
            journal: Journal::new(context.workspace(), context.timezone().clone()),
            usage: usage.unwrap_or_else(|| UsageLedger::new(&state_dir, context.timezone().clone())),
            pending,
            sessions,
            context,
            settings,
            live: Sessions::default(),
            turn_slots: Semaphore::new(MAX_CONCURRENT_TURNS),
            inflight,
            transcriber,
            progress,
            subagents,
            commands: CommandContext::new(jobs, scheduler, exec),
        }
    }

    /// What the slash commands need besides the agent.
    pub fn command_context(&self) -> &CommandContext {
        &self.commands
    }

    /// Cancel every turn of `session_key`, running or queued; returns how many.
    /// A cancelled turn's exec children are killed with their process group.
    pub fn stop_session(&self, session_key: &str) -> usize {
        let tokens = self.live.take_active(session_key);
        for t in &tokens {
            t.cancel();
        }
        if !tokens.is_empty() {
            tracing::info!(session = %session_key, turns = tokens.len(), "turns stopped");
        }
        tokens.len()
    }

    /// Whether a turn of `session_key` is running or queued.
    pub fn session_busy(&self, session_key: &str) -> bool {
        self.live.busy(session_key)
    }

    /// This agent as the narrow view channels get of it.
    pub fn activity(self: &Arc<Self>) -> Arc<dyn SessionActivity> {
        self.clone()
    }

    /// Turns running or queued, over all sessions.
    pub fn active_turns(&self) -> usize {
        self.live.active_turns()
    }

    pub fn settings(&self) -> &AgentSettings {
        &self.settings
    }

    pub fn tools(&self) -> &ToolRegistry {
        &self.tools
    }

    pub fn sessions(&self) -> &SessionStore {
        &self.sessions
    }

    pub fn context(&self) -> &ContextBuilder {
        &self.context
    }

    /// Work in flight: turns running or queued for their session.
    pub fn inflight(&self) -> &InFlight {
        &self.inflight
    }

    /// Why there is no provider, if there is none.
    pub fn provider_problem(&self) -> Option<&str> {
        self.provider.problem().map(|u| u.reason.as_str())
    }

    /// Whether voice notes can be transcribed, for `/status`.
    pub fn transcription_summary(&self) -> String {
        match &self.transcriber {
            Ok(Some(t)) => format!("transcribed by {}", t.describe()),
            Ok(None) => "not transcribed ([transcription] is not set up; notes are kept in inbox/)".into(),
            Err(why) => format!("not transcribed: {why}"),
        }
    }

    /// How photos reach the model, for `/status`.
    pub fn vision_summary(&self) -> String {
        match (&self.settings.vision_model, self.settings.vision) {
            (Some(m), _) => format!("shown to {}", self.model_label(m)),
            (None, true) => "shown to the model".into(),
            (None, false) => "named by file only ([agent] vision = false)".into(),
        }
    }

    /// `/stop`: cancel the session's sub-agents; returns how many.
    pub fn stop_subagents(&self, key: &str) -> usize {
        self.subagents.as_ref().map_or(0, |h| h.stop(key))
    }

    /// Wait until no sub-agent runs and their reports were handled (`bramble agent -m`).
    pub async fn wait_subagents(&self) {
        if let Some(h) = &self.subagents {
            h.wait_idle().await;
        }
    }

    /// Sub-agents running, all sessions.
    pub fn subagents_running(&self) -> usize {
        self.subagents.as_ref().map_or(0, |h| h.running(None))
    }
}
