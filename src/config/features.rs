//! What this build was made without: a config that uses an integration whose
//! cargo feature is not in the binary (the slim build, `--no-default-features
//! --features slim`) is refused at `bramble check` and at start, naming the
//! section and the feature. Never ignored: a board that silently runs without
//! its Home Assistant triggers or its MCP tools is worse than one that says so.
//!
//! The sections stay in [`super::Config`] in every build (a key is checked the
//! same everywhere); only the parts that use them are left out. `telegram-media`
//! has no section: without it a file sent to the bot is answered with what the
//! build takes, and an attachment is sent as a note naming the file.

use std::ops::Range;

use toml::de::{DeTable, DeValue};

use super::diagnose::Found;

/// An integration this build was made without.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Missing {
    #[error("this build has no Home Assistant support (feature `homeassistant`){HINT}")]
    HomeAssistant,
    #[error("this build has no MCP support (feature `mcp`){HINT}")]
    Mcp,
    #[error("this build has no email channel (feature `email`){HINT}")]
    Email,
    #[error("this build has no Matrix channel (feature `matrix`){HINT}")]
    Matrix,
    #[error("this build has no webhooks (feature `webhook`){HINT}")]
    Webhook,
    #[error("this build has no Discord channel (feature `discord`){HINT}")]
    Discord,
    #[error("this build has no Feishu / Lark channel (feature `feishu`){HINT}")]
    Feishu,
    #[error("this build has no Signal channel (feature `signal`){HINT}")]
    Signal,
    #[error("this build has no ntfy channel (feature `ntfy`){HINT}")]
    Ntfy,
    #[error("this build has no fleet mode (feature `fleet`){HINT}")]
    Fleet,
    #[error("this build has no web_search tool (feature `web-search`){HINT}")]
    WebSearch,
}

/// What to do about it.
const HINT: &str = ": remove the section, or install the full `bramble` binary (the release's `bramble-slim` \
                    leaves the integrations out) or build with the feature";

/// `[web]` keys that only `web_search` reads (`search = []`, turning it off, is fine everywhere).
const SEARCH_KEYS: [&str; 7] = [
    "search_max_results",
    "searxng_url",
    "brave_api_key_env",
    "tavily_api_key_env",
    "duckduckgo_url",
    "brave_url",
    "tavily_url",
];

/// The top-level sections this build has no part for, with the feature each needs.
fn absent() -> Vec<(&'static str, Missing)> {
    let all = [
        ("homeassistant", Missing::HomeAssistant, cfg!(feature = "homeassistant")),
        ("mcp", Missing::Mcp, cfg!(feature = "mcp")),
        ("email", Missing::Email, cfg!(feature = "email")),
        ("matrix", Missing::Matrix, cfg!(feature = "matrix")),
        ("webhook", Missing::Webhook, cfg!(feature = "webhook")),
        ("webhooks", Missing::Webhook, cfg!(feature = "webhook")),
        ("discord", Missing::Discord, cfg!(feature = "discord")),
        ("feishu", Missing::Feishu, cfg!(feature = "feishu")),
        ("signal", Missing::Signal, cfg!(feature = "signal")),
        ("ntfy", Missing::Ntfy, cfg!(feature = "ntfy")),
        ("fleet", Missing::Fleet, cfg!(feature = "fleet")),
    ];
    all.into_iter().filter(|(_, _, built)| !built).map(|(name, m, _)| (name, m)).collect()
}

/// The first section of `text` this build cannot serve, as an error at its name.
pub(super) fn check(text: &str) -> Result<(), Found> {
    let Ok(table) = DeTable::parse(text) else { return Ok(()) };
    first_missing(table.get_ref(), &absent(), cfg!(feature = "web-search")).map_or(Ok(()), |(span, m)| {
        let name = &text[span.clone()];
        let what = if m == Missing::WebSearch { format!("[web] {name}") } else { format!("[{name}]") };
        Err((Some(span), format!("{what}: {m}")))
    })
}

/// The span of the first key of `table` in `absent` (or a search key under `[web]`), and why.
/// A section with nothing in it (the shipped template's `[homeassistant]`, all
/// commented out) asks for nothing: it is not refused.
fn first_missing(table: &DeTable<'_>, absent: &[(&str, Missing)], search: bool) -> Option<(Range<usize>, Missing)> {
    for (key, value) in table {
        let empty = match value.get_ref() {
            DeValue::Table(t) => t.is_empty(),
            DeValue::Array(a) => a.is_empty(),
            _ => false,
        };
        if let Some((_, m)) = absent.iter().find(|(name, _)| *name == key.get_ref().as_ref()).filter(|_| !empty) {
            return Some((key.span(), *m));
        }
        if search || key.get_ref().as_ref() != "web" {
            continue;
        }
        let DeValue::Table(web) = value.get_ref() else { continue };
        for (k, v) in web {
            let engines = k.get_ref().as_ref() == "search" && !matches!(v.get_ref(), DeValue::Array(a) if a.is_empty());
            if engines || SEARCH_KEYS.contains(&k.get_ref().as_ref()) {
                return Some((k.span(), Missing::WebSearch));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn missing(text: &str, absent: &[(&str, Missing)], search: bool) -> Option<(String, Missing)> {
        let table = DeTable::parse(text).unwrap();
        first_missing(table.get_ref(), absent, search).map(|(s, m)| (text[s].to_string(), m))
    }

    #[test]
    fn a_section_of_a_feature_not_built_is_named() {
        let absent = [("homeassistant", Missing::HomeAssistant), ("mcp", Missing::Mcp)];
        let text = "[mqtt]\nurl = \"mqtt://b\"\n\n[homeassistant]\nurl = \"http://ha:8123\"\n";
        assert_eq!(missing(text, &absent, true), Some(("homeassistant".into(), Missing::HomeAssistant)));
        let text = "[[mcp.server]]\nname = \"x\"\ncommand = [\"y\"]\n";
        assert_eq!(missing(text, &absent, true), Some(("mcp".into(), Missing::Mcp)));
        // Built, not named, or empty (the shipped template's header with every key commented out): nothing to say.
        assert_eq!(missing("[homeassistant]\nurl = \"http://ha\"\n", &[], true), None);
        assert_eq!(missing("[homeassistant]\n# url = \"http://ha\"\n\n[mqtt]\n", &absent, true), None);
        assert_eq!(missing("[telegram]\nallow_from = [1]\n", &absent, false), None);
    }

    #[test]
    fn web_search_keys_need_the_feature_but_turning_it_off_does_not() {
        let text = "[web]\nmax_chars = 100\nsearch = [\"searxng\"]\n";
        assert_eq!(missing(text, &[], false), Some(("search".into(), Missing::WebSearch)));
        assert_eq!(missing("[web]\nsearxng_url = \"http://s\"\n", &[], false).map(|f| f.1), Some(Missing::WebSearch));
        assert_eq!(missing("[web]\nsearch = []\nmax_chars = 100\n", &[], false), None);
        assert_eq!(missing(text, &[], true), None);
    }

    #[test]
    fn the_message_says_what_to_do() {
        let m = Missing::HomeAssistant.to_string();
        assert!(m.starts_with("this build has no Home Assistant support (feature `homeassistant`)"), "{m}");
        assert!(m.contains("full `bramble` binary"), "{m}");
    }
}
