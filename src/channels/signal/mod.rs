//! The Signal channel, through a signal-cli daemon the owner runs: its event
//! stream in, `send` out to `signal:<number|uuid|group.<id>>`.
//!
//! - [`crate::clients::signal`]: the JSON-RPC wire (HTTP + SSE, or a socket).
//! - [`inbound`]: what one `receive` event does (allow-list, spoofed numbers,
//!   our own sync messages, replays, reactions for Done / Snooze, files).
//! - [`deliver`]: the `Channel` that sends reports (files as data URIs).
//! - [`state`]: what is kept in the state directory.
//!
//! ## The stream and the position
//!
//! The stream is opened with the last event id seen (signal-cli keeps its
//! last 1000 events and sends those after it; after its own restart it sends
//! all it kept). Every failure reconnects with a backoff from 1 s to 60 s; a
//! stream silent past the keep-alive is a dead one. Whatever comes twice is
//! dropped by sender + timestamp ([`state::Seen`], kept across restarts), so
//! a replay hands nothing over twice; the position is saved after each
//! message handled (at least once: a crash between hand-over and save
//! replays that one message, which the seen list then drops next time).
//!
//! ## Who is answered
//!
//! Only `[signal] allow_from` people ([`crate::policy::signal`]: a number
//! is pinned to its uuid) and accounts paired by uuid (a stranger's `/pair
//! <code>` in a direct message while a Signal code is pending: never from a
//! number known with another uuid, never in a group), in a direct chat or in
//! a group of `[signal] groups`. A stranger is ignored and logged once; a known number with
//! another uuid is refused as spoofed. Our own messages (sync messages, our
//! account as sender) are never input; edits, receipts, typing and stories
//! are skipped.

pub mod deliver;
pub mod inbound;
pub mod state;
pub mod status;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::agent::SessionActivity;
use crate::bus::InboundMessage;
use crate::clients::signal::{Client, Next, SignalError};
use crate::config::SignalConfig;
use crate::policy::signal::SignalPolicy;
use crate::util::timer::Backoff;
use crate::work::reminders::Reminders;

/// Backoff after a failed stream: from 1 s, doubling, to this.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Why Signal cannot start.
#[derive(Debug, thiserror::Error)]
pub enum SignalChannelError {
    #[error("[signal] endpoint is not usable: {0}")]
    Endpoint(String),
    #[error(transparent)]
    Client(#[from] SignalError),
}

/// What the stream reader and the delivery side share.
pub(crate) struct Shared {
    pub client: Client,
    pub state_dir: PathBuf,
    /// Our own number, if configured (our messages are never input).
    pub account: Option<String>,
    /// Recent job reports, for Done / Snooze.
    pub reports: std::sync::Mutex<state::ReportLog>,
    /// `[signal] max_file_mb` in bytes: files larger are neither taken in nor sent.
    pub max_file: u64,
}

/// Signal, configured: the delivery side and the reader share one client.
pub struct Signal {
    shared: Arc<Shared>,
    cfg: SignalConfig,
    policy: SignalPolicy,
    workspace: PathBuf,
    reminders: Option<Reminders>,
}

/// The daemon's Signal reader: until the stop, accepted messages go to `inbound`.
pub struct SignalPoller {
    pub signal: Signal,
    pub inbound: mpsc::Sender<InboundMessage>,
    pub activity: Arc<dyn SessionActivity>,
}

impl SignalPoller {
    pub async fn run(self, shutdown: crate::util::shutdown::Shutdown) {
        self.signal.listen(self.inbound, self.activity, shutdown.stop_token().clone()).await
    }
}

impl Signal {
    /// `None` when `[signal]` has no endpoint. `reminders` makes Done / Snooze work.
    pub fn from_config(
        cfg: &SignalConfig,
        state_dir: &Path,
        workspace: &Path,
        reminders: Option<Reminders>,
    ) -> Result<Option<Signal>, SignalChannelError> {
        let Some(endpoint) = cfg.endpoint.as_deref() else { return Ok(None) };
        let endpoint = crate::config::SignalEndpoint::parse(endpoint).map_err(SignalChannelError::Endpoint)?;
        let shared = Shared {
            client: Client::new(endpoint, cfg.account.clone())?,
            state_dir: state_dir.to_path_buf(),
            account: cfg.account.clone(),
            reports: std::sync::Mutex::new(state::ReportLog::load(state_dir)),
            max_file: cfg.max_file_mb * 1024 * 1024,
        };
        Ok(Some(Signal {
            shared: Arc::new(shared),
            policy: SignalPolicy::new(&cfg.allow_from, &cfg.groups, state_dir),
            cfg: cfg.clone(),
            workspace: workspace.to_path_buf(),
            reminders,
        }))
    }

    /// The delivery side, for the outbox.
    pub fn channel(&self) -> Arc<dyn crate::delivery::Channel> {
        Arc::new(deliver::SignalChannel::new(self.shared.clone(), &self.workspace))
    }

    /// Read the event stream until `stop`; accepted messages go to `inbound`.
    pub async fn listen(
        self,
        inbound: mpsc::Sender<InboundMessage>,
        agent: Arc<dyn SessionActivity>,
        stop: CancellationToken,
    ) {
        let dir = self.shared.state_dir.clone();
        let seen = crate::util::tasks::blocking(move || state::Seen::load(&dir)).await;
        if self.policy.is_empty() {
            tracing::warn!("[signal] allow_from is empty: the bot answers nobody");
        }
        let mut handler = inbound::Handler::new(self, seen, inbound, agent, stop.clone());
        let mut backoff = Backoff::new(MAX_BACKOFF);
        let mut was_up = false;
        let mut state: Option<state::Link> = None;
        loop {
            let last = handler.seen.last_event_id.clone();
            let opened = tokio::select! {
                r = handler.client().events(last.as_deref()) => r,
                _ = stop.cancelled() => break,
            };
            let mut events = match opened {
                Ok(e) => e,
                Err(e) => {
                    link(&mut state, false, Some(e.to_string()), &handler).await;
                    let wait = backoff.next_wait();
                    tracing::warn!(error = %e, retry_in = ?wait, "the signal-cli daemon is not reachable; retrying");
                    if sleep_or_stop(wait, &stop).await {
                        break;
                    }
                    continue;
                }
            };
            tracing::info!(endpoint = %handler.client().endpoint(), resumed = last.is_some(), "Signal listening");
            was_up = true;
            link(&mut state, true, None, &handler).await;
            let ended = loop {
                let next = tokio::select! {
                    n = events.next() => n,
                    _ = stop.cancelled() => break None,
                };
                match next {
                    Ok(Some(Next::Event(ev))) => {
                        backoff.reset();
                        if !handler.event(ev).await {
                            break None; // stopping, or the bus is gone
                        }
                    }
                    Ok(Some(Next::Skipped(why))) => tracing::warn!("a Signal event was skipped: {why}"),
                    Ok(None) => break Some("the daemon closed the event stream".to_string()),
                    Err(e) => break Some(e.to_string()),
                }
            };
            let Some(why) = ended else { break };
            link(&mut state, false, Some(why.clone()), &handler).await;
            let wait = backoff.next_wait();
            tracing::warn!(error = why, retry_in = ?wait, "the Signal event stream ended; reconnecting");
            if sleep_or_stop(wait, &stop).await {
                break;
            }
        }
        handler.save().await;
        link(&mut state, false, Some("bramble stopped".into()), &handler).await;
        if !was_up {
            tracing::info!("Signal stopped before the daemon was reached");
        }
    }
}

/// Record the link's state for `bramble status` when it changed.
async fn link(last: &mut Option<state::Link>, connected: bool, error: Option<String>, handler: &inbound::Handler) {
    if last.as_ref().is_some_and(|l| l.connected == connected && l.error == error) {
        return;
    }
    let now = jiff::Timestamp::now().to_string();
    let l = state::Link { connected, since: now, error };
    *last = Some(l.clone());
    let dir = handler.signal.shared.state_dir.clone();
    if let Err(e) = crate::util::tasks::blocking(move || l.save(&dir)).await {
        tracing::warn!(error = %e, "cannot record the Signal link's state for `bramble status`");
    }
}

/// Sleep for `d`; `true` if `stop` fired first.
async fn sleep_or_stop(d: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = stop.cancelled() => true,
    }
}
