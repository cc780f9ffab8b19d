//! What the agent remembers of each session while it runs: one map, one lock.
//!
//! A session's live state — its turn lock, the turns running or queued in it
//! (for `/stop`), its `/model` override, who answered its last turn, whether
//! it was told its model is blind — lives in one [`SessionState`] under one
//! mutex, so no two tables can disagree about a session and an entry goes
//! away when nothing is left in it. It is memory only: a restart forgets it
//! (the session files are [`super::session`]'s).
//!
//! The guards ([`ActiveTurn`], [`SessionLock`], [`PendingGuard`]) give back
//! what a turn took on drop, on every path, cancellation included.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio_util::sync::CancellationToken;

use super::pending::{PendingId, PendingStore};
use crate::provider::Route;

/// One session's live state.
#[derive(Default)]
pub(super) struct SessionState {
    /// Its turn lock, while a turn holds or waits for it.
    lock: Option<Arc<tokio::sync::Mutex<()>>>,
    /// Cancel tokens of its turns running or queued (for `/stop`), by turn id.
    active: Vec<(u64, CancellationToken)>,
    /// Its `/model` override: a restart goes back to the configured model.
    model: Option<String>,
    /// Who answered its last turn (`provider/model`, and why if a fallback), for `/status`.
    answered: Option<Route>,
    /// Already told that its model cannot see images.
    told_blind: bool,
}

impl SessionState {
    fn is_empty(&self) -> bool {
        self.lock.is_none()
            && self.active.is_empty()
            && self.model.is_none()
            && self.answered.is_none()
            && !self.told_blind
    }
}

/// Every session's live state, by session key.
#[derive(Default)]
pub(super) struct Sessions {
    map: Mutex<HashMap<String, SessionState>>,
    /// Names turns, for their entry in [`SessionState::active`].
    next_turn: AtomicU64,
}

impl Sessions {
    fn map(&self) -> MutexGuard<'_, HashMap<String, SessionState>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Change `key`'s state; its entry is dropped when nothing is left in it.
    fn update<T>(&self, key: &str, f: impl FnOnce(&mut SessionState) -> T) -> T {
        let mut map = self.map();
        let state = map.entry(key.to_string()).or_default();
        let out = f(state);
        if state.is_empty() {
            map.remove(key);
        }
        out
    }

    /// Read `key`'s state (the default when it has none).
    fn read<T>(&self, key: &str, f: impl FnOnce(&SessionState) -> T) -> T {
        match self.map().get(key) {
            Some(state) => f(state),
            None => f(&SessionState::default()),
        }
    }

    /// Take the cancel tokens of `key`'s turns, running or queued.
    pub(super) fn take_active(&self, key: &str) -> Vec<CancellationToken> {
        self.update(key, |s| std::mem::take(&mut s.active)).into_iter().map(|(_, t)| t).collect()
    }

    /// Whether a turn of `key` is running or queued.
    pub(super) fn busy(&self, key: &str) -> bool {
        self.read(key, |s| !s.active.is_empty())
    }

    /// Turns running or queued, over all sessions.
    pub(super) fn active_turns(&self) -> usize {
        self.map().values().map(|s| s.active.len()).sum()
    }

    /// `key`'s `/model` override.
    pub(super) fn model(&self, key: &str) -> Option<String> {
        self.read(key, |s| s.model.clone())
    }

    pub(super) fn set_model(&self, key: &str, model: Option<String>) {
        self.update(key, |s| s.model = model);
    }

    /// Who answered `key`'s last turn.
    pub(super) fn answered(&self, key: &str) -> Option<Route> {
        self.read(key, |s| s.answered.clone())
    }

    pub(super) fn set_answered(&self, key: &str, route: Route) {
        self.update(key, |s| s.answered = Some(route));
    }

    /// Mark `key` as told that its model is blind; whether it was not yet.
    pub(super) fn tell_blind(&self, key: &str) -> bool {
        self.update(key, |s| !std::mem::replace(&mut s.told_blind, true))
    }
}

/// A turn's entry in its session's table of stoppable turns, removed on drop.
pub(super) struct ActiveTurn<'a> {
    sessions: &'a Sessions,
    key: String,
    id: u64,
}

impl<'a> ActiveTurn<'a> {
    pub(super) fn new(sessions: &'a Sessions, key: &str, cancel: &CancellationToken) -> Self {
        let id = sessions.next_turn.fetch_add(1, Ordering::Relaxed);
        sessions.update(key, |s| s.active.push((id, cancel.clone())));
        ActiveTurn { sessions, key: key.to_string(), id }
    }
}

impl Drop for ActiveTurn<'_> {
    fn drop(&mut self) {
        let id = self.id;
        self.sessions.update(&self.key, |s| s.active.retain(|(i, _)| *i != id));
    }
}

/// A session's turn lock, taken from its state and given back on drop (on
/// every path, cancellation included), so the map holds only live sessions.
pub(super) struct SessionLock<'a> {
    sessions: &'a Sessions,
    key: String,
    pub(super) lock: Arc<tokio::sync::Mutex<()>>,
}

impl<'a> SessionLock<'a> {
    pub(super) fn new(sessions: &'a Sessions, key: &str) -> Self {
        let lock = sessions.update(key, |s| Arc::clone(s.lock.get_or_insert_with(Arc::default)));
        SessionLock { sessions, key: key.to_string(), lock }
    }
}

impl Drop for SessionLock<'_> {
    fn drop(&mut self) {
        let lock = &self.lock;
        self.sessions.update(&self.key, |s| {
            // One reference in the state, one here: nobody else holds or waits for it.
            if Arc::strong_count(lock) == 2 {
                s.lock = None;
            }
        });
    }
}

/// A turn's pending record, released (kept on disk for the next start) when
/// the turn ends without [`PendingStore::finish`].
pub(super) struct PendingGuard<'a> {
    pub(super) store: &'a PendingStore,
    pub(super) id: PendingId,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.store.release(self.id);
    }
}
