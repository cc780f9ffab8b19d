//! A sign of life: a long-running loop beats its [`Pulse`], and a watcher
//! (the daemon's dead-man, [`crate::work::alerts`]) asks how long it has been
//! silent. One atomic store per beat; nothing is written anywhere.
//!
//! Time is tokio's monotonic clock, so a wall-clock jump is not a silence and
//! tests can pause it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

/// Shared between the loop that beats and whoever watches it.
#[derive(Debug, Clone)]
pub struct Pulse {
    epoch: Instant,
    /// Milliseconds after `epoch` of the last beat.
    last: Arc<AtomicU64>,
}

impl Default for Pulse {
    fn default() -> Self {
        Pulse::new()
    }
}

impl Pulse {
    /// A pulse that beat just now.
    pub fn new() -> Pulse {
        Pulse { epoch: Instant::now(), last: Arc::new(AtomicU64::new(0)) }
    }

    /// Alive now.
    pub fn beat(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(ms, Ordering::Relaxed);
    }

    /// How long since the last beat.
    pub fn silent_for(&self) -> Duration {
        let last = Duration::from_millis(self.last.load(Ordering::Relaxed));
        self.epoch.elapsed().saturating_sub(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn silence_is_the_time_since_the_last_beat() {
        let pulse = Pulse::new();
        let watcher = pulse.clone();
        tokio::time::sleep(Duration::from_secs(90)).await;
        assert_eq!(watcher.silent_for(), Duration::from_secs(90));
        pulse.beat();
        assert_eq!(watcher.silent_for(), Duration::ZERO);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(watcher.silent_for(), Duration::from_secs(5));
    }
}
