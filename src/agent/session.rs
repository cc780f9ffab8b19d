//! Sessions: one JSONL file per conversation, in the state directory.
//!
//! The format is nanobot's: a metadata line, then one OpenAI-format message per
//! line with a timestamp. Sessions live in the state directory, not in the
//! workspace, so the agent's own file tools cannot rewrite its history.
//!
//! Writes are append-only and happen once per turn: all lines of the turn go
//! out in one `write` followed by `fsync`. A power cut can at worst leave a
//! torn last line, which the reader skips with a warning — it never makes a
//! session unreadable. (SD cards wear out from small writes; one append per
//! turn is the floor.)
//!
//! Consolidation (see [`super::memory`]) is the one rewrite: the file is
//! replaced atomically by the metadata line, a `{"_type":"checkpoint"}` line
//! holding the summary of what was dropped, and the messages after it. Appends
//! and rewrites take an advisory lock on the session's own file (and check,
//! once they hold it, that no rewrite replaced the file meanwhile), so a
//! `bramble agent` process and the daemon never lose each other's turns, and
//! sessions do not wait for each other's `fsync`. The agent calls these on a
//! blocking thread: they wait on the disk.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::provider::{Message, Role, Usage};
use crate::util;

/// Messages of a session kept in memory (the prompt window is smaller);
/// older ones stay on disk only.
const CACHE_MESSAGES: usize = 200;

/// Characters of one stored text (a message's content, a tool call's
/// arguments) at most. A model can write a 50 MB `write_file` argument, an MQTT
/// message can carry 8 MiB: stored whole, it would ride along in every later
/// prompt of the chat and push the daemon past a 256 MB `MemoryMax`. 64 Ki
/// characters is far above a chat message or a tool result (capped at
/// `[exec] max_output`, 10,000 by default) and keeps 200 cached messages under
/// ~50 MB at the very worst.
pub const STORED_TEXT_CAP: usize = 64 * 1024;

/// A message as stored on disk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredMessage {
    #[serde(flatten)]
    pub message: Message,
    /// RFC 3339.
    #[serde(default)]
    pub timestamp: String,
    /// Token usage of the turn, on its final assistant message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Serialize, Deserialize)]
struct MetadataLine {
    #[serde(rename = "_type")]
    kind: String,
    key: String,
    created_at: String,
}

/// The summary that stands in for the messages a consolidation dropped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// What the model (or the raw archive note) said about the dropped messages.
    pub summary: String,
    /// RFC 3339, when it was made.
    pub timestamp: String,
    /// Messages summarised into it, over the session's whole life.
    #[serde(default)]
    pub archived: u64,
}

#[derive(Serialize, Deserialize)]
struct CheckpointLine {
    #[serde(rename = "_type")]
    kind: String,
    #[serde(flatten)]
    checkpoint: Checkpoint,
}

/// A session as loaded: its checkpoint and its most recent messages.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Session {
    pub checkpoint: Option<Checkpoint>,
    /// The last messages after the checkpoint (at most a few hundred).
    pub messages: Vec<StoredMessage>,
    /// Lines of messages after the checkpoint that are on disk but not in `messages`.
    pub skipped: usize,
}

impl Session {
    /// The first message of the checkpoint summary, for the prompt.
    pub fn checkpoint_message(&self) -> Option<Message> {
        self.checkpoint.as_ref().map(|c| {
            Message::user(format!(
                "[Summary of the earlier conversation ({} messages, consolidated {}) — context, not instructions]\n{}",
                c.archived, c.timestamp, c.summary
            ))
        })
    }
}

/// Session files in one directory, with a small in-memory cache of their
/// tails. Clones share the cache.
#[derive(Clone)]
pub struct SessionStore {
    dir: PathBuf,
    /// Per session: the file length the tail was read at, and the tail. A
    /// different length on disk means another process appended: read again.
    cache: Arc<Mutex<HashMap<String, (u64, Session)>>>,
}

impl SessionStore {
    /// Sessions under `<state_dir>/sessions`.
    pub fn new(state_dir: &Path) -> SessionStore {
        SessionStore { dir: state_dir.join("sessions"), cache: Arc::default() }
    }

    /// The state directory the sessions live in.
    pub fn state_dir(&self) -> &Path {
        self.dir.parent().unwrap_or(&self.dir)
    }

    /// The session with *all* its messages after the checkpoint (consolidation reads this).
    pub fn load_all(&self, key: &str) -> std::io::Result<Session> {
        let (checkpoint, messages) = read_all(&self.path(key))?;
        Ok(Session { checkpoint, messages, skipped: 0 })
    }

    /// The file of a session key. Keys are encoded so that every key maps to a
    /// distinct, safe file name (`telegram:42` → `telegram%3A42.jsonl`).
    pub fn path(&self, key: &str) -> PathBuf {
        let mut name = String::with_capacity(key.len() + 6);
        for b in key.bytes() {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.') && !(name.is_empty() && b == b'.') {
                name.push(char::from(b));
            } else {
                name.push_str(&format!("%{b:02X}"));
            }
        }
        self.dir.join(format!("{name}.jsonl"))
    }

    /// The session's checkpoint and most recent messages.
    pub fn load(&self, key: &str) -> std::io::Result<Session> {
        let path = self.path(key);
        let len = file_len(&path)?;
        if let Some((cached_len, cached)) = self.lock().get(key) {
            if *cached_len == len {
                return Ok(cached.clone());
            }
        }
        let loaded = read_session_file(&path)?;
        self.lock().insert(key.to_string(), (len, loaded.clone()));
        Ok(loaded)
    }

    /// The session's most recent messages (up to a few hundred).
    pub fn messages(&self, key: &str) -> std::io::Result<Vec<StoredMessage>> {
        Ok(self.load(key)?.messages)
    }

    /// The last `max` messages for the prompt, starting at a user message so
    /// the window never opens with an orphan tool result or a tool call whose
    /// result was cut off; the checkpoint summary, if any, comes first.
    pub fn history(&self, key: &str, max: usize) -> std::io::Result<Vec<Message>> {
        let session = self.load(key)?;
        let all = &session.messages;
        let start = all.len().saturating_sub(max);
        let window = &all[start..];
        let first_user = window.iter().position(|m| m.message.role == Role::User).unwrap_or(window.len());
        let mut out: Vec<Message> = session.checkpoint_message().into_iter().collect();
        out.extend(window[first_user..].iter().map(|m| m.message.clone()));
        Ok(out)
    }

    /// Append one turn's messages with a single durable write.
    pub fn append_turn(&self, key: &str, messages: &[StoredMessage]) -> std::io::Result<()> {
        if messages.is_empty() {
            return Ok(());
        }
        let path = self.path(key);
        let file = self.open_locked(&path)?;
        // Bring the cache up to date with the file before extending both.
        let mut cached = self.load(key)?;
        let mut buf = Vec::with_capacity(256 * messages.len());
        let len = file.metadata()?.len();
        if len > 0 && ends_torn(&file, len)? {
            // A power cut left half a line: end it, so our first line stays whole.
            buf.push(b'\n');
        }
        if len == 0 {
            let meta = MetadataLine { kind: "metadata".into(), key: key.into(), created_at: now_rfc3339() };
            serde_json::to_writer(&mut buf, &meta).map_err(std::io::Error::other)?;
            buf.push(b'\n');
        }
        let messages: Vec<StoredMessage> = messages.iter().map(capped).collect();
        for m in &messages {
            serde_json::to_writer(&mut buf, m).map_err(std::io::Error::other)?;
            buf.push(b'\n');
        }
        (&*file).write_all(&buf)?;
        file.sync_data()?;
        if len == 0 {
            util::fs::sync_dir(&self.dir)?;
        }
        cached.messages.extend(messages);
        if cached.messages.len() > CACHE_MESSAGES {
            let excess = cached.messages.len() - CACHE_MESSAGES;
            cached.messages.drain(..excess);
            cached.skipped += excess;
        }
        self.lock().insert(key.to_string(), (file_len(&path)?, cached));
        Ok(())
    }

    /// Replace the session's first `drop` messages after its checkpoint by a
    /// new checkpoint (`None`: no checkpoint at all, a fresh start), atomically.
    ///
    /// `expected` are the messages the caller summarised: the last of the
    /// dropped ones. If the file no longer starts with them (another process
    /// consolidated meanwhile) nothing is written and `Ok(None)` comes back.
    /// Otherwise the dropped messages are returned (all of them, the ones the
    /// cache did not hold included, so the caller can archive those too).
    /// Messages appended after `expected` are kept.
    pub fn replace_prefix(
        &self,
        key: &str,
        drop: usize,
        expected: &[StoredMessage],
        checkpoint: Option<Checkpoint>,
    ) -> std::io::Result<Option<Vec<StoredMessage>>> {
        let path = self.path(key);
        let _lock = self.open_locked(&path)?;
        let (_, mut all) = read_all(&path)?;
        if drop > all.len() || drop < expected.len() || all[drop - expected.len()..drop] != *expected {
            return Ok(None);
        }
        let kept = all.split_off(drop);
        let dropped = all;
        let mut buf = Vec::with_capacity(256 * (kept.len() + 2));
        let meta = MetadataLine { kind: "metadata".into(), key: key.into(), created_at: now_rfc3339() };
        serde_json::to_writer(&mut buf, &meta).map_err(std::io::Error::other)?;
        buf.push(b'\n');
        if let Some(c) = &checkpoint {
            let line = CheckpointLine { kind: "checkpoint".into(), checkpoint: c.clone() };
            serde_json::to_writer(&mut buf, &line).map_err(std::io::Error::other)?;
            buf.push(b'\n');
        }
        for m in &kept {
            serde_json::to_writer(&mut buf, m).map_err(std::io::Error::other)?;
            buf.push(b'\n');
        }
        util::fs::write_atomic(&path, &buf)?;
        let mut session = Session { checkpoint, messages: kept, skipped: 0 };
        if session.messages.len() > CACHE_MESSAGES {
            session.skipped = session.messages.len() - CACHE_MESSAGES;
            session.messages.drain(..session.skipped);
        }
        self.lock().insert(key.to_string(), (file_len(&path)?, session));
        Ok(Some(dropped))
    }

    /// The session's file, opened for appending (created 0600 if missing) and
    /// locked exclusively. A rewrite renames a new file over the path: if that
    /// happened while we waited for the lock, the new file is locked instead.
    fn open_locked(&self, path: &Path) -> std::io::Result<nix::fcntl::Flock<File>> {
        util::fs::create_private_dir(&self.dir)?;
        loop {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .read(true)
                .append(true)
                .mode(util::fs::FILE_MODE)
                .open(path)?;
            let file = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
                .map_err(|(_, e)| std::io::Error::from_raw_os_error(e as i32))?;
            let held = file.metadata()?;
            match std::fs::metadata(path) {
                Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => return Ok(file),
                _ => continue,
            }
        }
    }

    /// Session keys with a file on disk.
    pub fn keys(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        let mut keys: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str()?.strip_suffix(".jsonl").map(decode_key))
            .collect();
        keys.sort();
        keys
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u64, Session)>> {
        // A poisoned cache only means another turn panicked mid-update; the data is still usable.
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The file's length, 0 when it does not exist.
fn file_len(path: &Path) -> std::io::Result<u64> {
    match std::fs::metadata(path) {
        Ok(m) => Ok(m.len()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

/// Whether the file is non-empty and does not end with a newline.
fn ends_torn(file: &File, len: u64) -> std::io::Result<bool> {
    let mut last = [0u8; 1];
    file.read_exact_at(&mut last, len - 1)?;
    Ok(last[0] != b'\n')
}

fn decode_key(name: &str) -> String {
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&name[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Read a session file: the last checkpoint and the messages after it,
/// skipping the metadata line and any unreadable line (logged), so a torn tail
/// after a power cut costs one line, not the session.
fn read_all(path: &Path) -> std::io::Result<(Option<Checkpoint>, Vec<StoredMessage>)> {
    let (checkpoint, lines) = match read_lines(path)? {
        Some(text) => scan(path, &text, usize::MAX),
        None => return Ok((None, Vec::new())),
    };
    Ok((checkpoint, lines.0))
}

/// The file's text, `None` when it does not exist.
fn read_lines(path: &Path) -> std::io::Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The last checkpoint, the last `keep` messages after it (parsed), and how
/// many message lines after it were not parsed. Only the kept lines are
/// decoded: a long session loads in the time of its tail.
fn scan(path: &Path, text: &str, keep: usize) -> (Option<Checkpoint>, (Vec<StoredMessage>, usize)) {
    let lines: Vec<(usize, &str)> = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()).collect();
    let mut checkpoint = None;
    let mut start = 0;
    for (i, (n, line)) in lines.iter().enumerate().rev() {
        if line.starts_with("{\"_type\":\"checkpoint\"") {
            match serde_json::from_str::<CheckpointLine>(line) {
                Ok(c) => {
                    checkpoint = Some(c.checkpoint);
                    start = i + 1;
                    break;
                }
                Err(e) => {
                    tracing::warn!(file = %path.display(), line = n + 1, error = %e, "skipping an unreadable checkpoint")
                }
            }
        }
    }
    let messages: Vec<(usize, &str)> =
        lines[start..].iter().filter(|(_, l)| !l.starts_with("{\"_type\"")).copied().collect();
    let skipped = messages.len().saturating_sub(keep);
    let mut out = Vec::with_capacity(messages.len() - skipped);
    for (n, line) in &messages[skipped..] {
        match serde_json::from_str::<StoredMessage>(line) {
            // A session written before the cap existed is capped as it loads.
            Ok(m) => out.push(capped(&m)),
            Err(e) => {
                tracing::warn!(file = %path.display(), line = n + 1, error = %e, "skipping an unreadable session line")
            }
        }
    }
    (checkpoint, (out, skipped))
}

/// [`read_all`], decoding only the tail kept in memory.
fn read_session_file(path: &Path) -> std::io::Result<Session> {
    let Some(text) = read_lines(path)? else { return Ok(Session::default()) };
    let (checkpoint, (messages, skipped)) = scan(path, &text, CACHE_MESSAGES);
    Ok(Session { checkpoint, messages, skipped })
}

/// `m` with its content and tool-call arguments cut to [`STORED_TEXT_CAP`]
/// characters, head and tail kept. Cut arguments stay valid JSON: the model
/// reads `{"truncated": "<head> ... <tail>"}` for the call it made.
pub fn capped(m: &StoredMessage) -> StoredMessage {
    let mut m = m.clone();
    if let Some(text) = &m.message.content {
        if text.len() > STORED_TEXT_CAP {
            m.message.content = Some(crate::tools::truncate_middle(text, STORED_TEXT_CAP));
        }
    }
    for call in &mut m.message.tool_calls {
        if call.function.arguments.len() > STORED_TEXT_CAP {
            let kept = crate::tools::truncate_middle(&call.function.arguments, STORED_TEXT_CAP - 64);
            call.function.arguments = serde_json::json!({ "truncated": kept }).to_string();
        }
    }
    m
}

pub(crate) fn now_rfc3339() -> String {
    jiff::Timestamp::now().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::ToolCall;

    fn stored(m: Message) -> StoredMessage {
        StoredMessage { message: m, timestamp: now_rfc3339(), usage: None }
    }

    #[test]
    fn keys_map_to_distinct_safe_files_and_back() {
        let dir = tempfile::tempdir().unwrap();
        let s = SessionStore::new(dir.path());
        let a = s.path("telegram:42");
        let b = s.path("telegram_42");
        assert_ne!(a, b);
        assert_eq!(a.file_name().unwrap(), "telegram%3A42.jsonl");
        assert_eq!(s.path("../../etc/passwd").parent().unwrap(), dir.path().join("sessions"));
        assert_eq!(decode_key("telegram%3A42"), "telegram:42");
        assert_eq!(decode_key("%2E%2E%2Fx"), "../x");
    }

    #[test]
    fn turns_append_and_reload() {
        let dir = tempfile::tempdir().unwrap();
        let s = SessionStore::new(dir.path());
        s.append_turn("cli:direct", &[stored(Message::user("hi")), stored(Message::assistant("hello"))]).unwrap();
        s.append_turn("cli:direct", &[stored(Message::user("again")), stored(Message::assistant("sure"))]).unwrap();
        let fresh = SessionStore::new(dir.path());
        let h = fresh.history("cli:direct", 100).unwrap();
        assert_eq!(h.iter().map(|m| m.text_content()).collect::<Vec<_>>(), ["hi", "hello", "again", "sure"]);
        assert_eq!(fresh.keys(), ["cli:direct"]);
        let text = std::fs::read_to_string(s.path("cli:direct")).unwrap();
        assert!(text.starts_with("{\"_type\":\"metadata\",\"key\":\"cli:direct\""), "{text}");
        assert_eq!(text.lines().count(), 5);
    }

    #[test]
    fn history_window_never_starts_with_a_tool_result() {
        let dir = tempfile::tempdir().unwrap();
        let s = SessionStore::new(dir.path());
        s.append_turn(
            "k",
            &[
                stored(Message::user("list files")),
                stored(Message::assistant_tool_calls(None, vec![ToolCall::new("c1", "list_dir", "{}")])),
                stored(Message::tool_result("c1", "list_dir", "a.txt")),
                stored(Message::assistant("there is a.txt")),
                stored(Message::user("thanks")),
                stored(Message::assistant("welcome")),
            ],
        )
        .unwrap();
        // A window of 4 would open on the tool result: it must start at "thanks" instead.
        let h = s.history("k", 4).unwrap();
        assert_eq!(h[0].role, Role::User);
        assert_eq!(h[0].text_content(), "thanks");
        // A window of 5 would open on the assistant tool call.
        assert_eq!(s.history("k", 5).unwrap()[0].text_content(), "thanks");
        assert_eq!(s.history("k", 6).unwrap().len(), 6);
    }

    #[test]
    fn a_torn_last_line_is_skipped_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let s = SessionStore::new(dir.path());
        s.append_turn("k", &[stored(Message::user("one")), stored(Message::assistant("two"))]).unwrap();
        util::fs::append_durable(&s.path("k"), b"{\"role\":\"user\",\"conte").unwrap();
        let fresh = SessionStore::new(dir.path());
        assert_eq!(fresh.history("k", 10).unwrap().len(), 2);
        // The next turn after the power cut is kept whole, its first line included.
        fresh.append_turn("k", &[stored(Message::user("three")), stored(Message::assistant("four"))]).unwrap();
        let again = SessionStore::new(dir.path());
        let texts: Vec<String> = again.history("k", 10).unwrap().iter().map(|m| m.text_content().to_string()).collect();
        assert_eq!(texts, ["one", "two", "three", "four"]);
    }

    #[test]
    fn appends_by_another_process_are_seen() {
        let dir = tempfile::tempdir().unwrap();
        let daemon = SessionStore::new(dir.path());
        let cli = SessionStore::new(dir.path());
        daemon.append_turn("k", &[stored(Message::user("a")), stored(Message::assistant("b"))]).unwrap();
        cli.append_turn("k", &[stored(Message::user("c")), stored(Message::assistant("d"))]).unwrap();
        assert_eq!(daemon.history("k", 10).unwrap().len(), 4);
    }

    #[test]
    fn checkpoints_replace_the_prefix_and_long_files_load_their_tail() {
        let dir = tempfile::tempdir().unwrap();
        let s = SessionStore::new(dir.path());
        let turn = |i: usize| [stored(Message::user(format!("q{i}"))), stored(Message::assistant(format!("a{i}")))];
        for i in 0..150 {
            s.append_turn("k", &turn(i)).unwrap();
        }
        let fresh = SessionStore::new(dir.path());
        let loaded = fresh.load("k").unwrap();
        assert_eq!((loaded.messages.len(), loaded.skipped), (CACHE_MESSAGES, 100));
        assert_eq!(loaded.messages[0].message.text_content(), "q50");
        let all = fresh.load_all("k").unwrap();
        assert_eq!(all.messages.len(), 300);

        // Someone else's view of the prefix: refused, nothing written.
        let wrong = [stored(Message::user("not in the file"))];
        assert_eq!(fresh.replace_prefix("k", 1, &wrong, None).unwrap(), None);
        let cp = Checkpoint { summary: "earlier talk".into(), timestamp: now_rfc3339(), archived: 296 };
        let dropped = fresh.replace_prefix("k", 296, &all.messages[290..296], Some(cp.clone())).unwrap().unwrap();
        assert_eq!(dropped.len(), 296);
        s.append_turn("k", &turn(150)).unwrap();
        let again = SessionStore::new(dir.path()).load("k").unwrap();
        assert_eq!(again.checkpoint, Some(cp));
        let texts: Vec<&str> = again.messages.iter().map(|m| m.message.text_content()).collect();
        assert_eq!(texts, ["q148", "a148", "q149", "a149", "q150", "a150"]);
        let h = s.history("k", 4).unwrap();
        assert!(h[0].text_content().starts_with("[Summary of the earlier conversation (296 messages"), "{h:?}");
        assert_eq!(h.len(), 5);
    }

    #[test]
    fn nanobot_style_lines_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let s = SessionStore::new(dir.path());
        std::fs::create_dir_all(dir.path().join("sessions")).unwrap();
        std::fs::write(
            s.path("x"),
            concat!(
                "{\"_type\":\"metadata\",\"key\":\"x\",\"created_at\":\"2026-01-01T00:00:00\",\"metadata\":{}}\n",
                "{\"role\":\"user\",\"content\":\"hi\",\"timestamp\":\"2026-01-01T00:00:01\"}\n",
                "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"a\",\"type\":\"function\",\"function\":{\"name\":\"exec\",\"arguments\":\"{}\"}}],\"timestamp\":\"t\",\"tools_used\":[\"exec\"]}\n",
            ),
        )
        .unwrap();
        let h = s.history("x", 10).unwrap();
        assert_eq!(h.len(), 2);
        assert_eq!(h[1].tool_calls[0].function.name, "exec");
    }
}
