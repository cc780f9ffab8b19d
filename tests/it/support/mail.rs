//! Real mail servers for the email channel's tests, on 127.0.0.1:
//!
//! - [`Dovecot`]: Debian's dovecot (`dovecot-imapd`) with a throwaway
//!   config in a temp dir — one user in a passwd-file, Maildir storage in
//!   the temp dir, a plain listener (STARTTLS offered) and an implicit-TLS
//!   one whose certificate for `localhost` a fresh test CA signed. Mail is
//!   put in with IMAP `APPEND` (as a receiving server would deliver it, its
//!   `Authentication-Results` header included or not).
//! - [`SmtpSink`]: `aiosmtpd` from PyPI (pinned in
//!   `tests/fixtures/aiosmtpd/requirements.txt`, in a venv) as the
//!   submission endpoint: it takes every mail and writes it to a Maildir the
//!   test reads. Chosen over postfix: no system service, no root-owned
//!   queue, no MTA config to template, started and killed per test.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

const INSTALL: &str = "apt-get install dovecot-imapd";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("free port").local_addr().expect("addr").port()
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("the mail tests need the openssl command ({e}): apt-get install openssl"));
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A test CA and a certificate for `localhost` it signed: `ca.pem`, `server.pem`, `server.key` in `d`.
fn make_certs(d: &Path) {
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    let ca = ["-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=bramble mail test CA"];
    openssl(d, &[&["req", "-x509"][..], &ec, &ca].concat());
    let csr = ["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost"];
    openssl(d, &[&["req"][..], &ec, &csr].concat());
    std::fs::write(
        d.join("ext.cnf"),
        "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .expect("ext");
    let sign = [
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
    ];
    openssl(d, &sign);
}

async fn wait_port(port: u16, what: &str, log: &Path) {
    for _ in 0..400 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what} did not listen on port {port} within 20 s:\n{}", std::fs::read_to_string(log).unwrap_or_default());
}

/// A running dovecot; killed when dropped.
pub struct Dovecot {
    child: Option<std::process::Child>,
    /// Plain IMAP (STARTTLS offered).
    pub port: u16,
    /// IMAP over TLS from the first byte.
    pub tls_port: u16,
    pub user: String,
    pub password: String,
    dir: tempfile::TempDir,
}

impl Dovecot {
    pub async fn start() -> Dovecot {
        Dovecot::start_with("").await
    }

    /// Like [`start`](Dovecot::start), with more config lines (`imap_capability = …` to hide IDLE).
    pub async fn start_with(extra: &str) -> Dovecot {
        let bin = ["/usr/sbin/dovecot", "/usr/bin/dovecot"].into_iter().find(|p| Path::new(p).exists()).unwrap_or_else(
            || panic!("the email tests need a real IMAP server and dovecot is not installed: {INSTALL}"),
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        // Dovecot's mail processes run as `nobody` (it refuses root); they reach the Maildir under the temp dir.
        std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
        make_certs(d);
        let home = d.join("home");
        std::fs::create_dir_all(&home).expect("home");
        let nobody = 65534;
        std::os::unix::fs::chown(&home, Some(nobody), Some(nobody)).expect("chown home");
        let (user, password) = ("bot@home.example".to_string(), "app-password-1".to_string());
        std::fs::write(d.join("passwd"), format!("{user}:{{PLAIN}}{password}\n")).expect("passwd");
        let (port, tls_port) = (free_port(), free_port());
        let p = d.display();
        let conf = format!(
            "base_dir = {p}/run\nstate_dir = {p}/state\nlog_path = {p}/dovecot.log\n\
             protocols = imap\nlisten = 127.0.0.1\nssl = yes\nssl_cert = <{p}/server.pem\nssl_key = <{p}/server.key\n\
             disable_plaintext_auth = no\nauth_mechanisms = plain login\nfirst_valid_uid = 1\n\
             passdb {{\n  driver = passwd-file\n  args = scheme=PLAIN username_format=%u {p}/passwd\n}}\n\
             userdb {{\n  driver = static\n  args = uid={nobody} gid={nobody} home={p}/home/%u\n}}\n\
             mail_location = maildir:~/Maildir\n\
             service imap-login {{\n  inet_listener imap {{\n    port = {port}\n  }}\n  \
             inet_listener imaps {{\n    port = {tls_port}\n    ssl = yes\n  }}\n}}\n\
             service anvil {{\n  chroot =\n}}\nservice stats {{\n  inet_listener http {{\n    port = 0\n  }}\n}}\n{extra}\n"
        );
        std::fs::write(d.join("dovecot.conf"), conf).expect("dovecot.conf");
        let child = std::process::Command::new(bin)
            .args(["-F", "-c"])
            .arg(d.join("dovecot.conf"))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(d.join("stderr.log")).expect("log"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start dovecot ({e}): {INSTALL}"));
        let dc = Dovecot { child: Some(child), port, tls_port, user, password, dir };
        wait_port(port, "dovecot", &dc.dir.path().join("stderr.log")).await;
        wait_port(tls_port, "dovecot (TLS)", &dc.dir.path().join("stderr.log")).await;
        dc
    }

    /// The test CA's certificate (for `SSL_CERT_FILE`).
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// Dovecot's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("dovecot.log")).unwrap_or_default()
            + &std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default()
    }

    /// Stop it (the server goes away; [`restart`](Dovecot::restart) brings it back on the same ports and mail).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start it again after [`kill`](Dovecot::kill), same ports, same mail.
    pub async fn restart(&mut self) {
        self.kill();
        let d = self.dir.path();
        let bin = if Path::new("/usr/sbin/dovecot").exists() { "/usr/sbin/dovecot" } else { "/usr/bin/dovecot" };
        let child = std::process::Command::new(bin)
            .args(["-F", "-c"])
            .arg(d.join("dovecot.conf"))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::options().append(true).open(d.join("stderr.log")).expect("log"))
            .spawn()
            .expect("restart dovecot");
        self.child = Some(child);
        wait_port(self.port, "dovecot", &d.join("stderr.log")).await;
    }

    /// A logged-in IMAP session over the plain port (a test's own client, raw commands).
    pub async fn session(&self) -> Session {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await.expect("connect to dovecot");
        let mut s = Session { io: BufReader::new(tcp), tag: 0 };
        s.line().await;
        s.run(&format!("LOGIN \"{}\" \"{}\"", self.user, self.password)).await;
        s
    }

    /// Put `mail` into INBOX (as delivered: unseen).
    pub async fn deliver(&self, mail: &str) {
        let mut s = self.session().await;
        s.append("INBOX", mail.replace("\r\n", "\n").replace('\n', "\r\n").as_bytes()).await;
        s.run("LOGOUT").await;
    }

    /// The flags of every message in INBOX, by UID: (uid, seen).
    pub async fn seen(&self) -> Vec<(u32, bool)> {
        let mut s = self.session().await;
        s.run("SELECT INBOX").await;
        let lines = s.run("UID FETCH 1:* (FLAGS)").await;
        s.run("LOGOUT").await;
        lines
            .iter()
            .filter(|l| l.contains("FETCH"))
            .filter_map(|l| {
                let uid = l.split("UID ").nth(1)?.split([' ', ')']).next()?.parse().ok()?;
                Some((uid, l.contains("\\Seen")))
            })
            .collect()
    }
}

impl Drop for Dovecot {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A test's own raw IMAP session.
pub struct Session {
    io: BufReader<tokio::net::TcpStream>,
    tag: u32,
}

impl Session {
    async fn line(&mut self) -> String {
        let mut l = String::new();
        tokio::time::timeout(Duration::from_secs(30), self.io.read_line(&mut l))
            .await
            .expect("IMAP answer")
            .expect("read");
        l
    }

    /// Run `cmd`; the untagged lines. Panics on NO/BAD.
    pub async fn run(&mut self, cmd: &str) -> Vec<String> {
        self.tag += 1;
        let tag = format!("t{}", self.tag);
        self.io.get_mut().write_all(format!("{tag} {cmd}\r\n").as_bytes()).await.expect("write");
        let mut out = Vec::new();
        loop {
            let l = self.line().await;
            if let Some(rest) = l.strip_prefix(&format!("{tag} ")) {
                assert!(rest.starts_with("OK") || cmd == "LOGOUT", "{cmd}: {rest}");
                return out;
            }
            // A literal: read it whole into the line.
            if let Some(n) = l
                .trim_end()
                .strip_suffix('}')
                .and_then(|x| x.rsplit_once('{'))
                .and_then(|(_, n)| n.parse::<usize>().ok())
            {
                let mut buf = vec![0; n];
                self.io.read_exact(&mut buf).await.expect("literal");
                out.push(format!("{}{}", l, String::from_utf8_lossy(&buf)));
                continue;
            }
            out.push(l);
        }
    }

    pub async fn append(&mut self, folder: &str, mail: &[u8]) {
        self.tag += 1;
        let tag = format!("t{}", self.tag);
        self.io
            .get_mut()
            .write_all(format!("{tag} APPEND {folder} {{{}}}\r\n", mail.len()).as_bytes())
            .await
            .expect("write");
        let cont = self.line().await;
        assert!(cont.starts_with('+'), "APPEND: {cont}");
        self.io.get_mut().write_all(mail).await.expect("write");
        self.io.get_mut().write_all(b"\r\n").await.expect("write");
        loop {
            let l = self.line().await;
            if let Some(rest) = l.strip_prefix(&format!("{tag} ")) {
                assert!(rest.starts_with("OK"), "APPEND: {rest}");
                return;
            }
        }
    }
}

/// aiosmtpd taking every mail into a Maildir; killed when dropped.
pub struct SmtpSink {
    child: Option<std::process::Child>,
    pub port: u16,
    dir: tempfile::TempDir,
}

impl SmtpSink {
    pub async fn start() -> SmtpSink {
        let dir = tempfile::tempdir().expect("tempdir");
        SmtpSink::start_in(dir, free_port()).await
    }

    async fn start_in(dir: tempfile::TempDir, port: u16) -> SmtpSink {
        let req = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/aiosmtpd/requirements.txt");
        let python = tokio::task::spawn_blocking(move || super::python::venv("aiosmtpd", &req)).await.expect("venv");
        let maildir = dir.path().join("mail");
        let log = dir.path().join("aiosmtpd.log");
        let child = std::process::Command::new(&python)
            .args(["-m", "aiosmtpd", "-n", "-l", &format!("127.0.0.1:{port}"), "-c", "aiosmtpd.handlers.Mailbox"])
            .arg(&maildir)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start aiosmtpd ({e})"));
        let s = SmtpSink { child: Some(child), port, dir };
        wait_port(port, "aiosmtpd", &log).await;
        s
    }

    /// Stop taking mail (the port refuses connections).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start again on the same port, into the same Maildir.
    pub async fn restart(self) -> SmtpSink {
        let mut me = self;
        me.kill();
        let (dir, port) = (std::mem::replace(&mut me.dir, tempfile::tempdir().expect("tempdir")), me.port);
        SmtpSink::start_in(dir, port).await
    }

    /// Every mail taken so far, raw, oldest first.
    pub fn mails(&self) -> Vec<String> {
        let mut files: Vec<(std::time::SystemTime, String)> = ["new", "cur"]
            .iter()
            .flat_map(|sub| std::fs::read_dir(self.dir.path().join("mail").join(sub)).into_iter().flatten().flatten())
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, std::fs::read_to_string(e.path()).ok()?)))
            .collect();
        files.sort();
        files.into_iter().map(|(_, m)| m).collect()
    }

    /// Wait until `n` mails have been taken (up to 60 s); them.
    pub async fn wait_for(&self, n: usize) -> Vec<String> {
        self.wait_for_secs(n, 60).await
    }

    /// Wait until `n` mails have been taken (up to `secs`); them.
    pub async fn wait_for_secs(&self, n: usize, secs: u64) -> Vec<String> {
        for _ in 0..secs * 10 {
            let m = self.mails();
            if m.len() >= n {
                return m;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("expected {n} mails, got {:?}", self.mails());
    }
}

impl Drop for SmtpSink {
    fn drop(&mut self) {
        self.kill();
    }
}
