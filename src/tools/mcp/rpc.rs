//! JSON-RPC 2.0 as MCP uses it, independent of the transport.
//!
//! A [`Peer`] is one connection's bookkeeping: the ids of our requests still
//! waiting for an answer, and what to do with whatever the server sends —
//! an answer goes to its waiting request; a request from the server is
//! answered here at once (`ping` with `{}`; `elicitation/create`,
//! `sampling/createMessage`, `roots/list` and anything else with JSON-RPC's
//! -32601 "method not found": bramble declares none of those capabilities,
//! and an unattended board has no one to ask and no model to lend), so a
//! server waiting on one of them goes on at once; a notification is
//! noted (`notifications/tools/list_changed` makes the server's tools be
//! listed again). The transports only move bytes and feed every message they
//! receive to [`Peer::incoming`], so stdio, streamable HTTP and HTTP+SSE
//! behave alike.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;

use serde_json::{json, Value};
use tokio::sync::{oneshot, Notify};
use tokio_util::sync::CancellationToken;

/// The protocol revision we ask for.
pub const PROTOCOL_VERSION: &str = "2025-11-25";

/// The revisions we speak; a server answering `initialize` with another is refused.
pub const SUPPORTED_VERSIONS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// The largest single message we read; a larger one is refused unread.
pub const MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// Why a request got no usable answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum McpError {
    /// The connection could not be made or is gone (refused, reset, the process exited).
    #[error("{0}")]
    Connection(String),
    /// No answer within the call's time limit.
    #[error("no answer within {0}s (the request was cancelled)")]
    Timeout(u64),
    /// The answer was bigger than [`MAX_MESSAGE`].
    #[error("the server's answer is larger than {} MiB, so it was not read (bramble's limit for one MCP message)", MAX_MESSAGE >> 20)]
    TooLarge,
    /// The server broke the protocol (not JSON, not JSON-RPC, an HTTP error).
    #[error("{0}")]
    Protocol(String),
    /// The server answered with a JSON-RPC error.
    #[error("the server answered with error {code}: {message}")]
    Rpc { code: i64, message: String },
    /// The streamable HTTP session is gone (404 to a request with a session id).
    #[error("the server ended the MCP session")]
    SessionExpired,
    /// The turn was stopped.
    #[error("the call was cancelled")]
    Cancelled,
    /// The server wants authorization bramble could not get (OAuth: see [`super::auth`]).
    #[error("{0}")]
    Auth(String),
}

impl McpError {
    /// Whether the connection is unusable after this error (reconnect before the next call).
    pub fn breaks_connection(&self) -> bool {
        matches!(self, McpError::Connection(_) | McpError::SessionExpired)
    }
}

type Waiter = oneshot::Sender<Result<Value, McpError>>;

/// One connection's requests in flight and the server's notifications.
pub struct Peer {
    next_id: AtomicI64,
    pending: Mutex<HashMap<i64, Waiter>>,
    /// The server said its tool list changed.
    pub list_changed: Notify,
    /// Fired once the connection is gone; [`Peer::closed_why`] says why.
    pub closed: CancellationToken,
    why: Mutex<Option<String>>,
}

impl Default for Peer {
    fn default() -> Self {
        Peer {
            next_id: AtomicI64::new(1),
            pending: Mutex::new(HashMap::new()),
            list_changed: Notify::new(),
            closed: CancellationToken::new(),
            why: Mutex::new(None),
        }
    }
}

impl Peer {
    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Waiter>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new request: its id, its JSON, and where its answer will arrive.
    pub fn request(&self, method: &str, params: Value) -> (i64, Value, oneshot::Receiver<Result<Value, McpError>>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending().insert(id, tx);
        (id, json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}), rx)
    }

    /// Give up on a request (timed out, cancelled): a late answer is dropped.
    pub fn forget(&self, id: i64) {
        self.pending().remove(&id);
    }

    /// Fail one request (its answer could not be read).
    pub fn fail(&self, id: i64, err: McpError) {
        if let Some(tx) = self.pending().remove(&id) {
            let _ = tx.send(Err(err));
        }
    }

    /// Fail every request in flight.
    pub fn fail_all(&self, err: &McpError) {
        for (_, tx) in self.pending().drain() {
            let _ = tx.send(Err(err.clone()));
        }
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> Vec<i64> {
        self.pending().keys().copied().collect()
    }

    /// The connection is gone: every request in flight fails with `why`.
    pub fn close(&self, why: String) {
        {
            let mut slot = self.why.lock().unwrap_or_else(|p| p.into_inner());
            if slot.is_none() {
                *slot = Some(why.clone());
            }
        }
        self.fail_all(&McpError::Connection(why));
        self.closed.cancel();
    }

    /// Why the connection closed (once it has).
    pub fn closed_why(&self) -> Option<String> {
        self.why.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Handle one message from the server (an object, or a batch array).
    /// Returns the replies to send back (to the server's own requests).
    pub fn incoming(&self, msg: Value) -> Vec<Value> {
        match msg {
            Value::Array(batch) => batch.into_iter().flat_map(|m| self.incoming(m)).collect(),
            Value::Object(map) => {
                let method = map.get("method").and_then(Value::as_str);
                let id = map.get("id").filter(|id| !id.is_null());
                match (method, id) {
                    (Some(method), Some(id)) => vec![self.server_request(method, id.clone())],
                    (Some(method), None) => {
                        self.notification(method);
                        Vec::new()
                    }
                    (None, Some(id)) => {
                        self.answer(id, &map);
                        Vec::new()
                    }
                    (None, None) => {
                        tracing::debug!("mcp: ignored a message that is neither request, answer nor notification");
                        Vec::new()
                    }
                }
            }
            _ => {
                tracing::debug!("mcp: ignored a message that is not a JSON object");
                Vec::new()
            }
        }
    }

    fn server_request(&self, method: &str, id: Value) -> Value {
        let why = match method {
            "ping" => return json!({"jsonrpc": "2.0", "id": id, "result": {}}),
            "elicitation/create" => "bramble runs unattended: there is no one to ask (no elicitation capability)",
            "sampling/createMessage" => "bramble lends no model to servers (no sampling capability)",
            "roots/list" => "bramble offers no roots (no roots capability)",
            _ => "bramble does not offer it",
        };
        tracing::info!(method, "mcp: refused a server's request: {why}");
        let message = format!("method not found: {method}: {why}");
        json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": message}})
    }

    fn notification(&self, method: &str) {
        match method {
            "notifications/tools/list_changed" => self.list_changed.notify_one(),
            other => tracing::trace!(method = other, "mcp: notification"),
        }
    }

    fn answer(&self, id: &Value, map: &serde_json::Map<String, Value>) {
        let Some(id) = id.as_i64().or_else(|| id.as_str().and_then(|s| s.parse().ok())) else {
            tracing::debug!("mcp: an answer with an id we never used");
            return;
        };
        let Some(tx) = self.pending().remove(&id) else {
            tracing::debug!(id, "mcp: a late or unknown answer was dropped");
            return;
        };
        let outcome = match (map.get("result"), map.get("error")) {
            (_, Some(err)) => Err(McpError::Rpc {
                code: err.get("code").and_then(Value::as_i64).unwrap_or(0),
                message: err.get("message").and_then(Value::as_str).unwrap_or("(no message)").to_string(),
            }),
            (Some(result), None) => Ok(result.clone()),
            (None, None) => Err(McpError::Protocol("the server's answer has neither result nor error".into())),
        };
        let _ = tx.send(outcome);
    }
}

/// A notification's JSON.
pub fn notification(method: &str, params: Option<Value>) -> Value {
    match params {
        Some(params) => json!({"jsonrpc": "2.0", "method": method, "params": params}),
        None => json!({"jsonrpc": "2.0", "method": method}),
    }
}

/// The params of our `initialize`.
pub fn initialize_params() -> Value {
    json!({
        "protocolVersion": PROTOCOL_VERSION,
        "capabilities": {},
        "clientInfo": {"name": "bramble", "version": env!("CARGO_PKG_VERSION")},
    })
}

/// Parse one message's bytes; a clear error when they are not JSON.
pub fn parse(bytes: &[u8]) -> Result<Value, McpError> {
    serde_json::from_slice(bytes).map_err(|e| {
        let text = String::from_utf8_lossy(&bytes[..bytes.len().min(120)]).into_owned();
        McpError::Protocol(format!("the server sent something that is not JSON ({e}): {text:?}"))
    })
}

/// If an oversized message's first bytes name an answer's id, that id (so
/// that its request, and only it, fails). Best effort: `"id":` before `"result"`.
pub fn id_in_prefix(prefix: &[u8]) -> Option<i64> {
    let text = String::from_utf8_lossy(&prefix[..prefix.len().min(256)]).into_owned();
    let start = text.find("\"id\"")? + 4;
    let rest = text[start..].trim_start().strip_prefix(':')?.trim_start();
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn answers_reach_their_request() {
        let peer = Peer::default();
        let (id1, body, rx1) = peer.request("tools/list", json!({}));
        let (id2, _, rx2) = peer.request("tools/call", json!({}));
        assert_eq!(body["method"], "tools/list");
        assert_ne!(id1, id2);
        let replies = peer.incoming(json!([
            {"jsonrpc": "2.0", "id": id2, "error": {"code": -32602, "message": "bad"}},
            {"jsonrpc": "2.0", "id": id1.to_string(), "result": {"tools": []}},
        ]));
        assert!(replies.is_empty());
        assert_eq!(rx1.await.unwrap(), Ok(json!({"tools": []})));
        assert_eq!(rx2.await.unwrap(), Err(McpError::Rpc { code: -32602, message: "bad".into() }));
        // A late answer is dropped quietly.
        assert!(peer.incoming(json!({"jsonrpc": "2.0", "id": id1, "result": {}})).is_empty());
    }

    #[tokio::test]
    async fn server_requests_and_notifications() {
        let peer = Peer::default();
        let replies = peer.incoming(json!({"jsonrpc": "2.0", "id": "p1", "method": "ping"}));
        assert_eq!(replies, [json!({"jsonrpc": "2.0", "id": "p1", "result": {}})]);
        let replies =
            peer.incoming(json!({"jsonrpc": "2.0", "id": 9, "method": "sampling/createMessage", "params": {}}));
        assert_eq!(replies[0]["error"]["code"], -32601);
        assert_eq!(replies[0]["id"], 9);
        for method in ["elicitation/create", "roots/list", "x/unknown"] {
            let replies = peer.incoming(json!({"jsonrpc": "2.0", "id": "r", "method": method, "params": {}}));
            assert_eq!(replies[0]["error"]["code"], -32601, "{method}");
            assert!(replies[0]["error"]["message"].as_str().unwrap().contains(method), "{method}");
        }
        peer.incoming(json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}));
        tokio::time::timeout(std::time::Duration::from_secs(1), peer.list_changed.notified()).await.unwrap();
        assert!(peer.incoming(json!("nonsense")).is_empty());
    }

    #[tokio::test]
    async fn closing_fails_what_waits() {
        let peer = Peer::default();
        let (_, _, rx) = peer.request("tools/call", json!({}));
        peer.close("the server process exited (exit status 3)".into());
        assert_eq!(rx.await.unwrap(), Err(McpError::Connection("the server process exited (exit status 3)".into())));
        assert!(peer.closed.is_cancelled());
        assert_eq!(peer.closed_why().as_deref(), Some("the server process exited (exit status 3)"));
    }

    #[test]
    fn parse_errors_and_ids_of_oversized_answers() {
        let err = parse(b"{not json").unwrap_err();
        assert!(err.to_string().starts_with("the server sent something that is not JSON"), "{err}");
        assert_eq!(id_in_prefix(br#"{"jsonrpc":"2.0","id":17,"result":{"content":[{"text":"BBBB"#), Some(17));
        assert_eq!(id_in_prefix(br#"{"jsonrpc": "2.0", "id" : 3, "#), Some(3));
        assert_eq!(id_in_prefix(br#"{"jsonrpc":"2.0","result":{"#), None);
    }
}
