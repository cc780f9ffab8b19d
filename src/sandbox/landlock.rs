//! Landlock on top of the namespace jail, where the kernel has it.
//!
//! Stock Raspberry Pi OS kernels usually do not (`CONFIG_SECURITY_LANDLOCK` is
//! off in their configs), so this is a
//! second wall, never the only one — except when user namespaces are
//! unavailable, where it is the filesystem layer that remains. Best effort:
//! the crate downgrades to what the running ABI supports.
//!
//! Rules, applied by the worker right before `exec`:
//! - read and execute everywhere **except** the hidden paths (state, config,
//!   credentials): Landlock only grants, so "everything but X" is built by
//!   granting each sibling on the way down to X ([`read_roots`]);
//! - full access beneath the workspace, `/tmp` and `/dev` (for `/dev/null`);
//! - with `network = false` and ABI ≥ 4: no TCP bind or connect at all;
//! - with ABI ≥ 6: no signals to, and no abstract UNIX sockets of, processes
//!   outside the sandbox.
//!
//! Landlock also stops ptrace-style access (`/proc/<pid>/environ`, `mem`) to
//! processes outside the domain, such as bramble itself.

use std::fmt;
use std::path::{Path, PathBuf};

use landlock::{
    Access, AccessFs, AccessNet, BitFlags, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreated,
    RulesetCreatedAttr, Scope, ABI,
};

use super::options::Options;

/// The newest ABI this code knows how to ask for; older kernels get a subset.
const ABI_WANTED: ABI = ABI::V6;

/// Why commands get no Landlock. The kernel's answer to the version query tells
/// "not there" apart from "there, but refused to us": the fix differs (another
/// kernel or boot parameter, against one line in a container's or unit's filter).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unavailable {
    /// `ENOSYS`: the kernel was built without Landlock (stock Raspberry Pi OS kernels).
    NotInKernel,
    /// `EOPNOTSUPP`: built in, but not among the security modules enabled at boot.
    DisabledAtBoot,
    /// `EPERM`: a seccomp filter refuses the calls (a container's, or a unit's `SystemCallFilter=`).
    Blocked,
    /// Another error number from the version query.
    Other(i32),
    /// The calls work, but a real run of the helper (the probe) could not set the rules up.
    Failed(String),
}

impl Unavailable {
    fn from_errno(errno: i32) -> Unavailable {
        match errno {
            libc::ENOSYS => Unavailable::NotInKernel,
            libc::EOPNOTSUPP => Unavailable::DisabledAtBoot,
            libc::EPERM => Unavailable::Blocked,
            other => Unavailable::Other(other),
        }
    }
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unavailable::NotInKernel => f.write_str("no Landlock in this kernel (built without CONFIG_SECURITY_LANDLOCK)"),
            Unavailable::DisabledAtBoot => f.write_str(
                "Landlock is in this kernel but was not enabled at boot (add `landlock` to the `lsm=` kernel parameter)",
            ),
            Unavailable::Blocked => f.write_str(
                "Landlock BLOCKED by a seccomp filter: the kernel has it, but its system calls fail with EPERM \
                 (a container's filter — systemd-nspawn needs --system-call-filter='landlock_create_ruleset \
                 landlock_add_rule landlock_restrict_self' — or a unit's SystemCallFilter=)",
            ),
            Unavailable::Other(errno) => write!(
                f,
                "no Landlock: the kernel answered the version query with {}",
                std::io::Error::from_raw_os_error(*errno)
            ),
            Unavailable::Failed(why) => write!(f, "Landlock FAILED in a test run: {why}"),
        }
    }
}

/// The kernel's Landlock ABI version, or why Landlock cannot be used.
pub fn abi_version() -> Result<i32, Unavailable> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) only returns a number.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if v > 0 {
        return Ok(v as i32);
    }
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::ENOSYS);
    Err(Unavailable::from_errno(errno))
}

/// Restrict the calling process (and what it execs) as described above.
pub fn restrict(o: &Options) -> Result<(), String> {
    let abi = ABI_WANTED;
    let mut created = ruleset(o.no_network)?;
    // What is read everywhere may hold entries that are no filesystem object
    // (the kernel refuses a pipe or a socket reached through a magic link):
    // nothing to grant there. What is granted by name must be granted.
    grant(&mut created, &read_roots(&o.hide), AccessFs::from_read(abi), true)?;
    let exposed: Vec<PathBuf> = o.expose.iter().filter(|p| p.exists()).cloned().collect();
    grant(&mut created, &exposed, AccessFs::from_read(abi), false)?;
    let mut writable: Vec<PathBuf> = vec!["/tmp".into(), "/dev".into()];
    writable.extend(o.workspace.clone());
    writable.retain(|p| p.exists());
    grant(&mut created, &writable, AccessFs::from_all(abi), false)?;
    created.restrict_self().map_err(ruleset_error)?;
    Ok(())
}

/// A ruleset that handles every filesystem right (and with `network`, TCP)
/// of [`ABI_WANTED`] and is scoped (signals, abstract sockets); rules grant.
fn ruleset(network: bool) -> Result<RulesetCreated, String> {
    let abi = ABI_WANTED;
    let mut ruleset = Ruleset::default().handle_access(AccessFs::from_all(abi)).map_err(ruleset_error)?;
    if network {
        ruleset = ruleset.handle_access(AccessNet::from_all(abi)).map_err(ruleset_error)?;
    }
    ruleset.scope(Scope::from_all(abi)).map_err(ruleset_error)?.create().map_err(ruleset_error)
}

fn ruleset_error(e: landlock::RulesetError) -> String {
    format!("Landlock: {e}")
}

/// The network proxy's rules ([`super::netproxy`]). It runs outside the jail,
/// in the host's mount namespace, and reads only what name resolution reads:
/// the resolver's files and the NSS modules the `hosts:` line of
/// `nsswitch.conf` loads. It writes nothing. Building the command's ruleset a
/// second time (a listing of every directory on the way to each hidden path,
/// a rule per entry) cost the proxy ~300 system calls per command; this one
/// is a dozen rules and reads no directory. A `hosts:` line naming a service
/// not known here (LDAP, SSSD, WINS, …: they read files of their own) gets the
/// command's rules instead, so resolution keeps working everywhere.
pub fn restrict_proxy(o: &Options) -> Result<(), String> {
    let nsswitch = std::fs::read_to_string("/etc/nsswitch.conf").unwrap_or_default();
    let Some(reads) = proxy_reads(&nsswitch) else { return restrict(o) };
    let mut created = ruleset(false)?;
    let mut starts: Vec<PathBuf> = Vec::with_capacity(reads.len() + 1);
    for path in reads {
        // Compared with the (canonical) hidden paths by name: `/lib -> usr/lib` must be
        // judged as what a rule on it grants.
        let Ok(real) = std::fs::canonicalize(path) else { continue };
        // resolv.conf is often a link into /run whose manager replaces the file
        // (a new inode, which a rule on the old one would not cover): its directory.
        if path == "/etc/resolv.conf" && real != Path::new(path) {
            if let Some(dir) = real.parent().filter(|d| *d != Path::new("/") && *d != Path::new("/etc")) {
                starts.push(dir.to_path_buf());
            }
        }
        starts.push(real);
    }
    starts.sort();
    starts.dedup();
    grant(&mut created, &roots_around(starts, &o.hide), AccessFs::from_read(ABI_WANTED), true)?;
    created.restrict_self().map_err(ruleset_error)?;
    Ok(())
}

/// What name resolution reads, for the `hosts:` line of `nsswitch` (glibc's
/// default, `dns files`, when there is none); `None` when it names a service
/// whose files are not known here.
fn proxy_reads(nsswitch: &str) -> Option<Vec<&'static str>> {
    // getaddrinfo's own: the resolver, address sorting, the library cache for NSS modules.
    let mut reads = vec![
        "/etc/nsswitch.conf",
        "/etc/resolv.conf",
        "/etc/host.conf",
        "/etc/hosts",
        "/etc/gai.conf",
        "/etc/ld.so.cache",
    ];
    let line = nsswitch
        .lines()
        .map(|l| l.split('#').next().unwrap_or_default().trim())
        .find_map(|l| l.strip_prefix("hosts:"))
        .unwrap_or("dns files");
    let mut modules = false;
    for word in line.split_whitespace() {
        if word.starts_with('[') || word.ends_with(']') || word.contains('=') {
            continue; // an action: `[NOTFOUND=return]`
        }
        match word {
            // Built into glibc ≥ 2.34; `dns` talks UDP/TCP to what resolv.conf names.
            "files" | "dns" => {}
            // Loadable modules that talk to a daemon over a socket by path
            // (systemd-resolved, machined, avahi), which Landlock does not govern.
            "resolve" | "myhostname" | "mymachines" | "systemd" | "mdns" | "mdns4" | "mdns6" | "mdns_minimal"
            | "mdns4_minimal" | "mdns6_minimal" => modules = true,
            _ => return None,
        }
        if word.starts_with("mdns") && !word.ends_with("_minimal") {
            reads.push("/etc/mdns.allow");
        }
    }
    if modules {
        reads.extend(["/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib"]);
    }
    Some(reads)
}

/// Add a rule per path, naming the path when the kernel refuses one.
/// `lenient`: skip paths that vanished or that the kernel says are no
/// filesystem object (`EBADFD`), rather than fail the command.
fn grant(
    created: &mut RulesetCreated,
    paths: &[PathBuf],
    access: BitFlags<AccessFs>,
    lenient: bool,
) -> Result<(), String> {
    for path in paths {
        let fd = match PathFd::new(path) {
            Ok(fd) => fd,
            Err(_) if lenient => continue,
            Err(e) => return Err(format!("Landlock: cannot open {}: {e}", path.display())),
        };
        if let Err(e) = created.add_rule(PathBeneath::new(fd, access)) {
            if lenient && os_error(&e) == Some(libc::EBADFD) {
                continue;
            }
            return Err(format!("Landlock: cannot grant access beneath {}: {e}", path.display()));
        }
    }
    Ok(())
}

/// The OS error number at the bottom of an error's chain of sources.
fn os_error(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(code) = err.downcast_ref::<std::io::Error>().and_then(std::io::Error::raw_os_error) {
            return Some(code);
        }
        cur = err.source();
    }
    None
}

/// Directories (and files) that together cover everything under `/` except `hidden`.
pub fn read_roots(hidden: &[PathBuf]) -> Vec<PathBuf> {
    roots_around(vec![PathBuf::from("/")], hidden)
}

/// Directories (and files) that together cover what `roots` cover, except `hidden`.
fn roots_around(mut roots: Vec<PathBuf>, hidden: &[PathBuf]) -> Vec<PathBuf> {
    for h in hidden {
        if !h.is_absolute() || h == Path::new("/") {
            continue;
        }
        let mut next = Vec::with_capacity(roots.len());
        for root in roots {
            if h.starts_with(&root) {
                split_around(&root, h, &mut next);
            } else if !root.starts_with(h) {
                next.push(root);
            }
        }
        roots = next;
    }
    roots.retain(|p| p.symlink_metadata().is_ok());
    roots
}

/// Push the entries of `root` that lead around `hidden` (which lies beneath `root`).
fn split_around(root: &Path, hidden: &Path, out: &mut Vec<PathBuf>) {
    if root == hidden {
        return;
    }
    let Ok(rest) = hidden.strip_prefix(root) else { return out.push(root.to_path_buf()) };
    let Some(first) = rest.components().next() else { return };
    let step = root.join(first);
    let Ok(entries) = std::fs::read_dir(root) else { return };
    for entry in entries.flatten() {
        // A link is followed when a rule is made: `/x -> /var/lib/bramble` would grant
        // the hidden state, `/dev/stdin -> /proc/self/fd/0` a pipe. Its target is
        // readable through whichever root covers the target.
        if entry.file_type().is_ok_and(|t| t.is_symlink()) {
            continue;
        }
        let p = entry.path();
        if p == step {
            split_around(&step, hidden, out);
        } else {
            out.push(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_roots_cover_everything_but_the_hidden() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for d in ["a/b/c", "a/x", "y"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(root.join("a/b/secret"), "k").unwrap();
        std::fs::write(root.join("a/b/ok"), "k").unwrap();
        // A link beside the way down is no root: a rule on it would grant its target.
        std::os::unix::fs::symlink(root.join("y"), root.join("a/to-hidden")).unwrap();
        let hidden = [root.join("a/b/secret"), root.join("y")];
        let mut got = read_roots(&hidden);
        got.retain(|p| p.starts_with(root));
        got.sort();
        assert_eq!(got, [root.join("a/b/c"), root.join("a/b/ok"), root.join("a/x")]);
        // Something outside our temp dir is still readable.
        assert!(read_roots(&hidden).iter().any(|p| Path::new("/etc/hostname").starts_with(p)));
        assert_eq!(read_roots(&[]), [PathBuf::from("/")]);
    }

    #[test]
    fn the_proxy_reads_what_its_hosts_line_loads() {
        let plain = proxy_reads("# hosts: ldap\nhosts:          files dns\nnetworks: files\n").unwrap();
        assert!(plain.contains(&"/etc/hosts") && plain.contains(&"/etc/resolv.conf"), "{plain:?}");
        assert!(!plain.contains(&"/usr/lib"), "files and dns are in glibc: no module to load");
        // Debian's desktop line: modules (from the library directories), no mdns.allow.
        let desktop = proxy_reads("hosts: files mdns4_minimal [NOTFOUND=return] dns myhostname\n").unwrap();
        assert!(desktop.contains(&"/usr/lib") && !desktop.contains(&"/etc/mdns.allow"), "{desktop:?}");
        assert!(proxy_reads("hosts: files mdns4 dns\n").unwrap().contains(&"/etc/mdns.allow"));
        assert!(proxy_reads("hosts: resolve [!UNAVAIL=return] files\n").unwrap().contains(&"/lib"));
        // No hosts line: glibc's default, dns and files.
        assert_eq!(proxy_reads(""), Some(plain));
        // A service whose files are unknown here: the command's rules instead.
        assert_eq!(proxy_reads("hosts: files ldap dns\n"), None);
        assert_eq!(proxy_reads("hosts: sss files\n"), None);
    }

    #[test]
    fn roots_around_keep_a_hidden_path_out_of_a_granted_tree() {
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join("lib");
        std::fs::create_dir_all(lib.join("bramble")).unwrap();
        std::fs::write(lib.join("libnss_x.so"), "").unwrap();
        let hidden = [lib.join("bramble"), dir.path().join("elsewhere")];
        assert_eq!(roots_around(vec![lib.clone()], &hidden), [lib.join("libnss_x.so")]);
        // A granted tree inside a hidden one is dropped whole.
        assert!(roots_around(vec![lib.join("bramble")], std::slice::from_ref(&lib)).is_empty());
    }

    /// Runs in a child process (a ruleset cannot be taken back): the proxy's rules
    /// let it resolve names and read nothing else.
    #[test]
    fn the_proxy_reads_the_resolver_and_nothing_else() {
        const CHILD: &str = "BRAMBLE_TEST_PROXY_RULES";
        const NAME: &str = "sandbox::landlock::tests::the_proxy_reads_the_resolver_and_nothing_else";
        if std::env::var_os(CHILD).is_some() {
            let o = Options { landlock: true, ..Options::default() };
            restrict_proxy(&o).unwrap();
            let denied =
                |p: &str| std::fs::read(p).err().map(|e| e.kind()) == Some(std::io::ErrorKind::PermissionDenied);
            assert!(std::fs::read("/etc/nsswitch.conf").is_ok() || !Path::new("/etc/nsswitch.conf").exists());
            assert!(std::fs::read("/etc/hosts").is_ok());
            for other in ["/etc/passwd", "/etc/hostname", "/proc/self/environ"] {
                assert!(!Path::new(other).exists() || denied(other), "{other} must be out of reach");
            }
            assert!(std::fs::read_dir("/").is_err());
            assert!(std::fs::write("/tmp/bramble-proxy-rules-test", "x").is_err());
            use std::net::ToSocketAddrs;
            let addrs: Vec<_> = ("localhost", 80).to_socket_addrs().unwrap().collect();
            assert!(addrs.iter().any(|a| a.ip().is_loopback()), "{addrs:?}");
            return;
        }
        if abi_version().is_err() {
            eprintln!("skipped: no Landlock here");
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
    }

    #[test]
    fn the_version_query_tells_missing_from_blocked() {
        assert_eq!(Unavailable::from_errno(libc::ENOSYS), Unavailable::NotInKernel);
        assert_eq!(Unavailable::from_errno(libc::EOPNOTSUPP), Unavailable::DisabledAtBoot);
        assert_eq!(Unavailable::from_errno(libc::EPERM), Unavailable::Blocked);
        assert!(Unavailable::Blocked.to_string().contains("seccomp"), "{}", Unavailable::Blocked);
        assert!(Unavailable::NotInKernel.to_string().starts_with("no Landlock in this kernel"));
    }
}
