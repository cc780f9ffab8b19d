//! Messages a stop left unanswered (see [`super::pending`]): taken once at
//! start, then reported to their sender or run again (`[agent] unanswered`).

use tokio_util::sync::CancellationToken;

use super::pending::PendingTurn;
use super::{Agent, TurnError, TurnRequest};
use crate::bus::Target;
use crate::config::Unanswered;

impl Agent {
    /// Messages left unanswered by a process that died mid-turn (see
    /// [`pending`]): taken from the state directory, so each is handled once.
    /// `cli_only`: only those typed in a terminal (`bramble agent` takes these;
    /// the daemon takes all).
    pub fn take_unanswered(&self, cli_only: bool) -> Vec<PendingTurn> {
        self.pending.take_orphans(|r| !cli_only || r.conversation.channel == crate::bus::Channel::Cli)
    }

    /// Handle unanswered messages as `[agent] unanswered` says: `deliver` gets
    /// the notice for each (report), or the answer of running it again (rerun).
    pub async fn resolve_unanswered(
        &self,
        cli_only: bool,
        cancel: &CancellationToken,
        mut deliver: impl FnMut(Target, String),
    ) {
        for p in self.take_unanswered(cli_only) {
            tracing::warn!(session = %p.conversation.session_key, started = %p.started, "a message was left unanswered by an earlier stop");
            let text = match self.settings.unanswered {
                Unanswered::Report => p.notice(self.context.timezone()),
                Unanswered::Rerun => {
                    let req = TurnRequest {
                        principal: crate::tools::presumed(&p.conversation),
                        model: None,
                        conversation: p.conversation.clone(),
                        text: p.text.clone(),
                        in_job: false,
                        cancel: cancel.child_token(),
                        attachments: Vec::new(),
                    };
                    match self.turn(req).await {
                        Ok(r) => r.text,
                        Err(TurnError::Cancelled) => continue,
                        Err(e) => format!("{}\n(Running it again failed: {e})", p.notice(self.context.timezone())),
                    }
                }
            };
            deliver(p.target(), text);
        }
    }
}
