//! `bramble sandbox-exec`: the small program every `exec` child starts as.
//!
//! bramble spawns itself (`posix_spawn`, no `pre_exec` hook: a `fork` with a
//! hook hangs under qemu-user) as `bramble sandbox-exec [options] -- PROGRAM
//! ARGS…`. This module runs in that fresh, single-threaded process, before any
//! async runtime exists, so every layer is set up in ordinary code — no
//! async-signal-safety rules to respect — and then `execve`s the program.
//!
//! The order matters:
//!
//! 1. rlimits (no core dumps, CPU, address space, file size, open files) —
//!    inherited by everything below;
//! 2. with `--ns`: `unshare` new mount, pid, ipc and uts namespaces (and an
//!    empty network namespace with `--no-network`); as non-root also a user
//!    namespace mapping only our own uid/gid. Root needs no user namespace: it
//!    builds the jail with its real privileges and the command drops them;
//! 3. `fork` → **init**, pid 1 of the new pid namespace, in a new session (no
//!    controlling terminal). It builds the filesystem view ([`super::jail`]),
//!    mounts a fresh `/proc`, then forks the **worker** and reaps until the
//!    worker ends. When init exits the kernel kills everything left in the
//!    namespace: background children cannot outlive the command;
//! 4. the worker switches to the unprivileged user (root only; `setgroups`,
//!    `setresgid`, `setresuid`), sets `RLIMIT_NPROC`, `PR_SET_NO_NEW_PRIVS`,
//!    the parent-death signal, Landlock, closes every inherited file
//!    descriptor above 2, installs the seccomp filter ([`super::seccomp`]),
//!    and `execvp`s the program.
//!
//! Every process in the chain has `PR_SET_PDEATHSIG(SIGKILL)`: if bramble dies
//! the helper dies, then init, and with init the whole pid namespace.
//! The helper reports the worker's exit status as its own (re-raising a fatal
//! signal), so the parent sees the command's real status.
//!
//! A layer that cannot be set up ends the helper with [`SETUP_FAILED`] and one
//! line on stderr starting with [`ERROR_PREFIX`]; the exec tool turns that into
//! an `Error: …` for the model.

use std::ffi::{CString, OsStr, OsString};
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sched::{unshare, CloneFlags};
use nix::sys::prctl;
use nix::sys::resource::{getrlimit, setrlimit, Resource};
use nix::sys::signal::{raise, signal, SigHandler, Signal};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{
    chdir, execvp, fork, getegid, geteuid, getpid, getppid, pipe2, read, setgroups, sethostname, setresgid, setresuid,
    setsid, setuid, write, ForkResult, Gid, Pid, Uid,
};

use super::jail;
use super::netproxy;
use super::options::{cstr, Limits, Options, ERROR_PREFIX, SETUP_FAILED};

/// Entry point of `bramble sandbox-exec`; never returns on success (the program replaces us).
pub fn main(args: &[OsString]) -> i32 {
    let opts = match Options::parse(args) {
        Ok(o) => o,
        Err(e) => return fail(&format!("bad arguments: {e}")),
    };
    match run(&opts) {
        Ok(code) => code,
        Err(e) => fail(&e),
    }
}

/// Print the one-line setup error and return [`SETUP_FAILED`].
fn fail(msg: &str) -> i32 {
    let _ = writeln!(io::stderr(), "{ERROR_PREFIX}{msg}");
    SETUP_FAILED
}

/// `what: <errno text>` for a failed call.
fn err(what: &str) -> impl FnOnce(Errno) -> String + '_ {
    move |e| format!("{what}: {}", io::Error::from(e))
}

fn run(o: &Options) -> Result<i32, String> {
    // The proxy is forked first: it must stay in the host's network namespace,
    // and it is not the command, so the command's limits are not its own.
    let proxy = match o.proxy {
        Some(_) if !o.ns => return Err("--net-proxy needs --ns".into()),
        Some(reach) => Some(netproxy::start(reach, o)?),
        None => None,
    };
    let result = run_with(o, proxy.as_ref());
    if let Some(proxy) = proxy {
        proxy.stop();
    }
    result
}

fn run_with(o: &Options, proxy: Option<&netproxy::Proxy>) -> Result<i32, String> {
    set_limits(&o.limits)?;
    set_pdeathsig()?;
    if getppid() == Pid::from_raw(1) {
        return Err("bramble exited before the sandbox was set up".into());
    }
    if !o.ns {
        // No namespaces: this process becomes the command, in bramble's process group.
        worker(o);
    }
    let (uid, gid) = (geteuid(), getegid());
    let root = uid.is_root();
    let mut flags = CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWPID | CloneFlags::CLONE_NEWIPC;
    flags |= CloneFlags::CLONE_NEWUTS;
    if o.no_network || proxy.is_some() {
        flags |= CloneFlags::CLONE_NEWNET;
    }
    if !root {
        flags |= CloneFlags::CLONE_NEWUSER;
    }
    unshare(flags).map_err(err("cannot create namespaces (unshare)"))?;
    if !root {
        // Map only ourselves: inside, we keep our uid and gid; nothing else exists.
        write_file("/proc/self/setgroups", "deny")?;
        write_file("/proc/self/uid_map", &format!("{uid} {uid} 1"))?;
        write_file("/proc/self/gid_map", &format!("{gid} {gid} 1"))?;
    }
    // A new user namespace changed our credentials, which clears the death signal.
    set_pdeathsig()?;
    if let Some(proxy) = proxy {
        // Loopback up, a listener on it handed to the proxy; the command is told where.
        let url = format!("http://127.0.0.1:{}", proxy.hand_over()?);
        for name in ["http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"] {
            std::env::set_var(name, &url);
        }
        for name in ["no_proxy", "NO_PROXY"] {
            std::env::set_var(name, "localhost,127.0.0.1,::1");
        }
    }

    let (status_r, status_w) = pipe2(OFlag::O_CLOEXEC).map_err(err("pipe"))?;
    let helper_pid = getpid();
    // SAFETY: this process is single-threaded (the helper runs before any runtime or
    // thread exists, see the module header), so the child may run ordinary code.
    match unsafe { fork() }.map_err(err("fork"))? {
        ForkResult::Child => {
            drop(status_r);
            let code = match init_process(o, status_w, helper_pid) {
                Ok(()) => 0,
                Err(e) => fail(&e),
            };
            std::process::exit(code);
        }
        ForkResult::Parent { child: init } => {
            drop(status_w);
            let init_status = wait_for(init)?;
            let mut buf = [0u8; 4];
            match read(&status_r, &mut buf) {
                Ok(4) => mirror(Ended::decode(buf)),
                // Init failed before the worker ended (its error is on stderr).
                _ => match init_status {
                    WaitStatus::Exited(_, code) => Ok(code),
                    _ => Err("the sandbox's init process was killed".into()),
                },
            }
        }
    }
}

/// How the worker ended, sent from init to the helper through a pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Exited(i32),
    Killed(Signal),
}

impl Ended {
    fn from_status(status: WaitStatus) -> Option<Ended> {
        match status {
            WaitStatus::Exited(_, code) => Some(Ended::Exited(code)),
            WaitStatus::Signaled(_, sig, _) => Some(Ended::Killed(sig)),
            _ => None,
        }
    }

    /// Non-negative: an exit code; negative: a signal number.
    fn encode(self) -> [u8; 4] {
        match self {
            Ended::Exited(code) => code.to_ne_bytes(),
            Ended::Killed(sig) => (-(sig as i32)).to_ne_bytes(),
        }
    }

    fn decode(bytes: [u8; 4]) -> Ended {
        let v = i32::from_ne_bytes(bytes);
        match v {
            v if v >= 0 => Ended::Exited(v),
            v => Signal::try_from(-v).map_or(Ended::Exited(SETUP_FAILED), Ended::Killed),
        }
    }
}

/// Pid 1 of the new pid namespace: build the view, start the worker, reap.
fn init_process(o: &Options, status_w: OwnedFd, helper_pid: Pid) -> Result<(), String> {
    set_pdeathsig()?;
    // The helper may have died between fork and prctl: then nobody waits for us. getppid()
    // reads 0 across the pid namespace boundary, but /proc is still the parent namespace's.
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let ppid = status.lines().find_map(|l| l.strip_prefix("PPid:")).and_then(|v| v.trim().parse::<i32>().ok());
    if ppid.is_some_and(|p| p != helper_pid.as_raw()) {
        return Err("the helper exited during setup".into());
    }
    // Own session: the command has no controlling terminal to inject keystrokes into.
    setsid().map_err(err("setsid"))?;
    jail::build(o)?;
    // Cosmetic (the uts namespace is new): a failure changes nothing that matters.
    let _ = sethostname("sandbox");
    // A warm jail: everything above was built ahead; now the command itself.
    let ordered;
    let o = if o.warm {
        ordered = take_order(o)?;
        &ordered
    } else {
        o
    };
    // SAFETY: init is single-threaded, like the helper it was forked from.
    let worker_pid = match unsafe { fork() }.map_err(err("fork"))? {
        ForkResult::Child => worker(o),
        ForkResult::Parent { child } => child,
    };
    loop {
        match waitpid(None::<Pid>, None) {
            Ok(status) if status.pid() == Some(worker_pid) => {
                if let Some(ended) = Ended::from_status(status) {
                    let _ = write(&status_w, &ended.encode());
                    return Ok(());
                }
            }
            Ok(_) | Err(Errno::EINTR) => {} // Reaped an orphan of the command.
            Err(e) => return Err(err("waitpid")(e)),
        }
    }
}

/// Bytes of a warm helper's order at most.
const MAX_ORDER: usize = 1 << 20;

/// A warm jail's order, read from stdin to its end: the working directory and
/// the command, NUL-separated ([`super::warm::order`]). Nothing is read when
/// bramble dropped the helper unused: it is killed instead.
fn take_order(o: &Options) -> Result<Options, String> {
    let mut order = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match nix::unistd::read(io::stdin(), &mut buf) {
            Ok(0) => break,
            Ok(n) if order.len() + n <= MAX_ORDER => order.extend_from_slice(&buf[..n]),
            Ok(_) => return Err("the command is too long".into()),
            Err(Errno::EINTR) => {}
            Err(e) => return Err(err("reading the command")(e)),
        }
    }
    let mut parts = order.split(|b| *b == 0).map(|p| OsStr::from_bytes(p).to_os_string());
    let cwd = parts.next().filter(|c| !c.is_empty()).ok_or("no working directory came")?;
    let command: Vec<OsString> = parts.collect();
    if command.first().is_none_or(|c| c.is_empty()) {
        return Err("no command came".into());
    }
    Ok(Options { cwd: Some(cwd.into()), command, warm: false, ..o.clone() })
}

/// Become the command: drop privileges, last layers, exec. Never returns.
fn worker(o: &Options) -> ! {
    let code = match prepare_worker(o) {
        Ok(()) => exec(&o.command),
        Err(e) => fail(&e),
    };
    std::process::exit(code)
}

fn prepare_worker(o: &Options) -> Result<(), String> {
    if let Some((uid, gid)) = o.run_as {
        let (uid, gid) = (Uid::from_raw(uid), Gid::from_raw(gid));
        // Groups first, then gid, then uid (afterwards we could not).
        setgroups(&[gid]).map_err(err("setgroups"))?;
        setresgid(gid, gid, gid).map_err(err(&format!("cannot switch to group {gid}")))?;
        setresuid(uid, uid, uid).map_err(err(&format!("cannot switch to user {uid}")))?;
        if setuid(Uid::from_raw(0)).is_ok() {
            return Err("dropping root did not stick".into());
        }
    }
    if o.limits.processes > 0 {
        set_limit(Resource::RLIMIT_NPROC, o.limits.processes, "processes")?;
    }
    prctl::set_no_new_privs().map_err(err("PR_SET_NO_NEW_PRIVS"))?;
    set_pdeathsig()?;
    if let Some(cwd) = &o.cwd {
        chdir(cwd.as_path()).map_err(err(&format!("cannot enter {}", cwd.display())))?;
    }
    if o.landlock {
        super::landlock::restrict(o)?;
    }
    close_inherited_fds();
    let policy = super::seccomp::Policy { deny_inet: o.no_network, deny_unix: o.no_unix };
    super::seccomp::install(policy)?;
    Ok(())
}

/// Close every file descriptor above stderr: whatever bramble inherited from
/// its parent without close-on-exec (a shell's redirections, a supervisor's
/// sockets) must not reach the command.
fn close_inherited_fds() {
    // SAFETY: close_range(first, last, flags) only closes descriptors; nothing in this
    // process refers to one above 2 any more (the worker is about to exec).
    if unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) } == 0 {
        return;
    }
    // Kernels before 5.9: every number up to the open-files limit.
    let last = getrlimit(Resource::RLIMIT_NOFILE).map_or(1024, |(soft, _)| soft.clamp(1024, 65536));
    for fd in 3..last as libc::c_int {
        let _ = nix::unistd::close(fd);
    }
}

/// `execvp` the command; returns the shell-style exit code on failure.
fn exec(command: &[OsString]) -> i32 {
    let args: Result<Vec<CString>, String> = command.iter().map(|a| cstr(a)).collect();
    let Ok(args) = args else { return fail("a NUL byte in the command") };
    let Err(e) = execvp(&args[0], &args);
    let _ = writeln!(io::stderr(), "{ERROR_PREFIX}cannot run {:?}: {}", command[0], io::Error::from(e));
    if e == Errno::ENOENT {
        127
    } else {
        126
    }
}

/// Exit the way the worker did: same code, or the same fatal signal.
fn mirror(ended: Ended) -> Result<i32, String> {
    match ended {
        Ended::Exited(code) => Ok(code),
        Ended::Killed(sig) => {
            // SAFETY: restoring the default disposition installs no handler.
            let _ = unsafe { signal(sig, SigHandler::SigDfl) };
            let _ = raise(sig);
            Ok(128 + sig as i32)
        }
    }
}

fn wait_for(pid: Pid) -> Result<WaitStatus, String> {
    loop {
        match waitpid(pid, None) {
            Err(Errno::EINTR) => continue,
            other => return other.map_err(err("waitpid")),
        }
    }
}

fn set_pdeathsig() -> Result<(), String> {
    prctl::set_pdeathsig(Signal::SIGKILL).map_err(err("PR_SET_PDEATHSIG"))
}

fn set_limits(l: &Limits) -> Result<(), String> {
    set_limit(Resource::RLIMIT_CORE, 0, "core dumps")?;
    for (res, v, what) in [
        (Resource::RLIMIT_CPU, l.cpu_seconds, "CPU time"),
        (Resource::RLIMIT_AS, l.address_space, "address space"),
        (Resource::RLIMIT_FSIZE, l.file_size, "file size"),
        (Resource::RLIMIT_NOFILE, l.open_files, "open files"),
    ] {
        if v > 0 {
            set_limit(res, v, what)?;
        }
    }
    Ok(())
}

/// Lower soft and hard limit to `v` (never raise: an existing lower hard limit stays).
fn set_limit(res: Resource, v: u64, what: &str) -> Result<(), String> {
    let (_, hard) = getrlimit(res).map_err(err(&format!("cannot read the {what} limit")))?;
    // rlim_t is 32 bits on armv7: a larger limit is "as much as there is".
    let v = libc::rlim_t::try_from(v).unwrap_or(libc::rlim_t::MAX).min(hard);
    setrlimit(res, v, v).map_err(err(&format!("cannot limit {what}")))
}

fn write_file(path: &str, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {path}: {e}"))
}
