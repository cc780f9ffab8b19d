//! The gateway connection loop (the wire format is
//! [`crate::clients::discord::gateway`]'s; its header has the sequence).
//!
//! One connection at a time. Each can end four ways: stopped (the daemon
//! stops: close 1000), resume (a drop, an unacknowledged heartbeat, op 7
//! Reconnect, a resumable Invalid Session, an oversize message: reconnect to
//! `resume_gateway_url` and Resume with the session id and the last
//! sequence), identify (the session is gone: 4007 / 4009, or a Resume the
//! server refused with Invalid Session `false`), or fatal (a refused token
//! or intents: logged with what to do; no reconnect, Discord would ban a
//! bot that keeps trying). Reconnects back off from 1 s to 60 s; a
//! connection that reached READY or RESUMED resets the backoff.
//!
//! Every wait is bounded: the connect, the Hello (a silent server), each
//! heartbeat's acknowledgement (the next heartbeat's deadline).
//!
//! Each change of state (connected, resuming, reconnecting, stopped with
//! why) is written for `bramble status` ([`super::state`]).

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::inbound::Handler;
use super::state::{record, Connection, Phase};
use crate::clients::discord::gateway::{self as wire, op, AfterClose, Payload, Ready};
use crate::clients::ws::{Endpoint, Message, Socket, WsError};
use crate::util::timer::Backoff;

/// Backoff after a failed connection: from 1 s, doubling, to this.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// How long connecting (TCP, TLS, the upgrade) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the server may take to say Hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(30);
/// Malformed messages logged per connection (the rest are counted).
const MALFORMED_LOGGED: u32 = 3;

/// A session that can be resumed.
#[derive(Debug, Clone)]
struct Session {
    id: String,
    resume_url: Option<String>,
    /// The last sequence number handled.
    seq: Option<u64>,
}

/// How a connection ended.
#[derive(Debug)]
enum End {
    Stopped,
    Resume(String),
    Identify(String),
    /// Why, and the gateway's close code.
    Fatal(String, Option<u16>),
}

/// Connect, run, reconnect until `stop` (or a fatal refusal).
pub async fn run(mut handler: Handler, stop: CancellationToken) {
    let mut backoff = Backoff::new(MAX_BACKOFF);
    let mut session: Option<Session> = None;
    let dir = handler.state_dir();
    record(&dir, Connection::now(Phase::Connecting, None, None)).await;
    loop {
        let url = match session.as_ref().and_then(|s| s.resume_url.clone()) {
            Some(u) => u,
            None => {
                let url = tokio::select! { u = handler.gateway_url() => u, _ = stop.cancelled() => return };
                match url {
                    Ok(u) => u,
                    Err(e) if e.is_unauthorized() => {
                        tracing::error!(error = %e, "Discord refused the bot token: check [discord] token_env; Discord is off");
                        return;
                    }
                    Err(e) => {
                        let wait = backoff.next_wait();
                        tracing::warn!(error = %e, retry_in = ?wait, "cannot ask Discord for its gateway; trying again");
                        if super::sleep_or_stop(wait, &stop).await {
                            return;
                        }
                        continue;
                    }
                }
            }
        };
        let mut healthy = false;
        let end = connection(&mut handler, &url, &mut session, &mut healthy, &stop).await;
        let conn = match end {
            End::Stopped => return stopped(&dir).await,
            End::Fatal(why, code) => {
                tracing::error!("Discord: {why}; the Discord channel is off until bramble restarts");
                return record(&dir, Connection::now(Phase::Stopped, Some(&why), code)).await;
            }
            End::Resume(why) => {
                tracing::warn!(resumable = session.is_some(), "Discord gateway: {why}; reconnecting");
                let phase = if session.is_some() { Phase::Resuming } else { Phase::Reconnecting };
                Connection::now(phase, Some(&why), None)
            }
            End::Identify(why) => {
                tracing::warn!("Discord gateway: {why}; starting a new session");
                session = None;
                Connection::now(Phase::Reconnecting, Some(&why), None)
            }
        };
        record(&dir, conn).await;
        if healthy {
            backoff.reset();
        }
        if super::sleep_or_stop(backoff.next_wait(), &stop).await {
            return stopped(&dir).await;
        }
    }
}

/// The daemon stops: Discord with it.
async fn stopped(dir: &std::path::Path) {
    record(dir, Connection::now(Phase::Stopped, Some("bramble stopped"), None)).await;
}

/// The URL with the gateway's query (`?v=10&encoding=json`) unless it has one.
fn with_query(url: &str) -> String {
    if url.contains('?') {
        return url.to_string();
    }
    format!("{}/{}", url.trim_end_matches('/'), wire::QUERY)
}

/// One connection: Hello, Identify or Resume, then events and heartbeats.
async fn connection(
    h: &mut Handler,
    url: &str,
    session: &mut Option<Session>,
    healthy: &mut bool,
    stop: &CancellationToken,
) -> End {
    let endpoint = match Endpoint::parse(&with_query(url)) {
        Ok(e) => e,
        Err(why) => {
            *session = None;
            return End::Identify(format!("the gateway URL `{url}` is not usable: {why}"));
        }
    };
    let connect = Socket::connect_with_cap(&endpoint, CONNECT_TIMEOUT, wire::MAX_PAYLOAD);
    let mut socket = tokio::select! {
        s = connect => match s {
            Ok(s) => s,
            Err(e) => return End::Resume(format!("cannot connect to {}: {e}", endpoint.describe())),
        },
        _ = stop.cancelled() => return End::Stopped,
    };
    let hello = tokio::select! {
        r = tokio::time::timeout(HELLO_TIMEOUT, next_payload(&mut socket)) => r,
        _ = stop.cancelled() => return End::Stopped,
    };
    let interval = match hello {
        Ok(Ok(p)) if p.op == op::HELLO => match p.heartbeat_interval() {
            Some(ms) => Duration::from_millis(ms),
            None => return End::Resume("a Hello without a usable heartbeat_interval".into()),
        },
        Ok(Ok(p)) => return End::Resume(format!("the first message was op {}, not Hello", p.op)),
        Ok(Err(e)) => return closed(e),
        Err(_) => return End::Resume(format!("no Hello within {HELLO_TIMEOUT:?}")),
    };
    let token = h.token();
    let first = match session.as_ref() {
        Some(s) => wire::resume(&token, &s.id, s.seq),
        None => wire::identify(&token),
    };
    if let Err(e) = socket.send_text(&first).await {
        return closed(e);
    }
    let next_beat = Instant::now() + interval.mul_f64(wire::jitter());
    let mut conn = Conn { socket, token, interval, next_beat, acked: true, malformed: 0 };
    let end = conn.events(h, session, healthy, stop).await;
    let code = if matches!(end, End::Stopped) { 1000 } else { wire::CLOSE_RESUME };
    conn.socket.close_with(code).await;
    end
}

/// An open connection past Hello.
struct Conn {
    socket: Socket,
    token: String,
    interval: Duration,
    next_beat: Instant,
    /// The last heartbeat was acknowledged.
    acked: bool,
    malformed: u32,
}

impl Conn {
    /// Events and heartbeats until the connection ends.
    async fn events(
        &mut self,
        h: &mut Handler,
        session: &mut Option<Session>,
        healthy: &mut bool,
        stop: &CancellationToken,
    ) -> End {
        loop {
            let msg = tokio::select! {
                _ = stop.cancelled() => return End::Stopped,
                _ = tokio::time::sleep_until(self.next_beat) => {
                    if !self.acked {
                        return End::Resume("the last heartbeat was not acknowledged (a zombie connection)".into());
                    }
                    if let Err(e) = self.beat(session).await {
                        return closed(e);
                    }
                    self.acked = false;
                    self.next_beat = Instant::now() + self.interval;
                    continue;
                }
                m = self.socket.recv() => m,
            };
            let text = match msg {
                Ok(Message::Text(t)) => t,
                Ok(Message::Ping(p)) => match self.socket.pong(&p).await {
                    Ok(()) => continue,
                    Err(e) => return closed(e),
                },
                Ok(Message::Pong(_)) => continue,
                Ok(Message::Binary(b)) => {
                    self.malformed(&format!("a binary message of {} bytes (JSON was asked for)", b.len()));
                    continue;
                }
                Err(e) => return closed(e),
            };
            match Payload::parse(&text) {
                Ok(p) => {
                    if let Some(end) = self.payload(h, p, session, healthy, stop).await {
                        return end;
                    }
                }
                Err(why) => self.malformed(&why),
            }
        }
    }

    /// One gateway message; `Some`: the connection ends.
    async fn payload(
        &mut self,
        h: &mut Handler,
        p: Payload,
        session: &mut Option<Session>,
        healthy: &mut bool,
        stop: &CancellationToken,
    ) -> Option<End> {
        match p.op {
            op::HEARTBEAT_ACK => self.acked = true,
            op::HEARTBEAT => return self.beat(session).await.err().map(closed),
            op::RECONNECT => return Some(End::Resume("the gateway asked for a reconnect (op 7)".into())),
            op::INVALID_SESSION if p.d.as_bool() == Some(true) && session.is_some() => {
                return Some(End::Resume("the gateway invalidated the connection (resumable)".into()));
            }
            op::INVALID_SESSION => {
                // Not resumable: wait 1–5 s, then identify afresh on this connection.
                *session = None;
                tracing::warn!("Discord gateway: the session is invalid; identifying again");
                let wait = Duration::from_secs_f64(1.0 + 4.0 * wire::jitter());
                if super::sleep_or_stop(wait, stop).await {
                    return Some(End::Stopped);
                }
                return self.socket.send_text(&wire::identify(&self.token)).await.err().map(closed);
            }
            op::DISPATCH if !dispatch(h, &p, session, healthy).await => return Some(End::Stopped),
            _ => {}
        }
        None
    }

    /// op 1 with the last sequence handled.
    async fn beat(&mut self, session: &Option<Session>) -> Result<(), WsError> {
        let seq = session.as_ref().and_then(|s| s.seq);
        self.socket.send_text(&wire::heartbeat(seq)).await
    }

    /// Log the first few malformed messages of a connection; they are skipped.
    fn malformed(&mut self, why: &str) {
        self.malformed += 1;
        if self.malformed <= MALFORMED_LOGGED {
            tracing::warn!(count = self.malformed, "a malformed Discord gateway message was skipped: {why}");
        }
    }
}

/// A dispatch: READY / RESUMED kept, anything else to the handler; the
/// sequence moves only once it was handled. `false`: stopping.
async fn dispatch(h: &mut Handler, p: &Payload, session: &mut Option<Session>, healthy: &mut bool) -> bool {
    match p.t.as_deref() {
        Some("READY") => match Ready::read(&p.d) {
            Some(r) => {
                tracing::info!(user = r.user_id, "Discord connected");
                record(&h.state_dir(), Connection::now(Phase::Connected, None, None)).await;
                h.set_me(r.user_id);
                *session = Some(Session { id: r.session_id, resume_url: r.resume_gateway_url, seq: p.s });
                *healthy = true;
                return true;
            }
            None => tracing::warn!("a READY without a session id or user was ignored"),
        },
        Some("RESUMED") => {
            tracing::info!("Discord session resumed");
            record(&h.state_dir(), Connection::now(Phase::Connected, None, None)).await;
            *healthy = true;
        }
        Some(t) if !h.dispatch(t, &p.d).await => return false,
        _ => {}
    }
    if let (Some(s), Some(seq)) = (session.as_mut(), p.s) {
        s.seq = Some(s.seq.map_or(seq, |old| old.max(seq)));
    }
    true
}

/// The next gateway message (for Hello): pings answered, anything else an error.
async fn next_payload(socket: &mut Socket) -> Result<Payload, WsError> {
    loop {
        match socket.recv().await? {
            Message::Text(t) => return Payload::parse(&t).map_err(WsError::Protocol),
            Message::Ping(p) => socket.pong(&p).await?,
            _ => {}
        }
    }
}

/// What a socket error means for the next connection.
fn closed(e: WsError) -> End {
    match &e {
        WsError::Closed { code: Some(code), .. } => match wire::after_close(Some(*code)) {
            AfterClose::Stop => End::Fatal(format!("{} ({e})", wire::close_advice(*code)), Some(*code)),
            AfterClose::Identify => End::Identify(e.to_string()),
            AfterClose::Resume => End::Resume(e.to_string()),
        },
        _ => End::Resume(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_is_added_once() {
        assert_eq!(with_query("wss://gateway.discord.gg"), "wss://gateway.discord.gg/?v=10&encoding=json");
        assert_eq!(with_query("ws://127.0.0.1:9/gw/"), "ws://127.0.0.1:9/gw/?v=10&encoding=json");
        assert_eq!(with_query("ws://h/?v=10"), "ws://h/?v=10");
        assert!(matches!(
            closed(WsError::Closed { code: Some(4004), reason: String::new() }),
            End::Fatal(_, Some(4004))
        ));
        assert!(matches!(closed(WsError::Closed { code: Some(4009), reason: String::new() }), End::Identify(_)));
        assert!(matches!(closed(WsError::TooLarge(1 << 30)), End::Resume(_)));
    }
}
