//! The ntfy wire format: publishing a notification and reading a topic's
//! JSON stream. No topics policy, no bus here.
//!
//! Following ntfy's published documentation:
//! - <https://docs.ntfy.sh/publish/>: "Publish as JSON" (a POST of
//!   `{topic, message, title, priority, tags, click, attach, filename,
//!   actions}` to the server's base URL), "Attach local file" (a PUT of the
//!   bytes to `/<topic>` with the other fields as query parameters), action
//!   buttons (`view` with a `url`; `http` with `url`, `method`, `headers`,
//!   `body`, `clear`), and access tokens (`Authorization: Bearer tk_…`).
//! - <https://docs.ntfy.sh/subscribe/api/>: `GET /<topic>/json?since=<id>`,
//!   one JSON object a line, events `open`, `keepalive`, `message` and
//!   `poll_request`; `since` resumes after a message id.
//!
//! Redirects are never followed: the token goes only to `server` as
//! configured (a redirect is an error that says where it pointed). A stream
//! line is capped at [`MAX_LINE`] bytes: a longer one is skipped whole, not
//! buffered, and a line that is not an event is reported, not fatal.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::Secret;

/// One publish, connection included.
pub const PUBLISH_TIMEOUT: Duration = Duration::from_secs(30);
/// A stream line longer than this is skipped.
pub const MAX_LINE: usize = 64 * 1024;
/// Time to connect to the server.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum NtfyError {
    /// No answer, a broken connection, a timeout.
    #[error("cannot reach the ntfy server: {0}")]
    Transport(String),
    /// The server answered with an error status.
    #[error("the ntfy server answered {status}: {body}")]
    Status { status: u16, body: String },
    /// The server pointed elsewhere: not followed (the token would go along).
    #[error("the ntfy server redirected to {0}: not followed; set [ntfy] server to the final address")]
    Redirect(String),
    /// The server's answer is not what ntfy sends.
    #[error("the ntfy server's answer is not ntfy's: {0}")]
    Protocol(String),
}

impl NtfyError {
    /// Whether trying again later may succeed: no answer, `408`, `429`, `5xx`.
    pub fn retryable(&self) -> bool {
        match self {
            NtfyError::Transport(_) => true,
            NtfyError::Status { status, .. } => *status == 408 || *status == 429 || *status >= 500,
            NtfyError::Redirect(_) | NtfyError::Protocol(_) => false,
        }
    }
}

/// An action button (<https://docs.ntfy.sh/publish/#action-buttons>).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "lowercase")]
pub enum Action {
    /// Opens a URL.
    View { label: String, url: String },
    /// The phone sends an HTTP request.
    Http {
        label: String,
        url: String,
        method: String,
        #[serde(skip_serializing_if = "BTreeMap::is_empty")]
        headers: BTreeMap<String, String>,
        #[serde(skip_serializing_if = "String::is_empty")]
        body: String,
        /// Dismiss the notification when pressed.
        clear: bool,
    },
}

/// A notification to publish.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Publish {
    pub topic: String,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<u8>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub click: Option<String>,
    /// An attachment by URL.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attach: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filename: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub actions: Vec<Action>,
}

/// One line of a topic's JSON stream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Event {
    pub id: String,
    pub time: i64,
    /// `open`, `keepalive`, `message`, `poll_request` (others are newer events).
    pub event: String,
    pub topic: String,
    pub message: String,
    pub title: String,
    pub tags: Vec<String>,
    pub attachment: Option<serde_json::Value>,
}

/// What reading the stream gave.
#[derive(Debug)]
pub enum Line {
    Event(Event),
    /// A line skipped: too long, or not an event (said why).
    Skipped(String),
}

/// An ntfy server.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<Secret>,
}

impl Client {
    /// A client for `base` (`https://ntfy.sh`), with an access token or none.
    pub fn new(base: &str, token: Option<Secret>) -> Result<Client, NtfyError> {
        crate::install_crypto();
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(concat!("bramble/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| NtfyError::Transport(e.to_string()))?;
        Ok(Client { http, base: base.trim_end_matches('/').to_string(), token })
    }

    fn authed(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(t) => req.bearer_auth(t.expose()),
            None => req,
        }
    }

    /// Publish as JSON to the base URL; the message's id.
    pub async fn publish(&self, p: &Publish) -> Result<String, NtfyError> {
        let req = self.http.post(format!("{}/", self.base)).json(p).timeout(PUBLISH_TIMEOUT);
        self.send(req).await
    }

    /// Publish with a file: a PUT of its bytes to `/<topic>`, the fields as query parameters.
    pub async fn upload(&self, p: &Publish, filename: &str, data: Vec<u8>) -> Result<String, NtfyError> {
        let mut url = reqwest::Url::parse(&format!("{}/{}", self.base, p.topic))
            .map_err(|e| NtfyError::Protocol(format!("bad topic URL: {e}")))?;
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("filename", filename);
            q.append_pair("message", &p.message);
            let opt = [("title", p.title.as_deref()), ("click", p.click.as_deref())];
            for (k, v) in opt {
                if let Some(v) = v {
                    q.append_pair(k, v);
                }
            }
            if let Some(pr) = p.priority {
                q.append_pair("priority", &pr.to_string());
            }
            if !p.tags.is_empty() {
                q.append_pair("tags", &p.tags.join(","));
            }
            if !p.actions.is_empty() {
                let actions = serde_json::to_string(&p.actions).unwrap_or_default();
                q.append_pair("actions", &actions);
            }
        }
        let req = self.http.put(url).body(data).timeout(PUBLISH_TIMEOUT * 4);
        self.send(req).await
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<String, NtfyError> {
        let resp = self.authed(req).send().await.map_err(transport)?;
        let resp = check(resp).await?;
        let v: serde_json::Value = resp.json().await.map_err(|e| NtfyError::Protocol(e.to_string()))?;
        Ok(v["id"].as_str().unwrap_or_default().to_string())
    }

    /// Open `topic`'s JSON stream, after message `since` (or from now).
    pub async fn subscribe(&self, topic: &str, since: Option<&str>) -> Result<Stream, NtfyError> {
        let mut url = reqwest::Url::parse(&format!("{}/{topic}/json", self.base))
            .map_err(|e| NtfyError::Protocol(format!("bad topic URL: {e}")))?;
        if let Some(id) = since {
            url.query_pairs_mut().append_pair("since", id);
        }
        let req = self.authed(self.http.get(url));
        let resp = tokio::time::timeout(CONNECT_TIMEOUT * 3, req.send())
            .await
            .map_err(|_| NtfyError::Transport("no answer to the subscription".into()))?
            .map_err(transport)?;
        Ok(Stream { resp: check(resp).await?, buf: Vec::new(), skipping: false })
    }

    /// `GET /v1/health`-like probe for `doctor`: the topic's stream opens (and is closed at once).
    pub async fn probe(&self, topic: &str) -> Result<(), NtfyError> {
        self.subscribe(topic, None).await.map(drop)
    }
}

fn transport(e: reqwest::Error) -> NtfyError {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        text = format!("{text}: {s}");
        source = s.source();
    }
    NtfyError::Transport(text)
}

/// A successful answer, or the error it says.
async fn check(resp: reqwest::Response) -> Result<reqwest::Response, NtfyError> {
    let status = resp.status();
    if status.is_redirection() {
        let to = resp.headers().get(reqwest::header::LOCATION).and_then(|l| l.to_str().ok()).unwrap_or("?");
        return Err(NtfyError::Redirect(to.escape_debug().to_string()));
    }
    if status.is_success() {
        return Ok(resp);
    }
    let body = resp.text().await.unwrap_or_default();
    let body: String = body.trim().chars().take(300).collect();
    Err(NtfyError::Status { status: status.as_u16(), body })
}

/// A topic's open JSON stream.
pub struct Stream {
    resp: reqwest::Response,
    buf: Vec<u8>,
    /// Inside a line over [`MAX_LINE`]: dropped up to its newline.
    skipping: bool,
}

impl Stream {
    /// The next line; `Ok(None)` when the server closed the stream. Cancel-safe
    /// only between lines: drop the stream when cancelled.
    pub async fn next(&mut self) -> Result<Option<Line>, NtfyError> {
        loop {
            if let Some(at) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=at).collect();
                if std::mem::take(&mut self.skipping) {
                    return Ok(Some(Line::Skipped(format!("a line over {MAX_LINE} bytes"))));
                }
                let line = &line[..line.len() - 1];
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Ok(Some(parse_line(line)));
            }
            if self.buf.len() > MAX_LINE {
                self.buf.clear();
                self.skipping = true;
            }
            match self.resp.chunk().await.map_err(transport)? {
                Some(chunk) => self.buf.extend_from_slice(&chunk),
                None => return Ok(None),
            }
        }
    }
}

/// One line as an event, or why it is not one.
pub fn parse_line(line: &[u8]) -> Line {
    match serde_json::from_slice::<Event>(line) {
        Ok(e) if !e.event.is_empty() => Line::Event(e),
        Ok(_) => Line::Skipped("a line without an `event`".into()),
        Err(e) => Line::Skipped(format!("a line that is not an ntfy event ({e})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_publish_is_ntfys_json_and_actions_are_tagged() {
        let p = Publish {
            topic: "t".into(),
            message: "water the plants".into(),
            title: Some("plants".into()),
            priority: Some(4),
            tags: vec!["bramble".into()],
            actions: vec![Action::Http {
                label: "Done".into(),
                url: "https://pi/ntfy/x/done".into(),
                method: "POST".into(),
                headers: BTreeMap::new(),
                body: String::new(),
                clear: true,
            }],
            ..Default::default()
        };
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(v["topic"], "t");
        assert_eq!(v["priority"], 4);
        assert_eq!(v["actions"][0]["action"], "http");
        assert_eq!(v["actions"][0]["clear"], true);
        assert!(v.get("click").is_none() && v["actions"][0].get("headers").is_none());
    }

    #[test]
    fn stream_lines_are_events_or_say_why_not() {
        let l = parse_line(br#"{"id":"a1","time":1,"event":"message","topic":"t","message":"hi"}"#);
        assert!(matches!(l, Line::Event(e) if e.message == "hi" && e.id == "a1"));
        assert!(matches!(parse_line(b"{not json"), Line::Skipped(_)));
        assert!(matches!(parse_line(b"[]"), Line::Skipped(_)));
        assert!(matches!(parse_line(br#"{"id":"x"}"#), Line::Skipped(_)));
        for (status, retry) in [(429, true), (503, true), (400, false), (403, false), (413, false)] {
            assert_eq!(NtfyError::Status { status, body: String::new() }.retryable(), retry);
        }
        assert!(!NtfyError::Redirect("x".into()).retryable());
    }
}
