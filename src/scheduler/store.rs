//! `jobs.json`: the jobs and their run state, shared by the daemon and the CLI.
//!
//! Two processes edit the file: the daemon (run state after each run) and
//! `bramble cron add/remove/enable` while the daemon runs. So every change is
//! a read-modify-write under an advisory `flock` on `jobs.lock`
//! ([`JobStore::update`]): the file is re-read *under the lock*, changed, and
//! replaced atomically (temp + fsync + rename), so neither side loses the
//! other's edit and a power cut leaves the old or the new file, never half.
//!
//! A file that does not parse is never wiped: it is renamed to
//! `jobs.json.corrupt-<unix-ts>` and reported as [`StoreError::Corrupt`]; the
//! caller decides whether to go on with an empty list. Only the first reader
//! gets that error, so every later reader asks [`JobStore::corrupt_copies`]
//! and says so too (daemon start-up log, `bramble status`, `bramble cron
//! list`) until the user restores or deletes the kept copy.
//!
//! The daemon notices CLI edits cheaply with [`JobStore::stamp`] (inode, size,
//! mtime): one `stat` per wake-up instead of a read.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use jiff::Timestamp;
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use super::job::Job;
use crate::util::fs::write_atomic;

/// The file format version this code reads and writes.
pub const VERSION: u32 = 1;

/// Why the store could not be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path} was corrupt ({reason}); it was kept as {kept_as} and the job list starts empty")]
    Corrupt { path: PathBuf, kept_as: PathBuf, reason: String },
    #[error(
        "{path} has format version {found}; this bramble reads version {VERSION} (was it written by a newer bramble?)"
    )]
    Version { path: PathBuf, found: u32 },
    #[error("a job named `{0}` already exists")]
    NameTaken(String),
    #[error("no job with id or name `{0}`")]
    NotFound(String),
}

/// What identifies one version of `jobs.json` on disk: a changed stamp means
/// someone wrote it. `None` from [`JobStore::stamp`] means there is no file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub inode: u64,
    pub len: u64,
    pub mtime_ns: i128,
}

#[derive(Serialize, Deserialize)]
struct FileRepr {
    version: u32,
    jobs: Vec<Job>,
}

/// Handle on `<state_dir>/jobs.json`. Cheap; holds no open file. Any number of
/// handles (in any number of processes) may point at the same directory.
#[derive(Debug, Clone)]
pub struct JobStore {
    path: PathBuf,
    lock_path: PathBuf,
}

impl JobStore {
    /// The store in `state_dir` (created on first write).
    pub fn open(state_dir: &Path) -> JobStore {
        JobStore { path: state_dir.join("jobs.json"), lock_path: state_dir.join("jobs.lock") }
    }

    /// The path of `jobs.json`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// All jobs. A missing file is an empty list.
    pub fn load(&self) -> Result<Vec<Job>, StoreError> {
        let _lock = self.lock()?;
        self.read_locked()
    }

    /// All jobs (same as [`load`](Self::load)).
    pub fn list(&self) -> Result<Vec<Job>, StoreError> {
        self.load()
    }

    /// The job whose id or name is `key` (an exact id match wins).
    pub fn get(&self, key: &str) -> Result<Job, StoreError> {
        let jobs = self.load()?;
        find(&jobs, key).map(|i| jobs[i].clone()).ok_or_else(|| StoreError::NotFound(key.to_string()))
    }

    /// Read-modify-write under the lock: re-read the file, apply `f`, write the
    /// result atomically. If `f` fails nothing is written. Returns what `f` returns.
    pub fn update<R>(&self, f: impl FnOnce(&mut Vec<Job>) -> Result<R, StoreError>) -> Result<R, StoreError> {
        self.update_with_stamp(f).map(|(out, _)| out)
    }

    /// [`update`](Self::update), also returning the stamp of the file it wrote,
    /// taken under the lock: a later change by anyone else changes the stamp.
    pub fn update_with_stamp<R>(
        &self,
        f: impl FnOnce(&mut Vec<Job>) -> Result<R, StoreError>,
    ) -> Result<(R, Option<Stamp>), StoreError> {
        let _lock = self.lock()?;
        let mut jobs = self.read_locked()?;
        let out = f(&mut jobs)?;
        let repr = FileRepr { version: VERSION, jobs };
        let mut data = serde_json::to_vec_pretty(&repr).map_err(|e| self.io_err(io::Error::other(e)))?;
        data.push(b'\n');
        write_atomic(&self.path, &data).map_err(|e| self.io_err(e))?;
        Ok((out, self.stamp()))
    }

    /// [`load`](Self::load), also returning the stamp of what was read (taken under the lock).
    pub fn load_with_stamp(&self) -> Result<(Vec<Job>, Option<Stamp>), StoreError> {
        let _lock = self.lock()?;
        let stamp = self.stamp();
        Ok((self.read_locked()?, stamp))
    }

    /// Add a job; its name must be unique.
    pub fn add(&self, job: Job) -> Result<Job, StoreError> {
        self.update(|jobs| {
            if jobs.iter().any(|j| j.name == job.name) {
                return Err(StoreError::NameTaken(job.name.clone()));
            }
            jobs.push(job.clone());
            Ok(job)
        })
    }

    /// Remove a job by id or name; returns it.
    pub fn remove(&self, key: &str) -> Result<Job, StoreError> {
        self.update(|jobs| {
            let i = find(jobs, key).ok_or_else(|| StoreError::NotFound(key.to_string()))?;
            Ok(jobs.remove(i))
        })
    }

    /// Enable or disable a job by id or name; returns it.
    ///
    /// Enabling clears `next_run`, so the daemon plans the next run from *now*:
    /// recurring occurrences that passed while it was disabled are not "missed".
    /// A one-shot whose time passed while disabled goes through its catch-up
    /// policy (by default it runs once); a `done` one-shot stays done.
    pub fn set_enabled(&self, key: &str, enabled: bool) -> Result<Job, StoreError> {
        self.update(|jobs| {
            let i = find(jobs, key).ok_or_else(|| StoreError::NotFound(key.to_string()))?;
            let job = &mut jobs[i];
            if enabled && !job.enabled {
                job.state.next_run = None;
            }
            job.enabled = enabled;
            Ok(job.clone())
        })
    }

    /// Remove the jobs that are done (a one-shot that ran, a job past its
    /// `max_runs` or `until`) and last ran (or were made, if they never ran)
    /// before `before`. Writes only when there is one. Returns them.
    pub fn prune_done(&self, before: Timestamp) -> Result<Vec<Job>, StoreError> {
        let old = |j: &Job| j.state.done && j.state.last_run.unwrap_or(j.created) < before;
        if !self.load()?.iter().any(old) {
            return Ok(Vec::new());
        }
        self.update(|jobs| {
            let (gone, kept): (Vec<Job>, Vec<Job>) = std::mem::take(jobs).into_iter().partition(old);
            *jobs = kept;
            Ok(gone)
        })
    }

    /// Copies of a corrupt `jobs.json` kept aside in the state directory
    /// (`jobs.json.corrupt-<unix-ts>`), oldest first. Non-empty means jobs
    /// were lost from the live list until the user restores or removes them.
    pub fn corrupt_copies(&self) -> Vec<PathBuf> {
        let Some(dir) = self.path.parent() else { return Vec::new() };
        let Ok(entries) = fs::read_dir(dir) else { return Vec::new() };
        let mut out: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with("jobs.json.corrupt-"))
            .map(|e| e.path())
            .collect();
        out.sort();
        out
    }

    /// One line for users about [`corrupt_copies`](Self::corrupt_copies), if any.
    pub fn corrupt_notice(&self) -> Option<String> {
        let copies = self.corrupt_copies();
        let newest = copies.last()?;
        let more = if copies.len() > 1 { format!(" ({} copies in all)", copies.len()) } else { String::new() };
        Some(format!(
            "{} was corrupt and set aside: its jobs are not loaded; the copy is kept at {}{more} \
             (fix and move it back to restore the jobs, or delete it)",
            self.path.display(),
            newest.display()
        ))
    }

    /// The current stamp of `jobs.json`, `None` if it does not exist.
    pub fn stamp(&self) -> Option<Stamp> {
        let m = fs::metadata(&self.path).ok()?;
        let mtime_ns = i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec());
        Some(Stamp { inode: m.ino(), len: m.len(), mtime_ns })
    }

    /// Whether `jobs.json` changed since `stamp` was taken.
    pub fn changed_since(&self, stamp: Option<Stamp>) -> bool {
        self.stamp() != stamp
    }

    fn lock(&self) -> Result<Flock<File>, StoreError> {
        let f = crate::util::fs::open_lock_file(&self.lock_path)
            .map_err(|e| StoreError::Io { path: self.lock_path.clone(), source: e })?;
        // flock(2), exclusive: released when the guard is dropped or the process
        // dies. nix's `Flock` rather than std's `File::lock` (the same call) for
        // the EINTR case: retried if a signal (SIGHUP) interrupts the wait.
        let mut file = f;
        loop {
            match Flock::lock(file, FlockArg::LockExclusive) {
                Ok(guard) => return Ok(guard),
                Err((f, Errno::EINTR)) => file = f,
                Err((_, e)) => return Err(StoreError::Io { path: self.lock_path.clone(), source: e.into() }),
            }
        }
    }

    fn read_locked(&self) -> Result<Vec<Job>, StoreError> {
        let data = match fs::read(&self.path) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(self.io_err(e)),
        };
        // Look at the version first, so a newer format is refused, not moved aside.
        #[derive(Deserialize)]
        struct Head {
            version: u32,
        }
        let reason = match serde_json::from_slice::<Head>(&data) {
            Ok(Head { version }) if version != VERSION => {
                return Err(StoreError::Version { path: self.path.clone(), found: version })
            }
            Ok(_) => match serde_json::from_slice::<FileRepr>(&data) {
                Ok(repr) => return Ok(repr.jobs),
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        };
        let kept_as = self.path.with_file_name(format!("jobs.json.corrupt-{}", Timestamp::now().as_second()));
        fs::rename(&self.path, &kept_as).map_err(|e| self.io_err(e))?;
        Err(StoreError::Corrupt { path: self.path.clone(), kept_as, reason })
    }

    fn io_err(&self, source: io::Error) -> StoreError {
        StoreError::Io { path: self.path.clone(), source }
    }
}

/// Index of the job with id `key`, else the job named `key`.
pub fn find(jobs: &[Job], key: &str) -> Option<usize> {
    jobs.iter().position(|j| j.id == key).or_else(|| jobs.iter().position(|j| j.name == key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::job::JobKind;
    use crate::scheduler::schedule::parse_cron;
    use jiff::tz::TimeZone;

    fn job(name: &str) -> Job {
        Job::new(
            name,
            parse_cron("0 9 * * *", None).unwrap(),
            JobKind::Remind { text: "hi".into() },
            vec![],
            "2026-05-01T10:00:00Z".parse().unwrap(),
            &TimeZone::UTC,
        )
        .unwrap()
    }

    #[test]
    fn crud_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let store = JobStore::open(&dir.path().join("state"));
        assert!(store.list().unwrap().is_empty());
        let a = store.add(job("a")).unwrap();
        store.add(job("b")).unwrap();
        assert!(matches!(store.add(job("a")), Err(StoreError::NameTaken(n)) if n == "a"));
        assert_eq!(store.get("a").unwrap().id, a.id);
        assert_eq!(store.get(&a.id).unwrap().name, "a");
        assert!(matches!(store.get("zzz"), Err(StoreError::NotFound(_))));

        let off = store.set_enabled("a", false).unwrap();
        assert!(!off.enabled && off.state.next_run.is_some());
        let on = store.set_enabled(&a.id, true).unwrap();
        assert!(on.enabled && on.state.next_run.is_none(), "enable re-plans from now");

        assert_eq!(store.remove("b").unwrap().name, "b");
        assert!(matches!(store.remove("b"), Err(StoreError::NotFound(_))));
        let names: Vec<_> = store.list().unwrap().into_iter().map(|j| j.name).collect();
        assert_eq!(names, ["a"]);
        let text = fs::read_to_string(store.path()).unwrap();
        assert!(text.contains("\"version\": 1"), "{text}");
    }

    #[test]
    fn a_second_handle_sees_edits_and_the_stamp_changes() {
        let dir = tempfile::tempdir().unwrap();
        let daemon = JobStore::open(dir.path());
        let cli = JobStore::open(dir.path());
        let before = daemon.stamp();
        assert!(before.is_none());
        assert!(!daemon.changed_since(before));
        cli.add(job("x")).unwrap();
        assert!(daemon.changed_since(before));
        let s1 = daemon.stamp();
        assert!(!daemon.changed_since(s1));
        // The daemon's update re-reads under the lock and keeps the CLI's job.
        daemon
            .update(|jobs| {
                jobs[0].state.last_error = Some("e".into());
                Ok(())
            })
            .unwrap();
        cli.add(job("y")).unwrap();
        let jobs = daemon.load().unwrap();
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[0].state.last_error.as_deref(), Some("e"));
        assert!(daemon.changed_since(s1));
    }

    #[test]
    fn concurrent_updates_from_threads_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let store = JobStore::open(&path);
                    for i in 0..10 {
                        store.add(job(&format!("t{t}-{i}"))).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(JobStore::open(&path).list().unwrap().len(), 40);
    }

    #[test]
    fn a_failed_update_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = JobStore::open(dir.path());
        store.add(job("a")).unwrap();
        let s = store.stamp();
        let r: Result<(), _> = store.update(|jobs| {
            jobs.clear();
            Err(StoreError::NotFound("x".into()))
        });
        assert!(r.is_err());
        assert!(!store.changed_since(s));
        assert_eq!(store.list().unwrap().len(), 1);
    }

    #[test]
    fn corrupt_file_is_kept_aside_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let store = JobStore::open(dir.path());
        fs::write(store.path(), b"{\"version\":1,\"jobs\":[{\"id\":").unwrap();
        match store.load() {
            Err(StoreError::Corrupt { path, kept_as, reason }) => {
                assert_eq!(path, store.path());
                assert!(kept_as.file_name().unwrap().to_string_lossy().starts_with("jobs.json.corrupt-"));
                assert_eq!(fs::read(&kept_as).unwrap(), b"{\"version\":1,\"jobs\":[{\"id\":");
                assert!(!reason.is_empty());
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
        // The caller decided to go on: the list is empty and writable again.
        assert!(store.load().unwrap().is_empty());
        store.add(job("fresh")).unwrap();
        assert_eq!(store.list().unwrap().len(), 1);
    }

    #[test]
    fn a_newer_version_is_refused_not_moved() {
        let dir = tempfile::tempdir().unwrap();
        let store = JobStore::open(dir.path());
        fs::write(store.path(), br#"{"version":2,"jobs":[],"more":true}"#).unwrap();
        assert!(matches!(store.load(), Err(StoreError::Version { found: 2, .. })));
        assert!(store.path().exists());
        assert!(store.add(job("a")).is_err(), "must not overwrite a newer file");
    }
}
