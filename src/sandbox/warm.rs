//! A jail built before its command: exec calls come in bursts, so after one
//! command the next jail is made ready while the model thinks.
//!
//! Most of a sandboxed command's start is the jail, not the command: a second
//! `execve` of bramble, the namespaces, the mounts of [`super::jail`], init's
//! `fork`, the network proxy. None of it depends on *which* command runs or in
//! which directory — only on `[exec]`, the workspace and the hidden paths. So
//! when a command has run, one helper is started with `--warm`: it builds all
//! of that and waits, in init, for its order on stdin (the working directory
//! and the command, NUL-separated). The next command with the same setup
//! takes it, writes the order, closes stdin and is run by
//! [`process::run_child`] like any other: the same process group, timeout,
//! output capture and clean-up. What is left on the critical path is init's
//! `fork` of the worker and the worker's own layers (user, `no_new_privs`,
//! Landlock, seccomp) before `execve` — every layer, as before.
//!
//! The ready jail belongs to a [`super::Sandbox`] ([`Ready`]): one per
//! composition root, dropped (and its helper killed) with it.
//!
//! Each warm helper is used once. One is kept at most, for [`WARM_IDLE`]
//! after the command that made it; then it is killed, so an idle daemon has no
//! extra processes. Only a model's commands make one (they come in bursts
//! within a turn), only in the daemon and the terminal chat, never a job's
//! (the next run is minutes away: the jail would be built to be thrown away). A helper that died meanwhile (or whose setup failed) is
//! not used: the command starts cold. Commands with stdin data start cold too.

use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

use super::options::Options;
use super::process::{self, CommandSpec, Outcome};

/// How long a ready jail waits for a command.
pub const WARM_IDLE: Duration = Duration::from_secs(60);
/// Orders longer than this start cold (the helper reads at most 1 MiB).
const MAX_ORDER: usize = 512 * 1024;

struct Warm {
    /// What it was built for: the helper, its options without cwd and command, the environment.
    key: Vec<OsString>,
    child: tokio::process::Child,
    id: u64,
}

/// A sandbox's jail built ahead, and what it counts.
#[derive(Default)]
pub struct Ready {
    /// The one ready jail, if any (shared with its idle timer).
    slot: Arc<Mutex<Option<Warm>>>,
    /// Commands that ran in a ready jail.
    runs: AtomicU64,
    /// Whether jails are made ready ahead: in the daemon and the terminal chat, where
    /// more commands follow; not for a one-shot `bramble agent -m`, which would only
    /// build one to throw it away.
    enabled: AtomicBool,
    next_id: AtomicU64,
}

impl Ready {
    /// Make jails ready ahead from now on (the daemon and the terminal chat call this).
    pub fn enable(&self) {
        self.enabled.store(true, Ordering::Relaxed);
    }

    /// Commands that ran in a jail built ahead of them.
    pub fn runs(&self) -> u64 {
        self.runs.load(Ordering::Relaxed)
    }

    /// Run a spec made by [`super::Sandbox::wrap`]: in the ready jail when one matches,
    /// else as [`process::run`] does; then, with `ahead` (a model's command: more
    /// tend to follow in the turn; not a job's, which comes back minutes later),
    /// make the next one ready.
    pub async fn run(&self, spec: CommandSpec, cancel: &CancellationToken, ahead: bool) -> io::Result<Outcome> {
        let Some(plan) = Plan::of(&spec) else { return process::run(spec, cancel).await };
        let ready = self.take(&plan.key);
        let outcome = match ready {
            Some(mut child) => match send_order(&mut child, &plan.order).await {
                Ok(()) => {
                    self.runs.fetch_add(1, Ordering::Relaxed);
                    process::run_child(child, spec, cancel).await
                }
                // It died between the check and the order: start cold (it is killed and reaped on drop).
                Err(_) => process::run(spec, cancel).await,
            },
            None => process::run(spec, cancel).await,
        };
        // Only after a command whose jail worked: a failing layer is for the probe to look at.
        let worked = outcome.as_ref().is_ok_and(|o| super::setup_error(o).is_none());
        if worked && ahead && !cancel.is_cancelled() && self.enabled.load(Ordering::Relaxed) {
            self.prepare(plan);
        }
        outcome
    }

    /// The ready jail for `key`, if it is there and alive; a ready jail for
    /// anything else is dropped (killed) either way: the setup changed.
    fn take(&self, key: &[OsString]) -> Option<tokio::process::Child> {
        let mut warm = lock(&self.slot).take()?;
        if warm.key != key {
            return None;
        }
        match warm.child.try_wait() {
            Ok(None) => Some(warm.child),
            _ => None,
        }
    }

    /// Start a ready jail for `plan`'s setup and forget it after [`WARM_IDLE`].
    fn prepare(&self, plan: Plan) {
        let Ok(child) = process::command(&plan.warm_spec).spawn() else { return };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        *lock(&self.slot) = Some(Warm { key: plan.key, child, id });
        let slot = Arc::downgrade(&self.slot);
        tokio::spawn(async move {
            tokio::time::sleep(WARM_IDLE).await;
            let Some(slot) = slot.upgrade() else { return };
            let mut s = lock(&slot);
            if s.as_ref().is_some_and(|w| w.id == id) {
                *s = None; // Killed on drop, reaped by tokio.
            }
        });
    }

    /// Kill the ready jail (tests; a config reload makes the old one unusable anyway).
    pub fn discard(&self) {
        *lock(&self.slot) = None;
    }
}

/// What a warmable spec needs: its key, the order, and the spec to start a ready jail with.
struct Plan {
    key: Vec<OsString>,
    order: Vec<u8>,
    warm_spec: CommandSpec,
}

impl Plan {
    /// `None` for anything but a namespace jail without stdin data.
    fn of(spec: &CommandSpec) -> Option<Plan> {
        if spec.stdin.is_some() || spec.args.first().is_none_or(|a| a != "sandbox-exec") {
            return None;
        }
        let opts = Options::parse(&spec.args[1..]).ok()?;
        if !opts.ns || opts.warm {
            return None;
        }
        let mut order: Vec<u8> = opts.cwd.as_ref()?.as_os_str().as_bytes().to_vec();
        for arg in &opts.command {
            order.push(0);
            order.extend_from_slice(arg.as_bytes());
        }
        if order.len() > MAX_ORDER {
            return None;
        }
        // The helper starts in the workspace (the command's directory may be gone by then).
        let cwd = opts.workspace.clone().unwrap_or_else(|| spec.cwd.clone());
        let template = Options { cwd: None, command: Vec::new(), warm: true, ..opts };
        let mut args: Vec<OsString> = vec!["sandbox-exec".into()];
        args.extend(template.to_args());
        let mut key: Vec<OsString> = vec![spec.program.clone().into_os_string()];
        key.extend(args.iter().cloned());
        for (k, v) in &spec.env {
            let mut pair = k.clone();
            pair.push("=");
            pair.push(v);
            key.push(pair);
        }
        let warm_spec = CommandSpec { args, cwd, stdin: Some(Vec::new()), ..spec.clone() };
        Some(Plan { key, order, warm_spec })
    }
}

async fn send_order(child: &mut tokio::process::Child, order: &[u8]) -> io::Result<()> {
    let mut stdin = child.stdin.take().ok_or_else(|| io::Error::other("no stdin"))?;
    stdin.write_all(order).await?;
    stdin.shutdown().await
}

fn lock(slot: &Mutex<Option<Warm>>) -> std::sync::MutexGuard<'_, Option<Warm>> {
    slot.lock().unwrap_or_else(|p| p.into_inner())
}
