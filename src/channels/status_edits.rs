//! One status message per chat while a chat turn runs tools ("reading
//! notes.md…"), edited in place as the turn moves on and removed when the
//! answer is delivered: the engine Matrix's notice and Feishu's card share.
//! Each channel says how to post, edit and remove its message ([`Surface`])
//! and how often it may (its server's rate limit); the engine keeps one
//! worker per chat.
//!
//! A chat's status changes at most once per [`Surface::GAP`], always to the
//! newest step (steps in between are skipped, not queued). A failed post or
//! edit silences the chat's status until its answer; it is never retried.
//! Scheduled deliveries never get one: only chat turns report steps. The
//! agent calls [`step`] on the runtime thread; it only records the step and,
//! if needed, starts the chat's worker.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::util::BoxFuture;

/// The status messages of all chats of one channel (kept where its delivery
/// can end them: [`finish`]).
#[derive(Default)]
pub struct Statuses(Mutex<HashMap<String, Status>>);

#[derive(Default)]
struct Status {
    /// The message's id, once posted.
    id: Option<String>,
    /// The newest step, and the one on screen.
    wanted: Option<String>,
    shown: Option<String>,
    /// A worker task is running for the chat.
    worker: bool,
    /// A post or edit failed: no more until the answer.
    muted: bool,
}

impl Statuses {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Status>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// How one channel shows a status message.
pub trait Surface: Clone + Send + Sync + 'static {
    /// At most one post or edit per chat this often.
    const GAP: Duration;
    /// Chats tracked at once; beyond it new steps are not shown.
    const MAX_CHATS: usize = 256;
    /// The message in log lines ("the Matrix status notice").
    const WHAT: &'static str;

    fn statuses(&self) -> &Statuses;
    /// Post `text` in `chat`: the new message's id.
    fn post<'a>(&'a self, chat: &'a str, text: &'a str) -> BoxFuture<'a, Result<String, String>>;
    /// Replace message `id`'s text.
    fn edit<'a>(&'a self, chat: &'a str, id: &'a str, text: &'a str) -> BoxFuture<'a, Result<(), String>>;
    /// Take message `id` away (errors are only logged).
    fn remove<'a>(&'a self, chat: &'a str, id: &'a str) -> BoxFuture<'a, ()>;
}

/// A chat turn in `chat` is at step `what`: shown when the chat's worker
/// next may.
pub fn step<S: Surface>(surface: &S, chat: &str, what: &str) {
    let start = {
        let mut chats = surface.statuses().lock();
        if !chats.contains_key(chat) && chats.len() >= S::MAX_CHATS {
            return;
        }
        let s = chats.entry(chat.to_string()).or_default();
        if s.muted {
            return;
        }
        s.wanted = Some(what.to_string());
        !std::mem::replace(&mut s.worker, true)
    };
    if start {
        tokio::spawn(work(surface.clone(), chat.to_string()));
    }
}

/// The answer for `chat` is being delivered: its status message goes.
pub async fn finish<S: Surface>(surface: &S, chat: &str) {
    let id = {
        let Some(status) = surface.statuses().lock().remove(chat) else { return };
        status.id
    };
    if let Some(id) = id {
        surface.remove(chat, &id).await;
    }
}

/// Show `chat`'s newest step until there is no newer one.
async fn work<S: Surface>(surface: S, chat: String) {
    loop {
        let (text, id) = {
            let mut chats = surface.statuses().lock();
            let Some(s) = chats.get_mut(&chat) else { return };
            match &s.wanted {
                Some(w) if !s.muted && s.shown.as_ref() != Some(w) => (w.clone(), s.id.clone()),
                _ => {
                    s.worker = false;
                    return;
                }
            }
        };
        let sent = match &id {
            None => surface.post(&chat, &text).await.map(Some),
            Some(id) => surface.edit(&chat, id, &text).await.map(|()| None),
        };
        let orphan = {
            let mut chats = surface.statuses().lock();
            match (chats.get_mut(&chat), sent) {
                (Some(s), Ok(new)) => {
                    s.id = s.id.take().or(new.filter(|id| !id.is_empty()));
                    s.shown = Some(text);
                    None
                }
                // The answer came while this was being posted: it goes too.
                (None, Ok(Some(id))) => Some(id),
                (None, _) => return,
                (Some(s), Err(e)) => {
                    tracing::debug!(error = %e, "cannot update {}; silent until the answer", S::WHAT);
                    s.muted = true;
                    s.worker = false;
                    return;
                }
            }
        };
        if let Some(id) = orphan.filter(|id| !id.is_empty()) {
            surface.remove(&chat, &id).await;
            return;
        }
        tokio::time::sleep(S::GAP).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A surface that records what it was asked, and fails edits when told to.
    #[derive(Clone, Default)]
    struct Recorder {
        statuses: Arc<Statuses>,
        ops: Arc<Mutex<Vec<String>>>,
        fail_edits: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Recorder {
        fn ops(&self) -> Vec<String> {
            self.ops.lock().unwrap().clone()
        }
        async fn wait_for(&self, n: usize) -> Vec<String> {
            for _ in 0..500 {
                if self.ops().len() >= n {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            self.ops()
        }
    }

    impl Surface for Recorder {
        const GAP: Duration = Duration::from_millis(20);
        const WHAT: &'static str = "the test status";
        fn statuses(&self) -> &Statuses {
            &self.statuses
        }
        fn post<'a>(&'a self, chat: &'a str, text: &'a str) -> BoxFuture<'a, Result<String, String>> {
            self.ops.lock().unwrap().push(format!("post {chat} {text}"));
            Box::pin(async { Ok("m1".to_string()) })
        }
        fn edit<'a>(&'a self, chat: &'a str, id: &'a str, text: &'a str) -> BoxFuture<'a, Result<(), String>> {
            self.ops.lock().unwrap().push(format!("edit {chat} {id} {text}"));
            let fail = self.fail_edits.load(std::sync::atomic::Ordering::SeqCst);
            Box::pin(async move {
                if fail {
                    Err("refused".into())
                } else {
                    Ok(())
                }
            })
        }
        fn remove<'a>(&'a self, chat: &'a str, id: &'a str) -> BoxFuture<'a, ()> {
            self.ops.lock().unwrap().push(format!("remove {chat} {id}"));
            Box::pin(async {})
        }
    }

    #[tokio::test]
    async fn one_message_per_chat_shows_the_newest_step_and_goes_with_the_answer() {
        let r = Recorder::default();
        step(&r, "c1", "a");
        assert_eq!(r.wait_for(1).await, ["post c1 a"]);
        // Two steps while the worker waits out its gap: only the newest is shown.
        step(&r, "c1", "b");
        step(&r, "c1", "c");
        assert_eq!(r.wait_for(2).await, ["post c1 a", "edit c1 m1 c"]);
        finish(&r, "c1").await;
        assert_eq!(r.ops().last().map(String::as_str), Some("remove c1 m1"));
        // A chat with no status: nothing to remove.
        finish(&r, "c2").await;
        assert_eq!(r.ops().len(), 3);
    }

    #[tokio::test]
    async fn a_failed_edit_silences_the_chat_until_its_answer() {
        let r = Recorder::default();
        r.fail_edits.store(true, std::sync::atomic::Ordering::SeqCst);
        step(&r, "c1", "a");
        r.wait_for(1).await;
        step(&r, "c1", "b");
        assert_eq!(r.wait_for(2).await, ["post c1 a", "edit c1 m1 b"]);
        step(&r, "c1", "c");
        tokio::time::sleep(Recorder::GAP * 5).await;
        assert_eq!(r.ops().len(), 2, "muted: {:?}", r.ops());
        finish(&r, "c1").await;
        assert_eq!(r.ops().last().map(String::as_str), Some("remove c1 m1"), "the message still goes");
        // After the answer a new turn shows its steps again.
        step(&r, "c1", "d");
        assert_eq!(r.wait_for(4).await.last().map(String::as_str), Some("post c1 d"));
    }
}
