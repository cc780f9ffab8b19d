//! The webhook wire format, both ways: the signature header, the bearer
//! check, and the POST of a report. No endpoint, policy or bus here.
//!
//! The signature is Stripe's scheme with bramble's header name:
//! `X-Bramble-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`.
//! Signing the timestamp with the body lets the receiver refuse an old
//! request replayed later (a window of ±[`TOLERANCE_SECS`]) without keeping
//! every signature it ever saw. Several `v1=` entries may be given (a secret
//! being rotated); one that matches is enough. Comparisons are constant-time
//! (`ring::hmac::verify`; for bearer tokens, of their SHA-256 digests, so the
//! token's length is not timed either).
//!
//! A report POSTed by bramble carries the same signature, its idempotency id
//! ([`ID_HEADER`]: a receiver drops a retry's duplicate by it) and this
//! bramble's instance ([`ORIGIN_HEADER`]: an endpoint refuses a request that
//! bramble itself sent, so a report delivered back into its own endpoint
//! cannot ping-pong). Redirects are followed only to the same origin (scheme,
//! host, port): a report and its signature never go where the user did not
//! point them.

use std::time::Duration;

use ring::hmac;

/// The signature header (Stripe-like).
pub const SIGNATURE_HEADER: &str = "x-bramble-signature";
/// A report's idempotency id: the same for every retry of one report.
pub const ID_HEADER: &str = "x-bramble-id";
/// The bramble instance that sent a report (loop detection).
pub const ORIGIN_HEADER: &str = "x-bramble-origin";
/// How far a signature's timestamp may be from now, either way.
pub const TOLERANCE_SECS: i64 = 300;
/// The whole POST of a report, connection included.
pub const POST_TIMEOUT: Duration = Duration::from_secs(30);

/// The hex HMAC-SHA256 of `<t>.<body>`.
pub fn sign(secret: &[u8], t: i64, body: &[u8]) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
    let mut ctx = hmac::Context::with_key(&key);
    ctx.update(t.to_string().as_bytes());
    ctx.update(b".");
    ctx.update(body);
    hex(ctx.sign().as_ref())
}

/// The whole header value: `t=<t>,v1=<hex>`.
pub fn signature_header(secret: &[u8], t: i64, body: &[u8]) -> String {
    format!("t={t},v1={}", sign(secret, t, body))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || text.len() > 128 {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

/// Why a signature was refused (said in the log, never to the caller).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("no X-Bramble-Signature header")]
    Missing,
    #[error("the X-Bramble-Signature header is not `t=<unix seconds>,v1=<hex>`")]
    Malformed,
    #[error(
        "the signature's timestamp is {0} s away from now (more than {TOLERANCE_SECS} s): a replay, or a clock off"
    )]
    Stale(i64),
    #[error("the signature does not match the body (another secret, or a changed body)")]
    Mismatch,
}

/// A signature that matched: its timestamp and the matching MAC (for the replay cache).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub t: i64,
    pub mac: Vec<u8>,
}

/// Check `header` (the value of [`SIGNATURE_HEADER`], if any) against `body`
/// at `now` (unix seconds).
pub fn verify(secret: &[u8], header: Option<&str>, body: &[u8], now: i64) -> Result<Verified, SignatureError> {
    let header = header.ok_or(SignatureError::Missing)?;
    let mut t: Option<i64> = None;
    let mut macs: Vec<Vec<u8>> = Vec::new();
    for part in header.split(',').take(8) {
        match part.trim().split_once('=') {
            Some(("t", v)) => t = Some(v.trim().parse().map_err(|_| SignatureError::Malformed)?),
            Some(("v1", v)) => macs.push(unhex(v.trim()).ok_or(SignatureError::Malformed)?),
            _ => {} // other schemes (v0, …): ignored, as Stripe does
        }
    }
    let t = t.ok_or(SignatureError::Malformed)?;
    if macs.is_empty() {
        return Err(SignatureError::Malformed);
    }
    let skew = now.saturating_sub(t);
    if skew.abs() > TOLERANCE_SECS {
        return Err(SignatureError::Stale(skew));
    }
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
    let signed = [t.to_string().as_bytes(), b".", body].concat();
    macs.into_iter()
        .find(|mac| hmac::verify(&key, &signed, mac).is_ok())
        .map(|mac| Verified { t, mac })
        .ok_or(SignatureError::Mismatch)
}

/// Whether an `Authorization` header value is `Bearer <token>`, compared in
/// constant time (of both sides' SHA-256, so the length is not timed).
pub fn bearer_matches(header: Option<&str>, token: &str) -> bool {
    let Some(given) = header.and_then(|h| h.strip_prefix("Bearer ").or_else(|| h.strip_prefix("bearer "))) else {
        return false;
    };
    let a = ring::digest::digest(&ring::digest::SHA256, given.trim().as_bytes());
    let b = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let diff = a.as_ref().iter().zip(b.as_ref()).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// A short stable id of this bramble (host name and state directory): what
/// [`ORIGIN_HEADER`] carries.
pub fn instance_id(host: &str, state_dir: &std::path::Path) -> String {
    let text = format!("{host}\0{}", state_dir.display());
    hex(&ring::digest::digest(&ring::digest::SHA256, text.as_bytes()).as_ref()[..8])
}

/// How a POST proves itself.
pub enum PostAuth<'a> {
    /// Signed with this secret ([`SIGNATURE_HEADER`]).
    Hmac(&'a str),
    /// `Authorization: Bearer <token>`.
    Bearer(&'a str),
}

/// One POST of a report.
pub struct Post<'a> {
    pub url: &'a str,
    pub body: Vec<u8>,
    pub auth: PostAuth<'a>,
    /// The report's idempotency id ([`ID_HEADER`]).
    pub id: &'a str,
    /// This bramble ([`ORIGIN_HEADER`]).
    pub origin: &'a str,
    /// Now, in unix seconds (the signature's `t`).
    pub now: i64,
}

/// Why a POST did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    /// The receiver answered with a status other than 2xx (and not a redirect).
    #[error("the receiver answered HTTP {status}{}", if .body.is_empty() { String::new() } else { format!(": {body}") })]
    Status { status: u16, body: String },
    /// A redirect to another origin (or too many): not followed.
    #[error("the receiver redirected to {0}, another origin (or too many times): not followed, the report and its signature stay here")]
    Redirect(String),
    /// No answer: connection refused, reset, timed out.
    #[error("{0}")]
    Transport(String),
}

/// The client for reports: no redirect to another origin, a timeout on the whole POST.
pub fn http_client() -> Result<reqwest::Client, reqwest::Error> {
    let policy = reqwest::redirect::Policy::custom(|attempt| {
        let first = attempt.previous().first().cloned();
        let same = first.is_some_and(|f| f.origin() == attempt.url().origin());
        if same && attempt.previous().len() <= 3 {
            attempt.follow()
        } else {
            attempt.stop()
        }
    });
    reqwest::Client::builder()
        .redirect(policy)
        .timeout(POST_TIMEOUT)
        .connect_timeout(Duration::from_secs(10))
        .user_agent(concat!("bramble/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// POST one report. Ok on a 2xx answer.
pub async fn post(http: &reqwest::Client, p: Post<'_>) -> Result<u16, PostError> {
    let mut req = http
        .post(p.url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(ID_HEADER, p.id)
        .header(ORIGIN_HEADER, p.origin);
    req = match p.auth {
        PostAuth::Hmac(secret) => req.header(SIGNATURE_HEADER, signature_header(secret.as_bytes(), p.now, &p.body)),
        PostAuth::Bearer(token) => req.bearer_auth(token),
    };
    let resp = req.body(p.body).send().await.map_err(|e| PostError::Transport(transport(&e)))?;
    let status = resp.status();
    if status.is_success() {
        return Ok(status.as_u16());
    }
    if status.is_redirection() {
        let to = resp.headers().get(reqwest::header::LOCATION).and_then(|l| l.to_str().ok()).unwrap_or("?");
        return Err(PostError::Redirect(to.chars().take(200).collect()));
    }
    let (body, _) = super::read_capped(resp, 300).await.unwrap_or_default();
    let body = String::from_utf8_lossy(&body).trim().chars().take(200).collect();
    Err(PostError::Status { status: status.as_u16(), body })
}

/// A transport error in one line, its cause included.
fn transport(e: &reqwest::Error) -> String {
    let mut text = if e.is_timeout() { "no answer in time".to_string() } else { e.to_string() };
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text = format!("{text}: {s}");
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_once_in_its_window_and_not_otherwise() {
        let body = br#"{"state":"open"}"#;
        let header = signature_header(b"s3cret", 1_000_000, body);
        assert!(header.starts_with("t=1000000,v1="), "{header}");
        let ok = verify(b"s3cret", Some(&header), body, 1_000_100).unwrap();
        assert_eq!(ok.t, 1_000_000);
        assert_eq!(verify(b"other", Some(&header), body, 1_000_000), Err(SignatureError::Mismatch));
        assert_eq!(verify(b"s3cret", Some(&header), b"{}", 1_000_000), Err(SignatureError::Mismatch));
        assert_eq!(verify(b"s3cret", Some(&header), body, 1_000_301), Err(SignatureError::Stale(301)));
        assert_eq!(verify(b"s3cret", None, body, 1), Err(SignatureError::Missing));
        for bad in ["", "t=x,v1=00", "v1=00", "t=5", "t=5,v1=zz", "t=5,v1=0"] {
            assert_eq!(verify(b"s", Some(bad), body, 5), Err(SignatureError::Malformed), "{bad}");
        }
        // A rotated secret: either v1 may match.
        let rotated = format!("t=7,v1={},v1={}", sign(b"old", 7, body), sign(b"new", 7, body));
        assert!(verify(b"new", Some(&rotated), body, 7).is_ok());
        // The same as openssl's: printf '1.{}' | openssl dgst -sha256 -hmac k
        assert_eq!(sign(b"k", 1, b"{}"), "3dd49b2593d0f9a349e9e71c4bde3e2b862c2be4003fe9b4ba81332029310158");
    }

    #[test]
    fn bearer_tokens_match_exactly() {
        assert!(bearer_matches(Some("Bearer abc"), "abc"));
        for bad in [None, Some("Bearer abd"), Some("Bearer ab"), Some("abc"), Some("Basic abc")] {
            assert!(!bearer_matches(bad, "abc"), "{bad:?}");
        }
    }
}
