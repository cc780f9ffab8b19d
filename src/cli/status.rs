//! `bramble status`: provider, paths, tools, channels, sessions, jobs and the outbox.
//!
//! The tools and channels are those of the parts the composition root builds
//! for the daemon ([`crate::daemon::assemble::daemon`]), so the list cannot
//! drift from what `bramble run` runs.
//!
//! Much of what it shows came from outside — MCP servers' tool names and
//! errors, a job's name, an undelivered report's error, an alert's text — so
//! those are printed through [`esc`]: an escape sequence in them is shown,
//! never run by the owner's terminal.
//!
//! Each section is collected once into a typed part that both renders the
//! text's lines and serializes into `status --json`'s object ([`Status`]): the
//! two outputs cannot say different things.

use std::process::ExitCode;

use serde::Serialize;

use crate::config::env::key_state;
use crate::config::Loaded;
use crate::daemon::assemble;
use crate::daemon::control::Facts;

use super::when;

mod chats;
use chats::{channel_lines, ChannelPart};

/// A one-line field that may have come from outside, its control characters escaped.
fn esc(text: &str) -> std::borrow::Cow<'_, str> {
    crate::util::text::escape_line(text)
}

/// Whether a daemon runs on `state` (it holds `daemon.lock`).
pub(super) fn daemon_line(state: &std::path::Path) -> String {
    let lock = state.join("daemon.lock");
    match std::fs::OpenOptions::new().write(true).open(&lock) {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            format!("unknown: no access to {} (run as the service's user, e.g. with sudo)", state.display())
        }
        Err(_) => "not running (start it: `bramble run`, or `systemctl enable --now bramble`)".into(),
        Ok(_) if crate::daemon::daemon_running(state) => "running on this state directory".into(),
        Ok(_) => "not running (start it: `bramble run`, or `systemctl enable --now bramble`)".into(),
    }
}

/// systemd's view of `bramble.service`, where systemd runs the machine.
pub(super) fn service_line() -> Option<String> {
    if !std::path::Path::new("/run/systemd/system").is_dir() {
        return None;
    }
    let out = std::process::Command::new("systemctl").args(["is-active", "bramble.service"]).output().ok()?;
    let state = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Some(match state.as_str() {
        "" => "unknown (systemctl said nothing)".into(),
        "inactive" => "bramble.service inactive (`systemctl enable --now bramble` starts it)".into(),
        other => format!("bramble.service {other} (`journalctl -u bramble` for its log)"),
    })
}

/// The word for a line of the service's state when that state is not readable here.
const PRIVATE: &str = "private to the service (`sudo bramble status`)";

pub(super) async fn status(loaded: &Loaded, acting: &super::service::Acting, json: bool) -> anyhow::Result<ExitCode> {
    let status = collect(loaded, acting, !json).await;
    if json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    }
    Ok(ExitCode::SUCCESS)
}

/// A part of the status: its facts serialize (flattened into `status
/// --json`'s object) and render to the text's lines, so the two cannot drift.
trait Section: Serialize {
    fn lines(&self) -> Vec<String>;
}

/// Everything `bramble status` shows, collected once. The text is each
/// section's [`Section::lines`]; `--json` is this object, its field names
/// stable (fields are added, never renamed or removed), times RFC 3339 UTC.
#[derive(Serialize)]
pub(super) struct Status {
    #[serde(flatten)]
    config: ConfigPart,
    #[serde(flatten)]
    env: EnvPart,
    #[serde(flatten)]
    provider: ProviderPart,
    #[serde(flatten)]
    paths: PathPart,
    #[serde(flatten)]
    daemon: DaemonPart,
    #[serde(flatten)]
    parts: PartsPart,
    #[serde(flatten)]
    exec: ExecPart,
    #[serde(flatten)]
    channels: ChannelPart,
    #[serde(flatten)]
    usage: UsagePart,
    #[serde(flatten)]
    schedule: SchedulePart,
    #[serde(flatten)]
    outbox: OutboxPart,
    #[serde(flatten)]
    alerts: AlertPart,
}

/// Collects the status; with `print`, each section's lines as soon as it is
/// collected (connecting MCP servers, the parts' section, may take a moment).
async fn collect(loaded: &Loaded, acting: &super::service::Acting, print: bool) -> Status {
    use super::service::Acting;
    fn show<S: Section>(print: bool, section: S) -> S {
        if print {
            section.lines().iter().for_each(|line| println!("{line}"));
        }
        section
    }
    // The service's state is its user's alone: what the config says is shown, the state's parts are not.
    let private = *acting == Acting::ServiceConfigOnly
        && nix::unistd::access(
            &loaded.paths.state_dir,
            nix::unistd::AccessFlags::R_OK | nix::unistd::AccessFlags::X_OK,
        )
        .is_err();
    // The secrets the running daemon has, which this shell may lack (or have other ones).
    let facts = daemon_facts(loaded).await;
    let config = show(print, config_lines(loaded, acting));
    let env = show(print, env_lines(facts.as_ref()));
    let provider = show(print, provider_lines(loaded, facts.as_ref()));
    let paths = show(print, path_lines(loaded));
    let daemon = show(print, daemon_part(loaded, acting, facts.as_ref()).await);
    let parts = show(print, parts_lines(loaded).await);
    let exec = show(print, exec_lines(loaded));
    let channels = show(print, channel_lines(loaded, facts.as_ref()));
    let usage = show(print, usage_lines(loaded, private));
    let schedule = show(print, schedule_lines(loaded, private));
    let outbox = show(print, outbox_lines(loaded, private));
    let alerts = show(print, alert_lines(loaded, private));
    Status { config, env, provider, paths, daemon, parts, exec, channels, usage, schedule, outbox, alerts }
}

/// RFC 3339 in UTC, as `cron list --json` prints times.
fn utc(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Which config file, and whose.
#[derive(Serialize)]
struct ConfigPart {
    /// The config file's path; null: none, the defaults.
    config: Option<String>,
    #[serde(skip)]
    whose: String,
}

impl Section for ConfigPart {
    fn lines(&self) -> Vec<String> {
        let path = self.config.clone().unwrap_or_else(|| "(none: defaults)".into());
        vec![format!("config:     {path}{}", self.whose)]
    }
}

fn config_lines(loaded: &Loaded, acting: &super::service::Acting) -> ConfigPart {
    use super::service::Acting;
    let whose = match acting {
        Acting::Own => String::new(),
        Acting::Service(user) => format!(" (the installed service's; acting as its user {user})"),
        Acting::ServiceConfigOnly => " (the installed service's; its state with `sudo bramble status`)".to_string(),
    };
    ConfigPart { config: loaded.path.as_ref().map(|p| p.display().to_string()), whose }
}

/// The running daemon's [`Facts`], when one answers on its control socket.
pub(super) async fn daemon_facts(loaded: &Loaded) -> Option<Facts> {
    let (path, _) = crate::daemon::control::socket_path(loaded);
    if !path.exists() {
        return None;
    }
    crate::daemon::control::facts(&path, std::time::Duration::from_secs(3)).await.ok()
}

/// Where a line's secrets were looked up: `from` is `daemon` or `shell`.
fn source(from: &str) -> &'static str {
    match from {
        "daemon" => "(from the running daemon)",
        _ => "(read in this shell)",
    }
}

/// The env file, as this shell read it and as the daemon did.
#[derive(Serialize)]
struct EnvPart {
    /// The env file as this shell read it.
    env_file: String,
    /// As the running daemon read it (null: no daemon answered).
    env_file_daemon: Option<String>,
}

impl Section for EnvPart {
    fn lines(&self) -> Vec<String> {
        let mut lines = vec![format!("env file:   {} (read in this shell)", esc(&self.env_file))];
        if let Some(theirs) = self.env_file_daemon.as_ref().filter(|d| **d != self.env_file) {
            lines.push(format!("            {} (the running daemon's)", esc(theirs)));
        }
        lines
    }
}

fn env_lines(facts: Option<&Facts>) -> EnvPart {
    let here = crate::config::env::describe(&crate::config::env::path());
    EnvPart { env_file: here, env_file_daemon: facts.map(|f| f.env_file.clone()) }
}

/// One provider, with where its key stands.
#[derive(Serialize)]
struct ProviderFacts {
    name: String,
    kind: &'static str,
    base_url: String,
    /// Its default model (one provider: the model turns use).
    model: String,
    /// `{"state": "set"}`, `{"state": "unset", "env": "NAME"}` or `{"state": "not_needed"}`.
    key: crate::config::env::KeyState,
    /// `daemon` (the running daemon's environment) or `shell` (this one's).
    key_from: &'static str,
    tokens_today: Option<u64>,
    /// 0: none.
    daily_token_budget: u64,
}

/// The provider (or each of the chain, with today's tokens), the model, the keys.
#[derive(Serialize)]
struct ProviderPart {
    providers: Vec<ProviderFacts>,
    /// The model turns use (several providers: as `name/model`).
    model: String,
    /// The fallback chain's provider names, in order.
    fallback: Vec<String>,
    fallback_cooldown: String,
}

impl Section for ProviderPart {
    fn lines(&self) -> Vec<String> {
        let key = |p: &ProviderFacts| format!("{} {}", p.key.describe(), source(p.key_from));
        if let [p] = self.providers.as_slice() {
            return vec![
                format!("provider:   {} at {}", p.kind, p.base_url),
                format!("model:      {}", self.model),
                format!("api key:    {}", key(p)),
            ];
        }
        let mut lines = Vec::new();
        for (i, p) in self.providers.iter().enumerate() {
            let budget = match p.daily_token_budget {
                0 => String::new(),
                b => format!(" of {b}"),
            };
            lines.push(format!(
                "{:<12}{} ({} at {}): model {}, api key {}, {}{budget} tokens today",
                if i == 0 { "providers:" } else { "" },
                p.name,
                p.kind,
                p.base_url,
                p.model,
                key(p),
                p.tokens_today.unwrap_or_default(),
            ));
        }
        lines.push(format!("model:      {}", self.model));
        lines.push(format!(
            "fallback:   {} (cooldown {})",
            if self.fallback.is_empty() { "none".to_string() } else { self.fallback.join(" → ") },
            self.fallback_cooldown
        ));
        lines
    }
}

fn provider_lines(loaded: &Loaded, facts: Option<&Facts>) -> ProviderPart {
    let c = &loaded.config;
    let single = c.providers.len() == 1;
    let usage = (!single).then(|| crate::agent::usage::UsageLedger::new(&loaded.paths.state_dir, c.timezone()));
    let providers = c
        .providers
        .iter()
        .map(|p| {
            let daemon = facts.and_then(|f| f.providers.iter().find(|(name, _)| name == p.name()).map(|(_, k)| k));
            ProviderFacts {
                name: p.name().to_string(),
                kind: p.kind.as_str(),
                base_url: p.base_url().to_string(),
                model: if single { c.model() } else { p.default_model() }.to_string(),
                key: daemon.cloned().unwrap_or_else(|| key_state(p)),
                key_from: if daemon.is_some() { "daemon" } else { "shell" },
                tokens_today: usage.as_ref().map(|u| u.today_of(p.name()).total()),
                daily_token_budget: p.daily_token_budget,
            }
        })
        .collect();
    ProviderPart {
        providers,
        model: if single { c.model().to_string() } else { crate::provider::chain::Chain::label_in(c, c.model()) },
        fallback: c.agent.fallback.iter().map(|f| f.get_ref().to_string()).collect(),
        fallback_cooldown: c.agent.fallback_cooldown.to_string(),
    }
}

/// The time zone, the workspace and the state directory.
#[derive(Serialize)]
struct PathPart {
    time_zone: String,
    workspace: String,
    workspace_exists: bool,
    state_dir: String,
}

impl Section for PathPart {
    fn lines(&self) -> Vec<String> {
        let missing = if self.workspace_exists { "" } else { " (missing: run `bramble init`)" };
        vec![
            format!("time zone:  {}", self.time_zone),
            format!("workspace:  {}{missing}", self.workspace),
            format!("state:      {}", self.state_dir),
        ]
    }
}

fn path_lines(loaded: &Loaded) -> PathPart {
    PathPart {
        time_zone: loaded.config.timezone().name().to_string(),
        workspace: loaded.paths.workspace.display().to_string(),
        workspace_exists: loaded.paths.workspace.is_dir(),
        state_dir: loaded.paths.state_dir.display().to_string(),
    }
}

/// Whether a daemon runs, whether it answered, and systemd's view.
#[derive(Serialize)]
struct DaemonPart {
    /// `daemon`: the running daemon answered on its control socket, and the
    /// secrets' lines are its view; `shell`: read in this shell.
    source: &'static str,
    /// The pid of the daemon that answered (null: none did).
    daemon_pid: Option<u32>,
    /// Whether a daemon runs on the state directory, in words.
    daemon: String,
    /// systemd's view of `bramble.service` (null: no systemd).
    service: Option<String>,
}

impl Section for DaemonPart {
    fn lines(&self) -> Vec<String> {
        let mut lines = vec![format!("daemon:     {}", esc(&self.daemon))];
        if let Some(pid) = self.daemon_pid {
            lines
                .push(format!("control:    pid {pid} answers on its control socket: lines marked so are its own view"));
        }
        if let Some(service) = &self.service {
            lines.push(format!("service:    {service}"));
        }
        lines
    }
}

async fn daemon_part(loaded: &Loaded, acting: &super::service::Acting, facts: Option<&Facts>) -> DaemonPart {
    // A member of the service's group: the state is private, the running service says whether it answers.
    let (daemon, daemon_pid) = if *acting == super::service::Acting::ServiceConfigOnly {
        (super::service::control_line().await, None)
    } else {
        (daemon_line(&loaded.paths.state_dir), facts.map(|f| f.pid))
    };
    DaemonPart { source: if facts.is_some() { "daemon" } else { "shell" }, daemon_pid, daemon, service: service_line() }
}

/// The tools and channels `bramble run` would start for this config.
#[derive(Serialize)]
struct PartsPart {
    tools: Vec<String>,
    channels: Vec<String>,
    /// Each MCP server's state, one line each.
    mcp: Vec<String>,
    /// Why the parts could not be built (null: they were).
    channels_error: Option<String>,
}

impl Section for PartsPart {
    fn lines(&self) -> Vec<String> {
        if let Some(e) = &self.channels_error {
            return vec![format!("channels:   error: {}", esc(e))];
        }
        let mut lines = vec![
            format!("tools:      {}", esc(&self.tools.join(", "))),
            format!("channels:   {}", self.channels.join(", ")),
        ];
        for (i, line) in self.mcp.iter().enumerate() {
            lines.push(format!("{:<12}{}", if i == 0 { "mcp:" } else { "" }, esc(line)));
        }
        lines
    }
}

/// Built and not started.
async fn parts_lines(loaded: &Loaded) -> PartsPart {
    // Quietly: what it would warn about (no key, a bad MQTT url) has its own line.
    let parts =
        tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), || assemble::daemon(loaded));
    let parts = match parts {
        Ok(parts) => parts,
        Err(e) => {
            return PartsPart { tools: vec![], channels: vec![], mcp: vec![], channels_error: Some(e.to_string()) }
        }
    };
    // MCP servers are connected from here (as the daemon would; stdio ones started and
    // stopped again), so the line says what this machine can reach now.
    let tools = parts.agent.tools();
    tools.prepare().await;
    PartsPart {
        tools: tools.names(),
        channels: parts.channels.names().iter().map(|n| n.to_string()).collect(),
        mcp: tools.sources_status(),
        channels_error: None,
    }
}

/// The exec tool and its sandbox.
#[derive(Serialize)]
struct ExecFacts {
    enabled: bool,
    timeout: Option<String>,
    network: Option<String>,
    /// What `network` comes to on this system, in words (`auto` differs with the jail).
    #[serde(skip)]
    network_means: Option<String>,
    /// The sandbox's layers, in words (null: exec is off).
    sandbox: Option<String>,
}

/// The exec tool, its sandbox, and web search.
#[derive(Serialize)]
struct ExecPart {
    exec: ExecFacts,
    /// The search engines in order; null: `[web]` is off; empty: search is off.
    web_search: Option<Vec<String>>,
}

impl Section for ExecPart {
    fn lines(&self) -> Vec<String> {
        let e = &self.exec;
        let mut lines = Vec::new();
        match (&e.timeout, &e.network, &e.sandbox) {
            (Some(timeout), Some(network), Some(sandbox)) if e.enabled => {
                let setting = if network.starts_with('[') { network.clone() } else { format!("\"{network}\"") };
                let means = e.network_means.as_deref().map(|m| format!(", which here means: {m}")).unwrap_or_default();
                lines.push(format!("exec:       timeout {timeout}, network {setting}{means}"));
                lines.push(format!("sandbox:    {sandbox}"));
            }
            _ => lines.push("exec:       off".into()),
        }
        match self.web_search.as_deref() {
            None => {}
            Some([]) => lines.push("web search: off ([web] search = [])".into()),
            Some(engines) => lines.push(format!("web search: {}", engines.join(" → "))),
        }
        lines
    }
}

fn exec_lines(loaded: &Loaded) -> ExecPart {
    let c = &loaded.config;
    let exec = match c.exec.enabled {
        true => {
            let sandbox = crate::sandbox::Sandbox::for_config(loaded);
            let reach = crate::sandbox::network_reach(&c.exec, &sandbox.probe());
            ExecFacts {
                enabled: true,
                timeout: Some(c.exec.timeout.to_string()),
                network: Some(c.exec.network.as_str().to_string()),
                network_means: Some(reach.describe().to_string()),
                sandbox: Some(sandbox.layers_summary(&c.exec)),
            }
        }
        false => ExecFacts { enabled: false, timeout: None, network: None, network_means: None, sandbox: None },
    };
    #[cfg(feature = "web-search")]
    let web_search = c.web.enabled.then(|| {
        let http = std::sync::Arc::new(crate::tools::web::GuardedHttp::new(&c.web));
        crate::tools::search::WebSearch::new(&c.web, http).map(|s| s.engines()).unwrap_or_default()
    });
    #[cfg(not(feature = "web-search"))]
    let web_search = None;
    ExecPart { exec, web_search }
}

/// Sessions, today's tokens and the skills (null each: private to the service).
#[derive(Serialize)]
struct UsagePart {
    /// The state is private to the service (`sudo bramble status`): its facts are null.
    private: bool,
    sessions: Option<usize>,
    tokens_today: Option<u64>,
    /// `[agent] daily_token_budget`; 0: none.
    daily_token_budget: u64,
    skills: Option<usize>,
    skills_available: Option<usize>,
    skills_with_errors: Option<usize>,
}

impl Section for UsagePart {
    fn lines(&self) -> Vec<String> {
        let (Some(sessions), Some(tokens), Some(skills), Some(available), Some(errors)) =
            (self.sessions, self.tokens_today, self.skills, self.skills_available, self.skills_with_errors)
        else {
            return ["sessions:", "tokens:", "skills:"].iter().map(|k| format!("{k:<12}{PRIVATE}")).collect();
        };
        let budget = match self.daily_token_budget {
            0 => String::new(),
            b => format!(" (budget {b})"),
        };
        let errors = match errors {
            0 => String::new(),
            n => format!(", {n} with errors: run `bramble check`"),
        };
        vec![
            format!("sessions:   {sessions}"),
            format!("tokens:     {tokens} today{budget}"),
            format!("skills:     {skills} ({available} available{errors})"),
        ]
    }
}

fn usage_lines(loaded: &Loaded, private: bool) -> UsagePart {
    let c = &loaded.config;
    let mut part = UsagePart {
        private,
        sessions: None,
        tokens_today: None,
        daily_token_budget: c.agent.daily_token_budget,
        skills: None,
        skills_available: None,
        skills_with_errors: None,
    };
    if private {
        return part;
    }
    part.sessions = Some(crate::agent::session::SessionStore::new(&loaded.paths.state_dir).keys().len());
    part.tokens_today =
        Some(crate::agent::usage::UsageLedger::new(&loaded.paths.state_dir, c.timezone()).today().total());
    let (skills, skill_errors) = crate::agent::skills::load(&loaded.paths.workspace);
    part.skills = Some(skills.len());
    part.skills_available = Some(skills.iter().filter(|s| s.available()).count());
    part.skills_with_errors = Some(skill_errors.len());
    part
}
/// The heartbeat: how often, how many active tasks, when it last ran.
#[derive(Serialize)]
struct HeartbeatFacts {
    enabled: bool,
    every: String,
    /// The active tasks in HEARTBEAT.md (null: private to the service).
    active_tasks: Option<usize>,
    last_run: Option<String>,
    #[serde(skip)]
    last_run_at: Option<jiff::Timestamp>,
}

/// The clock, the heartbeat and the jobs with their next runs.
#[derive(Serialize)]
struct SchedulePart {
    /// Whether the clock is trusted, in words.
    clock: String,
    heartbeat: HeartbeatFacts,
    /// How many jobs there are (null: private, or the store could not be read).
    job_count: Option<usize>,
    /// Each job as `cron list --json` prints it (null: as `job_count`).
    jobs: Option<Vec<serde_json::Value>>,
    jobs_error: Option<String>,
    /// What was wrong with a corrupt job store, which was set aside.
    job_store_notice: Option<String>,
    #[serde(skip)]
    listed: Option<Vec<crate::scheduler::Job>>,
    #[serde(skip)]
    tz: crate::config::TzName,
}

impl Section for SchedulePart {
    fn lines(&self) -> Vec<String> {
        let mut lines = vec![format!("clock:      {}", self.clock)];
        let hb = &self.heartbeat;
        lines.push(if hb.enabled {
            let tasks = hb.active_tasks.map_or("?".to_string(), |n| n.to_string());
            format!(
                "heartbeat:  every {}, {tasks} active task{}, last run {}",
                hb.every,
                if tasks == "1" { "" } else { "s" },
                when(hb.last_run_at, &self.tz)
            )
        } else {
            "heartbeat:  off".into()
        });
        match (&self.listed, &self.jobs_error) {
            (_, Some(e)) => lines.push(format!("jobs:       error: {}", esc(e))),
            (None, None) => lines.push(format!("jobs:       {PRIVATE}")),
            (Some(jobs), None) => {
                lines.push(format!("jobs:       {}", jobs.len()));
                if let Some(notice) = &self.job_store_notice {
                    lines.push(format!("  job store: {}", esc(notice)));
                }
                for j in jobs.iter().filter(|j| j.enabled && !j.state.done) {
                    lines.push(format!("  {:<20} next {}", esc(&j.name), when(j.state.next_run, &self.tz)));
                }
            }
        }
        lines
    }
}

fn schedule_lines(loaded: &Loaded, private: bool) -> SchedulePart {
    let c = &loaded.config;
    let tz = c.timezone();
    // Read once: the clock note and the job list below both need it.
    let jobs_store = crate::scheduler::JobStore::open(&loaded.paths.state_dir);
    let listed = (!private).then(|| jobs_store.list());
    let all_jobs = match &listed {
        Some(Ok(jobs)) => jobs.as_slice(),
        _ => &[],
    };
    let wait = c.daemon.clock_sync_wait.get();
    let clock = match crate::scheduler::engine::clock_hold_note(all_jobs, wait, tz.tz()) {
        None if crate::scheduler::clock_synchronized() => "synchronised".to_string(),
        None => "not reported as synchronised, but trusted: the machine is not freshly booted and the clock is \
                 past every time bramble recorded"
            .to_string(),
        Some(note) => note,
    };
    let active_tasks = if private { None } else { crate::scheduler::heartbeat::read_file(&loaded.paths.workspace) }
        .map(|t| crate::scheduler::heartbeat::active_tasks(&t).len())
        .or(if private { None } else { Some(0) });
    let last_run_at = crate::scheduler::heartbeat::StateFile::new(&loaded.paths.state_dir).load().last_run;
    let heartbeat = HeartbeatFacts {
        enabled: c.heartbeat.enabled,
        every: c.heartbeat.every.to_string(),
        active_tasks,
        last_run: last_run_at.map(utc),
        last_run_at,
    };
    let (listed, jobs_error) = match listed {
        None => (None, None),
        Some(Ok(jobs)) => (Some(jobs), None),
        Some(Err(e)) => (None, Some(e.to_string())),
    };
    let jobs = listed.as_ref().map(|jobs| {
        jobs.iter().filter_map(|j| serde_json::to_value(super::cron_view::JobJson::of(j, &tz, false)).ok()).collect()
    });
    SchedulePart {
        clock,
        heartbeat,
        job_count: listed.as_ref().map(Vec::len),
        jobs,
        jobs_error,
        job_store_notice: listed.as_ref().and_then(|_| jobs_store.corrupt_notice()),
        listed,
        tz,
    }
}

/// One undelivered report.
#[derive(Serialize)]
struct Undelivered {
    target: String,
    source: String,
    attempts: u32,
    last_error: Option<String>,
}

/// What the outbox holds undelivered.
#[derive(Serialize)]
struct OutboxPart {
    /// How many reports wait (null: private, or the outbox could not be read).
    undelivered: Option<usize>,
    /// Each, oldest first (the text shows the first five).
    outbox: Vec<Undelivered>,
    outbox_error: Option<String>,
}

impl Section for OutboxPart {
    fn lines(&self) -> Vec<String> {
        match (self.undelivered, &self.outbox_error) {
            (_, Some(e)) => vec![format!("outbox:     error: {}", esc(e))],
            (None, None) => vec![format!("outbox:     {PRIVATE}")],
            (Some(0), None) => vec!["outbox:     nothing undelivered".into()],
            (Some(n), None) => {
                let mut lines = vec![format!("outbox:     {n} undelivered")];
                for e in self.outbox.iter().take(5) {
                    let err = e.last_error.as_deref().map(|e| format!(" ({})", esc(e))).unwrap_or_default();
                    lines.push(format!("  {} from {}, {} attempts{err}", esc(&e.target), esc(&e.source), e.attempts));
                }
                lines
            }
        }
    }
}

fn outbox_lines(loaded: &Loaded, private: bool) -> OutboxPart {
    let outbox = crate::delivery::outbox::Outbox::new(&loaded.paths.state_dir);
    let mut part = OutboxPart { undelivered: None, outbox: Vec::new(), outbox_error: None };
    match (!private).then(|| outbox.pending()) {
        None => {}
        Some(Ok(p)) => {
            part.undelivered = Some(p.len());
            part.outbox = p
                .iter()
                .map(|e| Undelivered {
                    target: e.target.to_string(),
                    source: e.source.to_string(),
                    attempts: e.attempts,
                    last_error: e.last_error.clone(),
                })
                .collect();
        }
        Some(Err(e)) => part.outbox_error = Some(e.to_string()),
    }
    part
}

/// One open alert.
#[derive(Serialize)]
struct OpenAlert {
    key: String,
    since: String,
    text: String,
    #[serde(skip)]
    since_at: jiff::Timestamp,
}

/// The open alerts, and where alerts go.
#[derive(Serialize)]
struct AlertPart {
    /// `[alerts] deliver`: where alerts go (empty: nowhere).
    alerts_deliver: Vec<String>,
    /// How many are open (null: private to the service).
    open_alerts: Option<usize>,
    alerts: Vec<OpenAlert>,
    #[serde(skip)]
    tz: crate::config::TzName,
}

impl Section for AlertPart {
    fn lines(&self) -> Vec<String> {
        let Some(open) = self.open_alerts else { return vec![format!("alerts:     {PRIVATE}")] };
        let to = if self.alerts_deliver.is_empty() {
            "sent nowhere: set [alerts] deliver".to_string()
        } else {
            format!("to {}", self.alerts_deliver.join(", "))
        };
        if open == 0 {
            return vec![format!("alerts:     none open ({to})")];
        }
        let mut lines = vec![format!("alerts:     {open} open ({to})")];
        for o in &self.alerts {
            let first = o.text.lines().next().unwrap_or_default();
            let text = crate::scheduler::job::truncate(first, 160);
            lines.push(format!("  {} since {}: {}", esc(&o.key), when(Some(o.since_at), &self.tz), esc(&text)));
        }
        lines
    }
}

fn alert_lines(loaded: &Loaded, private: bool) -> AlertPart {
    let c = &loaded.config;
    let mut part = AlertPart {
        alerts_deliver: c.alerts.deliver.iter().map(|t| t.to_string()).collect(),
        open_alerts: None,
        alerts: Vec::new(),
        tz: c.timezone(),
    };
    if private {
        return part;
    }
    let open = crate::work::alerts::open_in(&loaded.paths.state_dir);
    part.open_alerts = Some(open.len());
    part.alerts = open
        .into_iter()
        .map(|(key, o)| OpenAlert { key, since: utc(o.since), text: o.text, since_at: o.since })
        .collect();
    part
}

/// Which sources of turns get which tools (`[policy.*]`), one line: the
/// sources with every tool named together.
fn policy_summary(cfg: &std::collections::BTreeMap<String, crate::config::PolicyRule>) -> String {
    use crate::tools::policy::{Source, ToolPolicy};
    let policy = ToolPolicy::from_config(cfg);
    let (all, limited): (Vec<Source>, Vec<Source>) =
        Source::ALL.into_iter().partition(|s| policy.describe(*s) == "every tool");
    let mut parts = Vec::new();
    if !all.is_empty() {
        parts.push(format!("{}: every tool", all.iter().map(|s| s.name()).collect::<Vec<_>>().join(", ")));
    }
    parts.extend(limited.iter().map(|s| format!("{}: {}", s.name(), policy.describe(*s))));
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Paths};

    fn loaded(dir: &std::path::Path, config: &str) -> Loaded {
        let config = Config::parse(config, std::path::Path::new("bramble.toml")).unwrap();
        let paths = Paths { workspace: dir.join("workspace"), state_dir: dir.join("state") };
        std::fs::create_dir_all(&paths.state_dir).unwrap();
        Loaded { config, path: None, paths }
    }

    #[test]
    fn config_and_paths_say_where_things_are() {
        let dir = tempfile::tempdir().unwrap();
        let l = loaded(dir.path(), "[agent]\ntimezone = \"Europe/Berlin\"\n");
        assert_eq!(config_lines(&l, &super::super::service::Acting::Own).lines(), ["config:     (none: defaults)"]);
        let paths = path_lines(&l).lines();
        assert_eq!(paths[0], "time zone:  Europe/Berlin");
        assert!(paths[1].ends_with("workspace (missing: run `bramble init`)"), "{paths:?}");
        assert!(paths[2].starts_with("state:      "), "{paths:?}");
    }

    #[test]
    fn private_state_is_said_private_section_by_section() {
        let dir = tempfile::tempdir().unwrap();
        let l = loaded(dir.path(), "");
        for lines in [usage_lines(&l, true).lines(), outbox_lines(&l, true).lines(), alert_lines(&l, true).lines()] {
            assert!(lines.iter().all(|line| line.ends_with(PRIVATE)), "{lines:?}");
        }
        assert_eq!(usage_lines(&l, true).lines()[0], format!("sessions:   {PRIVATE}"));
        assert!(schedule_lines(&l, true).lines().contains(&format!("jobs:       {PRIVATE}")));
    }

    #[test]
    fn an_empty_state_has_nothing_pending() {
        let dir = tempfile::tempdir().unwrap();
        let l = loaded(dir.path(), "");
        assert_eq!(outbox_lines(&l, false).lines(), ["outbox:     nothing undelivered"]);
        assert_eq!(alert_lines(&l, false).lines(), ["alerts:     none open (sent nowhere: set [alerts] deliver)"]);
        let schedule = schedule_lines(&l, false).lines();
        assert!(schedule.contains(&"jobs:       0".to_string()), "{schedule:?}");
        assert!(schedule[0].starts_with("clock:      "), "{schedule:?}");
        assert_eq!(usage_lines(&l, false).lines()[0], "sessions:   0");
    }

    #[test]
    fn exec_off_has_no_sandbox_line() {
        let dir = tempfile::tempdir().unwrap();
        let l = loaded(dir.path(), "[exec]\nenabled = false\n[web]\nenabled = false\n");
        assert_eq!(exec_lines(&l).lines(), ["exec:       off"]);
    }
}
