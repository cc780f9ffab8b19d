//! One turn, end to end: its place in its session's queue, its pending
//! record, a slot among the turns in flight, the prompt, the ReAct loop
//! ([`super::react`]), and the one append that commits it to the session.

use std::sync::Arc;

use super::input::{self, Input};
use super::pending::SYNC_AFTER;
use super::react::{run_loop, LoopFail, LoopSpec, LoopStats};
use super::session::{self, StoredMessage};
use super::sessions::{ActiveTurn, PendingGuard, SessionLock};
use super::usage::DayUsage;
use super::{Agent, TurnEnd, TurnError, TurnReport, TurnRequest};
use crate::config::ModelFooter;
use crate::provider::{Message, Provider, Route, Usage};
use crate::util;

impl Agent {
    /// Run one turn to the end. Turns of the same session queue up behind each other.
    pub async fn turn(&self, req: TurnRequest) -> Result<TurnReport, TurnError> {
        self.run_turn(req, None).await
    }

    /// A turn that decides whether there is anything to report (the
    /// heartbeat): it is offered `report(text)` and `nothing_to_report()`
    /// besides its tools, and a call of either ends it — [`TurnEnd::Reported`]
    /// with the report as the text, or [`TurnEnd::NothingToReport`] with
    /// `quiet` as the text (and in the session). A text answer ends it as any
    /// turn's does; the caller reads it as before.
    ///
    /// [`TurnEnd::Reported`]: super::TurnEnd::Reported
    /// [`TurnEnd::NothingToReport`]: super::TurnEnd::NothingToReport
    pub async fn decide(&self, req: TurnRequest, quiet: &str) -> Result<TurnReport, TurnError> {
        self.run_turn(req, Some(quiet)).await
    }

    /// A turn; a decision turn when `decide` holds its quiet reply.
    async fn run_turn(&self, req: TurnRequest, decide: Option<&str>) -> Result<TurnReport, TurnError> {
        let provider = Arc::clone(self.provider.get()?);
        if req.in_job {
            self.check_budget()?;
        }
        let _busy = self.inflight.enter();
        let _stoppable = ActiveTurn::new(&self.live, &req.conversation.session_key, &req.cancel);
        // Take this turn's place in its session's queue now, before anything
        // below waits: turns of one chat run in the order they came (the
        // pending record's write must not let a later message overtake).
        let session = SessionLock::new(&self.live, &req.conversation.session_key);
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
        let turn = self.turn_queued(provider.as_ref(), &req, decide, held, queued.as_mut());
        tokio::pin!(turn);
        let result = match &record {
            None => turn.await,
            Some(record) => tokio::select! {
                r = &mut turn => r,
                () = util::timer::sleep(SYNC_AFTER) => {
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
        decide: Option<&str>,
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
        self.turn_locked(provider, req, decide).await
    }

    async fn turn_locked(
        &self,
        provider: &dyn Provider,
        req: &TurnRequest,
        decide: Option<&str>,
    ) -> Result<TurnReport, TurnError> {
        let session_err = |source| TurnError::Session { key: req.conversation.session_key.clone(), source };
        let (model, mut input, mut messages) = self.prepare_turn(provider, req).await?;
        // Everything from the user's message on is this turn's and will be saved.
        let turn_start = messages.len() - 1;
        // The turn's origin (and so what its tools may do) follows from its channel.
        let tool_ctx = req.tool_context();
        // Built per turn: MCP servers' tools come and go with their connections.
        let mut specs = self.tools.specs_for(tool_ctx.grant());
        if decide.is_some() {
            specs.extend(super::decision::specs());
        }
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
            decide: decide.is_some(),
        };
        let mut stats = LoopStats::default();
        let outcome = run_loop(&spec, &mut messages, &mut stats).await;
        if stats.blind {
            input.images.clear();
            input.blind = true;
        }
        let today = self.record_usage(&stats);
        let (text, end) = match outcome {
            Ok((_, end @ TurnEnd::NothingToReport)) => (decide.unwrap_or_default().to_string(), end),
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
        let text = self.annotate(req, text, &input, today, stats.route.as_ref());
        let LoopStats { usage, model_calls, tool_calls, route, .. } = stats;
        Ok(TurnReport { text, end, usage, model_calls, tool_calls, route })
    }

    /// A turn's model, input and first prompt: voice notes transcribed,
    /// images placed, the session consolidated first if it grew too long.
    async fn prepare_turn(
        &self,
        provider: &dyn Provider,
        req: &TurnRequest,
    ) -> Result<(String, Input, Vec<Message>), TurnError> {
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
        Ok((model, input, messages))
    }

    /// The answer with what else the user must know: a blind model, a spent
    /// budget, who answered (`[agent] model_footer`).
    fn annotate(
        &self,
        req: &TurnRequest,
        mut text: String,
        input: &Input,
        today: DayUsage,
        route: Option<&Route>,
    ) -> String {
        if input.blind && self.live.tell_blind(&req.conversation.session_key) {
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
        if let Some(route) = route {
            self.live.set_answered(&req.conversation.session_key, route.clone());
            if let Some(footer) = footer(self.settings.model_footer, route) {
                text.push_str(&footer);
            }
        }
        text
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
    pub(super) fn record_usage(&self, stats: &LoopStats) -> DayUsage {
        if stats.model_calls == 0 {
            return self.usage.today();
        }
        self.usage.add(stats.usage, &stats.providers)
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
fn footer(setting: ModelFooter, route: &Route) -> Option<String> {
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
        // The window (and so the profile) first: asked of the server once per process.
        self.context.resolve_window().await;
        // The system prompt lists the tools this turn is offered (`[policy.*]`).
        let system = self.system_prompt_with(self.tools.names_for(req.tool_context().grant())).await;
        let history = self.sessions.history(&req.conversation.session_key, self.settings.history_messages)?;
        let messages = self.context.build(system, history, text, &req.conversation, jiff::Timestamp::now());
        Ok(self.fit_to_window(req, messages))
    }

    /// The system prompt, read from the workspace off the runtime thread: the
    /// files there are the agent's, and a slow disk must not stall the daemon.
    pub(super) async fn system_prompt(&self) -> String {
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
}
