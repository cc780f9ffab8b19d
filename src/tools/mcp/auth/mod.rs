//! OAuth 2.1 for remote MCP servers (MCP 2025-11-25, "Authorization").
//!
//! A streamable HTTP server that answers 401 (or 403 `insufficient_scope`)
//! is authorized here: [`discover`] finds its authorization server (RFC
//! 9728 → RFC 8414 / OpenID discovery, or the 2025-03-26 fallbacks), then
//! either the machine grant runs (`grant_type = "client_credentials"`, a
//! configured client) or the authorization code flow with PKCE S256 and
//! `resource` ([`flow`]), its client registered dynamically (RFC 7591),
//! configured (`client_id`) or named by its metadata document's URL.
//!
//! **A board has no browser.** The daemon never waits for a person: without
//! a usable grant, a server that wants one is down with "run `bramble mcp
//! login NAME`". That command (and the conformance adapter) gives a
//! [`UserAgent`]: the URL is shown (or visited), the code comes back through
//! the loopback listener or is pasted ([`callback`]).
//!
//! The grant is kept in memory and in the server's token file ([`store`]);
//! it is refreshed before it expires and once when the server refuses it;
//! a refresh refused marks the file, so `mcp list` and `doctor` say so.
//!
//! **Where tokens go:** only in the `Authorization` header of requests to the
//! server's own URL (the transport's; no redirect is ever followed, so no
//! other origin sees it), never to the authorization server, never in a log.

pub mod callback;
pub mod discover;
pub mod flow;
pub mod store;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{StatusCode, Url};

use crate::config::{GrantType, OAuthSettings};
use crate::util::BoxFuture;
use discover::{Challenge, Found};
use store::{ClientInfo, Record};

/// A token this close to its expiry (seconds) is renewed before use.
const REFRESH_MARGIN: u64 = 60;
/// Longest wait for the person to finish logging in.
const LOGIN_WAIT: Duration = Duration::from_secs(600);

/// Shows the authorization URL to a person (or visits it, headless).
pub trait UserAgent: Send + Sync {
    /// Show or visit `url`; `Some(text)` when the person pasted the redirect
    /// URL or the code, `None` to wait for the loopback callback alone.
    fn visit<'a>(&'a self, url: &'a Url) -> BoxFuture<'a, Option<String>>;
}

/// Why authorization failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AuthError {
    /// A metadata document or answer that cannot be used.
    #[error("{0}")]
    Metadata(String),
    /// The authorization server said no.
    #[error("the authorization server refused: {0}")]
    Refused(String),
    #[error("{0}")]
    Failed(String),
    /// A person must log in.
    #[error("MCP server \"{server}\" needs authorization ({why}): run `bramble mcp login {server}`")]
    NeedsLogin { server: String, why: String },
}

impl AuthError {
    /// A request to `url` that got no answer.
    pub fn unreachable(what: &str, url: &Url, e: &reqwest::Error) -> AuthError {
        let origin = url.origin().ascii_serialization();
        if e.is_timeout() {
            AuthError::Failed(format!("{what} ({origin}) did not answer in time"))
        } else {
            let mut why = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(s) = source {
                why = format!("{why}: {s}");
                source = s.source();
            }
            AuthError::Failed(format!("{what} ({origin}) is not reachable: {why}"))
        }
    }
}

/// One server's authorization: its settings, its grant, its token file.
pub struct Auth {
    name: String,
    url: Url,
    settings: OAuthSettings,
    file: Option<PathBuf>,
    timeout: Duration,
    agent: Option<Arc<dyn UserAgent>>,
    http: OnceLock<reqwest::Client>,
    grant: tokio::sync::Mutex<Slot>,
}

#[derive(Default)]
struct Slot {
    /// The token file's modification time when it was read (or written) last.
    seen: Option<std::time::SystemTime>,
    loaded: bool,
    record: Option<Record>,
}

impl Auth {
    /// `file`: the token file (none: the grant lives in memory only);
    /// `agent`: who shows the login URL (none: a login is asked of the owner).
    pub fn new(
        name: &str,
        url: Url,
        settings: OAuthSettings,
        file: Option<PathBuf>,
        timeout: Duration,
        agent: Option<Arc<dyn UserAgent>>,
    ) -> Auth {
        Auth {
            name: name.to_string(),
            url,
            settings,
            file,
            timeout,
            agent,
            http: OnceLock::new(),
            grant: tokio::sync::Mutex::new(Slot::default()),
        }
    }

    fn http(&self) -> Result<&reqwest::Client, AuthError> {
        if let Some(c) = self.http.get() {
            return Ok(c);
        }
        let c = crate::provider::http_client(self.timeout).map_err(|e| AuthError::Failed(e.to_string()))?;
        Ok(self.http.get_or_init(|| c))
    }

    /// Read the token file the first time, and again when it changed (a
    /// `bramble mcp login` or `logout` while the daemon runs).
    fn load(&self, slot: &mut Slot) {
        let Some(file) = &self.file else { return };
        let mtime = std::fs::metadata(file).and_then(|m| m.modified()).ok();
        if slot.loaded && mtime == slot.seen {
            return;
        }
        slot.loaded = true;
        slot.seen = mtime;
        match store::load(file) {
            Ok(r) => slot.record = r,
            Err(e) => tracing::warn!("mcp: {}: {e}", self.name),
        }
    }

    fn save(&self, slot: &mut Slot, record: Record) {
        let mut kept = record.clone();
        if self.settings.client_secret_env.is_some() {
            kept.client.client_secret = None; // a configured secret stays in its variable
        }
        if let Some(file) = &self.file {
            match store::save(file, &kept) {
                Ok(()) => slot.seen = std::fs::metadata(file).and_then(|m| m.modified()).ok(),
                Err(e) => tracing::warn!("mcp: {}: the grant is kept in memory only: {e}", self.name),
            }
        }
        slot.record = Some(record);
    }

    /// The `Authorization` value for the next request, renewed first when it
    /// is about to expire; `None` before any grant.
    pub async fn bearer(&self) -> Option<HeaderValue> {
        let mut slot = self.grant.lock().await;
        self.load(&mut slot);
        let rec = slot.record.as_ref()?;
        if rec.needs_login.is_none() && !rec.fresh(store::now(), REFRESH_MARGIN) {
            if let Err(e) = self.renew(&mut slot).await {
                tracing::warn!("mcp: {}: renewing the token failed: {e}", self.name);
            }
        }
        header(slot.record.as_ref()?)
    }

    /// The server refused a request (`status` 401 or 403) that carried `sent`:
    /// `Ok(true)` when there is a new token to retry with, `Ok(false)` when the
    /// refusal is not OAuth's (a plain 403, a 401 without a Bearer challenge).
    pub async fn challenged(
        &self,
        status: StatusCode,
        headers: &HeaderMap,
        sent: Option<&HeaderValue>,
    ) -> Result<bool, AuthError> {
        let challenge = discover::challenge(headers);
        let insufficient = challenge.as_ref().and_then(|c| c.error.as_deref()) == Some("insufficient_scope");
        if status == StatusCode::FORBIDDEN && !insufficient {
            return Ok(false);
        }
        // A 401 without a Bearer challenge is not OAuth's (a key header, a proxy): shown as it is.
        if challenge.is_none() && sent.is_none() {
            return Ok(false);
        }
        let mut slot = self.grant.lock().await;
        self.load(&mut slot);
        // Another request renewed the token meanwhile: retry with that one.
        let current = slot.record.as_ref().and_then(header);
        if current.is_some() && current.as_ref() != sent {
            return Ok(true);
        }
        if status == StatusCode::UNAUTHORIZED && sent.is_some() {
            let renewable = slot.record.as_ref().is_some_and(|r| r.refresh_token.is_some() && r.needs_login.is_none());
            if renewable && self.renew(&mut slot).await.is_ok() {
                return Ok(true);
            }
        }
        let previous = if insufficient { slot.record.as_ref().and_then(|r| r.scope.clone()) } else { None };
        self.authorize(&mut slot, challenge.as_ref(), previous.as_deref()).await.map(|()| true)
    }

    /// A new grant from scratch: discovery, then the configured grant type.
    async fn authorize(
        &self,
        slot: &mut Slot,
        challenge: Option<&Challenge>,
        previous: Option<&str>,
    ) -> Result<(), AuthError> {
        if self.settings.grant_type == GrantType::AuthorizationCode && self.agent.is_none() {
            let why = match challenge.and_then(|c| c.scope.as_deref()) {
                Some(scope) if previous.is_some() => format!("it asks for more scope: {scope}"),
                _ if slot.record.is_some() => "the grant is no longer accepted".to_string(),
                _ => "no grant yet".to_string(),
            };
            return Err(AuthError::NeedsLogin { server: self.name.clone(), why });
        }
        let http = self.http()?;
        let found = discover::discover(http, &self.url, challenge).await?;
        let scope = self.scope(challenge, &found, previous);
        let record = match self.settings.grant_type {
            GrantType::ClientCredentials => self.machine_grant(&found, scope.as_deref()).await?,
            GrantType::AuthorizationCode => self.code_grant(&found, scope.as_deref()).await?,
        };
        tracing::info!("mcp: {}: authorized ({})", self.name, record.grant_type);
        self.save(slot, record);
        Ok(())
    }

    /// The scopes to ask for: configured, else the challenge's (with those
    /// held, on a step-up), else all the resource lists, else none (MCP's
    /// scope selection strategy).
    fn scope(&self, challenge: Option<&Challenge>, found: &Found, previous: Option<&str>) -> Option<String> {
        if let Some(s) = &self.settings.scope {
            return Some(s.clone());
        }
        let mut scopes: Vec<&str> = Vec::new();
        match challenge.and_then(|c| c.scope.as_deref()).filter(|s| !s.trim().is_empty()) {
            Some(s) => scopes.extend(previous.unwrap_or_default().split_whitespace().chain(s.split_whitespace())),
            None => scopes.extend(found.scopes_supported.iter().map(String::as_str)),
        }
        let mut seen = Vec::new();
        for s in scopes {
            if !seen.contains(&s) {
                seen.push(s);
            }
        }
        (!seen.is_empty()).then(|| seen.join(" "))
    }

    async fn machine_grant(&self, found: &Found, scope: Option<&str>) -> Result<Record, AuthError> {
        let client = flow::configured_client(&self.settings, &found.server)?
            .ok_or_else(|| AuthError::Failed("client_credentials needs `client_id` and `client_secret_env`".into()))?;
        let mut params = vec![("grant_type", "client_credentials"), ("resource", found.resource.as_str())];
        params.extend(scope.map(|s| ("scope", s)));
        let tokens = flow::token(self.http()?, &found.server.token_endpoint, &client, &params).await?;
        Ok(record(tokens, found, client, "client_credentials", scope))
    }

    async fn code_grant(&self, found: &Found, scope: Option<&str>) -> Result<Record, AuthError> {
        let agent = self
            .agent
            .as_ref()
            .ok_or_else(|| AuthError::NeedsLogin { server: self.name.clone(), why: "no grant yet".into() })?;
        let s256 = found.server.code_challenge_methods.as_ref().is_some_and(|m| m.iter().any(|m| m == "S256"));
        if !s256 && !found.server.defaults {
            return Err(AuthError::Metadata(
                "the authorization server does not list PKCE S256 in code_challenge_methods_supported: refused \
                 (MCP requires PKCE with S256)"
                    .into(),
            ));
        }
        let http = self.http()?;
        let loopback = callback::Loopback::bind().await?;
        let client = match flow::configured_client(&self.settings, &found.server)? {
            Some(c) => c,
            None => match &found.server.registration_endpoint {
                Some(ep) => {
                    flow::register(http, &found.server, ep, &loopback.redirect_uri, "authorization_code").await?
                }
                None => {
                    return Err(AuthError::Failed(
                        "the authorization server offers no dynamic client registration: register bramble there \
                         (redirect URI http://127.0.0.1/callback, any port) and set `client_id` (and \
                         `client_secret_env`)"
                            .into(),
                    ))
                }
            },
        };
        let pkce = flow::Pkce::new()?;
        let state = flow::random(24)?;
        let url = flow::authorization_url(
            &found.server,
            &flow::AuthorizeRequest {
                client_id: &client.client_id,
                redirect_uri: &loopback.redirect_uri,
                challenge: &pkce.challenge,
                state: &state,
                scope,
                resource: &found.resource,
            },
        );
        let code = tokio::time::timeout(LOGIN_WAIT, async {
            let wait = loopback.wait(&state);
            let visit = agent.visit(&url);
            tokio::pin!(wait, visit);
            tokio::select! {
                code = &mut wait => code,
                pasted = &mut visit => match pasted {
                    Some(text) => callback::pasted(&text, &state),
                    None => wait.await,
                },
            }
        })
        .await
        .map_err(|_| {
            AuthError::Failed(format!("the login was not finished within {} minutes", LOGIN_WAIT.as_secs() / 60))
        })??;
        let params = [
            ("grant_type", "authorization_code"),
            ("code", code.as_str()),
            ("redirect_uri", loopback.redirect_uri.as_str()),
            ("code_verifier", pkce.verifier.as_str()),
            ("resource", found.resource.as_str()),
        ];
        let tokens = flow::token(http, &found.server.token_endpoint, &client, &params).await?;
        Ok(record(tokens, found, client, "authorization_code", scope))
    }

    /// A new access token without a person: the refresh token, or the machine grant again.
    async fn renew(&self, slot: &mut Slot) -> Result<(), AuthError> {
        let Some(rec) = slot.record.clone() else { return Err(AuthError::Failed("no grant".into())) };
        let endpoint = discover::require_secure(&rec.token_endpoint, "token_endpoint")?;
        let mut client = rec.client.clone();
        if let Some(var) = &self.settings.client_secret_env {
            client.client_secret = crate::config::secret_from_env(var).map(|s| s.expose().to_string());
        }
        if let Some(var) = &self.settings.client_key_env {
            client.key_pem = crate::config::secret_from_env(var).map(|s| s.expose().to_string());
        }
        let mut params = vec![("resource", rec.resource.as_str())];
        match (&rec.refresh_token, rec.grant_type.as_str()) {
            (Some(rt), _) => params.extend([("grant_type", "refresh_token"), ("refresh_token", rt.as_str())]),
            (None, "client_credentials") => {
                params.push(("grant_type", "client_credentials"));
                params.extend(rec.scope.as_deref().map(|s| ("scope", s)));
            }
            (None, _) => return Err(AuthError::Failed("the token expired and there is no refresh token".into())),
        }
        match flow::token(self.http()?, &endpoint, &client, &params).await {
            Ok(t) => {
                let mut next = rec.clone();
                next.access_token = t.access_token;
                next.refresh_token = t.refresh_token.or(rec.refresh_token.clone());
                next.expires_at = t.expires_in.map(|s| store::now() + s);
                next.scope = t.scope.or(rec.scope.clone());
                next.needs_login = None;
                self.save(slot, next);
                Ok(())
            }
            Err(e @ AuthError::Refused(_)) if rec.grant_type == "authorization_code" => {
                let mut dead = rec.clone();
                dead.needs_login = Some(format!("the refresh was refused: {e}"));
                self.save(slot, dead);
                Err(AuthError::NeedsLogin { server: self.name.clone(), why: format!("the refresh was refused: {e}") })
            }
            Err(e) => Err(e),
        }
    }

    /// `bramble mcp login`: ask the server (an unauthenticated `initialize`)
    /// what it wants, then get and keep a grant. Needs a [`UserAgent`] for the code flow.
    pub async fn login(&self) -> Result<Record, AuthError> {
        let http = self.http()?;
        let probe = http
            .post(self.url.clone())
            .header(reqwest::header::ACCEPT, "application/json, text/event-stream")
            .json(&serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": super::rpc::initialize_params()}))
            .send()
            .await
            .map_err(|e| AuthError::unreachable("the MCP server", &self.url, &e))?;
        let status = probe.status();
        let challenge = discover::challenge(probe.headers());
        drop(probe);
        if status != StatusCode::UNAUTHORIZED
            && discover::protected_resource(http, &self.url, challenge.as_ref()).await?.is_none()
        {
            return Err(AuthError::Failed(format!(
                "the server answered HTTP {status} without asking for authorization and publishes no protected \
                 resource metadata: there is nothing to log in to"
            )));
        }
        let mut slot = self.grant.lock().await;
        self.authorize(&mut slot, challenge.as_ref(), None).await?;
        slot.record.clone().ok_or_else(|| AuthError::Failed("no grant".into()))
    }
}

fn header(rec: &Record) -> Option<HeaderValue> {
    if rec.access_token.is_empty() || rec.needs_login.is_some() {
        return None;
    }
    let mut v = HeaderValue::from_str(&format!("Bearer {}", rec.access_token)).ok()?;
    v.set_sensitive(true);
    Some(v)
}

fn record(tokens: flow::Tokens, found: &Found, client: ClientInfo, grant: &str, scope: Option<&str>) -> Record {
    Record {
        access_token: tokens.access_token,
        refresh_token: tokens.refresh_token,
        expires_at: tokens.expires_in.map(|s| store::now() + s),
        scope: tokens.scope.or(scope.map(str::to_string)),
        token_endpoint: found.server.token_endpoint.to_string(),
        resource: found.resource.clone(),
        client,
        grant_type: grant.to_string(),
        needs_login: None,
    }
}

/// Whether a server of `headers`/`headers_env` is authorized by its own
/// `Authorization` header (then OAuth stays out of the way).
pub fn has_own_authorization<'a>(mut names: impl Iterator<Item = &'a String>) -> bool {
    names.any(|n| n.trim().eq_ignore_ascii_case("authorization"))
}

/// One line on a server's grant, for `mcp list` and `doctor`: `(ok, text)`.
pub fn describe(file: &std::path::Path, settings: &OAuthSettings) -> (bool, String) {
    match store::load(file) {
        Err(e) => (false, e.to_string()),
        Ok(None) if settings.grant_type == GrantType::ClientCredentials => {
            (true, "client credentials (a token is fetched when the server asks)".into())
        }
        Ok(None) => (true, "no OAuth grant (none needed until the server asks)".into()),
        Ok(Some(r)) => match &r.needs_login {
            Some(why) => (false, format!("needs login: {why}")),
            None => {
                let expiry = match r.expires_at {
                    Some(at) if at <= store::now() && r.refresh_token.is_none() => "expired".to_string(),
                    Some(at) if at <= store::now() => "expired, refreshable".to_string(),
                    Some(at) => format!(
                        "expires in {}m{}",
                        (at - store::now()) / 60,
                        if r.refresh_token.is_some() { ", refreshable" } else { "" }
                    ),
                    None => "no expiry given".to_string(),
                };
                let scope = r.scope.as_deref().map(|s| format!(", scope \"{s}\"")).unwrap_or_default();
                (true, format!("authorized ({}{scope}; {expiry})", r.grant_type))
            }
        },
    }
}
