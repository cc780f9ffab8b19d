//! The listener: hyper's HTTP/1 server over a bounded number of connections,
//! one request per connection, every wait bounded.
//!
//! A slow client (slowloris) holds one connection slot for at most
//! [`HEADER_TIMEOUT`] for its headers and [`BODY_TIMEOUT`] for its body, and
//! the whole connection lives at most [`CONNECTION_TIMEOUT`]; past
//! `[webhooks] max_connections` new clients wait in the kernel's backlog,
//! not in a task each. Headers are capped in size and number by hyper
//! (`431`), the body by the endpoint's `max_body` while it is read (`413`,
//! from `Content-Length` before a byte of it is read).
//!
//! Each request is checked in this order, so a caller without the secret
//! learns only that the endpoint exists: the path (`404`, the same for every
//! unknown name), the method (`405`), credentials present and right for a
//! bearer endpoint (`401`), the size (`413`), the body (`408` when it comes
//! too slowly), the signature and its freshness, then the replay cache
//! (`401`), bramble's own report coming back (`409`), the content type
//! (`415`), the JSON (`400`), the turn rate and the queue (`429`). Refusals
//! say why in the log, with the peer's address; the caller gets the status
//! and a word.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::spool::SpoolError;
use super::{Call, Endpoint, Shared};
use crate::clients::webhook::{self as wire, ORIGIN_HEADER, SIGNATURE_HEADER};
use crate::config::{WebhookAction, WebhookAuth};

/// Time for a client to finish the TLS handshake (HTTPS listeners).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Time for a client to send its request line and headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Time for a client to send its body.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest a connection may live.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);
/// Headers: at most this many, and this many bytes with the request line.
const MAX_HEADERS: usize = 32;
const MAX_HEAD_BYTES: usize = 16 * 1024;

/// The listener's bounds, and its TLS (`None`: plain HTTP).
pub struct Limits {
    max_connections: usize,
    tls: Option<tokio_rustls::TlsAcceptor>,
}

impl Limits {
    pub fn new(max_connections: u32, tls: Option<tokio_rustls::TlsAcceptor>) -> Limits {
        Limits { max_connections: (max_connections as usize).max(1), tls }
    }
}

/// The TLS acceptor for `tls_cert` / `tls_key` (`None`: not configured); the
/// error says what is wrong with which file.
pub fn acceptor(settings: &crate::config::WebhooksConfig) -> Result<Option<tokio_rustls::TlsAcceptor>, String> {
    let Some(files) = settings.tls_files() else { return Ok(None) };
    let files = files.map_err(|(_, why)| why)?;
    let provider = rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("[webhooks] TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(files.chain, files.key)
        .map_err(|e| format!("[webhooks] tls_cert and tls_key do not make a usable pair: {e}"))?;
    Ok(Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))))
}

/// Accept and serve connections until `stop`.
pub async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    calls: mpsc::Sender<Call>,
    limits: Limits,
    stop: CancellationToken,
) {
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let mut conns = tokio::task::JoinSet::new();
    loop {
        // A permit first: past the limit, clients wait in the backlog, not in a task each.
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p,
            _ = stop.cancelled() => break,
        };
        let Ok(permit) = permit else { break };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.cancelled() => break,
        };
        match accepted {
            Ok((stream, peer)) => {
                let (shared, calls, stop, tls) = (shared.clone(), calls.clone(), stop.clone(), limits.tls.clone());
                conns.spawn(async move {
                    let _permit = permit;
                    tokio::select! {
                        () = secured(stream, peer, tls, shared, calls) => {}
                        _ = stop.cancelled() => {}
                    }
                });
            }
            Err(e) => {
                tracing::warn!("webhooks: accept failed: {e}");
                drop(permit);
                crate::util::timer::sleep(Duration::from_millis(200)).await;
            }
        }
        while conns.try_join_next().is_some() {}
    }
    conns.abort_all();
}

/// One connection, after its TLS handshake (within [`HANDSHAKE_TIMEOUT`],
/// in the connection's own task: a stalled client holds only its own slot).
async fn secured(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shared: Arc<Shared>,
    calls: mpsc::Sender<Call>,
) {
    let Some(acceptor) = tls else { return connection(stream, peer, shared, calls).await };
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => connection(stream, peer, shared, calls).await,
        // Plain HTTP to the HTTPS port ends here too: the client sees the connection closed.
        Ok(Err(e)) => tracing::info!(%peer, "webhooks: TLS handshake failed: {e}"),
        Err(_) => tracing::info!(%peer, "webhooks: no TLS handshake within {HANDSHAKE_TIMEOUT:?}; closed"),
    }
}

/// One connection, one request, within [`CONNECTION_TIMEOUT`].
async fn connection<S>(stream: S, peer: SocketAddr, shared: Arc<Shared>, calls: mpsc::Sender<Call>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let (shared, calls) = (shared.clone(), calls.clone());
        async move { Ok::<_, Infallible>(answer(req, peer, &shared, &calls).await) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .keep_alive(false)
        .max_headers(MAX_HEADERS)
        .max_buf_size(MAX_HEAD_BYTES);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    match tokio::time::timeout(CONNECTION_TIMEOUT, conn).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(%peer, "webhooks: connection ended: {e}"),
        Err(_) => tracing::info!(%peer, "webhooks: connection closed after {CONNECTION_TIMEOUT:?}"),
    }
}

/// A bare answer: a status and a word.
fn reply(status: StatusCode, text: &str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(format!("{text}\n"))));
    *resp.status_mut() = status;
    resp.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("text/plain"));
    resp
}

fn header(req: &Request<Incoming>, name: impl hyper::header::AsHeaderName) -> Option<&str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

/// What the request's headers say, taken before the body is read.
struct Head {
    signature: Option<String>,
    origin: Option<String>,
    content_type: Option<String>,
    length: Option<u64>,
}

/// Answer one request (the order is in the module's header).
async fn answer(
    req: Request<Incoming>,
    peer: SocketAddr,
    shared: &Shared,
    calls: &mpsc::Sender<Call>,
) -> Response<Full<Bytes>> {
    for route in &shared.routes {
        if let Some((status, text)) = route.answer(req.method().as_str(), req.uri().path(), peer).await {
            return reply(StatusCode::from_u16(status).unwrap_or(StatusCode::NOT_FOUND), &text);
        }
    }
    let found =
        req.uri().path().strip_prefix("/hook/").and_then(|name| {
            shared.endpoints.iter().enumerate().find(|(_, e)| e.config.name == name && !name.is_empty())
        });
    let Some((index, ep)) = found else {
        shared.refused(peer, "-", &format!("no endpoint at {}", req.uri().path().escape_debug()));
        return reply(StatusCode::NOT_FOUND, "not found");
    };
    if req.method() != Method::POST {
        let mut r = reply(StatusCode::METHOD_NOT_ALLOWED, "use POST");
        r.headers_mut().insert(hyper::header::ALLOW, hyper::header::HeaderValue::from_static("POST"));
        return r;
    }
    let name = ep.config.name.as_str();
    let refuse = |why: &str| {
        shared.refused(peer, name, why);
        reply(StatusCode::UNAUTHORIZED, "unauthorized")
    };
    let Some(secret) = &ep.secret else { return refuse(&format!("`{}` is not set", ep.config.auth.env())) };
    if matches!(ep.config.auth, WebhookAuth::Bearer { .. })
        && !wire::bearer_matches(header(&req, hyper::header::AUTHORIZATION), secret.expose())
    {
        return refuse("no bearer token, or not this endpoint's");
    }
    let head = Head {
        signature: header(&req, SIGNATURE_HEADER).map(str::to_string),
        origin: header(&req, ORIGIN_HEADER).map(str::to_string),
        content_type: header(&req, hyper::header::CONTENT_TYPE).map(str::to_string),
        length: header(&req, hyper::header::CONTENT_LENGTH).and_then(|l| l.trim().parse().ok()),
    };
    if matches!(ep.config.auth, WebhookAuth::Hmac { .. }) && head.signature.is_none() {
        return refuse("no X-Bramble-Signature header");
    }
    let max = ep.config.max_body;
    if head.length.is_some_and(|l| l > max as u64) {
        shared.refused(peer, name, &format!("a body of {} bytes, over max_body ({max})", head.length.unwrap_or(0)));
        return reply(StatusCode::PAYLOAD_TOO_LARGE, "body too large");
    }
    let body = match read_body(req.into_body(), max).await {
        Ok(body) => body,
        Err((status, why)) => {
            shared.refused(peer, name, why);
            return reply(status, why);
        }
    };
    if let WebhookAuth::Hmac { .. } = ep.config.auth {
        if let Err(why) = check_signature(shared, index, secret.expose(), head.signature.as_deref(), &body) {
            return refuse(&why);
        }
    }
    accept(shared, index, ep, head, body, peer, calls).await
}

/// The body, at most `max` bytes, within [`BODY_TIMEOUT`].
async fn read_body(body: Incoming, max: usize) -> Result<Vec<u8>, (StatusCode, &'static str)> {
    match tokio::time::timeout(BODY_TIMEOUT, Limited::new(body, max).collect()).await {
        Err(_) => Err((StatusCode::REQUEST_TIMEOUT, "the body did not arrive in time")),
        Ok(Ok(collected)) => Ok(collected.to_bytes().to_vec()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            Err((StatusCode::PAYLOAD_TOO_LARGE, "body too large"))
        }
        Ok(Err(_)) => Err((StatusCode::BAD_REQUEST, "the body could not be read")),
    }
}

/// The signature, its window, and the replay cache.
fn check_signature(shared: &Shared, index: usize, secret: &str, sig: Option<&str>, body: &[u8]) -> Result<(), String> {
    let now = jiff::Timestamp::now().as_second();
    let ok = wire::verify(secret.as_bytes(), sig, body, now).map_err(|e| e.to_string())?;
    let mut replay = shared.replay.lock().unwrap_or_else(|p| p.into_inner());
    let name = shared.endpoints.get(index).map(|e| e.config.name.as_str()).unwrap_or_default();
    replay.first_time(name, ok.t, &ok.mac, now).map_err(str::to_string)
}

/// An authenticated request: the loop check, the content, then run it.
async fn accept(
    shared: &Shared,
    index: usize,
    ep: &Endpoint,
    head: Head,
    body: Vec<u8>,
    peer: SocketAddr,
    calls: &mpsc::Sender<Call>,
) -> Response<Full<Bytes>> {
    let name = ep.config.name.as_str();
    if head.origin.as_deref() == Some(shared.origin.as_str()) {
        let why = "it is a report this bramble posted (a `webhook:` target pointing back at its own endpoint); \
                   answering it would loop";
        shared.refused(peer, name, why);
        return reply(StatusCode::CONFLICT, "loop: this is bramble's own report");
    }
    let mime = head.content_type.as_deref().map(|c| c.split(';').next().unwrap_or_default().trim().to_lowercase());
    let json = match mime.as_deref() {
        Some("application/json") => match serde_json::from_slice::<serde_json::Value>(&body) {
            Ok(v) => Some(v),
            Err(e) => {
                shared.refused(peer, name, &format!("the body is not valid JSON ({e})"));
                return reply(StatusCode::BAD_REQUEST, &format!("the body is not valid JSON: {e}"));
            }
        },
        None | Some("text/plain") => None,
        Some(other) => {
            shared.refused(peer, name, &format!("content type `{}`", other.escape_debug()));
            return reply(StatusCode::UNSUPPORTED_MEDIA_TYPE, "send Content-Type: application/json (or text/plain)");
        }
    };
    match &ep.config.action {
        Some(WebhookAction::Job(job)) => run_job(shared, name, job, peer),
        Some(WebhookAction::Message(_)) => {
            if !shared.turns.allow() {
                return reply(StatusCode::TOO_MANY_REQUESTS, "too many calls: try again later");
            }
            let bytes = body.len();
            // On disk before the caller hears 202 (see `spool`): off the runtime's threads, it syncs.
            let (spool, n, b, is_json) = (shared.spool.clone(), name.to_string(), body.clone(), json.is_some());
            let kept = match tokio::task::spawn_blocking(move || spool.keep(&n, &b, is_json)).await {
                Ok(Ok(path)) => path,
                Ok(Err(SpoolError::Full)) => {
                    shared.refused(peer, name, "too many calls waiting to run");
                    return reply(StatusCode::TOO_MANY_REQUESTS, "too many calls waiting: try again later");
                }
                Ok(Err(e)) => {
                    tracing::error!(webhook = name, "{e}");
                    return reply(StatusCode::SERVICE_UNAVAILABLE, "the call cannot be kept (see bramble's log)");
                }
                Err(e) => {
                    tracing::error!(webhook = name, "webhooks: keeping the call failed: {e}");
                    return reply(StatusCode::SERVICE_UNAVAILABLE, "the call cannot be kept (see bramble's log)");
                }
            };
            if calls.try_send(Call { endpoint: index, body, json, kept: Some(kept.clone()) }).is_err() {
                shared.spool.done(&kept);
                shared.refused(peer, name, "too many calls waiting to run");
                return reply(StatusCode::TOO_MANY_REQUESTS, "too many calls waiting: try again later");
            }
            tracing::info!(%peer, webhook = name, bytes, "webhook call accepted: a turn in session webhook:{name}");
            reply(StatusCode::ACCEPTED, "accepted")
        }
        None => reply(StatusCode::NOT_FOUND, "not found"),
    }
}

/// A `job` endpoint: run the job now, as `bramble cron run` would.
fn run_job(shared: &Shared, name: &str, job: &str, peer: SocketAddr) -> Response<Full<Bytes>> {
    match shared.jobs.get(job) {
        Ok(j) if shared.scheduler.run_now(&j.id) => {
            tracing::info!(%peer, webhook = name, job, "webhook call accepted: running the job now");
            reply(StatusCode::ACCEPTED, "accepted")
        }
        Ok(_) => {
            tracing::warn!(%peer, webhook = name, job, "webhook call refused: the scheduler is busy");
            reply(StatusCode::TOO_MANY_REQUESTS, "busy: try again later")
        }
        Err(e) => {
            tracing::error!(webhook = name, job, "webhook: cannot run the job: {e}");
            reply(StatusCode::SERVICE_UNAVAILABLE, "the endpoint's job cannot run (see bramble's log)")
        }
    }
}
