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
pub mod input;
mod locks;
pub mod memory;
pub mod pending;
mod react;
mod serve;
pub mod session;
pub mod skills;
mod status;
pub mod subagent;
pub mod usage;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::bus::{Conversation, InboundMessage, OutboundMessage, Target};
use crate::provider::{ChatRequest, ChatResponse, Message, Provider, ProviderError, Role, ToolSpec, Usage};
use crate::tools::{ToolContext, ToolRegistry};
use crate::util;
use context::ContextBuilder;
use memory::Journal;
use pending::{PendingStore, PendingTurn};
use session::{SessionStore, StoredMessage};
use usage::{DayUsage, UsageLedger};

pub use consolidate::Consolidation;
use locks::{ActiveTurn, PendingGuard, SessionLock};
pub use react::ProgressSink;
pub(crate) use react::{run_loop, LoopFail, LoopSpec, LoopStats};
pub use status::SessionStatus;

/// Turns running at once across all sessions (each holds a prompt in memory).
pub const MAX_CONCURRENT_TURNS: usize = 4;

/// Extra model calls when it answers with nothing at all.
const EMPTY_ANSWER_RETRIES: u32 = 2;

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
    Provider(#[from] ProviderError),
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

/// Counts work in flight so shutdown can give it a grace period: every turn
/// enters it, and the daemon's job runner adds reminders and exec jobs.
///
/// It also carries the shutdown signal: [`InFlight::begin_shutdown`] (called by
/// the daemon just before it cancels work in flight) tells turns that their
/// cancellation is a shutdown, not a `/stop` — they then leave the session as
/// it was and keep the user's message pending — and stops sub-agents.
#[derive(Clone, Default)]
pub struct InFlight(Arc<(std::sync::atomic::AtomicUsize, Notify)>, CancellationToken);

/// Held while one piece of work runs.
pub struct InFlightGuard(InFlight);

impl InFlight {
    pub fn enter(&self) -> InFlightGuard {
        self.0 .0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        InFlightGuard(self.clone())
    }
    pub fn count(&self) -> usize {
        self.0 .0.load(std::sync::atomic::Ordering::SeqCst)
    }
    /// Work is about to be cancelled because the process stops or reloads.
    pub fn begin_shutdown(&self) {
        self.1.cancel();
    }
    pub fn is_shutting_down(&self) -> bool {
        self.1.is_cancelled()
    }
    /// Cancelled by [`begin_shutdown`](Self::begin_shutdown).
    pub fn shutdown_token(&self) -> &CancellationToken {
        &self.1
    }
    /// Wait until nothing is in flight, or `limit` passes. Returns whether it drained.
    pub async fn drained(&self, limit: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.0 .1.notified();
            if self.count() == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.count() == 0;
            }
        }
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0 .0 .0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        self.0 .0 .1.notify_waiters();
    }
}

/// The agent: provider, tools, sessions and the context builder.
pub struct Agent {
    provider: Result<Arc<dyn Provider>, String>,
    tools: ToolRegistry,
    sessions: SessionStore,
    context: ContextBuilder,
    settings: AgentSettings,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    turn_slots: Semaphore,
    inflight: InFlight,
    /// Cancel tokens of turns running or queued, by session (for `/stop`).
    active: Mutex<HashMap<String, Vec<(u64, CancellationToken)>>>,
    next_turn: std::sync::atomic::AtomicU64,
    /// The job store and zone, for `/jobs` and `/run`.
    jobs: Option<(crate::scheduler::JobStore, jiff::tz::TimeZone)>,
    /// `[exec]` and its sandbox, for the sandbox line of `/status` (`None`: exec is off).
    exec: Option<(crate::config::ExecConfig, Arc<crate::sandbox::Sandbox>)>,
    /// The daemon's scheduler, for `/run` (`None` outside the daemon).
    scheduler: Option<crate::scheduler::SchedulerHandle>,
    journal: Journal,
    usage: UsageLedger,
    pending: PendingStore,
    /// Per-session model overrides (`/model`), in memory: a restart goes back to the configured model.
    models: Mutex<HashMap<String, String>>,
    /// Voice notes to text: `Ok(None)` not configured, `Err` configured but unusable (why).
    transcriber: Result<Option<Arc<crate::provider::transcribe::Transcriber>>, String>,
    /// Sessions already told that their model cannot see images.
    told_blind: Mutex<std::collections::HashSet<String>>,
    /// Where chat turns say what they are doing (Telegram's status message).
    progress: Option<Arc<dyn ProgressSink>>,
    /// Who answered each session's last turn (`provider/model`, and why if a fallback), for `/status`.
    answered: Mutex<HashMap<String, crate::provider::Route>>,
    subagents: Option<Arc<subagent::Hub>>,
}

/// Everything an agent is made of, handed over whole by the composition root
/// (`daemon::assemble`): an agent is complete when it is made, nothing is set
/// on it afterwards.
pub struct AgentParts {
    /// `Err(reason)` when no provider is configured: turns then fail with that
    /// reason, everything else (exec jobs, status) still works.
    pub provider: Result<Arc<dyn Provider>, String>,
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
    pub transcriber: Result<Option<Arc<crate::provider::transcribe::Transcriber>>, String>,
    /// Where chat turns say what they are doing, if a channel shows it.
    pub progress: Option<Arc<dyn ProgressSink>>,
}

impl AgentParts {
    /// The parts every agent needs; the optional ones start empty.
    pub fn new(
        provider: Result<Arc<dyn Provider>, String>,
        tools: ToolRegistry,
        sessions: SessionStore,
        context: ContextBuilder,
        settings: AgentSettings,
    ) -> AgentParts {
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
        } = parts;
        let state_dir = sessions.state_dir().to_path_buf();
        Agent {
            provider,
            tools,
            journal: Journal::new(context.workspace(), context.timezone().clone()),
            usage: usage.unwrap_or_else(|| UsageLedger::new(&state_dir, context.timezone().clone())),
            pending: PendingStore::new(&state_dir),
            sessions,
            context,
            settings,
            locks: Mutex::new(HashMap::new()),
            turn_slots: Semaphore::new(MAX_CONCURRENT_TURNS),
            inflight,
            active: Mutex::new(HashMap::new()),
            next_turn: std::sync::atomic::AtomicU64::new(0),
            jobs,
            exec,
            scheduler,
            models: Mutex::new(HashMap::new()),
            answered: Mutex::new(HashMap::new()),
            transcriber,
            told_blind: Mutex::new(std::collections::HashSet::new()),
            progress,
            subagents,
        }
    }

    /// The sandbox layers commands get, for `/status`; `None` when exec is off.
    pub fn sandbox_summary(&self) -> Option<String> {
        self.exec.as_ref().filter(|(c, _)| c.enabled).map(|(c, sandbox)| sandbox.layers_summary(c))
    }

    /// The job store and display zone, if set.
    pub fn jobs(&self) -> Option<&(crate::scheduler::JobStore, jiff::tz::TimeZone)> {
        self.jobs.as_ref()
    }

    /// The daemon's scheduler, if this agent runs in the daemon.
    pub fn scheduler(&self) -> Option<&crate::scheduler::SchedulerHandle> {
        self.scheduler.as_ref()
    }

    /// Cancel every turn of `session_key`, running or queued; returns how many.
    /// A cancelled turn's exec children are killed with their process group.
    pub fn stop_session(&self, session_key: &str) -> usize {
        let tokens = self.active_lock().remove(session_key).unwrap_or_default();
        for (_, t) in &tokens {
            t.cancel();
        }
        if !tokens.is_empty() {
            tracing::info!(session = %session_key, turns = tokens.len(), "turns stopped");
        }
        tokens.len()
    }

    /// Whether a turn of `session_key` is running or queued.
    pub fn session_busy(&self, session_key: &str) -> bool {
        self.active_lock().get(session_key).is_some_and(|v| !v.is_empty())
    }

    /// This agent as the narrow view channels get of it.
    pub fn activity(self: &Arc<Self>) -> Arc<dyn SessionActivity> {
        self.clone()
    }

    /// Turns running or queued, over all sessions.
    pub fn active_turns(&self) -> usize {
        self.active_lock().values().map(Vec::len).sum()
    }

    fn active_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<(u64, CancellationToken)>>> {
        self.active.lock().unwrap_or_else(|p| p.into_inner())
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
        self.provider.as_ref().err().map(String::as_str)
    }

    /// Run one turn to the end. Turns of the same session queue up behind each other.
    pub async fn turn(&self, req: TurnRequest) -> Result<TurnReport, TurnError> {
        let provider = match &self.provider {
            Ok(p) => Arc::clone(p),
            Err(why) => return Err(ProviderError::NotConfigured(why.clone()).into()),
        };
        if req.in_job {
            self.check_budget()?;
        }
        let _busy = self.inflight.enter();
        let _stoppable = ActiveTurn::new(self, &req.conversation.session_key, &req.cancel);
        // Take this turn's place in its session's queue now, before anything
        // below waits: turns of one chat run in the order they came (the
        // pending record's write must not let a later message overtake).
        let session = SessionLock::new(self, &req.conversation.session_key);
        let queued = Arc::clone(&session.lock).lock_owned();
        tokio::pin!(queued);
        let mut held = None;
        std::future::poll_fn(|cx| {
            if let std::task::Poll::Ready(guard) = std::future::Future::poll(queued.as_mut(), cx) {
                held = Some(guard);
            }
            std::task::Poll::Ready(())
        })
        .await;
        // The user's message survives a crash from here on (chat turns only:
        // jobs have their own run records): its record is written now and
        // flushed if the turn is still running after `SYNC_AFTER` (a shorter
        // turn's session commit holds the message). Both wait on the disk:
        // off the runtime thread.
        let record = if req.in_job {
            None
        } else {
            let (pending, conversation, text) =
                (self.pending.clone(), req.conversation.clone(), input::with_references(&req.text, &req.attachments));
            match util::tasks::blocking(move || pending.begin_unsynced(&conversation, &text)).await {
                Ok(id) => Some(id),
                Err(e) => {
                    tracing::warn!(session = %req.conversation.session_key, "cannot record the turn as pending: {e}");
                    None
                }
            }
        };
        // Dropped unfinished (the turn's future abandoned): the record stays for the next start.
        let record = record.map(|id| PendingGuard { store: &self.pending, id });
        let turn = self.turn_queued(provider.as_ref(), &req, held, queued.as_mut());
        tokio::pin!(turn);
        let result = match &record {
            None => turn.await,
            Some(record) => tokio::select! {
                r = &mut turn => r,
                () = util::timer::sleep(pending::SYNC_AFTER) => {
                    let (pending, id) = (self.pending.clone(), record.id);
                    if let Err(e) = util::tasks::blocking(move || pending.sync(id)).await {
                        tracing::warn!(session = %req.conversation.session_key, "cannot flush the turn's pending record: {e}");
                    }
                    turn.await
                }
            },
        };
        if let Some(record) = record {
            // Cut off by shutdown: the session is unchanged and the message stays pending.
            let keep = matches!(result, Err(TurnError::Cancelled)) && self.inflight.is_shutting_down();
            if keep {
                // It must outlive a power cut after the stop, too.
                let (pending, id) = (self.pending.clone(), record.id);
                if let Err(e) = util::tasks::blocking(move || pending.sync(id)).await {
                    tracing::warn!(session = %req.conversation.session_key, "cannot flush the turn's pending record: {e}");
                }
            } else {
                let (pending, id) = (self.pending.clone(), record.id);
                util::tasks::blocking(move || pending.finish(id)).await;
            }
        }
        result
    }

    /// The turn once its session is free: `held` if it was free at once, else
    /// `queued` (its place in the session's queue, taken by [`Agent::turn`]).
    async fn turn_queued(
        &self,
        provider: &dyn Provider,
        req: &TurnRequest,
        held: Option<tokio::sync::OwnedMutexGuard<()>>,
        queued: std::pin::Pin<&mut impl std::future::Future<Output = tokio::sync::OwnedMutexGuard<()>>>,
    ) -> Result<TurnReport, TurnError> {
        // The session first, then a slot: turns queued on one busy chat must not
        // hold slots that other sessions (the heartbeat, jobs) need.
        let _in_session = match held {
            Some(guard) => guard,
            None => tokio::select! {
                g = queued => g,
                _ = req.cancel.cancelled() => return Err(TurnError::Cancelled),
            },
        };
        let _slot = tokio::select! {
            s = self.turn_slots.acquire() => s.map_err(|_| TurnError::Cancelled)?,
            _ = req.cancel.cancelled() => return Err(TurnError::Cancelled),
        };
        self.turn_locked(provider, req).await
    }

    async fn turn_locked(&self, provider: &dyn Provider, req: &TurnRequest) -> Result<TurnReport, TurnError> {
        let session_err = |source| TurnError::Session { key: req.conversation.session_key.clone(), source };
        let mut model = req.model.clone().unwrap_or_else(|| self.session_model(&req.conversation.session_key));
        // Voice notes become text, photos image parts (or references for a blind model).
        let mut input = tokio::select! {
            r = self.prepare_input(req) => r?,
            _ = req.cancel.cancelled() => return Err(TurnError::Cancelled),
        };
        if !input.images.is_empty() {
            match (&self.settings.vision_model, self.settings.vision) {
                (Some(vision), _) => model = vision.clone(),
                (None, true) => {}
                (None, false) => input.drop_images(),
            }
        }
        // MCP servers still in their first connection attempt: their tools belong in this turn.
        tokio::select! {
            () = self.tools.prepare() => {}
            _ = req.cancel.cancelled() => return Err(TurnError::Cancelled),
        }
        let mut messages = self.prompt(req, &input.text).await.map_err(session_err)?;
        if self.needs_consolidation(&req.conversation.session_key, &messages) {
            // Whether the session may write long-term memory follows from its source (`[policy.*] memory`).
            let session = (
                req.conversation.session_key.as_str(),
                crate::tools::policy::Source::of(&req.conversation, req.in_job),
            );
            tokio::select! {
                () = self.auto_consolidate(provider, &model, session, &messages) => {}
                // Nothing is written before the summary is back: stopping here changes nothing.
                _ = req.cancel.cancelled() => return Err(TurnError::Cancelled),
            }
            messages = self.prompt(req, &input.text).await.map_err(session_err)?;
        }
        if let Some(user) = messages.last_mut() {
            user.images = input.images.clone();
        }
        // Everything from the user's message on is this turn's and will be saved.
        let turn_start = messages.len() - 1;
        // The turn's origin (and so what its tools may do) follows from its channel.
        let tool_ctx = req.tool_context();
        // Built per turn: MCP servers' tools come and go with their connections.
        let specs = self.tools.specs_for(tool_ctx.grant());
        let spec = LoopSpec {
            provider,
            tools: &self.tools,
            specs: &specs,
            model: &model,
            max_tokens: self.settings.max_tokens,
            temperature: self.settings.temperature,
            max_iterations: self.settings.max_iterations,
            limit_setting: "[agent] max_iterations",
            tool_ctx: &tool_ctx,
            label: &req.conversation.session_key,
            // Chats only: scheduled work reports through the outbox, never a status message.
            progress: if req.in_job { None } else { self.progress.as_deref() },
            vision: self.settings.vision || self.settings.vision_model.as_deref() == Some(model.as_str()),
        };
        let mut stats = LoopStats::default();
        let outcome = run_loop(&spec, &mut messages, &mut stats).await;
        if stats.blind {
            input.images.clear();
            input.blind = true;
        }
        let today = self.record_usage(&stats);
        let (text, end) = match outcome {
            Ok(done) => done,
            Err(LoopFail::Provider(e)) => return Err(e.into()),
            Err(LoopFail::Cancelled) => {
                if !self.inflight.is_shutting_down() {
                    // Stopped by the user: keep what was done, closed properly.
                    messages.push(Message::assistant("(stopped before finishing this turn)"));
                    let saved =
                        self.commit(&req.conversation.session_key, &mut messages, turn_start, stats.usage).await;
                    if let Err(e) = saved {
                        tracing::error!(session = %req.conversation.session_key, "cannot save the stopped turn: {e}");
                    }
                }
                return Err(TurnError::Cancelled);
            }
        };

        messages.push(Message::assistant(text.clone()));
        self.commit(&req.conversation.session_key, &mut messages, turn_start, stats.usage)
            .await
            .map_err(session_err)?;
        tracing::info!(
            session = %req.conversation.session_key, channel = %req.conversation.channel, model_calls = stats.model_calls,
            tool_calls = stats.tool_calls, input_tokens = stats.usage.input_tokens,
            output_tokens = stats.usage.output_tokens, "turn finished"
        );
        let mut text = text;
        if input.blind && self.told_blind_lock().insert(req.conversation.session_key.clone()) {
            text.push_str(
                "\n\n(This model cannot see images: it was given the photo's file name only. \
                 Set [agent] vision_model to a model that can see to have photos looked at.)",
            );
        }
        let budget = self.settings.daily_token_budget;
        if budget > 0 && !req.in_job && today.total() >= budget {
            text.push_str(&format!(
                "\n\n(Note: today's token budget is used up: {} of {budget} tokens. Scheduled jobs and triggers \
                 are paused until tomorrow; chats still work.)",
                today.total()
            ));
        }
        if let Some(route) = &stats.route {
            self.answered_lock().insert(req.conversation.session_key.clone(), route.clone());
            if let Some(footer) = footer(self.settings.model_footer, route) {
                text.push_str(&footer);
            }
        }
        let LoopStats { usage, model_calls, tool_calls, route, .. } = stats;
        Ok(TurnReport { text, end, usage, model_calls, tool_calls, route })
    }

    /// Append the turn (messages from `start` on) to its session in one
    /// durable write, on a blocking thread (it waits on `fsync`).
    async fn commit(&self, key: &str, messages: &mut Vec<Message>, start: usize, usage: Usage) -> std::io::Result<()> {
        let now = session::now_rfc3339();
        let last = messages.len() - 1;
        let to_save: Vec<StoredMessage> = messages
            .drain(start..)
            .enumerate()
            .map(|(i, mut message)| {
                // Images are this turn's only: history replays them as their inbox reference.
                message.images = Vec::new();
                StoredMessage { message, timestamp: now.clone(), usage: (start + i == last).then_some(usage) }
            })
            .collect();
        let (sessions, key) = (self.sessions.clone(), key.to_string());
        util::tasks::blocking(move || sessions.append_turn(&key, &to_save)).await
    }

    /// Add a run's usage to today's ledger (written within a minute); today's totals after it.
    fn record_usage(&self, stats: &LoopStats) -> DayUsage {
        if stats.model_calls == 0 {
            return self.usage.today();
        }
        self.usage.add(stats.usage, &stats.providers)
    }

    fn told_blind_lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.told_blind.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn answered_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, crate::provider::Route>> {
        self.answered.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `Err(Budget)` when today's usage has reached `[agent] daily_token_budget`.
    fn check_budget(&self) -> Result<(), TurnError> {
        let budget = self.settings.daily_token_budget;
        if budget == 0 {
            return Ok(());
        }
        let used = self.usage.today().total();
        if used >= budget {
            tracing::warn!(used, budget, "daily token budget used up: a scheduled or triggered turn was refused");
            return Err(TurnError::Budget { used, budget });
        }
        Ok(())
    }
}

/// The line an answer ends with to say which model gave it, per `[agent] model_footer`.
fn footer(setting: crate::config::ModelFooter, route: &crate::provider::Route) -> Option<String> {
    use crate::config::ModelFooter;
    match (setting, &route.fallback) {
        (ModelFooter::Never, _) | (ModelFooter::Fallback, None) => None,
        (_, Some(why)) => {
            let mut why: String = why.chars().take(200).collect();
            if why.len() < route.fallback.as_deref().map_or(0, str::len) {
                why.push('…');
            }
            Some(format!("\n\n_— {} answered (fallback: {why})_", route.label()))
        }
        (ModelFooter::Always, None) => Some(format!("\n\n_— {}_", route.label())),
    }
}

impl Agent {
    /// The messages of a turn's first model call.
    async fn prompt(&self, req: &TurnRequest, text: &str) -> std::io::Result<Vec<Message>> {
        // The system prompt lists the tools this turn is offered (`[policy.*]`).
        let system = self.system_prompt_with(self.tools.names_for(req.tool_context().grant())).await;
        let history = self.sessions.history(&req.conversation.session_key, self.settings.history_messages)?;
        Ok(self.context.build(system, history, text, &req.conversation, jiff::Timestamp::now()))
    }

    /// The system prompt, read from the workspace off the runtime thread: the
    /// files there are the agent's, and a slow disk must not stall the daemon.
    async fn system_prompt(&self) -> String {
        self.system_prompt_with(self.tools.names()).await
    }

    /// [`system_prompt`](Agent::system_prompt) naming `names` as the tools.
    async fn system_prompt_with(&self, names: Vec<String>) -> String {
        let context = self.context.clone();
        tokio::task::spawn_blocking(move || {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            context.system_prompt(&names)
        })
        .await
        .unwrap_or_else(|e| {
            tracing::error!("building the system prompt failed: {e}");
            String::new()
        })
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
