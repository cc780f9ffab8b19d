//! Token usage per day, for `[agent] daily_token_budget` and `/status`.
//!
//! `<state>/usage.json` holds the totals of the last two months, by local date
//! in the configured time zone. A run's usage is added in memory at once (the
//! budget check sees it) and written at most once a minute — the write after
//! a run waits [`FLUSH_AFTER`], so a busy minute costs one atomic replace,
//! not two fsyncs per turn — and when the agent is dropped (shutdown, reload,
//! the end of `bramble agent`). The write adds the unsaved counts to the file
//! under an advisory lock shared with other bramble processes, so processes
//! never overwrite each other's counts. The replace flushes the file but not
//! the directory (one fsync, not two): a power cut leaves the old file or the
//! new one, whole, and loses at most the last minute's counts — this is
//! accounting for a budget, not a user's data.
//!
//! The file is read once and then kept (updated at each write), so a turn's
//! budget check does no file I/O; counts another process added are seen at
//! this process's next write.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::config::TzName;
use crate::provider::Usage;
use crate::util;

/// Days kept in the file.
const DAYS_KEPT: usize = 62;

/// One day's totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DayUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Model-using units of work: turns, consolidations, sub-agents.
    pub runs: u64,
}

impl DayUsage {
    pub fn total(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }

    fn plus(self, o: DayUsage) -> DayUsage {
        DayUsage {
            input_tokens: self.input_tokens + o.input_tokens,
            output_tokens: self.output_tokens + o.output_tokens,
            runs: self.runs + o.runs,
        }
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct UsageFile {
    #[serde(default)]
    days: BTreeMap<String, DayUsage>,
    /// The same per provider (`[provider] name`): date → provider → totals.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    providers: BTreeMap<String, BTreeMap<String, DayUsage>>,
}

/// Saved counts: all of them by date, and by date and provider.
#[derive(Debug, Default, Clone)]
struct Counts {
    days: BTreeMap<String, DayUsage>,
    providers: BTreeMap<(String, String), DayUsage>,
}

impl Counts {
    fn is_empty(&self) -> bool {
        self.days.is_empty() && self.providers.is_empty()
    }

    fn merge(&mut self, other: Counts) {
        for (k, d) in other.days {
            let day = self.days.entry(k).or_default();
            *day = day.plus(d);
        }
        for (k, d) in other.providers {
            let day = self.providers.entry(k).or_default();
            *day = day.plus(d);
        }
    }
}

impl From<UsageFile> for Counts {
    fn from(f: UsageFile) -> Counts {
        let providers = f
            .providers
            .into_iter()
            .flat_map(|(date, by)| by.into_iter().map(move |(name, d)| ((date.clone(), name), d)))
            .collect();
        Counts { days: f.days, providers }
    }
}

/// How long added usage may wait in memory before it is written.
pub const FLUSH_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// The usage ledger of a state directory. Clones share the unsaved counts;
/// the last one dropped writes them.
#[derive(Debug, Clone)]
pub struct UsageLedger {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    tz: TzName,
    /// Counts added since the last write, by local date.
    unsaved: Mutex<Unsaved>,
    /// The file's counts as this process last read or wrote them.
    saved: Mutex<Option<Counts>>,
}

#[derive(Debug, Default)]
struct Unsaved {
    counts: Counts,
    /// A delayed write is scheduled.
    flush_scheduled: bool,
}

impl UsageLedger {
    pub fn new(state_dir: &Path, tz: TzName) -> UsageLedger {
        UsageLedger {
            inner: Arc::new(Inner {
                path: state_dir.join("usage.json"),
                tz,
                unsaved: Mutex::default(),
                saved: Mutex::default(),
            }),
        }
    }

    fn today_key(&self) -> String {
        jiff::Timestamp::now().to_zoned(self.inner.tz.tz().clone()).strftime("%Y-%m-%d").to_string()
    }

    fn unsaved(&self) -> std::sync::MutexGuard<'_, Unsaved> {
        self.inner.unsaved.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Today's totals (local date): the file's and this process's unsaved ones.
    pub fn today(&self) -> DayUsage {
        let key = self.today_key();
        self.count(|c| c.days.get(&key).copied())
    }

    /// Today's totals of one provider.
    pub fn today_of(&self, provider: &str) -> DayUsage {
        let key = (self.today_key(), provider.to_string());
        self.count(|c| c.providers.get(&key).copied())
    }

    /// `pick` of the saved counts plus `pick` of the unsaved ones.
    fn count(&self, pick: impl Fn(&Counts) -> Option<DayUsage>) -> DayUsage {
        let saved = {
            let mut saved = self.inner.saved.lock().unwrap_or_else(|p| p.into_inner());
            pick(saved.get_or_insert_with(|| self.inner.read().into())).unwrap_or_default()
        };
        let unsaved = pick(&self.unsaved().counts).unwrap_or_default();
        saved.plus(unsaved)
    }

    /// Add one run's usage to today's totals (`providers`: its share per
    /// provider); returns today's totals. The write follows within
    /// [`FLUSH_AFTER`] on a blocking thread (at once outside a runtime).
    pub fn add(&self, usage: Usage, providers: &[(String, Usage)]) -> DayUsage {
        let schedule = {
            let today = self.today_key();
            let mut unsaved = self.unsaved();
            let day = unsaved.counts.days.entry(today.clone()).or_default();
            day.input_tokens += usage.input_tokens;
            day.output_tokens += usage.output_tokens;
            day.runs += 1;
            for (name, u) in providers {
                let day = unsaved.counts.providers.entry((today.clone(), name.clone())).or_default();
                day.input_tokens += u.input_tokens;
                day.output_tokens += u.output_tokens;
                day.runs += 1;
            }
            !std::mem::replace(&mut unsaved.flush_scheduled, true)
        };
        if schedule {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    // Holds only a weak reference: a dropped ledger has written its counts already.
                    let weak = Arc::downgrade(&self.inner);
                    rt.spawn(async move {
                        crate::util::timer::sleep(FLUSH_AFTER).await;
                        if let Some(inner) = weak.upgrade() {
                            crate::util::tasks::blocking(move || inner.flush()).await;
                        }
                    });
                }
                Err(_) => self.inner.flush(),
            }
        }
        self.today()
    }

    /// Write the unsaved counts now.
    pub fn flush(&self) {
        self.inner.flush();
    }
}

impl Inner {
    fn read(&self) -> UsageFile {
        match std::fs::read(&self.path) {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
                tracing::warn!(file = %self.path.display(), "unreadable usage file, starting a new one: {e}");
                UsageFile::default()
            }),
            Err(_) => UsageFile::default(),
        }
    }

    /// Add the unsaved counts to the file (under the lock) and forget them; on
    /// failure they stay in memory for the next try.
    fn flush(&self) {
        let counts = {
            let mut unsaved = self.unsaved.lock().unwrap_or_else(|p| p.into_inner());
            unsaved.flush_scheduled = false;
            std::mem::take(&mut unsaved.counts)
        };
        if counts.is_empty() {
            return;
        }
        if let Err(e) = self.write(&counts) {
            tracing::warn!(file = %self.path.display(), "cannot record token usage (kept in memory): {e}");
            let mut unsaved = self.unsaved.lock().unwrap_or_else(|p| p.into_inner());
            unsaved.counts.merge(counts);
        }
    }

    fn write(&self, counts: &Counts) -> std::io::Result<()> {
        let lock = util::fs::open_lock_file(&self.path.with_extension("lock"))?;
        let _lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| std::io::Error::from_raw_os_error(e as i32))?;
        let mut file = self.read();
        for (k, d) in &counts.days {
            let day = file.days.entry(k.clone()).or_default();
            *day = day.plus(*d);
        }
        for ((date, name), d) in &counts.providers {
            let day = file.providers.entry(date.clone()).or_default().entry(name.clone()).or_default();
            *day = day.plus(*d);
        }
        while file.days.len() > DAYS_KEPT {
            let Some(oldest) = file.days.keys().next().cloned() else { break };
            file.days.remove(&oldest);
        }
        while file.providers.len() > DAYS_KEPT {
            let Some(oldest) = file.providers.keys().next().cloned() else { break };
            file.providers.remove(&oldest);
        }
        let body = serde_json::to_vec_pretty(&file).map_err(std::io::Error::other)?;
        // No directory fsync: a power cut may lose this write (the counts of the last minute at
        // most, as documented), never leave a torn file.
        util::fs::write_atomic_relaxed(&self.path, &body)?;
        *self.saved.lock().unwrap_or_else(|p| p.into_inner()) = Some(file.into());
        Ok(())
    }
}

impl crate::provider::chain::Meter for UsageLedger {
    fn used_today(&self, provider: &str) -> u64 {
        self.today_of(provider).total()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_adds_up_per_day_and_persists() {
        let dir = tempfile::tempdir().unwrap();
        let l = UsageLedger::new(dir.path(), "UTC".parse().unwrap());
        assert_eq!(l.today(), DayUsage::default());
        l.add(Usage { input_tokens: 100, output_tokens: 20 }, &[]);
        let t = l.add(Usage { input_tokens: 5, output_tokens: 1 }, &[]);
        assert_eq!(t, DayUsage { input_tokens: 105, output_tokens: 21, runs: 2 });
        drop(l);
        let again = UsageLedger::new(dir.path(), "UTC".parse().unwrap());
        assert_eq!(again.today().total(), 126);
        std::fs::write(dir.path().join("usage.json"), "{garbage").unwrap();
        let fresh = UsageLedger::new(dir.path(), "UTC".parse().unwrap());
        assert_eq!(fresh.today(), DayUsage::default(), "a corrupt file is not fatal");
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn usage_waits_in_memory_and_is_written_once_a_minute() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("usage.json");
        let l = UsageLedger::new(dir.path(), "UTC".parse().unwrap());
        for _ in 0..10 {
            l.add(Usage { input_tokens: 10, output_tokens: 1 }, &[]);
        }
        assert!(!file.exists(), "nothing written per run");
        assert_eq!(l.today().runs, 10, "the budget sees it at once");
        // Another process (a CLI turn) adds to the file meanwhile: both counts are kept.
        let cli = UsageLedger::new(dir.path(), "UTC".parse().unwrap());
        cli.add(Usage { input_tokens: 1000, output_tokens: 0 }, &[]);
        drop(cli);
        tokio::time::sleep(FLUSH_AFTER + std::time::Duration::from_secs(1)).await;
        // The delayed write runs on a blocking thread: wait for it in real time.
        for _ in 0..500 {
            if l.inner.read().days.values().map(|d| d.runs).sum::<u64>() == 11 {
                break;
            }
            tokio::task::yield_now().await;
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let on_disk = l.inner.read();
        let day = on_disk.days.values().next().copied().unwrap();
        assert_eq!(day, DayUsage { input_tokens: 1100, output_tokens: 10, runs: 11 });
        assert_eq!(l.today(), day, "nothing counted twice");
    }

    #[test]
    fn usage_is_counted_per_provider_too() {
        let dir = tempfile::tempdir().unwrap();
        let l = UsageLedger::new(dir.path(), "UTC".parse().unwrap());
        let u = |i, o| Usage { input_tokens: i, output_tokens: o };
        l.add(u(100, 10), &[("cloud".into(), u(60, 5)), ("lan".into(), u(40, 5))]);
        l.add(u(7, 3), &[("lan".into(), u(7, 3))]);
        assert_eq!(l.today().total(), 120);
        assert_eq!(l.today_of("cloud"), DayUsage { input_tokens: 60, output_tokens: 5, runs: 1 });
        assert_eq!(l.today_of("lan").total(), 55);
        use crate::provider::chain::Meter;
        assert_eq!(l.used_today("lan"), 55);
        assert_eq!(l.used_today("nobody"), 0);
        drop(l);
        let again = UsageLedger::new(dir.path(), "UTC".parse().unwrap());
        assert_eq!(again.today_of("lan").total(), 55, "kept in the file");
        assert_eq!(again.today_of("cloud").total(), 65);
        let text = std::fs::read_to_string(dir.path().join("usage.json")).unwrap();
        assert!(text.contains("\"providers\""), "{text}");
    }
}
