//! Running commands on behalf of a model, inside kernel-enforced limits.
//!
//! Everything a model asks to run goes through [`process::run`]: its own
//! process group, a cleared environment, bounded output, a timeout, and no
//! survivors. [`Sandbox::wrap`] turns a plain [`process::CommandSpec`] into one that
//! starts `bramble sandbox-exec … -- PROGRAM ARGS` ([`helper`]), which sets up
//! the layers in ordinary code and then execs the program:
//!
//! | layer | where | needs |
//! |---|---|---|
//! | rlimits: CPU, address space, file size, open files, processes, no core | helper | — |
//! | `PR_SET_NO_NEW_PRIVS`, parent-death signal, own session | helper | — |
//! | unprivileged user (`[exec] run_as_user`) when bramble is root | worker | root |
//! | user + mount + pid + ipc + uts namespaces, read-only system, private `/tmp` and `/proc`, hidden state/config/credentials ([`jail`]) | init | user namespaces (or root) |
//! | empty network namespace (`[exec] network = false`) | helper | same |
//! | Landlock: filesystem, TCP (`network = false`), signal/abstract-socket scoping ([`landlock`]) | worker | Landlock in the kernel |
//! | fresh devpts, empty `/run`, the user's home hidden, workspace `nosuid,nodev` ([`jail`]) | init | same |
//! | inherited file descriptors above 2 closed | worker | — |
//! | seccomp: no set-id files, no memfd / SysV shm / io_uring, no sockets but `AF_UNIX` (`network = false`), no `AF_UNIX` unless walled in ([`seccomp`]) | worker | x86-64, aarch64, armv7 |
//!
//! Which of them this kernel offers is found out once per [`Sandbox`]
//! ([`Sandbox::probe`]: one real helper run) and reported by
//! [`Sandbox::layers_summary`] in the startup log and in `bramble status`.
//! Commands are wrapped on a cheap guess until then; a wrong guess costs one
//! failed start and a retry ([`Sandbox::recheck`]). With `[exec] isolation = "auto"` missing layers are
//! skipped (said once, at start); with `"required"` commands are refused
//! without the namespace jail; `"off"` runs commands with only the
//! process-group handling of [`process`].
//!
//! A [`Sandbox`] is a value, not process state: the composition root
//! (`daemon::assemble`) builds one per configuration — what it hides, its
//! probe, its jail built ahead ([`warm`]) — and hands it to what starts
//! commands. The helper's command line lives in [`options`], which both sides import.
//!
//! [`deny`] is a short list of friendly early refusals, never the boundary.
//!
//! How the helper is found: `/proc/self/exe`, resolved at start by `main`
//! ([`use_current_exe`]), the one process-wide fact here (set once, before
//! any sandbox is made). Tests that use the library in-process are not the
//! bramble binary, so they point at it with [`set_helper`],
//! [`Sandbox::with_helper`] or the `BRAMBLE_SANDBOX_HELPER` environment variable.

pub mod deny;
pub mod helper;
pub mod jail;
pub mod landlock;
pub mod netproxy;
pub mod options;
pub mod process;
pub mod reach;
pub mod seccomp;
pub mod warm;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::config::{ExecConfig, Isolation};
use process::CommandSpec;
pub use reach::NetworkReach;

/// Environment variable naming the helper binary (tests, unusual installs).
pub const HELPER_ENV: &str = "BRAMBLE_SANDBOX_HELPER";

/// Which bramble binary is the helper: this process's own executable (set by
/// `main` before anything runs) or the one a test names. Init-only: written
/// once, never changed, a fact about the process like its own path. Everything
/// that changes (what is hidden, the probe, the warm jail) is on a [`Sandbox`].
static HELPER: OnceLock<PathBuf> = OnceLock::new();

/// Use this binary as the helper (called by `main` at start).
pub fn use_current_exe() {
    if let Ok(exe) = std::fs::read_link("/proc/self/exe").or_else(|_| std::env::current_exe()) {
        set_helper(exe);
    }
}

/// Use `path` (a bramble binary) as the helper of every [`Sandbox`] made from
/// now on; the first call decides, later ones change nothing.
pub fn set_helper(path: impl Into<PathBuf>) {
    let _ = HELPER.set(path.into());
}

/// The sandbox commands of one composition root run in: which helper, what they
/// must not see, what this kernel offers (probed once, kept here) and the jail
/// built ahead ([`warm`]). Built by `daemon::assemble` and handed to whatever
/// starts commands (the exec tool, stdio MCP servers, the work runner).
/// `Sandbox::default()` has no helper at all (commands get the process layer only).
#[derive(Default)]
pub struct Sandbox {
    helper: Option<PathBuf>,
    /// Paths commands must not see: state dirs, config files, credentials.
    private: Vec<PathBuf>,
    /// The workspace, for the probe's test run of the real layout.
    workspace: Option<PathBuf>,
    probe: OnceLock<Arc<Probe>>,
    /// A cheap guess used until the probe has run (see [`Sandbox::assumed`]).
    guess: OnceLock<Arc<Probe>>,
    warm: warm::Ready,
    /// The "degraded" warning has been said (it is said once).
    warned: AtomicBool,
}

impl Sandbox {
    /// A sandbox with the process's helper ([`set_helper`]), hiding nothing yet.
    pub fn new() -> Sandbox {
        Sandbox { helper: HELPER.get().cloned(), ..Sandbox::default() }
    }

    /// The sandbox for a loaded configuration: it hides what `loaded` keeps
    /// private ([`private_paths`]), and its probe tries `loaded`'s workspace.
    pub fn for_config(loaded: &crate::config::Loaded) -> Sandbox {
        let ws = std::fs::canonicalize(&loaded.paths.workspace).unwrap_or_else(|_| loaded.paths.workspace.clone());
        Sandbox { workspace: Some(ws), ..Sandbox::new() }.protect(private_paths(loaded))
    }

    /// This one with `path` (a bramble binary) as its helper.
    pub fn with_helper(self, path: impl Into<PathBuf>) -> Sandbox {
        Sandbox { helper: Some(path.into()), ..self }
    }

    /// This one, hiding `paths` from its commands too.
    pub fn protect(mut self, paths: impl IntoIterator<Item = PathBuf>) -> Sandbox {
        for p in paths {
            if !p.as_os_str().is_empty() && !self.private.contains(&p) {
                self.private.push(p);
            }
        }
        self
    }

    /// `BRAMBLE_SANDBOX_HELPER` if set, else the helper this sandbox was made with.
    fn helper_path(&self) -> Option<PathBuf> {
        std::env::var_os(HELPER_ENV).filter(|v| !v.is_empty()).map(PathBuf::from).or_else(|| self.helper.clone())
    }

    /// The helper, or why there is none.
    fn helper(&self) -> Result<PathBuf, String> {
        match self.helper_path() {
            None => Err(format!("no helper binary (set {HELPER_ENV})")),
            Some(p) if p.is_file() => Ok(p),
            Some(p) => Err(format!("helper {} does not exist", p.display())),
        }
    }

    /// Make jails ready ahead of commands from now on (the daemon and the terminal chat).
    pub fn warm_ahead(&self) {
        self.warm.enable();
    }

    /// Commands that ran in a jail built ahead of them.
    pub fn warm_runs(&self) -> u64 {
        self.warm.runs()
    }

    /// Run a spec made by [`Sandbox::wrap`], in the jail built ahead when one is ready ([`warm`]).
    pub async fn run(
        &self,
        spec: CommandSpec,
        cancel: &tokio_util::sync::CancellationToken,
        ahead: bool,
    ) -> std::io::Result<process::Outcome> {
        self.warm.run(spec, cancel, ahead).await
    }

    /// Kill the jail built ahead, if any.
    pub fn discard_warm(&self) {
        self.warm.discard();
    }
}

/// What commands must not see of a loaded configuration: its file, the state
/// directory, and systemd's credentials directory.
pub fn private_paths(loaded: &crate::config::Loaded) -> Vec<PathBuf> {
    let mut out = vec![loaded.paths.state_dir.clone()];
    if let Some(config) = &loaded.path {
        let config = std::path::absolute(config).unwrap_or_else(|_| config.clone());
        // The whole config directory when it is bramble's own, else just the file.
        match config.parent() {
            Some(dir) if !loaded.paths.workspace.starts_with(dir) && dir.ends_with("bramble") => {
                out.push(dir.to_path_buf())
            }
            _ => out.push(config),
        }
    }
    if let Some(creds) = std::env::var_os("CREDENTIALS_DIRECTORY") {
        out.push(PathBuf::from(creds));
    }
    out
}

/// What the kernel and the installation offer, found out once by running the helper.
#[derive(Debug, Clone)]
pub struct Probe {
    /// The helper binary, or why there is none.
    pub helper: Result<PathBuf, String>,
    /// Whether the namespace jail can be built (a real `sandbox-exec --ns` run).
    pub namespaces: Result<(), String>,
    /// Whether commands get an empty `/proc` (a fresh one could not be mounted).
    pub proc_hidden: bool,
    /// Whether the filtering network proxy works (`[exec] network = "internet" | "lan"`).
    pub proxy: Result<(), String>,
    /// The kernel's Landlock ABI version, or why commands get no Landlock.
    pub landlock: Result<i32, landlock::Unavailable>,
    /// Whether bramble runs as root (commands then switch user).
    pub root: bool,
    /// How long the probe took.
    pub took: Duration,
}

impl Sandbox {
    /// The probe result, computed on first use.
    pub fn probe(&self) -> Arc<Probe> {
        self.probe.get_or_init(|| Arc::new(self.run_probe())).clone()
    }

    /// What commands are wrapped with: the probe if it has run (the daemon runs it at
    /// start for its log line), else a guess from `/proc/sys` that costs no process.
    /// A one-shot `bramble agent -m` thus pays no probe; if the guess was wrong, the
    /// first command's failure triggers the probe and the command is retried ([`Sandbox::recheck`]).
    fn assumed(&self) -> Arc<Probe> {
        match self.probe.get() {
            Some(p) => p.clone(),
            None => self.guess.get_or_init(|| Arc::new(self.guess())).clone(),
        }
    }

    fn guess(&self) -> Probe {
        let start = Instant::now();
        let root = nix::unistd::geteuid().is_root();
        let sysctl = |name: &str| std::fs::read_to_string(name).ok().and_then(|v| v.trim().parse::<i64>().ok());
        let namespaces = if root {
            Ok(())
        } else if sysctl("/proc/sys/user/max_user_namespaces") == Some(0)
            || sysctl("/proc/sys/kernel/unprivileged_userns_clone") == Some(0)
            || sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == Some(1)
        {
            Err("unprivileged user namespaces are disabled (sysctl)".to_string())
        } else {
            Ok(())
        };
        let landlock = landlock::abi_version();
        let proxy = namespaces.clone();
        Probe { helper: self.helper(), namespaces, proc_hidden: false, proxy, landlock, root, took: start.elapsed() }
    }

    /// After a command failed to start or a layer failed: run the probe (once) and
    /// say whether it found less than was assumed, so that the command is worth one retry.
    pub fn recheck(&self) -> bool {
        if self.probe.get().is_some() {
            return false;
        }
        let before = self.assumed();
        let now = self.probe();
        (before.helper.is_ok() && now.helper.is_err())
            || (before.jail_available() && !now.jail_available())
            || (before.landlock.is_ok() && now.landlock.is_err())
            || (before.proxy.is_ok() && now.proxy.is_err())
    }

    fn run_probe(&self) -> Probe {
        let start = Instant::now();
        let root = nix::unistd::geteuid().is_root();
        let mut landlock = landlock::abi_version();
        let mut helper = self.helper();
        let namespaces = match &helper {
            Ok(h) => {
                // One run of the real layout: the jail with Landlock, this workspace and these hidden paths.
                let workspace = self.workspace.clone().filter(|w| w.is_dir());
                let hide = self.hidden_paths(workspace.as_deref());
                let full = probe_run(h, landlock.is_ok(), false, workspace.as_deref(), &hide);
                match (full, &landlock) {
                    (Err(e), Ok(_)) if !e.starts_with(CANNOT_START) => {
                        // Without Landlock: which layer failed?
                        let bare = probe_run(h, false, false, workspace.as_deref(), &hide);
                        if bare.is_ok() {
                            landlock = Err(landlock::Unavailable::Failed(e));
                        }
                        bare
                    }
                    (full, _) => full,
                }
            }
            Err(e) => Err(e.clone()),
        };
        if let Err(e) = &namespaces {
            if e.starts_with(CANNOT_START) {
                // A helper that cannot even be executed (a foreign binary under qemu-user) is no helper.
                helper = Err(e.clone());
            }
        }
        let proc_hidden = namespaces.as_ref().is_ok_and(|hidden| *hidden);
        let namespaces = namespaces.map(|_| ());
        // The proxy's own setup (loopback up, the listener handed over), once the jail is known to work.
        let proxy = match (&helper, &namespaces) {
            (Ok(h), Ok(())) => probe_run(h, false, true, None, &[]).map(|_| ()),
            (_, Err(e)) | (Err(e), _) => Err(e.clone()),
        };
        Probe { helper, namespaces, proc_hidden, proxy, landlock, root, took: start.elapsed() }
    }
}

const CANNOT_START: &str = "cannot start the helper";

/// Build a complete jail (with an empty network namespace, or the proxy's
/// with `proxy`, and Landlock if `landlock`) around a shell that looks at its
/// `/proc`, with the workspace attached and the private paths hidden as
/// commands will have them. `Ok(true)`: the jail works but `/proc` is empty.
fn probe_run(
    helper: &Path,
    landlock: bool,
    proxy: bool,
    workspace: Option<&Path>,
    hide: &[PathBuf],
) -> Result<bool, String> {
    let opts = options::Options {
        ns: true,
        no_network: !proxy,
        proxy: proxy.then_some(netproxy::Reach { internet: true, lan: false }),
        landlock,
        workspace: workspace.map(Path::to_path_buf),
        hide: hide.to_vec(),
        tmp_mb: 1,
        command: vec!["/bin/sh".into(), "-c".into(), "test -e /proc/self/status || exit 3".into()],
        ..options::Options::default()
    };
    let mut child = std::process::Command::new(helper)
        .arg("sandbox-exec")
        .args(opts.to_args())
        .env_clear()
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("{CANNOT_START} {}: {e}", helper.display()))?;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(false),
            Ok(Some(status)) if status.code() == Some(3) => return Ok(true),
            Ok(Some(status)) => {
                let mut err = String::new();
                if let Some(mut s) = child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut s, &mut err);
                }
                let err = err.trim().trim_start_matches(options::ERROR_PREFIX);
                return Err(if err.is_empty() { format!("helper failed ({status})") } else { err.to_string() });
            }
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("the helper did not finish within 5 s (emulated CPU?)".into());
            }
        }
    }
}

impl Sandbox {
    /// One line for the startup log and `bramble status`: which layers commands get.
    pub fn layers_summary(&self, cfg: &ExecConfig) -> String {
        if cfg.isolation == Isolation::Off {
            return "off ([exec] isolation = \"off\"): own process group, minimal environment, capped output only"
                .into();
        }
        let p = self.probe();
        let mut parts: Vec<String> = Vec::new();
        match (&p.helper, &p.namespaces) {
            (Err(e), _) => parts.push(format!("NO HELPER ({e}): own process group and minimal environment only")),
            (Ok(_), Ok(())) => parts.push(format!(
                "namespaces ({}mount, pid, ipc, uts{}), read-only system, private /tmp, {}, hidden state/config",
                if p.root { "" } else { "user, " },
                match network_reach(cfg, &p) {
                    NetworkReach::None => ", empty network",
                    NetworkReach::Filtered { .. } => ", network (own, through the proxy)",
                    NetworkReach::All => "",
                },
                if p.proc_hidden {
                    "NO /proc (this system masks parts of /proc, e.g. systemd ProtectKernelTunables/ProtectKernelLogs)"
                } else {
                    "private /proc"
                }
            )),
            (Ok(_), Err(e)) => parts.push(format!("namespaces UNAVAILABLE ({e})")),
        }
        if p.helper.is_ok() {
            parts.push(format!(
                "rlimits (cpu {}, memory {}, file size {}, open files {}, processes {}, no core dumps)",
                limit(cfg.max_cpu_seconds, "s"),
                limit(cfg.max_memory_mb, " MiB"),
                limit(cfg.max_file_size_mb, " MiB"),
                limit(cfg.max_open_files, ""),
                limit(cfg.max_processes, ""),
            ));
            parts.push("no_new_privs".into());
            if p.root {
                parts.push(format!("runs as {}:{}", cfg.run_as_user, cfg.run_as_group));
            }
            if seccomp::available() {
                let inet = network_reach(cfg, &p) != NetworkReach::None;
                let sockets = match (inet, unix_sockets_refused(cfg, &p)) {
                    (true, false) => "",
                    (true, true) => ", no unix sockets",
                    (false, false) => ", no sockets but unix",
                    (false, true) => ", no sockets",
                };
                parts.push(format!("seccomp (no set-id files, memfd, SysV shm or io_uring{sockets})"));
            }
            parts.push(match &p.landlock {
                Ok(v) => {
                    let tcp_rules_missing = network_reach(cfg, &p) == NetworkReach::None && *v < 4;
                    format!("Landlock ABI {v}{}", if tcp_rules_missing { " (no TCP rules)" } else { "" })
                }
                Err(why) => why.to_string(),
            });
        }
        parts.push(network_line(cfg, &p));
        if cfg.isolation == Isolation::Required && !p.jail_available() {
            parts.push(format!("isolation = \"required\": commands are REFUSED ({})", p.missing()));
        }
        parts.join("; ")
    }
}

fn limit(v: u64, unit: &str) -> String {
    if v == 0 {
        "unlimited".into()
    } else {
        format!("{v}{unit}")
    }
}

impl Probe {
    /// Whether the namespace jail is available.
    pub fn jail_available(&self) -> bool {
        self.helper.is_ok() && self.namespaces.is_ok()
    }

    /// The Landlock ABI commands get, if any.
    pub fn landlock_abi(&self) -> Option<i32> {
        self.landlock.as_ref().ok().copied()
    }

    /// Why the jail is missing, and what became of Landlock, the wall that
    /// would remain: "not in this kernel" and "blocked by a filter" need different fixes.
    fn missing(&self) -> String {
        let jail = self.namespaces.as_ref().err().or(self.helper.as_ref().err()).cloned().unwrap_or_default();
        match &self.landlock {
            Ok(v) => format!("no namespace jail: {jail}; Landlock ABI {v} alone is not enough"),
            Err(why) => format!("no namespace jail: {jail}; {why}"),
        }
    }
}

/// What commands reach with `cfg` on this system: see [`NetworkReach::of`].
/// The proxy needs the jail's network namespace and its own setup to work.
pub fn network_reach(cfg: &ExecConfig, p: &Probe) -> NetworkReach {
    NetworkReach::of(cfg.network, p.jail_available() && p.proxy.is_ok())
}

/// `network: …` for the layers line: the setting, what it comes to, and why when that differs.
fn network_line(cfg: &ExecConfig, p: &Probe) -> String {
    use crate::config::Network;
    let reach = network_reach(cfg, p);
    let why = match (&p.namespaces, &p.proxy) {
        (Err(e), _) | (Ok(()), Err(e)) => e.as_str(),
        _ => "",
    };
    match (cfg.network, reach) {
        (Network::Auto, NetworkReach::All) => {
            format!("network: {} (\"auto\": the proxy cannot be set up here: {why})", reach.describe())
        }
        (Network::Filtered { .. }, NetworkReach::None) => format!(
            "network: NONE ([exec] network = {} needs the namespace jail and its proxy, unavailable: {why})",
            cfg.network.as_str()
        ),
        _ => format!("network: {}", reach.describe()),
    }
}

impl Sandbox {
    /// Turn `spec` (a program to run in `workspace`) into a sandboxed one, as `cfg` says.
    /// `Err` only when `[exec] isolation = "required"` cannot be met.
    pub fn wrap(&self, spec: CommandSpec, cfg: &ExecConfig, workspace: &Path) -> Result<CommandSpec, String> {
        if cfg.isolation == Isolation::Off {
            return Ok(spec);
        }
        let p = self.assumed();
        if cfg.isolation == Isolation::Required && !p.jail_available() {
            return Err(format!("sandbox: [exec] isolation = \"required\" but it cannot be met: {}", p.missing()));
        }
        let helper = match &p.helper {
            Ok(helper) => helper,
            // Without the helper a root bramble would run the command as root, with
            // no limits and the state directory in view: refuse rather than fail open.
            Err(why) if p.root => {
                return Err(format!(
                    "sandbox: bramble runs as root and its sandbox helper cannot start ({why}), so the command \
                 would run as root unconfined; refused. Run bramble as an unprivileged user (the packaged \
                 service does), or set [exec] isolation = \"off\" to accept the risk"
                ))
            }
            Err(_) => {
                self.warn_once(&format!("exec sandbox degraded: {}", self.layers_summary(cfg)));
                return Ok(spec);
            }
        };
        if p.namespaces.is_err() {
            self.warn_once(&format!("exec sandbox degraded: {}", self.layers_summary(cfg)));
        }
        let run_as = if p.root { Some(resolve_user(cfg)?) } else { None };
        let workspace = std::fs::canonicalize(workspace).unwrap_or_else(|_| workspace.to_path_buf());
        let cwd = std::fs::canonicalize(&spec.cwd).unwrap_or_else(|_| spec.cwd.clone());
        let canonical = |h: &PathBuf| std::fs::canonicalize(h).unwrap_or_else(|_| h.clone());
        let hide = self.hidden_paths(Some(&workspace));
        let jail = p.namespaces.is_ok();
        let mut expose: Vec<PathBuf> = cfg.expose.iter().map(canonical).collect();
        let reach = network_reach(cfg, &p);
        if reach == NetworkReach::All {
            // Names must still resolve: resolv.conf is often a link into /run (systemd-resolved).
            if let Ok(conf) = std::fs::canonicalize("/etc/resolv.conf") {
                if SOCKET_DIRS.iter().any(|d| conf.starts_with(d)) && !expose.contains(&conf) {
                    expose.push(conf);
                }
            }
        }
        let mb = |v: u64| v.saturating_mul(1 << 20);
        let mut command = vec![spec.program.clone().into_os_string()];
        command.extend(spec.args.iter().cloned());
        let opts = options::Options {
            ns: jail,
            no_network: reach == NetworkReach::None,
            proxy: match reach {
                NetworkReach::Filtered { internet, lan } => Some(netproxy::Reach { internet, lan }),
                _ => None,
            },
            no_unix: unix_sockets_refused(cfg, &p),
            landlock: p.landlock.is_ok(),
            run_as,
            limits: options::Limits {
                cpu_seconds: cfg.max_cpu_seconds,
                address_space: mb(cfg.max_memory_mb),
                file_size: mb(cfg.max_file_size_mb),
                open_files: cfg.max_open_files,
                processes: cfg.max_processes,
            },
            workspace: Some(workspace),
            cwd: Some(cwd),
            hide,
            mask: if jail { SOCKET_DIRS.iter().map(PathBuf::from).collect() } else { Vec::new() },
            expose,
            tmp_mb: cfg.tmp_size_mb,
            warm: false,
            command,
        };
        let mut args = vec!["sandbox-exec".into()];
        args.extend(opts.to_args());
        Ok(CommandSpec { program: helper.clone(), args, ..spec })
    }
}

/// Where the host's unix sockets live; shown empty in the jail.
const SOCKET_DIRS: [&str; 2] = ["/run", "/var/run"];

/// Whether commands are refused `socket(AF_UNIX)`. A unix socket reaches the
/// host's services by path (hidden only by the jail's empty `/run`) or by an
/// abstract name (kept to the sandbox only by an empty network namespace or
/// Landlock's scoping, ABI 6). So: allowed when `[exec] expose` asks for a
/// socket, or when both walls stand — the jail, and with the network on, Landlock ≥ 6.
pub fn unix_sockets_refused(cfg: &ExecConfig, p: &Probe) -> bool {
    if !cfg.expose.is_empty() {
        return false;
    }
    let jail = p.jail_available();
    // A network namespace of the command's own (none, or the proxy's) has its own abstract names.
    let abstract_scoped = network_reach(cfg, p) != NetworkReach::All || p.landlock_abi().is_some_and(|v| v >= 6);
    !(jail && abstract_scoped)
}

impl Sandbox {
    /// What commands must not see: the private paths and bramble's user's home
    /// (keys in ~/.profile, ssh keys, other projects). The workspace is attached
    /// again inside a hidden home; a workspace that *is* the home keeps it.
    fn hidden_paths(&self, workspace: Option<&Path>) -> Vec<PathBuf> {
        let canonical = |h: &PathBuf| std::fs::canonicalize(h).unwrap_or_else(|_| h.clone());
        let mut hide: Vec<PathBuf> = self.private.iter().map(canonical).collect();
        for home in homes() {
            if !workspace.is_some_and(|w| home.starts_with(w)) && !hide.contains(&home) {
                hide.push(home);
            }
        }
        hide
    }
}

/// The home directories of bramble's user: `$HOME` and the password database's.
fn homes() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let env = std::env::var_os("HOME").filter(|h| !h.is_empty()).map(PathBuf::from);
    let passwd = nix::unistd::User::from_uid(nix::unistd::geteuid()).ok().flatten().map(|u| u.dir);
    for home in env.into_iter().chain(passwd) {
        if let Ok(home) = std::fs::canonicalize(&home) {
            if home.is_absolute() && home.parent().is_some() && !out.contains(&home) {
                out.push(home);
            }
        }
    }
    out
}

/// The uid and gid commands run as when bramble is root.
fn resolve_user(cfg: &ExecConfig) -> Result<(u32, u32), String> {
    use nix::unistd::{Group, User};
    let user = User::from_name(&cfg.run_as_user)
        .ok()
        .flatten()
        .ok_or_else(|| format!("sandbox: [exec] run_as_user `{}` does not exist on this system", cfg.run_as_user))?;
    if user.uid.is_root() {
        return Err(format!("sandbox: [exec] run_as_user `{}` is root; pick an unprivileged user", cfg.run_as_user));
    }
    let gid = Group::from_name(&cfg.run_as_group).ok().flatten().map_or(user.gid, |g| g.gid);
    Ok((user.uid.as_raw(), gid.as_raw()))
}

/// If `outcome` is the helper reporting a layer it could not set up, its message.
pub fn setup_error(outcome: &process::Outcome) -> Option<String> {
    if outcome.state != process::ExitState::Exited(options::SETUP_FAILED) {
        return None;
    }
    let line = outcome.stderr.text.lines().find(|l| l.starts_with(options::ERROR_PREFIX))?;
    Some(format!("sandbox: {}", line.trim_start_matches(options::ERROR_PREFIX)))
}

impl Sandbox {
    /// The startup log line: the layers at `info`, a missing jail at `warn` (once per sandbox).
    pub fn log_layers(&self, cfg: &ExecConfig) {
        let summary = self.layers_summary(cfg);
        if cfg.isolation != Isolation::Off && !self.probe().jail_available() {
            self.warn_once(&format!("exec sandbox degraded: {summary}"));
        } else {
            tracing::info!("exec sandbox: {summary}");
        }
    }

    fn warn_once(&self, msg: &str) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!("{msg}");
        }
    }
}
