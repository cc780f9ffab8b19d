//! Done · Snooze 10 min · 1 h · Tomorrow under job reports, and what a press does.
//!
//! The buttons' `callback_data` is `r:<action>:<job id>` (at most 64 bytes, as
//! Telegram wants): `r:d:…` done, `r:s10:…`/`r:s60:…` snooze for minutes,
//! `r:t:…` snooze to tomorrow. The job id in the keyboard also marks the
//! message as that job's report, so a Telegram reply to it continues the
//! job's session ([`job_of`]).
//!
//! Every press is answered (`answerCallbackQuery`): the client shows a spinner
//! until then. Only `allow_from` users act; anyone else gets "not allowed"
//! and is logged once. The message is then edited to say what was done, and
//! its buttons are removed (a second press has nothing to press).

use serde_json::{json, Value};

use super::Poller;
use crate::clients::telegram::{Api, CallbackQuery};
use crate::config::ReportButtons;
use crate::delivery::JobRef;
use crate::work::reminders::{Reminders, Snooze};

/// What a button asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Done,
    Snooze(Snooze),
}

/// Whether a report of `job` gets buttons under `setting`.
pub fn wanted(setting: ReportButtons, job: &JobRef) -> bool {
    match setting {
        ReportButtons::All => true,
        ReportButtons::Reminders => job.reminder,
        ReportButtons::None => false,
    }
}

/// The inline keyboard for job `id`'s report.
pub fn keyboard(id: &str) -> Value {
    let b = |text: &str, action: &str| json!({"text": text, "callback_data": format!("r:{action}:{id}")});
    json!({"inline_keyboard": [[b("✅ Done", "d"), b("💤 10 min", "s10"), b("1 h", "s60"), b("Tomorrow", "t")]]})
}

/// `r:<action>:<id>` → (action, job id).
pub fn parse(data: &str) -> Option<(Action, String)> {
    let mut parts = data.splitn(3, ':');
    if parts.next()? != "r" {
        return None;
    }
    let action = match parts.next()? {
        "d" => Action::Done,
        "s10" => Action::Snooze(Snooze::Minutes(10)),
        "s60" => Action::Snooze(Snooze::Minutes(60)),
        "t" => Action::Snooze(Snooze::Tomorrow),
        _ => return None,
    };
    let id = parts.next()?;
    let valid = (1..=32).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric());
    valid.then(|| (action, id.to_string()))
}

/// The job whose report carries this keyboard, if it is one of ours.
pub fn job_of(markup: &Value) -> Option<String> {
    markup["inline_keyboard"]
        .as_array()?
        .iter()
        .filter_map(Value::as_array)
        .flatten()
        .find_map(|b| b["callback_data"].as_str().and_then(parse))
        .map(|(_, id)| id)
}

impl Poller {
    /// A button press: answered always, acted on for allowed users only.
    pub(super) async fn on_button(&mut self, api: &Api, reminders: Option<&Reminders>, q: CallbackQuery) {
        let answer = |text: Option<String>| async move {
            if let Err(e) = api.answer_callback_query(&q.id, text.as_deref()).await {
                tracing::warn!(error = %e, "answerCallbackQuery failed");
            }
        };
        if !self.allowed(&q.from) {
            answer(Some("Not allowed.".into())).await;
            return;
        }
        let (Some((action, id)), Some(reminders), Some(message)) =
            (q.data.as_deref().and_then(parse), reminders, q.message.as_ref())
        else {
            // Not ours, or a message too old for Telegram to include.
            answer(None).await;
            return;
        };
        let chat = message.chat.id.to_string();
        let text = message.text.clone().or_else(|| message.caption.clone()).unwrap_or_default();
        let (r, id2, chat2, text2) = (reminders.clone(), id.clone(), chat.clone(), text.clone());
        let now = jiff::Timestamp::now();
        let action2 = action.clone();
        let outcome = tokio::task::spawn_blocking(move || match action2 {
            Action::Done => r.done(&id2, now),
            Action::Snooze(when) => r.snooze(&id2, &text2, &chat2, when, now),
        })
        .await
        .unwrap_or_else(|e| Err(crate::work::reminders::ReminderError::Stopped(e.to_string())));
        let (toast, note) = match &outcome {
            Ok(said) => {
                tracing::info!(job = %id, ?action, user_id = q.from.id, "{said}");
                let mark = if action == Action::Done { "✅" } else { "💤" };
                (said.clone(), format!("{mark} {said}"))
            }
            Err(why) => {
                tracing::warn!(job = %id, ?action, "a report button did nothing: {why}");
                (cut(&why.to_string(), 190), format!("⚠️ {why}"))
            }
        };
        answer(Some(toast)).await;
        let edited = format!("{}\n\n{note}", text.trim_end());
        if let Err(e) = api.edit_message_text(&chat, message.message_id, &edited, false, None).await {
            tracing::warn!(error = %e, "cannot mark the report as handled");
        }
    }
}

/// At most `max` characters (a toast shows about 200).
fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    format!("{}…", text.chars().take(max - 1).collect::<String>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keyboard_round_trips_and_fits_telegrams_limit() {
        let k = keyboard("0a1b2c3d");
        for b in k["inline_keyboard"][0].as_array().unwrap() {
            let data = b["callback_data"].as_str().unwrap();
            assert!(data.len() <= 64);
            assert_eq!(parse(data).unwrap().1, "0a1b2c3d");
        }
        assert_eq!(job_of(&k).as_deref(), Some("0a1b2c3d"));
        assert_eq!(parse("r:s10:0a1b2c3d").unwrap().0, Action::Snooze(Snooze::Minutes(10)));
        assert_eq!(parse("r:t:0a1b2c3d").unwrap().0, Action::Snooze(Snooze::Tomorrow));
    }

    #[test]
    fn foreign_or_forged_data_is_not_an_action() {
        for d in ["", "r", "r:d", "r:d:", "x:d:abc", "r:zz:abc", "r:d:../../x", "r:d:a:b"] {
            assert!(parse(d).is_none(), "{d}");
        }
        assert!(job_of(&json!({"inline_keyboard": [[{"text": "x", "url": "https://e.org"}]]})).is_none());
    }

    #[test]
    fn which_reports_get_buttons() {
        let remind = JobRef { id: "a".into(), reminder: true };
        let other = JobRef { id: "b".into(), reminder: false };
        assert!(wanted(ReportButtons::Reminders, &remind) && !wanted(ReportButtons::Reminders, &other));
        assert!(wanted(ReportButtons::All, &other));
        assert!(!wanted(ReportButtons::None, &remind));
    }
}
