//! What one data frame's payload does: an event handed to the bus, a card
//! press acted on, or skipped with a reason (see the channel's header).
//! Every outcome but "later" is answered, so the server does not deliver
//! it again; "later" (the bus is full, or stopping) is left unanswered so
//! the server delivers it again, and nothing is lost.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::event::{self, CardAction, Envelope, Event, Message};
use super::files::FileInError;
use super::state::{State, StateFile};
use super::{deliver, Feishu};
use crate::bus::{Attachment, Channel, Conversation, InboundMessage, Principal, Target};
use crate::channels::telegram::buttons::{self, Action};
use crate::policy::pairing::{self, Attempt, Profile, Tries};

/// Strangers remembered for "logged once"; the set is cleared when full.
const MAX_STRANGERS: usize = 1024;
/// How long handing a message to a full bus may take before it is left for the server to deliver again.
const BUS_WAIT: Duration = Duration::from_secs(60);

/// What to answer a data frame with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Handled, skipped or refused: answered with HTTP-like `code` (and data for a card press's toast).
    Done { code: u16, data: Option<Value> },
    /// Not handled now: no answer, so the server delivers it again.
    Later,
}

impl Answer {
    const OK: Answer = Answer::Done { code: 200, data: None };
}

/// The channel's inbound state between frames.
pub struct Handler {
    pub(super) feishu: Feishu,
    /// The bot's own open_id, once known (loops; mentions in groups).
    pub(super) me: Option<String>,
    inbound: mpsc::Sender<InboundMessage>,
    stop: CancellationToken,
    pub(super) state: State,
    file: StateFile,
    strangers: HashSet<String>,
    /// Strangers' last `/pair` tries.
    tries: Tries,
}

impl Handler {
    pub fn new(feishu: Feishu, inbound: mpsc::Sender<InboundMessage>, stop: CancellationToken) -> Handler {
        let file = StateFile::new(&feishu.shared.state_dir);
        let state = file.load();
        Handler { feishu, me: None, inbound, stop, state, file, strangers: HashSet::new(), tries: Tries::default() }
    }

    /// Save the state file off the runtime thread.
    pub(super) async fn save(&self) {
        let (file, state) = (self.file.clone(), self.state.clone());
        if let Err(e) = crate::util::tasks::blocking(move || file.save(&state)).await {
            tracing::error!(error = %e, "cannot save the Feishu state; an event may be handled again after a restart");
        }
    }

    /// A joined payload of a data frame of `kind` (`event` or `card`); `frame_id` is its `message_id` header.
    pub async fn payload(&mut self, kind: &str, frame_id: &str, payload: &[u8]) -> Answer {
        match kind {
            "event" => match event::parse_event(payload) {
                Ok(env) => self.event(env).await,
                Err(why) => {
                    tracing::warn!("a malformed Feishu event was skipped: {why}");
                    Answer::OK
                }
            },
            "card" => match event::parse_card(payload) {
                Ok(card) => self.card_once(frame_id, card).await,
                Err(why) => {
                    tracing::warn!("a malformed Feishu card callback was skipped: {why}");
                    Answer::OK
                }
            },
            other => {
                tracing::debug!(kind = other, "a Feishu data frame of an unknown type was skipped");
                Answer::OK
            }
        }
    }

    async fn event(&mut self, env: Envelope) -> Answer {
        let ours = self.feishu.cfg.app_id.as_deref().unwrap_or_default();
        if !env.app_id.is_empty() && env.app_id != ours {
            tracing::warn!(app = %env.app_id, "a Feishu event for another app was skipped");
            return Answer::OK;
        }
        match env.event {
            Event::Message(m) => {
                let ids = [env.event_id, m.message_id.clone()];
                if ids.iter().any(|id| self.state.seen(id)) {
                    tracing::info!(message = %m.message_id, "a Feishu event delivered again was skipped (handled before)");
                    return Answer::OK;
                }
                let answer = self.message(m).await;
                if answer != Answer::Later {
                    ids.iter().for_each(|id| self.state.mark(id));
                    self.save().await;
                }
                answer
            }
            Event::Card(card) => self.card_once(&env.event_id, card).await,
            Event::Other(kind) => {
                tracing::debug!(kind, "a Feishu event of another type was skipped");
                Answer::OK
            }
        }
    }

    /// A card press unless `id` was handled before; remembered after.
    async fn card_once(&mut self, id: &str, card: CardAction) -> Answer {
        if self.state.seen(id) {
            tracing::info!(id, "a Feishu card press delivered again was skipped (handled before)");
            return Answer::OK;
        }
        let answer = self.card(card).await;
        self.state.mark(id);
        self.save().await;
        answer
    }

    /// A message: skipped with a reason, or handed to the bus.
    async fn message(&mut self, m: Message) -> Answer {
        if m.sender_type != "user" || self.me.as_deref() == Some(m.sender.as_str()) {
            tracing::info!(message = %m.message_id, "a Feishu message from a bot (or ourselves) was skipped");
            return Answer::OK;
        }
        self.refresh_paired().await;
        if !self.feishu.policy.allows(&m.sender) {
            let pair = m.text().filter(|_| m.chat_type == "p2p").and_then(|t| pairing::request(&t, false));
            match pair.filter(|_| crate::bus::is_feishu_id(&m.chat_id, "oc_")) {
                Some(code) => self.pair(&m, code).await,
                None => self.stranger(&m.sender, "a message"),
            }
            return Answer::OK;
        }
        if m.chat_type != "p2p" && !m.mentions(self.me.as_deref()) {
            tracing::debug!(chat = %m.chat_id, "a Feishu group message not mentioning the bot was skipped");
            return Answer::OK;
        }
        if !crate::bus::is_feishu_id(&m.chat_id, "oc_") {
            tracing::warn!(message = %m.message_id, "a Feishu message without a usable chat_id was skipped");
            return Answer::OK;
        }
        let (text, attachments) = match m.text() {
            Some(text) => (text, Vec::new()),
            None => match self.file_of(&m).await {
                Some(file) => (String::new(), vec![file]),
                None => return Answer::OK,
            },
        };
        if text.is_empty() && attachments.is_empty() {
            return Answer::OK;
        }
        let text = cap(&text, self.feishu.cfg.max_message_chars);
        self.remember_chat(&m.chat_id, &m.sender).await;
        let conversation = Conversation::new(Channel::Feishu, &m.chat_id, format!("feishu:{}", m.chat_id));
        let msg = InboundMessage {
            conversation,
            sender: m.sender.clone(),
            principal: Principal::Feishu(m.sender.clone()),
            text,
            reply_to: Target::Feishu(m.chat_id.clone()),
            attachments,
        };
        let sent = crate::channels::inbox::hand_over(&self.inbound, msg, BUS_WAIT, &self.stop).await;
        if sent {
            Answer::OK
        } else {
            Answer::Later
        }
    }

    /// The file an allowed user sent (an image, file, audio or video
    /// message), fetched into the inbox within `[feishu] max_file_mb`. One
    /// that cannot be taken is told to the chat; a message of another kind
    /// (a sticker, a card) is skipped.
    async fn file_of(&self, m: &Message) -> Option<Attachment> {
        let cap = self.feishu.cfg.max_file_mb;
        match self.feishu.fetch_file(&m.message_id, &m.message_type, &m.content, cap).await {
            Ok(file) => Some(file),
            Err(FileInError::NotAFile(kind)) => {
                tracing::info!(kind = %kind, "a Feishu message that is neither text nor a file was skipped");
                None
            }
            Err(why) => {
                tracing::warn!(message = %m.message_id, "a Feishu file was not taken: {why}");
                let uuid: String = format!("file-{}", m.message_id).chars().take(50).collect();
                let text = json!({"text": format!("I could not take your file: {why}")});
                if let Err(e) = self.feishu.shared.client.send_message(&m.chat_id, "text", &text, &uuid).await {
                    tracing::warn!(error = %e, "cannot tell a Feishu / Lark chat its file was not taken");
                }
                None
            }
        }
    }

    /// Read the paired users again if `bramble pair` changed them (a revoke
    /// is seen at the user's next message or press).
    async fn refresh_paired(&self) {
        let policy = self.feishu.policy.clone();
        crate::util::tasks::blocking(move || policy.refresh()).await;
    }

    /// A stranger's `/pair <code>` in a p2p chat: answered only while a
    /// Feishu code is pending ([`pairing::stranger_try`]).
    async fn pair(&mut self, m: &Message, code: String) {
        let (dir, who) = (self.feishu.shared.state_dir.clone(), Principal::Feishu(m.sender.clone()));
        let attempt = pairing::stranger_try(&dir, &mut self.tries, code, &who, Profile::default()).await;
        let Attempt::Answer { text, paired } = attempt else { return };
        if paired {
            self.feishu.policy.add_paired(&m.sender);
            self.strangers.remove(&m.sender); // logged again if they are revoked
            self.remember_chat(&m.chat_id, &m.sender).await;
        }
        // The message's id makes the answer's de-duplication key (at most 50 characters).
        let uuid: String = format!("pair-{}", m.message_id).chars().take(50).collect();
        let sent = self.feishu.shared.client.send_message(&m.chat_id, "text", &json!({"text": text}), &uuid).await;
        if let Err(e) = sent {
            tracing::warn!(error = %e, "cannot answer a Feishu / Lark /pair");
        }
    }

    /// Record the chat an allowed user wrote in (a turn may then post there).
    async fn remember_chat(&self, chat: &str, user: &str) {
        let (dir, chat, user) = (self.feishu.shared.state_dir.clone(), chat.to_string(), user.to_string());
        let r = crate::util::tasks::blocking(move || {
            let mut chats = crate::policy::feishu::Chats::load(&dir);
            if chats.chats.get(&chat) == Some(&user) || chats.chats.contains_key(&chat) {
                return Ok(());
            }
            chats.chats.insert(chat, user);
            chats.save(&dir)
        })
        .await;
        if let Err(e) = r {
            tracing::error!(error = %e, "cannot save the list of Feishu chats");
        }
    }

    /// A card press: Done / Snooze for an allowed user; anyone else is told no.
    async fn card(&mut self, card: CardAction) -> Answer {
        self.refresh_paired().await;
        if !self.feishu.policy.allows(&card.operator) {
            self.stranger(&card.operator, "a card button press");
            return toast("error", "Not allowed.");
        }
        let parsed = card.value["r"].as_str().and_then(buttons::parse);
        let (Some((action, job)), Some(reminders)) = (parsed, self.feishu.reminders.clone()) else {
            return Answer::OK;
        };
        let text = card.value["text"].as_str().unwrap_or_default().to_string();
        let chat = card.chat_id.clone();
        let conversation = Conversation::new(Channel::Feishu, &chat, format!("feishu:{chat}"));
        let (job2, text2, action2) = (job.clone(), text.clone(), action.clone());
        let now = jiff::Timestamp::now();
        let outcome = crate::util::tasks::blocking(move || match action2 {
            Action::Done => reminders.done(&job2, now),
            Action::Snooze(when) => reminders.snooze_in(&job2, &text2, conversation, when, now),
        })
        .await;
        let (kind, said, note) = match &outcome {
            Ok(said) => {
                tracing::info!(job = %job, ?action, user = %card.operator, "{said}");
                let mark = if action == Action::Done { "✅" } else { "💤" };
                ("success", said.clone(), format!("{mark} {said}"))
            }
            Err(why) => {
                tracing::warn!(job = %job, ?action, "a Feishu card button did nothing: {why}");
                ("warning", why.to_string(), format!("⚠️ {why}"))
            }
        };
        if !card.message_id.is_empty() {
            let updated = deliver::answered_card(&text, &note);
            if let Err(e) = self.feishu.shared.client.update_card(&card.message_id, &updated).await {
                tracing::warn!(error = %e, "cannot mark the Feishu report as handled");
            }
        }
        toast(kind, &said)
    }

    /// Log a stranger once (the set is cleared when full).
    fn stranger(&mut self, user: &str, what: &str) {
        if self.strangers.len() >= MAX_STRANGERS {
            self.strangers.clear();
        }
        if self.strangers.insert(user.to_string()) {
            tracing::warn!(
                user,
                "{what} from a Feishu / Lark user not in [feishu] allow_from was ignored (logged once per user)"
            );
        }
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

/// A card press's answer: a toast the user sees.
fn toast(kind: &str, text: &str) -> Answer {
    Answer::Done { code: 200, data: Some(json!({"toast": {"type": kind, "content": text}})) }
}
