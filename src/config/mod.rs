//! Configuration: `config.toml`, its defaults, and where bramble keeps things.
//!
//! Every key has a default, so no file at all is a valid configuration (the
//! daemon starts and says what is not configured). Keys are checked strictly:
//! an unknown key, a wrong type or a bad value is an error that names
//! `FILE:LINE:COL`, because a typo that is silently ignored (a misspelt
//! `[mqtt]` section, say) is the worst kind of config bug on a headless board.
//!
//! Secrets come from the file (`api_key`) or, better, from the environment
//! (`api_key_env = "OPENAI_API_KEY"`); the [`Secret`] type keeps them out of
//! `Debug` output and therefore out of logs.

pub mod channels;
mod diagnose;
pub mod discord;
pub mod email;
pub mod env;
pub mod features;
pub mod feishu;
pub mod fleet;
pub mod homeassistant;
pub mod keys;
pub mod matrix;
pub mod mcp;
pub mod ntfy;
pub mod signal;
pub mod templates;
pub mod tools;
pub mod transcription;
pub mod types;
pub mod warnings;
pub mod webhook;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub use channels::*;
pub use discord::DiscordConfig;
pub use feishu::{FeishuConfig, FeishuDomain};
pub use homeassistant::{EntityGlob, HaTrigger, HomeAssistantConfig};
pub use matrix::MatrixConfig;
pub use mcp::{GrantType, HttpKind, McpConfig, McpServer, McpTransport, OAuthSettings, StdioServer};
pub use signal::{SignalConfig, SignalEndpoint};
pub use tools::*;
pub use transcription::{TranscriptionConfig, TranscriptionKind};
pub use types::{Cidr, ContextWindow, Dur, HttpUrl, Profile, QuietHours, Secret, TextToolCalls, TzName};
pub use warnings::{security_warnings, warnings};
pub use webhook::{WebhookAction, WebhookAuth, WebhookConfig, WebhooksConfig};

use crate::bus::Target;

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub agent: AgentConfig,
    /// `[provider]` (one) or `[[provider]]` (several, each with a `name`): the
    /// first is the default, the others are there for `[agent] fallback`,
    /// `/model` and jobs' `--model`.
    #[serde(rename = "provider", deserialize_with = "providers")]
    pub providers: Vec<ProviderConfig>,
    pub heartbeat: HeartbeatConfig,
    pub exec: ExecConfig,
    pub web: WebConfig,
    pub telegram: TelegramConfig,
    /// `[discord]` (`discord.rs`).
    pub discord: DiscordConfig,
    /// `[matrix]` (`matrix.rs`).
    pub matrix: MatrixConfig,
    /// `[signal]` (`signal.rs`).
    pub signal: SignalConfig,
    /// `[feishu]` (`feishu.rs`): Feishu or Lark.
    pub feishu: FeishuConfig,
    pub mqtt: MqttConfig,
    pub daemon: DaemonConfig,
    pub alerts: AlertsConfig,
    /// `[[mcp.server]]`: MCP servers whose tools the agent may call.
    pub mcp: McpConfig,
    pub transcription: TranscriptionConfig,
    /// `[policy.<source>]`: which tools turns from each source are offered
    /// (`terminal`, `telegram`, `job`, `heartbeat`, `mqtt`, `trigger`).
    pub policy: BTreeMap<String, PolicyRule>,
    /// `[homeassistant]` (`homeassistant.rs`).
    pub homeassistant: HomeAssistantConfig,
    /// `[service]`: what members of the installed service's group may do.
    pub service: ServiceConfig,
    /// `[webhooks]` and `[[webhook]]` (`webhook.rs`): signed HTTP endpoints and targets.
    pub webhooks: WebhooksConfig,
    #[serde(deserialize_with = "webhook::webhooks")]
    pub webhook: Vec<WebhookConfig>,
    /// `[email]` (`email.rs`): IMAP in, SMTP out.
    pub email: email::EmailConfig,
    /// `[ntfy]` (`ntfy.rs`): push notifications out, commands in.
    pub ntfy: ntfy::NtfyConfig,
    /// `[fleet]` (`fleet.rs`): several boards, one chat; off without a name.
    pub fleet: fleet::FleetConfig,
}

/// `[service]`: the installed service's control socket (`bramble cron …` by
/// members of its group, without sudo; see `src/daemon/control.rs`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceConfig {
    /// What members of the service's group may do through the control socket:
    /// `jobs` (every `cron` command: as strong as sudo for bramble), `reminders`
    /// (read the jobs; add and change `--remind` jobs only), `none`.
    pub members: Members,
}

/// `[service] members`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Members {
    /// Every `cron` command, agent (`--message`) and `--exec` jobs included.
    #[default]
    Jobs,
    /// `list` and `show`; `add` (without `--attach`), `remove`, `enable`, `disable`, `run` of reminders only.
    Reminders,
    /// Nothing: the socket serves root and the service's user only.
    None,
}

impl Members {
    pub fn as_str(self) -> &'static str {
        match self {
            Members::Jobs => "jobs",
            Members::Reminders => "reminders",
            Members::None => "none",
        }
    }
}

/// `[policy.<source>]`: an allow-list and a deny list of tool names (`*` globs),
/// and whether the source's sessions may write long-term memory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyRule {
    /// Only these tools (unset: every tool).
    pub tools: Option<Vec<String>>,
    /// Not these (unset: the source's default list; `[]`: none).
    pub deny: Option<Vec<String>>,
    /// Whether consolidating the source's sessions (`/new`, `/compact`, a
    /// long session) may write `memory/MEMORY.md`, which goes into every
    /// system prompt (unset: yes for terminal, telegram, job and heartbeat;
    /// no for mqtt and trigger, whose text anyone on the broker can write).
    pub memory: Option<bool>,
}

/// `[alerts]`: telling the owner when jobs go wrong.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AlertsConfig {
    /// Where alerts go (`telegram:<id>`, `mqtt[:topic]`, `log`); empty: no alerts.
    pub deliver: Vec<Target>,
    /// A job that fails this many times in a row raises one alert (and one note when it works again).
    pub after_failures: u32,
    /// A report waiting in the outbox longer than this raises one alert per channel.
    pub undelivered_after: Dur,
}

impl Default for AlertsConfig {
    fn default() -> Self {
        AlertsConfig { deliver: Vec::new(), after_failures: 3, undelivered_after: Dur::secs(3600) }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            agent: AgentConfig::default(),
            providers: vec![ProviderConfig::default()],
            heartbeat: HeartbeatConfig::default(),
            exec: ExecConfig::default(),
            web: WebConfig::default(),
            telegram: TelegramConfig::default(),
            discord: DiscordConfig::default(),
            matrix: MatrixConfig::default(),
            signal: SignalConfig::default(),
            feishu: FeishuConfig::default(),
            mqtt: MqttConfig::default(),
            daemon: DaemonConfig::default(),
            alerts: AlertsConfig::default(),
            mcp: McpConfig::default(),
            transcription: TranscriptionConfig::default(),
            policy: BTreeMap::new(),
            homeassistant: HomeAssistantConfig::default(),
            service: ServiceConfig::default(),
            webhooks: WebhooksConfig::default(),
            webhook: Vec::new(),
            email: email::EmailConfig::default(),
            ntfy: ntfy::NtfyConfig::default(),
            fleet: fleet::FleetConfig::default(),
        }
    }
}

/// `provider` as one table (`[provider]`) or an array of them (`[[provider]]`).
fn providers<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<ProviderConfig>, D::Error> {
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = Vec<ProviderConfig>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a [provider] table or [[provider]] tables")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            ProviderConfig::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(|p| vec![p])
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(p) = seq.next_element::<ProviderConfig>()? {
                out.push(p);
            }
            if out.is_empty() {
                return Err(serde::de::Error::custom("at least one provider is needed"));
            }
            Ok(out)
        }
    }
    d.deserialize_any(V)
}

/// `[agent]`: the model and the loop.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// Model name as the provider knows it; default depends on the provider kind.
    pub model: Option<String>,
    /// The agent's workspace (its files, HEARTBEAT.md, memory). `~` is expanded.
    pub workspace: Option<PathBuf>,
    /// Time zone for the prompt, `at` times and cron jobs without their own zone. Default: the system's.
    pub timezone: Option<TzName>,
    /// Tool-call rounds per turn before giving up.
    pub max_iterations: u32,
    /// Output token limit per model call.
    pub max_tokens: u32,
    /// Sampling temperature; unset leaves the server's default (some models reject any value).
    pub temperature: Option<f32>,
    /// How many past messages of a session go into the prompt.
    pub history_messages: usize,
    /// Tool results longer than this are cut (head and tail kept).
    pub max_tool_result_chars: usize,
    /// Cap per bootstrap file (AGENTS.md, SOUL.md, …) in the system prompt.
    pub bootstrap_max_chars: usize,
    /// Cap for all bootstrap files together.
    pub bootstrap_total_chars: usize,
    /// Estimated prompt tokens of a session above which its older part is consolidated into memory.
    pub context_tokens: usize,
    /// Tokens per day (local date) after which scheduled and triggered turns refuse to start
    /// and chat answers carry a warning. 0: unlimited.
    pub daily_token_budget: u64,
    /// A message left unanswered by a crash or power cut: `report` it to the user at the next start, or `rerun` it.
    pub unanswered: Unanswered,
    /// Sub-agents (the `spawn` tool) running at once.
    pub max_subagents: usize,
    /// Tool-call rounds of one sub-agent.
    pub subagent_max_iterations: u32,
    /// Models tried in order when the one asked for fails (unreachable, rate
    /// limited, 5xx after its retries, a refused key, an unknown model):
    /// `"provider/model"` or just `"provider"` (its `model`).
    pub fallback: Vec<toml::Spanned<String>>,
    /// How long a provider that failed is skipped before it is tried first again.
    pub fallback_cooldown: Dur,
    /// When an answer says which model gave it: `fallback` (only when it was
    /// not the one asked for), `always`, `never`.
    pub model_footer: ModelFooter,
    /// Whether the model can see images (photos from Telegram). `false`: a
    /// photo reaches it as its inbox path only, and the user is told once.
    pub vision: bool,
    /// The model for turns that carry an image (`provider/model`), when the
    /// usual one cannot see; it falls back like any other.
    pub vision_model: Option<String>,
    /// `lean` or `default` (unset: `lean` when the context window is at most 8192 tokens).
    pub profile: Option<Profile>,
}

/// `[agent] model_footer`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelFooter {
    /// Only when a fallback answered.
    #[default]
    Fallback,
    Always,
    Never,
}

/// `[agent] unanswered`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unanswered {
    /// Tell the user the message was not answered.
    #[default]
    Report,
    /// Run it again.
    Rerun,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            model: None,
            workspace: None,
            timezone: None,
            max_iterations: 40,
            max_tokens: 4096,
            temperature: None,
            history_messages: 40,
            max_tool_result_chars: 16_000,
            bootstrap_max_chars: 12_000,
            bootstrap_total_chars: 40_000,
            context_tokens: 24_000,
            daily_token_budget: 0,
            unanswered: Unanswered::Report,
            max_subagents: 2,
            subagent_max_iterations: 15,
            fallback: Vec::new(),
            fallback_cooldown: Dur::secs(5 * 60),
            model_footer: ModelFooter::Fallback,
            vision: true,
            vision_model: None,
            profile: None,
        }
    }
}

/// Which wire protocol the provider speaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// `/v1/chat/completions`: OpenAI, OpenRouter, DeepSeek, Ollama, llama.cpp, vLLM, …
    #[default]
    Openai,
    /// The Anthropic Messages API.
    Anthropic,
}

impl ProviderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Openai => "openai",
            ProviderKind::Anthropic => "anthropic",
        }
    }
    fn default_base_url(self) -> &'static str {
        match self {
            ProviderKind::Openai => "https://api.openai.com/v1",
            ProviderKind::Anthropic => "https://api.anthropic.com",
        }
    }
    fn default_key_env(self) -> &'static str {
        match self {
            ProviderKind::Openai => "OPENAI_API_KEY",
            ProviderKind::Anthropic => "ANTHROPIC_API_KEY",
        }
    }
    fn default_model(self) -> &'static str {
        match self {
            ProviderKind::Openai => "gpt-4.1-mini",
            ProviderKind::Anthropic => "claude-sonnet-4-5",
        }
    }
}

/// `[provider]`: where the model is.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProviderConfig {
    /// What `/model`, jobs and `[agent] fallback` call it (`lan/qwen2.5:3b`);
    /// required when there are several. Default: the kind (`openai`).
    pub name: Option<toml::Spanned<String>>,
    pub kind: ProviderKind,
    /// This provider's model when only its name is given; the first
    /// provider's is the default model unless `[agent] model` says otherwise.
    pub model: Option<String>,
    /// Tokens per day (local date) this provider may use; past it the chain
    /// skips it until tomorrow. 0: unlimited.
    pub daily_token_budget: u64,
    pub base_url: Option<HttpUrl>,
    pub api_key: Option<Secret>,
    /// Name of the environment variable holding the key (default `OPENAI_API_KEY` / `ANTHROPIC_API_KEY`).
    pub api_key_env: Option<String>,
    /// Limit for one model call, from connect to the end of the answer.
    pub timeout: Dur,
    /// The same limit for calls nobody waits on (jobs, the heartbeat,
    /// sub-agents): a slow local model may take minutes. 0: no limit.
    pub job_timeout: Dur,
    /// Retries after a transient failure (408/409/429/5xx/connection), with 1/2/4 s backoff.
    pub max_retries: u32,
    /// Extra HTTP headers (OpenRouter's `HTTP-Referer`, a proxy's auth, …).
    pub extra_headers: BTreeMap<String, String>,
    /// Tokens the model reads at most. Unset: asked of the server (Ollama,
    /// llama.cpp), else known for common local models by name, else unknown.
    pub context_window: Option<ContextWindow>,
    /// A tool call written as text: recovered (the default) or left as text.
    pub text_tool_calls: TextToolCalls,
}

impl Default for ProviderConfig {
    fn default() -> Self {
        ProviderConfig {
            name: None,
            kind: ProviderKind::Openai,
            model: None,
            daily_token_budget: 0,
            base_url: None,
            api_key: None,
            api_key_env: None,
            timeout: Dur::secs(120),
            job_timeout: Dur::secs(600),
            max_retries: 3,
            extra_headers: BTreeMap::new(),
            context_window: None,
            text_tool_calls: TextToolCalls::Recover,
        }
    }
}

impl ProviderConfig {
    /// Its name: `name`, else the kind (`openai`, `anthropic`).
    pub fn name(&self) -> &str {
        self.name.as_ref().map(|n| n.get_ref().as_str()).unwrap_or(self.kind.as_str())
    }
    /// Whether it was given a name (only then `name/model` refers to it).
    pub fn is_named(&self) -> bool {
        self.name.is_some()
    }
    /// The model used when only the provider is named: `model`, else the kind's default.
    pub fn default_model(&self) -> &str {
        self.model.as_deref().unwrap_or(self.kind.default_model())
    }
    pub fn base_url(&self) -> &str {
        self.base_url.as_ref().map(HttpUrl::as_str).unwrap_or(self.kind.default_base_url())
    }
    pub fn key_env(&self) -> &str {
        self.api_key_env.as_deref().unwrap_or(self.kind.default_key_env())
    }
    /// The API key: `api_key`, else the `api_key_env` variable, else a systemd credential of that name.
    pub fn api_key(&self) -> Option<Secret> {
        self.api_key.clone().or_else(|| secret_from_env(self.key_env()))
    }
    /// Whether a key is required: public endpoints need one, a local server (Ollama,
    /// llama.cpp on the LAN or loopback) usually does not.
    pub fn key_required(&self) -> bool {
        self.base_url.is_none()
    }
}

/// `[heartbeat]`: the periodic look at HEARTBEAT.md.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HeartbeatConfig {
    pub enabled: bool,
    pub every: Dur,
    pub deliver: Vec<Target>,
    pub quiet_hours: Option<QuietHours>,
}

impl Default for HeartbeatConfig {
    fn default() -> Self {
        HeartbeatConfig { enabled: true, every: Dur::secs(30 * 60), deliver: vec![Target::Log], quiet_hours: None }
    }
}

/// `[daemon]`: where state lives, how loudly to log, when to trust the clock.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DaemonConfig {
    /// Sessions, jobs, outbox. Default `$XDG_STATE_HOME/bramble`, `/var/lib/bramble` under systemd.
    pub state_dir: Option<PathBuf>,
    /// `error`, `warn`, `info`, `debug`, `trace`, or a tracing filter; `RUST_LOG` wins.
    pub log_level: Option<String>,
    /// `bramble run` also appends its log here (0600; at 10 MiB it becomes
    /// `<file>.1`): for a daemon started without systemd (a shell, tmux, cron `@reboot`).
    pub log_file: Option<PathBuf>,
    /// How long after start cron and `at` jobs wait for the system clock to report
    /// NTP synchronisation (a Pi has no battery clock and boots with a stale time)
    /// before trusting it anyway. `0s`: trust it at once.
    pub clock_sync_wait: Dur,
}

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig { state_dir: None, log_level: None, log_file: None, clock_sync_wait: Dur::secs(600) }
    }
}

/// A secret from the environment variable `name`, or from the systemd
/// credential of that name (`$CREDENTIALS_DIRECTORY/<name>`, from a
/// `LoadCredential=` of the admin's), or `bramble_<name>` (the unit loads
/// the directory `/etc/bramble/credentials` under the ID `bramble`).
pub fn secret_from_env(name: &str) -> Option<Secret> {
    if name.is_empty() || name.contains(['=', '\0', '/']) {
        return None; // no variable or credential can have such a name
    }
    if let Ok(v) = std::env::var(name) {
        if !v.trim().is_empty() {
            return Some(Secret::new(v.trim()));
        }
    }
    let dir = PathBuf::from(std::env::var_os("CREDENTIALS_DIRECTORY")?);
    [name.to_string(), format!("bramble_{name}")].iter().find_map(|file| {
        let text = std::fs::read_to_string(dir.join(file)).ok()?;
        let text = text.trim();
        (!text.is_empty()).then(|| Secret::new(text))
    })
}

/// Why a config file could not be used. Displays as `FILE:LINE:COL: message`.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// No position: nothing of the file was read.
    #[error("{}: cannot read the config file: {source}{}", path.display(), read_hint(source))]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{}:{line}:{col}: {message}", path.display())]
    Invalid { path: PathBuf, line: usize, col: usize, message: String },
    /// Several errors of one file (each an `Invalid`), in file order: one per line.
    #[error("{}", errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Many { errors: Vec<ConfigError> },
}

/// What to do about a config file that cannot be read.
fn read_hint(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::NotFound => {
            " (`bramble init` writes one; without --config and BRAMBLE_CONFIG the defaults are used)"
        }
        std::io::ErrorKind::PermissionDenied => " (the installed service's config is read with `sudo bramble …`)",
        _ => "",
    }
}

/// A loaded configuration and where it came from.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Config,
    /// The file it was read from; `None` when there was none (all defaults).
    pub path: Option<PathBuf>,
    pub paths: Paths,
}

/// Where bramble's files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    pub workspace: PathBuf,
    pub state_dir: PathBuf,
}

impl Config {
    /// Parse config text. `path` is only used in error messages.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let invalid = |span: Option<std::ops::Range<usize>>, message: String| {
            let (line, col) = span.map(|s| line_col(text, s.start)).unwrap_or((1, 1));
            ConfigError::Invalid { path: path.to_path_buf(), line, col, message }
        };
        let all = |found: Vec<diagnose::Found>| {
            let mut errors: Vec<ConfigError> =
                found.into_iter().map(|(span, message)| invalid(span, message)).collect();
            match errors.len() {
                1 => errors.remove(0),
                _ => ConfigError::Many { errors },
            }
        };
        let mut config = diagnose::read(text).map_err(all)?;
        config.fleet.name_the_device(&mut config.mqtt);
        let mut found: Vec<diagnose::Found> = Vec::new();
        found.extend(config.check_models(text).err());
        found.extend(config.mcp.check().err());
        found.extend(config.email.check(text).err());
        found.extend(config.webhooks.check(text).err());
        found.extend(features::check(text).err());
        if !found.is_empty() {
            return Err(all(found));
        }
        Ok(config)
    }

    /// What one key cannot check alone: provider names (unique, needed when
    /// there are several, usable in `name/model`) and `[agent] fallback`
    /// entries that name a provider.
    fn check_models(&self, text: &str) -> Result<(), (Option<std::ops::Range<usize>>, String)> {
        for name in self.policy.keys() {
            if crate::bus::Source::from_name(name).is_none() {
                let at = text.find(&format!("policy.{name}")).map(|i| i..i + name.len() + 7);
                let names: Vec<&str> = crate::bus::Source::ALL.iter().map(|s| s.name()).collect();
                return Err((
                    at,
                    format!("[policy.{name}] is not a source of turns: expected one of {}", names.join(", ")),
                ));
            }
        }
        if parse_hh_mm(&self.telegram.tomorrow_at).is_none() {
            let at = text.find("tomorrow_at").map(|i| i..i + "tomorrow_at".len());
            return Err((
                at,
                format!(
                    "[telegram] tomorrow_at = \"{}\" is not a time of day like \"09:00\"",
                    self.telegram.tomorrow_at
                ),
            ));
        }
        if let Some(why) = self.discord.problem() {
            return Err((text.find("[discord]").map(|i| i..i + "[discord]".len()), why));
        }
        if let Some(why) = self.matrix.problem() {
            return Err((text.find("[matrix]").map(|i| i..i + "[matrix]".len()), why));
        }
        if let Some(why) = self.signal.problem() {
            return Err((text.find("[signal]").map(|i| i..i + "[signal]".len()), why));
        }
        if let Some(why) = self.feishu.problem() {
            return Err((text.find("[feishu]").map(|i| i..i + "[feishu]".len()), why));
        }
        if let Some(why) = self.ntfy.problem() {
            return Err((text.find("[ntfy").map(|i| i..i + "[ntfy".len()), why));
        }
        let mut seen: Vec<&str> = Vec::new();
        for (i, p) in self.providers.iter().enumerate() {
            match &p.name {
                Some(name) => {
                    let n = name.get_ref();
                    let ok = (1..=32).contains(&n.len())
                        && n.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
                    if !ok {
                        return Err((
                            Some(name.span()),
                            format!("`{n}` is not a provider name: 1 to 32 characters from `A-Z a-z 0-9 - _ .`"),
                        ));
                    }
                    if seen.contains(&n.as_str()) {
                        return Err((Some(name.span()), format!("two providers are named `{n}`")));
                    }
                    seen.push(n);
                }
                None if self.providers.len() > 1 => {
                    // The table has no span of its own: its header, found in the text.
                    let header = text.match_indices("[[provider]]").nth(i).map(|(at, h)| at..at + h.len());
                    return Err((
                        header,
                        "with several [[provider]] tables each needs a `name` (like `name = \"lan\"`), \
                         which `[agent] fallback` and `/model` use"
                            .to_string(),
                    ));
                }
                None => {}
            }
        }
        for entry in &self.agent.fallback {
            let text = entry.get_ref().trim();
            let provider = text.split('/').next().unwrap_or_default();
            if !self.providers.iter().any(|p| p.is_named() && p.name() == provider) {
                let names: Vec<&str> = self.providers.iter().filter(|p| p.is_named()).map(|p| p.name()).collect();
                let known = if names.is_empty() {
                    "no provider has a `name` yet".to_string()
                } else {
                    format!("the named providers are: {}", names.join(", "))
                };
                return Err((
                    Some(entry.span()),
                    format!("`{text}` does not start with a provider's name (`provider/model` or `provider`); {known}"),
                ));
            }
        }
        Ok(())
    }

    /// The first provider: the default one.
    pub fn provider(&self) -> &ProviderConfig {
        // `providers` is never empty: the deserializer refuses an empty list.
        &self.providers[0]
    }

    /// The model to ask for by default: `[agent] model`, else the first provider's.
    pub fn model(&self) -> &str {
        self.agent.model.as_deref().unwrap_or(self.provider().default_model())
    }

    /// The configured time zone, or the system's.
    pub fn timezone(&self) -> TzName {
        self.agent.timezone.clone().unwrap_or_else(TzName::system)
    }

    /// Resolve workspace and state directory: config, then environment, then defaults.
    pub fn paths(&self) -> Paths {
        let home = home_dir();
        let under_systemd = std::env::var_os("STATE_DIRECTORY").map(PathBuf::from);
        let state_dir = self
            .daemon
            .state_dir
            .as_deref()
            .map(|p| expand_tilde(p, &home))
            .or_else(|| std::env::var_os("BRAMBLE_STATE_DIR").map(PathBuf::from))
            .or_else(|| under_systemd.clone().map(|p| first_path(&p)))
            .or_else(|| xdg_dir("XDG_STATE_HOME").map(|p| p.join("bramble")))
            .unwrap_or_else(|| home.join(".local/state/bramble"));
        let workspace = self
            .agent
            .workspace
            .as_deref()
            .map(|p| expand_tilde(p, &home))
            .or_else(|| std::env::var_os("BRAMBLE_WORKSPACE").map(PathBuf::from))
            .or_else(|| under_systemd.map(|p| first_path(&p).join("workspace")))
            .or_else(|| xdg_dir("XDG_DATA_HOME").map(|p| p.join("bramble/workspace")))
            .unwrap_or_else(|| home.join(".local/share/bramble/workspace"));
        Paths { workspace, state_dir }
    }
}

/// An XDG base directory variable, if it is set to an absolute path: the
/// spec says an empty or relative value is to be ignored (an empty
/// `XDG_STATE_HOME` once made the state directory `./bramble`).
fn xdg_dir(name: &str) -> Option<PathBuf> {
    std::env::var_os(name).map(PathBuf::from).filter(|p| p.is_absolute())
}

/// systemd may pass several `:`-separated directories; the first is ours.
fn first_path(p: &Path) -> PathBuf {
    let s = p.to_string_lossy();
    PathBuf::from(s.split(':').next().unwrap_or(&s))
}

/// The installed service's files (the .deb): its config, its secrets and its user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    /// `/etc/bramble/config.toml`.
    pub config: PathBuf,
    /// `/etc/bramble/env`, the unit's `EnvironmentFile`.
    pub env_file: PathBuf,
    /// `/etc/bramble/credentials`, the unit's `LoadCredential` directory.
    pub credentials: PathBuf,
    /// The user the service runs as: `bramble`.
    pub user: String,
    /// `/run/bramble/control.sock`: the running service's control socket
    /// (the unit's `RuntimeDirectory=`), where members of its group send `cron` commands.
    pub control: PathBuf,
}

impl Service {
    /// Where the .deb puts them. A test build (debug assertions on) may move
    /// them under `BRAMBLE_TEST_SYSTEM_ROOT` and name another user with
    /// `BRAMBLE_TEST_SERVICE_USER`; a release build has no such switch, so
    /// nothing can point `sudo bramble` at another config or user.
    pub fn installed() -> Service {
        let root = PathBuf::from("/");
        let user = "bramble".to_string();
        #[cfg(debug_assertions)]
        let (root, user) = (
            std::env::var_os("BRAMBLE_TEST_SYSTEM_ROOT").map(PathBuf::from).unwrap_or(root),
            std::env::var("BRAMBLE_TEST_SERVICE_USER").unwrap_or(user),
        );
        let etc = root.join("etc/bramble");
        Service {
            config: etc.join("config.toml"),
            env_file: etc.join("env"),
            credentials: etc.join("credentials"),
            user,
            control: root.join("run/bramble/control.sock"),
        }
    }
}

/// The default config file: `$BRAMBLE_CONFIG`, systemd's `$CONFIGURATION_DIRECTORY/config.toml`,
/// `$XDG_CONFIG_HOME/bramble/config.toml`, `~/.config/bramble/config.toml`; when
/// that last one does not exist and the installed service's
/// `/etc/bramble/config.toml` does, that one (so `sudo bramble cron add …` acts on the service).
pub fn default_config_path() -> PathBuf {
    if let Some(p) = std::env::var_os("BRAMBLE_CONFIG") {
        return PathBuf::from(p);
    }
    if let Some(dir) = std::env::var_os("CONFIGURATION_DIRECTORY") {
        return first_path(Path::new(&dir)).join("config.toml");
    }
    let own = match xdg_dir("XDG_CONFIG_HOME") {
        Some(dir) => dir.join("bramble/config.toml"),
        None => home_dir().join(".config/bramble/config.toml"),
    };
    if !own.exists() {
        let service = Service::installed().config;
        if service.exists() {
            return service;
        }
    }
    own
}

/// Load the config. With `explicit` (from `--config`), the file must exist; the
/// default location may be missing, which means "all defaults".
pub fn load(explicit: Option<&Path>) -> Result<Loaded, ConfigError> {
    let path = explicit.map(Path::to_path_buf).unwrap_or_else(default_config_path);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && explicit.is_none() => None,
        Err(source) => return Err(ConfigError::Read { path, source }),
    };
    let (config, path) = match text {
        Some(text) => (Config::parse(&text, &path)?, Some(path)),
        None => (Config::default(), None),
    };
    let paths = config.paths();
    Ok(Loaded { config, path, paths })
}

/// Whether two paths name the same file (the same path when they cannot be resolved).
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// 1-based line and column (in characters) of a byte offset.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..floor_char_boundary(text, offset)];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map(|l| l.chars().count()).unwrap_or(0) + 1;
    (line, col)
}

fn floor_char_boundary(text: &str, mut i: usize) -> usize {
    while i > 0 && !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The user's home directory: `$HOME`, else the password database.
pub fn home_dir() -> PathBuf {
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h);
    }
    nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .map(|u| u.dir)
        .unwrap_or_else(|| PathBuf::from("/"))
}

/// Expand a leading `~` or `~/`.
pub fn expand_tilde(p: &Path, home: &Path) -> PathBuf {
    match p.strip_prefix("~") {
        Ok(rest) => home.join(rest),
        Err(_) => p.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    /// Every key of every section appears in the shipped template (set or as
    /// a `# key = …` comment), so the template documents the whole schema.
    #[test]
    fn every_config_key_is_in_the_template() {
        let source = concat!(include_str!("mod.rs"), include_str!("tools.rs"), include_str!("channels.rs"));
        let template = include_str!("../../config/bramble.toml");
        let sections = [
            ("AgentConfig", "agent"),
            ("ProviderConfig", "provider"),
            ("HeartbeatConfig", "heartbeat"),
            ("ExecConfig", "exec"),
            ("WebConfig", "web"),
            ("TelegramConfig", "telegram"),
            ("MqttConfig", "mqtt"),
            ("DaemonConfig", "daemon"),
            ("AlertsConfig", "alerts"),
            ("ServiceConfig", "service"),
        ];
        let mut missing = Vec::new();
        for (ty, section) in sections {
            let start = source.find(&format!("pub struct {ty} {{")).unwrap_or_else(|| panic!("{ty} not found"));
            let body = &source[start..start + source[start..].find("\n}").unwrap()];
            let header = format!("[{section}]");
            let from = template.find(&format!("\n{header}\n")).unwrap_or_else(|| panic!("no {header} in the template"));
            let rest = &template[from + header.len() + 2..];
            let part = &rest[..rest.find("\n[").unwrap_or(rest.len())];
            for line in body.lines().map(str::trim).filter(|l| l.starts_with("pub ") && !l.starts_with("pub struct")) {
                let key = line["pub ".len()..].split(':').next().unwrap().trim();
                if part.contains(&format!("[[{section}.{key}]]")) {
                    continue; // an array of tables, shown as such
                }
                let listed = part.lines().any(|l| {
                    let l = l.trim_start_matches('#').trim_start();
                    l.strip_prefix(key).is_some_and(|r| r.trim_start().starts_with('='))
                });
                if !listed {
                    missing.push(format!("{header} {key}"));
                }
            }
        }
        assert!(missing.is_empty(), "keys missing from config/bramble.toml: {missing:?}");
    }

    /// `[policy.<source>]`'s keys are shown in the template's policy part too.
    #[test]
    fn every_policy_key_is_in_the_template() {
        let source = concat!(include_str!("mod.rs"), include_str!("tools.rs"), include_str!("channels.rs"));
        let template = include_str!("../../config/bramble.toml");
        let start = source.find("pub struct PolicyRule {").unwrap();
        let body = &source[start..start + source[start..].find("\n}").unwrap()];
        let part = &template[template.find("# [policy.").unwrap()..];
        let part = &part[..part.find("\n[").unwrap_or(part.len())];
        for line in body.lines().map(str::trim).filter(|l| l.starts_with("pub ") && !l.starts_with("pub struct")) {
            let key = line["pub ".len()..].split(':').next().unwrap().trim();
            let listed = part.lines().any(|l| {
                l.trim_start_matches('#')
                    .trim_start()
                    .strip_prefix(key)
                    .is_some_and(|r| r.trim_start().starts_with('='))
            });
            assert!(listed, "[policy.<source>] {key} is missing from config/bramble.toml");
        }
    }

    #[test]
    fn policy_tables_take_memory() {
        let c = parse("[policy.mqtt]\nmemory = true\n[policy.telegram]\nmemory = false\n").unwrap();
        assert_eq!(c.policy["mqtt"].memory, Some(true));
        assert_eq!(c.policy["telegram"].memory, Some(false));
        assert!(parse("[policy.mqtt]\nmemory = \"yes\"\n").is_err(), "a boolean");
        assert!(parse("[policy.mqtt]\nmemories = true\n").unwrap_err().contains("memories"), "unknown keys refused");
    }

    use super::*;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text, Path::new("/etc/bramble/config.toml")).map_err(|e| e.to_string())
    }

    #[test]
    fn service_members_is_one_of_three_words_with_file_and_line() {
        assert_eq!(parse("").unwrap().service.members, Members::Jobs);
        assert_eq!(parse("[service]\nmembers = \"reminders\"\n").unwrap().service.members, Members::Reminders);
        assert_eq!(parse("[service]\nmembers = \"none\"\n").unwrap().service.members, Members::None);
        let err = parse("[service]\nmembers = \"all\"\n").unwrap_err();
        assert!(err.starts_with("/etc/bramble/config.toml:2:11:"), "{err}");
        assert!(err.contains("expected one of `jobs`, `reminders`, `none`"), "{err}");
    }

    #[test]
    fn empty_file_is_all_defaults() {
        let c = parse("").unwrap();
        assert_eq!(c.agent.max_iterations, 40);
        assert_eq!(c.exec.timeout, Dur::secs(60));
        assert_eq!(c.exec.max_output, 10_000);
        assert_eq!(c.heartbeat.every, Dur::secs(1800));
        assert_eq!(c.provider().kind, ProviderKind::Openai);
        assert_eq!(c.provider().base_url(), "https://api.openai.com/v1");
        assert_eq!(c.model(), "gpt-4.1-mini");
    }

    #[test]
    fn telegram_ids_may_be_numbers_or_strings() {
        let c = parse("[telegram]\nallow_from = [123456789, \"@me\", \"42\"]\n").unwrap();
        assert_eq!(c.telegram.allow_from, ["123456789", "@me", "42"]);
        let err = parse("[telegram]\nallow_from = [1.5]\n").unwrap_err();
        assert!(err.starts_with("/etc/bramble/config.toml:2:"), "file and line: {err}");
        assert!(err.contains("a user id (a number like 123456789) or \"@username\""), "{err}");
    }

    #[test]
    fn unknown_key_has_line_and_column() {
        let err = parse("[agent]\nmodel = \"x\"\nmax_iteration = 3\n").unwrap_err();
        assert!(
            err.starts_with(
                "/etc/bramble/config.toml:3:1: unknown key `max_iteration` in [agent]: did you mean `max_iterations`?"
            ),
            "{err}"
        );
    }

    #[test]
    fn unknown_section_is_an_error() {
        let err = parse("[mqqt]\nurl = \"mqtt://x\"\n").unwrap_err();
        assert!(err.starts_with("/etc/bramble/config.toml:1:2: unknown section `mqqt`: did you mean `mqtt`?"), "{err}");
    }

    #[test]
    fn wrong_type_has_line_and_column() {
        let err = parse("[agent]\nmax_iterations = \"many\"\n").unwrap_err();
        assert!(err.starts_with("/etc/bramble/config.toml:2:18: [agent] `max_iterations`: expected a whole number, like `10`, found `\"many\"`"), "{err}");
    }

    #[test]
    fn exec_network_takes_modes_lists_and_the_old_booleans() {
        let net = |v: &str| parse(&format!("[exec]\nnetwork = {v}\n")).map(|c| c.exec.network);
        assert_eq!(parse("").unwrap().exec.network, Network::Auto);
        assert_eq!(net("true"), Ok(Network::All));
        assert_eq!(net("false"), Ok(Network::None));
        assert_eq!(net("\"internet\""), Ok(Network::INTERNET));
        assert_eq!(net("\"lan\""), Ok(Network::Filtered { internet: false, lan: true }));
        assert_eq!(net("[\"lan\", \"internet\"]"), Ok(Network::Filtered { internet: true, lan: true }));
        assert_eq!(net("\"all\""), Ok(Network::All));
        assert_eq!(net("\"none\""), Ok(Network::None));
        let err = net("\"intranet\"").unwrap_err();
        assert!(err.starts_with("/etc/bramble/config.toml:2:11: unknown network `intranet`"), "{err}");
        assert!(net("[]").unwrap_err().contains("write \"none\""));
        assert!(net("[\"all\", \"lan\"]").unwrap_err().contains("on their own"));
        assert!(net("3").unwrap_err().contains("expected \"internet\""));
    }

    #[test]
    fn bad_duration_points_at_the_value() {
        let err = parse("[exec]\ntimeout = \"ten seconds\"\n").unwrap_err();
        assert!(err.starts_with("/etc/bramble/config.toml:2:11: `ten seconds` is not a duration"), "{err}");
    }

    #[test]
    fn bad_time_zone_points_at_the_value() {
        let err = parse("[agent]\n\ntimezone = \"Europe/Berln\"\n").unwrap_err();
        assert!(err.starts_with("/etc/bramble/config.toml:3:12: `Europe/Berln` is not a known time zone"), "{err}");
    }

    #[test]
    fn bad_target_and_url_and_trigger() {
        let err = parse("[heartbeat]\ndeliver = [\"log\", \"telegram:abc\"]\n").unwrap_err();
        assert!(err.contains(":2:11: `telegram:abc`"), "{err}");
        let err = parse("[provider]\nbase_url = \"localhost:11434\"\n").unwrap_err();
        assert!(err.contains(":2:12:"), "{err}");
        let err = parse("[mqtt]\nurl = \"tcp://broker\"\n").unwrap_err();
        assert!(err.contains(":2:7: `tcp://broker` is not a broker URL"), "{err}");
        let err = parse("[[mqtt.trigger]]\ntopic = \"door\"\n").unwrap_err();
        assert!(err.contains("needs exactly one of `message` or `exec`"), "{err}");
    }

    #[test]
    fn full_config_parses() {
        let c = parse(
            r#"
[agent]
model = "llama3.2"
workspace = "~/ws"
timezone = "Europe/Berlin"
[provider]
kind = "openai"
base_url = "http://192.168.1.10:11434/v1"
api_key_env = "OLLAMA_KEY"
timeout = "2m"
[heartbeat]
every = "15m"
deliver = ["telegram:123", "mqtt"]
quiet_hours = "23:00-07:00"
[exec]
network = false
env_allow = ["TZ"]
[web]
allow_private = ["192.168.1.0/24"]
[telegram]
token_env = "TG_TOKEN"
allow_from = ["123", "@me"]
[mqtt]
url = "mqtts://broker.lan"
device = "pi"
[[mqtt.trigger]]
topic = "zigbee2mqtt/front_door"
message = "door: {payload.contact}"
deliver = ["telegram:123"]
"#,
        )
        .unwrap();
        assert_eq!(c.provider().base_url(), "http://192.168.1.10:11434/v1");
        assert!(!c.provider().key_required());
        assert_eq!(c.provider().timeout, Dur::secs(120));
        assert_eq!(c.mqtt.url, Some(MqttUrl { tls: true, host: "broker.lan".into(), port: 8883 }));
        assert_eq!(c.mqtt.trigger[0].action, TriggerAction::Message("door: {payload.contact}".into()));
        assert_eq!(c.mqtt.trigger[0].min_interval, Dur::secs(60));
        let home = Path::new("/home/pi");
        assert_eq!(expand_tilde(c.agent.workspace.as_deref().unwrap(), home), PathBuf::from("/home/pi/ws"));
    }

    #[test]
    fn shipped_template_is_valid_and_complete() {
        let c = parse(templates::CONFIG_TOML).unwrap();
        assert_eq!(c.agent.max_iterations, 40);
    }

    #[test]
    fn line_col_counts_characters() {
        assert_eq!(line_col("a\nbé c", 6), (2, 4));
        assert_eq!(line_col("abc", 0), (1, 1));
        assert_eq!(line_col("abc", 99), (1, 4));
    }

    #[test]
    fn api_key_from_named_env_var() {
        let key = [("BRAMBLE_TEST_KEY_7f3a", "sk-test")];
        if !crate::util::test_env::in_child(concat!(module_path!(), "::api_key_from_named_env_var"), &key, &[]) {
            return;
        }
        let c = parse("[provider]\napi_key_env = \"BRAMBLE_TEST_KEY_7f3a\"\n").unwrap();
        assert_eq!(c.provider().api_key().unwrap().expose(), "sk-test");
        let c = parse("[provider]\napi_key = \"inline\"\napi_key_env = \"BRAMBLE_TEST_KEY_7f3a\"\n").unwrap();
        assert_eq!(c.provider().api_key().unwrap().expose(), "inline");
    }

    /// The unit hands `/etc/bramble/credentials/NAME` over as `bramble_NAME`;
    /// an admin's own `LoadCredential=NAME:…` as `NAME`, which wins.
    #[test]
    fn api_keys_from_systemd_credentials() {
        let dir = std::env::temp_dir().join(format!("bramble-creds-{}", std::process::id()));
        let dir_text = dir.to_str().unwrap().to_string();
        let vars = [("CREDENTIALS_DIRECTORY", dir_text.as_str())];
        let test = concat!(module_path!(), "::api_keys_from_systemd_credentials");
        if !crate::util::test_env::in_child(test, &vars, &["BRAMBLE_CRED_A", "BRAMBLE_CRED_B"]) {
            let _ = std::fs::remove_dir_all(&dir);
            return;
        }
        let dir = PathBuf::from(std::env::var_os("CREDENTIALS_DIRECTORY").unwrap()); // the parent's
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("bramble_BRAMBLE_CRED_A"), "sk-from-dir\n").unwrap();
        std::fs::write(dir.join("bramble_BRAMBLE_CRED_B"), "sk-from-dir").unwrap();
        std::fs::write(dir.join("BRAMBLE_CRED_B"), "sk-own").unwrap();
        std::fs::write(dir.join("bramble"), "none").unwrap();
        assert_eq!(secret_from_env("BRAMBLE_CRED_A").unwrap().expose(), "sk-from-dir");
        assert_eq!(secret_from_env("BRAMBLE_CRED_B").unwrap().expose(), "sk-own");
        assert!(secret_from_env("BRAMBLE_CRED_C").is_none());
        assert!(secret_from_env("").is_none(), "the fallback file `bramble` is no key");
        assert!(secret_from_env("../etc/passwd").is_none());
    }
}
