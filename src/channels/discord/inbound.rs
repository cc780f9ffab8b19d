//! What a gateway dispatch does: a message handed to the bus or skipped
//! with a reason, a button press acted on or refused (see the channel's header).
//!
//! Discord's "Message" object (MESSAGE_CREATE) and "Interaction" object
//! (INTERACTION_CREATE, type 3: a message component) are read as JSON
//! values: only the few fields used, each checked.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Discord, Shared};
use crate::agent::SessionActivity;
use crate::bus::{Attachment, AttachmentKind, Channel, Conversation, InboundMessage, Principal, Target};
use crate::channels::telegram::buttons::{self, Action};
use crate::clients::discord::DiscordError;
use crate::policy::discord::Dms;
use crate::policy::pairing::{self, Attempt, Profile, Tries};

/// Strangers remembered for "logged once"; the set is cleared when full.
const MAX_STRANGERS: usize = 1024;
/// Message ids remembered against a replay.
const RECENT: usize = 256;
/// "typing…" lasts about 10 s; renewed before it runs out.
const TYPING_EVERY: Duration = Duration::from_secs(8);
/// How long handing a message to a full bus may take before the connection gives up on it.
const BUS_WAIT: Duration = Duration::from_secs(600);
/// Message types that are someone writing (DEFAULT, REPLY).
const USER_MESSAGE_TYPES: [u64; 2] = [0, 19];
/// Interaction type: a message component (a button).
const MESSAGE_COMPONENT: u64 = 3;
/// Interaction callback types: a message only the presser sees; the button's message updated.
const CHANNEL_MESSAGE: u64 = 4;
const UPDATE_MESSAGE: u64 = 7;
/// Message flag: only the presser sees it.
const EPHEMERAL: u64 = 1 << 6;

/// The gateway loop's state between dispatches.
pub struct Handler {
    discord: Discord,
    inbound: mpsc::Sender<InboundMessage>,
    agent: Arc<dyn SessionActivity>,
    stop: CancellationToken,
    strangers: HashSet<u64>,
    recent: VecDeque<u64>,
    typing: HashMap<u64, tokio::task::JoinHandle<()>>,
    content_warned: bool,
    /// Strangers' last `/pair` tries.
    tries: Tries,
}

impl Handler {
    pub fn new(
        discord: Discord,
        inbound: mpsc::Sender<InboundMessage>,
        agent: Arc<dyn SessionActivity>,
        stop: CancellationToken,
    ) -> Handler {
        Handler {
            discord,
            inbound,
            agent,
            stop,
            strangers: HashSet::new(),
            recent: VecDeque::new(),
            typing: HashMap::new(),
            content_warned: false,
            tries: Tries::default(),
        }
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.discord.shared
    }

    /// The state directory (the connection state is kept there for `bramble status`).
    pub fn state_dir(&self) -> std::path::PathBuf {
        self.shared().state_dir.clone()
    }

    pub fn token(&self) -> String {
        self.shared().rest.token().expose().to_string()
    }

    pub fn set_me(&self, id: u64) {
        self.shared().me.store(id, Ordering::Relaxed);
    }

    /// `[discord] gateway`, or what `GET /gateway/bot` says.
    pub async fn gateway_url(&self) -> Result<String, DiscordError> {
        match &self.discord.cfg.gateway {
            Some(g) => Ok(g.clone()),
            None => self.shared().rest.gateway_url().await,
        }
    }

    /// One dispatch (not READY / RESUMED). `false`: stopping before it was handed over.
    pub async fn dispatch(&mut self, kind: &str, d: &Value) -> bool {
        match kind {
            "MESSAGE_CREATE" => self.message(d).await,
            "INTERACTION_CREATE" => {
                self.interaction(d).await;
                true
            }
            // MESSAGE_UPDATE (an edit) is not a new command; the rest is not asked for.
            _ => true,
        }
    }

    /// A new message: skipped with a reason, or handed to the bus.
    async fn message(&mut self, d: &Value) -> bool {
        let (Some(id), Some(channel), Some(author)) =
            (snowflake(&d["id"]), snowflake(&d["channel_id"]), snowflake(&d["author"]["id"]))
        else {
            tracing::warn!("a malformed Discord message (no id, channel or author) was skipped");
            return true;
        };
        if author == self.shared().me.load(Ordering::Relaxed) {
            return true; // our own messages, fed back: never input
        }
        if d["author"]["bot"].as_bool() == Some(true) || !d["webhook_id"].is_null() {
            tracing::debug!(channel, "a Discord message from a bot or a webhook was skipped");
            return true;
        }
        let guild = !d["guild_id"].is_null();
        if guild && !self.discord.policy.listens_in(channel) {
            return true; // a guild channel not in [discord] channels: not read
        }
        if !d["type"].as_u64().is_some_and(|t| USER_MESSAGE_TYPES.contains(&t)) {
            return true;
        }
        if self.recent.contains(&id) {
            tracing::info!(message = id, "a Discord message already handled was skipped (replayed)");
            return true;
        }
        let text = d["content"].as_str().unwrap_or_default();
        // A `bramble pair --revoke` is seen at the user's next message.
        let policy = self.discord.policy.clone();
        crate::util::tasks::blocking(move || policy.refresh()).await;
        let pair = pairing::request(text, false).filter(|_| !guild);
        if !self.discord.policy.allows(author) {
            match pair {
                Some(code) => self.pair(channel, author, &d["author"], code).await,
                None => self.stranger(author, channel),
            }
            self.remember(id);
            return true;
        }
        if pair.is_some() {
            self.remember(id);
            self.say(channel, "You can already talk to me.").await;
            return true;
        }
        let files = d["attachments"].as_array().cloned().unwrap_or_default();
        if text.is_empty() && files.is_empty() {
            self.no_content_warning();
            return true;
        }
        if !guild {
            self.remember_dm(channel, author).await;
        }
        let mut attachments = Vec::new();
        for f in &files {
            match self.fetch(f).await {
                Ok(a) => attachments.push(a),
                Err(why) => {
                    tracing::warn!(channel, "a Discord attachment was not taken: {why}");
                    self.say(channel, &format!("I could not take your file: {why}")).await;
                }
            }
        }
        if text.is_empty() && attachments.is_empty() {
            self.remember(id);
            return true;
        }
        let text = super::deliver::cap(text, self.discord.cfg.max_message_chars);
        let handed = self.hand_over(channel, author, text, attachments).await;
        if handed {
            self.remember(id);
        }
        handed
    }

    async fn hand_over(&mut self, channel: u64, author: u64, text: String, attachments: Vec<Attachment>) -> bool {
        let conversation = Conversation::new(Channel::Discord, channel.to_string(), format!("discord:{channel}"));
        let key = conversation.session_key.clone();
        let msg = InboundMessage {
            conversation,
            sender: format!("discord:{author}"),
            principal: Principal::Discord(author),
            text,
            reply_to: Target::Discord(channel),
            attachments,
        };
        let command = msg.text.trim_start().starts_with('/');
        let sent = crate::channels::inbox::hand_over(&self.inbound, msg, BUS_WAIT, &self.stop).await;
        if sent && !command {
            self.start_typing(channel, key);
        }
        sent
    }

    fn remember(&mut self, id: u64) {
        if self.recent.len() >= RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(id);
    }

    /// A DM with an allowed user is a channel turns may post to (the policy's file).
    async fn remember_dm(&self, channel: u64, user: u64) {
        let dir = self.shared().state_dir.clone();
        let saved = crate::util::tasks::blocking(move || {
            let mut dms = Dms::load(&dir);
            if dms.record(channel, user) {
                dms.save(&dir)
            } else {
                Ok(())
            }
        })
        .await;
        if let Err(e) = saved {
            tracing::warn!(error = %e, "cannot remember a Discord DM; the message tool may not reach it");
        }
    }

    /// A message with no text and no files: the Message Content intent is off.
    fn no_content_warning(&mut self) {
        if !std::mem::replace(&mut self.content_warned, true) {
            tracing::warn!(
                "a Discord message came without its text: turn on the Message Content intent (developer portal → \
                 your application → Bot → Privileged Gateway Intents)"
            );
        }
    }

    /// Log a stranger once (the set is cleared when full).
    fn stranger(&mut self, user: u64, channel: u64) {
        if self.strangers.len() >= MAX_STRANGERS {
            self.strangers.clear();
        }
        if self.strangers.insert(user) {
            tracing::warn!(
                user,
                channel,
                "a message from a Discord user not in [discord] allow_from was ignored (logged once per user)"
            );
        }
    }

    /// A stranger's `/pair <code>` in a DM: answered only while a Discord
    /// code is pending ([`pairing::stranger_try`]); the DM becomes a target
    /// once they are paired.
    async fn pair(&mut self, channel: u64, author: u64, who: &Value, code: String) {
        let username = who["username"].as_str().map(|n| n.chars().take(64).collect());
        let profile = Profile { username, number: None };
        let dir = self.shared().state_dir.clone();
        let attempt = pairing::stranger_try(&dir, &mut self.tries, code, &Principal::Discord(author), profile).await;
        let Attempt::Answer { text, paired } = attempt else { return };
        if paired {
            self.discord.policy.add_paired(author);
            self.strangers.remove(&author); // logged again if they are revoked
            self.remember_dm(channel, author).await;
        }
        self.say(channel, &text).await;
    }

    /// A plain message from the bot (a note about a file, a pairing answer).
    async fn say(&self, channel: u64, text: &str) {
        if let Err(e) = self.shared().rest.create_message(channel, &json!({"content": text})).await {
            tracing::warn!(channel, error = %e, "cannot post a note in Discord");
        }
    }

    /// One attachment, saved to `inbox/<date>/` of the workspace.
    async fn fetch(&self, f: &Value) -> Result<Attachment, String> {
        let Some(url) = f["url"].as_str() else { return Err("it has no URL".into()) };
        let cap = self.discord.cfg.max_file_mb * 1024 * 1024;
        if f["size"].as_u64().is_some_and(|s| s > cap) {
            return Err(format!("it is larger than [discord] max_file_mb ({} MB)", self.discord.cfg.max_file_mb));
        }
        let data = self.shared().rest.download(url, cap).await.map_err(|e| e.to_string())?;
        let mime = f["content_type"].as_str().unwrap_or("application/octet-stream").to_string();
        let kind = if mime.starts_with("image/") { AttachmentKind::Image } else { AttachmentKind::File };
        let name = crate::channels::inbox::safe_name(f["filename"].as_str().unwrap_or("file"));
        let ws = crate::workspace::Workspace::strict(&self.discord.workspace);
        let size = data.len() as u64;
        let path = crate::util::tasks::blocking(move || crate::channels::inbox::save_new(&ws, &name, &data))
            .await
            .map_err(|e| format!("cannot save it in the workspace inbox: {e}"))?;
        tracing::info!(path, size, "Discord file saved to the inbox");
        Ok(Attachment { kind, path, mime, size })
    }

    /// A button press: acted on for allowed users only; always answered.
    async fn interaction(&mut self, d: &Value) {
        let (Some(id), Some(token)) = (snowflake(&d["id"]), d["token"].as_str()) else { return };
        if d["type"].as_u64() != Some(MESSAGE_COMPONENT) {
            return;
        }
        let rest = self.shared().rest.clone();
        let user = snowflake(&d["member"]["user"]["id"]).or_else(|| snowflake(&d["user"]["id"]));
        let channel = snowflake(&d["channel_id"]);
        let allowed = user.is_some_and(|u| self.discord.policy.allows(u))
            && channel.is_some_and(|c| d["guild_id"].is_null() || self.discord.policy.listens_in(c));
        let answer = |body: Value| async move {
            if let Err(e) = rest.interaction_callback(id, token, &body).await {
                tracing::warn!(error = %e, "cannot answer a Discord button press");
            }
        };
        if !allowed {
            if let Some(u) = user {
                self.stranger(u, channel.unwrap_or_default());
            }
            answer(json!({"type": CHANNEL_MESSAGE, "data": {"content": "Not allowed.", "flags": EPHEMERAL}})).await;
            return;
        }
        let parsed = d["data"]["custom_id"].as_str().and_then(buttons::parse);
        let (Some((action, job)), Some(reminders), Some(channel)) = (parsed, self.discord.reminders.clone(), channel)
        else {
            answer(json!({"type": 6})).await; // not ours: acknowledged, nothing changed
            return;
        };
        let text = d["message"]["content"].as_str().unwrap_or_default().to_string();
        let original = text.clone();
        let conversation = Conversation::new(Channel::Discord, channel.to_string(), format!("discord:{channel}"));
        let (job2, action2, now) = (job.clone(), action.clone(), jiff::Timestamp::now());
        let outcome = crate::util::tasks::blocking(move || match action2 {
            Action::Done => reminders.done(&job2, now),
            Action::Snooze(when) => reminders.snooze_in(&job2, &original, conversation, when, now),
        })
        .await;
        let note = match &outcome {
            Ok(said) => {
                tracing::info!(job = %job, ?action, user, "{said}");
                format!("{} {said}", if action == Action::Done { "✅" } else { "💤" })
            }
            Err(why) => {
                tracing::warn!(job = %job, ?action, "a report button did nothing: {why}");
                format!("⚠️ {why}")
            }
        };
        let content = super::deliver::cut(&format!("{}\n\n{note}", text.trim_end()), super::deliver::MAX_CONTENT);
        answer(json!({"type": UPDATE_MESSAGE, "data": {"content": content, "components": []}})).await;
    }

    /// Show "typing…" in `channel` until its session has no turn running or queued.
    fn start_typing(&mut self, channel: u64, key: String) {
        self.typing.retain(|_, t| !t.is_finished());
        if self.typing.contains_key(&channel) {
            return;
        }
        let (rest, agent, stop) = (self.shared().rest.clone(), self.agent.clone(), self.stop.clone());
        let task = tokio::spawn(async move {
            loop {
                if let Err(e) = rest.typing(channel).await {
                    tracing::debug!(error = %e, "Discord typing failed");
                }
                if super::sleep_or_stop(TYPING_EVERY, &stop).await || !agent.session_busy(&key) {
                    return;
                }
            }
        });
        self.typing.insert(channel, task);
    }
}

/// A snowflake field (a string of digits in Discord's JSON).
pub fn snowflake(v: &Value) -> Option<u64> {
    v.as_str().and_then(crate::config::discord::snowflake)
}
