//! The Telegram channel: long polling for messages, delivery to `telegram:<chat_id>`.
//!
//! - [`crate::clients::telegram`]: the Bot API client (ours; see its header for why).
//! - [`format`]: Markdown → Telegram HTML, split under 4096 characters.
//! - [`media`]: voice notes, photos and documents saved to the workspace inbox.
//! - [`buttons`]: Done / Snooze under job reports, and what a press does.
//! - [`progress`]: one status message edited while a chat turn runs tools.
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
//!
//! ## Files, buttons and replies
//!
//! A message's file is saved to `inbox/<date>/` before its update is
//! confirmed ([`media`]); the turn gets it as an attachment (the agent
//! transcribes voice notes and shows photos to the model). Button presses
//! (`callback_query`) are answered always, so the client's spinner stops, and
//! acted on only for `allow_from` users. A Telegram reply to a job's report
//! (one with our buttons) continues that job's session.

pub mod buttons;
pub mod format;
pub mod media;
mod pair;
pub mod progress;
pub mod shared;

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
use crate::clients::telegram::{self as api, Api, ApiError, Message, User};
use crate::config::TelegramConfig;
use crate::delivery::{Capabilities, Channel, DeliveryError, Report};
use crate::policy::pins::{self, Allow, Verdict};
use crate::util::BoxFuture;
use crate::work::reminders::Reminders;
use media::{Fetched, Inbox};

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
    inbox: Inbox,
    workspace: PathBuf,
    /// What report buttons do (`None`: no job store, no buttons).
    reminders: Option<Reminders>,
    buttons: crate::config::ReportButtons,
    progress: Option<progress::Progress>,
}

/// The daemon's Telegram poller ([`Telegram::poll`]): until the stop, accepted
/// messages go to `inbound`; `activity` tells whether a chat's turn still runs.
/// It ends by itself only when Telegram refuses the token (it logs why).
pub struct TelegramPoller {
    pub telegram: Telegram,
    pub inbound: mpsc::Sender<InboundMessage>,
    pub activity: Arc<dyn SessionActivity>,
    /// In a fleet that shares the bot: when this board may poll ([`shared`]); `None`: always.
    pub shared: Option<shared::Shared>,
}

impl TelegramPoller {
    pub async fn run(self, shutdown: crate::util::shutdown::Shutdown) {
        self.telegram.poll(self.inbound, self.activity, self.shared, shutdown.stop_token().clone()).await
    }
}

impl Telegram {
    /// `None` when `[telegram]` has no token. `reminders` makes report
    /// buttons work; files are saved under `workspace`'s `inbox/`.
    pub fn from_config(
        cfg: &TelegramConfig,
        state_dir: &Path,
        workspace: &Path,
        reminders: Option<Reminders>,
    ) -> Result<Option<Telegram>, TelegramError> {
        let Some(token) = cfg.token() else { return Ok(None) };
        let api = Arc::new(Api::new(&cfg.api_base.0, token)?);
        let progress = cfg.progress.then(|| progress::Progress::new(api.clone()));
        Ok(Some(Telegram {
            api,
            allow: Allow::new(&cfg.allow_from),
            state_dir: state_dir.to_path_buf(),
            inbox: Inbox::new(workspace, cfg.max_file_mb, cfg.max_image_px),
            workspace: workspace.to_path_buf(),
            buttons: if reminders.is_some() { cfg.buttons } else { crate::config::ReportButtons::None },
            reminders,
            progress,
        }))
    }

    /// The delivery side, for the outbox.
    pub fn channel(&self) -> Arc<dyn Channel> {
        Arc::new(TelegramChannel {
            api: self.api.clone(),
            workspace: crate::workspace::Workspace::strict(&self.workspace),
            buttons: self.buttons,
            progress: self.progress.clone(),
        })
    }

    /// Where chat turns report what they are doing (`None`: `[telegram] progress = false`).
    pub fn progress(&self) -> Option<Arc<dyn crate::agent::ProgressSink>> {
        self.progress.clone().map(|p| Arc::new(p) as Arc<dyn crate::agent::ProgressSink>)
    }

    /// Poll for messages until `stop`; accepted ones go to `inbound`. `agent`
    /// tells whether a chat's turn still runs (for the typing indicator);
    /// `shared`, when this board may poll (a fleet sharing the bot).
    pub async fn poll(
        self,
        inbound: mpsc::Sender<InboundMessage>,
        agent: Arc<dyn SessionActivity>,
        shared: Option<shared::Shared>,
        stop: CancellationToken,
    ) {
        let mut backoff = Backoff::new(MAX_BACKOFF);
        let Some(me) = self.hello(&mut backoff, &stop).await else { return };
        backoff.reset();
        let offset_file = OffsetFile::new(&self.state_dir, me.id);
        let offset = offset_file.load();
        tracing::info!(bot = %me.username.as_deref().unwrap_or("?"), offset, "Telegram polling");
        let (allow, dir) = (self.allow.clone(), self.state_dir.clone());
        let allow = match tokio::task::spawn_blocking(move || allow.with_pins(&dir).with_paired(&dir)).await {
            Ok(a) => a,
            Err(e) => {
                tracing::error!(error = %e, "cannot load the Telegram username pins; usernames are pinned afresh");
                self.allow.clone()
            }
        };
        let mut poller = Poller::new(me, allow);
        poller.paired_stamp =
            crate::policy::pairing::stamp(&self.state_dir, crate::policy::pairing::PairChannel::Telegram);
        let mut polling = Polling { tg: self, poller, inbound, agent, stop, confirmed: None };
        match shared {
            Some(shared) => shared::serve(polling, offset_file, offset, shared).await,
            None => {
                polling.run(&offset_file, offset, &mut backoff).await;
            }
        }
    }

    /// Who the bot is (`getMe`, retried with `backoff` while Telegram is not
    /// reachable), with its command menu registered; `None`: stopped, or the token is refused.
    async fn hello(&self, backoff: &mut Backoff, stop: &CancellationToken) -> Option<User> {
        let me = loop {
            let r = tokio::select! { r = self.api.get_me() => r, _ = stop.cancelled() => return None };
            match r {
                Ok(me) => break me,
                Err(e) if e.is_unauthorized() => {
                    tracing::error!("{}; Telegram polling stopped", TelegramError::InvalidToken(e.to_string()));
                    return None;
                }
                Err(e) => {
                    let wait = backoff.next_wait();
                    tracing::warn!(error = %e, retry_in = ?wait, "Telegram is not reachable yet");
                    if sleep_or_stop(wait, stop).await {
                        return None;
                    }
                }
            }
        };
        if let Err(e) = self.api.set_my_commands(&crate::agent::commands::menu()).await {
            tracing::warn!(error = %e, "cannot register the bot's commands with Telegram");
        }
        Some(me)
    }

    /// Save `m`'s file for update `update_id`. `Ok(Some)`: saved; `Ok(None)`:
    /// refused and answered (the update is done); `Err`: try again at the next poll.
    async fn fetch(
        &self,
        poller: &mut Poller,
        update_id: i64,
        m: &Message,
    ) -> Result<Option<crate::bus::Attachment>, ()> {
        let chat = m.chat.id.to_string();
        let refuse = |why: String| async move {
            if let Err(e) = self.api.send_message(&chat, &why, false).await {
                tracing::warn!(error = %e, "cannot tell the user why their file was refused");
            }
        };
        match self.inbox.fetch(&self.api, m).await {
            None => Ok(None),
            Some(Fetched::Saved(a)) => {
                poller.tries.remove(&update_id);
                tracing::info!(path = %a.path, size = a.size, kind = ?a.kind, "Telegram file saved to the inbox");
                Ok(Some(a))
            }
            Some(Fetched::Refused(why)) => {
                tracing::warn!(chat_id = m.chat.id, "a Telegram file was refused: {why}");
                refuse(why).await;
                Ok(None)
            }
            Some(Fetched::Later(why)) => {
                let tries = poller.tries.entry(update_id).or_insert(0);
                *tries += 1;
                if *tries < media::MAX_TRIES {
                    tracing::warn!(chat_id = m.chat.id, tries = *tries, "cannot download a Telegram file yet: {why}");
                    return Err(());
                }
                poller.tries.remove(&update_id);
                tracing::error!(chat_id = m.chat.id, "gave up downloading a Telegram file: {why}");
                refuse(format!(
                    "I could not download your file after {} tries: {why}. Please send it again.",
                    media::MAX_TRIES
                ))
                .await;
                Ok(None)
            }
        }
    }

    /// The session a reply to one of our job reports continues (the job's), if `m` is one.
    async fn report_session(&self, m: &Message) -> Option<String> {
        let reminders = self.reminders.clone()?;
        let replied = m.reply_to_message.as_ref()?;
        let job = buttons::job_of(replied.reply_markup.as_ref()?)?;
        let chat = m.chat.id.to_string();
        tokio::task::spawn_blocking(move || reminders.session_of(&job, &chat)).await.ok().flatten()
    }
}

/// What handling one update leaves the batch to do.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// The update is done (handed over, answered or dropped): confirm it.
    Next,
    /// Its file could not be fetched yet: confirm nothing from here, poll again after a backoff.
    Later,
    /// Stopping (or the bus is gone) before it was handed over: confirm nothing from here, return.
    Stop,
}

/// The polling task: the channel, the poller's state, and where messages go.
struct Polling {
    tg: Telegram,
    poller: Poller,
    inbound: mpsc::Sender<InboundMessage>,
    agent: Arc<dyn SessionActivity>,
    stop: CancellationToken,
    /// In a fleet: where each confirmed offset is told ([`shared`]).
    confirmed: Option<tokio::sync::watch::Sender<Option<shared::Confirmed>>>,
}

impl Polling {
    /// Poll, handle each batch, confirm what was handled (see the header)
    /// until stopped; returns the next offset.
    async fn run(&mut self, offset_file: &OffsetFile, mut offset: i64, backoff: &mut Backoff) -> i64 {
        loop {
            let Some(updates) = self.updates(offset, backoff).await else { return offset };
            let before = offset;
            let mut step = Step::Next;
            if !updates.is_empty() {
                self.poller.refresh_paired(&self.tg.state_dir).await;
            }
            for update in updates {
                if update.update_id < offset {
                    continue; // already handled (a server that repeats itself)
                }
                let id = update.update_id;
                step = self.handle(update).await;
                if step != Step::Next {
                    break;
                }
                offset = id + 1;
            }
            self.save_pins().await;
            if offset != before {
                if let Err(e) = offset_file.save(offset) {
                    tracing::error!(error = %e, "cannot save the Telegram offset; updates may be handled again after a restart");
                }
                if let Some(tx) = &self.confirmed {
                    let next = shared::Offset { bot: self.poller.me.id, next: offset };
                    let _ = tx.send(Some(shared::Confirmed { offset: next, polling: true }));
                }
            }
            match step {
                Step::Stop => return offset,
                Step::Later if sleep_or_stop(backoff.next_wait(), &self.stop).await => return offset,
                Step::Later | Step::Next => {}
            }
        }
    }

    /// The next batch of updates from `offset` (failures retried with
    /// `backoff`); `None`: stopped, or the token is refused.
    async fn updates(&self, offset: i64, backoff: &mut Backoff) -> Option<Vec<api::Update>> {
        let api = &self.tg.api;
        loop {
            let r = tokio::select! { r = api.get_updates(offset) => r, _ = self.stop.cancelled() => return None };
            let e = match r {
                Ok(updates) => {
                    backoff.reset();
                    return Some(updates);
                }
                Err(e) => e,
            };
            if e.is_unauthorized() {
                tracing::error!("{}; Telegram polling stopped", TelegramError::InvalidToken(e.to_string()));
                return None;
            }
            let wait = backoff.next_wait();
            if e.code() == Some(409) {
                tracing::warn!(error = %e, "another poller or a webhook holds this bot; deleting the webhook");
                if let Err(e) = api.delete_webhook().await {
                    tracing::warn!(error = %e, "deleteWebhook failed");
                }
            } else {
                tracing::warn!(error = %e, retry_in = ?wait, "Telegram poll failed; reconnecting");
            }
            if sleep_or_stop(wait, &self.stop).await {
                return None;
            }
        }
    }

    /// Handle one update: a button press, a `/pair`, or a message for the agent.
    async fn handle(&mut self, update: api::Update) -> Step {
        if let Some(q) = update.callback_query {
            self.poller.on_button(&self.tg.api, self.tg.reminders.as_ref(), q).await;
        }
        let Some(m) = update.message else { return Step::Next };
        if let Some(code) = pair::request(&m) {
            self.poller.pair(&self.tg.api, &self.tg.state_dir, &m, code).await;
            return Step::Next;
        }
        let Some(mut msg) = self.poller.accept(&m) else { return Step::Next };
        if Inbox::has_file(&m) {
            match self.tg.fetch(&mut self.poller, update.update_id, &m).await {
                Ok(Some(a)) => msg.attachments.push(a),
                Ok(None) => return Step::Next,
                Err(()) => return Step::Later,
            }
        }
        self.hand_over(&m, msg).await
    }

    /// Hand `msg` (from `m`) to the agent: a reply to a job's report goes to
    /// the job's session; the chat shows "typing…" while its turn runs.
    async fn hand_over(&mut self, m: &Message, mut msg: InboundMessage) -> Step {
        let is_command = crate::agent::commands::parse(&msg.text).is_some();
        if !is_command {
            if let Some(key) = self.tg.report_session(m).await {
                // The job's session, and the report itself: a reminder's text is in no session.
                msg.conversation.session_key = key;
                let quoted = m.reply_to_message.as_ref().and_then(|r| r.text.as_deref()).unwrap_or("");
                msg.text = format!("[In reply to the report: \"{}\"]\n{}", quote(quoted), msg.text);
            }
        }
        let chat = msg.conversation.chat_id.clone();
        let key = msg.conversation.session_key.clone();
        // Biased: once stopping, nothing more is handed over (and so nothing confirmed).
        let sent =
            tokio::select! { biased; _ = self.stop.cancelled() => false, r = self.inbound.send(msg) => r.is_ok() };
        if !sent {
            // Not handed over: not confirmed either, Telegram sends it again after a restart.
            return Step::Stop;
        }
        if !is_command {
            self.poller.start_typing(&self.tg.api, &self.agent, chat, key, &self.stop);
        }
        Step::Next
    }

    /// Save the username pins if one was pinned in this batch.
    async fn save_pins(&mut self) {
        if !std::mem::take(&mut self.poller.pinned) {
            return;
        }
        let (pins, dir) = (self.poller.allow.pins().clone(), self.tg.state_dir.clone());
        match tokio::task::spawn_blocking(move || pins::save_pins(&dir, &pins)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::error!(error = %e, "cannot save the Telegram username pins; they hold until a restart")
            }
            Err(e) => tracing::error!(error = %e, "cannot save the Telegram username pins"),
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
    /// Failed downloads per update id (tried again at the next poll, up to [`media::MAX_TRIES`]).
    tries: HashMap<i64, u32>,
    /// The last `/pair` try per user (one per [`crate::policy::pairing::TRY_GAP`]).
    pair_tries: HashMap<i64, std::time::Instant>,
    /// `telegram-paired.json`'s modification time when last read.
    paired_stamp: Option<std::time::SystemTime>,
}

impl Poller {
    /// A poller for the bot `me`, serving `allow`.
    fn new(me: User, allow: Allow) -> Poller {
        Poller {
            me,
            allow,
            strangers: HashSet::new(),
            typing: HashMap::new(),
            pinned: false,
            tries: HashMap::new(),
            pair_tries: HashMap::new(),
            paired_stamp: None,
        }
    }

    /// The message for the agent, if it is one: text, a caption or a file,
    /// addressed to the bot (in groups), from an allowed user.
    fn accept(&mut self, m: &Message) -> Option<InboundMessage> {
        let from = m.from.as_ref()?;
        let text = m.text.as_deref().or(m.caption.as_deref()).map(str::trim).unwrap_or("");
        if text.is_empty() && !Inbox::has_file(m) {
            return None;
        }
        if matches!(m.chat.kind.as_str(), "group" | "supergroup") && !self.addressed(m, text) {
            return None;
        }
        if !self.allowed(from) {
            return None;
        }
        let chat = m.chat.id.to_string();
        let sender = match &from.username {
            Some(u) => format!("{} (@{u})", from.id),
            None => from.id.to_string(),
        };
        Some(InboundMessage {
            conversation: Conversation::new(crate::bus::Channel::Telegram, chat.clone(), format!("telegram:{chat}")),
            reply_to: Target::Telegram(chat),
            sender,
            principal: crate::bus::Principal::Telegram(from.id),
            text: text.to_string(),
            attachments: Vec::new(),
        })
    }

    /// Whether `from` is an `allow_from` user (pinning a username on first
    /// use); a stranger is logged once.
    fn allowed(&mut self, from: &User) -> bool {
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
                tracing::warn!(user_id = from.id, username = %from.username.as_deref().unwrap_or("-"), "{why}");
            }
            return false;
        }
        true
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

/// A report quoted in a reply's turn: at most 500 characters of it.
fn quote(text: &str) -> String {
    let text = text.trim();
    if text.chars().count() <= 500 {
        return text.to_string();
    }
    format!("{}…", text.chars().take(499).collect::<String>())
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
    /// Attachments are read from here (no links followed: the workspace may have been tampered with).
    #[cfg_attr(not(feature = "telegram-media"), allow(dead_code))]
    workspace: crate::workspace::Workspace,
    buttons: crate::config::ReportButtons,
    progress: Option<progress::Progress>,
}

impl TelegramChannel {
    async fn send(&self, chat: &str, report: &Report<'_>) -> Result<(), DeliveryError> {
        if let Some(p) = &self.progress {
            // The answer replaces the turn's status message.
            p.finish(chat).await;
        }
        let markup = report.job.filter(|j| buttons::wanted(self.buttons, j)).map(|j| buttons::keyboard(&j.id));
        let mut chunks = format::to_html_chunks(report.text, format::MAX_MESSAGE);
        if chunks.is_empty() {
            chunks.push("(empty message)".into());
        }
        let n = chunks.len();
        for (i, html) in chunks.iter().enumerate() {
            // The buttons go under the last part.
            let markup = if i + 1 == n { markup.as_ref() } else { None };
            match self.api.send_message_with(chat, html, true, markup).await {
                Ok(_) => {}
                Err(e) if e.is_bad_markup() => {
                    tracing::warn!(error = %e, part = i + 1, of = n, "Telegram refused the HTML; sending plain text");
                    self.api
                        .send_message_with(chat, &format::html_to_plain(html), false, markup)
                        .await
                        .map_err(delivery_error)?;
                }
                // Parts already sent are sent again on retry: at-least-once, like every target.
                Err(e) => return Err(delivery_error(e)),
            }
        }
        for path in report.attach {
            self.send_file(chat, path).await?;
        }
        Ok(())
    }

    /// The slim build sends no files: the chat is told which was left out.
    #[cfg(not(feature = "telegram-media"))]
    async fn send_file(&self, chat: &str, path: &str) -> Result<(), DeliveryError> {
        let note = format!("(The file {path} was not sent: {})", media::NO_MEDIA);
        self.api.send_message(chat, &note, false).await.map_err(delivery_error)
    }

    /// One attachment: an image as a photo (Telegram shows it inline), anything else as a document.
    #[cfg(feature = "telegram-media")]
    async fn send_file(&self, chat: &str, path: &str) -> Result<(), DeliveryError> {
        let (ws, p) = (self.workspace.clone(), path.to_string());
        let read = crate::util::tasks::blocking(move || ws.read_all(&p, api::MAX_UPLOAD)).await;
        let data = match read {
            Ok(d) => d,
            Err(e) => {
                // Gone or replaced since it was attached: say so instead of retrying forever.
                tracing::warn!(path, error = %e, "an attachment cannot be read; telling the chat");
                let note = format!("(The file {path} could not be sent: {e})");
                return self.api.send_message(chat, &note, false).await.map_err(delivery_error);
            }
        };
        let name = crate::channels::inbox::safe_name(path.rsplit('/').next().unwrap_or(path));
        let mime = crate::channels::inbox::mime_of(&name);
        let photo =
            matches!(mime, "image/jpeg" | "image/png" | "image/webp") && data.len() as u64 <= api::MAX_PHOTO_UPLOAD;
        match self.api.send_file(chat, photo, &name, mime, &data, None).await {
            Ok(()) => Ok(()),
            // Telegram could not process it as a photo (odd dimensions): as a document then.
            Err(e) if photo && e.code() == Some(400) => {
                tracing::warn!(path, error = %e, "sendPhoto refused; sending it as a document");
                self.api.send_file(chat, false, &name, mime, &data, None).await.map_err(delivery_error)
            }
            Err(e) => Err(delivery_error(e)),
        }
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

    fn capabilities(&self) -> Capabilities {
        Capabilities { files: cfg!(feature = "telegram-media"), buttons: true, edits: true, typing: true }
    }

    fn deliver<'a>(&'a self, report: Report<'a>) -> BoxFuture<'a, Result<(), DeliveryError>> {
        Box::pin(async move {
            match report.target {
                Target::Telegram(chat) => self.send(chat, &report).await,
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
        let mut p = Poller::new(user(99, Some("Bramble_bot")), allow);
        assert!(p.accept(&message("supergroup", 7, "hello all")).is_none());
        assert!(p.accept(&message("supergroup", 7, "@bramble_bot2 hi")).is_none());
        assert!(p.accept(&message("supergroup", 7, "/help")).is_some(), "a command for every bot");
        assert!(p.accept(&message("supergroup", 7, "/stop@Bramble_Bot")).is_some());
        assert!(p.accept(&message("supergroup", 7, "/stop@other_bot")).is_none(), "another bot's command");
        let m = p.accept(&message("supergroup", 7, "hey @bramble_bot, status?")).unwrap();
        assert_eq!(
            (m.conversation.session_key.as_str(), m.reply_to.to_string().as_str()),
            ("telegram:-100", "telegram:-100")
        );
        let mut reply = message("group", 7, "and this?");
        reply.reply_to_message = Some(Box::new(Message { from: Some(user(99, None)), ..Default::default() }));
        assert!(p.accept(&reply).is_some());
        assert!(p.accept(&message("private", 7, "direct")).is_some());
        assert!(p.accept(&message("private", 8, "stranger")).is_none());
        assert!(p.strangers.contains(&8));
    }

    #[test]
    fn captions_count_and_empty_messages_do_not() {
        let allow = Allow::new(&["7".into()]);
        let mut p = Poller::new(user(99, None), allow);
        let mut m = message("private", 7, "");
        assert!(p.accept(&m.clone()).is_none());
        m.text = None;
        m.caption = Some("look at this".into());
        assert_eq!(p.accept(&m).unwrap().text, "look at this");
    }

    struct Idle;
    impl SessionActivity for Idle {
        fn session_busy(&self, _: &str) -> bool {
            false
        }
    }

    /// A poller for allowed user 7 with its inbound queue; its API is nowhere (nothing here calls it).
    fn polling(dir: &Path) -> (Polling, mpsc::Receiver<InboundMessage>) {
        let api = Arc::new(Api::new("http://127.0.0.1:9", crate::config::Secret::new("1:x")).unwrap());
        let tg = Telegram {
            api,
            allow: Allow::new(&["7".into()]),
            state_dir: dir.to_path_buf(),
            inbox: Inbox::new(dir, 20, 1280),
            workspace: dir.to_path_buf(),
            reminders: None,
            buttons: crate::config::ReportButtons::None,
            progress: None,
        };
        let (inbound, rx) = mpsc::channel(4);
        let poller = Poller::new(user(99, Some("bramble_bot")), Allow::new(&["7".into()]));
        (Polling { tg, poller, inbound, agent: Arc::new(Idle), stop: CancellationToken::new(), confirmed: None }, rx)
    }

    fn update(m: Message) -> api::Update {
        api::Update { update_id: 5, message: Some(m), callback_query: None }
    }

    #[tokio::test]
    async fn one_update_is_handed_over_dropped_or_kept_for_later() {
        let dir = tempfile::tempdir().unwrap();
        let (mut p, mut rx) = polling(dir.path());
        // A command: handed over, and no typing task (it calls no model).
        assert_eq!(p.handle(update(message("private", 7, "/status"))).await, Step::Next);
        assert_eq!(rx.try_recv().unwrap().text, "/status");
        assert_eq!(p.handle(update(message("private", 8, "hi"))).await, Step::Next, "a stranger: dropped");
        assert!(rx.try_recv().is_err());
        let empty = api::Update { update_id: 6, message: None, callback_query: None };
        assert_eq!(p.handle(empty).await, Step::Next);
        p.stop.cancel();
        assert_eq!(p.handle(update(message("private", 7, "/help"))).await, Step::Stop, "stopping: not confirmed");
        assert!(rx.try_recv().is_err());
    }

    #[tokio::test]
    async fn a_gone_bus_stops_the_poller_unconfirmed() {
        let dir = tempfile::tempdir().unwrap();
        let (mut p, rx) = polling(dir.path());
        drop(rx);
        assert_eq!(p.handle(update(message("private", 7, "/status"))).await, Step::Stop);
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
