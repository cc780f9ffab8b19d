//! The chat apps beside Telegram (email, Matrix, Signal, Feishu / Lark,
//! Discord): each built from its config section when configured and when
//! its cargo feature is in the build, in two steps because some show a turn's
//! progress and the agent needs those sinks before it exists ([`Early`]),
//! while their readers need the agent ([`Early::readers`]). Kept apart from
//! `assemble.rs` so the composition root stays one screen per part.

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::agent::Agent;
use crate::bus::InboundMessage;
use crate::config::Loaded;
use crate::delivery::Channels;
use crate::scheduler::JobStore;
use crate::util::tasks::Supervisor;

/// The chat apps' channels that exist before the agent: Matrix, Feishu /
/// Lark and Discord (their progress notices are the agent's progress sinks).
pub struct Early {
    #[cfg(feature = "matrix")]
    matrix: Option<crate::channels::matrix::Matrix>,
    #[cfg(feature = "feishu")]
    feishu: Option<crate::channels::feishu::Feishu>,
    discord: DiscordPart,
}

/// The chat apps' long-running readers (`None` each: not configured, not
/// built, or unusable: logged).
pub struct Chats {
    /// The email reader and digest sender.
    #[cfg(feature = "email")]
    pub email: Option<crate::channels::email::EmailPoller>,
    /// `[matrix]`'s sync loop.
    #[cfg(feature = "matrix")]
    pub matrix: Option<crate::channels::matrix::MatrixPoller>,
    /// `[signal]`'s event stream reader.
    #[cfg(feature = "signal")]
    pub signal: Option<crate::channels::signal::SignalPoller>,
    /// `[feishu]`'s long connection.
    #[cfg(feature = "feishu")]
    pub feishu: Option<crate::channels::feishu::FeishuPoller>,
    /// `[discord]`'s gateway loop.
    pub discord: Option<DiscordGateway>,
}

impl Early {
    /// Matrix's and Discord's channels, and every chat's progress sink:
    /// Telegram's, Matrix's notice (each takes only its own rooms), Discord's
    /// in front (it takes its own channels' steps and hands the rest on).
    pub(super) fn build(
        loaded: &Loaded,
        jobs: &JobStore,
        telegram: Option<&crate::channels::telegram::Telegram>,
    ) -> (Early, Progress) {
        #[cfg(feature = "matrix")]
        let matrix = matrix_channel(loaded, reminders_for(&loaded.config, jobs));
        #[allow(unused_mut)] // without the `matrix` feature only Telegram's
        let mut progress: Vec<Arc<dyn crate::agent::ProgressSink>> =
            telegram.iter().filter_map(|t| t.progress()).collect();
        #[cfg(feature = "matrix")]
        progress.extend(matrix.as_ref().map(|m| m.progress()));
        #[cfg(feature = "feishu")]
        let feishu = feishu(loaded, jobs);
        #[cfg(feature = "feishu")]
        progress.extend(feishu.as_ref().map(|f| f.progress()));
        let (discord, progress) = discord_parts(loaded, jobs, Progresses::of(progress));
        let early = Early {
            #[cfg(feature = "matrix")]
            matrix,
            #[cfg(feature = "feishu")]
            feishu,
            discord,
        };
        (early, progress)
    }

    /// Each chat app's delivery added to `channels`, and its reader.
    #[allow(unused_variables)] // a build without the chat features reads none of them
    #[allow(clippy::unit_arg)] // without `discord` its part is `()`
    pub(super) fn readers(
        self,
        loaded: &Loaded,
        jobs: &JobStore,
        channels: &mut Channels,
        inbound: &mpsc::Sender<InboundMessage>,
        agent: &Arc<Agent>,
    ) -> Chats {
        #[cfg(feature = "email")]
        let email = email(loaded).map(|e| {
            channels.add(e.channel());
            e.poller(inbound.clone())
        });
        #[cfg(feature = "matrix")]
        let matrix = self.matrix.map(|matrix| {
            channels.add(matrix.channel());
            crate::channels::matrix::MatrixPoller { matrix, inbound: inbound.clone(), activity: agent.activity() }
        });
        Chats {
            #[cfg(feature = "email")]
            email,
            #[cfg(feature = "matrix")]
            matrix,
            #[cfg(feature = "signal")]
            signal: signal_reader(loaded, reminders_for(&loaded.config, jobs), channels, inbound, agent),
            #[cfg(feature = "feishu")]
            feishu: self.feishu.map(|feishu| {
                channels.add(feishu.channel());
                crate::channels::feishu::FeishuPoller { feishu, inbound: inbound.clone() }
            }),
            discord: discord_poller(self.discord, channels, inbound, agent),
        }
    }
}

impl Chats {
    /// Each reader as a named service (the policies are in the table of [`super`]).
    pub(super) fn spawn(self, tasks: &mut Supervisor) {
        #[cfg(feature = "email")]
        if let Some(email) = self.email {
            tasks.spawn(crate::util::tasks::Service::new("email", |sd| email.run(sd)));
        }
        #[cfg(feature = "matrix")]
        if let Some(poller) = self.matrix {
            tasks.spawn(crate::util::tasks::Service::ends("matrix poller", |sd| poller.run(sd)));
        }
        #[cfg(feature = "signal")]
        if let Some(reader) = self.signal {
            tasks.spawn(crate::util::tasks::Service::new("signal reader", |sd| reader.run(sd)));
        }
        #[cfg(feature = "feishu")]
        if let Some(conn) = self.feishu {
            tasks.spawn(crate::util::tasks::Service::new("feishu connection", |sd| conn.run(sd)));
        }
        #[cfg(feature = "discord")]
        if let Some(gateway) = self.discord {
            tasks.spawn(crate::util::tasks::Service::ends("discord gateway", |sd| gateway.run(sd)));
        }
        #[cfg(not(feature = "discord"))]
        let _ = (self.discord, &tasks);
    }
}

/// The email channel for this config (`None`: not configured, or its SMTP server unusable, logged).
#[cfg(feature = "email")]
pub(super) fn email(loaded: &Loaded) -> Option<crate::channels::email::Email> {
    let c = &loaded.config;
    let tz = c.timezone().tz().clone();
    match crate::channels::email::Email::from_config(&c.email, &loaded.paths.state_dir, &loaded.paths.workspace, tz) {
        Ok(e) => e,
        Err(e) => {
            tracing::error!("{e}; the email channel is off");
            None
        }
    }
}

/// Done / Snooze over the job store, for a channel's report answers.
#[cfg(any(feature = "matrix", feature = "signal", feature = "discord"))]
pub(super) fn reminders_for(c: &crate::config::Config, jobs: &JobStore) -> crate::work::reminders::Reminders {
    let tomorrow_at = crate::config::parse_hh_mm(&c.telegram.tomorrow_at).unwrap_or((9, 0));
    crate::work::reminders::Reminders::new(jobs.clone(), c.timezone().tz().clone(), tomorrow_at)
}

/// The Feishu / Lark channel for `[feishu]` (`None`: not configured, or unusable: logged).
#[cfg(feature = "feishu")]
pub(super) fn feishu(loaded: &Loaded, jobs: &JobStore) -> Option<crate::channels::feishu::Feishu> {
    let c = &loaded.config;
    let tomorrow_at = crate::config::parse_hh_mm(&c.telegram.tomorrow_at).unwrap_or((9, 0));
    let reminders = crate::work::reminders::Reminders::new(jobs.clone(), c.timezone().tz().clone(), tomorrow_at);
    let (state, workspace) = (&loaded.paths.state_dir, &loaded.paths.workspace);
    match crate::channels::feishu::Feishu::from_config(&c.feishu, state, workspace, Some(reminders)) {
        Ok(f) => f,
        Err(e) => {
            tracing::error!("Feishu / Lark is off: {e}");
            None
        }
    }
}

/// The Matrix channel for `[matrix]` (`None`: not configured, or unusable: logged).
#[cfg(feature = "matrix")]
pub(super) fn matrix_channel(
    loaded: &Loaded,
    reminders: crate::work::reminders::Reminders,
) -> Option<crate::channels::matrix::Matrix> {
    let (c, state) = (&loaded.config.matrix, &loaded.paths.state_dir);
    match crate::channels::matrix::Matrix::from_config(c, state, &loaded.paths.workspace, Some(reminders)) {
        Ok(m) => m,
        Err(e) => {
            tracing::error!("Matrix is off: {e}");
            None
        }
    }
}

/// The Signal channel for `[signal]`, added to `channels`, and its reader
/// (`None`: not configured, or unusable: logged).
#[cfg(feature = "signal")]
pub(super) fn signal_reader(
    loaded: &Loaded,
    reminders: crate::work::reminders::Reminders,
    channels: &mut Channels,
    inbound: &mpsc::Sender<InboundMessage>,
    agent: &Arc<Agent>,
) -> Option<crate::channels::signal::SignalPoller> {
    let (c, state) = (&loaded.config.signal, &loaded.paths.state_dir);
    let signal = match crate::channels::signal::Signal::from_config(c, state, &loaded.paths.workspace, Some(reminders))
    {
        Ok(s) => s?,
        Err(e) => {
            tracing::error!("Signal is off: {e}");
            return None;
        }
    };
    channels.add(signal.channel());
    Some(crate::channels::signal::SignalPoller { signal, inbound: inbound.clone(), activity: agent.activity() })
}

/// Every channel's progress sink: each step goes to all, each takes its own channel's conversations.
pub(super) struct Progresses(Vec<Arc<dyn crate::agent::ProgressSink>>);

impl Progresses {
    pub(super) fn of(
        mut sinks: Vec<Arc<dyn crate::agent::ProgressSink>>,
    ) -> Option<Arc<dyn crate::agent::ProgressSink>> {
        match sinks.len() {
            0 => None,
            1 => sinks.pop(),
            _ => Some(Arc::new(Progresses(sinks))),
        }
    }
}

impl crate::agent::ProgressSink for Progresses {
    fn step(&self, conversation: &crate::bus::Conversation, what: &str) {
        self.0.iter().for_each(|p| p.step(conversation, what));
    }
}

/// The Discord channel, before the agent is built (`()` without the feature).
#[cfg(feature = "discord")]
pub(super) type DiscordPart = Option<crate::channels::discord::Discord>;
#[cfg(not(feature = "discord"))]
pub(super) type DiscordPart = ();
#[cfg(feature = "discord")]
pub type DiscordGateway = crate::channels::discord::DiscordPoller;
#[cfg(not(feature = "discord"))]
pub type DiscordGateway = std::convert::Infallible;
pub(super) type Progress = Option<Arc<dyn crate::agent::ProgressSink>>;

/// The Discord channel for `[discord]` (`None`: not configured, or unusable:
/// logged), and the chat turns' progress sink with Discord's in front of `progress`.
#[cfg(feature = "discord")]
pub(super) fn discord_parts(loaded: &Loaded, jobs: &JobStore, progress: Progress) -> (DiscordPart, Progress) {
    let (c, state) = (&loaded.config.discord, &loaded.paths.state_dir);
    let reminders = Some(reminders_for(&loaded.config, jobs));
    match crate::channels::discord::Discord::from_config(c, state, &loaded.paths.workspace, reminders) {
        Ok(Some(d)) => {
            let progress = Some(d.progress(progress));
            (Some(d), progress)
        }
        Ok(None) => (None, progress),
        Err(e) => {
            tracing::error!("Discord is off: {e}");
            (None, progress)
        }
    }
}

#[cfg(not(feature = "discord"))]
pub(super) fn discord_parts(_: &Loaded, _: &JobStore, progress: Progress) -> (DiscordPart, Progress) {
    ((), progress)
}

/// Discord's delivery side into `channels`, and its gateway loop.
#[cfg(feature = "discord")]
pub(super) fn discord_poller(
    discord: DiscordPart,
    channels: &mut Channels,
    inbound: &mpsc::Sender<InboundMessage>,
    agent: &Arc<Agent>,
) -> Option<DiscordGateway> {
    let discord = discord?;
    channels.add(discord.channel());
    Some(crate::channels::discord::DiscordPoller { discord, inbound: inbound.clone(), activity: agent.activity() })
}

#[cfg(not(feature = "discord"))]
pub(super) fn discord_poller(
    _: DiscordPart,
    _: &mut Channels,
    _: &mpsc::Sender<InboundMessage>,
    _: &Arc<Agent>,
) -> Option<DiscordGateway> {
    None
}
