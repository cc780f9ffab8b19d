//! File tools confined to the workspace: `read_file`, `write_file`, `edit_file`, `list_dir`.
//!
//! A model names paths; nothing it names may reach outside the workspace —
//! not `/etc/passwd`, not `../x`, and not a symlink someone (or an earlier
//! command) planted inside the workspace pointing out of it. Checking a path
//! string and then opening it is racy (a component can be swapped for a
//! symlink in between), so the kernel resolves every path for us relative to
//! a descriptor of the workspace root:
//!
//! - `openat2(2)` with `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS` refuses any
//!   resolution that leaves the root, including through `..`, absolute
//!   symlinks and symlinks whose target lies outside (Linux 5.6+).
//! - Where `openat2` does not exist (`ENOSYS`), [`Workspace`] walks the path
//!   one component at a time with `O_NOFOLLOW`, reading each symlink itself and
//!   splicing its (relative) target back in, so `..` can never pop above the
//!   root descriptor.
//!
//! Writes create missing parent directories one `mkdirat` at a time beneath the
//! root and replace the file atomically (temp file in the same directory,
//! fsync, `renameat`), which never follows a symlink at the final component.
//!
//! A leading `~/` means the workspace root (commands run with `HOME` set to
//! it), and an absolute path inside the workspace is accepted as relative.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use nix::errno::Errno;
use nix::fcntl::{openat, readlinkat, renameat, AtFlags, OFlag};
use nix::sys::stat::{fchmod, fstat, fstatat, mkdirat, FileStat, Mode};
use nix::unistd::{fsync, unlinkat, UnlinkatFlags};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{parse_args, BoxFuture, Tool, ToolContext, ToolError};

/// Bytes of file content `read_file` returns at most.
const READ_CAP: usize = 128 * 1024;
/// Lines `read_file` returns when no `limit` is given.
const DEFAULT_LINES: u64 = 2000;
/// Bytes scanned past the shown window to count a file's lines.
const COUNT_SCAN_LIMIT: u64 = 64 * 1024 * 1024;
/// Largest file `edit_file` will load.
const EDIT_CAP: u64 = 4 * 1024 * 1024;
/// Entries `list_dir` shows at most.
const LIST_CAP: usize = 500;
/// Symlinks followed in one resolution, as the kernel's own limit.
const MAX_LINKS: u32 = 40;

/// Why a path could not be used. The text is what the model reads.
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
    #[error("invalid path: {0:?}")]
    Invalid(String),
    #[error("the workspace {root} cannot be opened: {source}")]
    Root { root: PathBuf, source: Errno },
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
}

impl PathError {
    fn from_errno(errno: Errno, path: &str) -> PathError {
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

    fn io(err: io::Error, path: &str) -> PathError {
        match err.raw_os_error() {
            Some(code) => PathError::from_errno(Errno::from_raw(code), path),
            None => PathError::Io { path: path.to_string(), source: err },
        }
    }
}

impl From<PathError> for ToolError {
    fn from(e: PathError) -> Self {
        ToolError(e.to_string())
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

/// The workspace root and the only way the file tools reach files.
#[derive(Debug, Clone)]
pub struct Workspace {
    root: PathBuf,
    /// Tests force the fallback walk to exercise it on kernels that have `openat2`.
    force_walk: bool,
}

impl Workspace {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Workspace { root: root.into(), force_walk: false }
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
        self.open_beneath(root.as_fd(), &rel, flags, Mode::empty()).map_err(|e| PathError::from_errno(e, path))
    }

    /// An existing directory beneath the root, as an absolute path (a command's working directory).
    pub fn dir_path(&self, path: &str) -> Result<PathBuf, PathError> {
        let rel = self.relative(path)?;
        let root = self.open_root()?;
        let fd = self
            .open_beneath(root.as_fd(), &rel, OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(|e| PathError::from_errno(e, path))?;
        // The kernel knows where the checked descriptor really is; fall back to the lexical join.
        let real = std::fs::read_link(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd)));
        Ok(real.ok().filter(|p| p.is_absolute()).unwrap_or_else(|| self.root.join(&rel)))
    }

    /// Resolve `rel` beneath `root` and open it: `openat2` when the kernel has it, else the walk.
    fn open_beneath(&self, root: BorrowedFd<'_>, rel: &Path, flags: OFlag, mode: Mode) -> nix::Result<OwnedFd> {
        if !self.force_walk && OPENAT2.load(Ordering::Relaxed) != 2 {
            use nix::fcntl::{openat2, OpenHow, ResolveFlag};
            let how = OpenHow::new()
                .flags(flags | OFlag::O_CLOEXEC)
                .mode(mode)
                .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
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
        walk_beneath(root, rel, flags, mode)
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
    fn read_all(&self, path: &str, cap: u64) -> Result<Vec<u8>, PathError> {
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
    fn open_regular(&self, path: &str) -> Result<(File, FileStat), PathError> {
        let fd = self.open(path, OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY)?;
        let stat = fstat(&fd).map_err(|e| PathError::from_errno(e, path))?;
        match stat.st_mode & libc::S_IFMT {
            libc::S_IFREG => Ok((File::from(fd), stat)),
            libc::S_IFDIR => Err(PathError::IsADirectory(path.to_string())),
            _ => Err(PathError::Io { path: path.to_string(), source: io::Error::other("not a regular file") }),
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
        let dir = self.ensure_dir(root.as_fd(), parent).map_err(|e| PathError::from_errno(e, path))?;

        let mut mode = Mode::from_bits_truncate(0o644);
        let mut keep_mode = false;
        match fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => match st.st_mode & libc::S_IFMT {
                libc::S_IFREG => {
                    mode = Mode::from_bits_truncate(st.st_mode & 0o7777);
                    keep_mode = true;
                }
                libc::S_IFDIR => return Err(PathError::IsADirectory(path.to_string())),
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
}

/// A fresh temp name next to `name`.
fn temp_name(name: &OsStr) -> OsString {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut tmp = OsString::from(".");
    tmp.push(name);
    tmp.push(format!(".{}-{}.tmp", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed)));
    tmp
}

/// Resolve `rel` beneath `root` without `openat2`: one component at a time,
/// never following a symlink in the kernel. A symlink's target is read and its
/// components spliced into the queue; `..` pops our own stack of directory
/// descriptors, and popping past the root, or an absolute target, is `EXDEV`.
fn walk_beneath(root: BorrowedFd<'_>, rel: &Path, flags: OFlag, mode: Mode) -> nix::Result<OwnedFd> {
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

/// Run blocking filesystem work off the async thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ToolError> + Send + 'static,
) -> Result<T, ToolError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ToolError::new(format!("file operation failed: {e}")))?
}

/// The four file tools over one workspace.
pub fn fs_tools(workspace: &Path) -> Vec<Arc<dyn Tool>> {
    let ws = Workspace::new(workspace);
    vec![
        Arc::new(ReadFile { ws: ws.clone() }),
        Arc::new(WriteFile { ws: ws.clone() }),
        Arc::new(EditFile { ws: ws.clone() }),
        Arc::new(ListDir { ws }),
    ]
}

/// `read_file`: lines of a text file.
struct ReadFile {
    ws: Workspace,
}

#[derive(Deserialize)]
struct ReadArgs {
    path: String,
    offset: Option<u64>,
    limit: Option<u64>,
}

impl Tool for ReadFile {
    fn name(&self) -> &'static str {
        "read_file"
    }
    fn description(&self) -> &'static str {
        "Read a text file in the workspace. Returns up to `limit` lines (default 2000, at most 128 KiB) \
         starting at line `offset` (1-based); a header says which lines are shown when not all are."
    }
    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path, relative to the workspace"},
                "offset": {"type": "integer", "minimum": 1, "description": "First line to return (1-based)"},
                "limit": {"type": "integer", "minimum": 1, "description": "Number of lines to return"}
            },
            "required": ["path"]
        })
    }
    fn execute<'a>(&'a self, args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let a: ReadArgs = parse_args("read_file", args)?;
            let ws = self.ws.clone();
            blocking(move || {
                let (file, _) = ws.open_regular(&a.path)?;
                let offset = a.offset.unwrap_or(1).max(1);
                let limit = a.limit.unwrap_or(DEFAULT_LINES).max(1);
                read_lines(file, offset, limit, &a.path)
            })
            .await
        })
    }
}

/// Lines `offset..offset+limit` of `file`, capped at [`READ_CAP`] bytes, with a
/// header when partial. Reads in chunks: a huge single line never grows memory.
fn read_lines(file: File, offset: u64, limit: u64, path: &str) -> Result<String, ToolError> {
    let mut reader = BufReader::with_capacity(64 * 1024, file);
    let io_err = |e: io::Error| ToolError::from(PathError::io(e, path));
    let end = offset.saturating_add(limit);
    let mut line = 1u64; // number of the line the next byte belongs to
    let mut out: Vec<u8> = Vec::new();
    let mut last_shown = 0u64;
    let mut capped = false;
    let mut cut_line = false;
    let mut at_line_start = true;
    let mut line_start = 0usize;
    let mut ends_with_newline = true;
    let mut scanned = 0u64;
    let mut complete = true;
    loop {
        let chunk = reader.fill_buf().map_err(io_err)?;
        if chunk.is_empty() {
            break;
        }
        if scanned == 0 && chunk[..chunk.len().min(8192)].contains(&0) {
            return Err(ToolError::new(format!(
                "{path} looks like a binary file (it contains NUL bytes); use exec with `file`, `xxd` or `strings` to inspect it"
            )));
        }
        let len = chunk.len();
        let mut i = 0;
        while i < len {
            let newline = chunk[i..].iter().position(|&b| b == b'\n');
            let stop = newline.map_or(len, |p| i + p + 1);
            if line >= offset && line < end && !capped {
                if at_line_start {
                    line_start = out.len();
                }
                let piece = &chunk[i..stop];
                let room = READ_CAP - out.len();
                if piece.len() <= room {
                    out.extend_from_slice(piece);
                    last_shown = line;
                } else if line_start == 0 {
                    // The first line alone is over the cap: show its head.
                    out.extend_from_slice(&piece[..room]);
                    last_shown = line;
                    cut_line = true;
                    capped = true;
                } else {
                    // Never end on half a line: drop the part of it already kept.
                    out.truncate(line_start);
                    last_shown = line - 1;
                    capped = true;
                }
            }
            at_line_start = newline.is_some();
            if at_line_start {
                line += 1;
            }
            i = stop;
        }
        ends_with_newline = chunk[len - 1] == b'\n';
        scanned += len as u64;
        reader.consume(len);
        if (capped || line >= end) && scanned > COUNT_SCAN_LIMIT {
            complete = false;
            break;
        }
    }
    if out.contains(&0) {
        return Err(ToolError::new(format!("{path} looks like a binary file (it contains NUL bytes)")));
    }
    let total = if ends_with_newline { line - 1 } else { line };
    if total == 0 {
        return Ok(format!("({path} is empty)"));
    }
    if offset > total {
        return Err(ToolError::new(format!("offset {offset} is past the end of {path} ({total} lines)")));
    }
    let text = String::from_utf8_lossy(&out);
    let total_text = if complete { total.to_string() } else { format!("more than {total}") };
    if offset == 1 && last_shown == total && complete && !capped {
        return Ok(text.into_owned());
    }
    let mut header = format!("[lines {offset}-{last_shown} of {total_text}");
    if cut_line {
        header.push_str(&format!("; line {last_shown} is longer than {} KiB and was cut", READ_CAP / 1024));
    } else if capped {
        header.push_str(&format!("; output capped at {} KiB", READ_CAP / 1024));
    }
    if last_shown < total || !complete {
        header.push_str(&format!("; use offset={} to continue", last_shown + 1));
    }
    header.push(']');
    Ok(format!("{header}\n{text}"))
}

/// `write_file`: create or replace a file.
struct WriteFile {
    ws: Workspace,
}

#[derive(Deserialize)]
struct WriteArgs {
    path: String,
    content: String,
}

impl Tool for WriteFile {
    fn name(&self) -> &'static str {
        "write_file"
    }
    fn description(&self) -> &'static str {
        "Create or replace a file in the workspace with the given content. Missing parent directories are created."
    }
    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path, relative to the workspace"},
                "content": {"type": "string", "description": "The complete new content"}
            },
            "required": ["path", "content"]
        })
    }
    fn execute<'a>(&'a self, args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let a: WriteArgs = parse_args("write_file", args)?;
            let ws = self.ws.clone();
            blocking(move || {
                ws.write_atomic(&a.path, a.content.as_bytes())?;
                Ok(format!("Wrote {} bytes to {}", a.content.len(), a.path))
            })
            .await
        })
    }
}

/// `edit_file`: exact text replacement.
struct EditFile {
    ws: Workspace,
}

#[derive(Deserialize)]
struct EditArgs {
    path: String,
    old_text: String,
    new_text: String,
    #[serde(default)]
    replace_all: bool,
}

impl Tool for EditFile {
    fn name(&self) -> &'static str {
        "edit_file"
    }
    fn description(&self) -> &'static str {
        "Replace exact text in a workspace file. `old_text` must match exactly once (include enough \
         surrounding lines to make it unique), or set `replace_all` to replace every occurrence."
    }
    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path, relative to the workspace"},
                "old_text": {"type": "string", "description": "Exact text to find"},
                "new_text": {"type": "string", "description": "Replacement text"},
                "replace_all": {"type": "boolean", "description": "Replace every occurrence (default false)"}
            },
            "required": ["path", "old_text", "new_text"]
        })
    }
    fn execute<'a>(&'a self, args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let a: EditArgs = parse_args("edit_file", args)?;
            let ws = self.ws.clone();
            blocking(move || {
                let data = ws.read_all(&a.path, EDIT_CAP)?;
                let text = String::from_utf8(data)
                    .map_err(|_| ToolError::new(format!("{} is not UTF-8 text; edit_file only edits text", a.path)))?;
                let (new, count) = apply_edit(&text, &a.old_text, &a.new_text, a.replace_all, &a.path)?;
                ws.write_atomic(&a.path, new.as_bytes())?;
                let plural = if count == 1 { "" } else { "s" };
                Ok(format!("Edited {}: replaced {count} occurrence{plural}", a.path))
            })
            .await
        })
    }
}

/// The edited text and the number of replacements, or why the edit is ambiguous or impossible.
fn apply_edit(text: &str, old: &str, new: &str, all: bool, path: &str) -> Result<(String, usize), ToolError> {
    if old.is_empty() {
        return Err(ToolError::new("old_text is empty; give the exact text to replace"));
    }
    let count = text.matches(old).count();
    match count {
        0 => {
            let mut msg = format!("old_text was not found in {path}");
            if squash_ws(text).contains(&squash_ws(old)) {
                msg.push_str(
                    "; it does match if whitespace is ignored: check indentation, tabs and line breaks \
                     (read_file shows the exact text)",
                );
            } else {
                msg.push_str("; read the file again and copy the text exactly");
            }
            Err(ToolError::new(msg))
        }
        n if n > 1 && !all => Err(ToolError::new(format!(
            "old_text matches {n} times in {path}; include more surrounding text to make it unique, \
             or set replace_all to true"
        ))),
        n if all => Ok((text.replace(old, new), n)),
        _ => Ok((text.replacen(old, new, 1), 1)),
    }
}

/// Collapse every run of whitespace to one space (for the "matches ignoring whitespace" hint).
fn squash_ws(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `list_dir`: the entries of a directory.
struct ListDir {
    ws: Workspace,
}

#[derive(Deserialize)]
struct ListArgs {
    #[serde(default = "dot")]
    path: String,
}

fn dot() -> String {
    ".".to_string()
}

impl Tool for ListDir {
    fn name(&self) -> &'static str {
        "list_dir"
    }
    fn description(&self) -> &'static str {
        "List a directory in the workspace: names sorted, directories end with `/`, files show their size."
    }
    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Directory, relative to the workspace (default: the workspace root)"}
            }
        })
    }
    fn execute<'a>(&'a self, args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let a: ListArgs = parse_args("list_dir", args)?;
            let ws = self.ws.clone();
            blocking(move || Ok(list(&ws, &a.path)?)).await
        })
    }
}

fn list(ws: &Workspace, path: &str) -> Result<String, PathError> {
    let fd = ws.open(path, OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
    let stat_fd = fd.try_clone().map_err(|e| PathError::io(e, path))?;
    let names = read_names(fd).map_err(|e| PathError::from_errno(e, path))?;
    let mut entries: Vec<String> = Vec::new();
    for name in &names {
        let name = name.as_c_str();
        let bytes = name.to_bytes();
        if bytes == b"." || bytes == b".." {
            continue;
        }
        let shown = String::from_utf8_lossy(bytes);
        let line = match fstatat(&stat_fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => match st.st_mode & libc::S_IFMT {
                libc::S_IFDIR => format!("{shown}/"),
                libc::S_IFREG => format!("{shown} ({})", human_size(st.st_size as u64)),
                libc::S_IFLNK => match readlinkat(&stat_fd, name) {
                    Ok(target) => format!("{shown} -> {}", target.to_string_lossy()),
                    Err(_) => format!("{shown} -> ?"),
                },
                _ => format!("{shown} (special file)"),
            },
            // Removed while listing.
            Err(_) => continue,
        };
        entries.push(line);
    }
    if entries.is_empty() {
        return Ok(format!("({path} is empty)"));
    }
    entries.sort();
    let total = entries.len();
    let mut out = entries.into_iter().take(LIST_CAP).collect::<Vec<_>>().join("\n");
    if total > LIST_CAP {
        out.push_str(&format!("\n... and {} more entries ({total} in total)", total - LIST_CAP));
    }
    Ok(out)
}

/// The names in the directory open at `fd` (including `.` and `..`), read
/// from the descriptor itself so the listing is of exactly what was checked.
fn read_names(fd: OwnedFd) -> nix::Result<Vec<std::ffi::CString>> {
    use std::os::fd::{FromRawFd, IntoRawFd};
    let raw = fd.into_raw_fd();
    // SAFETY: `raw` is an open directory descriptor we own; on success the DIR
    // stream owns it and `closedir` below closes it.
    let dir = unsafe { libc::fdopendir(raw) };
    if dir.is_null() {
        let err = Errno::last();
        // SAFETY: fdopendir failed, so we still own `raw`; this closes it.
        drop(unsafe { OwnedFd::from_raw_fd(raw) });
        return Err(err);
    }
    let mut names = Vec::new();
    let result = loop {
        Errno::clear();
        // SAFETY: `dir` is a valid stream, used by this thread only.
        let entry = unsafe { libc::readdir(dir) };
        if entry.is_null() {
            break match Errno::last_raw() {
                0 => Ok(()),
                code => Err(Errno::from_raw(code)),
            };
        }
        // SAFETY: readdir returned a valid entry whose d_name is NUL-terminated;
        // it is copied before the next readdir call.
        let name = unsafe { std::ffi::CStr::from_ptr((*entry).d_name.as_ptr()) };
        names.push(name.to_owned());
    };
    // SAFETY: `dir` is valid and not used after this.
    unsafe { libc::closedir(dir) };
    result.map(|()| names)
}

fn human_size(bytes: u64) -> String {
    match bytes {
        0..1024 => format!("{bytes} bytes"),
        1024..1_048_576 => format!("{:.1} KiB", bytes as f64 / 1024.0),
        _ => format!("{:.1} MiB", bytes as f64 / 1_048_576.0),
    }
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
        [Workspace::new(root), Workspace { root: root.to_path_buf(), force_walk: true }]
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

    fn lines(n: usize) -> String {
        (1..=n).map(|i| format!("line {i}\n")).collect()
    }

    #[test]
    fn read_lines_windows_and_headers() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("f");
        std::fs::write(&p, lines(340)).unwrap();
        let open = || File::open(&p).unwrap();
        let all = read_lines(open(), 1, 2000, "f").unwrap();
        assert_eq!(all, lines(340));
        let part = read_lines(open(), 1, 120, "f").unwrap();
        assert!(part.starts_with("[lines 1-120 of 340; use offset=121 to continue]\nline 1\n"), "{part}");
        assert!(part.ends_with("line 120\n"));
        let tail = read_lines(open(), 300, 2000, "f").unwrap();
        assert!(tail.starts_with("[lines 300-340 of 340]\nline 300\n"), "{tail}");
        let err = read_lines(open(), 341, 10, "f").unwrap_err();
        assert_eq!(err.0, "offset 341 is past the end of f (340 lines)");

        std::fs::write(&p, "no newline").unwrap();
        assert_eq!(read_lines(open(), 1, 10, "f").unwrap(), "no newline");
        std::fs::write(&p, "").unwrap();
        assert_eq!(read_lines(open(), 1, 10, "f").unwrap(), "(f is empty)");
        std::fs::write(&p, b"ELF\0\x01\x02").unwrap();
        assert!(read_lines(open(), 1, 10, "f").unwrap_err().0.contains("binary file"));
    }

    #[test]
    fn read_lines_caps_bytes_even_for_one_huge_line() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("big");
        let mut data = "x".repeat(1 << 20);
        data.push_str("\nsecond\n");
        std::fs::write(&p, &data).unwrap();
        let out = read_lines(File::open(&p).unwrap(), 1, 2000, "big").unwrap();
        let (header, body) = out.split_once('\n').unwrap();
        assert_eq!(header, "[lines 1-1 of 2; line 1 is longer than 128 KiB and was cut; use offset=2 to continue]");
        assert_eq!(body.len(), READ_CAP);

        // Many lines: the cap falls on a line boundary.
        let line = format!("{}\n", "y".repeat(99));
        std::fs::write(&p, line.repeat(5000)).unwrap();
        let out = read_lines(File::open(&p).unwrap(), 1, 2000, "big").unwrap();
        let (header, body) = out.split_once('\n').unwrap();
        let shown = READ_CAP / 100;
        assert_eq!(
            header,
            format!("[lines 1-{shown} of 5000; output capped at 128 KiB; use offset={} to continue]", shown + 1)
        );
        assert_eq!(body, line.repeat(shown));
    }

    #[test]
    fn edit_rules() {
        let text = "fn a() {\n    one();\n}\nfn b() {\n    one();\n}\n";
        let err = apply_edit(text, "two()", "x", false, "f.rs").unwrap_err();
        assert!(err.0.starts_with("old_text was not found in f.rs; read the file again"), "{}", err.0);
        let err = apply_edit(text, "fn a() {\none();", "x", false, "f.rs").unwrap_err();
        assert!(err.0.contains("it does match if whitespace is ignored"), "{}", err.0);
        let err = apply_edit(text, "one();", "two();", false, "f.rs").unwrap_err();
        assert!(err.0.contains("matches 2 times in f.rs"), "{}", err.0);
        let (new, n) = apply_edit(text, "one();", "two();", true, "f.rs").unwrap();
        assert_eq!((new.matches("two();").count(), n), (2, 2));
        let (new, n) = apply_edit(text, "fn b() {\n    one();", "fn b() {\n    three();", false, "f.rs").unwrap();
        assert_eq!(n, 1);
        assert!(new.contains("three();") && new.contains("one();"));
        assert!(apply_edit(text, "", "x", false, "f.rs").is_err());
    }

    #[test]
    fn sizes_are_readable() {
        assert_eq!(human_size(12), "12 bytes");
        assert_eq!(human_size(2048), "2.0 KiB");
        assert_eq!(human_size(3 << 20), "3.0 MiB");
    }
}
