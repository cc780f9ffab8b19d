//! `cron`: the agent schedules work itself — "remind me at 9", "check the
//! garden sensor every morning".
//!
//! Jobs go into the same store as `bramble cron add` (the daemon picks them up
//! at once). A job made in a chat remembers that chat and reports back to it
//! unless `deliver` says otherwise. Creating jobs is refused inside a job run
//! or heartbeat: a reminder that schedules a reminder is how feedback loops
//! start (nanobot #1441).
//!
//! Jobs outlive the turn that made them and run with the owner's rights, so
//! only a trusted [`super::Origin`] may add or remove them (not MQTT: anyone
//! who can publish to the broker, a sandboxed command included), and a job's
//! `deliver` list obeys the same Telegram rule as the `message` tool.

use serde::Deserialize;
use serde_json::{json, Value};

use super::{parse_args, Tool, ToolContext, ToolError};
use crate::bus::Target;
use crate::config::TzName;
use crate::policy::AllowedChats;
use crate::scheduler::{self as sched, CatchUp, Job, JobKind, JobStore, Schedule};
use crate::util::BoxFuture;

pub struct CronTool {
    store: JobStore,
    tz: TzName,
    /// The chats of `[telegram] allow_from`: the only Telegram chats a job may deliver to.
    telegram: AllowedChats,
    /// `[mqtt] publish_allow`, never a topic bramble listens to: the only
    /// topics a job may deliver to, as for the `message` tool and
    /// `mqtt_publish` (a report is a publish too).
    mqtt_allow: super::mqtt::MqttPublish,
}

impl CronTool {
    pub fn new(store: JobStore, tz: TzName, telegram: AllowedChats, publish_allow: Vec<String>) -> Self {
        let mqtt_allow = super::mqtt::MqttPublish::new(publish_allow, None);
        CronTool { store, tz, telegram, mqtt_allow }
    }

    /// Refuse `mqtt:<topic>` targets bramble listens to.
    pub fn with_mqtt_inputs(mut self, inputs: Option<crate::util::mqtt::InputTopics>) -> Self {
        self.mqtt_allow = self.mqtt_allow.refusing(inputs);
        self
    }

    async fn add(&self, a: Args, ctx: &ToolContext) -> Result<String, ToolError> {
        ctx.origin.may_manage_jobs()?;
        if ctx.in_job {
            return Err(ToolError::new(
                "jobs cannot be created from inside a scheduled job or heartbeat (that is how feedback loops start)",
            ));
        }
        let now = jiff::Timestamp::now();
        let schedule = match (a.every.as_deref(), a.cron.as_deref(), a.at.as_deref()) {
            (Some(every), None, None) => {
                Schedule::Every { every: sched::parse_every(every).map_err(err)?, anchor: now }
            }
            (None, Some(expr), None) => sched::parse_cron(expr, a.tz.as_deref()).map_err(err)?,
            (None, None, Some(at)) => Schedule::at(sched::parse_at(at, self.tz.tz()).map_err(err)?),
            _ => return Err(ToolError::new("give exactly one of `every`, `cron` or `at`")),
        };
        let kind =
            match (a.message, a.remind) {
                (Some(text), None) => JobKind::Message { text },
                (None, Some(text)) => JobKind::Remind { text },
                _ => return Err(ToolError::new(
                    "give exactly one of `message` (a task you will do when it is due) or `remind` (text sent as is)",
                )),
            };
        let deliver =
            a.deliver.iter().map(|t| t.parse::<Target>().map_err(ToolError)).collect::<Result<Vec<_>, _>>()?;
        for target in &deliver {
            if let Target::Mqtt(Some(topic)) = target {
                self.mqtt_allow.check(topic)?;
            }
        }
        super::message::check_delivery(ctx, &deliver, &self.telegram).await?;
        let name = match a.name {
            Some(n) => n,
            None => default_name(&kind),
        };
        let mut job = Job::new(&name, schedule, kind, deliver, now, self.tz.tz()).map_err(err)?;
        if let Some(policy) = a.catch_up {
            job.catch_up = policy.parse::<CatchUp>().map_err(err)?;
        }
        job.origin = Some(ctx.conversation.clone());
        // Its turns act for whoever asked, within their rights as they are when it runs.
        job.creator = Some(ctx.principal.clone());
        job.ha_button = a.ha_button;
        crate::scheduler::job::check_attach(&a.attach).map_err(|e| ToolError(e.to_string()))?;
        job.attach = a.attach;
        job.model = a.model.map(|m| m.trim().to_string()).filter(|m| !m.is_empty());
        if job.model.is_some() && !matches!(job.kind, JobKind::Message { .. }) {
            return Err(ToolError::new("`model` is for `message` jobs only (a reminder calls no model)"));
        }
        if let Some(command) = a.watch.filter(|c| !c.trim().is_empty()) {
            if !matches!(job.kind, JobKind::Message { .. }) {
                return Err(ToolError::new("`watch` needs `message`: the task to do when the output changes"));
            }
            let mode = a
                .watch_mode
                .as_deref()
                .unwrap_or("changed")
                .parse::<crate::scheduler::WatchMode>()
                .map_err(ToolError)?;
            job.watch = Some(crate::scheduler::Watch { command, mode });
        }
        if let Some(j) = a.jitter.as_deref().filter(|j| !j.trim().is_empty()) {
            job.jitter = Some(j.parse::<crate::config::Dur>().map_err(|e| ToolError::new(format!("jitter: {e}")))?);
        }
        if a.max_runs == Some(0) {
            return Err(ToolError::new("max_runs must be at least 1"));
        }
        job.max_runs = a.max_runs;
        if let Some(u) = a.until.as_deref() {
            let u = sched::parse_at(u, self.tz.tz()).map_err(err)?;
            if u <= now {
                return Err(ToolError::new(format!("until {u} is already past")));
            }
            job.until = Some(u);
        }
        let targets: Vec<String> = job.report_target_names();
        // Log only by default, not by choice: say so, and where else they could go.
        let log_only = job.deliver.is_empty() && job.report_targets() == [Target::Log];
        let job = self.store.add(job).map_err(err)?;
        let reports =
            if log_only { log_only_notice(ctx.origin) } else { format!("Reports go to {}.", targets.join(", ")) };
        Ok(format!(
            "Scheduled `{}` (id {}): {}. Next run: {}. {reports}",
            job.name,
            job.id,
            job.schedule.describe(self.tz.tz()),
            when(job.state.next_run, &job.schedule, &self.tz),
        ))
    }

    fn list(&self) -> Result<String, ToolError> {
        let jobs = self.store.list().map_err(err)?;
        if jobs.is_empty() {
            return Ok("No jobs.".into());
        }
        let lines: Vec<String> = jobs
            .iter()
            .map(|j| {
                let what = match &j.kind {
                    JobKind::Message { text } => format!("task: {text}"),
                    JobKind::Remind { text } => format!("reminder: {text}"),
                    JobKind::Exec { command } => format!("command: {command}"),
                };
                let state = if j.state.done {
                    "done".to_string()
                } else if !j.enabled {
                    "disabled".to_string()
                } else {
                    format!("next {}", when(j.state.next_run, &j.schedule, &self.tz))
                };
                format!("- {} (id {}): {}; {}; {}", j.name, j.id, j.schedule.describe(self.tz.tz()), state, what)
            })
            .collect();
        Ok(lines.join("\n"))
    }

    fn remove(&self, key: Option<String>, ctx: &ToolContext) -> Result<String, ToolError> {
        ctx.origin.may_manage_jobs()?;
        let key = key.ok_or_else(|| ToolError::new("`job` (the id or name to remove) is required"))?;
        let job = self.store.remove(&key).map_err(err)?;
        Ok(format!("Removed `{}` (id {}).", job.name, job.id))
    }
}

/// What the answer says of a job whose reports go only to the daemon's log
/// because the chat it was made in cannot be reached later (the terminal),
/// with the targets that would reach the user: the model relays it and asks.
fn log_only_notice(origin: super::Origin) -> String {
    let why = match origin {
        super::Origin::Cli => "the terminal chat is not there when the job runs, so ",
        _ => "this chat cannot be reached when the job runs, so ",
    };
    format!(
        "Its reports go only to the log: {why}nobody will see them unless they read the daemon's log. \
         To receive them, remove it and add it again with `deliver`: `telegram:<chat id>` (a user of \
         [telegram] allow_from), `mqtt` (the device's report topic) or `mqtt:<topic>` (within [mqtt] \
         publish_allow), or `ha:notify.<service>` (a Home Assistant notify service); from a shell, \
         `bramble cron add ... --deliver telegram:<chat id>`. Ask the user where they want the reports."
    )
}

fn err(e: impl std::fmt::Display) -> ToolError {
    ToolError::new(e.to_string())
}

/// A job's time as its schedule reads: a cron job's own zone, else the default.
fn when(t: Option<jiff::Timestamp>, schedule: &Schedule, tz: &TzName) -> String {
    sched::schedule::local_time(t, &schedule.zone(tz.tz()))
}

/// A name from the first words of the text plus a few random characters.
fn default_name(kind: &JobKind) -> String {
    let text = match kind {
        JobKind::Message { text } | JobKind::Remind { text } => text.as_str(),
        JobKind::Exec { command } => command.as_str(),
    };
    let mut slug: String = text
        .split_whitespace()
        .take(4)
        .collect::<Vec<_>>()
        .join("-")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(40)
        .collect::<String>()
        .to_ascii_lowercase();
    if slug.is_empty() {
        slug = "job".into();
    }
    format!("{slug}-{}", &sched::job::new_id()[..4])
}

#[derive(Deserialize)]
struct Args {
    action: String,
    name: Option<String>,
    message: Option<String>,
    remind: Option<String>,
    every: Option<String>,
    cron: Option<String>,
    tz: Option<String>,
    at: Option<String>,
    #[serde(default)]
    deliver: Vec<String>,
    catch_up: Option<String>,
    #[serde(default)]
    ha_button: bool,
    #[serde(default)]
    attach: Vec<String>,
    model: Option<String>,
    watch: Option<String>,
    watch_mode: Option<String>,
    jitter: Option<String>,
    max_runs: Option<u32>,
    until: Option<String>,
    job: Option<String>,
}

impl Tool for CronTool {
    fn name(&self) -> &str {
        "cron"
    }

    fn description(&self) -> &str {
        "Schedule, list or remove jobs. `add` needs one schedule (`every` like \"2h\", `cron` like \"0 9 * * 1-5\" \
         with optional `tz`, or `at` like \"2026-05-01 09:00\" in the user's time zone) and one action: `remind` \
         (text delivered as is at that time: use this for plain reminders) or `message` (a task you will carry out \
         then, with your tools). For \"tell me when X changes\", add `watch`: a command run on schedule whose \
         output gates the task, so unchanged polls cost no model call. Results go back to this chat unless \
         `deliver` names targets."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": ["add", "list", "remove"]},
                "name": {"type": "string", "description": "Unique job name (letters, digits, - and _); made up if omitted"},
                "remind": {"type": "string", "description": "Reminder text, delivered verbatim"},
                "message": {"type": "string", "description": "Task to carry out when due"},
                "every": {"type": "string", "description": "Interval: 90s, 10m, 2h, 1d"},
                "cron": {"type": "string", "description": "Cron expression, 5 fields (or 6 with seconds first)"},
                "tz": {"type": "string", "description": "IANA time zone for `cron`; default the user's"},
                "at": {"type": "string", "description": "One-shot time: YYYY-MM-DD HH:MM (user's zone) or RFC 3339"},
                "deliver": {"type": "array", "items": {"type": "string"},
                            "description": "Targets: telegram:<chat_id>, mqtt, mqtt:<topic>, log; default this chat"},
                "catch_up": {"type": "string", "description": "Missed runs: skip, once, or a window like 2h"},
                "ha_button": {"type": "boolean", "description": "Give the job a Run button in Home Assistant (only when the user asks for one)"},
                "attach": {"type": "array", "items": {"type": "string"}, "description": "Workspace files sent with each report (e.g. a chart the job's command draws)"},
                "model": {"type": "string", "description": "For `message` jobs, only when the user names one: the model, as provider/model"},
                "watch": {"type": "string", "description": "A shell command run on schedule; the `message` task runs only when its output changes (no model call otherwise). Put {output} and {previous} in the message"},
                "watch_mode": {"type": "string", "enum": ["changed", "nonempty", "exit-nonzero"], "description": "When the task runs (default changed)"},
                "max_runs": {"type": "integer", "minimum": 1, "description": "Done after this many runs (\"remind me 3 times\")"},
                "until": {"type": "string", "description": "Done when the next run would be after this time (\"every hour until Friday\"): YYYY-MM-DD HH:MM"},
                "jitter": {"type": "string", "description": "Spread the start by up to this duration (e.g. 5m), a fixed offset per job"},
                "job": {"type": "string", "description": "For remove: the job's id or name"}
            },
            "required": ["action"]
        })
    }

    fn brief(&self) -> String {
        "Jobs. add: one of every (\"2h\"), cron (\"0 9 * * 1-5\"), at (\"YYYY-MM-DD HH:MM\"), and remind \
         (text sent as is) or message (a task for you then). list. remove: job."
            .to_string()
    }

    /// The lean schema: the properties a plain reminder, a recurring task and
    /// a removal need (the others still work when given).
    fn lean_parameters(&self) -> Value {
        let s = json!({"type": "string"});
        json!({
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": ["add", "list", "remove"]},
                "remind": s, "message": s, "every": s, "cron": s, "at": s, "job": s
            },
            "required": ["action"]
        })
    }

    fn execute<'a>(&'a self, args: Value, ctx: &'a ToolContext) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let a: Args = parse_args("cron", args)?;
            match a.action.as_str() {
                "add" => self.add(a, ctx).await,
                "list" => self.list(),
                "remove" => self.remove(a.job.or(a.name), ctx),
                other => Err(ToolError::new(format!("unknown action `{other}`: use add, list or remove"))),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(dir: &std::path::Path) -> CronTool {
        CronTool::new(
            JobStore::open(dir),
            "Europe/Berlin".parse().unwrap(),
            AllowedChats::new(&["7".into()], dir),
            vec!["home/#".into()],
        )
    }

    fn telegram_ctx() -> ToolContext {
        ToolContext::detached("telegram:42").from_chat("telegram", "42")
    }

    #[tokio::test]
    async fn untrusted_origins_cannot_manage_jobs_nor_deliver_to_strangers() {
        let dir = tempfile::tempdir().unwrap();
        let t = tool(dir.path());
        let mqtt = ToolContext::detached("mqtt:in").from_chat("mqtt", "");
        let e = t.execute(json!({"action":"add","every":"1h","remind":"x"}), &mqtt).await.unwrap_err();
        assert!(e.0.contains("untrusted origin") && e.0.contains("cannot create"), "{e}");
        assert!(JobStore::open(dir.path()).list().unwrap().is_empty());
        t.execute(json!({"action":"add","name":"tea","every":"1h","remind":"x"}), &telegram_ctx()).await.unwrap();
        let e = t.execute(json!({"action":"remove","job":"tea"}), &mqtt).await.unwrap_err();
        assert!(e.0.contains("untrusted origin"), "{e}");
        assert!(t.execute(json!({"action":"list"}), &mqtt).await.unwrap().contains("tea"));
        // deliver: only allow_from chats (7), whoever asks.
        let e = t
            .execute(json!({"action":"add","every":"1h","remind":"x","deliver":["telegram:999"]}), &telegram_ctx())
            .await
            .unwrap_err();
        assert!(e.0.contains("allow_from"), "{e}");
        t.execute(json!({"action":"add","every":"1h","remind":"x","deliver":["telegram:7"]}), &telegram_ctx())
            .await
            .unwrap();
        assert_eq!(JobStore::open(dir.path()).list().unwrap().len(), 2);
    }

    #[tokio::test]
    async fn a_reminder_made_in_a_chat_reports_back_to_it() {
        let dir = tempfile::tempdir().unwrap();
        let t = tool(dir.path());
        let out = t
            .execute(json!({"action":"add","name":"tea","every":"1h","remind":"Drink tea"}), &telegram_ctx())
            .await
            .unwrap();
        assert!(out.contains("Scheduled `tea`") && out.contains("Reports go to telegram:42"), "{out}");
        let job = JobStore::open(dir.path()).get("tea").unwrap();
        assert_eq!(job.kind, JobKind::Remind { text: "Drink tea".into() });
        assert_eq!(job.report_targets(), vec![Target::Telegram("42".into())]);
        assert_eq!(job.origin.unwrap().session_key, "telegram:42");
        let list = t.execute(json!({"action":"list"}), &telegram_ctx()).await.unwrap();
        assert!(list.contains("tea") && list.contains("reminder: Drink tea"), "{list}");
        let out = t.execute(json!({"action":"remove","job":"tea"}), &telegram_ctx()).await.unwrap();
        assert!(out.starts_with("Removed `tea`"));
        assert!(JobStore::open(dir.path()).list().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_job_made_in_the_terminal_says_its_reports_go_only_to_the_log_and_offers_targets() {
        let dir = tempfile::tempdir().unwrap();
        let t = tool(dir.path());
        let cli = ToolContext::detached("cli:direct");
        let out =
            t.execute(json!({"action":"add","name":"tea","every":"1h","remind":"Drink tea"}), &cli).await.unwrap();
        assert!(out.starts_with("Scheduled `tea`"), "{out}");
        assert!(out.contains("go only to the log") && out.contains("terminal chat is not there"), "{out}");
        assert!(out.contains("`telegram:<chat id>`") && out.contains("--deliver telegram:<chat id>"), "{out}");
        assert!(!out.contains("Reports go to log."), "{out}");
        assert_eq!(JobStore::open(dir.path()).get("tea").unwrap().report_targets(), vec![Target::Log]);
        // Chosen targets, the log included, are simply named.
        let out =
            t.execute(json!({"action":"add","every":"1h","remind":"x","deliver":["telegram:7"]}), &cli).await.unwrap();
        assert!(out.contains("Reports go to telegram:7.") && !out.contains("only to the log"), "{out}");
        let out = t.execute(json!({"action":"add","every":"1h","remind":"x","deliver":["log"]}), &cli).await.unwrap();
        assert!(out.contains("Reports go to log.") && !out.contains("only to the log"), "{out}");
        // A Telegram chat gets its reports back: nothing to say.
        let out = t.execute(json!({"action":"add","every":"1h","remind":"x"}), &telegram_ctx()).await.unwrap();
        assert!(out.contains("Reports go to telegram:42.") && !out.contains("only to the log"), "{out}");
    }

    #[tokio::test]
    async fn refused_inside_a_job_run() {
        let dir = tempfile::tempdir().unwrap();
        let mut ctx = telegram_ctx();
        ctx.in_job = true;
        let e = tool(dir.path()).execute(json!({"action":"add","every":"1m","remind":"x"}), &ctx).await.unwrap_err();
        assert!(e.0.contains("cannot be created from inside a scheduled job"), "{e}");
        assert!(JobStore::open(dir.path()).list().unwrap().is_empty());
    }

    #[tokio::test]
    async fn bad_input_explains_itself() {
        let dir = tempfile::tempdir().unwrap();
        let t = tool(dir.path());
        let ctx = telegram_ctx();
        let e =
            t.execute(json!({"action":"add","every":"1h","cron":"* * * * *","remind":"x"}), &ctx).await.unwrap_err();
        assert!(e.0.contains("exactly one of `every`, `cron` or `at`"), "{e}");
        let e = t.execute(json!({"action":"add","cron":"61 * * * *","remind":"x"}), &ctx).await.unwrap_err();
        assert!(!e.0.is_empty());
        let e = t.execute(json!({"action":"add","every":"1h"}), &ctx).await.unwrap_err();
        assert!(e.0.contains("`message`"), "{e}");
        let e = t.execute(json!({"action":"add","at":"2001-01-01 09:00","remind":"x"}), &ctx).await.unwrap_err();
        assert!(!e.0.is_empty());
        let e = t.execute(json!({"action":"pause"}), &ctx).await.unwrap_err();
        assert!(e.0.contains("unknown action"), "{e}");
    }

    #[tokio::test]
    async fn names_are_made_up_when_missing() {
        let dir = tempfile::tempdir().unwrap();
        let out = tool(dir.path())
            .execute(json!({"action":"add","every":"1d","message":"Check the garden sensor!"}), &telegram_ctx())
            .await
            .unwrap();
        let job = &JobStore::open(dir.path()).list().unwrap()[0];
        assert!(job.name.starts_with("check-the-garden-sensor-"), "{}", job.name);
        assert!(out.contains(&job.name));
    }
}
