//! Serving the bus: every inbound message becomes a turn and its answer a
//! message on the outbound queue; at start, the messages a crash or power loss
//! left unanswered are reported or answered again; sub-agents' announcements
//! are turned into messages.

use super::*;

impl Agent {
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
        let mut running = crate::util::tasks::run_bounded(&mut inbound, crate::bus::BUS_CAPACITY, &stop, |msg| {
            let agent = Arc::clone(&self);
            let outbound = outbound.clone();
            let cancel = abort.child_token();
            async move { agent.answer(msg, cancel, outbound).await }
        })
        .await;
        // Messages a channel handed over (and may have confirmed to its server)
        // that no turn took: kept as pending records, so the next start tells the
        // user (or answers them) instead of losing them.
        inbound.close();
        while let Ok(msg) = inbound.try_recv() {
            if commands::parse(&msg.text).is_some() {
                continue;
            }
            match self.pending.begin(&msg.conversation, &input::with_references(&msg.text, &msg.attachments)) {
                Ok(id) => self.pending.release(id),
                Err(e) => {
                    tracing::error!(session = %msg.conversation.session_key, "a message not answered before the stop is lost: {e}")
                }
            }
        }
        while running.join_next().await.is_some() {}
    }

    /// One inbound message: a slash command is answered at once — ahead of
    /// the session's queue, as `/stop` must not wait behind the turn it stops —
    /// anything else is a turn. The answer goes to the message's reply target.
    async fn answer(&self, msg: InboundMessage, cancel: CancellationToken, outbound: mpsc::Sender<OutboundMessage>) {
        let target = msg.reply_to;
        let text = if let Some(inv) = commands::parse(&msg.text) {
            commands::execute(self, &msg.conversation, &inv).await
        } else {
            let req = TurnRequest {
                conversation: msg.conversation,
                text: msg.text,
                in_job: false,
                model: None,
                cancel,
                attachments: msg.attachments,
                principal: msg.principal,
            };
            match self.turn(req).await {
                Ok(report) => report.text,
                Err(TurnError::Cancelled) => return,
                Err(TurnError::Input(why)) => why,
                Err(e) => format!("Sorry, I could not answer: {e}"),
            }
        };
        if outbound.send(OutboundMessage::text(target, text)).await.is_err() {
            tracing::warn!("outbound queue closed; an answer was dropped");
        }
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
                model: None,
                conversation: a.conversation.clone(),
                text: a.prompt(),
                in_job: true,
                cancel: cancel.child_token(),
                attachments: Vec::new(),
                principal: a.principal.clone(),
            };
            let text = match self.turn(req).await {
                Ok(r) => Some(r.text),
                Err(TurnError::Cancelled) => None,
                // No turn (budget, provider down): the report itself goes out.
                Err(e) => Some(format!("Sub-agent `{}` finished:\n\n{}\n\n({e})", a.label, a.text)),
            };
            if let Some(text) = text {
                let target = a.conversation.reply_target();
                if outbound.send(OutboundMessage::text(target, text)).await.is_err() {
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
        self.pending.take_orphans(|r| !cli_only || r.conversation.channel == crate::bus::Channel::Cli)
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
            tracing::warn!(session = %p.conversation.session_key, started = %p.started, "a message was left unanswered by an earlier stop");
            let text = match self.settings.unanswered {
                crate::config::Unanswered::Report => p.notice(self.context.timezone()),
                crate::config::Unanswered::Rerun => {
                    let req = TurnRequest {
                        principal: crate::tools::presumed(&p.conversation),
                        model: None,
                        conversation: p.conversation.clone(),
                        text: p.text.clone(),
                        in_job: false,
                        cancel: cancel.child_token(),
                        attachments: Vec::new(),
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
