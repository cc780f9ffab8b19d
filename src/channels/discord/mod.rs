//! The Discord channel: gateway events in, REST out, to `discord:<channel id>`.
//!
//! - [`crate::clients::discord`]: the REST API and the gateway's messages
//!   (ours; see its header for why not serenity or twilight).
//! - [`gateway`]: the connection loop — Hello, Identify or Resume, heartbeats
//!   with their acknowledgements, Reconnect and Invalid Session, backoff.
//! - [`inbound`]: what a message or a button press does (allow-list, loops,
//!   files, Done / Snooze).
//! - [`deliver`]: the `Channel` that posts reports (chunks of 2000
//!   characters, files, Done / Snooze buttons under reminders).
//! - [`progress`]: one status message per channel, edited while a turn runs tools.
//! - [`state`]: where the gateway connection stands, kept for `bramble status`.
//! - [`status`]: `bramble status` and `doctor`.
//!
//! ## Who is answered
//!
//! Only `[discord] allow_from` users and those paired with `bramble pair
//! --channel discord` (a stranger's `/pair <code>` in a DM, only while a
//! Discord code is pending; never in a guild channel), by id: in a DM, or in one of
//! `[discord] channels` (guild channels; any other guild channel is not
//! read). Our own messages (author = the user READY named: the loop), other
//! bots' and webhooks' messages are never input. A stranger is ignored and
//! logged once per user; a stranger's button press changes nothing and is
//! told so (ephemerally, only they see it). Edits (MESSAGE_UPDATE) are not
//! new commands. A message id seen recently is not handled twice (a resume
//! that replays what was already handled).
//!
//! ## Nothing lost, nothing doubled
//!
//! The last sequence number is taken only after its dispatch was handled
//! (on the bus), so a drop resumes right after it: the gateway replays what
//! was missed. A restart of the daemon starts a new session (Discord does
//! not replay across sessions): messages sent while bramble was down are not
//! read, as with a person who was away.

pub mod deliver;
pub mod gateway;
pub mod inbound;
pub mod progress;
pub mod state;
pub mod status;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::agent::SessionActivity;
use crate::bus::InboundMessage;
use crate::clients::discord::{DiscordError, Rest};
use crate::config::DiscordConfig;
use crate::policy::discord::DiscordPolicy;
use crate::work::reminders::Reminders;

/// How long the start-up check may take.
const START_CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// Why Discord cannot start.
#[derive(Debug, thiserror::Error)]
pub enum DiscordChannelError {
    #[error("Discord refused the bot token ({0}): check [discord] token_env")]
    Login(String),
    #[error("[discord] token_env names {0}, which is not set: set it (or a systemd credential of that name)")]
    NoToken(String),
    #[error(transparent)]
    Api(#[from] DiscordError),
}

/// What the gateway loop and the delivery side share.
pub(crate) struct Shared {
    pub rest: Arc<Rest>,
    pub state_dir: PathBuf,
    /// Our own user id, once READY said it (0 before).
    pub me: AtomicU64,
    pub progress: progress::Progress,
}

/// Discord, configured: the delivery side and the gateway loop share one client.
pub struct Discord {
    shared: Arc<Shared>,
    cfg: DiscordConfig,
    policy: DiscordPolicy,
    workspace: PathBuf,
    reminders: Option<Reminders>,
}

/// The daemon's gateway loop: until the stop, accepted messages go to
/// `inbound`; `activity` tells whether a channel's turn still runs (typing).
/// It ends by itself only when Discord refuses the token or the intents.
pub struct DiscordPoller {
    pub discord: Discord,
    pub inbound: mpsc::Sender<InboundMessage>,
    pub activity: Arc<dyn SessionActivity>,
}

impl DiscordPoller {
    pub async fn run(self, shutdown: crate::util::shutdown::Shutdown) {
        let handler = inbound::Handler::new(self.discord, self.inbound, self.activity, shutdown.stop_token().clone());
        gateway::run(handler, shutdown.stop_token().clone()).await
    }
}

impl Discord {
    /// `None` when `[discord]` names no token variable. `reminders` makes Done / Snooze work.
    pub fn from_config(
        cfg: &DiscordConfig,
        state_dir: &Path,
        workspace: &Path,
        reminders: Option<Reminders>,
    ) -> Result<Option<Discord>, DiscordChannelError> {
        let Some(env) = &cfg.token_env else { return Ok(None) };
        let token = cfg.token().ok_or_else(|| DiscordChannelError::NoToken(env.clone()))?;
        let rest = Arc::new(Rest::new(cfg.api_base.as_str(), token)?);
        let shared = Arc::new(Shared {
            rest: rest.clone(),
            state_dir: state_dir.to_path_buf(),
            me: AtomicU64::new(0),
            progress: progress::Progress::new(rest),
        });
        Ok(Some(Discord {
            shared,
            policy: DiscordPolicy::new(cfg.users(), cfg.channel_ids(), state_dir),
            cfg: cfg.clone(),
            workspace: workspace.to_path_buf(),
            reminders,
        }))
    }

    /// The delivery side, for the outbox.
    pub fn channel(&self) -> Arc<dyn crate::delivery::Channel> {
        Arc::new(deliver::DiscordChannel::new(self.shared.clone(), &self.workspace))
    }

    /// The status messages of chat turns; steps of other channels go on to `next`.
    pub fn progress(&self, next: Option<Arc<dyn crate::agent::ProgressSink>>) -> Arc<dyn crate::agent::ProgressSink> {
        Arc::new(progress::Chain { discord: self.shared.progress.clone(), next })
    }
}

/// Sleep for `d`; `true` if `stop` fired first.
pub(crate) async fn sleep_or_stop(d: Duration, stop: &tokio_util::sync::CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = stop.cancelled() => true,
    }
}

/// Check the token once at daemon start: a refused token is an error; an
/// unreachable Discord is not (the gateway loop keeps trying).
pub async fn check_login(cfg: &DiscordConfig) -> Result<(), DiscordChannelError> {
    let Some(env) = &cfg.token_env else { return Ok(()) };
    let token = cfg.token().ok_or_else(|| DiscordChannelError::NoToken(env.clone()))?;
    let rest = Rest::new(cfg.api_base.as_str(), token)?;
    let answer = tokio::time::timeout(START_CHECK_TIMEOUT, rest.me())
        .await
        .unwrap_or_else(|_| Err(DiscordError::Transport(format!("no answer within {START_CHECK_TIMEOUT:?}"))));
    match answer {
        Ok(_) => Ok(()),
        Err(e) if e.is_unauthorized() => Err(DiscordChannelError::Login(e.to_string())),
        Err(e) => {
            tracing::warn!(error = %e, "cannot reach Discord now; the bot starts when it is up");
            Ok(())
        }
    }
}
