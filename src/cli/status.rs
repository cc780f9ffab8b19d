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

use std::process::ExitCode;

use crate::config::env::key_state;
use crate::config::Loaded;
use crate::daemon::assemble;
use crate::daemon::control::Facts;

use super::check::telegram_summary;
use super::when;

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

pub(super) async fn status(loaded: &Loaded, acting: &super::service::Acting) -> anyhow::Result<ExitCode> {
    use super::service::Acting;
    // The service's state is its user's alone: what the config says is shown, the state's parts are not.
    let private = *acting == Acting::ServiceConfigOnly
        && nix::unistd::access(
            &loaded.paths.state_dir,
            nix::unistd::AccessFlags::R_OK | nix::unistd::AccessFlags::X_OK,
        )
        .is_err();
    // Printed section by section: connecting MCP servers (the parts' section) may take a moment.
    let show = |lines: Vec<String>| lines.iter().for_each(|line| println!("{line}"));
    // The secrets the running daemon has, which this shell may lack (or have other ones).
    let facts = daemon_facts(loaded).await;
    show(config_lines(loaded, acting));
    show(env_lines(facts.as_ref()));
    show(provider_lines(loaded, facts.as_ref()));
    show(path_lines(loaded));
    if *acting == Acting::ServiceConfigOnly {
        // The state is private; the running service says whether it answers (and what members may).
        println!("daemon:     {}", esc(&super::service::control_line().await));
    } else {
        println!("daemon:     {}", daemon_line(&loaded.paths.state_dir));
        if let Some(f) = &facts {
            println!("control:    pid {} answers on its control socket: lines marked so are its own view", f.pid);
        }
    }
    if let Some(service) = service_line() {
        println!("service:    {service}");
    }
    show(parts_lines(loaded).await);
    show(exec_lines(loaded));
    show(channel_lines(loaded, facts.as_ref()));
    show(usage_lines(loaded, private));
    show(schedule_lines(loaded, private));
    show(outbox_lines(loaded, private));
    show(alert_lines(loaded, private));
    Ok(ExitCode::SUCCESS)
}

/// Which config file, and whose.
fn config_lines(loaded: &Loaded, acting: &super::service::Acting) -> Vec<String> {
    use super::service::Acting;
    let whose = match acting {
        Acting::Own => String::new(),
        Acting::Service(user) => format!(" (the installed service's; acting as its user {user})"),
        Acting::ServiceConfigOnly => " (the installed service's; its state with `sudo bramble status`)".to_string(),
    };
    let path = loaded.path.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "(none: defaults)".into());
    vec![format!("config:     {path}{whose}")]
}

/// The running daemon's [`Facts`], when one answers on its control socket.
pub(super) async fn daemon_facts(loaded: &Loaded) -> Option<Facts> {
    let (path, _) = crate::daemon::control::socket_path(loaded);
    if !path.exists() {
        return None;
    }
    crate::daemon::control::facts(&path, std::time::Duration::from_secs(3)).await.ok()
}

/// Where a line's secrets were looked up.
fn source(facts: Option<&Facts>) -> &'static str {
    match facts {
        Some(_) => "(from the running daemon)",
        None => "(read in this shell)",
    }
}

/// The env file, as this shell read it and as the daemon did.
fn env_lines(facts: Option<&Facts>) -> Vec<String> {
    let here = crate::config::env::describe(&crate::config::env::path());
    let mut lines = vec![format!("env file:   {} (read in this shell)", esc(&here))];
    if let Some(f) = facts.filter(|f| f.env_file != here) {
        lines.push(format!("            {} (the running daemon's)", esc(&f.env_file)));
    }
    lines
}

/// The provider (or each of the chain, with today's tokens), the model, the keys.
fn provider_lines(loaded: &Loaded, facts: Option<&Facts>) -> Vec<String> {
    let c = &loaded.config;
    let key = |p: &crate::config::ProviderConfig| {
        let daemon = facts.and_then(|f| f.providers.iter().find(|(name, _)| name == p.name()).map(|(_, k)| k));
        let state = daemon.cloned().unwrap_or_else(|| key_state(p));
        let from = if daemon.is_some() { source(facts) } else { source(None) };
        format!("{} {from}", state.describe())
    };
    if let [p] = c.providers.as_slice() {
        return vec![
            format!("provider:   {} at {}", p.kind.as_str(), p.base_url()),
            format!("model:      {}", c.model()),
            format!("api key:    {}", key(p)),
        ];
    }
    let mut lines = Vec::new();
    let usage = crate::agent::usage::UsageLedger::new(&loaded.paths.state_dir, c.timezone());
    for (i, p) in c.providers.iter().enumerate() {
        let used = usage.today_of(p.name()).total();
        let budget = match p.daily_token_budget {
            0 => String::new(),
            b => format!(" of {b}"),
        };
        lines.push(format!(
            "{:<12}{} ({} at {}): model {}, api key {}, {used}{budget} tokens today",
            if i == 0 { "providers:" } else { "" },
            p.name(),
            p.kind.as_str(),
            p.base_url(),
            p.default_model(),
            key(p),
        ));
    }
    lines.push(format!("model:      {}", crate::provider::chain::Chain::label_in(c, c.model())));
    let fallback: Vec<&str> = c.agent.fallback.iter().map(|f| f.get_ref().as_str()).collect();
    lines.push(format!(
        "fallback:   {} (cooldown {})",
        if fallback.is_empty() { "none".to_string() } else { fallback.join(" → ") },
        c.agent.fallback_cooldown
    ));
    lines
}

/// The time zone, the workspace and the state directory.
fn path_lines(loaded: &Loaded) -> Vec<String> {
    let missing = if loaded.paths.workspace.is_dir() { "" } else { " (missing: run `bramble init`)" };
    vec![
        format!("time zone:  {}", loaded.config.timezone().name()),
        format!("workspace:  {}{missing}", loaded.paths.workspace.display()),
        format!("state:      {}", loaded.paths.state_dir.display()),
    ]
}

/// The tools and channels `bramble run` would start for this config, built and not started.
async fn parts_lines(loaded: &Loaded) -> Vec<String> {
    // Quietly: what it would warn about (no key, a bad MQTT url) has its own line.
    let parts =
        tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), || assemble::daemon(loaded));
    let parts = match parts {
        Ok(parts) => parts,
        Err(e) => return vec![format!("channels:   error: {}", esc(&e.to_string()))],
    };
    // MCP servers are connected from here (as the daemon would; stdio ones started and
    // stopped again), so the line says what this machine can reach now.
    let tools = parts.agent.tools();
    tools.prepare().await;
    let mut lines = vec![
        format!("tools:      {}", esc(&tools.names().join(", "))),
        format!("channels:   {}", parts.channels.names().join(", ")),
    ];
    for (i, line) in tools.sources_status().iter().enumerate() {
        lines.push(format!("{:<12}{}", if i == 0 { "mcp:" } else { "" }, esc(line)));
    }
    lines
}

/// The exec tool, its sandbox, and web search.
fn exec_lines(loaded: &Loaded) -> Vec<String> {
    let c = &loaded.config;
    let mut lines = Vec::new();
    if c.exec.enabled {
        lines.push(format!("exec:       timeout {}, network {}", c.exec.timeout, c.exec.network.as_str()));
        lines.push(format!("sandbox:    {}", crate::sandbox::Sandbox::for_config(loaded).layers_summary(&c.exec)));
    } else {
        lines.push("exec:       off".into());
    }
    if c.web.enabled {
        let http = std::sync::Arc::new(crate::tools::web::GuardedHttp::new(&c.web));
        let engines = crate::tools::search::WebSearch::new(&c.web, http).map(|s| s.engines().join(" → "));
        lines.push(format!("web search: {}", engines.unwrap_or_else(|| "off ([web] search = [])".into())));
    }
    lines
}

/// Telegram, MQTT, the tool policy and Home Assistant.
fn channel_lines(loaded: &Loaded, facts: Option<&Facts>) -> Vec<String> {
    let c = &loaded.config;
    let token = facts.map_or(c.telegram.token().is_some(), |f| f.telegram_token);
    let mut ha = crate::channels::homeassistant::status_line(c, &loaded.paths.state_dir);
    if facts.and_then(|f| f.homeassistant_token) == Some(true) {
        ha = ha.replace(&format!("token MISSING: set {}", c.homeassistant.token_env()), "token set");
    }
    let ha_from = if c.homeassistant.url.is_some() { format!(" {}", source(facts)) } else { String::new() };
    vec![
        format!(
            "telegram:   {} {}",
            esc(&telegram_summary(&c.telegram, token, &loaded.paths.state_dir)),
            source(facts)
        ),
        format!("mqtt:       {}", esc(&crate::channels::mqtt::status_line(&c.mqtt))),
        format!("policy:     {}", policy_summary(&c.policy)),
        format!("ha:         {}{ha_from}", esc(&ha)),
    ]
}

/// Sessions, today's tokens and the skills.
fn usage_lines(loaded: &Loaded, private: bool) -> Vec<String> {
    if private {
        return ["sessions:", "tokens:", "skills:"].iter().map(|k| format!("{k:<12}{PRIVATE}")).collect();
    }
    let c = &loaded.config;
    let sessions = crate::agent::session::SessionStore::new(&loaded.paths.state_dir).keys();
    let today = crate::agent::usage::UsageLedger::new(&loaded.paths.state_dir, c.timezone()).today();
    let budget = match c.agent.daily_token_budget {
        0 => String::new(),
        b => format!(" (budget {b})"),
    };
    let (skills, skill_errors) = crate::agent::skills::load(&loaded.paths.workspace);
    let errors = if skill_errors.is_empty() {
        String::new()
    } else {
        format!(", {} with errors: run `bramble check`", skill_errors.len())
    };
    vec![
        format!("sessions:   {}", sessions.len()),
        format!("tokens:     {} today{budget}", today.total()),
        format!("skills:     {} ({} available{errors})", skills.len(), skills.iter().filter(|s| s.available()).count()),
    ]
}

/// The clock, the heartbeat and the jobs with their next runs.
fn schedule_lines(loaded: &Loaded, private: bool) -> Vec<String> {
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
    let mut lines = vec![format!("clock:      {clock}")];
    let hb_tasks = if private { None } else { crate::scheduler::heartbeat::read_file(&loaded.paths.workspace) }
        .map(|t| crate::scheduler::heartbeat::active_tasks(&t).len().to_string())
        .unwrap_or_else(|| if private { "?".into() } else { "0".into() });
    let hb_last = crate::scheduler::heartbeat::StateFile::new(&loaded.paths.state_dir).load().last_run;
    lines.push(if c.heartbeat.enabled {
        let every = &c.heartbeat.every;
        format!(
            "heartbeat:  every {every}, {hb_tasks} active task{}, last run {}",
            if hb_tasks == "1" { "" } else { "s" },
            when(hb_last, &tz)
        )
    } else {
        "heartbeat:  off".into()
    });
    match listed {
        None => lines.push(format!("jobs:       {PRIVATE}")),
        Some(Ok(jobs)) => {
            lines.push(format!("jobs:       {}", jobs.len()));
            if let Some(notice) = jobs_store.corrupt_notice() {
                lines.push(format!("  job store: {}", esc(&notice)));
            }
            for j in jobs.iter().filter(|j| j.enabled && !j.state.done) {
                lines.push(format!("  {:<20} next {}", esc(&j.name), when(j.state.next_run, &tz)));
            }
        }
        Some(Err(e)) => lines.push(format!("jobs:       error: {}", esc(&e.to_string()))),
    }
    lines
}

/// What the outbox holds undelivered (the first five).
fn outbox_lines(loaded: &Loaded, private: bool) -> Vec<String> {
    let outbox = crate::delivery::outbox::Outbox::new(&loaded.paths.state_dir);
    match (!private).then(|| outbox.pending()) {
        None => vec![format!("outbox:     {PRIVATE}")],
        Some(Ok(p)) if p.is_empty() => vec!["outbox:     nothing undelivered".into()],
        Some(Ok(p)) => {
            let mut lines = vec![format!("outbox:     {} undelivered", p.len())];
            for e in p.iter().take(5) {
                let err = e.last_error.as_deref().map(|e| format!(" ({})", esc(e))).unwrap_or_default();
                let (target, source) = (e.target.to_string(), e.source.to_string());
                lines.push(format!("  {} from {}, {} attempts{err}", esc(&target), esc(&source), e.attempts));
            }
            lines
        }
        Some(Err(e)) => vec![format!("outbox:     error: {}", esc(&e.to_string()))],
    }
}

/// The open alerts, and where alerts go.
fn alert_lines(loaded: &Loaded, private: bool) -> Vec<String> {
    if private {
        return vec![format!("alerts:     {PRIVATE}")];
    }
    let c = &loaded.config;
    let open = crate::work::alerts::open_in(&loaded.paths.state_dir);
    let to = if c.alerts.deliver.is_empty() {
        "sent nowhere: set [alerts] deliver".to_string()
    } else {
        format!("to {}", c.alerts.deliver.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", "))
    };
    if open.is_empty() {
        return vec![format!("alerts:     none open ({to})")];
    }
    let mut lines = vec![format!("alerts:     {} open ({to})", open.len())];
    let tz = c.timezone();
    for (key, o) in &open {
        let first = o.text.lines().next().unwrap_or_default();
        let text = crate::scheduler::job::truncate(first, 160);
        lines.push(format!("  {} since {}: {}", esc(key), when(Some(o.since), &tz), esc(&text)));
    }
    lines
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
        assert_eq!(config_lines(&l, &super::super::service::Acting::Own), ["config:     (none: defaults)"]);
        let paths = path_lines(&l);
        assert_eq!(paths[0], "time zone:  Europe/Berlin");
        assert!(paths[1].ends_with("workspace (missing: run `bramble init`)"), "{paths:?}");
        assert!(paths[2].starts_with("state:      "), "{paths:?}");
    }

    #[test]
    fn private_state_is_said_private_section_by_section() {
        let dir = tempfile::tempdir().unwrap();
        let l = loaded(dir.path(), "");
        for lines in [usage_lines(&l, true), outbox_lines(&l, true), alert_lines(&l, true)] {
            assert!(lines.iter().all(|line| line.ends_with(PRIVATE)), "{lines:?}");
        }
        assert_eq!(usage_lines(&l, true)[0], format!("sessions:   {PRIVATE}"));
        assert!(schedule_lines(&l, true).contains(&format!("jobs:       {PRIVATE}")));
    }

    #[test]
    fn an_empty_state_has_nothing_pending() {
        let dir = tempfile::tempdir().unwrap();
        let l = loaded(dir.path(), "");
        assert_eq!(outbox_lines(&l, false), ["outbox:     nothing undelivered"]);
        assert_eq!(alert_lines(&l, false), ["alerts:     none open (sent nowhere: set [alerts] deliver)"]);
        let schedule = schedule_lines(&l, false);
        assert!(schedule.contains(&"jobs:       0".to_string()), "{schedule:?}");
        assert!(schedule[0].starts_with("clock:      "), "{schedule:?}");
        assert_eq!(usage_lines(&l, false)[0], "sessions:   0");
    }

    #[test]
    fn exec_off_has_no_sandbox_line() {
        let dir = tempfile::tempdir().unwrap();
        let l = loaded(dir.path(), "[exec]\nenabled = false\n[web]\nenabled = false\n");
        assert_eq!(exec_lines(&l), ["exec:       off"]);
    }
}
