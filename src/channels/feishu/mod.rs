//! The Feishu / Lark channel: the bot's long connection (a WebSocket the
//! bot opens, so no public address is needed — right for a board behind
//! NAT) for messages and card presses, and delivery to `feishu:<chat_id>`.
//!
//! - [`crate::clients::feishu`]: the wire (frames, endpoint, token, REST).
//! - [`handler`]: what one event or card press does (allow-list, loops,
//!   groups, duplicates, Done / Snooze).
//! - [`parts`]: split payloads joined, within a cap.
//! - [`deliver`]: the `Channel` that posts reports (text; reminders as
//!   cards; files uploaded and sent as image / file messages).
//! - [`progress`]: a chat turn's status card, edited as it runs tools.
//! - [`files`]: a file a user sends, fetched into the workspace inbox.
//! - [`state`]: the handled ids, kept across restarts.
//!
//! ## The connection
//!
//! As the official SDKs do (larksuite/oapi-sdk-go `ws/client.go`): `POST
//! /callback/ws/endpoint` with the app's id and secret gives a `wss://` URL
//! and a `ClientConfig`; the socket carries binary `pbbp2.Frame`s. We send a
//! ping (a control frame, `type: ping`, the URL's `service_id`) at once and
//! then every `PingInterval` seconds; the server's pong may carry a new
//! `ClientConfig`. A data frame of type `event` or `card` is answered with
//! the same frame whose payload is `{"code":200}` (plus a toast for a card
//! press); an unanswered event is delivered again by the server, which is
//! what "later" uses when the bus is full. Heard nothing for three ping
//! intervals, a closed socket, a failed endpoint call: reconnect with a
//! backoff from 1 s to 60 s. Stopping closes the socket (code 1000).
//!
//! ## Who is answered
//!
//! Only `[feishu] allow_from` open_ids; a stranger's message or card press
//! is ignored and logged once per user (a card press gets "Not allowed.").
//! In groups only messages that @mention the bot. Messages from bots and
//! from ourselves (the loop), other apps' events, non-text messages and
//! malformed payloads are skipped with a log line; an event delivered again
//! (same `event_id` or `message_id`, also after a restart) is answered and
//! not handled twice.

pub mod deliver;
pub mod event;
pub mod files;
pub mod handler;
pub mod parts;
pub mod progress;
pub mod state;
pub mod status;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::bus::InboundMessage;
use crate::clients::feishu::frame::{Frame, METHOD_CONTROL, METHOD_DATA};
use crate::clients::feishu::{Client, ClientConfig, FeishuError};
use crate::clients::ws::{self, Message, Socket, WsError};
use crate::config::FeishuConfig;
use crate::policy::feishu::FeishuPolicy;
use crate::util::timer::Backoff;
use crate::work::reminders::Reminders;
use handler::{Answer, Handler};

/// Backoff after a failed connection: from 1 s, doubling, to this.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// How long the endpoint call and the WebSocket handshake may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest WebSocket message taken (a part of a split payload, with its frame).
const MAX_MESSAGE: usize = parts::MAX_PAYLOAD + 64 * 1024;
/// Ping intervals the server may set, clamped to this range.
const PING_RANGE: (u64, u64) = (5, 600);

/// Why Feishu / Lark cannot start.
#[derive(Debug, thiserror::Error)]
pub enum FeishuChannelError {
    #[error("[feishu] app_secret_env: the variable `{0}` is not set (the app's App Secret)")]
    NoSecret(String),
    #[error(transparent)]
    Api(#[from] FeishuError),
}

/// What the connection and the delivery side share.
pub(crate) struct Shared {
    pub client: Client,
    pub state_dir: PathBuf,
    /// Where a report's files are read from (confined: no path out of it).
    pub workspace: crate::workspace::Workspace,
    /// The chat turns' status cards.
    pub progress: progress::Statuses,
}

/// Feishu / Lark, configured: the delivery side and the connection share one client.
pub struct Feishu {
    shared: Arc<Shared>,
    cfg: FeishuConfig,
    policy: FeishuPolicy,
    reminders: Option<Reminders>,
}

/// The daemon's Feishu / Lark connection: until the stop, accepted messages go to `inbound`.
pub struct FeishuPoller {
    pub feishu: Feishu,
    pub inbound: mpsc::Sender<InboundMessage>,
}

impl FeishuPoller {
    pub async fn run(self, shutdown: crate::util::shutdown::Shutdown) {
        let stop = shutdown.stop_token().clone();
        let handler = Handler::new(self.feishu, self.inbound, stop.clone());
        connect_loop(handler, stop).await
    }
}

impl Feishu {
    /// `None` when `[feishu]` has no app_id. `reminders` makes Done / Snooze
    /// work; reports' files are read from `workspace`.
    pub fn from_config(
        cfg: &FeishuConfig,
        state_dir: &Path,
        workspace: &Path,
        reminders: Option<Reminders>,
    ) -> Result<Option<Feishu>, FeishuChannelError> {
        let Some(app_id) = cfg.app_id.as_deref() else { return Ok(None) };
        let secret = cfg
            .app_secret()
            .ok_or_else(|| FeishuChannelError::NoSecret(cfg.app_secret_env.clone().unwrap_or_default()))?;
        let client = Client::new(&cfg.base(), app_id, secret)?
            .with_upload_timeout(Duration::from_secs(cfg.upload_timeout_secs.max(1)));
        let shared = Shared {
            client,
            state_dir: state_dir.to_path_buf(),
            workspace: crate::workspace::Workspace::strict(workspace),
            progress: progress::Statuses::default(),
        };
        Ok(Some(Feishu {
            shared: Arc::new(shared),
            policy: FeishuPolicy::new(&cfg.allow_from, &cfg.chats, state_dir),
            cfg: cfg.clone(),
            reminders,
        }))
    }

    /// The delivery side, for the outbox.
    pub fn channel(&self) -> Arc<dyn crate::delivery::Channel> {
        Arc::new(deliver::FeishuChannel::new(self.shared.clone()))
    }

    /// The status cards of chat turns (it takes only Feishu / Lark conversations).
    pub fn progress(&self) -> Arc<dyn crate::agent::ProgressSink> {
        Arc::new(progress::Progress::new(self.shared.clone()))
    }
}

/// How a connection ended.
enum End {
    Stopped,
    Failed(String),
}

/// Connect, serve, reconnect with backoff, until `stop`.
async fn connect_loop(mut h: Handler, stop: CancellationToken) {
    let mut backoff = Backoff::new(MAX_BACKOFF);
    loop {
        if h.me.is_none() {
            match h.feishu.shared.client.bot_info().await {
                Ok((id, name)) if !id.is_empty() => {
                    tracing::info!(bot = %name, open_id = %id, "Feishu / Lark bot");
                    h.me = Some(id);
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "cannot learn the Feishu / Lark bot's own id yet"),
            }
        }
        let end = tokio::select! {
            r = connect(&h) => match r {
                Ok((socket, service, config)) => {
                    backoff.reset();
                    h.state.connected = Some(jiff::Timestamp::now().to_string());
                    h.save().await;
                    serve(&mut h, socket, service, config, &stop).await
                }
                Err(e) => End::Failed(e),
            },
            _ = stop.cancelled() => End::Stopped,
        };
        match end {
            End::Stopped => return,
            End::Failed(why) => {
                let wait = backoff.next_wait();
                tracing::warn!(error = %why, retry_in = ?wait, "the Feishu / Lark long connection failed; reconnecting");
                h.state.last_error = Some(format!("{}: {why}", jiff::Timestamp::now()));
                h.save().await;
                if sleep_or_stop(wait, &stop).await {
                    return;
                }
            }
        }
    }
}

/// The endpoint call and the WebSocket handshake.
async fn connect(h: &Handler) -> Result<(Socket, i32, ClientConfig), String> {
    let ep = tokio::time::timeout(CONNECT_TIMEOUT, h.feishu.shared.client.ws_endpoint())
        .await
        .map_err(|_| format!("no endpoint within {CONNECT_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
    let endpoint = ws::Endpoint::parse(&ep.url)?;
    let socket = Socket::connect_with_cap(&endpoint, CONNECT_TIMEOUT, MAX_MESSAGE).await.map_err(|e| e.to_string())?;
    tracing::info!(host = %endpoint.host, "Feishu / Lark long connection up");
    Ok((socket, ep.service_id(), ep.config))
}

fn ping_every(c: &ClientConfig) -> Duration {
    Duration::from_secs(c.ping_interval.clamp(PING_RANGE.0, PING_RANGE.1))
}

/// Serve one connection until it fails or `stop`.
async fn serve(
    h: &mut Handler,
    mut socket: Socket,
    service: i32,
    config: ClientConfig,
    stop: &CancellationToken,
) -> End {
    let mut every = ping_every(&config);
    let mut parts = parts::Parts::default();
    let mut heard = Instant::now();
    let mut next_ping = tokio::time::Instant::now();
    loop {
        let got = tokio::select! {
            m = socket.recv() => m,
            _ = tokio::time::sleep_until(next_ping) => {
                if heard.elapsed() > every * 3 {
                    return End::Failed(format!("nothing heard for {:?}", heard.elapsed()));
                }
                if let Err(e) = socket.send_binary(&Frame::ping(service).encode()).await {
                    return End::Failed(e.to_string());
                }
                next_ping = tokio::time::Instant::now() + every;
                continue;
            }
            _ = stop.cancelled() => {
                socket.close().await;
                return End::Stopped;
            }
        };
        heard = Instant::now();
        let result = match got {
            Ok(Message::Binary(bytes)) => frame(h, &mut socket, &mut parts, &bytes, &mut every).await,
            Ok(Message::Ping(p)) => socket.pong(&p).await,
            Ok(Message::Text(_) | Message::Pong(_)) => Ok(()),
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            return End::Failed(e.to_string());
        }
    }
}

/// One binary message: a control frame read, a data frame handled and answered.
async fn frame(
    h: &mut Handler,
    socket: &mut Socket,
    parts: &mut parts::Parts,
    bytes: &[u8],
    every: &mut Duration,
) -> Result<(), WsError> {
    let f = match Frame::decode(bytes) {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(error = %e, len = bytes.len(), "a malformed Feishu frame was skipped");
            return Ok(());
        }
    };
    match f.method {
        METHOD_CONTROL => {
            let pushed = (f.header("type") == Some("pong")).then_some(f.payload.as_deref()).flatten();
            if let Some(c) = pushed.and_then(|p| serde_json::from_slice::<ClientConfig>(p).ok()) {
                *every = ping_every(&c);
            }
            Ok(())
        }
        METHOD_DATA => {
            let kind = f.header("type").unwrap_or_default().to_string();
            let id = f.header("message_id").unwrap_or_default().to_string();
            let answer = match parts.add(&f) {
                Ok(None) => return Ok(()),
                Ok(Some(payload)) => h.payload(&kind, &id, &payload).await,
                Err(e) => {
                    tracing::error!(message_id = %id, "a Feishu payload was refused: {e}");
                    Answer::Done { code: 200, data: None }
                }
            };
            match answer {
                Answer::Later => Ok(()),
                Answer::Done { code, data } => socket.send_binary(&response(f, code, data).encode()).await,
            }
        }
        _ => Ok(()),
    }
}

/// The answer to data frame `f`: the same frame, its payload `{"code",...}`
/// (the SDK's `Response`, whose `data` is bytes, so base64 in JSON).
fn response(mut f: Frame, code: u16, data: Option<serde_json::Value>) -> Frame {
    use base64::Engine as _;
    let data = data.map(|d| base64::engine::general_purpose::STANDARD.encode(d.to_string()));
    let body = serde_json::json!({"code": code, "headers": null, "data": data});
    f.headers.push(("biz_rt".into(), "0".into()));
    f.payload = Some(body.to_string().into_bytes());
    f
}

/// Sleep for `d`; `true` if `stop` fired first.
async fn sleep_or_stop(d: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = crate::util::timer::sleep(d) => false,
        _ = stop.cancelled() => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_is_the_frame_with_a_code() {
        let f = Frame {
            method: METHOD_DATA,
            headers: vec![("type".into(), "event".into()), ("message_id".into(), "m".into())],
            payload: Some(b"{}".to_vec()),
            ..Default::default()
        };
        let r = Frame::decode(&response(f, 200, None).encode()).unwrap();
        assert_eq!(r.header("message_id"), Some("m"));
        let body: serde_json::Value = serde_json::from_slice(r.payload.as_deref().unwrap()).unwrap();
        assert_eq!(body["code"], 200);
        assert_eq!(ping_every(&ClientConfig { ping_interval: 0, ..Default::default() }), Duration::from_secs(5));
    }
}
