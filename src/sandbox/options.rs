//! The command line between bramble and its sandbox helper: what
//! `bramble sandbox-exec` is asked to build ([`Options`]), how it reports a
//! layer it could not set up ([`SETUP_FAILED`], [`ERROR_PREFIX`]).
//!
//! Its own module because both sides speak it: the parent ([`super::wrap`],
//! [`super::warm`]) writes it, and the helper and the layers it sets up
//! ([`super::helper`], [`super::jail`], [`super::landlock`],
//! [`super::netproxy`]) read it. Kept here, those import it and not each other.

use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// Exit status of the helper when a layer could not be set up.
pub const SETUP_FAILED: i32 = 125;
/// First bytes of the helper's one-line error on stderr.
pub const ERROR_PREFIX: &str = "bramble-sandbox: ";

/// What the parent asked for; the command line of `sandbox-exec`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// Build the namespace jail.
    pub ns: bool,
    /// A new, empty network namespace (with `ns`); Landlock TCP denial too.
    pub no_network: bool,
    /// A new network namespace whose only way out is the filtering proxy
    /// ([`super::netproxy`]), reaching what this says (with `ns`).
    pub proxy: Option<Reach>,
    /// Refuse `socket(AF_UNIX)` (seccomp): host sockets would be reachable.
    pub no_unix: bool,
    /// Apply Landlock (best effort).
    pub landlock: bool,
    /// Switch to this uid/gid before exec (set when bramble runs as root).
    pub run_as: Option<(u32, u32)>,
    pub limits: Limits,
    /// Writable: the workspace (bound at its own path).
    pub workspace: Option<PathBuf>,
    /// Directory to run in (inside the workspace).
    pub cwd: Option<PathBuf>,
    /// Paths made invisible: state dir, config, credentials, the home directory
    /// (by the jail's mounts and by Landlock).
    pub hide: Vec<PathBuf>,
    /// Directories shown empty in the jail only: where host sockets live (`/run`).
    pub mask: Vec<PathBuf>,
    /// Paths under a hidden or masked directory shown again, read-only (`[exec] expose`).
    pub expose: Vec<PathBuf>,
    /// Size of the fresh `/tmp` in MiB.
    pub tmp_mb: u64,
    /// Build everything, then wait: the working directory and the command
    /// arrive on stdin ([`super::warm`]), which the command then finds closed.
    pub warm: bool,
    /// The program and its arguments.
    pub command: Vec<OsString>,
}

/// Resource limits; 0 means "leave as is".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub cpu_seconds: u64,
    pub address_space: u64,
    pub file_size: u64,
    pub open_files: u64,
    pub processes: u64,
}

impl Options {
    /// The argument list after `sandbox-exec` (the inverse of [`Options::parse`]).
    pub fn to_args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let mut flag = |name: &str, on: bool| {
            if on {
                a.push(name.into());
            }
        };
        flag("--ns", self.ns);
        flag("--no-network", self.no_network);
        flag("--no-unix", self.no_unix);
        flag("--landlock", self.landlock);
        flag("--warm", self.warm);
        if let Some(reach) = self.proxy {
            a.push("--net-proxy".into());
            a.push(reach.as_arg().into());
        }
        let mut kv = |name: &str, value: OsString| {
            a.push(name.into());
            a.push(value);
        };
        if let Some((uid, gid)) = self.run_as {
            kv("--uid", uid.to_string().into());
            kv("--gid", gid.to_string().into());
        }
        let l = &self.limits;
        for (name, v) in [
            ("--cpu", l.cpu_seconds),
            ("--as", l.address_space),
            ("--fsize", l.file_size),
            ("--nofile", l.open_files),
            ("--nproc", l.processes),
            ("--tmp-mb", self.tmp_mb),
        ] {
            if v > 0 {
                kv(name, v.to_string().into());
            }
        }
        if let Some(ws) = &self.workspace {
            kv("--workspace", ws.clone().into());
        }
        if let Some(cwd) = &self.cwd {
            kv("--cwd", cwd.clone().into());
        }
        for h in &self.hide {
            kv("--hide", h.clone().into());
        }
        for m in &self.mask {
            kv("--mask", m.clone().into());
        }
        for e in &self.expose {
            kv("--expose", e.clone().into());
        }
        a.push("--".into());
        a.extend(self.command.iter().cloned());
        a
    }

    /// Parse the arguments after `sandbox-exec`.
    pub fn parse(args: &[OsString]) -> Result<Options, String> {
        let mut o = Options::default();
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let name = arg.to_string_lossy();
            let mut value = || it.next().cloned().ok_or_else(|| format!("{name} needs a value"));
            let mut number = || -> Result<u64, String> {
                let v = value()?;
                v.to_string_lossy().parse::<u64>().map_err(|_| format!("{name}: not a number: {v:?}"))
            };
            match name.as_ref() {
                "--ns" => o.ns = true,
                "--no-network" => o.no_network = true,
                "--no-unix" => o.no_unix = true,
                "--landlock" => o.landlock = true,
                "--warm" => o.warm = true,
                "--net-proxy" => {
                    let v = value()?;
                    o.proxy = Some(Reach::parse(&v.to_string_lossy()).ok_or_else(|| format!("{name}: {v:?}"))?);
                }
                "--uid" => o.run_as = Some((number()? as u32, o.run_as.map_or(0, |r| r.1))),
                "--gid" => o.run_as = Some((o.run_as.map_or(0, |r| r.0), number()? as u32)),
                "--cpu" => o.limits.cpu_seconds = number()?,
                "--as" => o.limits.address_space = number()?,
                "--fsize" => o.limits.file_size = number()?,
                "--nofile" => o.limits.open_files = number()?,
                "--nproc" => o.limits.processes = number()?,
                "--tmp-mb" => o.tmp_mb = number()?,
                "--workspace" => o.workspace = Some(value()?.into()),
                "--cwd" => o.cwd = Some(value()?.into()),
                "--hide" => o.hide.push(value()?.into()),
                "--mask" => o.mask.push(value()?.into()),
                "--expose" => o.expose.push(value()?.into()),
                "--" => {
                    o.command = it.cloned().collect();
                    break;
                }
                other => return Err(format!("unknown option {other}")),
            }
        }
        if o.warm && !o.ns {
            return Err("--warm needs --ns".into());
        }
        if o.command.is_empty() && !o.warm {
            return Err("no command after --".into());
        }
        Ok(o)
    }
}

/// What the proxy lets commands reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reach {
    /// Public (globally routable) addresses.
    pub internet: bool,
    /// The local network: RFC 1918, CGNAT, link-local, unique-local, and
    /// the prefixes this machine's interfaces are on.
    pub lan: bool,
}

impl Reach {
    /// `--net-proxy`'s value.
    pub fn as_arg(self) -> &'static str {
        match (self.internet, self.lan) {
            (true, true) => "internet,lan",
            (false, true) => "lan",
            _ => "internet",
        }
    }

    pub fn parse(arg: &str) -> Option<Reach> {
        let (mut internet, mut lan) = (false, false);
        for part in arg.split(',') {
            match part {
                "internet" => internet = true,
                "lan" => lan = true,
                _ => return None,
            }
        }
        (internet || lan).then_some(Reach { internet, lan })
    }
}

/// `s` as a C string, or why it cannot be one.
pub(crate) fn cstr(s: &OsStr) -> Result<CString, String> {
    CString::new(s.as_bytes()).map_err(|_| format!("a NUL byte in {s:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_round_trip() {
        let o = Options {
            ns: true,
            no_network: false,
            proxy: Some(Reach { internet: true, lan: true }),
            no_unix: true,
            landlock: true,
            run_as: Some((65534, 65533)),
            limits: Limits { cpu_seconds: 5, address_space: 1 << 30, file_size: 7, open_files: 64, processes: 32 },
            workspace: Some("/ws".into()),
            cwd: Some("/ws/sub".into()),
            hide: vec!["/state".into(), "/etc/bramble".into()],
            mask: vec!["/run".into()],
            expose: vec!["/run/mosquitto".into()],
            tmp_mb: 64,
            warm: false,
            command: vec!["/bin/sh".into(), "-c".into(), "echo --ns".into()],
        };
        assert_eq!(Options::parse(&o.to_args()).unwrap(), o);
        let minimal = Options { command: vec!["true".into()], ..Options::default() };
        assert_eq!(minimal.to_args(), [OsString::from("--"), "true".into()]);
        assert_eq!(Options::parse(&minimal.to_args()).unwrap(), minimal);
    }

    #[test]
    fn bad_arguments_are_errors_not_panics() {
        let p = |a: &[&str]| Options::parse(&a.iter().map(OsString::from).collect::<Vec<_>>());
        assert_eq!(p(&["--cpu"]).unwrap_err(), "--cpu needs a value");
        assert_eq!(p(&["--cpu", "x", "--", "a"]).unwrap_err(), "--cpu: not a number: \"x\"");
        assert_eq!(p(&["--what"]).unwrap_err(), "unknown option --what");
        assert_eq!(p(&["--ns"]).unwrap_err(), "no command after --");
        assert_eq!(p(&["--ns", "--"]).unwrap_err(), "no command after --");
        assert!(p(&["--net-proxy", "everything", "--", "a"]).is_err());
    }
}
