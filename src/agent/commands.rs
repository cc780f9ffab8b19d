//! Slash commands: `/new`, `/compact`, `/status`, `/stop`, `/help`, `/jobs`,
//! `/run <job>`, `/model [name]`, `/history [n]`.
//!
//! Channel-independent: Telegram, MQTT `<prefix>/in` and the terminal all send
//! text; [`Agent::serve_until`](super::Agent::serve_until) recognises a command
//! with [`parse`] *before* the message waits for its session lock, so `/stop`
//! reaches a running turn instead of queueing behind it. A command never calls
//! the model; an unknown one gets a "did you mean" answer.
//!
//! The commands are a table ([`COMMANDS`]): adding one (`/compact`, `/model`,
//! `/history`) is one handler function and one row. Telegram's command menu
//! (`setMyCommands`) is built from the same table.

use super::{Agent, Consolidation};
use crate::bus::Conversation;
use crate::config::ExecConfig;
use crate::scheduler::{JobStore, SchedulerHandle};
use crate::tools::policy::Source;
use crate::util::BoxFuture;

/// What `/jobs`, `/run` and `/status` need that a turn does not: the job
/// store, the daemon's scheduler, `[exec]`. Made with the agent from its
/// parts; the turn engine never reads it.
pub struct CommandContext {
    /// The job store and the zone times are shown in (`None`: no jobs here).
    jobs: Option<(JobStore, jiff::tz::TimeZone)>,
    /// The daemon's scheduler, for `/run` (`None` outside the daemon).
    scheduler: Option<SchedulerHandle>,
    /// `[exec]` and its sandbox, for the sandbox line of `/status` (`None`: exec is off).
    exec: Option<(ExecConfig, std::sync::Arc<crate::sandbox::Sandbox>)>,
}

impl CommandContext {
    pub fn new(
        jobs: Option<(JobStore, jiff::tz::TimeZone)>,
        scheduler: Option<SchedulerHandle>,
        exec: Option<(ExecConfig, std::sync::Arc<crate::sandbox::Sandbox>)>,
    ) -> CommandContext {
        CommandContext { jobs, scheduler, exec }
    }

    /// The job store and display zone, if set.
    pub fn jobs(&self) -> Option<&(JobStore, jiff::tz::TimeZone)> {
        self.jobs.as_ref()
    }

    /// The daemon's scheduler, if the agent runs in the daemon.
    pub fn scheduler(&self) -> Option<&SchedulerHandle> {
        self.scheduler.as_ref()
    }

    /// The sandbox layers commands get, for `/status`; `None` when exec is off.
    pub fn sandbox_summary(&self) -> Option<String> {
        self.exec.as_ref().filter(|(c, _)| c.enabled).map(|(c, sandbox)| sandbox.layers_summary(c))
    }
}

/// A command as typed: `/name args`, with any `@botname` suffix removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Invocation<'a> {
    /// Lower-cased, without the slash.
    pub name: &'a str,
    /// The rest of the message, trimmed.
    pub args: &'a str,
}

/// A handler: the agent, the session the command was sent in (its key, and
/// where it came from), its arguments.
type Handler = for<'a> fn(&'a Agent, Sent<'a>, &'a str) -> BoxFuture<'a, String>;

/// Where a command was sent: the session's key and its source (`[policy.*]`;
/// `/new` and `/compact` write long-term memory only for a source that may).
#[derive(Debug, Clone, Copy)]
struct Sent<'a> {
    key: &'a str,
    source: Source,
}

/// One row of the command table.
pub struct Command {
    pub name: &'static str,
    /// Arguments, for `/help` (`<job>`), or empty.
    pub args: &'static str,
    /// One line for `/help` and Telegram's menu.
    pub about: &'static str,
    handler: Handler,
}

/// Every command. Order is the order of `/help` and of Telegram's menu.
pub const COMMANDS: &[Command] = &[
    Command { name: "new", args: "", about: "Start a fresh conversation (the old one goes to memory)", handler: new },
    Command { name: "stop", args: "", about: "Stop what I am doing in this chat", handler: stop },
    Command { name: "status", args: "", about: "Model, provider, session, tokens, jobs, sandbox", handler: status },
    Command { name: "jobs", args: "", about: "List scheduled jobs", handler: jobs },
    Command { name: "run", args: "<job>", about: "Run a job now", handler: run },
    Command {
        name: "compact",
        args: "",
        about: "Summarise the older part of this conversation into memory",
        handler: compact,
    },
    Command { name: "model", args: "[name]", about: "Show or switch the model for this chat", handler: model },
    Command { name: "history", args: "[n]", about: "Show the last n messages of this chat", handler: history },
    Command { name: "help", args: "", about: "List the commands", handler: help },
];

/// The command in `text`, if it is one: `/word` (letters, digits, `_`),
/// optionally `@botname`, then whitespace or the end. `/etc/hosts` is not one.
pub fn parse(text: &str) -> Option<Invocation<'_>> {
    let text = text.trim();
    let body = text.strip_prefix('/')?;
    let end = body.find(char::is_whitespace).unwrap_or(body.len());
    let (word, args) = (&body[..end], body[end..].trim());
    let name = word.split_once('@').map_or(word, |(n, _)| n);
    let valid = !name.is_empty()
        && name.len() <= 32
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && word[name.len()..]
            .strip_prefix('@')
            .is_none_or(|bot| bot.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
    valid.then_some(Invocation { name, args })
}

/// Whether `name` is one of the [`COMMANDS`] (any case).
pub fn is_known(name: &str) -> bool {
    COMMANDS.iter().any(|c| c.name.eq_ignore_ascii_case(name))
}

/// Run a command sent in `conversation` (never in a job) and return the answer.
pub async fn execute(agent: &Agent, conversation: &Conversation, inv: &Invocation<'_>) -> String {
    let name = inv.name.to_ascii_lowercase();
    let sent = Sent { key: &conversation.session_key, source: Source::of(conversation, false) };
    match COMMANDS.iter().find(|c| c.name == name) {
        Some(cmd) => (cmd.handler)(agent, sent, inv.args).await,
        None => unknown(&name),
    }
}

/// `(command, description)` pairs for Telegram's `setMyCommands`.
pub fn menu() -> Vec<(&'static str, &'static str)> {
    COMMANDS.iter().map(|c| (c.name, c.about)).collect()
}

fn unknown(name: &str) -> String {
    let best = COMMANDS.iter().map(|c| (edit_distance(name, c.name), c.name)).min();
    match best {
        Some((d, cmd)) if d <= 2 || cmd.starts_with(name) => {
            format!("Unknown command /{name} — did you mean /{cmd}?")
        }
        _ => format!("Unknown command /{name} — /help lists the commands."),
    }
}

/// Levenshtein distance (short strings only).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur.push((prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// `/new`: the session goes to long-term memory only when its source may
/// write it; otherwise it is archived in the journal, and the answer says so.
fn new<'a>(agent: &'a Agent, Sent { key, source }: Sent<'a>, _: &'a str) -> BoxFuture<'a, String> {
    Box::pin(async move {
        match agent.reset_session(key, source).await {
            Ok(Consolidation::Nothing) => "Started a new conversation.".into(),
            Ok(done) => format!("Started a new conversation. {done}"),
            Err(e) => format!("Could not start a new conversation: {e}"),
        }
    })
}

fn stop<'a>(agent: &'a Agent, Sent { key, .. }: Sent<'a>, _: &'a str) -> BoxFuture<'a, String> {
    Box::pin(async move {
        let turns = match agent.stop_session(key) {
            0 => String::new(),
            1 => "Stopped 1 turn.".into(),
            n => format!("Stopped {n} turns (the running one and those queued behind it)."),
        };
        let subagents = match agent.stop_subagents(key) {
            0 => String::new(),
            1 => "Stopped 1 sub-agent.".into(),
            n => format!("Stopped {n} sub-agents."),
        };
        match (turns.is_empty(), subagents.is_empty()) {
            (true, true) => "Nothing is running here.".into(),
            (false, true) => turns,
            (true, false) => subagents,
            (false, false) => format!("{turns} {subagents}"),
        }
    })
}

/// One block: each fact once, the session's details (who answered, the
/// providers, tokens) under the lines they belong to.
fn status<'a>(agent: &'a Agent, Sent { key, .. }: Sent<'a>, _: &'a str) -> BoxFuture<'a, String> {
    Box::pin(async move {
        let provider = match agent.provider_problem() {
            None => "ready".to_string(),
            Some(why) => format!("not usable: {why}"),
        };
        let jobs = match agent.command_context().jobs().map(|(store, _)| store.list()) {
            Some(Ok(list)) => {
                let on = list.iter().filter(|j| j.enabled && !j.state.done).count();
                format!("{} ({on} active)", list.len())
            }
            Some(Err(e)) => format!("unreadable: {e}"),
            None => "unknown".into(),
        };
        let sandbox = agent.command_context().sandbox_summary().unwrap_or_else(|| "exec is off".into());
        let mut out = format!("bramble {}\n", env!("CARGO_PKG_VERSION"));
        let session = agent.session_status(key).await;
        match &session {
            Ok(st) => session_lines(&mut out, st, &provider),
            Err(e) => {
                let messages = agent.sessions().messages(key).map(|m| m.len()).unwrap_or(0);
                let model = agent.model_label(&agent.session_model(key));
                out.push_str(&format!(
                    "Model: {model}\nProvider: {provider}\nThis session: {messages} messages (details unreadable: {e})\n"
                ));
            }
        }
        out.push_str(&format!(
            "Jobs: {jobs}\nTurns running or queued: {}\nSandbox: {sandbox}\nVoice notes: {}\nImages: {}",
            agent.active_turns(),
            agent.transcription_summary(),
            agent.vision_summary(),
        ));
        if let Ok(st) = &session {
            if !st.mcp.is_empty() {
                out.push_str("\nMCP servers:");
                for line in &st.mcp {
                    out.push_str(&format!("\n  {line}"));
                }
            }
        }
        out
    })
}

/// `/status`'s model, provider, session and token lines.
fn session_lines(out: &mut String, st: &crate::agent::SessionStatus, provider: &str) {
    out.push_str(&format!("Model: {}\n", st.model));
    // With one provider there is no one else to have answered.
    if let Some(r) = st.answered.as_ref().filter(|_| !st.providers.is_empty()) {
        match &r.fallback {
            Some(why) => out.push_str(&format!("  last answer: {} (fallback: {why})\n", r.label())),
            None => out.push_str(&format!("  last answer: {}\n", r.label())),
        }
    }
    for line in &st.providers {
        out.push_str(&format!("  {line}\n"));
    }
    let consolidated = if st.consolidated { " (older ones consolidated)" } else { "" };
    let budget = if st.daily_budget == 0 { "no budget".to_string() } else { format!("budget {}", st.daily_budget) };
    out.push_str(&format!(
        "Provider: {provider}\nThis session: {} messages{consolidated}, prompt ≈ {} of {} tokens\nTokens today: {} ({budget})\n",
        st.messages,
        st.estimated_tokens,
        st.context_tokens,
        st.today.total(),
    ));
    if st.subagents > 0 {
        out.push_str(&format!("Sub-agents running: {}\n", st.subagents));
    }
}

fn jobs<'a>(agent: &'a Agent, _: Sent<'a>, _: &'a str) -> BoxFuture<'a, String> {
    Box::pin(async move {
        let Some((store, tz)) = agent.command_context().jobs() else { return "Jobs are not available here.".into() };
        let list = match store.list() {
            Ok(l) => l,
            Err(e) => return format!("Cannot read the jobs: {e}"),
        };
        if list.is_empty() {
            return "No jobs yet. Ask me to schedule something.".into();
        }
        let lines: Vec<String> = list
            .iter()
            .map(|j| {
                let next = if j.state.done {
                    "done".to_string()
                } else if !j.enabled {
                    "disabled".to_string()
                } else {
                    format!("next {}", crate::scheduler::schedule::local_time(j.state.next_run, tz))
                };
                let last = j.state.last_status.map(|s| format!(", last {s}")).unwrap_or_default();
                format!("• {} — {} — {next}{last}", j.name, j.schedule.describe(tz))
            })
            .collect();
        lines.join("\n")
    })
}

fn run<'a>(agent: &'a Agent, _: Sent<'a>, args: &'a str) -> BoxFuture<'a, String> {
    Box::pin(async move {
        let name = args.split_whitespace().next().unwrap_or("");
        if name.is_empty() {
            return "Usage: /run <job> — /jobs lists them.".into();
        }
        let Some(handle) = agent.command_context().scheduler() else {
            return format!("Jobs run in the daemon; here use `bramble cron run {name}`.");
        };
        let job = match agent.command_context().jobs().map(|(store, _)| store.get(name)) {
            Some(Ok(job)) => job,
            Some(Err(e)) => return format!("{e}. /jobs lists them."),
            None => return "Jobs are not available here.".into(),
        };
        if handle.run_now(&job.id) {
            let targets: Vec<String> = job.report_target_names();
            format!("Running job {} now; its report goes to {}.", job.name, targets.join(", "))
        } else {
            "The scheduler is busy or stopping; try again in a moment.".into()
        }
    })
}

fn compact<'a>(agent: &'a Agent, Sent { key, source }: Sent<'a>, _: &'a str) -> BoxFuture<'a, String> {
    Box::pin(async move {
        match agent.consolidate(key, source).await {
            Ok(done) => done.to_string(),
            Err(e) => format!("Could not compact this conversation: {e}"),
        }
    })
}

fn model<'a>(agent: &'a Agent, Sent { key, .. }: Sent<'a>, args: &'a str) -> BoxFuture<'a, String> {
    Box::pin(async move {
        let configured = agent.model_label(&agent.settings().model);
        match args.split_whitespace().next() {
            None => {
                let mut out = format!(
                    "Model: {} (configured: {configured}). `/model NAME` switches this chat (`provider/model` \
                     picks a provider); `/model default` goes back.",
                    agent.model_label(&agent.session_model(key))
                );
                let health = agent.provider_health();
                if !health.is_empty() {
                    out.push_str("\nProviders:");
                    for line in health {
                        out.push_str(&format!("\n  {line}"));
                    }
                }
                out
            }
            Some("default" | "reset") => {
                format!("Back to the configured model {}.", agent.model_label(&agent.set_session_model(key, None)))
            }
            Some(name) => format!(
                "This chat now uses {} (until bramble restarts; `/model default` goes back).",
                agent.model_label(&agent.set_session_model(key, Some(name)))
            ),
        }
    })
}

fn history<'a>(agent: &'a Agent, Sent { key, .. }: Sent<'a>, args: &'a str) -> BoxFuture<'a, String> {
    Box::pin(async move {
        let n = match args.split_whitespace().next().map(str::parse::<usize>) {
            None => 10,
            Some(Ok(n)) if n > 0 => n,
            _ => return "Usage: /history [n] — n is a number of messages (1–50).".into(),
        };
        match agent.history(key, n) {
            Ok(text) if text.trim().is_empty() => "This conversation is empty.".into(),
            Ok(text) => text,
            Err(e) => format!("Cannot read this conversation: {e}"),
        }
    })
}

fn help<'a>(_: &'a Agent, _: Sent<'a>, _: &'a str) -> BoxFuture<'a, String> {
    Box::pin(async move {
        let mut out = String::from("Commands:\n");
        for c in COMMANDS {
            let args = if c.args.is_empty() { String::new() } else { format!(" {}", c.args) };
            out.push_str(&format!("/{}{args} — {}\n", c.name, c.about));
        }
        out.push_str("Anything else is a message for me.");
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_commands_and_not_paths() {
        assert_eq!(parse("/help"), Some(Invocation { name: "help", args: "" }));
        assert_eq!(parse("  /run  backup now "), Some(Invocation { name: "run", args: "backup now" }));
        assert_eq!(parse("/stop@bramble_bot"), Some(Invocation { name: "stop", args: "" }));
        assert_eq!(parse("/run@bramble_bot backup"), Some(Invocation { name: "run", args: "backup" }));
        assert_eq!(parse("/etc/hosts is broken"), None);
        assert_eq!(parse("hello /help"), None);
        assert_eq!(parse("/"), None);
        assert_eq!(parse("/@bot"), None);
        assert_eq!(parse("/héllo"), None);
    }

    #[test]
    fn table_names_are_valid_telegram_commands() {
        for c in COMMANDS {
            assert!(parse(&format!("/{}", c.name)).is_some(), "{}", c.name);
            assert!(c.name.len() <= 32 && c.name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'));
            assert!(!c.about.is_empty() && c.about.len() <= 256);
        }
        assert_eq!(menu().len(), COMMANDS.len());
    }

    #[test]
    fn unknown_commands_suggest_the_nearest() {
        assert_eq!(unknown("stpo"), "Unknown command /stpo — did you mean /stop?");
        assert_eq!(unknown("stat"), "Unknown command /stat — did you mean /status?");
        assert_eq!(unknown("jbos"), "Unknown command /jbos — did you mean /jobs?");
        assert_eq!(unknown("frobnicate"), "Unknown command /frobnicate — /help lists the commands.");
    }

    /// An agent without a provider over a temp state dir, with a job store.
    fn agent(dir: &std::path::Path) -> Agent {
        agent_with(dir, None)
    }

    /// The same, with the daemon's scheduler (for `/run`) when given.
    fn agent_with(dir: &std::path::Path, scheduler: Option<crate::scheduler::SchedulerHandle>) -> Agent {
        use crate::agent::{context, session::SessionStore, AgentParts, AgentSettings};
        use crate::provider::{ProviderSlot, Unconfigured};
        let settings = AgentSettings {
            model: "m".into(),
            max_iterations: 1,
            max_tokens: 1,
            temperature: None,
            history_messages: 10,
            context_tokens: 10_000,
            daily_token_budget: 0,
            unanswered: crate::config::Unanswered::default(),
            model_footer: crate::config::ModelFooter::default(),
            vision: true,
            vision_model: None,
        };
        let limits = context::ContextLimits { per_file_chars: 100, total_chars: 100 };
        let ctx = context::ContextBuilder::new(dir.to_path_buf(), crate::config::TzName::system(), limits);
        let tools = crate::tools::ToolRegistry::new(1000);
        let mut parts = AgentParts::new(
            ProviderSlot::Unconfigured(Unconfigured::new("no provider in this test")),
            tools,
            SessionStore::new(dir),
            ctx,
            settings,
        );
        parts.jobs = Some((crate::scheduler::JobStore::open(dir), jiff::tz::TimeZone::UTC));
        parts.scheduler = scheduler;
        Agent::new(parts)
    }

    async fn say(agent: &Agent, text: &str) -> String {
        execute(
            agent,
            &crate::bus::Conversation::new(crate::bus::Channel::Telegram, "1", "telegram:1"),
            &parse(text).unwrap(),
        )
        .await
    }

    #[tokio::test]
    async fn stop_cancels_the_sessions_turns_and_says_how_many() {
        let dir = tempfile::tempdir().unwrap();
        let agent = agent(dir.path());
        assert_eq!(say(&agent, "/stop").await, "Nothing is running here.");
        let (a, b, other) = (Default::default(), Default::default(), Default::default());
        let _t1 = crate::agent::sessions::ActiveTurn::new(&agent.live, "telegram:1", &a);
        let _t2 = crate::agent::sessions::ActiveTurn::new(&agent.live, "telegram:1", &b);
        let _t3 = crate::agent::sessions::ActiveTurn::new(&agent.live, "telegram:2", &other);
        assert!(agent.session_busy("telegram:1"));
        assert!(say(&agent, "/status").await.contains("Turns running or queued: 3"));
        assert!(say(&agent, "/stop").await.starts_with("Stopped 2 turns"));
        let cancelled: [&tokio_util::sync::CancellationToken; 3] = [&a, &b, &other];
        assert_eq!(cancelled.map(|t| t.is_cancelled()), [true, true, false], "only this session's turns");
        assert!(!agent.session_busy("telegram:1") && agent.session_busy("telegram:2"));
    }

    #[tokio::test]
    async fn run_needs_the_daemon_and_a_known_job() {
        use crate::scheduler::{Job, JobKind, Schedule};
        let dir = tempfile::tempdir().unwrap();
        let agent = agent(dir.path());
        assert!(say(&agent, "/run").await.starts_with("Usage: /run <job>"));
        assert_eq!(say(&agent, "/run backup").await, "Jobs run in the daemon; here use `bramble cron run backup`.");
        let now = jiff::Timestamp::now();
        let every = Schedule::Every { every: crate::scheduler::parse_every("1h").unwrap(), anchor: now };
        let job =
            Job::new("backup", every, JobKind::Remind { text: "x".into() }, vec![], now, &jiff::tz::TimeZone::UTC);
        agent.command_context().jobs().unwrap().0.add(job.unwrap()).unwrap();
        let listed = say(&agent, "/jobs").await;
        assert!(listed.starts_with("• backup — every 1h") && listed.contains(" — next 20"), "{listed}");
        let scheduler =
            crate::scheduler::Scheduler::new(crate::scheduler::JobStore::open(dir.path()), jiff::tz::TimeZone::UTC);
        let agent = agent_with(dir.path(), Some(scheduler.handle()));
        assert_eq!(say(&agent, "/run backup").await, "Running job backup now; its report goes to log.");
        assert!(say(&agent, "/run nope").await.contains("/jobs lists them"));
    }

    #[tokio::test]
    async fn new_help_lists_and_unknown_suggests() {
        let dir = tempfile::tempdir().unwrap();
        let agent = agent(dir.path());
        assert_eq!(say(&agent, "/new").await, "Started a new conversation.");
        let help = say(&agent, "/HELP").await;
        for c in COMMANDS {
            assert!(help.contains(&format!("/{}", c.name)), "{help}");
        }
        assert_eq!(say(&agent, "/hlep").await, "Unknown command /hlep — did you mean /help?");
        assert!(say(&agent, "/status").await.contains("Provider: not usable: no provider in this test"));
    }

    #[tokio::test]
    async fn status_is_one_block_that_says_each_fact_once() {
        let dir = tempfile::tempdir().unwrap();
        let agent = agent(dir.path());
        let status = say(&agent, "/status").await;
        for label in ["model:", "session", "provider:", "tokens today", "jobs:", "sandbox:"] {
            let times = status.to_lowercase().matches(label).count();
            assert_eq!(times, 1, "`{label}` {times} times in:\n{status}");
        }
        assert!(status.contains("This session: 0 messages, prompt ≈ "), "{status}");
        assert!(status.contains("\nTokens today: 0 (no budget)\n"), "{status}");
        // One block: no empty line inside, every line but the first and the
        // indented details is `Label: value`.
        assert!(!status.trim_end().contains("\n\n"), "{status}");
        for line in status.lines().skip(1).filter(|l| !l.starts_with("  ")) {
            let label = line.split(": ").next().unwrap_or("");
            assert!(label.starts_with(|c: char| c.is_ascii_uppercase()) && line.contains(": "), "{line:?} in {status}");
        }
    }

    #[test]
    fn edit_distances() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("same", "same"), 0);
    }
}
