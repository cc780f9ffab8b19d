//! The two tasks between producers and channels: [`OutboundPump`] moves the
//! agent's messages from the bus into the outbox, [`OutboxSender`] delivers
//! what is due and records the attempts, one write per pass.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use super::outbox::{self, Attempt, Outbox};
use super::{Channels, Report};
use crate::bus::OutboundMessage;
use crate::util::tasks::blocking;

/// At most this many messages go into one outbox write.
const MAX_BATCH: usize = 64;

/// The outbox's delivery loop ([`run_outbox`]); it runs until the abort, so
/// reports still go out during the shutdown's grace period. Cheap to clone:
/// the daemon makes it again if it ever ends.
#[derive(Clone)]
pub struct OutboxSender {
    pub reports: super::Reports,
    pub channels: Channels,
    /// Set when the state-dir watcher is unavailable: poll at least every minute.
    pub poll: Arc<std::sync::atomic::AtomicBool>,
}

impl OutboxSender {
    pub async fn run(self, shutdown: crate::util::shutdown::Shutdown) {
        let (outbox, wake) = (self.reports.outbox().clone(), self.reports.wake().clone());
        run_outbox(outbox, self.channels, wake, self.poll, shutdown.abort_token().clone()).await
    }
}

/// Moves the agent's messages from the bus into the outbox ([`pump_outbound`])
/// until the abort; what is queued then is still written.
pub struct OutboundPump {
    pub outbound: mpsc::Receiver<OutboundMessage>,
    pub reports: super::Reports,
}

impl OutboundPump {
    pub async fn run(self, shutdown: crate::util::shutdown::Shutdown) {
        let (outbox, wake) = (self.reports.outbox().clone(), self.reports.wake().clone());
        pump_outbound(self.outbound, outbox, wake, shutdown.abort_token().clone()).await
    }
}

/// Deliver due outbox entries until cancelled. Wakes when `wake` is notified
/// (a new entry) or when the earliest backoff ends — not on a fixed tick.
///
/// Reports for a channel that is not configured stay in the outbox untouched
/// (no write per attempt) until a reload brings the channel. An outcome that
/// could not be written is remembered and written on the next pass, and the
/// report is not delivered again meanwhile. `poll` (set when the state-dir
/// watcher is unavailable) caps the sleep at a minute so reports queued by CLI
/// processes are still noticed.
pub async fn run_outbox(
    outbox: Outbox,
    channels: Channels,
    wake: Arc<Notify>,
    poll: Arc<std::sync::atomic::AtomicBool>,
    cancel: CancellationToken,
) {
    let mut warned: Vec<&'static str> = Vec::new();
    let mut unrecorded: HashMap<u64, Attempt> = HashMap::new();
    loop {
        let mut write_failed = false;
        // The outbox waits on the disk: read and written on a blocking thread.
        let reader = outbox.clone();
        let mut due = blocking(move || reader.due(Timestamp::now())).await.unwrap_or_else(|e| {
            tracing::error!("{e}");
            write_failed = true;
            Vec::new()
        });
        // A report the other side refused before goes after the others: if it
        // takes the connection down again, it takes nothing else with it.
        due.sort_by_key(|e| e.refusals > 0);
        // Outcomes from earlier passes that could not be written yet go into this pass's write.
        let mut outcomes: Vec<(u64, Attempt)> = unrecorded.drain().collect();
        for entry in due {
            if outcomes.iter().any(|(id, _)| *id == entry.id) {
                continue;
            }
            let Some(ch) = channels.for_target(&entry.target) else {
                let name = entry.target.channel();
                if !warned.contains(&name) {
                    warned.push(name);
                    tracing::warn!(target = %entry.target, "no `{name}` channel is configured: its reports wait in the outbox");
                }
                continue;
            };
            let attempt = match ch
                .deliver(Report {
                    target: &entry.target,
                    text: &entry.text,
                    source: &entry.source,
                    job: entry.job.as_ref(),
                    attach: &entry.attach,
                    id: entry.id,
                    created: entry.created,
                })
                .await
            {
                Ok(()) => Attempt::Delivered,
                Err(e) if e.suspect => {
                    tracing::warn!(target = %entry.target, refusals = entry.refusals + 1, error = %e, "delivery refused or the connection closed under it; will retry");
                    Attempt::Suspect(e.message)
                }
                Err(e) if e.retryable => {
                    tracing::warn!(target = %entry.target, attempt = entry.attempts + 1, error = %e, "delivery failed; will retry");
                    Attempt::Retry(e.message)
                }
                Err(e) => {
                    tracing::error!(target = %entry.target, error = %e, "delivery refused; report dropped");
                    Attempt::Drop(e.message)
                }
            };
            outcomes.push((entry.id, attempt));
        }
        if !outcomes.is_empty() {
            // One append for the pass's outcomes.
            let (writer, batch) = (outbox.clone(), outcomes.clone());
            if let Err(e) = blocking(move || writer.record_many(batch, Timestamp::now())).await {
                tracing::error!("{e}");
                unrecorded.extend(outcomes);
                write_failed = true;
            }
        }
        let reader = outbox.clone();
        let waiting = blocking(move || reader.pending()).await.unwrap_or_default();
        let next = outbox::next_attempt_at(&waiting, |t| channels.for_target(t).is_some());
        let mut sleep = match next {
            Some(t) => Duration::try_from(t.duration_since(Timestamp::now())).unwrap_or(Duration::ZERO),
            None => Duration::from_secs(3600),
        };
        if write_failed {
            // A full or failing disk: do not spin on it.
            sleep = sleep.max(outbox::backoff(1));
        }
        if poll.load(std::sync::atomic::Ordering::Relaxed) {
            sleep = sleep.min(Duration::from_secs(60));
        }
        let sleep = sleep.clamp(Duration::from_millis(50), Duration::from_secs(3600));
        tokio::select! {
            _ = crate::util::timer::sleep(sleep) => {}
            _ = wake.notified() => {}
            _ = cancel.cancelled() => return,
        }
    }
}

/// Move messages the agent sends (answers, the `message` tool) into the
/// outbox: what has arrived meanwhile goes in one append and one flush (on a
/// blocking thread), so a burst of answers shares a write. On cancel, what
/// is already queued is still written before returning.
pub async fn pump_outbound(
    mut rx: mpsc::Receiver<OutboundMessage>,
    outbox: Outbox,
    wake: Arc<Notify>,
    cancel: CancellationToken,
) {
    let save = |batch: Vec<OutboundMessage>| {
        let outbox = outbox.clone();
        let wake = wake.clone();
        async move {
            let reports = batch
                .into_iter()
                .map(|m| super::Outgoing {
                    attach: m.attach,
                    ..super::Outgoing::new(m.target, m.text, crate::bus::ReportSource::Agent)
                })
                .collect();
            let results = blocking(move || outbox.enqueue_many(reports)).await;
            if results.iter().any(Result::is_ok) {
                wake.notify_one();
            }
            for e in results.into_iter().filter_map(Result::err) {
                tracing::error!("a message could not be queued: {e}");
            }
        }
    };
    loop {
        let first = tokio::select! {
            biased;
            m = rx.recv() => match m { Some(m) => m, None => return },
            _ = cancel.cancelled() => break,
        };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(m) => batch.push(m),
                Err(_) => break,
            }
        }
        save(batch).await;
    }
    let mut batch = Vec::new();
    while let Ok(m) = rx.try_recv() {
        batch.push(m);
    }
    if !batch.is_empty() {
        save(batch).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::Target;
    use crate::delivery::{Channel, DeliveryError};
    use crate::util::BoxFuture;
    use std::sync::Mutex;

    /// Records what it was given; refuses `bad` as a broker would (suspect).
    struct Recording(Mutex<Vec<String>>);

    impl Channel for Recording {
        fn name(&self) -> &'static str {
            "log"
        }
        fn deliver<'a>(&'a self, report: Report<'a>) -> BoxFuture<'a, Result<(), DeliveryError>> {
            self.0.lock().unwrap().push(report.text.to_string());
            let bad = report.text == "bad";
            Box::pin(async move {
                if bad {
                    Err(DeliveryError::suspect("connection lost"))
                } else {
                    Ok(())
                }
            })
        }
    }

    #[tokio::test]
    async fn a_report_refused_before_goes_after_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let outbox = Outbox::new(dir.path());
        let bad = outbox.enqueue(Target::Log, "bad", "job:a").unwrap();
        outbox.record(bad, Attempt::Suspect("connection lost".into()), Timestamp::now()).unwrap();
        outbox.retry_now("log").unwrap();
        outbox.enqueue(Target::Log, "good", "job:b").unwrap();
        let ch = Arc::new(Recording(Mutex::new(Vec::new())));
        let mut channels = Channels::default();
        channels.add(ch.clone());
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run_outbox(outbox.clone(), channels, Arc::default(), Arc::default(), cancel.clone()));
        for _ in 0..200 {
            if ch.0.lock().unwrap().len() >= 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        cancel.cancel();
        task.await.unwrap();
        assert_eq!(*ch.0.lock().unwrap(), ["good", "bad"], "the older, refused report goes last");
        assert_eq!(outbox.pending().unwrap()[0].refusals, 2, "counted again");
    }
}
