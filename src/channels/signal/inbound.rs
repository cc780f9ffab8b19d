//! What one `receive` event does: skipped with a reason (our own, a replay,
//! a stranger, a spoofed number, not a message), acted on (a reaction or a
//! quoted reply to a reminder: Done / Snooze, the path Telegram's buttons
//! take, [`Reminders`]) or handed to the bus (see the channel's header).
//!
//! The envelope fields read are signal-cli's `MessageEnvelope` JSON:
//! `sourceNumber`, `sourceUuid`, `timestamp`, `dataMessage { message,
//! attachments, groupInfo.groupId, reaction, quote }`, `syncMessage`,
//! `editMessage`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::state::Seen;
use super::{Shared, Signal};
use crate::agent::SessionActivity;
use crate::bus::{Attachment, AttachmentKind, Channel, Conversation, InboundMessage, Principal, Target};
use crate::clients::signal::{Client, Event};
use crate::policy::pairing::{self, Attempt, Profile, Tries};
use crate::policy::signal::Verdict;
use crate::work::reminders::{Reminders, Snooze};

/// Strangers remembered for "logged once"; the set is cleared when full.
const MAX_STRANGERS: usize = 1024;
/// A typing indicator lasts 15 s in Signal; it is renewed before that.
const TYPING_EVERY: Duration = Duration::from_secs(10);
/// How long handing a message to a full bus may take before the reader stops.
const BUS_WAIT: Duration = Duration::from_secs(600);

/// The reader's state between events.
pub struct Handler {
    pub(super) signal: Signal,
    pub(super) seen: Seen,
    inbound: mpsc::Sender<InboundMessage>,
    agent: Arc<dyn SessionActivity>,
    stop: CancellationToken,
    strangers: HashSet<String>,
    typing: HashMap<String, tokio::task::JoinHandle<()>>,
    /// Strangers' last `/pair` tries.
    tries: Tries,
}

/// Who sent an envelope, as signal-cli says.
struct Sender {
    number: Option<String>,
    uuid: Option<String>,
}

impl Sender {
    fn of(env: &Value) -> Sender {
        let s = |k: &str| env[k].as_str().filter(|v| !v.is_empty()).map(str::to_string);
        // `source` is the deprecated field: a number when there is one, else the uuid.
        let legacy = s("source");
        let number = s("sourceNumber").or_else(|| legacy.clone().filter(|l| l.starts_with('+')));
        let uuid = s("sourceUuid").or_else(|| legacy.filter(|l| crate::bus::is_signal_uuid(l)));
        Sender { number, uuid }
    }

    /// Its name in logs and in the seen list.
    fn name(&self) -> &str {
        self.uuid.as_deref().or(self.number.as_deref()).unwrap_or("unknown")
    }
}

impl Handler {
    pub fn new(
        signal: Signal,
        seen: Seen,
        inbound: mpsc::Sender<InboundMessage>,
        agent: Arc<dyn SessionActivity>,
        stop: CancellationToken,
    ) -> Handler {
        let (strangers, typing) = (HashSet::new(), HashMap::new());
        Handler { signal, seen, inbound, agent, stop, strangers, typing, tries: Tries::default() }
    }

    pub fn client(&self) -> &Client {
        &self.signal.shared.client
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.signal.shared
    }

    /// Save the position and the seen list (on a blocking thread).
    pub async fn save(&self) {
        let (seen, dir) = (self.seen.clone(), self.shared().state_dir.clone());
        if let Err(e) = crate::util::tasks::blocking(move || seen.save(&dir)).await {
            tracing::error!(error = %e, "cannot save the Signal position; a message may be handled again");
        }
    }

    /// One event. `false`: stopping, or the bus is gone (or full for
    /// [`BUS_WAIT`]): the event's id is not taken, so it comes again.
    pub async fn event(&mut self, ev: Event) -> bool {
        let handled = self.handle(&ev.params).await;
        let Some(handled) = handled else { return false };
        if let Some(id) = ev.id {
            // Saved with the next message handled, or at the stop (receipts and typing do not write).
            self.seen.last_event_id = Some(id);
        }
        if let Some(key) = handled {
            self.seen.add(key);
            self.save().await;
        }
        true
    }

    /// `Some(Some(key))`: a message done with (handed over, acted on or
    /// refused), to remember; `Some(None)`: nothing for us; `None`: stopping.
    async fn handle(&mut self, params: &Value) -> Option<Option<String>> {
        let env = &params["envelope"];
        let Some(ts) = self.relevant(params) else { return Some(None) };
        let sender = Sender::of(env);
        let key = Seen::key(sender.name(), ts);
        if self.seen.contains(&key) {
            tracing::info!(key, "a Signal message that was handled already came again; skipped");
            return Some(None);
        }
        self.message(&sender, env).await?;
        Some(Some(key))
    }

    /// The timestamp of an envelope that may be for us; `None`: not a
    /// message (receipts, typing, calls, stories), ours, or malformed.
    fn relevant(&self, params: &Value) -> Option<i64> {
        let env = &params["envelope"];
        if !env.is_object() {
            tracing::warn!("a Signal event without an envelope was skipped");
            return None;
        }
        let ours = self.shared().account.as_deref();
        if let (Some(a), Some(b)) = (ours, params["account"].as_str()) {
            if a != b {
                return None; // another account's, on a multi-account daemon
            }
        }
        if env.get("syncMessage").is_some() {
            return None; // what we (or our other devices) sent: never input
        }
        if ours.is_some() && (env["sourceNumber"].as_str() == ours || env["source"].as_str() == ours) {
            return None; // our own account as sender: a loop
        }
        if env.get("editMessage").is_some() {
            tracing::info!("an edit of a Signal message was skipped (not a new command)");
            return None;
        }
        if !env["dataMessage"].is_object() {
            return None;
        }
        let ts = env["timestamp"].as_i64().or(env["dataMessage"]["timestamp"].as_i64());
        if ts.is_none() {
            tracing::warn!("a Signal message without a timestamp was skipped");
        }
        ts
    }

    /// A data message. `Some(())`: done with it (handed over, acted on or
    /// refused); `None`: stopping before it was handed over.
    async fn message(&mut self, sender: &Sender, env: &Value) -> Option<()> {
        let policy = self.signal.policy.clone();
        let (n, u) = (sender.number.clone(), sender.uuid.clone());
        let verdict = crate::util::tasks::blocking(move || policy.check(n.as_deref(), u.as_deref())).await;
        let id = match verdict {
            Verdict::Allowed(id) => id,
            Verdict::Stranger => {
                let data = &env["dataMessage"];
                let direct = data["groupInfo"].is_null() && data["groupV2"].is_null();
                match data["message"].as_str().and_then(|t| pairing::request(t, false)).filter(|_| direct) {
                    Some(code) => self.pair(sender, code).await,
                    None => self.stranger(sender.name()),
                }
                return Some(());
            }
            Verdict::Spoofed { number, pinned, uuid } => {
                tracing::warn!(
                    number,
                    pinned,
                    uuid,
                    "a Signal message from an allowed number with another account uuid was refused \
                     (a re-registered number? delete it from signal-pins.json to accept the new one)"
                );
                return Some(());
            }
        };
        let data = &env["dataMessage"];
        let group = data["groupInfo"]["groupId"].as_str();
        if let Some(g) = group.filter(|g| !self.signal.policy.group_allowed(g)) {
            self.stranger(&format!("group.{g}"));
            return Some(());
        }
        let chat = group.map(|g| format!("group.{g}")).unwrap_or_else(|| id.clone());
        let own_chats: Vec<&str> = match group {
            Some(_) => vec![chat.as_str()],
            None => [Some(id.as_str()), sender.number.as_deref()].into_iter().flatten().collect(),
        };
        if data["reaction"].is_object() {
            self.reaction(&chat, &own_chats, &data["reaction"]).await;
            return Some(());
        }
        let text = data["message"].as_str().unwrap_or_default().to_string();
        if let Some(action) = data["quote"]["id"].as_i64().and_then(|q| Action::from_reply(&text).map(|a| (q, a))) {
            if self.act(&chat, &own_chats, action.0, action.1).await {
                return Some(());
            }
        }
        let attachments = self.files(sender, group, data).await;
        if text.trim().is_empty() && attachments.is_empty() {
            tracing::info!(chat, "a Signal message with no text and no file was skipped");
            return Some(());
        }
        let text = cap(&text, self.signal.cfg.max_message_chars);
        self.hand_over(&chat, id, text, attachments).await
    }

    /// A stranger's `/pair <code>` in a direct message: only from an account
    /// uuid, never from a number bramble knows with another uuid (pinned in
    /// `allow_from`, or a paired user's); answered only while a Signal code
    /// is pending ([`pairing::stranger_try`]).
    async fn pair(&mut self, sender: &Sender, code: String) {
        let Some(uuid) = sender.uuid.clone() else {
            tracing::warn!(
                who = sender.name(),
                "a Signal /pair without an account uuid was ignored (only a uuid can pair)"
            );
            return;
        };
        if let Some(number) = sender.number.clone() {
            let policy = self.signal.policy.clone();
            let n = number.clone();
            let pinned = crate::util::tasks::blocking(move || policy.pinned(&n)).await;
            if let Some(pinned) = pinned.filter(|p| !p.eq_ignore_ascii_case(&uuid)) {
                tracing::warn!(
                    number,
                    pinned,
                    uuid,
                    "a Signal /pair from a pinned number with another uuid was refused"
                );
                return;
            }
        }
        let profile = Profile { username: None, number: sender.number.clone() };
        let (dir, who) = (self.shared().state_dir.clone(), Principal::Signal(uuid.to_ascii_lowercase()));
        let Attempt::Answer { text, paired } = pairing::stranger_try(&dir, &mut self.tries, code, &who, profile).await
        else {
            return;
        };
        if paired {
            self.signal.policy.add_paired(&uuid);
            self.strangers.remove(&uuid); // logged again if they are revoked
        }
        if let Err(e) = self.client().send(&uuid, &text, Vec::new()).await {
            tracing::warn!(error = %e, "cannot answer a Signal /pair");
        }
    }

    /// A reaction by an allowed person: 👍 / ✅ Done, 💤 / ⏰ Snooze, on one of our reports.
    async fn reaction(&mut self, chat: &str, own_chats: &[&str], r: &Value) {
        if r["isRemove"].as_bool() == Some(true) {
            return;
        }
        let emoji = r["emoji"].as_str().unwrap_or_default();
        let action = if emoji.starts_with('👍') || emoji.starts_with('✅') || emoji.starts_with('✔') {
            Action::Done
        } else if emoji.starts_with('💤') || emoji.starts_with('⏰') {
            Action::Snooze(Snooze::Minutes(60))
        } else {
            return;
        };
        let Some(ts) = r["targetSentTimestamp"].as_i64() else { return };
        self.act(chat, own_chats, ts, action).await;
    }

    /// Done / Snooze on our report sent at `ts`; the answer is sent to `chat`.
    async fn act(&mut self, chat: &str, own_chats: &[&str], ts: i64, action: Action) -> bool {
        let Some(reminders) = self.signal.reminders.clone() else { return false };
        let report = self.shared().reports.lock().ok().and_then(|r| r.find(own_chats, ts).cloned());
        let Some(report) = report else { return false };
        let conversation = Conversation::new(Channel::Signal, chat, format!("signal:{chat}"));
        let answer = apply(reminders, action, report.job, report.text, conversation).await;
        if let Err(e) = self.client().send(chat, &answer, Vec::new()).await {
            tracing::warn!(chat, error = %e, "cannot answer a Done / Snooze in Signal");
        }
        true
    }

    /// The message's files, saved to the workspace inbox (one that cannot be
    /// taken is logged and left out).
    async fn files(&mut self, sender: &Sender, group: Option<&str>, data: &Value) -> Vec<Attachment> {
        let mut out = Vec::new();
        let Some(list) = data["attachments"].as_array() else { return out };
        let from = sender.uuid.as_deref().or(sender.number.as_deref()).unwrap_or_default();
        for a in list {
            match super::deliver::fetch(self.shared(), &self.signal.workspace, a, from, group).await {
                Ok(att) => out.push(att),
                Err(why) => tracing::warn!("a Signal file was not taken: {why}"),
            }
        }
        out
    }

    async fn hand_over(&mut self, chat: &str, id: String, text: String, attachments: Vec<Attachment>) -> Option<()> {
        let conversation = Conversation::new(Channel::Signal, chat, format!("signal:{chat}"));
        let key = conversation.session_key.clone();
        let msg = InboundMessage {
            conversation,
            sender: id.clone(),
            principal: Principal::Signal(id),
            text,
            reply_to: Target::Signal(chat.to_string()),
            attachments,
        };
        let command = msg.text.trim_start().starts_with('/');
        let sent = crate::channels::inbox::hand_over(&self.inbound, msg, BUS_WAIT, &self.stop).await;
        if !sent {
            return None;
        }
        if !command {
            self.start_typing(chat, key);
        }
        Some(())
    }

    /// Log a stranger once (the set is cleared when full).
    fn stranger(&mut self, who: &str) {
        if self.strangers.len() >= MAX_STRANGERS {
            self.strangers.clear();
        }
        if self.strangers.insert(who.to_string()) {
            tracing::warn!(
                who,
                "a Signal message from someone not in [signal] allow_from (or a group not in [signal] groups) \
                 was ignored (logged once each)"
            );
        }
    }

    /// Show "typing…" in `chat` until its session has no turn running or queued.
    fn start_typing(&mut self, chat: &str, key: String) {
        self.typing.retain(|_, t| !t.is_finished());
        if self.typing.contains_key(chat) {
            return;
        }
        let (shared, agent, stop, chat_id) =
            (self.shared().clone(), self.agent.clone(), self.stop.clone(), chat.to_string());
        let task = tokio::spawn(async move {
            loop {
                if let Err(e) = shared.client.typing(&chat_id, false).await {
                    tracing::debug!(error = %e, "Signal typing failed");
                }
                if super::sleep_or_stop(TYPING_EVERY, &stop).await || !agent.session_busy(&key) {
                    let _ = shared.client.typing(&chat_id, true).await;
                    return;
                }
            }
        });
        self.typing.insert(chat.to_string(), task);
    }
}

/// Done or Snooze, on a blocking thread (the job store is files); what to tell the person.
async fn apply(reminders: Reminders, action: Action, job: String, text: String, conversation: Conversation) -> String {
    let now = jiff::Timestamp::now();
    crate::util::tasks::blocking(move || match action {
        Action::Done => reminders.done(&job, now),
        Action::Snooze(when) => reminders.snooze_in(&job, &text, conversation, when, now),
    })
    .await
    .unwrap_or_else(|e| format!("Nothing changed: {e}"))
}

/// What a reaction or a quoted reply asks of a report.
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
            ("done" | "✅" | "👍", None, None) => Some(Action::Done),
            ("snooze" | "💤", None, None) => Some(Action::Snooze(Snooze::Minutes(60))),
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

/// At most `max` characters, with a note when cut.
fn cap(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let cut: String = text.chars().take(max).collect();
    format!("{cut}\n[… the message was cut to {max} characters]")
}

/// The kind of a file by its content type.
pub(super) fn kind_of(mime: &str) -> AttachmentKind {
    if mime.starts_with("image/") {
        AttachmentKind::Image
    } else {
        AttachmentKind::File
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn replies_ask_for_done_or_snooze() {
        assert_eq!(Action::from_reply("Done."), Some(Action::Done));
        assert_eq!(Action::from_reply("snooze 10"), Some(Action::Snooze(Snooze::Minutes(10))));
        assert_eq!(Action::from_reply("snooze tomorrow"), Some(Action::Snooze(Snooze::Tomorrow)));
        assert_eq!(Action::from_reply("done with the dishes, what next?"), None);
    }

    #[test]
    fn the_sender_is_read_from_new_and_old_fields() {
        let s = Sender::of(&json!({"source": "+491", "sourceUuid": "7ccae375-cd51-4c82-8b1e-7be3280aa485"}));
        assert_eq!((s.number.as_deref(), s.name()), (Some("+491"), "7ccae375-cd51-4c82-8b1e-7be3280aa485"));
        let s = Sender::of(&json!({"source": "7ccae375-cd51-4c82-8b1e-7be3280aa485"}));
        assert!(s.number.is_none() && s.uuid.is_some());
    }
}
