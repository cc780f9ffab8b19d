//! Signed envelopes between boards: HMAC-SHA256 with the fleet key over the
//! topic, the sender, the addressee, the time, a nonce, the kind, the
//! correlation id and the body, and a replay guard (a window around now, and
//! the nonces seen in it).
//!
//! Why on top of the broker's accounts: the broker's ACL keeps a board from
//! publishing outside its own prefix (`bramble fleet acl`), so a command on
//! the primary's prefix came from the primary's account; the MAC adds that it
//! came from someone holding the fleet key (a leaked broker password alone
//! commands nothing), and the time and nonce that it is not a recording of an
//! old command played again. Both are needed: a compromised node holds the
//! key but cannot write under the primary's prefix; a stolen broker password
//! can write but cannot sign. docs/fleet.md says why one shared key.

use std::collections::{BTreeMap, VecDeque};

use ring::hmac;
use serde::{Deserialize, Serialize};

use crate::config::fleet::BoardName;

/// Nonces remembered at most (the oldest go first): a flood of signed
/// envelopes cannot grow the guard without bound.
pub const MAX_NONCES: usize = 4096;
/// The largest envelope accepted, in bytes (a job, a turn's text).
pub const MAX_ENVELOPE: usize = 256 * 1024;

/// What one board asks of or tells another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    pub from: BoardName,
    pub to: BoardName,
    /// Unix seconds when it was signed.
    pub ts: i64,
    /// 16 random bytes, hex.
    pub nonce: String,
    /// `cron.add`, `cron.remove`, `turn`, `reply`, `report`.
    pub kind: String,
    /// Correlates a reply with its request (or a report's idempotency key).
    pub id: String,
    /// The kind's JSON, as text: the MAC covers these exact bytes.
    pub body: String,
    /// HMAC-SHA256, hex.
    pub mac: String,
}

/// Why an envelope was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("not a fleet envelope: {0}")]
    Malformed(String),
    #[error("too large ({0} bytes; at most {MAX_ENVELOPE})")]
    TooLarge(usize),
    #[error("addressed to `{0}`, not to this board")]
    NotForUs(BoardName),
    #[error("from `{0}`, which may not send this here")]
    Sender(BoardName),
    #[error("the signature does not match (another fleet key, or the message was changed)")]
    Mac,
    #[error("signed {0} s away from now: outside the replay window")]
    Stale(i64),
    #[error("its nonce was seen before: a replay")]
    Replay,
}

/// The fleet key, ready to sign and check.
#[derive(Clone)]
pub struct Signer {
    key: hmac::Key,
}

impl Signer {
    pub fn new(secret: &[u8]) -> Signer {
        Signer { key: hmac::Key::new(hmac::HMAC_SHA256, secret) }
    }

    fn message(topic: &str, e: &Envelope) -> Vec<u8> {
        // Each field length-prefixed: no two envelopes sign the same bytes.
        let mut m = Vec::with_capacity(topic.len() + e.body.len() + 128);
        let ts = e.ts.to_string();
        for part in [topic, e.from.as_str(), e.to.as_str(), &ts, &e.nonce, &e.kind, &e.id, &e.body] {
            m.extend_from_slice(&(part.len() as u64).to_be_bytes());
            m.extend_from_slice(part.as_bytes());
        }
        m
    }

    /// A signed envelope for `topic`, now.
    pub fn seal(&self, topic: &str, from: &BoardName, to: &BoardName, kind: &str, id: &str, body: String) -> Envelope {
        let mut e = Envelope {
            from: from.clone(),
            to: to.clone(),
            ts: jiff::Timestamp::now().as_second(),
            nonce: random_hex(16),
            kind: kind.to_string(),
            id: id.to_string(),
            body,
            mac: String::new(),
        };
        e.mac = hex(hmac::sign(&self.key, &Self::message(topic, &e)).as_ref());
        e
    }

    /// Whether the MAC is right for `topic` (constant time).
    pub fn verify(&self, topic: &str, e: &Envelope) -> bool {
        let Some(mac) = unhex(&e.mac) else { return false };
        hmac::verify(&self.key, &Self::message(topic, e), &mac).is_ok()
    }
}

/// Checks envelopes addressed to one board: signature, addressee, sender,
/// time, and nonces seen within the window.
pub struct Guard {
    signer: Signer,
    me: BoardName,
    window: i64,
    seen: BTreeMap<String, i64>,
    order: VecDeque<(i64, String)>,
}

impl Guard {
    pub fn new(signer: Signer, me: BoardName, window: std::time::Duration) -> Guard {
        let window = i64::try_from(window.as_secs()).unwrap_or(i64::MAX).max(1);
        Guard { signer, me, window, seen: BTreeMap::new(), order: VecDeque::new() }
    }

    /// Parse and check one payload that arrived on `topic`; `may_send`
    /// decides whether its sender may send it there. `now`: unix seconds.
    pub fn open(
        &mut self,
        topic: &str,
        payload: &[u8],
        may_send: impl Fn(&BoardName) -> bool,
        now: i64,
    ) -> Result<Envelope, AuthError> {
        if payload.len() > MAX_ENVELOPE {
            return Err(AuthError::TooLarge(payload.len()));
        }
        let e: Envelope = serde_json::from_slice(payload).map_err(|err| AuthError::Malformed(err.to_string()))?;
        if !self.signer.verify(topic, &e) {
            return Err(AuthError::Mac);
        }
        if e.to != self.me {
            return Err(AuthError::NotForUs(e.to));
        }
        if !may_send(&e.from) {
            return Err(AuthError::Sender(e.from));
        }
        let off = e.ts.saturating_sub(now);
        if off.abs() > self.window {
            return Err(AuthError::Stale(off));
        }
        self.forget_before(now - self.window);
        if self.seen.contains_key(&e.nonce) {
            return Err(AuthError::Replay);
        }
        while self.order.len() >= MAX_NONCES {
            if let Some((_, old)) = self.order.pop_front() {
                self.seen.remove(&old);
            }
        }
        self.seen.insert(e.nonce.clone(), e.ts);
        self.order.push_back((e.ts, e.nonce.clone()));
        Ok(e)
    }

    fn forget_before(&mut self, oldest: i64) {
        while self.order.front().is_some_and(|(ts, _)| *ts < oldest) {
            if let Some((_, n)) = self.order.pop_front() {
                self.seen.remove(&n);
            }
        }
    }
}

/// `n` random bytes as hex (ring's system random).
pub fn random_hex(n: usize) -> String {
    use ring::rand::SecureRandom as _;
    let mut b = vec![0u8; n];
    // The system's random source does not fail on Linux once booted; zeros would still be unique enough per run.
    let _ = ring::rand::SystemRandom::new().fill(&mut b);
    hex(&b)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(n: &str) -> BoardName {
        n.parse().unwrap()
    }

    fn guard(key: &[u8]) -> Guard {
        Guard::new(Signer::new(key), b("garage"), std::time::Duration::from_secs(300))
    }

    const TOPIC: &str = "bramble/living/fleet/cmd/garage";

    #[test]
    fn a_signed_command_opens_once() {
        let s = Signer::new(b"k".repeat(32).as_slice());
        let e = s.seal(TOPIC, &b("living"), &b("garage"), "turn", "c1", "{\"text\":\"hi\"}".into());
        let wire = serde_json::to_vec(&e).unwrap();
        let mut g = guard(b"k".repeat(32).as_slice());
        let now = e.ts;
        let from_primary = |f: &BoardName| f.as_str() == "living";
        assert_eq!(g.open(TOPIC, &wire, from_primary, now).unwrap(), e);
        assert_eq!(g.open(TOPIC, &wire, from_primary, now), Err(AuthError::Replay), "the same bytes again");
    }

    #[test]
    fn forged_changed_stale_and_misrouted_envelopes_are_refused() {
        let key = b"k".repeat(32);
        let s = Signer::new(&key);
        let from_primary = |f: &BoardName| f.as_str() == "living";
        let e = s.seal(TOPIC, &b("living"), &b("garage"), "turn", "c1", "{}".into());
        let now = e.ts;
        // Another key (a rogue board's).
        let rogue =
            Signer::new(b"r".repeat(32).as_slice()).seal(TOPIC, &b("living"), &b("garage"), "turn", "c", "{}".into());
        let mut g = guard(&key);
        assert_eq!(g.open(TOPIC, &serde_json::to_vec(&rogue).unwrap(), from_primary, now), Err(AuthError::Mac));
        // The body changed on the way.
        let mut changed = e.clone();
        changed.body = "{\"x\":1}".into();
        assert_eq!(g.open(TOPIC, &serde_json::to_vec(&changed).unwrap(), from_primary, now), Err(AuthError::Mac));
        // Replayed on another topic (signed for one board, sent to another).
        let wire = serde_json::to_vec(&e).unwrap();
        assert_eq!(g.open("bramble/living/fleet/cmd/attic", &wire, from_primary, now), Err(AuthError::Mac));
        // Signed by a key holder, but not the primary.
        let node = s.seal(TOPIC, &b("attic"), &b("garage"), "turn", "c", "{}".into());
        let err = g.open(TOPIC, &serde_json::to_vec(&node).unwrap(), from_primary, node.ts);
        assert_eq!(err, Err(AuthError::Sender(b("attic"))));
        // For another board.
        let other = s.seal(TOPIC, &b("living"), &b("attic"), "turn", "c", "{}".into());
        assert_eq!(
            g.open(TOPIC, &serde_json::to_vec(&other).unwrap(), from_primary, now),
            Err(AuthError::NotForUs(b("attic")))
        );
        // Old: outside the window.
        assert_eq!(g.open(TOPIC, &wire, from_primary, now + 301), Err(AuthError::Stale(-301)));
        // Malformed and oversize.
        assert!(matches!(g.open(TOPIC, b"{", from_primary, now), Err(AuthError::Malformed(_))));
        assert!(matches!(g.open(TOPIC, &vec![b' '; MAX_ENVELOPE + 1], from_primary, now), Err(AuthError::TooLarge(_))));
        assert!(g.open(TOPIC, &wire, from_primary, now).is_ok(), "the good one still opens");
    }

    #[test]
    fn the_nonce_memory_is_bounded() {
        let key = b"k".repeat(32);
        let s = Signer::new(&key);
        let mut g = guard(&key);
        let mut first = None;
        for i in 0..MAX_NONCES + 10 {
            let e = s.seal(TOPIC, &b("living"), &b("garage"), "turn", &i.to_string(), "{}".into());
            first.get_or_insert(e.clone());
            g.open(TOPIC, &serde_json::to_vec(&e).unwrap(), |_| true, e.ts).unwrap();
        }
        assert!(g.seen.len() <= MAX_NONCES);
    }
}
