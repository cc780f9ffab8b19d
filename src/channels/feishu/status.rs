//! `bramble status`'s Feishu / Lark line and `bramble doctor`'s check:
//! whether it is configured, where the long connection stands, and whether
//! the app's credentials get a token.

use std::path::Path;
use std::time::Duration;

use super::state::StateFile;
use crate::clients::feishu::Client;
use crate::config::FeishuConfig;

/// One line for `bramble status` (blocking: reads the state file).
pub fn status_line(c: &FeishuConfig, state_dir: &Path) -> String {
    let Some(app_id) = c.app_id.as_deref() else { return "not configured".into() };
    if let Some(why) = c.problem() {
        return format!("OFF: {why}");
    }
    let secret = match (&c.app_secret_env, c.app_secret()) {
        (Some(env), Some(_)) => format!("secret from {env}"),
        (Some(env), None) => format!("secret MISSING: set {env}"),
        (None, _) => "no secret configured".into(),
    };
    let s = StateFile::new(state_dir).load();
    let connected = match &s.connected {
        Some(t) => format!("last connected {t}"),
        None => "never connected".into(),
    };
    let error = s.last_error.as_deref().map(|e| format!("; last error {e}")).unwrap_or_default();
    format!("app {app_id} at {} ({secret}; {connected}{error}); allow_from: {} user(s)", c.base(), c.allow_from.len())
}

/// What `doctor` says: `Ok(None)` not configured, `Ok(Some((found, warnings)))`, or why it fails.
pub async fn probe(c: &FeishuConfig, limit: Duration) -> Result<Option<(String, Vec<String>)>, String> {
    let Some(app_id) = c.app_id.as_deref() else { return Ok(None) };
    if let Some(why) = c.problem() {
        return Err(why);
    }
    let Some(secret) = c.app_secret() else {
        return Err(format!(
            "the App Secret is not in the environment: set {}",
            c.app_secret_env.as_deref().unwrap_or("[feishu] app_secret_env")
        ));
    };
    crate::install_crypto();
    let client = Client::new(&c.base(), app_id, secret).map_err(|e| e.to_string())?;
    let (id, name) = match tokio::time::timeout(limit, client.bot_info()).await {
        Ok(Ok(me)) => me,
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err(format!("no answer within {} s", limit.as_secs())),
    };
    let mut warnings = Vec::new();
    if c.allow_from.is_empty() {
        warnings.push("[feishu] allow_from is empty: the bot answers nobody".into());
    }
    Ok(Some((format!("the app's token works: bot {name} ({id}) at {}", c.base()), warnings)))
}
