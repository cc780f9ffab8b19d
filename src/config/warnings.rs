//! What a loaded configuration says about itself: the start-up warnings
//! (`bramble check`, the daemon's log) and the ones about secrets. Split from
//! `mod.rs`; re-exported there.

use std::path::Path;

use super::{Config, Isolation, Loaded, McpTransport};

/// Something `bramble check` wants the user to know that is not an error.
pub fn warnings(loaded: &Loaded) -> Vec<String> {
    let c = &loaded.config;
    let mut out = Vec::new();
    for p in c.providers.iter().filter(|p| p.key_required() && p.api_key().is_none()) {
        let name = p.key_env();
        let mut line = format!(
            "no API key for the {} provider: set {name} in the environment (or `api_key_env` / `api_key` in [provider]); {}",
            p.name(),
            if c.providers.len() > 1 { "it is skipped until then" } else { "LLM turns will fail until then" },
        );
        if loaded.path.as_ref().is_some_and(|p| p.starts_with("/etc/bramble")) {
            // The service's own places, which only systemd reads: not this command.
            line.push_str(&format!(
                ". If it is in /etc/bramble/env or /etc/bramble/credentials/{name}, only the service sees it: \
                 `journalctl -u bramble` says `provider ready`"
            ));
        }
        out.push(line);
    }
    if let Err(e) = c.fleet.check(&c.mqtt) {
        out.push(format!("{e}: the fleet stays off"));
    } else if c.fleet.board().is_some()
        && c.fleet.role == super::fleet::FleetRole::Standby
        && c.telegram.token().is_none()
    {
        out.push("[fleet] role = \"standby\" without [telegram] token: it has no chat to take over".into());
    }
    if !loaded.paths.workspace.is_dir() {
        out.push(format!("the workspace {} does not exist yet: run `bramble init`", loaded.paths.workspace.display()));
    }
    if c.telegram.token_env.is_some() && c.telegram.token().is_none() {
        out.push(format!(
            "[telegram] token_env names {} but it is not set: Telegram stays off",
            c.telegram.token_env.as_deref().unwrap_or_default()
        ));
    }
    if c.telegram.token().is_some() && c.telegram.allow_from.is_empty() {
        out.push("[telegram] allow_from is empty: the bot will answer nobody".into());
    }
    out.extend(c.mcp.warnings(&c.exec));
    out.extend(security_warnings(loaded));
    out
}

/// The warnings about who else can reach bramble's secrets or the machine:
/// `bramble check` prints them and the daemon logs them at every start.
pub fn security_warnings(loaded: &Loaded) -> Vec<String> {
    let c = &loaded.config;
    let mut out = Vec::new();
    if let Some(path) = &loaded.path {
        out.extend(exposed_secrets(c, path));
    }
    if c.exec.isolation == Isolation::Off && nix::unistd::geteuid().is_root() {
        out.push(
            "DANGER: [exec] isolation = \"off\" while bramble runs as root: every command the model, a job or a \
             trigger runs, runs as root with no sandbox. Use isolation = \"auto\" (the default) or run bramble as \
             its own user"
                .into(),
        );
    }
    out
}

/// A warning when the config file holds secrets inline (`api_key`, `token`,
/// `password`) and other users may read it.
fn exposed_secrets(c: &Config, path: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let inline: Vec<&str> = [
        ("[provider] api_key", c.providers.iter().any(|p| p.api_key.is_some())),
        ("[telegram] token", c.telegram.token.is_some()),
        ("[mqtt] password", c.mqtt.password.is_some()),
        (
            "[[mcp.server]] headers",
            c.mcp.server.iter().any(|s| {
                matches!(&s.transport, McpTransport::Http { headers, .. }
                    if headers.keys().any(|h| h.eq_ignore_ascii_case("authorization")))
            }),
        ),
        ("[homeassistant] token", c.homeassistant.token.is_some()),
    ]
    .into_iter()
    .filter_map(|(name, set)| set.then_some(name))
    .collect();
    if inline.is_empty() {
        return None;
    }
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
    if mode & 0o044 == 0 {
        return None;
    }
    let who = if mode & 0o004 != 0 { "every user on this machine" } else { "its group" };
    Some(format!(
        "{} holds secrets inline ({}) and is readable by {who} (mode {mode:04o}): run `chmod 600 {}`, or move \
         them to the environment (`api_key_env`, `token_env`, `password_env`)",
        path.display(),
        inline.join(", "),
        path.display()
    ))
}
