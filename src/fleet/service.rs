//! The fleet's task on one board: presence out, the others' presence in;
//! on a node, the primary's commands; on the primary, the nodes' reports and
//! answers, and the chat's `/on` and `/boards`. One task, one loop: the MQTT
//! router hands it the fleet's topics through a bounded queue, and on the
//! primary every inbound chat message passes through it on its way to the
//! agent (only `/on …` and `/boards` stop here).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::auth::{random_hex, Envelope, Guard, Signer};
use super::presence::{Boards, JobLine, Presence};
use super::topics::{self, FleetTopic};
use super::wire;
use crate::bus::{Channel, Conversation, InboundMessage, Principal, ReportSource, Target};
use crate::channels::mqtt::{FleetMessage, Link};
use crate::config::fleet::{BoardName, FleetRole};
use crate::delivery::Reports;
use crate::policy::AllowedChats;
use crate::scheduler::{JobStore, Placement};

/// Which targets a node's report may reach on the primary (its chats, as a
/// member's reminder may: `policy::standing::member_target`).
#[derive(Clone)]
pub struct Reach {
    pub chats: AllowedChats,
    pub publish_allow: Vec<String>,
}

/// A `/on` turn waiting for its board's answer.
struct Pending {
    board: BoardName,
    reply_to: Target,
    deadline: Instant,
    answered: bool,
}

/// The fleet's task, built and not started.
pub struct FleetService {
    pub(super) me: BoardName,
    pub(super) role: FleetRole,
    /// On a node: the board whose commands it takes.
    pub(super) primary: Option<BoardName>,
    pub(super) link: Arc<Link>,
    pub(super) signer: Signer,
    pub(super) guard: Guard,
    pub(super) messages: mpsc::Receiver<FleetMessage>,
    /// On the primary: the chat's messages, before the agent sees them.
    pub(super) chat_in: Option<mpsc::Receiver<InboundMessage>>,
    /// Where messages for the agent go (the agent's queue).
    pub(super) agent: mpsc::Sender<InboundMessage>,
    pub(super) jobs: JobStore,
    pub(super) jobs_changed: Arc<Notify>,
    pub(super) reports: Reports,
    pub(super) delivered: super::dedup::Delivered,
    pub(super) reach: Reach,
    pub(super) timeout: Duration,
    pub(super) capabilities: Vec<String>,
    /// On a node: the reports waiting for the primary's ack.
    pub(super) acks: super::relay::Acks,
    pub(super) boards: Boards,
    pending: HashMap<String, Pending>,
    /// Who polls the chat, when this board has one to share ([`super::standby`]).
    pub(super) seat: Option<super::standby::Seat>,
}

impl FleetService {
    pub(super) fn new(parts: super::Parts) -> FleetService {
        let super::Parts {
            me,
            role,
            primary,
            link,
            signer,
            guard,
            messages,
            chat_in,
            agent,
            jobs,
            jobs_changed,
            reports,
            delivered,
            reach,
            timeout,
            capabilities,
            acks,
        } = parts;
        FleetService {
            me,
            role,
            primary,
            link,
            signer,
            guard,
            messages,
            chat_in,
            agent,
            jobs,
            jobs_changed,
            reports,
            delivered,
            reach,
            timeout,
            capabilities,
            acks,
            boards: Boards::default(),
            pending: HashMap::new(),
            seat: None,
        }
    }

    /// Until the shutdown's stop.
    pub async fn run(self, shutdown: crate::util::shutdown::Shutdown) {
        let stop = shutdown.stop_token().clone();
        self.serve(stop).await
    }

    async fn serve(mut self, stop: CancellationToken) {
        self.publish_presence();
        loop {
            let next = self.pending.values().map(|p| p.deadline).min();
            let chat_at = self.seat.as_ref().and_then(|s| s.deadline);
            tokio::select! {
                m = self.messages.recv() => match m {
                    Some((topic, payload, retained)) => self.on_message(&topic, &payload, retained).await,
                    None => return,
                },
                m = recv_opt(&mut self.chat_in) => match m {
                    Some(msg) => self.on_chat(msg).await,
                    None => self.chat_in = None,
                },
                () = sleep_opt(next) => self.expire().await,
                () = sleep_opt(chat_at) => self.chat_decide(),
                () = super::standby::Seat::changed(&mut self.seat) => self.chat_confirmed(),
                () = self.jobs_changed.notified() => self.publish_presence(),
                () = stop.cancelled() => return,
            }
        }
    }

    fn now() -> i64 {
        jiff::Timestamp::now().as_second()
    }

    /// This board's retained presence (published again on every reconnect by the link).
    fn publish_presence(&self) {
        let jobs = match self.jobs.list() {
            Ok(list) => list
                .iter()
                .map(|j| JobLine {
                    name: j.name.clone(),
                    schedule: j.schedule.to_string(),
                    enabled: j.enabled,
                    next_run: j.state.next_run.map(|t| t.to_string()),
                })
                .collect(),
            Err(e) => {
                tracing::warn!("fleet: cannot read the jobs for the presence document: {e}");
                Vec::new()
            }
        };
        let p = Presence {
            board: self.me.clone(),
            role: self.role,
            version: env!("CARGO_PKG_VERSION").to_string(),
            capabilities: self.capabilities.clone(),
            since: jiff::Timestamp::now().to_string(),
            jobs,
            chat: self.seat.as_ref().is_some_and(|s| s.holding()),
        };
        match serde_json::to_vec(&p) {
            Ok(bytes) => self.link.set_retained(&topics::presence(&self.me), bytes),
            Err(e) => tracing::warn!("fleet: presence not published: {e}"),
        }
    }

    async fn on_message(&mut self, topic: &str, payload: &[u8], retained: bool) {
        let now = Self::now();
        if super::standby::board_of(topic).is_some() {
            return self.chat_doc(topic, payload);
        }
        let Some(t) = topics::parse(topic) else { return };
        match t {
            FleetTopic::Status(b) => {
                self.boards.status(&b, payload, now);
                if let Some(seat) = &mut self.seat {
                    seat.on_status(&b, payload == b"online", &self.boards);
                }
                // This node connected again, or its primary is back: the reports that waited go now.
                let primary = self.primary.as_ref();
                if payload == b"online" && primary.is_some() && (b == self.me || Some(&b) == primary) {
                    self.connected_again();
                }
                if payload == b"online" && Some(&b) == primary {
                    self.acks.back.notify_waiters();
                }
            }
            FleetTopic::Presence(b) => {
                if let Err(e) = self.boards.presence(&b, payload) {
                    tracing::warn!(topic, "fleet: ignored a presence document: {e}");
                }
            }
            _ if retained => tracing::warn!(topic, "fleet: ignored a retained command or report (it would replay)"),
            FleetTopic::Command(from, to) if to == self.me && self.primary.as_ref() == Some(&from) => {
                let primary = from.clone();
                match self.guard.open(topic, payload, |f| *f == primary, now) {
                    Ok(e) => self.on_command(e).await,
                    Err(err) => tracing::warn!(topic, "fleet: refused a command: {err}"),
                }
            }
            FleetTopic::Up(node) if self.primary.is_none() && node != self.me => {
                self.boards.heard_from(&node, now);
                match self.guard.open(topic, payload, |f| *f == node, now) {
                    Ok(e) => self.on_up(e).await,
                    Err(err) => tracing::warn!(topic, "fleet: refused a message from a node: {err}"),
                }
            }
            FleetTopic::Answer(node, id) if self.primary.is_none() => self.on_answer(&node, &id, payload).await,
            _ => tracing::debug!(topic, "fleet: not for this board"),
        }
    }

    /// Another board's (or our own) chat document: where its polling stands.
    fn chat_doc(&mut self, topic: &str, payload: &[u8]) {
        let Some(seat) = &mut self.seat else { return };
        match seat.on_doc(&self.signer, topic, payload, &self.boards) {
            Ok(()) => {}
            // The broker's echo of an earlier document of ours, or a late retained copy.
            Err(e @ super::standby::DocError::Older) => tracing::debug!(topic, "fleet: ignored a chat offset: {e}"),
            Err(e) => tracing::warn!(topic, "fleet: ignored a chat offset: {e}"),
        }
    }

    /// The end of a grace period: think again about who polls the chat.
    fn chat_decide(&mut self) {
        if let Some(seat) = &mut self.seat {
            seat.decide(&self.boards);
        }
    }

    /// This board's poller confirmed a batch (or started or stopped): the
    /// signed offset goes out retained; the presence says who holds the chat.
    fn chat_confirmed(&mut self) {
        let Some(seat) = &mut self.seat else { return };
        let Some((topic, payload, changed)) = seat.confirmed(&self.signer) else { return };
        self.link.set_retained(&topic, payload);
        seat.decide(&self.boards);
        if changed {
            self.publish_presence();
        }
    }

    /// A node, connected again: the reports for the primary that waited go now.
    fn connected_again(&self) {
        let mut n = 0;
        for name in super::relay::RELAYED {
            match self.reports.outbox().retry_now(name) {
                Ok(k) => n += k,
                Err(e) => tracing::warn!("fleet: {e}"),
            }
        }
        if n > 0 {
            tracing::info!(reports = n, "fleet: connected again: sending the reports for the primary that waited");
            self.reports.wake().notify_one();
        }
    }

    /// A node: one command of the primary's, checked.
    async fn on_command(&mut self, e: Envelope) {
        let reply = match e.kind.as_str() {
            wire::TURN => return self.remote_turn(&e),
            wire::ACK => {
                if !self.acks.acked(&e.id) {
                    tracing::debug!(key = e.id, "fleet: an ack for no waiting report");
                }
                return;
            }
            wire::CRON_ADD => self.cron_add(&e.body),
            wire::CRON_REMOVE => match serde_json::from_str::<wire::Remove>(&e.body) {
                Ok(r) => match self.jobs.remove(&r.id) {
                    Ok(j) => Ok(format!("removed job {} ({}) on {}", j.name, j.id, self.me)),
                    Err(err) => Err(err.to_string()),
                },
                Err(err) => Err(format!("not a cron.remove: {err}")),
            },
            other => Err(format!("unknown command `{other}`")),
        };
        if reply.is_ok() {
            self.publish_presence();
        }
        let (ok, text) = match reply {
            Ok(t) => (true, t),
            Err(t) => (false, t),
        };
        tracing::info!(kind = e.kind, ok, "fleet: {text}");
        self.send_up(wire::REPLY, &e.id, &wire::Reply { ok, text });
    }

    fn cron_add(&self, body: &str) -> Result<String, String> {
        let mut job: crate::scheduler::Job = serde_json::from_str(body).map_err(|e| format!("not a job: {e}"))?;
        match &job.placement {
            Placement::Board(b) if *b == self.me => {}
            // A job for any board: only where NATS can decide who runs each slot.
            Placement::Any if self.capabilities.iter().any(|c| c == super::once::CAPABILITY) => {}
            Placement::Any => {
                return Err(format!("{} has no [fleet] nats_url: it cannot take a job for any board", self.me))
            }
            other => return Err(format!("job `{}` is placed on `{other}`, not on {}", job.name, self.me)),
        }
        // The primary's owner made it; on this board it acts for the owner, within [policy.job].
        job.origin = None;
        let job = self.jobs.add(job).map_err(|e| e.to_string())?;
        Ok(format!("added job {} ({}) on {}", job.name, job.id, self.me))
    }

    /// A node: `/on <board> …` from the primary's chat, as one agent turn whose
    /// answer is published to `fleet/answer/<id>`.
    fn remote_turn(&self, e: &Envelope) {
        let Ok(turn) = serde_json::from_str::<wire::Turn>(&e.body) else {
            return tracing::warn!("fleet: a turn that is not one");
        };
        let answer = topics::answer(&self.me, &e.id);
        let msg = InboundMessage {
            conversation: Conversation::new(
                Channel::Mqtt,
                answer.clone(),
                format!("{}{}", crate::bus::FLEET_SESSION, e.from),
            ),
            sender: format!("fleet:{}", e.from),
            principal: Principal::Anonymous,
            text: cut(&turn.text),
            reply_to: Target::Mqtt(Some(answer)),
            attachments: Vec::new(),
        };
        if self.agent.try_send(msg).is_err() {
            tracing::warn!("fleet: the agent's queue is full: a /on turn was dropped");
        }
    }

    /// Sign and publish something for the primary (QoS 1, not waited for).
    fn send_up<T: serde::Serialize>(&self, kind: &str, id: &str, body: &T) {
        let Some(primary) = &self.primary else { return };
        let topic = topics::up(&self.me);
        let body = serde_json::to_string(body).unwrap_or_default();
        let e = self.signer.seal(&topic, &self.me, primary, kind, id, body);
        if let Err(err) = self.link.publish(&topic, serde_json::to_vec(&e).unwrap_or_default(), false) {
            tracing::warn!("fleet: {kind} not sent to {primary}: {err}");
        }
    }

    /// The primary: a node's signed message.
    async fn on_up(&mut self, e: Envelope) {
        match e.kind.as_str() {
            wire::REPORT => self.on_report(e).await,
            // Replies go to the CLI that asked (`bramble cron add --on`).
            wire::REPLY => tracing::debug!(from = %e.from, id = e.id, "fleet: a reply for the command line"),
            other => tracing::warn!(from = %e.from, "fleet: unknown message kind `{other}`"),
        }
    }

    /// A node's report: into this board's outbox once per key.
    async fn on_report(&mut self, e: Envelope) {
        let now = Self::now();
        let key = format!("{}:{}", e.from, e.id);
        if self.delivered.seen(&key, now) {
            tracing::info!(key, "fleet: a report delivered already: duplicate dropped");
            return self.ack(&e);
        }
        let body: wire::ReportBody = match serde_json::from_str(&e.body) {
            Ok(b) => b,
            Err(err) => return tracing::warn!(from = %e.from, "fleet: not a report: {err}"),
        };
        let target: Target = match body.target.parse() {
            Ok(t) => t,
            Err(err) => return tracing::warn!(from = %e.from, "fleet: a report's target: {err}"),
        };
        let reach = self.reach.clone();
        let t = target.clone();
        let allowed = crate::util::tasks::blocking(move || {
            crate::policy::standing::member_target(&t, &reach.chats, &reach.publish_allow).map_err(|e| e.to_string())
        })
        .await;
        if let Err(why) = allowed {
            return tracing::warn!(from = %e.from, %target, "fleet: a node's report refused: {why}");
        }
        let text = format!("[{}] {}", e.from, cut(&body.text));
        self.reports.send(&[target], &text, ReportSource::from(body.source.as_str())).await;
        let snapshot = self.delivered.remember(&key, now);
        if let Err(err) = crate::util::tasks::blocking(move || snapshot.write()).await {
            tracing::warn!(key, "fleet: cannot record a delivered report's key: {err}");
        }
        self.ack(&e);
    }

    /// The primary: tell a node its report is in our outbox (it stops sending it).
    fn ack(&self, report: &Envelope) {
        let topic = topics::command(&self.me, &report.from);
        let e = self.signer.seal(&topic, &self.me, &report.from, wire::ACK, &report.id, String::new());
        if let Err(err) = self.link.publish(&topic, serde_json::to_vec(&e).unwrap_or_default(), false) {
            tracing::warn!(node = %report.from, "fleet: ack not sent: {err}");
        }
    }

    /// The primary: a node's answer to a `/on` turn (only to a request of ours,
    /// from the board it went to: the id is 128 random bits).
    async fn on_answer(&mut self, node: &BoardName, id: &str, payload: &[u8]) {
        let Some(p) = self.pending.get_mut(id).filter(|p| &p.board == node) else {
            return tracing::warn!(%node, "fleet: an answer to no request of ours: ignored");
        };
        p.answered = true;
        let target = p.reply_to.clone();
        let text = format!("[{node}] {}", cut(&String::from_utf8_lossy(payload)));
        self.reports.send(&[target], &text, ReportSource::Agent).await;
    }

    /// Requests whose time is up: said in their chat; answered ones forgotten
    /// a while later (an answer can come in several messages).
    async fn expire(&mut self) {
        let now = Instant::now();
        let late: Vec<String> =
            self.pending.iter().filter(|(_, p)| p.deadline <= now).map(|(id, _)| id.clone()).collect();
        for id in late {
            let Some(p) = self.pending.remove(&id) else { continue };
            if !p.answered {
                let text = format!("No answer from {} within {} s.", p.board, self.timeout.as_secs());
                self.reports.send(&[p.reply_to], &text, ReportSource::Agent).await;
            }
        }
    }

    /// The primary: a chat message on its way to the agent.
    async fn on_chat(&mut self, msg: InboundMessage) {
        let trusted_chat = !matches!(msg.principal, Principal::Anonymous)
            && matches!(msg.conversation.channel, Channel::Telegram | Channel::Matrix | Channel::Email | Channel::Cli);
        let command = trusted_chat.then(|| super::chat::parse(&msg.text)).flatten();
        let Some(command) = command else {
            if self.agent.send(msg).await.is_err() {
                tracing::warn!("fleet: the agent's queue is closed");
            }
            return;
        };
        let answer = match command {
            super::chat::Command::Boards => self.boards.render(&self.me, Self::now()),
            super::chat::Command::On { board, .. } if board == self.me => {
                let text = super::chat::strip_on(&msg.text);
                let msg = InboundMessage { text, ..msg };
                let _ = self.agent.send(msg).await;
                return;
            }
            super::chat::Command::On { board, text } => match self.ask(&board, text, msg.reply_to.clone()) {
                Ok(()) => return,
                Err(why) => why,
            },
            super::chat::Command::Bad(why) => why,
        };
        self.reports.send(&[msg.reply_to], &answer, ReportSource::Agent).await;
    }

    /// Send a `/on` turn to `board`; `Err`: why not (said in the chat).
    fn ask(&mut self, board: &BoardName, text: String, reply_to: Target) -> Result<(), String> {
        if !self.boards.0.contains_key(board) {
            return Err(format!("No board `{board}` in the fleet (/boards lists them)."));
        }
        if !self.boards.is_online(board) {
            return Err(format!("{board} is offline: not sent (/boards says when it was last seen)."));
        }
        let id = random_hex(16);
        let topic = topics::command(&self.me, board);
        let body = serde_json::to_string(&wire::Turn { text }).map_err(|e| e.to_string())?;
        let e = self.signer.seal(&topic, &self.me, board, wire::TURN, &id, body);
        let bytes = serde_json::to_vec(&e).map_err(|e| e.to_string())?;
        self.link.publish(&topic, bytes, false).map_err(|e| format!("Not sent to {board}: {e}."))?;
        let deadline = Instant::now() + self.timeout;
        self.pending.insert(id, Pending { board: board.clone(), reply_to, deadline, answered: false });
        Ok(())
    }
}

/// A text cut to [`wire::MAX_TEXT`] characters.
fn cut(text: &str) -> String {
    text.chars().take(wire::MAX_TEXT).collect()
}

async fn recv_opt(rx: &mut Option<mpsc::Receiver<InboundMessage>>) -> Option<InboundMessage> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

async fn sleep_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
