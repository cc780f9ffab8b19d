//! Who polls the chat (Tier 2, docs/fleet.md "The chat survives the primary").
//!
//! A bot token allows one `getUpdates` poller. The primary polls; a standby
//! polls only while the primary's `status` (retained, set to `offline` by its
//! last will) has said `offline` for `[fleet] takeover_after`, and stops when
//! it says `online` again. Of several standbys the lowest-named online one
//! takes over, and none takes the chat from a board that holds it.
//!
//! Where the updates stand is shared: the board that polls publishes, after
//! each batch, a signed retained document on `bramble/<board>/fleet/chat`
//! (`{bot, next, holding}`, a fleet envelope of kind `chat`); every board
//! keeps the newest valid one per board and the poller starts from the
//! highest `next` for its bot. An unsigned, forged, misaddressed or older
//! document is ignored. The primary coming back waits until no online board
//! says it holds the chat, so two boards never poll at once on purpose (a
//! 409 while one stops is survived by the poller's backoff).
//!
//! This module decides; the Telegram channel's [`shared`] seam carries the
//! decision to the poller and the confirmed offsets back. It wakes only on a
//! fleet message, a confirmed batch, or the end of a grace period: no timer
//! while the primary is online.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::auth::{Envelope, Signer};
use super::presence::Boards;
use super::topics::ROOT;
use crate::channels::telegram::shared::{self, Offset, Turn};
use crate::config::fleet::{BoardName, FleetRole};

/// The envelope kind of a chat document.
pub const KIND: &str = "chat";
/// The largest chat document read.
const MAX_DOC: usize = 4096;

/// `bramble/<board>/fleet/chat`: where a board says where its polling stands.
pub fn topic(board: &BoardName) -> String {
    format!("{ROOT}/{board}/fleet/chat")
}

/// The filter every board with a chat to share subscribes to.
pub fn filter() -> String {
    format!("{ROOT}/+/fleet/chat")
}

/// The board a chat document's topic belongs to (`None`: not one).
pub fn board_of(topic: &str) -> Option<BoardName> {
    let rest = topic.strip_prefix(ROOT)?.strip_prefix('/')?;
    let (board, rest) = rest.split_once('/')?;
    (rest == "fleet/chat").then(|| board.parse().ok()).flatten()
}

/// A chat document's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatDoc {
    pub bot: i64,
    /// The next update id to ask for.
    pub next: i64,
    /// The board polls now.
    pub holding: bool,
}

/// Why a chat document was ignored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DocError {
    #[error("too large ({0} bytes)")]
    TooLarge(usize),
    #[error("not a fleet envelope: {0}")]
    Malformed(String),
    #[error("the signature does not match (another fleet key, or it was changed)")]
    Mac,
    #[error("signed by `{0}`, not by the board it was published under")]
    Sender(BoardName),
    #[error("older than the one kept")]
    Older,
}

/// This board's seat at the chat: what it has heard, and the seam to its poller.
pub struct Seat {
    seam: shared::Seat,
    me: BoardName,
    /// `None` on the primary.
    primary: Option<BoardName>,
    grace: Duration,
    started: Instant,
    /// This board's own `online` came back from the broker: what was retained has been heard.
    connected: bool,
    /// On a standby: since when the primary has been heard offline (or not at all).
    offline_since: Option<Instant>,
    heard: BTreeMap<BoardName, (i64, ChatDoc)>,
    /// The next time [`Seat::decide`] must run without a message (the end of a grace period).
    pub deadline: Option<Instant>,
    /// The poller is gone: nothing more will be confirmed.
    closed: bool,
    /// Whether this board last said it holds the chat (the broker's echo of
    /// an earlier document may come after a newer one was kept).
    said_holding: bool,
}

impl Seat {
    pub fn new(
        seam: shared::Seat,
        me: BoardName,
        role: FleetRole,
        primary: Option<BoardName>,
        grace: Duration,
    ) -> Seat {
        let primary = if role == FleetRole::Primary { None } else { primary };
        let started = Instant::now();
        Seat {
            seam,
            me,
            primary,
            grace,
            started,
            connected: false,
            offline_since: None,
            heard: BTreeMap::new(),
            deadline: Some(started + grace),
            closed: false,
            said_holding: false,
        }
    }

    /// Whether this board's poller holds the chat now.
    pub fn holding(&self) -> bool {
        self.seam.confirmed.borrow().is_some_and(|c| c.polling)
    }

    /// `bramble/<board>/status` came in (after `boards` took it).
    pub fn on_status(&mut self, board: &BoardName, online: bool, boards: &Boards) {
        if *board == self.me && online {
            self.connected = true;
        }
        self.decide(boards);
    }

    /// A chat document: checked with the fleet key and kept when newer.
    pub fn on_doc(&mut self, signer: &Signer, topic: &str, payload: &[u8], boards: &Boards) -> Result<(), DocError> {
        let Some(board) = board_of(topic) else { return Ok(()) };
        if payload.is_empty() {
            self.heard.remove(&board);
            self.decide(boards);
            return Ok(());
        }
        if payload.len() > MAX_DOC {
            return Err(DocError::TooLarge(payload.len()));
        }
        let e: Envelope = serde_json::from_slice(payload).map_err(|e| DocError::Malformed(e.to_string()))?;
        if !signer.verify(topic, &e) {
            return Err(DocError::Mac);
        }
        if e.from != board || e.to != board || e.kind != KIND {
            return Err(DocError::Sender(e.from));
        }
        let doc: ChatDoc = serde_json::from_str(&e.body).map_err(|e| DocError::Malformed(e.to_string()))?;
        if let Some((ts, old)) = self.heard.get(&board) {
            if old.bot == doc.bot && (doc.next < old.next || (doc.next == old.next && e.ts < *ts)) {
                return Err(DocError::Older);
            }
        }
        self.heard.insert(board, (e.ts, doc));
        self.decide(boards);
        Ok(())
    }

    /// Work out whether this board should poll, and tell its poller when that changed.
    pub fn decide(&mut self, boards: &Boards) {
        let now = Instant::now();
        let (poll, wake) = self.wanted(boards, now);
        let floor: Vec<Offset> = self.heard.values().map(|(_, d)| Offset { bot: d.bot, next: d.next }).collect();
        let turn = Turn { poll, floor };
        self.seam.turn.send_if_modified(|t| {
            if poll != t.poll {
                tracing::info!(poll, "fleet: {}", if poll { "taking the chat" } else { "leaving the chat" });
            }
            let changed = *t != turn;
            *t = turn;
            changed
        });
        self.deadline = wake;
    }

    /// Whether to poll now, and when to think again without a message.
    fn wanted(&mut self, boards: &Boards, now: Instant) -> (bool, Option<Instant>) {
        let me = &self.me;
        let others_hold = self.heard.iter().any(|(b, (_, d))| b != me && d.holding && boards.is_online(b));
        let Some(primary) = &self.primary else {
            // The primary: once connected, whenever no other board holds the chat; without a
            // broker, after the grace period (a fleet whose broker is down still has its chat).
            if self.connected {
                return (!others_hold, None);
            }
            let at = self.started + self.grace;
            return (now >= at, (now < at).then_some(at));
        };
        if !self.connected || boards.is_online(primary) {
            self.offline_since = None;
            return (false, None);
        }
        let at = *self.offline_since.get_or_insert(now) + self.grace;
        let polling = self.seam.turn.borrow().poll;
        let lower = boards
            .0
            .iter()
            .any(|(b, s)| b < me && s.online && s.presence.as_ref().is_some_and(|p| p.role == FleetRole::Standby));
        (now >= at && (polling || (!others_hold && !lower)), (now < at).then_some(at))
    }

    /// What the poller confirmed since last asked: the document to publish
    /// (topic, payload) and whether this board's holding changed.
    pub fn confirmed(&mut self, signer: &Signer) -> Option<(String, Vec<u8>, bool)> {
        let c = (*self.seam.confirmed.borrow_and_update())?;
        let topic = topic(&self.me);
        let was = std::mem::replace(&mut self.said_holding, c.polling);
        let doc = ChatDoc { bot: c.offset.bot, next: c.offset.next, holding: c.polling };
        let body = serde_json::to_string(&doc).ok()?;
        let e = signer.seal(&topic, &self.me, &self.me, KIND, "", body);
        let bytes = serde_json::to_vec(&e).ok()?;
        // Kept at once: the broker's echo may come after the next decision.
        self.heard.insert(self.me.clone(), (e.ts, doc));
        Some((topic, bytes, was != c.polling))
    }

    /// Until the poller confirms something (never once it is gone).
    pub async fn changed(seat: &mut Option<Seat>) {
        match seat {
            Some(s) if !s.closed => {
                if s.seam.confirmed.changed().await.is_err() {
                    s.closed = true;
                }
            }
            _ => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channels::telegram::shared::{seam, Confirmed};

    fn b(n: &str) -> BoardName {
        n.parse().unwrap()
    }

    fn signer() -> Signer {
        Signer::new(b"k".repeat(32).as_slice())
    }

    fn doc(s: &Signer, board: &str, next: i64, holding: bool) -> Vec<u8> {
        let body = serde_json::to_string(&ChatDoc { bot: 1, next, holding }).unwrap();
        serde_json::to_vec(&s.seal(&topic(&b(board)), &b(board), &b(board), KIND, "", body)).unwrap()
    }

    fn online(boards: &mut Boards, board: &str, yes: bool) {
        boards.status(&b(board), if yes { b"online" } else { b"offline" }, 0);
    }

    #[test]
    fn topics_read_back() {
        assert_eq!(board_of(&topic(&b("garage"))), Some(b("garage")));
        assert_eq!(board_of("bramble/garage/fleet/board"), None);
        assert_eq!(board_of("bramble/Garage/fleet/chat"), None);
        let acl = super::super::topics::mosquitto_acl(&[b("living")]);
        assert!(acl.contains("user living\n") && acl.contains("topic read bramble/+/fleet/chat\n"), "{acl}");
        assert!(!acl.contains("pattern read bramble/+/fleet/chat"), "not every account's to read: {acl}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_standby_takes_over_after_the_grace_and_hands_back() {
        let (shared, fleet) = seam();
        let grace = Duration::from_secs(60);
        let mut seat = Seat::new(fleet, b("garage"), FleetRole::Standby, Some(b("living")), grace);
        let mut boards = Boards::default();
        online(&mut boards, "living", true);
        online(&mut boards, "garage", true);
        seat.on_status(&b("garage"), true, &boards);
        assert!(!shared.turn.borrow().poll && seat.deadline.is_none(), "the primary is online: no timer");
        // The primary publishes where it stands.
        let s = signer();
        seat.on_doc(&s, &topic(&b("living")), &doc(&s, "living", 1005, true), &boards).unwrap();
        online(&mut boards, "living", false);
        seat.on_status(&b("living"), false, &boards);
        assert!(!shared.turn.borrow().poll, "not within the grace period");
        let at = seat.deadline.expect("woken at the end of the grace");
        tokio::time::advance(grace).await;
        assert!(Instant::now() >= at);
        seat.decide(&boards);
        let turn = shared.turn.borrow().clone();
        assert!(turn.poll);
        assert_eq!(turn.floor, vec![Offset { bot: 1, next: 1005 }]);
        // The primary comes back: the standby stops.
        online(&mut boards, "living", true);
        seat.on_status(&b("living"), true, &boards);
        assert!(!shared.turn.borrow().poll);
    }

    #[tokio::test(start_paused = true)]
    async fn the_primary_waits_for_the_standby_to_let_go() {
        let (shared, fleet) = seam();
        let mut seat = Seat::new(fleet, b("living"), FleetRole::Primary, None, Duration::from_secs(60));
        let mut boards = Boards::default();
        let s = signer();
        online(&mut boards, "garage", true);
        seat.on_doc(&s, &topic(&b("garage")), &doc(&s, "garage", 1010, true), &boards).unwrap();
        online(&mut boards, "living", true);
        seat.on_status(&b("living"), true, &boards);
        assert!(!shared.turn.borrow().poll, "the garage holds the chat");
        // Older, forged, misaddressed, oversize: ignored, nothing changes.
        let older = doc(&s, "garage", 1003, false);
        assert_eq!(seat.on_doc(&s, &topic(&b("garage")), &older, &boards), Err(DocError::Older));
        let rogue = Signer::new(b"r".repeat(32).as_slice());
        let forged = doc(&rogue, "garage", 999_999, false);
        assert_eq!(seat.on_doc(&s, &topic(&b("garage")), &forged, &boards), Err(DocError::Mac));
        let attic = doc(&s, "attic", 999_999, false);
        assert_eq!(seat.on_doc(&s, &topic(&b("garage")), &attic, &boards), Err(DocError::Mac));
        assert!(matches!(seat.on_doc(&s, &topic(&b("garage")), b"{", &boards), Err(DocError::Malformed(_))));
        let big = vec![b' '; MAX_DOC + 1];
        assert!(matches!(seat.on_doc(&s, &topic(&b("garage")), &big, &boards), Err(DocError::TooLarge(_))));
        assert!(!shared.turn.borrow().poll);
        // It lets go: the primary polls from where it stopped.
        seat.on_doc(&s, &topic(&b("garage")), &doc(&s, "garage", 1012, false), &boards).unwrap();
        let turn = shared.turn.borrow().clone();
        assert!(turn.poll);
        assert_eq!(shared::start_from(0, 1, &turn.floor), 1012);
    }

    #[tokio::test(start_paused = true)]
    async fn of_two_standbys_the_lower_name_takes_over() {
        let grace = Duration::from_secs(10);
        let mut boards = Boards::default();
        for (name, role) in [("attic", FleetRole::Standby), ("garage", FleetRole::Standby)] {
            let p = super::super::presence::Presence {
                board: b(name),
                role,
                version: "0".into(),
                capabilities: vec![],
                since: String::new(),
                jobs: vec![],
                chat: false,
            };
            boards.presence(&b(name), &serde_json::to_vec(&p).unwrap()).unwrap();
            online(&mut boards, name, true);
        }
        let ((attic_poller, attic_seam), (garage_poller, garage_seam)) = (seam(), seam());
        let mut attic = Seat::new(attic_seam, b("attic"), FleetRole::Standby, Some(b("living")), grace);
        let mut garage = Seat::new(garage_seam, b("garage"), FleetRole::Standby, Some(b("living")), grace);
        for seat in [&mut attic, &mut garage] {
            seat.on_status(&b("attic"), true, &boards);
            seat.on_status(&b("garage"), true, &boards);
        }
        tokio::time::advance(grace).await;
        attic.decide(&boards);
        garage.decide(&boards);
        assert!(attic_poller.turn.borrow().poll);
        assert!(!garage_poller.turn.borrow().poll, "attic < garage");
        // The attic confirms it holds; it dies; the garage takes over after its own grace.
        attic_poller.confirmed.send_replace(Some(Confirmed { offset: Offset { bot: 1, next: 7 }, polling: true }));
        let (t, payload, changed) = attic.confirmed(&signer()).unwrap();
        assert!(changed);
        garage.on_doc(&signer(), &t, &payload, &boards).unwrap();
        online(&mut boards, "attic", false);
        garage.on_status(&b("attic"), false, &boards);
        assert!(garage_poller.turn.borrow().poll, "the primary has been gone for the grace already");
        assert_eq!(garage_poller.turn.borrow().floor, vec![Offset { bot: 1, next: 7 }]);
    }
}
