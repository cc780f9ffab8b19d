//! Alerts: the owner hears once when something goes wrong, and once when it
//! is right again — never once per retry or per poll.
//!
//! Two kinds:
//! - **Conditions** last until something clears them: a job failing
//!   `after_failures` times in a row or a one-shot given up (cleared by the
//!   job's next good run), reports waiting in the outbox longer than
//!   `undelivered_after` (cleared when nothing waits that long), a stalled
//!   scheduler or a silent heartbeat (the dead-man, [`dead_man`]). An open
//!   condition is kept in `alerts.json`, so a restart neither repeats its
//!   alert nor forgets to send the recovery note. Home Assistant's `problem`
//!   sensor and `bramble status` show what is open.
//! - **Events** happen once: occurrences a job missed and its catch-up policy
//!   did not make up, a recurring run cut off by a crash. One alert per
//!   scheduler pass lists them all (a power cut that made ten jobs miss their
//!   runs is one message). The scheduler tells them after its own store
//!   write, so a restart does not decide them again.
//!
//! An alert goes into the outbox (through `[alerts] deliver`) *before*
//! `alerts.json` records it: a power cut between the two can repeat an
//! alert, never lose one. With `deliver` empty, conditions are still
//! tracked and logged. `alerts.json` is written only when a condition opens
//! or closes, and removed when none is open; the common path (a good run
//! with nothing open) costs one `stat`.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::bus::ReportSource;
use crate::config::AlertsConfig;
use crate::delivery::outbox::Outbox;
use crate::delivery::Reports;
use crate::util::pulse::Pulse;
use crate::util::tasks::blocking;

/// The file of open conditions, in the state directory.
pub const ALERTS_FILE: &str = "alerts.json";
/// The dead-man looks at its pulses and the outbox every half of the
/// shortest limit, at most this seldom (an idle board should sleep: with the
/// default limits it wakes every 5 minutes, one timerfd wake-up each) …
pub const CHECK_AT_MOST_EVERY: Duration = Duration::from_secs(5 * 60);
/// … and at least this seldom.
pub const CHECK_AT_LEAST_EVERY: Duration = Duration::from_secs(10);
/// The scheduler completes a pass at least once a minute; this long without
/// one is a stall.
pub const SCHEDULER_STALL: Duration = Duration::from_secs(10 * 60);
/// Keys of the dead-man's conditions.
pub const SCHEDULER_KEY: &str = "deadman:scheduler";
pub const HEARTBEAT_KEY: &str = "deadman:heartbeat";

/// An open condition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Open {
    pub since: Timestamp,
    /// The alert as it was sent.
    pub text: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct AlertFile {
    #[serde(default)]
    version: u32,
    #[serde(default)]
    open: BTreeMap<String, Open>,
}

/// What identifies one version of `alerts.json` (a change by another process).
type FileStamp = (u64, u64, i64, i64);

fn stamp(path: &Path) -> Option<FileStamp> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.ino(), m.len(), m.mtime(), m.mtime_nsec()))
}

/// The alert key of a job's condition (failing, given up).
pub fn job_key(id: &str) -> String {
    format!("job:{id}")
}

/// Raises and clears alerts; cheap to clone.
#[derive(Clone)]
pub struct Alerts {
    inner: Arc<Inner>,
}

struct Inner {
    config: AlertsConfig,
    reports: Reports,
    path: PathBuf,
    lock: PathBuf,
    /// The file as last read or written by us, and its stamp.
    cache: Mutex<(Option<FileStamp>, BTreeMap<String, Open>)>,
}

impl Alerts {
    pub fn new(state_dir: &Path, config: &AlertsConfig, reports: Reports) -> Alerts {
        Alerts {
            inner: Arc::new(Inner {
                config: config.clone(),
                reports,
                path: state_dir.join(ALERTS_FILE),
                lock: state_dir.join(".alerts.lock"),
                cache: Mutex::new((None, BTreeMap::new())),
            }),
        }
    }

    pub fn config(&self) -> &AlertsConfig {
        &self.inner.config
    }

    /// Open the condition `key` and send `text`, unless it is open already.
    /// Returns whether it was opened now.
    pub async fn raise(&self, key: &str, text: String) -> bool {
        let (me, key_owned) = (self.clone(), key.to_string());
        let opened = blocking(move || {
            me.change(&key_owned.clone(), true, |open| {
                if open.contains_key(&key_owned) {
                    return None;
                }
                open.insert(key_owned.clone(), Open { since: Timestamp::now(), text: text.clone() });
                Some(text)
            })
        })
        .await;
        self.after_change(key, opened, true)
    }

    /// Close the condition `key` if it is open, and send `note` (made from
    /// what was open). Returns whether it was open.
    pub async fn clear(&self, key: &str, note: impl FnOnce(&Open) -> String + Send + 'static) -> bool {
        if !self.maybe_open(|k| k == key) {
            return false;
        }
        let (me, key_owned) = (self.clone(), key.to_string());
        let closed =
            blocking(move || me.change(&key_owned.clone(), false, |open| open.remove(&key_owned).map(|o| note(&o))))
                .await;
        self.after_change(key, closed, false)
    }

    /// Close, without a note, the job conditions of jobs not in `ids` (removed
    /// jobs). Returns how many.
    pub async fn forget_jobs(&self, ids: HashSet<String>) -> usize {
        let gone = move |k: &str| k.strip_prefix("job:").is_some_and(|id| !ids.contains(id));
        if !self.maybe_open(&gone) {
            return 0;
        }
        let me = self.clone();
        let forgotten = blocking(move || {
            let mut n = 0;
            let result = me.change_quietly(|open| {
                let before = open.len();
                open.retain(|k, _| !gone(k));
                n = before - open.len();
                n > 0
            });
            result.map(|()| n)
        })
        .await;
        match forgotten {
            Ok(n) => {
                if n > 0 {
                    tracing::info!(alerts = n, "alerts of removed jobs closed");
                }
                n
            }
            Err(e) => {
                tracing::error!("cannot update {}: {e}", self.inner.path.display());
                0
            }
        }
    }

    /// Send a one-off alert (nothing to clear later).
    pub async fn event(&self, text: String) {
        tracing::warn!("{text}");
        if !self.inner.config.deliver.is_empty() {
            self.inner.reports.send(&self.inner.config.deliver, &text, ReportSource::Alert).await;
        }
    }

    /// The open conditions (read from the file). Blocking.
    pub fn open(&self) -> BTreeMap<String, Open> {
        read_open(&self.inner.path)
    }

    /// Whether some open condition's key may satisfy `pred`: from the cached
    /// copy when the file has not changed since (one `stat`), else `true`.
    pub fn maybe_open(&self, pred: impl Fn(&str) -> bool) -> bool {
        let now = stamp(&self.inner.path);
        if now.is_none() {
            return false;
        }
        let cache = self.inner.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.0 != now || cache.1.keys().any(|k| pred(k))
    }

    /// Under the lock: read, let `f` change the set and say what to send,
    /// send it (outbox first), then write the file (or remove it if empty).
    /// An empty text changes the set and sends nothing. When `opening` and
    /// the alert cannot be queued (a full disk), nothing is recorded either,
    /// so the next occasion raises it again instead of it being lost.
    fn change(
        &self,
        key: &str,
        opening: bool,
        f: impl FnOnce(&mut BTreeMap<String, Open>) -> Option<String>,
    ) -> Result<Option<String>, AlertsError> {
        let mut text = None;
        self.change_quietly(|open| {
            text = f(open);
            let Some(t) = text.as_ref().filter(|t| !t.is_empty()) else { return text.is_some() };
            if self.inner.config.deliver.is_empty() {
                return true;
            }
            let reports = self
                .inner
                .config
                .deliver
                .iter()
                .map(|to| crate::delivery::Outgoing::new(to.clone(), t.clone(), ReportSource::Alert))
                .collect();
            let mut queued = true;
            for r in self.inner.reports.outbox().enqueue_many(reports) {
                if let Err(e) = r {
                    tracing::error!(alert = key, "alert not queued: {e}");
                    queued = false;
                }
            }
            if !queued && opening {
                open.remove(key);
                text = None;
                return false;
            }
            true
        })?;
        Ok(text)
    }

    /// Under the lock: read, let `f` change the set (returning whether it
    /// did), write. Blocking.
    fn change_quietly(&self, f: impl FnOnce(&mut BTreeMap<String, Open>) -> bool) -> Result<(), AlertsError> {
        let lock = crate::util::fs::open_lock_file(&self.inner.lock).map_err(AlertsError::LockFile)?;
        let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| AlertsError::Lock(e))?;
        let mut open = read_open(&self.inner.path);
        let changed = f(&mut open);
        if changed {
            let result = if open.is_empty() {
                match std::fs::remove_file(&self.inner.path) {
                    Ok(()) => crate::util::fs::sync_dir(self.inner.path.parent().unwrap_or(Path::new("."))),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                    Err(e) => Err(e),
                }
            } else {
                let file = AlertFile { version: 1, open: open.clone() };
                serde_json::to_vec_pretty(&file)
                    .map_err(std::io::Error::other)
                    .and_then(|data| crate::util::fs::write_atomic(&self.inner.path, &data))
            };
            result.map_err(|source| AlertsError::Write { path: self.inner.path.clone(), source })?;
        }
        *self.inner.cache.lock().unwrap_or_else(|e| e.into_inner()) = (stamp(&self.inner.path), open);
        Ok(())
    }

    fn after_change(&self, key: &str, result: Result<Option<String>, AlertsError>, raising: bool) -> bool {
        match result {
            Ok(Some(text)) if text.is_empty() => {
                tracing::info!(alert = key, "closed");
                true
            }
            Ok(Some(text)) => {
                if raising {
                    tracing::warn!(alert = key, "{text}");
                } else {
                    tracing::info!(alert = key, "{text}");
                }
                self.inner.reports.wake().notify_one();
                true
            }
            Ok(None) => false,
            Err(e) => {
                tracing::error!(alert = key, "{e}");
                false
            }
        }
    }
}

/// Why `alerts.json` could not be changed (logged; the alert is tried again
/// at its next occasion).
#[derive(Debug, thiserror::Error)]
enum AlertsError {
    #[error("{0}")]
    LockFile(std::io::Error),
    #[error("{0}")]
    Lock(nix::errno::Errno),
    #[error("cannot write {}: {source}", path.display())]
    Write { path: PathBuf, source: std::io::Error },
}

/// The open conditions in `path`; a missing file is none, an unreadable one
/// is logged and counts as none (it is replaced at the next change).
fn read_open(path: &Path) -> BTreeMap<String, Open> {
    match std::fs::read(path) {
        Ok(data) => match serde_json::from_slice::<AlertFile>(&data) {
            Ok(f) => f.open,
            Err(e) => {
                tracing::warn!(file = %path.display(), "unreadable, taken as no open alerts: {e}");
                BTreeMap::new()
            }
        },
        Err(_) => BTreeMap::new(),
    }
}

/// The open conditions of a state directory, for `bramble status` and MQTT.
pub fn open_in(state_dir: &Path) -> BTreeMap<String, Open> {
    read_open(&state_dir.join(ALERTS_FILE))
}

/// One alert for what a scheduler pass decided: missed occurrences and
/// interrupted runs in one message. `None` when there is nothing to say.
pub fn incidents_text(incidents: &[crate::scheduler::Incident]) -> Option<String> {
    use crate::scheduler::Incident;
    const MAX_LISTED: usize = 20;
    let lines: Vec<String> = incidents
        .iter()
        .filter_map(|i| match i {
            Incident::Missed { name, missed, .. } => {
                Some(format!("- `{name}` {missed} (not made up: its catch-up policy)"))
            }
            Incident::Interrupted { name, scheduled, .. } => {
                Some(format!("- `{name}`: the run of {scheduled} was cut off (crash, kill or watchdog); not run again"))
            }
            Incident::GaveUp { .. } => None,
        })
        .collect();
    if lines.is_empty() {
        return None;
    }
    let mut text = format!(
        "Alert: {} job{} did not run as planned (bramble was down, the board was off or the clock jumped):\n",
        lines.len(),
        if lines.len() == 1 { "" } else { "s" }
    );
    text.push_str(&lines.iter().take(MAX_LISTED).cloned().collect::<Vec<_>>().join("\n"));
    if lines.len() > MAX_LISTED {
        text.push_str(&format!("\n… and {} more (see `bramble cron list`)", lines.len() - MAX_LISTED));
    }
    Some(text)
}

/// A loop the dead-man watches.
#[derive(Clone)]
pub struct Watched {
    /// Its condition's key ([`SCHEDULER_KEY`], [`HEARTBEAT_KEY`]).
    pub key: &'static str,
    pub pulse: Pulse,
    /// Silent longer than this is an alert.
    pub limit: Duration,
    /// The alert: "the scheduler has not completed a pass for {silent}…".
    pub alert: fn(Duration) -> String,
    /// The recovery note.
    pub recovered: &'static str,
}

/// The daemon's dead-man ([`dead_man`]) as a service, until the stop. Cheap
/// to clone: the daemon makes it again if it ever ends.
#[derive(Clone)]
pub struct DeadMan {
    pub alerts: Alerts,
    pub watched: Vec<Watched>,
    /// Where reports wait: the age of the oldest undelivered one is watched too.
    pub outbox: Outbox,
}

impl DeadMan {
    pub async fn run(self, shutdown: crate::util::shutdown::Shutdown) {
        dead_man(self.alerts, self.watched, self.outbox, shutdown.stop_token().clone()).await
    }
}

/// The dead-man: every half of the shortest limit (within
/// [`CHECK_AT_LEAST_EVERY`]…[`CHECK_AT_MOST_EVERY`]), raise an alert for a
/// watched loop silent beyond its limit (clear it once the loop beats
/// again), and for reports that waited in the outbox longer than `[alerts]
/// undelivered_after`. A hung *runtime* stops this task too: that is the
/// systemd watchdog's job.
pub async fn dead_man(alerts: Alerts, watched: Vec<Watched>, outbox: Outbox, stop: CancellationToken) {
    let every = watched
        .iter()
        .map(|w| w.limit / 2)
        .chain([alerts.config().undelivered_after.get() / 2])
        .min()
        .unwrap_or(CHECK_AT_MOST_EVERY)
        .clamp(CHECK_AT_LEAST_EVERY, CHECK_AT_MOST_EVERY);
    // A loop no longer watched (the heartbeat turned off) has nothing open.
    for key in [SCHEDULER_KEY, HEARTBEAT_KEY] {
        if !watched.iter().any(|w| w.key == key) {
            alerts.clear(key, |_| String::new()).await;
        }
    }
    loop {
        tokio::select! {
            // At multiples of `every` on the monotonic clock: the scheduler's
            // idle wake-ups fall on the same grid, so the two share one.
            _ = crate::util::timer::sleep_on_grid(every, every) => {}
            _ = stop.cancelled() => return,
        }
        for w in &watched {
            let silent = w.pulse.silent_for();
            if silent > w.limit {
                alerts.raise(w.key, (w.alert)(silent)).await;
            } else {
                let note = w.recovered;
                alerts.clear(w.key, move |_| note.to_string()).await;
            }
        }
        check_outbox(&alerts, &outbox).await;
    }
}

/// Raise `outbox:<channel>` for each channel with reports (other than
/// alerts) waiting longer than `undelivered_after`; clear the others.
pub async fn check_outbox(alerts: &Alerts, outbox: &Outbox) {
    let after = alerts.config().undelivered_after.get();
    let pending = if outbox.maybe_pending() {
        let reader = outbox.clone();
        let Ok(pending) = blocking(move || reader.pending()).await else { return };
        pending
    } else {
        Vec::new()
    };
    let now = Timestamp::now();
    let mut stuck: BTreeMap<&'static str, (usize, Timestamp, Option<String>)> = BTreeMap::new();
    for e in &pending {
        let waited = Duration::try_from(now.duration_since(e.created)).unwrap_or(Duration::ZERO);
        if e.source == ReportSource::Alert || waited <= after {
            continue;
        }
        let slot = stuck.entry(e.target.channel()).or_insert((0, e.created, None));
        slot.0 += 1;
        slot.1 = slot.1.min(e.created);
        if e.last_error.is_some() {
            slot.2.clone_from(&e.last_error);
        }
    }
    for (channel, (n, oldest, error)) in &stuck {
        let text = format!(
            "Alert: {n} report{} for {channel} ha{} waited more than {} (the oldest since {oldest}){}",
            if *n == 1 { "" } else { "s" },
            if *n == 1 { "s" } else { "ve" },
            crate::config::Dur(after),
            match error {
                Some(e) => format!("; last error: {}", crate::scheduler::job::truncate(e, 300)),
                None => format!("; is the {channel} channel configured and reachable?"),
            }
        );
        alerts.raise(&format!("outbox:{channel}"), text).await;
    }
    let waiting: Vec<String> = if alerts.maybe_open(|k| k.starts_with("outbox:")) {
        let me = alerts.clone();
        blocking(move || me.open()).await.into_keys().filter(|k| k.starts_with("outbox:")).collect()
    } else {
        Vec::new()
    };
    for key in waiting {
        let channel = key.trim_start_matches("outbox:").to_string();
        if !stuck.contains_key(channel.as_str()) {
            let after = crate::config::Dur(after);
            alerts
                .clear(&key, move |_| {
                    format!("Recovered: no report for {channel} has been waiting longer than {after}.")
                })
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::Target;
    use crate::config::Dur;
    use crate::delivery::outbox::Attempt;
    use crate::scheduler::{Incident, Missed};

    fn alerts_in(dir: &Path, deliver: &[&str]) -> Alerts {
        alerts_with(dir, deliver, Dur::secs(0))
    }

    fn alerts_with(dir: &Path, deliver: &[&str], undelivered_after: Dur) -> Alerts {
        let config = AlertsConfig {
            deliver: deliver.iter().map(|t| t.parse().unwrap()).collect(),
            after_failures: 3,
            undelivered_after,
        };
        let reports = Reports::new(Outbox::new(dir), Arc::new(tokio::sync::Notify::new()));
        Alerts::new(dir, &config, reports)
    }

    /// The texts queued for delivery (alerts and notes), in order.
    fn queued(dir: &Path) -> Vec<String> {
        let outbox = Outbox::new(dir);
        outbox.pending().unwrap().into_iter().filter(|e| e.source == ReportSource::Alert).map(|e| e.text).collect()
    }

    #[tokio::test]
    async fn a_condition_alerts_once_across_restarts_and_notes_its_recovery_once() {
        let dir = tempfile::tempdir().unwrap();
        let a = alerts_in(dir.path(), &["log"]);
        assert!(a.raise("job:1", "Alert: backup fails".into()).await);
        assert!(!a.raise("job:1", "Alert: backup fails".into()).await, "open already: no second alert");
        // A restart: a new process reads what is open.
        let b = alerts_in(dir.path(), &["log"]);
        assert!(!b.raise("job:1", "Alert: backup fails".into()).await);
        assert_eq!(b.open().keys().collect::<Vec<_>>(), ["job:1"]);
        assert!(b.clear("job:1", |o| format!("Recovered ({})", o.text)).await);
        assert!(!b.clear("job:1", |_| "again".into()).await);
        // The first process's cached copy is stale: the file is gone, so nothing is open.
        assert!(!a.clear("job:1", |_| "stale".into()).await);
        assert_eq!(queued(dir.path()), ["Alert: backup fails", "Recovered (Alert: backup fails)"]);
        assert!(!dir.path().join(ALERTS_FILE).exists(), "removed when nothing is open");
    }

    #[tokio::test]
    async fn without_targets_conditions_are_still_tracked_but_nothing_is_sent() {
        let dir = tempfile::tempdir().unwrap();
        let a = alerts_in(dir.path(), &[]);
        assert!(a.raise("outbox:telegram", "Alert: stuck".into()).await);
        assert_eq!(open_in(dir.path()).len(), 1);
        a.event("Alert: missed".into()).await;
        assert!(queued(dir.path()).is_empty());
    }

    #[tokio::test]
    async fn conditions_of_removed_jobs_close_without_a_note() {
        let dir = tempfile::tempdir().unwrap();
        let a = alerts_in(dir.path(), &["log"]);
        a.raise(&job_key("kept"), "Alert: kept".into()).await;
        a.raise(&job_key("gone"), "Alert: gone".into()).await;
        a.raise(SCHEDULER_KEY, "Alert: stalled".into()).await;
        assert_eq!(a.forget_jobs(["kept".to_string()].into()).await, 1);
        assert_eq!(open_in(dir.path()).into_keys().collect::<Vec<_>>(), [SCHEDULER_KEY, "job:kept"]);
        assert_eq!(a.forget_jobs(["kept".to_string()].into()).await, 0);
        assert_eq!(queued(dir.path()).len(), 3, "three alerts, no notes");
    }

    #[test]
    fn a_pass_makes_one_alert_listing_its_misses() {
        let t = |s: &str| s.parse::<Timestamp>().unwrap();
        let missed =
            Missed { count: 5, capped: false, first: t("2026-05-01T08:30:00Z"), last: t("2026-05-01T12:30:00Z") };
        let list = vec![
            Incident::Missed { id: "1".into(), name: "hourly".into(), missed },
            Incident::Interrupted { id: "2".into(), name: "backup".into(), scheduled: t("2026-05-01T03:00:00Z") },
            Incident::GaveUp { id: "3".into(), name: "remind".into() },
        ];
        let text = incidents_text(&list).unwrap();
        assert!(text.starts_with("Alert: 2 jobs did not run as planned"), "{text}");
        assert!(text.contains("`hourly` missed 5 occurrences from 2026-05-01T08:30:00Z"), "{text}");
        assert!(text.contains("`backup`: the run of 2026-05-01T03:00:00Z was cut off"), "{text}");
        assert!(!text.contains("remind"), "a given-up one-shot is its own condition");
        assert_eq!(incidents_text(&list[2..]), None);
        let many: Vec<_> =
            (0..25).map(|i| Incident::Missed { id: i.to_string(), name: format!("j{i}"), missed }).collect();
        let text = incidents_text(&many).unwrap();
        assert!(text.ends_with("… and 5 more (see `bramble cron list`)"), "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_dead_man_alerts_a_silent_loop_once_and_notes_its_return() {
        let dir = tempfile::tempdir().unwrap();
        let a = alerts_with(dir.path(), &["log"], Dur::secs(3600));
        let pulse = Pulse::new();
        let watched = vec![Watched {
            key: HEARTBEAT_KEY,
            pulse: pulse.clone(),
            limit: Duration::from_secs(20 * 60),
            alert: |silent| format!("Alert: silent for {}", crate::config::Dur(silent)),
            recovered: "Recovered: ticks again",
        }];
        let stop = CancellationToken::new();
        let task = tokio::spawn(dead_man(a.clone(), watched, Outbox::new(dir.path()), stop.clone()));
        // Checked every 5 minutes (half the 20-minute limit would be 10).
        tokio::time::sleep(Duration::from_secs(19 * 60)).await;
        assert!(open_in(dir.path()).is_empty(), "within the limit");
        tokio::time::sleep(Duration::from_secs(10 * 60)).await;
        assert_eq!(queued(dir.path()), ["Alert: silent for 25m"], "one alert, not one per check");
        pulse.beat();
        tokio::time::sleep(Duration::from_secs(61)).await;
        assert_eq!(queued(dir.path()), ["Alert: silent for 25m", "Recovered: ticks again"]);
        assert!(open_in(dir.path()).is_empty());
        stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_loop_no_longer_watched_has_its_alert_closed_without_a_message() {
        let dir = tempfile::tempdir().unwrap();
        let a = alerts_with(dir.path(), &["log"], Dur::secs(3600));
        a.raise(HEARTBEAT_KEY, "Alert: the heartbeat is silent".into()).await;
        // The heartbeat was turned off meanwhile: the dead-man watches the scheduler only.
        let watched = vec![Watched {
            key: SCHEDULER_KEY,
            pulse: Pulse::new(),
            limit: SCHEDULER_STALL,
            alert: |_| "stalled".into(),
            recovered: "runs",
        }];
        let stop = CancellationToken::new();
        let task = tokio::spawn(dead_man(a.clone(), watched, Outbox::new(dir.path()), stop.clone()));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(open_in(dir.path()).is_empty());
        assert_eq!(queued(dir.path()), ["Alert: the heartbeat is silent"], "no empty note");
        stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn reports_stuck_in_the_outbox_alert_once_per_channel_until_they_go() {
        let dir = tempfile::tempdir().unwrap();
        let a = alerts_in(dir.path(), &["log"]);
        let outbox = Outbox::new(dir.path());
        let tg: Target = "telegram:42".parse().unwrap();
        let first = outbox.enqueue(tg.clone(), "report 1", "job:x").unwrap();
        let second = outbox.enqueue(tg.clone(), "report 2", "job:x").unwrap();
        outbox.record(first, Attempt::Retry("429 Too Many Requests".into()), Timestamp::now()).unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await; // older than undelivered_after (0 s here)
        check_outbox(&a, &outbox).await;
        check_outbox(&a, &outbox).await;
        let texts = queued(dir.path());
        assert_eq!(texts.len(), 1, "{texts:?}");
        assert!(texts[0].starts_with("Alert: 2 reports for telegram have waited more than 0s"), "{}", texts[0]);
        assert!(texts[0].ends_with("last error: 429 Too Many Requests"), "{}", texts[0]);
        // Alerts waiting themselves do not keep the condition open.
        for id in [first, second] {
            outbox.record(id, Attempt::Delivered, Timestamp::now()).unwrap();
        }
        check_outbox(&a, &outbox).await;
        let texts = queued(dir.path());
        assert_eq!(texts.len(), 2, "{texts:?}");
        assert_eq!(texts[1], "Recovered: no report for telegram has been waiting longer than 0s.");
        assert!(open_in(dir.path()).is_empty());
    }
}
