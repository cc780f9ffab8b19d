//! `bramble status`'s ntfy line and `bramble doctor`'s check: the server,
//! the token, the topics read and where reading stands, the buttons.

use std::path::Path;
use std::time::Duration;

use super::inbound::SinceState;
use crate::clients::ntfy::Client;
use crate::config::ntfy::NtfyConfig;

/// One line for `bramble status` (blocking: reads the state file).
pub fn status_line(c: &NtfyConfig, alerts_deliver_empty: bool, state_dir: &Path) -> String {
    let Some(server) = c.server.as_ref().map(|s| s.as_str()) else { return "not configured".into() };
    if let Some(why) = c.problem() {
        return format!("OFF: {why}");
    }
    let token = match &c.token_env {
        Some(env) if c.token().is_some() => format!("token from {env}"),
        Some(env) => format!("token MISSING: set {env}"),
        None => "no token".into(),
    };
    let since = SinceState::load(state_dir, server, &c.subscribe);
    let read = match (c.subscribe.len(), since.last) {
        (0, _) => "reads no topic".to_string(),
        (n, Some(id)) => format!("reads {n} topic(s), last message {id}"),
        (n, None) => format!("reads {n} topic(s), no message yet"),
    };
    let alerts = match (&c.alert_topic, alerts_deliver_empty) {
        (Some(t), true) => format!("; alerts and the dead-man to ntfy:{t}"),
        _ => String::new(),
    };
    let buttons =
        if c.callback_base.is_some() { "reminder buttons on" } else { "no reminder buttons (no callback_base)" };
    format!("{server} ({token}); {read}; {buttons}{alerts}")
}

/// What `doctor` says: `Ok(None)` not configured, `Ok(Some((found, warnings)))`, or why it fails.
pub async fn probe(c: &NtfyConfig, limit: Duration) -> Result<Option<(String, Vec<String>)>, String> {
    let Some(server) = c.server.as_ref().map(|s| s.as_str()) else { return Ok(None) };
    if let Some(why) = c.problem() {
        return Err(why);
    }
    let mut warnings = Vec::new();
    if let (Some(env), None) = (&c.token_env, c.token()) {
        warnings.push(format!("`{env}` is not set: publishing and reading without a token"));
    }
    let client = Client::new(server, c.token()).map_err(|e| e.to_string())?;
    // Opening a topic's stream checks the address, the token and the right to read it.
    let topic = c.subscribe.first().or(c.alert_topic.as_ref()).or(c.topics.keys().next());
    let Some(topic) = topic else {
        return Ok(Some((format!("{server}: no topic configured to publish to or read"), warnings)));
    };
    match tokio::time::timeout(limit, client.probe(topic)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(format!("{topic}: {e}")),
        Err(_) => return Err(format!("no answer within {} s", limit.as_secs())),
    }
    if c.callback_base.is_some() && !cfg!(feature = "webhook") {
        warnings.push("callback_base needs the webhook listener (cargo feature `webhook`)".into());
    }
    Ok(Some((format!("{server}: topic {topic} can be read"), warnings)))
}
