//! A reminder's Done / Snooze buttons on ntfy: `http` actions the phone
//! sends to `<callback_base>/ntfy/<token>/done` (or `/snooze`), served by the
//! webhook listener ([`crate::channels::webhook::Route`]).
//!
//! The token is the only credential: 128 random bits, one per notification,
//! good for one press (either button) within `[ntfy] callback_ttl`. Only its
//! SHA-256 is kept (`ntfy-callbacks.json`, 0600), and a presented token is
//! compared with every kept digest in constant time. A forged, expired or
//! used token gets the same `404` and changes nothing; a press does what
//! Telegram's buttons do ([`Reminders`]): Done is a line in the job's
//! history, Snooze a new one-shot an hour later on the same topic.

// Without the webhook listener no press can arrive: the store is built but never read.
#![cfg_attr(not(feature = "webhook"), allow(dead_code))]

use std::path::{Path, PathBuf};
#[cfg(feature = "webhook")]
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

#[cfg(feature = "webhook")]
use super::Shared;
#[cfg(feature = "webhook")]
use crate::bus::{Channel, Conversation};
use crate::clients::ntfy::Action;
use crate::work::reminders::Reminders;
#[cfg(feature = "webhook")]
use crate::work::reminders::Snooze;

/// `ntfy-callbacks.json`.
pub const CALLBACKS_FILE: &str = "ntfy-callbacks.json";
/// Tokens kept at most (the oldest go first).
const MAX_KEPT: usize = 500;
/// The report text kept for a snooze, in characters.
const TEXT_CHARS: usize = 2000;

/// One issued token.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    /// Hex SHA-256 of the token.
    hash: String,
    job: String,
    topic: String,
    text: String,
    /// Unix seconds after which the token does nothing.
    expires: i64,
}

/// The issued tokens, kept across restarts.
pub struct Callbacks {
    base: String,
    ttl: Duration,
    path: PathBuf,
    reminders: Reminders,
    entries: Mutex<Vec<Entry>>,
    refusals: crate::channels::mqtt::TurnLimit,
}

impl Callbacks {
    pub fn new(base: &str, ttl: Duration, state_dir: &Path, reminders: Reminders) -> Callbacks {
        let path = state_dir.join(CALLBACKS_FILE);
        let entries = std::fs::read(&path).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
        // Log at most a few refused presses a minute.
        let rate = crate::channels::mqtt::TurnRate { per_minute: 10, burst: 10 };
        Callbacks {
            base: base.trim_end_matches('/').to_string(),
            ttl,
            path,
            reminders,
            entries: Mutex::new(entries),
            refusals: crate::channels::mqtt::TurnLimit::new(rate, "refused ntfy button presses logged"),
        }
    }

    /// A fresh token for job `job`'s report on `topic`: its Done and Snooze
    /// buttons. Blocking (writes the file). `None` when no token can be made.
    pub fn issue(&self, job: &str, topic: &str, text: &str, now: i64) -> Option<Vec<Action>> {
        let mut raw = [0u8; 16];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut raw).ok()?;
        let token = hex(&raw);
        let entry = Entry {
            hash: digest(&token),
            job: job.to_string(),
            topic: topic.to_string(),
            text: text.chars().take(TEXT_CHARS).collect(),
            expires: now.saturating_add(self.ttl.as_secs() as i64),
        };
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.retain(|e| e.expires > now);
        entries.push(entry);
        let over = entries.len().saturating_sub(MAX_KEPT);
        entries.drain(..over);
        if let Err(e) = self.save(&entries) {
            tracing::warn!(error = %e, "ntfy: cannot keep a reminder's button token; the notification goes without buttons");
            entries.pop();
            return None;
        }
        let button = |label: &str, what: &str| Action::Http {
            label: label.into(),
            url: format!("{}/ntfy/{token}/{what}", self.base),
            method: "POST".into(),
            headers: Default::default(),
            body: String::new(),
            clear: true,
        };
        Some(vec![button("Done", "done"), button("Snooze 1 h", "snooze")])
    }

    /// The entry of `token`, taken (a second press finds nothing); `None`
    /// for a token never issued, used or expired. Blocking.
    fn take(&self, token: &str, now: i64) -> Option<Entry> {
        if token.len() != 32 || !token.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return None;
        }
        let given = digest(token);
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        // Every digest is compared, each in constant time.
        let mut found = None;
        for (i, e) in entries.iter().enumerate() {
            if same(e.hash.as_bytes(), given.as_bytes()) {
                found = Some(i);
            }
        }
        let entry = entries.remove(found?);
        if let Err(e) = self.save(&entries) {
            tracing::warn!(error = %e, "ntfy: cannot record a used button token");
        }
        (entry.expires > now).then_some(entry)
    }

    fn save(&self, entries: &[Entry]) -> std::io::Result<()> {
        let data = serde_json::to_vec(entries).map_err(std::io::Error::other)?;
        crate::util::fs::write_atomic(&self.path, &data)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn digest(token: &str) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, token.as_bytes()).as_ref())
}

/// Equal, in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0 && a.len() == b.len()
}

/// The `/ntfy/…` route on the webhook listener.
#[cfg(feature = "webhook")]
pub struct CallbackRoute(pub Arc<Shared>);

#[cfg(feature = "webhook")]
impl crate::channels::webhook::Route for CallbackRoute {
    fn answer<'a>(
        &'a self,
        method: &'a str,
        path: &'a str,
        peer: std::net::SocketAddr,
    ) -> crate::util::BoxFuture<'a, Option<(u16, String)>> {
        Box::pin(async move {
            let rest = path.strip_prefix("/ntfy/")?;
            Some(press(self.0.clone(), method, rest, peer).await)
        })
    }
}

/// One press: `<token>/done` or `<token>/snooze`.
#[cfg(feature = "webhook")]
async fn press(shared: Arc<Shared>, method: &str, rest: &str, peer: std::net::SocketAddr) -> (u16, String) {
    if method != "POST" {
        return (405, "use POST".into());
    }
    let (token, what) = rest.split_once('/').unwrap_or((rest, ""));
    let snooze = match what {
        "done" => false,
        "snooze" => true,
        _ => return (404, "not found".into()),
    };
    let (token, now) = (token.to_string(), jiff::Timestamp::now());
    let outcome = crate::util::tasks::blocking(move || {
        let callbacks = shared.callbacks.as_ref()?;
        let Some(entry) = callbacks.take(&token, now.as_second()) else {
            return Some(Err(callbacks.refusals.allow()));
        };
        let r = &callbacks.reminders;
        let done = if snooze {
            let conversation = Conversation::new(Channel::Ntfy, entry.topic.clone(), format!("ntfy:{}", entry.topic));
            r.snooze_in(&entry.job, &entry.text, conversation, Snooze::Minutes(60), now)
        } else {
            r.done(&entry.job, now)
        };
        Some(Ok((entry, done)))
    })
    .await;
    match outcome {
        None => (404, "not found".into()),
        Some(Err(log)) => {
            if log {
                tracing::warn!(%peer, "ntfy: a button press with an unknown, used or expired token was refused");
            }
            (404, "unknown, used or expired link".into())
        }
        Some(Ok((entry, Ok(said)))) => {
            tracing::info!(job = %entry.job, topic = %entry.topic, "ntfy button: {said}");
            (200, said)
        }
        Some(Ok((entry, Err(why)))) => {
            tracing::warn!(job = %entry.job, "an ntfy button did nothing: {why}");
            (409, why.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_works_once_and_only_before_it_expires() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::scheduler::JobStore::open(dir.path());
        let r = Reminders::new(store, jiff::tz::TimeZone::UTC, (9, 0));
        let cb = Callbacks::new("https://pi.example/", Duration::from_secs(60), dir.path(), r);
        let actions = cb.issue("job1", "t", "water", 1000).unwrap();
        let Action::Http { url, .. } = &actions[0] else { panic!() };
        assert!(url.starts_with("https://pi.example/ntfy/") && url.ends_with("/done"));
        let token = url.split('/').nth(4).unwrap().to_string();
        assert!(!std::fs::read_to_string(dir.path().join(CALLBACKS_FILE)).unwrap().contains(&token), "kept hashed");
        assert!(cb.take("0".repeat(32).as_str(), 1001).is_none(), "forged");
        assert!(cb.take("../../etc", 1001).is_none());
        assert_eq!(cb.take(&token, 1001).unwrap().job, "job1");
        assert!(cb.take(&token, 1002).is_none(), "used");
        let again = cb.issue("job1", "t", "water", 1000).unwrap();
        let Action::Http { url, .. } = &again[1] else { panic!() };
        let token = url.split('/').nth(4).unwrap().to_string();
        assert!(cb.take(&token, 2000).is_none(), "expired");
        // Kept across a restart.
        let third = cb.issue("job2", "t", "x", 3000).unwrap();
        let Action::Http { url, .. } = &third[0] else { panic!() };
        let token = url.split('/').nth(4).unwrap().to_string();
        let store = crate::scheduler::JobStore::open(dir.path());
        let r = Reminders::new(store, jiff::tz::TimeZone::UTC, (9, 0));
        let reopened = Callbacks::new("https://pi.example", Duration::from_secs(60), dir.path(), r);
        assert_eq!(reopened.take(&token, 3001).unwrap().job, "job2");
    }
}
