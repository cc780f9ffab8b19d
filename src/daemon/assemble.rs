//! The composition root: the one place where a loaded config becomes parts.
//!
//! `bramble run` ([`daemon`]), the terminal chat (`bramble agent`), the
//! one-off commands (`heartbeat`, `cron run`: [`queued`]) and `bramble status`
//! all build here, so what `status` lists is what the daemon runs, and a new
//! tool, channel or kind of work is wired in one file.
//!
//! Below this module nothing constructs a sibling: the agent is handed its
//! tools, the tools their publisher and job store, the channels a
//! [`SessionActivity`](crate::agent::SessionActivity) view of the agent. Each
//! part is complete when it is made; nothing is set on it afterwards. For the
//! daemon every part is made here once (one job store, one [`Reports`]), the
//! long-running loops included, as values with `run(self, Shutdown)`.
//! Building is pure: no task is spawned and no connection opened until the
//! caller starts the parts (`daemon::start`), but for [`queued`]'s outbox
//! pump, a one-off command's only task.

use std::sync::Arc;

use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use crate::agent::context::{ContextBuilder, ContextLimits};
use crate::agent::session::SessionStore;
use crate::agent::usage::UsageLedger;
use crate::agent::{memory, skills, subagent, Agent, AgentParts, AgentSettings, Announcements, InFlight, ServeBus};
use crate::bus::{Bus, InboundMessage, OutboundMessage};
#[cfg(feature = "homeassistant")]
use crate::channels::homeassistant::events::{self, HaEvents};
use crate::channels::mqtt::MqttServices;
use crate::channels::telegram::TelegramPoller;
use crate::config::Loaded;
use crate::delivery::dispatcher::{OutboundPump, OutboxSender};
use crate::delivery::outbox::Outbox;
use crate::delivery::{Channels, Publisher, Reports};
use crate::sandbox::Sandbox;
use crate::scheduler::heartbeat::StateFile;
use crate::scheduler::{JobStore, Scheduler, SchedulerHandle, SchedulerLoop};
use crate::tools::ToolRegistry;
use crate::util::shutdown::Shutdown;
use crate::work::alerts::{self, Alerts, DeadMan, Watched};
use crate::work::heartbeat_loop::{Heartbeat, HeartbeatLoop};
use crate::work::jobs::{JobRunner, ObservedRunner, RunObserver};
use crate::work::Runner;

use super::watch::StateWatcher;

/// What the agent is connected to besides its config.
pub struct AgentLinks {
    /// Where the `message` tool and sub-agents send.
    pub outbound: mpsc::Sender<OutboundMessage>,
    /// The connection `mqtt_publish` publishes through (the daemon's; `None` elsewhere).
    pub mqtt: Option<Arc<dyn Publisher>>,
    /// The daemon's scheduler, for `/run` (`None` outside the daemon).
    pub scheduler: Option<SchedulerHandle>,
    /// Telegram's status messages for chat turns (`None`: off, or outside the daemon).
    pub progress: Option<Arc<dyn crate::agent::ProgressSink>>,
    /// The daemon's Home Assistant client, shared with the `ha` channel
    /// (`None`: the agent makes its own from the config, if there is one).
    pub ha: Option<HaClient>,
    /// The daemon's job store (`None`: the agent opens the config's).
    pub jobs: Option<JobStore>,
}

impl AgentLinks {
    /// Links for an agent outside the daemon: it sends to `outbound` only.
    pub fn outside_daemon(outbound: mpsc::Sender<OutboundMessage>) -> AgentLinks {
        AgentLinks { outbound, mqtt: None, scheduler: None, progress: None, ha: None, jobs: None }
    }
}

/// The sandbox commands run in for this config ([`Sandbox::for_config`]): one
/// per root, shared by the exec tool, stdio MCP servers and the work runner.
pub fn sandbox(loaded: &Loaded) -> Arc<Sandbox> {
    Arc::new(Sandbox::for_config(loaded))
}

/// The agent as the configuration describes it: provider, tools (each with
/// what it needs), skills, context, sub-agents; commands run in `sandbox`.
pub fn agent(loaded: &Loaded, links: AgentLinks, sandbox: &Arc<Sandbox>) -> Agent {
    let c = &loaded.config;
    let ws = loaded.paths.workspace.clone();
    let state = &loaded.paths.state_dir;
    // One ledger: the agent counts into it, the chain reads per-provider budgets from it.
    let usage = UsageLedger::new(state, c.timezone());
    // The reason alone: a turn reports it as "no LLM provider is configured: <reason>",
    // the daemon's start-up line as "no LLM: <reason>".
    let provider = crate::provider::ProviderSlot::of(
        crate::provider::chain::Chain::from_config(c)
            .map(|chain| Arc::new(chain.with_meter(Arc::new(usage.clone()))) as Arc<dyn crate::provider::Provider>),
    );
    let jobs = links.jobs.unwrap_or_else(|| JobStore::open(state));
    // The context window (asked of the server at the first turn) and the profile it chooses.
    let window = Arc::new(crate::provider::window::WindowProbe::for_config(c));
    let mut tools =
        tools(loaded, &links.outbound, links.mqtt, links.ha, sandbox, jobs.clone()).with_window(window.clone());
    let (_, skill_errors) = skills::load(&ws);
    for e in &skill_errors {
        tracing::warn!("skill left out: {e}");
    }
    let limits =
        ContextLimits { per_file_chars: c.agent.bootstrap_max_chars, total_chars: c.agent.bootstrap_total_chars };
    let context = ContextBuilder::new(ws, c.timezone(), limits).with_window(window);
    let settings = settings(c);
    let inflight = InFlight::default();
    // Sub-agents get the tools registered so far (not `spawn` itself).
    let subagents = provider.ready().map(|p| {
        let sub = subagent::SubagentSettings {
            model: settings.model.clone(),
            max_tokens: settings.max_tokens,
            temperature: settings.temperature,
            max_iterations: c.agent.subagent_max_iterations,
            max_running: c.agent.max_subagents,
        };
        let hub = subagent::Hub::new(
            Arc::clone(p),
            &tools,
            context.clone(),
            sub,
            links.outbound,
            usage.clone(),
            inflight.shutdown_token().clone(),
        );
        tools.register(Arc::new(subagent::SpawnTool::new(Arc::clone(&hub))));
        hub
    });
    let mut parts = AgentParts::new(provider, tools, SessionStore::new(state), context, settings);
    parts.jobs = Some((jobs, c.timezone().tz().clone()));
    parts.exec = Some((c.exec.clone(), Arc::clone(sandbox)));
    parts.scheduler = links.scheduler;
    parts.progress = links.progress;
    parts.inflight = inflight;
    parts.subagents = subagents;
    parts.usage = Some(usage);
    parts.transcriber =
        crate::provider::transcribe::Transcriber::from_config(&c.transcription).map(|t| t.map(Arc::new));
    Agent::new(parts)
}

/// The tools an agent built from `loaded` is offered, before `spawn` (which
/// needs the provider): files, exec, web, message, MQTT, Home Assistant, cron,
/// memory search and the MCP servers' tools, under `[policy.*]` and audited.
fn tools(
    loaded: &Loaded,
    outbound: &mpsc::Sender<OutboundMessage>,
    mqtt: Option<Arc<dyn Publisher>>,
    ha: Option<HaClient>,
    sandbox: &Arc<Sandbox>,
    jobs: JobStore,
) -> ToolRegistry {
    let c = &loaded.config;
    let ws = loaded.paths.workspace.clone();
    let state = &loaded.paths.state_dir;
    let mut tools = ToolRegistry::new(c.agent.max_tool_result_chars)
        .with_policy(crate::tools::policy::ToolPolicy::from_config(&c.policy))
        // Under systemd the journal keeps the audit trail; elsewhere `<state>/audit.jsonl` does.
        .with_audit(crate::tools::audit::Audit::new(state, crate::logging::stderr_is_journal()));
    for tool in crate::tools::fs::fs_tools(&ws) {
        tools.register(tool);
    }
    if c.exec.enabled {
        tools.register(Arc::new(crate::tools::exec::ExecTool::new(c.exec.clone(), ws.clone(), Arc::clone(sandbox))));
    }
    if c.web.enabled {
        // One guarded client for both: the same SSRF guard, one set of CA certificates.
        let http = Arc::new(crate::tools::web::GuardedHttp::new(&c.web));
        tools.register(Arc::new(crate::tools::web::WebFetch::new(&c.web, Arc::clone(&http))));
        #[cfg(feature = "web-search")]
        if let Some(search) = crate::tools::search::WebSearch::new(&c.web, http) {
            tools.register(Arc::new(search));
        }
    }
    let telegram_chats = crate::policy::AllowedChats::new(&c.telegram.allow_from, state)
        .with_email(c.email.allow_from.iter().map(|a| a.0.clone()))
        .with_matrix(crate::policy::matrix::MatrixPolicy::new(&c.matrix.allow_from, &c.matrix.rooms, state))
        .with_signal(crate::policy::signal::SignalPolicy::new(&c.signal.allow_from, &c.signal.groups, state))
        .with_feishu(crate::policy::feishu::FeishuPolicy::new(&c.feishu.allow_from, &c.feishu.chats, state))
        .with_discord(crate::policy::discord::DiscordPolicy::new(c.discord.users(), c.discord.channel_ids(), state));
    // The topics bramble listens to: no tool delivers or publishes there.
    let mqtt_inputs = crate::channels::mqtt::Settings::from_config(&c.mqtt).ok().flatten().map(|s| s.inputs);
    tools.register(Arc::new(
        crate::tools::message::MessageTool::new(outbound.clone(), c.mqtt.publish_allow.clone(), telegram_chats.clone())
            .with_mqtt_inputs(mqtt_inputs.clone())
            .with_workspace(crate::workspace::Workspace::new(ws.clone())),
    ));
    if c.mqtt.url.is_some() {
        tools.register(Arc::new(
            crate::tools::mqtt::MqttPublish::new(c.mqtt.publish_allow.clone(), mqtt).refusing(mqtt_inputs.clone()),
        ));
    }
    #[cfg(feature = "homeassistant")]
    if let Some(ha) = ha.or_else(|| ha_rest(c)) {
        let allow = &c.homeassistant.allow;
        tools.register(Arc::new(crate::tools::homeassistant::HaCallService::new(ha.clone(), allow)));
        tools.register(Arc::new(crate::tools::homeassistant::HaGetState::new(ha, allow)));
    }
    #[cfg(not(feature = "homeassistant"))]
    let _ = ha;
    tools.register(Arc::new(
        crate::tools::cron::CronTool::new(jobs, c.timezone(), telegram_chats, c.mqtt.publish_allow.clone())
            .with_mqtt_inputs(mqtt_inputs),
    ));
    tools.register(Arc::new(memory::MemorySearchTool::new(memory::Journal::new(&ws, c.timezone()))));
    // MCP servers' tools: built here, connected by the daemon at start or by the first turn that needs them.
    #[cfg(feature = "mcp")]
    let auth = crate::tools::mcp::AuthEnv { state_dir: Some(state.clone()), agent: None };
    #[cfg(feature = "mcp")]
    if let Some(hub) = crate::tools::mcp::McpHub::with_auth(&c.mcp, &c.exec, &ws, Arc::clone(sandbox), auth) {
        tools.register_source(hub);
    }
    tools
}

/// The agent's settings from `[agent]`.
fn settings(c: &crate::config::Config) -> AgentSettings {
    AgentSettings {
        model: c.model().to_string(),
        max_iterations: c.agent.max_iterations,
        max_tokens: c.agent.max_tokens,
        temperature: c.agent.temperature,
        history_messages: c.agent.history_messages,
        context_tokens: c.agent.context_tokens,
        daily_token_budget: c.agent.daily_token_budget,
        unanswered: c.agent.unanswered,
        model_footer: c.agent.model_footer,
        vision: c.agent.vision,
        vision_model: c.agent.vision_model.clone(),
    }
}

/// Who may still have their jobs run: Telegram's users now, and what
/// `[service] members` lets members do.
pub fn standing(loaded: &Loaded) -> crate::policy::Standing {
    let c = &loaded.config;
    crate::policy::Standing::new(
        &c.telegram.allow_from,
        &loaded.paths.state_dir,
        c.service.members,
        &c.mqtt.publish_allow,
    )
    .with_email(c.email.allow_from.iter().map(|a| a.0.clone()))
    .with_matrix(crate::policy::matrix::MatrixPolicy::new(
        &c.matrix.allow_from,
        &c.matrix.rooms,
        &loaded.paths.state_dir,
    ))
    .with_signal(crate::policy::signal::SignalPolicy::new(
        &c.signal.allow_from,
        &c.signal.groups,
        &loaded.paths.state_dir,
    ))
    .with_feishu(crate::policy::feishu::FeishuPolicy::new(
        &c.feishu.allow_from,
        &c.feishu.chats,
        &loaded.paths.state_dir,
    ))
    .with_discord(crate::policy::discord::DiscordPolicy::new(
        c.discord.users(),
        c.discord.channel_ids(),
        &loaded.paths.state_dir,
    ))
}

/// Home Assistant's REST client: a type without values in a build without the
/// feature (there `[homeassistant]` is refused when the config is read).
#[cfg(feature = "homeassistant")]
pub type HaClient = Arc<crate::clients::ha_rest::HaRest>;
#[cfg(not(feature = "homeassistant"))]
pub type HaClient = Arc<std::convert::Infallible>;

/// No Home Assistant in this build.
#[cfg(not(feature = "homeassistant"))]
fn ha_rest(_: &crate::config::Config) -> Option<HaClient> {
    None
}

/// The Home Assistant REST client for this config, if `[homeassistant]` is usable.
#[cfg(feature = "homeassistant")]
fn ha_rest(c: &crate::config::Config) -> Option<HaClient> {
    match crate::clients::ha_rest::HaRest::from_config(&c.homeassistant) {
        Ok(rest) => rest.map(Arc::new),
        Err(e) => {
            tracing::error!("Home Assistant is off: {e}");
            None
        }
    }
}

/// The MQTT link for this config, if a broker is configured and usable.
fn mqtt_link(c: &crate::config::Config) -> Option<Arc<crate::channels::mqtt::Link>> {
    match crate::channels::mqtt::Settings::from_config(&c.mqtt) {
        #[cfg_attr(not(feature = "fleet"), allow(unused_mut))]
        Ok(Some(mut settings)) => {
            // `[fleet]`: its topics are subscribed to and routed to it on this one connection.
            #[cfg(feature = "fleet")]
            settings.inputs.fleet.extend(crate::fleet::filters(&c.fleet));
            // A node's Home Assistant device is reached through its primary's.
            #[cfg(feature = "fleet")]
            if let (Some(_), Ok(Some(primary))) = (c.fleet.board(), c.fleet.primary_of_node()) {
                settings.via = Some(crate::clients::mqtt::node_id_of(primary.as_str()));
            }
            Some(crate::channels::mqtt::Link::new(settings))
        }
        Ok(None) => None,
        Err(e) => {
            tracing::error!("MQTT is off: {e}");
            None
        }
    }
}

/// The daemon's parts for one config, built and not yet started: every
/// long-running loop as a value with `run(self, Shutdown)`, for
/// `daemon::start` to hand to its supervisor (see the table in [`super`]).
pub struct Daemon {
    /// This generation's two-phase shutdown; the job runner cancels with its abort.
    pub shutdown: Shutdown,
    pub agent: Arc<Agent>,
    /// Where reports go: `log`, and `telegram`/`mqtt`/`ha` when configured.
    pub channels: Channels,
    /// Where commands run (the agent's exec tool and the work runner share it).
    pub sandbox: Arc<Sandbox>,
    /// Where channels put inbound messages; held so the agent's queue stays open.
    pub inbound: mpsc::Sender<InboundMessage>,
    /// The scheduler, handing due jobs to the job runner (and its observers).
    pub scheduler: SchedulerLoop<ObservedRunner>,
    pub telegram: Option<TelegramPoller>,
    /// The other chat apps' readers (email, Matrix, Signal, Feishu / Lark, Discord).
    pub chats: super::chats::Chats,
    pub pump: OutboundPump,
    pub outbox: OutboxSender,
    pub bus: ServeBus,
    pub announcements: Option<Announcements>,
    pub unanswered: super::Unanswered,
    pub mqtt: Option<MqttServices>,
    /// `[fleet]`'s task (`None`: not in a fleet, or its config keeps it off, logged).
    pub fleet: Option<FleetBuilt>,
    #[cfg(feature = "homeassistant")]
    pub ha: Option<HaEvents>,
    /// `None`: `[heartbeat] enabled = false`.
    pub heartbeat: Option<HeartbeatLoop>,
    pub dead_man: DeadMan,
    pub watcher: StateWatcher,
    pub mcp: super::McpSources,
    /// `[[webhook]]` endpoints (`None`: none, or the listener may not start as configured).
    #[cfg(feature = "webhook")]
    pub webhook: Option<crate::channels::webhook::WebhookServer>,
    /// `[ntfy] subscribe`'s reader (`None`: no topic to read).
    #[cfg(feature = "ntfy")]
    pub ntfy: Option<crate::channels::ntfy::inbound::Subscriber>,
}

/// Everything `bramble run` runs for this config.
pub fn daemon(loaded: &Loaded) -> Result<Daemon, crate::channels::telegram::TelegramError> {
    let c = &loaded.config;
    let state = &loaded.paths.state_dir;
    let shutdown = Shutdown::new();
    let jobs = JobStore::open(state);
    #[cfg_attr(not(feature = "fleet"), allow(unused_mut))]
    let mut bus = Bus::new();
    let mqtt = mqtt_link(c);
    let scheduler =
        Scheduler::new(jobs.clone(), c.timezone().tz().clone()).with_sync_wait(Some(c.daemon.clock_sync_wait.get()));
    let tomorrow_at = crate::config::parse_hh_mm(&c.telegram.tomorrow_at).unwrap_or((9, 0));
    let reminders = crate::work::reminders::Reminders::new(jobs.clone(), c.timezone().tz().clone(), tomorrow_at);
    let telegram =
        crate::channels::telegram::Telegram::from_config(&c.telegram, state, &loaded.paths.workspace, Some(reminders))?;
    // The chat apps' channels that show a turn's progress exist before the agent.
    let (early, progress) = super::chats::Early::build(loaded, &jobs, telegram.as_ref());
    let ha = ha_rest(c);
    let links = AgentLinks {
        ha: ha.clone(),
        outbound: bus.outbound_tx.clone(),
        mqtt: mqtt.clone().map(|link| link as Arc<dyn Publisher>),
        scheduler: Some(scheduler.handle()),
        progress,
        jobs: Some(jobs.clone()),
    };
    let sandbox = sandbox(loaded);
    let agent = Arc::new(agent(loaded, links, &sandbox));
    #[allow(unused_mut)] // without the `webhook` and `email` features nothing is added
    let mut channels = channels(telegram.as_ref(), mqtt.as_ref(), ha.as_ref());
    let chats = early.readers(loaded, &jobs, &mut channels, &bus.inbound_tx, &agent);
    let reports = Reports::new(Outbox::new(state).holding_in_memory(), Arc::new(Notify::new()));
    let poll = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let work = work(loaded, &agent, &sandbox, &reports, &shutdown);
    #[allow(unused_variables)] // without the `webhook` and `ntfy` features it holds nothing
    let listeners = listeners(loaded, &mut channels, (&work, &scheduler, &jobs), &bus.inbound_tx);
    #[cfg_attr(not(feature = "fleet"), allow(unused_mut))]
    let mut fleet = fleet(loaded, mqtt.as_ref(), &jobs, &reports, &mut bus, &mut channels);
    let telegram = telegram.map(|telegram| TelegramPoller {
        telegram,
        inbound: bus.inbound_tx.clone(),
        activity: agent.activity(),
        shared: fleet_chat(&mut fleet, c),
    });
    let mqtt = mqtt.and_then(|link| {
        let wiring = crate::channels::mqtt::Wiring {
            fleet: fleet_router(&fleet),
            inbound: bus.inbound_tx.clone(),
            scheduler: scheduler.handle(),
            jobs,
            state_dir: state.clone(),
            triggers: Some(work.triggers()),
            reports: reports.clone(),
        };
        mqtt_services(link, &c.mqtt, wiring)
    });
    #[cfg(feature = "homeassistant")]
    let ha = ha.and_then(|ha| events::services(&ha, &c.homeassistant, state, work.triggers()));
    let gate = once_gate(loaded, &work.alerts);
    let (scheduler, heartbeat, dead_man) =
        work.into_loops(scheduler, mqtt.as_ref().map(|(_, o)| o.clone()), gate, &agent);
    let mut watched =
        vec![("jobs.json", scheduler.scheduler.reload_handle()), ("outbox.jsonl", reports.wake().clone())];
    let mqtt = mqtt.map(|(services, _)| {
        watched.extend(services.state.files());
        services
    });
    watched.extend(fleet_router(&fleet).and(fleet_jobs(&fleet)).map(|n| ("jobs.json", n)));
    Ok(Daemon {
        shutdown,
        unanswered: super::Unanswered { agent: agent.clone(), reports: reports.clone() },
        mcp: super::McpSources { agent: agent.clone() },
        announcements: Announcements::new(agent.clone(), bus.outbound_tx.clone()),
        bus: ServeBus { agent: agent.clone(), inbound: bus.inbound_rx, outbound: bus.outbound_tx },
        pump: OutboundPump { outbound: bus.outbound_rx, reports: reports.clone() },
        outbox: OutboxSender { reports, channels: channels.clone(), poll: poll.clone() },
        watcher: StateWatcher { dir: state.clone(), watched, poll },
        inbound: bus.inbound_tx,
        agent,
        channels,
        sandbox,
        scheduler,
        telegram,
        chats,
        mqtt,
        fleet,
        #[cfg(feature = "homeassistant")]
        ha,
        heartbeat,
        dead_man,
        #[cfg(feature = "webhook")]
        webhook: listeners.webhook,
        #[cfg(feature = "ntfy")]
        ntfy: listeners.ntfy,
    })
}

/// The channels that serve or read something beside the chats: `[[webhook]]`
/// endpoints and ntfy's topics (whose Done / Snooze route the webhook listener serves).
struct Listeners {
    #[cfg(feature = "webhook")]
    webhook: Option<crate::channels::webhook::WebhookServer>,
    #[cfg(feature = "ntfy")]
    ntfy: Option<crate::channels::ntfy::inbound::Subscriber>,
}

#[allow(unused_variables, unused_mut, clippy::let_unit_value)] // which parts exist depends on the features
fn listeners(
    loaded: &Loaded,
    channels: &mut Channels,
    (work, scheduler, jobs): (&Work, &Scheduler, &JobStore),
    inbound: &mpsc::Sender<InboundMessage>,
) -> Listeners {
    #[cfg(feature = "ntfy")]
    let ntfy = ntfy_channel(loaded, jobs);
    #[cfg(feature = "webhook")]
    let mut routes: Vec<Arc<dyn crate::channels::webhook::Route>> = Vec::new();
    #[cfg(all(feature = "ntfy", feature = "webhook"))]
    routes.extend(ntfy.as_ref().and_then(|n| n.route()));
    Listeners {
        #[cfg(feature = "ntfy")]
        ntfy: ntfy.and_then(|n| {
            channels.add(n.channel());
            n.subscriber(inbound.clone())
        }),
        #[cfg(feature = "webhook")]
        webhook: webhooks(loaded, channels, work, scheduler, jobs, routes),
    }
}

/// The ntfy channel for `[ntfy]` (`None`: not configured, or unusable: logged).
#[cfg(feature = "ntfy")]
fn ntfy_channel(loaded: &Loaded, jobs: &JobStore) -> Option<crate::channels::ntfy::Ntfy> {
    let c = &loaded.config;
    let tomorrow_at = crate::config::parse_hh_mm(&c.telegram.tomorrow_at).unwrap_or((9, 0));
    let reminders = crate::work::reminders::Reminders::new(jobs.clone(), c.timezone().tz().clone(), tomorrow_at);
    let (state, ws) = (&loaded.paths.state_dir, &loaded.paths.workspace);
    crate::channels::ntfy::Ntfy::from_config(&c.ntfy, state, ws, Some(reminders)).unwrap_or_else(|e| {
        tracing::error!("ntfy is off: {e}");
        None
    })
}

/// The fleet, built (nothing can be without the `fleet` feature).
#[cfg(feature = "fleet")]
pub type FleetBuilt = crate::fleet::Fleet;
#[cfg(not(feature = "fleet"))]
pub type FleetBuilt = std::convert::Infallible;

/// The queue the MQTT router feeds the fleet's topics into.
#[cfg(feature = "fleet")]
fn fleet_router(f: &Option<FleetBuilt>) -> Option<mpsc::Sender<crate::channels::mqtt::FleetMessage>> {
    f.as_ref().map(|f| f.router.clone())
}
#[cfg(not(feature = "fleet"))]
fn fleet_router(_: &Option<FleetBuilt>) -> Option<mpsc::Sender<crate::channels::mqtt::FleetMessage>> {
    None
}

/// In a fleet the bot is shared: the fleet says when this board polls it.
#[cfg(feature = "fleet")]
fn fleet_chat(
    f: &mut Option<FleetBuilt>,
    c: &crate::config::Config,
) -> Option<crate::channels::telegram::shared::Shared> {
    f.as_mut().and_then(|f| f.share_chat(&c.fleet))
}
#[cfg(not(feature = "fleet"))]
fn fleet_chat(
    _: &mut Option<FleetBuilt>,
    _: &crate::config::Config,
) -> Option<crate::channels::telegram::shared::Shared> {
    None
}

/// The fleet's wake-up when jobs.json changes (its presence lists the jobs).
#[cfg(feature = "fleet")]
fn fleet_jobs(f: &Option<FleetBuilt>) -> Option<Arc<Notify>> {
    f.as_ref().map(|f| f.jobs_changed.clone())
}
#[cfg(not(feature = "fleet"))]
fn fleet_jobs(_: &Option<FleetBuilt>) -> Option<Arc<Notify>> {
    None
}

#[cfg(not(feature = "fleet"))]
fn fleet(
    _: &Loaded,
    _: Option<&Arc<crate::channels::mqtt::Link>>,
    _: &JobStore,
    _: &Reports,
    _: &mut Bus,
    _: &mut Channels,
) -> Option<FleetBuilt> {
    None
}

/// `[fleet]`: the fleet's task, and the queue the agent reads (on the
/// primary the fleet reads the channels' queue first, for `/on` and `/boards`).
#[cfg(feature = "fleet")]
fn fleet(
    loaded: &Loaded,
    link: Option<&Arc<crate::channels::mqtt::Link>>,
    jobs: &JobStore,
    reports: &Reports,
    bus: &mut Bus,
    channels: &mut Channels,
) -> Option<FleetBuilt> {
    let c = &loaded.config;
    let state = &loaded.paths.state_dir;
    let Some(link) = link.filter(|_| c.fleet.board().is_some()) else {
        if c.fleet.board().is_some() {
            tracing::error!("the fleet is off: {}", crate::config::fleet::FleetConfigError::NoBroker);
        }
        return None;
    };
    let mut capabilities: Vec<String> = channels.names().iter().map(|n| n.to_string()).collect();
    if c.exec.enabled {
        capabilities.push("exec".into());
    }
    if c.fleet.nats_url.is_some() {
        capabilities.push(crate::fleet::once::CAPABILITY.into());
    }
    let reach = crate::fleet::Reach {
        chats: crate::policy::AllowedChats::new(&c.telegram.allow_from, state)
            .with_email(c.email.allow_from.iter().map(|a| a.0.clone()))
            .with_matrix(crate::policy::matrix::MatrixPolicy::new(&c.matrix.allow_from, &c.matrix.rooms, state)),
        publish_allow: c.mqtt.publish_allow.clone(),
    };
    let wiring = crate::fleet::Wiring {
        config: &c.fleet,
        state_dir: state,
        link: link.clone(),
        jobs: jobs.clone(),
        reports: reports.clone(),
        agent: bus.inbound_tx.clone(),
        reach,
        capabilities,
    };
    // On the primary the fleet reads the channels' queue and fills the agent's.
    let chat = std::mem::replace(&mut bus.inbound_rx, mpsc::channel(1).1);
    let (fleet, agent_rx) = crate::fleet::build(wiring, chat, channels);
    bus.inbound_rx = agent_rx;
    fleet.unwrap_or_else(|e| {
        tracing::error!("the fleet is off: {e}");
        None
    })
}

/// `[[webhook]]`: the `webhook:<name>` targets into `channels`, and the
/// endpoints' server (`None`: no endpoint, or the listener may not start).
#[cfg(feature = "webhook")]
fn webhooks(
    loaded: &Loaded,
    channels: &mut Channels,
    work: &Work,
    scheduler: &Scheduler,
    jobs: &JobStore,
    routes: Vec<Arc<dyn crate::channels::webhook::Route>>,
) -> Option<crate::channels::webhook::WebhookServer> {
    let c = &loaded.config;
    let host = nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default();
    let origin = crate::clients::webhook::instance_id(&host, &loaded.paths.state_dir);
    if let Some(out) = crate::channels::webhook::WebhookChannel::new(&c.webhook, origin.clone()) {
        channels.add(Arc::new(out));
    }
    let wiring = crate::channels::webhook::Wiring {
        deps: work.triggers(),
        jobs: jobs.clone(),
        scheduler: scheduler.handle(),
        origin,
        state_dir: loaded.paths.state_dir.clone(),
        routes,
    };
    crate::channels::webhook::WebhookServer::new(&c.webhooks, &c.webhook, wiring)
}

/// The delivery channels: `log`, and Telegram, MQTT and Home Assistant when configured.
fn channels(
    telegram: Option<&crate::channels::telegram::Telegram>,
    mqtt: Option<&Arc<crate::channels::mqtt::Link>>,
    ha: Option<&HaClient>,
) -> Channels {
    let mut channels = Channels::with_log();
    if let Some(t) = telegram {
        channels.add(t.channel());
    }
    if let Some(link) = mqtt {
        channels.add(Arc::new(crate::channels::mqtt::MqttChannel::new(link.clone())));
    }
    #[cfg(feature = "homeassistant")]
    if let Some(ha) = ha {
        channels.add(Arc::new(crate::channels::homeassistant::NotifyChannel::new(ha.clone())));
    }
    #[cfg(not(feature = "homeassistant"))]
    let _ = ha;
    channels
}

/// MQTT's tasks on `link`, and the observer that publishes each job's run record (`None`: MQTT is off).
fn mqtt_services(
    link: Arc<crate::channels::mqtt::Link>,
    config: &crate::config::MqttConfig,
    wiring: crate::channels::mqtt::Wiring,
) -> Option<(MqttServices, RunObserver)> {
    match crate::channels::mqtt::services(link.clone(), config, wiring) {
        Ok(services) => {
            let observer: RunObserver = Arc::new(move |job: &crate::scheduler::Job, record: &serde_json::Value| {
                crate::channels::mqtt::publish_run_record(&link, record, &job.name)
            });
            Some((services, observer))
        }
        Err(e) => {
            tracing::error!("MQTT is off: {e}");
            None
        }
    }
}

/// What runs without a chat waiting: the work runner (jobs, triggers), the
/// heartbeat and the alerts, reporting to one outbox.
struct Work {
    runner: Runner,
    reports: Reports,
    alerts: Alerts,
    job_runner: JobRunner,
    heartbeat: Option<Heartbeat>,
}

fn work(loaded: &Loaded, agent: &Arc<Agent>, sandbox: &Arc<Sandbox>, reports: &Reports, shutdown: &Shutdown) -> Work {
    let c = &loaded.config;
    let runner = Runner::new(agent.clone(), c.exec.clone(), loaded.paths.workspace.clone(), sandbox.clone());
    // With `[alerts] deliver` empty, `[ntfy] alert_topic` gets the alerts and the dead-man's.
    let alerts = Alerts::new(&loaded.paths.state_dir, &c.ntfy.alerts(&c.alerts), reports.clone());
    let job_runner = JobRunner {
        runner: runner.clone(),
        reports: reports.clone(),
        abort: shutdown.abort_token().clone(),
        alerts: alerts.clone(),
        standing: standing(loaded),
    };
    let heartbeat = c.heartbeat.enabled.then(|| Heartbeat {
        config: c.heartbeat.clone(),
        workspace: loaded.paths.workspace.clone(),
        tz: c.timezone(),
        state: StateFile::new(&loaded.paths.state_dir),
        reports: reports.clone(),
        pulse: crate::util::pulse::Pulse::new(),
    });
    Work { runner, reports: reports.clone(), alerts, job_runner, heartbeat }
}

impl Work {
    /// What a trigger runner needs (MQTT's, Home Assistant's).
    fn triggers(&self) -> crate::work::firing::TriggerDeps {
        crate::work::firing::TriggerDeps { runner: self.runner.clone(), reports: self.reports.clone() }
    }

    /// The scheduler over the job runner (its runs also told to `observer`),
    /// the heartbeat's loop, and the dead-man watching both.
    fn into_loops(
        self,
        scheduler: Scheduler,
        observer: Option<RunObserver>,
        gate: Option<Arc<dyn crate::work::jobs::OnceGate>>,
        agent: &Arc<Agent>,
    ) -> (SchedulerLoop<ObservedRunner>, Option<HeartbeatLoop>, DeadMan) {
        let mut watched = vec![scheduler_watched(scheduler.pulse())];
        if let Some(hb) = &self.heartbeat {
            watched.push(heartbeat_watched(hb.pulse.clone(), hb.config.every.get()));
        }
        let executor = ObservedRunner { runner: self.job_runner, observers: observer.into_iter().collect(), gate };
        let heartbeat = self.heartbeat.map(|heartbeat| HeartbeatLoop { heartbeat, agent: agent.clone() });
        let dead_man = DeadMan { alerts: self.alerts, watched, outbox: self.reports.outbox().clone() };
        (SchedulerLoop { scheduler, executor }, heartbeat, dead_man)
    }
}

/// `[fleet] nats_url`: the gate of jobs for any board (`None`: none, or
/// misconfigured, logged: such jobs then do not run here).
fn once_gate(loaded: &Loaded, alerts: &Alerts) -> Option<Arc<dyn crate::work::jobs::OnceGate>> {
    #[cfg(feature = "fleet")]
    match crate::fleet::once::Once::new(&loaded.config.fleet, alerts.clone()) {
        Ok(gate) => gate.map(|g| Arc::new(g) as Arc<dyn crate::work::jobs::OnceGate>),
        Err(e) => {
            tracing::error!("jobs for any board will not run on this board: {e}");
            None
        }
    }
    #[cfg(not(feature = "fleet"))]
    {
        let _ = (loaded, alerts);
        None
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
fn heartbeat_watched(pulse: crate::util::pulse::Pulse, every: std::time::Duration) -> Watched {
    Watched {
        key: alerts::HEARTBEAT_KEY,
        pulse,
        limit: every.max(std::time::Duration::from_secs(10)) * 2,
        alert: |silent| {
            format!(
                "Alert: the heartbeat has not ticked for {} (twice its interval): HEARTBEAT.md is not being looked at.",
                crate::config::Dur(silent)
            )
        },
        recovered: "Recovered: the heartbeat ticks again.",
    }
}

/// The agent of a chat in the terminal (`bramble agent`).
pub struct Terminal {
    pub agent: Arc<Agent>,
    /// Where the agent's sub-agent answers go (into `outbound_rx`).
    pub outbound_tx: mpsc::Sender<OutboundMessage>,
    /// What the agent sends mid-turn (the `message` tool), for the terminal to print.
    pub outbound_rx: mpsc::Receiver<OutboundMessage>,
    /// Where a notice for another channel goes (the daemon delivers it).
    pub outbox: Outbox,
    /// Where the agent's commands run.
    pub sandbox: Arc<Sandbox>,
}

/// The terminal's agent: it sends to a queue the terminal prints.
pub fn terminal(loaded: &Loaded) -> Terminal {
    let bus = Bus::new();
    let sandbox = sandbox(loaded);
    let agent = Arc::new(agent(loaded, AgentLinks::outside_daemon(bus.outbound_tx.clone()), &sandbox));
    Terminal {
        agent,
        outbound_tx: bus.outbound_tx,
        outbound_rx: bus.outbound_rx,
        outbox: Outbox::new(&loaded.paths.state_dir),
        sandbox,
    }
}

/// An agent for a one-off command (`heartbeat`, `cron run`): what it sends
/// (the `message` tool) goes into the outbox, for the daemon to deliver.
pub struct Queued {
    pub agent: Arc<Agent>,
    reports: Reports,
    /// Cancels the work (Ctrl-C) and, at the end, the outbox pump.
    pub cancel: CancellationToken,
    /// Where commands run (the agent's exec tool and a job's `--exec`).
    pub sandbox: Arc<Sandbox>,
    pump: tokio::task::JoinHandle<()>,
}

impl Queued {
    /// How work reports: into the outbox.
    pub fn reports(&self) -> Reports {
        self.reports.clone()
    }

    /// Stop the pump once everything queued so far is in the outbox.
    pub async fn finish(self) {
        drop(self.agent);
        self.cancel.cancel();
        let _ = self.pump.await;
    }
}

/// The agent of a one-off command, with its outbox pump running (the
/// command's one task: it ends with [`Queued::finish`]).
pub fn queued(loaded: &Loaded) -> Queued {
    let reports = Reports::new(Outbox::new(&loaded.paths.state_dir), Arc::new(Notify::new()));
    let bus = Bus::new();
    let sandbox = sandbox(loaded);
    let agent = Arc::new(agent(loaded, AgentLinks::outside_daemon(bus.outbound_tx.clone()), &sandbox));
    let shutdown = Shutdown::new();
    let pump = OutboundPump { outbound: bus.outbound_rx, reports: reports.clone() };
    let pump = tokio::spawn(pump.run(shutdown.clone()));
    Queued { agent, reports, cancel: shutdown.abort_token().clone(), sandbox, pump }
}
