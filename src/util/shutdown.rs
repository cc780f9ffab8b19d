//! The daemon's two-phase shutdown, as one value every long-running loop is
//! handed (mini-redis's `Shutdown`, with a second phase).
//!
//! - **stop**: take no new work (no new poll, no new message, no new job);
//!   what is running goes on.
//! - **abort**: cancel the work in flight too. It comes after the grace
//!   period for turns (`daemon::SHUTDOWN_GRACE`), or at once when the daemon
//!   stops for a fault.
//!
//! An abort implies a stop (the stop token is a child of the abort token), so
//! a loop that waits on `stop` alone also ends when the daemon aborts. Cheap
//! to clone: two `CancellationToken`s.

use tokio_util::sync::CancellationToken;

/// The two phases of a shutdown; see the module docs.
#[derive(Debug, Clone)]
pub struct Shutdown {
    stop: CancellationToken,
    abort: CancellationToken,
}

impl Default for Shutdown {
    fn default() -> Shutdown {
        Shutdown::new()
    }
}

impl Shutdown {
    /// Neither phase has begun.
    pub fn new() -> Shutdown {
        let abort = CancellationToken::new();
        Shutdown { stop: abort.child_token(), abort }
    }

    /// Begin the first phase: no new work is taken.
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// Begin the second phase: work in flight is cancelled (and no new work taken).
    pub fn abort(&self) {
        self.abort.cancel();
    }

    /// Whether new work must not be taken.
    pub fn is_stopping(&self) -> bool {
        self.stop.is_cancelled()
    }

    /// Whether work in flight is being cancelled.
    pub fn is_aborting(&self) -> bool {
        self.abort.is_cancelled()
    }

    /// Wait until no new work may be taken.
    pub async fn stopped(&self) {
        self.stop.cancelled().await
    }

    /// Wait until work in flight is cancelled.
    pub async fn aborted(&self) {
        self.abort.cancelled().await
    }

    /// The stop phase as a token, for loops written against one.
    pub fn stop_token(&self) -> &CancellationToken {
        &self.stop
    }

    /// The abort phase as a token, for work that a turn or a job cancels with.
    pub fn abort_token(&self) -> &CancellationToken {
        &self.abort
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_leaves_work_in_flight_alone() {
        let s = Shutdown::new();
        let theirs = s.clone();
        s.stop();
        assert!(theirs.is_stopping(), "a clone sees the stop");
        assert!(!theirs.is_aborting(), "stop does not cancel work in flight");
    }

    #[tokio::test]
    async fn abort_implies_stop() {
        let s = Shutdown::new();
        s.abort();
        assert!(s.is_stopping());
        s.stopped().await;
        s.aborted().await;
    }
}
