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
//!
//! [`clock_set`] lets a loop that plans by the wall clock sleep long and still
//! hear of a clock step (NTP at boot, `date -s`) at once, instead of waking
//! now and then to compare clocks.

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

/// Sleep for `d` or until the next multiple of `grid` on the monotonic clock,
/// whichever comes first. Loops that wake on their own every so often (the
/// scheduler's backstop, the dead-man's checks) sleep to the same grid, so
/// their timers expire at the same instant and wake the board once, not once
/// each. Unit tests (paused time) sleep `d`, unaligned.
pub async fn sleep_on_grid(d: Duration, grid: Duration) {
    if cfg!(test) || grid.is_zero() {
        return sleep(d).await;
    }
    let Some(now) = monotonic_now() else { return sleep(d).await };
    let next = grid_point_at_or_after(now + Duration::from_nanos(1), grid);
    if next - now >= d || d < LONG {
        return sleep(d).await;
    }
    sleep_until(next, now).await;
}

/// Sleep at least `d`, until the first multiple of `grid` on the monotonic
/// clock at or after that. A periodic task that must not fall behind its
/// period (the MQTT keep-alive) sleeps this way to land on the grid the
/// scheduler and the dead-man wake on. Unit tests (paused time) sleep `d`.
pub async fn sleep_to_grid_after(d: Duration, grid: Duration) {
    if cfg!(test) || grid.is_zero() {
        return sleep(d).await;
    }
    let Some(now) = monotonic_now() else { return sleep(d).await };
    let at = grid_point_at_or_after(now + d, grid);
    if at - now < LONG {
        return tokio::time::sleep(at - now).await;
    }
    sleep_until(at, now).await;
}

fn monotonic_now() -> Option<Duration> {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).ok().map(Duration::from)
}

/// Sleep until `at` on the monotonic clock (read as `now`), by the kernel.
async fn sleep_until(at: Duration, now: Duration) {
    if let Err(e) =
        kernel_wait(Expiration::OneShot(TimeSpec::from_duration(at)), TimerSetTimeFlags::TFD_TIMER_ABSTIME).await
    {
        tracing::debug!("timerfd unavailable ({e}); using tokio's timer");
        tokio::time::sleep(at.saturating_sub(now)).await;
    }
}

/// The first multiple of `grid` at or after `t`.
fn grid_point_at_or_after(t: Duration, grid: Duration) -> Duration {
    let g = grid.as_nanos().max(1);
    Duration::from_nanos((t.as_nanos().div_ceil(g) * g) as u64)
}

async fn kernel_sleep(d: Duration) -> std::io::Result<()> {
    kernel_wait(Expiration::OneShot(TimeSpec::from_duration(d)), TimerSetTimeFlags::empty()).await
}

/// One expiry of a `CLOCK_MONOTONIC` timerfd armed with `when` and `flags`.
async fn kernel_wait(when: Expiration, flags: TimerSetTimeFlags) -> std::io::Result<()> {
    let timer = TimerFd::new(ClockId::CLOCK_MONOTONIC, TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC)?;
    timer.set(when, flags)?;
    expiry(timer).await
}

/// Wait until `timer` can be read: `Ok` for an expiry, `Err` for what the
/// read said instead (`ECANCELED` for a cancelled realtime timer).
async fn expiry(timer: TimerFd) -> std::io::Result<()> {
    // SAFETY: `Timer` owns the timerfd and neither closes nor replaces it while
    // the AsyncFd exists; `as_raw_fd` always returns that descriptor.
    let fd = unsafe { AsyncFd::register(Timer(timer)) }?;
    loop {
        let mut ready = fd.readable().await?;
        let mut expirations = [0u8; 8];
        match ready.try_io(|t| nix::unistd::read(t.get_ref().0.as_fd(), &mut expirations).map_err(Into::into)) {
            Ok(result) => return result.map(drop),
            Err(_would_block) => continue,
        }
    }
}

/// Resolves when the wall clock is *set* (stepped: NTP's first sync, `date
/// -s`, `timedatectl set-time`); the gradual adjustments of a synchronised
/// clock do not count. A `timerfd` on `CLOCK_REALTIME` armed for a year ahead
/// with `TFD_TIMER_CANCEL_ON_SET`: the kernel cancels it (its read fails with
/// `ECANCELED`) when the clock is set, which wakes the task once. A clock
/// set between the caller's last look at the clock and this call is not
/// seen: callers still wake now and then on their own. Never resolves where
/// the timer is not available (and in unit tests, whose clocks are fakes).
pub async fn clock_set() {
    if cfg!(test) {
        return std::future::pending().await;
    }
    if let Err(e) = kernel_clock_set().await {
        tracing::debug!("cannot watch for clock steps ({e}); relying on periodic checks");
        std::future::pending::<()>().await;
    }
}

async fn kernel_clock_set() -> std::io::Result<()> {
    use nix::time::{clock_gettime, ClockId as Clock};
    let timer = TimerFd::new(ClockId::CLOCK_REALTIME, TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC)?;
    let now = clock_gettime(Clock::CLOCK_REALTIME)?;
    let year_ahead = TimeSpec::new(now.tv_sec().saturating_add(366 * 24 * 3600), 0);
    timer.set(
        Expiration::OneShot(year_ahead),
        TimerSetTimeFlags::TFD_TIMER_ABSTIME | TimerSetTimeFlags::TFD_TIMER_CANCEL_ON_SET,
    )?;
    // ECANCELED: the clock was set. An expiry means a year passed: as good a
    // reason as any to look at the clock again.
    match expiry(timer).await {
        Err(e) if e.raw_os_error() == Some(libc::ECANCELED) => Ok(()),
        other => other,
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

    #[tokio::test]
    async fn an_absolute_kernel_timer_wakes_at_its_instant() {
        let now = Duration::from(nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap());
        let t0 = std::time::Instant::now();
        let at = Expiration::OneShot(TimeSpec::from_duration(now + Duration::from_millis(120)));
        kernel_wait(at, TimerSetTimeFlags::TFD_TIMER_ABSTIME).await.unwrap();
        let slept = t0.elapsed();
        assert!(slept >= Duration::from_millis(110), "{slept:?}");
        assert!(slept < Duration::from_secs(5), "{slept:?}");
    }

    #[test]
    fn grid_points_are_at_or_after_the_instant() {
        let s = Duration::from_secs;
        assert_eq!(grid_point_at_or_after(s(600), s(300)), s(600), "on the grid already");
        assert_eq!(grid_point_at_or_after(s(601), s(300)), s(900));
        assert_eq!(grid_point_at_or_after(Duration::from_millis(299_999), s(300)), s(300));
        assert_eq!(grid_point_at_or_after(s(7), Duration::ZERO), s(7), "no grid");
    }

    #[tokio::test]
    async fn the_clock_step_watch_arms_and_waits() {
        // Setting the machine's clock is not for a test; what can be checked
        // is that the watch arms (no error) and does not fire by itself.
        let waited = tokio::time::timeout(Duration::from_millis(100), kernel_clock_set()).await;
        assert!(waited.is_err(), "no clock step, no wake-up: {waited:?}");
    }
}
