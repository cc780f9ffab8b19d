//! The command line: `bramble init | run | agent | cron | heartbeat | status | doctor | logs | check |
//! completions`.
//!
//! [`args`] defines the commands (clap); each command is one file here, a
//! small function over the library that builds what it needs through the
//! composition root ([`crate::daemon::assemble`]). Errors go up as `anyhow`
//! with context that names the file or setting involved; `main` prints them
//! as `bramble: error: …`.

mod args;
mod chat;
mod check;
mod cron;
mod cron_view;
mod doctor;
mod fleet;
mod heartbeat;
mod init;
mod logs;
#[cfg(feature = "mcp")]
mod mcp;
mod outbox;
mod pair;
mod service;
mod status;

use std::process::ExitCode;

use clap::Parser as _;

pub use args::{AddArgs, Cli, Command, CronCommand, McpCommand, OutboxCommand};

use crate::config;

/// Parse the process's arguments (exits with usage on error, as clap does).
pub fn parse() -> Cli {
    Cli::parse()
}

/// Run a parsed command.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let explicit = cli.config.as_deref();
    // `bramble logs` and `bramble audit` only read the journal (as whoever
    // may: root, the systemd-journal group), completions and the man page are
    // text; everything else on the installed service's config acts as the service's user.
    let acting = match cli.command {
        Command::Logs { .. } | Command::Audit { .. } | Command::Completions { .. } | Command::Man => {
            service::Acting::Own
        }
        _ => service::enter(explicit)?,
    };
    // The owner's env file, read before anything else starts a thread (the
    // installed service reads /etc/bramble/env through systemd instead).
    let env_file = match (&acting, &cli.command) {
        (_, Command::Completions { .. } | Command::Man) => None,
        (service::Acting::Own, _) => read_env_file(),
        _ => None,
    };
    match cli.command {
        Command::Check { reload: false } => return Ok(check::check(explicit)),
        Command::Check { reload: true } => return Ok(check::reload(explicit)),
        Command::Init { workspace, setup } => return init::init(explicit, workspace.as_deref(), setup).await,
        Command::Logs { follow, lines } => return logs::logs(follow, lines),
        Command::Doctor { json } => return Ok(doctor::doctor(explicit, json).await),
        Command::Completions { shell } => {
            print!("{}", gunzip(completions(shell)));
            return Ok(ExitCode::SUCCESS);
        }
        Command::Man => {
            print!("{}", gunzip(MAN_PAGE));
            return Ok(ExitCode::SUCCESS);
        }
        _ => {}
    }
    let loaded = config::load(explicit)?;
    match &acting {
        // A member's job commands go to the running service, which acts on them as itself.
        service::Acting::ServiceConfigOnly => match &cli.command {
            Command::Cron(cmd) => return service::through_service(&cron::argv(cmd)).await,
            other => service::member_may(other)?,
        },
        service::Acting::Service(_) | service::Acting::Own => {}
    }
    let default_level = if matches!(cli.command, Command::Run) { "info" } else { "warn" };
    // The log file is the daemon's: a one-shot command's warnings are its own terminal's.
    let log_file = loaded.config.daemon.log_file.as_deref().filter(|_| matches!(cli.command, Command::Run));
    let log_file = log_file.map(|p| config::expand_tilde(p, &config::home_dir()));
    crate::logging::init(loaded.config.daemon.log_level.as_deref(), default_level, log_file.as_deref());
    if let Some((path, applied)) = &env_file {
        let kept = if applied.kept.is_empty() {
            String::new()
        } else {
            format!("; already set in the environment, which wins: {}", applied.kept.join(", "))
        };
        tracing::info!("env file {}: set {}{kept}", path.display(), applied.set.join(", "));
    }
    match cli.command {
        Command::Run => {
            let control: crate::daemon::control::Handler = std::sync::Arc::new(cron::serve);
            crate::daemon::run(explicit, loaded, Some(control)).await.map(|()| ExitCode::SUCCESS)
        }
        Command::Cron(cmd) => cron::cron(&loaded, *cmd).await,
        Command::Agent { message, session } => chat::agent(&loaded, message, session).await,
        Command::Heartbeat { dry_run } => heartbeat::heartbeat(&loaded, dry_run).await,
        Command::Status { json } => status::status(&loaded, &acting, json).await,
        Command::Pair { channel, list, revoke } => pair::pair(&loaded, channel, list, revoke).await,
        Command::Audit { since, json } => audit(&loaded, &since, json),
        Command::Outbox(cmd) => outbox::outbox(&loaded, cmd),
        #[cfg(feature = "mcp")]
        Command::Mcp(cmd) => mcp::mcp(&loaded, cmd).await,
        Command::Fleet(cmd) => fleet::fleet(&loaded, cmd).await,
        #[cfg(not(feature = "mcp"))]
        Command::Mcp(_) => Err(crate::config::features::Missing::Mcp.into()),
        Command::Check { .. }
        | Command::Init { .. }
        | Command::Logs { .. }
        | Command::Doctor { .. }
        | Command::Completions { .. }
        | Command::Man => unreachable!("handled above"),
    }
}

/// Read the owner's env file (`~/.config/bramble/env`) into this process;
/// a file others may read is refused, loudly, and its values never shown.
fn read_env_file() -> Option<(std::path::PathBuf, config::env::Applied)> {
    let path = config::env::path();
    match config::env::read(&path) {
        Ok(None) => None,
        Ok(Some(file)) => Some((path, config::env::apply(&file))),
        Err(e) => {
            eprintln!("bramble: warning: {e}");
            None
        }
    }
}

/// The man page, written (gzipped) by build.rs from the CLI's definition.
const MAN_PAGE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/bramble.1.gz"));

/// A completion script, written (gzipped) by build.rs from the CLI's definition.
fn completions(shell: args::Shell) -> &'static [u8] {
    match shell {
        args::Shell::Bash => include_bytes!(concat!(env!("OUT_DIR"), "/bramble.bash.gz")),
        args::Shell::Zsh => include_bytes!(concat!(env!("OUT_DIR"), "/_bramble.gz")),
        args::Shell::Fish => include_bytes!(concat!(env!("OUT_DIR"), "/bramble.fish.gz")),
    }
}

/// The text of one of those (they were written by build.rs: they unpack).
fn gunzip(gz: &[u8]) -> String {
    use std::io::Read as _;
    let mut text = String::new();
    if let Err(e) = flate2::read::GzDecoder::new(gz).read_to_string(&mut text) {
        // Only a broken build could get here.
        return format!("(cannot unpack the text built into this binary: {e})\n");
    }
    text
}

/// A time in the configured zone, or `-`.
fn when(t: Option<jiff::Timestamp>, tz: &config::TzName) -> String {
    crate::scheduler::schedule::local_time(t, tz.tz())
}

/// Who typed the command: sudo's caller, else this process's user.
fn invoking_user() -> String {
    if let Some(name) = std::env::var("SUDO_USER").ok().filter(|n| !n.is_empty()) {
        return name;
    }
    let uid = nix::unistd::getuid();
    match nix::unistd::User::from_uid(uid) {
        Ok(Some(user)) => user.name,
        _ => format!("uid {uid}"),
    }
}

/// `bramble audit [--since WHEN]`: the journal's audit entries where systemd
/// runs the service, else `<state>/audit.jsonl`.
fn audit(loaded: &crate::config::Loaded, since: &str, json: bool) -> anyhow::Result<ExitCode> {
    use crate::tools::audit;
    let now = jiff::Timestamp::now();
    let from = match since.parse::<crate::config::Dur>() {
        Ok(d) => now - d.get(),
        Err(_) => crate::scheduler::parse_at(since, loaded.config.timezone().tz())
            .map_err(|e| anyhow::anyhow!("--since: `{since}` is neither a duration (1h, 2d) nor a time: {e}"))?,
    };
    let journal = std::path::Path::new("/run/systemd/system").is_dir()
        && std::process::Command::new("systemctl")
            .args(["is-enabled", "--quiet", "bramble.service"])
            .status()
            .is_ok_and(|s| s.success());
    let entries = if journal {
        let since_arg = format!("@{}", from.as_second());
        let out = std::process::Command::new("journalctl")
            .args(["-u", "bramble.service", "-o", "json", "--no-pager", "--since", &since_arg, "AUDIT=tool"])
            .output()
            .map_err(|e| anyhow::anyhow!("cannot run journalctl: {e}"))?;
        if !out.status.success() {
            anyhow::bail!(
                "journalctl failed ({}): reading the service's journal needs root or the systemd-journal group (`sudo bramble audit`)",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let mut entries: Vec<audit::Entry> =
            String::from_utf8_lossy(&out.stdout).lines().filter_map(audit::from_journal).collect();
        // What commands recorded outside the service (`pair --revoke`) is in the file.
        entries.extend(audit::read_file(&loaded.paths.state_dir, Some(from)));
        entries.sort_by_key(|e| e.at);
        entries
    } else {
        audit::read_file(&loaded.paths.state_dir, Some(from))
    };
    let place = if journal {
        format!(
            "the journal (journalctl -u bramble AUDIT=tool) and {}",
            loaded.paths.state_dir.join(audit::AUDIT_FILE).display()
        )
    } else {
        loaded.paths.state_dir.join(audit::AUDIT_FILE).display().to_string()
    };
    if json {
        // One object per line (as `journalctl -o json`): the fields of `audit.jsonl`.
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        for e in &entries {
            serde_json::to_writer(&mut out, e)?;
            std::io::Write::write_all(&mut out, b"\n")?;
        }
        std::io::Write::flush(&mut out)?;
        return Ok(ExitCode::SUCCESS);
    }
    if entries.is_empty() {
        println!("no tool calls that changed something since {} (from {place})", from.strftime("%Y-%m-%d %H:%M"));
        return Ok(ExitCode::SUCCESS);
    }
    for e in &entries {
        println!("{e}");
    }
    eprintln!("({} entries since {}, from {place})", entries.len(), from.strftime("%Y-%m-%d %H:%M UTC"));
    Ok(ExitCode::SUCCESS)
}
