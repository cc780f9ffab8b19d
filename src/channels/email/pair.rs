//! `/pair <code>` by mail: a new sender joins with the code `bramble pair
//! --channel email` printed, written as the subject or the first line.
//!
//! Only from a sender the receiving server vouched for (DKIM or SPF passed
//! for the `From` domain, [`super::trust`]): a forged `From` cannot pair,
//! and nothing is mailed back to an address nobody proved. One try per
//! sender per [`pairing::TRY_GAP`] is answered (more are dropped and
//! logged); every try is logged. The answer is a plain reply in the thread.

use std::time::Instant;

use super::{new_message_id, Reader};
use crate::bus::Principal;
use crate::clients::smtp::{self, Mail};
use crate::policy::pairing::{self, Redeemed};

/// Senders whose last try is remembered; the map is cleared when full.
const MAX_TRIES: usize = 1024;

impl Reader {
    /// Redeem `code` for `sender` and answer by mail.
    pub(super) async fn pair(&mut self, sender: &str, code: String, message_id: Option<String>, subject: &str) {
        let now = Instant::now();
        if self.pair_tries.get(sender).is_some_and(|t| now.duration_since(*t) < pairing::TRY_GAP) {
            tracing::warn!(from = %sender, "a /pair mail too soon after the last one was ignored");
            return;
        }
        if self.pair_tries.len() >= MAX_TRIES {
            self.pair_tries.clear();
        }
        self.pair_tries.insert(sender.to_string(), now);
        let answer = if code.is_empty() {
            "Send the code too: /pair ABCD-EFGH as the subject (the owner gets one with `bramble pair --channel email`)."
                .to_string()
        } else {
            let (dir, who) = (self.shared.state_dir.clone(), Principal::Email(sender.to_string()));
            let at = jiff::Timestamp::now();
            let outcome = crate::util::tasks::blocking(move || pairing::redeem(&dir, &code, &who, None, at)).await;
            match &outcome {
                Ok(Redeemed::Paired) => {
                    if let Some(p) = &self.shared.rules.paired {
                        p.add(sender);
                    }
                    tracing::warn!(from = %sender, "paired a mail sender: their mail is read from now on");
                }
                Ok(Redeemed::Wrong { left }) => tracing::warn!(from = %sender, left, "a wrong email pairing code"),
                Ok(Redeemed::Voided) => {
                    tracing::warn!(from = %sender, "too many wrong pairing codes: the email code is void")
                }
                Ok(Redeemed::NoCode) => tracing::warn!(from = %sender, "a /pair mail with no valid code pending"),
                Err(e) => tracing::error!(error = %e, "cannot read or write the email pairing files"),
            }
            pairing::answer(&outcome).replace("talk to me", "write to me")
        };
        let Some(smtp) = &self.shared.smtp else {
            tracing::warn!("a /pair mail cannot be answered: [email] smtp is not set");
            return;
        };
        let subject = if subject.is_empty() { "Pairing".to_string() } else { format!("Re: {subject}") };
        let mail = Mail {
            from: self.shared.me.clone(),
            to: sender.to_string(),
            subject,
            message_id: new_message_id(&self.shared.me),
            references: message_id.iter().cloned().collect(),
            in_reply_to: message_id,
            html: smtp::simple_html(&answer),
            text: answer,
            ..Mail::default()
        };
        if let Err(e) = smtp.send(&mail).await {
            tracing::warn!(to = %sender, error = %e, "cannot answer a /pair mail");
        }
    }
}
