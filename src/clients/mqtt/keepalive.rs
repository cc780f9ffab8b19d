//! The MQTT keep-alive on the kernel's clock instead of tokio's timer wheel.
//!
//! The broker must hear from us within 1.5 × keep-alive, or it drops the
//! connection and publishes the last will; we must notice a broker that went
//! silent. rumqttc does both with a PINGREQ on a tokio `Sleep`. On tokio's
//! hierarchical wheel a 5-minute sleep is cascaded down three levels as its
//! deadline nears, and each cascade wakes the board: four wake-ups per ping,
//! the largest share of an idle daemon's (BENCHMARKS.md, "Idle wake-ups").
//!
//! So after the ConnAck the connection task takes the pings over:
//!
//! - rumqttc's own timer, armed at connect with the announced keep-alive,
//!   fires once (at connect + keep-alive); the task then sets rumqttc's
//!   interval to [`SILENCED`], so that timer is not heard from again.
//! - The task's timer is a `timerfd` on the monotonic clock, on a grid of
//!   multiples of the keep-alive, the first point at least a margin after
//!   rumqttc's one ping (so the two never overlap: a second PINGREQ before the
//!   first one's answer is rumqttc's "no PINGRESP" error). With the default
//!   5 minutes the grid is the scheduler's and the dead-man's: one wake-up
//!   for all three. The gap between two pings is at most keep-alive + margin,
//!   well inside the broker's 1.5 ×.
//! - A ping goes into `EventLoop::pending`, which rumqttc sends before new
//!   requests; to put it there the task drops the `poll()` future it was
//!   awaiting. That is safe only while rumqttc has nothing half-written, so
//!   the task pings only while every publish it handed over has been written
//!   ([`Link::idle`](super::Link::idle)), and otherwise looks again a second
//!   later. A dead broker is noticed as before: the next ping finds the last
//!   one unanswered and `poll()` fails, and the task reconnects.
//! - A broker may impose its own keep-alive (MQTT 5 *Server Keep Alive* in
//!   the ConnAck); rumqttc adopts it, and so does the task.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::wire::Events;

/// rumqttc's ping interval once the task pings itself: a year.
const SILENCED: Duration = Duration::from_secs(365 * 24 * 3600);
/// The shortest keep-alive the task takes over (rumqttc's own minimum).
const MIN_KEEP_ALIVE: Duration = Duration::from_secs(5);
/// How soon to look again when a ping was due but a publish was mid-write.
const BUSY_RETRY: Duration = Duration::from_secs(1);

type Timer = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The connection task's ping timer; made at the ConnAck.
pub struct Pinger {
    every: Duration,
    timer: Timer,
}

impl Pinger {
    /// Take the pings over from `events`, which has just connected. `None`
    /// (rumqttc keeps them) if the broker imposed a keep-alive below the 5 s
    /// MQTT clients may ask for: no grid to put it on.
    pub fn take_over(events: &mut Events) -> Option<Pinger> {
        // The announced value, or the broker's if it imposed one.
        let every = events.keep_alive();
        if every < MIN_KEEP_ALIVE {
            return None;
        }
        events.set_keep_alive(SILENCED);
        let first = every + margin(every);
        Some(Pinger { every, timer: Box::pin(crate::util::timer::sleep_to_grid_after(first, every)) })
    }

    /// Resolves when a ping is due.
    pub async fn due(&mut self) {
        self.timer.as_mut().await;
    }

    /// The timer fired (and the `poll()` future was dropped): queue a PINGREQ
    /// if rumqttc is between requests, and arm the timer again.
    pub fn ping(&mut self, events: &mut Events, idle: bool) {
        if !idle {
            self.timer = Box::pin(tokio::time::sleep(BUSY_RETRY));
            return;
        }
        events.queue_ping();
        self.timer = Box::pin(crate::util::timer::sleep_to_grid_after(BUSY_RETRY, self.every));
    }
}

/// How long after rumqttc's one ping the task's first may come: long enough
/// for its answer, short enough that the gap stays under 1.5 × keep-alive.
fn margin(every: Duration) -> Duration {
    (every / 10).clamp(Duration::from_millis(500), Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_ping_leaves_room_for_rumqttcs_and_stays_inside_the_brokers_limit() {
        for secs in [5, 10, 60, 300, 65535] {
            let every = Duration::from_secs(secs);
            let m = margin(every);
            assert!(m >= Duration::from_millis(500), "{secs}: {m:?}");
            // The worst gap: rumqttc's ping at connect + every, ours up to one grid step after the margin.
            assert!(every + m < every * 3 / 2, "{secs}: {m:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_ping_waits_while_a_publish_is_mid_write() {
        let mut o = rumqttc::v5::MqttOptions::new("t", "127.0.0.1", 1);
        o.set_keep_alive(Duration::from_secs(60));
        let mut o4 = rumqttc::MqttOptions::new("t", "127.0.0.1", 1);
        o4.set_keep_alive(Duration::from_secs(60));
        for events in [
            Events::V5(Box::new(rumqttc::v5::EventLoop::new(o, 4))),
            Events::V311(Box::new(rumqttc::EventLoop::new(o4, 4))),
        ] {
            one_ping(events).await;
        }
    }

    async fn one_ping(mut events: Events) {
        let mut p = Pinger::take_over(&mut events).expect("60 s");
        assert_eq!(p.every, Duration::from_secs(60));
        assert_eq!(events.keep_alive(), SILENCED, "rumqttc's timer silenced");
        let t0 = tokio::time::Instant::now();
        p.due().await;
        assert!(t0.elapsed() >= Duration::from_secs(60) + margin(Duration::from_secs(60)), "{:?}", t0.elapsed());
        p.ping(&mut events, false);
        assert!(!events.ping_queued(), "busy: no ping");
        let t1 = tokio::time::Instant::now();
        p.due().await;
        assert_eq!(t1.elapsed(), BUSY_RETRY);
        p.ping(&mut events, true);
        assert!(events.ping_queued(), "{}", events.protocol());
    }
}
