//! A real Matrix homeserver for tests: Synapse from PyPI (pinned in
//! `tests/fixtures/synapse/requirements.txt`, installed in a venv by
//! [`super::python::venv`]) on a free port of 127.0.0.1, with a throwaway
//! SQLite config written here: no federation, no open registration (users
//! are made with Synapse's own `register_new_matrix_user` and the shared
//! secret), rate limits relaxed so a test's burst is not throttled.
//!
//! It takes seconds to start, so it is started once per test process and
//! shared ([`Synapse::shared`]); every test registers its own users and
//! rooms. The keeper thread that spawned it lives as long as the process, and
//! the child gets SIGKILL when that thread ends (`PR_SET_PDEATHSIG`): no
//! Synapse outlives the test run.
//!
//! [`User`] is the "human" side: plain client-server API calls with reqwest.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{json, Value};

const SHARED_SECRET: &str = "bramble-test-registration-secret";
pub const PASSWORD: &str = "test-password-do-not-log";

/// The running homeserver.
pub struct Synapse {
    pub port: u16,
    /// `register_new_matrix_user` in the venv.
    register: PathBuf,
    dir: PathBuf,
}

static SHARED: OnceLock<Synapse> = OnceLock::new();
static NEXT_USER: AtomicU32 = AtomicU32::new(0);

impl Synapse {
    /// The process's homeserver, started on first use (blocking: call from a blocking thread or early).
    pub async fn shared() -> &'static Synapse {
        if let Some(s) = SHARED.get() {
            return s;
        }
        tokio::task::spawn_blocking(|| SHARED.get_or_init(Synapse::start)).await.expect("start synapse")
    }

    fn start() -> Synapse {
        let req = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/synapse/requirements.txt");
        let python = super::python::venv("synapse", &req);
        let register = python.with_file_name("register_new_matrix_user");
        // Not a TempDir: it lives as long as the process (statics are not dropped). Those of
        // test processes that are gone are removed here instead.
        for old in std::fs::read_dir(std::env::temp_dir()).into_iter().flatten().flatten() {
            let name = old.file_name().to_string_lossy().into_owned();
            let pid = name.strip_prefix("bramble-synapse-").and_then(|p| p.parse::<u32>().ok());
            if pid.is_some_and(|p| !std::path::Path::new(&format!("/proc/{p}")).exists()) {
                let _ = std::fs::remove_dir_all(old.path());
            }
        }
        let dir = std::env::temp_dir().join(format!("bramble-synapse-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("synapse dir");
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("free port").local_addr().expect("addr").port();
        let conf = dir.join("homeserver.yaml");
        std::fs::write(&conf, config(&dir, port)).expect("homeserver.yaml");
        let keys = std::process::Command::new(&python)
            .args(["-m", "synapse.app.homeserver", "-c"])
            .arg(&conf)
            .arg("--generate-keys")
            .output()
            .expect("synapse --generate-keys");
        assert!(keys.status.success(), "synapse --generate-keys: {}", String::from_utf8_lossy(&keys.stderr));
        let (tx, rx) = std::sync::mpsc::channel();
        let log = dir.join("synapse.log");
        std::thread::Builder::new()
            .name("synapse-keeper".into())
            .spawn(move || {
                use std::os::unix::process::CommandExt;
                let mut cmd = std::process::Command::new(&python);
                cmd.args(["-m", "synapse.app.homeserver", "-c"])
                    .arg(&conf)
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::fs::File::create(&log).expect("synapse log"));
                // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
                unsafe {
                    cmd.pre_exec(|| {
                        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
                let mut child = cmd.spawn().expect("start synapse");
                tx.send(()).expect("started");
                // This thread lives until the process ends; then the kernel kills the child.
                let _ = child.wait();
            })
            .expect("keeper thread");
        rx.recv().expect("synapse spawned");
        let url = format!("http://127.0.0.1:{port}/_matrix/client/versions");
        let up = (0..1200).any(|_| {
            let ok = std::process::Command::new("curl")
                .args(["-sf", "-o", "/dev/null", &url])
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                std::thread::sleep(Duration::from_millis(100));
            }
            ok
        });
        let log = std::fs::read_to_string(dir.join("synapse.log")).unwrap_or_default();
        assert!(up, "Synapse did not answer on port {port} within 120 s:\n{log}");
        Synapse { port, register, dir }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What Synapse logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("synapse.log")).unwrap_or_default()
    }

    /// A new user (`<name>N`, unique in the process), registered and logged in.
    pub async fn user(&self, name: &str) -> User {
        let n = NEXT_USER.fetch_add(1, Ordering::Relaxed);
        let local = format!("{name}{n}");
        let (register, url, l) = (self.register.clone(), self.url(), local.clone());
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new(register)
                .args(["-u", &l, "-p", PASSWORD, "--no-admin", "-k", SHARED_SECRET, &url])
                .output()
                .expect("register_new_matrix_user")
        })
        .await
        .expect("register");
        assert!(out.status.success(), "register_new_matrix_user {local}: {}", String::from_utf8_lossy(&out.stderr));
        bramble::install_crypto();
        let http = reqwest::Client::new();
        let login: Value = http
            .post(format!("{}/_matrix/client/v3/login", self.url()))
            .json(&json!({"type": "m.login.password", "identifier": {"type": "m.id.user", "user": local},
                          "password": PASSWORD}))
            .send()
            .await
            .expect("login")
            .json()
            .await
            .expect("login answer");
        User {
            http,
            base: self.url(),
            id: login["user_id"].as_str().expect("user_id").to_string(),
            token: login["access_token"].as_str().expect("access_token").to_string(),
            local,
        }
    }
}

fn config(dir: &std::path::Path, port: u16) -> String {
    let d = dir.display();
    let relaxed = "{per_second: 10000, burst_count: 10000}";
    format!(
        "server_name: \"localhost\"\n\
         pid_file: {d}/homeserver.pid\n\
         listeners:\n  - port: {port}\n    bind_addresses: ['127.0.0.1']\n    type: http\n    tls: false\n    \
         x_forwarded: false\n    resources:\n      - names: [client]\n        compress: false\n\
         database:\n  name: sqlite3\n  args:\n    database: {d}/homeserver.db\n\
         media_store_path: {d}/media\n\
         registration_shared_secret: \"{SHARED_SECRET}\"\n\
         report_stats: false\n\
         macaroon_secret_key: \"bramble-test-macaroon\"\n\
         form_secret: \"bramble-test-form\"\n\
         signing_key_path: {d}/signing.key\n\
         trusted_key_servers: []\n\
         suppress_key_server_warning: true\n\
         federation_domain_whitelist: []\n\
         enable_registration: false\n\
         encryption_enabled_by_default_for_room_type: \"off\"\n\
         rc_message: {relaxed}\n\
         rc_login:\n  address: {relaxed}\n  account: {relaxed}\n  failed_attempts: {relaxed}\n\
         rc_joins:\n  local: {relaxed}\n  remote: {relaxed}\n\
         rc_invites:\n  per_room: {relaxed}\n  per_user: {relaxed}\n  per_issuer: {relaxed}\n\
         rc_media_create: {relaxed}\n"
    )
}

/// A "human" account, driven with plain client-server API calls.
pub struct User {
    http: reqwest::Client,
    base: String,
    /// `@name:localhost`.
    pub id: String,
    pub token: String,
    pub local: String,
}

fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

impl User {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self.http.request(method.clone(), format!("{}{path}", self.base)).bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = resp.status();
        let v: Value = resp.json().await.unwrap_or(Value::Null);
        assert!(status.is_success(), "{method} {path}: HTTP {status}: {v}");
        v
    }

    /// A private room with `invite`d users (`encrypted`: with `m.room.encryption`).
    pub async fn create_room(&self, invite: &[&str], encrypted: bool) -> String {
        let mut body = json!({"preset": "private_chat", "invite": invite, "is_direct": invite.len() == 1});
        if encrypted {
            body["initial_state"] = json!([{"type": "m.room.encryption", "state_key": "", "content": {"algorithm": "m.megolm.v1.aes-sha2"}}]);
        }
        let v = self.call(reqwest::Method::POST, "/_matrix/client/v3/createRoom", Some(body)).await;
        v["room_id"].as_str().expect("room_id").to_string()
    }

    pub async fn invite(&self, room: &str, user: &str) {
        let path = format!("/_matrix/client/v3/rooms/{}/invite", enc(room));
        self.call(reqwest::Method::POST, &path, Some(json!({"user_id": user}))).await;
    }

    pub async fn join(&self, room: &str) {
        self.call(reqwest::Method::POST, &format!("/_matrix/client/v3/join/{}", enc(room)), Some(json!({}))).await;
    }

    /// Send an event of `kind`; its id.
    pub async fn send(&self, room: &str, kind: &str, content: Value) -> String {
        let txn = format!("t{}", NEXT_USER.fetch_add(1, Ordering::Relaxed));
        let path = format!("/_matrix/client/v3/rooms/{}/send/{}/{txn}", enc(room), enc(kind));
        let v = self.call(reqwest::Method::PUT, &path, Some(content)).await;
        v["event_id"].as_str().expect("event_id").to_string()
    }

    pub async fn say(&self, room: &str, body: &str) -> String {
        self.send(room, "m.room.message", json!({"msgtype": "m.text", "body": body})).await
    }

    pub async fn react(&self, room: &str, event: &str, key: &str) -> String {
        let content = json!({"m.relates_to": {"rel_type": "m.annotation", "event_id": event, "key": key}});
        self.send(room, "m.reaction", content).await
    }

    /// The joined members' ids.
    pub async fn members(&self, room: &str) -> Vec<String> {
        let path = format!("/_matrix/client/v3/rooms/{}/joined_members", enc(room));
        let v = self.call(reqwest::Method::GET, &path, None).await;
        v["joined"].as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default()
    }

    /// Wait until `user` has joined `room` (or `false` after `secs`).
    pub async fn wait_member(&self, room: &str, user: &str, secs: u64) -> bool {
        for _ in 0..secs * 5 {
            if self.members(room).await.iter().any(|m| m == user) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        false
    }

    /// The room's message events, oldest first (the last 100).
    pub async fn messages(&self, room: &str) -> Vec<Value> {
        let filter = enc(r#"{"types":["m.room.message"]}"#);
        let path = format!("/_matrix/client/v3/rooms/{}/messages?dir=b&limit=100&filter={filter}", enc(room));
        let v = self.call(reqwest::Method::GET, &path, None).await;
        let mut events: Vec<Value> = v["chunk"].as_array().cloned().unwrap_or_default();
        events.reverse();
        events
    }

    /// Messages in `room` sent by `sender`, oldest first.
    pub async fn messages_from(&self, room: &str, sender: &str) -> Vec<Value> {
        self.messages(room).await.into_iter().filter(|e| e["sender"] == sender).collect()
    }

    /// Wait until `sender` has posted at least `n` messages in `room`; them.
    pub async fn wait_messages(&self, room: &str, sender: &str, n: usize, secs: u64) -> Vec<Value> {
        for _ in 0..secs * 4 {
            let m = self.messages_from(room, sender).await;
            if m.len() >= n {
                return m;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        self.messages_from(room, sender).await
    }
}
