//! The filesystem view of a sandboxed command, built inside its new mount
//! namespace by the helper's init process (see [`super::helper`]).
//!
//! Like bubblewrap, without needing it installed:
//!
//! - nothing propagates back to the host (`/` becomes a private tree);
//! - a fresh `/proc` for the new pid namespace: bramble's own
//!   `/proc/<pid>/environ` (API keys, tokens) does not exist in there. Where
//!   the kernel refuses one (a user namespace under a /proc with masked parts,
//!   e.g. systemd's `ProtectKernelTunables`), an empty `/proc` instead;
//! - the whole system read-only and `nosuid` (`mount_setattr`, recursive);
//! - a fresh, size-limited tmpfs on `/tmp`, also bound on `/var/tmp` and
//!   `/dev/shm`: the per-run temp dir, gone when the command ends;
//! - bramble's state directory, config, credentials and its user's home
//!   covered by empty read-only tmpfs (directories) or `/dev/null` (files):
//!   not visible at all;
//! - `/run` (and a real `/var/run`) shown empty: the host's unix sockets live
//!   there (the broker's, D-Bus, a desktop's `/run/user/UID/bus`), and a path
//!   socket needs no network to reach. `[exec] expose` brings chosen paths
//!   back, read-only (sockets still connect: that needs no write access to
//!   the mount); with the network on, the target of `/etc/resolv.conf` comes
//!   back too, so names still resolve;
//! - a fresh devpts instance on `/dev/pts`: bramble's terminal (and everyone
//!   else's) cannot be opened by path;
//! - when the command will run as another user (bramble is root), the first
//!   ancestor of the workspace that user could not enter (`/root`, a 0700
//!   temp dir) is covered too, so the path to the workspace exists for it;
//! - the workspace, cloned with `open_tree` *before* anything covered it,
//!   attached again at its own path, writable, `nosuid` and `nodev`. For a
//!   root bramble the clone is idmapped (root's files shown as the command
//!   user's); that also stores the command's new files as root's, which is why
//!   the seccomp filter refuses set-id mode bits ([`super::seccomp`]).
//!
//! Paths arrive canonical (the parent resolved symlinks).

use std::ffi::CStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::options::{cstr, Options};

use libc::{
    mount_attr, AT_RECURSIVE, MOUNT_ATTR_IDMAP, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY,
    MOVE_MOUNT_F_EMPTY_PATH, OPEN_TREE_CLONE,
};
use nix::mount::MsFlags;
use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::{fork, pause, pipe2, read, write, ForkResult};

/// The workspace: where it is, and its clone taken before anything covered it.
type Attached = (PathBuf, OwnedFd);

/// A path of `[exec] expose`, cloned read-only before anything covered it.
struct Exposed {
    path: PathBuf,
    tree: OwnedFd,
    is_dir: bool,
}

/// Build the view described by `o` in the current (new) mount namespace: each
/// step below is one row of the list at the top of this file, in the order they must happen.
pub fn build(o: &Options) -> Result<(), String> {
    mount(None, "/", None, libc::MS_REC | libc::MS_PRIVATE, None)
        .map_err(|e| format!("cannot make the mount tree private: {e}"))?;
    // Clone the workspace before anything can cover it (it may live under /tmp or the state dir).
    let ws: Option<Attached> = match &o.workspace {
        Some(ws) => Some((ws.clone(), open_tree(ws)?)),
        None => None,
    };
    fresh_proc()?;
    if let Some((ws, tree)) = &ws {
        prepare_workspace(ws, tree, o.run_as)?;
    }
    // Exposed paths, cloned (like the workspace) before anything covers them.
    let exposed = clone_exposed(&o.expose)?;
    set_attr("/", MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, AT_RECURSIVE as libc::c_uint)
        .map_err(|e| format!("cannot make the system read-only: {e}"))?;
    fresh_devpts()?;
    fresh_tmp(o.tmp_mb)?;
    let (covers, files) = hide(o, ws.as_ref())?;
    attach_exposed(&exposed)?;
    seal(&covers, &files)
}

/// A fresh `/proc` for the new pid namespace, or none at all where the kernel refuses one.
fn fresh_proc() -> Result<(), String> {
    let proc_flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    match mount(Some("proc"), "/proc", Some("proc"), proc_flags, None) {
        Ok(()) => Ok(()),
        // A /proc with masked parts (systemd's ProtectKernelTunables, a container) cannot be
        // mounted again from a user namespace. Then the command gets no /proc at all rather
        // than the host's, where bramble's own environment is.
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => cover(Path::new("/proc")),
        Err(e) => Err(format!("cannot mount a fresh /proc: {e}")),
    }
}

/// The workspace's clone: idmapped for a command user (bramble is root), `nosuid,nodev`.
fn prepare_workspace(ws: &Path, tree: &OwnedFd, run_as: Option<(u32, u32)>) -> Result<(), String> {
    if let Some((uid, gid)) = run_as {
        // Root's workspace, used by an unprivileged user: show root's files as theirs.
        // Here, between the fresh /proc (the helper child's pid is ours) and the read-only remount.
        if let Err(e) = idmap(tree, uid, gid) {
            eprintln!("{}note: the workspace stays read-only for this command: {e}", super::options::ERROR_PREFIX);
        }
    }
    set_attr_fd(tree, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)
        .map_err(|e| format!("cannot mount the workspace {} nosuid,nodev: {e}", ws.display()))
}

/// Read-only clones of the exposed paths that exist now.
fn clone_exposed(paths: &[PathBuf]) -> Result<Vec<Exposed>, String> {
    let mut exposed = Vec::new();
    for path in paths {
        let Ok(meta) = std::fs::metadata(path) else { continue }; // Nothing there now.
        let tree = open_tree(path)?;
        set_attr_fd(&tree, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)
            .map_err(|e| format!("cannot make {} read-only: {e}", path.display()))?;
        exposed.push(Exposed { path: path.clone(), tree, is_dir: meta.is_dir() });
    }
    Ok(exposed)
}

/// A devpts of our own: no terminal of the host can be opened by path.
fn fresh_devpts() -> Result<(), String> {
    let pts = "newinstance,ptmxmode=0666,mode=0620";
    let pts_flags = libc::MS_NOSUID | libc::MS_NOEXEC;
    if Path::new("/dev/pts").is_dir()
        && mount(Some("devpts"), "/dev/pts", Some("devpts"), pts_flags, Some(pts)).is_err()
    {
        mount(Some("tmpfs"), "/dev/pts", Some("tmpfs"), libc::MS_NOSUID | libc::MS_NODEV, Some("size=4k,mode=755"))
            .map_err(|e| format!("cannot hide /dev/pts: {e}"))?;
    }
    Ok(())
}

/// A fresh, size-limited `/tmp`, also on `/var/tmp` and `/dev/shm`.
fn fresh_tmp(tmp_mb: u64) -> Result<(), String> {
    let tmp_size = format!("size={}m,mode=1777", tmp_mb.max(1));
    mount(Some("tmpfs"), "/tmp", Some("tmpfs"), libc::MS_NOSUID | libc::MS_NODEV, Some(&tmp_size))
        .map_err(|e| format!("cannot mount a fresh /tmp: {e}"))?;
    for shared in ["/var/tmp", "/dev/shm"] {
        if Path::new(shared).is_dir() {
            bind("/tmp", shared).map_err(|e| format!("cannot mount {shared}: {e}"))?;
        }
    }
    Ok(())
}

/// Hide what `o` says (directories under an empty tmpfs, still writable, files
/// left for [`seal`]) and attach the workspace again in between: the covers
/// made, and the files still to hide.
fn hide(o: &Options, ws: Option<&Attached>) -> Result<(Vec<PathBuf>, Vec<PathBuf>), String> {
    // The unreachable ancestor first: what it covers needs no hiding of its own.
    let mut covers: Vec<PathBuf> = Vec::new();
    if let (Some((ws, _)), Some((uid, gid))) = (ws, o.run_as) {
        if let Some(blocked) = first_unreachable_ancestor(ws, uid, gid) {
            cover(&blocked)?;
            covers.push(blocked);
        }
    }
    let workspace = ws.map(|(w, _)| w.as_path());
    let hidden = Hidden::sort(&o.hide, &o.mask, workspace);
    for dir in outermost(hidden.outside, &covers) {
        cover(&dir)?;
        covers.push(dir);
    }
    if let Some((ws, tree)) = ws {
        std::fs::create_dir_all(ws).map_err(|e| format!("cannot recreate {}: {e}", ws.display()))?;
        move_mount(tree, ws)?;
    }
    let early = covers.len();
    for dir in outermost(hidden.inside, &[]) {
        cover(&dir)?;
        covers.push(dir);
    }
    let files = uncovered(hidden.files, &covers, early, workspace);
    Ok((covers, files))
}

/// What to hide, sorted, looked at all at once before anything is covered: a
/// cover over the home hides the state directory beneath it (the default
/// layout outside systemd), which then needs no cover of its own — and could
/// not get one. What lies inside the workspace is covered after the workspace is back.
#[derive(Debug, Default, PartialEq, Eq)]
struct Hidden {
    /// Directories outside the workspace, and the masked ones.
    outside: Vec<PathBuf>,
    /// Directories inside the workspace.
    inside: Vec<PathBuf>,
    /// Files (and anything that is not a directory).
    files: Vec<PathBuf>,
}

impl Hidden {
    fn sort(hide: &[PathBuf], mask: &[PathBuf], workspace: Option<&Path>) -> Hidden {
        let mut h = Hidden::default();
        for path in hide {
            match std::fs::symlink_metadata(path) {
                Ok(m) if m.is_dir() && inside(path, workspace) => h.inside.push(path.clone()),
                Ok(m) if m.is_dir() => h.outside.push(path.clone()),
                Ok(_) => h.files.push(path.clone()),
                Err(_) => {} // Nothing there (or already covered), nothing to hide.
            }
        }
        for dir in mask {
            // Only real directories: `/var/run` is usually a link to `/run`, masked already.
            if std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
                h.outside.push(dir.clone());
            }
        }
        h
    }
}

/// Whether `p` lies strictly inside the workspace.
fn inside(p: &Path, workspace: Option<&Path>) -> bool {
    workspace.is_some_and(|w| p.starts_with(w) && p != w)
}

/// The files still visible after `covers`: a file under a cover is gone
/// already, unless the workspace (attached after the first `early` covers) brought it back.
fn uncovered(mut files: Vec<PathBuf>, covers: &[PathBuf], early: usize, workspace: Option<&Path>) -> Vec<PathBuf> {
    files.retain(|f| !covers[..early].iter().any(|c| f.starts_with(c)) || inside(f, workspace));
    files.retain(|f| !covers[early..].iter().any(|c| f.starts_with(c)));
    files
}

/// Attach the exposed paths again, read-only; the mount point is made in the
/// (still writable) cover if the path is under one.
fn attach_exposed(exposed: &[Exposed]) -> Result<(), String> {
    for Exposed { path, tree, is_dir } in exposed {
        if std::fs::symlink_metadata(path).is_err() {
            let made = if *is_dir {
                std::fs::create_dir_all(path)
            } else {
                path.parent()
                    .map_or(Ok(()), std::fs::create_dir_all)
                    .and_then(|()| std::fs::File::create(path).map(drop))
            };
            made.map_err(|e| format!("cannot expose {}: {e}", path.display()))?;
        }
        move_mount(tree, path).map_err(|e| format!("[exec] expose: {e}"))?;
    }
    Ok(())
}

/// Make every cover read-only and hide the files under `/dev/null`.
fn seal(covers: &[PathBuf], files: &[PathBuf]) -> Result<(), String> {
    for c in covers {
        mount(None, path_str(c)?, None, libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY, None)
            .map_err(|e| format!("cannot make {} read-only: {e}", c.display()))?;
    }
    for f in files {
        bind("/dev/null", path_str(f)?).map_err(|e| format!("cannot hide {}: {e}", f.display()))?;
    }
    Ok(())
}

/// Make the detached mount `tree` show files owned by root (uid/gid 0) as owned
/// by `uid`/`gid`, and store what `uid` creates as root's: an idmapped mount.
/// Needs a user namespace that maps 0 to `uid`; a short-lived child provides it.
fn idmap(tree: &OwnedFd, uid: u32, gid: u32) -> Result<(), String> {
    let (ready_r, ready_w) =
        pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {}", std::io::Error::from(e)))?;
    // SAFETY: init is single-threaded; the child only unshares, writes one byte and pauses.
    let child = match unsafe { fork() }.map_err(|e| format!("fork: {}", std::io::Error::from(e)))? {
        ForkResult::Child => {
            let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
            let ok = unshare(CloneFlags::CLONE_NEWUSER).is_ok();
            let _ = write(&ready_w, &[u8::from(ok)]);
            loop {
                pause();
            }
        }
        ForkResult::Parent { child } => child,
    };
    drop(ready_w);
    let result = (|| {
        let mut byte = [0u8; 1];
        if read(&ready_r, &mut byte) != Ok(1) || byte[0] != 1 {
            return Err("cannot create a user namespace for the mapping".to_string());
        }
        let w = |file: &str, text: String| {
            std::fs::write(format!("/proc/{child}/{file}"), text).map_err(|e| format!("{file}: {e}"))
        };
        w("uid_map", format!("0 {uid} 1"))?;
        w("gid_map", format!("0 {gid} 1"))?;
        let ns = std::fs::File::open(format!("/proc/{child}/ns/user")).map_err(|e| format!("ns/user: {e}"))?;
        let attr =
            mount_attr { attr_set: MOUNT_ATTR_IDMAP, attr_clr: 0, propagation: 0, userns_fd: ns.as_raw_fd() as u64 };
        mount_setattr(tree.as_raw_fd(), c"", libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE as libc::c_uint, &attr)
            .map_err(|e| format!("idmapped mount: {e}"))
    })();
    let _ = kill(child, Signal::SIGKILL);
    let _ = waitpid(child, None);
    result
}

/// The directories of `dirs` that lie beneath no other one (nor beneath one of
/// `covered`), each once.
fn outermost(mut dirs: Vec<PathBuf>, covered: &[PathBuf]) -> Vec<PathBuf> {
    dirs.sort(); // a parent sorts before what lies beneath it
    let mut out: Vec<PathBuf> = Vec::new();
    for d in dirs {
        if !out.iter().chain(covered).any(|c| d.starts_with(c)) {
            out.push(d);
        }
    }
    out
}

/// An empty, small tmpfs over `dir` (writable until the caller remounts it read-only).
fn cover(dir: &Path) -> Result<(), String> {
    mount(Some("tmpfs"), path_str(dir)?, Some("tmpfs"), libc::MS_NOSUID | libc::MS_NODEV, Some("size=1m,mode=755"))
        .map_err(|e| format!("cannot hide {}: {e}", dir.display()))
}

/// The first ancestor of `ws` (below `/`) that `uid`/`gid` cannot search.
fn first_unreachable_ancestor(ws: &Path, uid: u32, gid: u32) -> Option<PathBuf> {
    let mut dir = PathBuf::from("/");
    for part in ws.components().skip(1) {
        dir.push(part);
        if dir == ws {
            return None;
        }
        let m = std::fs::metadata(&dir).ok()?;
        let mode = m.mode();
        let bit = if m.uid() == uid {
            0o100
        } else if m.gid() == gid {
            0o010
        } else {
            0o001
        };
        if mode & bit == 0 {
            return Some(dir);
        }
    }
    None
}

fn path_str(p: &Path) -> Result<&str, String> {
    p.to_str().ok_or_else(|| format!("not a UTF-8 path: {}", p.display()))
}

fn bind(from: &str, to: &str) -> Result<(), std::io::Error> {
    mount(Some(from), to, None, libc::MS_BIND | libc::MS_REC, None)
}

fn mount(
    src: Option<&str>,
    target: &str,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<(), std::io::Error> {
    nix::mount::mount(src, target, fstype, MsFlags::from_bits_retain(flags), data).map_err(std::io::Error::from)
}

/// A detached copy of the mount tree at `path`.
fn open_tree(path: &Path) -> Result<OwnedFd, String> {
    let c = cstr(path.as_os_str())?;
    let flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | AT_RECURSIVE as libc::c_uint;
    // SAFETY: open_tree(dfd, path, flags) reads a valid C string and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, c.as_ptr(), flags) };
    if fd < 0 {
        return Err(format!("cannot clone the mount {}: {}", path.display(), std::io::Error::last_os_error()));
    }
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn move_mount(tree: &OwnedFd, to: &Path) -> Result<(), String> {
    let target = cstr(to.as_os_str())?;
    // SAFETY: move_mount(from_dfd, "", to_dfd, to_path, F_EMPTY_PATH) with valid C strings and an open fd.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if rc < 0 {
        return Err(format!("cannot attach {} again: {}", to.display(), std::io::Error::last_os_error()));
    }
    Ok(())
}

/// `mount_setattr(2)`: change the attributes of the mount(s) at `dfd`/`path`.
fn mount_setattr(dfd: RawFd, path: &CStr, flags: libc::c_uint, attr: &mount_attr) -> Result<(), std::io::Error> {
    // SAFETY: the kernel reads `path` (a valid C string) and `size_of::<mount_attr>()` bytes of `attr`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            dfd,
            path.as_ptr(),
            flags,
            attr as *const mount_attr,
            size_of::<mount_attr>(),
        )
    };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Set mount attributes on a detached tree (recursively).
fn set_attr_fd(tree: &OwnedFd, set: u64) -> Result<(), std::io::Error> {
    let attr = mount_attr { attr_set: set, attr_clr: 0, propagation: 0, userns_fd: 0 };
    mount_setattr(tree.as_raw_fd(), c"", libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE as libc::c_uint, &attr)
}

/// Set mount attributes on the mount at `path` (with `AT_RECURSIVE` in `flags`: and beneath).
fn set_attr(path: &str, set: u64, clear: u64, flags: libc::c_uint) -> Result<(), std::io::Error> {
    let c = std::ffi::CString::new(path).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    let attr = mount_attr { attr_set: set, attr_clr: clear, propagation: 0, userns_fd: 0 };
    mount_setattr(libc::AT_FDCWD, &c, flags, &attr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covers_beneath_another_are_dropped() {
        let p = |s: &str| PathBuf::from(s);
        let dirs = vec![p("/home/pi/.local/state/bramble"), p("/run"), p("/home/pi"), p("/home/pi2"), p("/run")];
        assert_eq!(outermost(dirs, &[]), [p("/home/pi"), p("/home/pi2"), p("/run")]);
        assert_eq!(outermost(vec![p("/root/x"), p("/srv")], &[p("/root")]), [p("/srv")]);
    }

    #[test]
    fn hidden_paths_are_sorted_by_kind_and_place() {
        let tmp = tempfile::tempdir().unwrap();
        let (ws, state, inner, file) =
            (tmp.path().join("ws"), tmp.path().join("state"), tmp.path().join("ws/.secret"), tmp.path().join("cfg"));
        for d in [&ws, &state, &inner] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(&file, "x").unwrap();
        let link = tmp.path().join("run-link");
        std::os::unix::fs::symlink(&state, &link).unwrap();
        let hide = [state.clone(), inner.clone(), file.clone(), tmp.path().join("gone"), ws.clone()];
        let h = Hidden::sort(&hide, &[link, state.clone()], Some(&ws));
        assert_eq!(h.outside, [state.clone(), ws.clone(), state], "the workspace itself is not inside itself");
        assert_eq!(h.inside, [inner]);
        assert_eq!(h.files, [file]);
    }

    #[test]
    fn files_under_a_cover_need_none_unless_the_workspace_brought_them_back() {
        let p = |s: &str| PathBuf::from(s);
        let files =
            vec![p("/home/pi/.netrc"), p("/home/pi/ws/key"), p("/home/pi/ws/.hidden/key"), p("/etc/bramble.toml")];
        let covers = [p("/home/pi"), p("/home/pi/ws/.hidden")];
        let left = uncovered(files, &covers, 1, Some(Path::new("/home/pi/ws")));
        assert_eq!(left, [p("/home/pi/ws/key"), p("/etc/bramble.toml")]);
    }
}
