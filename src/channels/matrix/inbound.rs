//! What one `/sync` batch does: invites taken or refused, rooms left,
//! encrypted rooms told once, and each new event handed to the bus, acted on
//! (Done / Snooze) or skipped with a reason (see the channel's header).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Matrix, Shared};
use crate::agent::SessionActivity;
use crate::bus::{Channel, Conversation, InboundMessage, Principal, Target};
use crate::clients::matrix::{Client, Event, JoinedRoom, Sync};
use crate::policy::matrix::{RoomRecord, Rooms};
use crate::policy::pairing;
use crate::work::reminders::Snooze;

/// Strangers remembered for "logged once"; the set is cleared when full.
const MAX_STRANGERS: usize = 1024;
/// Typing is announced for this long, and renewed before it runs out.
const TYPING_MS: u64 = 30_000;
const TYPING_EVERY: Duration = Duration::from_secs(20);
/// How long handing a message to a full bus may take before the batch stops.
const BUS_WAIT: Duration = Duration::from_secs(600);

/// What a batch came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing handed over or acted on (the position may wait to be saved).
    Quiet,
    /// Something was handled: save the position now.
    Handled,
    /// An invite could not be answered (the homeserver is away): keep the
    /// position and what was handled, sync the same batch again after a pause.
    Later,
    /// Stopping (or the bus is gone) before the batch was done.
    Stopped,
}

/// The poller's state between batches.
pub struct Handler {
    pub(super) matrix: Matrix,
    me: String,
    inbound: mpsc::Sender<InboundMessage>,
    agent: Arc<dyn SessionActivity>,
    stop: CancellationToken,
    strangers: HashSet<String>,
    typing: HashMap<String, tokio::task::JoinHandle<()>>,
    /// The last `/pair` try per user (one per [`crate::policy::pairing::TRY_GAP`]).
    pub(super) pair_tries: HashMap<String, std::time::Instant>,
    /// A Matrix pairing code is pending (as of this batch): strangers' invites are taken.
    pub(super) pairing_open: bool,
}

impl Handler {
    pub fn new(
        matrix: Matrix,
        me: String,
        inbound: mpsc::Sender<InboundMessage>,
        agent: Arc<dyn SessionActivity>,
        stop: CancellationToken,
    ) -> Handler {
        Handler {
            matrix,
            me,
            inbound,
            agent,
            stop,
            strangers: HashSet::new(),
            typing: HashMap::new(),
            pair_tries: HashMap::new(),
            pairing_open: false,
        }
    }

    pub fn client(&self) -> &Client {
        &self.matrix.shared.client
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.matrix.shared
    }

    /// Join `[matrix] rooms` (aliases resolved) and record them.
    pub async fn join_configured(&mut self) {
        let mut rooms = super::load_rooms(&self.shared().state_dir).await;
        let mut changed = false;
        for room in self.matrix.cfg.rooms.clone() {
            match self.client().join(&room).await {
                Ok(id) => {
                    let alias = room.starts_with('#').then_some(room.as_str());
                    let rec = rooms.rooms.entry(id).or_insert_with(|| super::configured(alias));
                    if rec.alias.is_none() && alias.is_some() {
                        rec.alias = alias.map(str::to_string);
                    }
                    changed = true;
                }
                Err(e) => tracing::error!(room, error = %e, "cannot join a room of [matrix] rooms"),
            }
        }
        if changed {
            super::save_rooms(&self.shared().state_dir, rooms).await;
        }
    }

    /// Handle one sync answer. `first`: the account's first sync (history is
    /// not handled). `handled`: ids already handled from this batch (a restart
    /// half way), grown as events are handled.
    pub async fn batch(&mut self, sync: &Sync, first: bool, handled: &mut Vec<String>) -> Outcome {
        let mut outcome = Outcome::Quiet;
        self.refresh_pairing().await;
        let mut rooms = super::load_rooms(&self.shared().state_dir).await;
        let before = rooms.clone();
        let mut later = false;
        for (room, invite) in &sync.rooms.invite {
            later |= !self.invite(room, &invite.invite_state.read(), &mut rooms).await;
        }
        for room in sync.rooms.leave.keys() {
            rooms.rooms.remove(room);
        }
        for (room, joined) in &sync.rooms.join {
            if !self.known(room, &mut rooms).await {
                continue;
            }
            self.encryption(room, joined, &mut rooms).await;
            if first {
                continue;
            }
            for event in joined.timeline.read() {
                if handled.contains(&event.event_id) {
                    continue;
                }
                match self.event(room, &event).await {
                    Some(true) => outcome = Outcome::Handled,
                    Some(false) => {}
                    None => {
                        if rooms != before {
                            super::save_rooms(&self.shared().state_dir, rooms).await;
                        }
                        return Outcome::Stopped;
                    }
                }
                handled.push(event.event_id.clone());
            }
        }
        if rooms != before {
            super::save_rooms(&self.shared().state_dir, rooms).await;
            outcome = Outcome::Handled;
        }
        if later {
            return Outcome::Later;
        }
        outcome
    }

    /// An invite: taken from an allowed user, refused from anyone else.
    /// `false`: the homeserver could not be reached; try the batch again.
    async fn invite(&mut self, room: &str, state: &[Event], rooms: &mut Rooms) -> bool {
        let inviter = state
            .iter()
            .find(|e| e.kind == "m.room.member" && e.state_key.as_deref() == Some(self.me.as_str()))
            .map(|e| e.sender.clone())
            .unwrap_or_default();
        if self.matrix.policy.allows(&inviter) {
            // Recorded first: a join that happened but whose answer was lost is still ours.
            rooms
                .rooms
                .insert(room.to_string(), RoomRecord { invited_by: Some(inviter.clone()), ..Default::default() });
            return match self.client().join(room).await {
                Ok(id) => {
                    tracing::info!(room = %id, inviter, "joined a Matrix room on an allowed user's invite");
                    true
                }
                Err(e) if e.is_retryable() => {
                    tracing::warn!(room, error = %e, "cannot join a Matrix room we were invited to yet; trying again");
                    false
                }
                Err(e) => {
                    tracing::warn!(room, error = %e, "cannot join a Matrix room we were invited to");
                    rooms.rooms.remove(room);
                    true
                }
            };
        }
        if self.pairing_open && !inviter.is_empty() {
            // Taken so that they can send the code; left again if they do not pair ([`Handler::known`]).
            rooms
                .rooms
                .insert(room.to_string(), RoomRecord { invited_by: Some(inviter.clone()), ..Default::default() });
            return match self.client().join(room).await {
                Ok(id) => {
                    tracing::warn!(room = %id, inviter, "joined a stranger's Matrix room: a pairing code is pending");
                    true
                }
                Err(e) => {
                    tracing::warn!(room, error = %e, "cannot join a Matrix room to pair in");
                    rooms.rooms.remove(room);
                    !e.is_retryable()
                }
            };
        }
        self.stranger(&inviter, "an invite");
        if let Err(e) = self.client().leave(room).await {
            tracing::warn!(room, error = %e, "cannot refuse a Matrix invite");
        }
        true
    }

    /// Whether `room` is one we should be in: recorded, or configured; any
    /// other is left (joined by someone else's doing, or its inviter is no
    /// longer allowed).
    async fn known(&mut self, room: &str, rooms: &mut Rooms) -> bool {
        let keep = match rooms.rooms.get(room) {
            Some(r) => r.invited_by.as_deref().is_none_or(|u| self.matrix.policy.allows(u) || self.pairing_open),
            None => self.matrix.cfg.rooms.iter().any(|r| r == room),
        };
        if keep {
            rooms.rooms.entry(room.to_string()).or_insert_with(|| super::configured(None));
            return true;
        }
        tracing::warn!(room, "leaving a Matrix room no allowed user invited bramble to");
        if let Err(e) = self.client().leave(room).await {
            tracing::warn!(room, error = %e, "cannot leave a Matrix room");
        }
        rooms.rooms.remove(room);
        false
    }

    /// An encrypted room: marked, and told once that the bot cannot read it.
    async fn encryption(&mut self, room: &str, joined: &JoinedRoom, rooms: &mut Rooms) {
        let encrypted =
            joined.state.read().iter().chain(joined.timeline.read().iter()).any(|e| e.kind == "m.room.encryption");
        let Some(rec) = rooms.rooms.get_mut(room) else { return };
        if !encrypted || rec.warned {
            return;
        }
        rec.encrypted = true;
        tracing::warn!(room, "a Matrix room is encrypted: bramble cannot read it (see docs/channels/matrix.md)");
        let content = json!({"msgtype": "m.notice", "body": ENCRYPTED_NOTICE});
        match self.client().send(room, "m.room.message", &self.shared().txn(), &content).await {
            Ok(_) => rec.warned = true,
            Err(e) => {
                tracing::warn!(room, error = %e, "cannot tell an encrypted Matrix room that bramble cannot read it")
            }
        }
    }

    /// One timeline event. `Some(true)`: handed over or acted on;
    /// `Some(false)`: skipped; `None`: stopping before it was handed over.
    async fn event(&mut self, room: &str, e: &Event) -> Option<bool> {
        if e.sender == self.me {
            return Some(false); // our own messages, fed back: never input
        }
        match e.kind.as_str() {
            "m.reaction" => Some(self.reaction(room, e).await),
            "m.room.message" => self.message(room, e).await,
            _ => Some(false),
        }
    }

    /// A reaction: ✅ / 👍 (Done) or ⏰ / 💤 (Snooze) on one of our job reports, by an allowed user.
    async fn reaction(&mut self, room: &str, e: &Event) -> bool {
        if !self.matrix.policy.allows(&e.sender) || e.rel_type() != Some("m.annotation") {
            return false;
        }
        let key = e.content["m.relates_to"]["key"].as_str().unwrap_or_default();
        let action = if key.starts_with('✅') || key.starts_with('✔') || key.starts_with('👍') {
            Action::Done
        } else if key.starts_with('⏰') || key.starts_with('💤') {
            Action::Snooze(Snooze::Minutes(60))
        } else {
            return false;
        };
        self.act(room, e.relates_to().unwrap_or_default(), action).await
    }

    /// Done / Snooze on the report `event_id` in `room`; the answer is posted as a notice.
    async fn act(&mut self, room: &str, event_id: &str, action: Action) -> bool {
        let Some(reminders) = self.matrix.reminders.clone() else { return false };
        let report = self.shared().reports.lock().ok().and_then(|r| r.find(room, event_id).cloned());
        let Some(report) = report else { return false };
        let conversation = Conversation::new(Channel::Matrix, room, format!("matrix:{room}"));
        let now = jiff::Timestamp::now();
        let answer = crate::util::tasks::blocking(move || match action {
            Action::Done => reminders.done(&report.job, now),
            Action::Snooze(when) => reminders.snooze_in(&report.job, &report.text, conversation, when, now),
        })
        .await;
        let text = answer.unwrap_or_else(|e| format!("Nothing changed: {e}"));
        let content = json!({"msgtype": "m.notice", "body": text,
                             "m.relates_to": {"m.in_reply_to": {"event_id": event_id}}});
        if let Err(e) = self.client().send(room, "m.room.message", &self.shared().txn(), &content).await {
            tracing::warn!(room, error = %e, "cannot answer a Done / Snooze in Matrix");
        }
        true
    }

    /// A room message: skipped with a reason, acted on, or handed to the bus.
    async fn message(&mut self, room: &str, e: &Event) -> Option<bool> {
        let pair =
            e.content["body"].as_str().filter(|_| e.rel_type().is_none()).and_then(|b| pairing::request(b, false));
        if let Some(code) = pair.filter(|_| e.content["msgtype"] == "m.text") {
            return Some(self.pair(room, &e.sender, code).await);
        }
        if !self.matrix.policy.allows(&e.sender) {
            self.stranger(&e.sender, "a message");
            return Some(false);
        }
        if e.is_redacted() {
            tracing::info!(room, event = %e.event_id, "a redacted Matrix message was skipped");
            return Some(false);
        }
        if e.rel_type() == Some("m.replace") {
            tracing::info!(room, event = %e.event_id, "an edit of a Matrix message was skipped (not a new command)");
            return Some(false);
        }
        let (Some(msgtype), Some(body)) = (e.content["msgtype"].as_str(), e.content["body"].as_str()) else {
            tracing::warn!(room, event = %e.event_id, "a malformed Matrix message (no msgtype or body) was skipped");
            return Some(false);
        };
        let mut attachments = Vec::new();
        let text = match msgtype {
            "m.text" | "m.emote" => strip_reply_fallback(body),
            "m.image" | "m.file" | "m.audio" | "m.video" => {
                match super::deliver::fetch(self.shared(), &self.matrix.workspace, &self.matrix.cfg, e).await {
                    Ok(a) => {
                        attachments.push(a);
                        String::new()
                    }
                    Err(why) => {
                        tracing::warn!(room, "a Matrix file was not taken: {why}");
                        self.notice(room, &format!("I could not take your file: {why}")).await;
                        return Some(false);
                    }
                }
            }
            // m.notice is what bots send: never a command (no bot-to-bot loops).
            "m.notice" => return Some(false),
            other => {
                tracing::info!(room, event = %e.event_id, "a Matrix message of type {other} was skipped");
                return Some(false);
            }
        };
        let reply_to = e.content["m.relates_to"]["m.in_reply_to"]["event_id"].as_str();
        if let Some(action) = reply_to.and_then(|_| Action::from_reply(&text)) {
            if self.act(room, reply_to.unwrap_or_default(), action).await {
                return Some(true);
            }
        }
        let text = cap(&text, self.matrix.cfg.max_message_chars);
        self.hand_over(room, e, text, attachments).await
    }

    async fn hand_over(
        &mut self,
        room: &str,
        e: &Event,
        text: String,
        attachments: Vec<crate::bus::Attachment>,
    ) -> Option<bool> {
        let conversation = Conversation::new(Channel::Matrix, room, format!("matrix:{room}"));
        let key = conversation.session_key.clone();
        let msg = InboundMessage {
            conversation,
            sender: e.sender.clone(),
            principal: Principal::Matrix(e.sender.clone()),
            text,
            reply_to: Target::Matrix(room.to_string()),
            attachments,
        };
        let command = msg.text.trim_start().starts_with('/');
        let sent = crate::channels::inbox::hand_over(&self.inbound, msg, BUS_WAIT, &self.stop).await;
        if !sent {
            return None;
        }
        if !command {
            self.start_typing(room, key);
        }
        Some(true)
    }

    pub(super) async fn notice(&self, room: &str, text: &str) {
        let content = json!({"msgtype": "m.notice", "body": text});
        if let Err(e) = self.client().send(room, "m.room.message", &self.shared().txn(), &content).await {
            tracing::warn!(room, error = %e, "cannot post a notice in Matrix");
        }
    }

    /// Log a stranger once (the set is cleared when full).
    fn stranger(&mut self, user: &str, what: &str) {
        if self.strangers.len() >= MAX_STRANGERS {
            self.strangers.clear();
        }
        if self.strangers.insert(user.to_string()) {
            tracing::warn!(
                user,
                "{what} from a Matrix user not in [matrix] allow_from was ignored (logged once per user)"
            );
        }
    }

    /// Show "typing…" in `room` until its session has no turn running or queued.
    fn start_typing(&mut self, room: &str, key: String) {
        self.typing.retain(|_, t| !t.is_finished());
        if self.typing.contains_key(room) {
            return;
        }
        let (shared, agent, stop) = (self.shared().clone(), self.agent.clone(), self.stop.clone());
        let (room_id, me) = (room.to_string(), self.me.clone());
        let task = tokio::spawn(async move {
            loop {
                if let Err(e) = shared.client.typing(&room_id, &me, true, TYPING_MS).await {
                    tracing::debug!(error = %e, "Matrix typing failed");
                }
                if super::sleep_or_stop(TYPING_EVERY, &stop).await || !agent.session_busy(&key) {
                    let _ = shared.client.typing(&room_id, &me, false, 0).await;
                    return;
                }
            }
        });
        self.typing.insert(room.to_string(), task);
    }
}

/// The message Matrix rooms with encryption get, once.
pub const ENCRYPTED_NOTICE: &str = "I cannot read this room: it is end-to-end encrypted, and bramble does not do \
     Matrix encryption. Talk to me in an unencrypted room instead: create a new room or direct chat with \
     encryption turned off (Element: + → New room, open \"Advanced\" / turn \"Enable end-to-end encryption\" off; \
     encryption cannot be turned off in an existing room), then invite me.";

/// What a reaction or a reply asks of a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Done,
    Snooze(Snooze),
}

impl Action {
    /// A reply `done`, `snooze`, `snooze 10`, `snooze tomorrow` (any case).
    fn from_reply(text: &str) -> Option<Action> {
        let t = text.trim().trim_end_matches(['.', '!']).to_lowercase();
        let mut words = t.split_whitespace();
        match (words.next()?, words.next(), words.next()) {
            ("done" | "✅", None, None) => Some(Action::Done),
            ("snooze" | "⏰", None, None) => Some(Action::Snooze(Snooze::Minutes(60))),
            ("snooze", Some("tomorrow"), None) => Some(Action::Snooze(Snooze::Tomorrow)),
            ("snooze", Some(m), None) => m
                .trim_end_matches("min")
                .parse::<u32>()
                .ok()
                .filter(|m| (1..=1440).contains(m))
                .map(|m| Action::Snooze(Snooze::Minutes(m))),
            _ => None,
        }
    }
}

/// A reply's body starts with the quoted original (`> <@a:x> …` lines, then a
/// blank line): only what follows is the message.
pub fn strip_reply_fallback(body: &str) -> String {
    if !body.starts_with("> ") {
        return body.to_string();
    }
    let mut lines = body.lines().skip_while(|l| l.starts_with('>'));
    match lines.next() {
        Some(l) if l.trim().is_empty() => lines.collect::<Vec<_>>().join("\n"),
        Some(l) => std::iter::once(l).chain(lines).collect::<Vec<_>>().join("\n"),
        None => String::new(),
    }
}

/// At most `max` characters, with a note when cut.
pub fn cap(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let cut: String = text.chars().take(max).collect();
    format!("{cut}\n[… the message was cut to {max} characters]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_lose_their_quote_and_long_bodies_are_cut() {
        assert_eq!(strip_reply_fallback("> <@a:x> the report\n> more\n\ndone"), "done");
        assert_eq!(strip_reply_fallback("plain\n> not a quote"), "plain\n> not a quote");
        let long = "é".repeat(50);
        let c = cap(&long, 10);
        assert!(c.starts_with(&"é".repeat(10)) && c.contains("cut to 10 characters"), "{c}");
        assert_eq!(cap("short", 10), "short");
    }

    #[test]
    fn replies_ask_for_done_or_snooze() {
        assert_eq!(Action::from_reply("Done."), Some(Action::Done));
        assert_eq!(Action::from_reply("snooze"), Some(Action::Snooze(Snooze::Minutes(60))));
        assert_eq!(Action::from_reply("snooze 10"), Some(Action::Snooze(Snooze::Minutes(10))));
        assert_eq!(Action::from_reply("snooze tomorrow"), Some(Action::Snooze(Snooze::Tomorrow)));
        assert_eq!(Action::from_reply("done with the dishes, what next?"), None);
        assert_eq!(Action::from_reply("snooze 99999"), None);
    }
}
