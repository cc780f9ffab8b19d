//! OAuth 2.1 for remote MCP servers: `bramble mcp login | list | logout`
//! through the real binary, the daemon's hub using and refreshing the grant,
//! and what a hostile or broken server or authorization server gets.
//!
//! The happy paths are also checked against the official conformance suite's
//! servers (`mcp_conformance.rs`, 20 auth scenarios). The fake here exists
//! for what no correct server does — a refused refresh, metadata naming
//! another resource, no PKCE S256, an http authorization server, oversized
//! or malformed metadata, a token endpoint that never answers, a redirect to
//! another origin — and is written from the wire formats of MCP 2025-11-25
//! "Authorization", RFC 9728 (resource metadata), RFC 8414 (server
//! metadata), RFC 7591 (registration), RFC 6749 §4.1/§6 and RFC 7636 (S256).

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use base64::Engine as _;
use bramble::provider::ToolCall;
use bramble::tools::mcp::{AuthEnv, McpHub};
use bramble::tools::{ToolContext, ToolRegistry};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};

use crate::support::http::{Request, Response, TestServer};
use crate::support::setup::TestHome;

/// How the fake misbehaves.
#[derive(Default, Clone)]
struct Knobs {
    /// The `resource` its metadata names (default: its own `/mcp`).
    resource: Option<String>,
    /// `code_challenge_methods_supported` left out.
    no_s256: bool,
    /// Endpoints on a plain-http host that is not the loopback.
    http_endpoints: bool,
    /// The server metadata: 100 KiB of JSON, or not JSON.
    huge_metadata: bool,
    malformed_metadata: bool,
    /// Refresh tokens are refused (`invalid_grant`).
    refuse_refresh: bool,
    /// The token endpoint takes longer than anyone waits.
    slow_token: bool,
    /// The MCP endpoint answers 307 to this URL.
    redirect_to: Option<String>,
}

/// A fake MCP server that is its own authorization server, and what it saw.
struct World {
    server: TestServer,
    seen: Arc<Mutex<Vec<Request>>>,
    issued: Arc<Mutex<Vec<String>>>,
}

impl World {
    fn url(&self) -> String {
        format!("{}/mcp", self.server.url())
    }

    fn seen(&self, path: &str) -> Vec<Request> {
        self.seen.lock().unwrap().iter().filter(|r| r.path_only() == path).cloned().collect()
    }
}

fn s256(verifier: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, verifier.as_bytes());
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest.as_ref())
}

fn form(body: &str) -> Vec<(String, String)> {
    reqwest::Url::parse(&format!("http://x/?{body}")).unwrap().query_pairs().into_owned().collect()
}

fn field<'a>(pairs: &'a [(String, String)], k: &str) -> Option<&'a str> {
    pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
}

async fn world(knobs: Knobs) -> World {
    let base: Arc<OnceLock<String>> = Arc::new(OnceLock::new());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let issued = Arc::new(Mutex::new(Vec::<String>::new()));
    let challenge = Arc::new(Mutex::new(String::new()));
    let (b, log, tokens) = (base.clone(), seen.clone(), issued.clone());
    let server = TestServer::start_async(move |req: Request| {
        let (base, knobs, tokens, challenge) =
            (b.get().cloned().unwrap_or_default(), knobs.clone(), tokens.clone(), challenge.clone());
        log.lock().unwrap().push(req.clone());
        async move { serve(&base, &knobs, &tokens, &challenge, req).await }
    })
    .await;
    base.set(server.url()).unwrap();
    World { server, seen, issued }
}

async fn serve(
    base: &str,
    k: &Knobs,
    tokens: &Mutex<Vec<String>>,
    challenge: &Mutex<String>,
    req: Request,
) -> Response {
    let issue = |n: &str| {
        let mut t = tokens.lock().unwrap();
        let token = format!("{n}-{}", t.len());
        t.push(token.clone());
        token
    };
    match (req.method.as_str(), req.path_only()) {
        ("GET", "/.well-known/oauth-protected-resource/mcp") => Response::json(
            200,
            &json!({"resource": k.resource.clone().unwrap_or(format!("{base}/mcp")), "authorization_servers": [base], "scopes_supported": ["tools"]}),
        ),
        ("GET", "/.well-known/oauth-authorization-server") => {
            if k.huge_metadata {
                return Response::json(200, &json!({"issuer": base, "padding": "x".repeat(100 * 1024)}));
            }
            if k.malformed_metadata {
                return Response::text(200, "<html>this is not metadata</html>");
            }
            let at = if k.http_endpoints { "http://as.example.com".to_string() } else { base.to_string() };
            let mut meta = json!({
                "issuer": base, "authorization_endpoint": format!("{at}/authorize"), "token_endpoint": format!("{at}/token"),
                "registration_endpoint": format!("{at}/register"), "response_types_supported": ["code"],
                "token_endpoint_auth_methods_supported": ["none"], "code_challenge_methods_supported": ["S256"],
            });
            if k.no_s256 {
                meta.as_object_mut().unwrap().remove("code_challenge_methods_supported");
            }
            Response::json(200, &meta)
        }
        ("GET", "/authorize") => {
            let q = form(req.path.split_once('?').map_or("", |(_, q)| q));
            *challenge.lock().unwrap() = field(&q, "code_challenge").unwrap_or("").to_string();
            let mut to = reqwest::Url::parse(field(&q, "redirect_uri").unwrap_or("http://127.0.0.1:9/")).unwrap();
            to.query_pairs_mut().append_pair("code", "the-code").append_pair("state", field(&q, "state").unwrap_or(""));
            Response::new(302).header("location", to.to_string())
        }
        ("POST", "/register") => {
            Response::json(201, &json!({"client_id": "registered-client", "token_endpoint_auth_method": "none"}))
        }
        ("POST", "/token") => {
            let want = challenge.lock().unwrap().clone();
            token(k, &form(&req.text()), &want, issue).await
        }
        ("POST", "/mcp") => mcp(base, k, tokens, &req),
        _ => Response::new(404),
    }
}

async fn token(k: &Knobs, f: &[(String, String)], challenge: &str, issue: impl Fn(&str) -> String) -> Response {
    if k.slow_token {
        tokio::time::sleep(Duration::from_secs(120)).await;
    }
    let grant = field(f, "grant_type").unwrap_or("");
    let ok = match grant {
        "authorization_code" => {
            field(f, "code") == Some("the-code") && field(f, "code_verifier").map(s256).as_deref() == Some(challenge)
        }
        "refresh_token" => !k.refuse_refresh && field(f, "refresh_token").is_some_and(|t| t.starts_with("rt-")),
        _ => false,
    };
    if !ok {
        return Response::json(400, &json!({"error": "invalid_grant", "error_description": "no"}));
    }
    Response::json(
        200,
        &json!({"access_token": issue("at"), "refresh_token": issue("rt"), "token_type": "Bearer", "expires_in": 3600, "scope": "tools"}),
    )
}

fn mcp(base: &str, k: &Knobs, tokens: &Mutex<Vec<String>>, req: &Request) -> Response {
    let bearer = req.header("authorization").and_then(|v| v.strip_prefix("Bearer ")).unwrap_or("");
    let valid = bearer.starts_with("at-") && tokens.lock().unwrap().iter().any(|t| t == bearer);
    if !valid {
        let prm = format!("{base}/.well-known/oauth-protected-resource/mcp");
        return Response::json(401, &json!({"error": "invalid_token"}))
            .header("www-authenticate", format!("Bearer resource_metadata=\"{prm}\""));
    }
    if let Some(to) = &k.redirect_to {
        return Response::new(307).header("location", to.clone());
    }
    let msg = req.json().unwrap_or(Value::Null);
    let id = msg.get("id").cloned();
    let result = match msg["method"].as_str().unwrap_or("") {
        "initialize" => {
            json!({"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": {"name": "oauth-fake", "version": "1"}})
        }
        "tools/list" => json!({"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]}),
        "tools/call" => json!({"content": [{"type": "text", "text": "echoed"}]}),
        _ if id.is_none() => return Response::new(202),
        _ => json!({}),
    };
    Response::json(200, &json!({"jsonrpc": "2.0", "id": id, "result": result}))
}

fn home(url: &str, extra: &str) -> TestHome {
    TestHome::new(
        "openai",
        "http://127.0.0.1:9",
        "",
        "",
        &format!("[[mcp.server]]\nname = \"s\"\nurl = \"{url}\"\ntimeout = \"3s\"\n{extra}"),
    )
}

/// `bramble mcp login s` at a terminal: the URL it prints, and the running child.
struct Login {
    child: tokio::process::Child,
    url: reqwest::Url,
    out: String,
}

async fn start_login(home: &TestHome) -> Login {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_bramble"))
        .args(["--config", home.config.to_str().unwrap(), "mcp", "login", "s"])
        .env_clear()
        .env("HOME", home.path())
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("BRAMBLE_TEST_SYSTEM_ROOT", "/nonexistent-bramble-test-root")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn bramble");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut out = String::new();
    let url = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            out.push_str(&line);
            out.push('\n');
            if let Some(u) = line.trim().strip_prefix("http") {
                return reqwest::Url::parse(&format!("http{u}")).unwrap();
            }
        }
        panic!("bramble mcp login printed no URL:\n{out}");
    })
    .await
    .expect("the login URL in time");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Login { child, url, out }
}

/// The browser: the authorization URL's redirect (not followed).
async fn approve(url: &reqwest::Url) -> String {
    let resp = bramble::provider::http_client(Duration::from_secs(10)).unwrap().get(url.clone()).send().await.unwrap();
    assert_eq!(resp.status(), 302);
    resp.headers()["location"].to_str().unwrap().to_string()
}

async fn bramble(home: &TestHome, args: &[&str]) -> (bool, String) {
    let mut all = vec!["--config", home.config.to_str().unwrap()];
    all.extend(args);
    let out = crate::support::setup::bramble(home.path(), &all, None).await;
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

async fn registry(home: &TestHome) -> (ToolRegistry, Arc<McpHub>) {
    bramble::install_crypto();
    let loaded = home.loaded();
    let auth = AuthEnv { state_dir: Some(loaded.paths.state_dir.clone()), agent: None };
    let hub =
        McpHub::with_auth(&loaded.config.mcp, &loaded.config.exec, &home.workspace, Default::default(), auth).unwrap();
    let mut registry = ToolRegistry::new(16_000);
    registry.register_source(hub.clone());
    registry.prepare().await;
    (registry, hub)
}

async fn call_echo(registry: &ToolRegistry) -> (bool, String) {
    let ctx = ToolContext::detached("t").from_chat("cli", "t");
    let out = registry.execute(&ToolCall::new("c1", "s__echo", "{}"), &ctx).await;
    (!out.is_error, out.text)
}

fn token_file(home: &TestHome) -> std::path::PathBuf {
    home.state.join("mcp-oauth/s.json")
}

#[tokio::test]
async fn login_by_pasting_the_redirect_then_the_daemon_uses_the_grant() {
    crate::support::setup::real_sandbox();
    let w = world(Knobs::default()).await;
    let home = home(&w.url(), "");
    let (_, before) = bramble(&home, &["mcp", "list"]).await;
    assert!(before.contains("no OAuth grant"), "{before}");
    let mut login = start_login(&home).await;
    // The browser ran elsewhere: its final address is pasted.
    let location = approve(&login.url).await;
    let mut stdin = login.child.stdin.take().unwrap();
    stdin.write_all(format!("{location}\n").as_bytes()).await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(60), login.child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{}", login.out);
    // What the authorization request carried: PKCE S256, the resource, a state.
    let q = form(login.url.query().unwrap());
    assert_eq!(field(&q, "code_challenge_method"), Some("S256"));
    assert_eq!(field(&q, "resource"), Some(w.url().as_str()));
    assert_eq!(field(&q, "scope"), Some("tools"));
    assert!(field(&q, "state").is_some_and(|s| s.len() >= 20));
    let file = token_file(&home);
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    let (_, listed) = bramble(&home, &["mcp", "list"]).await;
    assert!(listed.contains("authorized (authorization_code, scope \"tools\""), "{listed}");
    let issued = w.issued.lock().unwrap().clone();
    assert!(
        issued.iter().all(|t| !listed.contains(t.as_str()) && !login.out.contains(t.as_str())),
        "a token was shown"
    );
    // The daemon's hub uses it; the token goes to the MCP server only.
    let (registry, _hub) = registry(&home).await;
    assert_eq!(call_echo(&registry).await, (true, "echoed".to_string()));
    let access = &issued[0];
    let to_mcp =
        w.seen("/mcp").iter().filter(|r| r.header("authorization") == Some(&format!("Bearer {access}"))).count();
    assert!(to_mcp >= 2, "initialize, tools/list, tools/call carry the token");
    for path in ["/token", "/register", "/authorize", "/.well-known/oauth-authorization-server"] {
        assert!(w.seen(path).iter().all(|r| r.header("authorization").is_none()), "{path} got an Authorization header");
    }
    // Logout forgets it.
    let (ok, out) = bramble(&home, &["mcp", "logout", "s"]).await;
    assert!(ok && out.contains("forgot the OAuth grant"), "{out}");
    assert!(!file.exists());
}

#[tokio::test]
async fn the_loopback_callback_refuses_a_wrong_state_and_takes_the_right_one() {
    let w = world(Knobs::default()).await;
    let home = home(&w.url(), "");
    let mut login = start_login(&home).await;
    drop(login.child.stdin.take()); // nobody pastes: the loopback alone
    let location = approve(&login.url).await;
    let client = bramble::provider::http_client(Duration::from_secs(10)).unwrap();
    let mut forged = reqwest::Url::parse(&location).unwrap();
    forged.query_pairs_mut().clear().append_pair("code", "the-code").append_pair("state", "forged");
    let refused = client.get(forged).send().await.unwrap();
    assert_eq!(refused.status(), 400);
    assert!(refused.text().await.unwrap().contains("state"));
    assert!(w.seen("/token").is_empty(), "a forged callback reached the token endpoint");
    let ok = client.get(&location).send().await.unwrap();
    assert_eq!(ok.status(), 200);
    let status = tokio::time::timeout(Duration::from_secs(60), login.child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{}", login.out);
    assert_eq!(w.seen("/token").len(), 1);
}

/// A grant on disk whose access token has expired.
fn expired_grant(home: &TestHome, w: &World) {
    let rec = json!({
        "access_token": "at-old", "refresh_token": "rt-old", "expires_at": 1, "token_endpoint": format!("{}/token", w.server.url()),
        "resource": w.url(), "client": {"client_id": "registered-client", "auth_method": "none"}, "grant_type": "authorization_code",
    });
    std::fs::create_dir_all(token_file(home).parent().unwrap()).unwrap();
    std::fs::write(token_file(home), rec.to_string()).unwrap();
}

#[tokio::test]
async fn an_expired_token_is_refreshed_before_use() {
    let w = world(Knobs::default()).await;
    let home = home(&w.url(), "");
    expired_grant(&home, &w);
    let (registry, _hub) = registry(&home).await;
    assert_eq!(call_echo(&registry).await, (true, "echoed".to_string()));
    let refresh = w.seen("/token");
    assert_eq!(refresh.len(), 1);
    assert_eq!(field(&form(&refresh[0].text()), "grant_type"), Some("refresh_token"));
    assert!(
        w.seen("/mcp").iter().all(|r| r.header("authorization") != Some("Bearer at-old")),
        "the expired token was sent"
    );
    let saved: Value = serde_json::from_slice(&std::fs::read(token_file(&home)).unwrap()).unwrap();
    assert!(saved["access_token"].as_str().unwrap().starts_with("at-") && saved["access_token"] != "at-old");
}

#[tokio::test]
async fn a_refused_refresh_asks_for_a_login_in_the_tools_list_and_doctor() {
    let w = world(Knobs { refuse_refresh: true, ..Knobs::default() }).await;
    let home = home(&w.url(), "");
    expired_grant(&home, &w);
    let (registry, _hub) = registry(&home).await;
    let (ok, text) = call_echo(&registry).await;
    assert!(!ok && text.contains("run `bramble mcp login s`"), "{text}");
    assert!(w.seen("/authorize").is_empty(), "the daemon never starts a login on its own");
    let (_, listed) = bramble(&home, &["mcp", "list"]).await;
    assert!(listed.contains("needs login: the refresh was refused"), "{listed}");
    let config = home.config.to_str().unwrap();
    let out = crate::support::setup::bramble(home.path(), &["--config", config, "doctor", "--json"], None).await;
    let doctor = String::from_utf8_lossy(&out.stdout);
    let json: Value = serde_json::from_str(&doctor).unwrap_or_else(|e| panic!("{e}: {doctor}"));
    let check = json["checks"].as_array().unwrap().iter().find(|c| c["name"] == "mcp").expect("an mcp check");
    assert_eq!(check["status"], "warn");
    assert_eq!(check["hint"], "run `bramble mcp login s`");
}

/// `bramble mcp login s` against a server that misbehaves: its error, and what the fake saw.
async fn failed_login(w: &World) -> String {
    let home = home(&w.url(), "");
    let (ok, out) = bramble(&home, &["mcp", "login", "s"]).await;
    assert!(!ok, "the login succeeded: {out}");
    assert!(!token_file(&home).exists());
    out
}

#[tokio::test]
async fn metadata_for_another_resource_is_refused_before_anything_is_sent() {
    let w = world(Knobs { resource: Some("https://evil.example.com/mcp".into()), ..Knobs::default() }).await;
    let out = failed_login(&w).await;
    assert!(out.contains("not for this server"), "{out}");
    assert!(w.seen("/register").is_empty() && w.seen("/authorize").is_empty() && w.seen("/token").is_empty());
}

#[tokio::test]
async fn an_authorization_server_without_pkce_s256_is_refused() {
    let w = world(Knobs { no_s256: true, ..Knobs::default() }).await;
    let out = failed_login(&w).await;
    assert!(out.contains("does not list PKCE S256"), "{out}");
    assert!(w.seen("/register").is_empty() && w.seen("/token").is_empty());
}

#[tokio::test]
async fn plain_http_endpoints_off_the_loopback_are_refused() {
    let w = world(Knobs { http_endpoints: true, ..Knobs::default() }).await;
    let out = failed_login(&w).await;
    assert!(out.contains("`http://as.example.com/") && out.contains("` is not https"), "{out}");
}

#[tokio::test]
async fn oversized_and_malformed_metadata_are_clear_errors() {
    let w = world(Knobs { huge_metadata: true, ..Knobs::default() }).await;
    let out = failed_login(&w).await;
    assert!(out.contains("is larger than 64 KiB"), "{out}");
    let w = world(Knobs { malformed_metadata: true, ..Knobs::default() }).await;
    let out = failed_login(&w).await;
    assert!(out.contains("the authorization server's metadata at") && out.contains("is not JSON"), "{out}");
}

#[tokio::test]
async fn a_token_endpoint_that_never_answers_times_out() {
    let w = world(Knobs { slow_token: true, ..Knobs::default() }).await;
    let home = home(&w.url(), "");
    let mut login = start_login(&home).await;
    drop(login.child.stdin.take());
    let location = approve(&login.url).await;
    let client = bramble::provider::http_client(Duration::from_secs(10)).unwrap();
    assert_eq!(client.get(&location).send().await.unwrap().status(), 200);
    let out = tokio::time::timeout(Duration::from_secs(60), login.child.wait_with_output()).await.unwrap().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("the token endpoint") && err.contains("did not answer in time"), "{err}");
}

#[tokio::test]
async fn a_redirect_to_another_origin_never_carries_the_token() {
    let elsewhere_seen = Arc::new(Mutex::new(Vec::<Request>::new()));
    let log = elsewhere_seen.clone();
    let elsewhere = TestServer::start(move |req| {
        log.lock().unwrap().push(req);
        Response::new(200)
    })
    .await;
    let w = world(Knobs { redirect_to: Some(format!("{}/steal", elsewhere.url())), ..Knobs::default() }).await;
    let home = home(&w.url(), "");
    // A valid grant on disk.
    let rec = json!({"access_token": "at-0", "token_endpoint": format!("{}/token", w.server.url()), "resource": w.url(),
        "client": {"client_id": "c", "auth_method": "none"}, "grant_type": "authorization_code"});
    w.issued.lock().unwrap().push("at-0".into());
    std::fs::create_dir_all(token_file(&home).parent().unwrap()).unwrap();
    std::fs::write(token_file(&home), rec.to_string()).unwrap();
    let (registry, hub) = registry(&home).await;
    let (ok, text) = call_echo(&registry).await;
    assert!(!ok, "{text}");
    assert!(hub.status().join(" ").contains("redirect"), "{:?}", hub.status());
    assert!(elsewhere_seen.lock().unwrap().is_empty(), "the other origin was contacted");
    assert!(Path::new(&token_file(&home)).exists());
}
