//! ntfy: reports as push notifications on `ntfy:<topic>`, commands typed in
//! the ntfy app on `[ntfy] subscribe` topics, and a reminder's Done / Snooze
//! buttons calling back to bramble.
//!
//! - [`deliver`]: the `Channel` for `ntfy:<topic>` (title, priority, tags,
//!   click, an attachment by URL or uploaded, the buttons).
//! - [`inbound`]: one long-lived JSON stream per subscribed topic,
//!   reconnecting with backoff and `since=<last id>` (kept in
//!   `ntfy-since.json`), so a message is handled once across drops and restarts.
//! - [`callback`]: the buttons' one-time tokens and the `/ntfy/<token>/…`
//!   route on the webhook listener.
//!
//! ntfy carries no sender: whoever can publish to a topic (knows its name
//! and, on a protected server, holds a token) is the caller. So a turn from
//! a topic acts for [`Principal::Anonymous`](crate::bus::Principal) under
//! `[policy.ntfy]` (no commands, no file writes by default), like a webhook
//! caller, never as a person. Everything bramble publishes carries the tag
//! [`OWN_TAG`]; a message with it is never taken as input (no loop).

pub mod callback;
pub mod deliver;
pub mod inbound;
pub mod status;

use std::path::Path;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::bus::InboundMessage;
use crate::clients::ntfy::{Client, NtfyError};
use crate::config::ntfy::NtfyConfig;
use crate::work::reminders::Reminders;

/// The tag on everything bramble publishes: a message with it is bramble's own.
pub const OWN_TAG: &str = "bramble";
/// `ntfy-since.json`: the last message id handled on each topic.
pub const SINCE_FILE: &str = "ntfy-since.json";

/// What the channel's parts share.
pub struct Shared {
    pub cfg: NtfyConfig,
    pub client: Client,
    pub state_dir: std::path::PathBuf,
    pub callbacks: Option<callback::Callbacks>,
}

/// The configured ntfy channel, built and not yet started.
pub struct Ntfy {
    shared: Arc<Shared>,
    workspace: std::path::PathBuf,
}

impl Ntfy {
    /// `None` when `[ntfy]` has no server. `reminders` makes the buttons work
    /// (with `callback_base` set and the webhook listener in this build).
    pub fn from_config(
        cfg: &NtfyConfig,
        state_dir: &Path,
        workspace: &Path,
        reminders: Option<Reminders>,
    ) -> Result<Option<Ntfy>, NtfyError> {
        let Some(server) = cfg.server.as_ref() else { return Ok(None) };
        if let (Some(env), None) = (&cfg.token_env, cfg.token()) {
            tracing::warn!("ntfy: `{env}` is not set: reports wait until it is; topics are read without a token");
        }
        let client = Client::new(server.as_str(), cfg.token())?;
        let callbacks = match (&cfg.callback_base, reminders) {
            (Some(base), Some(r)) if cfg!(feature = "webhook") => {
                Some(callback::Callbacks::new(base.as_str(), cfg.callback_ttl.get(), state_dir, r))
            }
            _ => None,
        };
        let shared = Shared { cfg: cfg.clone(), client, state_dir: state_dir.to_path_buf(), callbacks };
        Ok(Some(Ntfy { shared: Arc::new(shared), workspace: workspace.to_path_buf() }))
    }

    /// The `ntfy:<topic>` delivery channel.
    pub fn channel(&self) -> Arc<dyn crate::delivery::Channel> {
        Arc::new(deliver::NtfyChannel::new(self.shared.clone(), &self.workspace))
    }

    /// The subscriber of `[ntfy] subscribe` (`None`: no topic to read).
    pub fn subscriber(&self, inbound: mpsc::Sender<InboundMessage>) -> Option<inbound::Subscriber> {
        (!self.shared.cfg.subscribe.is_empty()).then(|| inbound::Subscriber::new(self.shared.clone(), inbound))
    }

    /// The buttons' route on the webhook listener (`None`: no `callback_base`).
    #[cfg(feature = "webhook")]
    pub fn route(&self) -> Option<Arc<dyn crate::channels::webhook::Route>> {
        self.shared.callbacks.as_ref()?;
        Some(Arc::new(callback::CallbackRoute(self.shared.clone())))
    }
}
