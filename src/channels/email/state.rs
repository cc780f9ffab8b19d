//! What the email channel keeps across a restart, in the state directory:
//!
//! - `email-imap.json`: the folder's UIDVALIDITY and the highest UID
//!   handled. With `\Seen` on the server it is the second guard against
//!   handling a mail twice (a search asks for unseen mail above the mark);
//!   written (atomic replace) only when it changes. A new UIDVALIDITY (the
//!   folder was re-created) starts the mark again from zero.
//! - `email-threads.json`: per sender, the last mail of theirs that was
//!   served (its `Message-ID`, `References` and subject), so an answer goes
//!   into that thread (`In-Reply-To`, `References`, `Re:`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

const MARK_FILE: &str = "email-imap.json";
const THREADS_FILE: &str = "email-threads.json";
/// References kept per thread (the root and the most recent ones).
const MAX_REFERENCES: usize = 12;
/// Senders whose thread is remembered.
const MAX_THREADS: usize = 256;

/// The high-water mark.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    pub uid_validity: u32,
    pub last_uid: u32,
}

/// `email-imap.json`.
#[derive(Debug, Clone)]
pub struct MarkFile {
    path: PathBuf,
}

impl MarkFile {
    pub fn new(state_dir: &Path) -> MarkFile {
        MarkFile { path: state_dir.join(MARK_FILE) }
    }

    /// The saved mark (zero when there is none or it cannot be read).
    pub fn load(&self) -> Mark {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                tracing::warn!(file = %self.path.display(), error = %e, "unreadable IMAP mark; unseen mail is read again");
                Mark::default()
            }),
            Err(_) => Mark::default(),
        }
    }

    pub fn save(&self, mark: Mark) -> std::io::Result<()> {
        let json = serde_json::to_vec(&mark).map_err(std::io::Error::other)?;
        crate::util::fs::write_atomic(&self.path, &json)
    }
}

/// The last served mail of one sender: what an answer threads on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Thread {
    /// `<…>`
    pub message_id: String,
    /// The thread, oldest first, each `<…>`, the mail's own id last.
    pub references: Vec<String>,
    pub subject: String,
}

impl Thread {
    /// The thread of a mail with `message_id`, its `references` (`<…>` each) and `subject`.
    pub fn of(message_id: &str, mut references: Vec<String>, subject: &str) -> Thread {
        let id = bracket(message_id);
        references.retain(|r| r != &id);
        references.push(id.clone());
        if references.len() > MAX_REFERENCES {
            let cut = references.len() - MAX_REFERENCES;
            references.drain(1..1 + cut);
        }
        Thread { message_id: id, references, subject: subject.to_string() }
    }

    /// The first of the thread: what names its session.
    pub fn root(&self) -> &str {
        self.references.first().map(String::as_str).unwrap_or(&self.message_id)
    }

    /// `Re: <subject>` (no second `Re:`).
    pub fn reply_subject(&self) -> String {
        let s = self.subject.trim();
        if s.get(..3).is_some_and(|p| p.eq_ignore_ascii_case("re:")) {
            s.to_string()
        } else if s.is_empty() {
            "Re: your message".into()
        } else {
            format!("Re: {s}")
        }
    }
}

/// `<id>` whether or not it came with its brackets.
pub fn bracket(id: &str) -> String {
    format!("<{}>", id.trim().trim_start_matches('<').trim_end_matches('>'))
}

/// `email-threads.json`: sender (lower case) → their last thread.
#[derive(Debug, Clone)]
pub struct Threads {
    path: PathBuf,
}

impl Threads {
    pub fn new(state_dir: &Path) -> Threads {
        Threads { path: state_dir.join(THREADS_FILE) }
    }

    fn load(&self) -> BTreeMap<String, Thread> {
        std::fs::read(&self.path).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default()
    }

    /// The thread an answer to `sender` goes into. Blocking (reads a file).
    pub fn get(&self, sender: &str) -> Option<Thread> {
        self.load().remove(&sender.to_ascii_lowercase())
    }

    /// Remember `thread` as `sender`'s latest. Blocking.
    pub fn set(&self, sender: &str, thread: Thread) -> std::io::Result<()> {
        let mut all = self.load();
        if all.get(sender) == Some(&thread) {
            return Ok(());
        }
        if all.len() >= MAX_THREADS && !all.contains_key(sender) {
            all.clear();
        }
        all.insert(sender.to_ascii_lowercase(), thread);
        let json = serde_json::to_vec(&all).map_err(std::io::Error::other)?;
        crate::util::fs::write_atomic(&self.path, &json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_keeps_its_root_and_its_newest() {
        let refs: Vec<String> = (0..20).map(|i| format!("<m{i}@x>")).collect();
        let t = Thread::of("m20@x", refs, "Re: lights");
        assert_eq!(t.references.len(), MAX_REFERENCES);
        assert_eq!(t.root(), "<m0@x>");
        assert_eq!(t.references.last().unwrap(), "<m20@x>");
        assert_eq!(t.reply_subject(), "Re: lights");
        assert_eq!(Thread::of("<a@x>", Vec::new(), "lights").reply_subject(), "Re: lights");
    }

    #[test]
    fn the_mark_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let f = MarkFile::new(dir.path());
        assert_eq!(f.load(), Mark::default());
        f.save(Mark { uid_validity: 7, last_uid: 42 }).unwrap();
        assert_eq!(MarkFile::new(dir.path()).load(), Mark { uid_validity: 7, last_uid: 42 });
        let t = Threads::new(dir.path());
        t.set("me@example.org", Thread::of("<a@x>", Vec::new(), "hi")).unwrap();
        assert_eq!(t.get("ME@example.org").unwrap().message_id, "<a@x>");
    }
}
