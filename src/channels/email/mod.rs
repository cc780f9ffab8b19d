//! The email channel: mail in by IMAP, reports out by SMTP submission.
//!
//! - [`crate::clients::imap`], [`crate::clients::smtp`]: the wire.
//! - [`trust`]: who is served (allow-list **and** the receiving server's
//!   `Authentication-Results`), loops and auto-replies.
//! - [`inbound`]: a fetched mail → the agent's message (text, files, thread).
//! - [`state`]: the UIDVALIDITY + UID mark and the threads, across restarts.
//! - [`digest`]: `email:<address>?digest=HH:MM`, a day's reports in one mail.
//!
//! ## Reading
//!
//! One connection selects `[email] folder` and asks for unseen mail above
//! the mark; each is fetched (`BODY.PEEK[]`, nothing set by reading),
//! checked, handed to the bus, then marked `\Seen`, and the mark saved when
//! it moved. A crash before `\Seen` hands the mail over again after the
//! restart, never loses it; both guards (flag and mark) must fail for a
//! mail to be handled twice. Then IDLE (RFC 2177), re-issued every 25
//! minutes (servers may end one at 30); a server without IDLE is polled
//! every `poll_every`. Every failure reconnects with backoff (1 s to 5 min).
//! Mail over `max_mail_mb` is not fetched; a refused mail (a stranger, a
//! forged sender, our own, an auto-reply, malformed MIME) is marked seen and
//! logged once per sender and reason, and never answered.
//!
//! ## Sending
//!
//! `email:<address>` through the outbox: an answer goes into the sender's
//! last thread (`In-Reply-To`, `References`, `Re:`); a job's report gets a
//! new thread whose subject names the job and `Auto-Submitted:
//! auto-generated`. Plain text with a simple HTML part; the report's files
//! attached up to `max_attach_mb` in all (named in the text beyond). A
//! refusal by the server (5xx) is counted against the report, anything else
//! retried. Digest targets are collected on disk ([`digest`]).

pub mod check;
pub mod digest;
pub mod inbound;
mod pair;
pub mod state;
pub mod trust;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use crate::bus::{Channel as BusChannel, Conversation, EmailTarget, InboundMessage, Principal, ReportSource, Target};
use crate::clients::imap::{Imap, ImapError};
use crate::clients::smtp::{self, Mail, Smtp, SmtpError};
use crate::config::email::{EmailConfig, MailServer};
use crate::config::Secret;
use crate::delivery::{Capabilities, Channel, DeliveryError, Report};
use crate::policy::pairing::{PairChannel, PairedCache};
use crate::util::timer::Backoff;
use crate::util::BoxFuture;
use crate::workspace::Workspace;
use inbound::Read;
use state::{MarkFile, Threads};

/// IDLE is ended and issued again this often (servers may drop one after 30 minutes).
pub const IDLE_FOR: Duration = Duration::from_secs(25 * 60);
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// Refusals remembered for "logged once"; cleared when full.
const MAX_LOGGED: usize = 1024;

/// Why the email channel cannot start.
#[derive(Debug, thiserror::Error)]
pub enum EmailError {
    #[error(transparent)]
    Smtp(#[from] SmtpError),
}

/// The email channel, configured: the IMAP side (if any) and the SMTP side share its state.
pub struct Email {
    shared: Arc<Shared>,
    imap: Option<ImapSide>,
}

struct ImapSide {
    server: MailServer,
    folder: String,
    poll_every: Duration,
}

/// What the reader, the sender and the digest share.
struct Shared {
    me: String,
    login: String,
    password: Option<Secret>,
    smtp: Option<Smtp>,
    rules: trust::Rules,
    state_dir: PathBuf,
    workspace: PathBuf,
    threads: Threads,
    digests: digest::Store,
    digest_wake: Notify,
    tz: jiff::tz::TimeZone,
    max_mail: usize,
    max_attach: u64,
}

impl Email {
    /// `None` when `[email]` is not configured.
    pub fn from_config(
        cfg: &EmailConfig,
        state_dir: &Path,
        workspace: &Path,
        tz: jiff::tz::TimeZone,
    ) -> Result<Option<Email>, EmailError> {
        let (Some(me), Some(login)) = (cfg.address.as_ref(), cfg.login()) else { return Ok(None) };
        if !cfg.enabled() {
            return Ok(None);
        }
        let password = cfg.password();
        let smtp = match &cfg.smtp {
            Some(s) => Some(Smtp::new(s, &login, password.as_ref())?),
            None => None,
        };
        let shared = Shared {
            me: me.0.to_ascii_lowercase(),
            login,
            password,
            smtp,
            rules: trust::Rules {
                me: me.0.to_ascii_lowercase(),
                allow: cfg.allow_from.iter().map(|a| a.0.to_ascii_lowercase()).collect(),
                authserv_id: cfg.authserv_id.as_ref().map(|s| s.to_ascii_lowercase()),
                paired: Some(PairedCache::new(state_dir, PairChannel::Email)),
            },
            state_dir: state_dir.to_path_buf(),
            workspace: workspace.to_path_buf(),
            threads: Threads::new(state_dir),
            digests: digest::Store::new(state_dir),
            digest_wake: Notify::new(),
            tz,
            max_mail: usize::try_from(cfg.max_mail_mb.saturating_mul(1024 * 1024)).unwrap_or(usize::MAX),
            max_attach: cfg.max_attach_mb.saturating_mul(1024 * 1024),
        };
        let imap = cfg.imap.clone().map(|server| ImapSide {
            server,
            folder: cfg.folder.clone(),
            poll_every: cfg.poll_every.get().max(Duration::from_secs(10)),
        });
        Ok(Some(Email { shared: Arc::new(shared), imap }))
    }

    /// The delivery side, for the outbox.
    pub fn channel(&self) -> Arc<dyn Channel> {
        Arc::new(EmailChannel { shared: self.shared.clone() })
    }

    /// The loops: the reader (with IMAP) and the digest sender.
    pub fn poller(self, inbound: mpsc::Sender<InboundMessage>) -> EmailPoller {
        EmailPoller { email: self, inbound }
    }
}

/// The daemon's email loops ([`EmailPoller::run`]): reading the folder, and
/// sending the digests when due.
pub struct EmailPoller {
    email: Email,
    inbound: mpsc::Sender<InboundMessage>,
}

impl EmailPoller {
    pub async fn run(self, shutdown: crate::util::shutdown::Shutdown) {
        let stop = shutdown.stop_token().clone();
        let shared = self.email.shared.clone();
        let reader = async {
            if let Some(side) = self.email.imap {
                let r = Reader {
                    shared: shared.clone(),
                    side,
                    inbound: self.inbound,
                    stop: stop.clone(),
                    logged: HashSet::new(),
                    pair_tries: HashMap::new(),
                };
                r.run().await;
            }
        };
        tokio::join!(reader, digests(shared.clone(), stop.clone()));
    }
}

/// The IMAP reader.
struct Reader {
    shared: Arc<Shared>,
    side: ImapSide,
    inbound: mpsc::Sender<InboundMessage>,
    stop: CancellationToken,
    /// (sender, reason) pairs already logged.
    logged: HashSet<(String, String)>,
    /// The last `/pair` try per sender (one per [`crate::policy::pairing::TRY_GAP`]).
    pair_tries: HashMap<String, std::time::Instant>,
}

/// Why a session with the server ended.
enum End {
    Stopped,
    Failed(ImapError),
}

impl Reader {
    async fn run(mut self) {
        let mut backoff = Backoff::new(MAX_BACKOFF);
        let marks = MarkFile::new(&self.shared.state_dir);
        let stop = self.stop.clone();
        loop {
            let end = tokio::select! {
                biased;
                _ = stop.cancelled() => End::Stopped,
                end = self.session(&marks, &mut backoff) => end,
            };
            let e = match end {
                End::Stopped => return,
                End::Failed(e) => e,
            };
            let wait = backoff.next_wait();
            if e.is_login() {
                tracing::error!(retry_in = ?wait, "{e}");
            } else {
                tracing::warn!(error = %e, retry_in = ?wait, "IMAP failed; reconnecting");
            }
            if sleep_or_stop(wait, &self.stop).await {
                return;
            }
        }
    }

    /// One connection: log in, select, read what is new, wait, read again.
    async fn session(&mut self, marks: &MarkFile, backoff: &mut Backoff) -> End {
        let Some(password) = self.shared.password.clone() else {
            return End::Failed(ImapError::Login {
                user: self.shared.login.clone(),
                text: "no password: [email] password_env names no set variable".into(),
            });
        };
        let mut imap = match Imap::connect(&self.side.server, &self.shared.login, &password, self.shared.max_mail).await
        {
            Ok(i) => i,
            Err(e) => return End::Failed(e),
        };
        let folder = match imap.select(&self.side.folder).await {
            Ok(f) => f,
            Err(e) => return End::Failed(e),
        };
        let idle = imap.has("IDLE");
        tracing::info!(server = %self.side.server, folder = %self.side.folder, idle, "IMAP connected");
        backoff.reset();
        let mut mark = marks.load();
        if mark.uid_validity != folder.uid_validity {
            if mark.uid_validity != 0 {
                tracing::warn!("the IMAP folder's UIDVALIDITY changed (re-created?): unseen mail in it is read again");
            }
            mark = state::Mark { uid_validity: folder.uid_validity, last_uid: 0 };
        }
        loop {
            if let Err(e) = self.read_new(&mut imap, &mut mark, marks).await {
                return e;
            }
            let waited = if idle {
                imap.idle(IDLE_FOR).await.map(drop)
            } else {
                tokio::time::sleep(self.side.poll_every).await;
                imap.noop().await
            };
            if let Err(e) = waited {
                return End::Failed(e);
            }
        }
    }

    /// Handle every unseen mail above the mark.
    async fn read_new(&mut self, imap: &mut Imap, mark: &mut state::Mark, marks: &MarkFile) -> Result<(), End> {
        if let Some(paired) = self.shared.rules.paired.clone() {
            crate::util::tasks::blocking(move || paired.refresh()).await;
        }
        let uids = imap.unseen_after(mark.last_uid).await.map_err(End::Failed)?;
        for uid in uids {
            let handed = self.one(imap, uid).await?;
            if !handed {
                return Err(End::Stopped);
            }
            imap.mark_seen(uid).await.map_err(End::Failed)?;
            mark.last_uid = uid;
            let (file, m) = (marks.clone(), *mark);
            if let Err(e) = crate::util::tasks::blocking(move || file.save(m)).await {
                tracing::error!(error = %e, "cannot save the IMAP mark; the \\Seen flags still guard against reading twice");
            }
        }
        Ok(())
    }

    /// Fetch, check and hand over mail `uid`. `Ok(false)`: stopping before it was handed over.
    async fn one(&mut self, imap: &mut Imap, uid: u32) -> Result<bool, End> {
        let size = imap.size(uid).await.map_err(End::Failed)?;
        let Some(size) = size else { return Ok(true) };
        if size > self.shared.max_mail as u64 {
            tracing::warn!(uid, size, "a mail over [email] max_mail_mb was not read (marked seen)");
            return Ok(true);
        }
        let Some(raw) = imap.fetch(uid).await.map_err(End::Failed)? else { return Ok(true) };
        let msg = match inbound::read(&raw, &self.shared.rules) {
            Read::Accepted(a) => *a,
            Read::Malformed => {
                tracing::warn!(uid, "a mail that is not a mail (no headers) was ignored");
                return Ok(true);
            }
            Read::Refused { sender, why } => {
                self.log_refusal(uid, &sender, &why);
                return Ok(true);
            }
            Read::Pair { sender, code, message_id, subject } => {
                self.pair(&sender, code, message_id, &subject).await;
                return Ok(true);
            }
        };
        let msg = self.to_inbound(msg).await;
        let sent =
            tokio::select! { biased; _ = self.stop.cancelled() => false, r = self.inbound.send(msg) => r.is_ok() };
        Ok(sent)
    }

    /// The bus message for an accepted mail: files saved, thread remembered.
    async fn to_inbound(&self, a: inbound::Accepted) -> InboundMessage {
        let shared = self.shared.clone();
        let sender = a.sender.clone();
        let thread = a.thread.clone();
        let (text, attachments) = crate::util::tasks::blocking(move || {
            let mut text = a.text;
            let ws = Workspace::strict(&shared.workspace);
            let saved = inbound::save(&ws, &a.files, &mut text);
            if let Err(e) = shared.threads.set(&a.sender, a.thread) {
                tracing::warn!(error = %e, "cannot remember the mail's thread; the answer starts a new one");
            }
            (text, saved)
        })
        .await;
        tracing::info!(from = %sender, files = attachments.len(), "mail accepted");
        let session = format!("email:{sender}:{}", short_hash(thread.root()));
        InboundMessage {
            conversation: Conversation::new(BusChannel::Email, sender.clone(), session),
            sender: sender.clone(),
            principal: Principal::Email(sender.clone()),
            text,
            reply_to: Target::Email(EmailTarget { address: sender, digest: None }),
            attachments,
        }
    }

    /// Log a refused mail once per sender and reason.
    fn log_refusal(&mut self, uid: u32, sender: &str, why: &trust::Refusal) {
        if self.logged.len() >= MAX_LOGGED {
            self.logged.clear();
        }
        let reason = why.to_string();
        if self.logged.insert((sender.to_ascii_lowercase(), reason.clone())) {
            tracing::warn!(uid, from = %crate::util::text::escape_line(sender), "ignoring a mail: {reason}");
        }
    }
}

/// A short, stable name for a thread's root id.
fn short_hash(text: &str) -> String {
    let h = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    format!("{h:016x}")
}

/// Send the digests when due, until stopped.
async fn digests(shared: Arc<Shared>, stop: CancellationToken) {
    let mut backoff = Backoff::new(Duration::from_secs(3600));
    loop {
        let s = shared.clone();
        let (due, next) = crate::util::tasks::blocking(move || s.digests.due(jiff::Timestamp::now(), &s.tz)).await;
        let mut failed = false;
        for d in due {
            match send_digest(&shared, &d).await {
                Ok(()) => {
                    let s = shared.clone();
                    crate::util::tasks::blocking(move || s.digests.sent(&d)).await;
                }
                Err(e) => {
                    tracing::warn!(to = %d.target.address, error = %e, "the daily digest was not sent; trying again");
                    failed = true;
                }
            }
        }
        let wait = match failed {
            true => backoff.next_wait(),
            false => {
                backoff.reset();
                digest::wait_until(next, jiff::Timestamp::now())
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = shared.digest_wake.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

async fn send_digest(shared: &Shared, due: &digest::Due) -> Result<(), SmtpError> {
    let Some(smtp) = &shared.smtp else { return Err(SmtpError::Unavailable("[email] smtp is not set".into())) };
    let (subject, text) = digest::compose(due, &shared.tz);
    let mail = Mail {
        from: shared.me.clone(),
        to: due.target.address.clone(),
        subject,
        message_id: new_message_id(&shared.me),
        html: smtp::simple_html(&text),
        text,
        auto: true,
        ..Mail::default()
    };
    smtp.send(&mail).await
}

/// `<bramble.<time>.<pid>.<n>@<our domain>>`: recognisable when it comes back ([`trust::is_ours`]).
fn new_message_id(me: &str) -> String {
    let domain = me.rsplit_once('@').map(|(_, d)| d).unwrap_or("localhost");
    let now = jiff::Timestamp::now().as_nanosecond();
    format!("<{}{now:x}.{:x}.{}@{domain}>", trust::ID_PREFIX, std::process::id(), crate::util::unique::next())
}

/// Sleep `d` unless stopped first; `true`: stopped.
async fn sleep_or_stop(d: Duration, stop: &CancellationToken) -> bool {
    tokio::select! { _ = stop.cancelled() => true, _ = tokio::time::sleep(d) => false }
}

/// Delivery to `email:` targets.
struct EmailChannel {
    shared: Arc<Shared>,
}

impl Channel for EmailChannel {
    fn name(&self) -> &'static str {
        "email"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { files: true, ..Capabilities::TEXT }
    }

    fn deliver<'a>(&'a self, report: Report<'a>) -> BoxFuture<'a, Result<(), DeliveryError>> {
        Box::pin(async move {
            let Target::Email(target) = report.target else {
                return Err(DeliveryError::permanent(format!("{} is not an email target", report.target)));
            };
            if target.digest.is_some() {
                return self.collect(target, report).await;
            }
            let Some(smtp) = &self.shared.smtp else {
                return Err(DeliveryError::retryable("[email] smtp is not set: mail cannot be sent"));
            };
            let mail = self.mail(target, report).await;
            match smtp.send(&mail).await {
                Ok(()) => Ok(()),
                Err(e @ SmtpError::Refused(_)) => Err(DeliveryError::suspect(e.to_string())),
                Err(e @ SmtpError::Build(_)) => Err(DeliveryError::permanent(e.to_string())),
                Err(e @ SmtpError::Unavailable(_)) => Err(DeliveryError::retryable(e.to_string())),
            }
        })
    }
}

impl EmailChannel {
    /// A digest target's report: on disk until the digest goes.
    async fn collect(&self, target: &EmailTarget, report: Report<'_>) -> Result<(), DeliveryError> {
        let entry = digest::Entry {
            target: Target::Email(target.clone()),
            at: jiff::Timestamp::now().as_second(),
            source: report.source.to_string(),
            text: report.text.to_string(),
            attach: report.attach.to_vec(),
        };
        let s = self.shared.clone();
        crate::util::tasks::blocking(move || s.digests.add(&entry))
            .await
            .map_err(|e| DeliveryError::retryable(format!("cannot keep the report for the digest: {e}")))?;
        self.shared.digest_wake.notify_one();
        Ok(())
    }

    /// The mail for one report: threaded for an answer, a new subject for a job's report.
    async fn mail(&self, target: &EmailTarget, report: Report<'_>) -> Mail {
        let s = self.shared.clone();
        let to = target.address.clone();
        let answer = matches!(report.source, ReportSource::Agent);
        let (thread, files, named) = {
            let attach = report.attach.to_vec();
            crate::util::tasks::blocking(move || {
                let thread = if answer { s.threads.get(&to) } else { None };
                let (files, named) = read_files(&Workspace::strict(&s.workspace), &attach, s.max_attach);
                (thread, files, named)
            })
            .await
        };
        let mut text = report.text.to_string();
        if !named.is_empty() {
            text.push_str(&format!("\n\n(files in the workspace, too large to attach: {})", named.join(", ")));
        }
        let subject = match (&thread, report.source) {
            (Some(t), _) => t.reply_subject(),
            (None, ReportSource::Job(name)) => format!("bramble: {name}"),
            (None, ReportSource::Trigger(label)) => format!("bramble: {label}"),
            (None, ReportSource::Heartbeat) => "bramble: heartbeat".into(),
            (None, ReportSource::Alert) => "bramble: alert".into(),
            (None, _) => first_line(&text),
        };
        Mail {
            from: self.shared.me.clone(),
            to: target.address.clone(),
            subject,
            message_id: new_message_id(&self.shared.me),
            in_reply_to: thread.as_ref().map(|t| t.message_id.clone()),
            references: thread.map(|t| t.references).unwrap_or_default(),
            html: smtp::simple_html(&text),
            text,
            files,
            auto: !answer,
        }
    }
}

/// The report's files up to `max` bytes in all; the names of those left out.
fn read_files(ws: &Workspace, attach: &[String], max: u64) -> (Vec<smtp::File>, Vec<String>) {
    let (mut files, mut named, mut total) = (Vec::new(), Vec::new(), 0u64);
    for path in attach {
        match ws.read_all(path, max.saturating_sub(total).saturating_add(1)) {
            Ok(bytes) if total + bytes.len() as u64 <= max => {
                total += bytes.len() as u64;
                let name = path.rsplit('/').next().unwrap_or(path).to_string();
                files.push(smtp::File { mime: crate::channels::inbox::mime_of(&name).into(), name, bytes });
            }
            Ok(_) => named.push(path.clone()),
            Err(e) => {
                tracing::warn!(path, error = %e, "a report's file cannot be attached");
                named.push(path.clone());
            }
        }
    }
    (files, named)
}

/// A subject from the text's first line (at most 70 characters).
fn first_line(text: &str) -> String {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("a message from bramble");
    let mut s: String = line.chars().take(70).collect();
    if line.chars().count() > 70 {
        s.push('…');
    }
    s
}
