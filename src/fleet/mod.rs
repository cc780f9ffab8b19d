//! Fleet mode (`[fleet]`, docs/fleet.md): several boards, one chat.
//!
//! The primary owns the chat channels; nodes run their own jobs and answer
//! it. Everything travels over the MQTT broker the home already runs, on the
//! board's one connection (its retained `status` and last will are the
//! presence), under `bramble/<board>/…` ([`topics`]). Commands between
//! boards are signed with the fleet key and checked against a replay window
//! ([`auth`]) on top of the broker's accounts ([`topics::mosquitto_acl`]).
//!
//! - [`service`]: the one task per board (presence, commands, reports, `/on`).
//! - [`relay`]: on a node, the delivery channel that sends reports for the
//!   primary's chats to it; the primary drops duplicates by key ([`dedup`]).
//! - [`remote`]: the command line's short sessions (`cron add --on`, `fleet status`).
//! - [`once`]: jobs for any board (`--on any`): the board that wins a
//!   put-if-absent on the slot's key in NATS JetStream KV runs it; refused
//!   at `cron add` without `[fleet] nats_url`.
//! - [`standby`]: who polls the chat: the primary, or a standby while the
//!   primary has been offline for `takeover_after`; the update offset shared.
//!
//! Layer: above the channels (it holds the MQTT channel's link and sits in
//! front of the agent's queue), below the daemon that builds it.

pub mod auth;
pub mod chat;
pub mod dedup;
pub mod once;
pub mod presence;
pub mod relay;
pub mod remote;
pub mod service;
pub mod standby;
pub mod topics;
pub mod wire;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Notify};

use crate::bus::InboundMessage;
use crate::channels::mqtt::{FleetMessage, Link};
use crate::config::fleet::{BoardName, FleetConfig, FleetConfigError, FleetRole};
use crate::delivery::{Channels, Reports};
use crate::scheduler::JobStore;
pub use service::{FleetService, Reach};

/// The fleet's queue from the MQTT router.
const QUEUE: usize = 64;

/// Why a fleet operation cannot be done.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("this board is not in a fleet: set [fleet] name (docs/fleet.md)")]
    Off,
    #[error(transparent)]
    Config(FleetConfigError),
    #[error("the MQTT broker: {0}")]
    Broker(String),
    #[error("this board ({0}) is a node: only the primary sends commands to boards")]
    NotPrimary(BoardName),
    #[error("`--on {0}` is this board: leave out --on")]
    SelfBoard(BoardName),
    #[error("no answer from {0} within {1} s: is it online? (`bramble fleet status`)")]
    NoAnswer(BoardName, u64),
    #[error(
        "`--on any` needs [fleet] nats_url (a NATS JetStream server decides which board runs each slot); without it the job would run on every board"
    )]
    AnyWithoutNats,
}

/// The MQTT filters the fleet listens to (empty without `[fleet]`): set on
/// the MQTT settings before the link is made, so the router sends them here.
pub fn filters(c: &FleetConfig) -> Vec<String> {
    match (c.board(), c.primary_of_node()) {
        (Some(me), Ok(primary)) => {
            let mut v = topics::subscriptions(me, primary);
            v.push(standby::filter());
            v
        }
        _ => Vec::new(),
    }
}

/// What the daemon hands the fleet.
pub struct Wiring<'a> {
    pub config: &'a FleetConfig,
    pub state_dir: &'a Path,
    pub link: Arc<Link>,
    pub jobs: JobStore,
    pub reports: Reports,
    /// The agent's queue (turns asked for by the primary go there).
    pub agent: mpsc::Sender<InboundMessage>,
    pub reach: Reach,
    pub capabilities: Vec<String>,
}

/// The parts of a [`FleetService`].
pub(crate) struct Parts {
    me: BoardName,
    role: FleetRole,
    primary: Option<BoardName>,
    link: Arc<Link>,
    signer: auth::Signer,
    guard: auth::Guard,
    messages: mpsc::Receiver<FleetMessage>,
    chat_in: Option<mpsc::Receiver<InboundMessage>>,
    agent: mpsc::Sender<InboundMessage>,
    jobs: JobStore,
    jobs_changed: Arc<Notify>,
    reports: Reports,
    delivered: dedup::Delivered,
    reach: Reach,
    timeout: Duration,
    capabilities: Vec<String>,
    acks: relay::Acks,
}

/// The fleet, built: its task, the queue the MQTT router feeds, the
/// notification of changed jobs, and (on the primary) the agent's new inbound end.
pub struct Fleet {
    pub service: FleetService,
    pub router: mpsc::Sender<FleetMessage>,
    pub jobs_changed: Arc<Notify>,
}

/// Build the fleet for this board (`Ok(None)`: no `[fleet]`). `chat` is the
/// channels' inbound queue; the receiver returned is the one the agent
/// reads: on the primary a new one, which the fleet fills with all but its
/// own commands (`/on`, `/boards`); otherwise `chat` itself. On a node, the
/// chat channels it lacks are relayed to the primary (added to `channels`).
pub fn build(
    w: Wiring<'_>,
    chat: mpsc::Receiver<InboundMessage>,
    channels: &mut Channels,
) -> (Result<Option<Fleet>, FleetError>, mpsc::Receiver<InboundMessage>) {
    let Some(me) = w.config.board().cloned() else { return (Ok(None), chat) };
    let checked = w.config.primary_of_node().and_then(|p| Ok((p.cloned(), w.config.key()?)));
    let (primary, key) = match checked {
        Ok(pair) => pair,
        Err(e) => return (Err(FleetError::Config(e)), chat),
    };
    let signer = auth::Signer::new(key.expose().as_bytes());
    let guard = auth::Guard::new(signer.clone(), me.clone(), w.config.replay_window.get());
    let (router, messages) = mpsc::channel(QUEUE);
    let acks = relay::Acks::default();
    let (agent, chat_in, agent_rx) = match &primary {
        None => {
            let (tx, rx) = mpsc::channel(crate::bus::BUS_CAPACITY);
            (tx, Some(chat), rx)
        }
        Some(p) => {
            for name in relay::RELAYED {
                if !channels.names().contains(&name) {
                    let (signer, acks) = (signer.clone(), acks.clone());
                    let (me, primary, link) = (me.clone(), p.clone(), w.link.clone());
                    channels.add(Arc::new(relay::Relay { name, me, primary, link, signer, acks }));
                }
            }
            (w.agent, None, chat)
        }
    };
    let jobs_changed = Arc::new(Notify::new());
    let parts = Parts {
        me,
        role: w.config.role,
        primary,
        link: w.link,
        signer,
        guard,
        messages,
        chat_in,
        agent,
        jobs: w.jobs,
        jobs_changed: jobs_changed.clone(),
        reports: w.reports,
        delivered: dedup::Delivered::open(w.state_dir, w.config.dedup_window.get()),
        reach: w.reach,
        timeout: w.config.timeout.get(),
        capabilities: w.capabilities,
        acks,
    };
    (Ok(Some(Fleet { service: FleetService::new(parts), router, jobs_changed })), agent_rx)
}

impl Fleet {
    /// This board's chat poller shares the bot with the fleet (the primary,
    /// or a standby): the poller's end of the seam, the fleet keeps the other.
    /// `None` on a plain node, which polls no chat.
    pub fn share_chat(&mut self, c: &FleetConfig) -> Option<crate::channels::telegram::shared::Shared> {
        if c.role == FleetRole::Node {
            return None;
        }
        let (poller, seat) = crate::channels::telegram::shared::seam();
        let s = &mut self.service;
        let grace = c.takeover_after.get();
        s.seat = Some(standby::Seat::new(seat, s.me.clone(), s.role, s.primary.clone(), grace));
        Some(poller)
    }
}

/// `bramble status`/`doctor`: what the fleet config says, in one line.
pub fn status_line(c: &crate::config::Config) -> String {
    let Some(me) = c.fleet.board() else { return "off (no [fleet] name)".into() };
    match c.fleet.check(&c.mqtt) {
        Ok(()) => match &c.fleet.primary {
            Some(p) if c.fleet.role != FleetRole::Primary => {
                format!("{me}, {} of {p}, over {}", c.fleet.role.as_str(), describe_broker(c))
            }
            _ => format!("{me}, primary, over {}", describe_broker(c)),
        },
        Err(e) => format!("OFF: {e}"),
    }
}

fn describe_broker(c: &crate::config::Config) -> String {
    match crate::clients::mqtt::Settings::from_config(&c.mqtt) {
        Ok(Some(s)) => format!("{}:{}", s.host, s.port),
        _ => "no broker".into(),
    }
}
