//! `[ntfy]`: an ntfy server bramble publishes reports to and reads commands
//! from (docs/channels/ntfy.md).
//!
//! Its own file so the section's types and checks sit together. ntfy has no
//! accounts in a message: a topic is the address and, on a public server,
//! the password. So bramble publishes only to topics named here (never one a
//! model made up), reads only the `subscribe` topics, and takes its access
//! token only by a `*_env` name.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{secret_from_env, AlertsConfig, Dur, HttpUrl, Secret};
use crate::bus::{is_ntfy_topic, Target};

/// `[ntfy]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NtfyConfig {
    /// The server's base URL (`https://ntfy.sh`, `http://ntfy.lan`); unset: no ntfy.
    pub server: Option<HttpUrl>,
    /// The variable (or systemd credential) holding an access token (`tk_…`),
    /// sent as `Authorization: Bearer`; unset: anonymous.
    pub token_env: Option<String>,
    /// Topics whose messages (typed in the ntfy app) become turns; the
    /// allow-list: no other topic is ever subscribed.
    pub subscribe: Vec<String>,
    /// Where `[alerts]` and the dead-man report when `[alerts] deliver` is empty.
    pub alert_topic: Option<String>,
    /// The address of bramble's webhook listener as the phone reaches it
    /// (`https://pi.example.org:8443`): reminders get Done / Snooze buttons
    /// that call `<callback_base>/ntfy/<token>/…`. Unset: plain notifications.
    pub callback_base: Option<HttpUrl>,
    /// How long a reminder's buttons work.
    pub callback_ttl: Dur,
    /// A message typed in the app longer than this many characters is cut to it.
    pub max_message_chars: usize,
    /// Turns the subscribed topics may start per minute (0: no limit), and the burst.
    pub turns_per_minute: u32,
    pub turn_burst: u32,
    /// Per-topic defaults (`[ntfy.topics.<topic>]`); a topic named here may be published to.
    pub topics: BTreeMap<String, NtfyTopic>,
}

/// `[ntfy.topics.<topic>]`: what every notification to the topic carries.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct NtfyTopic {
    /// 1 (min) to 5 (max); unset: 3, or 4 for alerts and reminders.
    pub priority: Option<u8>,
    /// Tags (emoji short codes like `robot` show as emoji).
    pub tags: Vec<String>,
    /// What a tap on the notification opens.
    pub click: Option<HttpUrl>,
    /// A title for every notification (instead of the job's name).
    pub title: Option<String>,
}

impl Default for NtfyConfig {
    fn default() -> Self {
        NtfyConfig {
            server: None,
            token_env: None,
            subscribe: Vec::new(),
            alert_topic: None,
            callback_base: None,
            callback_ttl: Dur::secs(24 * 3600),
            max_message_chars: 4000,
            turns_per_minute: 6,
            turn_burst: 3,
            topics: BTreeMap::new(),
        }
    }
}

impl NtfyConfig {
    /// The access token from `token_env`, if set and present.
    pub fn token(&self) -> Option<Secret> {
        self.token_env.as_deref().and_then(secret_from_env)
    }

    /// Whether `topic` may be published to: named in `topics`, `subscribe` or `alert_topic`.
    pub fn publishes_to(&self, topic: &str) -> bool {
        self.server.is_some()
            && (self.topics.contains_key(topic)
                || self.subscribe.iter().any(|t| t == topic)
                || self.alert_topic.as_deref() == Some(topic))
    }

    /// `[alerts]` as it applies: with `deliver` empty and `alert_topic` set,
    /// alerts and the dead-man go to `ntfy:<alert_topic>`.
    pub fn alerts(&self, alerts: &AlertsConfig) -> AlertsConfig {
        let mut a = alerts.clone();
        if a.deliver.is_empty() && cfg!(feature = "ntfy") && self.server.is_some() {
            a.deliver.extend(self.alert_topic.iter().map(|t| Target::Ntfy(t.clone())));
        }
        a
    }

    /// What `bramble check` says about the section (`None`: fine or not configured).
    pub fn problem(&self) -> Option<String> {
        self.server.as_ref()?;
        let bad = |key: &str, t: &str| {
            format!("[ntfy] {key}: `{t}` is not an ntfy topic: 1 to 64 of `A-Z a-z 0-9 _ -`, like \"bramble-x7k2\"")
        };
        if let Some(t) = self.subscribe.iter().find(|t| !is_ntfy_topic(t)) {
            return Some(bad("subscribe", t));
        }
        if let Some(t) = self.alert_topic.as_deref().filter(|t| !is_ntfy_topic(t)) {
            return Some(bad("alert_topic", t));
        }
        for (name, t) in &self.topics {
            if !is_ntfy_topic(name) {
                return Some(bad("topics", name));
            }
            if let Some(p) = t.priority.filter(|p| !(1..=5).contains(p)) {
                return Some(format!("[ntfy.topics.{name}] priority = {p}: ntfy's priorities are 1 (min) to 5 (max)"));
            }
        }
        if self.max_message_chars == 0 {
            return Some("[ntfy] max_message_chars must be at least 1".into());
        }
        None
    }
}

#[cfg(all(test, feature = "ntfy"))]
mod tests {
    use super::*;

    #[test]
    fn topics_are_checked_and_only_named_ones_are_published_to() {
        let c = NtfyConfig {
            server: Some(HttpUrl("http://127.0.0.1:1".into())),
            subscribe: vec!["in-x7".into()],
            alert_topic: Some("alerts".into()),
            ..Default::default()
        };
        assert!(c.problem().is_none());
        assert!(c.publishes_to("in-x7") && c.publishes_to("alerts") && !c.publishes_to("elsewhere"));
        let a = c.alerts(&AlertsConfig::default());
        assert_eq!(a.deliver, vec![Target::Ntfy("alerts".into())]);
        let set = AlertsConfig { deliver: vec![Target::Log], ..Default::default() };
        assert_eq!(c.alerts(&set).deliver, vec![Target::Log], "a target set by the user stays");
        let bad = NtfyConfig { subscribe: vec!["a/b".into()], ..c.clone() };
        assert!(bad.problem().unwrap().contains("`a/b` is not an ntfy topic"));
        let mut loud = c.clone();
        loud.topics.insert("t".into(), NtfyTopic { priority: Some(9), ..Default::default() });
        assert!(loud.problem().unwrap().contains("1 (min) to 5 (max)"));
        assert!(NtfyConfig::default().problem().is_none(), "not configured: nothing to say");
        assert!(NtfyConfig::default().alerts(&AlertsConfig::default()).deliver.is_empty());
    }
}
