//! Whether a job's creator still has the rights the job runs with.
//!
//! A job outlives the chat that made it, so the rights it was made with are
//! checked again each time it is due, not only when it was made: a Telegram
//! user revoked with `bramble pair --revoke` (or taken out of `allow_from`)
//! no longer has their jobs run, and a member of the service's group has
//! theirs run only while `[service] members` still lets them make such a job.
//! The turn of a job that may run is still narrowed to its creator's
//! `[policy.<source>]` ([`crate::tools::policy::Source::ceiling_of`]).

use std::path::Path;

use crate::bus::{Principal, Target};
use crate::config::Members;
use crate::scheduler::{Job, JobKind};

use super::AllowedChats;

/// What decides a creator's standing now: who Telegram serves, and what
/// members may do.
#[derive(Debug, Clone)]
pub struct Standing {
    telegram: AllowedChats,
    members: Members,
    /// `[mqtt] publish_allow`: the topics a member's reminder may go to.
    publish_allow: Vec<String>,
}

impl Standing {
    pub fn new(allow_from: &[String], state_dir: &Path, members: Members, publish_allow: &[String]) -> Standing {
        Standing { telegram: AllowedChats::new(allow_from, state_dir), members, publish_allow: publish_allow.to_vec() }
    }

    /// The addresses of `[email] allow_from`: whose jobs still run, where members' reminders may go.
    pub fn with_email(mut self, allow_from: impl IntoIterator<Item = String>) -> Standing {
        self.telegram = self.telegram.with_email(allow_from);
        self
    }

    /// With `[matrix]`'s users (their jobs run while they stay in `allow_from`) and rooms.
    pub fn with_matrix(self, matrix: super::matrix::MatrixPolicy) -> Standing {
        Standing { telegram: self.telegram.with_matrix(matrix), ..self }
    }

    /// With `[signal]`'s people (their jobs run while they stay in `allow_from`) and groups.
    pub fn with_signal(self, signal: super::signal::SignalPolicy) -> Standing {
        Standing { telegram: self.telegram.with_signal(signal), ..self }
    }

    /// With `[discord]`'s users (their jobs run while they stay in `allow_from`) and channels.
    pub fn with_discord(self, discord: super::discord::DiscordPolicy) -> Standing {
        Standing { telegram: self.telegram.with_discord(discord), ..self }
    }

    /// `Err(why)` when `job`'s creator may no longer have it run. Blocking
    /// (reads the paired users): call it off the runtime thread.
    pub fn check(&self, job: &Job) -> Result<(), StandingError> {
        match job.made_by() {
            Principal::Owner => Ok(()),
            Principal::Telegram(id) if self.telegram.contains(&id.to_string()) => Ok(()),
            Principal::Telegram(id) => Err(StandingError::Revoked(id)),
            Principal::Discord(id) if self.telegram.discord().allows_now(id) => Ok(()),
            Principal::Discord(id) => Err(StandingError::DiscordRevoked(id)),
            Principal::Email(addr) if self.telegram.allows_email(&addr) => Ok(()),
            Principal::Email(addr) => Err(StandingError::MailRevoked(addr)),
            Principal::Feishu(user) if self.telegram.feishu().allows_now(&user) => Ok(()),
            Principal::Feishu(user) => Err(StandingError::FeishuRevoked(user)),
            Principal::Matrix(user) if self.telegram.matrix().allows_now(&user) => Ok(()),
            Principal::Matrix(user) => Err(StandingError::MatrixRevoked(user)),
            Principal::Signal(id) if self.telegram.signal().allows(&id) => Ok(()),
            Principal::Signal(id) => Err(StandingError::SignalRevoked(id)),
            Principal::Member(user) => member_may(self.members, job)
                .and_then(|()| match self.members {
                    Members::Jobs => Ok(()),
                    _ => job.deliver.iter().try_for_each(|t| member_target(t, &self.telegram, &self.publish_allow)),
                })
                .map_err(|why| StandingError::Member { user, why }),
            Principal::Anonymous => Err(StandingError::Anonymous),
        }
    }

    /// With `[feishu]`'s users (their jobs run while they stay in `allow_from`) and chats.
    pub fn with_feishu(self, feishu: super::feishu::FeishuPolicy) -> Standing {
        Standing { telegram: self.telegram.with_feishu(feishu), ..self }
    }

    /// Whether a user is served by Telegram now (allow_from, pins, pairing). Blocking.
    pub fn telegram_allows(&self, id: i64) -> bool {
        self.telegram.contains(&id.to_string())
    }
}

/// Why a job's creator may no longer have it run: the end of the log line
/// "job not run and disabled: <this>".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StandingError {
    #[error("its creator, Telegram user {0}, is no longer allowed (revoked, or not in [telegram] allow_from)")]
    Revoked(i64),
    #[error("its creator, Discord user {0}, is no longer in [discord] allow_from")]
    DiscordRevoked(u64),
    #[error("its creator, {0}, is no longer in [email] allow_from")]
    MailRevoked(String),
    #[error("its creator, Matrix user {0}, is no longer in [matrix] allow_from")]
    MatrixRevoked(String),
    #[error("its creator, Signal account {0}, is no longer in [signal] allow_from")]
    SignalRevoked(String),
    #[error("its creator, Feishu / Lark user {0}, is no longer in [feishu] allow_from")]
    FeishuRevoked(String),
    #[error("its creator, {user} (a member of the service's group), {why}")]
    Member { user: String, why: MemberRefusal },
    #[error("it was made by nobody bramble knows (an untrusted source)")]
    Anonymous,
}

/// What `[service] members` does not let a member have: said after who they are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemberRefusal {
    #[error("may not have jobs run ([service] members = \"none\")")]
    NoJobs,
    #[error("may have reminders only ([service] members = \"reminders\")")]
    RemindersOnly,
    #[error("may not attach workspace files ([service] members = \"reminders\")")]
    Attachments,
    #[error("telegram:{0} is not the chat of a user bramble serves: members' reminders go to those chats only")]
    Chat(String),
    #[error("discord:{0} is not a channel of [discord] channels nor an allowed user's DM")]
    DiscordChannel(u64),
    #[error("email:{0} is not in [email] allow_from: members' reminders go to those addresses only")]
    Mail(String),
    #[error("matrix:{0} is not a room of [matrix] rooms nor one an allowed user invited bramble to")]
    Room(String),
    #[error("signal:{0} is not an allowed person of [signal] allow_from nor a group of [signal] groups")]
    SignalChat(String),
    #[error("feishu:{0} is not a chat of [feishu] chats nor one an allowed user wrote in")]
    FeishuChat(String),
    #[error(
        "mqtt:{0} is not in [mqtt] publish_allow: members' reminders go to chats, the device's report \
         topic or the topics the owner allows"
    )]
    Topic(String),
    #[error("the terminal is not a delivery target for a job")]
    Terminal,
}

/// What `members` lets a member have run: everything, reminders without a
/// watcher that go to chats and report topics only, or nothing.
pub fn member_may(members: Members, job: &Job) -> Result<(), MemberRefusal> {
    match members {
        Members::Jobs => Ok(()),
        Members::None => Err(MemberRefusal::NoJobs),
        Members::Reminders => {
            if !matches!(job.kind, JobKind::Remind { .. }) || job.watch.is_some() {
                return Err(MemberRefusal::RemindersOnly);
            }
            if !job.attach.is_empty() {
                return Err(MemberRefusal::Attachments);
            }
            Ok(())
        }
    }
}

/// Whether a member's reminder may go to `target`: a chat (an allowed
/// Telegram user's, a Home Assistant notify service), the log, the device's
/// own report topic, or a topic the owner opened with `[mqtt] publish_allow`
/// — never any other topic (a device's command topic, bramble's own inputs).
pub fn member_target(target: &Target, chats: &AllowedChats, publish_allow: &[String]) -> Result<(), MemberRefusal> {
    match target {
        Target::Telegram(chat) if chats.contains(chat) => Ok(()),
        Target::Telegram(chat) => Err(MemberRefusal::Chat(chat.clone())),
        Target::Discord(c) if chats.discord().channel_allowed(*c) => Ok(()),
        Target::Discord(c) => Err(MemberRefusal::DiscordChannel(*c)),
        Target::Email(t) if chats.allows_email(&t.address) => Ok(()),
        Target::Email(t) => Err(MemberRefusal::Mail(t.address.clone())),
        Target::Feishu(chat) if chats.feishu().chat_allowed(chat) => Ok(()),
        Target::Feishu(chat) => Err(MemberRefusal::FeishuChat(chat.clone())),
        Target::Matrix(room) if chats.matrix().room_allowed(room) => Ok(()),
        Target::Matrix(room) => Err(MemberRefusal::Room(room.clone())),
        Target::Signal(chat) if chats.signal().chat_allowed(chat) => Ok(()),
        Target::Signal(chat) => Err(MemberRefusal::SignalChat(chat.clone())),
        // A webhook target names a `url` the owner configured, like a notify service.
        // So does an ntfy topic: the channel publishes only to topics named in `[ntfy]`.
        Target::HomeAssistant(_) | Target::Webhook(_) | Target::Ntfy(_) | Target::Log | Target::Mqtt(None) => Ok(()),
        Target::Mqtt(Some(topic)) if publish_allow.iter().any(|f| crate::util::mqtt::topic_matches(f, topic)) => Ok(()),
        Target::Mqtt(Some(topic)) => Err(MemberRefusal::Topic(topic.clone())),
        Target::Cli => Err(MemberRefusal::Terminal),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::{Job, JobKind, Schedule};

    fn job(kind: JobKind, deliver: &[&str], creator: Option<Principal>) -> Job {
        let now = jiff::Timestamp::now();
        let schedule = Schedule::Every { every: crate::scheduler::parse_every("1h").unwrap(), anchor: now };
        let deliver = deliver.iter().map(|t| t.parse().unwrap()).collect();
        let mut j = Job::new("j", schedule, kind, deliver, now, &jiff::tz::TimeZone::UTC).unwrap();
        j.creator = creator;
        j
    }

    #[test]
    fn a_revoked_or_unlisted_users_job_may_not_run_and_the_owners_may() {
        let dir = tempfile::tempdir().unwrap();
        let s = Standing::new(&["7".into()], dir.path(), Members::Jobs, &[]);
        let msg = JobKind::Message { text: "x".into() };
        assert!(s.check(&job(msg.clone(), &[], Some(Principal::Owner))).is_ok());
        assert!(s.check(&job(msg.clone(), &[], Some(Principal::Telegram(7)))).is_ok());
        let err = s.check(&job(msg.clone(), &[], Some(Principal::Telegram(8)))).unwrap_err().to_string();
        assert!(err.contains("Telegram user 8") && err.contains("no longer allowed"), "{err}");
        assert!(s.check(&job(msg, &[], Some(Principal::Anonymous))).is_err());
    }

    #[test]
    fn members_jobs_follow_what_members_may_do_now() {
        let dir = tempfile::tempdir().unwrap();
        let ann = Some(Principal::Member("ann".into()));
        let remind = JobKind::Remind { text: "tea".into() };
        let msg = JobKind::Message { text: "x".into() };
        let jobs = Standing::new(&[], dir.path(), Members::Jobs, &[]);
        assert!(jobs.check(&job(msg.clone(), &["mqtt:z2m/lock/set"], ann.clone())).is_ok());
        let reminders = Standing::new(&["7".into()], dir.path(), Members::Reminders, &["home/note/#".into()]);
        assert!(reminders
            .check(&job(remind.clone(), &["telegram:7", "mqtt", "mqtt:home/note/x"], ann.clone()))
            .is_ok());
        assert!(reminders.check(&job(msg, &[], ann.clone())).unwrap_err().to_string().contains("reminders only"));
        let err = reminders.check(&job(remind.clone(), &["mqtt:bramble/dev/in"], ann.clone())).unwrap_err().to_string();
        assert!(err.contains("publish_allow"), "{err}");
        assert!(reminders.check(&job(remind.clone(), &["telegram:8"], ann.clone())).is_err());
        let none = Standing::new(&[], dir.path(), Members::None, &[]);
        assert!(none.check(&job(remind, &[], ann)).is_err());
    }
}
