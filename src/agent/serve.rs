//! Serving the bus: every inbound message becomes a turn and its answer a
//! message on the outbound queue; sub-agents' announcements are turned into
//! turns of the sessions that spawned them.
//!
//! [`BusServer`] is one task over an [`Agent`] (mini-redis's handler shape):
//! it owns the queues' ends while it runs, and hands what no turn took back
//! to the pending journal when it stops, so the next start reports it.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{commands, input, Agent, TurnError, TurnRequest};
use crate::bus::{InboundMessage, OutboundMessage};

/// The agent serving the bus.
pub struct BusServer {
    agent: Arc<Agent>,
}

impl Agent {
    /// Serve the bus until `cancel` fires or the inbound queue closes (see [`BusServer::run`]).
    pub async fn serve(
        self: Arc<Self>,
        inbound: mpsc::Receiver<InboundMessage>,
        outbound: mpsc::Sender<OutboundMessage>,
        cancel: CancellationToken,
    ) {
        BusServer::new(self).run(inbound, outbound, cancel.clone(), cancel).await
    }

    /// Serve the bus with a grace period (see [`BusServer::run`]).
    pub async fn serve_until(
        self: Arc<Self>,
        inbound: mpsc::Receiver<InboundMessage>,
        outbound: mpsc::Sender<OutboundMessage>,
        stop: CancellationToken,
        abort: CancellationToken,
    ) {
        BusServer::new(self).run(inbound, outbound, stop, abort).await
    }

    /// Turn sub-agent reports into turns (see [`BusServer::run_announcements`]).
    pub async fn run_announcements(
        self: Arc<Self>,
        outbound: mpsc::Sender<OutboundMessage>,
        cancel: CancellationToken,
    ) {
        BusServer::new(self).run_announcements(outbound, cancel).await
    }
}

/// The daemon's bus server as a service: [`BusServer::run`] over the bus's
/// two ends; the stop ends taking messages, the abort cancels running turns.
pub struct ServeBus {
    pub agent: Arc<Agent>,
    pub inbound: mpsc::Receiver<InboundMessage>,
    pub outbound: mpsc::Sender<OutboundMessage>,
}

impl ServeBus {
    pub async fn run(self, shutdown: crate::util::shutdown::Shutdown) {
        let (stop, abort) = (shutdown.stop_token().clone(), shutdown.abort_token().clone());
        BusServer::new(self.agent).run(self.inbound, self.outbound, stop, abort).await
    }
}

/// Sub-agents' reports turned into turns ([`BusServer::run_announcements`])
/// until the abort; answers go to `outbound`.
pub struct Announcements {
    agent: Arc<Agent>,
    outbound: mpsc::Sender<OutboundMessage>,
}

impl Announcements {
    /// `None` when the agent has no sub-agents (nothing would ever be announced).
    pub fn new(agent: Arc<Agent>, outbound: mpsc::Sender<OutboundMessage>) -> Option<Announcements> {
        agent.subagents.is_some().then_some(Announcements { agent, outbound })
    }

    pub async fn run(self, shutdown: crate::util::shutdown::Shutdown) {
        BusServer::new(self.agent).run_announcements(self.outbound, shutdown.abort_token().clone()).await
    }
}

impl BusServer {
    pub fn new(agent: Arc<Agent>) -> BusServer {
        BusServer { agent }
    }

    /// Serve the bus: every inbound message becomes a turn; its answer (or the
    /// reason there is none) goes to the message's reply target. `stop` ends
    /// taking messages; running turns go on until they finish or `abort` fires.
    /// Returns when the inbound queue closes or `stop` fires, after running turns end.
    pub async fn run(
        self,
        mut inbound: mpsc::Receiver<InboundMessage>,
        outbound: mpsc::Sender<OutboundMessage>,
        stop: CancellationToken,
        abort: CancellationToken,
    ) {
        // Turns started but not finished, bounded like the bus itself: when all
        // are taken, messages wait in the bounded queue instead of in memory here.
        let mut running = crate::util::tasks::run_bounded(&mut inbound, crate::bus::BUS_CAPACITY, &stop, |msg| {
            let agent = Arc::clone(&self.agent);
            let outbound = outbound.clone();
            let cancel = abort.child_token();
            async move { answer(&agent, msg, cancel, outbound).await }
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
            match self.agent.pending.begin(&msg.conversation, &input::with_references(&msg.text, &msg.attachments)) {
                Ok(id) => self.agent.pending.release(id),
                Err(e) => {
                    tracing::error!(session = %msg.conversation.session_key, "a message not answered before the stop is lost: {e}")
                }
            }
        }
        while running.join_next().await.is_some() {}
    }

    /// Turn sub-agent reports into turns of the sessions that spawned them;
    /// answers go to `outbound`. Run once per agent (the daemon, the CLI).
    pub async fn run_announcements(self, outbound: mpsc::Sender<OutboundMessage>, cancel: CancellationToken) {
        let agent = self.agent;
        let Some(hub) = agent.subagents.clone() else { return };
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
            let text = match agent.turn(req).await {
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
}

/// One inbound message: a slash command is answered at once — ahead of
/// the session's queue, as `/stop` must not wait behind the turn it stops —
/// anything else is a turn. The answer goes to the message's reply target.
async fn answer(
    agent: &Agent,
    msg: InboundMessage,
    cancel: CancellationToken,
    outbound: mpsc::Sender<OutboundMessage>,
) {
    let target = msg.reply_to;
    let text = if let Some(inv) = commands::parse(&msg.text) {
        commands::execute(agent, &msg.conversation, &inv).await
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
        match agent.turn(req).await {
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
