//! `bramble status`'s Signal line and `bramble doctor`'s check: whether it
//! is configured, whether the daemon's event stream is open (as the running
//! bramble last recorded it) and the last error; `doctor` asks the daemon.

use std::path::Path;
use std::time::Duration;

use super::state::Link;
use crate::clients::signal::Client;
use crate::config::SignalConfig;

/// One line for `bramble status` (blocking: reads the state files).
pub fn status_line(c: &SignalConfig, state_dir: &Path) -> String {
    let Some(endpoint) = c.endpoint.as_deref() else { return "not configured".into() };
    if let Some(why) = c.problem() {
        return format!("OFF: {why}");
    }
    let link = match Link::load(state_dir) {
        Some(Link { connected: true, since, .. }) => format!("connected since {since}"),
        Some(Link { connected: false, since, error }) => {
            format!("NOT CONNECTED since {since}: {}", error.as_deref().unwrap_or("unknown"))
        }
        None => "never connected".into(),
    };
    format!(
        "{} at {endpoint} ({link}); allow_from: {} number(s)/uuid(s), {} group(s)",
        c.account.as_deref().unwrap_or("the account"),
        c.allow_from.len(),
        c.groups.len()
    )
}

/// What `doctor` says: `Ok(None)` not configured, `Ok(Some((found, warnings)))`, or why it fails.
pub async fn probe(c: &SignalConfig, limit: Duration) -> Result<Option<(String, Vec<String>)>, String> {
    let Some(endpoint) = c.endpoint() else {
        return match c.problem() {
            Some(why) => Err(why),
            None => Ok(None),
        };
    };
    if let Some(why) = c.problem() {
        return Err(why);
    }
    let client = Client::new(endpoint.clone(), c.account.clone()).map_err(|e| e.to_string())?;
    match tokio::time::timeout(limit, client.check()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(format!("{e}: is `signal-cli daemon` running there? (docs/channels/signal.md)")),
        Err(_) => return Err(format!("no answer from {endpoint} within {} s", limit.as_secs())),
    }
    let mut warnings = Vec::new();
    if c.allow_from.is_empty() {
        warnings.push("[signal] allow_from is empty: the bot answers nobody".into());
    }
    if c.account.is_none() {
        warnings.push("[signal] account is not set: needed when the daemon serves several accounts".into());
    }
    Ok(Some((format!("the signal-cli daemon answers at {endpoint}"), warnings)))
}
