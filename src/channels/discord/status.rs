//! `bramble status`'s Discord line and `bramble doctor`'s check: whether it
//! is configured, whether the token is there and accepted, the gateway, and
//! where the running daemon's connection stands ([`super::state`]).

use std::path::Path;
use std::time::Duration;

use crate::clients::discord::Rest;
use crate::config::DiscordConfig;
use crate::policy::discord::Dms;

use super::state::Connection;

/// One line for `bramble status` (blocking: reads the DMs and connection
/// files). `daemon`: the pid of the daemon that answered `status`, if one did.
pub fn status_line(c: &DiscordConfig, state_dir: &Path, daemon: Option<u32>) -> String {
    let Some(env) = &c.token_env else { return "not configured".into() };
    if let Some(why) = c.problem() {
        return format!("OFF: {why}");
    }
    let (connection, live) = match Connection::load(state_dir) {
        Some(conn) => {
            let live = match daemon {
                Some(pid) => pid == conn.pid,
                None => Path::new(&format!("/proc/{}", conn.pid)).exists(),
            };
            (conn.words(live), live)
        }
        None => ("never connected".into(), false),
    };
    // A live connection means the daemon's environment has the token, whatever this shell's has.
    let token = match (c.token().is_some(), live) {
        (true, _) => format!("token from {env}"),
        (false, true) => format!("token from {env} in the running daemon"),
        (false, false) => format!("token MISSING: set {env}"),
    };
    let dms = Dms::load(state_dir).dms.len();
    let paired = crate::policy::pairing::paired(state_dir, crate::policy::pairing::PairChannel::Discord).len();
    let paired = if paired > 0 { format!(" (+{paired} paired)") } else { String::new() };
    format!(
        "{connection}; bot ({token}); allow_from: {} user(s){paired}; {} guild channel(s); {dms} DM(s) known",
        c.allow_from.len(),
        c.channels.len()
    )
}

/// What `doctor` says: `Ok(None)` not configured, `Ok(Some((found, warnings)))`, or why it fails.
pub async fn probe(c: &DiscordConfig, limit: Duration) -> Result<Option<(String, Vec<String>)>, String> {
    let Some(env) = &c.token_env else { return Ok(None) };
    if let Some(why) = c.problem() {
        return Err(why);
    }
    let Some(token) = c.token() else {
        return Err(format!("{env} is not set: put the bot token there (developer portal → your application → Bot)"));
    };
    let rest = Rest::new(c.api_base.as_str(), token).map_err(|e| e.to_string())?;
    let me = match tokio::time::timeout(limit, rest.me()).await {
        Ok(Ok(me)) => me,
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err(format!("no answer within {} s", limit.as_secs())),
    };
    let mut warnings = Vec::new();
    if c.allow_from.is_empty() {
        warnings.push("[discord] allow_from is empty: the bot answers nobody".into());
    }
    let gateway = match &c.gateway {
        Some(g) => g.clone(),
        None => match tokio::time::timeout(limit, rest.gateway_url()).await {
            Ok(Ok(url)) => url,
            Ok(Err(e)) => return Err(format!("the token works, but the gateway is not available: {e}")),
            Err(_) => return Err(format!("no gateway answer within {} s", limit.as_secs())),
        },
    };
    let name = me["username"].as_str().unwrap_or("?");
    let id = me["id"].as_str().unwrap_or("?");
    Ok(Some((format!("logged in as {name} ({id}); gateway {gateway}"), warnings)))
}
