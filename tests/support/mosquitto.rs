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
    dir: tempfile::TempDir,
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
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("free port").local_addr().expect("addr").port();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut m = Mosquitto { child: None, port, dir };
        m.launch().await;
        m
    }

    async fn launch(&mut self) {
        let conf = self.dir.path().join("mosquitto.conf");
        std::fs::write(&conf, format!("listener {} 127.0.0.1\nallow_anonymous true\npersistence false\n", self.port))
            .expect("mosquitto.conf");
        let child = std::process::Command::new(binary())
            .arg("-c")
            .arg(&conf)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start mosquitto ({e}): {INSTALL}"));
        self.child = Some(child);
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("mosquitto did not listen on port {} within 5 s", self.port);
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
