//! The email channel end to end: a real `bramble run` reading a real IMAP
//! server (dovecot, started by the test on 127.0.0.1 with its own TLS
//! certificate) and sending through a real SMTP submission endpoint
//! (aiosmtpd from PyPI), with the fake LLM answering. Mail is put in with
//! IMAP APPEND, with or without the receiving server's
//! `Authentication-Results` stamp (RFC 8601), which is how a receiving MTA's
//! verdict is simulated.

use std::path::Path;

use crate::support::daemon::Daemon;
use crate::support::fake_llm::{Dialect, FakeLlm, Reply};
use crate::support::mail::{Dovecot, SmtpSink};
use crate::support::setup::TestHome;

const AR_PASS: &str = "Authentication-Results: mx.home.example;\r\n\tdkim=pass header.d=example.org header.i=@example.org;\r\n\tspf=pass smtp.mailfrom=me@example.org\r\n";

struct Setup {
    llm: FakeLlm,
    imap: Dovecot,
    smtp: SmtpSink,
    home: TestHome,
    log: tempfile::TempDir,
}

/// `imap`: `imaps` (TLS on the TLS port) or `imap` (STARTTLS on the plain port).
async fn setup(imap_scheme: &str, extra: &str) -> Setup {
    let llm = FakeLlm::start(Dialect::OpenAi).await;
    let imap = Dovecot::start().await;
    let smtp = SmtpSink::start().await;
    let port = if imap_scheme == "imaps" { imap.tls_port } else { imap.port };
    let home = TestHome::new(
        "openai",
        &llm.base_url(),
        "",
        "max_retries = 0\n",
        &format!(
            "[heartbeat]\nenabled = false\n[email]\naddress = \"bot@home.example\"\n\
             password_env = \"BRAMBLE_EMAIL_PASSWORD\"\nimap = \"{imap_scheme}://localhost:{port}\"\n\
             smtp = \"smtp+plain://127.0.0.1:{}\"\nallow_from = [\"me@example.org\"]\n\
             authserv_id = \"mx.home.example\"\n{extra}",
            smtp.port
        ),
    );
    Setup { llm, imap, smtp, home, log: tempfile::tempdir().expect("log dir") }
}

impl Setup {
    fn daemon(&self) -> Daemon {
        let log = self.log.path().join(format!("run-{}.log", std::process::id() as u64 + rand_suffix()));
        let ca = self.imap.ca();
        Daemon::start_with_env(
            self.home.path(),
            Some(&self.home.config),
            &log,
            &[("BRAMBLE_EMAIL_PASSWORD", Path::new(&self.imap.password)), ("SSL_CERT_FILE", &ca)],
        )
    }
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// A mail from `from` with `headers` on top (a receiving server's stamp), as delivered.
fn mail(top: &str, from: &str, id: &str, subject: &str, body: &str, more: &str) -> String {
    format!(
        "{top}Received: from mail.example.org by mx.home.example; Fri, 27 Nov 2026 07:00:00 +0000\r\n\
         From: Someone <{from}>\r\nTo: bot@home.example\r\nSubject: {subject}\r\n\
         Message-ID: <{id}>\r\nDate: Fri, 27 Nov 2026 07:00:00 +0000\r\n{more}\
         Content-Type: text/plain; charset=utf-8\r\n\r\n{body}\r\n"
    )
}

/// The text of every user message the model was sent.
fn asked(llm: &FakeLlm) -> Vec<String> {
    llm.requests()
        .iter()
        .filter_map(|r| {
            r["messages"].as_array()?.iter().rev().find(|m| m["role"] == "user")?["content"].as_str().map(String::from)
        })
        .collect()
}

#[tokio::test]
async fn a_trusted_mail_is_answered_in_its_thread_and_marked_seen() {
    let s = setup("imaps", "").await;
    s.llm.push(Reply::text("The lights are **off** now."));
    s.imap.deliver(&mail(AR_PASS, "me@example.org", "m1@example.org", "lights", "Turn off the lights.", "")).await;
    let daemon = s.daemon();
    let mails = s.smtp.wait_for(1).await;
    let m = &mails[0];
    for want in [
        "To: me@example.org",
        "From: bot@home.example",
        "Subject: Re: lights",
        "In-Reply-To: <m1@example.org>",
        "References: <m1@example.org>",
        "Message-ID: <bramble.",
        "text/plain",
        "text/html",
    ] {
        assert!(m.contains(want), "{want} missing in:\n{m}");
    }
    assert!(m.contains("The lights are **off** now."), "{m}");
    assert!(asked(&s.llm).iter().any(|t| t.contains("Turn off the lights.")), "{:?}", asked(&s.llm));
    let seen = s.imap.seen().await;
    assert_eq!(seen, vec![(1, true)], "{}", daemon.log());
    let mark = std::fs::read_to_string(s.home.state.join("email-imap.json")).expect("the mark is saved");
    assert!(mark.contains("\"last_uid\":1"), "{mark}");
    drop(daemon);
}
