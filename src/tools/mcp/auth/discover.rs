//! Finding a server's authorization server: the 401's challenge, the
//! protected resource metadata (RFC 9728) and the authorization server's
//! metadata (RFC 8414, with OpenID Connect discovery as the fallback), in the
//! order MCP 2025-11-25 ("Authorization", "Discovery") gives; with what
//! 2025-03-26 servers did when there is none (metadata at the server's root,
//! then the default `/authorize`, `/token`, `/register`).
//!
//! Every document is read with a cap ([`MAX_METADATA`]) and must be a JSON
//! object; an authorization server's endpoints must be https (plain http
//! only on the loopback, where tests and local servers live); a resource
//! metadata whose `resource` is not the server we talk to is refused (RFC
//! 9728 §3.3: a server could otherwise obtain tokens meant for another).

use reqwest::header::{HeaderMap, WWW_AUTHENTICATE};
use reqwest::{StatusCode, Url};
use serde_json::Value;

use super::AuthError;

/// Largest metadata document read.
pub const MAX_METADATA: usize = 64 * 1024;

/// What a `WWW-Authenticate: Bearer …` challenge says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Challenge {
    pub resource_metadata: Option<String>,
    pub scope: Option<String>,
    pub error: Option<String>,
}

/// The Bearer challenge of a response's headers, if any.
pub fn challenge(headers: &HeaderMap) -> Option<Challenge> {
    headers.get_all(WWW_AUTHENTICATE).iter().filter_map(|v| v.to_str().ok()).find_map(parse_challenge)
}

/// One `WWW-Authenticate` value, when it is a Bearer challenge (RFC 6750 §3: `Bearer k="v", k=v`).
pub fn parse_challenge(value: &str) -> Option<Challenge> {
    let value = value.trim();
    let (scheme, rest) = value.split_once(char::is_whitespace).unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut out = Challenge::default();
    let mut rest = rest.trim_start();
    while !rest.is_empty() {
        let Some((key, after)) = rest.split_once('=') else { break };
        let key = key.trim().trim_start_matches(',').trim().to_ascii_lowercase();
        let after = after.trim_start();
        let (val, next) = if let Some(quoted) = after.strip_prefix('"') {
            let mut val = String::new();
            let mut chars = quoted.char_indices();
            let mut end = quoted.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => val.extend(chars.next().map(|(_, c)| c)),
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    c => val.push(c),
                }
            }
            (val, &quoted[end.min(quoted.len())..])
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (after[..end].trim().to_string(), &after[end..])
        };
        match key.as_str() {
            "resource_metadata" => out.resource_metadata = Some(val),
            "scope" => out.scope = Some(val),
            "error" => out.error = Some(val),
            _ => {}
        }
        rest = next.trim_start().trim_start_matches(',').trim_start();
    }
    Some(out)
}

/// Whether `url` may carry OAuth traffic: https, or http to the loopback.
pub fn secure(url: &Url) -> bool {
    match url.scheme() {
        "https" => true,
        "http" => matches!(url.host_str(), Some("127.0.0.1" | "localhost" | "[::1]")),
        _ => false,
    }
}

/// `url`, refused unless [`secure`] (`what` names it in the error).
pub fn require_secure(url: &str, what: &str) -> Result<Url, AuthError> {
    let parsed =
        Url::parse(url).map_err(|e| AuthError::Metadata(format!("{what} `{}` is not a URL ({e})", excerpt(url))))?;
    if !secure(&parsed) {
        return Err(AuthError::Metadata(format!(
            "{what} `{}` is not https: tokens and codes would travel in clear text (only 127.0.0.1/localhost may \
             use http)",
            excerpt(url)
        )));
    }
    Ok(parsed)
}

fn excerpt(s: &str) -> String {
    s.chars().take(120).collect()
}

/// GET a metadata document: `Ok(None)` when the server has none there (a 4xx), the object otherwise.
pub async fn get_json(http: &reqwest::Client, url: &Url, what: &str) -> Result<Option<Value>, AuthError> {
    let mut resp = http
        .get(url.clone())
        .header(reqwest::header::ACCEPT, "application/json")
        .send()
        .await
        .map_err(|e| AuthError::unreachable(what, url, &e))?;
    let status = resp.status();
    if status.is_client_error() {
        return Ok(None);
    }
    if status.is_redirection() {
        // Not followed (no client here follows one); treated as "none here", like a 404.
        return Ok(None);
    }
    if status != StatusCode::OK {
        return Err(AuthError::Metadata(format!("{what} at {url}: HTTP {status}")));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| AuthError::unreachable(what, url, &e))? {
        if body.len() + chunk.len() > MAX_METADATA {
            return Err(AuthError::Metadata(format!(
                "{what} at {url} is larger than {} KiB: not read",
                MAX_METADATA / 1024
            )));
        }
        body.extend_from_slice(&chunk);
    }
    match serde_json::from_slice::<Value>(&body) {
        Ok(v @ Value::Object(_)) => Ok(Some(v)),
        Ok(_) => Err(AuthError::Metadata(format!("{what} at {url} is not a JSON object"))),
        Err(e) => Err(AuthError::Metadata(format!("{what} at {url} is not JSON ({e})"))),
    }
}

/// A server's protected resource metadata, checked.
#[derive(Debug, Clone)]
pub struct Resource {
    /// The `resource` to ask tokens for (RFC 8707).
    pub resource: String,
    pub authorization_server: Url,
    pub scopes_supported: Vec<String>,
}

/// Where to look for `server`'s resource metadata: the challenge's URL, else
/// the path-based well-known URL, then the root one (MCP 2025-11-25).
fn prm_candidates(server: &Url, challenge: Option<&Challenge>) -> Result<Vec<Url>, AuthError> {
    if let Some(url) = challenge.and_then(|c| c.resource_metadata.as_deref()) {
        let parsed = Url::parse(url)
            .or_else(|_| server.join(url))
            .map_err(|e| AuthError::Metadata(format!("resource_metadata `{}` is not a URL ({e})", excerpt(url))))?;
        if parsed.origin() != server.origin() && !secure(&parsed) {
            return Err(AuthError::Metadata(format!("resource_metadata `{}` is not https", excerpt(url))));
        }
        return Ok(vec![parsed]);
    }
    let mut out = Vec::new();
    let path = server.path().trim_end_matches('/');
    let mut root = server.clone();
    root.set_query(None);
    root.set_fragment(None);
    if !path.is_empty() {
        let mut u = root.clone();
        u.set_path(&format!("/.well-known/oauth-protected-resource{path}"));
        out.push(u);
    }
    root.set_path("/.well-known/oauth-protected-resource");
    out.push(root);
    Ok(out)
}

/// `server`'s protected resource metadata; `None` when it publishes none (a 2025-03-26 server).
pub async fn protected_resource(
    http: &reqwest::Client,
    server: &Url,
    challenge: Option<&Challenge>,
) -> Result<Option<Resource>, AuthError> {
    for url in prm_candidates(server, challenge)? {
        let Some(doc) = get_json(http, &url, "the protected resource metadata").await? else { continue };
        return check_resource(server, &doc).map(Some);
    }
    Ok(None)
}

/// The metadata's fields, and its `resource` checked against the server's URL.
pub fn check_resource(server: &Url, doc: &Value) -> Result<Resource, AuthError> {
    let resource = doc
        .get("resource")
        .and_then(Value::as_str)
        .ok_or_else(|| AuthError::Metadata("the protected resource metadata has no `resource`".into()))?;
    if !resource_matches(server, resource) {
        return Err(AuthError::Metadata(format!(
            "the protected resource metadata is for `{}`, not for this server ({}): refused, a token for it could \
             reach another service",
            excerpt(resource),
            canonical(server)
        )));
    }
    let issuer = doc
        .get("authorization_servers")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().find_map(Value::as_str))
        .ok_or_else(|| AuthError::Metadata("the protected resource metadata names no authorization server".into()))?;
    let authorization_server = require_secure(issuer, "the authorization server")?;
    let scopes_supported = strings(doc.get("scopes_supported"));
    Ok(Resource { resource: resource.to_string(), authorization_server, scopes_supported })
}

/// The server's URL as a resource indicator: no fragment (RFC 8707 §2).
pub fn canonical(server: &Url) -> String {
    let mut u = server.clone();
    u.set_fragment(None);
    u.to_string()
}

/// Whether `resource` names `server`: the same origin, and a path that is `server`'s or a parent of it.
pub fn resource_matches(server: &Url, resource: &str) -> bool {
    let Ok(r) = Url::parse(resource) else { return false };
    if r.origin() != server.origin() || r.fragment().is_some() {
        return false;
    }
    let want = r.path().trim_end_matches('/');
    let have = server.path().trim_end_matches('/');
    have == want || have.starts_with(&format!("{want}/"))
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default()
}

/// An authorization server's metadata (the fields bramble uses).
#[derive(Debug, Clone)]
pub struct Server {
    /// Its `issuer` (the audience of a client assertion).
    pub issuer: Option<String>,
    pub authorization_endpoint: Url,
    pub token_endpoint: Url,
    pub registration_endpoint: Option<Url>,
    /// `None`: the metadata does not say (refused for the code flow, as the spec requires).
    pub code_challenge_methods: Option<Vec<String>>,
    pub token_auth_methods: Vec<String>,
    pub client_id_metadata_documents: bool,
    /// No metadata at all: the 2025-03-26 default endpoints.
    pub defaults: bool,
}

/// RFC 8414 §3 and OpenID Connect discovery URLs for `issuer`, in the spec's order.
fn as_candidates(issuer: &Url) -> Vec<Url> {
    let path = issuer.path().trim_end_matches('/');
    let at = |p: String| {
        let mut u = issuer.clone();
        u.set_query(None);
        u.set_fragment(None);
        u.set_path(&p);
        u
    };
    if path.is_empty() {
        vec![at("/.well-known/oauth-authorization-server".into()), at("/.well-known/openid-configuration".into())]
    } else {
        vec![
            at(format!("/.well-known/oauth-authorization-server{path}")),
            at(format!("/.well-known/openid-configuration{path}")),
            at(format!("{path}/.well-known/openid-configuration")),
        ]
    }
}

/// The metadata of `issuer`; `None` when it publishes none.
pub async fn authorization_server(http: &reqwest::Client, issuer: &Url) -> Result<Option<Server>, AuthError> {
    for url in as_candidates(issuer) {
        let Some(doc) = get_json(http, &url, "the authorization server's metadata").await? else { continue };
        return parse_server(&doc).map(Some);
    }
    Ok(None)
}

/// The fields of an authorization server's metadata, checked.
pub fn parse_server(doc: &Value) -> Result<Server, AuthError> {
    let endpoint = |key: &str| -> Result<Url, AuthError> {
        let v = doc
            .get(key)
            .and_then(Value::as_str)
            .ok_or_else(|| AuthError::Metadata(format!("the authorization server's metadata has no `{key}`")))?;
        require_secure(v, key)
    };
    let registration_endpoint = match doc.get("registration_endpoint").and_then(Value::as_str) {
        Some(v) => Some(require_secure(v, "registration_endpoint")?),
        None => None,
    };
    Ok(Server {
        issuer: doc.get("issuer").and_then(Value::as_str).map(str::to_string),
        authorization_endpoint: endpoint("authorization_endpoint")?,
        token_endpoint: endpoint("token_endpoint")?,
        registration_endpoint,
        code_challenge_methods: doc.get("code_challenge_methods_supported").map(|v| strings(Some(v))),
        token_auth_methods: strings(doc.get("token_endpoint_auth_methods_supported")),
        client_id_metadata_documents: doc.get("client_id_metadata_document_supported").and_then(Value::as_bool)
            == Some(true),
        defaults: false,
    })
}

/// The 2025-03-26 fallback: `/authorize`, `/token`, `/register` at the server's origin.
pub fn default_endpoints(server: &Url) -> Result<Server, AuthError> {
    let at = |p: &str| {
        let mut u = server.clone();
        u.set_query(None);
        u.set_fragment(None);
        u.set_path(p);
        require_secure(u.as_str(), "the server's default OAuth endpoint")
    };
    Ok(Server {
        issuer: None,
        authorization_endpoint: at("/authorize")?,
        token_endpoint: at("/token")?,
        registration_endpoint: Some(at("/register")?),
        code_challenge_methods: None,
        token_auth_methods: Vec::new(),
        client_id_metadata_documents: false,
        defaults: true,
    })
}

/// Everything discovery found for one server.
#[derive(Debug, Clone)]
pub struct Found {
    pub resource: String,
    pub scopes_supported: Vec<String>,
    pub server: Server,
}

/// Discover from a challenge (or none): resource metadata, then the authorization server.
pub async fn discover(http: &reqwest::Client, server: &Url, challenge: Option<&Challenge>) -> Result<Found, AuthError> {
    let prm = protected_resource(http, server, challenge).await?;
    let (resource, scopes_supported, issuer) = match prm {
        Some(r) => (r.resource, r.scopes_supported, r.authorization_server),
        None => {
            // 2025-03-26: the server is its own authorization server.
            let mut root = server.clone();
            root.set_path("/");
            root.set_query(None);
            root.set_fragment(None);
            (canonical(server), Vec::new(), root)
        }
    };
    let meta = match authorization_server(http, &issuer).await? {
        Some(m) => m,
        None => default_endpoints(&issuer)?,
    };
    Ok(Found { resource, scopes_supported, server: meta })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn challenges_are_read_as_rfc_6750_writes_them() {
        let c = parse_challenge(
            r#"Bearer error="insufficient_scope", scope="a b", resource_metadata="http://x/.well-known/p", error_description="no \"way\"""#,
        )
        .unwrap();
        assert_eq!(c.scope.as_deref(), Some("a b"));
        assert_eq!(c.error.as_deref(), Some("insufficient_scope"));
        assert_eq!(c.resource_metadata.as_deref(), Some("http://x/.well-known/p"));
        assert_eq!(parse_challenge("bearer scope=x").unwrap().scope.as_deref(), Some("x"));
        assert_eq!(parse_challenge("Bearer").unwrap(), Challenge::default());
        assert!(parse_challenge("Basic realm=\"x\"").is_none());
        // Malformed: no panic, what can be read is read.
        assert!(parse_challenge("Bearer scope=\"unterminated").is_some());
        assert!(parse_challenge("Bearer ===,,,\"").is_some());
    }

    #[test]
    fn resource_metadata_must_name_this_server() {
        let server = Url::parse("http://localhost:3000/mcp").unwrap();
        for ok in [
            "http://localhost:3000/mcp",
            "http://localhost:3000/",
            "http://localhost:3000",
            "http://localhost:3000/mcp/",
        ] {
            assert!(resource_matches(&server, ok), "{ok}");
        }
        for bad in [
            "https://evil.example.com/mcp",
            "http://localhost:3001/mcp",
            "http://localhost:3000/other",
            "http://localhost:3000/mc",
            "not a url",
        ] {
            assert!(!resource_matches(&server, bad), "{bad}");
        }
        let doc = json!({"resource": "https://evil.example.com/mcp", "authorization_servers": ["http://localhost:1"]});
        let err = check_resource(&server, &doc).unwrap_err().to_string();
        assert!(err.contains("not for this server"), "{err}");
    }

    #[test]
    fn authorization_servers_must_use_https_off_the_loopback() {
        let doc =
            json!({"authorization_endpoint": "http://as.example.com/a", "token_endpoint": "https://as.example.com/t"});
        let err = parse_server(&doc).unwrap_err().to_string();
        assert!(err.contains("is not https"), "{err}");
        let doc = json!({"authorization_endpoint": "http://127.0.0.1:9/a", "token_endpoint": "http://localhost:9/t", "code_challenge_methods_supported": ["S256"]});
        let s = parse_server(&doc).unwrap();
        assert_eq!(s.code_challenge_methods.as_deref(), Some(&["S256".to_string()][..]));
        let prm = json!({"resource": "http://localhost:3000/mcp", "authorization_servers": ["http://as.example.com"]});
        let server = Url::parse("http://localhost:3000/mcp").unwrap();
        assert!(check_resource(&server, &prm).unwrap_err().to_string().contains("is not https"));
    }

    #[test]
    fn well_known_urls_follow_the_specs_order() {
        let s = |u: &str| Url::parse(u).unwrap();
        let got: Vec<String> =
            prm_candidates(&s("http://h:1/mcp?x=1"), None).unwrap().iter().map(Url::to_string).collect();
        assert_eq!(
            got,
            ["http://h:1/.well-known/oauth-protected-resource/mcp", "http://h:1/.well-known/oauth-protected-resource"]
        );
        let got: Vec<String> = as_candidates(&s("https://a/tenant1")).iter().map(Url::to_string).collect();
        assert_eq!(
            got,
            [
                "https://a/.well-known/oauth-authorization-server/tenant1",
                "https://a/.well-known/openid-configuration/tenant1",
                "https://a/tenant1/.well-known/openid-configuration"
            ]
        );
        let got: Vec<String> = as_candidates(&s("https://a")).iter().map(Url::to_string).collect();
        assert_eq!(
            got,
            ["https://a/.well-known/oauth-authorization-server", "https://a/.well-known/openid-configuration"]
        );
    }
}
