//! What a server that was sent a credential may send back, made safe to show.
//!
//! Every client that holds a secret (providers, transcription, Home
//! Assistant, MCP over HTTP, keyed search engines, Telegram) passes a
//! server's words — an error body, a transport error — through [`redact`]
//! before they reach a model, a log, a report or the audit trail: a server, or
//! a proxy in front of it, may quote the request (`Authorization: Bearer …`).
//! [`redact`] replaces the secrets the client sent and, whatever their value,
//! credentials written the way headers and parameters are echoed.
//!
//! The same clients follow no redirect ([`redirect_refusal`]): an HTTP library
//! drops `Authorization` when a redirect leaves the origin, but it cannot know
//! that `x-api-key` or a token in the path is a secret too.

use reqwest::header::{HeaderMap, LOCATION};

/// What a secret becomes.
const MASK: &str = "***";
/// Shorter values are not replaced (they would mangle ordinary words).
const MIN_SECRET: usize = 4;
/// Names whose `name: value` / `name=value` is a credential when a server echoes it.
const CREDENTIAL_NAMES: [&str; 11] = [
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "api-key",
    "x-subscription-token",
    "x-auth-token",
    "x-goog-api-key",
    "cookie",
    "access_token",
    "api_key",
    "apikey",
];
/// Authentication schemes written before a credential (`Bearer <token>`).
const SCHEMES: [&str; 3] = ["bearer", "basic", "token"];
/// A free-standing `Bearer <token>` is masked when the token is at least this long.
const MIN_BEARER: usize = 8;

/// `text` with every one of `secrets` replaced by `***`, and every echoed
/// credential (`Authorization: Bearer abc`, `"x-api-key": "abc"`,
/// `api_key=abc`, `Bearer abc…`) masked whatever its value.
pub fn redact<S: AsRef<str>>(text: &str, secrets: &[S]) -> String {
    let mut values: Vec<&str> = secrets.iter().map(|s| s.as_ref().trim()).filter(|s| s.len() >= MIN_SECRET).collect();
    // Longest first: a secret that contains another is replaced whole.
    values.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut out = text.to_string();
    for value in values {
        out = out.replace(value, MASK);
    }
    mask_echoed_credentials(&out)
}

/// The values of `headers` marked sensitive, and the credential inside each
/// (`Bearer abc` gives `Bearer abc` and `abc`): the secrets a request carried.
pub fn sensitive_values(headers: &HeaderMap) -> Vec<String> {
    let mut out = Vec::new();
    for value in headers.values().filter(|v| v.is_sensitive()) {
        let Ok(text) = value.to_str() else { continue };
        out.push(text.to_string());
        if let Some((_, credential)) = text.trim().rsplit_once(' ') {
            out.push(credential.to_string());
        }
    }
    out
}

/// A redirect answered to a request that carried a credential, as an error
/// naming where it pointed (the origin only: a path may hold a token). `None`
/// when `resp` is not a redirect.
pub fn redirect_refusal(resp: &reqwest::Response) -> Option<String> {
    let status = resp.status();
    if !status.is_redirection() || status == reqwest::StatusCode::NOT_MODIFIED {
        return None;
    }
    let target = resp
        .headers()
        .get(LOCATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|l| resp.url().join(l.trim()).ok())
        .map(|u| u.origin().ascii_serialization());
    let to = match target {
        Some(origin) => format!("a redirect to {origin}"),
        None => "a redirect".to_string(),
    };
    Some(format!(
        "the server answered HTTP {} with {to}, which is not followed: the request carries a credential that must \
         not travel to another address; configure the final URL instead",
        status.as_u16()
    ))
}

/// Whether `b` may be part of a header or parameter name.
fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

/// Whether `b` ends a credential value.
fn ends_value(b: u8) -> bool {
    b.is_ascii_whitespace() || b"\"',;}])&<>\\".contains(&b)
}

/// The first index at or after `i` whose byte is not accepted by `skip`.
fn skip_while(bytes: &[u8], mut i: usize, skip: impl Fn(u8) -> bool) -> usize {
    while i < bytes.len() && skip(bytes[i]) {
        i += 1;
    }
    i
}

/// The byte range of the value after `name` at `at` (`: "Bearer abc"` → `abc`), if it is `name: value`.
fn echoed_value(bytes: &[u8], lower: &str, at: usize, name: &str) -> Option<(usize, usize)> {
    if at > 0 && is_name_byte(bytes[at - 1]) {
        return None;
    }
    let mut i = at + name.len();
    if i < bytes.len() && is_name_byte(bytes[i]) {
        return None;
    }
    i = skip_while(bytes, i, |b| b == b'"' || b == b'\'');
    i = skip_while(bytes, i, |b| b == b' ' || b == b'\t');
    if i >= bytes.len() || !(bytes[i] == b':' || bytes[i] == b'=') {
        return None;
    }
    i = skip_while(bytes, i + 1, |b| b == b' ' || b == b'\t' || b == b'"' || b == b'\'');
    if let Some(scheme) = SCHEMES.iter().find(|s| lower[i..].starts_with(*s)) {
        let after = i + scheme.len();
        if after < bytes.len() && bytes[after] == b' ' {
            i = skip_while(bytes, after, |b| b == b' ');
        }
    }
    let end = skip_while(bytes, i, |b| !ends_value(b));
    (end > i).then_some((i, end))
}

/// `text` with the value of every echoed credential replaced by `***`.
fn mask_echoed_credentials(text: &str) -> String {
    // ASCII lower-casing keeps every byte where it was, so indices carry over.
    let lower = text.to_ascii_lowercase();
    let bytes = text.as_bytes();
    let mut cuts: Vec<(usize, usize)> = Vec::new();
    for name in CREDENTIAL_NAMES {
        cuts.extend(lower.match_indices(name).filter_map(|(at, _)| echoed_value(bytes, &lower, at, name)));
    }
    for (at, _) in lower.match_indices("bearer ") {
        if at > 0 && is_name_byte(bytes[at - 1]) {
            continue;
        }
        let start = skip_while(bytes, at + "bearer ".len(), |b| b == b' ');
        let end = skip_while(bytes, start, |b| !ends_value(b));
        if end - start >= MIN_BEARER {
            cuts.push((start, end));
        }
    }
    if cuts.is_empty() {
        return text.to_string();
    }
    cuts.sort_unstable();
    let mut out = String::with_capacity(text.len());
    let mut done = 0;
    for (start, end) in cuts {
        if end <= done {
            continue;
        }
        let start = start.max(done);
        out.push_str(&text[done..start]);
        out.push_str(MASK);
        done = end;
    }
    out.push_str(&text[done..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_and_echoed_credentials_are_masked() {
        assert_eq!(redact("bad key sk-secret-123!", &["sk-secret-123"]), "bad key ***!");
        assert_eq!(redact("nothing", &[] as &[&str]), "nothing");
        assert_eq!(redact("a b c", &["b"]), "a b c", "too short to be a secret");
        let cases = [
            ("got Authorization: Bearer abc.def-ghi\nHost: x", "got Authorization: Bearer ***\nHost: x"),
            (
                r#"{"headers":{"authorization":"Bearer zzzzzzzz","x-api-key":"k-1"}}"#,
                r#"{"headers":{"authorization":"Bearer ***","x-api-key":"***"}}"#,
            ),
            ("X-Subscription-Token: BSAabc123 denied", "X-Subscription-Token: *** denied"),
            ("GET /x?api_key=abc&q=1", "GET /x?api_key=***&q=1"),
            ("invalid token Bearer eyJhbGciOi.xyz here", "invalid token Bearer *** here"),
            ("Cookie: session=abc; other=1", "Cookie: ***; other=1"),
        ];
        for (text, want) in cases {
            assert_eq!(redact(text, &[] as &[&str]), want, "{text}");
        }
        // Words that only look like it are left alone.
        for text in ["the bearer of news", "authorization failed", "no api-key given", "my-authorization: x"] {
            assert_eq!(redact(text, &[] as &[&str]), text);
        }
        // Non-ASCII text around an echo survives.
        assert_eq!(redact("é Authorization: Basic äbc é", &[] as &[&str]), "é Authorization: Basic *** é");
    }

    #[test]
    fn sensitive_header_values_are_the_secrets() {
        let mut headers = HeaderMap::new();
        let mut v = reqwest::header::HeaderValue::from_static("Bearer tok-123");
        v.set_sensitive(true);
        headers.insert("authorization", v);
        headers.insert("accept", reqwest::header::HeaderValue::from_static("application/json"));
        assert_eq!(sensitive_values(&headers), vec!["Bearer tok-123".to_string(), "tok-123".to_string()]);
    }
}
