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
use crate::util;

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
    /// The daemon: scheduler, heartbeat, agent and channels (SIGHUP reloads, SIGTERM stops)
    Run,
    /// One turn with -m, else a chat in the terminal
    Agent {
        /// The message; without it, read messages from the terminal until EOF or `exit`
        #[arg(short, long, value_name = "TEXT")]
        message: Option<String>,
        /// Session key: turns with the same key share history
        #[arg(short, long, value_name = "KEY", default_value = "cli:direct")]
        session: String,
    },
    /// Scheduled jobs: reminders, agent tasks and commands
    #[command(subcommand)]
    Cron(CronCommand),
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

// Parsed once per process: the size of the `Add` variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum CronCommand {
    /// Add a job (a running daemon picks it up at once)
    #[command(group(clap::ArgGroup::new("schedule").required(true).args(["every", "cron", "at"])))]
    #[command(group(clap::ArgGroup::new("action").required(true).args(["message", "remind", "exec"])))]
    Add {
        /// A unique name: letters, digits, `-` and `_` (used in MQTT topics)
        name: String,
        /// Run at a fixed interval: 90s, 10m, 2h, 1d
        #[arg(long, value_name = "DUR")]
        every: Option<String>,
        /// Run on a cron expression: 5 fields (`0 9 * * 1-5`) or 6 with seconds first
        #[arg(long, value_name = "EXPR")]
        cron: Option<String>,
        /// Time zone of the cron expression [default: [agent] timezone]
        #[arg(long, value_name = "ZONE", requires = "cron")]
        tz: Option<String>,
        /// Run once: RFC 3339, or `YYYY-MM-DD HH:MM` in the configured time zone
        #[arg(long, value_name = "TIME")]
        at: Option<String>,
        /// An agent turn with this task
        #[arg(long, value_name = "TEXT")]
        message: Option<String>,
        /// Deliver this text as it is (no model call)
        #[arg(long, value_name = "TEXT")]
        remind: Option<String>,
        /// Run this shell command in the sandbox (no model call)
        #[arg(long, value_name = "CMD")]
        exec: Option<String>,
        /// Where the result goes: telegram:<chat_id>, mqtt, mqtt:<topic>, log (repeatable) [default: log]
        #[arg(long, value_name = "TARGET")]
        deliver: Vec<String>,
        /// Missed runs (daemon down, clock jump): skip, once, or a window like 2h [default: skip; once for --at]
        #[arg(long, value_name = "POLICY")]
        catch_up: Option<String>,
    },
    /// List jobs with their next run
    List,
    /// Show one job with its recent runs
    Show {
        /// Job id or name
        id: String,
    },
    /// Remove a job
    Remove {
        /// Job id or name
        id: String,
    },
    /// Run a job now, in this terminal, and queue its report
    Run {
        /// Job id or name
        id: String,
    },
    /// Enable a job (planned again from now)
    Enable {
        /// Job id or name
        id: String,
    },
    /// Disable a job
    Disable {
        /// Job id or name
        id: String,
    },
}

impl Command {
    /// Commands that print something and exit (no children, no long-lived connections).
    pub fn prints_and_exits(&self) -> bool {
        match self {
            Command::Init { .. } | Command::Status | Command::Check => true,
            Command::Cron(c) => !matches!(c, CronCommand::Run { .. }),
            Command::Run | Command::Agent { .. } | Command::Heartbeat { .. } => false,
        }
    }
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
    // Commands started by this process never see the state dir, config or credentials.
    crate::sandbox::protect(crate::sandbox::private_paths(&loaded));
    let default_level = if matches!(cli.command, Command::Run) { "info" } else { "warn" };
    crate::logging::init(loaded.config.daemon.log_level.as_deref(), default_level);
    match cli.command {
        Command::Run => crate::daemon::run(explicit, loaded).await.map(|()| ExitCode::SUCCESS),
        Command::Cron(cmd) => cron(&loaded, cmd).await,
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
    println!("telegram: {}", telegram_summary(&loaded.config.telegram, &loaded.paths.state_dir));
    for w in config::warnings(&loaded) {
        println!("warning: {w}");
    }
    for w in crate::channels::mqtt::check_warnings(&loaded.config) {
        println!("warning: {w}");
    }
    let (skills, errors) = crate::agent::skills::load(&loaded.paths.workspace);
    for s in skills.iter().filter(|s| !s.available()) {
        println!("warning: skill {} is unavailable: missing {}", s.name, s.missing.join(", "));
    }
    if !errors.is_empty() {
        for e in &errors {
            eprintln!("{}:{}: {}", loaded.paths.workspace.join(&e.path).display(), e.line, e.message);
        }
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// Whether Telegram is configured and who may use it (no network).
/// Usernames are shown with the id they are pinned to (issue 22).
fn telegram_summary(t: &config::TelegramConfig, state_dir: &Path) -> String {
    match (t.token(), t.allow_from.len()) {
        (None, _) => "not configured".into(),
        (Some(_), 0) => "configured, but allow_from is empty: it answers nobody".into(),
        (Some(_), n) => {
            let mut line = format!("configured, {n} allowed user{}", if n == 1 { "" } else { "s" });
            if let Some(pins) = crate::policy::pins::pins_summary(&t.allow_from, state_dir) {
                line.push_str(&format!(" ({pins})"));
            }
            line
        }
    }
}

fn init(explicit: Option<&Path>, workspace: Option<&Path>) -> anyhow::Result<ExitCode> {
    let config_path = explicit.map(Path::to_path_buf).unwrap_or_else(config::default_config_path);
    let mut text = templates::CONFIG_TOML.to_string();
    if let Some(ws) = workspace {
        let ws = std::path::absolute(ws).with_context(|| format!("cannot resolve {}", ws.display()))?;
        let line = format!("workspace = {}", toml_string(&ws.to_string_lossy()));
        text = text.replacen("# workspace = \"~/.local/share/bramble/workspace\"", &line, 1);
    }
    let wrote = util::fs::write_new(&config_path, text.as_bytes())
        .with_context(|| format!("cannot write {}", config_path.display()))?;
    report_init(&config_path, wrote);
    // Read back what is now there (it may be the user's own file) to find the workspace.
    let loaded = config::load(Some(&config_path))?;
    let ws = match workspace {
        Some(ws) => ws.to_path_buf(),
        None => loaded.paths.workspace.clone(),
    };
    std::fs::create_dir_all(&ws).with_context(|| format!("cannot create the workspace {}", ws.display()))?;
    // The workspace may already hold what earlier commands left: never write through a link there.
    let confined = crate::workspace::Workspace::strict(&ws);
    for (rel, body) in templates::WORKSPACE {
        let path = ws.join(rel);
        let wrote =
            confined.write_new(rel, body.as_bytes()).with_context(|| format!("cannot write {}", path.display()))?;
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
    let agent = Arc::new(Agent::from_config(loaded, bus.outbound_tx.clone(), None));
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
    let background = tokio_util::sync::CancellationToken::new();
    let announcements = tokio::spawn(agent.clone().run_announcements(bus.outbound_tx.clone(), background.clone()));
    report_unanswered(loaded, &agent).await;
    let result = match message {
        Some(text) => one_turn(&agent, &session, text).await,
        None => repl(&agent, &session).await,
    };
    if result.as_ref().is_ok_and(|code| *code == ExitCode::SUCCESS) {
        // `-m` or the end of a chat: let sub-agents report before the process ends (Ctrl-C stops them).
        if agent.subagents_running() > 0 {
            eprintln!("(waiting for {} sub-agent(s) to report; Ctrl-C stops them)", agent.subagents_running());
        }
        tokio::select! {
            _ = agent.wait_subagents() => {}
            _ = tokio::signal::ctrl_c() => agent.inflight().begin_shutdown(),
        }
    }
    background.cancel();
    let _ = announcements.await;
    drop(agent);
    printer.abort();
    result
}

/// Messages typed in a terminal that a crash left unanswered: told on stderr,
/// or run again (`[agent] unanswered`); the answer is printed.
async fn report_unanswered(loaded: &Loaded, agent: &Agent) {
    let outbox = crate::delivery::outbox::Outbox::new(&loaded.paths.state_dir);
    let cancel = tokio_util::sync::CancellationToken::new();
    agent
        .resolve_unanswered(true, &cancel, |target, text| match target {
            Target::Cli => eprintln!("bramble: {text}"),
            other => {
                if let Err(e) = outbox.enqueue(other, &text, "agent") {
                    eprintln!("bramble: {text} (could not queue it: {e})");
                }
            }
        })
        .await;
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
    eprintln!(
        "bramble {} — session `{session}`. Type a message; /help for commands; `exit` or Ctrl-D to quit.",
        env!("CARGO_PKG_VERSION")
    );
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
        if let Some(inv) = crate::agent::commands::parse(text) {
            println!("bramble> {}\n", crate::agent::commands::execute(agent, session, &inv).await);
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

/// An agent for a one-off command (`heartbeat`, `cron run`): what it sends
/// (the `message` tool) goes into the outbox, for the daemon to deliver.
struct QueuedAgent {
    agent: Arc<Agent>,
    outbox: crate::delivery::outbox::Outbox,
    wake: Arc<tokio::sync::Notify>,
    /// Cancels the work (Ctrl-C) and, at the end, the outbox pump.
    cancel: tokio_util::sync::CancellationToken,
    pump: tokio::task::JoinHandle<()>,
}

impl QueuedAgent {
    fn new(loaded: &Loaded) -> QueuedAgent {
        let outbox = crate::delivery::outbox::Outbox::new(&loaded.paths.state_dir);
        let bus = Bus::new();
        let agent = Arc::new(Agent::from_config(loaded, bus.outbound_tx.clone(), None));
        let cancel = tokio_util::sync::CancellationToken::new();
        let wake = Arc::new(tokio::sync::Notify::new());
        let pump = tokio::spawn(crate::delivery::dispatcher::pump_outbound(
            bus.outbound_rx,
            outbox.clone(),
            wake.clone(),
            cancel.clone(),
        ));
        QueuedAgent { agent, outbox, wake, cancel, pump }
    }

    /// Stop the pump once everything queued so far is in the outbox.
    async fn finish(self) {
        drop(self.agent);
        self.cancel.cancel();
        let _ = self.pump.await;
    }
}

async fn heartbeat(loaded: &Loaded, dry_run: bool) -> anyhow::Result<ExitCode> {
    use crate::work::heartbeat::{Heartbeat, HeartbeatOutcome};
    let c = &loaded.config;
    let run = QueuedAgent::new(loaded);
    let hb = Heartbeat {
        config: c.heartbeat.clone(),
        workspace: loaded.paths.workspace.clone(),
        tz: c.timezone(),
        state: crate::scheduler::heartbeat::StateFile::new(&loaded.paths.state_dir),
        reports: crate::delivery::Reports::new(run.outbox.clone(), run.wake.clone()),
    };
    let outcome = hb.tick(&run.agent, dry_run, &run.cancel).await;
    run.finish().await;
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
        HeartbeatOutcome::Cancelled => {
            println!("(stopped)");
            return Ok(ExitCode::from(130));
        }
        HeartbeatOutcome::Failed(why) => {
            eprintln!("bramble: error: {why}");
            return Ok(ExitCode::FAILURE);
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn cron(loaded: &Loaded, cmd: CronCommand) -> anyhow::Result<ExitCode> {
    use crate::scheduler::{self as sched, CatchUp, Job, JobKind, JobStore, Schedule};
    let store = JobStore::open(&loaded.paths.state_dir);
    let tz = loaded.config.timezone();
    let now = jiff::Timestamp::now();
    match cmd {
        CronCommand::Add { name, every, cron, tz: job_tz, at, message, remind, exec, deliver, catch_up } => {
            let schedule = if let Some(every) = every {
                Schedule::Every { every: sched::parse_every(&every)?, anchor: now }
            } else if let Some(expr) = cron {
                sched::parse_cron(&expr, job_tz.as_deref())?
            } else if let Some(at) = at {
                Schedule::At { at: sched::parse_at(&at, tz.tz())? }
            } else {
                unreachable!("clap requires one schedule")
            };
            let kind = match (message, remind, exec) {
                (Some(text), _, _) => JobKind::Message { text },
                (_, Some(text), _) => JobKind::Remind { text },
                (_, _, Some(command)) => JobKind::Exec { command },
                _ => unreachable!("clap requires one action"),
            };
            let deliver = deliver
                .iter()
                .map(|t| t.parse::<Target>().map_err(anyhow::Error::msg))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let mut job = Job::new(&name, schedule, kind, deliver, now, tz.tz())?;
            if let Some(policy) = catch_up {
                job.catch_up = policy.parse::<CatchUp>().map_err(anyhow::Error::msg)?;
            }
            let job = store.add(job)?;
            println!("added job {} ({})", job.name, job.id);
            for t in &job.deliver {
                let configured = match t {
                    Target::Telegram(_) => loaded.config.telegram.token().is_some(),
                    Target::Mqtt(_) => loaded.config.mqtt.url.is_some(),
                    Target::Log | Target::Cli => true,
                };
                if !configured {
                    eprintln!(
                        "warning: {} is not configured: reports for {t} wait in the outbox until it is",
                        t.channel()
                    );
                }
            }
            println!("  schedule: {}", job.schedule.describe(tz.tz()));
            println!("  next run: {}", when(job.state.next_run, &tz));
        }
        CronCommand::List => {
            let jobs = store.list()?;
            let corrupt = store.corrupt_notice();
            if let Some(notice) = &corrupt {
                println!("job store: {notice}");
            }
            if jobs.is_empty() && corrupt.is_none() {
                println!("no jobs. Add one: bramble cron add NAME --every 1h --remind \"stretch\"");
            }
            for j in jobs {
                let state = if j.state.done {
                    "done".to_string()
                } else if !j.enabled {
                    "disabled".to_string()
                } else {
                    format!("next {}", when(j.state.next_run, &tz))
                };
                let last = j.state.last_status.map(|s| format!(", last {s}")).unwrap_or_default();
                println!(
                    "{:<8}  {:<20}  {:<7}  {:<34}  {state}{last}",
                    j.id,
                    j.name,
                    kind_name(&j.kind),
                    j.schedule.describe(tz.tz())
                );
            }
        }
        CronCommand::Show { id } => {
            let j = store.get(&id)?;
            println!("{} ({})", j.name, j.id);
            println!("  kind:      {}", kind_name(&j.kind));
            match &j.kind {
                JobKind::Message { text } | JobKind::Remind { text } => println!("  text:      {text}"),
                JobKind::Exec { command } => println!("  command:   {command}"),
            }
            println!("  schedule:  {}", j.schedule.describe(tz.tz()));
            println!("  catch-up:  {}", j.catch_up);
            let targets: Vec<String> = j.report_target_names();
            println!("  deliver:   {}", targets.join(", "));
            println!("  enabled:   {}{}", j.enabled, if j.state.done { " (done)" } else { "" });
            println!("  next run:  {}", when(j.state.next_run, &tz));
            if let Some(e) = &j.state.last_error {
                println!("  last error: {e}");
            }
            for r in &j.state.history {
                println!("  {}  {:<7}  {}", when(Some(r.started), &tz), r.status.to_string(), r.summary);
            }
        }
        CronCommand::Remove { id } => {
            let j = store.remove(&id)?;
            println!("removed job {} ({})", j.name, j.id);
        }
        CronCommand::Enable { id } => {
            let j = store.set_enabled(&id, true)?;
            println!("enabled job {} ({})", j.name, j.id);
        }
        CronCommand::Disable { id } => {
            let j = store.set_enabled(&id, false)?;
            println!("disabled job {} ({})", j.name, j.id);
        }
        CronCommand::Run { id } => return cron_run(loaded, &store, &id).await,
    }
    Ok(ExitCode::SUCCESS)
}

/// Run a job in this process, record the run in the store, queue its report.
async fn cron_run(loaded: &Loaded, store: &crate::scheduler::JobStore, key: &str) -> anyhow::Result<ExitCode> {
    use crate::scheduler::{engine, RunStatus};
    let job = store.get(key)?;
    if let Some(since) = job.state.running_since {
        anyhow::bail!(
            "job {} is running right now (since {}) in the daemon; try again when it has finished",
            job.name,
            when(Some(since), &loaded.config.timezone())
        );
    }
    let run = QueuedAgent::new(loaded);
    let abort = run.cancel.clone();
    let runner = crate::work::jobs::JobRunner {
        runner: crate::work::Runner::new(run.agent.clone(), loaded.config.exec.clone(), loaded.paths.workspace.clone()),
        reports: crate::delivery::Reports::new(run.outbox.clone(), run.wake.clone()),
        abort: abort.clone(),
    };
    let started = jiff::Timestamp::now();
    let ctrl_c = abort.clone();
    let stop = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            ctrl_c.cancel();
        }
    });
    let outcome = runner.run_job(&job).await;
    stop.abort();
    drop(runner);
    let interrupted = abort.is_cancelled();
    run.finish().await;
    if interrupted {
        // Ctrl-C: nothing recorded, nothing reported; the job keeps its schedule.
        eprintln!("(stopped)");
        return Ok(ExitCode::from(130));
    }
    let tz = loaded.config.timezone();
    store.update(|jobs| {
        if let Some(i) = crate::scheduler::store::find(jobs, &job.id) {
            let summary = crate::scheduler::job::truncate(&outcome.summary, 200);
            let err = outcome.error.as_deref();
            engine::mark_finished(
                &mut jobs[i],
                started,
                started,
                jiff::Timestamp::now(),
                outcome.status,
                &summary,
                err,
                None,
                true,
                tz.tz(),
            );
        }
        Ok(())
    })?;
    let targets: Vec<String> = job.report_target_names();
    match outcome.status {
        RunStatus::Ok => {
            println!("{}\n\n(report queued for {}; the daemon delivers it)", outcome.summary, targets.join(", "));
            Ok(ExitCode::SUCCESS)
        }
        _ => {
            eprintln!("bramble: job {} failed: {}", job.name, outcome.error.unwrap_or(outcome.summary));
            Ok(ExitCode::FAILURE)
        }
    }
}

fn kind_name(k: &crate::scheduler::JobKind) -> &'static str {
    match k {
        crate::scheduler::JobKind::Message { .. } => "message",
        crate::scheduler::JobKind::Remind { .. } => "remind",
        crate::scheduler::JobKind::Exec { .. } => "exec",
    }
}

/// A time in the configured zone, or `-`.
fn when(t: Option<jiff::Timestamp>, tz: &config::TzName) -> String {
    crate::scheduler::schedule::local_time(t, tz.tz())
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
    println!(
        "workspace:  {}{}",
        loaded.paths.workspace.display(),
        if loaded.paths.workspace.is_dir() { "" } else { " (missing: run `bramble init`)" }
    );
    println!("state:      {}", loaded.paths.state_dir.display());
    // The tool list of the agent this config builds (the daemon builds the same one).
    let (outbound, _) = tokio::sync::mpsc::channel(1);
    // Quietly: what it would warn about (no key) has its own line above.
    let agent = tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), || {
        Agent::from_config(loaded, outbound, None)
    });
    let tools = agent.tools().names().join(", ");
    println!("tools:      {tools}");
    println!(
        "exec:       {}",
        if c.exec.enabled {
            format!("timeout {}, network {}", c.exec.timeout, yes_no(c.exec.network))
        } else {
            "off".into()
        }
    );
    if c.exec.enabled {
        println!("sandbox:    {}", crate::sandbox::layers_summary(&c.exec));
    }
    println!("telegram:   {}", telegram_summary(&c.telegram, &loaded.paths.state_dir));
    println!("mqtt:       {}", crate::channels::mqtt::status_line(&c.mqtt));
    let sessions = crate::agent::session::SessionStore::new(&loaded.paths.state_dir).keys();
    println!("sessions:   {}", sessions.len());
    let today = crate::agent::usage::UsageLedger::new(&loaded.paths.state_dir, c.timezone()).today();
    println!(
        "tokens:     {} today{}",
        today.total(),
        match c.agent.daily_token_budget {
            0 => String::new(),
            b => format!(" (budget {b})"),
        }
    );
    let (skills, skill_errors) = crate::agent::skills::load(&loaded.paths.workspace);
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
    let synced = crate::scheduler::clock_synchronized();
    println!(
        "clock:      {}",
        if synced {
            "synchronised".to_string()
        } else {
            format!(
                "not reported as synchronised (cron and at jobs wait up to {} after start)",
                c.daemon.clock_sync_wait
            )
        }
    );
    let hb_tasks = crate::scheduler::heartbeat::read_file(&loaded.paths.workspace)
        .map(|t| crate::scheduler::heartbeat::active_tasks(&t).len())
        .unwrap_or(0);
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
    let jobs_store = crate::scheduler::JobStore::open(&loaded.paths.state_dir);
    match jobs_store.list() {
        Ok(jobs) => {
            println!("jobs:       {}", jobs.len());
            if let Some(notice) = jobs_store.corrupt_notice() {
                println!("  job store: {notice}");
            }
            for j in jobs.iter().filter(|j| j.enabled && !j.state.done) {
                println!("  {:<20} next {}", j.name, when(j.state.next_run, &tz));
            }
        }
        Err(e) => println!("jobs:       error: {e}"),
    }
    let outbox = crate::delivery::outbox::Outbox::new(&loaded.paths.state_dir);
    match outbox.pending() {
        Ok(p) if p.is_empty() => println!("outbox:     nothing undelivered"),
        Ok(p) => {
            println!("outbox:     {} undelivered", p.len());
            for e in p.iter().take(5) {
                let err = e.last_error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default();
                println!("  {} from {}, {} attempts{err}", e.target, e.source, e.attempts);
            }
        }
        Err(e) => println!("outbox:     error: {e}"),
    }
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
