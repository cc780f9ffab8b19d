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

use crate::config::Loaded;
use crate::daemon::assemble;

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

pub(super) async fn status(loaded: &Loaded, acting: &super::service::Acting) -> anyhow::Result<ExitCode> {
    use super::service::Acting;
    let c = &loaded.config;
    let whose = match acting {
        Acting::Own => String::new(),
        Acting::Service(user) => format!(" (the installed service's; acting as its user {user})"),
        Acting::ServiceConfigOnly => " (the installed service's; its state with `sudo bramble status`)".to_string(),
    };
    // The service's state is its user's alone: what the config says is shown, the state's parts are not.
    let private = *acting == Acting::ServiceConfigOnly
        && nix::unistd::access(
            &loaded.paths.state_dir,
            nix::unistd::AccessFlags::R_OK | nix::unistd::AccessFlags::X_OK,
        )
        .is_err();
    const PRIVATE: &str = "private to the service (`sudo bramble status`)";
    println!(
        "config:     {}{whose}",
        loaded.path.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "(none: defaults)".into())
    );
    let key = |p: &crate::config::ProviderConfig| match p.api_key() {
        Some(_) => "set".to_string(),
        None if !p.key_required() => "not needed (custom base_url)".to_string(),
        None => format!("MISSING: set {}", p.key_env()),
    };
    if let [p] = c.providers.as_slice() {
        println!("provider:   {} at {}", p.kind.as_str(), p.base_url());
        println!("model:      {}", c.model());
        println!("api key:    {}", key(p));
    } else {
        let usage = crate::agent::usage::UsageLedger::new(&loaded.paths.state_dir, c.timezone());
        for (i, p) in c.providers.iter().enumerate() {
            let used = usage.today_of(p.name()).total();
            let budget = match p.daily_token_budget {
                0 => String::new(),
                b => format!(" of {b}"),
            };
            println!(
                "{:<12}{} ({} at {}): model {}, api key {}, {used}{budget} tokens today",
                if i == 0 { "providers:" } else { "" },
                p.name(),
                p.kind.as_str(),
                p.base_url(),
                p.default_model(),
                key(p),
            );
        }
        println!("model:      {}", crate::provider::chain::Chain::label_in(c, c.model()));
        let fallback: Vec<&str> = c.agent.fallback.iter().map(|f| f.get_ref().as_str()).collect();
        println!(
            "fallback:   {} (cooldown {})",
            if fallback.is_empty() { "none".to_string() } else { fallback.join(" → ") },
            c.agent.fallback_cooldown
        );
    }
    println!("time zone:  {}", c.timezone().name());
    println!(
        "workspace:  {}{}",
        loaded.paths.workspace.display(),
        if loaded.paths.workspace.is_dir() { "" } else { " (missing: run `bramble init`)" }
    );
    println!("state:      {}", loaded.paths.state_dir.display());
    if *acting == Acting::ServiceConfigOnly {
        // The state is private; the running service says whether it answers (and what members may).
        println!("daemon:     {}", esc(&super::service::control_line().await));
    } else {
        println!("daemon:     {}", daemon_line(&loaded.paths.state_dir));
    }
    if let Some(service) = service_line() {
        println!("service:    {service}");
    }
    // The parts `bramble run` would start for this config, built and not started.
    // Quietly: what it would warn about (no key, a bad MQTT url) has its own line.
    let parts =
        tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), || assemble::daemon(loaded));
    match &parts {
        Ok(parts) => {
            // MCP servers are connected from here (as the daemon would; stdio ones started and
            // stopped again), so the line says what this machine can reach now.
            let tools = parts.agent.tools();
            tools.prepare().await;
            println!("tools:      {}", esc(&tools.names().join(", ")));
            println!("channels:   {}", parts.channels.names().join(", "));
            for (i, line) in tools.sources_status().iter().enumerate() {
                println!("{:<12}{}", if i == 0 { "mcp:" } else { "" }, esc(line));
            }
        }
        Err(e) => println!("channels:   error: {}", esc(&e.to_string())),
    }
    println!(
        "exec:       {}",
        if c.exec.enabled {
            format!("timeout {}, network {}", c.exec.timeout, c.exec.network.as_str())
        } else {
            "off".into()
        }
    );
    if c.exec.enabled {
        println!("sandbox:    {}", crate::sandbox::Sandbox::for_config(loaded).layers_summary(&c.exec));
    }
    if c.web.enabled {
        let http = std::sync::Arc::new(crate::tools::web::GuardedHttp::new(&c.web));
        let engines = crate::tools::search::WebSearch::new(&c.web, http).map(|s| s.engines().join(" → "));
        println!("web search: {}", engines.unwrap_or_else(|| "off ([web] search = [])".into()));
    }
    println!("telegram:   {}", esc(&telegram_summary(&c.telegram, &loaded.paths.state_dir)));
    println!("mqtt:       {}", esc(&crate::channels::mqtt::status_line(&c.mqtt)));
    println!("policy:     {}", policy_summary(&c.policy));
    println!("ha:         {}", esc(&crate::channels::homeassistant::status_line(c, &loaded.paths.state_dir)));
    if private {
        println!("sessions:   {PRIVATE}");
    } else {
        let sessions = crate::agent::session::SessionStore::new(&loaded.paths.state_dir).keys();
        println!("sessions:   {}", sessions.len());
    }
    let today = crate::agent::usage::UsageLedger::new(&loaded.paths.state_dir, c.timezone()).today();
    if private {
        println!("tokens:     {PRIVATE}");
    } else {
        println!(
            "tokens:     {} today{}",
            today.total(),
            match c.agent.daily_token_budget {
                0 => String::new(),
                b => format!(" (budget {b})"),
            }
        );
    }
    let (skills, skill_errors) =
        if private { (Vec::new(), Vec::new()) } else { crate::agent::skills::load(&loaded.paths.workspace) };
    if private {
        println!("skills:     {PRIVATE}");
    } else {
        println!(
            "skills:     {} ({} available{})",
            skills.len(),
            skills.iter().filter(|s| s.available()).count(),
            if skill_errors.is_empty() {
                String::new()
            } else {
                format!(", {} with errors: run `bramble check`", skill_errors.len())
            }
        );
    }
    // Read once: the clock note and the job list below both need it.
    let jobs_store = crate::scheduler::JobStore::open(&loaded.paths.state_dir);
    let listed = (!private).then(|| jobs_store.list());
    let all_jobs = match &listed {
        Some(Ok(jobs)) => jobs.as_slice(),
        _ => &[],
    };
    let wait = c.daemon.clock_sync_wait.get();
    let clock = match crate::scheduler::engine::clock_hold_note(all_jobs, wait, c.timezone().tz()) {
        None if crate::scheduler::clock_synchronized() => "synchronised".to_string(),
        None => "not reported as synchronised, but trusted: the machine is not freshly booted and the clock is \
                 past every time bramble recorded"
            .to_string(),
        Some(note) => note,
    };
    println!("clock:      {clock}");
    let hb_tasks = if private { None } else { crate::scheduler::heartbeat::read_file(&loaded.paths.workspace) }
        .map(|t| crate::scheduler::heartbeat::active_tasks(&t).len().to_string())
        .unwrap_or_else(|| if private { "?".into() } else { "0".into() });
    let hb_last = crate::scheduler::heartbeat::StateFile::new(&loaded.paths.state_dir).load().last_run;
    let tz = c.timezone();
    println!(
        "heartbeat:  {}",
        if c.heartbeat.enabled {
            format!("every {}, {hb_tasks} active tasks, last run {}", c.heartbeat.every, when(hb_last, &tz))
        } else {
            "off".into()
        }
    );
    match listed {
        None => println!("jobs:       {PRIVATE}"),
        Some(Ok(jobs)) => {
            println!("jobs:       {}", jobs.len());
            if let Some(notice) = jobs_store.corrupt_notice() {
                println!("  job store: {}", esc(&notice));
            }
            for j in jobs.iter().filter(|j| j.enabled && !j.state.done) {
                println!("  {:<20} next {}", esc(&j.name), when(j.state.next_run, &tz));
            }
        }
        Some(Err(e)) => println!("jobs:       error: {}", esc(&e.to_string())),
    }
    let outbox = crate::delivery::outbox::Outbox::new(&loaded.paths.state_dir);
    match (!private).then(|| outbox.pending()) {
        None => println!("outbox:     {PRIVATE}"),
        Some(Ok(p)) if p.is_empty() => println!("outbox:     nothing undelivered"),
        Some(Ok(p)) => {
            println!("outbox:     {} undelivered", p.len());
            for e in p.iter().take(5) {
                let err = e.last_error.as_deref().map(|e| format!(" ({})", esc(e))).unwrap_or_default();
                let (target, source) = (e.target.to_string(), e.source.to_string());
                println!("  {} from {}, {} attempts{err}", esc(&target), esc(&source), e.attempts);
            }
        }
        Some(Err(e)) => println!("outbox:     error: {}", esc(&e.to_string())),
    }
    if private {
        println!("alerts:     {PRIVATE}");
        return Ok(ExitCode::SUCCESS);
    }
    let open = crate::work::alerts::open_in(&loaded.paths.state_dir);
    let to = if c.alerts.deliver.is_empty() {
        "sent nowhere: set [alerts] deliver".to_string()
    } else {
        format!("to {}", c.alerts.deliver.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", "))
    };
    if open.is_empty() {
        println!("alerts:     none open ({to})");
    } else {
        println!("alerts:     {} open ({to})", open.len());
        for (key, o) in &open {
            let first = o.text.lines().next().unwrap_or_default();
            let text = crate::scheduler::job::truncate(first, 160);
            println!("  {} since {}: {}", esc(key), when(Some(o.since), &tz), esc(&text));
        }
    }
    Ok(ExitCode::SUCCESS)
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
