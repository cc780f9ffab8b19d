//! Talking to systemd: `Type=notify` readiness, status lines, the watchdog.
//!
//! Everything here is a no-op outside systemd (no `NOTIFY_SOCKET`), so the
//! daemon behaves the same from a terminal. READY=1 is sent only once the
//! scheduler, heartbeat, outbox and channels have been started, so
//! `systemctl start` returns when bramble is really up.
//!
//! The watchdog is pinged by a task on the same single-threaded runtime that
//! runs everything else: if that runtime hangs, the pings stop and systemd
//! restarts the service (`WatchdogSec=` in the unit).

use std::time::Duration;

use sd_notify::NotifyState;
use tokio_util::sync::CancellationToken;

fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::debug!("sd_notify failed: {e}");
    }
}

/// All components are up.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// A status line for `systemctl status`.
pub fn status(status: &str) {
    send(&[NotifyState::Status(status)]);
}

/// Reloading the config (SIGHUP); `ready` follows when done.
pub fn reloading() {
    send(&[NotifyState::Reloading, NotifyState::Status("reloading")]);
}

/// Shutting down.
pub fn stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
}

/// The watchdog's pinger ([`watchdog`]) as a service, until the abort (it
/// pings through the grace period too: a stop that hangs is a hang).
#[derive(Clone, Copy)]
pub struct Watchdog;

impl Watchdog {
    /// `None` when systemd enabled no watchdog for this process.
    pub fn enabled() -> Option<Watchdog> {
        sd_notify::watchdog_enabled().map(|_| Watchdog)
    }

    pub async fn run(self, shutdown: crate::util::shutdown::Shutdown) {
        watchdog(shutdown.abort_token().clone()).await
    }
}

/// Ping the watchdog at half its interval until cancelled. Returns at once when
/// systemd did not enable a watchdog for this process.
pub async fn watchdog(cancel: CancellationToken) {
    let Some(interval) = sd_notify::watchdog_enabled() else { return };
    let every = (interval / 2).max(Duration::from_millis(100));
    tracing::debug!(?every, "systemd watchdog enabled");
    loop {
        send(&[NotifyState::Watchdog]);
        tokio::select! {
            _ = crate::util::timer::sleep(every) => {}
            _ = cancel.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixDatagram;

    /// A fake systemd notify socket receives what the daemon would send. The
    /// variables systemd sets are given to a child process running this test.
    /// (Multi-threaded: the blocking `recv` must not stall the pinging task.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn notifications_reach_the_notify_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let test = concat!(module_path!(), "::notifications_reach_the_notify_socket");
        let path_text = path.to_str().unwrap();
        let vars = [("NOTIFY_SOCKET", path_text), ("WATCHDOG_USEC", "400000")];
        if !crate::util::test_env::in_child(test, &vars, &["WATCHDOG_PID"]) {
            return;
        }
        // In the child: the socket is where NOTIFY_SOCKET says.
        let path = std::path::PathBuf::from(std::env::var_os("NOTIFY_SOCKET").unwrap());
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let recv = || {
            let mut buf = [0u8; 512];
            let n = sock.recv(&mut buf).unwrap();
            String::from_utf8_lossy(&buf[..n]).into_owned()
        };
        ready("running: 3 jobs");
        assert_eq!(recv(), "READY=1\nSTATUS=running: 3 jobs\n");
        stopping();
        assert_eq!(recv(), "STOPPING=1\nSTATUS=stopping\n");
        let cancel = CancellationToken::new();
        let pinger = tokio::spawn(watchdog(cancel.clone()));
        assert_eq!(recv(), "WATCHDOG=1\n");
        assert_eq!(recv(), "WATCHDOG=1\n", "pinged again at half the interval");
        cancel.cancel();
        pinger.await.unwrap();
    }
}
