//! MCP over HTTP: streamable HTTP (2025-03-26 and later) and, as a fallback,
//! the HTTP+SSE transport of 2024-11-05.
//!
//! **Streamable HTTP**: one endpoint; every message is a POST; the answer to a
//! request is either `application/json` (the message) or `text/event-stream`
//! (SSE `message` events, which may carry the server's own requests and
//! notifications before the answer). `initialize` may return an
//! `Mcp-Session-Id` header, sent back on every later request, together with
//! `MCP-Protocol-Version`. A 404 to a request that carried a session id means
//! the server forgot the session: the connection says [`McpError::SessionExpired`]
//! and the caller initializes again. An answer's stream that ends early is
//! resumed, and the server's own GET stream is kept open by a task while the
//! session lives ([`Streamable::listen`]; both in [`super::stream`]). Costs no
//! process and one idle connection at most, so it is the first choice on a Pi.
//!
//! **HTTP+SSE**: a long-lived GET whose first event, `endpoint`, names the
//! URL to POST messages to; answers arrive as `message` events on the GET.
//! A reader task owns that stream; when it ends, the [`Peer`] is closed and
//! the requests in flight fail.
//!
//! No redirect is followed (the client is [`crate::provider::http_client`]'s):
//! the headers carry secrets, and a 3xx is an error naming where it pointed.
//! A server without its own `Authorization` header gets OAuth's
//! ([`super::super::auth`]): a 401 is authorized and the message sent again.
//! What a server answers is scrubbed of those secrets before anyone sees it.
//!
//! Every body is read with a cap ([`MAX_MESSAGE`]): a JSON body by bytes, an
//! event stream by event ([`super::super::sse::Parser`]); more is an error and
//! the connection is dropped rather than buffered.

use std::sync::{Arc, Mutex};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use reqwest::{StatusCode, Url};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::super::auth::Auth;
use super::super::rpc::{self, McpError, Peer, MAX_MESSAGE};
use super::super::sse;
use super::stream;

const SESSION: &str = "mcp-session-id";
const VERSION: &str = "mcp-protocol-version";
const LAST_EVENT_ID: &str = "last-event-id";
/// Characters of an HTTP error body shown.
const EXCERPT: usize = 300;
/// New grants tried for one message at most (a server that refuses every token is not looped on).
const AUTH_RETRIES: u32 = 2;

/// Headers every request of a server carries (its own and the resolved `*_env` secrets).
pub fn build_headers(
    plain: &std::collections::BTreeMap<String, String>,
    from_env: &std::collections::BTreeMap<String, String>,
) -> Result<HeaderMap, McpError> {
    let mut map = HeaderMap::new();
    let bad = |what: String| McpError::Connection(what);
    for (name, value) in plain {
        let header = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| bad(format!("`{name}` is not a valid HTTP header name")))?;
        let mut value = HeaderValue::from_str(value.trim())
            .map_err(|_| bad(format!("the value of header `{name}` is not a valid HTTP header value")))?;
        // An inline token is as secret as one from the environment: scrubbed from errors.
        value.set_sensitive(true);
        map.insert(header, value);
    }
    for (name, spec) in from_env {
        let header = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| bad(format!("`{name}` is not a valid HTTP header name")))?;
        let (prefix, var) = crate::config::mcp::header_from_env(spec);
        let Some(secret) = crate::config::secret_from_env(var) else {
            return Err(bad(format!(
                "header `{name}`: the environment variable {var} is not set (headers_env; or put it in the \
                 service's credentials)"
            )));
        };
        // Never echo the value: it is a token.
        let text = match prefix {
            Some(p) => format!("{p} {}", secret.expose()),
            None => secret.expose().to_string(),
        };
        let mut value = HeaderValue::from_str(&text).map_err(|_| {
            bad(format!("header `{name}`: the value of {var} has characters not allowed in an HTTP header"))
        })?;
        value.set_sensitive(true);
        map.insert(header, value);
    }
    Ok(map)
}

/// Why a request failed at the HTTP level: the error and its causes, scrubbed
/// of the secrets in `headers` and of echoed credentials.
pub(super) fn describe(e: &reqwest::Error, headers: &HeaderMap) -> String {
    redact(&describe_raw(e), headers)
}

/// `text` without the secret header values sent ([`crate::util::secrets`]).
fn redact(text: &str, headers: &HeaderMap) -> String {
    crate::util::secrets::redact(text, &crate::util::secrets::sensitive_values(headers))
}

fn describe_raw(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

/// An HTTP status that is not success, with an excerpt of the body (scrubbed
/// as [`describe`] says). A redirect is refused: the headers carry secrets.
pub(super) async fn status_error(resp: reqwest::Response, headers: &HeaderMap) -> McpError {
    if let Some(why) = crate::util::secrets::redirect_refusal(&resp) {
        return McpError::Protocol(format!("{why} (the server's `url`)"));
    }
    let status = resp.status();
    let body = read_capped(resp, 4096).await.map(|(b, _)| b).unwrap_or_default();
    let text = String::from_utf8_lossy(&body);
    let text: String = text.trim().chars().take(EXCERPT).collect();
    let hint = match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => " (check the server's `headers` / `headers_env`)",
        _ => "",
    };
    let text = redact(&text, headers);
    McpError::Protocol(format!(
        "HTTP {status}{hint}{}",
        if text.is_empty() { String::new() } else { format!(": {text}") }
    ))
}

/// The body, at most `cap` bytes; `true` when there was more (not read).
async fn read_capped(mut resp: reqwest::Response, cap: usize) -> Result<(Vec<u8>, bool), reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        if body.len() + chunk.len() > cap {
            return Ok((body, true));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, false))
}

pub(super) fn content_type(resp: &reqwest::Response) -> String {
    resp.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_ascii_lowercase()
}

/// A streamable HTTP server's endpoint: where to POST and GET, with the
/// headers every request carries (the server's own, the session, the
/// negotiated revision).
pub struct Endpoint {
    client: reqwest::Client,
    url: Url,
    pub(super) headers: HeaderMap,
    session: Mutex<Option<HeaderValue>>,
    protocol: Mutex<Option<HeaderValue>>,
    /// OAuth, for a server without its own `Authorization` header.
    auth: Option<Arc<Auth>>,
}

impl Endpoint {
    fn stamp(&self, mut req: reqwest::RequestBuilder) -> (reqwest::RequestBuilder, bool) {
        let session = self.session.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let protocol = self.protocol.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let had_session = session.is_some();
        if let Some(s) = session {
            req = req.header(SESSION, s);
        }
        if let Some(p) = protocol {
            req = req.header(VERSION, p);
        }
        (req, had_session)
    }

    /// POST one message; the response, and whether a session id was sent.
    /// A 401 (or 403 `insufficient_scope`) is authorized ([`Auth::challenged`])
    /// and the message sent again, at most [`AUTH_RETRIES`] times.
    async fn post(&self, body: &Value) -> Result<(reqwest::Response, bool), McpError> {
        let mut retries = 0;
        loop {
            let bearer = match &self.auth {
                Some(auth) => auth.bearer().await,
                None => None,
            };
            let mut req = self
                .client
                .post(self.url.clone())
                .headers(self.headers.clone())
                .header(ACCEPT, "application/json, text/event-stream")
                .json(body);
            if let Some(b) = &bearer {
                req = req.header(AUTHORIZATION, b.clone());
            }
            let (req, had_session) = self.stamp(req);
            let resp = req.send().await.map_err(|e| McpError::Connection(describe(&e, &self.headers)))?;
            if let Some(s) = resp.headers().get(SESSION) {
                *self.session.lock().unwrap_or_else(|p| p.into_inner()) = Some(s.clone());
            }
            let status = resp.status();
            let refused = status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN;
            if let (Some(auth), true) = (&self.auth, refused && retries < AUTH_RETRIES) {
                match auth.challenged(status, resp.headers(), bearer.as_ref()).await {
                    Ok(true) => {
                        retries += 1;
                        continue;
                    }
                    Ok(false) => {}
                    Err(e) => return Err(McpError::Auth(e.to_string())),
                }
            }
            return Ok((resp, had_session));
        }
    }

    /// Send a notification or a reply (the server answers 202 with no body).
    pub async fn send(&self, msg: &Value) -> Result<(), McpError> {
        let (resp, _) = self.post(msg).await?;
        if !resp.status().is_success() {
            return Err(status_error(resp, &self.headers).await);
        }
        Ok(())
    }

    /// GET the event stream (the server's own, or a resumed one after `last_id`);
    /// the response as it came, and whether a session id was sent.
    pub async fn get(&self, last_id: Option<&str>) -> Result<(reqwest::Response, bool), McpError> {
        let mut req =
            self.client.get(self.url.clone()).headers(self.headers.clone()).header(ACCEPT, "text/event-stream");
        if let Some(b) = match &self.auth {
            Some(auth) => auth.bearer().await,
            None => None,
        } {
            req = req.header(AUTHORIZATION, b);
        }
        let (mut req, had_session) = self.stamp(req);
        if let Some(id) = last_id {
            let value = HeaderValue::from_str(id)
                .map_err(|_| McpError::Protocol("the server's event id cannot be sent back in a header".into()))?;
            req = req.header(LAST_EVENT_ID, value);
        }
        let resp = req.send().await.map_err(|e| McpError::Connection(describe(&e, &self.headers)))?;
        Ok((resp, had_session))
    }
}

/// A streamable HTTP connection.
pub struct Streamable {
    pub endpoint: Arc<Endpoint>,
    pub peer: Arc<Peer>,
    /// bramble is stopping.
    cancel: CancellationToken,
    /// Stops the GET stream's task (a new session gets a new one; dropping the connection ends it).
    listening: Mutex<Option<CancellationToken>>,
}

impl Drop for Streamable {
    fn drop(&mut self) {
        self.stop_listening();
    }
}

impl Streamable {
    pub fn new(
        client: reqwest::Client,
        url: Url,
        headers: HeaderMap,
        auth: Option<Arc<Auth>>,
        cancel: &CancellationToken,
    ) -> Streamable {
        let endpoint = Endpoint { client, url, headers, session: Mutex::new(None), protocol: Mutex::new(None), auth };
        Streamable {
            endpoint: Arc::new(endpoint),
            peer: Arc::new(Peer::default()),
            cancel: cancel.clone(),
            listening: Mutex::new(None),
        }
    }

    /// Forget the session (before `initialize`).
    pub fn reset_session(&self) {
        self.stop_listening();
        *self.endpoint.session.lock().unwrap_or_else(|p| p.into_inner()) = None;
        *self.endpoint.protocol.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The negotiated protocol version, sent on every request after `initialize`.
    pub fn set_protocol(&self, version: &str) {
        if let Ok(v) = HeaderValue::from_str(version) {
            *self.endpoint.protocol.lock().unwrap_or_else(|p| p.into_inner()) = Some(v);
        }
    }

    /// Open the server's GET event stream for this session, kept by a task ([`stream::listen`]).
    pub fn listen(&self) {
        self.stop_listening();
        let stop = self.cancel.child_token();
        *self.listening.lock().unwrap_or_else(|p| p.into_inner()) = Some(stop.clone());
        tokio::spawn(stream::listen(Arc::clone(&self.endpoint), Arc::clone(&self.peer), stop));
    }

    fn stop_listening(&self) {
        if let Some(stop) = self.listening.lock().unwrap_or_else(|p| p.into_inner()).take() {
            stop.cancel();
        }
    }

    /// Send a notification or a reply.
    pub async fn send(&self, msg: &Value) -> Result<(), McpError> {
        self.endpoint.send(msg).await
    }

    /// Send request `id` (`body`) and read its answer from the HTTP response
    /// (resuming its event stream if the server ends it early).
    pub async fn request(&self, id: i64, body: &Value) -> Result<(), McpError> {
        let (resp, had_session) = match self.endpoint.post(body).await {
            Ok(r) => r,
            Err(e) => {
                self.peer.forget(id);
                return Err(e);
            }
        };
        let status = resp.status();
        if status == StatusCode::NOT_FOUND && had_session {
            self.peer.forget(id);
            return Err(McpError::SessionExpired);
        }
        if !status.is_success() {
            self.peer.forget(id);
            return Err(status_error(resp, &self.endpoint.headers).await);
        }
        let ctype = content_type(&resp);
        let outcome = if ctype.starts_with("text/event-stream") {
            stream::answer(&self.endpoint, &self.peer, id, resp).await
        } else if ctype.starts_with("application/json") {
            match read_capped(resp, MAX_MESSAGE).await {
                Ok((_, true)) => Err(McpError::TooLarge),
                Ok((bytes, false)) => match rpc::parse(&bytes) {
                    Ok(msg) => stream::reply_all(&self.endpoint, self.peer.incoming(msg)).await,
                    Err(e) => Err(e),
                },
                Err(e) => Err(McpError::Connection(describe(&e, &self.endpoint.headers))),
            }
        } else if status == StatusCode::ACCEPTED {
            Err(McpError::Protocol("the server accepted the request (202) but sent no answer".into()))
        } else {
            Err(McpError::Protocol(format!("the server answered with `{ctype}`, not JSON or an event stream")))
        };
        match outcome {
            Ok(()) => {
                // Read to the end without our answer: say so rather than wait for the timeout.
                self.peer.fail(id, McpError::Protocol("the server ended its answer without answering".into()));
                Ok(())
            }
            Err(e) => {
                self.peer.fail(id, e.clone());
                Err(e)
            }
        }
    }
}

/// An HTTP+SSE (2024-11-05) connection: the GET stream and where to POST.
pub struct LegacySse {
    client: reqwest::Client,
    endpoint: Url,
    headers: HeaderMap,
    pub peer: Arc<Peer>,
    /// Stops the reader task (dropping the GET) when the connection is dropped.
    stop: CancellationToken,
}

impl Drop for LegacySse {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl LegacySse {
    /// GET the event stream, wait for its `endpoint` event, and start the reader task.
    pub async fn open(
        client: reqwest::Client,
        url: Url,
        headers: HeaderMap,
        cancel: &CancellationToken,
    ) -> Result<LegacySse, McpError> {
        let mut resp = client
            .get(url.clone())
            .headers(headers.clone())
            .header(ACCEPT, "text/event-stream")
            .send()
            .await
            .map_err(|e| McpError::Connection(describe(&e, &headers)))?;
        if !resp.status().is_success() {
            return Err(status_error(resp, &headers).await);
        }
        if !content_type(&resp).starts_with("text/event-stream") {
            return Err(McpError::Protocol(format!(
                "neither streamable HTTP nor HTTP+SSE: a GET of the URL answered `{}`, not an event stream",
                content_type(&resp)
            )));
        }
        let mut parser = sse::Parser::new(MAX_MESSAGE);
        // The first event names the endpoint; anything after it in the same chunk is kept for the reader.
        let (endpoint, early) = loop {
            let chunk = match resp.chunk().await {
                Ok(Some(c)) => c,
                Ok(None) => {
                    return Err(McpError::Connection("the event stream ended before its `endpoint` event".into()))
                }
                Err(e) => return Err(McpError::Connection(describe(&e, &headers))),
            };
            let mut events = parser.feed(&chunk).map_err(|_| McpError::TooLarge)?;
            if let Some(pos) = events.iter().position(|e| e.name == "endpoint") {
                let rest = events.split_off(pos + 1);
                let data = events.pop().map(|e| e.data).unwrap_or_default();
                break (data, rest);
            }
        };
        let endpoint = url
            .join(endpoint.trim())
            .map_err(|e| McpError::Protocol(format!("the `endpoint` event is not a URL ({e}): {endpoint:?}")))?;
        // The spec has the endpoint on the server's own origin; our headers (a token) go nowhere else.
        if endpoint.origin() != url.origin() {
            return Err(McpError::Protocol(format!(
                "the server's `endpoint` is on another origin ({}); refused",
                endpoint.origin().ascii_serialization()
            )));
        }
        let peer = Arc::new(Peer::default());
        let stop = cancel.child_token();
        let reader =
            Reader { client: client.clone(), endpoint: endpoint.clone(), headers: headers.clone(), peer: peer.clone() };
        tokio::spawn(reader.run(resp, parser, early, stop.clone()));
        Ok(LegacySse { client, endpoint, headers, peer, stop })
    }

    /// POST one message to the endpoint (answers come on the stream).
    pub async fn send(&self, msg: &Value) -> Result<(), McpError> {
        post_to(&self.client, &self.endpoint, &self.headers, msg).await
    }

    /// Send request `id`; its answer arrives through the reader task.
    pub async fn request(&self, id: i64, body: &Value) -> Result<(), McpError> {
        if let Err(e) = self.send(body).await {
            self.peer.fail(id, e.clone());
            return Err(e);
        }
        Ok(())
    }
}

async fn post_to(client: &reqwest::Client, endpoint: &Url, headers: &HeaderMap, msg: &Value) -> Result<(), McpError> {
    let resp = client
        .post(endpoint.clone())
        .headers(headers.clone())
        .json(msg)
        .send()
        .await
        .map_err(|e| McpError::Connection(describe(&e, headers)))?;
    if !resp.status().is_success() {
        return Err(status_error(resp, headers).await);
    }
    Ok(())
}

/// The HTTP+SSE connection's GET stream, read until it ends or the connection is dropped.
struct Reader {
    client: reqwest::Client,
    endpoint: Url,
    headers: HeaderMap,
    peer: Arc<Peer>,
}

impl Reader {
    async fn run(
        self,
        mut resp: reqwest::Response,
        mut parser: sse::Parser,
        early: Vec<sse::Event>,
        stop: CancellationToken,
    ) {
        let mut events = early;
        let why = loop {
            for event in events.drain(..).filter(|e| e.name == "message" && !e.data.trim().is_empty()) {
                match rpc::parse(event.data.as_bytes()) {
                    Ok(msg) => {
                        for reply in self.peer.incoming(msg) {
                            if let Err(e) = post_to(&self.client, &self.endpoint, &self.headers, &reply).await {
                                tracing::debug!("mcp: a reply to the server failed: {e}");
                            }
                        }
                    }
                    // Not one request's answer that we could name: every waiting request learns why.
                    Err(e) => self.peer.fail_all(&e),
                }
            }
            let chunk = tokio::select! {
                c = resp.chunk() => c,
                () = stop.cancelled() => break "the connection was closed".to_string(),
            };
            match chunk {
                Ok(Some(chunk)) => match parser.feed(&chunk) {
                    Ok(more) => events = more,
                    Err(_) => break McpError::TooLarge.to_string(),
                },
                Ok(None) => break "the server closed its event stream".to_string(),
                Err(e) => break describe(&e, &self.headers),
            }
        };
        self.peer.close(why);
    }
}
