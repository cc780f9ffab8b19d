//! The MQTT channel: reports out, commands and triggers in, Home Assistant discovery.
//!
//! ## Layout
//!
//! - this file: the connection task ([`spawn`]: reconnects, the MQTT version
//!   in use, backoff) and the [`MqttChannel`] delivery target (`mqtt`,
//!   `mqtt:<topic>`).
//! - below it, in `crate::clients::mqtt`: [`Settings`] (from `[mqtt]`), the
//!   [`Link`] shared by everything that publishes (ack tracking, the retained
//!   state re-published on every connect), the keep-alive, and `wire.rs`: one
//!   connection over MQTT 5 or 3.1.1.
//! - `inbound.rs`: `<prefix>/in`, `<prefix>/run/<job>`, and the routing of
//!   everything else to discovery clean-up and triggers, by the same
//!   [`InputTopics`] we subscribe with — and never publish to: a report on a
//!   topic we listen to would come back as a new message (a loop of turns).
//! - `limit.rs`: [`TurnLimit`], the model turns one source on the broker may start.
//! - [`triggers`]: `[[mqtt.trigger]]` — templates into agent turns, or commands.
//! - [`discovery`]: Home Assistant MQTT discovery documents.
//!
//! ## Why it is built this way (rumqttc 0.25 traps)
//!
//! - **No backoff of its own.** After an error from `EventLoop::poll` the next
//!   poll reconnects at once; a refused connection would be a hot loop. The task
//!   sleeps itself (1 s doubling to 60 s) and keeps going until shutdown.
//! - **Nothing survives a reconnect on the client side.** With a broker that
//!   lost our session, rumqttc drops queued publishes and subscriptions are
//!   gone. So on *every* ConnAck we subscribe again and publish the retained
//!   state again (`online`, discovery, job records), and reports are never held
//!   inside rumqttc: they live in the durable outbox until the broker acked them.
//! - **Ack tracking.** rumqttc 0.25 has no per-publish ack future. Requests go
//!   through one FIFO channel and the event loop reports `Outgoing::Publish(pkid)`
//!   in that order, then `Incoming::PubAck(pkid)`. [`Link`] keeps a waiter per
//!   publish in the same order, under one lock with the `try_publish` call, so
//!   `deliver` returns Ok only when the broker acknowledged the report. On a
//!   connection error the event loop and its request channel are thrown away
//!   and built anew (the persistent session lives in the broker), so no stale
//!   request can shift that order; the waiters fail as retryable and the outbox
//!   sends those reports again (at-least-once).
//! - **Never `publish().await` in the polling task** (it deadlocks when the
//!   request channel is full): everything uses `try_publish`; a full channel is
//!   a retryable delivery failure.
//! - **10 KiB packet limit by default**: raised to [`MAX_PACKET`] for what we
//!   send and [`MAX_INCOMING`] for what we accept.
//! - **Its keep-alive timer wakes the board four times per ping** (tokio's
//!   timer wheel): after the ConnAck the connection task sends the pings
//!   itself, on a kernel timer (`keepalive.rs`).
//! - **MQTT 5 first, for the packet limit** (3.1.1 where the broker speaks
//!   only that: `[mqtt] protocol`, and `clients/mqtt/wire.rs` for what stands
//!   in for what 5 gives). A packet over the client's limit is a
//!   decode error that drops the connection; in MQTT 3.1.1 the broker cannot be
//!   told the limit, so one oversize retained (or queued) message on
//!   `<prefix>/in` came back after every reconnect: a reconnect loop, the
//!   channel blocked until someone cleared it. MQTT 5's CONNECT carries
//!   *Maximum Packet Size*, and the broker then must not send us a larger
//!   packet: it drops it (mosquitto ≥ 1.6 logs it) and the connection stays
//!   up. The session lives on in the broker for [`SESSION_EXPIRY`] after a
//!   disconnect (MQTT 5 ends it at once unless asked). Should an oversize
//!   packet arrive anyway (a broker that ignores the limit), the backoff is not
//!   reset by the ConnAck that preceded it, so it cannot become a hot loop.

pub mod discovery;
mod inbound;
mod limit;
pub mod triggers;

pub use crate::clients::mqtt::{
    probe, Link, MqttError, PublishError, Settings, ACK_TIMEOUT, MAX_INCOMING, MAX_PACKET, SESSION_EXPIRY,
};
use crate::clients::mqtt::{Event, Events, Failure, Pinger, Protocol};
pub use inbound::inbound_message;
use inbound::Router;
pub use limit::{TurnLimit, TurnRate};

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use crate::bus::{InboundMessage, ReportSource, Target};
use crate::config::MqttConfig;
use crate::delivery::{Channel, DeliveryError, Report};
use crate::scheduler::{JobStore, SchedulerHandle};
use crate::util::BoxFuture;

/// Longest reconnect wait after an error (from 1 s, doubling).
const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// A connection that lasted this long resets the backoff when it ends.
const STABLE: Duration = Duration::from_secs(10);

/// `bramble status`: where the broker is, what is on, and whether it answers
/// on its port right now (a TCP connect, at most two seconds).
pub fn status_line(c: &MqttConfig) -> String {
    let s = match Settings::from_config(c) {
        Ok(None) => return "not configured".into(),
        Err(e) => return format!("OFF: {e}"),
        Ok(Some(s)) => s,
    };
    let reach = {
        use std::net::ToSocketAddrs as _;
        let addr = (s.host.as_str(), s.port).to_socket_addrs().ok().and_then(|mut a| a.next());
        match addr.map(|a| std::net::TcpStream::connect_timeout(&a, Duration::from_secs(2))) {
            Some(Ok(_)) => "broker reachable".to_string(),
            Some(Err(e)) => format!("broker NOT reachable: {e}"),
            None => format!("cannot resolve {}", s.host),
        }
    };
    format!(
        "{} ({reach}); MQTT {}; {}; discovery {}, {} trigger(s), mqtt_publish to {}",
        s.describe(),
        match s.protocol {
            crate::config::MqttProtocol::Auto => "auto (5, or 3.1.1 for a broker that speaks only that)",
            crate::config::MqttProtocol::V5 => "5",
            crate::config::MqttProtocol::V311 => "3.1.1 (max_packet is the only packet limit)",
        },
        if s.inbound { format!("listens on {} and run/<job>", s.topic("in")) } else { "inbound off".into() },
        if s.discovery { "on" } else { "off" },
        c.trigger.len(),
        if c.publish_allow.is_empty() { "nothing".to_string() } else { c.publish_allow.join(", ") }
    )
}

/// The MQTT targets among `targets` that bramble must not deliver to, as an
/// error that names the first: a topic against MQTT's rules, or one of the
/// topics this config makes bramble listen to (a report there would come back
/// as a new message). For every place a target is accepted: `cron add
/// --deliver`, the cron and message tools, the config.
pub fn refuse_targets(config: &MqttConfig, targets: &[Target]) -> Result<(), String> {
    let inputs = Settings::from_config(config).ok().flatten().map(|s| s.inputs);
    for t in targets {
        if let Target::Mqtt(Some(topic)) = t {
            let refused = match &inputs {
                Some(inputs) => inputs.refuse(topic),
                None => crate::util::mqtt::check_topic(topic),
            };
            refused.map_err(|e| format!("`{}` cannot be a delivery target: {e}", t.to_string().escape_debug()))?;
        }
    }
    Ok(())
}

/// `bramble check`: what would keep MQTT from working as configured.
pub fn check_warnings(config: &crate::config::Config) -> Vec<String> {
    let c = &config.mqtt;
    let mut out = Vec::new();
    match Settings::from_config(c) {
        Err(e) => out.push(format!("{e}: MQTT stays off")),
        Ok(None) if !c.trigger.is_empty() || !c.publish_allow.is_empty() => {
            out.push("[mqtt] has triggers or publish_allow but no `url`: MQTT stays off".into())
        }
        _ => {}
    }
    let configured =
        [&config.heartbeat.deliver, &config.alerts.deliver].into_iter().chain(c.trigger.iter().map(|t| &t.deliver));
    for targets in configured {
        if let Err(e) = refuse_targets(c, targets) {
            out.push(format!("{e}: such reports are set aside, never published"));
        }
    }
    for t in &c.trigger {
        for target in &t.deliver {
            if let Target::Telegram(_) = target {
                if config.telegram.token().is_none() {
                    out.push(format!("trigger `{}` delivers to {target} but Telegram is not configured", t.topic));
                }
            }
        }
    }
    out.extend(broker_trust_warning(config));
    out
}

/// A broker anyone may publish to (no username) or whose password crosses
/// the network in plain text, combined with inbound topics whose turns are
/// offered tools that change things: whoever reaches the broker commands them.
fn broker_trust_warning(config: &crate::config::Config) -> Option<String> {
    use crate::tools::policy::{Source, ToolPolicy};
    let c = &config.mqtt;
    let url = c.url.as_ref()?;
    let loopback = matches!(url.host.as_str(), "localhost" | "127.0.0.1" | "::1");
    let weak = match (c.username.is_some(), url.tls || loopback) {
        (false, _) => "accepts anyone (no username)",
        (true, false) => "gets the password in plain text (mqtt:// to another host)",
        (true, true) => return None,
    };
    let policy = ToolPolicy::from_config(&config.policy);
    let mut reach = Vec::new();
    if c.inbound {
        let tools = policy.powerful(Source::Mqtt);
        if !tools.is_empty() {
            reach.push(format!("<prefix>/in turns may use {} ([policy.mqtt])", tools.join(", ")));
        }
    }
    if c.trigger.iter().any(|t| matches!(t.action, crate::config::TriggerAction::Message(_))) {
        let tools = policy.powerful(Source::Trigger);
        if !tools.is_empty() {
            reach.push(format!("trigger turns may use {} ([policy.trigger])", tools.join(", ")));
        }
    }
    if reach.is_empty() {
        return None;
    }
    Some(format!(
        "the broker mqtt{}://{} {weak}, and {}: whoever can publish there commands them. Give bramble and \
         Home Assistant their own broker users with an ACL (SECURITY.md, \"Threat model\"), or narrow [policy.*], \
         or set [mqtt] inbound = false",
        if url.tls { "s" } else { "" },
        url.host,
        reach.join("; ")
    ))
}

impl crate::delivery::Publisher for Link {
    /// `mqtt_publish`: never to a topic we listen to, nor one against MQTT's rules.
    fn publish<'a>(
        &'a self,
        topic: &'a str,
        payload: Vec<u8>,
        retain: bool,
    ) -> BoxFuture<'a, Result<(), crate::delivery::PublishFailure>> {
        Box::pin(async move {
            self.settings.inputs.refuse(topic)?;
            self.publish_acked(topic, payload, retain, ACK_TIMEOUT)
                .await
                .map_err(|e| crate::delivery::PublishFailure::Broker(Box::new(e)))
        })
    }
}

/// The `mqtt` delivery channel: `mqtt` (the device's report topic; heartbeat
/// reports on `<prefix>/heartbeat`) and `mqtt:<topic>`.
pub struct MqttChannel {
    link: Arc<Link>,
}

impl MqttChannel {
    pub fn new(link: Arc<Link>) -> MqttChannel {
        MqttChannel { link }
    }

    /// The topic a report goes to.
    pub fn topic_for(settings: &Settings, target: &Target, source: &ReportSource) -> Option<String> {
        match (target, source) {
            (Target::Mqtt(Some(topic)), _) => Some(topic.clone()),
            (Target::Mqtt(None), ReportSource::Heartbeat) => Some(settings.topic("heartbeat")),
            (Target::Mqtt(None), ReportSource::Alert) => Some(settings.topic("alert")),
            (Target::Mqtt(None), _) => Some(settings.topic("out")),
            _ => None,
        }
    }
}

impl Channel for MqttChannel {
    fn name(&self) -> &'static str {
        "mqtt"
    }

    fn deliver<'a>(&'a self, report: Report<'a>) -> BoxFuture<'a, Result<(), DeliveryError>> {
        Box::pin(async move {
            let Some(topic) = MqttChannel::topic_for(&self.link.settings, report.target, report.source) else {
                return Err(DeliveryError::permanent(format!("`{}` is not an MQTT target", report.target)));
            };
            // Never a topic we listen to (the report would come back as a new
            // message), nor one a broker closes the connection on: refused
            // for good, whatever queued it (an old outbox, an old job, the config).
            if let Err(e) = self.link.settings.inputs.refuse(&topic) {
                return Err(DeliveryError::permanent(format!("{}: {e}", topic.escape_debug())));
            }
            let text = report.text_naming_files();
            match self.link.publish_acked(&topic, text.as_bytes().to_vec(), false, ACK_TIMEOUT).await {
                Ok(()) => Ok(()),
                Err(e @ PublishError::TooLarge(_)) => Err(DeliveryError::permanent(format!("{topic}: {e}"))),
                // The broker said no, or closed the connection with this report
                // in flight (what it does to a packet it will not take): counted.
                Err(e @ (PublishError::Refused(_) | PublishError::Lost)) => {
                    Err(DeliveryError::suspect(format!("{topic}: {e}")))
                }
                Err(e) => Err(DeliveryError::retryable(format!("{topic}: {e}"))),
            }
        })
    }
}

/// What the MQTT tasks need from the rest of the daemon.
pub struct Wiring {
    pub inbound: mpsc::Sender<InboundMessage>,
    pub scheduler: SchedulerHandle,
    pub jobs: JobStore,
    pub state_dir: PathBuf,
    pub triggers: Option<triggers::TriggerDeps>,
    /// Reports waiting out a backoff are retried at once when the broker is back.
    pub reports: crate::delivery::Reports,
    /// The fleet's queue (`[fleet]`): messages on its topics (`Settings::inputs.fleet`).
    pub fleet: Option<mpsc::Sender<FleetMessage>>,
}

/// A message on one of the fleet's topics: topic, payload, retained.
pub type FleetMessage = (String, Vec<u8>, bool);

/// MQTT's long-running tasks, built and not started.
pub struct MqttServices {
    pub connection: MqttConnection,
    pub state: RetainedState,
    /// Runs `[[mqtt.trigger]]` turns (`None`: no triggers, or no work to run them).
    pub triggers: Option<TriggerRunner>,
}

/// The broker connection ([`connection`]): polls the event loop until the
/// stop (publishing `offline` first), reconnecting with backoff.
pub struct MqttConnection {
    link: Arc<Link>,
    subscriptions: Vec<String>,
    router: Router,
    reports: crate::delivery::Reports,
}

impl MqttConnection {
    pub async fn run(self, shutdown: crate::util::shutdown::Shutdown) {
        let outbox = (self.reports.outbox().clone(), self.reports.wake().clone());
        let stop = shutdown.stop_token().clone();
        connection(self.link, self.subscriptions, self.router, outbox, stop).await
    }
}

/// The retained state that follows files in the state directory ([`state_watch`]),
/// until the stop. Cheap to clone: the daemon makes it again if it ever ends.
#[derive(Clone)]
pub struct RetainedState {
    link: Arc<Link>,
    jobs: JobStore,
    state_dir: PathBuf,
    changed: Changed,
}

impl RetainedState {
    /// The state files it follows, and what to notify when one changes.
    pub fn files(&self) -> [(&'static str, Arc<Notify>); 3] {
        [
            ("jobs.json", self.changed.jobs.clone()),
            ("heartbeat.json", self.changed.heartbeat.clone()),
            (crate::work::alerts::ALERTS_FILE, self.changed.alerts.clone()),
        ]
    }

    pub async fn run(self, shutdown: crate::util::shutdown::Shutdown) {
        state_watch(self.link, self.jobs, self.state_dir, self.changed, shutdown.stop_token().clone()).await
    }
}

/// The trigger runner ([`triggers::run`]): the stop ends taking fires, the abort cancels runs.
pub struct TriggerRunner {
    triggers: Arc<triggers::Triggers>,
    fires: mpsc::Receiver<triggers::Fire>,
    deps: triggers::TriggerDeps,
}

impl TriggerRunner {
    pub async fn run(self, shutdown: crate::util::shutdown::Shutdown) {
        let (stop, abort) = (shutdown.stop_token().clone(), shutdown.abort_token().clone());
        triggers::run(self.triggers, self.fires, self.deps, stop, abort).await
    }
}

/// The connection task and its helpers for `link`, built and not started.
pub fn services(link: Arc<Link>, config: &MqttConfig, w: Wiring) -> Result<MqttServices, MqttError> {
    link.settings.open(link.settings.first_protocol(), false)?;
    let (trigger_set, trigger_rx) = triggers::Triggers::new(&config.trigger, link.settings.turn_rate);
    let trigger_set = Arc::new(trigger_set);
    let triggers = match (trigger_rx, w.triggers) {
        (Some(fires), Some(deps)) => Some(TriggerRunner { triggers: trigger_set.clone(), fires, deps }),
        _ => None,
    };
    if !link.settings.inbound {
        tracing::info!("MQTT inbound is off: {} and run/<job> are not listened to", link.settings.topic("in"));
    }
    // The one list we listen to, route by and never publish to.
    let subscriptions = link.settings.inputs.subscriptions();
    let router = Router {
        link: link.clone(),
        inbound: w.inbound,
        scheduler: w.scheduler,
        jobs: w.jobs.clone(),
        triggers: trigger_set,
        turns: TurnLimit::new(link.settings.turn_rate, link.settings.topic("in")),
        fleet: w.fleet,
    };
    let connection = MqttConnection { link: link.clone(), subscriptions, router, reports: w.reports };
    let state = RetainedState { link, jobs: w.jobs, state_dir: w.state_dir, changed: Changed::default() };
    Ok(MqttServices { connection, state, triggers })
}

/// Poll the event loop until `stop`, reconnecting with backoff.
async fn connection(
    link: Arc<Link>,
    subscriptions: Vec<String>,
    router: Router,
    (outbox, wake): (crate::delivery::outbox::Outbox, Arc<Notify>),
    stop: CancellationToken,
) {
    let mut backoff = crate::util::timer::Backoff::new(BACKOFF_MAX);
    let mut was_connected = false;
    let mut connected_at: Option<tokio::time::Instant> = None;
    let mut protocol = Version { now: link.settings.first_protocol(), settled: false };
    loop {
        // A fresh client and event loop per connection: see the module docs.
        let (client, mut events) = match link.settings.open(protocol.now, false) {
            Ok(pair) => pair,
            Err(e) => return tracing::error!("MQTT stays off: {e}"),
        };
        let mut client = Some(client);
        let mut pinger: Option<Pinger> = None;
        let error = loop {
            let event = tokio::select! {
                e = events.poll() => e,
                // Dropping the `poll()` future here is safe while the link is
                // idle; `Pinger` waits otherwise (see keepalive.rs).
                () = async {
                    match pinger.as_mut() {
                        Some(p) => p.due().await,
                        None => std::future::pending().await,
                    }
                } => {
                    if let Some(p) = pinger.as_mut() {
                        p.ping(&mut events, link.idle());
                    }
                    continue;
                }
                _ = stop.cancelled() => {
                    goodbye(&link, &mut events).await;
                    return;
                }
            };
            match event {
                Ok(Event::ConnAck { session_present, max_packet }) => {
                    tracing::info!(
                        broker = %link.settings.describe(), session_present, protocol = %protocol.now,
                        "MQTT connected ({})", protocol.now
                    );
                    was_connected = true;
                    protocol.settled = true;
                    connected_at = Some(tokio::time::Instant::now());
                    pinger = Pinger::take_over(&mut events);
                    if let Some(c) = client.take() {
                        link.on_connack(c, &subscriptions, max_packet);
                    }
                    match outbox.retry_now("mqtt") {
                        Ok(0) => {}
                        Ok(n) => {
                            tracing::info!(reports = n, "MQTT is back: sending the reports that waited");
                            wake.notify_one();
                        }
                        Err(e) => tracing::warn!("MQTT: {e}"),
                    }
                }
                Ok(Event::Refused(code)) => {
                    break Failure {
                        text: format!("the broker refused the connection: {code}"),
                        not_v5: false,
                        refused: true,
                    }
                }
                Ok(Event::Publish { topic: Some(topic), payload, retain }) => router.dispatch(&topic, &payload, retain),
                Ok(Event::Publish { topic: None, .. }) => {
                    tracing::warn!("MQTT: ignored a message on a topic that is not UTF-8")
                }
                Ok(Event::PubAck { pkid, refused }) => link.on_puback(pkid, refused),
                Ok(Event::OutgoingPublish(pkid)) => link.on_outgoing_publish(pkid),
                Ok(_) => {}
                Err(e) => break e,
            }
        };
        link.on_disconnect();
        // Only a connection that lasted counts as good: one the broker (or a packet) kills
        // right after the ConnAck must not reset the backoff, or it becomes a hot loop.
        if connected_at.take().is_some_and(|t| t.elapsed() >= STABLE) {
            backoff.reset();
        }
        let connected = std::mem::replace(&mut was_connected, false);
        if !connected && protocol.fall_back(&link.settings, &error) {
            continue;
        }
        let wait = backoff.next_wait();
        say_why(&link.settings, &error, protocol.now, connected, wait);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// The MQTT version the connection task speaks, and whether a ConnAck in it
/// settled that for this run.
struct Version {
    now: Protocol,
    settled: bool,
}

impl Version {
    /// After a connection that never got its ConnAck: whether to try again at
    /// once in the other version. With `auto`, a broker that answered MQTT 5 as
    /// a 3.1.1 broker does is asked in 3.1.1 (remembered once it connects); a
    /// 3.1.1 attempt that fails before any 3.1.1 ConnAck goes back to 5 next
    /// time (the first failure may have been a broker restarting), after the backoff.
    fn fall_back(&mut self, settings: &Settings, error: &Failure) -> bool {
        if settings.protocol != crate::config::MqttProtocol::Auto || self.settled {
            return false;
        }
        match self.now {
            Protocol::V5 if error.not_v5 => {
                tracing::warn!(
                    broker = %settings.describe(),
                    "the MQTT broker did not answer MQTT 5 ({error}): asking again in MQTT 3.1.1 ([mqtt] protocol = \"auto\")"
                );
                self.now = Protocol::V311;
                true
            }
            Protocol::V311 => {
                self.now = Protocol::V5;
                false
            }
            Protocol::V5 => false,
        }
    }
}

/// The log line for a connection that ended or never began.
fn say_why(settings: &Settings, error: &Failure, protocol: Protocol, connected: bool, wait: Duration) {
    let broker = settings.describe();
    if protocol == Protocol::V5 && error.not_v5 && settings.protocol == crate::config::MqttProtocol::V5 && !connected {
        tracing::error!(
            broker,
            "the MQTT broker did not answer MQTT 5 ({error}): if it speaks only MQTT 3.1.1 (amqtt, aedes, \
             RabbitMQ, mosquitto before 1.6), set [mqtt] protocol = \"auto\" or \"3.1.1\"; retrying in {wait:?}"
        );
    } else if connected {
        tracing::warn!(error = %error, "MQTT connection lost; reconnecting in {wait:?}");
    } else {
        tracing::warn!(broker, error = %error, %protocol, "cannot connect to the MQTT broker; retrying in {wait:?}");
    }
}

/// A clean goodbye: `offline` (a graceful disconnect does not fire the last
/// will), then DISCONNECT, flushed within two seconds.
async fn goodbye(link: &Link, events: &mut Events) {
    let client = link.client();
    let Some(client) = client else { return };
    let _ = link.publish(&link.settings.topic("status"), b"offline".to_vec(), true);
    client.try_disconnect();
    link.on_disconnect();
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while let Ok(ev) = events.poll().await {
            if matches!(ev, Event::OutgoingDisconnect) {
                break;
            }
        }
    })
    .await;
}

/// The notifications of changed state files.
#[derive(Clone, Default)]
struct Changed {
    jobs: Arc<Notify>,
    heartbeat: Arc<Notify>,
    alerts: Arc<Notify>,
}

/// Keep the retained state that follows files in the state directory
/// current: discovery and job records (jobs.json), the last heartbeat, the
/// open alerts (`<prefix>/problem`).
async fn state_watch(link: Arc<Link>, jobs: JobStore, state_dir: PathBuf, changed: Changed, stop: CancellationToken) {
    let heartbeat = crate::scheduler::heartbeat::StateFile::new(&state_dir);
    let mut known: Vec<String> = Vec::new();
    let mut buttons: Vec<String> = Vec::new();
    let mut warned = false;
    let (mut refresh_jobs, mut refresh_heartbeat, mut refresh_alerts) = (true, true, true);
    loop {
        if refresh_heartbeat {
            if let Some(t) = heartbeat.load().last_run {
                link.set_retained(&link.settings.topic("heartbeat/last"), t.to_string().into_bytes());
            }
        }
        if refresh_alerts {
            let open = crate::work::alerts::open_in(&state_dir);
            link.set_retained(&link.settings.topic("problem"), problem_payload(&open).into_bytes());
        }
        if refresh_jobs {
            match jobs.list() {
                Ok(list) => {
                    let names: Vec<String> = list.iter().map(|j| j.name.clone()).collect();
                    for gone in known.iter().filter(|n| !names.contains(n)) {
                        // A removed job: its retained record goes too.
                        link.set_retained(&link.settings.topic(&format!("jobs/{gone}")), Vec::new());
                    }
                    if link.settings.discovery {
                        buttons = discovery::publish(&link, &list, &buttons, &mut warned);
                    }
                    known = names;
                }
                Err(e) => tracing::warn!("MQTT: cannot read the jobs for discovery: {e}"),
            }
            crate::util::sys::release_freed_memory();
        }
        (refresh_jobs, refresh_heartbeat, refresh_alerts) = tokio::select! {
            _ = changed.jobs.notified() => (true, false, false),
            _ = changed.heartbeat.notified() => (false, true, false),
            _ = changed.alerts.notified() => (false, false, true),
            _ = stop.cancelled() => return,
        };
    }
}

/// `<prefix>/problem`: `{"state":"ON"|"OFF","problems":[{"alert","since","text"}]}`.
pub fn problem_payload(open: &std::collections::BTreeMap<String, crate::work::alerts::Open>) -> String {
    let problems: Vec<serde_json::Value> = open
        .iter()
        .map(|(key, o)| serde_json::json!({"alert": key, "since": o.since.to_string(), "text": o.text}))
        .collect();
    serde_json::json!({"state": if open.is_empty() { "OFF" } else { "ON" }, "problems": problems}).to_string()
}

/// A job run's record on `<prefix>/jobs/<name>` (retained) and `<prefix>/last_job`.
pub fn publish_run_record(link: &Link, record: &serde_json::Value, job: &str) {
    let payload = record.to_string().into_bytes();
    link.set_retained(&link.settings.topic(&format!("jobs/{job}")), payload.clone());
    link.set_retained(&link.settings.topic("last_job"), payload);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        let cfg: crate::config::Config = crate::config::Config::parse(
            "[mqtt]\nurl = \"mqtt://127.0.0.1:1883\"\ndevice = \"pi\"\n",
            "c.toml".as_ref(),
        )
        .unwrap();
        Settings::from_config(&cfg.mqtt).unwrap().unwrap()
    }

    #[test]
    fn check_says_what_keeps_mqtt_off() {
        let parse = |t: &str| crate::config::Config::parse(t, "c.toml".as_ref()).unwrap();
        let c = parse("[mqtt]\nurl = \"mqtt://b\"\npassword_env = \"BRAMBLE_TEST_UNSET_PW\"\n");
        assert_eq!(
            check_warnings(&c),
            ["[mqtt] password_env names BRAMBLE_TEST_UNSET_PW but it is not set: MQTT stays off"]
        );
        let c = parse("[mqtt]\npublish_allow = [\"a/#\"]\n");
        assert!(check_warnings(&c)[0].contains("no `url`"));
        let c = parse("[mqtt]\nurl = \"mqtt://b\"\ntopic_prefix = \"a/+\"\n");
        assert!(check_warnings(&c)[0].contains("topic_prefix `a/+`"));
        // Configured reports into our own input topics, or to a `$` topic: said, and set aside at delivery.
        let c = parse(
            "[heartbeat]\ndeliver = [\"mqtt:bramble/pi/in\"]\n[mqtt]\nurl = \"mqtt://b\"\ndevice = \"pi\"\n\
             [[mqtt.trigger]]\ntopic = \"a/b\"\nexec = \"cat\"\ndeliver = [\"mqtt:a/b\"]\n",
        );
        let w = check_warnings(&c);
        assert!(w.iter().filter(|w| w.contains("own input topics")).count() == 2, "{w:?}");
        assert!(check_warnings(&parse("")).is_empty());
        let c = parse("[mqtt]\nurl = \"mqtt://b\"\nmax_packet = 100\n");
        assert!(check_warnings(&c)[0].contains("max_packet 100 must be between 1024"), "{:?}", check_warnings(&c));
        let err = crate::config::Config::parse("[mqtt]\nprotocol = \"4\"\n", "c.toml".as_ref()).unwrap_err();
        assert!(err.to_string().contains("3.1.1"), "{err}");
    }

    #[test]
    fn filters_match_like_a_broker() {}

    #[test]
    fn defaults_from_the_device_name() {
        let s = settings();
        assert_eq!(s.prefix, "bramble/pi");
        assert_eq!(s.client_id, "pi");
        assert_eq!(s.topic("status"), "bramble/pi/status");
    }

    #[test]
    fn keep_alive_defaults_to_five_minutes_and_is_configurable() {
        let s = settings();
        assert_eq!(s.keep_alive, Duration::from_secs(300));
        assert_eq!(s.options().unwrap().keep_alive(), Duration::from_secs(300), "announced in CONNECT");
        let parse = |t: &str| crate::config::Config::parse(t, "c.toml".as_ref()).unwrap();
        let c = parse("[mqtt]\nurl = \"mqtt://b\"\nkeep_alive = \"90s\"\n");
        let s = Settings::from_config(&c.mqtt).unwrap().unwrap();
        assert_eq!(s.options().unwrap().keep_alive(), Duration::from_secs(90));
        // rumqttc asserts ≥ 5 s and MQTT carries seconds in a u16: refused, not a panic.
        for bad in ["4s", "65536s"] {
            let c = parse(&format!("[mqtt]\nurl = \"mqtt://b\"\nkeep_alive = \"{bad}\"\n"));
            assert!(matches!(Settings::from_config(&c.mqtt), Err(MqttError::KeepAlive(_))), "{bad}");
            assert!(check_warnings(&c)[0].contains("keep_alive"), "{bad}");
        }
    }

    #[test]
    fn inbound_text_and_json() {
        let s = settings();
        let m = inbound_message(&s, b"  hello  ").unwrap();
        assert_eq!((m.text.as_str(), m.conversation.session_key.as_str()), ("hello", "mqtt:bramble/pi"));
        assert_eq!(m.reply_to, Target::Mqtt(Some("bramble/pi/out".into())));
        let m = inbound_message(&s, br#"{"text":"hi","session":"kitchen","reply_to":"home/kitchen/say"}"#).unwrap();
        assert_eq!((m.text.as_str(), m.conversation.session_key.as_str()), ("hi", "mqtt:bramble/pi:kitchen"));
        assert_eq!(m.reply_to, Target::Mqtt(Some("home/kitchen/say".into())));
        // Another channel's session cannot be named from MQTT.
        let err = inbound_message(&s, br#"{"text":"/history 50","session":"telegram:12345"}"#).unwrap_err();
        assert!(err.contains("not a session name"), "{err}");
        assert!(inbound_message(&s, br#"{"text":"#).unwrap_err().contains("not a valid JSON"));
        assert!(inbound_message(&s, br#"{"text":"x","reply_to":"a/#"}"#).unwrap_err().contains("wildcard"));
        // Never a topic we listen to (the answer would be the next message), nor one a broker disconnects on.
        for (reply_to, says) in [
            ("bramble/pi/in", "own input topics"),
            ("bramble/pi/run/backup", "own input topics"),
            ("homeassistant/button/bramble_pi/run_x/config", "own input topics"),
            ("a/\\u0000", "U+0000"),
            ("$SYS/broker", "`$`"),
        ] {
            let payload = format!(r#"{{"text":"x","reply_to":"{reply_to}"}}"#);
            let err = inbound_message(&s, payload.as_bytes()).unwrap_err();
            assert!(err.contains(says), "{reply_to}: {err}");
        }
        assert!(inbound_message(&s, b"   ").is_err());
    }

    #[test]
    fn heartbeat_reports_have_their_own_topic() {
        let s = settings();
        let topic = |target: Target, source: ReportSource| MqttChannel::topic_for(&s, &target, &source).unwrap();
        assert_eq!(topic(Target::Mqtt(None), ReportSource::Heartbeat), "bramble/pi/heartbeat");
        assert_eq!(topic(Target::Mqtt(None), ReportSource::Job("x".into())), "bramble/pi/out");
        assert_eq!(topic(Target::Mqtt(None), ReportSource::Alert), "bramble/pi/alert");
        assert_eq!(topic(Target::Mqtt(Some("a/b".into())), ReportSource::Heartbeat), "a/b");
    }

    #[test]
    fn tls_uses_the_ring_provider_and_system_roots() {
        crate::install_crypto();
        let cfg = crate::config::Config::parse("[mqtt]\nurl = \"mqtts://broker.lan\"\n", "c.toml".as_ref()).unwrap();
        let s = Settings::from_config(&cfg.mqtt).unwrap().unwrap();
        assert!(s.tls && s.port == 8883);
        let o = s.options().unwrap();
        assert!(matches!(o.transport(), rumqttc::Transport::Tls(_)));
        assert!(!o.clean_start());
        assert_eq!(o.session_expiry_interval(), Some(SESSION_EXPIRY), "the broker keeps the session");
        assert_eq!(o.max_packet_size(), Some(MAX_INCOMING as u32), "told to the broker in CONNECT");
    }

    #[test]
    fn publishing_while_disconnected_is_refused() {
        let link = Link::new(settings());
        assert_eq!(link.publish("a", b"x".to_vec(), false).unwrap_err(), PublishError::NotConnected);
        assert!(matches!(link.publish("a", vec![0; MAX_PACKET], false).unwrap_err(), PublishError::TooLarge(_)));
        // The broker's Maximum Packet Size: a larger publish would take the connection down.
        let (client, _events) = rumqttc::v5::AsyncClient::new(link.settings.options().unwrap(), 10);
        let client = crate::clients::mqtt::Client::V5(client);
        link.on_connack(client, &[], Some(2000));
        assert!(matches!(link.publish("a", vec![0; 2000], false).unwrap_err(), PublishError::TooLarge(2000)));
        assert!(link.publish("a", vec![0; 100], false).is_ok());
        link.set_retained("big/state", vec![0; 3000]);
        link.set_retained("small/state", b"x".to_vec());
        assert_eq!(link.unsent_count(), 0, "the oversize state is skipped, the rest goes");
        link.on_disconnect();
        // Retained state is kept for the next connection.
        link.set_retained("bramble/pi/jobs/x", b"{}".to_vec());
        assert_eq!(link.retained_value("bramble/pi/jobs/x"), Some(b"{}".to_vec()));
    }

    #[test]
    fn retained_state_waits_for_room_in_the_request_queue() {
        let link = Link::new(settings());
        for i in 0..10 {
            link.set_retained(&format!("t/{i}"), b"x".to_vec());
        }
        // A connection whose request queue holds 4: `online` and three more go now.
        let (client, _events) = rumqttc::v5::AsyncClient::new(link.settings.options().unwrap(), 4);
        let client = crate::clients::mqtt::Client::V5(client);
        link.on_connack(client, &[], None);
        assert_eq!(link.unsent_count(), 7);
        // Disconnected, a change waits too; the next ConnAck sends everything again.
        link.on_disconnect();
        link.set_retained("t/new", b"y".to_vec());
        assert_eq!(link.unsent_count(), 8);
        let (client, _events) = rumqttc::v5::AsyncClient::new(link.settings.options().unwrap(), 100);
        let client = crate::clients::mqtt::Client::V5(client);
        link.on_connack(client, &[], None);
        assert_eq!(link.unsent_count(), 0);
    }
}
