//! `/pair <code>`: a new user joins with the code `bramble pair` printed.
//!
//! Handled here, in the poller, because the sender is not (yet) allowed: a
//! stranger's message never reaches the bus. Only in private chats; one try
//! per user per [`pairing::TRY_GAP`] is answered (more are dropped and
//! logged); every try is logged with the user's id. The code's own limits
//! (10 minutes, used once, void after 5 wrong tries, kept across restarts)
//! are in [`crate::policy::pairing`].

use std::time::Instant;

use super::Poller;
use crate::clients::telegram::{Api, Message};
use crate::policy::pairing::{self, Redeemed};

/// The code of a `/pair <code>` (or `/pair@thisbot <code>`) message in a private chat.
pub(super) fn request(m: &Message) -> Option<String> {
    if m.chat.kind != "private" {
        return None;
    }
    let text = m.text.as_deref()?.trim();
    let (command, rest) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
    let name = command.split('@').next()?;
    (name == "/pair").then(|| rest.trim().to_string())
}

impl Poller {
    /// Answer a `/pair` message from `m`'s sender.
    pub(super) async fn pair(&mut self, api: &Api, state_dir: &std::path::Path, m: &Message, code: String) {
        let Some(from) = m.from.clone() else { return };
        let chat = m.chat.id.to_string();
        let reply = |text: String| async move {
            if let Err(e) = api.send_message(&chat, &text, false).await {
                tracing::warn!(error = %e, "cannot answer a /pair message");
            }
        };
        if self.allow.allows(from.id, from.username.as_deref()) {
            reply("You can already talk to me.".into()).await;
            return;
        }
        let now = Instant::now();
        if self.pair_tries.get(&from.id).is_some_and(|t| now.duration_since(*t) < pairing::TRY_GAP) {
            tracing::warn!(user_id = from.id, "a /pair try too soon after the last one was ignored");
            return;
        }
        if self.pair_tries.len() >= 1024 {
            self.pair_tries.clear();
        }
        self.pair_tries.insert(from.id, now);
        if code.is_empty() {
            reply("Send the code too: /pair ABCD-EFGH (the owner gets one with `bramble pair`).".into()).await;
            return;
        }
        let (dir, name, id) = (state_dir.to_path_buf(), from.username.clone(), from.id);
        let at = jiff::Timestamp::now();
        let outcome = tokio::task::spawn_blocking(move || {
            pairing::redeem(&dir, &code, &crate::bus::Principal::Telegram(id), name.as_deref(), at)
        })
        .await;
        let user = from.username.as_deref().unwrap_or("-");
        let text = match outcome {
            Ok(Ok(Redeemed::Paired)) => {
                self.allow.add_paired(from.id);
                tracing::warn!(user_id = from.id, username = %user, "paired a Telegram user: they are served from now on");
                "Paired: you can talk to me now.".to_string()
            }
            Ok(Ok(Redeemed::Wrong { left })) => {
                tracing::warn!(user_id = from.id, username = %user, left, "a wrong Telegram pairing code");
                format!("That code is not right ({left} tries left for it).")
            }
            Ok(Ok(Redeemed::Voided)) => {
                tracing::warn!(user_id = from.id, username = %user, "too many wrong pairing codes: the code is void");
                "Too many wrong codes: that code no longer works. Ask the owner for a new one.".to_string()
            }
            Ok(Ok(Redeemed::NoCode)) => {
                tracing::warn!(user_id = from.id, username = %user, "a /pair with no valid code pending");
                "There is no valid pairing code: ask the owner to run `bramble pair` (a code lasts 10 minutes).".into()
            }
            Ok(Err(e)) => {
                tracing::error!(error = %e, "cannot read or write the pairing files");
                "Pairing failed on the bot's side; the owner can see why in its log.".into()
            }
            Err(e) => {
                tracing::error!(error = %e, "pairing stopped");
                "Pairing failed on the bot's side; the owner can see why in its log.".into()
            }
        };
        reply(text).await;
    }

    /// Reload the paired users when `telegram-paired.json` changed (a
    /// `bramble pair --revoke`); one `stat` per batch of updates, off the
    /// runtime thread like every read of the state directory here.
    pub(super) async fn refresh_paired(&mut self, state_dir: &std::path::Path) {
        let (dir, seen) = (state_dir.to_path_buf(), self.paired_stamp);
        let changed = tokio::task::spawn_blocking(move || {
            let stamp = pairing::stamp(&dir, pairing::PairChannel::Telegram);
            (stamp != seen).then(|| (stamp, pairing::paired_ids(&dir)))
        })
        .await;
        if let Ok(Some((stamp, ids))) = changed {
            self.paired_stamp = stamp;
            self.allow.set_paired(ids);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(kind: &str, text: &str) -> Message {
        Message {
            chat: crate::clients::telegram::Chat { id: 5, kind: kind.into(), ..Default::default() },
            text: Some(text.into()),
            ..Default::default()
        }
    }

    #[test]
    fn pair_requests_are_private_commands() {
        assert_eq!(request(&msg("private", "/pair ABCD-EFGH")).as_deref(), Some("ABCD-EFGH"));
        assert_eq!(request(&msg("private", "/pair@bramble_bot  abcd efgh ")).as_deref(), Some("abcd efgh"));
        assert_eq!(request(&msg("private", "/pair")).as_deref(), Some(""));
        assert!(request(&msg("group", "/pair ABCD-EFGH")).is_none());
        assert!(request(&msg("private", "/pairing")).is_none() && request(&msg("private", "pair ABCD")).is_none());
    }
}
