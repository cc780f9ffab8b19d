//! The guards of a turn, each given back on drop on every path (cancellation
//! included): its entry in the table of stoppable turns, its pending record,
//! and its session's lock.

use super::*;

/// A turn's entry in the agent's table of stoppable turns, removed on drop.
pub(super) struct ActiveTurn<'a> {
    pub(super) agent: &'a Agent,
    pub(super) key: String,
    pub(super) id: u64,
}

impl<'a> ActiveTurn<'a> {
    pub(super) fn new(agent: &'a Agent, key: &str, cancel: &CancellationToken) -> Self {
        let id = agent.next_turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        agent.active_lock().entry(key.to_string()).or_default().push((id, cancel.clone()));
        ActiveTurn { agent, key: key.to_string(), id }
    }
}

impl Drop for ActiveTurn<'_> {
    fn drop(&mut self) {
        let mut active = self.agent.active_lock();
        if let Some(list) = active.get_mut(&self.key) {
            list.retain(|(id, _)| *id != self.id);
            if list.is_empty() {
                active.remove(&self.key);
            }
        }
    }
}

/// A turn's pending record, released (kept on disk for the next start) when
/// the turn ends without [`PendingStore::finish`].
pub(super) struct PendingGuard<'a> {
    pub(super) store: &'a PendingStore,
    pub(super) id: super::pending::PendingId,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.store.release(self.id);
    }
}

/// A session's turn lock, taken from the agent's map and given back on drop
/// (on every path, cancellation included), so the map holds only live sessions.
pub(super) struct SessionLock<'a> {
    pub(super) agent: &'a Agent,
    pub(super) key: String,
    pub(super) lock: Arc<tokio::sync::Mutex<()>>,
}

impl<'a> SessionLock<'a> {
    pub(super) fn new(agent: &'a Agent, key: &str) -> Self {
        let mut locks = agent.locks.lock().unwrap_or_else(|p| p.into_inner());
        let lock = Arc::clone(locks.entry(key.to_string()).or_default());
        SessionLock { agent, key: key.to_string(), lock }
    }
}

impl Drop for SessionLock<'_> {
    fn drop(&mut self) {
        let mut locks = self.agent.locks.lock().unwrap_or_else(|p| p.into_inner());
        // One reference in the map, one here: nobody else holds or waits for it.
        if Arc::strong_count(&self.lock) == 2 {
            locks.remove(&self.key);
        }
    }
}
