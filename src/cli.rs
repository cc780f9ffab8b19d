//! The command line: `bramble init | run | agent | cron | heartbeat | status | check`.
//!
//! Each command is a small function over the library. Errors go up as
//! `anyhow` with context that names the file or setting involved; `main`
//! prints them as `bramble: error: …`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use crate::agent::{Agent, TurnError, TurnRequest};
use crate::bus::{Bus, OutboundMessage, Target};
use crate::config::{self, templates, Loaded};
use crate::fsutil;

/// bramble: a small, scheduler-first AI agent for your Raspberry Pi.
#[derive(Debug, Parser)]
#[command(name = "bramble", version, propagate_version = true, max_term_width = 100)]
pub struct Cli {
    /// Config file [default: $XDG_CONFIG_HOME/bramble/config.toml, /etc/bramble/config.toml under systemd]
    #[arg(long, global = true, env = "BRAMBLE_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Write a commented config.toml and the workspace templates (never overwrites a file)
    Init {
        /// Where the agent's workspace goes [default: from the config, else ~/.local/share/bramble/workspace]
        #[arg(long, value_name = "DIR")]
        workspace: Option<PathBuf>,
    },
    /// One turn with -m, else a chat in the terminal
    Agent {
        /// The message; without it, read messages from the terminal until EOF or `exit`
        #[arg(short, long, value_name = "TEXT")]
        message: Option<String>,
        /// Session key: turns with the same key share history
        #[arg(short, long, value_name = "KEY", default_value = "cli:direct")]
        session: String,
    },
    /// Run one heartbeat now: read HEARTBEAT.md and, if it lists active tasks, run them
    Heartbeat {
        /// Show what would run, without calling the model or delivering anything
        #[arg(long)]
        dry_run: bool,
    },
    /// Show provider, paths, tools and sessions
    Status,
    /// Validate the config and the workspace; errors as FILE:LINE:COL
    Check,
}

/// Parse the process's arguments (exits with usage on error, as clap does).
pub fn parse() -> Cli {
    Cli::parse()
}

/// Run a parsed command.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let explicit = cli.config.as_deref();
    match cli.command {
        Command::Check => return Ok(check(explicit)),
        Command::Init { workspace } => return init(explicit, workspace.as_deref()),
        _ => {}
    }
    let loaded = config::load(explicit)?;
    crate::logging::init(loaded.config.daemon.log_level.as_deref(), "warn");
    match cli.command {
        Command::Agent { message, session } => agent(&loaded, message, session).await,
        Command::Heartbeat { dry_run } => heartbeat(&loaded, dry_run).await,
        Command::Status => status(&loaded),
        Command::Check | Command::Init { .. } => unreachable!("handled above"),
    }
}

fn check(explicit: Option<&Path>) -> ExitCode {
    let loaded = match config::load(explicit) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    match &loaded.path {
        Some(p) => println!("{}: ok", p.display()),
        None => println!("no config file at {} (all defaults): ok", config::default_config_path().display()),
    }
    for w in config::warnings(&loaded) {
        println!("warning: {w}");
    }
    ExitCode::SUCCESS
}

fn init(explicit: Option<&Path>, workspace: Option<&Path>) -> anyhow::Result<ExitCode> {
    let config_path = explicit.map(Path::to_path_buf).unwrap_or_else(config::default_config_path);
    let mut text = templates::CONFIG_TOML.to_string();
    if let Some(ws) = workspace {
        let ws = std::path::absolute(ws).with_context(|| format!("cannot resolve {}", ws.display()))?;
        let line = format!("workspace = {}", toml_string(&ws.to_string_lossy()));
        text = text.replacen("# workspace = \"~/.local/share/bramble/workspace\"", &line, 1);
    }
    let wrote = fsutil::write_new(&config_path, text.as_bytes())
        .with_context(|| format!("cannot write {}", config_path.display()))?;
    report_init(&config_path, wrote);
    // Read back what is now there (it may be the user's own file) to find the workspace.
    let loaded = config::load(Some(&config_path))?;
    let ws = match workspace {
        Some(ws) => ws.to_path_buf(),
        None => loaded.paths.workspace.clone(),
    };
    for (rel, body) in templates::WORKSPACE {
        let path = ws.join(rel);
        let wrote = fsutil::write_new(&path, body.as_bytes()).with_context(|| format!("cannot write {}", path.display()))?;
        report_init(&path, wrote);
    }
    println!("\nNext: set your API key (e.g. export OPENAI_API_KEY=…), then try `bramble agent -m \"hello\"`.");
    Ok(ExitCode::SUCCESS)
}

fn report_init(path: &Path, wrote: bool) {
    if wrote {
        println!("wrote   {}", path.display());
    } else {
        println!("kept    {} (exists)", path.display());
    }
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

async fn agent(loaded: &Loaded, message: Option<String>, session: String) -> anyhow::Result<ExitCode> {
    let bus = Bus::new();
    let agent = Arc::new(Agent::from_config(loaded, bus.outbound_tx.clone()));
    // Messages the agent sends mid-turn (the `message` tool).
    let mut outbound = bus.outbound_rx;
    let printer = tokio::spawn(async move {
        while let Some(OutboundMessage { target, text }) = outbound.recv().await {
            match target {
                Target::Cli => println!("[message] {text}"),
                other => tracing::warn!(
                    target = %other,
                    "`bramble agent` cannot deliver to {other}: only the daemon (`bramble run`) runs channels"
                ),
            }
        }
    });
    let result = match message {
        Some(text) => one_turn(&agent, &session, text).await,
        None => repl(&agent, &session).await,
    };
    drop(agent);
    printer.abort();
    result
}

async fn one_turn(agent: &Agent, session: &str, text: String) -> anyhow::Result<ExitCode> {
    let req = TurnRequest::cli(session, text);
    let cancel = req.cancel.clone();
    let stop = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            cancel.cancel();
        }
    });
    let result = agent.turn(req).await;
    stop.abort();
    match result {
        Ok(report) => {
            println!("{}", report.text);
            Ok(ExitCode::SUCCESS)
        }
        Err(TurnError::Cancelled) => Ok(ExitCode::from(130)),
        Err(e) => Err(e.into()),
    }
}

async fn repl(agent: &Agent, session: &str) -> anyhow::Result<ExitCode> {
    if let Some(why) = agent.provider_problem() {
        eprintln!("warning: {why}");
    }
    eprintln!("bramble {} — session `{session}`. Type a message; `exit` or Ctrl-D to quit.", env!("CARGO_PKG_VERSION"));
    loop {
        print!("you> ");
        std::io::stdout().flush().ok();
        let line = tokio::task::spawn_blocking(|| {
            let mut s = String::new();
            std::io::stdin().read_line(&mut s).map(|n| (n, s))
        })
        .await
        .context("the terminal reader stopped")?
        .context("cannot read from the terminal")?;
        let (n, text) = line;
        let text = text.trim();
        if n == 0 || matches!(text, "exit" | "quit" | "/exit" | "/quit") {
            println!();
            return Ok(ExitCode::SUCCESS);
        }
        if text.is_empty() {
            continue;
        }
        let req = TurnRequest::cli(session, text);
        let cancel = req.cancel.clone();
        let stop = tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                cancel.cancel();
            }
        });
        match agent.turn(req).await {
            Ok(report) => println!("bramble> {}\n", report.text),
            Err(TurnError::Cancelled) => println!("(stopped)\n"),
            Err(e) => eprintln!("error: {e}\n"),
        }
        stop.abort();
    }
}

async fn heartbeat(loaded: &Loaded, dry_run: bool) -> anyhow::Result<ExitCode> {
    use crate::daemon::{Heartbeat, HeartbeatOutcome};
    let c = &loaded.config;
    let outbox = crate::daemon::outbox::Outbox::new(&loaded.paths.state_dir);
    let bus = Bus::new();
    let agent = Agent::from_config(loaded, bus.outbound_tx.clone());
    let cancel = tokio_util::sync::CancellationToken::new();
    // What the agent sends with the `message` tool waits in the outbox for the daemon.
    let pump = tokio::spawn(crate::daemon::pump_outbound(
        bus.outbound_rx,
        outbox.clone(),
        Arc::new(tokio::sync::Notify::new()),
        cancel.clone(),
    ));
    let hb = Heartbeat {
        config: c.heartbeat.clone(),
        workspace: loaded.paths.workspace.clone(),
        tz: c.timezone(),
        state: crate::scheduler::heartbeat::StateFile::new(&loaded.paths.state_dir),
        outbox,
        wake: Arc::new(tokio::sync::Notify::new()),
    };
    let outcome = hb.tick(&agent, dry_run, &cancel).await;
    drop(agent);
    cancel.cancel();
    let _ = pump.await;
    let targets = |t: &[Target]| t.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
    let hb_file = loaded.paths.workspace.join("HEARTBEAT.md");
    match outcome {
        HeartbeatOutcome::NoTasks => {
            println!("{} lists no active tasks: nothing to do (no model call).", hb_file.display())
        }
        HeartbeatOutcome::Quiet => println!("inside quiet hours: skipped."),
        HeartbeatOutcome::DryRun(prompt) => println!(
            "would run one agent turn in session `heartbeat`, reporting to {}:\n\n{prompt}",
            targets(&c.heartbeat.deliver)
        ),
        HeartbeatOutcome::NothingToReport => println!("HEARTBEAT_OK: nothing to report, nothing delivered."),
        HeartbeatOutcome::Reported { text, targets: t } => {
            println!("{text}\n\n(queued for {}; the daemon delivers it)", targets(&t))
        }
        HeartbeatOutcome::Failed(why) => {
            eprintln!("bramble: error: {why}");
            return Ok(ExitCode::FAILURE);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn status(loaded: &Loaded) -> anyhow::Result<ExitCode> {
    let c = &loaded.config;
    let yes_no = |b: bool| if b { "yes" } else { "no" };
    println!(
        "config:     {}",
        loaded.path.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "(none: defaults)".into())
    );
    println!("provider:   {} at {}", c.provider.kind.as_str(), c.provider.base_url());
    println!("model:      {}", c.model());
    let key = match c.provider.api_key() {
        Some(_) => "set".to_string(),
        None if !c.provider.key_required() => "not needed (custom base_url)".to_string(),
        None => format!("MISSING: set {}", c.provider.key_env()),
    };
    println!("api key:    {key}");
    println!("time zone:  {}", c.timezone().name());
    println!("workspace:  {}{}", loaded.paths.workspace.display(), if loaded.paths.workspace.is_dir() { "" } else { " (missing: run `bramble init`)" });
    println!("state:      {}", loaded.paths.state_dir.display());
    println!(
        "tools:      files, exec ({}), web_fetch ({}), message",
        if c.exec.enabled { format!("timeout {}, network {}", c.exec.timeout, yes_no(c.exec.network)) } else { "off".into() },
        if c.web.enabled { "on" } else { "off" }
    );
    println!("telegram:   {}", if c.telegram.token().is_some() { "configured" } else { "not configured" });
    println!("mqtt:       {}", c.mqtt.url.as_ref().map(|u| format!("{}:{}", u.host, u.port)).unwrap_or_else(|| "not configured".into()));
    let sessions = crate::agent::session::SessionStore::new(&loaded.paths.state_dir).keys();
    println!("sessions:   {}", sessions.len());
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn toml_strings_are_escaped() {
        assert_eq!(toml_string(r#"/a "b"\c"#), r#""/a \"b\"\\c""#);
    }
}
