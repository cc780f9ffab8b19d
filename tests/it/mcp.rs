//! The MCP client against real MCP servers: the official Python SDK's
//! (`tests/fixtures/mcp/server.py`, `mcp` pinned in `requirements.txt`) over
//! streamable HTTP, HTTP+SSE and stdio — the stdio one started by bramble
//! through the exec sandbox. The SDK is installed once into a venv under the
//! test target directory (locked, so parallel test binaries do not race).
//! Without `python3 -m venv` or PyPI these tests FAIL with the reason; they
//! never pass without a server.
//!
//! Two behaviours no correct SDK server shows — invalid JSON, a session the
//! server forgets, tool names with path characters — are tested against a
//! small raw fake written here ([`raw_fake`]), and only those.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bramble::config::Config;
use bramble::provider::ToolCall;
use bramble::tools::mcp::McpHub;
use bramble::tools::{ToolContext, ToolOutcome, ToolRegistry};
use serde_json::{json, Value};

use crate::support::fake_llm::{Dialect, FakeLlm, Reply};
use crate::support::http::{refused_url, Request, Response, TestServer};
use crate::support::setup::{real_sandbox, TestHome};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp/server.py")
}

/// The venv's python, and the directories the sandbox must show it (a python
/// installed under a home directory — pyenv — is hidden by the jail otherwise).
struct Python {
    bin: PathBuf,
    expose: Vec<PathBuf>,
}

fn python() -> &'static Python {
    static PY: OnceLock<Python> = OnceLock::new();
    PY.get_or_init(|| {
        let requirements = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp/requirements.txt");
        let bin = crate::support::python::venv("mcp", &requirements);
        let venv = bin.parent().and_then(Path::parent).expect("the venv").to_path_buf();
        let out = std::process::Command::new(&bin)
            .args(["-c", "import sys; print(sys.base_prefix)"])
            .output()
            .expect("run the venv's python");
        let prefix = std::fs::canonicalize(String::from_utf8_lossy(&out.stdout).trim()).expect("base prefix");
        let home = std::env::var_os("HOME").map(PathBuf::from).and_then(|h| std::fs::canonicalize(h).ok());
        // The jail hides the home directory and gives commands a /tmp of their own.
        let tmp = std::fs::canonicalize(std::env::temp_dir()).ok();
        let hidden = |p: &Path| {
            home.as_ref().is_some_and(|h| p.starts_with(h)) || tmp.as_ref().is_some_and(|t| p.starts_with(t))
        };
        let venv = std::fs::canonicalize(&venv).expect("venv");
        let expose = [prefix, venv].into_iter().filter(|p| hidden(p)).collect();
        Python { bin, expose }
    })
}

/// A fixture server on 127.0.0.1 (`streamable-http` or `sse`), killed when dropped.
struct PyServer {
    _child: tokio::process::Child,
    port: u16,
}

impl PyServer {
    async fn start(transport: &str) -> PyServer {
        PyServer::start_with(transport, &[]).await
    }

    async fn start_with(transport: &str, more: &[&str]) -> PyServer {
        let py = python();
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let child = tokio::process::Command::new(&py.bin)
            .arg(fixture())
            .args(["--transport", transport, "--port", &port.to_string()])
            .args(more)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start the fixture server");
        let up =
            crate::support::daemon::wait_until(30, || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()).await;
        assert!(up, "the fixture MCP server ({transport}) did not listen on {port} within 30 s");
        PyServer { _child: child, port }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

/// A config's `[[mcp.server]]` tables (plus `[exec]`), parsed as the daemon would.
fn config(toml: &str) -> Config {
    Config::parse(toml, Path::new("/test/config.toml")).unwrap_or_else(|e| panic!("{e}\n{toml}"))
}

/// The `[exec]` section a stdio server needs here.
fn exec_section() -> String {
    let expose: Vec<String> = python().expose.iter().map(|p| format!("{:?}", p.display().to_string())).collect();
    format!("[exec]\nexpose = [{}]\n", expose.join(", "))
}

fn stdio_server(name: &str, extra: &str) -> String {
    stdio_server_args(name, &[], extra)
}

/// A stdio server with more arguments for the fixture.
fn stdio_server_args(name: &str, more: &[&str], extra: &str) -> String {
    let mut args = vec![fixture().display().to_string(), "--transport".into(), "stdio".into()];
    args.extend(more.iter().map(|a| a.to_string()));
    let args: Vec<String> = args.iter().map(|a| format!("{a:?}")).collect();
    format!(
        "[[mcp.server]]\nname = \"{name}\"\ncommand = {:?}\nargs = [{}]\n{extra}\n",
        python().bin.display().to_string(),
        args.join(", ")
    )
}

/// A registry holding only the configured servers' tools, as the agent's would.
pub(crate) struct Setup {
    pub(crate) registry: ToolRegistry,
    hub: Arc<McpHub>,
    _ws: tempfile::TempDir,
}

pub(crate) async fn setup(toml: &str) -> Setup {
    real_sandbox();
    bramble::install_crypto();
    let c = config(toml);
    let ws = tempfile::tempdir().expect("workspace");
    let hub = McpHub::new(&c.mcp, &c.exec, ws.path(), Arc::new(bramble::sandbox::Sandbox::new()))
        .expect("servers configured");
    let mut registry = ToolRegistry::new(16_000);
    registry.register_source(hub.clone());
    registry.prepare().await;
    Setup { registry, hub, _ws: ws }
}

impl Setup {
    pub(crate) async fn call(&self, name: &str, args: Value) -> ToolOutcome {
        self.call_from("cli", name, args).await
    }

    async fn call_from(&self, channel: &str, name: &str, args: Value) -> ToolOutcome {
        let ctx = ToolContext::detached("t").from_chat(channel, "c");
        self.registry.execute(&ToolCall::new("c1", name, args.to_string()), &ctx).await
    }

    fn spec(&self, name: &str) -> Option<bramble::provider::ToolSpec> {
        self.registry.specs().into_iter().find(|s| s.name == name)
    }

    pub(crate) fn status(&self) -> String {
        self.hub.status().join("\n")
    }
}

pub(crate) fn ok(out: &ToolOutcome) -> &str {
    assert!(!out.is_error, "{}", out.text);
    &out.text
}

pub(crate) fn err(out: &ToolOutcome) -> &str {
    assert!(out.is_error, "expected an error: {}", out.text);
    &out.text
}

/// What every transport must do with the SDK's server.
async fn the_basics(s: &Setup, transport: &str) {
    let names = s.registry.names();
    for t in ["py__add", "py__echo", "py__big", "py__crash", "py__sleep", "py__fail", "py__image", "py__files_read_v2"]
    {
        assert!(names.iter().any(|n| n == t), "{t} missing from {names:?}");
    }
    assert!(s.status().contains("py: connected"), "{}", s.status());
    assert!(s.status().contains(transport), "{}", s.status());
    assert!(s.status().contains("bramble-test"), "server info: {}", s.status());
    assert_eq!(ok(&s.call("py__add", json!({"a": 2, "b": 3})).await), "5");
    assert_eq!(ok(&s.call("py__echo", json!({"text": "grüße\nzwei"})).await), "grüße\nzwei");
    let failed = s.call("py__fail", json!({"why": "nope"})).await;
    assert!(err(&failed).starts_with("Error: `fail` of MCP server \"py\" failed:"), "{}", failed.text);
    let image = s.call("py__image", json!({})).await;
    assert!(ok(&image).starts_with("[image: image/png, "), "{}", image.text);
    // The server checks arguments: its complaint reaches the model.
    let bad = s.call("py__add", json!({"a": "two"})).await;
    assert!(err(&bad).contains("MCP server \"py\""), "{}", bad.text);
    // The cleaned schema: no $ref/$defs, no `format: uri`, an object at the top.
    let spec = s.spec("py__files_read_v2").expect("the renamed tool");
    let schema = spec.parameters.to_string();
    assert!(!schema.contains("$ref") && !schema.contains("$defs") && !schema.contains("\"uri\""), "{schema}");
    assert_eq!(spec.parameters["type"], "object");
    assert_eq!(spec.parameters["properties"]["target"]["properties"]["url"]["type"], "string");
    let read = s.call("py__files_read_v2", json!({"target": {"url": "https://example.com/x"}})).await;
    assert_eq!(ok(&read), "read https://example.com/x depth 1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamable_http_against_the_python_sdk() {
    let server = PyServer::start("streamable-http").await;
    let s =
        setup(&format!("[[mcp.server]]\nname = \"py\"\nurl = \"{}\"\ntimeout = \"20s\"\n", server.url("/mcp"))).await;
    the_basics(&s, "streamable HTTP").await;
    // 10 MB in one answer: refused at 4 MiB, unread, and the server stays usable.
    let big = s.call("py__big", json!({})).await;
    assert!(err(&big).contains("larger than 4 MiB, so it was not read"), "{}", big.text);
    assert_eq!(ok(&s.call("py__add", json!({"a": 1, "b": 1})).await), "2");
}

/// What a server sends on its own: a changed tool list is listed again, and
/// requests an unattended board cannot serve (elicitation, roots) are refused
/// at once — the tool gets the error and answers, nothing waits for the timeout.
async fn what_the_server_sends_on_its_own(s: &Setup) {
    assert!(!s.registry.names().iter().any(|n| n == "py__grown"));
    assert_eq!(ok(&s.call("py__grow", json!({})).await), "grew");
    let listed = crate::support::daemon::wait_until(20, || s.registry.names().iter().any(|n| n == "py__grown")).await;
    assert!(listed, "the changed tool list was not listed again: {:?}", s.registry.names());
    assert_eq!(ok(&s.call("py__grown", json!({})).await), "grown");
    for tool in ["py__ask", "py__ask_here"] {
        let out = s.call(tool, json!({})).await;
        assert!(ok(&out).starts_with("refused: ") && out.text.contains("elicitation"), "{tool}: {}", out.text);
    }
    let out = s.call("py__roots", json!({})).await;
    assert!(ok(&out).starts_with("refused: ") && out.text.contains("roots"), "{}", out.text);
}

/// Over streamable HTTP, the server's own GET stream carries them (the
/// timeout is a minute: a refusal that did not arrive would fail the call).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamable_http_server_stream_against_the_python_sdk() {
    let server = PyServer::start("streamable-http").await;
    let s =
        setup(&format!("[[mcp.server]]\nname = \"py\"\nurl = \"{}\"\ntimeout = \"60s\"\n", server.url("/mcp"))).await;
    what_the_server_sends_on_its_own(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_server_requests_and_changed_tools() {
    let s = setup(&format!("{}{}", exec_section(), stdio_server("py", "timeout = \"60s\""))).await;
    what_the_server_sends_on_its_own(&s).await;
}

/// A 2025-11-25 server that ends a long call's event stream after its priming
/// event (the SDK's `close_sse_stream`, with an event store and retry 300 ms):
/// the answer is taken from the resumed stream (GET with Last-Event-ID).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumable_answer_against_the_python_sdk() {
    let server = PyServer::start_with("streamable-http", &["--resumable"]).await;
    let s =
        setup(&format!("[[mcp.server]]\nname = \"py\"\nurl = \"{}\"\ntimeout = \"60s\"\n", server.url("/mcp"))).await;
    assert_eq!(ok(&s.call("py__poll", json!({"seconds": 1})).await), "polled 1.0");
    assert_eq!(ok(&s.call("py__poll", json!({"seconds": 0})).await), "polled 0.0");
    assert_eq!(ok(&s.call("py__add", json!({"a": 1, "b": 2})).await), "3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_sse_fallback_against_the_python_sdk() {
    let server = PyServer::start("sse").await;
    // `transport` is auto: the POST to /sse is refused (405), the GET stream is used.
    let s =
        setup(&format!("[[mcp.server]]\nname = \"py\"\nurl = \"{}\"\ntimeout = \"20s\"\n", server.url("/sse"))).await;
    the_basics(&s, "HTTP+SSE").await;
    let slow = {
        let toml = format!("[[mcp.server]]\nname = \"py\"\nurl = \"{}\"\ntimeout = \"2s\"\n", server.url("/sse"));
        setup(&toml).await
    };
    let out = slow.call("py__sleep", json!({"seconds": 30})).await;
    assert!(err(&out).contains("no answer within 2s (the request was cancelled)"), "{}", out.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_server_in_the_sandbox_crashes_restarts_and_times_out() {
    let s = setup(&format!("{}{}", exec_section(), stdio_server("py", "timeout = \"20s\""))).await;
    the_basics(&s, "stdio").await;
    // It runs in the sandbox: where the kernel offers the jail, the user's home is hidden from it.
    let probe = bramble::sandbox::Sandbox::new().probe();
    assert!(probe.helper.is_ok(), "the sandbox helper runs the server: {:?}", probe.helper);
    let home = std::env::var_os("HOME").map(PathBuf::from).expect("HOME");
    let secret = tempfile::Builder::new().prefix(".bramble-mcp-test").tempdir_in(&home).expect("a dir in HOME");
    let path = secret.path().display().to_string();
    assert!(Path::new(&path).exists());
    let seen = ok(&s.call("py__exists", json!({"path": path})).await).to_string();
    if probe.jail_available() {
        assert_eq!(seen, "false", "the stdio server sees the home directory: it is not in the jail");
    } else {
        eprintln!("no namespace jail on this kernel ({:?}): the hidden-home check is skipped", probe.namespaces);
    }
    assert_eq!(ok(&s.call("py__exists", json!({"path": "/etc/hostname"})).await), "true");

    let first = ok(&s.call("py__pid", json!({})).await).to_string();
    // The process exits in the middle of the call: a clear error at once, not a timeout.
    let started = std::time::Instant::now();
    let crash = s.call("py__crash", json!({})).await;
    assert!(err(&crash).contains("the server process exited (exit status 3)"), "{}", crash.text);
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    // The next call gets a new process.
    let second = ok(&s.call("py__pid", json!({})).await).to_string();
    assert_ne!(first, second, "the server was restarted");
    assert_eq!(ok(&s.call("py__add", json!({"a": 20, "b": 22})).await), "42");

    // 10 MB on one line: refused while it streams past, the process is still the same.
    let big = s.call("py__big", json!({})).await;
    assert!(err(&big).contains("larger than 4 MiB"), "{}", big.text);
    assert_eq!(ok(&s.call("py__pid", json!({})).await), second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_never_answers_times_out_and_the_server_goes_on() {
    // A server already running (a stdio one's start counts against the 2 s, and a loaded machine takes longer).
    let server = PyServer::start("streamable-http").await;
    let s =
        setup(&format!("[[mcp.server]]\nname = \"py\"\nurl = \"{}\"\ntimeout = \"2s\"\n", server.url("/mcp"))).await;
    let out = s.call("py__sleep", json!({"seconds": 30})).await;
    assert_eq!(err(&out), "Error: MCP server \"py\", tool `sleep`: no answer within 2s (the request was cancelled)");
    assert_eq!(ok(&s.call("py__echo", json!({"text": "still here"})).await), "still here");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_children_stop_with_bramble() {
    // An argument only this test's server has (the stdio transport ignores the port).
    let s = setup(&format!("{}{}", exec_section(), stdio_server_args("py", &["--port", STOP_MARKER], ""))).await;
    ok(&s.call("py__pid", json!({})).await);
    let script = fixture().display().to_string();
    assert!(stdio_fixture_running(&script), "the server runs");
    // The registry (holding the hub) goes: the server is stopped, its group killed.
    drop(s);
    let gone = crate::support::daemon::wait_until(10, || !stdio_fixture_running(&script)).await;
    assert!(gone, "the stdio server outlived its hub");
}

/// The `--port` of the stdio server of `stdio_children_stop_with_bramble`, to find it in /proc.
const STOP_MARKER: &str = "47119";

/// Whether a live process runs the fixture `script` over stdio.
/// Other tests run it too: only those started with this test's marker count.
fn stdio_fixture_running(script: &str) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else { return false };
    dir.flatten().any(|e| {
        if !e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())) {
            return false;
        }
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let zombie = stat.rsplit_once(')').is_some_and(|(_, r)| r.trim_start().starts_with('Z'));
        !zombie && cmdline.contains(script) && cmdline.contains(STOP_MARKER)
    })
}

// ------------------------------------------------------------------ a raw fake

/// What the raw fake does.
#[derive(Clone, Copy, PartialEq)]
enum Fake {
    /// Answers `tools/call` with bytes that are not JSON.
    InvalidJson,
    /// Forgets the session after `initialize`: the first later request gets 404.
    ForgetsSession,
}

/// A streamable HTTP server of a few lines (JSON answers), for behaviours no
/// SDK server shows. Tools: `echo`, `../../etc/passwd`, a 70-character name.
async fn raw_fake(mode: Fake) -> (TestServer, Arc<Mutex<Vec<Request>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let sessions = Arc::new(Mutex::new(0u32));
    let server = TestServer::start(move |req: Request| {
        log.lock().unwrap().push(req.clone());
        let Some(msg) = req.json() else { return Response::new(400) };
        let id = msg.get("id").cloned();
        let method = msg["method"].as_str().unwrap_or("").to_string();
        let mut sessions = sessions.lock().unwrap();
        if method == "initialize" {
            *sessions += 1;
            let result = json!({"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "raw", "version": "0"}});
            return Response::json(200, &json!({"jsonrpc": "2.0", "id": id, "result": result}))
                .header("Mcp-Session-Id", format!("s{}", *sessions));
        }
        if id.is_none() {
            return Response::new(202);
        }
        let session = req.header("mcp-session-id").unwrap_or("").to_string();
        if mode == Fake::ForgetsSession && session == "s1" && method == "tools/call" {
            return Response::text(404, "session not found");
        }
        match method.as_str() {
            "tools/list" => {
                let schema = json!({"type": "object", "properties": {"text": {"type": "string"}}});
                let tools = json!([
                    {"name": "echo", "description": "echo", "inputSchema": schema},
                    {"name": "../../etc/passwd", "inputSchema": {"type": "object"}},
                    {"name": "x".repeat(70), "inputSchema": {"type": "object"}},
                ]);
                Response::json(200, &json!({"jsonrpc": "2.0", "id": id, "result": {"tools": tools}}))
            }
            "tools/call" if mode == Fake::InvalidJson => {
                Response::new(200).header("Content-Type", "application/json").body("{\"jsonrpc\": \"2.0\", \"id\": ")
            }
            "tools/call" => {
                let text = format!("{} (session {session})", msg["params"]["arguments"]["text"].as_str().unwrap_or(""));
                let result = json!({"content": [{"type": "text", "text": text}]});
                Response::json(200, &json!({"jsonrpc": "2.0", "id": id, "result": result}))
            }
            _ => Response::json(200, &json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "no"}})),
        }
    })
    .await;
    (server, seen)
}

fn http_server(name: &str, url: &str, extra: &str) -> String {
    format!("[[mcp.server]]\nname = \"{name}\"\nurl = \"{url}/mcp\"\ntransport = \"streamable-http\"\ntimeout = \"5s\"\n{extra}\n")
}

#[tokio::test]
async fn invalid_json_and_odd_names_from_a_raw_server() {
    let (fake, _) = raw_fake(Fake::InvalidJson).await;
    let s = setup(&http_server("raw", &fake.url(), "")).await;
    let out = s.call("raw__echo", json!({"text": "hi"})).await;
    assert!(err(&out).contains("the server sent something that is not JSON"), "{}", out.text);
    // Path characters are replaced; a name over 64 characters is left out, and said so.
    let names = s.registry.names();
    assert!(names.iter().any(|n| n == "raw________etc_passwd"), "{names:?}");
    assert!(!names.iter().any(|n| n.contains("xxxxxxxx")), "{names:?}");
    assert!(s.status().contains("would be 75 characters; providers accept at most 64"), "{}", s.status());
    assert!(names
        .iter()
        .all(|n| n.len() <= 64 && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')));
}

#[tokio::test]
async fn a_forgotten_session_is_initialized_again() {
    let (fake, seen) = raw_fake(Fake::ForgetsSession).await;
    // A secret from the environment: HOME stands in for a token (tests set no variables).
    let extra = "headers = { X-Test = \"yes\" }\nheaders_env = { Authorization = \"Bearer HOME\" }";
    let s = setup(&http_server("raw", &fake.url(), extra)).await;
    let out = s.call("raw__echo", json!({"text": "hi"})).await;
    assert_eq!(ok(&out), "hi (session s2)");
    // The GETs of the server's own event stream (refused here with 400) are not JSON-RPC.
    let seen: Vec<Request> = seen.lock().unwrap().iter().filter(|r| r.method == "POST").cloned().collect();
    let methods: Vec<String> =
        seen.iter().filter_map(|r| r.json()).map(|m| m["method"].as_str().unwrap_or("").to_string()).collect();
    assert_eq!(
        methods,
        [
            "initialize",
            "notifications/initialized",
            "tools/list",
            "tools/call",
            "initialize",
            "notifications/initialized",
            "tools/call"
        ]
    );
    let after_init = &seen[2];
    assert_eq!(after_init.header("mcp-session-id"), Some("s1"));
    assert_eq!(after_init.header("mcp-protocol-version"), Some("2025-06-18"));
    assert_eq!(after_init.header("x-test"), Some("yes"));
    let home = std::env::var("HOME").expect("HOME");
    assert_eq!(after_init.header("authorization"), Some(format!("Bearer {home}").as_str()));
    assert!(seen[0].header("mcp-session-id").is_none());
    // We ask for the current revision; the server answered 2025-06-18, which is then spoken.
    assert_eq!(seen[0].json().unwrap()["params"]["protocolVersion"], "2025-11-25");
    assert!(after_init.header("accept").unwrap_or("").contains("text/event-stream"));
}

#[tokio::test]
async fn untrusted_origins_are_refused_unless_allowed() {
    let (fake, _) = raw_fake(Fake::ForgetsSession).await;
    let toml =
        format!("{}{}", http_server("a", &fake.url(), ""), http_server("b", &fake.url(), "allow_untrusted = true"));
    let s = setup(&toml).await;
    let out = s.call_from("mqtt", "a__echo", json!({"text": "x"})).await;
    assert!(err(&out).starts_with("Error: this turn came from MQTT (an untrusted origin)"), "{}", out.text);
    assert!(out.text.contains("allow_untrusted = true"), "{}", out.text);
    assert!(ok(&s.call_from("mqtt", "b__echo", json!({"text": "x"})).await).starts_with("x (session"));
    assert!(ok(&s.call_from("telegram", "a__echo", json!({"text": "y"})).await).starts_with("y (session"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_down_leaves_the_others_working() {
    let (fake, _) = raw_fake(Fake::ForgetsSession).await;
    let down = refused_url().await;
    let toml = format!(
        "{}{}{}{}",
        exec_section(),
        http_server("down", &down, ""),
        http_server("raw", &fake.url(), ""),
        stdio_server("py", ""),
    );
    let s = setup(&toml).await;
    // The down server is said to be down, in the tool list and when called.
    let placeholder = s.spec("down__unavailable").expect("a placeholder for the down server");
    assert!(
        placeholder.description.contains("MCP server \"down\" is configured but not reachable"),
        "{}",
        placeholder.description
    );
    let out = s.call("down__turn_on", json!({})).await;
    assert!(err(&out).starts_with("Error: MCP server \"down\" is not reachable: "), "{}", out.text);
    assert!(out.text.contains("onnect"), "the reason: {}", out.text);
    let out = s.call("down__unavailable", json!({})).await;
    assert!(err(&out).starts_with("Error: MCP server \"down\" is not reachable: "), "{}", out.text);
    assert!(s.status().contains("down: down ("), "{}", s.status());
    // The others work, before and after a crash of one of them.
    assert!(ok(&s.call("raw__echo", json!({"text": "a"})).await).starts_with("a (session"));
    assert_eq!(ok(&s.call("py__add", json!({"a": 1, "b": 2})).await), "3");
    err(&s.call("py__crash", json!({})).await);
    assert!(ok(&s.call("raw__echo", json!({"text": "b"})).await).starts_with("b (session"));
    // A tool the server does not have: named as such.
    let out = s.call("raw__nope", json!({})).await;
    assert!(err(&out).contains("MCP server \"raw\" has no tool `raw__nope`; its tools are: raw__echo"), "{}", out.text);
}

/// The agent loop end to end: the model calls `py__add` on the SDK's server and reads the result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_calls_an_mcp_tool_in_a_turn() {
    let server = PyServer::start("streamable-http").await;
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let extra = format!("[[mcp.server]]\nname = \"py\"\nurl = \"{}\"\n", server.url("/mcp"));
    let home = TestHome::new("openai", &fake.base_url(), "", "", &extra);
    fake.push(Reply::tool_call("py__add", r#"{"a": 19, "b": 23}"#));
    fake.push(Reply::Text("It is 42.".into()));
    let (agent, _out) = home.agent();
    let report = agent.turn(bramble::agent::TurnRequest::cli("s", "what is 19 + 23?")).await.expect("the turn");
    assert_eq!(report.text, "It is 42.");
    let first = &fake.requests()[0];
    let add = first["tools"]
        .as_array()
        .expect("tools offered")
        .iter()
        .find(|t| t["function"]["name"] == "py__add")
        .expect("py__add offered to the model");
    assert_eq!(add["function"]["description"], "Add two integers.");
    assert_eq!(add["function"]["parameters"]["required"], json!(["a", "b"]));
    let second = &fake.requests()[1];
    let result = second["messages"].as_array().unwrap().iter().find(|m| m["role"] == "tool").expect("the tool result");
    assert_eq!(result["content"], "42");
}

/// An image a tool returns is shown to a model that can see (a user message
/// after the results: tool messages cannot carry images), and only named to one that cannot.
#[tokio::test]
async fn a_tools_image_reaches_a_model_that_can_see() {
    let server = PyServer::start("streamable-http").await;
    for vision in [true, false] {
        let fake = FakeLlm::start(Dialect::OpenAi).await;
        let extra = format!("[[mcp.server]]\nname = \"py\"\nurl = \"{}\"\n", server.url("/mcp"));
        let home = TestHome::new("openai", &fake.base_url(), &format!("vision = {vision}\n"), "", &extra);
        fake.push(Reply::tool_call("py__image", "{}"));
        fake.push(Reply::Text("A tiny picture.".into()));
        let (agent, _out) = home.agent();
        let report = agent.turn(bramble::agent::TurnRequest::cli("s", "show me")).await.expect("the turn");
        assert_eq!(report.text, "A tiny picture.");
        let second = fake.requests()[1]["messages"].as_array().unwrap().clone();
        let tool = second.iter().find(|m| m["role"] == "tool").expect("the tool result");
        assert!(tool["content"].as_str().unwrap().starts_with("[image: image/png, "), "{tool}");
        let shown = second.last().unwrap();
        if vision {
            assert_eq!(shown["role"], "user");
            assert_eq!(shown["content"][0]["text"], "[The images returned by py__image follow.]");
            let url = shown["content"][1]["image_url"]["url"].as_str().unwrap();
            assert!(url.starts_with("data:image/png;base64,iVBORw0KGgo"), "{url}");
        } else {
            assert_eq!(shown["role"], "tool", "no image for a model that cannot see: {shown}");
        }
        // The session keeps no image data.
        let saved = std::fs::read_dir(home.state.join("sessions"))
            .unwrap()
            .flatten()
            .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
            .collect::<String>();
        assert!(!saved.contains("iVBORw0KGgo"), "{saved}");
    }
}

/// `bramble status` (the real binary) connects to the servers and says how they are.
#[tokio::test]
async fn status_lists_the_servers_and_their_state() {
    let (fake, _) = raw_fake(Fake::ForgetsSession).await;
    let down = refused_url().await;
    let llm = FakeLlm::start(Dialect::OpenAi).await;
    let extra = format!("{}{}", http_server("raw", &fake.url(), ""), http_server("off", &down, ""));
    let home = TestHome::new("openai", &llm.base_url(), "", "", &extra);
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_bramble"))
        .arg("--config")
        .arg(&home.config)
        .arg("status")
        .env("HOME", home.path())
        .env("BRAMBLE_TEST_SYSTEM_ROOT", "/nonexistent-bramble-test-root")
        .kill_on_drop(true)
        .output()
        .await
        .expect("bramble status");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let mcp: Vec<&str> = stdout.lines().skip_while(|l| !l.starts_with("mcp:")).take(2).collect();
    assert_eq!(mcp.len(), 2, "{stdout}");
    assert!(mcp[0].contains("raw: connected") && mcp[0].contains("streamable HTTP, raw 0), 2 tools"), "{}", mcp[0]);
    assert!(mcp[0].contains("left out: `xxxx"), "{}", mcp[0]);
    assert!(mcp[1].trim_start().starts_with("off: down ("), "{}", mcp[1]);
    let tools = stdout.lines().find(|l| l.starts_with("tools:")).expect("tools line");
    assert!(tools.contains("raw__echo") && tools.contains("off__unavailable"), "{tools}");
}
