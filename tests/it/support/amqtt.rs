//! A second, MQTT 3.1.1-only broker for tests: amqtt from PyPI (pinned in
//! `tests/fixtures/amqtt/requirements.txt`, installed in a venv by
//! [`super::python::venv`]), on a free port with anonymous access. It
//! answers an MQTT 5 CONNECT with a 3.1.1 ConnAck "unacceptable protocol
//! version" and hangs up, as 3.1.1 brokers do.

use std::time::Duration;

/// A running amqtt broker; killed when dropped.
pub struct Amqtt {
    child: Option<std::process::Child>,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Amqtt {
    pub async fn start() -> Amqtt {
        let req = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/amqtt/requirements.txt");
        let python = tokio::task::spawn_blocking(move || super::python::venv("amqtt", &req)).await.expect("venv");
        let amqtt = python.with_file_name("amqtt");
        let dir = tempfile::tempdir().expect("tempdir");
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("free port").local_addr().expect("addr").port();
        let conf = dir.path().join("amqtt.yaml");
        std::fs::write(
            &conf,
            format!(
                "listeners:\n  default:\n    type: tcp\n    bind: 127.0.0.1:{port}\nplugins:\n  \
                 amqtt.plugins.authentication.AnonymousAuthPlugin:\n    allow_anonymous: true\n"
            ),
        )
        .expect("amqtt.yaml");
        let child = std::process::Command::new(&amqtt)
            .arg("-c")
            .arg(&conf)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("amqtt.log")).expect("log"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {} ({e})", amqtt.display()));
        let b = Amqtt { child: Some(child), port, _dir: dir };
        let mut up = false;
        for _ in 0..400 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
                up = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(up, "amqtt did not listen on port {port} within 20 s");
        b
    }

    /// `mqtt://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }
}

impl Drop for Amqtt {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
