//! What a report's buttons do: Done and Snooze (10 min · 1 h · Tomorrow),
//! through the job store like every other change to jobs.
//!
//! A snooze is a new one-shot `at` job with the report's text, delivered to
//! the chat the button was pressed in: the scheduler then treats it like any
//! reminder (catch-up after a power cut, the clock-sync hold, the outbox), and
//! `bramble cron list` shows it. Done writes a line into the job's history
//! (`bramble cron show`). A button of a job that was deleted meanwhile does
//! nothing and says so.
//!
//! The store's file lock serialises these writes with the scheduler's.

use jiff::{tz::TimeZone, Timestamp, ToSpan};

use crate::bus::Conversation;
#[cfg(test)]
use crate::bus::Target;
use crate::scheduler::{Job, JobKind, JobStore, RunRecord, RunStatus, Schedule, StoreError};

/// When a snoozed report comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Snooze {
    /// After this many minutes.
    Minutes(u32),
    /// Tomorrow at `[telegram] tomorrow_at`.
    Tomorrow,
}

/// Done and Snooze over the job store.
#[derive(Clone)]
pub struct Reminders {
    store: JobStore,
    tz: TimeZone,
    /// `[telegram] tomorrow_at`.
    tomorrow_at: (i8, i8),
}

impl Reminders {
    pub fn new(store: JobStore, tz: TimeZone, tomorrow_at: (i8, i8)) -> Reminders {
        Reminders { store, tz, tomorrow_at }
    }

    /// The session a reply from `chat` to job `id`'s report continues: the
    /// job's chat session when the job was made in that very chat, else the
    /// job's own (`cron:<name>`) — never another chat's history. `None`: no such job.
    pub fn session_of(&self, id: &str, chat: &str) -> Option<String> {
        let job = self.store.get(id).ok()?;
        let own = format!("cron:{}", job.name);
        Some(match job.origin {
            Some(o) if o.channel == crate::bus::Channel::Telegram && o.chat_id == chat => o.session_key,
            _ => own,
        })
    }

    /// Snooze job `id`'s report (`text`) for `chat`: a new one-shot. Returns
    /// what to tell the user (the local time it comes back), or why not.
    pub fn snooze(
        &self,
        id: &str,
        text: &str,
        chat: &str,
        when: Snooze,
        now: Timestamp,
    ) -> Result<String, ReminderError> {
        let conversation = Conversation::new(crate::bus::Channel::Telegram, chat, format!("telegram:{chat}"));
        self.snooze_in(id, text, conversation, when, now)
    }

    /// [`Reminders::snooze`] for any chat: the new one-shot reports back to `conversation`.
    pub fn snooze_in(
        &self,
        id: &str,
        text: &str,
        conversation: Conversation,
        when: Snooze,
        now: Timestamp,
    ) -> Result<String, ReminderError> {
        let original = self.get(id)?;
        let text = text.trim();
        if text.is_empty() {
            return Err(ReminderError::NoText);
        }
        let at = self.when(when, now)?;
        let local = at.to_zoned(self.tz.clone());
        let name = snooze_name(&original.name, &crate::scheduler::job::new_id());
        let mut job = Job::new(
            &name,
            Schedule::at(at),
            JobKind::Remind { text: text.to_string() },
            vec![conversation.reply_target()],
            now,
            &self.tz,
        )
        .map_err(ReminderError::Job)?;
        job.origin = Some(conversation);
        self.store.add(job).map_err(ReminderError::Save)?;
        let day = if local.date() == now.to_zoned(self.tz.clone()).date() { "" } else { "tomorrow " };
        Ok(format!("Snoozed until {day}{}", local.strftime("%H:%M")))
    }

    /// Mark job `id`'s latest report as done: a line in its history.
    pub fn done(&self, id: &str, now: Timestamp) -> Result<String, ReminderError> {
        self.store
            .update(|jobs| {
                let job = jobs.iter_mut().find(|j| j.id == id).ok_or_else(|| StoreError::NotFound(id.to_string()))?;
                let scheduled = job.state.last_run.unwrap_or(now);
                job.state.history.push_back(RunRecord {
                    scheduled,
                    started: now,
                    finished: now,
                    status: RunStatus::Ok,
                    summary: "marked done (Telegram button)".into(),
                    model: None,
                });
                while job.state.history.len() > crate::scheduler::job::HISTORY_LEN {
                    job.state.history.pop_front();
                }
                Ok(())
            })
            .map_err(|e| match e {
                StoreError::NotFound(_) => ReminderError::Gone,
                e => ReminderError::Record(e),
            })?;
        Ok("Done".into())
    }

    fn get(&self, id: &str) -> Result<Job, ReminderError> {
        self.store.get(id).map_err(|e| match e {
            StoreError::NotFound(_) => ReminderError::Gone,
            e => ReminderError::Read(e),
        })
    }

    /// The instant a snooze ends.
    fn when(&self, when: Snooze, now: Timestamp) -> Result<Timestamp, ReminderError> {
        match when {
            Snooze::Minutes(m) => Ok(now.checked_add(i64::from(m).minutes())?),
            Snooze::Tomorrow => {
                let (h, m) = self.tomorrow_at;
                let today = now.to_zoned(self.tz.clone()).date();
                let tomorrow = today.tomorrow()?;
                let at = tomorrow.at(h, m, 0, 0).to_zoned(self.tz.clone())?;
                Ok(at.timestamp())
            }
        }
    }
}

/// Why a report button did nothing: what the user's toast and the edited
/// report say.
#[derive(Debug, thiserror::Error)]
pub enum ReminderError {
    #[error("that job no longer exists (it was deleted), so nothing was changed")]
    Gone,
    #[error("the report has no text to remind you of")]
    NoText,
    #[error("cannot read the jobs: {0}")]
    Read(StoreError),
    #[error("cannot save the snooze: {0}")]
    Save(StoreError),
    #[error("cannot record it: {0}")]
    Record(StoreError),
    #[error(transparent)]
    Job(crate::scheduler::job::JobError),
    /// The snooze's time is out of range.
    #[error(transparent)]
    Time(#[from] jiff::Error),
    /// The blocking task that did the work ended without an answer.
    #[error("the button's work stopped: {0}")]
    Stopped(String),
}

/// `<name>-snooze-<id>`, cut to the 64 characters a job name may have.
fn snooze_name(original: &str, id: &str) -> String {
    let suffix = format!("-snooze-{id}");
    let keep = 64usize.saturating_sub(suffix.len());
    let base: String = original.chars().take(keep).collect();
    format!("{base}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, Reminders, Job, Timestamp) {
        let dir = tempfile::tempdir().unwrap();
        let store = JobStore::open(dir.path());
        let tz = TimeZone::get("Europe/Berlin").unwrap();
        let now: Timestamp = "2026-11-23T13:00:00Z".parse().unwrap();
        let job = Job::new(
            "water-plants",
            Schedule::at("2026-11-23T14:00:00Z".parse().unwrap()),
            JobKind::Remind { text: "water the plants".into() },
            vec![Target::Telegram("42".into())],
            now,
            &tz,
        )
        .unwrap();
        let job = store.add(job).unwrap();
        (dir, Reminders::new(store, tz, (9, 0)), job, now)
    }

    #[test]
    fn a_snooze_is_a_new_one_shot_for_the_chat() {
        let (_dir, r, job, now) = setup();
        let said = r.snooze(&job.id, "water the plants", "42", Snooze::Minutes(10), now).unwrap();
        assert_eq!(said, "Snoozed until 14:10"); // 13:10 UTC is 14:10 in Berlin
        let said = r.snooze(&job.id, "water the plants", "42", Snooze::Tomorrow, now).unwrap();
        assert_eq!(said, "Snoozed until tomorrow 09:00");
        let jobs = r.store.list().unwrap();
        assert_eq!(jobs.len(), 3);
        let snoozed = &jobs[1];
        assert!(snoozed.name.starts_with("water-plants-snooze-"), "{}", snoozed.name);
        assert_eq!(snoozed.kind, JobKind::Remind { text: "water the plants".into() });
        assert_eq!(snoozed.deliver, vec![Target::Telegram("42".into())]);
        assert_eq!(snoozed.schedule, Schedule::at("2026-11-23T13:10:00Z".parse().unwrap()));
        assert_eq!(jobs[2].schedule, Schedule::at("2026-11-24T08:00:00Z".parse().unwrap()));
    }

    #[test]
    fn done_is_recorded_and_a_deleted_job_says_so() {
        let (_dir, r, job, now) = setup();
        assert_eq!(r.done(&job.id, now).unwrap(), "Done");
        let h = &r.store.get(&job.id).unwrap().state.history;
        assert_eq!(h.back().unwrap().summary, "marked done (Telegram button)");
        r.store.remove(&job.id).unwrap();
        let err = r.snooze(&job.id, "x", "42", Snooze::Minutes(10), now).unwrap_err().to_string();
        assert!(err.contains("no longer exists"), "{err}");
        assert!(r.done(&job.id, now).unwrap_err().to_string().contains("no longer exists"));
        assert_eq!(r.store.list().unwrap().len(), 0, "nothing was created");
    }

    #[test]
    fn a_reply_never_continues_another_chats_session() {
        let (_dir, r, job, _) = setup();
        assert_eq!(r.session_of(&job.id, "42").as_deref(), Some("cron:water-plants"));
        r.store
            .update(|jobs| {
                jobs[0].origin = Some(Conversation::new(crate::bus::Channel::Telegram, "42", "telegram:42"));
                Ok(())
            })
            .unwrap();
        assert_eq!(r.session_of(&job.id, "42").as_deref(), Some("telegram:42"), "made in this chat");
        assert_eq!(r.session_of(&job.id, "99").as_deref(), Some("cron:water-plants"), "another chat");
        assert!(r.session_of("nope", "42").is_none());
    }

    #[test]
    fn snooze_names_stay_valid() {
        let long = "a".repeat(64);
        let name = snooze_name(&long, "0123abcd");
        assert!(name.len() <= 64 && crate::scheduler::job::check_name(&name).is_ok(), "{name}");
    }
}
