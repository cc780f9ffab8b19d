//! [`TurnLimit`]: how many model turns one source on the broker may start.
//!
//! Whoever can publish to `<prefix>/in` (or to a trigger's topic) spends
//! bramble's model budget: 200 messages a second are 200 turns. Each source
//! (`<prefix>/in`, the message triggers together) gets a token bucket of
//! `[mqtt] turns_per_minute` refilled continuously, holding at most
//! `turn_burst`. A message that finds the bucket empty is dropped before it
//! reaches the agent. Nothing is published back for it: a "rate limited"
//! answer to the sender's `reply_to` would be one publish per message again,
//! to a topic the sender chose. The drops are logged once when they start and
//! counted in one line when turns are allowed again, so a flood does not
//! flood the journal either.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

pub use crate::clients::mqtt::TurnRate;

/// One source's bucket. Never waits: it runs in the MQTT polling task.
pub struct TurnLimit {
    rate: TurnRate,
    /// What the limit is for, in log lines (`<prefix>/in`, `message triggers`).
    what: String,
    state: Mutex<Bucket>,
}

struct Bucket {
    tokens: f64,
    at: Instant,
    dropped: u64,
}

impl TurnLimit {
    pub fn new(rate: TurnRate, what: impl Into<String>) -> TurnLimit {
        let bucket = Bucket { tokens: f64::from(rate.burst.max(1)), at: Instant::now(), dropped: 0 };
        TurnLimit { rate, what: what.into(), state: Mutex::new(bucket) }
    }

    /// Whether one more turn may start now (a token is taken if so).
    pub fn allow(&self) -> bool {
        if self.rate.per_minute == 0 {
            return true;
        }
        let mut b = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let per_sec = f64::from(self.rate.per_minute) / 60.0;
        let full = f64::from(self.rate.burst.max(1));
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * per_sec).min(full);
        b.at = now;
        if b.tokens < 1.0 {
            b.dropped += 1;
            if b.dropped == 1 {
                let wait = Duration::from_secs_f64((1.0 - b.tokens) / per_sec);
                tracing::warn!(
                    source = %self.what,
                    "more than {} model turns a minute (burst {}) from {}: messages are dropped for about {} s \
                     ([mqtt] turns_per_minute, turn_burst)",
                    self.rate.per_minute,
                    self.rate.burst,
                    self.what,
                    wait.as_secs().max(1)
                );
            }
            return false;
        }
        b.tokens -= 1.0;
        if b.dropped > 0 {
            tracing::warn!(source = %self.what, dropped = b.dropped, "{} message(s) from {} were dropped by the turn rate limit", b.dropped, self.what);
            b.dropped = 0;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_then_the_rate() {
        let l = TurnLimit::new(TurnRate { per_minute: 20, burst: 5 }, "t");
        assert_eq!((0..200).filter(|_| l.allow()).count(), 5, "the burst");
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!((0..200).filter(|_| l.allow()).count(), 1, "one every 3 s");
        tokio::time::advance(Duration::from_secs(600)).await;
        assert_eq!((0..200).filter(|_| l.allow()).count(), 5, "never more than the burst");
        let off = TurnLimit::new(TurnRate { per_minute: 0, burst: 0 }, "t");
        assert!((0..1000).all(|_| off.allow()));
    }
}
