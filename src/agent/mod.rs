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
//! - A turn's messages reach the session file in one append when the turn
//!   ends; a failed or cancelled turn leaves the session as it was.

pub mod context;
pub mod session;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, Notify, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::bus::{InboundMessage, OutboundMessage};
use crate::provider::{ChatRequest, ChatResponse, Message, Provider, ProviderError, ToolSpec, Usage};
use crate::tools::{ToolContext, ToolRegistry};
use context::{ContextBuilder, Origin};
use session::{SessionStore, StoredMessage};

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
}

/// Counts work in flight so shutdown can give it a grace period: every turn
/// enters it, and the daemon's job runner adds reminders and exec jobs.
#[derive(Clone, Default)]
pub struct InFlight(Arc<(std::sync::atomic::AtomicUsize, Notify)>);

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
        Agent {
            provider,
            specs: tools.specs(),
            tools,
            sessions,
            context,
            settings,
            locks: Mutex::new(HashMap::new()),
            turn_slots: Semaphore::new(MAX_CONCURRENT_TURNS),
            inflight: InFlight::default(),
        }
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
        let _busy = self.inflight.enter();
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
        self.turn_locked(provider.as_ref(), &req).await
    }

    async fn turn_locked(&self, provider: &dyn Provider, req: &TurnRequest) -> Result<TurnReport, TurnError> {
        let session_err = |source| TurnError::Session { key: req.session_key.clone(), source };
        let history = self.sessions.history(&req.session_key, self.settings.history_messages).map_err(session_err)?;
        let specs = &self.specs;
        let names = self.tools.names();
        let origin = Origin { channel: &req.channel, chat_id: &req.chat_id };
        let mut messages = self.context.build(history, &req.text, origin, &names, jiff::Timestamp::now());
        // Everything from the user's message on is this turn's and will be saved.
        let turn_start = messages.len() - 1;
        let tool_ctx = ToolContext {
            session_key: req.session_key.clone(),
            channel: req.channel.clone(),
            chat_id: req.chat_id.clone(),
            in_job: req.in_job,
            cancel: req.cancel.clone(),
        };

        let mut usage = Usage::default();
        let mut model_calls = 0;
        let mut tool_calls = 0;
        let mut empty_answers = 0;
        let mut rounds = 0;
        let (text, end) = loop {
            if rounds >= self.settings.max_iterations {
                let n = self.settings.max_iterations;
                break (
                    format!(
                        "I stopped after {n} rounds of tool calls without reaching a final answer \
                         (the limit is [agent] max_iterations = {n}). Ask me to continue, or split the task."
                    ),
                    TurnEnd::MaxIterations,
                );
            }
            let request = ChatRequest {
                model: &self.settings.model,
                messages: &messages,
                tools: specs,
                max_tokens: self.settings.max_tokens,
                temperature: self.settings.temperature,
            };
            let response: ChatResponse = tokio::select! {
                r = provider.chat(request) => r?,
                _ = req.cancel.cancelled() => return Err(TurnError::Cancelled),
            };
            model_calls += 1;
            usage.add(response.usage);

            if !response.tool_calls.is_empty() {
                rounds += 1;
                let calls = response.tool_calls;
                let content = response.content.filter(|c| !c.trim().is_empty());
                messages.push(Message::assistant_tool_calls(content, calls.clone()));
                for call in &calls {
                    tool_calls += 1;
                    let outcome = self.tools.execute(call, &tool_ctx).await;
                    tracing::debug!(
                        session = %req.session_key, tool = %call.function.name, error = outcome.is_error,
                        "tool call finished"
                    );
                    messages.push(Message::tool_result(&call.id, &call.function.name, outcome.text));
                    if req.cancel.is_cancelled() {
                        return Err(TurnError::Cancelled);
                    }
                }
                continue;
            }

            let text = response.content.unwrap_or_default();
            if text.trim().is_empty() {
                empty_answers += 1;
                if empty_answers > EMPTY_ANSWER_RETRIES {
                    break (
                        "The model returned an empty answer several times in a row. Please try again or rephrase."
                            .to_string(),
                        TurnEnd::EmptyAnswer,
                    );
                }
                tracing::warn!(session = %req.session_key, attempt = empty_answers, "the model returned an empty answer; asking again");
                continue;
            }
            break (text.trim().to_string(), TurnEnd::Answered);
        };

        messages.push(Message::assistant(text.clone()));
        let now = session::now_rfc3339();
        let last = messages.len() - 1;
        let to_save: Vec<StoredMessage> = messages
            .drain(turn_start..)
            .enumerate()
            .map(|(i, message)| StoredMessage {
                message,
                timestamp: now.clone(),
                usage: (turn_start + i == last).then_some(usage),
            })
            .collect();
        let sessions = &self.sessions;
        sessions.append_turn(&req.session_key, &to_save).map_err(session_err)?;
        tracing::info!(
            session = %req.session_key, channel = %req.channel, model_calls, tool_calls,
            input_tokens = usage.input_tokens, output_tokens = usage.output_tokens,
            "turn finished"
        );
        Ok(TurnReport { text, end, usage, model_calls, tool_calls })
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
        while running.join_next().await.is_some() {}
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

impl Agent {
    /// The agent as the configuration describes it: provider, tools, sessions, context.
    ///
    /// Messages sent by the `message` tool go to `outbound`.
    pub fn from_config(loaded: &crate::config::Loaded, outbound: mpsc::Sender<OutboundMessage>) -> Agent {
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
            tools.register(Arc::new(crate::tools::exec::ExecTool::new(c.exec.clone(), ws.clone())));
        }
        if c.web.enabled {
            match crate::tools::web::WebFetch::new(&c.web) {
                Ok(web) => tools.register(Arc::new(web)),
                Err(e) => tracing::warn!("web_fetch is unavailable: {e}"),
            }
        }
        tools.register(Arc::new(crate::tools::message::MessageTool::new(outbound)));
        if c.mqtt.url.is_some() {
            tools.register(Arc::new(crate::tools::mqtt::MqttPublish::new(c.mqtt.publish_allow.clone())));
        }
        tools.register(Arc::new(crate::tools::cron::CronTool::new(
            crate::scheduler::JobStore::open(&loaded.paths.state_dir),
            c.timezone(),
        )));
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
        };
        Agent::new(provider, tools, SessionStore::new(&loaded.paths.state_dir), context, settings)
    }
}
