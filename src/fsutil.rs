//! Small filesystem helpers: atomic replace, durable appends.
//!
//! State files (jobs, outbox, offsets) are replaced atomically: write a temp
//! file in the same directory, fsync it, rename it over the target, fsync the
//! directory. A power cut leaves either the old or the new file, never half of
//! one — the failure SD-card boards see most.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

/// Replace `path` with `data` atomically (temp + fsync + rename + dir fsync).
pub fn write_atomic(path: &Path, data: &[u8]) -> io::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let mut tmp = tempfile::Builder::new().prefix(".tmp-").tempfile_in(dir)?;
    tmp.write_all(data)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    sync_dir(dir)
}

/// Append `data` to `path` (created if missing) with one write, then fsync.
///
/// One `write` on an `O_APPEND` file lands as a unit for regular files, so a
/// reader never sees two appends interleaved; a power cut may leave a torn
/// tail, which readers of append-only files must tolerate.
pub fn append_durable(path: &Path, data: &[u8]) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    let mut f = OpenOptions::new().create(true).append(true).open(path)?;
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
        fs::create_dir_all(dir)?;
    }
    match OpenOptions::new().write(true).create_new(true).open(path) {
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
        assert_eq!(fs::read(&p).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(p.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("jobs.json")]);
    }

    #[test]
    fn write_new_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a/SOUL.md");
        assert!(write_new(&p, b"first").unwrap());
        assert!(!write_new(&p, b"second").unwrap());
        assert_eq!(fs::read(&p).unwrap(), b"first");
    }

    #[test]
    fn appends_accumulate() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.jsonl");
        append_durable(&p, b"a\n").unwrap();
        append_durable(&p, b"b\n").unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "a\nb\n");
    }
}
