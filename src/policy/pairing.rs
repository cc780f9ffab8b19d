//! Pairing: adding a Telegram user without editing the config and restarting.
//!
//! `bramble pair` (as the service: `sudo bramble pair`) writes a one-time code
//! into the state directory, valid for [`CODE_TTL`]; the new user sends
//! `/pair <code>` to the bot; the poller redeems it and adds their id to
//! `telegram-paired.json`. The config's `allow_from` still works and is
//! checked first; pairing only adds. `bramble pair --list` / `--revoke <id>`
//! read and change the list; the running daemon sees a change at the next
//! message (the file's modification time).
//!
//! A code is 8 characters from a 32-letter alphabet (40 bits, from
//! `/dev/urandom`), used once, and void after [`MAX_FAILURES`] wrong tries
//! (the poller also answers one try per user per [`TRY_GAP`]); every try is
//! logged. The files live in the private state directory, so the code can be
//! kept as it is. The code survives a restart of the daemon in between.
//! A lock file serialises the daemon's redeeming with the CLI's writing.

use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// The paired users, in the state directory.
pub const PAIRED_FILE: &str = "telegram-paired.json";
/// The pending code, in the state directory.
pub const CODE_FILE: &str = "telegram-pair-code.json";
const LOCK_FILE: &str = "telegram-pair.lock";
/// How long a code is valid.
pub const CODE_TTL: Duration = Duration::from_secs(10 * 60);
/// Wrong tries after which a code is void.
pub const MAX_FAILURES: u32 = 5;
/// One try per user this often (the poller's rate limit).
pub const TRY_GAP: Duration = Duration::from_secs(5);
/// The code's alphabet: no 0/O, 1/I/L confusion.
const ALPHABET: &[u8; 32] = b"ABCDEFGHJKMNPQRSTUVWXYZ234567890";

/// A user added by pairing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairedUser {
    pub id: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    pub paired: Timestamp,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct PendingCode {
    code: String,
    expires: Timestamp,
    #[serde(default)]
    failures: u32,
}

/// What a `/pair <code>` came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redeemed {
    /// The user is paired now (or already was).
    Paired,
    /// Wrong code; `left` tries before the code is void.
    Wrong { left: u32 },
    /// The code was right but is past its 10 minutes, or no code is pending.
    NoCode,
    /// Too many wrong tries: the code is void.
    Voided,
}

fn path(state_dir: &Path, name: &str) -> PathBuf {
    state_dir.join(name)
}

/// A new code, replacing any pending one; returns it (`ABCD-EFGH`) and when it expires.
pub fn new_code(state_dir: &Path, now: Timestamp) -> std::io::Result<(String, Timestamp)> {
    let mut bytes = [0u8; 8];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    let raw: String = bytes.iter().map(|b| ALPHABET[usize::from(b % 32)] as char).collect();
    let expires = now + CODE_TTL;
    let _lock = lock(state_dir)?;
    let pending = PendingCode { code: raw.clone(), expires, failures: 0 };
    crate::util::fs::write_atomic(&path(state_dir, CODE_FILE), &serde_json::to_vec(&pending)?)?;
    Ok((format!("{}-{}", &raw[..4], &raw[4..]), expires))
}

/// Redeem `text` (what the user sent after `/pair`) for user `id`.
pub fn redeem(
    state_dir: &Path,
    text: &str,
    id: i64,
    username: Option<&str>,
    now: Timestamp,
) -> std::io::Result<Redeemed> {
    let given: String = text.chars().filter(|c| c.is_ascii_alphanumeric()).map(|c| c.to_ascii_uppercase()).collect();
    let _lock = lock(state_dir)?;
    let code_path = path(state_dir, CODE_FILE);
    let mut pending: PendingCode = match std::fs::read(&code_path) {
        Ok(data) => match serde_json::from_slice(&data) {
            Ok(p) => p,
            Err(_) => return Ok(Redeemed::NoCode),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Redeemed::NoCode),
        Err(e) => return Err(e),
    };
    if pending.expires <= now {
        let _ = std::fs::remove_file(&code_path);
        return Ok(Redeemed::NoCode);
    }
    if !constant_time_eq(given.as_bytes(), pending.code.as_bytes()) {
        pending.failures += 1;
        if pending.failures >= MAX_FAILURES {
            std::fs::remove_file(&code_path)?;
            return Ok(Redeemed::Voided);
        }
        crate::util::fs::write_atomic(&code_path, &serde_json::to_vec(&pending)?)?;
        return Ok(Redeemed::Wrong { left: MAX_FAILURES - pending.failures });
    }
    let mut users = paired(state_dir);
    if !users.iter().any(|u| u.id == id) {
        users.push(PairedUser { id, username: username.map(str::to_string), paired: now });
        save(state_dir, &users)?;
    }
    // Used once: gone before the answer is sent.
    std::fs::remove_file(&code_path)?;
    Ok(Redeemed::Paired)
}

/// The paired users (a missing or unreadable file: none; unreadable is logged).
pub fn paired(state_dir: &Path) -> Vec<PairedUser> {
    let p = path(state_dir, PAIRED_FILE);
    match std::fs::read(&p) {
        Ok(data) => serde_json::from_slice(&data).unwrap_or_else(|e| {
            tracing::warn!(file = %p.display(), error = %e, "unreadable list of paired Telegram users: nobody is paired");
            Vec::new()
        }),
        Err(_) => Vec::new(),
    }
}

/// The ids of the paired users.
pub fn paired_ids(state_dir: &Path) -> HashSet<i64> {
    paired(state_dir).into_iter().map(|u| u.id).collect()
}

/// When the list last changed (to reload it only then).
pub fn stamp(state_dir: &Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(path(state_dir, PAIRED_FILE)).and_then(|m| m.modified()).ok()
}

/// Remove user `id`; whether they were paired.
pub fn revoke(state_dir: &Path, id: i64) -> std::io::Result<bool> {
    let _lock = lock(state_dir)?;
    let mut users = paired(state_dir);
    let before = users.len();
    users.retain(|u| u.id != id);
    if users.len() == before {
        return Ok(false);
    }
    save(state_dir, &users)?;
    Ok(true)
}

fn save(state_dir: &Path, users: &[PairedUser]) -> std::io::Result<()> {
    let data = serde_json::to_vec_pretty(users).map_err(std::io::Error::other)?;
    crate::util::fs::write_atomic(&path(state_dir, PAIRED_FILE), &data)
}

/// The pairing lock, held until the returned guard is dropped.
fn lock(state_dir: &Path) -> std::io::Result<nix::fcntl::Flock<std::fs::File>> {
    let file = crate::util::fs::open_lock_file(&path(state_dir, LOCK_FILE))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| std::io::Error::from(e))
}

/// Compare without stopping at the first difference.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code_of(dir: &Path) -> String {
        let p: PendingCode = serde_json::from_slice(&std::fs::read(dir.join(CODE_FILE)).unwrap()).unwrap();
        p.code
    }

    #[test]
    fn a_code_pairs_once_and_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let now: Timestamp = "2026-11-23T20:00:00Z".parse().unwrap();
        let (shown, expires) = new_code(dir.path(), now).unwrap();
        assert_eq!(expires, now + CODE_TTL);
        assert!(shown.len() == 9 && shown.as_bytes()[4] == b'-', "{shown}");
        // Written as the user might: lower case, with spaces.
        let typed = shown.to_lowercase().replace('-', " ");
        assert_eq!(redeem(dir.path(), &typed, 42, Some("bob"), now).unwrap(), Redeemed::Paired);
        assert_eq!(paired_ids(dir.path()), HashSet::from([42]));
        assert_eq!(paired(dir.path())[0].username.as_deref(), Some("bob"));
        // Used once.
        assert_eq!(redeem(dir.path(), &shown, 43, None, now).unwrap(), Redeemed::NoCode);
        assert_eq!(paired_ids(dir.path()), HashSet::from([42]));
        assert!(revoke(dir.path(), 42).unwrap() && !revoke(dir.path(), 42).unwrap());
        assert!(paired_ids(dir.path()).is_empty());
    }

    #[test]
    fn codes_expire_and_wrong_tries_void_them() {
        let dir = tempfile::tempdir().unwrap();
        let now: Timestamp = "2026-11-23T20:00:00Z".parse().unwrap();
        new_code(dir.path(), now).unwrap();
        let code = code_of(dir.path());
        let later = now + Duration::from_secs(11 * 60);
        assert_eq!(redeem(dir.path(), &code, 1, None, later).unwrap(), Redeemed::NoCode, "expired");
        new_code(dir.path(), now).unwrap();
        let code = code_of(dir.path());
        for left in (1..MAX_FAILURES).rev() {
            assert_eq!(redeem(dir.path(), "WRONGWRO", 1, None, now).unwrap(), Redeemed::Wrong { left });
        }
        assert_eq!(redeem(dir.path(), "WRONGWRO", 1, None, now).unwrap(), Redeemed::Voided);
        assert_eq!(redeem(dir.path(), &code, 1, None, now).unwrap(), Redeemed::NoCode, "void: even the right code");
        assert!(paired_ids(dir.path()).is_empty());
    }
}
