//! Long sleeps that wake the process once.
//!
//! tokio's timer wheel is hierarchical: a 60 s sleep sits in a level with
//! 4.1 s slots and is cascaded down through a 64 ms level as its deadline
//! nears, so the thread wakes up to three times for one sleep. An idle board
//! should sleep, so the daemon's long idle sleeps (scheduler, heartbeat,
//! outbox) ask the kernel instead: a one-shot `timerfd` on `CLOCK_MONOTONIC`
//! (the clock behind tokio's `Instant`), registered with tokio's reactor,
//! wakes the thread exactly once.
//!
//! Short sleeps use tokio's timer, and so do the library's unit tests, which
//! pause tokio's clock (a kernel timer would not be paused).

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::time::Duration;

use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use tokio::io::unix::AsyncFd;

/// Reconnect delays for a link that failed: 1 s, 2 s, 4 s, … up to `max`.
/// Shared by the channels (Telegram polling, the MQTT connection).
#[derive(Debug, Clone)]
pub struct Backoff {
    attempts: u32,
    max: Duration,
}

impl Backoff {
    pub fn new(max: Duration) -> Backoff {
        Backoff { attempts: 0, max }
    }

    /// The next wait; each call doubles it.
    pub fn next_wait(&mut self) -> Duration {
        let d = Duration::from_secs(1u64 << self.attempts.min(20)).min(self.max);
        self.attempts = self.attempts.saturating_add(1);
        d
    }

    /// The link works again: the next failure waits 1 s.
    pub fn reset(&mut self) {
        self.attempts = 0;
    }
}

/// Sleeps at least this long go to the kernel.
const LONG: Duration = Duration::from_secs(5);

/// Sleep for `d`, waking once.
pub async fn sleep(d: Duration) {
    if d < LONG || cfg!(test) {
        return tokio::time::sleep(d).await;
    }
    if let Err(e) = kernel_sleep(d).await {
        tracing::debug!("timerfd unavailable ({e}); using tokio's timer");
        tokio::time::sleep(d).await;
    }
}

async fn kernel_sleep(d: Duration) -> std::io::Result<()> {
    let timer = TimerFd::new(ClockId::CLOCK_MONOTONIC, TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC)?;
    timer.set(Expiration::OneShot(TimeSpec::from_duration(d)), TimerSetTimeFlags::empty())?;
    // SAFETY: `Timer` owns the timerfd and neither closes nor replaces it while
    // the AsyncFd exists; `as_raw_fd` always returns that descriptor.
    let fd = unsafe { AsyncFd::register(Timer(timer)) }?;
    loop {
        let mut ready = fd.readable().await?;
        let mut expirations = [0u8; 8];
        match ready.try_io(|t| nix::unistd::read(t.get_ref().0.as_fd(), &mut expirations).map_err(Into::into)) {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
}

struct Timer(TimerFd);

impl AsRawFd for Timer {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_kernel_timer_sleeps_the_requested_time() {
        let t0 = std::time::Instant::now();
        kernel_sleep(Duration::from_millis(120)).await.unwrap();
        let slept = t0.elapsed();
        assert!(slept >= Duration::from_millis(120), "{slept:?}");
        assert!(slept < Duration::from_secs(5), "{slept:?}");
    }
}
