//! The workspace, opened safely: the one way bramble reaches files in it.
//!
//! The workspace belongs to the agent, and so to whatever the agent's commands
//! did to it: every file there may have been written by an attacker. A command
//! can plant a symlink (`AGENTS.md -> /proc/self/environ`,
//! `memory/history.jsonl -> /root/.bashrc`, `memory -> /etc`), a FIFO (an
//! `open()` that never returns, stalling the daemon's only runtime thread) or
//! a device (`IDENTITY.md -> /dev/zero`, an endless read). bramble itself runs
//! outside the sandbox, so a plain `std::fs` call on such a path does for the
//! command what its sandbox forbids. Hence this module, used by the model's
//! file tools *and* by bramble's own reads and writes (the context builder,
//! skills, memory, the heartbeat, `bramble status`, `bramble init`).
//!
//! Checking a path string and then opening it is racy (a component can be
//! swapped for a symlink in between), so the kernel resolves every path for us
//! relative to a descriptor of the workspace root:
//!
//! - `openat2(2)` with `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS` refuses any
//!   resolution that leaves the root, including through `..`, absolute
//!   symlinks and symlinks whose target lies outside (Linux 5.6+).
//! - Where `openat2` does not exist (`ENOSYS`), [`Workspace`] walks the path
//!   one component at a time with `O_NOFOLLOW`, reading each symlink itself and
//!   splicing its (relative) target back in, so `..` can never pop above the
//!   root descriptor.
//!
//! Two kinds of [`Workspace`]:
//!
//! - [`Workspace::new`], for the model's file tools: symlinks that stay inside
//!   the workspace are followed (the model may organise its files with links).
//! - [`Workspace::strict`], for bramble's own files: no symlink is followed at
//!   all (`RESOLVE_NO_SYMLINKS`; the walk refuses any link), reads open with
//!   `O_NONBLOCK | O_NOCTTY`, check that the file is a regular file *after*
//!   the open (on the descriptor, not the name) and read at most a cap, and
//!   every write creates its parent directories beneath the root itself.
//!
//! Writes replace the file atomically (temp file in the same directory, fsync,
//! `renameat`), which never follows a symlink at the final component.
//! The functions here block: async callers run them in `spawn_blocking`.
//!
//! A leading `~/` means the workspace root (commands run with `HOME` set to
//! it), and an absolute path inside the workspace is accepted as relative.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};

use nix::errno::Errno;
use nix::fcntl::{openat, readlinkat, renameat, AtFlags, OFlag};
use nix::sys::stat::{fchmod, fstat, fstatat, mkdirat, FileStat, Mode};
use nix::unistd::{fsync, unlinkat, UnlinkatFlags};

/// Symlinks followed in one resolution, as the kernel's own limit.
const MAX_LINKS: u32 = 40;

/// Why a path could not be used. The text is what the model (or the log) reads.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    #[error("path escapes the workspace: {0}")]
    Escapes(String),
    #[error("no such file or directory: {0}")]
    NotFound(String),
    #[error("not a directory: {0}")]
    NotADirectory(String),
    #[error("{0} is a directory")]
    IsADirectory(String),
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    #[error("too many levels of symbolic links: {0}")]
    Loop(String),
    #[error("{0} is a symbolic link; name the file it points to instead")]
    Symlink(String),
    #[error("{0} is a symbolic link; bramble does not follow links for its own files")]
    LinkRefused(String),
    #[error("{0} is not a regular file (a FIFO, device or socket)")]
    NotRegular(String),
    #[error("invalid path: {0:?}")]
    Invalid(String),
    #[error("the workspace {root} cannot be opened: {source}")]
    Root { root: PathBuf, source: Errno },
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
}

impl PathError {
    pub fn from_errno(errno: Errno, path: &str) -> PathError {
        let path = path.to_string();
        match errno {
            Errno::EXDEV => PathError::Escapes(path),
            Errno::ENOENT => PathError::NotFound(path),
            Errno::ENOTDIR => PathError::NotADirectory(path),
            Errno::EISDIR => PathError::IsADirectory(path),
            Errno::EACCES | Errno::EPERM => PathError::PermissionDenied(path),
            Errno::ELOOP => PathError::Loop(path),
            Errno::EINVAL => PathError::Invalid(path),
            other => PathError::Io { path, source: io::Error::from(other) },
        }
    }

    /// The file, or the whole workspace, does not exist.
    pub fn is_missing(&self) -> bool {
        matches!(self, PathError::NotFound(_) | PathError::Root { source: Errno::ENOENT, .. })
    }

    pub fn io(err: io::Error, path: &str) -> PathError {
        match err.raw_os_error() {
            Some(code) => PathError::from_errno(Errno::from_raw(code), path),
            None => PathError::Io { path: path.to_string(), source: err },
        }
    }
}

/// How paths are resolved beneath the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// `openat2` with `RESOLVE_BENEATH` (the kernel does the confinement).
    Openat2,
    /// Component-wise walk with `O_NOFOLLOW` (kernels without `openat2`).
    Walk,
}

/// Whether this kernel has `openat2`: 0 not yet known, 1 yes, 2 no.
static OPENAT2: AtomicU8 = AtomicU8::new(0);

/// The resolution this process uses, once the first path has been resolved (`None` before).
pub fn resolution() -> Option<Resolution> {
    match OPENAT2.load(Ordering::Relaxed) {
        1 => Some(Resolution::Openat2),
        2 => Some(Resolution::Walk),
        _ => None,
    }
}

/// The workspace root and the only way bramble reaches files in it.
#[derive(Debug, Clone)]
pub struct Workspace {
    root: PathBuf,
    /// Tests force the fallback walk to exercise it on kernels that have `openat2`.
    force_walk: bool,
    /// Refuse every symlink (bramble's own files), not only those leading out.
    strict: bool,
}

impl Workspace {
    /// For the model's file tools: symlinks inside the workspace are followed.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Workspace { root: root.into(), force_walk: false, strict: false }
    }

    /// For bramble's own files: no symlink is followed, anywhere in the path.
    pub fn strict(root: impl Into<PathBuf>) -> Self {
        Workspace { root: root.into(), force_walk: false, strict: true }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Turn a model's path into one relative to the root, without touching the
    /// filesystem: `~/x` → `x`, `/<root>/x` → `x`; any other absolute path, or
    /// `..` that climbs above the root, is refused. Returns `.` for the root.
    /// Symlinks are checked when the path is opened, not here.
    pub fn relative(&self, path: &str) -> Result<PathBuf, PathError> {
        if path.is_empty() {
            return Err(PathError::Invalid(path.to_string()));
        }
        if path.contains('\0') {
            return Err(PathError::Invalid(path.to_string()));
        }
        let given = Path::new(path);
        let rel: &Path = if path == "~" {
            Path::new(".")
        } else if let Some(rest) = path.strip_prefix("~/") {
            Path::new(rest)
        } else if given.has_root() {
            self.strip_root(given).ok_or_else(|| PathError::Escapes(path.to_string()))?
        } else {
            given
        };
        let mut out = PathBuf::new();
        let mut depth = 0usize;
        for c in rel.components() {
            match c {
                Component::CurDir => {}
                Component::ParentDir => {
                    depth = depth.checked_sub(1).ok_or_else(|| PathError::Escapes(path.to_string()))?;
                    out.push("..");
                }
                Component::Normal(name) => {
                    depth += 1;
                    out.push(name);
                }
                Component::RootDir | Component::Prefix(_) => return Err(PathError::Escapes(path.to_string())),
            }
        }
        if out.as_os_str().is_empty() {
            out.push(".");
        }
        Ok(out)
    }

    /// The part of an absolute `path` below the root, if it is below the root
    /// (as configured, or with the root's symlinks resolved).
    fn strip_root<'p>(&self, path: &'p Path) -> Option<&'p Path> {
        if let Ok(rest) = path.strip_prefix(&self.root) {
            return Some(rest);
        }
        let canonical = std::fs::canonicalize(&self.root).ok()?;
        path.strip_prefix(canonical).ok()
    }

    fn open_root(&self) -> Result<OwnedFd, PathError> {
        nix::fcntl::open(&self.root, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(|source| PathError::Root { root: self.root.clone(), source })
    }

    /// Open `path` (a model's path) beneath the root with `flags`.
    pub fn open(&self, path: &str, flags: OFlag) -> Result<OwnedFd, PathError> {
        let rel = self.relative(path)?;
        let root = self.open_root()?;
        self.open_beneath(root.as_fd(), &rel, flags, Mode::empty()).map_err(|e| self.error(e, path))
    }

    /// `errno` for `path`, with a refused link named as such in strict mode.
    fn error(&self, errno: Errno, path: &str) -> PathError {
        match errno {
            Errno::ELOOP if self.strict => PathError::LinkRefused(path.to_string()),
            other => PathError::from_errno(other, path),
        }
    }

    /// An existing directory beneath the root, as an absolute path (a command's working directory).
    pub fn dir_path(&self, path: &str) -> Result<PathBuf, PathError> {
        let rel = self.relative(path)?;
        let root = self.open_root()?;
        let fd = self
            .open_beneath(root.as_fd(), &rel, OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(|e| self.error(e, path))?;
        // The kernel knows where the checked descriptor really is; fall back to the lexical join.
        let real = std::fs::read_link(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd)));
        Ok(real.ok().filter(|p| p.is_absolute()).unwrap_or_else(|| self.root.join(&rel)))
    }

    /// Resolve `rel` beneath `root` and open it: `openat2` when the kernel has it, else the walk.
    fn open_beneath(&self, root: BorrowedFd<'_>, rel: &Path, flags: OFlag, mode: Mode) -> nix::Result<OwnedFd> {
        if !self.force_walk && OPENAT2.load(Ordering::Relaxed) != 2 {
            use nix::fcntl::{openat2, OpenHow, ResolveFlag};
            let mut resolve = ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS;
            if self.strict {
                resolve |= ResolveFlag::RESOLVE_NO_SYMLINKS;
            }
            let how = OpenHow::new().flags(flags | OFlag::O_CLOEXEC).mode(mode).resolve(resolve);
            // EAGAIN: a concurrent rename raced a `..`; the kernel asks us to retry.
            for _ in 0..8 {
                match openat2(root, rel, how) {
                    Err(Errno::EAGAIN) => continue,
                    Err(Errno::ENOSYS) => {
                        OPENAT2.store(2, Ordering::Relaxed);
                        break;
                    }
                    result => {
                        OPENAT2.store(1, Ordering::Relaxed);
                        return result;
                    }
                }
            }
            if OPENAT2.load(Ordering::Relaxed) != 2 {
                return Err(Errno::EAGAIN);
            }
        }
        walk_beneath(root, rel, flags, mode, self.strict)
    }

    /// Open the directory `rel` beneath `root`, creating missing components
    /// one `mkdirat` at a time (each in a directory already checked to be beneath).
    fn ensure_dir(&self, root: BorrowedFd<'_>, rel: &Path) -> nix::Result<OwnedFd> {
        let dir_flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let mut dir = self.open_beneath(root, Path::new("."), dir_flags, Mode::empty())?;
        let mut prefix = PathBuf::new();
        for c in rel.components() {
            let Component::Normal(name) = c else {
                if c == Component::ParentDir {
                    prefix.push("..");
                    dir = self.open_beneath(root, &prefix, dir_flags, Mode::empty())?;
                }
                continue;
            };
            prefix.push(name);
            dir = match self.open_beneath(root, &prefix, dir_flags, Mode::empty()) {
                Err(Errno::ENOENT) => {
                    match mkdirat(&dir, name, Mode::from_bits_truncate(0o755)) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => return Err(e),
                    }
                    self.open_beneath(root, &prefix, dir_flags, Mode::empty())?
                }
                other => other?,
            };
        }
        Ok(dir)
    }

    /// Read a whole (regular) file of at most `cap` bytes.
    pub fn read_all(&self, path: &str, cap: u64) -> Result<Vec<u8>, PathError> {
        let (file, stat) = self.open_regular(path)?;
        if stat.st_size as u64 > cap {
            return Err(PathError::Io {
                path: path.to_string(),
                source: io::Error::other(format!("file is too large ({} bytes, limit {cap})", stat.st_size)),
            });
        }
        let mut data = Vec::new();
        file.take(cap).read_to_end(&mut data).map_err(|e| PathError::io(e, path))?;
        Ok(data)
    }

    /// Open an existing regular file for reading. `O_NONBLOCK` keeps a FIFO from hanging the open.
    pub fn open_regular(&self, path: &str) -> Result<(File, FileStat), PathError> {
        let fd = self.open(path, OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY)?;
        let stat = fstat(&fd).map_err(|e| PathError::from_errno(e, path))?;
        match stat.st_mode & libc::S_IFMT {
            libc::S_IFREG => Ok((File::from(fd), stat)),
            libc::S_IFDIR => Err(PathError::IsADirectory(path.to_string())),
            _ => Err(PathError::NotRegular(path.to_string())),
        }
    }

    /// Replace (or create) the file at `path` with `data` atomically. Missing
    /// parent directories are created; an existing file keeps its permissions.
    pub fn write_atomic(&self, path: &str, data: &[u8]) -> Result<(), PathError> {
        let rel = self.relative(path)?;
        let (parent, name) = match (rel.parent(), rel.components().next_back()) {
            (Some(parent), Some(Component::Normal(name))) => (parent, name),
            _ => return Err(PathError::IsADirectory(path.to_string())),
        };
        let root = self.open_root()?;
        let dir = self.ensure_dir(root.as_fd(), parent).map_err(|e| self.error(e, path))?;

        let mut mode = Mode::from_bits_truncate(0o644);
        let mut keep_mode = false;
        match fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => match st.st_mode & libc::S_IFMT {
                libc::S_IFREG => {
                    mode = Mode::from_bits_truncate(st.st_mode & 0o7777);
                    keep_mode = true;
                }
                libc::S_IFDIR => return Err(PathError::IsADirectory(path.to_string())),
                libc::S_IFLNK if self.strict => return Err(PathError::LinkRefused(path.to_string())),
                libc::S_IFLNK => {
                    // Say whether it points out of the workspace, but never write through it.
                    return match self.open_beneath(root.as_fd(), &rel, OFlag::O_PATH, Mode::empty()) {
                        Err(Errno::EXDEV) => Err(PathError::Escapes(path.to_string())),
                        _ => Err(PathError::Symlink(path.to_string())),
                    };
                }
                _ => {
                    return Err(PathError::Io {
                        path: path.to_string(),
                        source: io::Error::other("not a regular file"),
                    })
                }
            },
            Err(Errno::ENOENT) => {}
            Err(e) => return Err(PathError::from_errno(e, path)),
        }

        let tmp = temp_name(name);
        let fd = openat(
            &dir,
            tmp.as_os_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            mode,
        )
        .map_err(|e| PathError::from_errno(e, path))?;
        let written = (|| -> nix::Result<()> {
            if keep_mode {
                fchmod(&fd, mode)?;
            }
            let mut file = File::from(fd);
            file.write_all(data).map_err(|e| e.raw_os_error().map_or(Errno::EIO, Errno::from_raw))?;
            fsync(&file)?;
            renameat(&dir, tmp.as_os_str(), &dir, name)
        })();
        if let Err(e) = written {
            let _ = unlinkat(&dir, tmp.as_os_str(), UnlinkatFlags::NoRemoveDir);
            return Err(PathError::from_errno(e, path));
        }
        // The rename is durable once the directory is synced; a failure here loses nothing now.
        let _ = fsync(&dir);
        Ok(())
    }

    /// The text of the regular file at `path`, at most `cap` bytes of it
    /// (read no further: a huge file or `/dev/zero` costs `cap`, not more).
    /// `Ok(None)` when there is no such file. Bytes that are not UTF-8 are
    /// replaced; a cut through a character drops that character.
    pub fn read_text(&self, path: &str, cap: usize) -> Result<Option<Capped>, PathError> {
        let (file, _) = match self.open_regular(path) {
            Ok(opened) => opened,
            Err(e) if e.is_missing() => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut data = Vec::new();
        file.take(cap as u64 + 1).read_to_end(&mut data).map_err(|e| PathError::io(e, path))?;
        let truncated = data.len() > cap;
        data.truncate(cap);
        if truncated {
            // A character cut in two at the cap is dropped, not replaced.
            if let Err(e) = std::str::from_utf8(&data) {
                if e.error_len().is_none() {
                    data.truncate(e.valid_up_to());
                }
            }
        }
        let text = String::from_utf8(data).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
        Ok(Some(Capped { text, truncated }))
    }

    /// Open the regular file at `path` for appending (and reading), creating it
    /// with `mode` and its parent directories if missing. Never through a
    /// symlink, never a FIFO or a device.
    pub fn open_append(&self, path: &str, mode: u32) -> Result<File, PathError> {
        let (dir, name) = self.parent_dir(path)?;
        let fd = openat(
            &dir,
            name.as_os_str(),
            OFlag::O_RDWR
                | OFlag::O_APPEND
                | OFlag::O_CREAT
                | OFlag::O_NOFOLLOW
                | OFlag::O_NONBLOCK
                | OFlag::O_NOCTTY
                | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(mode),
        )
        .map_err(|e| self.error(e, path))?;
        let stat = fstat(&fd).map_err(|e| PathError::from_errno(e, path))?;
        if stat.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(PathError::NotRegular(path.to_string()));
        }
        Ok(File::from(fd))
    }

    /// Write `data` to `path` unless something is there already (a file, a
    /// link, anything: it is never followed or replaced). Returns whether it wrote.
    pub fn write_new(&self, path: &str, data: &[u8]) -> Result<bool, PathError> {
        let (dir, name) = self.parent_dir(path)?;
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd = match openat(&dir, name.as_os_str(), flags, Mode::from_bits_truncate(0o644)) {
            Ok(fd) => fd,
            Err(Errno::EEXIST) => return Ok(false),
            Err(e) => return Err(self.error(e, path)),
        };
        let mut file = File::from(fd);
        file.write_all(data).and_then(|()| file.sync_all()).map_err(|e| PathError::io(e, path))?;
        let _ = fsync(&dir);
        Ok(true)
    }

    /// The names of the directories directly in the directory `path`, sorted
    /// (a missing directory has none). Entries that are links, files or
    /// anything else are left out.
    pub fn subdirectories(&self, path: &str) -> Result<Vec<String>, PathError> {
        let fd = match self.open(path, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NONBLOCK) {
            Ok(fd) => fd,
            Err(e) if e.is_missing() => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let stat_fd = fd.try_clone().map_err(|e| PathError::io(e, path))?;
        let names = read_names(fd).map_err(|e| PathError::from_errno(e, path))?;
        let mut dirs: Vec<String> = names
            .iter()
            .filter(|n| !matches!(n.to_bytes(), b"." | b".."))
            .filter(|n| {
                fstatat(&stat_fd, n.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
            })
            .filter_map(|n| n.to_str().ok().map(str::to_string))
            .collect();
        dirs.sort();
        Ok(dirs)
    }

    /// The directory that holds `path` (created beneath the root if missing)
    /// and the file's name in it.
    fn parent_dir(&self, path: &str) -> Result<(OwnedFd, OsString), PathError> {
        let rel = self.relative(path)?;
        let (parent, name) = match (rel.parent(), rel.components().next_back()) {
            (Some(parent), Some(Component::Normal(name))) => (parent, name.to_os_string()),
            _ => return Err(PathError::IsADirectory(path.to_string())),
        };
        let root = self.open_root()?;
        let dir = self.ensure_dir(root.as_fd(), parent).map_err(|e| self.error(e, path))?;
        Ok((dir, name))
    }
}

/// A file's text, cut at a cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capped {
    pub text: String,
    /// The file went on past the cap.
    pub truncated: bool,
}

/// A fresh temp name next to `name`.
fn temp_name(name: &OsStr) -> OsString {
    let mut tmp = OsString::from(".");
    tmp.push(name);
    tmp.push(format!(".{}-{}.tmp", std::process::id(), crate::util::unique::next()));
    tmp
}

/// Resolve `rel` beneath `root` without `openat2`: one component at a time,
/// never following a symlink in the kernel. A symlink's target is read and its
/// components spliced into the queue; `..` pops our own stack of directory
/// descriptors, and popping past the root, or an absolute target, is `EXDEV`.
fn walk_beneath(root: BorrowedFd<'_>, rel: &Path, flags: OFlag, mode: Mode, strict: bool) -> nix::Result<OwnedFd> {
    let mut pending: VecDeque<OsString> = VecDeque::new();
    splice(&mut pending, rel)?;
    if pending.is_empty() || pending.back().is_some_and(|n| n == "..") {
        pending.push_back(".".into());
    }
    let mut stack: Vec<OwnedFd> = Vec::new();
    let mut links = 0;
    while let Some(name) = pending.pop_front() {
        if name == ".." {
            stack.pop().ok_or(Errno::EXDEV)?;
            continue;
        }
        let cur = stack.last().map_or(root, |fd| fd.as_fd());
        let opened = if pending.is_empty() {
            match openat(cur, name.as_os_str(), flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, mode) {
                // With O_PATH, O_NOFOLLOW opens a symlink itself rather than failing.
                Ok(fd) if !is_symlink(&fd)? => return Ok(fd),
                Ok(_) => None,
                // A symlink fails O_NOFOLLOW with ELOOP, or ENOTDIR when O_DIRECTORY is set.
                Err(e @ (Errno::ELOOP | Errno::ENOTDIR)) => {
                    let st = fstatat(cur, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)?;
                    if st.st_mode & libc::S_IFMT != libc::S_IFLNK {
                        return Err(e);
                    }
                    None
                }
                Err(e) => return Err(e),
            }
        } else {
            let fd =
                openat(cur, name.as_os_str(), OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())?;
            match fstat(&fd)?.st_mode & libc::S_IFMT {
                libc::S_IFDIR => Some(fd),
                libc::S_IFLNK => None,
                _ => return Err(Errno::ENOTDIR),
            }
        };
        match opened {
            Some(dir) => stack.push(dir),
            None => {
                if strict {
                    return Err(Errno::ELOOP);
                }
                links += 1;
                if links > MAX_LINKS {
                    return Err(Errno::ELOOP);
                }
                let target = readlinkat(cur, name.as_os_str())?;
                let target = Path::new(&target);
                if target.has_root() {
                    return Err(Errno::EXDEV);
                }
                let mut spliced = VecDeque::new();
                splice(&mut spliced, target)?;
                if spliced.is_empty() {
                    spliced.push_back(".".into());
                }
                if pending.is_empty() && spliced.back().is_some_and(|n| n == "..") {
                    spliced.push_back(".".into());
                }
                while let Some(c) = spliced.pop_back() {
                    pending.push_front(c);
                }
            }
        }
    }
    // Only reached when the last name was `..` without a trailing `.`, which `splice` prevents.
    Err(Errno::ENOENT)
}

/// Append the components of a relative path (`.` dropped) to `queue`.
fn splice(queue: &mut VecDeque<OsString>, path: &Path) -> nix::Result<()> {
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => queue.push_back("..".into()),
            Component::Normal(n) => queue.push_back(n.to_os_string()),
            Component::RootDir | Component::Prefix(_) => return Err(Errno::EXDEV),
        }
    }
    Ok(())
}

fn is_symlink(fd: &OwnedFd) -> nix::Result<bool> {
    Ok(fstat(fd)?.st_mode & libc::S_IFMT == libc::S_IFLNK)
}

/// The names in the directory open at `fd` (including `.` and `..`), read
/// from the descriptor itself so the listing is of exactly what was checked.
pub fn read_names(fd: OwnedFd) -> nix::Result<Vec<std::ffi::CString>> {
    let mut dir = nix::dir::Dir::from_fd(fd)?;
    dir.iter().map(|entry| entry.map(|e| e.file_name().to_owned())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A workspace in a temp dir, with an `outside` directory next to it.
    struct Fixture {
        _tmp: tempfile::TempDir,
        root: PathBuf,
        outside: PathBuf,
    }

    fn fixture() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("ws");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(root.join("sub/deep")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), "top secret").unwrap();
        std::fs::write(root.join("sub/deep/f.txt"), "inside").unwrap();
        symlink("/etc", root.join("etc_link")).unwrap();
        symlink("/etc/hostname", root.join("host_link")).unwrap();
        symlink("../outside", root.join("out_link")).unwrap();
        symlink("sub/deep", root.join("deep_link")).unwrap();
        symlink("../sub/deep/f.txt", root.join("sub/rel_link")).unwrap();
        Fixture { _tmp: tmp, root, outside }
    }

    fn both(root: &Path) -> [Workspace; 2] {
        [Workspace::new(root), Workspace { root: root.to_path_buf(), force_walk: true, strict: false }]
    }

    fn read(ws: &Workspace, path: &str) -> Result<String, PathError> {
        ws.read_all(path, 1 << 20).map(|d| String::from_utf8(d).unwrap())
    }

    #[test]
    fn relative_paths_are_normalised_lexically() {
        let ws = Workspace::new("/srv/ws");
        let rel = |p: &str| ws.relative(p).map(|p| p.display().to_string());
        assert_eq!(rel("a/./b").unwrap(), "a/b");
        assert_eq!(rel("~/notes.md").unwrap(), "notes.md");
        assert_eq!(rel("~").unwrap(), ".");
        assert_eq!(rel("/srv/ws/x/y").unwrap(), "x/y");
        assert_eq!(rel("/srv/ws").unwrap(), ".");
        assert_eq!(rel("a/../b").unwrap(), "a/../b");
        assert!(matches!(ws.relative("/etc/passwd"), Err(PathError::Escapes(_))));
        assert!(matches!(ws.relative("/srv/wsx/y"), Err(PathError::Escapes(_))));
        assert!(matches!(ws.relative("../outside"), Err(PathError::Escapes(_))));
        assert!(matches!(ws.relative("sub/../../x"), Err(PathError::Escapes(_))));
        assert!(matches!(ws.relative(""), Err(PathError::Invalid(_))));
        assert!(matches!(ws.relative("a\0b"), Err(PathError::Invalid(_))));
    }

    #[test]
    fn reads_inside_work_with_both_resolvers() {
        let f = fixture();
        for ws in both(&f.root) {
            assert_eq!(read(&ws, "sub/deep/f.txt").unwrap(), "inside");
            assert_eq!(read(&ws, "deep_link/f.txt").unwrap(), "inside", "dir symlink inside");
            assert_eq!(read(&ws, "sub/rel_link").unwrap(), "inside", "relative file symlink inside");
            assert_eq!(read(&ws, "sub/deep/../deep/f.txt").unwrap(), "inside");
            assert_eq!(read(&ws, f.root.join("sub/deep/f.txt").to_str().unwrap()).unwrap(), "inside");
            assert!(matches!(read(&ws, "missing"), Err(PathError::NotFound(_))));
            assert!(matches!(read(&ws, "sub"), Err(PathError::IsADirectory(_))));
        }
    }

    #[test]
    fn escapes_are_refused_by_both_resolvers() {
        let f = fixture();
        for ws in both(&f.root) {
            for path in ["/etc/passwd", "../outside/secret", "sub/../../outside/secret"] {
                let err = read(&ws, path).unwrap_err();
                assert!(matches!(err, PathError::Escapes(_)), "{path}: {err}");
            }
            for path in ["etc_link/passwd", "host_link", "out_link/secret", "sub/../out_link/secret"] {
                let err = read(&ws, path).unwrap_err();
                assert_eq!(err.to_string(), format!("path escapes the workspace: {path}"), "{:?}", ws.force_walk);
            }
            // Writes through a symlinked directory, or onto a symlink, are refused too.
            for path in ["out_link/planted", "out_link/new_dir/planted", "etc_link/planted"] {
                let err = ws.write_atomic(path, b"x").unwrap_err();
                assert!(matches!(err, PathError::Escapes(_)), "{path}: {err}");
            }
            let err = ws.write_atomic("host_link", b"x").unwrap_err();
            assert!(matches!(err, PathError::Escapes(_)), "{err}");
            assert!(matches!(ws.write_atomic("sub/rel_link", b"x"), Err(PathError::Symlink(_))));
            assert_eq!(std::fs::read_dir(&f.outside).unwrap().count(), 1, "nothing written outside");
        }
    }

    #[test]
    fn walk_handles_link_chains_and_loops() {
        let f = fixture();
        symlink("deep_link", f.root.join("chain")).unwrap();
        symlink("loop_b", f.root.join("loop_a")).unwrap();
        symlink("loop_a", f.root.join("loop_b")).unwrap();
        symlink("sub/..", f.root.join("up_link")).unwrap();
        for ws in both(&f.root) {
            assert_eq!(read(&ws, "chain/f.txt").unwrap(), "inside");
            assert!(matches!(read(&ws, "loop_a"), Err(PathError::Loop(_))));
            assert!(matches!(read(&ws, "up_link/../x"), Err(PathError::Escapes(_))));
            assert!(ws.open("up_link", OFlag::O_RDONLY | OFlag::O_DIRECTORY).is_ok());
            assert!(matches!(read(&ws, "sub/deep/f.txt/x"), Err(PathError::NotADirectory(_))));
        }
    }

    #[test]
    fn writes_create_parents_replace_atomically_and_keep_mode() {
        use std::os::unix::fs::PermissionsExt;
        let f = fixture();
        for (i, ws) in both(&f.root).into_iter().enumerate() {
            let path = format!("new{i}/a/b/c.txt");
            ws.write_atomic(&path, b"one").unwrap();
            assert_eq!(std::fs::read_to_string(f.root.join(&path)).unwrap(), "one");
            let script = f.root.join("run.sh");
            std::fs::write(&script, "old").unwrap();
            std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o750)).unwrap();
            ws.write_atomic("~/run.sh", b"new").unwrap();
            assert_eq!(std::fs::read_to_string(&script).unwrap(), "new");
            assert_eq!(std::fs::metadata(&script).unwrap().permissions().mode() & 0o777, 0o750);
            // Through an inside dir symlink is fine.
            ws.write_atomic("deep_link/g.txt", b"g").unwrap();
            assert_eq!(std::fs::read_to_string(f.root.join("sub/deep/g.txt")).unwrap(), "g");
            assert!(matches!(ws.write_atomic("sub", b"x"), Err(PathError::IsADirectory(_))));
            assert!(matches!(ws.write_atomic(".", b"x"), Err(PathError::IsADirectory(_))));
        }
        let leftovers: Vec<_> = std::fs::read_dir(&f.root)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty());
    }

    #[test]
    fn dir_path_is_checked_and_absolute() {
        let f = fixture();
        let ws = Workspace::new(&f.root);
        let canonical = std::fs::canonicalize(&f.root).unwrap();
        assert_eq!(ws.dir_path("sub/deep").unwrap(), canonical.join("sub/deep"));
        assert_eq!(ws.dir_path("deep_link").unwrap(), canonical.join("sub/deep"));
        assert!(matches!(ws.dir_path("out_link"), Err(PathError::Escapes(_))));
        assert!(matches!(ws.dir_path("sub/deep/f.txt"), Err(PathError::NotADirectory(_))));
    }

    #[test]
    fn openat2_is_used_where_the_kernel_has_it() {
        let f = fixture();
        let ws = Workspace::new(&f.root);
        read(&ws, "sub/deep/f.txt").unwrap();
        let root = ws.open_root().unwrap();
        let probe = nix::fcntl::openat2(&root, ".", nix::fcntl::OpenHow::new().flags(OFlag::O_PATH));
        let expected = if matches!(probe, Err(Errno::ENOSYS)) { Resolution::Walk } else { Resolution::Openat2 };
        assert_eq!(resolution(), Some(expected));
    }

    fn strict_both(root: &Path) -> [Workspace; 2] {
        [Workspace::strict(root), Workspace { root: root.to_path_buf(), force_walk: true, strict: true }]
    }

    #[test]
    fn strict_reads_refuse_links_fifos_and_devices_and_cap() {
        let f = fixture();
        std::fs::write(f.root.join("AGENTS.md"), "x".repeat(100)).unwrap();
        symlink("/dev/zero", f.root.join("zero")).unwrap();
        symlink("sub/deep/f.txt", f.root.join("inside_link")).unwrap();
        nix::unistd::mkfifo(&f.root.join("fifo"), Mode::from_bits_truncate(0o644)).unwrap();
        for ws in strict_both(&f.root) {
            let capped = ws.read_text("AGENTS.md", 10).unwrap().unwrap();
            assert_eq!(capped, Capped { text: "x".repeat(10), truncated: true });
            let whole = ws.read_text("sub/deep/f.txt", 100).unwrap().unwrap();
            assert_eq!(whole, Capped { text: "inside".into(), truncated: false });
            assert_eq!(ws.read_text("missing.md", 10).unwrap(), None);
            // Links are refused even when they stay inside; so is a link in the middle.
            for path in ["inside_link", "host_link", "zero", "deep_link/f.txt", "out_link/secret"] {
                let err = ws.read_text(path, 10).unwrap_err();
                assert!(matches!(err, PathError::LinkRefused(_) | PathError::Escapes(_)), "{path}: {err}");
            }
            // A FIFO neither blocks the open nor is read.
            assert!(matches!(ws.read_text("fifo", 10), Err(PathError::NotRegular(_))));
            assert!(matches!(ws.read_text("sub", 10), Err(PathError::IsADirectory(_))));
        }
    }

    #[test]
    fn a_cut_never_splits_a_character() {
        let f = fixture();
        std::fs::write(f.root.join("u.md"), "aé€").unwrap();
        let ws = Workspace::strict(&f.root);
        assert_eq!(ws.read_text("u.md", 2).unwrap().unwrap().text, "a");
        assert_eq!(ws.read_text("u.md", 4).unwrap().unwrap().text, "aé");
        assert_eq!(ws.read_text("u.md", 6).unwrap().unwrap(), Capped { text: "aé€".into(), truncated: false });
    }

    #[test]
    fn strict_writes_never_go_through_links() {
        let f = fixture();
        let victim = f.outside.join("bashrc");
        std::fs::write(&victim, "original").unwrap();
        std::fs::create_dir_all(f.root.join("memory")).unwrap();
        symlink(&victim, f.root.join("memory/history.jsonl")).unwrap();
        symlink(&f.outside, f.root.join("linked_dir")).unwrap();
        symlink("sub", f.root.join("inside_dir_link")).unwrap();
        for ws in strict_both(&f.root) {
            assert!(matches!(ws.open_append("memory/history.jsonl", 0o600), Err(PathError::LinkRefused(_))));
            for path in ["linked_dir/MEMORY.md", "inside_dir_link/MEMORY.md"] {
                let err = ws.write_atomic(path, b"x").unwrap_err();
                assert!(matches!(err, PathError::LinkRefused(_) | PathError::Escapes(_)), "{path}: {err}");
                let err = ws.open_append(path, 0o600).unwrap_err();
                assert!(matches!(err, PathError::LinkRefused(_) | PathError::Escapes(_)), "{path}: {err}");
            }
            assert!(matches!(ws.write_atomic("memory/history.jsonl", b"x"), Err(PathError::LinkRefused(_))));
            // write_new keeps whatever is there, a dangling link included, and follows nothing.
            symlink(f.outside.join("new_file"), f.root.join("dangling")).unwrap();
            assert!(!ws.write_new("dangling", b"x").unwrap());
            std::fs::remove_file(f.root.join("dangling")).unwrap();
        }
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "original");
        assert_eq!(std::fs::read_dir(&f.outside).unwrap().count(), 2, "nothing new outside");
    }

    #[test]
    fn appends_and_new_files_work_beneath_the_root() {
        use std::os::unix::fs::PermissionsExt;
        let f = fixture();
        let ws = Workspace::strict(&f.root);
        let mut file = ws.open_append("memory/history.jsonl", 0o600).unwrap();
        file.write_all(b"one\n").unwrap();
        let mut file = ws.open_append("memory/history.jsonl", 0o600).unwrap();
        file.write_all(b"two\n").unwrap();
        let path = f.root.join("memory/history.jsonl");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "one\ntwo\n");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(ws.write_new("skills/a/SKILL.md", b"s").unwrap());
        assert!(!ws.write_new("skills/a/SKILL.md", b"t").unwrap());
        assert_eq!(std::fs::read_to_string(f.root.join("skills/a/SKILL.md")).unwrap(), "s");
    }

    #[test]
    fn subdirectories_lists_real_directories_only() {
        let f = fixture();
        std::fs::create_dir_all(f.root.join("skills/b")).unwrap();
        std::fs::create_dir_all(f.root.join("skills/a")).unwrap();
        std::fs::write(f.root.join("skills/file"), "").unwrap();
        symlink(&f.outside, f.root.join("skills/out")).unwrap();
        symlink("a", f.root.join("skills/alias")).unwrap();
        let ws = Workspace::strict(&f.root);
        assert_eq!(ws.subdirectories("skills").unwrap(), vec!["a".to_string(), "b".to_string()]);
        assert!(ws.subdirectories("missing").unwrap().is_empty());
        let nowhere = Workspace::strict(f.root.join("not-made-yet"));
        assert!(nowhere.subdirectories("skills").unwrap().is_empty(), "no workspace yet: no skills");
        assert_eq!(nowhere.read_text("AGENTS.md", 10).unwrap(), None);
        std::fs::rename(f.root.join("skills"), f.root.join("real_skills")).unwrap();
        symlink(&f.outside, f.root.join("skills")).unwrap();
        assert!(ws.subdirectories("skills").is_err(), "a linked skills/ is not listed");
    }
}
