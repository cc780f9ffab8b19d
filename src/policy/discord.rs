//! Discord: who is served, and which channels a turn may post to.
//!
//! A Discord user id is an identity (Discord vouches for the author of a
//! gateway event; nobody else can write as them), so `[discord] allow_from`
//! is a plain list of ids, no pins. A channel is allowed as a target when it
//! is one of `[discord] channels` (guild channels the owner named), or the
//! DM channel of an allowed user: the channel records those in
//! `<state>/discord-dms.json` when such a user writes (this module owns the
//! file's format; the channel writes it, the tools only read it). A model
//! turn therefore cannot post to an arbitrary channel, nor to a stranger's DM.
//! Users paired with `bramble pair --channel discord` (`discord-paired.json`,
//! [`super::pairing`]) are served like `allow_from`'s until revoked.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::pairing::{PairChannel, PairedCache};

/// The file name in the state directory.
pub const DMS_FILE: &str = "discord-dms.json";
/// DM channels remembered at most (one per allowed user, in practice).
const MAX_DMS: usize = 1024;

/// `<state>/discord-dms.json`: DM channel id → the allowed user it is with.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Dms {
    pub dms: BTreeMap<String, String>,
}

impl Dms {
    /// Read it; a missing or unreadable file is none (logged when unreadable).
    pub fn load(state_dir: &Path) -> Dms {
        let path = state_dir.join(DMS_FILE);
        let Ok(text) = std::fs::read_to_string(&path) else { return Dms::default() };
        serde_json::from_str(&text).unwrap_or_else(|e| {
            tracing::warn!(file = %path.display(), error = %e, "unreadable list of Discord DMs; starting afresh");
            Dms::default()
        })
    }

    /// Record `channel` as `user`'s DM; `true` when that is new (then [`Dms::save`]).
    pub fn record(&mut self, channel: u64, user: u64) -> bool {
        if self.dms.len() >= MAX_DMS && !self.dms.contains_key(&channel.to_string()) {
            return false;
        }
        self.dms.insert(channel.to_string(), user.to_string()).as_deref() != Some(&user.to_string())
    }

    /// Write it (atomic replace, 0600).
    pub fn save(&self, state_dir: &Path) -> std::io::Result<()> {
        let data = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        crate::util::fs::write_atomic(&state_dir.join(DMS_FILE), &data)
    }
}

/// `[discord] allow_from` and `channels`, and the DMs of allowed users.
#[derive(Debug, Clone, Default)]
pub struct DiscordPolicy {
    users: Vec<u64>,
    channels: Vec<u64>,
    state_dir: PathBuf,
    paired: Option<PairedCache>,
}

impl DiscordPolicy {
    pub fn new(users: Vec<u64>, channels: Vec<u64>, state_dir: &Path) -> DiscordPolicy {
        let paired = Some(PairedCache::new(state_dir, PairChannel::Discord));
        DiscordPolicy { users, channels, state_dir: state_dir.to_path_buf(), paired }
    }

    /// Whether `user` is served: in `allow_from`, or paired (as of the last [`DiscordPolicy::refresh`]).
    pub fn allows(&self, user: u64) -> bool {
        self.users.contains(&user) || self.paired.as_ref().is_some_and(|p| p.contains(&user.to_string()))
    }

    /// Whether `user` is served now (the paired list read again if it changed). Blocking.
    pub fn allows_now(&self, user: u64) -> bool {
        self.refresh();
        self.allows(user)
    }

    /// Read the paired users again if `bramble pair` changed them. Blocking (one `stat`).
    pub fn refresh(&self) {
        if let Some(p) = &self.paired {
            p.refresh();
        }
    }

    /// Serve `user`, just paired, at once.
    pub fn add_paired(&self, user: u64) {
        if let Some(p) = &self.paired {
            p.add(&user.to_string());
        }
    }

    /// Whether messages in guild channel `channel` are read.
    pub fn listens_in(&self, channel: u64) -> bool {
        self.channels.contains(&channel)
    }

    /// Whether a turn may post to `channel`: a configured guild channel, or
    /// the DM of a user still in `allow_from`. Blocking (reads the DMs file):
    /// call it off the runtime thread.
    pub fn channel_allowed(&self, channel: u64) -> bool {
        if self.listens_in(channel) {
            return true;
        }
        self.refresh();
        let dms = Dms::load(&self.state_dir);
        dms.dms.get(&channel.to_string()).and_then(|u| u.parse().ok()).is_some_and(|u| self.allows(u))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_are_allowed_by_config_or_an_allowed_users_dm() {
        let dir = tempfile::tempdir().unwrap();
        let p = DiscordPolicy::new(vec![7], vec![100], dir.path());
        assert!(p.allows(7) && !p.allows(8));
        assert!(p.channel_allowed(100) && !p.channel_allowed(200));
        let mut dms = Dms::default();
        assert!(dms.record(200, 7) && !dms.record(200, 7), "recorded once");
        assert!(dms.record(300, 8));
        dms.save(dir.path()).unwrap();
        assert!(p.channel_allowed(200));
        assert!(!p.channel_allowed(300), "the DM of someone not in allow_from");
        std::fs::write(dir.path().join(DMS_FILE), "garbage").unwrap();
        assert!(!p.channel_allowed(200) && p.channel_allowed(100));
    }
}
