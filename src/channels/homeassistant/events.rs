//! Home Assistant's WebSocket API (`/api/websocket`): one connection that
//! authenticates, subscribes to `state_changed`, and feeds the triggers.
//!
//! The exchange, from HA's developer docs: the server sends `auth_required`;
//! we send `{"type":"auth","access_token":…}`; it answers `auth_ok` or
//! `auth_invalid` (and closes). Then `{"id":1,"type":"subscribe_events",
//! "event_type":"state_changed"}` → a `result` with `success`, and from then
//! on `event` messages with that id.
//!
//! ## Staying connected, honestly
//!
//! - **Backoff** 1 s doubling to 60 s; only a connection that lasted
//!   [`STABLE`] resets it, so a server that accepts and drops at once cannot
//!   make a hot loop. A refused token waits the full minute every time: it
//!   will not fix itself, and the error (logged, and in `bramble status`)
//!   says what to do.
//! - **Every connection subscribes anew** — HA keeps no subscription across
//!   connections. Nothing is replayed: events during an outage are gone, and
//!   `for` matches waiting when the connection dropped are cancelled (see
//!   [`super::state_triggers`]).
//! - **Liveness.** HA's server pings every ~55 s (control frames, answered
//!   here). After [`IDLE`] with nothing from the server we send HA's own
//!   `ping` command; no answer within [`DEAD`] more ends the connection.
//! - **State file.** `<state>/homeassistant.json` records the connection's
//!   state and last error when it *changes* (connected, refused, lost), for
//!   `bramble status` in another process; no write while nothing happens.
//!
//! The token is sent in the auth message only; no log line or error has it
//! (what the server says is scrubbed of it and of echoed credentials).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::state_triggers::{Fire, Matcher, StateChange};
use crate::clients::ws::{Endpoint, Message, Socket, WsError};
use crate::config::Secret;

/// Longest reconnect wait (from 1 s, doubling); also the wait after a refused token.
const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// A connection that lasted this long resets the backoff when it ends.
const STABLE: Duration = Duration::from_secs(10);
/// Connect and handshake, and each step of auth and subscribe, within this.
const STEP: Duration = Duration::from_secs(10);
/// Silence from the server after which we ping it.
const IDLE: Duration = Duration::from_secs(60);
/// Silence after our ping after which the connection counts as dead.
const DEAD: Duration = Duration::from_secs(20);

/// Why one connection ended.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("Home Assistant refused the token: {0}. Make a new long-lived access token (your HA profile → Security) and set it in [homeassistant] token_env")]
    AuthInvalid(String),
    #[error("{0}")]
    Ws(#[from] WsError),
    #[error("unexpected answer from Home Assistant: {0}")]
    Unexpected(String),
    #[error("Home Assistant did not answer within {} s", .0.as_secs())]
    Silent(Duration),
}

/// What the connection task needs.
pub struct Connection {
    pub endpoint: Endpoint,
    pub token: Secret,
    pub matcher: Matcher,
    /// Where fired triggers go (bounded: [`super::state_triggers::QUEUE`]).
    pub fires: mpsc::Sender<Fire>,
    pub state: StateFile,
}

impl Connection {
    /// The daemon's service: [`run`] until the stop.
    pub async fn run(self, shutdown: crate::util::shutdown::Shutdown) {
        run(self, shutdown.stop_token().clone()).await
    }
}

/// Connect, subscribe and dispatch until `stop`, reconnecting with backoff.
pub async fn run(mut c: Connection, stop: CancellationToken) {
    let mut backoff = crate::util::timer::Backoff::new(BACKOFF_MAX);
    let mut failures = 0u32;
    loop {
        let started = Instant::now();
        let mut connected = false;
        // Biased: once subscribed, the session sees `stop` itself and sends a
        // close frame before this branch drops it; before that, this ends it.
        let result = tokio::select! {
            biased;
            r = session(&mut c, &mut connected, &stop) => r,
            _ = stop.cancelled() => Ok(()),
        };
        if stop.is_cancelled() {
            c.state.record(WsState::Stopped, None).await;
            return;
        }
        let dropped = c.matcher.reset();
        if dropped > 0 {
            tracing::info!(
                dropped,
                "Home Assistant connection lost: {dropped} `for` trigger(s) waiting were cancelled"
            );
        }
        if connected && started.elapsed() >= STABLE {
            backoff.reset();
            failures = 0;
        }
        let error = match &result {
            Ok(()) => "the connection ended".to_string(),
            // Server text (a close reason, an auth answer) may quote the token back.
            Err(e) => crate::util::secrets::redact(&e.to_string(), &[c.token.expose()]),
        };
        let (wait, state) = match &result {
            Err(SessionError::AuthInvalid(_)) => (BACKOFF_MAX, WsState::Refused),
            _ => (backoff.next_wait(), WsState::Disconnected),
        };
        failures += 1;
        if state == WsState::Refused {
            tracing::error!(url = %c.endpoint.describe(), "{error}; trying again in {wait:?}");
        } else if connected {
            tracing::warn!(url = %c.endpoint.describe(), "Home Assistant connection lost ({error}); reconnecting in {wait:?}");
        } else {
            tracing::warn!(url = %c.endpoint.describe(), attempt = failures, "cannot connect to Home Assistant ({error}); retrying in {wait:?}");
        }
        c.state.record(state, Some(error)).await;
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.cancelled() => {
                c.state.record(WsState::Stopped, None).await;
                return;
            }
        }
    }
}

/// One connection: handshake, auth, subscribe, then events until it ends.
async fn session(c: &mut Connection, connected: &mut bool, stop: &CancellationToken) -> Result<(), SessionError> {
    let mut ws = login(&c.endpoint, &c.token).await?;
    let mut id = 1u64;
    let subscription = id;
    ws.send_text(&json!({"id": id, "type": "subscribe_events", "event_type": "state_changed"}).to_string()).await?;
    let result = loop {
        let m = next_json(&mut ws).await?;
        if m["type"] == "result" && m["id"] == subscription {
            break m;
        }
    };
    if result["success"] != true {
        return Err(SessionError::Unexpected(format!("subscribe_events failed: {}", result["error"])));
    }
    *connected = true;
    tracing::info!(url = %c.endpoint.describe(), "Home Assistant connected: listening to state changes");
    c.state.record(WsState::Connected, None).await;
    let mut last_heard = Instant::now();
    let mut pinged: Option<Instant> = None;
    loop {
        let deadline = match pinged {
            Some(at) => at + DEAD,
            None => last_heard + IDLE,
        };
        let next_due = c.matcher.next_due();
        let message = tokio::select! {
            m = ws.recv() => m?,
            _ = tokio::time::sleep_until(next_due.unwrap_or(deadline)), if next_due.is_some() => {
                let fires = c.matcher.due(Instant::now());
                dispatch(c, fires);
                continue;
            }
            // One kernel timer per quiet minute (tokio's wheel would wake up to three times).
            _ = crate::util::timer::sleep(deadline.saturating_duration_since(Instant::now())) => {
                if pinged.is_some() {
                    return Err(SessionError::Silent(IDLE + DEAD));
                }
                id += 1;
                ws.send_text(&json!({"id": id, "type": "ping"}).to_string()).await?;
                pinged = Some(Instant::now());
                continue;
            }
            _ = stop.cancelled() => {
                ws.close().await;
                return Ok(());
            }
        };
        last_heard = Instant::now();
        pinged = None;
        match message {
            Message::Ping(payload) => ws.pong(&payload).await?,
            Message::Text(text) => {
                let Ok(v) = serde_json::from_str::<Value>(&text) else {
                    tracing::debug!("Home Assistant sent a message that is not JSON; ignored");
                    continue;
                };
                if v["type"] == "event" && v["id"] == subscription {
                    if let Some(change) = StateChange::from_event(&v["event"]) {
                        let fires = c.matcher.on_event(&change, Instant::now());
                        dispatch(c, fires);
                    }
                }
            }
            Message::Pong(_) | Message::Binary(_) => {}
        }
    }
}

/// Connect and authenticate: `auth_required` → `auth` → `auth_ok`. Also
/// `bramble doctor`'s check.
pub async fn login(endpoint: &Endpoint, token: &Secret) -> Result<Socket, SessionError> {
    let mut ws = Socket::connect(endpoint, STEP).await?;
    let first = next_json(&mut ws).await?;
    if first["type"] != "auth_required" {
        return Err(SessionError::Unexpected(format!("expected auth_required, got {}", kind(&first))));
    }
    ws.send_text(&json!({"type": "auth", "access_token": token.expose()}).to_string()).await?;
    let answer = next_json(&mut ws).await?;
    match answer["type"].as_str() {
        Some("auth_ok") => Ok(ws),
        Some("auth_invalid") => {
            let why = answer["message"].as_str().unwrap_or("auth_invalid").to_string();
            Err(SessionError::AuthInvalid(why))
        }
        _ => Err(SessionError::Unexpected(format!("expected auth_ok, got {}", kind(&answer)))),
    }
}

/// Queue fired triggers without waiting; a full queue drops with a warning.
fn dispatch(c: &Connection, fires: Vec<Fire>) {
    for fire in fires {
        let entity = fire.change.entity.clone();
        if c.fires.try_send(fire).is_err() {
            tracing::warn!(entity = %entity, "too many Home Assistant trigger runs waiting: event dropped");
        }
    }
}

/// The next message as JSON, within [`STEP`] (the auth and subscribe exchange).
async fn next_json(ws: &mut Socket) -> Result<Value, SessionError> {
    loop {
        let m = tokio::time::timeout(STEP, ws.recv()).await.map_err(|_| SessionError::Silent(STEP))??;
        match m {
            Message::Text(t) => {
                return serde_json::from_str(&t)
                    .map_err(|_| SessionError::Unexpected("a message that is not JSON".into()))
            }
            Message::Ping(p) => ws.pong(&p).await?,
            _ => {}
        }
    }
}

fn kind(v: &Value) -> String {
    v["type"].as_str().map(|t| format!("`{t}`")).unwrap_or_else(|| "a message without a type".into())
}

/// The connection's state as `bramble status` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WsState {
    Connected,
    Disconnected,
    /// The token was refused.
    Refused,
    /// The daemon stopped.
    Stopped,
}

#[derive(Debug, Serialize, Deserialize)]
struct Recorded {
    state: WsState,
    since: jiff::Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// `<state>/homeassistant.json`: written when the state or its error changes.
pub struct StateFile {
    path: PathBuf,
    last: Option<(WsState, Option<String>)>,
}

impl StateFile {
    pub fn new(state_dir: &Path) -> StateFile {
        StateFile { path: state_dir.join("homeassistant.json"), last: None }
    }

    /// Record a state; nothing is written when it is what was recorded last.
    /// The write (it waits on the disk) runs off the runtime thread.
    pub async fn record(&mut self, state: WsState, error: Option<String>) {
        let now = (state, error);
        if self.last.as_ref() == Some(&now) {
            return;
        }
        let rec = Recorded { state: now.0, since: jiff::Timestamp::now(), error: now.1.clone() };
        let text = serde_json::to_vec(&rec).unwrap_or_default();
        let path = self.path.clone();
        // A status file: a lost update on power loss is harmless, so no directory fsync.
        let written = crate::util::tasks::blocking(move || crate::util::fs::write_atomic_relaxed(&path, &text)).await;
        if let Err(e) = written {
            tracing::debug!("cannot write {}: {e}", self.path.display());
        }
        self.last = Some(now);
    }

    /// `connected since …`, `refused since …: why`, or `state unknown` (no daemon has run it).
    pub fn describe(&self) -> String {
        let Ok(text) = std::fs::read(&self.path) else { return "state unknown (no daemon has connected yet)".into() };
        let Ok(r) = serde_json::from_slice::<Recorded>(&text) else { return "state unknown".into() };
        let state = match r.state {
            WsState::Connected => "connected",
            WsState::Disconnected => "DISCONNECTED",
            WsState::Refused => "REFUSED",
            WsState::Stopped => "stopped (the daemon is not running)",
        };
        let since = r.since.strftime("%Y-%m-%d %H:%M:%S UTC");
        match r.error {
            Some(e) => format!("{state} since {since}: {e}"),
            None => format!("{state} since {since}"),
        }
    }
}

/// Home Assistant's event tasks, built and not started.
pub struct HaEvents {
    pub connection: Connection,
    pub triggers: TriggerRunner,
}

/// The trigger runner ([`super::state_triggers::run`]): the stop ends taking fires, the abort cancels runs.
pub struct TriggerRunner {
    triggers: Arc<[crate::config::HaTrigger]>,
    fires: mpsc::Receiver<Fire>,
    deps: crate::work::firing::TriggerDeps,
}

impl TriggerRunner {
    pub async fn run(self, shutdown: crate::util::shutdown::Shutdown) {
        let (stop, abort) = (shutdown.stop_token().clone(), shutdown.abort_token().clone());
        super::state_triggers::run(self.triggers, self.fires, self.deps, stop, abort).await
    }
}

/// The connection and the trigger runner, built and not started (`None` without triggers).
pub fn services(
    rest: &crate::clients::ha_rest::HaRest,
    config: &crate::config::HomeAssistantConfig,
    state_dir: &Path,
    deps: crate::work::firing::TriggerDeps,
) -> Option<HaEvents> {
    if config.trigger.is_empty() {
        return None;
    }
    let endpoint = match Endpoint::under(rest.base(), "/api/websocket") {
        Ok(e) => e,
        Err(e) => {
            tracing::error!("Home Assistant triggers are off: {e}");
            return None;
        }
    };
    let (tx, rx) = mpsc::channel(super::state_triggers::QUEUE);
    let triggers: Arc<[crate::config::HaTrigger]> = config.trigger.clone().into();
    let runner = TriggerRunner { triggers, fires: rx, deps };
    let connection = Connection {
        endpoint,
        token: rest.token().clone(),
        matcher: Matcher::new(&config.trigger),
        fires: tx,
        state: StateFile::new(state_dir),
    };
    Some(HaEvents { connection, triggers: runner })
}
