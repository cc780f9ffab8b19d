//! `/pair <code>` in Matrix: a new user joins with the code `bramble pair
//! --channel matrix` printed.
//!
//! Handled in the poller, because the sender is not (yet) allowed: a
//! stranger's message never reaches the bus. The new user needs a room with
//! the bot: one the bot is in already, or one they invite it to; a
//! stranger's invite is taken only while a Matrix code is pending (and the
//! room is left again at its next event if nobody paired by then, like any
//! room no allowed user invited us to). One try per user per
//! [`pairing::TRY_GAP`] is answered (more are dropped and logged); every try
//! is logged with the user id. The code's own limits (10 minutes, used once,
//! void after 5 wrong tries) are in [`crate::policy::pairing`].

use std::time::Instant;

use super::inbound::Handler;
use crate::bus::Principal;
use crate::policy::pairing::{self, PairChannel, Redeemed};

/// Users whose last try is remembered; the map is cleared when full.
const MAX_TRIES: usize = 1024;

impl Handler {
    /// Read the paired users again if `bramble pair` changed them, and learn
    /// whether a code is pending (a stranger's invite is taken only then).
    pub(super) async fn refresh_pairing(&mut self) {
        let policy = self.matrix.policy.clone();
        let dir = self.matrix.shared.state_dir.clone();
        let open = crate::util::tasks::blocking(move || {
            policy.refresh();
            pairing::pending(&dir, PairChannel::Matrix, jiff::Timestamp::now())
        })
        .await;
        self.pairing_open = open;
    }

    /// Answer `/pair <code>` from `user` in `room`; `true`: it was answered.
    pub(super) async fn pair(&mut self, room: &str, user: &str, code: String) -> bool {
        if self.matrix.policy.allows(user) {
            self.notice(room, "You can already talk to me.").await;
            return true;
        }
        let now = Instant::now();
        if self.pair_tries.get(user).is_some_and(|t| now.duration_since(*t) < pairing::TRY_GAP) {
            tracing::warn!(user, "a Matrix /pair try too soon after the last one was ignored");
            return false;
        }
        if self.pair_tries.len() >= MAX_TRIES {
            self.pair_tries.clear();
        }
        self.pair_tries.insert(user.to_string(), now);
        if code.is_empty() {
            self.notice(
                room,
                "Send the code too: /pair ABCD-EFGH (the owner gets one with `bramble pair --channel matrix`).",
            )
            .await;
            return true;
        }
        let (dir, who) = (self.matrix.shared.state_dir.clone(), Principal::Matrix(user.to_string()));
        let at = jiff::Timestamp::now();
        let outcome = crate::util::tasks::blocking(move || pairing::redeem(&dir, &code, &who, None, at)).await;
        match &outcome {
            Ok(Redeemed::Paired) => {
                self.matrix.policy.add_paired(user);
                tracing::warn!(user, room, "paired a Matrix user: they are served from now on");
            }
            Ok(Redeemed::Wrong { left }) => tracing::warn!(user, left, "a wrong Matrix pairing code"),
            Ok(Redeemed::Voided) => tracing::warn!(user, "too many wrong pairing codes: the Matrix code is void"),
            Ok(Redeemed::NoCode) => tracing::warn!(user, "a Matrix /pair with no valid code pending"),
            Err(e) => tracing::error!(error = %e, "cannot read or write the Matrix pairing files"),
        }
        self.notice(room, &pairing::answer(&outcome)).await;
        true
    }
}
