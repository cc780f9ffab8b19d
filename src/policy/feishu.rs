//! Feishu / Lark: who is served, and which chats a turn may post to.
//!
//! An `open_id` (`ou_…`) is an identity the platform vouches for (it is per
//! app: the same person has another open_id under another app), so `[feishu]
//! allow_from` is a plain list, no pins. A chat (`oc_…`) is allowed as a
//! target when it is one of `[feishu] chats`, or a chat an allowed user wrote
//! to the bot in: the channel records those in `<state>/feishu-chats.json`
//! (this module owns the file's format; the channel writes it, the tools only
//! read it). A model turn therefore cannot post to an arbitrary chat, nor to
//! a group a stranger added the bot to. Users paired with `bramble pair
//! --channel feishu` ([`super::pairing`]) are served like `allow_from`'s.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::pairing::{PairChannel, PairedCache};

/// The file name in the state directory.
pub const CHATS_FILE: &str = "feishu-chats.json";

/// `<state>/feishu-chats.json`: chat id → the allowed user who wrote there first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Chats {
    pub chats: BTreeMap<String, String>,
}

impl Chats {
    /// Read it; a missing or unreadable file is no chats (logged when unreadable).
    pub fn load(state_dir: &Path) -> Chats {
        let path = state_dir.join(CHATS_FILE);
        let Ok(text) = std::fs::read_to_string(&path) else { return Chats::default() };
        serde_json::from_str(&text).unwrap_or_else(|e| {
            tracing::warn!(file = %path.display(), error = %e, "unreadable list of Feishu chats; starting afresh");
            Chats::default()
        })
    }

    /// Write it (atomic replace, 0600).
    pub fn save(&self, state_dir: &Path) -> std::io::Result<()> {
        let data = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        crate::util::fs::write_atomic(&state_dir.join(CHATS_FILE), &data)
    }
}

/// `[feishu] allow_from` and `chats`, and the chats allowed users wrote in.
#[derive(Debug, Clone, Default)]
pub struct FeishuPolicy {
    users: Vec<String>,
    chats: Vec<String>,
    state_dir: PathBuf,
    paired: Option<PairedCache>,
}

impl FeishuPolicy {
    pub fn new(allow_from: &[String], chats: &[String], state_dir: &Path) -> FeishuPolicy {
        let clean = |v: &[String]| v.iter().map(|u| u.trim().to_string()).filter(|u| !u.is_empty()).collect();
        let paired = Some(PairedCache::new(state_dir, PairChannel::Feishu));
        FeishuPolicy { users: clean(allow_from), chats: clean(chats), state_dir: state_dir.to_path_buf(), paired }
    }

    /// Whether `open_id` is served: in `allow_from` or paired (as of the
    /// last [`FeishuPolicy::refresh`]). Exact, as ids are.
    pub fn allows(&self, open_id: &str) -> bool {
        self.users.iter().any(|u| u == open_id) || self.paired.as_ref().is_some_and(|p| p.contains(open_id))
    }

    /// Whether `open_id` is served now (the paired list read again if it changed). Blocking.
    pub fn allows_now(&self, open_id: &str) -> bool {
        self.refresh();
        self.allows(open_id)
    }

    /// Read the paired users again if `bramble pair` changed them. Blocking (one `stat`).
    pub fn refresh(&self) {
        if let Some(p) = &self.paired {
            p.refresh();
        }
    }

    /// Serve `open_id`, just paired, at once.
    pub fn add_paired(&self, open_id: &str) {
        if let Some(p) = &self.paired {
            p.add(open_id);
        }
    }

    /// Whether a turn may post to `chat`: a configured chat, or one an
    /// allowed user wrote in. Blocking (reads the chats file): call it off
    /// the runtime thread.
    pub fn chat_allowed(&self, chat: &str) -> bool {
        if self.chats.iter().any(|c| c == chat) {
            return true;
        }
        self.refresh();
        Chats::load(&self.state_dir).chats.get(chat).is_some_and(|by| self.allows(by))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chats_are_allowed_by_config_or_an_allowed_writer() {
        let dir = tempfile::tempdir().unwrap();
        let p = FeishuPolicy::new(&["ou_owner".into()], &["oc_team".into()], dir.path());
        assert!(p.allows("ou_owner") && !p.allows("ou_Owner") && !p.allows("ou_mallory"));
        assert!(p.chat_allowed("oc_team") && !p.chat_allowed("oc_dm"));
        let mut chats = Chats::default();
        chats.chats.insert("oc_dm".into(), "ou_owner".into());
        chats.chats.insert("oc_old".into(), "ou_former".into());
        chats.save(dir.path()).unwrap();
        assert!(p.chat_allowed("oc_dm"));
        assert!(!p.chat_allowed("oc_old"), "recorded for someone no longer in allow_from");
        std::fs::write(dir.path().join(CHATS_FILE), "garbage").unwrap();
        assert!(!p.chat_allowed("oc_dm") && p.chat_allowed("oc_team"));
    }
}
