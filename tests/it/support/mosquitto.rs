//! A real MQTT broker for tests: Debian's `mosquitto`, started on a free port
//! with a throwaway config, and [`Watcher`], a rumqttc client that records
//! everything it sees.
//!
//! No fallback: without the binary the tests fail and say how to install it
//! (a test that passes without a broker would prove nothing).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};

const INSTALL: &str = "install mosquitto: apt-get install mosquitto";

/// A running broker; killed when dropped.
pub struct Mosquitto {
    child: Option<std::process::Child>,
    pub port: u16,
    /// With [`start_tls`](Mosquitto::start_tls): the TLS listener's port (`port` stays plain).
    pub tls_port: Option<u16>,
    /// More lines for mosquitto.conf.
    extra: String,
    dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("free port").local_addr().expect("addr").port()
}

fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("the TLS test needs the openssl command ({e}): apt-get install openssl"));
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn binary() -> PathBuf {
    for p in ["/usr/sbin/mosquitto", "/usr/bin/mosquitto", "/usr/local/sbin/mosquitto"] {
        if std::path::Path::new(p).exists() {
            return PathBuf::from(p);
        }
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("mosquitto"))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("the MQTT tests need a real broker and mosquitto is not installed: {INSTALL}"))
}

impl Mosquitto {
    /// Start a broker on a free port of 127.0.0.1 (anonymous, no persistence).
    pub async fn start() -> Mosquitto {
        Mosquitto::start_with("").await
    }

    /// Like [`start`](Mosquitto::start), with more config lines (e.g. `set_tcp_nodelay true`).
    pub async fn start_with(extra: &str) -> Mosquitto {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut m = Mosquitto { child: None, port: free_port(), tls_port: None, extra: extra.into(), dir };
        m.launch().await;
        m
    }

    /// A broker with a plain listener (`port`) and a TLS one (`tls_port`) whose
    /// certificate for `localhost` is signed by a fresh test CA; returns the CA file.
    pub async fn start_tls() -> (Mosquitto, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        // mosquitto started as root drops to its own user before reading certificates.
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
        let d = dir.path();
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
        openssl(
            d,
            &[
                &["req", "-x509"][..],
                &ec,
                &["-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=bramble test CA"],
            ]
            .concat(),
        );
        openssl(
            d,
            &[&["req"][..], &ec, &["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost"]].concat(),
        );
        std::fs::write(
            d.join("ext.cnf"),
            "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
        )
        .expect("ext");
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.pem",
                "-days",
                "2",
                "-extfile",
                "ext.cnf",
            ],
        );
        for f in ["server.key", "server.pem", "ca.pem"] {
            std::fs::set_permissions(d.join(f), std::os::unix::fs::PermissionsExt::from_mode(0o644)).expect("chmod");
        }
        let ca = d.join("ca.pem");
        let mut m =
            Mosquitto { child: None, port: free_port(), tls_port: Some(free_port()), extra: String::new(), dir };
        m.launch().await;
        (m, ca)
    }

    async fn launch(&mut self) {
        let conf = self.dir.path().join("mosquitto.conf");
        let mut text =
            format!("allow_anonymous true\npersistence false\n{}\nlistener {} 127.0.0.1\n", self.extra, self.port);
        if let Some(tls) = self.tls_port {
            let d = self.dir.path().display();
            text += &format!("listener {tls} 127.0.0.1\ncertfile {d}/server.pem\nkeyfile {d}/server.key\n");
        }
        std::fs::write(&conf, text).expect("mosquitto.conf");
        let child = std::process::Command::new(binary())
            .arg("-c")
            .arg(&conf)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start mosquitto ({e}): {INSTALL}"));
        self.child = Some(child);
        for port in std::iter::once(self.port).chain(self.tls_port) {
            let mut up = false;
            for _ in 0..200 {
                if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
                    up = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            assert!(up, "mosquitto did not listen on port {port} within 5 s");
        }
    }

    /// `mqtt://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }

    /// SIGKILL the broker (an outage; retained messages and sessions are lost).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The broker's process id (to stop it with SIGSTOP: a broker that hangs).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Start it again on the same port.
    pub async fn restart(&mut self) {
        self.kill();
        self.launch().await;
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One message a [`Watcher`] received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub topic: String,
    pub payload: String,
    pub retain: bool,
}

/// A test client subscribed to some filters; reconnects (and subscribes again)
/// on its own, records every message, and publishes.
pub struct Watcher {
    client: AsyncClient,
    seen: Arc<Mutex<Vec<Seen>>>,
    connected: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Watcher {
    pub async fn start(port: u16, filters: &[&str]) -> Watcher {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let id = format!("watcher-{}-{}", std::process::id(), N.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let mut opts = MqttOptions::new(id, "127.0.0.1", port);
        opts.set_max_packet_size(1 << 20, 1 << 20).set_keep_alive(Duration::from_secs(5));
        let (client, mut events) = AsyncClient::new(opts, 100);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let connected = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let filters: Vec<String> = filters.iter().map(|f| f.to_string()).collect();
        let (c2, s2, k2) = (client.clone(), seen.clone(), connected.clone());
        let task = tokio::spawn(async move {
            loop {
                match events.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        for f in &filters {
                            let _ = c2.try_subscribe(f.clone(), QoS::AtLeastOnce);
                        }
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => k2.store(true, std::sync::atomic::Ordering::SeqCst),
                    Ok(Event::Incoming(Packet::Publish(p))) => s2.lock().unwrap().push(Seen {
                        topic: p.topic.clone(),
                        payload: String::from_utf8_lossy(&p.payload).into_owned(),
                        retain: p.retain,
                    }),
                    Ok(_) => {}
                    Err(_) => {
                        k2.store(false, std::sync::atomic::Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        });
        let w = Watcher { client, seen, connected, task };
        assert!(
            super::daemon::wait_until(10, || w.connected.load(std::sync::atomic::Ordering::SeqCst)).await,
            "the test client subscribed"
        );
        w
    }

    /// Everything received on `topic`, oldest first.
    pub fn on(&self, topic: &str) -> Vec<Seen> {
        self.seen.lock().unwrap().iter().filter(|s| s.topic == topic).cloned().collect()
    }

    /// The newest payload on `topic`.
    pub fn last(&self, topic: &str) -> Option<String> {
        self.on(topic).last().map(|s| s.payload.clone())
    }

    /// Wait up to `secs` for a message on `topic` that satisfies `check`.
    pub async fn wait_for(&self, secs: u64, topic: &str, check: impl Fn(&str) -> bool) -> bool {
        super::daemon::wait_until(secs, || self.on(topic).iter().any(|s| check(&s.payload))).await
    }

    /// Wait until the newest payload on `topic` is `payload`.
    pub async fn wait_last(&self, secs: u64, topic: &str, payload: &str) -> bool {
        super::daemon::wait_until(secs, || self.last(topic).as_deref() == Some(payload)).await
    }

    /// Forget what was seen so far.
    pub fn clear(&self) {
        self.seen.lock().unwrap().clear();
    }

    pub async fn publish(&self, topic: &str, payload: &str) {
        self.client.publish(topic, QoS::AtLeastOnce, false, payload.as_bytes().to_vec()).await.expect("publish");
    }

    /// Publish with the retain flag (the broker keeps it as the topic's state).
    pub async fn publish_retained(&self, topic: &str, payload: &str) {
        self.client.publish(topic, QoS::AtLeastOnce, true, payload.as_bytes().to_vec()).await.expect("publish");
    }

    pub fn all(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}
