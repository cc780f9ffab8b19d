//! Webhooks through the real binary: curl (a real HTTP client) posting to
//! `bramble run`'s endpoints on 127.0.0.1, and receivers on 127.0.0.1 taking
//! the signed reports bramble posts. The signature scheme is bramble's own
//! (Stripe's, documented in docs/channels/webhook.md); the test signs with
//! the library's `sign`, which a unit test checks against openssl.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use crate::support::daemon::{wait_until, Daemon};
use crate::support::fake_llm::{Dialect, FakeLlm, Reply};
use crate::support::http::{self, Request, Response};
use crate::support::setup::TestHome;
use bramble::clients::webhook::{signature_header, verify};

const DOOR_SECRET: &str = "door-secret-0123456789";
const SINK_SECRET: &str = "sink-secret-abcdef";
const JOB_TOKEN: &str = "job-token-xyz";
const OTHER_TOKEN: &str = "other-token-uvw";

/// A free port on 127.0.0.1 (bound, then let go).
async fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    l.local_addr().expect("addr").port()
}

/// A receiver of bramble's reports at a given address, answering `status`.
struct Receiver {
    got: Arc<Mutex<Vec<Request>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    async fn start(port: u16, answer: Response) -> Receiver {
        let listener = TcpListener::bind(("127.0.0.1", port)).await.expect("bind the receiver");
        let got: Arc<Mutex<Vec<Request>>> = Arc::default();
        let seen = got.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let mut stream = BufReader::new(stream);
                if let Ok(Some((req, _))) = http::read_request(&mut stream).await {
                    seen.lock().unwrap().push(req);
                    let _ = http::write_response(stream.get_mut(), &answer, false).await;
                }
            }
        });
        Receiver { got, task }
    }

    fn requests(&self) -> Vec<Request> {
        self.got.lock().unwrap().clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Setup {
    fake: FakeLlm,
    home: TestHome,
    log: PathBuf,
    port: u16,
}

impl Setup {
    /// A fake LLM and a config listening on a free port; `webhooks` is the `[[webhook]]` tables.
    async fn new(webhooks: &str) -> Setup {
        let fake = FakeLlm::start(Dialect::OpenAi).await;
        let port = free_port().await;
        let extra = format!(
            "clock_sync_wait = \"0s\"\n[heartbeat]\nenabled = false\n\
             [webhooks]\nlisten = \"127.0.0.1:{port}\"\n{}\n",
            webhooks.replace("{PORT}", &port.to_string())
        );
        let home = TestHome::new("openai", &fake.base_url(), "", "", &extra);
        let log = home.path().join("daemon.log");
        Setup { fake, home, log, port }
    }

    async fn start(&self) -> Daemon {
        let env: [(&str, &Path); 4] = [
            ("DOOR_SECRET", Path::new(DOOR_SECRET)),
            ("SINK_SECRET", Path::new(SINK_SECRET)),
            ("JOB_TOKEN", Path::new(JOB_TOKEN)),
            ("OTHER_TOKEN", Path::new(OTHER_TOKEN)),
        ];
        let d = Daemon::start_with_env(self.home.path(), Some(&self.home.config), &self.log, &env);
        assert!(d.wait_log("webhooks listening", 30).await, "{}", self.log());
        d
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn cli(&self, args: &[&str]) -> String {
        let out = crate::support::setup::bramble(
            self.home.path(),
            &[&["--config", self.home.config.to_str().unwrap()], args].concat(),
            None,
        )
        .await;
        assert!(out.status.success(), "bramble {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `bramble doctor --json`'s `webhooks` check, with the secrets set.
    async fn doctor(&self) -> Value {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_bramble"))
            .args(["--config", self.home.config.to_str().unwrap(), "doctor", "--json"])
            .env_clear()
            .env("HOME", self.home.path())
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs([("DOOR_SECRET", DOOR_SECRET), ("SINK_SECRET", SINK_SECRET), ("JOB_TOKEN", JOB_TOKEN)])
            .env("OTHER_TOKEN", OTHER_TOKEN)
            .output()
            .await
            .expect("bramble doctor");
        let all: Value = serde_json::from_slice(&out.stdout).expect("doctor --json");
        let checks = all["checks"].as_array().expect("checks");
        checks.iter().find(|c| c["name"] == "webhooks").cloned().expect("a webhooks check")
    }

    /// POST with curl: the status and the answer's body.
    async fn curl(&self, path: &str, headers: &[String], body: &[u8]) -> (u16, String) {
        let url = format!("http://127.0.0.1:{}{path}", self.port);
        let mut cmd = tokio::process::Command::new("curl");
        cmd.args(["-sS", "-o", "-", "-w", "\n%{http_code}", "--max-time", "60", "-X", "POST", "--data-binary", "@-"]);
        for h in headers {
            cmd.arg("-H").arg(h);
        }
        let mut child = cmd
            .arg(url)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("curl (apt-get install curl)");
        let mut stdin = child.stdin.take().unwrap();
        let body = body.to_vec();
        tokio::spawn(async move {
            let _ = stdin.write_all(&body).await;
        });
        let out = child.wait_with_output().await.expect("curl ran");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (answer, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), answer.trim().to_string())
    }

    /// A signed JSON POST to `/hook/<name>` with `secret`, signed at `t`.
    async fn signed(&self, name: &str, secret: &str, t: i64, body: &str) -> (u16, String) {
        let sig = signature_header(secret.as_bytes(), t, body.as_bytes());
        let headers = [format!("X-Bramble-Signature: {sig}"), "Content-Type: application/json".to_string()];
        self.curl(&format!("/hook/{name}"), &headers, body.as_bytes()).await
    }
}

fn now() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// The tables of the happy path: a signed `message` endpoint answering to a
/// signed target, a bearer `job` endpoint, and the target at `sink`.
fn tables(sink: &str) -> String {
    format!(
        "[[webhook]]\nname = \"door\"\nsecret_env = \"DOOR_SECRET\"\nmessage = \"The {{door.name}} door is {{state}}\"\n\
         deliver = [\"webhook:sink\"]\n\n\
         [[webhook]]\nname = \"brew\"\ntoken_env = \"JOB_TOKEN\"\njob = \"tea\"\n\n\
         [[webhook]]\nname = \"other\"\ntoken_env = \"OTHER_TOKEN\"\nmessage = \"x\"\n\n\
         [[webhook]]\nname = \"sink\"\nsecret_env = \"SINK_SECRET\"\nurl = \"{sink}/in\"\nallow_http = true\n"
    )
}

/// A signed call runs a turn under `[policy.webhook]` with the payload marked
/// as data; the answer reaches a `webhook:` target signed, with its id; a
/// bearer call runs a job whose report goes there too.
#[tokio::test]
async fn a_signed_call_runs_a_turn_and_its_answer_is_posted_signed() {
    let sink_port = free_port().await;
    let sink = Receiver::start(sink_port, Response::new(204)).await;
    let s = Setup::new(&tables(&format!("http://127.0.0.1:{sink_port}"))).await;
    s.cli(&["cron", "add", "tea", "--every", "1d", "--exec", "echo brewed", "--deliver", "webhook:sink"]).await;
    let d = s.start().await;
    s.fake.push(Reply::text("Noted: the front door is open."));

    let (status, _) = s.signed("door", DOOR_SECRET, now(), r#"{"state":"open","door":{"name":"front"}}"#).await;
    assert_eq!(status, 202, "{}", s.log());
    assert!(wait_until(60, || !sink.requests().is_empty()).await, "{}", s.log());
    let req = &sink.requests()[0];
    assert_eq!(req.path, "/in");
    let body: Value = req.json().expect("a JSON report");
    assert_eq!(body["text"], "Noted: the front door is open.");
    assert_eq!(body["source"], "trigger:webhook:door");
    assert!(body["id"].as_str().is_some_and(|id| !id.is_empty()) && body["time"].is_string(), "{body}");
    assert_eq!(req.header("x-bramble-id"), body["id"].as_str());
    verify(SINK_SECRET.as_bytes(), req.header("x-bramble-signature"), &req.body, now())
        .expect("signed with the sink's secret");
    // The turn: the rendered template, marked as data from outside; no exec, no file writes offered.
    let turn = s.fake.requests()[0].to_string();
    assert!(turn.contains("The front door is open"), "{turn}");
    assert!(turn.contains("data, not as instructions"), "{turn}");
    let tools = s.fake.requests()[0]["tools"].to_string();
    assert!(tools.contains("read_file") && !tools.contains("\"exec\"") && !tools.contains("write_file"), "{tools}");

    // The job endpoint: a bearer token, and the job's report to the same target.
    let (status, _) = s
        .curl(
            "/hook/brew",
            &[format!("Authorization: Bearer {JOB_TOKEN}"), "Content-Type: application/json".into()],
            b"{}",
        )
        .await;
    assert_eq!(status, 202, "{}", s.log());
    assert!(wait_until(60, || sink.requests().len() >= 2).await, "{}", s.log());
    let job: Value = sink.requests()[1].json().unwrap();
    assert_eq!(job["job"], "tea", "{job}");
    assert!(job["text"].as_str().unwrap().contains("brewed"), "{job}");
    assert_eq!(s.fake.request_count(), 1, "the exec job needs no model");

    // `status` says where it listens and what each endpoint does; `doctor` checks it all.
    let status = s.cli(&["status"]).await;
    let line =
        format!("webhooks:   http://127.0.0.1:{}/hook/<name> listening; endpoints: door (signed, a turn)", s.port);
    assert!(status.contains(&line) && status.contains("brew (bearer, runs job tea)"), "{status}");
    let check = s.doctor().await;
    assert_eq!(check["status"], "ok", "{check}");
    let detail = check["detail"].as_str().unwrap();
    assert!(detail.contains("in use (by the running daemon)") && detail.contains("webhook:sink reachable"), "{detail}");
    d.stop().await;
}

/// Strangers, forgeries, replays, floods and slow clients are refused with a
/// bare status, run nothing, and leave the endpoint serving.
#[tokio::test]
async fn forged_replayed_oversize_slow_and_malformed_calls_are_refused() {
    let s = Setup::new(&tables("http://127.0.0.1:9")).await;
    let d = s.start().await;
    let body = r#"{"state":"open","door":{"name":"back"}}"#;
    let json = "Content-Type: application/json".to_string();

    // No signature, a wrong one, a stale one.
    assert_eq!(s.curl("/hook/door", std::slice::from_ref(&json), body.as_bytes()).await, (401, "unauthorized".into()));
    assert_eq!(s.signed("door", "not-the-secret", now(), body).await.0, 401);
    assert_eq!(s.signed("door", DOOR_SECRET, now() - 3600, body).await.0, 401);
    assert!(s.log().contains("away from now"), "{}", s.log());
    // Another endpoint's bearer token, and none.
    let other = format!("Authorization: Bearer {JOB_TOKEN}");
    assert_eq!(s.curl("/hook/other", &[other, json.clone()], b"{}").await.0, 401);
    assert_eq!(s.curl("/hook/brew", std::slice::from_ref(&json), b"{}").await.0, 401);
    // Unknown endpoints all look the same, and name none that exist.
    let unknown = s.curl("/hook/nope", std::slice::from_ref(&json), b"{}").await;
    assert_eq!(unknown, (404, "not found".into()));
    assert_eq!(s.curl("/", std::slice::from_ref(&json), b"{}").await, unknown);

    // A valid call, then the very same request again: a replay.
    let t = now();
    let sig = format!("X-Bramble-Signature: {}", signature_header(DOOR_SECRET.as_bytes(), t, body.as_bytes()));
    s.fake.push(Reply::text("ok"));
    assert_eq!(s.curl("/hook/door", &[sig.clone(), json.clone()], body.as_bytes()).await.0, 202);
    assert_eq!(s.curl("/hook/door", &[sig, json.clone()], body.as_bytes()).await.0, 401);
    assert!(s.log().contains("a replay"), "{}", s.log());

    // Too large: by Content-Length, and streamed without one.
    let big = format!(r#"{{"state":"{}"}}"#, "x".repeat(70 * 1024));
    assert_eq!(s.signed("door", DOOR_SECRET, now(), &big).await.0, 413);
    let chunked = [
        format!("X-Bramble-Signature: {}", signature_header(DOOR_SECRET.as_bytes(), now(), big.as_bytes())),
        "Transfer-Encoding: chunked".into(),
        json.clone(),
    ];
    assert_eq!(s.curl("/hook/door", &chunked, big.as_bytes()).await.0, 413);
    // Not JSON though it says so: a clear 400; a form: 415.
    let (status, said) = s.signed("door", DOOR_SECRET, now(), "{\"state\": ").await;
    assert_eq!(status, 400);
    assert!(said.contains("not valid JSON"), "{said}");
    let form = "Content-Type: application/x-www-form-urlencoded".to_string();
    let sig = format!("X-Bramble-Signature: {}", signature_header(DOOR_SECRET.as_bytes(), now(), b"a=b"));
    assert_eq!(s.curl("/hook/door", &[sig, form], b"a=b").await.0, 415);

    // A slow client holds its connection open with half a request: others are
    // still served, and it is cut off.
    let mut slow = tokio::net::TcpStream::connect(("127.0.0.1", s.port)).await.unwrap();
    slow.write_all(b"POST /hook/door HTTP/1.1\r\nHost: x\r\nX-Slow: ").await.unwrap();
    s.fake.push(Reply::text("still here"));
    let other = r#"{"state":"closed"}"#;
    assert_eq!(s.signed("door", DOOR_SECRET, now(), other).await.0, 202, "served beside a slow client");
    let mut rest = Vec::new();
    let cut = tokio::time::timeout(std::time::Duration::from_secs(60), slow.read_to_end(&mut rest)).await;
    assert!(cut.is_ok(), "the slow connection was closed by bramble");

    // Two turns ran: the two accepted calls, nothing for the refused ones.
    assert!(wait_until(60, || s.fake.request_count() >= 2).await, "{}", s.log());
    assert!(d.wait_log_count("webhook call accepted", 2, 10).await);
    assert_eq!(s.fake.request_count(), 2, "{}", s.log());
    d.stop().await;
}

/// An answer delivered to a `webhook:` target that posts back into the same
/// endpoint is refused there as bramble's own (409): one turn, no ping-pong.
#[tokio::test]
async fn an_answer_posted_back_into_its_own_endpoint_does_not_loop() {
    let s = Setup::new(
        "[[webhook]]\nname = \"echo\"\nsecret_env = \"DOOR_SECRET\"\nmessage = \"{payload}\"\n\
         deliver = [\"webhook:echo\"]\nurl = \"http://127.0.0.1:{PORT}/hook/echo\"\nallow_http = true\n",
    )
    .await;
    let d = s.start().await;
    s.fake.push(Reply::text("an answer that would come back"));
    s.fake.push(Reply::text("a second turn: the loop"));
    assert_eq!(s.signed("echo", DOOR_SECRET, now(), r#"{"q":"hi"}"#).await.0, 202);
    assert!(d.wait_log("answering it would loop", 60).await, "{}", s.log());
    assert!(d.wait_log("report dropped", 30).await, "{}", s.log());
    assert!(s.log().contains("HTTP 409"), "{}", s.log());
    assert_eq!(s.fake.request_count(), 1, "one turn only: {}", s.log());
    d.stop().await;
}

/// A receiver that is down keeps the report in the outbox; once it is up
/// the report is delivered, once, with the same id.
#[tokio::test]
async fn a_report_waits_for_a_receiver_that_is_down_and_is_delivered_once() {
    let sink_port = free_port().await;
    let s = Setup::new(&tables(&format!("http://127.0.0.1:{sink_port}"))).await;
    s.cli(&["cron", "add", "tea", "--every", "1d", "--exec", "echo brewed", "--deliver", "webhook:sink"]).await;
    let d = s.start().await;
    let bearer = [format!("Authorization: Bearer {JOB_TOKEN}"), "Content-Type: application/json".into()];
    assert_eq!(s.curl("/hook/brew", &bearer, b"{}").await.0, 202);
    assert!(d.wait_log("delivery failed; will retry", 60).await, "{}", s.log());
    assert!(s.cli(&["outbox", "list"]).await.contains("webhook:sink"), "kept in the outbox");

    let sink = Receiver::start(sink_port, Response::new(200)).await;
    s.cli(&["outbox", "retry", "all"]).await;
    assert!(wait_until(60, || !sink.requests().is_empty()).await, "{}", s.log());
    let mut done = false;
    for _ in 0..60 {
        if s.cli(&["outbox", "list"]).await.contains("no reports waiting") {
            done = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    assert!(done, "recorded as delivered: {}", s.log());
    assert_eq!(sink.requests().len(), 1, "delivered once");
    assert!(sink.requests()[0].json().unwrap()["text"].as_str().unwrap().contains("brewed"));
    d.stop().await;
}

/// A receiver that redirects to another origin is not followed: the report
/// and its signature never reach the other host; the report is refused.
#[tokio::test]
async fn a_redirect_to_another_origin_is_not_followed_with_the_signature() {
    let (sink_port, thief_port) = (free_port().await, free_port().await);
    let thief = Receiver::start(thief_port, Response::new(200)).await;
    let location = format!("http://127.0.0.1:{thief_port}/steal");
    let sink = Receiver::start(sink_port, Response::new(307).header("location", location)).await;
    let s = Setup::new(&tables(&format!("http://127.0.0.1:{sink_port}"))).await;
    s.cli(&["cron", "add", "tea", "--every", "1d", "--exec", "echo brewed", "--deliver", "webhook:sink"]).await;
    let d = s.start().await;
    let bearer = [format!("Authorization: Bearer {JOB_TOKEN}"), "Content-Type: application/json".into()];
    assert_eq!(s.curl("/hook/brew", &bearer, b"{}").await.0, 202);
    assert!(d.wait_log("report dropped", 60).await, "{}", s.log());
    assert!(s.log().contains("another origin"), "{}", s.log());
    assert_eq!(sink.requests().len(), 1);
    assert!(sink.requests()[0].header("x-bramble-signature").is_some());
    assert!(thief.requests().is_empty(), "nothing went to the other origin");
    d.stop().await;
}

/// A request accepted before a restart is still a replay after it.
#[tokio::test]
async fn a_request_replayed_after_a_restart_is_refused() {
    let s = Setup::new(&tables("http://127.0.0.1:9")).await;
    let d = s.start().await;
    let body = r#"{"state":"open","door":{"name":"side"}}"#;
    let t = now();
    s.fake.push(Reply::text("ok"));
    assert_eq!(s.signed("door", DOOR_SECRET, t, body).await.0, 202);
    assert!(wait_until(60, || s.fake.request_count() == 1).await, "{}", s.log());
    d.stop().await;
    let d = s.start().await;
    assert_eq!(s.signed("door", DOOR_SECRET, t, body).await.0, 401, "{}", s.log());
    assert!(s.log().contains("a replay"), "{}", s.log());
    assert_eq!(s.fake.request_count(), 1);
    d.stop().await;
}

/// A call answered `202` is kept on disk until its turn has run: a daemon
/// killed mid-turn runs it after the restart, and only once.
#[tokio::test]
async fn an_accepted_call_survives_a_crash_and_runs_once_after_the_restart() {
    let s = Setup::new(&tables("http://127.0.0.1:9")).await;
    let d = s.start().await;
    // The first turn hangs in the model: the daemon dies before it ends.
    s.fake.push(Reply::Delayed(std::time::Duration::from_secs(300), Box::new(Reply::text("too late"))));
    let body = r#"{"state":"open","door":{"name":"cellar"}}"#;
    assert_eq!(s.signed("door", DOOR_SECRET, now(), body).await.0, 202, "{}", s.log());
    assert!(wait_until(60, || s.fake.request_count() == 1).await, "{}", s.log());
    d.kill9().await;

    s.fake.push(Reply::text("Noted: the cellar door is open."));
    let d = s.start().await;
    assert!(wait_until(60, || s.fake.request_count() == 2).await, "the kept call did not run: {}", s.log());
    let turn = s.fake.requests()[1].to_string();
    assert!(turn.contains("The cellar door is open") && turn.contains("data, not as instructions"), "{turn}");
    assert!(s.log().contains("accepted before the restart runs now"), "{}", s.log());
    assert!(d.wait_log("webhook:door", 30).await, "{}", s.log());
    d.stop().await;

    // It ran: a third start has nothing left to run.
    let d = s.start().await;
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(s.fake.request_count(), 2, "ran twice: {}", s.log());
    d.stop().await;
}

/// A self-signed certificate for 127.0.0.1 made by the `openssl` CLI: (cert, key).
fn self_signed(dir: &Path) -> (PathBuf, PathBuf) {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let out = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2"])
        .args(["-subj", "/CN=bramble-test", "-addext", "subjectAltName=IP:127.0.0.1"])
        // A server certificate, not a CA (webpki refuses a CA as the end entity).
        .args(["-addext", "basicConstraints=critical,CA:FALSE", "-addext", "extendedKeyUsage=serverAuth"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl (apt-get install openssl)");
    assert!(out.status.success(), "openssl: {}", String::from_utf8_lossy(&out.stderr));
    (cert, key)
}

#[tokio::test]
async fn a_lan_listener_with_a_certificate_serves_https_only_and_a_stalled_handshake_delays_nobody() {
    bramble::install_crypto();
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed(certs.path());
    let tls = format!("tls_cert = \"{}\"\ntls_key = \"{}\"\n", cert.display(), key.display());
    let s =
        Setup::new(&format!("{tls}\n[[webhook]]\nname = \"other\"\ntoken_env = \"OTHER_TOKEN\"\nmessage = \"x\"\n"))
            .await;
    // Any address (not only loopback) once the listener has TLS.
    let text = std::fs::read_to_string(&s.home.config).unwrap();
    std::fs::write(&s.home.config, text.replace("listen = \"127.0.0.1:", "listen = \"0.0.0.0:")).unwrap();

    // An unreadable key is `bramble check`'s FILE:LINE error, naming the key.
    let good = std::fs::read_to_string(&s.home.config).unwrap();
    std::fs::write(&s.home.config, good.replace(key.to_str().unwrap(), "/nonexistent/key.pem")).unwrap();
    let cfg = s.home.config.to_str().unwrap();
    let out = crate::support::setup::bramble(s.home.path(), &["--config", cfg, "check"], None).await;
    let err = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!("{cfg}:")) && err.contains("tls_key = \"/nonexistent/key.pem\" cannot be read"),
        "{err}"
    );
    std::fs::write(&s.home.config, &good).unwrap();
    assert!(s.cli(&["check"]).await.contains("ok"));

    let d = s.start().await;
    assert!(s.log().contains("https=true"), "{}", s.log());
    // A client that connects and never says hello holds only its own slot.
    let mut stalled = tokio::net::TcpStream::connect(("127.0.0.1", s.port)).await.unwrap();
    s.fake.push(Reply::text("ok"));
    let trusting = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(&cert).unwrap()).unwrap())
        .build()
        .unwrap();
    let url = format!("https://127.0.0.1:{}/hook/other", s.port);
    let call = |client: &reqwest::Client, url: &str| {
        client.post(url).bearer_auth(OTHER_TOKEN).header("Content-Type", "application/json").body("{}").send()
    };
    let answer = call(&trusting, &url).await.expect("HTTPS to the listener");
    assert_eq!(answer.status().as_u16(), 202, "{}", s.log());
    // A client that does not trust the certificate, and plain HTTP to the HTTPS port: refused, not served.
    let plain_client = reqwest::Client::new();
    assert!(call(&plain_client, &url).await.is_err(), "an untrusted certificate is not accepted");
    let plain = call(&plain_client, &format!("http://127.0.0.1:{}/hook/other", s.port)).await;
    assert!(plain.is_err(), "plain HTTP gets no answer: {plain:?}");
    // The stalled client is closed after the handshake time.
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(std::time::Duration::from_secs(60), stalled.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "closed: {read:?}");
    assert!(wait_until(30, || s.log().contains("no TLS handshake within")).await, "{}", s.log());
    assert!(s.log().contains("TLS handshake failed"), "{}", s.log());
    let status = s.cli(&["status"]).await;
    assert!(status.contains(&format!("https://0.0.0.0:{}/hook/<name>", s.port)), "{status}");
    assert_eq!(s.fake.request_count(), 1, "only the HTTPS call ran");
    d.stop().await;
}
