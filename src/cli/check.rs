//! `bramble check`: validate the config and the workspace; errors as FILE:LINE:COL.

use std::path::Path;
use std::process::ExitCode;

use crate::config;

pub(super) fn check(explicit: Option<&Path>) -> ExitCode {
    let loaded = match config::load(explicit) {
        Ok(l) => l,
        Err(e) => {
            error(&e.to_string());
            return ExitCode::FAILURE;
        }
    };
    match &loaded.path {
        Some(p) => println!("{}: ok", p.display()),
        None => println!("no config file at {} (all defaults): ok", config::default_config_path().display()),
    }
    let telegram = &loaded.config.telegram;
    println!("telegram: {}", telegram_summary(telegram, telegram.token().is_some(), &loaded.paths.state_dir));
    // A key variable named for an own server and not set: every turn would fail
    // (the public endpoints' missing keys are among the config's warnings).
    for p in loaded.config.providers.iter().filter(|p| !p.key_required()) {
        if let config::env::KeyState::Unset(env) = config::env::key_state(p) {
            println!(
                "warning: the {} provider's api_key_env names {env}, which is not set (read in this shell): every \
                 turn fails until it is; set it here and in the daemon's environment, or in {}",
                p.name(),
                config::env::path().display()
            );
        }
    }
    for w in config::warnings(&loaded) {
        println!("warning: {w}");
    }
    for w in crate::channels::mqtt::check_warnings(&loaded.config) {
        println!("warning: {w}");
    }
    #[cfg(feature = "homeassistant")]
    for w in crate::channels::homeassistant::check_warnings(&loaded.config) {
        println!("warning: {w}");
    }
    if let Some((true, line)) = context_line(&agent_for(&loaded)) {
        println!("warning: {line}");
    }
    let (skills, errors) = crate::agent::skills::load(&loaded.paths.workspace);
    for s in skills.iter().filter(|s| !s.available()) {
        println!("warning: skill {} is unavailable: missing {}", s.name, s.missing.join(", "));
    }
    if !errors.is_empty() {
        for e in &errors {
            error(&format!("{}:{}: {}", loaded.paths.workspace.join(&e.path).display(), e.line, e.message));
        }
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// The agent as `bramble agent` builds it, for a look at its prompt (nothing is run or connected).
pub(super) fn agent_for(loaded: &config::Loaded) -> crate::agent::Agent {
    let (tx, _rx) = tokio::sync::mpsc::channel(1);
    let sandbox = crate::daemon::assemble::sandbox(loaded);
    crate::daemon::assemble::agent(loaded, crate::daemon::assemble::AgentLinks::outside_daemon(tx), &sandbox)
}

/// The context window against the part of every prompt that is fixed (the
/// system prompt and the tool specs of a terminal turn, characters / 4):
/// `(true, …)` when that part alone takes more than half of the window, so
/// little is left for the history, the tool results and the answer. `None`
/// when the window is unknown (`check` knows it from the config and the
/// model's name; `doctor` asks the server first).
pub(super) fn context_line(agent: &crate::agent::Agent) -> Option<(bool, String)> {
    let window = agent.context().window()?;
    let fixed = agent.fixed_prompt_tokens();
    let profile = agent.context().profile();
    let tokens = window.tokens as usize;
    let what = format!(
        "the system prompt and tool specs take ≈ {fixed} of the model's {tokens} tokens ({}; profile {})",
        window.source,
        profile.name()
    );
    if window.tools_dropped {
        return Some((true, format!("{what}; but {}", crate::provider::window::TOOLS_DROPPED)));
    }
    if fixed * 2 <= tokens {
        return Some((false, what));
    }
    let fix = match profile {
        config::Profile::Default => {
            "set [agent] profile = \"lean\", shorten AGENTS.md and SOUL.md, or serve the model with a larger window"
        }
        config::Profile::Lean => {
            "shorten AGENTS.md, SOUL.md and MEMORY.md, drop MCP servers, or serve the model with a larger window"
        }
    };
    Some((true, format!("{what}: more than half, little is left for the conversation; {fix}")))
}

/// Print an error on stderr. Under systemd (`ExecReload=bramble check
/// --reload`) stderr is the journal, which files a plain line at priority 6
/// (info): each line then carries the `<3>` (error) prefix journald reads, so
/// `journalctl -p warning` shows why a reload failed.
fn error(text: &str) {
    let journal = crate::logging::stderr_is_journal();
    let mut out = String::new();
    for line in text.lines() {
        if journal {
            out.push_str("<3>");
        }
        out.push_str(line);
        out.push('\n');
    }
    eprint!("{out}");
}

/// `bramble check --reload`: what the daemon's reload would refuse, found
/// before the signal is sent, so that `systemctl reload` fails where the
/// reload would (the unit runs this first) and the error reaches the terminal
/// that asked, not only the journal. The running daemon keeps its config either way.
pub(super) fn reload(explicit: Option<&Path>) -> ExitCode {
    let loaded = match config::load(explicit) {
        Ok(l) => l,
        Err(e) => {
            error(&format!("{e}\nbramble: not reloaded: the running daemon keeps its config"));
            return ExitCode::FAILURE;
        }
    };
    let state = &loaded.paths.state_dir;
    if !crate::daemon::daemon_running(state) {
        error(&format!(
            "bramble: no running daemon uses the state directory {}: a reload cannot move it (the daemon would \
             keep its old config); restart instead",
            state.display()
        ));
        return ExitCode::FAILURE;
    }
    let name = loaded.path.as_ref().map_or_else(|| "defaults (no config file)".into(), |p| p.display().to_string());
    println!("{name}: ok to reload");
    ExitCode::SUCCESS
}

/// Whether Telegram is configured and who may use it (no network).
/// Usernames are shown with the id they are pinned to (issue 22).
pub(super) fn telegram_summary(t: &config::TelegramConfig, token: bool, state_dir: &Path) -> String {
    match (token, t.allow_from.len()) {
        (false, _) if t.token_env.is_some() => {
            format!("not configured: token_env names {}, which is not set", t.token_env.as_deref().unwrap_or_default())
        }
        (false, _) => "not configured".into(),
        (true, 0) => "configured, but allow_from is empty: it answers nobody".into(),
        (true, n) => {
            let mut line = format!("configured, {n} allowed user{}", if n == 1 { "" } else { "s" });
            if let Some(pins) = crate::policy::pins::pins_summary(&t.allow_from, state_dir) {
                line.push_str(&format!(" ({pins})"));
            }
            line
        }
    }
}
