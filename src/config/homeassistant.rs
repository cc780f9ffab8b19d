//! `[homeassistant]`: a Home Assistant instance on the LAN — its REST API for
//! the `ha_call_service` / `ha_get_state` tools and the `ha:notify.<service>`
//! delivery target, its WebSocket API for `[[homeassistant.trigger]]`.
//!
//! Its own file so the section's types, checks and template test sit
//! together. Entity patterns are a type ([`EntityGlob`]) that checks itself
//! while it is read, so a bad glob is a `FILE:LINE:COL` error like every
//! other value; a trigger's shape (exactly one of `message`/`exec`) is checked
//! when the table is read.

use serde::Deserialize;

use super::{secret_from_env, Dur, HttpUrl, Secret, TriggerAction};
use crate::bus::Target;

/// `[homeassistant]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HomeAssistantConfig {
    /// `http://homeassistant.local:8123`; unset: no Home Assistant. A LAN
    /// address is fine: these calls do not go through `[web] allow_private`.
    pub url: Option<HttpUrl>,
    /// A long-lived access token, inline (prefer `token_env`).
    pub token: Option<Secret>,
    /// The variable (or systemd credential) holding the token; default `HA_TOKEN`.
    pub token_env: Option<String>,
    /// What the tools may touch: entity ids, and `domain.service` names. A
    /// service call needs every entity it targets allowed *and* the service:
    /// listed by name (`notify.mobile_app_*`, `script.good_night`), or a
    /// service of its entities' own domain (`light.turn_on` on allowed lights).
    /// Globs: `*` and `?`. Empty: nothing.
    pub allow: Vec<EntityGlob>,
    pub trigger: Vec<HaTrigger>,
}

impl HomeAssistantConfig {
    pub fn token_env(&self) -> &str {
        self.token_env.as_deref().unwrap_or("HA_TOKEN")
    }

    /// The token: `token`, else the `token_env` variable (or credential).
    pub fn token(&self) -> Option<Secret> {
        self.token.clone().or_else(|| secret_from_env(self.token_env()))
    }
}

/// An entity id pattern: `light.kitchen`, `binary_sensor.*_door`,
/// `notify.mobile_app_*`. Lower-case letters, digits, `_`, one `.` between
/// domain and object, and the wildcards `*` (any run) and `?` (one character).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntityGlob(pub String);

impl EntityGlob {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn matches(&self, id: &str) -> bool {
        crate::util::text::glob_match(&self.0, id)
    }
}

impl std::fmt::Display for EntityGlob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for EntityGlob {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        let t = text.trim();
        let ok_chars = t.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.*?".contains(&b));
        let dots = t.bytes().filter(|&b| b == b'.').count();
        let has_parts = t.split_once('.').is_some_and(|(d, o)| !d.is_empty() && !o.is_empty());
        if !ok_chars || dots != 1 || !has_parts {
            return Err(format!(
                "`{text}` is not an entity pattern: expected `domain.object` in lower case, with `*` or `?` as \
                 wildcards, like `light.kitchen`, `binary_sensor.*_door` or `notify.mobile_app_*`"
            ));
        }
        Ok(EntityGlob(t.to_string()))
    }
}

impl<'de> Deserialize<'de> for EntityGlob {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// `[[homeassistant.trigger]]`: a `state_changed` event of a matching entity
/// starts an agent turn or a command.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, try_from = "RawHaTrigger")]
pub struct HaTrigger {
    /// Entity patterns (one, or a list).
    pub entity_id: Vec<EntityGlob>,
    /// Only when the old state was this.
    pub from: Option<String>,
    /// Only when the new state is this.
    pub to: Option<String>,
    /// The new state must hold this long before the trigger fires (a change cancels it).
    pub hold: Option<Dur>,
    pub action: TriggerAction,
    pub deliver: Vec<Target>,
    /// At most one run per this interval; events in between are dropped (and counted).
    pub min_interval: Dur,
}

impl HaTrigger {
    /// A short name for logs and report sources: the entity patterns.
    pub fn label(&self) -> String {
        self.entity_id.iter().map(EntityGlob::as_str).collect::<Vec<_>>().join(",")
    }
}

/// One pattern or a list of them; a bad one keeps its own error message
/// (an untagged enum would say only "did not match any variant").
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<EntityGlob>, D::Error> {
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = Vec<EntityGlob>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an entity pattern (\"binary_sensor.*_door\") or a list of them")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            v.parse().map(|g| vec![g]).map_err(E::custom)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(g) = seq.next_element::<EntityGlob>()? {
                out.push(g);
            }
            Ok(out)
        }
    }
    d.deserialize_any(V)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHaTrigger {
    #[serde(deserialize_with = "one_or_many")]
    entity_id: Vec<EntityGlob>,
    from: Option<String>,
    to: Option<String>,
    #[serde(rename = "for")]
    hold: Option<Dur>,
    message: Option<String>,
    exec: Option<String>,
    #[serde(default)]
    deliver: Vec<Target>,
    min_interval: Option<Dur>,
}

impl TryFrom<RawHaTrigger> for HaTrigger {
    type Error = String;
    fn try_from(r: RawHaTrigger) -> Result<Self, String> {
        let entity_id = r.entity_id;
        let label = entity_id.iter().map(EntityGlob::as_str).collect::<Vec<_>>().join(",");
        if entity_id.is_empty() {
            return Err("a Home Assistant trigger needs at least one `entity_id` pattern".into());
        }
        let action = match (r.message, r.exec) {
            (Some(m), None) => TriggerAction::Message(m),
            (None, Some(e)) => TriggerAction::Exec(e),
            _ => return Err(format!("trigger `{label}` needs exactly one of `message` or `exec`")),
        };
        let min_interval = r.min_interval.unwrap_or(match action {
            TriggerAction::Message(_) => Dur::secs(60),
            TriggerAction::Exec(_) => Dur::secs(1),
        });
        Ok(HaTrigger { entity_id, from: r.from, to: r.to, hold: r.hold, action, deliver: r.deliver, min_interval })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text, "/etc/bramble/config.toml".as_ref()).map_err(|e| e.to_string())
    }

    #[test]
    #[cfg(feature = "homeassistant")]
    fn every_key_is_in_the_template() {
        let source = include_str!("homeassistant.rs");
        let template = include_str!("../../config/bramble.toml");
        let start = source.find("pub struct HomeAssistantConfig {").unwrap();
        let body = &source[start..start + source[start..].find("\n}").unwrap()];
        let from = template.find("\n[homeassistant]\n").expect("[homeassistant] in the template");
        let part = &template[from..];
        let part = &part[..part[1..].find("\n[").map(|i| i + 1).unwrap_or(part.len())];
        assert!(part.contains("[[homeassistant.trigger]]"), "{part}");
        for line in body.lines().map(str::trim).filter(|l| l.starts_with("pub ") && !l.starts_with("pub struct")) {
            let key = line["pub ".len()..].split(':').next().unwrap().trim();
            let listed = part.contains(&format!("[[homeassistant.{key}]]"))
                || part.lines().any(|l| {
                    let l = l.trim_start_matches('#').trim_start();
                    l.strip_prefix(key).is_some_and(|r| r.trim_start().starts_with('='))
                });
            assert!(listed, "[homeassistant] {key} is missing from config/bramble.toml");
        }
        // The template's example trigger parses.
        // Every commented-out setting of the section, the example trigger included, parses.
        let example: String = part
            .lines()
            .filter_map(|l| l.strip_prefix("# "))
            .filter(|l| l.starts_with("[[") || l.split_once(" = ").is_some_and(|(k, _)| !k.contains(' ')))
            .collect::<Vec<_>>()
            .join("\n");
        let c = parse(&format!("[homeassistant]\n{example}\n")).unwrap_or_else(|e| panic!("{e}\n{example}"));
        assert!(!c.homeassistant.trigger.is_empty());
    }

    #[test]
    #[cfg(feature = "homeassistant")]
    fn a_trigger_reads_globs_filters_and_durations() {
        let c = parse(
            "[homeassistant]\nurl = \"http://ha.lan:8123\"\nallow = [\"light.*\", \"notify.mobile_app_?ixel\"]\n\
             [[homeassistant.trigger]]\nentity_id = \"binary_sensor.*_door\"\nfrom = \"off\"\nto = \"on\"\n\
             for = \"2m\"\nmessage = \"{entity} is {to}\"\ndeliver = [\"telegram:42\", \"ha:notify.mobile_app_x\"]\n\
             [[homeassistant.trigger]]\nentity_id = [\"sensor.a\", \"sensor.b\"]\nexec = \"cat\"\n",
        )
        .unwrap();
        let ha = &c.homeassistant;
        assert_eq!(ha.url.as_ref().unwrap().as_str(), "http://ha.lan:8123");
        assert!(ha.allow[1].matches("notify.mobile_app_pixel"));
        let t = &ha.trigger[0];
        assert_eq!(t.label(), "binary_sensor.*_door");
        assert_eq!((t.from.as_deref(), t.to.as_deref(), t.hold), (Some("off"), Some("on"), Some(Dur::secs(120))));
        assert_eq!(t.min_interval, Dur::secs(60));
        assert_eq!(t.deliver[1], Target::HomeAssistant("mobile_app_x".into()));
        assert_eq!(ha.trigger[1].entity_id.len(), 2);
        assert_eq!(ha.trigger[1].min_interval, Dur::secs(1));
        assert_eq!(ha.token_env(), "HA_TOKEN");
    }

    #[test]
    fn mistakes_are_file_line_col_errors() {
        let err = parse("[homeassistant]\nallow = [\"light.*\", \"Light Kitchen\"]\n").unwrap_err();
        assert!(err.starts_with("/etc/bramble/config.toml:2:"), "{err}");
        assert!(err.contains("not an entity pattern"), "{err}");
        let err = parse("[[homeassistant.trigger]]\nentity_id = \"sensor.x\"\nmessage = \"m\"\nfor = \"soon\"\n")
            .unwrap_err();
        assert!(err.contains(":4:") && err.contains("not a duration"), "{err}");
        let err = parse("[[homeassistant.trigger]]\nentity_id = \"sensor.x\"\nmessage = \"m\"\nmin_intervl = \"1m\"\n")
            .unwrap_err();
        assert!(err.contains("unknown key `min_intervl`"), "{err}");
        let err = parse("[[homeassistant.trigger]]\nentity_id = \"sensor.x\"\n").unwrap_err();
        assert!(err.contains("exactly one of `message` or `exec`"), "{err}");
        let err = parse("[homeassistant]\nurl = \"ws://ha\"\n").unwrap_err();
        assert!(err.contains("http://"), "{err}");
        let err = parse("[homeassistant]\ntokn = \"x\"\n").unwrap_err();
        assert!(err.starts_with("/etc/bramble/config.toml:2:1: unknown key `tokn` in [homeassistant]"), "{err}");
        for bad in ["light", "light.", ".x", "a.b.c", "light.Kitchen", "light.*/x"] {
            assert!(bad.parse::<EntityGlob>().is_err(), "{bad}");
        }
    }
}
