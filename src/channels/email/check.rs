//! The email channel in `bramble status` (one line from the config and the
//! state files) and `bramble doctor` (a real IMAP login and folder select,
//! and an SMTP connection test).

use std::path::Path;
use std::time::Duration;

use crate::clients::imap::Imap;
use crate::clients::smtp::Smtp;
use crate::config::email::EmailConfig;

/// `bramble status`'s `email:` line.
pub fn status_line(c: &EmailConfig, state_dir: &Path) -> String {
    let Some(me) = &c.address else { return "not configured".into() };
    let mut parts = vec![me.0.clone()];
    if let Some(s) = &c.imap {
        parts.push(format!("reads {} {}", s, c.folder));
    }
    if let Some(s) = &c.smtp {
        parts.push(format!("sends via {s}"));
    }
    parts.push(match c.allow_from.len() {
        0 => "answers nobody (allow_from is empty)".into(),
        n => format!("{n} sender(s) allowed"),
    });
    if c.imap.is_some() && c.authserv_id.is_none() {
        parts.push("NO authserv_id: nobody is trusted".into());
    }
    match (&c.password_env, c.password().is_some()) {
        (Some(var), false) => parts.push(format!("password MISSING: set {var}")),
        (None, _) => parts.push("no password_env".into()),
        _ => {}
    }
    let mark = super::state::MarkFile::new(state_dir).load();
    if mark.last_uid > 0 {
        parts.push(format!("last mail read: UID {}", mark.last_uid));
    }
    let waiting = std::fs::read_dir(state_dir.join("email-digest")).map(|d| d.count()).unwrap_or(0);
    if waiting > 0 {
        parts.push(format!("{waiting} digest(s) collecting"));
    }
    parts.join("; ")
}

/// `bramble doctor`: log in to IMAP and select the folder, connect to SMTP.
/// `Ok(None)`: not configured.
pub async fn probe(c: &EmailConfig, limit: Duration) -> Result<Option<String>, String> {
    let (Some(_), Some(login)) = (&c.address, c.login()) else { return Ok(None) };
    if !c.enabled() {
        return Ok(None);
    }
    let password = c.password();
    let mut found = Vec::new();
    if let Some(server) = &c.imap {
        let Some(pw) = &password else {
            return Err("[email] password_env names no set variable: IMAP cannot log in".into());
        };
        let session = async {
            let mut imap = Imap::connect(server, &login, pw, 1024).await?;
            let folder = imap.select(&c.folder).await?;
            let idle = imap.has("IDLE");
            imap.logout().await;
            Ok::<_, crate::clients::imap::ImapError>((folder, idle))
        };
        let (folder, idle) = tokio::time::timeout(limit, session)
            .await
            .map_err(|_| format!("IMAP {server}: no answer within {limit:?}"))?
            .map_err(|e| e.to_string())?;
        found.push(format!(
            "IMAP {server}: logged in, {} holds {} mail(s){}",
            c.folder,
            folder.exists,
            if idle { ", IDLE" } else { ", no IDLE (polled)" }
        ));
    }
    if let Some(server) = &c.smtp {
        let smtp = Smtp::new(server, &login, password.as_ref()).map_err(|e| e.to_string())?;
        match tokio::time::timeout(limit, smtp.test()).await {
            Ok(Ok(true)) => found.push(format!("SMTP {server}: answers")),
            Ok(Ok(false)) => return Err(format!("SMTP {server}: the connection test failed")),
            Ok(Err(e)) => return Err(format!("SMTP {server}: {e}")),
            Err(_) => return Err(format!("SMTP {server}: no answer within {limit:?}")),
        }
    }
    Ok(Some(found.join("; ")))
}
