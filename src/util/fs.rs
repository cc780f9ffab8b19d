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

/// Make an existing directory 0700 if others may read or enter it. Returns
/// whether it changed the mode (the caller logs that once).
pub fn make_private(dir: &Path) -> io::Result<bool> {
    let mode = std::fs::metadata(dir)?.permissions().mode();
    if mode & 0o077 == 0 {
        return Ok(false);
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode & 0o700 | 0o700))?;
    Ok(true)
}

/// [`write_atomic`] without the directory's fsync: after a power cut `path`
/// is the old file or the new one, each whole, but the replacement may be
/// lost. For state whose last change may be lost (the usage ledger); one
/// flush fewer than [`write_atomic`].
pub fn write_atomic_relaxed(path: &Path, data: &[u8]) -> io::Result<()> {
    replace(path, data, false)
}

/// Open (creating it 0600, and its directory 0700) the file at `path` for an
/// advisory lock; its content is never written.
pub fn open_lock_file(path: &Path) -> io::Result<File> {
    if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_private_dir(dir)?;
    }
    OpenOptions::new().create(true).truncate(false).write(true).mode(FILE_MODE).open(path)
}

/// Open `path` for appending, creating it 0600 (no fsync: records that may be lost to a power cut).
pub fn open_append_private(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).mode(FILE_MODE).open(path)
}

/// Replace `path` with `data` atomically (temp + fsync + rename + dir fsync).
pub fn write_atomic(path: &Path, data: &[u8]) -> io::Result<()> {
    replace(path, data, true)
}

/// Temp file (0600) in the same directory, data, fsync, rename over `path`;
/// then the directory's fsync if `durable`.
fn replace(path: &Path, data: &[u8], durable: bool) -> io::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    create_private_dir(dir)?;
    // tempfile creates the file 0600; the rename keeps that mode.
    let mut tmp = tempfile::Builder::new().prefix(".tmp-").tempfile_in(dir)?;
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
    fn appends_accumulate() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.jsonl");
        append_durable(&p, b"a\n").unwrap();
        append_durable(&p, b"b\n").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "a\nb\n");
    }
}
