//! `bramble status`'s Matrix line and `bramble doctor`'s check: whether it
//! is configured, how it logs in, where syncing stands, and the rooms it
//! cannot read (encrypted ones).

use std::path::Path;
use std::time::Duration;

use crate::clients::matrix::Client;
use crate::config::MatrixConfig;
use crate::policy::matrix::Rooms;

/// One line for `bramble status` (blocking: reads the state files).
pub fn status_line(c: &MatrixConfig, state_dir: &Path) -> String {
    let Some(homeserver) = c.homeserver.as_ref().map(|h| h.as_str()) else { return "not configured".into() };
    if let Some(why) = c.problem() {
        return format!("OFF: {why}");
    }
    let login = match (&c.access_token_env, &c.password_env) {
        (Some(env), _) if c.access_token().is_some() => format!("token from {env}"),
        (Some(env), _) => format!("token MISSING: set {env}"),
        (None, Some(_)) if state_dir.join(super::state::SESSION_FILE).exists() => "kept password-login token".into(),
        (None, Some(env)) if c.password().is_some() => format!("logs in with the password from {env}"),
        (None, Some(env)) => format!("password MISSING: set {env}"),
        (None, None) => "no login configured".into(),
    };
    let synced = if state_dir.join("matrix-sync.json").exists() { "synced before" } else { "never synced" };
    let rooms = Rooms::load(state_dir);
    format!(
        "{} at {homeserver} ({login}; {synced}); {} room(s){}; allow_from: {} user(s)",
        c.user_id.as_deref().unwrap_or("the bot"),
        rooms.rooms.len(),
        encrypted_note(&rooms),
        c.allow_from.len()
    )
}

/// `, 1 ENCRYPTED (not read): !a:x` or nothing.
fn encrypted_note(rooms: &Rooms) -> String {
    let e = rooms.encrypted();
    if e.is_empty() {
        return String::new();
    }
    format!(", {} ENCRYPTED (bramble cannot read them): {}", e.len(), e.join(", "))
}

/// What `doctor` says: `Ok(None)` not configured, `Ok(Some((found, warnings)))`, or why it fails.
pub async fn probe(
    c: &MatrixConfig,
    state_dir: &Path,
    limit: Duration,
) -> Result<Option<(String, Vec<String>)>, String> {
    let Some(homeserver) = c.homeserver.as_ref().map(|h| h.as_str()) else { return Ok(None) };
    if let Some(why) = c.problem() {
        return Err(why);
    }
    let token = c
        .access_token()
        .or_else(|| c.user_id.as_deref().and_then(|u| super::state::Session::load(state_dir, homeserver, u)));
    let mut warnings = Vec::new();
    let Some(token) = token else {
        return match c.password() {
            Some(_) => Ok(Some(("not logged in yet: the daemon logs in with the password at start".into(), warnings))),
            None => Err("no access token and no password in the environment: set the variable [matrix] names".into()),
        };
    };
    crate::install_crypto();
    let client = Client::new(homeserver, Some(token)).map_err(|e| e.to_string())?;
    let me = match tokio::time::timeout(limit, client.whoami()).await {
        Ok(Ok(me)) => me,
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err(format!("no answer within {} s", limit.as_secs())),
    };
    if c.allow_from.is_empty() {
        warnings.push("[matrix] allow_from is empty: the bot answers nobody".into());
    }
    let rooms = Rooms::load(state_dir);
    for room in rooms.encrypted() {
        warnings.push(format!(
            "{room} is encrypted: bramble cannot read it; use a room created with encryption off \
             (docs/channels/matrix.md)"
        ));
    }
    Ok(Some((format!("logged in as {me} at {homeserver}; {} room(s)", rooms.rooms.len()), warnings)))
}
