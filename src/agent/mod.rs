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
pub mod context;
pub mod memory;
pub mod pending;
pub mod session;
pub mod skills;
pub mod subagent;
pub mod usage;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, Notify, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::bus::{InboundMessage, OutboundMessage, Target};
use crate::provider::{ChatRequest, ChatResponse, Message, Provider, ProviderError, Role, ToolSpec, Usage};
use crate::tools::{ToolContext, ToolRegistry};
use context::{ContextBuilder, Origin};
use memory::Journal;
use pending::{PendingStore, PendingTurn};
use session::{SessionStore, StoredMessage};
use usage::{DayUsage, UsageLedger};

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
    pub session_key: String,
    pub channel: String,
    pub chat_id: String,
    pub text: String,
    /// Set for scheduled job runs: tools that would schedule more work refuse.
    pub in_job: bool,
    pub cancel: CancellationToken,
}

impl TurnRequest {
    /// A turn from the local terminal.
    pub fn cli(session_key: impl Into<String>, text: impl Into<String>) -> Self {
        TurnRequest {
            session_key: session_key.into(),
            channel: "cli".into(),
            chat_id: "direct".into(),
            text: text.into(),
            in_job: false,
            cancel: CancellationToken::new(),
        }
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
    /// The tools' specs, built once: they do not change while the agent lives.
    specs: Vec<ToolSpec>,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    turn_slots: Semaphore,
    inflight: InFlight,
    /// Cancel tokens of turns running or queued, by session (for `/stop`).
    active: Mutex<HashMap<String, Vec<(u64, CancellationToken)>>>,
    next_turn: std::sync::atomic::AtomicU64,
    /// The job store and zone, for `/jobs` and `/run` (set by `from_config`).
    jobs: Option<(crate::scheduler::JobStore, jiff::tz::TimeZone)>,
    /// `[exec]`, for the sandbox line of `/status` (unset: exec is off).
    exec: Option<crate::config::ExecConfig>,
    /// The daemon's scheduler, for `/run` (unset outside the daemon).
    scheduler: std::sync::OnceLock<crate::scheduler::SchedulerHandle>,
    journal: Journal,
    usage: UsageLedger,
    pending: PendingStore,
    /// Per-session model overrides (`/model`), in memory: a restart goes back to the configured model.
    models: Mutex<HashMap<String, String>>,
    subagents: Option<Arc<subagent::Hub>>,
}

impl Agent {
    /// An agent. `provider` is `Err(reason)` when none is configured: turns then
    /// fail with that reason, everything else (exec jobs, status) still works.
    pub fn new(
        provider: Result<Arc<dyn Provider>, String>,
        tools: ToolRegistry,
        sessions: SessionStore,
        context: ContextBuilder,
        settings: AgentSettings,
    ) -> Agent {
        let state_dir = sessions.state_dir().to_path_buf();
        Agent {
            provider,
            specs: tools.specs(),
            tools,
            journal: Journal::new(context.workspace(), context.timezone().clone()),
            usage: UsageLedger::new(&state_dir, context.timezone().clone()),
            pending: PendingStore::new(&state_dir),
            sessions,
            context,
            settings,
            locks: Mutex::new(HashMap::new()),
            turn_slots: Semaphore::new(MAX_CONCURRENT_TURNS),
            inflight: InFlight::default(),
            active: Mutex::new(HashMap::new()),
            next_turn: std::sync::atomic::AtomicU64::new(0),
            jobs: None,
            exec: None,
            scheduler: std::sync::OnceLock::new(),
            models: Mutex::new(HashMap::new()),
            subagents: None,
        }
    }

    /// Give the agent the job store (for `/jobs` and `/run`), with the zone times are shown in.
    pub fn with_jobs(mut self, store: crate::scheduler::JobStore, tz: jiff::tz::TimeZone) -> Agent {
        self.jobs = Some((store, tz));
        self
    }

    /// Give the agent `[exec]`, so `/status` can say which sandbox layers commands get.
    pub fn with_exec(mut self, exec: crate::config::ExecConfig) -> Agent {
        self.exec = Some(exec);
        self
    }

    /// The sandbox layers commands get, for `/status`; `None` when exec is off.
    pub fn sandbox_summary(&self) -> Option<String> {
        self.exec.as_ref().filter(|c| c.enabled).map(crate::sandbox::layers_summary)
    }

    /// The job store and display zone, if set.
    pub fn jobs(&self) -> Option<&(crate::scheduler::JobStore, jiff::tz::TimeZone)> {
        self.jobs.as_ref()
    }

    /// Let `/run` start jobs through the daemon's scheduler (set once, by `daemon::start`).
    pub fn set_scheduler(&self, handle: crate::scheduler::SchedulerHandle) {
        let _ = self.scheduler.set(handle);
    }

    /// The daemon's scheduler, if this agent runs in the daemon.
    pub fn scheduler(&self) -> Option<&crate::scheduler::SchedulerHandle> {
        self.scheduler.get()
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
        let _stoppable = ActiveTurn::new(self, &req.session_key, &req.cancel);
        // The user's message survives a crash from here on (chat turns only:
        // jobs have their own run records).
        let record = if req.in_job {
            None
        } else {
            match self.pending.begin(&req.session_key, &req.channel, &req.chat_id, &req.text) {
                Ok(path) => Some(path),
                Err(e) => {
                    tracing::warn!(session = %req.session_key, "cannot record the turn as pending: {e}");
                    None
                }
            }
        };
        // Dropped unfinished (the turn's future abandoned): the record stays for the next start.
        let record = record.map(|path| PendingGuard { store: &self.pending, path });
        let result = self.turn_queued(provider.as_ref(), &req).await;
        if let Some(record) = record {
            // Cut off by shutdown: the session is unchanged and the message stays pending.
            let keep = matches!(result, Err(TurnError::Cancelled)) && self.inflight.is_shutting_down();
            if !keep {
                self.pending.finish(&record.path);
            }
        }
        result
    }

    async fn turn_queued(&self, provider: &dyn Provider, req: &TurnRequest) -> Result<TurnReport, TurnError> {
        // The session first, then a slot: turns queued on one busy chat must not
        // hold slots that other sessions (the heartbeat, jobs) need.
        let session = SessionLock::new(self, &req.session_key);
        let _in_session = tokio::select! {
            g = session.lock.lock() => g,
            _ = req.cancel.cancelled() => return Err(TurnError::Cancelled),
        };
        let _slot = tokio::select! {
            s = self.turn_slots.acquire() => s.map_err(|_| TurnError::Cancelled)?,
            _ = req.cancel.cancelled() => return Err(TurnError::Cancelled),
        };
        self.turn_locked(provider, req).await
    }

    async fn turn_locked(&self, provider: &dyn Provider, req: &TurnRequest) -> Result<TurnReport, TurnError> {
        let session_err = |source| TurnError::Session { key: req.session_key.clone(), source };
        let model = self.session_model(&req.session_key);
        let mut messages = self.prompt(req).await.map_err(session_err)?;
        if self.needs_consolidation(&req.session_key, &messages) {
            tokio::select! {
                () = self.auto_consolidate(provider, &model, &req.session_key, &messages) => {}
                // Nothing is written before the summary is back: stopping here changes nothing.
                _ = req.cancel.cancelled() => return Err(TurnError::Cancelled),
            }
            messages = self.prompt(req).await.map_err(session_err)?;
        }
        // Everything from the user's message on is this turn's and will be saved.
        let turn_start = messages.len() - 1;
        // The turn's origin (and so what its tools may do) follows from its channel.
        let tool_ctx = ToolContext::new(&req.session_key, &req.channel, &req.chat_id, req.in_job, req.cancel.clone());
        let spec = LoopSpec {
            provider,
            tools: &self.tools,
            specs: &self.specs,
            model: &model,
            max_tokens: self.settings.max_tokens,
            temperature: self.settings.temperature,
            max_iterations: self.settings.max_iterations,
            limit_setting: "[agent] max_iterations",
            tool_ctx: &tool_ctx,
            label: &req.session_key,
        };
        let mut stats = LoopStats::default();
        let outcome = run_loop(&spec, &mut messages, &mut stats).await;
        let today = self.record_usage(&stats);
        let (text, end) = match outcome {
            Ok(done) => done,
            Err(LoopFail::Provider(e)) => return Err(e.into()),
            Err(LoopFail::Cancelled) => {
                if !self.inflight.is_shutting_down() {
                    // Stopped by the user: keep what was done, closed properly.
                    messages.push(Message::assistant("(stopped before finishing this turn)"));
                    let saved = self.commit(&req.session_key, &mut messages, turn_start, stats.usage);
                    if let Err(e) = saved {
                        tracing::error!(session = %req.session_key, "cannot save the stopped turn: {e}");
                    }
                }
                return Err(TurnError::Cancelled);
            }
        };

        messages.push(Message::assistant(text.clone()));
        self.commit(&req.session_key, &mut messages, turn_start, stats.usage).map_err(session_err)?;
        tracing::info!(
            session = %req.session_key, channel = %req.channel, model_calls = stats.model_calls,
            tool_calls = stats.tool_calls, input_tokens = stats.usage.input_tokens,
            output_tokens = stats.usage.output_tokens, "turn finished"
        );
        let mut text = text;
        let budget = self.settings.daily_token_budget;
        if budget > 0 && !req.in_job && today.total() >= budget {
            text.push_str(&format!(
                "\n\n(Note: today's token budget is used up: {} of {budget} tokens. Scheduled jobs and triggers \
                 are paused until tomorrow; chats still work.)",
                today.total()
            ));
        }
        let LoopStats { usage, model_calls, tool_calls } = stats;
        Ok(TurnReport { text, end, usage, model_calls, tool_calls })
    }

    /// Append the turn (messages from `start` on) to its session in one write.
    fn commit(&self, key: &str, messages: &mut Vec<Message>, start: usize, usage: Usage) -> std::io::Result<()> {
        let now = session::now_rfc3339();
        let last = messages.len() - 1;
        let to_save: Vec<StoredMessage> = messages
            .drain(start..)
            .enumerate()
            .map(|(i, message)| StoredMessage {
                message,
                timestamp: now.clone(),
                usage: (start + i == last).then_some(usage),
            })
            .collect();
        self.sessions.append_turn(key, &to_save)
    }

    /// Add a run's usage to today's ledger (one write); today's totals after it.
    fn record_usage(&self, stats: &LoopStats) -> DayUsage {
        if stats.model_calls == 0 {
            return self.usage.today();
        }
        self.usage.add(stats.usage).unwrap_or_else(|e| {
            tracing::warn!("cannot record token usage: {e}");
            self.usage.today()
        })
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

    /// Serve the bus: every inbound message becomes a turn; its answer (or the
    /// reason there is none) goes to the message's reply target. Returns when
    /// `cancel` fires or the inbound queue closes, after running turns end.
    pub async fn serve(
        self: Arc<Self>,
        inbound: mpsc::Receiver<InboundMessage>,
        outbound: mpsc::Sender<OutboundMessage>,
        cancel: CancellationToken,
    ) {
        self.serve_until(inbound, outbound, cancel.clone(), cancel).await
    }

    /// Like [`serve`](Agent::serve), with a grace period: `stop` ends taking
    /// messages, running turns go on until they finish or `abort` fires.
    pub async fn serve_until(
        self: Arc<Self>,
        mut inbound: mpsc::Receiver<InboundMessage>,
        outbound: mpsc::Sender<OutboundMessage>,
        stop: CancellationToken,
        abort: CancellationToken,
    ) {
        // Turns started but not finished, bounded like the bus itself: when all
        // are taken, messages wait in the bounded queue instead of in memory here.
        let started = Arc::new(Semaphore::new(crate::bus::BUS_CAPACITY));
        let mut running = JoinSet::new();
        loop {
            let permit = tokio::select! {
                p = started.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
                _ = stop.cancelled() => break,
            };
            let msg = tokio::select! {
                m = inbound.recv() => match m { Some(m) => m, None => break },
                _ = stop.cancelled() => break,
                Some(_) = running.join_next(), if !running.is_empty() => continue,
            };
            let agent = Arc::clone(&self);
            let outbound = outbound.clone();
            // Commands are answered here, ahead of the session's queue: `/stop` must
            // not wait behind the turn it stops.
            if let Some(inv) = commands::parse(&msg.text) {
                let (key, target) = (msg.session_key, msg.reply_to);
                let name = inv.name.to_string();
                let args = inv.args.to_string();
                running.spawn(async move {
                    let _permit = permit;
                    let inv = commands::Invocation { name: &name, args: &args };
                    let text = commands::execute(&agent, &key, &inv).await;
                    if outbound.send(OutboundMessage { target, text }).await.is_err() {
                        tracing::warn!("outbound queue closed; a command's answer was dropped");
                    }
                });
                continue;
            }
            let req = TurnRequest {
                session_key: msg.session_key,
                channel: msg.channel,
                chat_id: msg.chat_id,
                text: msg.text,
                in_job: false,
                cancel: abort.child_token(),
            };
            let target = msg.reply_to;
            running.spawn(async move {
                let _permit = permit;
                let text = match agent.turn(req).await {
                    Ok(report) => report.text,
                    Err(TurnError::Cancelled) => return,
                    Err(e) => format!("Sorry, I could not answer: {e}"),
                };
                if outbound.send(OutboundMessage { target, text }).await.is_err() {
                    tracing::warn!("outbound queue closed; an answer was dropped");
                }
            });
        }
        // Messages a channel handed over (and may have confirmed to its server)
        // that no turn took: kept as pending records, so the next start tells the
        // user (or answers them) instead of losing them.
        inbound.close();
        while let Ok(msg) = inbound.try_recv() {
            if commands::parse(&msg.text).is_some() {
                continue;
            }
            match self.pending.begin(&msg.session_key, &msg.channel, &msg.chat_id, &msg.text) {
                Ok(path) => self.pending.release(&path),
                Err(e) => {
                    tracing::error!(session = %msg.session_key, "a message not answered before the stop is lost: {e}")
                }
            }
        }
        while running.join_next().await.is_some() {}
    }
}

/// A turn's entry in the agent's table of stoppable turns, removed on drop.
struct ActiveTurn<'a> {
    agent: &'a Agent,
    key: String,
    id: u64,
}

impl<'a> ActiveTurn<'a> {
    fn new(agent: &'a Agent, key: &str, cancel: &CancellationToken) -> Self {
        let id = agent.next_turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        agent.active_lock().entry(key.to_string()).or_default().push((id, cancel.clone()));
        ActiveTurn { agent, key: key.to_string(), id }
    }
}

impl Drop for ActiveTurn<'_> {
    fn drop(&mut self) {
        let mut active = self.agent.active_lock();
        if let Some(list) = active.get_mut(&self.key) {
            list.retain(|(id, _)| *id != self.id);
            if list.is_empty() {
                active.remove(&self.key);
            }
        }
    }
}

/// A turn's pending record, released (kept on disk for the next start) when
/// the turn ends without [`PendingStore::finish`].
struct PendingGuard<'a> {
    store: &'a PendingStore,
    path: std::path::PathBuf,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.store.release(&self.path);
    }
}

/// A session's turn lock, taken from the agent's map and given back on drop
/// (on every path, cancellation included), so the map holds only live sessions.
struct SessionLock<'a> {
    agent: &'a Agent,
    key: String,
    lock: Arc<tokio::sync::Mutex<()>>,
}

impl<'a> SessionLock<'a> {
    fn new(agent: &'a Agent, key: &str) -> Self {
        let mut locks = agent.locks.lock().unwrap_or_else(|p| p.into_inner());
        let lock = Arc::clone(locks.entry(key.to_string()).or_default());
        SessionLock { agent, key: key.to_string(), lock }
    }
}

impl Drop for SessionLock<'_> {
    fn drop(&mut self) {
        let mut locks = self.agent.locks.lock().unwrap_or_else(|p| p.into_inner());
        // One reference in the map, one here: nobody else holds or waits for it.
        if Arc::strong_count(&self.lock) == 2 {
            locks.remove(&self.key);
        }
    }
}

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
}

/// What a loop spent, kept even when it fails.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct LoopStats {
    pub usage: Usage,
    pub model_calls: u32,
    pub tool_calls: u32,
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
        };
        let response: ChatResponse = tokio::select! {
            r = spec.provider.chat(request) => r.map_err(LoopFail::Provider)?,
            _ = cancel.cancelled() => return Err(LoopFail::Cancelled),
        };
        stats.model_calls += 1;
        stats.usage.add(response.usage);

        if !response.tool_calls.is_empty() {
            rounds += 1;
            let calls = response.tool_calls;
            let content = response.content.filter(|c| !c.trim().is_empty());
            messages.push(Message::assistant_tool_calls(content, calls.clone()));
            for (i, call) in calls.iter().enumerate() {
                if cancel.is_cancelled() {
                    // Every call gets a result, so the saved turn has no orphan call.
                    for c in &calls[i..] {
                        messages.push(Message::tool_result(
                            &c.id,
                            &c.function.name,
                            "Error: not run: the turn was stopped",
                        ));
                    }
                    return Err(LoopFail::Cancelled);
                }
                stats.tool_calls += 1;
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
            }
            if cancel.is_cancelled() {
                return Err(LoopFail::Cancelled);
            }
            continue;
        }

        let text = response.content.unwrap_or_default();
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

/// How much of a session a consolidation keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keep {
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
        }
    }
}

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
}

impl std::fmt::Display for SessionStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "model: {}", self.model)?;
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
        Ok(())
    }
}

impl Agent {
    /// The messages of a turn's first model call.
    async fn prompt(&self, req: &TurnRequest) -> std::io::Result<Vec<Message>> {
        let system = self.system_prompt().await;
        let history = self.sessions.history(&req.session_key, self.settings.history_messages)?;
        let origin = Origin { channel: &req.channel, chat_id: &req.chat_id };
        Ok(self.context.build(system, history, &req.text, origin, jiff::Timestamp::now()))
    }

    /// The system prompt, read from the workspace off the runtime thread: the
    /// files there are the agent's, and a slow disk must not stall the daemon.
    async fn system_prompt(&self) -> String {
        let context = self.context.clone();
        let names = self.tools.names();
        tokio::task::spawn_blocking(move || context.system_prompt(&names)).await.unwrap_or_else(|e| {
            tracing::error!("building the system prompt failed: {e}");
            String::new()
        })
    }

    /// Whether the prompt passes `[agent] context_tokens`, or the session has
    /// more messages than the history window holds (they would drop out of the
    /// prompt without being remembered).
    fn needs_consolidation(&self, key: &str, prompt: &[Message]) -> bool {
        let count = self.sessions.load(key).map(|s| s.messages.len() + s.skipped).unwrap_or(0);
        let estimate = memory::estimate_tokens(prompt) + memory::estimate_spec_tokens(&self.specs);
        count > self.settings.history_messages || estimate > self.settings.context_tokens
    }

    /// Consolidate the older part of a session before a turn. Failures are
    /// logged; the turn goes on with the session as it is.
    async fn auto_consolidate(&self, provider: &dyn Provider, model: &str, key: &str, prompt: &[Message]) {
        // What every prompt carries besides the history: system prompt, tools, runtime context, the new text.
        let fixed = prompt.first().map_or(0, |m| memory::estimate_tokens(std::slice::from_ref(m)))
            + prompt.iter().rev().take(2).map(|m| memory::estimate_tokens(std::slice::from_ref(m))).sum::<usize>()
            + memory::estimate_spec_tokens(&self.specs);
        let keep = Keep::Recent {
            messages: (self.settings.history_messages / 2).max(1),
            tokens: self.settings.context_tokens.saturating_sub(fixed) / 2,
        };
        tracing::info!(session = %key, "consolidating the session's older part");
        match self.consolidate_locked(Some(provider), model, key, keep).await {
            Ok(c) => tracing::info!(session = %key, "{c}"),
            Err(e) => tracing::error!(session = %key, "consolidation failed, the session is unchanged: {e}"),
        }
    }

    /// Estimated tokens of what every prompt carries: the system prompt and the tool specs.
    async fn base_prompt_tokens(&self) -> usize {
        memory::estimate_tokens(&[Message::system(self.system_prompt().await)])
            + memory::estimate_spec_tokens(&self.specs)
    }

    /// Summarise the part of the session before the boundary `keep` picks and
    /// replace it by a checkpoint (no checkpoint for [`Keep::Nothing`]). The
    /// caller holds the session's lock.
    async fn consolidate_locked(
        &self,
        provider: Option<&dyn Provider>,
        model: &str,
        key: &str,
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
        let workspace = self.context.workspace().to_path_buf();
        let current = {
            let workspace = workspace.clone();
            tokio::task::spawn_blocking(move || memory::read_memory(&workspace)).await.unwrap_or_default()
        };
        let result = match provider {
            Some(p) => {
                let summary = memory::summarise(p, model, self.settings.max_tokens, &current, chunk).await;
                let stats = LoopStats { usage: summary.usage, model_calls: 1, tool_calls: 0 };
                self.record_usage(&stats);
                summary.result
            }
            None => Err(self.provider_problem().unwrap_or("no provider").to_string()),
        };
        let archived = session.checkpoint.as_ref().map_or(0, |c| c.archived) + boundary as u64;
        let journal_err = |e: std::io::Error| TurnError::Session {
            key: key.to_string(),
            source: std::io::Error::new(e.kind(), format!("cannot write {}: {e}", self.journal.path().display())),
        };
        // The journal first: once the old messages are in it, the session may drop them.
        let (checkpoint, outcome) = match result {
            Ok(saved) => {
                let cursor =
                    self.append_journal(key, "summary", saved.history_entry.trim()).await.map_err(journal_err)?;
                let update = saved.memory_update.clone();
                let written =
                    tokio::task::spawn_blocking(move || memory::apply_memory_update(&workspace, &current, &update))
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
                let cursor = self.append_journal(key, "raw", &raw).await.map_err(journal_err)?;
                (
                    memory::raw_checkpoint(boundary, archived, cursor),
                    Consolidation::Archived { messages: boundary, cursor, reason },
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

    /// Append to the history journal off the runtime thread (a command may hold a lock on it).
    async fn append_journal(&self, key: &str, kind: &'static str, content: &str) -> std::io::Result<u64> {
        let journal = self.journal.clone();
        let (key, content) = (key.to_string(), content.to_string());
        tokio::task::spawn_blocking(move || journal.append(&key, kind, &content))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)))
    }

    /// `/compact`: consolidate everything but the last turn now.
    pub async fn consolidate(&self, key: &str) -> Result<Consolidation, TurnError> {
        let lock = SessionLock::new(self, key);
        let _in_session = lock.lock.lock().await;
        let model = self.session_model(key);
        let provider = self.provider.as_ref().ok().cloned();
        self.consolidate_locked(provider.as_deref(), &model, key, Keep::Recent { messages: 1, tokens: 0 }).await
    }

    /// `/new`: consolidate the whole session into memory and start it afresh.
    /// Without a provider the messages are archived verbatim.
    pub async fn reset_session(&self, key: &str) -> Result<Consolidation, TurnError> {
        let lock = SessionLock::new(self, key);
        let _in_session = lock.lock.lock().await;
        let model = self.session_model(key);
        let provider = self.provider.as_ref().ok().cloned();
        self.consolidate_locked(provider.as_deref(), &model, key, Keep::Nothing).await
    }

    /// The model a session's turns use.
    pub fn session_model(&self, key: &str) -> String {
        let models = self.models.lock().unwrap_or_else(|p| p.into_inner());
        models.get(key).cloned().unwrap_or_else(|| self.settings.model.clone())
    }

    /// `/model [name]`: use `model` for this session's turns (until restart);
    /// `None` goes back to the configured one. Returns the model now in use.
    pub fn set_session_model(&self, key: &str, model: Option<&str>) -> String {
        let mut models = self.models.lock().unwrap_or_else(|p| p.into_inner());
        match model.map(str::trim).filter(|m| !m.is_empty()) {
            Some(m) if m != self.settings.model => {
                models.insert(key.to_string(), m.to_string());
            }
            _ => {
                models.remove(key);
            }
        }
        models.get(key).cloned().unwrap_or_else(|| self.settings.model.clone())
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
        Ok(SessionStatus {
            model: self.session_model(key),
            messages: session.messages.len() + session.skipped,
            consolidated: session.checkpoint.is_some(),
            estimated_tokens: self.base_prompt_tokens().await + memory::estimate_tokens(&history),
            context_tokens: self.settings.context_tokens,
            today: self.usage.today(),
            daily_budget: self.settings.daily_token_budget,
            subagents: self.subagents.as_ref().map_or(0, |h| h.running(Some(key))),
        })
    }

    /// Today's token usage (local date), all sessions.
    pub fn usage_today(&self) -> DayUsage {
        self.usage.today()
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

    /// Turn sub-agent reports into turns of the sessions that spawned them;
    /// answers go to `outbound`. Run once per agent (the daemon, the CLI).
    pub async fn run_announcements(
        self: Arc<Self>,
        outbound: mpsc::Sender<OutboundMessage>,
        cancel: CancellationToken,
    ) {
        let Some(hub) = self.subagents.clone() else { return };
        let Some(mut rx) = hub.take_announcements() else { return };
        loop {
            let a = tokio::select! {
                a = rx.recv() => match a { Some(a) => a, None => return },
                _ = cancel.cancelled() => return,
            };
            let req = TurnRequest {
                session_key: a.session_key.clone(),
                channel: a.channel.clone(),
                chat_id: a.chat_id.clone(),
                text: a.prompt(),
                in_job: true,
                cancel: cancel.child_token(),
            };
            let text = match self.turn(req).await {
                Ok(r) => Some(r.text),
                Err(TurnError::Cancelled) => None,
                // No turn (budget, provider down): the report itself goes out.
                Err(e) => Some(format!("Sub-agent `{}` finished:\n\n{}\n\n({e})", a.label, a.text)),
            };
            if let Some(text) = text {
                let target = Target::origin(&a.channel, &a.chat_id);
                if outbound.send(OutboundMessage { target, text }).await.is_err() {
                    tracing::warn!("outbound queue closed; a sub-agent report was dropped");
                }
            }
            hub.announced();
        }
    }

    /// Messages left unanswered by a process that died mid-turn (see
    /// [`pending`]): taken from the state directory, so each is handled once.
    /// `cli_only`: only those typed in a terminal (`bramble agent` takes these;
    /// the daemon takes all).
    pub fn take_unanswered(&self, cli_only: bool) -> Vec<PendingTurn> {
        self.pending.take_orphans(|r| !cli_only || r.channel == "cli")
    }

    /// Handle unanswered messages as `[agent] unanswered` says: `deliver` gets
    /// the notice for each (report), or the answer of running it again (rerun).
    pub async fn resolve_unanswered(
        &self,
        cli_only: bool,
        cancel: &CancellationToken,
        mut deliver: impl FnMut(Target, String),
    ) {
        for p in self.take_unanswered(cli_only) {
            tracing::warn!(session = %p.session_key, started = %p.started, "a message was left unanswered by an earlier stop");
            let text = match self.settings.unanswered {
                crate::config::Unanswered::Report => p.notice(self.context.timezone()),
                crate::config::Unanswered::Rerun => {
                    let req = TurnRequest {
                        session_key: p.session_key.clone(),
                        channel: p.channel.clone(),
                        chat_id: p.chat_id.clone(),
                        text: p.text.clone(),
                        in_job: false,
                        cancel: cancel.child_token(),
                    };
                    match self.turn(req).await {
                        Ok(r) => r.text,
                        Err(TurnError::Cancelled) => continue,
                        Err(e) => format!("{}\n(Running it again failed: {e})", p.notice(self.context.timezone())),
                    }
                }
            };
            deliver(p.target(), text);
        }
    }
}

impl Agent {
    /// The agent as the configuration describes it: provider, tools, sessions, context.
    ///
    /// Messages sent by the `message` tool go to `outbound`; `mqtt_publish`
    /// publishes through `mqtt` (the daemon's connection; `None` elsewhere).
    pub fn from_config(
        loaded: &crate::config::Loaded,
        outbound: mpsc::Sender<OutboundMessage>,
        mqtt: Option<Arc<dyn crate::delivery::Publisher>>,
    ) -> Agent {
        let c = &loaded.config;
        let ws = loaded.paths.workspace.clone();
        let provider = crate::provider::from_config(&c.provider).map_err(|e| e.to_string());
        if let Err(why) = &provider {
            tracing::warn!("LLM turns will fail: {why}");
        }
        let mut tools = ToolRegistry::new(c.agent.max_tool_result_chars);
        for tool in crate::tools::fs::fs_tools(&ws) {
            tools.register(tool);
        }
        if c.exec.enabled {
            crate::sandbox::protect(crate::sandbox::private_paths(loaded));
            tools.register(Arc::new(crate::tools::exec::ExecTool::new(c.exec.clone(), ws.clone())));
        }
        if c.web.enabled {
            match crate::tools::web::WebFetch::new(&c.web) {
                Ok(web) => tools.register(Arc::new(web)),
                Err(e) => tracing::warn!("web_fetch is unavailable: {e}"),
            }
        }
        let telegram_chats = crate::policy::AllowedChats::new(&c.telegram.allow_from, &loaded.paths.state_dir);
        tools.register(Arc::new(crate::tools::message::MessageTool::new(
            outbound.clone(),
            c.mqtt.publish_allow.clone(),
            telegram_chats.clone(),
        )));
        if c.mqtt.url.is_some() {
            tools.register(Arc::new(crate::tools::mqtt::MqttPublish::new(c.mqtt.publish_allow.clone(), mqtt)));
        }
        tools.register(Arc::new(crate::tools::cron::CronTool::new(
            crate::scheduler::JobStore::open(&loaded.paths.state_dir),
            c.timezone(),
            telegram_chats,
        )));
        let journal = Journal::new(&ws, c.timezone());
        tools.register(Arc::new(memory::MemorySearchTool::new(journal)));
        let (_, skill_errors) = skills::load(&ws);
        for e in &skill_errors {
            tracing::warn!("skill left out: {e}");
        }
        let context = ContextBuilder::new(
            ws,
            c.timezone(),
            context::ContextLimits {
                per_file_chars: c.agent.bootstrap_max_chars,
                total_chars: c.agent.bootstrap_total_chars,
            },
        );
        let settings = AgentSettings {
            model: c.model().to_string(),
            max_iterations: c.agent.max_iterations,
            max_tokens: c.agent.max_tokens,
            temperature: c.agent.temperature,
            history_messages: c.agent.history_messages,
            context_tokens: c.agent.context_tokens,
            daily_token_budget: c.agent.daily_token_budget,
            unanswered: c.agent.unanswered,
        };
        let inflight = InFlight::default();
        let hub = provider.as_ref().ok().map(|p| {
            let sub = subagent::SubagentSettings {
                model: settings.model.clone(),
                max_tokens: settings.max_tokens,
                temperature: settings.temperature,
                max_iterations: c.agent.subagent_max_iterations,
                max_running: c.agent.max_subagents,
            };
            let usage = UsageLedger::new(&loaded.paths.state_dir, c.timezone());
            let hub = subagent::Hub::new(
                Arc::clone(p),
                &tools,
                context.clone(),
                sub,
                outbound,
                usage,
                inflight.shutdown_token().clone(),
            );
            tools.register(Arc::new(subagent::SpawnTool::new(Arc::clone(&hub))));
            hub
        });
        let mut agent = Agent::new(provider, tools, SessionStore::new(&loaded.paths.state_dir), context, settings)
            .with_jobs(crate::scheduler::JobStore::open(&loaded.paths.state_dir), c.timezone().tz().clone())
            .with_exec(c.exec.clone());
        agent.inflight = inflight;
        agent.subagents = hub;
        agent
    }
}
