//! `bramble outbox list | retry ID | drop ID`: the reports waiting to be
//! delivered, for the one that never will be (a chat that is gone, a channel
//! no longer configured). The outbox keeps every report until a channel took
//! it (at-least-once), so dropping one is the user's decision, said here and
//! kept in the outbox's record (`bramble status` shows it among the recent).
//!
//! `--json` prints an array of [`ReportJson`], stable field names.

use std::io::Write;
use std::process::ExitCode;

use serde::Serialize;

use super::cron_view::{esc, table};
use super::OutboxCommand;
use crate::config::Loaded;
use crate::delivery::outbox::{Entry, Outbox};

pub(super) fn outbox(loaded: &Loaded, cmd: OutboxCommand) -> anyhow::Result<ExitCode> {
    let outbox = Outbox::new(&loaded.paths.state_dir);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match cmd {
        OutboxCommand::List { json } => list(loaded, &outbox, json, &mut out)?,
        OutboxCommand::Retry { id } => {
            let which = pick(&id)?;
            let picked = outbox.retry_where(|e| which.is_none_or(|id| e.id == id))?;
            if picked.is_empty() {
                return not_found(&id);
            }
            for e in &picked {
                writeln!(out, "report {} to {} is due now: the running daemon tries it at once", e.id, e.target)?;
            }
        }
        OutboxCommand::Drop { id } => {
            let Some(which) = pick(&id)? else {
                anyhow::bail!("`drop` takes one report's id (`bramble outbox list`), not `all`");
            };
            let dropped = outbox.drop_where(|e| e.id == which, "by `bramble outbox drop`", jiff::Timestamp::now())?;
            if dropped.is_empty() {
                return not_found(&id);
            }
            for e in &dropped {
                writeln!(
                    out,
                    "dropped report {} to {} from {}: it is not delivered",
                    e.id,
                    e.target,
                    esc(&e.source.to_string())
                )?;
            }
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// `all` → `None`, a number → that id.
fn pick(id: &str) -> anyhow::Result<Option<u64>> {
    match id.trim() {
        "all" => Ok(None),
        n => n
            .parse::<u64>()
            .map(Some)
            .map_err(|_| anyhow::anyhow!("`{}` is not a report id: a number from `bramble outbox list`", esc(id))),
    }
}

fn not_found(id: &str) -> anyhow::Result<ExitCode> {
    eprintln!("bramble: no waiting report with id {} (`bramble outbox list` shows them)", esc(id));
    Ok(ExitCode::FAILURE)
}

/// A waiting report as `outbox list --json` prints it. Times are RFC 3339
/// in UTC. Stable: fields are added, never renamed or removed.
#[derive(Debug, Serialize)]
struct ReportJson<'a> {
    id: u64,
    /// `telegram:42`, `mqtt:home/x`, `log`, …
    target: String,
    /// What made it: `job:<name>`, `heartbeat`, `agent`, …
    source: String,
    /// The id of the job whose report it is, if one.
    job: Option<&'a str>,
    created: String,
    attempts: u32,
    /// Not tried before this time (its back-off); null: at the next pass.
    next_attempt: Option<String>,
    last_error: Option<&'a str>,
    /// Whether a channel for its target is configured (else it waits until one is).
    deliverable: bool,
    text: &'a str,
}

fn utc(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Whether the config has a channel for `target` (as `cron add` asks).
fn configured(loaded: &Loaded, target: &crate::bus::Target) -> bool {
    use crate::bus::Target;
    let c = &loaded.config;
    match target {
        Target::Telegram(_) => c.telegram.token().is_some(),
        Target::Email(_) => cfg!(feature = "email") && c.email.smtp.is_some(),
        Target::Matrix(_) => cfg!(feature = "matrix") && c.matrix.homeserver.is_some(),
        Target::Signal(_) => cfg!(feature = "signal") && c.signal.endpoint.is_some(),
        Target::Feishu(_) => cfg!(feature = "feishu") && c.feishu.app_id.is_some(),
        Target::Discord(_) => cfg!(feature = "discord") && c.discord.configured(),
        Target::Mqtt(_) => c.mqtt.url.is_some(),
        Target::HomeAssistant(_) => c.homeassistant.url.is_some(),
        Target::Webhook(name) => c.has_webhook_target(name),
        Target::Ntfy(topic) => cfg!(feature = "ntfy") && c.ntfy.publishes_to(topic),
        Target::Log | Target::Cli => true,
    }
}

fn list(loaded: &Loaded, outbox: &Outbox, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let pending: Vec<Entry> = outbox.pending()?;
    if json {
        let rows: Vec<ReportJson> = pending
            .iter()
            .map(|e| ReportJson {
                id: e.id,
                target: e.target.to_string(),
                source: e.source.to_string(),
                job: e.job.as_ref().map(|j| j.id.as_str()),
                created: utc(e.created),
                attempts: e.attempts,
                next_attempt: e.next_attempt.map(utc),
                last_error: e.last_error.as_deref(),
                deliverable: configured(loaded, &e.target),
                text: &e.text,
            })
            .collect();
        serde_json::to_writer_pretty(&mut *out, &rows)?;
        writeln!(out)?;
        return Ok(());
    }
    if pending.is_empty() {
        writeln!(out, "no reports waiting: everything was delivered")?;
        return Ok(());
    }
    let tz = loaded.config.timezone();
    let local = |t: jiff::Timestamp| t.to_zoned(tz.tz().clone()).strftime("%Y-%m-%d %H:%M %Z").to_string();
    let rows: Vec<[String; 6]> = pending
        .iter()
        .map(|e| {
            let why = match (&e.last_error, configured(loaded, &e.target)) {
                (_, false) => format!("{} is not configured: waits until it is", e.target.channel()),
                (Some(err), true) => esc(&crate::scheduler::job::truncate(err, 80)).into_owned(),
                (None, true) => "-".into(),
            };
            let next = e.next_attempt.map(local).unwrap_or_else(|| "next pass".into());
            [
                e.id.to_string(),
                local(e.created),
                esc(&e.target.to_string()).into_owned(),
                esc(&e.source.to_string()).into_owned(),
                format!("{} (next: {next})", e.attempts),
                why,
            ]
        })
        .collect();
    table(out, &["ID", "QUEUED", "TARGET", "SOURCE", "ATTEMPTS", "LAST ERROR"], &rows)?;
    writeln!(out, "(`bramble outbox retry ID` tries one now; `bramble outbox drop ID` gives one up)")?;
    Ok(())
}
