//! The seccomp filter every sandboxed command runs under.
//!
//! It is the one layer that needs nothing from the kernel but seccomp (there
//! since 3.5), so it carries the rules that must hold even on a stock Pi
//! kernel without Landlock or user namespaces. A few dozen classic-BPF
//! instructions written by hand (no seccompiler: it cannot build for armv7,
//! and this is all we need):
//!
//! - **no set-user-ID or set-group-ID files**: `chmod`, `fchmod`, `fchmodat`,
//!   `fchmodat2`, and `open`/`openat`/`creat`/`mknod`/`mknodat` creating a file,
//!   with `S_ISUID` or `S_ISGID` in the mode → `EPERM`. Run by a root bramble,
//!   a command writes the workspace through an idmapped mount that stores its
//!   files as root's (an idmapping is a bijection: showing root's files as the
//!   command's means storing the command's as root's). The jail mounts the
//!   workspace `nosuid`, but outside it such a file would be a setuid-root
//!   binary any local user can run; this rule means it cannot exist;
//! - **no memory outside the limits**: `memfd_create`, `memfd_secret` and
//!   `shmget` → `ENOSYS` (an anonymous file or a SysV segment can hold far
//!   more than `RLIMIT_AS`; POSIX shm lives in `/dev/shm`, which is the
//!   size-limited `/tmp`);
//! - **no side doors**: `io_uring_setup` (its opcodes open files and sockets
//!   without the syscalls above) and `openat2` (its mode is behind a pointer)
//!   → `ENOSYS`; callers fall back to `openat`;
//! - **sockets, as [`Policy`] says**: with `[exec] network = false` nothing
//!   but `AF_UNIX` (`EAFNOSUPPORT`); `AF_UNIX` itself is refused too unless a
//!   layer keeps it to the sandbox's own sockets (see
//!   [`super::unix_sockets_allowed`]). On 32-bit ARM `socketcall` → `ENOSYS`
//!   whenever a family is refused;
//! - a foreign architecture (`int 0x80` on x86-64) or the x32 ABI → `EPERM`.

/// Which socket families commands may create.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Policy {
    /// Refuse every family but `AF_UNIX` (`[exec] network = false`).
    pub deny_inet: bool,
    /// Refuse `AF_UNIX` too (host sockets would be reachable).
    pub deny_unix: bool,
}

/// Install the filter on the calling thread (inherited by what it execs).
/// Requires `PR_SET_NO_NEW_PRIVS` first. `Ok(false)`: no filter for this architecture.
pub fn install(policy: Policy) -> Result<bool, String> {
    let Some(arch) = Arch::current() else { return Ok(false) };
    let filter = program(&arch, policy);
    let prog = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr() as *mut libc::sock_filter };
    // SAFETY: prog points to `filter`, alive for the call; the kernel copies it.
    let rc = unsafe { libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &prog as *const _ as usize, 0, 0) };
    if rc < 0 {
        return Err(format!("seccomp: {}", std::io::Error::last_os_error()));
    }
    Ok(true)
}

/// Whether this build has a filter for its architecture.
pub fn available() -> bool {
    Arch::current().is_some()
}

/// A syscall whose mode argument must not carry set-id bits.
#[derive(Clone, Copy)]
struct ModeCall {
    nr: u32,
    /// Argument index of the mode.
    mode: u32,
    /// Argument index of open flags: the mode only counts with `O_CREAT`/`O_TMPFILE`.
    flags: Option<u32>,
}

const fn chmod_like(nr: libc::c_long, mode: u32) -> ModeCall {
    ModeCall { nr: nr as u32, mode, flags: None }
}
const fn open_like(nr: libc::c_long, flags: u32, mode: u32) -> ModeCall {
    ModeCall { nr: nr as u32, mode, flags: Some(flags) }
}

struct Arch {
    audit: u32,
    socket: u32,
    /// Denied outright with ENOSYS.
    enosys: Vec<u32>,
    /// Only when a socket family is refused (32-bit ARM's `socketcall`).
    enosys_for_sockets: Vec<u32>,
    modes: Vec<ModeCall>,
    /// x86-64: syscall numbers with this bit are the x32 ABI.
    x32_bit: Option<u32>,
}

// The same number on every architecture.
const IO_URING_SETUP: u32 = 425;
const OPENAT2: u32 = 437;
const MEMFD_SECRET: u32 = 447;
const FCHMODAT2: libc::c_long = 452;

impl Arch {
    #[cfg(target_arch = "x86_64")]
    fn current() -> Option<Arch> {
        use libc::*;
        Some(Arch {
            audit: 0xC000_003E,
            socket: SYS_socket as u32,
            enosys: vec![IO_URING_SETUP, OPENAT2, MEMFD_SECRET, SYS_memfd_create as u32, SYS_shmget as u32],
            enosys_for_sockets: vec![],
            modes: vec![
                chmod_like(SYS_chmod, 1),
                chmod_like(SYS_fchmod, 1),
                chmod_like(SYS_fchmodat, 2),
                chmod_like(FCHMODAT2, 2),
                chmod_like(SYS_creat, 1),
                chmod_like(SYS_mknod, 1),
                chmod_like(SYS_mknodat, 2),
                open_like(SYS_open, 1, 2),
                open_like(SYS_openat, 2, 3),
            ],
            x32_bit: Some(0x4000_0000),
        })
    }

    // RISC-V uses the same generic syscall table as aarch64 (no `open`,
    // `chmod`, `creat`, `mknod`); AUDIT_ARCH_RISCV64 = EM_RISCV | 64-bit | LE.
    #[cfg(any(target_arch = "aarch64", target_arch = "riscv64"))]
    fn current() -> Option<Arch> {
        use libc::*;
        Some(Arch {
            audit: if cfg!(target_arch = "riscv64") { 0xC000_00F3 } else { 0xC000_00B7 },
            socket: SYS_socket as u32,
            enosys: vec![IO_URING_SETUP, OPENAT2, MEMFD_SECRET, SYS_memfd_create as u32, SYS_shmget as u32],
            enosys_for_sockets: vec![],
            modes: vec![
                chmod_like(SYS_fchmod, 1),
                chmod_like(SYS_fchmodat, 2),
                chmod_like(FCHMODAT2, 2),
                chmod_like(SYS_mknodat, 2),
                open_like(SYS_openat, 2, 3),
            ],
            x32_bit: None,
        })
    }

    #[cfg(target_arch = "arm")]
    fn current() -> Option<Arch> {
        use libc::*;
        Some(Arch {
            audit: 0x4000_0028,
            socket: SYS_socket as u32,
            enosys: vec![IO_URING_SETUP, OPENAT2, MEMFD_SECRET, SYS_memfd_create as u32, SYS_shmget as u32],
            enosys_for_sockets: vec![102], // socketcall
            modes: vec![
                chmod_like(SYS_chmod, 1),
                chmod_like(SYS_fchmod, 1),
                chmod_like(SYS_fchmodat, 2),
                chmod_like(FCHMODAT2, 2),
                chmod_like(SYS_creat, 1),
                chmod_like(SYS_mknod, 1),
                chmod_like(SYS_mknodat, 2),
                open_like(SYS_open, 1, 2),
                open_like(SYS_openat, 2, 3),
            ],
            x32_bit: None,
        })
    }

    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64", target_arch = "riscv64", target_arch = "arm")))]
    fn current() -> Option<Arch> {
        None
    }
}

const RET_ALLOW: u32 = 0x7fff_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;
/// Set-user-ID and set-group-ID bits of a mode.
const SET_ID_BITS: u32 = libc::S_ISUID | libc::S_ISGID;
/// Flags with which `open` creates a file (`O_TMPFILE` without its `O_DIRECTORY`).
const CREATING: u32 = (libc::O_CREAT | (libc::O_TMPFILE & !libc::O_DIRECTORY)) as u32;

/// Offset of the low 32 bits of argument `i` (all supported architectures are little-endian).
fn arg(i: u32) -> u32 {
    16 + 8 * i
}
fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt: 0, jf: 0, k }
}
fn load(offset: u32) -> libc::sock_filter {
    stmt((libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16, offset)
}
fn ret(k: u32) -> libc::sock_filter {
    stmt((libc::BPF_RET | libc::BPF_K) as u16, k)
}
fn errno(e: i32) -> libc::sock_filter {
    ret(RET_ERRNO | e as u32)
}
/// If the accumulator equals `k`, skip `jt` instructions, else `jf`.
fn jeq(k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16, jt, jf, k }
}
fn jge(k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code: (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16, jt, jf, k }
}
/// If `accumulator & k != 0`, skip `jt`, else `jf`.
fn jset(k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code: (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16, jt, jf, k }
}

fn program(a: &Arch, policy: Policy) -> Vec<libc::sock_filter> {
    let mut f = vec![load(OFFSET_ARCH), jeq(a.audit, 1, 0), errno(libc::EPERM), load(OFFSET_NR)];
    if let Some(bit) = a.x32_bit {
        f.extend([jge(bit, 0, 1), errno(libc::EPERM)]);
    }
    let sockets_limited = policy.deny_inet || policy.deny_unix;
    let enosys = a.enosys.iter().chain(a.enosys_for_sockets.iter().filter(|_| sockets_limited));
    for &nr in enosys {
        f.extend([jeq(nr, 0, 1), errno(libc::ENOSYS)]);
    }
    // Each block ends in a return, so the accumulator is the syscall number again after it.
    for m in &a.modes {
        match m.flags {
            None => f.extend([
                jeq(m.nr, 0, 4),
                load(arg(m.mode)),
                jset(SET_ID_BITS, 0, 1),
                errno(libc::EPERM),
                ret(RET_ALLOW),
            ]),
            Some(flags) => f.extend([
                jeq(m.nr, 0, 6),
                load(arg(flags)),
                jset(CREATING, 0, 3),
                load(arg(m.mode)),
                jset(SET_ID_BITS, 0, 1),
                errno(libc::EPERM),
                ret(RET_ALLOW),
            ]),
        }
    }
    let answer = |deny: bool| if deny { errno(libc::EAFNOSUPPORT) } else { ret(RET_ALLOW) };
    f.extend([
        jeq(a.socket, 1, 0),
        ret(RET_ALLOW),
        load(arg(0)),
        jeq(libc::AF_UNIX as u32, 0, 1),
        answer(policy.deny_unix),
        answer(policy.deny_inet),
    ]);
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny classic-BPF interpreter: enough to run our own programs.
    fn run(f: &[libc::sock_filter], nr: u32, args: [u32; 6], arch: u32) -> u32 {
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let ins = f[pc];
            let class = ins.code & 0x07;
            if class == libc::BPF_LD as u16 {
                acc = match ins.k {
                    OFFSET_NR => nr,
                    OFFSET_ARCH => arch,
                    k => args[((k - 16) / 8) as usize],
                };
                pc += 1;
            } else if class == libc::BPF_RET as u16 {
                return ins.k;
            } else {
                let op = ins.code & 0xf0;
                let hit = if op == libc::BPF_JEQ as u16 {
                    acc == ins.k
                } else if op == libc::BPF_JGE as u16 {
                    acc >= ins.k
                } else {
                    acc & ins.k != 0
                };
                pc += 1 + usize::from(if hit { ins.jt } else { ins.jf });
            }
            assert!(pc < f.len(), "ran off the end");
        }
    }

    #[test]
    fn the_filter_answers_as_documented() {
        let Some(a) = Arch::current() else { return };
        let f = program(&a, Policy { deny_inet: true, deny_unix: false });
        let call = |nr: libc::c_long, args: [u32; 6]| run(&f, nr as u32, args, a.audit);
        let eperm = RET_ERRNO | libc::EPERM as u32;
        let fchmodat = libc::SYS_fchmodat;
        assert_eq!(call(fchmodat, [0, 0, 0o4755, 0, 0, 0]), eperm);
        assert_eq!(call(fchmodat, [0, 0, 0o2755, 0, 0, 0]), eperm);
        assert_eq!(call(fchmodat, [0, 0, 0o1777, 0, 0, 0]), RET_ALLOW);
        assert_eq!(call(FCHMODAT2, [0, 0, 0o6755, 0, 0, 0]), eperm);
        let creat = libc::O_CREAT as u32;
        assert_eq!(call(libc::SYS_openat, [0, 0, creat, 0o4755, 0, 0]), eperm);
        // Without O_CREAT the mode is ignored by the kernel, and so here.
        assert_eq!(call(libc::SYS_openat, [0, 0, 0, 0o4755, 0, 0]), RET_ALLOW);
        assert_eq!(call(libc::SYS_openat, [0, 0, creat, 0o644, 0, 0]), RET_ALLOW);
        assert_eq!(call(libc::SYS_mknodat, [0, 0, libc::S_IFREG | 0o4755, 0, 0, 0]), eperm);
        assert_eq!(call(libc::SYS_memfd_create, [0; 6]), RET_ERRNO | libc::ENOSYS as u32);
        assert_eq!(call(libc::SYS_socket, [libc::AF_INET as u32, 0, 0, 0, 0, 0]), RET_ERRNO | 97);
        assert_eq!(call(libc::SYS_socket, [libc::AF_UNIX as u32, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(call(libc::SYS_read, [0; 6]), RET_ALLOW);
        assert_eq!(run(&f, libc::SYS_read as u32, [0; 6], 1), eperm, "a foreign architecture");

        let open = program(&a, Policy::default());
        assert_eq!(run(&open, libc::SYS_socket as u32, [libc::AF_INET as u32, 0, 0, 0, 0, 0], a.audit), RET_ALLOW);
        let closed = program(&a, Policy { deny_inet: true, deny_unix: true });
        assert_eq!(
            run(&closed, libc::SYS_socket as u32, [libc::AF_UNIX as u32, 0, 0, 0, 0, 0], a.audit),
            RET_ERRNO | 97
        );
    }

    #[test]
    fn every_jump_stays_inside_the_program() {
        let Some(a) = Arch::current() else { return };
        let f = program(&a, Policy { deny_inet: true, deny_unix: true });
        assert!(f.len() < 200);
        for (i, ins) in f.iter().enumerate().filter(|(_, ins)| ins.code & 0x07 == libc::BPF_JMP as u16) {
            assert!(i + 1 + (ins.jt.max(ins.jf) as usize) < f.len(), "jump out of range at {i}");
        }
        assert_eq!(f.last().unwrap().code, (libc::BPF_RET | libc::BPF_K) as u16);
    }
}
