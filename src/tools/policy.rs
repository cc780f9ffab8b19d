//! Which tools a turn is offered, by where it came from: `[policy.<source>]`.
//!
//! [`super::Origin`] says whether a turn is trusted (what `cron` and
//! `message` may do); this says which tools the model is offered at all.
//! Anyone who can publish to `<prefix>/in` — on many home networks an
//! anonymous mosquitto, a command in the sandbox included — starts a turn, so
//! the defaults are: the terminal, Telegram's `allow_from` users, jobs and the
//! heartbeat get every tool; `<prefix>/in` and triggers get no `exec`, no file
//! writes and no `mqtt_publish` unless the config says so. A refused call gets
//! a clear error too, so a model that calls a tool it was not offered learns why.
//!
//! ```toml
//! [policy.mqtt]                 # <prefix>/in
//! tools = ["read_file", "web_fetch", "message"]   # only these (globs: "ha__*")
//! [policy.trigger]              # [[mqtt.trigger]] and Home Assistant triggers
//! deny = ["exec"]               # everything but these (replaces the default deny list)
//! ```
//!
//! Sub-agents inherit their parent's source.

use std::collections::BTreeMap;

use crate::bus::Principal;
use crate::config::PolicyRule;

pub use crate::bus::Source;

/// What each source may do when the config says nothing, and how far a
/// job's maker's rights reach (the source itself is vocabulary: `bus::Source`).
impl Source {
    /// The rights a job's creator has as a chat source, which its turns may
    /// never exceed (`None`: the owner's, all of `[policy.job]`). A Telegram
    /// user's jobs get no tool `[policy.telegram]` denies them. An anonymous
    /// turn (a trigger's) is governed by its own untrusted source already,
    /// and owns no job: `policy::Standing` refuses to run one.
    pub fn ceiling_of(principal: &Principal) -> Option<Source> {
        match principal {
            Principal::Owner | Principal::Member(_) | Principal::Anonymous => None,
            Principal::Telegram(_) => Some(Source::Telegram),
            Principal::Discord(_) => Some(Source::Discord),
            Principal::Email(_) => Some(Source::Email),
            Principal::Matrix(_) => Some(Source::Matrix),
            Principal::Signal(_) => Some(Source::Signal),
            Principal::Feishu(_) => Some(Source::Feishu),
        }
    }

    /// What a source may not use when the config says nothing: the tools that
    /// change things (commands, files, the broker) for the untrusted ones.
    pub fn default_deny(self) -> &'static [&'static str] {
        match self {
            Source::Mqtt | Source::Webhook | Source::Ntfy | Source::Trigger => {
                &["exec", "write_file", "edit_file", "mqtt_publish", "ha_call_service"]
            }
            // A mail account is more often phished than a phone: no commands by default.
            // Discord too: its accounts are a favourite of token stealers, and guild channels are shared.
            Source::Email | Source::Discord => &["exec"],
            // The owner asked in the primary's chat; jobs on a board are made with `cron add --on`.
            Source::Fleet => &["cron", "mqtt_publish"],
            _ => &[],
        }
    }

    /// Whether the source's sessions may write long-term memory when the
    /// config says nothing: not the untrusted ones (nor any source added
    /// later without saying so).
    pub fn default_memory(self) -> bool {
        matches!(
            self,
            Source::Terminal
                | Source::Telegram
                | Source::Discord
                | Source::Feishu
                | Source::Matrix
                | Source::Signal
                | Source::Email
                | Source::Job
                | Source::Heartbeat
        )
    }
}

/// What a turn may be offered: its source's tools, and, for a job's turn,
/// no more than its creator's source (`ceiling`) is offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub source: Source,
    pub ceiling: Option<Source>,
}

impl From<Source> for Grant {
    fn from(source: Source) -> Grant {
        Grant { source, ceiling: None }
    }
}

impl Grant {
    /// The `[policy.*]` tables that decide, for refusals: `[policy.job]` and `[policy.telegram]`.
    pub fn tables(self) -> String {
        match self.ceiling {
            Some(c) if c != self.source => {
                format!("[policy.{}] and its creator's [policy.{}]", self.source.name(), c.name())
            }
            _ => format!("[policy.{}]", self.source.name()),
        }
    }
}

/// One source's rule: an allow-list (`None`: every tool), a deny list, and
/// whether its sessions may write long-term memory.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    allow: Option<Vec<String>>,
    deny: Vec<String>,
    memory: bool,
}

/// The rules of every source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolPolicy {
    rules: BTreeMap<Source, Rule>,
}

impl Default for ToolPolicy {
    /// The defaults: untrusted sources without the tools that change things.
    fn default() -> Self {
        ToolPolicy::from_config(&BTreeMap::new())
    }
}

impl ToolPolicy {
    /// The policy of `[policy.*]` (names checked by the config loader; an
    /// unknown one is ignored here). A table's `deny` replaces its source's
    /// default list; without `deny` the default stays.
    pub fn from_config(cfg: &BTreeMap<String, PolicyRule>) -> ToolPolicy {
        let rules = Source::ALL
            .into_iter()
            .map(|s| {
                let rule = cfg.get(s.name());
                let allow = rule.and_then(|r| r.tools.clone());
                let deny = rule
                    .and_then(|r| r.deny.clone())
                    .unwrap_or_else(|| s.default_deny().iter().map(|t| t.to_string()).collect());
                let memory = rule.and_then(|r| r.memory).unwrap_or_else(|| s.default_memory());
                (s, Rule { allow, deny, memory })
            })
            .collect();
        ToolPolicy { rules }
    }

    /// Whether a turn from `source` may use `tool`.
    pub fn allows(&self, source: Source, tool: &str) -> bool {
        let Some(rule) = self.rules.get(&source) else { return true };
        let listed = rule.allow.as_ref().is_none_or(|allow| allow.iter().any(|p| glob(p, tool)));
        listed && !rule.deny.iter().any(|p| glob(p, tool))
    }

    /// Whether a turn under `grant` may use `tool`: its source allows it, and
    /// so does its ceiling's.
    pub fn grants(&self, grant: Grant, tool: &str) -> bool {
        self.allows(grant.source, tool) && grant.ceiling.is_none_or(|c| self.allows(c, tool))
    }

    /// Whether a session from `source` may write long-term memory
    /// (`memory/MEMORY.md`, through consolidation). A source without a rule: no.
    pub fn remembers(&self, source: Source) -> bool {
        self.rules.get(&source).is_some_and(|r| r.memory)
    }

    /// The rule of `source` in a few words, for `bramble status`.
    pub fn describe(&self, source: Source) -> String {
        let Some(rule) = self.rules.get(&source) else { return "every tool".into() };
        let base = match &rule.allow {
            None => "every tool".to_string(),
            Some(list) if list.is_empty() => "no tools".to_string(),
            Some(list) => format!("only {}", list.join(", ")),
        };
        let tools = if rule.deny.is_empty() { base } else { format!("{base} except {}", rule.deny.join(", ")) };
        if rule.memory {
            tools
        } else {
            format!("{tools} (no memory writes)")
        }
    }

    /// Whether `source` may use any of the tools that change things on this
    /// machine or the network (`bramble check`'s broker warning).
    pub fn powerful(&self, source: Source) -> Vec<&'static str> {
        ["exec", "write_file", "edit_file", "mqtt_publish", "ha_call_service"]
            .into_iter()
            .filter(|t| self.allows(source, t))
            .collect()
    }
}

/// `*` matches any run of characters (`ha__*`, `*_file`); anything else is literal.
pub fn glob(pattern: &str, name: &str) -> bool {
    let Some((head, rest)) = pattern.split_once('*') else { return pattern == name };
    let Some(mut tail) = name.strip_prefix(head) else { return false };
    let mut parts: Vec<&str> = rest.split('*').collect();
    let last = parts.pop().unwrap_or("");
    for p in parts {
        match tail.find(p) {
            Some(i) => tail = &tail[i + p.len()..],
            None => return false,
        }
    }
    tail.len() >= last.len() && tail.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv(channel: &str, key: &str) -> crate::bus::Conversation {
        crate::bus::Conversation::new(channel.into(), "x", key)
    }

    #[test]
    fn sources_follow_the_channel_and_the_session() {
        assert_eq!(Source::of(&conv("cli", "cli:direct"), false), Source::Terminal);
        assert_eq!(Source::of(&conv("telegram", "telegram:1"), false), Source::Telegram);
        assert_eq!(Source::of(&conv("telegram", "telegram:1"), true), Source::Job, "a job made in a chat");
        assert_eq!(Source::of(&conv("system", "heartbeat"), true), Source::Heartbeat);
        assert_eq!(Source::of(&conv("system", "cron:backup"), true), Source::Job);
        assert_eq!(Source::of(&conv("mqtt", "mqtt:kitchen"), false), Source::Mqtt);
        assert_eq!(Source::of(&conv("mqtt", "trigger:zigbee2mqtt/door"), false), Source::Trigger);
        assert_eq!(Source::of(&conv("homeassistant", "trigger:door"), false), Source::Trigger);
        assert_eq!(Source::of(&conv("carrier-pigeon", "x"), false), Source::Trigger, "unknown: untrusted");
    }

    #[test]
    fn a_scheduled_turn_is_a_jobs_whatever_chat_made_it() {
        // `bramble agent`'s cron tool stores the terminal's conversation as the job's origin.
        assert_eq!(Source::of(&conv("cli", "cli:direct"), true), Source::Job);
        assert_eq!(Source::of(&conv("telegram", "telegram:1"), true), Source::Job);
        assert_eq!(Source::of(&conv("system", "cron:x"), true), Source::Job);
        assert_eq!(Source::of(&conv("system", "heartbeat"), true), Source::Heartbeat);
        // Untrusted stays untrusted when the scheduler or a trigger runs it.
        assert_eq!(Source::of(&conv("mqtt", "mqtt:x"), true), Source::Mqtt);
        assert_eq!(Source::of(&conv("mqtt", "trigger:t"), true), Source::Trigger);
        assert_eq!(Source::of(&conv("homeassistant", "trigger:t"), true), Source::Trigger);
    }

    #[test]
    fn a_grant_is_narrowed_by_its_ceiling() {
        let mut cfg = BTreeMap::new();
        cfg.insert("telegram".to_string(), PolicyRule { tools: None, deny: Some(vec!["exec".into()]), memory: None });
        let p = ToolPolicy::from_config(&cfg);
        let owner = Grant { source: Source::Job, ceiling: Source::ceiling_of(&Principal::Owner) };
        let user = Grant { source: Source::Job, ceiling: Source::ceiling_of(&Principal::Telegram(7)) };
        assert!(p.grants(owner, "exec"));
        assert!(!p.grants(user, "exec") && p.grants(user, "write_file"));
        assert_eq!(user.tables(), "[policy.job] and its creator's [policy.telegram]");
        // A trigger's turn (anonymous) is [policy.trigger]'s alone: opening it opens it.
        cfg.insert("trigger".to_string(), PolicyRule { tools: None, deny: Some(vec![]), memory: None });
        let p = ToolPolicy::from_config(&cfg);
        let trigger = Grant { source: Source::Trigger, ceiling: Source::ceiling_of(&Principal::Anonymous) };
        assert!(p.grants(trigger, "exec"));
        assert_eq!(Grant::from(Source::Mqtt).tables(), "[policy.mqtt]");
    }

    #[test]
    fn the_defaults_keep_untrusted_sources_from_changing_things() {
        let p = ToolPolicy::default();
        for tool in ["exec", "write_file", "edit_file", "mqtt_publish", "ha_call_service"] {
            assert!(!p.allows(Source::Mqtt, tool) && !p.allows(Source::Trigger, tool), "{tool}");
            assert!(p.allows(Source::Telegram, tool) && p.allows(Source::Terminal, tool), "{tool}");
        }
        assert!(p.allows(Source::Mqtt, "read_file") && p.allows(Source::Mqtt, "web_fetch"));
        assert_eq!(
            p.describe(Source::Mqtt),
            "every tool except exec, write_file, edit_file, mqtt_publish, ha_call_service (no memory writes)"
        );
        assert_eq!(p.describe(Source::Job), "every tool");
    }

    #[test]
    fn tables_allow_and_deny_with_globs() {
        let mut cfg = BTreeMap::new();
        cfg.insert(
            "mqtt".to_string(),
            PolicyRule { tools: Some(vec!["read_file".into(), "ha__*".into()]), deny: None, memory: None },
        );
        cfg.insert("trigger".to_string(), PolicyRule { tools: None, deny: Some(vec![]), memory: Some(true) });
        cfg.insert(
            "telegram".to_string(),
            PolicyRule { tools: None, deny: Some(vec!["exec".into()]), memory: Some(false) },
        );
        let p = ToolPolicy::from_config(&cfg);
        assert!(p.allows(Source::Mqtt, "read_file") && p.allows(Source::Mqtt, "ha__get_state"));
        assert!(!p.allows(Source::Mqtt, "web_fetch"));
        assert!(!p.allows(Source::Mqtt, "exec"), "the default deny list stays without `deny`");
        assert!(p.allows(Source::Trigger, "exec"), "`deny = []` replaces the default");
        assert!(!p.allows(Source::Telegram, "exec") && p.allows(Source::Telegram, "write_file"));
        assert_eq!(p.powerful(Source::Telegram), ["write_file", "edit_file", "mqtt_publish", "ha_call_service"]);
        assert!(p.remembers(Source::Trigger) && !p.remembers(Source::Telegram), "`memory` overrides the default");
        assert!(!p.remembers(Source::Mqtt), "a table without `memory` keeps the default");
    }

    #[test]
    fn only_trusted_sources_write_memory_by_default() {
        let p = ToolPolicy::default();
        for s in Source::ALL {
            let trusted = matches!(
                s,
                Source::Terminal
                    | Source::Telegram
                    | Source::Discord
                    | Source::Feishu
                    | Source::Matrix
                    | Source::Signal
                    | Source::Email
                    | Source::Job
                    | Source::Heartbeat
            );
            assert_eq!(p.remembers(s), trusted, "{s:?}");
        }
        assert!(p.describe(Source::Mqtt).ends_with(" (no memory writes)"));
    }

    #[test]
    fn globs() {
        assert!(glob("exec", "exec") && !glob("exec", "exec2"));
        assert!(glob("ha__*", "ha__light") && !glob("ha__*", "mqtt_publish"));
        assert!(glob("*_file", "read_file") && glob("*", "anything") && glob("a*b*c", "aXbYc"));
        assert!(!glob("a*b*c", "aXc") && !glob("*_file", "file"));
    }
}
