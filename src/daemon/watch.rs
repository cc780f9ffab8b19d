//! Notice changes other processes make to the state directory.
//!
//! `bramble cron add` (another process, maybe another user) edits `jobs.json`;
//! `bramble agent` may queue reports in `outbox.jsonl`. The daemon learns of it
//! at once through inotify — no polling, so an idle board stays idle. Files
//! are replaced by rename (atomic writes, hence `IN_MOVED_TO`) or appended to
//! (journals, hence `IN_CLOSE_WRITE`).

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::Arc;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// The daemon's watch on its state directory, until the stop. Cheap to
/// clone: the daemon makes it again if it ever ends.
#[derive(Clone)]
pub struct StateWatcher {
    pub dir: std::path::PathBuf,
    /// Which part to wake when which file changes.
    pub watched: Vec<(&'static str, Arc<Notify>)>,
    /// Set when there is no watch: the outbox then polls (at least every minute).
    pub poll: Arc<std::sync::atomic::AtomicBool>,
}

impl StateWatcher {
    /// Wake each watched part when its file changes; without a watch, set
    /// `poll` and wait for the stop (polling is then how changes are seen).
    pub async fn run(self, shutdown: crate::util::shutdown::Shutdown) {
        if let Err(e) = watch_state_dir(self.dir, self.watched, shutdown.stop_token().clone()).await {
            tracing::warn!("cannot watch the state directory ({e}); CLI edits are picked up within a minute");
            self.poll.store(true, std::sync::atomic::Ordering::Relaxed);
            shutdown.stopped().await;
        }
    }
}

/// Watch `dir`; notify `on_change[name]` when the file `name` in it is replaced or written.
pub async fn watch_state_dir(
    dir: std::path::PathBuf,
    on_change: Vec<(&'static str, Arc<Notify>)>,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
    // Deleted too: `alerts.json` is removed when the last alert closes.
    inotify.add_watch(&dir, AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_CLOSE_WRITE | AddWatchFlags::IN_DELETE)?;
    // SAFETY: `Watched` owns the inotify descriptor and never closes or swaps
    // it while the AsyncFd exists; `as_raw_fd` always returns that descriptor.
    let fd = unsafe { AsyncFd::register(Watched(inotify)) }?;
    tracing::debug!(dir = %dir.display(), "watching the state directory");
    loop {
        let mut guard = tokio::select! {
            g = fd.readable() => g?,
            _ = cancel.cancelled() => return Ok(()),
        };
        match guard.get_inner().0.read_events() {
            Ok(events) => {
                for ev in events {
                    let Some(name) = ev.name.as_ref().and_then(|n| n.to_str()) else { continue };
                    for (file, notify) in &on_change {
                        if name == *file {
                            notify.notify_one();
                        }
                    }
                }
            }
            Err(nix::errno::Errno::EAGAIN) => guard.clear_ready(),
            Err(e) => return Err(e.into()),
        }
    }
}

/// The inotify instance, registered with tokio's reactor.
struct Watched(Inotify);

impl AsRawFd for Watched {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}
