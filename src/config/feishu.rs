//! `[feishu]`: a Feishu (飞书, China) or Lark (international) bot bramble
//! talks through, over the platform's long connection (a WebSocket the bot
//! opens: no public address needed; see docs/channels/feishu.md).
//!
//! Its own file so the section's types and checks sit together. The app
//! secret only by an `*_env` name; the app id is not a secret.

use serde::Deserialize;

use super::{secret_from_env, HttpUrl, Secret};
use crate::bus::is_feishu_id;

/// Which platform the app lives on: the two have the same API at different hosts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FeishuDomain {
    /// `https://open.feishu.cn` (Feishu, mainland China).
    #[default]
    Feishu,
    /// `https://open.larksuite.com` (Lark, international).
    Lark,
}

impl FeishuDomain {
    pub fn base(self) -> &'static str {
        match self {
            FeishuDomain::Feishu => "https://open.feishu.cn",
            FeishuDomain::Lark => "https://open.larksuite.com",
        }
    }
}

/// `[feishu]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FeishuConfig {
    /// The app's App ID (`cli_…`); unset: no Feishu / Lark.
    pub app_id: Option<String>,
    /// The variable (or systemd credential) holding the app's App Secret.
    pub app_secret_env: Option<String>,
    /// `"feishu"` (open.feishu.cn) or `"lark"` (open.larksuite.com).
    pub domain: FeishuDomain,
    /// Overrides the domain's base URL (a proxy, or a test's fake server).
    pub api_base: Option<HttpUrl>,
    /// The users (open_ids, `ou_…`) that may talk to the bot. Empty: nobody.
    pub allow_from: Vec<String>,
    /// Group chats (`oc_…`) reports may be posted to besides those an
    /// allowed user wrote in.
    pub chats: Vec<String>,
    /// A message longer than this many characters is cut to it.
    pub max_message_chars: usize,
    /// How long one file upload may take, in seconds (a report waiting on a
    /// slower one goes back to the outbox and is tried again).
    pub upload_timeout_secs: u64,
    /// A file a user sends that is larger than this many MB is not
    /// downloaded (they are told; the platform serves up to 100 MB).
    pub max_file_mb: u64,
}

impl Default for FeishuConfig {
    fn default() -> Self {
        FeishuConfig {
            app_id: None,
            app_secret_env: None,
            domain: FeishuDomain::Feishu,
            api_base: None,
            allow_from: Vec::new(),
            chats: Vec::new(),
            max_message_chars: 16_000,
            upload_timeout_secs: 120,
            max_file_mb: 20,
        }
    }
}

impl FeishuConfig {
    /// The App Secret from `app_secret_env`, if set and present.
    pub fn app_secret(&self) -> Option<Secret> {
        self.app_secret_env.as_deref().and_then(secret_from_env)
    }

    /// The API's base URL: `api_base`, else the domain's.
    pub fn base(&self) -> String {
        match &self.api_base {
            Some(b) => b.as_str().to_string(),
            None => self.domain.base().to_string(),
        }
    }

    /// What `bramble check` says about the section (`None`: fine or not configured).
    pub fn problem(&self) -> Option<String> {
        let app_id = self.app_id.as_deref()?;
        if app_id.trim().is_empty() || app_id.contains(char::is_whitespace) {
            return Some("[feishu] app_id: expected the app's App ID, like \"cli_a1b2c3d4e5f6\"".to_string());
        }
        for id in &self.allow_from {
            if !is_feishu_id(id, "ou_") {
                return Some(format!(
                    "[feishu] allow_from: `{id}` is not an open_id like \"ou_7d8a6e6df7621556ce0d21922b676706\""
                ));
            }
        }
        for chat in &self.chats {
            if !is_feishu_id(chat, "oc_") {
                return Some(format!(
                    "[feishu] chats: `{chat}` is not a chat_id like \"oc_a0553eda9014c201e6969b478895c230\""
                ));
            }
        }
        if self.upload_timeout_secs == 0 {
            return Some("[feishu] upload_timeout_secs: expected a number of seconds above 0, like 120".to_string());
        }
        if self.app_secret_env.is_none() {
            return Some(
                "[feishu] needs app_secret_env: the name of the variable holding the app's App Secret".to_string(),
            );
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_secret_are_checked() {
        let c = FeishuConfig { app_id: Some("cli_a1".into()), allow_from: vec!["owner".into()], ..Default::default() };
        assert!(c.problem().unwrap().contains("`owner` is not an open_id"));
        let c = FeishuConfig { allow_from: vec!["ou_abc".into()], chats: vec!["ou_x".into()], ..c };
        assert!(c.problem().unwrap().contains("`ou_x` is not a chat_id"));
        let c = FeishuConfig { chats: vec!["oc_x".into()], ..c };
        assert!(c.problem().unwrap().contains("app_secret_env"));
        let c = FeishuConfig { app_secret_env: Some("FEISHU_SECRET".into()), ..c };
        assert_eq!(c.problem(), None);
        let zero = FeishuConfig { upload_timeout_secs: 0, ..c.clone() };
        assert!(zero.problem().unwrap().contains("upload_timeout_secs"));
        assert_eq!(c.base(), "https://open.feishu.cn");
        let c = FeishuConfig { domain: FeishuDomain::Lark, ..c };
        assert_eq!(c.base(), "https://open.larksuite.com");
        assert!(FeishuConfig::default().problem().is_none(), "not configured: nothing to say");
    }
}
