//! A seccomp filter that takes sockets away when `[exec] network = false`.
//!
//! The empty network namespace already does that where user namespaces exist,
//! and Landlock (ABI ≥ 4) denies TCP; this filter is the third wall and the
//! only one on a kernel with neither. It is a dozen classic-BPF instructions
//! written by hand (no seccompiler: it cannot build for armv7, and this is all
//! we need):
//!
//! - `socket(2)` for anything but `AF_UNIX` → `EAFNOSUPPORT`;
//! - `io_uring_setup` (io_uring can open sockets) and, on 32-bit ARM,
//!   `socketcall` → `ENOSYS`;
//! - a foreign architecture (`int 0x80` on x86-64) or the x32 ABI → `EPERM`.

/// Install the filter on the calling thread (inherited by what it execs).
/// Requires `PR_SET_NO_NEW_PRIVS` first. `Ok(false)`: no filter for this architecture.
pub fn deny_sockets() -> Result<bool, String> {
    let Some(arch) = Arch::current() else { return Ok(false) };
    let filter = program(&arch);
    let prog = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr() as *mut libc::sock_filter };
    // SAFETY: prog points to `filter`, alive for the call; the kernel copies it.
    let rc = unsafe { libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &prog as *const _ as usize, 0, 0) };
    if rc < 0 {
        return Err(format!("seccomp: {}", std::io::Error::last_os_error()));
    }
    Ok(true)
}

struct Arch {
    audit: u32,
    socket: u32,
    /// Denied outright with ENOSYS.
    denied: &'static [u32],
    /// x86-64: syscall numbers with this bit are the x32 ABI.
    x32_bit: Option<u32>,
}

const IO_URING_SETUP: u32 = 425; // the same on every architecture

impl Arch {
    fn current() -> Option<Arch> {
        if cfg!(target_arch = "x86_64") {
            Some(Arch { audit: 0xC000_003E, socket: 41, denied: &[IO_URING_SETUP], x32_bit: Some(0x4000_0000) })
        } else if cfg!(target_arch = "aarch64") {
            Some(Arch { audit: 0xC000_00B7, socket: 198, denied: &[IO_URING_SETUP], x32_bit: None })
        } else if cfg!(target_arch = "arm") {
            Some(Arch { audit: 0x4000_0028, socket: 281, denied: &[IO_URING_SETUP, 102], x32_bit: None })
        } else {
            None
        }
    }
}

const RET_ALLOW: u32 = 0x7fff_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;
/// Low 32 bits of the first argument (all supported architectures are little-endian).
const OFFSET_ARG0: u32 = 16;

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt: 0, jf: 0, k }
}
fn load(offset: u32) -> libc::sock_filter {
    stmt((libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16, offset)
}
fn ret(k: u32) -> libc::sock_filter {
    stmt((libc::BPF_RET | libc::BPF_K) as u16, k)
}
/// If the accumulator equals `k`, skip `jt` instructions, else `jf`.
fn jeq(k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16, jt, jf, k }
}
fn jge(k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code: (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16, jt, jf, k }
}

fn program(a: &Arch) -> Vec<libc::sock_filter> {
    let mut f = vec![load(OFFSET_ARCH), jeq(a.audit, 1, 0), ret(RET_ERRNO | libc::EPERM as u32), load(OFFSET_NR)];
    if let Some(bit) = a.x32_bit {
        f.extend([jge(bit, 0, 1), ret(RET_ERRNO | libc::EPERM as u32)]);
    }
    for &nr in a.denied {
        f.extend([jeq(nr, 0, 1), ret(RET_ERRNO | libc::ENOSYS as u32)]);
    }
    f.extend([
        jeq(a.socket, 1, 0),
        ret(RET_ALLOW),
        load(OFFSET_ARG0),
        jeq(libc::AF_UNIX as u32, 0, 1),
        ret(RET_ALLOW),
        ret(RET_ERRNO | libc::EAFNOSUPPORT as u32),
    ]);
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_shape_ends_in_returns() {
        let a = Arch { audit: 1, socket: 41, denied: &[425], x32_bit: Some(0x4000_0000) };
        let f = program(&a);
        assert_eq!(f.len(), 14);
        // Every jump stays inside the program.
        for (i, ins) in f.iter().enumerate().filter(|(_, ins)| ins.code & 0x07 == libc::BPF_JMP as u16) {
            assert!(i + 1 + (ins.jt.max(ins.jf) as usize) < f.len(), "jump out of range at {i}");
        }
        assert_eq!(f.last().unwrap().k, RET_ERRNO | libc::EAFNOSUPPORT as u32);
    }
}
