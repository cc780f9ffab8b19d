//! The daemon (`bramble run`): wires the scheduler, the heartbeat, the agent,
//! the channels and the outbox together, and owns their lifecycle.
//!
//! Lifecycle: load config → build every part ([`assemble::daemon`]) and start
//! each loop as a supervised service sharing one [`Shutdown`] → run until
//! SIGINT/SIGTERM (stop), SIGHUP (reload: stop gracefully, load the config
//! again, start again; a config with errors is reported and the running one
//! kept) or a service whose end stops the daemon (an error exit, below).
//! Turns in flight get [`SHUTDOWN_GRACE`] to finish; state is written as it
//! changes, so there is nothing left to flush.
//!
//! Without a config file the daemon still runs with defaults and says what is
//! not configured: no provider means LLM jobs fail with that reason, while
//! reminders and exec jobs still run.
//!
//! ## Services and supervision
//!
//! [`assemble::daemon`] builds every part once; [`start`] hands each
//! long-running loop to a [`Supervisor`] as a named [`Service`] (a struct with
//! `async fn run(self, Shutdown)`). Only this module and `util::tasks` spawn
//! long-running tasks (`src/layers.rs` checks it). [`Shutdown`] has two
//! phases: *stop* (take no new work) and, after [`SHUTDOWN_GRACE`] for turns
//! in flight, *abort* (cancel what still runs).
//!
//! A task that ends while the daemon is not stopping is logged at error with
//! its name, then, by its policy ([`crate::util::tasks::Policy`]):
//! **restart** (made again after a backoff of 1 s doubling to 5 min), or
//! **exit** (the daemon stops, exit status 1, and systemd's `Restart=` starts
//! it afresh), or **ends** (ending is what it does; a panic still exits).
//!
//! | task | policy | why |
//! |---|---|---|
//! | telegram poller | ends | it ends by itself only when Telegram refuses the token, and says so; a restart cannot help until the config changes, and an exit would keep the whole daemon down (a refused token is fatal at start) |
//! | email | exit | owns its inbound sender and the digest wake-up; it reconnects by itself and ends only when stopped |
//! | matrix poller | ends | the same for a refused Matrix login |
//! | signal reader | exit | owns its inbound sender; it reconnects to signal-cli by itself and ends only when stopped |
//! | feishu connection | exit | owns its inbound sender; it reconnects by itself and ends only when stopped |
//! | discord gateway | ends | the same for a refused Discord token or intents (Discord bans bots that keep trying) |
//! | outbound pump | exit | owns the bus's outbound end: without it answers would pile up unsaved |
//! | outbox sender | restart | holds only handles; what to deliver is in the durable outbox |
//! | bus server | exit | owns the bus's inbound end |
//! | announcements | exit | owns the sub-agents' announcement queue (taken once) |
//! | unanswered messages | ends | one pass at start |
//! | mqtt triggers, ha triggers | exit | each owns its fire queue |
//! | mqtt connection | exit | owns the router (inbound queue, trigger queue) |
//! | mqtt state | restart | recomputes the retained state from the state files |
//! | ha events | exit | owns the trigger queue's sending end |
//! | control socket | exit | owns the bound socket |
//! | webhooks | restart | binds its address anew (a busy port is tried again with backoff); the calls queued when it ended were answered `202` and are lost with it |
//! | ntfy subscriber | restart | reconnects by itself; its position is in `ntfy-since.json` |
//! | scheduler | exit | owns the run-now queue and the runs in flight; a fresh start re-reads `jobs.json` |
//! | heartbeat | restart | anchored on `heartbeat.json`, so a new loop keeps the interval |
//! | dead-man | restart | the open alerts are in `alerts.json` |
//! | state watcher | restart | a new inotify watch; without one it sets polling and waits |
//! | systemd watchdog | restart | stateless (only spawned when systemd asks for pings) |
//! | mcp servers | exit | starting the servers' supervisors twice would double their connections |
//! | start-up pages | restart | releasing the pages again is harmless |

pub mod assemble;
mod chats;
pub mod control;
pub mod systemd;
pub mod watch;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::agent::{Agent, InFlight};
use crate::delivery::{Channels, Reports};
use crate::scheduler::heartbeat;
use crate::util::shutdown::Shutdown;
use crate::util::tasks::{Service, Supervisor};

/// How long running turns may take to finish on shutdown or reload.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Why the daemon stopped one generation of its components.
#[derive(Debug)]
enum Stop {
    Exit,
    Reload,
    /// A task whose end stops the daemon ended (an error exit: systemd restarts it).
    Failed(crate::util::tasks::ServiceFailed),
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
    // The same for a Matrix access token.
    #[cfg(feature = "matrix")]
    crate::channels::matrix::check_login(&first.config.matrix).await?;
    // And for a Discord bot token.
    #[cfg(feature = "discord")]
    crate::channels::discord::check_login(&first.config.discord).await?;
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
        let mut running = running;
        let stop = tokio::select! {
            _ = term.recv() => Stop::Exit,
            _ = int.recv() => Stop::Exit,
            _ = hup.recv() => Stop::Reload,
            failed = running.tasks.watch() => Stop::Failed(failed),
        };
        match &stop {
            Stop::Exit | Stop::Failed(_) => {
                tracing::info!("stopping");
                systemd::stopping();
            }
            Stop::Reload => {
                tracing::info!("SIGHUP: reloading the config and jobs");
                systemd::reloading();
            }
        }
        running.stop().await;
        match stop {
            Stop::Exit => return Ok(()),
            Stop::Failed(failed) => return Err(failed.into()),
            Stop::Reload => {}
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
    shutdown: Shutdown,
    inflight: InFlight,
    tasks: Supervisor,
    /// Where channels put inbound messages; held so the agent's queue stays open.
    _inbound: mpsc::Sender<crate::bus::InboundMessage>,
}

impl Running {
    async fn stop(self) {
        self.shutdown.stop();
        if !self.inflight.drained(SHUTDOWN_GRACE).await {
            tracing::warn!(
                running = self.inflight.count(),
                "work still running after {SHUTDOWN_GRACE:?}; cancelling it"
            );
        }
        // Turns cut off now keep their user's message pending (see agent::pending).
        self.inflight.begin_shutdown();
        self.shutdown.abort();
        self.tasks.join(Duration::from_secs(5)).await;
    }
}

/// Start every component for this config: each long-running loop a named
/// service under the supervisor, with its policy (the table above).
fn start(loaded: &crate::config::Loaded, control: Option<control::Handler>) -> anyhow::Result<Running> {
    make_dirs(loaded)?;
    let mut d = assemble::daemon(loaded)?;
    // Read once, here: the scheduler starts from these, and the start-up line counts them.
    let jobs = d.scheduler.scheduler.preload().unwrap_or_else(|e| {
        tracing::error!("{e}");
        0
    });
    let mut tasks = Supervisor::new(d.shutdown.clone());
    if let Some(poller) = d.telegram {
        tasks.spawn(Service::ends("telegram poller", |sd| poller.run(sd)));
    }
    d.chats.spawn(&mut tasks);
    tasks.spawn(Service::new("outbound pump", |sd| d.pump.run(sd)));
    tasks.spawn(Service::restarting("outbox sender", move |sd| d.outbox.clone().run(sd)));
    tasks.spawn(Service::new("bus server", |sd| d.bus.run(sd)));
    if let Some(announcements) = d.announcements {
        tasks.spawn(Service::new("announcements", |sd| announcements.run(sd)));
    }
    tasks.spawn(Service::ends("unanswered messages", |sd| d.unanswered.run(sd)));
    #[cfg(feature = "fleet")]
    if let Some(fleet) = d.fleet {
        tasks.spawn(Service::new("fleet", |sd| fleet.service.run(sd)));
    }
    if let Some(mqtt) = d.mqtt {
        if let Some(triggers) = mqtt.triggers {
            tasks.spawn(Service::new("mqtt triggers", |sd| triggers.run(sd)));
        }
        tasks.spawn(Service::new("mqtt connection", |sd| mqtt.connection.run(sd)));
        tasks.spawn(Service::restarting("mqtt state", move |sd| mqtt.state.clone().run(sd)));
    }
    #[cfg(feature = "homeassistant")]
    if let Some(ha) = d.ha {
        tasks.spawn(Service::new("ha triggers", |sd| ha.triggers.run(sd)));
        tasks.spawn(Service::new("ha events", |sd| ha.connection.run(sd)));
    }
    #[cfg(feature = "webhook")]
    if let Some(webhook) = d.webhook {
        tasks.spawn(Service::restarting("webhooks", move |sd| webhook.clone().run(sd)));
    }
    #[cfg(feature = "ntfy")]
    if let Some(ntfy) = d.ntfy {
        tasks.spawn(Service::restarting("ntfy subscriber", move |sd| ntfy.clone().run(sd)));
    }
    if let Some(server) = control.and_then(|handler| control_server(loaded, handler, d.scheduler.scheduler.handle())) {
        tasks.spawn(Service::new("control socket", |sd| server.run(sd)));
    }
    tasks.spawn(Service::new("scheduler", |sd| d.scheduler.run(sd)));
    match d.heartbeat {
        Some(heartbeat) => tasks.spawn(Service::restarting("heartbeat", move |sd| heartbeat.clone().run(sd))),
        None => tracing::info!("heartbeat disabled"),
    }
    tasks.spawn(Service::restarting("dead-man", move |sd| d.dead_man.clone().run(sd)));
    tasks.spawn(Service::restarting("state watcher", move |sd| d.watcher.clone().run(sd)));
    if let Some(watchdog) = systemd::Watchdog::enabled() {
        tasks.spawn(Service::restarting("systemd watchdog", move |sd| watchdog.run(sd)));
    }
    // MCP servers connect now; they stop (stdio children killed) when work in flight is cancelled.
    tasks.spawn(Service::new("mcp servers", |sd| d.mcp.run(sd)));
    let summary = log_startup(loaded, &d.agent, &d.channels, jobs);
    systemd::ready(&summary);
    // After READY: this probes the kernel with one real jail (a few ms).
    if loaded.config.exec.enabled {
        d.sandbox.log_layers(&loaded.config.exec);
        d.sandbox.warm_ahead();
    }
    tasks.spawn(Service::restarting("start-up pages", |sd| ReleaseStartupPages.run(sd)));
    let inflight = d.agent.inflight().clone();
    Ok(Running { shutdown: d.shutdown, inflight, tasks, _inbound: d.inbound })
}

/// Messages a crash or power cut left unanswered: told to the user (or run
/// again, as `[agent] unanswered` says), once at start, until the abort.
pub struct Unanswered {
    pub agent: Arc<Agent>,
    pub reports: Reports,
}

impl Unanswered {
    pub async fn run(self, shutdown: Shutdown) {
        let (outbox, wake) = (self.reports.outbox(), self.reports.wake());
        let notify = |target, text: String| match outbox.enqueue(target, &text, "agent") {
            Ok(_) => wake.notify_one(),
            Err(e) => tracing::error!("a notice about an unanswered message could not be queued: {e}"),
        };
        self.agent.resolve_unanswered(false, shutdown.abort_token(), notify).await
    }
}

/// The MCP servers' connections: made at start, closed (stdio children
/// killed) when work in flight is cancelled, at the abort.
pub struct McpSources {
    pub agent: Arc<Agent>,
}

impl McpSources {
    pub async fn run(self, shutdown: Shutdown) {
        self.agent.tools().run_sources(shutdown.abort_token().clone()).await
    }
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

/// Once start-up is over, the code it ran need not stay resident (idle RSS):
/// after [`RELEASE_AFTER`], release it once, then wait for the stop.
pub struct ReleaseStartupPages;

impl ReleaseStartupPages {
    pub async fn run(self, shutdown: Shutdown) {
        tokio::select! {
            () = crate::util::timer::sleep(RELEASE_AFTER) => {}
            () = shutdown.stopped() => return,
        }
        // Here, not on the blocking pool: one read of our own smaps (procfs: the
        // kernel walks our page tables, nothing waits on a disk) and a dozen
        // madvise calls, 1.4 ms under strace, once. The task then waits for the
        // stop: what runs after the release is what the idle loops run anyway,
        // not a hand-over and a task's completion, whose pages would be faulted
        // straight back in.
        let kib = crate::util::sys::release_code_pages();
        tracing::debug!(kib, "released the start-up pages of the binary and its libraries");
        shutdown.stopped().await;
    }
}

/// The control socket ([`control`]) for this generation, bound; without it the daemon runs on.
fn control_server(
    loaded: &crate::config::Loaded,
    handler: control::Handler,
    scheduler: crate::scheduler::SchedulerHandle,
) -> Option<control::ControlServer> {
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
            Some(control::ControlServer { listener, shared })
        }
        Err(e) if shared => {
            tracing::warn!("no control socket ({e}): members of the service's group cannot use `bramble cron`");
            None
        }
        Err(e) => {
            tracing::debug!("no control socket: {e}");
            None
        }
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
        heartbeat = %if c.heartbeat.enabled { format!("every {} ({tasks} active task{})", c.heartbeat.every, if tasks == 1 { "" } else { "s" }) } else { "off".into() },
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
