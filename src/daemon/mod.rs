//! The daemon (`bramble run`): wires the scheduler, the heartbeat, the agent,
//! the channels and the outbox together, and owns their lifecycle.
//!
//! Lifecycle: load config → start every component with a child of one
//! cancellation token → run until SIGINT/SIGTERM (stop) or SIGHUP (reload:
//! stop gracefully, load the config again, start again; a config with errors
//! is reported and the running one kept). Turns in flight get
//! [`SHUTDOWN_GRACE`] to finish; state is written as it changes, so there is
//! nothing left to flush.
//!
//! Without a config file the daemon still runs with defaults and says what is
//! not configured: no provider means LLM jobs fail with that reason, while
//! reminders and exec jobs still run.

pub mod assemble;
pub mod control;
pub mod systemd;
pub mod watch;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use crate::agent::{Agent, InFlight};
use crate::delivery::dispatcher::{pump_outbound, run_outbox};
use crate::delivery::{Channels, Reports};
use crate::scheduler::heartbeat::{self, StateFile};
use crate::scheduler::{Job, JobStore};
use crate::work::alerts::{self, Alerts, Watched};
use crate::work::heartbeat_loop::Heartbeat;
use crate::work::jobs::{JobRunner, ObservedRunner, RunObserver};
use crate::work::Runner;

/// How long running turns may take to finish on shutdown or reload.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Why the daemon stopped one generation of its components.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Exit,
    Reload,
}

/// `bramble run`: run until SIGINT/SIGTERM; reload on SIGHUP. `control`
/// answers `bramble cron …` on the control socket ([`control`]; `None`: no socket).
pub async fn run(
    explicit_config: Option<&std::path::Path>,
    first: crate::config::Loaded,
    control: Option<control::Handler>,
) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let _lock = lock_state_dir(&first.paths.state_dir)?;
    // A refused Telegram token is fatal at start; an unreachable Telegram is not.
    crate::channels::telegram::check_token(&first.config.telegram).await?;
    let mut loaded = first;
    let mut previous: Option<crate::config::Loaded> = None;
    loop {
        let running = match (start(&loaded, control.clone()), previous.take()) {
            (Ok(r), _) => r,
            (Err(e), Some(old)) => {
                tracing::error!("cannot start with the new config ({e:#}); going on with the old one");
                loaded = old;
                start(&loaded, control.clone())?
            }
            (Err(e), None) => return Err(e),
        };
        let stop = tokio::select! {
            _ = term.recv() => Stop::Exit,
            _ = int.recv() => Stop::Exit,
            _ = hup.recv() => Stop::Reload,
        };
        match stop {
            Stop::Exit => {
                tracing::info!("stopping");
                systemd::stopping();
            }
            Stop::Reload => {
                tracing::info!("SIGHUP: reloading the config and jobs");
                systemd::reloading();
            }
        }
        running.stop().await;
        if stop == Stop::Exit {
            return Ok(());
        }
        match crate::config::load(explicit_config) {
            Ok(new) if new.paths.state_dir != loaded.paths.state_dir => tracing::error!(
                "the new config moves the state directory to {}: that needs a restart, keeping the old config",
                new.paths.state_dir.display()
            ),
            Ok(new) => {
                crate::logging::set_level(new.config.daemon.log_level.as_deref());
                previous = Some(std::mem::replace(&mut loaded, new));
            }
            Err(e) => tracing::error!("the new config has an error, keeping the old one: {e}"),
        }
    }
}

/// Take `<state>/daemon.lock` for this process: two daemons on one state
/// directory would run every job twice.
fn lock_state_dir(state: &std::path::Path) -> anyhow::Result<nix::fcntl::Flock<std::fs::File>> {
    use anyhow::Context as _;
    crate::util::fs::create_private_dir(state)
        .with_context(|| format!("cannot create the state directory {}", state.display()))?;
    if crate::util::fs::make_private(state).with_context(|| format!("cannot make {} private", state.display()))? {
        tracing::warn!(state = %state.display(), "the state directory was readable by other users; it is 0700 now");
    }
    let path = state.join("daemon.lock");
    let file = crate::util::fs::open_lock_file(&path).with_context(|| format!("cannot open {}", path.display()))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
        if e == nix::errno::Errno::EWOULDBLOCK {
            anyhow::anyhow!(
                "another bramble daemon is already running with the state directory {} (is the systemd service running?)",
                state.display()
            )
        } else {
            anyhow::anyhow!("cannot lock {}: {e}", path.display())
        }
    })
}

/// Whether a daemon holds the state directory (for CLI commands that would race it).
pub fn daemon_running(state: &std::path::Path) -> bool {
    let Ok(file) = std::fs::OpenOptions::new().write(true).open(state.join("daemon.lock")) else { return false };
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).is_err()
}

/// One generation of running components.
struct Running {
    /// Stops components from starting new work.
    stop: CancellationToken,
    /// Cancels work in flight (after the grace period).
    abort: CancellationToken,
    inflight: InFlight,
    tasks: tokio::task::JoinSet<()>,
    /// Where channels put inbound messages; held so the agent's queue stays open.
    _inbound: mpsc::Sender<crate::bus::InboundMessage>,
}

impl Running {
    async fn stop(mut self) {
        self.stop.cancel();
        if !self.inflight.drained(SHUTDOWN_GRACE).await {
            tracing::warn!(
                running = self.inflight.count(),
                "work still running after {SHUTDOWN_GRACE:?}; cancelling it"
            );
        }
        // Turns cut off now keep their user's message pending (see agent::pending).
        self.inflight.begin_shutdown();
        self.abort.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), async { while self.tasks.join_next().await.is_some() {} })
            .await;
        self.tasks.abort_all();
    }
}

/// Start every component for this config.
fn start(loaded: &crate::config::Loaded, control: Option<control::Handler>) -> anyhow::Result<Running> {
    let c = &loaded.config;
    let state = &loaded.paths.state_dir;
    make_dirs(loaded)?;
    let stop = CancellationToken::new();
    let abort = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();

    let assemble::Daemon { agent, bus, channels, telegram, mqtt, ha, mut scheduler, outbox, wake, sandbox } =
        assemble::daemon(loaded)?;
    // Read once, here: the scheduler starts from these, and the start-up line counts them.
    let jobs = scheduler.preload().unwrap_or_else(|e| {
        tracing::error!("{e}");
        0
    });
    let reports = Reports::new(outbox.clone(), wake.clone());
    // Turns (chat, jobs, heartbeat), reminders and exec jobs: what shutdown waits for.
    let inflight = agent.inflight().clone();
    if let Some(telegram) = telegram {
        tasks.spawn(telegram.poll(bus.inbound_tx.clone(), agent.activity(), stop.clone()));
    }

    let poll = Arc::new(std::sync::atomic::AtomicBool::new(false));
    tasks.spawn(pump_outbound(bus.outbound_rx, outbox.clone(), wake.clone(), abort.clone()));
    tasks.spawn(run_outbox(outbox.clone(), channels.clone(), wake.clone(), poll.clone(), abort.clone()));
    tasks.spawn(agent.clone().serve_until(bus.inbound_rx, bus.outbound_tx.clone(), stop.clone(), abort.clone()));
    // Sub-agent reports become turns of the sessions that spawned them.
    tasks.spawn(agent.clone().run_announcements(bus.outbound_tx.clone(), abort.clone()));
    tasks.spawn(resolve_unanswered(agent.clone(), outbox.clone(), wake.clone(), abort.clone()));

    let reload = scheduler.reload_handle();
    let work = Runner::new(agent.clone(), c.exec.clone(), loaded.paths.workspace.clone(), sandbox.clone());
    let alerts = Alerts::new(state, &c.alerts, reports.clone());
    let runner = JobRunner {
        runner: work.clone(),
        reports: reports.clone(),
        abort: abort.clone(),
        alerts: alerts.clone(),
        standing: assemble::standing(loaded),
    };
    let deps = || crate::work::firing::TriggerDeps { runner: work.clone(), reports: reports.clone() };
    let mqtt_jobs = Arc::new(Notify::new());
    let mqtt_heartbeat = Arc::new(Notify::new());
    let mqtt_alerts = Arc::new(Notify::new());
    let mut observers: Vec<RunObserver> = Vec::new();
    if let Some(link) = mqtt.clone() {
        let wiring = crate::channels::mqtt::Wiring {
            inbound: bus.inbound_tx.clone(),
            scheduler: scheduler.handle(),
            jobs: JobStore::open(state),
            state_dir: state.clone(),
            jobs_changed: mqtt_jobs.clone(),
            heartbeat_changed: mqtt_heartbeat.clone(),
            alerts_changed: mqtt_alerts.clone(),
            triggers: Some(deps()),
            outbox: outbox.clone(),
            wake: wake.clone(),
        };
        observers.extend(spawn_mqtt(link, &c.mqtt, wiring, &mut tasks, &stop, &abort));
    }
    if let Some(ha) = ha {
        use crate::channels::homeassistant::events as ha_events;
        ha_events::spawn(&ha, &c.homeassistant, state, deps(), &mut tasks, stop.clone(), abort.clone());
    }
    // The dead-man watches the scheduler's and the heartbeat's loops.
    let mut watched = vec![scheduler_watched(scheduler.pulse())];
    if let Some(handler) = control {
        spawn_control(loaded, handler, scheduler.handle(), &mut tasks, stop.clone());
    }
    tasks.spawn(scheduler.run(ObservedRunner { runner, observers }, stop.clone()));

    let heartbeat = heartbeat_of(loaded, reports);
    if c.heartbeat.enabled {
        watched.push(heartbeat_watched(heartbeat.pulse.clone(), c.heartbeat.every.get()));
    }
    tasks.spawn(heartbeat.run(agent.clone(), stop.clone(), abort.clone()));
    tasks.spawn(alerts::dead_man(alerts, watched, outbox.clone(), stop.clone()));

    let watched = vec![
        ("jobs.json", reload),
        ("outbox.jsonl", wake),
        ("jobs.json", mqtt_jobs),
        ("heartbeat.json", mqtt_heartbeat),
        (alerts::ALERTS_FILE, mqtt_alerts),
    ];
    tasks.spawn(watch_state(state.clone(), watched, poll.clone(), stop.clone()));

    tasks.spawn(systemd::watchdog(abort.clone()));
    // MCP servers connect now; they stop (stdio children killed) when work in flight is cancelled.
    tasks.spawn(run_mcp(agent.clone(), abort.clone()));
    let summary = log_startup(loaded, &agent, &channels, jobs);
    systemd::ready(&summary);
    // After READY: this probes the kernel with one real jail (a few ms).
    if c.exec.enabled {
        sandbox.log_layers(&c.exec);
        sandbox.warm_ahead();
    }
    tasks.spawn(release_startup_pages(stop.clone()));
    Ok(Running { stop, abort, inflight, tasks, _inbound: bus.inbound_tx })
}

/// The heartbeat's loop for this config, reporting to `reports`.
fn heartbeat_of(loaded: &crate::config::Loaded, reports: Reports) -> Heartbeat {
    Heartbeat {
        config: loaded.config.heartbeat.clone(),
        workspace: loaded.paths.workspace.clone(),
        tz: loaded.config.timezone(),
        state: StateFile::new(&loaded.paths.state_dir),
        reports,
        pulse: crate::util::pulse::Pulse::new(),
    }
}

/// Connect the MCP servers; they stop (stdio children killed) when `stop` (work in flight) is cancelled.
async fn run_mcp(agent: Arc<Agent>, stop: CancellationToken) {
    agent.tools().run_sources(stop).await
}

/// The state directory (private) and the workspace (made empty if missing).
fn make_dirs(loaded: &crate::config::Loaded) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let state = &loaded.paths.state_dir;
    crate::util::fs::create_private_dir(state)
        .with_context(|| format!("cannot create the state directory {}", state.display()))?;
    // Commands run in the workspace; an empty one is better than failing every exec job.
    let ws = &loaded.paths.workspace;
    if !ws.is_dir() {
        std::fs::create_dir_all(ws).with_context(|| format!("cannot create the workspace {}", ws.display()))?;
        tracing::warn!(workspace = %ws.display(), "created an empty workspace: run `bramble init` for the templates");
    }
    Ok(())
}

/// Messages a crash or power cut left unanswered: told to the user (or run again).
async fn resolve_unanswered(
    agent: Arc<Agent>,
    outbox: crate::delivery::outbox::Outbox,
    wake: Arc<Notify>,
    cancel: CancellationToken,
) {
    agent
        .resolve_unanswered(false, &cancel, |target, text| match outbox.enqueue(target, &text, "agent") {
            Ok(_) => wake.notify_one(),
            Err(e) => tracing::error!("a notice about an unanswered message could not be queued: {e}"),
        })
        .await
}

/// Start MQTT on `link`; its observer publishes each job's run record (`None`: MQTT is off).
fn spawn_mqtt(
    link: Arc<crate::channels::mqtt::Link>,
    cfg: &crate::config::MqttConfig,
    wiring: crate::channels::mqtt::Wiring,
    tasks: &mut tokio::task::JoinSet<()>,
    stop: &CancellationToken,
    abort: &CancellationToken,
) -> Option<RunObserver> {
    match crate::channels::mqtt::spawn(link.clone(), cfg, wiring, tasks, stop.clone(), abort.clone()) {
        Ok(()) => Some(Arc::new(move |job: &Job, record: &serde_json::Value| {
            crate::channels::mqtt::publish_run_record(&link, record, &job.name)
        })),
        Err(e) => {
            tracing::error!("MQTT is off: {e}");
            None
        }
    }
}

/// The dead-man's watch on the scheduler's loop.
fn scheduler_watched(pulse: crate::util::pulse::Pulse) -> Watched {
    Watched {
        key: alerts::SCHEDULER_KEY,
        pulse,
        limit: alerts::SCHEDULER_STALL,
        alert: |silent| {
            format!(
                "Alert: the scheduler has not completed a pass for {}: jobs may not run. (The systemd watchdog \
                 restarts a daemon that hangs as a whole; this one still runs.) Try `sudo systemctl restart bramble`.",
                crate::config::Dur(silent)
            )
        },
        recovered: "Recovered: the scheduler runs again.",
    }
}

/// The dead-man's watch on the heartbeat's loop, which ticks `every`.
fn heartbeat_watched(pulse: crate::util::pulse::Pulse, every: Duration) -> Watched {
    Watched {
        key: alerts::HEARTBEAT_KEY,
        pulse,
        limit: every.max(Duration::from_secs(10)) * 2,
        alert: |silent| {
            format!(
                "Alert: the heartbeat has not ticked for {} (twice its interval): HEARTBEAT.md is not being looked at.",
                crate::config::Dur(silent)
            )
        },
        recovered: "Recovered: the heartbeat ticks again.",
    }
}

/// Wake each of `watched`'s parts when its file in `dir` changes; without a
/// watch, the outbox falls back to polling (`poll`).
async fn watch_state(
    dir: std::path::PathBuf,
    watched: Vec<(&'static str, Arc<Notify>)>,
    poll: Arc<std::sync::atomic::AtomicBool>,
    stop: CancellationToken,
) {
    if let Err(e) = watch::watch_state_dir(dir, watched, stop).await {
        tracing::warn!("cannot watch the state directory ({e}); CLI edits are picked up within a minute");
        poll.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Once start-up is over, the code it ran need not stay resident (idle RSS).
async fn release_startup_pages(settle: CancellationToken) {
    tokio::select! {
        () = crate::util::timer::sleep(RELEASE_AFTER) => {}
        _ = settle.cancelled() => return,
    }
    // Here, not on the blocking pool: one read of our own smaps (procfs: the
    // kernel walks our page tables, nothing waits on a disk) and a dozen
    // madvise calls, 1.4 ms under strace, once. The task then waits for the
    // stop: what runs after the release is what the idle loops run anyway,
    // not a hand-over and a task's completion, whose pages would be faulted
    // straight back in.
    let kib = crate::util::sys::release_code_pages();
    tracing::debug!(kib, "released the start-up pages of the binary and its libraries");
    settle.cancelled().await;
}

/// Open the control socket ([`control`]) for this generation; without it the daemon runs on.
fn spawn_control(
    loaded: &crate::config::Loaded,
    handler: control::Handler,
    scheduler: crate::scheduler::SchedulerHandle,
    tasks: &mut tokio::task::JoinSet<()>,
    stop: CancellationToken,
) {
    let (path, shared) = control::socket_path(loaded);
    match control::bind(&path, shared) {
        Ok(listener) => {
            if shared {
                let members = loaded.config.service.members.as_str();
                tracing::info!(socket = %path.display(), members, "control socket: `bramble cron` for the service's group");
            } else {
                tracing::debug!(socket = %path.display(), "control socket");
            }
            let audit = crate::tools::audit::Audit::new(&loaded.paths.state_dir, crate::logging::stderr_is_journal());
            let shared = control::Shared { loaded: Arc::new(loaded.clone()), scheduler, handler, audit };
            tasks.spawn(control::serve(listener, shared, stop));
        }
        Err(e) if shared => {
            tracing::warn!("no control socket ({e}): members of the service's group cannot use `bramble cron`")
        }
        Err(e) => tracing::debug!("no control socket: {e}"),
    }
}

/// How long after start the binary's start-up pages are released
/// ([`crate::util::sys::release_code_pages`]): after READY, the first
/// polls, connections and the sandbox probe.
const RELEASE_AFTER: std::time::Duration = std::time::Duration::from_secs(20);

/// Log what runs and what is missing; returns a one-line status for systemd.
fn log_startup(loaded: &crate::config::Loaded, agent: &Agent, channels: &Channels, jobs: usize) -> String {
    let c = &loaded.config;
    match agent.provider_problem() {
        None => {
            tracing::info!(provider = c.provider().name(), model = %agent.model_label(c.model()), "provider ready");
            for line in agent.provider_health() {
                tracing::info!("provider {line}");
            }
        }
        Some(why) => {
            tracing::warn!("no LLM: {why}. Message jobs and the heartbeat will fail; reminders and exec jobs still run")
        }
    }
    for w in crate::config::security_warnings(loaded) {
        tracing::warn!("{w}");
    }
    let tasks = heartbeat::read_file(&loaded.paths.workspace).map(|t| heartbeat::active_tasks(&t).len()).unwrap_or(0);
    tracing::info!(
        config = %loaded.path.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "(none: defaults)".into()),
        workspace = %loaded.paths.workspace.display(),
        state = %loaded.paths.state_dir.display(),
        jobs,
        heartbeat = %if c.heartbeat.enabled { format!("every {} ({tasks} active tasks)", c.heartbeat.every) } else { "off".into() },
        channels = %channels.names().join(", "),
        "bramble {} running", env!("CARGO_PKG_VERSION")
    );
    format!(
        "running: {jobs} jobs, heartbeat {}, channels {}{}",
        if c.heartbeat.enabled { c.heartbeat.every.to_string() } else { "off".into() },
        channels.names().join(", "),
        if agent.provider_problem().is_some() { ", no LLM provider" } else { "" }
    )
}
