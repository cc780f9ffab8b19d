//! Where the authorization server sends the browser back: a loopback
//! listener (RFC 8252 §7.3, `http://127.0.0.1:<random port>/callback`), or
//! the redirect URL — or the bare code — pasted at the prompt when the
//! browser runs on another device and cannot reach the board's loopback.
//!
//! The listener is tokio's `TcpListener` with a bounded read: the request
//! line and headers only ([`MAX_REQUEST`] bytes), within [`READ_WAIT`]; one
//! answer, then the connection is closed. A callback whose `state` is not
//! ours is refused (HTTP 400) and the wait goes on: a stranger on the machine
//! cannot end or hijack the login; an `error` from the authorization server
//! ends it with that error.

use std::time::Duration;

use reqwest::Url;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

use super::AuthError;

/// Most bytes of a callback request read (its line and headers).
const MAX_REQUEST: usize = 8 * 1024;
/// Longest wait for one connection's request.
const READ_WAIT: Duration = Duration::from_secs(10);
const PATH: &str = "/callback";

/// A bound loopback listener.
pub struct Loopback {
    listener: TcpListener,
    pub redirect_uri: String,
}

/// What a callback carried.
enum Outcome {
    Code(String),
    Error(String),
    /// Not ours (another path, a wrong state, malformed): refused, keep waiting.
    Ignored(&'static str),
}

impl Loopback {
    /// Listen on 127.0.0.1, a port the system picks.
    pub async fn bind() -> Result<Loopback, AuthError> {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(|e| AuthError::Failed(format!("cannot listen on 127.0.0.1 for the callback: {e}")))?;
        let port = listener.local_addr().map_err(|e| AuthError::Failed(e.to_string()))?.port();
        Ok(Loopback { listener, redirect_uri: format!("http://127.0.0.1:{port}{PATH}") })
    }

    /// The code of the first callback carrying `state`.
    pub async fn wait(&self, state: &str) -> Result<String, AuthError> {
        loop {
            let Ok((mut stream, _)) = self.listener.accept().await else { continue };
            let head = match tokio::time::timeout(READ_WAIT, read_head(&mut stream)).await {
                Ok(Some(head)) => head,
                _ => continue,
            };
            let outcome = judge(&head, state);
            let (status, text) = match &outcome {
                Outcome::Code(_) => ("200 OK", "bramble is authorized. You can close this page.".to_string()),
                Outcome::Error(e) => ("400 Bad Request", format!("The authorization failed: {e}")),
                Outcome::Ignored(why) => ("400 Bad Request", format!("Refused: {why}.")),
            };
            let answer = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: \
                 close\r\n\r\n{text}",
                text.len()
            );
            let _ = tokio::time::timeout(READ_WAIT, stream.write_all(answer.as_bytes())).await;
            let _ = stream.shutdown().await;
            match outcome {
                Outcome::Code(code) => return Ok(code),
                Outcome::Error(e) => return Err(AuthError::Refused(e)),
                Outcome::Ignored(why) => tracing::warn!("mcp: a callback to the login's listener was refused: {why}"),
            }
        }
    }
}

/// The request's head (up to the blank line), or `None` when it is too long or broken.
async fn read_head(stream: &mut tokio::net::TcpStream) -> Option<String> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && !buf.windows(2).any(|w| w == b"\n\n") {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_REQUEST {
            return None;
        }
    }
    String::from_utf8(buf).ok()
}

fn judge(head: &str, state: &str) -> Outcome {
    let line = head.lines().next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some("GET"), Some(target)) = (parts.next(), parts.next()) else { return Outcome::Ignored("not a GET") };
    let Ok(url) = Url::parse("http://127.0.0.1").and_then(|b| b.join(target)) else {
        return Outcome::Ignored("not a URL");
    };
    if url.path() != PATH {
        return Outcome::Ignored("not the callback's path");
    }
    match from_query(&url, state) {
        Ok(code) => Outcome::Code(code),
        Err(AuthError::Refused(e)) => Outcome::Error(e),
        Err(_) => Outcome::Ignored("the state does not match this login"),
    }
}

/// The code of a redirect URL's query, its `state` checked; an `error` is [`AuthError::Refused`].
fn from_query(url: &Url, state: &str) -> Result<String, AuthError> {
    let get = |k: &str| url.query_pairs().find(|(n, _)| n == k).map(|(_, v)| v.into_owned());
    if get("state").as_deref() != Some(state) {
        return Err(AuthError::Failed(
            "the redirect's `state` is not this login's: refused (it may come from another login, or an attacker)"
                .into(),
        ));
    }
    if let Some(e) = get("error") {
        let d = get("error_description").map(|d| format!(": {d}")).unwrap_or_default();
        return Err(AuthError::Refused(format!("{e}{d}").chars().take(300).collect()));
    }
    get("code").filter(|c| !c.is_empty()).ok_or_else(|| AuthError::Failed("the redirect carries no `code`".into()))
}

/// What was pasted at the prompt: the whole redirect URL (its `state`
/// checked) or the bare code.
pub fn pasted(text: &str, state: &str) -> Result<String, AuthError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(AuthError::Failed("nothing was pasted".into()));
    }
    if text.contains("://") || text.starts_with('/') || text.contains('?') {
        let url = Url::parse(text)
            .or_else(|_| Url::parse("http://127.0.0.1").and_then(|b| b.join(text)))
            .map_err(|e| AuthError::Failed(format!("the pasted text is not a URL ({e})")))?;
        return from_query(&url, state);
    }
    if text.len() > 2048 || text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(AuthError::Failed("the pasted text is neither the redirect URL nor a code".into()));
    }
    Ok(text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pasted_urls_have_their_state_checked() {
        assert_eq!(pasted("http://127.0.0.1:5/callback?code=abc&state=s1", "s1").unwrap(), "abc");
        assert_eq!(pasted("  abc-123  ", "s1").unwrap(), "abc-123");
        let err = pasted("http://127.0.0.1:5/callback?code=abc&state=evil", "s1").unwrap_err().to_string();
        assert!(err.contains("`state` is not this login's"), "{err}");
        assert!(pasted("http://127.0.0.1:5/callback?code=abc", "s1").is_err());
        let err = pasted("http://x/callback?error=access_denied&state=s1", "s1").unwrap_err();
        assert!(matches!(err, AuthError::Refused(ref e) if e.contains("access_denied")), "{err}");
        assert!(pasted("two words", "s1").is_err());
        assert!(pasted("", "s1").is_err());
    }

    #[tokio::test]
    async fn the_listener_refuses_strangers_and_takes_the_right_callback() {
        let lb = Loopback::bind().await.unwrap();
        let port: u16 = lb.redirect_uri.rsplit(':').next().unwrap().trim_end_matches(PATH).parse().unwrap();
        let send = |req: String| async move {
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            s.write_all(req.as_bytes()).await.unwrap();
            let mut out = String::new();
            let _ = s.read_to_string(&mut out).await;
            out
        };
        let client = async {
            let huge = format!("GET /callback?{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_REQUEST + 10));
            let a = send(huge).await;
            let b = send("GET /callback?code=stolen&state=wrong HTTP/1.1\r\nHost: x\r\n\r\n".into()).await;
            let c = send("GET /other?code=x&state=good HTTP/1.1\r\n\r\n".into()).await;
            let d = send("GET /callback?code=the-code&state=good HTTP/1.1\r\nHost: x\r\n\r\n".into()).await;
            (a, b, c, d)
        };
        let (code, (a, b, c, d)) = tokio::join!(lb.wait("good"), client);
        assert_eq!(code.unwrap(), "the-code");
        assert!(a.is_empty() || a.contains("400"), "{a}");
        assert!(b.starts_with("HTTP/1.1 400") && b.contains("state"), "{b}");
        assert!(c.starts_with("HTTP/1.1 400"), "{c}");
        assert!(d.starts_with("HTTP/1.1 200"), "{d}");
    }
}
