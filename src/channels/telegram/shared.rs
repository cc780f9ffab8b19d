//! One bot, several boards (fleet mode, docs/fleet.md "The chat survives the
//! primary"): the seam through which something above the channels says when
//! this board may poll, and hears which offset it confirmed.
//!
//! A bot token allows one `getUpdates` poller, so in a fleet the poller waits
//! for its [`Turn`]: while `poll` is false it makes no request at all. When
//! its turn comes it starts from the highest of its own offset file and the
//! fleet's `floor` for the same bot (the offset the board that polled before
//! published), and after every batch (handed over, then written to the offset
//! file) it reports the next offset through [`Confirmed`], before it polls
//! again. When the turn is taken away it stops between batches (an update
//! being handed over is finished first), reports its last offset with
//! `polling: false`, and waits.
//!
//! Layer: the channel owns the seam; the fleet (above) holds the other ends.

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::{OffsetFile, Polling};
use crate::util::timer::Backoff;

/// Where a bot's updates stand: the next update id to ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Offset {
    /// The bot's user id (`getMe`): update ids belong to one bot.
    pub bot: i64,
    pub next: i64,
}

/// What the fleet lets this board's poller do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Turn {
    /// Poll now; `false`: do not poll (or stop, and hand the chat back).
    pub poll: bool,
    /// The offsets other boards published (the poller takes the highest for its bot).
    pub floor: Vec<Offset>,
}

/// What the poller confirmed: after each batch, and when it starts or stops polling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Confirmed {
    pub offset: Offset,
    /// It holds the chat (polls) now.
    pub polling: bool,
}

/// The poller's ends of the seam.
pub struct Shared {
    pub turn: watch::Receiver<Turn>,
    pub confirmed: watch::Sender<Option<Confirmed>>,
}

/// The fleet's ends of the seam.
pub struct Seat {
    pub turn: watch::Sender<Turn>,
    pub confirmed: watch::Receiver<Option<Confirmed>>,
}

/// A new seam: nobody polls until the fleet says so.
pub fn seam() -> (Shared, Seat) {
    let (turn_tx, turn_rx) = watch::channel(Turn::default());
    let (conf_tx, conf_rx) = watch::channel(None);
    (Shared { turn: turn_rx, confirmed: conf_tx }, Seat { turn: turn_tx, confirmed: conf_rx })
}

/// The offset to start from: ours, or the fleet's for the same bot when it is further on.
pub fn start_from(own: i64, bot: i64, floor: &[Offset]) -> i64 {
    floor.iter().filter(|f| f.bot == bot).map(|f| f.next).fold(own, i64::max)
}

/// Until `turn` says stop (or its sender is gone).
async fn taken_away(turn: &mut watch::Receiver<Turn>) {
    loop {
        if !turn.borrow_and_update().poll {
            return;
        }
        if turn.changed().await.is_err() {
            return;
        }
    }
}

/// The shared poller: poll while it is this board's turn (see the header).
pub(super) async fn serve(mut polling: Polling, file: OffsetFile, mut offset: i64, mut shared: Shared) {
    let stop = polling.stop.clone();
    let bot = polling.poller.me.id;
    polling.confirmed = Some(shared.confirmed.clone());
    loop {
        loop {
            if shared.turn.borrow_and_update().poll {
                break;
            }
            tracing::debug!("Telegram: another board holds the chat; not polling");
            tokio::select! {
                r = shared.turn.changed() => if r.is_err() { return },
                () = stop.cancelled() => return,
            }
        }
        let from = start_from(offset, bot, &shared.turn.borrow().floor);
        if from != offset {
            offset = from;
            if let Err(e) = file.save(offset) {
                tracing::warn!(error = %e, "cannot save the Telegram offset the fleet gave");
            }
        }
        tracing::info!(offset, "Telegram: this board holds the chat now; polling");
        let _ = shared.confirmed.send(Some(Confirmed { offset: Offset { bot, next: offset }, polling: true }));
        let session = stop.child_token();
        polling.stop = session.clone();
        let mut backoff = Backoff::new(super::MAX_BACKOFF);
        let ended = {
            let run = polling.run(&file, offset, &mut backoff);
            tokio::pin!(run);
            tokio::select! {
                o = &mut run => (o, false),
                () = taken_away(&mut shared.turn) => {
                    session.cancel();
                    (run.await, true)
                }
            }
        };
        offset = ended.0;
        let _ = shared.confirmed.send(Some(Confirmed { offset: Offset { bot, next: offset }, polling: false }));
        if !ended.1 || stop.is_cancelled() {
            // Stopped, the token refused or the bus gone: as without a fleet, the poller ends.
            return;
        }
        tracing::info!(offset, "Telegram: handed the chat back; not polling");
        polling.stop = stop.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_is_the_highest_offset_for_this_bot() {
        let floor = [Offset { bot: 1, next: 50 }, Offset { bot: 2, next: 900 }, Offset { bot: 1, next: 40 }];
        assert_eq!(start_from(10, 1, &floor), 50);
        assert_eq!(start_from(60, 1, &floor), 60, "never backwards");
        assert_eq!(start_from(10, 3, &floor), 10, "another bot's offset is not ours");
    }

    #[tokio::test]
    async fn the_turn_taken_away_ends_the_wait() {
        let (mut shared, seat) = seam();
        seat.turn.send_replace(Turn { poll: true, floor: vec![] });
        let waiting = tokio::spawn(async move { taken_away(&mut shared.turn).await });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        seat.turn.send_replace(Turn { poll: false, floor: vec![] });
        waiting.await.unwrap();
    }
}
