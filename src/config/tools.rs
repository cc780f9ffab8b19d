//! `[exec]` and `[web]`: what the shell tool, exec jobs and the web tools may
//! do. Split from `mod.rs` to keep each file a size one reads; the types are
//! re-exported there (`crate::config::ExecConfig`, …).

use serde::Deserialize;

use super::{Cidr, Dur, HttpUrl};

/// `[exec]`: the shell tool and exec jobs.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExecConfig {
    pub enabled: bool,
    pub timeout: Dur,
    /// Characters of output kept (head and tail) per command.
    pub max_output: usize,
    /// What commands may reach over the network.
    pub network: Network,
    /// Environment variables passed through to commands (besides PATH, HOME, LANG, TERM).
    pub env_allow: Vec<String>,
    /// The kernel sandbox: `auto` (every layer the kernel offers), `required`
    /// (refuse to run commands without the namespace jail), `off`.
    pub isolation: Isolation,
    /// When bramble runs as root, commands run as this user…
    pub run_as_user: String,
    /// …and this group (falls back to the user's own group if it does not exist).
    pub run_as_group: String,
    /// CPU seconds per process (`RLIMIT_CPU`); 0: no limit.
    pub max_cpu_seconds: u64,
    /// Address space per process in MiB (`RLIMIT_AS`); 0: no limit.
    pub max_memory_mb: u64,
    /// Largest file a command may write, in MiB (`RLIMIT_FSIZE`); 0: no limit.
    pub max_file_size_mb: u64,
    /// Open files per process (`RLIMIT_NOFILE`); 0: no limit.
    pub max_open_files: u64,
    /// Processes of the command's user (`RLIMIT_NPROC`, inside its own user namespace); 0: no limit.
    pub max_processes: u64,
    /// Size of the command's private `/tmp` in MiB.
    pub tmp_size_mb: u64,
    /// Paths the jail hides that commands may see again, read-only: a unix
    /// socket under `/run` (and `socket(AF_UNIX)` is then allowed).
    #[serde(deserialize_with = "absolute_paths")]
    pub expose: Vec<std::path::PathBuf>,
}

fn absolute_paths<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<std::path::PathBuf>, D::Error> {
    let paths = Vec::<std::path::PathBuf>::deserialize(d)?;
    match paths.iter().find(|p| !p.is_absolute()) {
        Some(p) => Err(serde::de::Error::custom(format!("`{}` is not an absolute path", p.display()))),
        None => Ok(paths),
    }
}

/// `[exec] isolation`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    #[default]
    Auto,
    Required,
    Off,
}

impl Isolation {
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Auto => "auto",
            Isolation::Required => "required",
            Isolation::Off => "off",
        }
    }
}

/// `[exec] network`: what commands may reach.
///
/// `"internet"` and `"lan"` put the command in a network namespace of its own
/// whose only way out is bramble's filtering proxy (`crate::sandbox::netproxy`),
/// so the kernel, not a reading of the command, decides what it reaches.
/// What each setting comes to on this system is the sandbox's judgement
/// (`crate::sandbox::reach`); this is only the setting as written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Network {
    /// `"internet"` where the namespace jail can enforce it, else `"all"` (said at start).
    #[default]
    Auto,
    /// Nothing at all (`false`).
    None,
    /// Through the proxy: public addresses, the local network, or both.
    Filtered { internet: bool, lan: bool },
    /// Whatever the host reaches, its own services included (`true`).
    All,
}

impl Network {
    /// The default for commands: public addresses only.
    pub const INTERNET: Network = Network::Filtered { internet: true, lan: false };

    /// As written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Network::Auto => "auto",
            Network::None => "none",
            Network::All => "all",
            Network::Filtered { internet: true, lan: false } => "internet",
            Network::Filtered { internet: false, lan: true } => "lan",
            Network::Filtered { .. } => "[\"internet\", \"lan\"]",
        }
    }
}

impl<'de> Deserialize<'de> for Network {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        const EXPECTED: &str =
            "\"internet\", \"lan\", \"all\", \"none\", \"auto\", a list such as [\"internet\", \"lan\"], or true/false";
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Network;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(EXPECTED)
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Network, E> {
                Ok(if v { Network::All } else { Network::None })
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Network, E> {
                Ok(match v {
                    "auto" => Network::Auto,
                    "none" => Network::None,
                    "all" => Network::All,
                    "internet" => Network::INTERNET,
                    "lan" => Network::Filtered { internet: false, lan: true },
                    other => return Err(E::custom(format!("unknown network `{other}`: expected {EXPECTED}"))),
                })
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Network, A::Error> {
                let (mut internet, mut lan) = (false, false);
                while let Some(item) = seq.next_element::<String>()? {
                    match item.as_str() {
                        "internet" => internet = true,
                        "lan" => lan = true,
                        other => {
                            return Err(serde::de::Error::custom(format!(
                                "`{other}` in a network list: a list combines \"internet\" and \"lan\" \
                                 (write \"all\" or \"none\" on their own)"
                            )))
                        }
                    }
                }
                if !internet && !lan {
                    return Err(serde::de::Error::custom("an empty network list: write \"none\" for no network"));
                }
                Ok(Network::Filtered { internet, lan })
            }
        }
        d.deserialize_any(V)
    }
}

impl Default for ExecConfig {
    fn default() -> Self {
        ExecConfig {
            enabled: true,
            timeout: Dur::secs(60),
            max_output: 10_000,
            network: Network::Auto,
            env_allow: Vec::new(),
            isolation: Isolation::Auto,
            run_as_user: "nobody".into(),
            run_as_group: "nogroup".into(),
            max_cpu_seconds: 300,
            max_memory_mb: 1024,
            max_file_size_mb: 1024,
            max_open_files: 1024,
            max_processes: 128,
            tmp_size_mb: 64,
            expose: Vec::new(),
        }
    }
}

/// `[web]`: the web_fetch tool.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebConfig {
    pub enabled: bool,
    /// Private ranges that may be fetched anyway (a LAN Home Assistant, Ollama).
    pub allow_private: Vec<Cidr>,
    /// Characters of page text returned to the model.
    pub max_chars: usize,
    pub timeout: Dur,
    /// The `web_search` engines, tried in order: `duckduckgo` (no key),
    /// `searxng` (`searxng_url`), `brave`, `tavily` (keys from the environment).
    /// One name or a list; an empty list turns `web_search` off.
    #[serde(deserialize_with = "engines")]
    pub search: Vec<SearchEngine>,
    /// Results `web_search` returns at most (1–20).
    pub search_max_results: usize,
    /// A SearXNG instance (its JSON API must be enabled: `search.formats: [html, json]`).
    /// On the LAN it must also be in `allow_private`.
    pub searxng_url: Option<HttpUrl>,
    /// Environment variable (or systemd credential) with the Brave Search API key.
    pub brave_api_key_env: String,
    /// Environment variable (or systemd credential) with the Tavily API key.
    pub tavily_api_key_env: String,
    /// Other endpoints for the engines (a proxy, a test double); the defaults are the public ones.
    pub duckduckgo_url: Option<HttpUrl>,
    pub brave_url: Option<HttpUrl>,
    pub tavily_url: Option<HttpUrl>,
}

impl Default for WebConfig {
    fn default() -> Self {
        WebConfig {
            enabled: true,
            allow_private: Vec::new(),
            max_chars: 50_000,
            timeout: Dur::secs(30),
            search: vec![SearchEngine::Duckduckgo],
            search_max_results: 5,
            searxng_url: None,
            brave_api_key_env: "BRAVE_API_KEY".into(),
            tavily_api_key_env: "TAVILY_API_KEY".into(),
            duckduckgo_url: None,
            brave_url: None,
            tavily_url: None,
        }
    }
}

/// A `web_search` engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SearchEngine {
    Duckduckgo,
    Searxng,
    Brave,
    Tavily,
}

impl SearchEngine {
    pub fn as_str(self) -> &'static str {
        match self {
            SearchEngine::Duckduckgo => "duckduckgo",
            SearchEngine::Searxng => "searxng",
            SearchEngine::Brave => "brave",
            SearchEngine::Tavily => "tavily",
        }
    }
}

/// `[web] search`: one engine or a list of them.
fn engines<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<SearchEngine>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(SearchEngine),
        Many(Vec<SearchEngine>),
    }
    // Untagged errors say nothing useful: say what is accepted.
    let value = toml::Value::deserialize(d)?;
    let list = match value {
        toml::Value::String(s) if s.is_empty() => return Ok(Vec::new()),
        v => OneOrMany::deserialize(v).map_err(|_| {
            serde::de::Error::custom("expected \"duckduckgo\", \"searxng\", \"brave\" or \"tavily\", or a list of them")
        })?,
    };
    let mut out = match list {
        OneOrMany::One(e) => vec![e],
        OneOrMany::Many(v) => v,
    };
    let mut seen = Vec::new();
    out.retain(|e| {
        !seen.contains(e) && {
            seen.push(*e);
            true
        }
    });
    Ok(out)
}
