//! Small filesystem helpers: atomic replace, durable appends.
//!
//! State files (jobs, outbox, offsets) are replaced atomically: write a temp
//! file in the same directory, fsync it, rename it over the target, fsync the
//! directory. A power cut leaves either the old or the new file, never half of
//! one — the failure SD-card boards see most.
//!
//! State is private: conversations, offsets, usage and reports are nobody
//! else's business on a shared board. Every directory made here is 0700 and
//! every file 0600 (whatever the umask), and the daemon tightens a state
//! directory left more open by an older version ([`make_private`]).
//!
//! One exception, made by the administrator: a state directory that is
//! group-`rwx` (the .deb's `/var/lib/bramble`, 0770 `bramble:bramble`) shares
//! the few files the job commands need — `jobs.json` and its lock, the open
//! alerts — with that group, so its members manage the service's jobs
//! without sudo ([`write_atomic_shared`], [`open_shared_lock_file`]): such a
//! file is given the directory's group and mode 0660, whoever writes it.
//! Everything else (sessions, the outbox, pending turns, usage) stays 0600
//! and its directories 0700 even there.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Mode of the directories bramble creates for its state.
pub const DIR_MODE: u32 = 0o700;
/// Mode of the files bramble writes there.
pub const FILE_MODE: u32 = 0o600;

/// Create `dir` and its missing parents with mode 0700.
pub fn create_private_dir(dir: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir)
}

/// Make an existing directory 0700 if others may read or enter it (0770 if
/// it is shared with its group: see [`shared_group`]). Returns whether it
/// changed the mode (the caller logs that once).
pub fn make_private(dir: &Path) -> io::Result<bool> {
    let mode = std::fs::metadata(dir)?.permissions().mode();
    let keep = if mode & 0o070 == 0o070 { 0o770 } else { 0o700 };
    if mode & 0o777 & !keep == 0 {
        return Ok(false);
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode & !0o777 | keep))?;
    Ok(true)
}

/// [`write_atomic`] without the directory's fsync: after a power cut `path`
/// is the old file or the new one, each whole, but the replacement may be
/// lost. For state whose last change may be lost (the usage ledger); one
/// flush fewer than [`write_atomic`].
pub fn write_atomic_relaxed(path: &Path, data: &[u8]) -> io::Result<()> {
    replace(path, data, None, false)
}

/// The group `dir` shares its job files with: its group, when the group may
/// read, write and enter it (and others may not write). `None`: private.
pub fn shared_group(dir: &Path) -> Option<nix::unistd::Gid> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(dir).ok()?;
    (m.is_dir() && m.mode() & 0o070 == 0o070 && m.mode() & 0o002 == 0).then(|| nix::unistd::Gid::from_raw(m.gid()))
}

/// Give a file of ours the shared group and mode 0660 (whatever the umask).
fn share(file: &File, gid: nix::unistd::Gid) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let m = file.metadata()?;
    if m.gid() != gid.as_raw() {
        nix::unistd::fchown(file, None, Some(gid)).map_err(io::Error::from)?;
    }
    if m.mode() & 0o777 != 0o660 {
        file.set_permissions(std::fs::Permissions::from_mode(0o660))?;
    }
    Ok(())
}

/// [`write_atomic`] for a file shared with the directory's group (see
/// [`shared_group`]): in a shared directory the new file is 0660 and the
/// directory's group; elsewhere exactly [`write_atomic`].
pub fn write_atomic_shared(path: &Path, data: &[u8]) -> io::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    replace(path, data, shared_group(dir), true)
}

/// [`open_lock_file`] for a lock shared with the directory's group: created
/// 0660 with the directory's group in a shared directory (and made so if we
/// own it and it is not yet).
pub fn open_shared_lock_file(path: &Path) -> io::Result<File> {
    let file = open_lock_file(path)?;
    if let Some(gid) = path.parent().and_then(shared_group) {
        if file.metadata().is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == nix::unistd::geteuid().as_raw()) {
            share(&file, gid)?;
        }
    }
    Ok(file)
}

/// In a shared directory, make each existing file of `names` that we own
/// 0660 with the directory's group (files written before it was shared).
/// Returns how many changed.
pub fn share_existing(dir: &Path, names: &[&str]) -> io::Result<usize> {
    use std::os::unix::fs::MetadataExt;
    let Some(gid) = shared_group(dir) else { return Ok(0) };
    let mut changed = 0;
    for name in names {
        // O_NOFOLLOW: a link planted in the state directory is not followed.
        let file = match OpenOptions::new().read(true).custom_flags(nix::libc::O_NOFOLLOW).open(dir.join(name)) {
            Ok(f) => f,
            Err(_) => continue,
        };
        let m = file.metadata()?;
        if !m.is_file() || m.uid() != nix::unistd::geteuid().as_raw() {
            continue;
        }
        if m.gid() != gid.as_raw() || m.mode() & 0o777 != 0o660 {
            share(&file, gid)?;
            changed += 1;
        }
    }
    Ok(changed)
}

/// Open (creating it 0600, and its directory 0700) the file at `path` for an
/// advisory lock; its content is never written.
pub fn open_lock_file(path: &Path) -> io::Result<File> {
    if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_private_dir(dir)?;
    }
    OpenOptions::new().create(true).truncate(false).write(true).mode(FILE_MODE).open(path)
}

/// Replace `path` with `data` atomically (temp + fsync + rename + dir fsync).
pub fn write_atomic(path: &Path, data: &[u8]) -> io::Result<()> {
    replace(path, data, None, true)
}

/// Temp file (0600, or 0660 with `group`) in the same directory, data,
/// fsync, rename over `path`; then the directory's fsync if `durable`.
fn replace(path: &Path, data: &[u8], group: Option<nix::unistd::Gid>, durable: bool) -> io::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    create_private_dir(dir)?;
    // tempfile creates the file 0600; the rename keeps that mode.
    let mut tmp = tempfile::Builder::new().prefix(".tmp-").tempfile_in(dir)?;
    if let Some(gid) = group {
        share(tmp.as_file(), gid)?;
    }
    tmp.write_all(data)?;
    // The data before the rename, or a power cut could leave the new name on an empty file.
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    if durable {
        sync_dir(dir)?;
    }
    Ok(())
}

/// Append `data` to `path` (created if missing) with one write, then fsync.
///
/// One `write` on an `O_APPEND` file lands as a unit for regular files, so a
/// reader never sees two appends interleaved; a power cut may leave a torn
/// tail, which readers of append-only files must tolerate.
pub fn append_durable(path: &Path, data: &[u8]) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        create_private_dir(dir)?;
    }
    let mut f = OpenOptions::new().create(true).append(true).mode(FILE_MODE).open(path)?;
    f.write_all(data)?;
    f.sync_data()
}

/// fsync a directory so a rename or a new file in it is durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Write `data` to `path` unless it exists. Returns whether it wrote.
pub fn write_new(path: &Path, data: &[u8]) -> io::Result<bool> {
    if let Some(dir) = path.parent() {
        create_private_dir(dir)?;
    }
    match OpenOptions::new().write(true).create_new(true).mode(FILE_MODE).open(path) {
        Ok(mut f) => {
            f.write_all(data)?;
            f.sync_all()?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state/jobs.json");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(p.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("jobs.json")]);
    }

    #[test]
    fn write_new_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a/SOUL.md");
        assert!(write_new(&p, b"first").unwrap());
        assert!(!write_new(&p, b"second").unwrap());
        assert_eq!(std::fs::read(&p).unwrap(), b"first");
    }

    #[test]
    fn state_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let state = dir.path().join("state");
        append_durable(&state.join("sessions/a.jsonl"), b"x\n").unwrap();
        write_atomic(&state.join("jobs.json"), b"{}").unwrap();
        write_new(&state.join("x/new"), b"n").unwrap();
        drop(open_lock_file(&state.join("locks/.lock")).unwrap());
        for d in ["", "sessions", "x", "locks"] {
            assert_eq!(mode(&state.join(d)), 0o700, "{d}");
        }
        for f in ["sessions/a.jsonl", "jobs.json", "x/new", "locks/.lock"] {
            assert_eq!(mode(&state.join(f)), 0o600, "{f}");
        }
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(make_private(&state).unwrap());
        assert_eq!(mode(&state), 0o700);
        assert!(!make_private(&state).unwrap(), "already private");
    }

    #[test]
    fn a_group_shared_directory_shares_the_job_files_and_nothing_else() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        create_private_dir(&state).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
        // Private: the shared writers write private files.
        write_atomic_shared(&state.join("jobs.json"), b"{}").unwrap();
        assert_eq!(mode(&state.join("jobs.json")), 0o600);
        assert_eq!(share_existing(&state, &["jobs.json"]).unwrap(), 0);
        // Shared with its group (0770): 0660, the directory's group.
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o770)).unwrap();
        assert!(!make_private(&state).unwrap(), "a shared directory stays shared");
        assert_eq!(share_existing(&state, &["jobs.json", "missing"]).unwrap(), 1, "written before");
        assert_eq!(mode(&state.join("jobs.json")), 0o660);
        write_atomic_shared(&state.join("alerts.json"), b"{}").unwrap();
        drop(open_shared_lock_file(&state.join("jobs.lock")).unwrap());
        let gid = std::fs::metadata(&state).unwrap().gid();
        for f in ["alerts.json", "jobs.lock"] {
            assert_eq!(mode(&state.join(f)), 0o660, "{f}");
            assert_eq!(std::fs::metadata(state.join(f)).unwrap().gid(), gid, "{f}");
        }
        // The rest stays private.
        write_atomic(&state.join("usage.json"), b"{}").unwrap();
        append_durable(&state.join("sessions/a.jsonl"), b"x\n").unwrap();
        assert_eq!(mode(&state.join("usage.json")), 0o600);
        assert_eq!(mode(&state.join("sessions")), 0o700);
        // Others never: 0777 becomes 0770.
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(shared_group(&state), None, "world-writable is not shared");
        assert!(make_private(&state).unwrap());
        assert_eq!(mode(&state), 0o770);
    }

    #[test]
    fn appends_accumulate() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.jsonl");
        append_durable(&p, b"a\n").unwrap();
        append_durable(&p, b"b\n").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "a\nb\n");
    }
}
