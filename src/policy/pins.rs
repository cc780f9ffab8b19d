//! `allow_from` usernames, pinned to the user id that first used them.
//!
//! A Telegram username is not an identity: its holder can drop it and anyone
//! can claim it afterwards. `allow_from = ["@alice"]` therefore serves the
//! *first* user seen with that name and no one else: on first contact the
//! name is pinned to that user's numeric id, written to
//! `<state>/telegram-pins.json` (atomic replace), and from then on only that id
//! is served for the entry. Someone else presenting `@alice` later is ignored
//! and logged. Numeric ids in `allow_from` need no pin. To re-pin a name (the
//! owner's account changed), delete its line from the file, or put the id in
//! `allow_from` instead.
//!
//! The same file tells the tools which chats a username entry stands for: a
//! message or a job may only go to an `allow_from` user's chat, and an unpinned
//! name stands for no chat at all (see [`AllowedChats`]).

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

/// The file name in the state directory.
pub const PINS_FILE: &str = "telegram-pins.json";

/// What [`Allow::check`] decided about a user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Served: a numeric entry, or a name already pinned to this id.
    Allowed,
    /// Served, and `name` was pinned to this id just now (save the pins).
    Pinned(String),
    /// Presents a listed name that is pinned to another id.
    NameTaken { name: String, pinned: i64 },
    /// Not in `allow_from` at all.
    Stranger,
}

/// Who may talk to the bot: `allow_from` plus the pins.
#[derive(Debug, Clone, Default)]
pub struct Allow {
    ids: HashSet<i64>,
    /// Lower-case, without `@`.
    names: HashSet<String>,
    /// Name (lower-case, without `@`) → the id it was first seen with.
    pins: BTreeMap<String, i64>,
    /// Users added by pairing (`telegram-paired.json`).
    paired: HashSet<i64>,
}

impl Allow {
    /// From `allow_from`: numeric ids, `@username` or `username`. No pins yet.
    pub fn new(entries: &[String]) -> Allow {
        let mut allow = Allow::default();
        for e in entries {
            let e = e.trim();
            match e.parse::<i64>() {
                Ok(id) => {
                    allow.ids.insert(id);
                }
                Err(_) => {
                    let name = e.trim_start_matches('@').to_ascii_lowercase();
                    if !name.is_empty() {
                        allow.names.insert(name);
                    }
                }
            }
        }
        allow
    }

    /// With the pins saved in `state_dir` (only those of names still listed).
    pub fn with_pins(mut self, state_dir: &Path) -> Allow {
        let names = &self.names;
        self.pins = load_pins(state_dir).into_iter().filter(|(n, _)| names.contains(n)).collect();
        self
    }

    /// With the users paired in `state_dir` (`bramble pair`).
    pub fn with_paired(mut self, state_dir: &Path) -> Allow {
        self.paired = super::pairing::paired_ids(state_dir);
        self
    }

    /// Replace the paired users (the list was read again).
    pub fn set_paired(&mut self, ids: HashSet<i64>) {
        self.paired = ids;
    }

    /// Add a user just paired.
    pub fn add_paired(&mut self, id: i64) {
        self.paired.insert(id);
    }

    /// Decide about the user `id` (with `username`, if they have one),
    /// pinning a listed name on its first contact.
    pub fn check(&mut self, id: i64, username: Option<&str>) -> Verdict {
        if self.ids.contains(&id) || self.paired.contains(&id) {
            return Verdict::Allowed;
        }
        let Some(name) = username.map(str::to_ascii_lowercase) else {
            return Verdict::Stranger;
        };
        if !self.names.contains(&name) {
            return Verdict::Stranger;
        }
        match self.pins.get(&name) {
            Some(&pinned) if pinned == id => Verdict::Allowed,
            Some(&pinned) => Verdict::NameTaken { name, pinned },
            None => {
                self.pins.insert(name.clone(), id);
                Verdict::Pinned(name)
            }
        }
    }

    /// Whether the user would be served, without pinning anything.
    pub fn allows(&self, id: i64, username: Option<&str>) -> bool {
        let mut probe = self.clone();
        matches!(probe.check(id, username), Verdict::Allowed | Verdict::Pinned(_))
    }

    /// The pins, for saving.
    pub fn pins(&self) -> &BTreeMap<String, i64> {
        &self.pins
    }
}

fn pins_path(state_dir: &Path) -> PathBuf {
    state_dir.join(PINS_FILE)
}

/// The saved pins; a missing or unreadable file is no pins (logged when unreadable).
pub fn load_pins(state_dir: &Path) -> BTreeMap<String, i64> {
    let path = pins_path(state_dir);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return BTreeMap::new(),
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "cannot read the Telegram username pins");
            return BTreeMap::new();
        }
    };
    serde_json::from_str(&text).unwrap_or_else(|e| {
        tracing::warn!(file = %path.display(), error = %e, "unreadable Telegram username pins; no name is pinned");
        BTreeMap::new()
    })
}

/// Write the pins (atomic replace). Blocking: call it off the runtime thread.
pub fn save_pins(state_dir: &Path, pins: &BTreeMap<String, i64>) -> std::io::Result<()> {
    let data = serde_json::to_vec_pretty(pins).map_err(std::io::Error::other)?;
    crate::util::fs::write_atomic(&pins_path(state_dir), &data)
}

/// For `bramble status` and `check`: how each `allow_from` username stands
/// (`@alice pinned to id 123`, `@bob not pinned yet`); `None` without usernames.
pub fn pins_summary(allow_from: &[String], state_dir: &Path) -> Option<String> {
    let allow = Allow::new(allow_from).with_pins(state_dir);
    if allow.names.is_empty() {
        return None;
    }
    let mut names: Vec<&String> = allow.names.iter().collect();
    names.sort();
    let parts: Vec<String> = names
        .into_iter()
        .map(|n| match allow.pins.get(n) {
            Some(id) => format!("@{n} pinned to id {id}"),
            None => format!("@{n} not pinned yet (the first user to write as @{n} will be)"),
        })
        .collect();
    Some(parts.join(", "))
}

/// The Telegram chats a turn may send to: the private chats of the
/// `allow_from` users, i.e. the numeric ids, the ids the listed usernames
/// are pinned to, and the paired users' ids. Read fresh on each check (the poller pins names while the
/// daemon runs); the read is blocking, so call [`AllowedChats::contains`] off
/// the runtime thread.
#[derive(Debug, Clone)]
pub struct AllowedChats {
    allow: Allow,
    state_dir: PathBuf,
    /// `[email] allow_from`, lower case: the addresses a turn may mail.
    email: Vec<String>,
    /// `[matrix]`'s users and rooms (empty: no Matrix room is allowed).
    matrix: super::matrix::MatrixPolicy,
    /// `[signal]`'s people and groups (empty: no Signal chat is allowed).
    signal: super::signal::SignalPolicy,
    /// `[feishu]`'s users and chats (empty: no Feishu chat is allowed).
    feishu: super::feishu::FeishuPolicy,
    /// `[discord]`'s users and channels (empty: no Discord channel is allowed).
    discord: super::discord::DiscordPolicy,
}

impl AllowedChats {
    pub fn new(allow_from: &[String], state_dir: &Path) -> AllowedChats {
        AllowedChats {
            allow: Allow::new(allow_from),
            state_dir: state_dir.to_path_buf(),
            email: Vec::new(),
            matrix: Default::default(),
            signal: Default::default(),
            feishu: Default::default(),
            discord: Default::default(),
        }
    }

    /// The addresses of `[email] allow_from`: the only ones a turn may mail.
    pub fn with_email(mut self, allow_from: impl IntoIterator<Item = String>) -> AllowedChats {
        self.email = allow_from.into_iter().map(|a| a.to_ascii_lowercase()).collect();
        self
    }

    /// Whether `address` is in `[email] allow_from` or paired (`bramble pair
    /// --channel email`). Blocking (reads the paired list).
    pub fn allows_email(&self, address: &str) -> bool {
        self.email.iter().any(|a| a.eq_ignore_ascii_case(address))
            || super::pairing::paired_names(&self.state_dir, super::pairing::PairChannel::Email)
                .contains(&address.to_ascii_lowercase())
    }

    /// With `[matrix]`'s users and rooms.
    pub fn with_matrix(self, matrix: super::matrix::MatrixPolicy) -> AllowedChats {
        AllowedChats { matrix, ..self }
    }

    /// With `[discord]`'s users and channels.
    pub fn with_discord(self, discord: super::discord::DiscordPolicy) -> AllowedChats {
        AllowedChats { discord, ..self }
    }

    /// The Discord users served and channels allowed.
    pub fn discord(&self) -> &super::discord::DiscordPolicy {
        &self.discord
    }

    /// The Matrix users served and rooms allowed.
    pub fn matrix(&self) -> &super::matrix::MatrixPolicy {
        &self.matrix
    }

    /// With `[signal]`'s people and groups.
    pub fn with_signal(self, signal: super::signal::SignalPolicy) -> AllowedChats {
        AllowedChats { signal, ..self }
    }

    /// The Signal people served and groups allowed.
    pub fn signal(&self) -> &super::signal::SignalPolicy {
        &self.signal
    }

    /// With `[feishu]`'s users and chats.
    pub fn with_feishu(self, feishu: super::feishu::FeishuPolicy) -> AllowedChats {
        AllowedChats { feishu, ..self }
    }

    /// The Feishu / Lark users served and chats allowed.
    pub fn feishu(&self) -> &super::feishu::FeishuPolicy {
        &self.feishu
    }

    /// Whether `chat` (as written in a `telegram:<chat>` target) is an allowed user's chat.
    pub fn contains(&self, chat: &str) -> bool {
        let Ok(id) = chat.trim().parse::<i64>() else { return false };
        if self.allow.ids.contains(&id) || super::pairing::paired_ids(&self.state_dir).contains(&id) {
            return true;
        }
        if self.allow.names.is_empty() {
            return false;
        }
        self.allow.clone().with_pins(&self.state_dir).pins.values().any(|&p| p == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_pinned_to_its_first_user() {
        let dir = tempfile::tempdir().unwrap();
        let mut allow = Allow::new(&["@Alice".into(), "7".into()]).with_pins(dir.path());
        assert_eq!(allow.check(7, None), Verdict::Allowed);
        assert_eq!(allow.check(1, Some("alice")), Verdict::Pinned("alice".into()));
        assert_eq!(allow.check(1, Some("ALICE")), Verdict::Allowed);
        assert_eq!(allow.check(2, Some("alice")), Verdict::NameTaken { name: "alice".into(), pinned: 1 });
        assert_eq!(allow.check(3, Some("mallory")), Verdict::Stranger);
        save_pins(dir.path(), allow.pins()).unwrap();
        // After a restart the pin holds.
        let mut again = Allow::new(&["@alice".into()]).with_pins(dir.path());
        assert!(!again.allows(2, Some("alice")));
        assert_eq!(again.check(1, Some("alice")), Verdict::Allowed);
        // The chats a message may go to: ids and pinned names; not the impostor, not text.
        let chats = AllowedChats::new(&["@alice".into(), "7".into()], dir.path());
        assert!(chats.contains("7") && chats.contains("1"));
        assert!(!chats.contains("2") && !chats.contains("@alice") && !chats.contains("-100"));
        assert_eq!(
            pins_summary(&["@alice".into(), "@bob".into(), "7".into()], dir.path()).unwrap(),
            "@alice pinned to id 1, @bob not pinned yet (the first user to write as @bob will be)"
        );
        assert_eq!(pins_summary(&["7".into()], dir.path()), None);
        // A pin for a name no longer listed is dropped.
        assert!(Allow::new(&["@bob".into()]).with_pins(dir.path()).pins().is_empty());
    }

    #[test]
    fn garbage_pins_pin_nothing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(PINS_FILE), "not json").unwrap();
        let mut allow = Allow::new(&["@alice".into()]).with_pins(dir.path());
        assert!(allow.pins().is_empty());
        assert_eq!(allow.check(5, Some("alice")), Verdict::Pinned("alice".into()));
    }
}
