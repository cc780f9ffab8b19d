//! The audit trail: every tool call that changes something, with who asked.
//!
//! `exec`, `write_file`, `edit_file`, `mqtt_publish`, `ha_call_service`,
//! `cron` (anything but `list`) and MCP servers' tools (`<server>__<tool>`:
//! they can do anything) are recorded when they run, and when the policy
//! refuses them: the tool, what it was asked to do (a command, a path, a
//! topic; at most 200 characters), whether it worked, the turn's source
//! (`[policy.*]`'s name), session and chat. So are the job changes members
//! of the service's group send through the daemon's control socket (tool
//! `cron`, source `cli`, session `cli:<user>`: [`Audit::record_cli`]).
//!
//! Under systemd the record is a journal entry with its own fields
//! (`AUDIT=tool`, `AUDIT_TOOL`, `AUDIT_SOURCE`, `AUDIT_SESSION`, `AUDIT_OK`):
//! `journalctl -u bramble AUDIT=tool` finds them and `bramble audit` formats
//! them. Anywhere else (a `bramble run` by hand logs to its stderr) it is
//! also appended to `<state>/audit.jsonl`, which is kept under 512 KiB (the
//! older half moves to `audit.jsonl.1`). No fsync: a record lost to a power
//! cut costs less than an SD card written at every command.
//!
//! A record keeps what was asked as it was asked (the file is JSON, the
//! journal stores bytes): the evidence is not rewritten. What was asked is an
//! attacker's text, though (an anonymous MQTT publisher's refused command), so
//! `bramble audit` prints every field through
//! [`escape_line`](crate::util::text::escape_line): an escape sequence in it
//! (OSC 52 writes the owner's clipboard in many terminals) is shown, never run.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::ToolContext;

/// The audit file in the state directory (when not under systemd).
pub const AUDIT_FILE: &str = "audit.jsonl";
/// Past this size the file moves to `audit.jsonl.1` (the one before is dropped).
const MAX_FILE: u64 = 512 * 1024;
/// Characters of a call's detail kept.
const MAX_DETAIL: usize = 200;

/// One audited call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub at: jiff::Timestamp,
    pub tool: String,
    /// `terminal`, `telegram`, `job`, `heartbeat`, `mqtt`, `trigger`.
    pub source: String,
    pub session: String,
    pub chat: String,
    pub ok: bool,
    pub detail: String,
}

/// Where audit records go.
#[derive(Debug, Clone)]
pub struct Audit {
    /// `None`: the journal only.
    file: Option<PathBuf>,
}

impl Audit {
    /// Records for the journal (`to_journal`) or for `<state_dir>/audit.jsonl`.
    pub fn new(state_dir: &Path, to_journal: bool) -> Audit {
        Audit { file: (!to_journal).then(|| state_dir.join(AUDIT_FILE)) }
    }

    /// Whether a call of `tool` with `args` changes something (and so is audited).
    pub fn audited(tool: &str, args: &Value) -> bool {
        match tool {
            "exec" | "write_file" | "edit_file" | "mqtt_publish" | "ha_call_service" => true,
            "cron" => args.get("action").and_then(Value::as_str) != Some("list"),
            t => t.contains("__"),
        }
    }

    /// Record a call (`ok`: it ran without error; a refusal is not ok).
    pub async fn record(&self, ctx: &ToolContext, tool: &str, args: &Value, ok: bool) {
        let detail = detail(tool, args);
        tracing::info!(
            target: "bramble::audit",
            audit = "tool",
            audit_tool = tool,
            audit_source = ctx.source.name(),
            audit_session = %ctx.session_key(),
            audit_chat = %ctx.conversation.chat_id,
            audit_ok = ok,
            "audit: {tool} {} ({}, {}): {detail}",
            if ok { "ran" } else { "failed or refused" },
            ctx.source.name(),
            ctx.session_key(),
        );
        let entry = Entry {
            at: jiff::Timestamp::now(),
            tool: tool.to_string(),
            source: ctx.source.name().to_string(),
            session: ctx.session_key().to_string(),
            chat: ctx.conversation.chat_id.clone(),
            ok,
            detail,
        };
        self.append(entry).await;
    }

    /// Record a `bramble cron …` that came through the daemon's control socket
    /// (source `cli`, session `cli:<user>`: who sent it, as the kernel told the daemon).
    pub async fn record_cli(&self, user: &str, detail: &str, ok: bool) {
        let session = format!("cli:{user}");
        let detail = clip(detail);
        tracing::info!(
            target: "bramble::audit",
            audit = "tool",
            audit_tool = "cron",
            audit_source = "cli",
            audit_session = %session,
            audit_chat = "",
            audit_ok = ok,
            "audit: cron {} (cli, {session}): {detail}",
            if ok { "ran" } else { "failed or refused" },
        );
        let entry = Entry {
            at: jiff::Timestamp::now(),
            tool: "cron".into(),
            source: "cli".into(),
            session,
            chat: String::new(),
            ok,
            detail,
        };
        self.append(entry).await;
    }

    async fn append(&self, entry: Entry) {
        let Some(path) = self.file.clone() else { return };
        let written = crate::util::tasks::blocking(move || append(&path, &entry)).await;
        if let Err(e) = written {
            tracing::warn!(error = %e, "cannot append to the audit file");
        }
    }
}

/// What a call was asked to do, in a line.
fn detail(tool: &str, args: &Value) -> String {
    let s = |k: &str| args.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let text = match tool {
        "exec" => s("command"),
        "write_file" | "edit_file" => s("path"),
        "mqtt_publish" => s("topic"),
        "ha_call_service" => format!(
            "{}.{} {}",
            s("domain"),
            s("service"),
            args.get("entity_id").map(Value::to_string).unwrap_or_default()
        ),
        "cron" => format!("{} {}", s("action"), if s("name").is_empty() { s("job") } else { s("name") }),
        _ => serde_json::to_string(args).unwrap_or_default(),
    };
    clip(&text)
}

/// One line of at most [`MAX_DETAIL`] characters.
fn clip(text: &str) -> String {
    let text = text.trim().replace(['\n', '\r'], " ");
    if text.chars().count() <= MAX_DETAIL {
        return text;
    }
    format!("{}…", text.chars().take(MAX_DETAIL - 1).collect::<String>())
}

/// Append `entry`, moving a full file aside first.
fn append(path: &Path, entry: &Entry) -> std::io::Result<()> {
    if std::fs::metadata(path).is_ok_and(|m| m.len() > MAX_FILE) {
        let mut old = path.as_os_str().to_owned();
        old.push(".1");
        std::fs::rename(path, PathBuf::from(old))?;
    }
    let mut line = serde_json::to_vec(entry).map_err(std::io::Error::other)?;
    line.push(b'\n');
    let mut file = crate::util::fs::open_append_private(path)?;
    file.write_all(&line)
}

/// The entries of the audit file (and its older half), oldest first, from `since` on.
pub fn read_file(state_dir: &Path, since: Option<jiff::Timestamp>) -> Vec<Entry> {
    let path = state_dir.join(AUDIT_FILE);
    let mut old = path.as_os_str().to_owned();
    old.push(".1");
    let mut out = Vec::new();
    for p in [PathBuf::from(old), path] {
        let Ok(text) = std::fs::read_to_string(&p) else { continue };
        out.extend(
            text.lines()
                .filter_map(|l| serde_json::from_str::<Entry>(l).ok())
                .filter(|e| since.is_none_or(|s| e.at >= s)),
        );
    }
    out
}

/// An audit entry from one line of `journalctl -o json`.
pub fn from_journal(line: &str) -> Option<Entry> {
    let v: Value = serde_json::from_str(line).ok()?;
    let s = |k: &str| v.get(k).and_then(journal_text);
    let micros: i64 = s("__REALTIME_TIMESTAMP")?.parse().ok()?;
    let message = s("MESSAGE").unwrap_or_default();
    Some(Entry {
        at: jiff::Timestamp::from_microsecond(micros).ok()?,
        tool: s("AUDIT_TOOL")?,
        source: s("AUDIT_SOURCE").unwrap_or_default(),
        session: s("AUDIT_SESSION").unwrap_or_default(),
        chat: s("AUDIT_CHAT").unwrap_or_default(),
        ok: s("AUDIT_OK").as_deref() == Some("true"),
        detail: message.split_once("): ").map(|(_, d)| d.to_string()).unwrap_or(message),
    })
}

/// A field of `journalctl -o json`: a string, or (for a value with control
/// characters or bytes that are not UTF-8) an array of its bytes.
fn journal_text(v: &Value) -> Option<String> {
    if let Some(text) = v.as_str() {
        return Some(text.to_string());
    }
    let bytes: Option<Vec<u8>> = v.as_array()?.iter().map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok())).collect();
    Some(String::from_utf8_lossy(&bytes?).into_owned())
}

impl std::fmt::Display for Entry {
    /// `2026-11-23 20:01:02  telegram  telegram:42  exec  ok  df -h`, every
    /// field with its control characters escaped (they came from outside).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::util::text::escape_line;
        write!(
            f,
            "{}  {:<9} {:<22} {:<14} {:<7} {}",
            self.at.strftime("%Y-%m-%d %H:%M:%S"),
            escape_line(&self.source),
            escape_line(&self.session),
            escape_line(&self.tool),
            if self.ok { "ok" } else { "refused/failed" },
            escape_line(&self.detail)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn what_changes_things_is_audited() {
        assert!(Audit::audited("exec", &json!({})) && Audit::audited("write_file", &json!({})));
        assert!(
            Audit::audited("cron", &json!({"action": "add"})) && !Audit::audited("cron", &json!({"action": "list"}))
        );
        assert!(Audit::audited("ha__turn_on", &json!({})));
        assert!(!Audit::audited("read_file", &json!({})) && !Audit::audited("web_fetch", &json!({})));
        assert_eq!(detail("exec", &json!({"command": "df -h\nrm x"})), "df -h rm x");
        assert_eq!(detail("cron", &json!({"action": "remove", "job": "backup"})), "remove backup");
        assert!(detail("exec", &json!({"command": "x".repeat(500)})).chars().count() <= MAX_DETAIL);
    }

    #[tokio::test]
    async fn the_file_is_appended_read_back_and_kept_small() {
        let dir = tempfile::tempdir().unwrap();
        let audit = Audit::new(dir.path(), false);
        let ctx = ToolContext::detached("telegram:42").from_chat("telegram", "42");
        audit.record(&ctx, "exec", &json!({"command": "uptime"}), true).await;
        let mqtt = ToolContext::detached("mqtt:x").from_chat("mqtt", "home/reply");
        audit.record(&mqtt, "exec", &json!({"command": "rm -rf /"}), false).await;
        let entries = read_file(dir.path(), None);
        assert_eq!(entries.len(), 2);
        assert_eq!(
            (entries[0].source.as_str(), entries[0].detail.as_str(), entries[0].ok),
            ("telegram", "uptime", true)
        );
        assert_eq!((entries[1].source.as_str(), entries[1].ok), ("mqtt", false));
        let later = jiff::Timestamp::now() + std::time::Duration::from_secs(60);
        assert!(read_file(dir.path(), Some(later)).is_empty());
        // Past the limit the file moves aside: both halves are still read.
        std::fs::write(dir.path().join(AUDIT_FILE), "x".repeat(MAX_FILE as usize + 1)).unwrap();
        audit.record(&ctx, "write_file", &json!({"path": "notes.md"}), true).await;
        assert!(dir.path().join("audit.jsonl.1").exists());
        assert_eq!(read_file(dir.path(), None).last().unwrap().detail, "notes.md");
        // Journal only: no file.
        let other = tempfile::tempdir().unwrap();
        Audit::new(other.path(), true).record(&ctx, "exec", &json!({"command": "x"}), true).await;
        assert!(!other.path().join(AUDIT_FILE).exists());
    }

    #[test]
    fn journal_lines_are_read_back() {
        let line = r#"{"__REALTIME_TIMESTAMP":"1795464062000000","MESSAGE":"audit: exec ran (telegram, telegram:42): df -h","AUDIT":"tool","AUDIT_TOOL":"exec","AUDIT_SOURCE":"telegram","AUDIT_SESSION":"telegram:42","AUDIT_CHAT":"42","AUDIT_OK":"true"}"#;
        let e = from_journal(line).unwrap();
        assert_eq!((e.tool.as_str(), e.source.as_str(), e.detail.as_str(), e.ok), ("exec", "telegram", "df -h", true));
        assert!(from_journal(r#"{"MESSAGE":"other"}"#).is_none());
        // journalctl gives a value with control characters as its bytes: read, then shown escaped.
        let bytes: Vec<u8> = "audit: exec failed or refused (mqtt, mqtt:x): ls \u{1b}]52;c;eA==\u{7}".bytes().collect();
        let line = json!({"__REALTIME_TIMESTAMP": "1795464062000000", "MESSAGE": bytes, "AUDIT_TOOL": "exec"});
        let e = from_journal(&line.to_string()).unwrap();
        assert_eq!(e.detail, "ls \u{1b}]52;c;eA==\u{7}");
        assert!(e.to_string().ends_with("refused/failed ls \\x1b]52;c;eA==\\x07"), "{e}");
    }
}
