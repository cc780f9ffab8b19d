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

#[tokio::test]
async fn forged_strange_automatic_oversize_and_looping_mail_is_never_answered() {
    let s = setup("imaps", "max_mail_mb = 1\n").await;
    // The malformed mail and the last one are the sender's: both answered.
    s.llm.push(Reply::text("Only you."));
    s.llm.push(Reply::text("Only you."));
    let real_but_failed =
        "Authentication-Results: mx.home.example; dkim=none; spf=softfail smtp.mailfrom=evil.example\r\n";
    let forged_below = "Authentication-Results: mx.home.example; dkim=pass header.d=example.org\r\n";
    let other_server = "Authentication-Results: mx.evil.example; dkim=pass header.d=example.org\r\n";
    let stranger_ar = "Authentication-Results: mx.home.example; dkim=pass header.d=example.org\r\n";
    let big = "x".repeat(1_200_000);
    for m in [
        // A forged From, no verdict at all.
        mail("", "me@example.org", "f1@evil.example", "hi", "forged 1", ""),
        // Another server's verdict.
        mail(other_server, "me@example.org", "f2@evil.example", "hi", "forged 2", ""),
        // The real stamp says no; a pass forged below it (under the receiving server's Received line).
        mail(real_but_failed, "me@example.org", "f3@evil.example", "hi", "forged 3", forged_below),
        // A stranger, authenticated for their own domain.
        mail(stranger_ar, "you@example.org", "s1@example.org", "hi", "stranger", ""),
        // Our own mail coming back, and a mail carrying one of our Message-IDs.
        mail(AR_PASS, "bot@home.example", "x1@home.example", "hi", "own 1", ""),
        mail(AR_PASS, "me@example.org", "bramble.1.2.3@home.example", "Re: hi", "own 2", ""),
        // An out-of-office answer and a list's mail.
        mail(AR_PASS, "me@example.org", "a1@example.org", "Away", "auto 1", "Auto-Submitted: auto-replied\r\n"),
        mail(AR_PASS, "me@example.org", "a2@example.org", "News", "auto 2", "Precedence: bulk\r\n"),
        // Over max_mail_mb.
        mail(AR_PASS, "me@example.org", "big@example.org", "big", &big, ""),
        // Malformed MIME from the trusted sender: read as far as it goes, no crash.
        mail(
            AR_PASS,
            "me@example.org",
            "mal@example.org",
            "broken",
            "--b\r\n\x01\x02",
            "MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=\"b\r\n",
        ),
    ] {
        s.imap.deliver(&m).await;
    }
    s.imap.deliver(&mail(AR_PASS, "me@example.org", "ok@example.org", "last", "the last one", "")).await;
    let daemon = s.daemon();
    let answers = s.smtp.wait_for(2).await;
    // Mail is read in order: once the last one is answered, every earlier one was decided.
    assert!(daemon.wait_log_count("mail accepted", 2, 30).await);
    let asked = asked(&s.llm);
    assert!(asked.iter().any(|t| t.contains("the last one")), "{asked:?}");
    for bad in ["forged", "stranger", "own ", "auto ", "xxxx"] {
        assert!(!asked.iter().any(|t| t.contains(bad)), "{bad} reached the model: {asked:?}");
    }
    assert!(answers.iter().all(|m| m.contains("To: me@example.org")), "{answers:?}");
    let log = daemon.log();
    for why in [
        "no Authentication-Results header of mx.home.example",
        "mx.home.example said dkim=none, spf=softfail",
        "not in [email] allow_from",
        "our own mail came back",
        "Auto-Submitted: auto-replied",
        "Precedence: bulk",
        "over [email] max_mail_mb",
    ] {
        assert!(log.contains(why), "no log line saying {why:?}:\n{log}");
    }
    let seen = s.imap.seen().await;
    assert_eq!(seen.len(), 11);
    assert!(seen.iter().all(|(_, seen)| *seen), "every mail is marked seen: {seen:?}");
    // Nobody but the allowed sender got mail: the strangers and forgers got no answer.
    let mails = s.smtp.mails();
    assert_eq!(mails.len(), 2, "{mails:?}");
    assert_eq!(s.llm.request_count(), 2);
}

#[tokio::test]
async fn a_dead_server_and_a_restart_neither_lose_nor_double_a_mail() {
    // STARTTLS on the plain port this time.
    let mut s = setup("imap", "").await;
    for answer in ["one", "two", "three"] {
        s.llm.push(Reply::text(format!("answer {answer}")));
    }
    s.imap.deliver(&mail(AR_PASS, "me@example.org", "r1@example.org", "first", "question one", "")).await;
    let daemon = s.daemon();
    s.smtp.wait_for(1).await;
    // The server dies and comes back: the reader reconnects, the next mail is read once.
    s.imap.kill();
    assert!(daemon.wait_log("IMAP failed; reconnecting", 60).await, "{}", daemon.log());
    s.imap.restart().await;
    s.imap.deliver(&mail(AR_PASS, "me@example.org", "r2@example.org", "second", "question two", "")).await;
    s.smtp.wait_for(2).await;
    // A restart of bramble: the mail that came meanwhile is read, the old ones are not.
    daemon.stop().await;
    s.imap.deliver(&mail(AR_PASS, "me@example.org", "r3@example.org", "third", "question three", "")).await;
    let daemon = s.daemon();
    let mails = s.smtp.wait_for(3).await;
    assert!(daemon.wait_log("IMAP connected", 30).await);
    let asked = asked(&s.llm);
    for q in ["question one", "question two", "question three"] {
        assert_eq!(asked.iter().filter(|t| t.contains(q)).count(), 1, "{q}: {asked:?}");
    }
    assert!(mails[2].contains("In-Reply-To: <r3@example.org>"), "{}", mails[2]);
    assert_eq!(s.imap.seen().await, vec![(1, true), (2, true), (3, true)]);
    daemon.stop().await;
    assert_eq!(s.smtp.mails().len(), 3);
}

#[tokio::test]
async fn with_the_smtp_server_down_the_answer_waits_in_the_outbox() {
    let mut s = setup("imaps", "").await;
    s.llm.push(Reply::text("kept for later"));
    s.smtp.kill();
    s.imap.deliver(&mail(AR_PASS, "me@example.org", "d1@example.org", "later", "are you there", "")).await;
    let daemon = s.daemon();
    assert!(daemon.wait_log("cannot send through the SMTP server", 60).await, "{}", daemon.log());
    let s = Setup { smtp: s.smtp.restart().await, ..s };
    let mails = s.smtp.wait_for(1).await;
    assert!(mails[0].contains("kept for later"), "{}", mails[0]);
    assert!(mails[0].contains("In-Reply-To: <d1@example.org>"), "{}", mails[0]);
    drop(daemon);
}

impl Setup {
    /// `bramble <args>` on this home's config, with the mail password set.
    async fn cli(&self, args: &[&str]) -> String {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_bramble"))
            .arg("--config")
            .arg(&self.home.config)
            .args(args)
            .env_clear()
            .env("HOME", self.home.path())
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("BRAMBLE_EMAIL_PASSWORD", &self.imap.password)
            .env("SSL_CERT_FILE", self.imap.ca())
            .output()
            .await
            .expect("bramble");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() || args[0] == "doctor", "bramble {args:?}: {text}");
        text
    }
}

#[tokio::test]
async fn a_digest_is_collected_on_disk_across_a_restart_and_sent_once_at_its_time() {
    let s = setup("imaps", "").await;
    let now = jiff::Timestamp::now().as_second();
    // The digest's time: the first whole minute at least 40 s away, so both reports are collected before it.
    let due = (now + 100) - (now + 100) % 60;
    let hhmm = jiff::Timestamp::from_second(due).unwrap().strftime("%H:%M").to_string();
    let target = format!("email:me@example.org?digest={hhmm}");
    for (name, at, text) in [("one", now + 2, "first report"), ("two", now + 3, "second report")] {
        let at = jiff::Timestamp::from_second(at).unwrap().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        s.cli(&["cron", "add", name, "--at", &at, "--remind", text, "--deliver", &target]).await;
    }
    let daemon = s.daemon();
    let dir = s.home.state.join("email-digest");
    let collected = || {
        std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default().lines().count())
            .sum::<usize>()
    };
    assert!(
        crate::support::daemon::wait_until(60, || collected() == 2).await,
        "both reports wait on disk: {}",
        daemon.log()
    );
    assert!(s.smtp.mails().is_empty(), "nothing is sent before its time");
    // A restart keeps them: they are in the state directory, not in memory.
    daemon.stop().await;
    let daemon = s.daemon();
    let mails = s.smtp.wait_for_secs(1, 180).await;
    assert_eq!(mails.len(), 1, "{mails:?}");
    let m = &mails[0];
    for want in ["To: me@example.org", "Subject: bramble: daily digest (2 reports)", "first report", "second report"] {
        assert!(m.contains(want), "{want} missing in:\n{m}");
    }
    assert!(crate::support::daemon::wait_until(30, || collected() == 0).await, "a sent digest is forgotten");
    // The doctor logs in to both servers; status names the channel.
    let doctor = s.cli(&["doctor"]).await;
    assert!(doctor.lines().any(|l| l.starts_with("ok") && l.contains("email") && l.contains("logged in")), "{doctor}");
    let status = s.cli(&["status"]).await;
    assert!(status.contains("email:      bot@home.example; reads localhost"), "{status}");
    drop(daemon);
}

#[tokio::test]
async fn files_come_in_to_the_inbox_and_go_out_attached_on_a_server_without_idle() {
    let llm = FakeLlm::start(Dialect::OpenAi).await;
    // A server that does not offer IDLE: bramble polls.
    let imap = Dovecot::start_with("imap_capability = IMAP4rev1 LITERAL+ SASL-IR UIDPLUS\n").await;
    let smtp = SmtpSink::start().await;
    let home = TestHome::new(
        "openai",
        &llm.base_url(),
        "",
        "max_retries = 0\n",
        &format!(
            "[heartbeat]\nenabled = false\n[email]\naddress = \"bot@home.example\"\n\
             password_env = \"BRAMBLE_EMAIL_PASSWORD\"\nimap = \"imaps://localhost:{}\"\n\
             smtp = \"smtp+plain://127.0.0.1:{}\"\nallow_from = [\"me@example.org\"]\n\
             authserv_id = \"mx.home.example\"\npoll_every = \"10s\"\n",
            imap.tls_port, smtp.port
        ),
    );
    let s = Setup { llm, imap, smtp, home, log: tempfile::tempdir().expect("log dir") };
    std::fs::write(s.home.workspace.join("report.csv"), "a,b\n1,2\n").unwrap();
    s.llm.push(Reply::tool_call("message", r#"{"content": "Here it is.", "attach": ["report.csv"]}"#));
    s.llm.push(Reply::text("Sent."));
    let daemon = s.daemon();
    assert!(daemon.wait_log("IMAP connected", 30).await, "{}", daemon.log());
    assert!(daemon.log().contains("idle=false"), "{}", daemon.log());
    // Arrives after the first look: found by the next poll.
    let body = "--b1\r\nContent-Type: text/plain\r\n\r\nPlease look at the photo.\r\n--b1\r\n\
                Content-Type: image/png\r\nContent-Disposition: attachment; filename=\"../../etc/cat.png\"\r\n\
                Content-Transfer-Encoding: base64\r\n\r\niVBORw0KGgo=\r\n--b1--";
    let m = mail(AR_PASS, "me@example.org", "att@example.org", "photo", body, "MIME-Version: 1.0\r\n").replace(
        "Content-Type: text/plain; charset=utf-8\r\n\r\n",
        "Content-Type: multipart/mixed; boundary=\"b1\"\r\n\r\n",
    );
    s.imap.deliver(&m).await;
    let mails = s.smtp.wait_for(2).await;
    let first = s.llm.requests()[0].to_string();
    assert!(first.contains("Please look at the photo."), "{first}");
    let saved: Vec<_> = walk(&s.home.workspace.join("inbox"));
    assert_eq!(saved.len(), 1, "{saved:?}");
    assert!(saved[0].ends_with("cat.png") && !saved[0].contains(".."), "{saved:?}");
    assert_eq!(std::fs::read(&saved[0]).unwrap(), [0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a]);
    let with_file = mails.iter().find(|m| m.contains("Here it is.")).expect("the message tool's mail");
    assert!(with_file.contains("filename=\"report.csv\"") || with_file.contains("filename=report.csv"), "{with_file}");
    assert!(with_file.contains("In-Reply-To: <att@example.org>"), "{with_file}");
    drop(daemon);
}

fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.path().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path().display().to_string());
        }
    }
    out
}

/// Wait until the server has `n` mails, every one marked seen (bramble decided about each).
async fn all_seen(s: &Setup, n: usize) -> bool {
    for _ in 0..120 {
        let seen = s.imap.seen().await;
        if seen.len() >= n && seen.iter().all(|(_, seen)| *seen) {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    false
}

#[tokio::test]
async fn a_vouched_stranger_pairs_by_mail_a_forged_one_cannot_and_revoking_cuts_them_off() {
    use crate::pairing::{code_of, pair_cli};
    let s = setup("imaps", "").await;
    s.llm.push(Reply::text("hello bob"));
    let vouched = "Authentication-Results: mx.home.example; dkim=pass header.d=example.org\r\n";
    let daemon = s.daemon();
    assert!(daemon.wait_log("IMAP connected", 30).await, "{}", daemon.log());
    // An expired code pairs nobody.
    let (ok, out) = pair_cli(&s.home, &["--channel", "email"]);
    assert!(ok && out.contains("mail bot@home.example"), "{out}");
    let expired = code_of(&out);
    let file = s.home.state.join("email-pair-code.json");
    let mut pending: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    pending["expires"] = "2020-01-01T00:00:00Z".into();
    std::fs::write(&file, serde_json::to_vec(&pending).unwrap()).unwrap();
    s.imap.deliver(&mail(vouched, "erin@example.org", "p0@example.org", &format!("/pair {expired}"), "", "")).await;
    let answers = s.smtp.wait_for(1).await;
    assert!(answers[0].contains("To: erin@example.org") && answers[0].contains("There is no valid pairing code"));

    let (ok, out) = pair_cli(&s.home, &["--channel", "email"]);
    assert!(ok, "{out}");
    let code = code_of(&out);
    let pair = format!("/pair {code}");
    for m in [
        // A forged From with the right code: no verdict, so no pairing and no answer.
        mail("", "bob@example.org", "p1@evil.example", &pair, "", ""),
        // A wrong code, from a sender the server vouched for.
        mail(vouched, "dave@example.org", "p2@example.org", "pair ABCD-EFGH", "", ""),
        // Bob, vouched for, with the code as the first line.
        mail(vouched, "Bob@Example.org", "p3@example.org", "let me in", &format!("{pair}\n\nthanks"), ""),
        // Carol reuses it.
        mail(vouched, "carol@example.org", "p4@example.org", &pair, "", ""),
        mail(vouched, "bob@example.org", "p5@example.org", "hello", "hi, I am bob", ""),
    ] {
        s.imap.deliver(&m).await;
    }
    let answers = s.smtp.wait_for(5).await;
    assert_eq!(answers.len(), 5, "{}", daemon.log());
    let to = |i: usize, who: &str, text: &str| {
        assert!(answers[i].contains(&format!("To: {who}")) && answers[i].contains(text), "{i}: {}", answers[i]);
    };
    to(1, "dave@example.org", "That code is not right (4 tries left");
    to(2, "bob@example.org", "Paired: you can write to me now.");
    assert!(answers[2].contains("In-Reply-To: <p3@example.org>"), "{}", answers[2]);
    to(3, "carol@example.org", "There is no valid pairing code");
    to(4, "bob@example.org", "hello bob");
    let (ok, out) = pair_cli(&s.home, &["--channel", "email", "--list"]);
    assert!(ok && out.contains("bob@example.org") && !out.contains("carol"), "{out}");

    // Revoked: bob's next mail is a stranger's again.
    let (ok, out) = pair_cli(&s.home, &["--channel", "email", "--revoke", "BOB@example.org"]);
    assert!(ok && out.contains("revoked"), "{out}");
    s.imap.deliver(&mail(vouched, "bob@example.org", "p6@example.org", "again", "still there?", "")).await;
    assert!(all_seen(&s, 7).await, "{}", daemon.log());
    let asked = asked(&s.llm);
    assert_eq!(asked.len(), 1, "only the paired mail reached the model: {asked:?}");
    assert!(asked[0].contains("hi, I am bob"), "{asked:?}");
    let log = daemon.log();
    assert!(!log.contains(&code), "the code is not logged");
    drop(daemon);
    assert_eq!(s.smtp.mails().len(), 5, "nobody else was answered");
}
