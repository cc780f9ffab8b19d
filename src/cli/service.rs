//! `sudo bramble …` on the installed service: act as the service, never as root.
//!
//! After `apt install ./bramble_*.deb` the service's config is
//! `/etc/bramble/config.toml` and its state `/var/lib/bramble`, owned by the
//! `bramble` user. When a command resolves to that config (no `--config`,
//! `BRAMBLE_CONFIG` or per-user config: see [`config::default_config_path`])
//! and runs as root, it reads what only root may read — the unit's
//! `EnvironmentFile` and credentials, so `cron run` has the API key the
//! service has — and then drops to the `bramble` user and its groups *before*
//! the config is used or any state is touched. Every file it writes is the
//! service's, as if the service had written it.
//!
//! A member of the `bramble` group (plain `bramble …`, no sudo) reads the
//! config and sees `status` (what the config says; the state's parts are
//! shown as private, and whether the running service answers). The state is
//! the service user's alone — sessions hold private chats, and a group member
//! who may write the state directory could swap, plant or symlink any file in
//! it — so a member's `cron …` is not done here: it goes to the running
//! daemon's control socket (`/run/bramble/control.sock`, the group's), which
//! does it as the service, audited as `cli:<member>` and limited by `[service]
//! members` ([`through_service`]; the server is `crate::daemon::control`). No
//! running service: "start it, or use sudo". What would run as the service in
//! this process (a turn, the heartbeat, the daemon) is told to use sudo
//! ([`member_may`]).

use std::ffi::CString;
use std::path::Path;

use anyhow::{bail, Context as _};

use crate::config::{self, Service};

/// Who a command acts as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acting {
    /// Not the service's config: the user who ran it, as always.
    Own,
    /// The service's config, by root: now its user (the name).
    Service(String),
    /// The service's config, by another user (a member of the `bramble` group).
    ServiceConfigOnly,
}

/// Resolve whether `explicit` (or the default config) is the installed
/// service's; if so and this is root, take the service's secrets and become
/// its user. Call before anything else reads the config or the state.
pub fn enter(explicit: Option<&Path>) -> anyhow::Result<Acting> {
    let service = Service::installed();
    let path = explicit.map(Path::to_path_buf).unwrap_or_else(config::default_config_path);
    if !(path.exists() && config::same_file(&path, &service.config)) {
        return Ok(Acting::Own);
    }
    if !nix::unistd::geteuid().is_root() {
        // The service itself (`bramble run` under the unit, `runuser -u bramble`) is not a member.
        let me = nix::unistd::User::from_uid(nix::unistd::geteuid()).ok().flatten();
        return Ok(match me {
            Some(me) if me.name == service.user => Acting::Service(me.name),
            _ => Acting::ServiceConfigOnly,
        });
    }
    let user = nix::unistd::User::from_name(&service.user)
        .with_context(|| format!("cannot look up the user `{}`", service.user))?
        .with_context(|| {
            format!(
                "{} is the installed service's config, but its user `{}` does not exist: is bramble installed \
                 from its .deb? (Or pass --config to use another config as root.)",
                service.config.display(),
                service.user
            )
        })?;
    // Root-only files first: the service's environment file and credentials.
    load_secrets(&service);
    let name = CString::new(user.name.clone()).context("the service user's name")?;
    nix::unistd::initgroups(&name, user.gid).context("cannot set the service user's groups")?;
    nix::unistd::setgid(user.gid).context("cannot become the service user's group")?;
    nix::unistd::setuid(user.uid).context("cannot become the service user")?;
    if nix::unistd::setuid(nix::unistd::Uid::from_raw(0)).is_ok() || nix::unistd::geteuid().is_root() {
        bail!("could not drop root privileges to the user `{}`", user.name);
    }
    // Its home, for anything that looks there (the sandbox's hidden paths).
    std::env::set_var("HOME", &user.dir);
    std::env::set_var("USER", &user.name);
    std::env::set_var("LOGNAME", &user.name);
    Ok(Acting::Service(user.name))
}

/// The service's environment file (`KEY=value` lines, as systemd reads them:
/// `#` comments, optional quotes) and credential files (`NAME` → `$NAME`),
/// into this process's environment where a variable is not set already.
/// Runs before the runtime has more than this thread.
fn load_secrets(service: &Service) {
    if let Ok(text) = std::fs::read_to_string(&service.env_file) {
        for (key, value) in parse_env_file(&text) {
            if std::env::var_os(&key).is_none() {
                std::env::set_var(key, value);
            }
        }
    }
    let Ok(dir) = std::fs::read_dir(&service.credentials) else { return };
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !is_var_name(&name) || !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        if let Ok(value) = std::fs::read_to_string(entry.path()) {
            if std::env::var_os(&name).is_none() && !value.trim().is_empty() {
                std::env::set_var(&name, value.trim());
            }
        }
    }
}

/// `KEY=value` pairs of an environment file, as systemd's `EnvironmentFile=` reads them.
pub fn parse_env_file(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with(';'))
        .filter_map(|l| {
            let l = l.strip_prefix("export ").unwrap_or(l);
            let (key, value) = l.split_once('=')?;
            let key = key.trim();
            let value = value.trim();
            let value = ['"', '\'']
                .iter()
                .find_map(|q| value.strip_prefix(*q).and_then(|v| v.strip_suffix(*q)))
                .unwrap_or(value);
            is_var_name(key).then(|| (key.to_string(), value.to_string()))
        })
        .collect()
}

fn is_var_name(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// For a non-root user on the service's config (a member of its group, or
/// anyone who may read the config): `status`, and the job commands through
/// the running service ([`through_service`]); nothing else that would run as
/// the service (a turn, the heartbeat, the daemon need its secrets and its user).
pub fn member_may(command: &crate::cli::args::Command) -> anyhow::Result<()> {
    use crate::cli::args::Command;
    let what = match command {
        Command::Status { .. } | Command::Cron(_) => return Ok(()),
        Command::Run => "the service runs under systemd (`sudo systemctl start bramble`)",
        _ => "this runs as the service, with its secrets",
    };
    bail!("{what}: use sudo (`sudo bramble …` acts as the service's user)")
}

/// How long a member waits for the service's answer.
const ANSWER_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// A member's `bramble cron …`: sent to the running service's control socket
/// (`argv`: the arguments after `cron`); its output printed, its exit code returned.
pub async fn through_service(argv: &[String]) -> anyhow::Result<std::process::ExitCode> {
    use crate::daemon::control::{self, ClientError};
    use std::io::Write as _;
    let path = Service::installed().control;
    let reply = match control::request(&path, argv, ANSWER_WAIT).await {
        Ok(reply) => reply,
        Err(ClientError::Connect { source }) => bail!("{}", cannot_connect(&path, &source)),
        Err(e) => bail!("the bramble service ({}): {e}", path.display()),
    };
    let mut out = std::io::stdout().lock();
    out.write_all(reply.out.as_bytes())?;
    out.flush()?;
    eprint!("{}", reply.err);
    Ok(std::process::ExitCode::from(u8::try_from(reply.code).unwrap_or(1)))
}

/// What a failed connection to the control socket means to the user.
fn cannot_connect(path: &Path, e: &std::io::Error) -> String {
    use std::io::ErrorKind;
    match e.kind() {
        ErrorKind::NotFound | ErrorKind::ConnectionRefused => {
            "the bramble service is not running (systemctl status bramble); start it, or use sudo".into()
        }
        ErrorKind::PermissionDenied => format!(
            "{}: permission denied: only members of the service's group (`bramble`) may ask the service \
             (`id` lists your groups; after `adduser` log in again), or use sudo",
            path.display()
        ),
        _ => format!("cannot reach the bramble service at {}: {e}", path.display()),
    }
}

/// `bramble status` for a member: whether the service's control socket answers.
pub async fn control_line() -> String {
    let path = Service::installed().control;
    match crate::daemon::control::request(&path, &[], std::time::Duration::from_secs(5)).await {
        Ok(r) if r.code == 0 => format!("{} at {}", r.out.trim(), path.display()),
        Ok(r) => r.err.trim().trim_start_matches("bramble: error: ").to_string(),
        Err(crate::daemon::control::ClientError::Connect { source }) => cannot_connect(&path, &source),
        Err(e) => format!("no answer from {}: {e}", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_files_are_read_as_systemd_reads_them() {
        let text = "# keys\nOPENAI_API_KEY=sk-1\n\nexport TELEGRAM_BOT_TOKEN=\"12:ab\"\n; old\nBAD KEY=x\nEMPTY=\nQ='it is'\n1X=y\n";
        assert_eq!(
            parse_env_file(text),
            [
                ("OPENAI_API_KEY".to_string(), "sk-1".to_string()),
                ("TELEGRAM_BOT_TOKEN".into(), "12:ab".into()),
                ("EMPTY".into(), String::new()),
                ("Q".into(), "it is".into()),
            ]
        );
    }
}
