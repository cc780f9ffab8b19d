//! `[discord]`: a Discord bot bramble talks through (the gateway WebSocket
//! for events, REST v10 for sending; see docs/channels/discord.md).
//!
//! Its own file so the section's types and checks sit together. The bot
//! token only by a `*_env` name. Ids are Discord's snowflakes written as
//! strings (`"80351110224678912"`), the form Discord's own JSON uses: a
//! number that large loses digits in many tools that copy it.

use serde::Deserialize;

use super::{secret_from_env, HttpUrl, Secret};

/// Discord's REST API, version 10.
pub const DEFAULT_API_BASE: &str = "https://discord.com/api/v10";

/// `[discord]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiscordConfig {
    /// The variable (or systemd credential) holding the bot token; unset: no Discord.
    pub token_env: Option<String>,
    /// User ids that may talk to the bot (in a DM, or in an allowed channel). Empty: nobody.
    pub allow_from: Vec<String>,
    /// Guild (server) text channel ids where allowed users' messages are
    /// answered, and which turns may post to. DMs need no entry.
    pub channels: Vec<String>,
    /// The REST base (tests point it at a fake).
    pub api_base: HttpUrl,
    /// The gateway's `wss://` URL; unset: asked of `GET /gateway/bot`.
    pub gateway: Option<String>,
    /// Files larger than this are not downloaded.
    pub max_file_mb: u64,
    /// A message longer than this many characters is cut to it.
    pub max_message_chars: usize,
}

impl Default for DiscordConfig {
    fn default() -> Self {
        DiscordConfig {
            token_env: None,
            allow_from: Vec::new(),
            channels: Vec::new(),
            api_base: HttpUrl(DEFAULT_API_BASE.into()),
            gateway: None,
            max_file_mb: 20,
            max_message_chars: 16_000,
        }
    }
}

/// A snowflake: a non-zero 64-bit number, in decimal.
pub fn snowflake(text: &str) -> Option<u64> {
    let t = text.trim();
    if t.is_empty() || t.len() > 20 || !t.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    t.parse().ok().filter(|n| *n > 0)
}

impl DiscordConfig {
    /// Whether `[discord]` names a token variable (the channel is wanted).
    pub fn configured(&self) -> bool {
        self.token_env.is_some()
    }

    /// The bot token from `token_env`, if set and present.
    pub fn token(&self) -> Option<Secret> {
        self.token_env.as_deref().and_then(secret_from_env)
    }

    /// The allowed users, as numbers (bad entries are `problem`s, skipped here).
    pub fn users(&self) -> Vec<u64> {
        self.allow_from.iter().filter_map(|u| snowflake(u)).collect()
    }

    /// The allowed guild channels, as numbers.
    pub fn channel_ids(&self) -> Vec<u64> {
        self.channels.iter().filter_map(|c| snowflake(c)).collect()
    }

    /// What `bramble check` says about the section (`None`: fine or not configured).
    pub fn problem(&self) -> Option<String> {
        if !self.configured() {
            return None;
        }
        for id in &self.allow_from {
            if snowflake(id).is_none() {
                return Some(format!(
                    "[discord] allow_from: `{id}` is not a Discord user id (a number like \"80351110224678912\"; \
                     Discord: Settings → Advanced → Developer Mode, then right-click the user → Copy User ID)"
                ));
            }
        }
        for id in &self.channels {
            if snowflake(id).is_none() {
                return Some(format!(
                    "[discord] channels: `{id}` is not a Discord channel id (a number; right-click the channel → Copy Channel ID)"
                ));
            }
        }
        if let Some(g) = self.gateway.as_deref().filter(|g| !(g.starts_with("wss://") || g.starts_with("ws://"))) {
            return Some(format!("[discord] gateway = \"{g}\" is not a ws:// or wss:// URL"));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked() {
        assert_eq!(snowflake("80351110224678912"), Some(80351110224678912));
        for bad in ["", "0", "-1", "12a", "@me", "123456789012345678901", "99999999999999999999"] {
            assert_eq!(snowflake(bad), None, "{bad}");
        }
        let c = DiscordConfig { token_env: Some("T".into()), allow_from: vec!["owner".into()], ..Default::default() };
        assert!(c.problem().unwrap().contains("`owner` is not a Discord user id"));
        let c = DiscordConfig { allow_from: vec!["1".into()], channels: vec!["#general".into()], ..c };
        assert!(c.problem().unwrap().contains("`#general` is not a Discord channel id"));
        let c = DiscordConfig { channels: vec![], gateway: Some("https://x".into()), ..c };
        assert!(c.problem().unwrap().contains("not a ws:// or wss:// URL"));
        assert!(DiscordConfig::default().problem().is_none(), "not configured: nothing to say");
    }
}
