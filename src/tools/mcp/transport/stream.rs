//! Streamable HTTP's event streams: the answer to a POST (resumed when the
//! server ends it early) and the server's own GET stream.
//!
//! **Answers** ([`answer`]): a POST's `text/event-stream` carries the
//! server's requests and notifications, then our answer. A 2025-11-25 server
//! may end that stream before the answer after a *priming* event (an `id`,
//! often a `retry:`), expecting the client to come back with a GET carrying
//! `Last-Event-ID` after `retry` milliseconds (clamped to
//! [`MIN_RETRY`]..=[`MAX_RETRY`]) and to read the rest there. We do, at most
//! [`MAX_RESUMES`] times, giving up after [`RESUME_FAILURES`] failed GETs in a
//! row with an error that says so — a dead server fails the call, it never
//! hangs to the timeout. A stream with no event id cannot be resumed: the
//! call fails at once, as before.
//!
//! **The server's stream** ([`listen`]): after `initialize` a GET opens the
//! stream on which a server sends what is not an answer to a POST —
//! `notifications/tools/list_changed`, `ping`, `elicitation/create` and
//! other requests (answered at once by [`Peer::incoming`]). 405 means the
//! server offers none; a redirect is refused (our headers carry secrets); a
//! 4xx ends it; a stream that ends or breaks is opened again after `retry`,
//! then with a backoff growing while the streams bring nothing (to one
//! attempt a minute), and given up after [`LISTEN_FAILURES`] failed attempts
//! in a row. Memory is bounded per event ([`MAX_MESSAGE`]); a malformed event
//! is skipped; replies are sent one by one, so a flood is paced by our POSTs.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::super::rpc::{self, McpError, Peer, MAX_MESSAGE};
use super::super::sse;
use super::http::{content_type, describe, status_error, Endpoint};

/// The wait before resuming when the server named none.
pub const DEFAULT_RETRY: Duration = Duration::from_secs(1);
/// The shortest wait honoured (a `retry: 0` would be a busy loop).
pub const MIN_RETRY: Duration = Duration::from_millis(100);
/// The longest wait honoured (a hostile `retry:` does not park a call).
pub const MAX_RETRY: Duration = Duration::from_secs(10);
/// Resumptions of one answer at most.
pub const MAX_RESUMES: u32 = 50;
/// Failed resumption GETs in a row before the call fails.
pub const RESUME_FAILURES: u32 = 3;
/// Failed attempts in a row to open the server's stream before giving up on it.
pub const LISTEN_FAILURES: u32 = 8;
/// The longest wait between two openings of the server's stream.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// The server's `retry:` as a wait, clamped.
pub fn retry_wait(ms: Option<u64>) -> Duration {
    ms.map_or(DEFAULT_RETRY, Duration::from_millis).clamp(MIN_RETRY, MAX_RETRY)
}

/// Where reading a stream stopped.
enum End {
    /// Our request was answered.
    Answered,
    /// The stream ended (cleanly, or broken with the error).
    Closed(Option<McpError>),
    /// The stream cannot go on (an oversized or, for an answer, malformed event).
    Failed(McpError),
}

/// A parser for the next stream of the same conversation: the last event id and `retry` carry over.
fn carry(old: &sse::Parser) -> sse::Parser {
    let mut p = sse::Parser::new(MAX_MESSAGE);
    p.last_id = old.last_id.clone();
    p.retry = old.retry;
    p
}

/// Send our replies to the server's requests, in order; the first failure.
pub async fn reply_all(endpoint: &Endpoint, replies: Vec<Value>) -> Result<(), McpError> {
    for reply in replies {
        endpoint.send(&reply).await?;
    }
    Ok(())
}

/// Read one event stream into the peer until it ends (or, with `until`, that
/// request is answered); the count of messages read.
async fn pump(
    endpoint: &Endpoint,
    peer: &Peer,
    mut resp: reqwest::Response,
    parser: &mut sse::Parser,
    until: Option<i64>,
) -> (End, usize) {
    let mut messages = 0;
    loop {
        let chunk = match resp.chunk().await {
            Ok(Some(c)) => c,
            Ok(None) => return (End::Closed(None), messages),
            Err(e) => return (End::Closed(Some(McpError::Connection(describe(&e, &endpoint.headers)))), messages),
        };
        let Ok(events) = parser.feed(&chunk) else { return (End::Failed(McpError::TooLarge), messages) };
        for event in events.into_iter().filter(|e| e.name == "message" && !e.data.trim().is_empty()) {
            match rpc::parse(event.data.as_bytes()) {
                Ok(msg) => {
                    messages += 1;
                    if let Err(e) = reply_all(endpoint, peer.incoming(msg)).await {
                        tracing::debug!("mcp: a reply to the server failed: {e}");
                    }
                }
                Err(e) if until.is_some() => return (End::Failed(e), messages),
                Err(e) => tracing::debug!("mcp: skipped an event of the server's stream: {e}"),
            }
        }
        if until.is_some_and(|id| !peer.in_flight().contains(&id)) {
            return (End::Answered, messages); // the rest of the stream is not ours to wait for
        }
    }
}

/// Why a resumption GET gave no stream.
enum Refusal {
    /// Worth another try (no connection, a 5xx).
    Unreachable(McpError),
    /// Final (405, a redirect, a 4xx, not an event stream).
    Final(McpError),
}

/// GET the stream after `last_id`.
async fn reopen(endpoint: &Endpoint, last_id: &str) -> Result<reqwest::Response, Refusal> {
    let (resp, had_session) = endpoint.get(Some(last_id)).await.map_err(|e| match e {
        McpError::Connection(_) => Refusal::Unreachable(e),
        other => Refusal::Final(other),
    })?;
    let status = resp.status();
    let why = match status {
        s if s.is_success() && content_type(&resp).starts_with("text/event-stream") => return Ok(resp),
        s if s.is_success() => format!("it answered `{}`, not an event stream", content_type(&resp)),
        StatusCode::METHOD_NOT_ALLOWED => "it does not offer GET to resume it (405)".to_string(),
        StatusCode::NOT_FOUND if had_session => "it forgot the session; the call's outcome is unknown".to_string(),
        s if s.is_server_error() => return Err(Refusal::Unreachable(status_error(resp, &endpoint.headers).await)),
        _ => status_error(resp, &endpoint.headers).await.to_string(),
    };
    Err(Refusal::Final(McpError::Protocol(format!(
        "the server ended the answer's event stream early and resuming it failed: {why}"
    ))))
}

/// Read the answer to request `id` from its POST's event stream, resuming it as needed.
/// `Ok` when the stream ended (answered, or not: the caller checks).
pub async fn answer(endpoint: &Endpoint, peer: &Peer, id: i64, resp: reqwest::Response) -> Result<(), McpError> {
    let mut parser = sse::Parser::new(MAX_MESSAGE);
    let (mut end, _) = pump(endpoint, peer, resp, &mut parser, Some(id)).await;
    let (mut resumes, mut failures) = (0u32, 0u32);
    loop {
        let broken = match end {
            End::Answered => return Ok(()),
            End::Failed(e) => return Err(e),
            End::Closed(broken) => broken,
        };
        if !peer.in_flight().contains(&id) {
            return Ok(()); // answered elsewhere (the server's own stream)
        }
        let Some(last_id) = parser.last_id.clone() else {
            return broken.map_or(Ok(()), Err); // nothing to resume from
        };
        resumes += 1;
        if resumes > MAX_RESUMES {
            return Err(McpError::Protocol(format!(
                "the server ended the answer's event stream {MAX_RESUMES} times without answering"
            )));
        }
        tokio::time::sleep(retry_wait(parser.retry)).await;
        tracing::debug!(id, last_id, "mcp: resuming an answer's event stream");
        match reopen(endpoint, &last_id).await {
            Ok(resp) => {
                failures = 0;
                let mut next = carry(&parser);
                end = pump(endpoint, peer, resp, &mut next, Some(id)).await.0;
                parser = next;
            }
            Err(Refusal::Final(e)) => return Err(e),
            Err(Refusal::Unreachable(e)) => {
                failures += 1;
                if failures >= RESUME_FAILURES {
                    return Err(McpError::Connection(format!(
                        "the server ended the answer's event stream early and could not be reached to resume it \
                         ({failures} tries): {e}"
                    )));
                }
                end = End::Closed(None);
            }
        }
    }
}

/// What one opening of the server's stream came to.
enum Opened {
    /// It ran and ended; the messages it brought.
    Ran(usize),
    /// It could not be opened (worth another try).
    Failed(String),
    /// Not offered, refused, or the session is gone: stop.
    Stop,
}

/// Keep the server's GET stream open until `stop` (see the module's doc).
pub async fn listen(endpoint: std::sync::Arc<Endpoint>, peer: std::sync::Arc<Peer>, stop: CancellationToken) {
    let mut parser = sse::Parser::new(MAX_MESSAGE);
    let (mut failures, mut quiet) = (0u32, 0u32);
    loop {
        let opened = tokio::select! {
            o = open_once(&endpoint, &peer, &mut parser) => o,
            () = stop.cancelled() => return,
        };
        let wait = match opened {
            Opened::Stop => return,
            Opened::Ran(messages) => {
                failures = 0;
                quiet = if messages == 0 { quiet.saturating_add(1) } else { 0 };
                retry_wait(parser.retry).max(backoff(quiet.saturating_sub(1)))
            }
            Opened::Failed(why) => {
                failures += 1;
                if failures >= LISTEN_FAILURES {
                    tracing::warn!(
                        "mcp: gave up on the server's event stream after {failures} failed attempts ({why}); what \
                         it sends on its own (changed tools, requests) is not received until it reconnects"
                    );
                    return;
                }
                tracing::debug!("mcp: the server's event stream failed: {why}");
                retry_wait(parser.retry).max(backoff(failures))
            }
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// 0 for `n == 0`, then 1 s, 2 s, 4 s, … up to [`MAX_BACKOFF`].
fn backoff(n: u32) -> Duration {
    match n {
        0 => Duration::ZERO,
        n => Duration::from_secs(1u64 << (n - 1).min(6)).min(MAX_BACKOFF),
    }
}

async fn open_once(endpoint: &Endpoint, peer: &Peer, parser: &mut sse::Parser) -> Opened {
    let last_id = parser.last_id.clone();
    let (resp, had_session) = match endpoint.get(last_id.as_deref()).await {
        Ok(r) => r,
        Err(e) => return Opened::Failed(e.to_string()),
    };
    let status = resp.status();
    if let Some(why) = crate::util::secrets::redirect_refusal(&resp) {
        tracing::warn!("mcp: the server's event stream is not opened: {why} (the server's `url`)");
        return Opened::Stop;
    }
    if status == StatusCode::METHOD_NOT_ALLOWED {
        tracing::debug!("mcp: the server offers no event stream of its own (405)");
        return Opened::Stop;
    }
    if status == StatusCode::NOT_FOUND && had_session {
        tracing::debug!("mcp: the server forgot the session; its event stream opens with the next one");
        return Opened::Stop;
    }
    if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
        return Opened::Failed(status_error(resp, &endpoint.headers).await.to_string());
    }
    if !status.is_success() {
        let why = status_error(resp, &endpoint.headers).await;
        tracing::debug!("mcp: the server's event stream is not opened: {why}");
        return Opened::Stop;
    }
    if !content_type(&resp).starts_with("text/event-stream") {
        tracing::debug!("mcp: the server's GET answered `{}`, not an event stream", content_type(&resp));
        return Opened::Stop;
    }
    let mut next = carry(parser);
    let (end, messages) = pump(endpoint, peer, resp, &mut next, None).await;
    *parser = next;
    match end {
        End::Failed(e) => {
            tracing::warn!("mcp: the server's event stream was dropped: {e}");
            Opened::Failed(e.to_string())
        }
        End::Closed(Some(e)) if messages == 0 => Opened::Failed(e.to_string()),
        End::Closed(_) | End::Answered => Opened::Ran(messages),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_is_clamped_and_backoff_bounded() {
        assert_eq!(retry_wait(None), DEFAULT_RETRY);
        assert_eq!(retry_wait(Some(500)), Duration::from_millis(500));
        assert_eq!(retry_wait(Some(0)), MIN_RETRY);
        assert_eq!(retry_wait(Some(u64::MAX)), MAX_RETRY);
        assert_eq!(backoff(0), Duration::ZERO);
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(3), Duration::from_secs(4));
        assert_eq!(backoff(40), MAX_BACKOFF);
    }
}
