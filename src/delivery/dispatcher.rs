//! The two tasks between producers and channels: [`pump_outbound`] moves the
//! agent's messages from the bus into the outbox, [`run_outbox`] delivers what
//! is due and records each attempt.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use super::outbox::{self, Attempt, Outbox};
use super::{Channels, Report};
use crate::bus::OutboundMessage;

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
        // Outcomes from earlier passes that could not be written yet.
        unrecorded.retain(|id, attempt| match outbox.record(*id, attempt.clone(), Timestamp::now()) {
            Ok(()) => false,
            Err(e) => {
                tracing::error!("{e}");
                write_failed = true;
                true
            }
        });
        let due = outbox.due(Timestamp::now()).unwrap_or_else(|e| {
            tracing::error!("{e}");
            write_failed = true;
            Vec::new()
        });
        for entry in due {
            if unrecorded.contains_key(&entry.id) {
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
                .deliver(Report { target: &entry.target, text: &entry.text, source: &entry.source })
                .await
            {
                Ok(()) => Attempt::Delivered,
                Err(e) if e.retryable => {
                    tracing::warn!(target = %entry.target, attempt = entry.attempts + 1, error = %e, "delivery failed; will retry");
                    Attempt::Retry(e.message)
                }
                Err(e) => {
                    tracing::error!(target = %entry.target, error = %e, "delivery refused; report dropped");
                    Attempt::Drop(e.message)
                }
            };
            if let Err(e) = outbox.record(entry.id, attempt.clone(), Timestamp::now()) {
                tracing::error!("{e}");
                unrecorded.insert(entry.id, attempt);
                write_failed = true;
            }
        }
        let mut sleep = match outbox.next_due_for(|t| channels.for_target(t).is_some()) {
            Ok(Some(t)) => Duration::try_from(t.duration_since(Timestamp::now())).unwrap_or(Duration::ZERO),
            _ => Duration::from_secs(3600),
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

/// Move messages the agent sends (answers, the `message` tool) into the outbox.
/// On cancel, what is already queued is still written before returning.
pub async fn pump_outbound(
    mut rx: mpsc::Receiver<OutboundMessage>,
    outbox: Outbox,
    wake: Arc<Notify>,
    cancel: CancellationToken,
) {
    let save = |msg: OutboundMessage| match outbox.enqueue(msg.target, &msg.text, "agent") {
        Ok(_) => wake.notify_one(),
        Err(e) => tracing::error!("a message could not be queued: {e}"),
    };
    loop {
        tokio::select! {
            biased;
            m = rx.recv() => match m { Some(m) => save(m), None => return },
            _ = cancel.cancelled() => break,
        }
    }
    while let Ok(m) = rx.try_recv() {
        save(m);
    }
}
