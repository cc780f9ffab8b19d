//! `bramble status`'s channels section: every chat app, MQTT, Home
//! Assistant and the webhooks, each in words (and in `status --json`).

use serde::Serialize;

use crate::config::Loaded;
use crate::daemon::control::Facts;

use super::super::check::telegram_summary;
use super::{esc, policy_summary, source, Section};

/// Telegram, MQTT, the tool policy and Home Assistant, each in words.
#[derive(Serialize)]
pub(super) struct ChannelPart {
    telegram: String,
    mqtt: String,
    /// `[matrix]`, in words (`not configured` without the feature).
    matrix: String,
    /// Which sources of turns get which tools, in words.
    policy: String,
    homeassistant: String,
    /// `[webhooks]` / `[[webhook]]`: where it listens, the endpoints, the targets.
    webhooks: String,
    /// `[email]` in words (null without the feature).
    email: Option<String>,
    /// `[signal]` in words (null without the feature).
    signal: Option<String>,
    /// `[feishu]` in words (null without the feature).
    feishu: Option<String>,
    /// `[discord]` in words, first where the running daemon's gateway
    /// connection stands (null without the feature).
    discord: Option<String>,
    /// `[ntfy]` in words (null without the feature).
    ntfy: Option<String>,
    /// `[fleet]` in words.
    fleet: String,
    /// Where the secrets' state was read: `daemon` or `shell`.
    secrets_from: &'static str,
    #[serde(skip)]
    ha_configured: bool,
}

impl Section for ChannelPart {
    fn lines(&self) -> Vec<String> {
        let from = source(self.secrets_from);
        let ha_from = if self.ha_configured { format!(" {from}") } else { String::new() };
        let mut lines = vec![
            format!("telegram:   {} {from}", esc(&self.telegram)),
            format!("mqtt:       {}", esc(&self.mqtt)),
            format!("matrix:     {}", esc(&self.matrix)),
            format!("policy:     {}", self.policy),
            format!("ha:         {}{ha_from}", esc(&self.homeassistant)),
            format!("webhooks:   {}", esc(&self.webhooks)),
        ];
        lines.extend(self.email.as_ref().map(|e| format!("email:      {}", esc(e))));
        lines.extend(self.signal.as_ref().map(|s| format!("signal:     {}", esc(s))));
        lines.extend(self.feishu.as_ref().map(|e| format!("feishu:     {}", esc(e))));
        lines.extend(self.discord.as_ref().map(|d| format!("discord:    {}", esc(d))));
        lines.extend(self.ntfy.as_ref().map(|n| format!("ntfy:       {}", esc(n))));
        lines.push(format!("fleet:      {}", esc(&self.fleet)));
        lines
    }
}

pub(super) fn channel_lines(loaded: &Loaded, facts: Option<&Facts>) -> ChannelPart {
    let c = &loaded.config;
    let token = facts.map_or(c.telegram.token().is_some(), |f| f.telegram_token);
    #[cfg(feature = "homeassistant")]
    let mut ha = crate::channels::homeassistant::status_line(c, &loaded.paths.state_dir);
    #[cfg(not(feature = "homeassistant"))]
    let mut ha = String::from("not in this build (cargo feature `homeassistant`)");
    if facts.and_then(|f| f.homeassistant_token) == Some(true) {
        ha = ha.replace(&format!("token MISSING: set {}", c.homeassistant.token_env()), "token set");
    }
    ChannelPart {
        telegram: telegram_summary(&c.telegram, token, &loaded.paths.state_dir),
        mqtt: crate::channels::mqtt::status_line(&c.mqtt),
        #[cfg(feature = "matrix")]
        matrix: crate::channels::matrix::status::status_line(&c.matrix, &loaded.paths.state_dir),
        #[cfg(not(feature = "matrix"))]
        matrix: "not in this build (cargo feature `matrix`)".into(),
        policy: policy_summary(&c.policy),
        #[cfg(feature = "fleet")]
        fleet: crate::fleet::status_line(c),
        #[cfg(not(feature = "fleet"))]
        fleet: "not in this build (cargo feature `fleet`)".into(),
        homeassistant: ha,
        webhooks: webhook_status(c),
        #[cfg(feature = "feishu")]
        feishu: Some(crate::channels::feishu::status::status_line(&c.feishu, &loaded.paths.state_dir)),
        #[cfg(not(feature = "feishu"))]
        feishu: None,
        #[cfg(feature = "email")]
        email: Some(crate::channels::email::check::status_line(&c.email, &loaded.paths.state_dir)),
        #[cfg(not(feature = "email"))]
        email: None,
        #[cfg(feature = "signal")]
        signal: Some(crate::channels::signal::status::status_line(&c.signal, &loaded.paths.state_dir)),
        #[cfg(not(feature = "signal"))]
        signal: None,
        #[cfg(feature = "discord")]
        discord: Some(crate::channels::discord::status::status_line(
            &c.discord,
            &loaded.paths.state_dir,
            facts.map(|f| f.pid),
        )),
        #[cfg(not(feature = "discord"))]
        discord: None,
        #[cfg(feature = "ntfy")]
        ntfy: Some(crate::channels::ntfy::status::status_line(
            &c.ntfy,
            c.alerts.deliver.is_empty(),
            &loaded.paths.state_dir,
        )),
        #[cfg(not(feature = "ntfy"))]
        ntfy: None,
        secrets_from: if facts.is_some() { "daemon" } else { "shell" },
        ha_configured: c.homeassistant.url.is_some(),
    }
}

fn webhook_status(c: &crate::config::Config) -> String {
    #[cfg(feature = "webhook")]
    return crate::channels::webhook::status::status_line(c);
    #[cfg(not(feature = "webhook"))]
    match c.webhook.is_empty() {
        true => "not configured".into(),
        false => "OFF: this build has no webhooks (cargo feature `webhook`)".into(),
    }
}
