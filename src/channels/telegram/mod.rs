//! The Telegram channel: long polling for messages, delivery to `telegram:<chat_id>`.
//!
//! - [`api`]: the Bot API client (ours; see its header for why).
//! - [`format`]: Markdown → Telegram HTML, split under 4096 characters.
//!
//! ## Polling and the offset
//!
//! `getUpdates` long-polls (50 s). Telegram forgets an update only when we
//! poll again with an offset above its id, so the order per batch is: hand each
//! update to the bus (or drop it: a stranger, a group chat that does not
//! address the bot) → write `telegram-offset.json` (atomic replace) → poll with
//! the new offset. A crash before the write means Telegram sends the batch
//! again; nothing is confirmed to Telegram that is not on disk first. The file
//! is written only when updates arrive, never on a timer.
//!
//! A stalled connection is caught by the long poll's own HTTP limit (65 s);
//! every failure reconnects with a backoff from 1 s to 60 s. A 409 (a webhook
//! is set, or another poller runs) calls `deleteWebhook`. A refused token
//! (401/404) stops the poller with a clear error; [`check_token`] makes it
//! fatal at daemon start, while a network error there is not (a Pi boots
//! before its network).
//!
//! ## Who is answered
//!
//! Only `[telegram] allow_from` (numeric user ids or `@usernames`; empty means
//! nobody). A username is pinned to the id that first used it ([`pins`]).
//! Strangers are logged once per user and never reach the agent. In
//! groups, only messages that mention the bot, reply to it, or are commands
//! (`/stop`, or `/stop@thisbot` but not `/stop@otherbot`) count.

pub mod api;
pub mod format;

use crate::util::timer::Backoff;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::agent::SessionActivity;
use crate::bus::{Conversation, InboundMessage, Target};
use crate::config::TelegramConfig;
use crate::delivery::{Channel, DeliveryError, Report};
use crate::policy::pins::{self, Allow, Verdict};
use crate::util::BoxFuture;
use api::{Api, ApiError, Message, User};

/// The typing indicator lasts ~5 s; it is refreshed this often while a turn runs.
const TYPING_EVERY: Duration = Duration::from_secs(4);
/// Strangers remembered for "logged once"; the set is cleared when full.
const MAX_STRANGERS: usize = 1024;
/// How long the start-up token check may take.
const START_CHECK_TIMEOUT: Duration = Duration::from_secs(10);
/// Backoff after a failed poll: from 1 s, doubling, to this.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Why Telegram cannot start.
#[derive(Debug, thiserror::Error)]
pub enum TelegramError {
    #[error("Telegram refused the bot token ({0}): check [telegram] token / token_env (BotFather gives the token)")]
    InvalidToken(String),
    #[error(transparent)]
    Api(#[from] ApiError),
}

/// Telegram, configured: the delivery side and the poller share one client.
pub struct Telegram {
    api: Arc<Api>,
    allow: Allow,
    state_dir: PathBuf,
}

impl Telegram {
    /// `None` when `[telegram]` has no token.
    pub fn from_config(cfg: &TelegramConfig, state_dir: &Path) -> Result<Option<Telegram>, TelegramError> {
        let Some(token) = cfg.token() else { return Ok(None) };
        let api = Arc::new(Api::new(&cfg.api_base.0, token)?);
        Ok(Some(Telegram { api, allow: Allow::new(&cfg.allow_from), state_dir: state_dir.to_path_buf() }))
    }

    /// The delivery side, for the outbox.
    pub fn channel(&self) -> Arc<dyn Channel> {
        Arc::new(TelegramChannel { api: self.api.clone() })
    }

    /// Poll for messages until `stop`; accepted ones go to `inbound`. `agent`
    /// tells whether a chat's turn still runs (for the typing indicator).
    pub async fn poll(
        self,
        inbound: mpsc::Sender<InboundMessage>,
        agent: Arc<dyn SessionActivity>,
        stop: CancellationToken,
    ) {
        let mut backoff = Backoff::new(MAX_BACKOFF);
        let me = loop {
            let r = tokio::select! { r = self.api.get_me() => r, _ = stop.cancelled() => return };
            match r {
                Ok(me) => break me,
                Err(e) if e.is_unauthorized() => {
                    tracing::error!("{}; Telegram polling stopped", TelegramError::InvalidToken(e.to_string()));
                    return;
                }
                Err(e) => {
                    let wait = backoff.next_wait();
                    tracing::warn!(error = %e, retry_in = ?wait, "Telegram is not reachable yet");
                    if sleep_or_stop(wait, &stop).await {
                        return;
                    }
                }
            }
        };
        backoff.reset();
        if let Err(e) = self.api.set_my_commands(&crate::agent::commands::menu()).await {
            tracing::warn!(error = %e, "cannot register the bot's commands with Telegram");
        }
        let offset_file = OffsetFile::new(&self.state_dir, me.id);
        let mut offset = offset_file.load();
        tracing::info!(bot = %me.username.as_deref().unwrap_or("?"), offset, "Telegram polling");
        let (allow, dir) = (self.allow.clone(), self.state_dir.clone());
        let allow = match tokio::task::spawn_blocking(move || allow.with_pins(&dir)).await {
            Ok(a) => a,
            Err(e) => {
                tracing::error!(error = %e, "cannot load the Telegram username pins; usernames are pinned afresh");
                self.allow.clone()
            }
        };
        let mut poller = Poller { me, allow, strangers: HashSet::new(), typing: HashMap::new(), pinned: false };
        loop {
            let r = tokio::select! { r = self.api.get_updates(offset) => r, _ = stop.cancelled() => return };
            let updates = match r {
                Ok(u) => {
                    backoff.reset();
                    u
                }
                Err(e) if e.is_unauthorized() => {
                    tracing::error!("{}; Telegram polling stopped", TelegramError::InvalidToken(e.to_string()));
                    return;
                }
                Err(e) => {
                    let wait = backoff.next_wait();
                    if e.code() == Some(409) {
                        tracing::warn!(error = %e, "another poller or a webhook holds this bot; deleting the webhook");
                        if let Err(e) = self.api.delete_webhook().await {
                            tracing::warn!(error = %e, "deleteWebhook failed");
                        }
                    } else {
                        tracing::warn!(error = %e, retry_in = ?wait, "Telegram poll failed; reconnecting");
                    }
                    if sleep_or_stop(wait, &stop).await {
                        return;
                    }
                    continue;
                }
            };
            let before = offset;
            let mut stopped = false;
            for update in updates {
                if update.update_id < offset {
                    continue; // already handled (a server that repeats itself)
                }
                if let Some(msg) = update.message.and_then(|m| poller.accept(m)) {
                    let chat = msg.conversation.chat_id.clone();
                    let key = msg.conversation.session_key.clone();
                    let is_command = crate::agent::commands::parse(&msg.text).is_some();
                    // Biased: once stopping, nothing more is handed over (and so nothing confirmed).
                    let sent =
                        tokio::select! { biased; _ = stop.cancelled() => false, r = inbound.send(msg) => r.is_ok() };
                    if !sent {
                        // Not handed over: not confirmed either, Telegram sends it again after a restart.
                        stopped = true;
                        break;
                    }
                    if !is_command {
                        poller.start_typing(&self.api, &agent, chat, key, &stop);
                    }
                }
                offset = update.update_id + 1;
            }
            if std::mem::take(&mut poller.pinned) {
                let (pins, dir) = (poller.allow.pins().clone(), self.state_dir.clone());
                match tokio::task::spawn_blocking(move || pins::save_pins(&dir, &pins)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::error!(error = %e, "cannot save the Telegram username pins; they hold until a restart")
                    }
                    Err(e) => tracing::error!(error = %e, "cannot save the Telegram username pins"),
                }
            }
            if offset != before {
                if let Err(e) = offset_file.save(offset) {
                    tracing::error!(error = %e, "cannot save the Telegram offset; updates may be handled again after a restart");
                }
            }
            if stopped {
                return;
            }
        }
    }
}

/// Per-poller state: who the bot is, who was already logged, typing tasks.
struct Poller {
    me: User,
    allow: Allow,
    strangers: HashSet<i64>,
    typing: HashMap<String, tokio::task::JoinHandle<()>>,
    /// A username was pinned since the pins were last saved.
    pinned: bool,
}

impl Poller {
    /// The message for the agent, if it is one: text or caption, addressed to
    /// the bot (in groups), from an allowed user.
    fn accept(&mut self, m: Message) -> Option<InboundMessage> {
        let from = m.from.as_ref()?;
        let text = m.text.as_deref().or(m.caption.as_deref()).map(str::trim).filter(|t| !t.is_empty())?;
        if matches!(m.chat.kind.as_str(), "group" | "supergroup") && !self.addressed(&m, text) {
            return None;
        }
        let refused = match self.allow.check(from.id, from.username.as_deref()) {
            Verdict::Allowed => None,
            Verdict::Pinned(name) => {
                tracing::warn!(
                    user_id = from.id,
                    "pinned @{name} to id {}: only this user is served as @{name} from now on",
                    from.id
                );
                self.pinned = true;
                None
            }
            Verdict::NameTaken { name, pinned } => Some(format!(
                "ignoring a Telegram user presenting @{name}: that allow_from name is pinned to id {pinned}"
            )),
            Verdict::Stranger => {
                Some("ignoring messages from a Telegram user not in [telegram] allow_from".to_string())
            }
        };
        if let Some(why) = refused {
            if self.strangers.len() >= MAX_STRANGERS {
                self.strangers.clear();
            }
            if self.strangers.insert(from.id) {
                tracing::warn!(
                    user_id = from.id, username = %from.username.as_deref().unwrap_or("-"), chat_id = m.chat.id,
                    "{why}"
                );
            }
            return None;
        }
        let chat = m.chat.id.to_string();
        let sender = match &from.username {
            Some(u) => format!("{} (@{u})", from.id),
            None => from.id.to_string(),
        };
        Some(InboundMessage {
            conversation: Conversation::new("telegram", chat.clone(), format!("telegram:{chat}")),
            reply_to: Target::Telegram(chat),
            sender,
            text: text.to_string(),
        })
    }

    /// In a group: the bot is @mentioned, the message replies to the bot, or it
    /// is a command for every bot (`/help`) or for this one (`/help@bramble_bot`).
    fn addressed(&self, m: &Message, text: &str) -> bool {
        if crate::agent::commands::parse(text).is_some() {
            let word = text.split_whitespace().next().unwrap_or("");
            let ours = match word.split_once('@') {
                None => true,
                Some((_, bot)) => self.me.username.as_ref().is_some_and(|u| u.eq_ignore_ascii_case(bot)),
            };
            if ours {
                return true;
            }
        }
        let replied = m.reply_to_message.as_ref().and_then(|r| r.from.as_ref()).is_some_and(|u| u.id == self.me.id);
        let mentioned = self.me.username.as_ref().is_some_and(|name| {
            let needle = format!("@{}", name.to_ascii_lowercase());
            let lower = text.to_ascii_lowercase();
            lower.match_indices(&needle).any(|(i, _)| {
                // `@bramble_bot` but not `@bramble_bot2`.
                !lower[i + needle.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
            })
        });
        replied || mentioned
    }

    /// Show "typing…" in `chat` until its session has no turn running or queued.
    fn start_typing(
        &mut self,
        api: &Arc<Api>,
        agent: &Arc<dyn SessionActivity>,
        chat: String,
        key: String,
        stop: &CancellationToken,
    ) {
        self.typing.retain(|_, t| !t.is_finished());
        if self.typing.contains_key(&chat) {
            return;
        }
        let (api, agent, stop) = (api.clone(), agent.clone(), stop.clone());
        let chat_id = chat.clone();
        let task = tokio::spawn(async move {
            loop {
                if let Err(e) = api.send_typing(&chat_id).await {
                    tracing::debug!(error = %e, "sendChatAction failed");
                }
                if sleep_or_stop(TYPING_EVERY, &stop).await || !agent.session_busy(&key) {
                    return;
                }
            }
        });
        self.typing.insert(chat, task);
    }
}

/// Sleep for `d`; `true` if `stop` fired first.
async fn sleep_or_stop(d: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = stop.cancelled() => true,
    }
}

/// `<state>/telegram-offset.json`: the next update id to ask for, per bot
/// (update ids belong to one bot: a new token starts from scratch).
struct OffsetFile {
    path: PathBuf,
    bot_id: i64,
}

#[derive(Serialize, Deserialize)]
struct OffsetState {
    bot_id: i64,
    offset: i64,
}

impl OffsetFile {
    fn new(state_dir: &Path, bot_id: i64) -> OffsetFile {
        OffsetFile { path: state_dir.join("telegram-offset.json"), bot_id }
    }

    fn load(&self) -> i64 {
        let Ok(text) = std::fs::read_to_string(&self.path) else { return 0 };
        match serde_json::from_str::<OffsetState>(&text) {
            Ok(s) if s.bot_id == self.bot_id => s.offset,
            Ok(_) => {
                tracing::info!("the Telegram offset belongs to another bot; starting afresh");
                0
            }
            Err(e) => {
                tracing::warn!(file = %self.path.display(), error = %e, "unreadable Telegram offset; starting afresh");
                0
            }
        }
    }

    fn save(&self, offset: i64) -> std::io::Result<()> {
        let data = serde_json::to_vec(&OffsetState { bot_id: self.bot_id, offset }).map_err(std::io::Error::other)?;
        crate::util::fs::write_atomic(&self.path, &data)
    }
}

/// Check the token once at daemon start: a refused token is an error; an
/// unreachable Telegram is not (the poller keeps trying). Returns the bot when known.
pub async fn check_token(cfg: &TelegramConfig) -> Result<Option<User>, TelegramError> {
    let Some(token) = cfg.token() else { return Ok(None) };
    let api = Api::new(&cfg.api_base.0, token)?;
    // Bounded: a network that swallows packets must not hold up the daemon's start.
    let answer = tokio::time::timeout(START_CHECK_TIMEOUT, api.get_me())
        .await
        .unwrap_or_else(|_| Err(ApiError::Transport(format!("no answer within {START_CHECK_TIMEOUT:?}"))));
    match answer {
        Ok(me) => Ok(Some(me)),
        Err(e) if e.is_unauthorized() => Err(TelegramError::InvalidToken(e.to_string())),
        Err(e) => {
            tracing::warn!(error = %e, "cannot reach Telegram now; the bot starts when the network is up");
            Ok(None)
        }
    }
}

/// Delivers reports to `telegram:<chat_id>`.
pub struct TelegramChannel {
    api: Arc<Api>,
}

impl TelegramChannel {
    async fn send(&self, chat: &str, text: &str) -> Result<(), DeliveryError> {
        let mut chunks = format::to_html_chunks(text, format::MAX_MESSAGE);
        if chunks.is_empty() {
            chunks.push("(empty message)".into());
        }
        let n = chunks.len();
        for (i, html) in chunks.iter().enumerate() {
            match self.api.send_message(chat, html, true).await {
                Ok(()) => {}
                Err(e) if e.is_bad_markup() => {
                    tracing::warn!(error = %e, part = i + 1, of = n, "Telegram refused the HTML; sending plain text");
                    self.api.send_message(chat, &format::html_to_plain(html), false).await.map_err(delivery_error)?;
                }
                // Parts already sent are sent again on retry: at-least-once, like every target.
                Err(e) => return Err(delivery_error(e)),
            }
        }
        Ok(())
    }
}

fn delivery_error(e: ApiError) -> DeliveryError {
    if e.is_retryable() {
        DeliveryError::retryable(e.to_string())
    } else {
        DeliveryError::permanent(e.to_string())
    }
}

impl Channel for TelegramChannel {
    fn name(&self) -> &'static str {
        "telegram"
    }

    fn deliver<'a>(&'a self, report: Report<'a>) -> BoxFuture<'a, Result<(), DeliveryError>> {
        Box::pin(async move {
            match report.target {
                Target::Telegram(chat) => self.send(chat, report.text).await,
                other => Err(DeliveryError::permanent(format!("the telegram channel cannot deliver to {other}"))),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(id: i64, name: Option<&str>) -> User {
        User { id, username: name.map(Into::into), ..Default::default() }
    }

    #[test]
    fn allow_from_takes_ids_and_usernames() {
        let allow = Allow::new(&["12345".into(), "@Alice".into(), "bob".into(), " ".into()]);
        assert!(allow.allows(12345, None));
        assert!(allow.allows(1, Some("alice")));
        assert!(allow.allows(2, Some("BOB")));
        assert!(!allow.allows(3, Some("mallory")));
        assert!(!allow.allows(4, None));
        assert!(!Allow::new(&[]).allows(12345, Some("alice")), "empty means nobody");
    }

    fn message(chat_kind: &str, from: i64, text: &str) -> Message {
        Message {
            message_id: 1,
            from: Some(user(from, Some("alice"))),
            chat: api::Chat { id: -100, kind: chat_kind.into(), ..Default::default() },
            text: Some(text.into()),
            ..Default::default()
        }
    }

    #[test]
    fn groups_need_a_mention_or_a_reply() {
        let allow = Allow::new(&["7".into()]);
        let mut p = Poller {
            me: user(99, Some("Bramble_bot")),
            allow,
            strangers: HashSet::new(),
            typing: HashMap::new(),
            pinned: false,
        };
        assert!(p.accept(message("supergroup", 7, "hello all")).is_none());
        assert!(p.accept(message("supergroup", 7, "@bramble_bot2 hi")).is_none());
        assert!(p.accept(message("supergroup", 7, "/help")).is_some(), "a command for every bot");
        assert!(p.accept(message("supergroup", 7, "/stop@Bramble_Bot")).is_some());
        assert!(p.accept(message("supergroup", 7, "/stop@other_bot")).is_none(), "another bot's command");
        let m = p.accept(message("supergroup", 7, "hey @bramble_bot, status?")).unwrap();
        assert_eq!(
            (m.conversation.session_key.as_str(), m.reply_to.to_string().as_str()),
            ("telegram:-100", "telegram:-100")
        );
        let mut reply = message("group", 7, "and this?");
        reply.reply_to_message = Some(Box::new(Message { from: Some(user(99, None)), ..Default::default() }));
        assert!(p.accept(reply).is_some());
        assert!(p.accept(message("private", 7, "direct")).is_some());
        assert!(p.accept(message("private", 8, "stranger")).is_none());
        assert!(p.strangers.contains(&8));
    }

    #[test]
    fn captions_count_and_empty_messages_do_not() {
        let allow = Allow::new(&["7".into()]);
        let mut p =
            Poller { me: user(99, None), allow, strangers: HashSet::new(), typing: HashMap::new(), pinned: false };
        let mut m = message("private", 7, "");
        assert!(p.accept(m.clone()).is_none());
        m.text = None;
        m.caption = Some("look at this".into());
        assert_eq!(p.accept(m).unwrap().text, "look at this");
    }

    #[test]
    fn the_offset_is_per_bot_and_survives() {
        let dir = tempfile::tempdir().unwrap();
        let f = OffsetFile::new(dir.path(), 1);
        assert_eq!(f.load(), 0);
        f.save(42).unwrap();
        assert_eq!(OffsetFile::new(dir.path(), 1).load(), 42);
        assert_eq!(OffsetFile::new(dir.path(), 2).load(), 0);
        std::fs::write(dir.path().join("telegram-offset.json"), "garbage").unwrap();
        assert_eq!(f.load(), 0);
    }

    #[test]
    fn backoff_doubles_to_a_minute() {
        let mut b = Backoff::new(MAX_BACKOFF);
        let secs: Vec<u64> = (0..9).map(|_| b.next_wait().as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        b.reset();
        assert_eq!(b.next_wait().as_secs(), 1);
    }
}
