//! The Matrix channel: `/sync` long polling for room messages, delivery to
//! `matrix:<room id or alias>`.
//!
//! - [`crate::clients::matrix`]: the client-server API client (ours; see its
//!   header for why not matrix-sdk).
//! - [`inbound`]: what one synced event does (allow-list, loops, edits,
//!   invites, encrypted rooms, Done / Snooze).
//! - [`deliver`]: the `Channel` that posts reports (HTML, files, Done / Snooze).
//! - [`state`]: what is kept in the state directory.
//!
//! ## Syncing and the position
//!
//! `/sync` long-polls (30 s) with a filter (messages, reactions, membership,
//! encryption; no presence, receipts or typing). The position (`since`) is
//! saved after a batch with events was handled, and otherwise only when it
//! changed and a minute passed (an SD card is not written every 30 s). A
//! batch is handled event by event; a stop half way saves the handled ids
//! with the old position, so after a restart nothing is handled twice and
//! nothing is lost ([`state`]). The very first sync of an account only takes
//! the position: old history is not a list of commands.
//!
//! A stalled connection is caught by the poll's own HTTP limit (45 s); every
//! failure reconnects with a backoff from 1 s to 60 s. A refused token stops
//! the poller with a clear error (a kept password-login token is forgotten
//! first, so the next start logs in again).
//!
//! ## Who is answered
//!
//! Only `[matrix] allow_from` users and paired ones ([`pair`]), exactly by
//! id. Invites are taken only from them (and from anyone while a pairing code
//! is pending); a room the bot finds itself in otherwise is left. A stranger's
//! message in a shared room is ignored and logged once per user. Our own
//! events (the loop), `m.notice`s (other bots), edits (`m.replace`: an edit
//! of an old message is not a new command), redacted and malformed events
//! are skipped with a log line; a long body is cut to `max_message_chars`.
//!
//! ## Encrypted rooms
//!
//! Not read (docs/channels/matrix.md gives the figures behind that): in a
//! room with `m.room.encryption` the bot says once, unencrypted, that it
//! cannot read it and how to make an unencrypted room; `status` and `doctor`
//! list such rooms.

pub mod deliver;
pub mod inbound;
mod pair;
pub mod progress;
pub mod state;
pub mod status;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::agent::SessionActivity;
use crate::bus::InboundMessage;
use crate::clients::matrix::{self as api, Client, MatrixError};
use crate::config::{MatrixConfig, Secret};
use crate::policy::matrix::{MatrixPolicy, RoomRecord, Rooms};
use crate::util::timer::Backoff;
use crate::work::reminders::Reminders;
use state::{Session, SyncFile, SyncState};

/// Backoff after a failed sync: from 1 s, doubling, to this.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// The position is written at most this often when no event was handled.
const SAVE_EVERY: Duration = Duration::from_secs(60);
/// How long the start-up check may take.
const START_CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// Why Matrix cannot start.
#[derive(Debug, thiserror::Error)]
pub enum MatrixChannelError {
    #[error(
        "the Matrix homeserver refused the login ({0}): check [matrix] access_token_env, or user_id and password_env"
    )]
    Login(String),
    #[error(transparent)]
    Api(#[from] MatrixError),
}

/// What the poller and the delivery side share.
pub(crate) struct Shared {
    pub client: Client,
    pub state_dir: PathBuf,
    /// Our own user id, once known (for typing; the poller sets it).
    pub me: std::sync::OnceLock<String>,
    /// Recent job reports, for Done / Snooze.
    pub reports: std::sync::Mutex<state::ReportLog>,
    /// Aliases resolved (`#room:server` → `!id:server`).
    pub aliases: std::sync::Mutex<std::collections::HashMap<String, String>>,
    /// The next transaction id's number.
    pub txns: std::sync::atomic::AtomicU64,
    /// The rooms' status notices while a turn runs tools.
    pub progress: progress::Statuses,
}

impl Shared {
    /// A fresh transaction id for a send.
    pub fn txn(&self) -> String {
        deliver::txn_id(&self.txns)
    }
}

/// Matrix, configured: the delivery side and the poller share one client.
pub struct Matrix {
    shared: Arc<Shared>,
    cfg: MatrixConfig,
    policy: MatrixPolicy,
    workspace: PathBuf,
    reminders: Option<Reminders>,
}

/// The daemon's Matrix poller: until the stop, accepted messages go to
/// `inbound`; `activity` tells whether a room's turn still runs (typing).
/// It ends by itself only when the homeserver refuses the login (it logs why).
pub struct MatrixPoller {
    pub matrix: Matrix,
    pub inbound: mpsc::Sender<InboundMessage>,
    pub activity: Arc<dyn SessionActivity>,
}

impl MatrixPoller {
    pub async fn run(self, shutdown: crate::util::shutdown::Shutdown) {
        self.matrix.poll(self.inbound, self.activity, shutdown.stop_token().clone()).await
    }
}

impl Matrix {
    /// `None` when `[matrix]` has no homeserver. `reminders` makes Done / Snooze work.
    pub fn from_config(
        cfg: &MatrixConfig,
        state_dir: &Path,
        workspace: &Path,
        reminders: Option<Reminders>,
    ) -> Result<Option<Matrix>, MatrixChannelError> {
        let Some(homeserver) = &cfg.homeserver else { return Ok(None) };
        let token = cfg
            .access_token()
            .or_else(|| cfg.user_id.as_deref().and_then(|u| Session::load(state_dir, homeserver.as_str(), u)));
        let shared = Shared {
            client: Client::new(homeserver.as_str(), token)?,
            state_dir: state_dir.to_path_buf(),
            me: std::sync::OnceLock::new(),
            reports: std::sync::Mutex::new(state::ReportLog::load(state_dir)),
            aliases: Default::default(),
            txns: Default::default(),
            progress: Default::default(),
        };
        Ok(Some(Matrix {
            shared: Arc::new(shared),
            policy: MatrixPolicy::new(&cfg.allow_from, &cfg.rooms, state_dir),
            cfg: cfg.clone(),
            workspace: workspace.to_path_buf(),
            reminders,
        }))
    }

    /// Where chat turns report what they are doing (a status notice, edited).
    pub fn progress(&self) -> Arc<dyn crate::agent::ProgressSink> {
        Arc::new(progress::Progress::new(self.shared.clone()))
    }

    /// The delivery side, for the outbox.
    pub fn channel(&self) -> Arc<dyn crate::delivery::Channel> {
        Arc::new(deliver::MatrixChannel::new(self.shared.clone(), &self.workspace))
    }

    /// Sync until `stop`; accepted messages go to `inbound`.
    pub async fn poll(
        self,
        inbound: mpsc::Sender<InboundMessage>,
        agent: Arc<dyn SessionActivity>,
        stop: CancellationToken,
    ) {
        let mut backoff = Backoff::new(MAX_BACKOFF);
        let Some(me) = self.hello(&mut backoff, &stop).await else { return };
        backoff.reset();
        let _ = self.shared.me.set(me.clone());
        let file = SyncFile::new(&self.shared.state_dir, &me);
        let position = file.load();
        tracing::info!(user = %me, resumed = position.since.is_some(), "Matrix syncing");
        let mut handler = inbound::Handler::new(self, me, inbound, agent, stop.clone());
        handler.join_configured().await;
        run(&mut handler, file, position, backoff, &stop).await;
    }

    /// Log in if needed and learn who we are (retried with `backoff` while
    /// the homeserver is not reachable); `None`: stopped, or the login is refused.
    async fn hello(&self, backoff: &mut Backoff, stop: &CancellationToken) -> Option<String> {
        loop {
            let r = tokio::select! { r = self.login_and_whoami() => r, _ = stop.cancelled() => return None };
            match r {
                Ok(me) => return Some(me),
                Err(e @ MatrixChannelError::Login(_)) => {
                    tracing::error!("{e}; Matrix syncing stopped");
                    return None;
                }
                Err(e) => {
                    let wait = backoff.next_wait();
                    tracing::warn!(error = %e, retry_in = ?wait, "the Matrix homeserver is not reachable yet");
                    if sleep_or_stop(wait, stop).await {
                        return None;
                    }
                }
            }
        }
    }

    async fn login_and_whoami(&self) -> Result<String, MatrixChannelError> {
        let client = &self.shared.client;
        if !client.has_token() {
            self.password_login().await?;
        }
        match client.whoami().await {
            Ok(me) => Ok(me),
            Err(e) if e.is_unauthorized() && self.cfg.access_token().is_none() && self.cfg.password().is_some() => {
                // A kept token that was logged out: log in again, once.
                tracing::warn!(error = %e, "the kept Matrix token was refused; logging in again");
                Session::forget(&self.shared.state_dir);
                self.password_login().await?;
                client.whoami().await.map_err(|e| login_error(&e).unwrap_or(MatrixChannelError::Api(e)))
            }
            Err(e) => Err(login_error(&e).unwrap_or(MatrixChannelError::Api(e))),
        }
    }

    /// `POST /login` with `password_env`; the token is kept (0600) for the next start.
    async fn password_login(&self) -> Result<(), MatrixChannelError> {
        let (Some(user), Some(password)) = (self.cfg.user_id.as_deref(), self.cfg.password()) else {
            return Err(MatrixChannelError::Login("no access token and no password to log in with".into()));
        };
        let client = &self.shared.client;
        let answer = client.login_password(user, &password).await.map_err(|e| match e.code() {
            Some(400..=499) if e.code() != Some(429) => MatrixChannelError::Login(e.to_string()),
            _ => MatrixChannelError::Api(e),
        })?;
        let homeserver = self.cfg.homeserver.as_ref().map(|h| h.as_str().to_string()).unwrap_or_default();
        let session = Session {
            homeserver,
            user_id: user.to_string(),
            access_token: answer.access_token.clone(),
            device_id: answer.device_id,
        };
        if let Err(e) = session.save(&self.shared.state_dir) {
            tracing::error!(error = %e, "cannot keep the Matrix token; the next start logs in again");
        }
        client.set_token(Secret::new(answer.access_token));
        tracing::info!(user, "logged in to Matrix with the password (the token is kept in the state directory)");
        Ok(())
    }
}

/// A refused token as a login error (the poller stops); anything else is retried.
fn login_error(e: &MatrixError) -> Option<MatrixChannelError> {
    e.is_unauthorized().then(|| MatrixChannelError::Login(e.to_string()))
}

/// Sync, handle each batch, save the position (see the header) until stopped.
async fn run(
    handler: &mut inbound::Handler,
    file: SyncFile,
    mut position: SyncState,
    mut backoff: Backoff,
    stop: &CancellationToken,
) {
    let filter = api::sync_filter();
    let mut saved_at = Instant::now();
    let mut dirty = false;
    loop {
        let sync = tokio::select! {
            r = handler.client().sync(position.since.as_deref(), &filter, api::SYNC_TIMEOUT_MS) => r,
            _ = stop.cancelled() => break,
        };
        let sync = match sync {
            Ok(s) => {
                backoff.reset();
                s
            }
            Err(e) if e.is_unauthorized() => {
                tracing::error!(error = %e, "the Matrix homeserver refused the token; Matrix syncing stopped");
                if handler.matrix.cfg.access_token().is_none() {
                    Session::forget(&handler.matrix.shared.state_dir);
                }
                break;
            }
            Err(e) => {
                let wait = backoff.next_wait();
                tracing::warn!(error = %e, retry_in = ?wait, "Matrix sync failed; reconnecting");
                if sleep_or_stop(wait, stop).await {
                    break;
                }
                continue;
            }
        };
        let first = position.since.is_none();
        let outcome = handler.batch(&sync, first, &mut position.handled).await;
        if outcome == inbound::Outcome::Stopped {
            // Half a batch: the old position with what was handled of it.
            save(&file, &position).await;
            return;
        }
        if outcome == inbound::Outcome::Later {
            save(&file, &position).await;
            if sleep_or_stop(backoff.next_wait(), stop).await {
                return;
            }
            continue;
        }
        let moved = position.since.as_deref() != Some(sync.next_batch.as_str()) && !sync.next_batch.is_empty();
        if moved {
            position.since = Some(sync.next_batch.clone());
            position.handled.clear();
            dirty = true;
        }
        if dirty && (outcome == inbound::Outcome::Handled || first || saved_at.elapsed() >= SAVE_EVERY) {
            save(&file, &position).await;
            saved_at = Instant::now();
            dirty = false;
        }
    }
    if dirty {
        save(&file, &position).await;
    }
}

/// Write the position on a blocking thread (an atomic write syncs, which an SD card can take long over).
async fn save(file: &SyncFile, position: &SyncState) {
    let (file, position) = (file.clone(), position.clone());
    if let Err(e) = crate::util::tasks::blocking(move || file.save(&position)).await {
        tracing::error!(error = %e, "cannot save the Matrix sync position; events may be handled again after a restart");
    }
}

/// Sleep for `d`; `true` if `stop` fired first.
async fn sleep_or_stop(d: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = stop.cancelled() => true,
    }
}

/// The rooms file, read and written off the runtime thread by the poller (its one writer).
pub(crate) async fn load_rooms(state_dir: &Path) -> Rooms {
    let dir = state_dir.to_path_buf();
    crate::util::tasks::blocking(move || Rooms::load(&dir)).await
}

pub(crate) async fn save_rooms(state_dir: &Path, rooms: Rooms) {
    let dir = state_dir.to_path_buf();
    if let Err(e) = crate::util::tasks::blocking(move || rooms.save(&dir)).await {
        tracing::error!(error = %e, "cannot save the list of Matrix rooms");
    }
}

/// A configured room's record.
pub(crate) fn configured(alias: Option<&str>) -> RoomRecord {
    RoomRecord { alias: alias.map(str::to_string), ..Default::default() }
}

/// Check the login once at daemon start: a refused token is an error; an
/// unreachable homeserver is not (the poller keeps trying). A password login
/// is left to the poller.
pub async fn check_login(cfg: &MatrixConfig) -> Result<(), MatrixChannelError> {
    let (Some(homeserver), Some(token)) = (&cfg.homeserver, cfg.access_token()) else { return Ok(()) };
    let client = Client::new(homeserver.as_str(), Some(token))?;
    let answer = tokio::time::timeout(START_CHECK_TIMEOUT, client.whoami())
        .await
        .unwrap_or_else(|_| Err(MatrixError::Transport(format!("no answer within {START_CHECK_TIMEOUT:?}"))));
    match answer {
        Ok(_) => Ok(()),
        Err(e) if e.is_unauthorized() => Err(MatrixChannelError::Login(e.to_string())),
        Err(e) => {
            tracing::warn!(error = %e, "cannot reach the Matrix homeserver now; the bot starts when it is up");
            Ok(())
        }
    }
}
