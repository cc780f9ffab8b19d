//! Token usage per day, for `[agent] daily_token_budget` and `/status`.
//!
//! `<state>/usage.json` holds the totals of the last two months, by local date
//! in the configured time zone. It is written when a turn (or a consolidation,
//! or a sub-agent) ends — not on a timer — with an atomic replace under an
//! advisory lock shared with other bramble processes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct UsageFile {
    #[serde(default)]
    days: BTreeMap<String, DayUsage>,
}

/// The usage ledger of a state directory.
#[derive(Debug, Clone)]
pub struct UsageLedger {
    path: PathBuf,
    tz: TzName,
}

impl UsageLedger {
    pub fn new(state_dir: &Path, tz: TzName) -> UsageLedger {
        UsageLedger { path: state_dir.join("usage.json"), tz }
    }

    fn today_key(&self) -> String {
        jiff::Timestamp::now().to_zoned(self.tz.tz().clone()).strftime("%Y-%m-%d").to_string()
    }

    fn read(&self) -> UsageFile {
        match std::fs::read(&self.path) {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
                tracing::warn!(file = %self.path.display(), "unreadable usage file, starting a new one: {e}");
                UsageFile::default()
            }),
            Err(_) => UsageFile::default(),
        }
    }

    /// Today's totals (local date).
    pub fn today(&self) -> DayUsage {
        self.read().days.get(&self.today_key()).copied().unwrap_or_default()
    }

    /// Add one run's usage to today's totals; returns them.
    pub fn add(&self, usage: Usage) -> std::io::Result<DayUsage> {
        let lock = crate::util::fs::open_lock_file(&self.path.with_extension("lock"))?;
        let _lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| std::io::Error::from_raw_os_error(e as i32))?;
        let mut file = self.read();
        let day = file.days.entry(self.today_key()).or_default();
        day.input_tokens += usage.input_tokens;
        day.output_tokens += usage.output_tokens;
        day.runs += 1;
        let today = *day;
        while file.days.len() > DAYS_KEPT {
            let Some(oldest) = file.days.keys().next().cloned() else { break };
            file.days.remove(&oldest);
        }
        let body = serde_json::to_vec_pretty(&file).map_err(std::io::Error::other)?;
        util::fs::write_atomic(&self.path, &body)?;
        Ok(today)
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
        l.add(Usage { input_tokens: 100, output_tokens: 20 }).unwrap();
        let t = l.add(Usage { input_tokens: 5, output_tokens: 1 }).unwrap();
        assert_eq!(t, DayUsage { input_tokens: 105, output_tokens: 21, runs: 2 });
        let again = UsageLedger::new(dir.path(), "UTC".parse().unwrap());
        assert_eq!(again.today().total(), 126);
        std::fs::write(dir.path().join("usage.json"), "{garbage").unwrap();
        assert_eq!(again.today(), DayUsage::default(), "a corrupt file is not fatal");
    }
}
