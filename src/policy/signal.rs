//! Signal: who is served, and which chats a turn may send to.
//!
//! signal-cli reports a sender by its account uuid (ACI, `sourceUuid`) and,
//! when the sender shares it, its number (`sourceNumber`). The uuid is the
//! identity; a number can change hands. So `[signal] allow_from` takes
//! either: a uuid is matched exactly; a number is pinned to the uuid first
//! seen with it (`<state>/signal-pins.json`, owned by this module, written
//! by the channel), and an envelope with that number and another uuid is
//! refused as spoofed (a re-registered number: the owner deletes the pin).
//! A chat a turn may send to is an allowed number or uuid (a pinned uuid
//! included), or a group of `[signal] groups`. Accounts paired with `bramble
//! pair --channel signal` ([`super::pairing`]) are served by uuid only, like
//! a listed uuid: their number alone never is.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::pairing::{PairChannel, PairedCache};

/// The pins file in the state directory.
pub const PINS_FILE: &str = "signal-pins.json";

/// What the policy says of an envelope's sender.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Served, as this id (the uuid, or the number where no uuid came).
    Allowed(String),
    /// Not in `allow_from`.
    Stranger,
    /// An allowed number with another uuid than the one pinned to it.
    Spoofed { number: String, pinned: String, uuid: String },
}

/// `[signal] allow_from` and `groups`, and the pins.
#[derive(Debug, Clone, Default)]
pub struct SignalPolicy {
    numbers: Vec<String>,
    uuids: Vec<String>,
    groups: Vec<String>,
    state_dir: PathBuf,
    paired: Option<PairedCache>,
}

impl SignalPolicy {
    pub fn new(allow_from: &[String], groups: &[String], state_dir: &Path) -> SignalPolicy {
        let entries = allow_from.iter().map(|e| e.trim().to_ascii_lowercase());
        let (numbers, uuids) = entries.filter(|e| !e.is_empty()).partition(|e| e.starts_with('+'));
        SignalPolicy {
            numbers,
            uuids,
            groups: groups.iter().map(|g| g.trim().to_string()).collect(),
            state_dir: state_dir.to_path_buf(),
            paired: Some(PairedCache::new(state_dir, PairChannel::Signal)),
        }
    }

    /// Whether `uuid` (lower case) was paired; the list is read again if it changed. Blocking.
    fn paired_now(&self, uuid: &str) -> bool {
        self.paired.as_ref().is_some_and(|p| {
            p.refresh();
            p.contains(uuid)
        })
    }

    /// Serve `uuid`, just paired, at once.
    pub fn add_paired(&self, uuid: &str) {
        if let Some(p) = &self.paired {
            p.add(&uuid.to_ascii_lowercase());
        }
    }

    /// The uuid `number` is pinned to, if it is (a number of `allow_from`, or one that was). Blocking.
    pub fn pinned(&self, number: &str) -> Option<String> {
        Pins::load(&self.state_dir).0.get(number).cloned()
    }

    /// Whether anybody is served.
    pub fn is_empty(&self) -> bool {
        self.numbers.is_empty() && self.uuids.is_empty()
    }

    /// Whether `group` (base64 id) is one of `[signal] groups`.
    pub fn group_allowed(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }

    /// The sender of an envelope. Blocking (reads, and on a first message
    /// writes, the pins): call it off the runtime thread.
    pub fn check(&self, number: Option<&str>, uuid: Option<&str>) -> Verdict {
        let uuid = uuid.map(str::to_ascii_lowercase).filter(|u| !u.is_empty());
        let number = number.filter(|n| !n.is_empty());
        let listed_number = number.filter(|n| self.numbers.iter().any(|a| a == n));
        let mut pins = Pins::load(&self.state_dir);
        if let (Some(n), Some(u)) = (listed_number, uuid.as_deref()) {
            match pins.0.get(n) {
                Some(p) if p != u => {
                    return Verdict::Spoofed { number: n.to_string(), pinned: p.clone(), uuid: u.to_string() }
                }
                Some(_) => return Verdict::Allowed(u.to_string()),
                None => {
                    pins.0.insert(n.to_string(), u.to_string());
                    if let Err(e) = pins.save(&self.state_dir) {
                        tracing::error!(error = %e, "cannot pin a Signal number to its uuid");
                    }
                    tracing::info!(number = n, uuid = u, "a Signal number of allow_from is pinned to its account uuid");
                    return Verdict::Allowed(u.to_string());
                }
            }
        }
        match (uuid, listed_number) {
            (Some(u), _) if self.uuids.contains(&u) || self.pinned_listed(&pins, &u) || self.paired_now(&u) => {
                Verdict::Allowed(u)
            }
            // A number without a uuid (an old signal-cli): served as the number, unpinned.
            (None, Some(n)) if !pins.0.contains_key(n) => Verdict::Allowed(n.to_string()),
            _ => Verdict::Stranger,
        }
    }

    /// Whether `uuid` is pinned to a number still in `allow_from`.
    fn pinned_listed(&self, pins: &Pins, uuid: &str) -> bool {
        pins.0.iter().any(|(n, u)| u == uuid && self.numbers.contains(n))
    }

    /// Whether `id` (a principal: uuid or number) is still served. Blocking.
    pub fn allows(&self, id: &str) -> bool {
        let id = id.to_ascii_lowercase();
        if self.uuids.contains(&id) || self.numbers.contains(&id) || self.paired_now(&id) {
            return true;
        }
        self.pinned_listed(&Pins::load(&self.state_dir), &id)
    }

    /// Whether a turn may send to `chat` (`+number`, uuid or `group.<id>`). Blocking.
    pub fn chat_allowed(&self, chat: &str) -> bool {
        match chat.strip_prefix("group.") {
            Some(g) => self.group_allowed(g),
            None => self.allows(chat),
        }
    }
}

/// `<state>/signal-pins.json`: number → uuid.
#[derive(Debug, Default)]
struct Pins(BTreeMap<String, String>);

impl Pins {
    fn load(state_dir: &Path) -> Pins {
        let Ok(text) = std::fs::read_to_string(state_dir.join(PINS_FILE)) else { return Pins::default() };
        Pins(serde_json::from_str(&text).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "unreadable {PINS_FILE}: no Signal number is pinned until it is fixed");
            BTreeMap::new()
        }))
    }

    fn save(&self, state_dir: &Path) -> std::io::Result<()> {
        let data = serde_json::to_vec_pretty(&self.0).map_err(std::io::Error::other)?;
        crate::util::fs::write_atomic(&state_dir.join(PINS_FILE), &data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANN: &str = "7ccae375-cd51-4c82-8b1e-7be3280aa485";
    const EVE: &str = "0b0e6f5a-3c1d-4e2f-9a8b-7c6d5e4f3a2b";

    #[test]
    fn a_number_is_pinned_to_its_first_uuid_and_a_second_uuid_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = SignalPolicy::new(&["+4915100000001".into()], &[], dir.path());
        assert_eq!(p.check(Some("+4915100000001"), Some(ANN)), Verdict::Allowed(ANN.into()));
        assert!(matches!(p.check(Some("+4915100000001"), Some(EVE)), Verdict::Spoofed { .. }));
        assert_eq!(p.check(None, Some(ANN)), Verdict::Allowed(ANN.into()), "the pinned uuid without its number");
        assert_eq!(p.check(None, Some(EVE)), Verdict::Stranger);
        assert_eq!(p.check(Some("+4915100000009"), Some(EVE)), Verdict::Stranger);
        assert_eq!(p.check(Some("+4915100000001"), None), Verdict::Stranger, "pinned: a uuid is needed");
        assert!(p.allows(ANN) && p.chat_allowed(ANN) && p.chat_allowed("+4915100000001"));
        assert!(!p.allows(EVE) && !p.chat_allowed("group.abc"));
        // Out of allow_from: the pin no longer serves.
        let q = SignalPolicy::new(&[], &[], dir.path());
        assert_eq!(q.check(None, Some(ANN)), Verdict::Stranger);
        assert!(!q.allows(ANN));
    }

    #[test]
    fn a_listed_uuid_is_matched_exactly_and_groups_by_id() {
        let dir = tempfile::tempdir().unwrap();
        let p = SignalPolicy::new(&[ANN.to_uppercase()], &["R2lk".into()], dir.path());
        assert_eq!(p.check(Some("+4915100000002"), Some(ANN)), Verdict::Allowed(ANN.into()));
        assert!(p.chat_allowed("group.R2lk") && !p.chat_allowed("group.R2lr"));
    }
}
