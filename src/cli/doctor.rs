//! `bramble doctor`: the things users ask about, checked in one go.
//!
//! Each line is `ok`, `warning` or `error`, what was found, and for the last
//! two what to do. Network checks say what they send: the provider gets one
//! `GET …/models` (no tokens are spent), Telegram one `getMe`, the broker one
//! MQTT CONNECT under a client id of its own. Exit status 1 when any line is
//! an error. `doctor --json` prints the same checks as one object (see
//! [`Summary`]), collected in one [`Report`] that the text is printed from.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use crate::config::{self, Loaded};

/// What to do about a config that does not load.
const FIX_CONFIG: &str = "fix the line it names; `bramble check` says the same";

/// How long each network check may take.
const LIMIT: Duration = Duration::from_secs(10);

/// A check's outcome. `Skip`: the part is not configured (the text says `ok`, as it always did).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
enum Level {
    Ok,
    #[serde(rename = "warn")]
    Warning,
    #[serde(rename = "fail")]
    Error,
    Skip,
}

/// One check, as `doctor --json` prints it and the text line is made from.
/// Stable: fields are added, never renamed or removed.
#[derive(Debug, serde::Serialize)]
struct Check {
    name: String,
    status: Level,
    /// What was found.
    detail: String,
    /// What to do, for a `warn` or a `fail` that has a fix (else null).
    hint: Option<String>,
}

impl Check {
    /// The text line: the level, the name, the detail and the hint after a colon.
    fn line(&self) -> String {
        let tag = match self.status {
            Level::Ok | Level::Skip => "ok     ",
            Level::Warning => "warning",
            Level::Error => "error  ",
        };
        let text = match &self.hint {
            Some(hint) => format!("{}: {hint}", self.detail),
            None => self.detail.clone(),
        };
        // What a server answered is quoted here: its control characters are shown, not run.
        format!("{tag}  {:<16} {}", self.name, crate::util::text::escape_controls(&text))
    }
}

/// The checks made so far; printed one by one as they come unless the output is JSON.
struct Report {
    checks: Vec<Check>,
    json: bool,
}

/// `doctor --json`: the checks in order, and `result`: `fail` when any check
/// failed (exit status 1), else `warn` when any warned, else `ok`.
#[derive(serde::Serialize)]
struct Summary<'a> {
    result: &'static str,
    errors: usize,
    warnings: usize,
    checks: &'a [Check],
}

impl Report {
    fn new(json: bool) -> Report {
        Report { checks: Vec::new(), json }
    }

    fn line(&mut self, level: Level, what: &str, text: impl AsRef<str>) {
        self.hinted(level, what, text, None::<String>);
    }

    fn hinted(&mut self, level: Level, what: &str, detail: impl AsRef<str>, hint: Option<impl Into<String>>) {
        let check = Check {
            name: what.to_string(),
            status: level,
            detail: detail.as_ref().to_string(),
            hint: hint.map(Into::into),
        };
        if !self.json {
            println!("{}", check.line());
        }
        self.checks.push(check);
    }

    fn count(&self, level: Level) -> usize {
        self.checks.iter().filter(|c| c.status == level).count()
    }

    /// The closing line (or the JSON object), and the exit status.
    fn finish(&self) -> ExitCode {
        let (errors, warnings) = (self.count(Level::Error), self.count(Level::Warning));
        if self.json {
            let result = if errors > 0 {
                "fail"
            } else if warnings > 0 {
                "warn"
            } else {
                "ok"
            };
            let summary = Summary { result, errors, warnings, checks: &self.checks };
            match serde_json::to_string_pretty(&summary) {
                Ok(out) => println!("{out}"),
                Err(e) => eprintln!("error: {e}"),
            }
        } else {
            println!(
                "\n{} error{}, {} warning{}",
                errors,
                if errors == 1 { "" } else { "s" },
                warnings,
                if warnings == 1 { "" } else { "s" }
            );
        }
        if errors > 0 {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        }
    }
}

pub(super) async fn doctor(explicit: Option<&Path>, json: bool) -> ExitCode {
    let mut r = Report::new(json);
    let loaded = match config::load(explicit) {
        Ok(l) => l,
        Err(e) => {
            // The text as it always was: the fix on a line of its own, no summary line.
            let (detail, hint) = match json {
                true => (e.to_string(), Some(FIX_CONFIG.to_string())),
                false => (format!("{e}\n                 {FIX_CONFIG}"), None),
            };
            r.hinted(Level::Error, "config", detail, hint);
            return if json { r.finish() } else { ExitCode::FAILURE };
        }
    };
    let where_ = loaded.path.as_ref().map_or("none: all defaults".to_string(), |p| p.display().to_string());
    r.line(Level::Ok, "config", format!("{where_} is valid"));
    providers(&loaded, &mut r).await;
    // The context window (asked of the server) against the fixed part of every prompt.
    let agent = super::check::agent_for(&loaded);
    agent.context().resolve_window().await;
    match super::check::context_line(&agent) {
        Some((true, line)) => r.line(Level::Warning, "context", line),
        Some((false, line)) => r.line(Level::Ok, "context", line),
        None => r.line(Level::Skip, "context", "the model's context window is unknown ([provider] context_window)"),
    }
    telegram(&loaded, &mut r).await;
    match crate::channels::mqtt::probe(&loaded.config.mqtt, LIMIT).await {
        Ok(None) => r.line(Level::Skip, "mqtt", "not configured"),
        Ok(Some(found)) => r.line(Level::Ok, "mqtt", found),
        Err(e) => r.line(Level::Error, "mqtt", e),
    }
    fleet(&loaded, &mut r).await;
    chat_apps(&loaded, &mut r).await;
    #[cfg(feature = "homeassistant")]
    match crate::channels::homeassistant::probe(&loaded.config.homeassistant).await {
        Ok(None) => r.line(Level::Skip, "homeassistant", "not configured"),
        Ok(Some(found)) => r.line(Level::Ok, "homeassistant", found),
        Err(e) => r.line(Level::Error, "homeassistant", e),
    }
    webhooks(&loaded, &mut r);
    if crate::scheduler::engine::clock_synchronized() {
        r.line(Level::Ok, "clock", "synchronised");
    } else {
        r.line(
            Level::Warning,
            "clock",
            format!(
                "not synchronised: cron and `at` jobs wait for it up to [daemon] clock_sync_wait ({}) after a \
                 start; enable an NTP client (`timedatectl set-ntp true`)",
                loaded.config.daemon.clock_sync_wait
            ),
        );
    }
    if loaded.config.exec.enabled {
        let layers = crate::sandbox::Sandbox::for_config(&loaded).layers_summary(&loaded.config.exec);
        let weak = ["NO ", "NONE (", "UNAVAILABLE", "BLOCKED", "MISSING", "off ("].iter().any(|w| layers.contains(w));
        let level = if weak { Level::Warning } else { Level::Ok };
        r.line(level, "sandbox", layers);
    } else {
        r.line(Level::Skip, "sandbox", "exec is off");
    }
    // MCP servers' OAuth grants: one whose refresh was refused needs the owner.
    #[cfg(feature = "mcp")]
    for (name, ok, text) in super::mcp::auth_lines(&loaded) {
        let (level, hint) =
            if ok { (Level::Ok, None) } else { (Level::Warning, Some(format!("run `bramble mcp login {name}`"))) };
        r.hinted(level, "mcp", format!("{name}: {text}"), hint);
    }
    storage(&loaded, &mut r);
    if let Some(service) = super::status::service_line() {
        let level = if service.contains(" active") { Level::Ok } else { Level::Warning };
        r.line(level, "service", service);
    }
    r.finish()
}

/// `[[webhook]]`: the secrets, the listening address, the targets' hosts.
fn webhooks(loaded: &Loaded, r: &mut Report) {
    #[cfg(feature = "webhook")]
    {
        let running = crate::daemon::daemon_running(&loaded.paths.state_dir);
        match crate::channels::webhook::status::probe(&loaded.config, running, LIMIT) {
            Ok(None) => r.line(Level::Skip, "webhooks", "not configured"),
            Ok(Some(found)) => r.line(Level::Ok, "webhooks", found),
            Err(e) => r.line(Level::Error, "webhooks", e),
        }
    }
    #[cfg(not(feature = "webhook"))]
    match loaded.config.webhook.is_empty() {
        true => r.line(Level::Skip, "webhooks", "not configured"),
        false => r.line(Level::Error, "webhooks", "this build has no webhooks (cargo feature `webhook`)"),
    }
}

/// `bramble init`'s checks after it wrote the answers: the providers and
/// Telegram, as [`doctor`] prints them. Whether none was an error.
pub(super) async fn first_checks(loaded: &Loaded) -> bool {
    let mut r = Report::new(false);
    providers(loaded, &mut r).await;
    telegram(loaded, &mut r).await;
    r.count(Level::Error) == 0
}

/// Each provider: its key, then one request that costs no tokens, and
/// whether the model configured for it is in the server's list.
async fn providers(loaded: &Loaded, r: &mut Report) {
    use crate::config::env::KeyState;
    for p in &loaded.config.providers {
        let what = format!("provider {}", p.name());
        let client = match crate::provider::client(p) {
            Ok(c) => c,
            Err(e) => {
                r.line(Level::Error, &what, e.to_string());
                continue;
            }
        };
        let key = match crate::config::env::key_state(p) {
            KeyState::Set => "key set".to_string(),
            KeyState::NotNeeded => "no key needed (own base_url, no api_key_env)".to_string(),
            KeyState::Unset(env) => {
                let file = crate::config::env::path();
                r.hinted(
                    Level::Warning,
                    &what,
                    format!("api_key_env names {env}, which is not set (read in this shell)"),
                    Some(format!("every turn fails until it is; set it, or put it in {}", file.display())),
                );
                continue;
            }
        };
        match client.probe().await {
            Ok(found) => {
                r.line(Level::Ok, &what, format!("{key}; reachable ({}; no tokens spent)", found.summary));
                model_listed(loaded, p, found.models.as_deref(), r);
            }
            // Not found, not allowed, not implemented: a server without a model list.
            Err(crate::provider::ProviderError::Http { status: 404 | 405 | 501, .. }) => r.line(
                Level::Warning,
                &what,
                format!("{key}; the server answers but has no model list at {} (a chat may still work)", p.base_url()),
            ),
            Err(e @ crate::provider::ProviderError::Auth { .. }) => {
                r.hinted(Level::Error, &what, e.to_string(), Some(format!("check the key ({})", p.key_env())))
            }
            Err(e) => r.hinted(Level::Error, &what, e.to_string(), Some(format!("is {} right and up?", p.base_url()))),
        }
    }
}

/// Whether the models configured for `p` are in the list its server gave.
fn model_listed(loaded: &Loaded, p: &crate::config::ProviderConfig, listed: Option<&[String]>, r: &mut Report) {
    let Some(listed) = listed.filter(|l| !l.is_empty()) else { return };
    let c = &loaded.config;
    // One provider: the model turns use. Several: each one's own, and `[agent] model`'s `name/model`.
    let mut wanted = vec![if c.providers.len() == 1 { c.model() } else { p.default_model() }.to_string()];
    if let Some((name, model)) = c.model().split_once('/').filter(|_| c.providers.len() > 1) {
        if p.is_named() && name == p.name() {
            wanted.push(model.to_string());
        }
    }
    wanted.dedup();
    let what = format!("model {}", p.name());
    for model in wanted {
        // Ollama lists `llama3.2:latest` for `llama3.2`.
        let found = listed.iter().any(|m| *m == model || m.strip_suffix(":latest") == Some(&model));
        if found {
            r.line(Level::Ok, &what, format!("{model} is in the server's model list"));
        } else {
            let some: Vec<&str> = listed.iter().take(5).map(String::as_str).collect();
            r.line(
                Level::Warning,
                &what,
                format!(
                    "{model} is not in the server's list of {} models (e.g. {}): check the spelling in the config",
                    listed.len(),
                    some.join(", ")
                ),
            );
        }
    }
}

/// `[fleet]`: the config, and what the broker says of the boards (docs/fleet.md).
async fn fleet(loaded: &Loaded, r: &mut Report) {
    let c = &loaded.config;
    let Some(me) = c.fleet.board() else { return r.line(Level::Skip, "fleet", "not configured") };
    if let Err(e) = c.fleet.check(&c.mqtt) {
        return r.line(Level::Error, "fleet", e.to_string());
    }
    #[cfg(feature = "fleet")]
    match crate::fleet::remote::snapshot(c).await {
        Err(e) => r.line(Level::Error, "fleet", e.to_string()),
        Ok((_, boards)) => {
            let others: Vec<_> = boards.0.iter().filter(|(b, _)| *b != me).collect();
            let offline: Vec<String> = others.iter().filter(|(_, s)| !s.online).map(|(b, _)| b.to_string()).collect();
            let primary_down = c.fleet.primary.as_ref().filter(|p| !boards.is_online(p));
            let text = format!(
                "{me} ({}): {} other board(s) on the broker, {} offline{}{}",
                c.fleet.role.as_str(),
                others.len(),
                offline.len(),
                if offline.is_empty() { String::new() } else { format!(" ({})", offline.join(", ")) },
                boards.chat_holder().map(|b| format!("; {b} holds the chat")).unwrap_or_default()
            );
            match primary_down {
                Some(p) => r.hinted(
                    Level::Warning,
                    "fleet",
                    text,
                    Some(format!("the primary {p} is offline: reports wait on this board")),
                ),
                None => r.line(Level::Ok, "fleet", text),
            }
        }
    }
    #[cfg(not(feature = "fleet"))]
    r.line(Level::Warning, "fleet", format!("{me}: this bramble was built without the `fleet` feature"));
}

async fn telegram(loaded: &Loaded, r: &mut Report) {
    let c = &loaded.config.telegram;
    let Some(token) = c.token() else {
        let why = match &c.token_env {
            Some(env) => (Level::Warning, format!("token_env names {env}, which is not set: Telegram stays off")),
            None => (Level::Skip, "not configured".to_string()),
        };
        r.line(why.0, "telegram", why.1);
        return;
    };
    crate::install_crypto();
    let api = match crate::clients::telegram::Api::new(c.api_base.as_str(), token) {
        Ok(a) => a,
        Err(e) => return r.line(Level::Error, "telegram", e.to_string()),
    };
    match tokio::time::timeout(LIMIT, api.get_me()).await {
        Ok(Ok(me)) => {
            let name = me.username.map_or(me.first_name, |u| format!("@{u}"));
            r.line(Level::Ok, "telegram", format!("the bot is {name} (id {})", me.id));
            if c.allow_from.is_empty() {
                r.line(Level::Warning, "telegram", "[telegram] allow_from is empty: the bot answers nobody");
            }
        }
        Ok(Err(e)) if e.code() == Some(401) => {
            r.hinted(Level::Error, "telegram", e.to_string(), Some("the token is wrong; get it again from @BotFather"))
        }
        Ok(Err(e)) => r.line(Level::Error, "telegram", e.to_string()),
        Err(_) => r.line(Level::Error, "telegram", format!("no answer within {} s", LIMIT.as_secs())),
    }
}

/// `[discord]`: the token, and the gateway.
#[cfg(feature = "discord")]
async fn discord(loaded: &Loaded, r: &mut Report) {
    match crate::channels::discord::status::probe(&loaded.config.discord, LIMIT).await {
        Ok(None) => r.line(Level::Skip, "discord", "not configured"),
        Ok(Some((found, warnings))) => {
            r.line(Level::Ok, "discord", found);
            for w in warnings {
                r.line(Level::Warning, "discord", w);
            }
        }
        Err(e) => r.line(Level::Error, "discord", e),
    }
}

/// `[ntfy]`: the server answers, and the token may read a topic.
#[cfg(feature = "ntfy")]
async fn ntfy(loaded: &Loaded, r: &mut Report) {
    match crate::channels::ntfy::status::probe(&loaded.config.ntfy, LIMIT).await {
        Ok(None) => r.line(Level::Skip, "ntfy", "not configured"),
        Ok(Some((found, warnings))) => {
            r.line(Level::Ok, "ntfy", found);
            for w in warnings {
                r.line(Level::Warning, "ntfy", w);
            }
        }
        Err(e) => r.line(Level::Error, "ntfy", e),
    }
}

/// `[matrix]`: the login, and the rooms bramble cannot read.
#[cfg(feature = "matrix")]
async fn matrix(loaded: &Loaded, r: &mut Report) {
    let state = &loaded.paths.state_dir;
    match crate::channels::matrix::status::probe(&loaded.config.matrix, state, LIMIT).await {
        Ok(None) => r.line(Level::Skip, "matrix", "not configured"),
        Ok(Some((found, warnings))) => {
            r.line(Level::Ok, "matrix", found);
            for w in warnings {
                r.line(Level::Warning, "matrix", w);
            }
        }
        Err(e) => r.line(Level::Error, "matrix", e),
    }
}

/// The workspace exists, and the state directory's file system has room.
fn storage(loaded: &Loaded, r: &mut Report) {
    let ws = &loaded.paths.workspace;
    if ws.is_dir() {
        r.line(Level::Ok, "workspace", ws.display().to_string());
    } else {
        r.hinted(Level::Warning, "workspace", format!("{} does not exist", ws.display()), Some("run `bramble init`"));
    }
    let state = &loaded.paths.state_dir;
    // The directory, or the nearest one above it that exists (where it will be made).
    let Some(existing) = state.ancestors().find(|p| p.exists()) else { return };
    match nix::sys::statvfs::statvfs(existing) {
        Ok(st) => {
            // u64 here, u32 on armv7: the conversion is not useless everywhere.
            #[allow(clippy::useless_conversion)]
            let free = u64::from(st.blocks_available()) * u64::from(st.fragment_size());
            let mib = free / (1024 * 1024);
            let text = format!("{}: {mib} MiB free", state.display());
            match mib {
                0..=9 => {
                    r.hinted(Level::Error, "disk", text, Some("reports and sessions cannot be saved; free some space"))
                }
                10..=99 => r.line(Level::Warning, "disk", format!("{text}: little room left")),
                _ => r.line(Level::Ok, "disk", text),
            }
        }
        Err(e) => r.line(Level::Warning, "disk", format!("cannot read the free space of {}: {e}", existing.display())),
    }
}

/// The chat apps beside Telegram: email, Matrix, Signal, Feishu / Lark, Discord, ntfy.
#[allow(unused_variables)] // a build without the chat features checks none of them
async fn chat_apps(loaded: &Loaded, r: &mut Report) {
    #[cfg(feature = "email")]
    match crate::channels::email::check::probe(&loaded.config.email, LIMIT).await {
        Ok(None) => r.line(Level::Skip, "email", "not configured"),
        Ok(Some(found)) => r.line(Level::Ok, "email", found),
        Err(e) => r.line(Level::Error, "email", e),
    }
    #[cfg(feature = "matrix")]
    matrix(loaded, r).await;
    #[cfg(feature = "signal")]
    match crate::channels::signal::status::probe(&loaded.config.signal, LIMIT).await {
        Ok(None) => r.line(Level::Skip, "signal", "not configured"),
        Ok(Some((found, warnings))) => {
            r.line(Level::Ok, "signal", found);
            warnings.into_iter().for_each(|w| r.line(Level::Warning, "signal", w));
        }
        Err(e) => r.line(Level::Error, "signal", e),
    }
    #[cfg(feature = "feishu")]
    match crate::channels::feishu::status::probe(&loaded.config.feishu, LIMIT).await {
        Ok(None) => r.line(Level::Skip, "feishu", "not configured"),
        Ok(Some((found, warnings))) => {
            r.line(Level::Ok, "feishu", found);
            warnings.into_iter().for_each(|w| r.line(Level::Warning, "feishu", w));
        }
        Err(e) => r.line(Level::Error, "feishu", e),
    }
    #[cfg(feature = "discord")]
    discord(loaded, r).await;
    #[cfg(feature = "ntfy")]
    ntfy(loaded, r).await;
}
