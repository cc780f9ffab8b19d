//! Pairing: letting a new user of a channel with users (Telegram, Matrix,
//! email, Discord, Signal, Feishu / Lark) in without editing the config and
//! restarting.
//!
//! `bramble pair [--channel C]` (as the service: `sudo bramble pair`) writes
//! a one-time code for channel C into the state directory, valid for
//! [`CODE_TTL`]; the new user sends `/pair <code>` on that channel (a
//! Telegram private chat, a Matrix room with the bot, a mail whose subject or
//! first line is `/pair <code>`, a Discord DM, a Signal direct message from
//! an account uuid, a Feishu / Lark p2p chat); the channel's reader redeems
//! it and adds
//! the sender, as a typed [`Principal`], to `<channel>-paired.json`. The
//! config's `allow_from` still works and is checked first; pairing only adds.
//! `bramble pair --list` / `--revoke <id>` read and change the list; the
//! running daemon sees a change at the next message (the file's modification
//! time). A code of one channel is never redeemed on another: each channel
//! has its own code file, so a Matrix code cannot pair a Telegram account.
//!
//! A code is 8 characters from a 32-letter alphabet (40 bits, from
//! `/dev/urandom`), used once, and void after [`MAX_FAILURES`] wrong tries
//! (the readers also answer one try per user per [`TRY_GAP`]); every try is
//! logged. The files live in the private state directory, so the code can be
//! kept as it is. The code survives a restart of the daemon in between.
//! A lock file per channel serialises the daemon's redeeming with the CLI's
//! writing. The Telegram files keep the names they had before the other
//! channels could pair (`telegram-paired.json` with numeric ids).
//!
//! Discord, Signal and Feishu answer a stranger's `/pair` only while a code
//! of their own channel is pending ([`pending`]); otherwise it is ignored
//! like any stranger's message, so a bot nobody is pairing with says nothing
//! to strangers. Discord ids are kept as texts (snowflakes, as Discord's
//! JSON writes them). A Signal user is kept by account uuid, with the number
//! it came with: that number with another uuid cannot pair ([`number_taken`]).

use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::bus::Principal;

/// How long a code is valid.
pub const CODE_TTL: Duration = Duration::from_secs(10 * 60);
/// Wrong tries after which a code is void.
pub const MAX_FAILURES: u32 = 5;
/// One try per user this often (the readers' rate limit).
pub const TRY_GAP: Duration = Duration::from_secs(5);
/// The code's alphabet: no 0/O, 1/I/L confusion.
const ALPHABET: &[u8; 32] = b"ABCDEFGHJKMNPQRSTUVWXYZ234567890";

/// A channel whose users can pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PairChannel {
    Telegram,
    Matrix,
    Email,
    Discord,
    Signal,
    Feishu,
}

impl PairChannel {
    pub const ALL: [PairChannel; 6] = [
        PairChannel::Telegram,
        PairChannel::Matrix,
        PairChannel::Email,
        PairChannel::Discord,
        PairChannel::Signal,
        PairChannel::Feishu,
    ];

    /// Its name (`telegram`, `matrix`, `email`, `discord`, `signal`, `feishu`): the prefix of its files.
    pub fn name(self) -> &'static str {
        match self {
            PairChannel::Telegram => "telegram",
            PairChannel::Matrix => "matrix",
            PairChannel::Email => "email",
            PairChannel::Discord => "discord",
            PairChannel::Signal => "signal",
            PairChannel::Feishu => "feishu",
        }
    }

    /// The paired users' file in the state directory.
    pub fn paired_file(self) -> String {
        format!("{}-paired.json", self.name())
    }

    /// The pending code's file in the state directory.
    pub fn code_file(self) -> String {
        format!("{}-pair-code.json", self.name())
    }

    fn lock_file(self) -> String {
        format!("{}-pair.lock", self.name())
    }

    /// The channel and stored id of `who`; `None` for a principal of no channel with users.
    pub fn of(who: &Principal) -> Option<(PairChannel, UserId)> {
        match who {
            Principal::Telegram(id) => Some((PairChannel::Telegram, UserId::Number(*id))),
            Principal::Matrix(user) => Some((PairChannel::Matrix, UserId::Text(user.clone()))),
            Principal::Email(addr) => Some((PairChannel::Email, UserId::Text(addr.to_ascii_lowercase()))),
            Principal::Discord(id) => Some((PairChannel::Discord, UserId::Text(id.to_string()))),
            Principal::Signal(id) => Some((PairChannel::Signal, UserId::Text(id.to_ascii_lowercase()))),
            Principal::Feishu(open_id) => Some((PairChannel::Feishu, UserId::Text(open_id.clone()))),
            _ => None,
        }
    }

    /// The principal of a user of this channel, from its id as typed
    /// (`bramble pair --revoke`): a number for Telegram, `@user:server` for
    /// Matrix, an address for email, a snowflake for Discord, an account uuid
    /// for Signal, an `ou_…` open_id for Feishu.
    pub fn principal(self, id: &str) -> Result<Principal, PairError> {
        let id = id.trim();
        let bad = |what: &str| PairError::BadId { channel: self.name(), id: id.to_string(), what: what.to_string() };
        match self {
            PairChannel::Telegram => id.parse().map(Principal::Telegram).map_err(|_| bad("a numeric user id")),
            PairChannel::Matrix if crate::bus::is_matrix_user(id) => Ok(Principal::Matrix(id.to_string())),
            PairChannel::Matrix => Err(bad("a Matrix user id like @bob:example.org")),
            PairChannel::Email if is_address(id) => Ok(Principal::Email(id.to_ascii_lowercase())),
            PairChannel::Email => Err(bad("a mail address like bob@example.org")),
            PairChannel::Discord => crate::config::discord::snowflake(id)
                .map(Principal::Discord)
                .ok_or_else(|| bad("a Discord user id (a number; Developer Mode → Copy User ID)")),
            PairChannel::Signal if crate::bus::is_signal_uuid(id) => Ok(Principal::Signal(id.to_ascii_lowercase())),
            PairChannel::Signal => Err(bad("a Signal account uuid, or the +number a paired user came with")),
            PairChannel::Feishu if crate::bus::is_feishu_id(id, "ou_") => Ok(Principal::Feishu(id.to_string())),
            PairChannel::Feishu => Err(bad("a Feishu / Lark open_id like ou_7d8a6e6df7621556ce0d21922b676706")),
        }
    }
}

impl std::fmt::Display for PairChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PairChannel {
    type Err = PairError;
    fn from_str(s: &str) -> Result<Self, PairError> {
        PairChannel::ALL
            .into_iter()
            .find(|c| c.name() == s.trim().to_ascii_lowercase())
            .ok_or_else(|| PairError::NoSuchChannel(s.to_string()))
    }
}

/// A paired user's id as stored: a number (Telegram) or a text (Matrix, email).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum UserId {
    Number(i64),
    Text(String),
}

impl std::fmt::Display for UserId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UserId::Number(n) => write!(f, "{n}"),
            UserId::Text(t) => f.write_str(t),
        }
    }
}

/// What cannot be paired or revoked.
#[derive(Debug, thiserror::Error)]
pub enum PairError {
    #[error("`{0}` is not a channel with users to pair: use telegram, matrix, email, discord, signal or feishu")]
    NoSuchChannel(String),
    #[error("`{id}` is not a {channel} user: give {what}")]
    BadId { channel: &'static str, id: String, what: String },
    #[error("{0} has no users to pair")]
    NotAUser(String),
    #[error("the Signal number {number} came before with account {pinned}, not {uuid}: it cannot pair")]
    NumberTaken { number: String, pinned: String, uuid: String },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// `a@b.c`, roughly: one `@`, something on each side, no spaces.
fn is_address(s: &str) -> bool {
    matches!(s.split_once('@'), Some((l, d)) if !l.is_empty() && d.contains('.') && !d.contains('@'))
        && !s.contains(char::is_whitespace)
}

/// A user added by pairing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairedUser {
    pub id: UserId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// The phone number a Signal user paired with (their id is the account uuid).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub number: Option<String>,
    pub paired: Timestamp,
}

/// What is kept of a user beside their id when they pair.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Profile {
    /// Their name on the channel (shown by `--list`).
    pub username: Option<String>,
    /// A Signal user's number (their id is the uuid).
    pub number: Option<String>,
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

/// A new code for `channel`, replacing any pending one; returns it (`ABCD-EFGH`) and when it expires.
pub fn new_code(state_dir: &Path, channel: PairChannel, now: Timestamp) -> std::io::Result<(String, Timestamp)> {
    let mut bytes = [0u8; 8];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    let raw: String = bytes.iter().map(|b| ALPHABET[usize::from(b % 32)] as char).collect();
    let expires = now + CODE_TTL;
    let _lock = lock(state_dir, channel)?;
    let pending = PendingCode { code: raw.clone(), expires, failures: 0 };
    crate::util::fs::write_atomic(&path(state_dir, &channel.code_file()), &serde_json::to_vec(&pending)?)?;
    Ok((format!("{}-{}", &raw[..4], &raw[4..]), expires))
}

/// Whether a code of `channel` is pending (not expired, not void): a Matrix
/// stranger's invite is taken only then. Blocking.
pub fn pending(state_dir: &Path, channel: PairChannel, now: Timestamp) -> bool {
    std::fs::read(path(state_dir, &channel.code_file()))
        .ok()
        .and_then(|d| serde_json::from_slice::<PendingCode>(&d).ok())
        .is_some_and(|p| p.expires > now)
}

/// Redeem `text` (what the user sent after `/pair`) for `who`, on `who`'s
/// channel (its own code file only).
pub fn redeem(
    state_dir: &Path,
    text: &str,
    who: &Principal,
    username: Option<&str>,
    now: Timestamp,
) -> Result<Redeemed, PairError> {
    redeem_as(state_dir, text, who, Profile { username: username.map(str::to_string), number: None }, now)
}

/// [`redeem`] keeping `profile` with the user. A Signal number already kept
/// with another uuid is refused ([`PairError::NumberTaken`]) before the code
/// is looked at: a re-registered number is not the person who paired.
pub fn redeem_as(
    state_dir: &Path,
    text: &str,
    who: &Principal,
    profile: Profile,
    now: Timestamp,
) -> Result<Redeemed, PairError> {
    let (channel, id) = PairChannel::of(who).ok_or_else(|| PairError::NotAUser(who.to_string()))?;
    let given: String = text.chars().filter(|c| c.is_ascii_alphanumeric()).map(|c| c.to_ascii_uppercase()).collect();
    let _lock = lock(state_dir, channel)?;
    if let (Some(number), UserId::Text(uuid)) = (profile.number.as_deref(), &id) {
        if let Some(pinned) = number_taken(state_dir, number, uuid) {
            return Err(PairError::NumberTaken { number: number.to_string(), pinned, uuid: uuid.clone() });
        }
    }
    let code_path = path(state_dir, &channel.code_file());
    let mut pending: PendingCode = match std::fs::read(&code_path) {
        Ok(data) => match serde_json::from_slice(&data) {
            Ok(p) => p,
            Err(_) => return Ok(Redeemed::NoCode),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Redeemed::NoCode),
        Err(e) => return Err(e.into()),
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
        crate::util::fs::write_atomic(&code_path, &serde_json::to_vec(&pending).map_err(std::io::Error::other)?)?;
        return Ok(Redeemed::Wrong { left: MAX_FAILURES - pending.failures });
    }
    let mut users = paired(state_dir, channel);
    if !users.iter().any(|u| u.id == id) {
        users.push(PairedUser { id, username: profile.username, number: profile.number, paired: now });
        save(state_dir, channel, &users)?;
    }
    // Used once: gone before the answer is sent.
    std::fs::remove_file(&code_path)?;
    Ok(Redeemed::Paired)
}

/// The uuid a paired Signal user came with `number` as, when it is not
/// `uuid`: that number belongs to another account as far as bramble knows.
pub fn number_taken(state_dir: &Path, number: &str, uuid: &str) -> Option<String> {
    paired(state_dir, PairChannel::Signal).into_iter().find_map(|u| match u.id {
        UserId::Text(t) if u.number.as_deref() == Some(number) && !t.eq_ignore_ascii_case(uuid) => Some(t),
        _ => None,
    })
}

/// The paired Signal user who came with `number` (`bramble pair --revoke +4915…`).
pub fn signal_by_number(state_dir: &Path, number: &str) -> Option<Principal> {
    paired(state_dir, PairChannel::Signal).into_iter().find_map(|u| match u.id {
        UserId::Text(t) if u.number.as_deref() == Some(number.trim()) => Some(Principal::Signal(t)),
        _ => None,
    })
}

/// The users paired on `channel` (a missing or unreadable file: none; unreadable is logged).
pub fn paired(state_dir: &Path, channel: PairChannel) -> Vec<PairedUser> {
    let p = path(state_dir, &channel.paired_file());
    match std::fs::read(&p) {
        Ok(data) => serde_json::from_slice(&data).unwrap_or_else(|e| {
            tracing::warn!(file = %p.display(), error = %e, channel = channel.name(),
                           "unreadable list of paired users: nobody is paired");
            Vec::new()
        }),
        Err(_) => Vec::new(),
    }
}

/// The ids of the paired Telegram users.
pub fn paired_ids(state_dir: &Path) -> HashSet<i64> {
    paired(state_dir, PairChannel::Telegram)
        .into_iter()
        .filter_map(|u| match u.id {
            UserId::Number(n) => Some(n),
            UserId::Text(_) => None,
        })
        .collect()
}

/// The ids of the users paired on a channel whose ids are texts (Matrix user ids, mail addresses).
pub fn paired_names(state_dir: &Path, channel: PairChannel) -> HashSet<String> {
    paired(state_dir, channel)
        .into_iter()
        .filter_map(|u| match u.id {
            UserId::Text(t) => Some(t),
            UserId::Number(_) => None,
        })
        .collect()
}

/// When `channel`'s list last changed (to reload it only then).
pub fn stamp(state_dir: &Path, channel: PairChannel) -> Option<std::time::SystemTime> {
    std::fs::metadata(path(state_dir, &channel.paired_file())).and_then(|m| m.modified()).ok()
}

/// Remove `who` from their channel's list; whether they were paired.
pub fn revoke(state_dir: &Path, who: &Principal) -> Result<bool, PairError> {
    let (channel, id) = PairChannel::of(who).ok_or_else(|| PairError::NotAUser(who.to_string()))?;
    let _lock = lock(state_dir, channel)?;
    let mut users = paired(state_dir, channel);
    let before = users.len();
    users.retain(|u| u.id != id);
    if users.len() == before {
        return Ok(false);
    }
    save(state_dir, channel, &users)?;
    Ok(true)
}

fn save(state_dir: &Path, channel: PairChannel, users: &[PairedUser]) -> std::io::Result<()> {
    let data = serde_json::to_vec_pretty(users).map_err(std::io::Error::other)?;
    crate::util::fs::write_atomic(&path(state_dir, &channel.paired_file()), &data)
}

/// `channel`'s pairing lock, held until the returned guard is dropped.
fn lock(state_dir: &Path, channel: PairChannel) -> std::io::Result<nix::fcntl::Flock<std::fs::File>> {
    let file = crate::util::fs::open_lock_file(&path(state_dir, &channel.lock_file()))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| std::io::Error::from(e))
}

/// Compare without stopping at the first difference.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A set of paired ids kept in memory, read again only when the file changed
/// (a `bramble pair --revoke`). Cheap to clone; the clones share the set.
#[derive(Debug, Clone)]
pub struct PairedCache {
    channel: PairChannel,
    state_dir: PathBuf,
    inner: std::sync::Arc<std::sync::RwLock<(Option<std::time::SystemTime>, HashSet<String>)>>,
}

impl PairedCache {
    /// Empty until the first [`PairedCache::refresh`].
    pub fn new(state_dir: &Path, channel: PairChannel) -> PairedCache {
        PairedCache { channel, state_dir: state_dir.to_path_buf(), inner: Default::default() }
    }

    /// Read the list again if it changed since; one `stat` otherwise. Blocking.
    pub fn refresh(&self) {
        let stamp = stamp(&self.state_dir, self.channel);
        let seen = self.inner.read().map(|g| g.0).unwrap_or(None);
        if stamp == seen && stamp.is_some() {
            return;
        }
        let names = paired_names(&self.state_dir, self.channel);
        if let Ok(mut g) = self.inner.write() {
            *g = (stamp, names);
        }
    }

    /// Whether `id` was paired at the last refresh (or added since).
    pub fn contains(&self, id: &str) -> bool {
        self.inner.read().map(|g| g.1.contains(id)).unwrap_or(false)
    }

    /// Add a user just paired (until the next refresh reads the file).
    pub fn add(&self, id: &str) {
        if let Ok(mut g) = self.inner.write() {
            g.1.insert(id.to_string());
        }
    }
}

/// The code of a `/pair <code>` text (`/pair@bot code` too, and `pair code`
/// when `bare` — a mail's subject): `Some("")` for a `/pair` alone.
pub fn request(text: &str, bare: bool) -> Option<String> {
    let text = text.trim();
    let (command, rest) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
    let name = command.split('@').next()?.to_ascii_lowercase();
    (name == "/pair" || (bare && name == "pair")).then(|| rest.trim().to_string())
}

/// The answer a user gets for an outcome of [`redeem`] (the same words on every channel).
pub fn answer(outcome: &Result<Redeemed, PairError>) -> String {
    match outcome {
        Ok(Redeemed::Paired) => "Paired: you can talk to me now.".into(),
        Ok(Redeemed::Wrong { left }) => format!("That code is not right ({left} tries left for it)."),
        Ok(Redeemed::Voided) => "Too many wrong codes: that code no longer works. Ask the owner for a new one.".into(),
        Ok(Redeemed::NoCode) => {
            "There is no valid pairing code: ask the owner to run `bramble pair` (a code lasts 10 minutes).".into()
        }
        Err(_) => "Pairing failed on the bot's side; the owner can see why in its log.".into(),
    }
}

/// Strangers whose last `/pair` try is remembered; the map is cleared when full.
const MAX_TRIES: usize = 1024;

/// The last `/pair` try per stranger of one channel's reader (one per [`TRY_GAP`]).
#[derive(Debug, Default)]
pub struct Tries(std::collections::HashMap<String, std::time::Instant>);

impl Tries {
    /// Whether `who` may try now (then the try is remembered).
    pub fn allow(&mut self, who: &str) -> bool {
        let now = std::time::Instant::now();
        if self.0.get(who).is_some_and(|t| now.duration_since(*t) < TRY_GAP) {
            return false;
        }
        if self.0.len() >= MAX_TRIES {
            self.0.clear();
        }
        self.0.insert(who.to_string(), now);
        true
    }
}

/// What a stranger's `/pair` came to on a channel that pairs only while its
/// own code is pending (Discord, Signal, Feishu).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// No code of this channel is pending (or the try came too soon, or the
    /// number belongs to another account): say nothing, as to any stranger.
    Ignored,
    /// Answer with this; `paired`: the user is served from now on.
    Answer { text: String, paired: bool },
}

/// A stranger's `/pair <code>` (`code` as typed, maybe empty) on `who`'s
/// channel, rate-limited by `tries`; every try is logged with the user's id.
pub async fn stranger_try(
    state_dir: &Path,
    tries: &mut Tries,
    code: String,
    who: &Principal,
    profile: Profile,
) -> Attempt {
    let Some((channel, id)) = PairChannel::of(who) else { return Attempt::Ignored };
    let (dir, at) = (state_dir.to_path_buf(), Timestamp::now());
    if !crate::util::tasks::blocking(move || pending(&dir, channel, at)).await {
        tracing::info!(channel = channel.name(), user = %id, "a stranger's /pair with no code of this channel pending was ignored");
        return Attempt::Ignored;
    }
    if !tries.allow(&id.to_string()) {
        tracing::warn!(channel = channel.name(), user = %id, "a /pair try too soon after the last one was ignored");
        return Attempt::Ignored;
    }
    if code.is_empty() {
        let text =
            format!("Send the code too: /pair ABCD-EFGH (the owner gets one with `bramble pair --channel {channel}`).");
        return Attempt::Answer { text, paired: false };
    }
    let (dir, who2) = (state_dir.to_path_buf(), who.clone());
    let outcome = crate::util::tasks::blocking(move || redeem_as(&dir, &code, &who2, profile, at)).await;
    let name = channel.name();
    match &outcome {
        Ok(Redeemed::Paired) => {
            tracing::warn!(channel = name, user = %id, "paired a user: they are served from now on")
        }
        Ok(Redeemed::Wrong { left }) => tracing::warn!(channel = name, user = %id, left, "a wrong pairing code"),
        Ok(Redeemed::Voided) => {
            tracing::warn!(channel = name, user = %id, "too many wrong pairing codes: the code is void")
        }
        Ok(Redeemed::NoCode) => return Attempt::Ignored, // it ran out in between
        Err(e @ PairError::NumberTaken { .. }) => {
            tracing::warn!(channel = name, "a /pair was refused as spoofed: {e} (a re-registered number?)");
            return Attempt::Ignored;
        }
        Err(e) => tracing::error!(channel = name, error = %e, "cannot read or write the pairing files"),
    }
    Attempt::Answer { text: answer(&outcome), paired: outcome.as_ref().is_ok_and(|o| *o == Redeemed::Paired) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code_of(dir: &Path, channel: PairChannel) -> String {
        let p: PendingCode = serde_json::from_slice(&std::fs::read(dir.join(channel.code_file())).unwrap()).unwrap();
        p.code
    }

    #[test]
    fn a_code_pairs_once_and_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let now: Timestamp = "2026-11-23T20:00:00Z".parse().unwrap();
        let (shown, expires) = new_code(dir.path(), PairChannel::Telegram, now).unwrap();
        assert_eq!(expires, now + CODE_TTL);
        assert!(shown.len() == 9 && shown.as_bytes()[4] == b'-', "{shown}");
        // Written as the user might: lower case, with spaces.
        let typed = shown.to_lowercase().replace('-', " ");
        let bob = Principal::Telegram(42);
        assert_eq!(redeem(dir.path(), &typed, &bob, Some("bob"), now).unwrap(), Redeemed::Paired);
        assert_eq!(paired_ids(dir.path()), HashSet::from([42]));
        assert_eq!(paired(dir.path(), PairChannel::Telegram)[0].username.as_deref(), Some("bob"));
        // The file keeps the numeric ids it always had.
        let raw = std::fs::read_to_string(dir.path().join("telegram-paired.json")).unwrap();
        assert!(raw.contains("\"id\": 42"), "{raw}");
        // Used once.
        assert_eq!(redeem(dir.path(), &shown, &Principal::Telegram(43), None, now).unwrap(), Redeemed::NoCode);
        assert_eq!(paired_ids(dir.path()), HashSet::from([42]));
        assert!(revoke(dir.path(), &bob).unwrap() && !revoke(dir.path(), &bob).unwrap());
        assert!(paired_ids(dir.path()).is_empty());
    }

    #[test]
    fn codes_expire_and_wrong_tries_void_them() {
        let dir = tempfile::tempdir().unwrap();
        let now: Timestamp = "2026-11-23T20:00:00Z".parse().unwrap();
        let who = Principal::Telegram(1);
        new_code(dir.path(), PairChannel::Telegram, now).unwrap();
        let code = code_of(dir.path(), PairChannel::Telegram);
        let later = now + Duration::from_secs(11 * 60);
        assert!(pending(dir.path(), PairChannel::Telegram, now));
        assert!(!pending(dir.path(), PairChannel::Telegram, later));
        assert_eq!(redeem(dir.path(), &code, &who, None, later).unwrap(), Redeemed::NoCode, "expired");
        new_code(dir.path(), PairChannel::Telegram, now).unwrap();
        let code = code_of(dir.path(), PairChannel::Telegram);
        for left in (1..MAX_FAILURES).rev() {
            assert_eq!(redeem(dir.path(), "WRONGWRO", &who, None, now).unwrap(), Redeemed::Wrong { left });
        }
        assert_eq!(redeem(dir.path(), "WRONGWRO", &who, None, now).unwrap(), Redeemed::Voided);
        assert_eq!(redeem(dir.path(), &code, &who, None, now).unwrap(), Redeemed::NoCode, "void: even the right code");
        assert!(paired_ids(dir.path()).is_empty());
    }

    #[test]
    fn each_channel_has_its_own_code_and_list() {
        let dir = tempfile::tempdir().unwrap();
        let now: Timestamp = "2026-11-23T20:00:00Z".parse().unwrap();
        new_code(dir.path(), PairChannel::Matrix, now).unwrap();
        let code = code_of(dir.path(), PairChannel::Matrix);
        // A Matrix code does not pair a Telegram user nor a mail sender.
        assert_eq!(redeem(dir.path(), &code, &Principal::Telegram(7), None, now).unwrap(), Redeemed::NoCode);
        let mail = Principal::Email("Bob@Example.org".into());
        assert_eq!(redeem(dir.path(), &code, &mail, None, now).unwrap(), Redeemed::NoCode);
        let bob = Principal::Matrix("@bob:x".into());
        assert_eq!(redeem(dir.path(), &code, &bob, None, now).unwrap(), Redeemed::Paired);
        assert_eq!(paired_names(dir.path(), PairChannel::Matrix), HashSet::from(["@bob:x".to_string()]));
        assert!(paired_ids(dir.path()).is_empty() && paired_names(dir.path(), PairChannel::Email).is_empty());
        // Mail addresses are kept lower case; revoking matches any case.
        new_code(dir.path(), PairChannel::Email, now).unwrap();
        let code = code_of(dir.path(), PairChannel::Email);
        assert_eq!(redeem(dir.path(), &code, &mail, None, now).unwrap(), Redeemed::Paired);
        assert_eq!(paired_names(dir.path(), PairChannel::Email), HashSet::from(["bob@example.org".to_string()]));
        let cache = PairedCache::new(dir.path(), PairChannel::Email);
        cache.refresh();
        assert!(cache.contains("bob@example.org"));
        assert!(revoke(dir.path(), &Principal::Email("BOB@example.org".into())).unwrap());
        cache.refresh();
        assert!(!cache.contains("bob@example.org"), "a revoke is seen at the next refresh");
        assert!(matches!(redeem(dir.path(), &code, &Principal::Anonymous, None, now), Err(PairError::NotAUser(_))));
    }

    #[test]
    fn ids_are_typed_per_channel_and_requests_are_commands() {
        assert_eq!(PairChannel::Telegram.principal("42").unwrap(), Principal::Telegram(42));
        assert!(PairChannel::Telegram.principal("@bob:x").is_err());
        assert_eq!(PairChannel::Matrix.principal("@bob:x").unwrap(), Principal::Matrix("@bob:x".into()));
        assert!(PairChannel::Matrix.principal("bob").is_err());
        assert_eq!(PairChannel::Email.principal("Bob@X.org").unwrap(), Principal::Email("bob@x.org".into()));
        assert!(PairChannel::Email.principal("bob at x").is_err());
        assert!("slack".parse::<PairChannel>().is_err());
        assert_eq!("Matrix".parse::<PairChannel>().unwrap(), PairChannel::Matrix);
        assert_eq!(request("/pair ABCD-EFGH", false).as_deref(), Some("ABCD-EFGH"));
        assert_eq!(request("/pair@bramble_bot  abcd efgh ", false).as_deref(), Some("abcd efgh"));
        assert_eq!(request("/pair", false).as_deref(), Some(""));
        assert_eq!(request("pair ABCD", true).as_deref(), Some("ABCD"));
        assert!(request("pair ABCD", false).is_none() && request("/pairing", false).is_none());
    }

    #[test]
    fn discord_signal_and_feishu_ids_are_typed_and_a_signal_number_keeps_its_uuid() {
        const ANN: &str = "7ccae375-cd51-4c82-8b1e-7be3280aa485";
        const EVE: &str = "0b0e6f5a-3c1d-4e2f-9a8b-7c6d5e4f3a2b";
        assert_eq!(PairChannel::Discord.principal("80351110224678912").unwrap(), Principal::Discord(80351110224678912));
        assert!(PairChannel::Discord.principal("@bob").is_err());
        assert_eq!(PairChannel::Signal.principal(&ANN.to_uppercase()).unwrap(), Principal::Signal(ANN.into()));
        assert!(PairChannel::Signal.principal("+4915100000001").is_err(), "a number alone is not an identity");
        assert_eq!(PairChannel::Feishu.principal("ou_abc").unwrap(), Principal::Feishu("ou_abc".into()));
        assert!(PairChannel::Feishu.principal("oc_abc").is_err());
        assert_eq!("signal".parse::<PairChannel>().unwrap(), PairChannel::Signal);

        let dir = tempfile::tempdir().unwrap();
        let now: Timestamp = "2026-11-23T20:00:00Z".parse().unwrap();
        new_code(dir.path(), PairChannel::Signal, now).unwrap();
        let code = code_of(dir.path(), PairChannel::Signal);
        // A Discord or Feishu user cannot use a Signal code.
        assert_eq!(redeem(dir.path(), &code, &Principal::Discord(5), None, now).unwrap(), Redeemed::NoCode);
        assert_eq!(redeem(dir.path(), &code, &Principal::Feishu("ou_x".into()), None, now).unwrap(), Redeemed::NoCode);
        let number = Some("+4915100000001".to_string());
        let ann = Principal::Signal(ANN.into());
        let profile = Profile { username: None, number: number.clone() };
        assert_eq!(redeem_as(dir.path(), &code, &ann, profile.clone(), now).unwrap(), Redeemed::Paired);
        assert_eq!(paired(dir.path(), PairChannel::Signal)[0].number, number);
        assert_eq!(signal_by_number(dir.path(), "+4915100000001"), Some(ann.clone()));
        // The same number with another uuid cannot pair, even with a right code.
        new_code(dir.path(), PairChannel::Signal, now).unwrap();
        let code = code_of(dir.path(), PairChannel::Signal);
        let eve = Principal::Signal(EVE.into());
        let taken = redeem_as(dir.path(), &code, &eve, profile.clone(), now);
        assert!(matches!(taken, Err(PairError::NumberTaken { .. })), "{taken:?}");
        assert!(pending(dir.path(), PairChannel::Signal, now), "a refused number does not use up the code");
        assert_eq!(number_taken(dir.path(), "+4915100000001", ANN), None);
        assert!(revoke(dir.path(), &ann).unwrap());
        assert!(paired_names(dir.path(), PairChannel::Signal).is_empty());
    }

    #[tokio::test]
    async fn a_stranger_is_answered_only_while_a_code_of_their_channel_is_pending() {
        let dir = tempfile::tempdir().unwrap();
        let mut tries = Tries::default();
        let bob = Principal::Discord(42);
        let ignored = stranger_try(dir.path(), &mut tries, "ABCD".into(), &bob, Profile::default()).await;
        assert_eq!(ignored, Attempt::Ignored, "no code pending: nothing said");
        new_code(dir.path(), PairChannel::Feishu, Timestamp::now()).unwrap();
        let other = stranger_try(dir.path(), &mut tries, "ABCD".into(), &bob, Profile::default()).await;
        assert_eq!(other, Attempt::Ignored, "another channel's code: nothing said");
        new_code(dir.path(), PairChannel::Discord, Timestamp::now()).unwrap();
        let wrong = stranger_try(dir.path(), &mut tries, "WRONGWRO".into(), &bob, Profile::default()).await;
        assert_eq!(
            wrong,
            Attempt::Answer { text: "That code is not right (4 tries left for it).".into(), paired: false }
        );
        let code = code_of(dir.path(), PairChannel::Discord);
        let soon = stranger_try(dir.path(), &mut tries, code.clone(), &bob, Profile::default()).await;
        assert_eq!(soon, Attempt::Ignored, "one try per user per TRY_GAP");
        let mut fresh = Tries::default();
        let ok = stranger_try(dir.path(), &mut fresh, code, &bob, Profile::default()).await;
        assert!(matches!(ok, Attempt::Answer { paired: true, .. }), "{ok:?}");
        assert_eq!(paired_names(dir.path(), PairChannel::Discord), HashSet::from(["42".to_string()]));
    }
}
