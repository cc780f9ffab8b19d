//! Work in flight, counted so that a shutdown or reload can give it a grace
//! period, and the shutdown signal that tells a cut-off turn it was not a `/stop`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Counts work in flight so shutdown can give it a grace period: every turn
/// enters it, and the daemon's job runner adds reminders and exec jobs.
///
/// It also carries the shutdown signal: [`InFlight::begin_shutdown`] (called by
/// the daemon just before it cancels work in flight) tells turns that their
/// cancellation is a shutdown, not a `/stop` — they then leave the session as
/// it was and keep the user's message pending — and stops sub-agents.
#[derive(Clone, Default)]
pub struct InFlight {
    counter: Arc<Counter>,
    shutdown: CancellationToken,
}

/// The count, and who waits for it to reach zero.
#[derive(Default)]
struct Counter {
    running: AtomicUsize,
    changed: Notify,
}

/// Held while one piece of work runs.
pub struct InFlightGuard(Arc<Counter>);

impl InFlight {
    pub fn enter(&self) -> InFlightGuard {
        self.counter.running.fetch_add(1, Ordering::SeqCst);
        InFlightGuard(Arc::clone(&self.counter))
    }
    pub fn count(&self) -> usize {
        self.counter.running.load(Ordering::SeqCst)
    }
    /// Work is about to be cancelled because the process stops or reloads.
    pub fn begin_shutdown(&self) {
        self.shutdown.cancel();
    }
    pub fn is_shutting_down(&self) -> bool {
        self.shutdown.is_cancelled()
    }
    /// Cancelled by [`begin_shutdown`](Self::begin_shutdown).
    pub fn shutdown_token(&self) -> &CancellationToken {
        &self.shutdown
    }
    /// Wait until nothing is in flight, or `limit` passes. Returns whether it drained.
    pub async fn drained(&self, limit: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.counter.changed.notified();
            if self.count() == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.count() == 0;
            }
        }
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }
}
