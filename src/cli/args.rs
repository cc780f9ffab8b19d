//! The command line's definition (clap): every command, flag and help text.
//! The commands themselves are in the sibling files, one per command.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// bramble: a small, scheduler-first AI agent for your Raspberry Pi.
#[derive(Debug, Parser)]
// `option_env!`: build.rs compiles this file too (for the man page), before the version exists.
#[command(
    name = "bramble",
    version = option_env!("BRAMBLE_VERSION").unwrap_or(env!("CARGO_PKG_VERSION")),
    propagate_version = true,
    max_term_width = 100
)]
pub struct Cli {
    // Global: shown at every level, so `-h` gets one short line; `--help` says where it is looked for.
    #[arg(
        long,
        global = true,
        env = "BRAMBLE_CONFIG",
        value_name = "PATH",
        help = "Config file [default: see --help]",
        long_help = "Config file [default: $XDG_CONFIG_HOME/bramble/config.toml, \
                     /etc/bramble/config.toml under systemd]"
    )]
    pub config: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Write a commented config.toml, the env file and the workspace templates; on a terminal, ask
    /// for the provider, model, key, Telegram and MQTT first (re-running keeps what is set)
    Init {
        /// Where the agent's workspace goes [default: from the config, else ~/.local/share/bramble/workspace]
        #[arg(long, value_name = "DIR")]
        workspace: Option<PathBuf>,
        #[command(flatten)]
        setup: InitSetup,
    },
    /// The daemon: scheduler, heartbeat, agent and channels (SIGHUP reloads, SIGTERM stops)
    Run,
    /// One turn with -m, else a chat in the terminal
    Agent {
        /// The message; without it, read messages from the terminal until EOF or `exit`
        #[arg(short, long, value_name = "TEXT")]
        message: Option<String>,
        /// Session key: turns with the same key share history [default: cli:direct for the chat,
        /// cli:message for -m, so that one-off messages stay out of the chat's history]
        #[arg(short, long, value_name = "KEY")]
        session: Option<String>,
    },
    /// Scheduled jobs: reminders, agent tasks and commands
    #[command(subcommand)]
    Cron(Box<CronCommand>),
    /// Run one heartbeat now: read HEARTBEAT.md and, if it lists active tasks, run them
    Heartbeat {
        /// Show what would run, without calling the model or delivering anything
        #[arg(long)]
        dry_run: bool,
    },
    /// Show provider, paths, tools and sessions
    Status {
        /// One JSON object instead of the text (`--help` lists its fields)
        ///
        /// Stable names, fields only ever added; times RFC 3339 UTC; null when unknown or private
        /// to the service. The fields: `source` (`daemon`|`shell`),
        /// `daemon_pid`, `config`, `env_file`, `env_file_daemon`, `providers` [{`name`, `kind`,
        /// `base_url`, `model`, `key` {`state`: `set`|`unset`|`not_needed`, `env`}, `key_from`,
        /// `tokens_today`, `daily_token_budget`}], `model`, `fallback`, `fallback_cooldown`,
        /// `time_zone`, `workspace`, `workspace_exists`, `state_dir`, `daemon`, `service`, `tools`,
        /// `channels`, `mcp`, `channels_error`, `exec` {`enabled`, `timeout`, `network`, `sandbox`},
        /// `web_search`, `telegram`, `mqtt`, `matrix`, `policy`, `homeassistant`, `webhooks`, `email`, `signal`,
        /// `feishu`, `discord`, `ntfy`, `fleet`, `secrets_from`,
        /// `private`, `sessions`, `tokens_today`, `daily_token_budget`, `skills`, `skills_available`,
        /// `skills_with_errors`, `clock`, `heartbeat` {`enabled`, `every`, `active_tasks`,
        /// `last_run`}, `job_count`, `jobs` [the objects of `cron list --json`], `jobs_error`,
        /// `job_store_notice`, `undelivered`, `outbox` [{`target`, `source`, `attempts`,
        /// `last_error`}], `outbox_error`, `alerts_deliver`, `open_alerts`, `alerts` [{`key`,
        /// `since`, `text`}]
        #[arg(long)]
        json: bool,
    },
    /// Check what users ask about: config, keys, provider (one GET of its model list, no tokens),
    /// Telegram (getMe), MQTT (one CONNECT), clock, sandbox, disk, service
    Doctor {
        /// One JSON object instead of the text (`--help` lists its fields)
        ///
        /// The fields: `result` (`ok`|`warn`|`fail`), `errors`, `warnings`,
        /// `checks` [{`name`, `status` (`ok`|`warn`|`fail`|`skip`), `detail`, `hint` (or null)}];
        /// the exit status is the text's (1 when a check failed)
        #[arg(long)]
        json: bool,
    },
    /// Print a shell completion script: `bramble completions bash > /etc/bash_completion.d/bramble`
    Completions {
        /// The shell
        #[arg(value_enum)]
        shell: Shell,
    },
    /// Print the man page (roff), as the .deb installs it
    #[command(hide = true)]
    Man,
    /// The service's log: `journalctl -u bramble` where systemd runs it
    Logs {
        /// Keep printing new lines as they come
        #[arg(short, long)]
        follow: bool,
        /// How many of the last lines to show
        #[arg(short = 'n', long, value_name = "N", default_value_t = 100)]
        lines: u32,
    },
    /// Tool calls that changed something (commands, files, MQTT, jobs, Home Assistant, MCP), with who asked
    Audit {
        /// From this long ago (`1h`, `2d`) or this time (`2026-11-23 08:00`) [default: the last day]
        #[arg(long, value_name = "WHEN", default_value = "1d", hide_default_value = true)]
        since: String,
        /// One JSON object per line: `at` (RFC 3339, UTC), `source`, `session`, `chat`, `tool`, `ok`, `detail`
        #[arg(long)]
        json: bool,
    },
    /// Reports waiting to be delivered: list them, retry one now, or drop one that never can be
    #[command(subcommand)]
    Outbox(OutboxCommand),
    /// Remote MCP servers' OAuth: log in (the URL is opened on any device), log out, list each server's state
    #[command(subcommand)]
    Mcp(McpCommand),
    /// Let a new user in: print a one-time code (10 minutes) they send as `/pair <code>`
    Pair {
        /// The channel: telegram (the default), matrix, email, discord, signal or feishu
        #[arg(long, value_name = "CHANNEL")]
        channel: Option<PairWith>,
        /// List the users added by pairing
        #[arg(long, conflicts_with = "revoke")]
        list: bool,
        /// Remove a paired user (a Telegram numeric id, a Matrix @user:server, a mail address, a Discord
        /// user id, a Signal uuid or +number, a Feishu ou_ open_id)
        #[arg(long, value_name = "ID")]
        revoke: Option<String>,
    },
    /// Fleet mode ([fleet]): the boards, and the broker ACL they need
    #[command(subcommand)]
    Fleet(FleetCommand),
    /// Validate the config and the workspace; errors as FILE:LINE:COL
    Check {
        /// Check what a reload of the running daemon needs: the config parses and keeps the
        /// daemon's state directory (the unit's ExecReload runs this before sending SIGHUP)
        #[arg(long)]
        reload: bool,
    },
}

/// `bramble fleet …`.
#[derive(Debug, Subcommand)]
pub enum FleetCommand {
    /// Every board on the broker: online or offline, role, version, last seen, jobs
    Status,
    /// Print a mosquitto ACL for the fleet: each board writes only under bramble/<board>/
    Acl,
}

/// `bramble outbox …`.
#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// The reports waiting, oldest first: id, target, attempts, last error
    List {
        /// A JSON array, one object per report: id, target, source, job, created, attempts,
        /// next_attempt, last_error, deliverable, text (stable names)
        #[arg(long)]
        json: bool,
    },
    /// Try this report again at the daemon's next pass (clears its back-off)
    Retry {
        /// The report's id (from `bramble outbox list`), or `all`
        id: String,
    },
    /// Delete this report: it is never delivered
    Drop {
        /// The report's id (from `bramble outbox list`)
        id: String,
    },
}

/// `bramble mcp …`.
#[derive(Debug, Subcommand)]
pub enum McpCommand {
    /// Each configured MCP server, its address and its authorization state (connects to nothing)
    List,
    /// Authorize bramble with a server that asks for OAuth: print the URL to open in a browser on any
    /// device, then take the browser's redirect (to this machine) or its address pasted here
    Login {
        /// The server's `name` in [[mcp.server]]
        name: String,
    },
    /// Forget a server's OAuth grant (its token file): it asks for a login again
    Logout {
        /// The server's `name` in [[mcp.server]]
        name: String,
    },
}

/// A shell `bramble completions` writes for.
/// The channels whose users `bramble pair` lets in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PairWith {
    Telegram,
    Matrix,
    Email,
    Discord,
    Signal,
    Feishu,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// `bramble cron add`'s options: one struct, parsed by clap, read by
/// `cron add`, by the control socket's handler and sent back by a member's CLI.
#[derive(Debug, Clone, clap::Args)]
#[command(group(clap::ArgGroup::new("schedule").required(true).args(["every", "cron", "at", "in"])))]
#[command(group(clap::ArgGroup::new("action").required(true).args(["message", "remind", "exec"])))]
pub struct AddArgs {
    /// A unique name: letters, digits, `-` and `_` (used in MQTT topics)
    pub name: String,
    /// Run at a fixed interval: 90s, 10m, 2h, 1d (a number needs its unit)
    #[arg(long, value_name = "DUR")]
    pub every: Option<String>,
    /// Run on a cron expression: 5 fields (`0 9 * * 1-5`) or 6 with seconds first
    #[arg(long, value_name = "EXPR")]
    pub cron: Option<String>,
    /// The time zone --cron and --at are read in [default: [agent] timezone]
    #[arg(long, value_name = "ZONE")]
    pub tz: Option<String>,
    /// Run once: `16:30` (the next one), `tomorrow 07:00`, `2026-12-01 09:00`, `+2m`, or RFC 3339
    #[arg(long, value_name = "TIME")]
    pub at: Option<String>,
    /// Run once, this long from now: 2m, 1h30m (the same as `--at +2m`)
    #[arg(long = "in", id = "in", value_name = "DUR")]
    pub in_: Option<String>,
    /// An agent turn with this task
    #[arg(long, value_name = "TEXT")]
    pub message: Option<String>,
    /// Deliver this text as it is (no model call)
    #[arg(long, value_name = "TEXT")]
    pub remind: Option<String>,
    /// Run this shell command in the sandbox (no model call)
    #[arg(long, value_name = "CMD")]
    pub exec: Option<String>,
    /// Where the result goes: telegram:<chat_id>, mqtt, mqtt:<topic>, ha:notify.<service>, log (repeatable) [default: log]
    #[arg(long, value_name = "TARGET")]
    pub deliver: Vec<String>,
    /// Missed runs (daemon down, clock jump): skip, once, or a window like 2h [default: skip; once for --at]
    #[arg(long, value_name = "POLICY")]
    pub catch_up: Option<String>,
    /// Give the job a "Run" button in Home Assistant (with `[mqtt] discovery = true`)
    #[arg(long)]
    pub ha_button: bool,
    /// Send this workspace file with each report (Telegram: a photo or a document; repeatable)
    #[arg(long, value_name = "FILE")]
    pub attach: Vec<String>,
    /// The model for its turns: `provider/model`, a provider's name, or a model
    /// of the first provider; `[agent] fallback` still applies
    #[arg(long, value_name = "MODEL")]
    pub model: Option<String>,
    /// A watcher: run this command (in the sandbox) on schedule, and the --message turn only when
    /// its output changed (see --watch-mode); `{output}` and `{previous}` go into the message
    #[arg(long, value_name = "CMD")]
    pub watch: Option<String>,
    /// When a watcher's turn runs: changed (output not empty and different), nonempty, exit-nonzero
    #[arg(long, value_name = "MODE", requires = "watch", default_value = "changed")]
    pub watch_mode: String,
    /// Start each run up to this much later (a fixed offset per job), so jobs set for the same
    /// minute spread out: 5m
    #[arg(long, value_name = "DURATION")]
    pub jitter: Option<String>,
    /// Done after this many scheduled runs ("remind me 3 times")
    #[arg(long, value_name = "N")]
    pub max_runs: Option<u32>,
    /// Done when the next run would be after this time (like --at)
    #[arg(long, value_name = "TIME")]
    pub until: Option<String>,
    /// Fleet: store and run the job on this board (its clock, zone and sandbox); its reports come
    /// to this board's chats. `any`: whichever board wins each run (needs [fleet] nats_url)
    #[arg(long, value_name = "BOARD")]
    pub on: Option<String>,
}

// Parsed once per process: the size of the `Add` variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum CronCommand {
    /// Add a job (a running daemon picks it up at once)
    // The generated usage names every value (140 columns): this one fits 100.
    #[command(
        override_usage = "bramble cron add [OPTIONS] <NAME> <--every|--cron|--at|--in> <--message|--remind|--exec>"
    )]
    Add(AddArgs),
    /// List jobs with their next run, in each job's zone (done one-shots with --all)
    List {
        /// Also the one-shots that are done (kept 30 days)
        #[arg(long)]
        all: bool,
        /// Fleet: every board's jobs, as each board last announced them on the broker
        #[arg(long, conflicts_with_all = ["all", "json"])]
        fleet: bool,
        /// A JSON array, one object per job: id, name, kind, text, schedule, zone, enabled, done,
        /// next_run, last_run (RFC 3339, UTC), last_status, last_error, deliver (stable names)
        #[arg(long)]
        json: bool,
    },
    /// Show one job with its recent runs
    Show {
        /// Job id or name
        id: String,
        /// The job as a JSON object: the fields of `cron list --json`, and `runs` (started,
        /// finished, status, summary, model)
        #[arg(long)]
        json: bool,
    },
    /// Remove a job
    Remove {
        /// Job id or name
        id: String,
        /// Fleet: remove it on this board (a signed command over the broker)
        #[arg(long, value_name = "BOARD")]
        on: Option<String>,
    },
    /// Run a job now, in this terminal, and queue its report (a member of the service's group:
    /// the running service runs it)
    Run {
        /// Job id or name
        id: String,
    },
    /// Enable a job (planned again from now)
    Enable {
        /// Job id or name
        id: String,
    },
    /// Disable a job
    Disable {
        /// Job id or name
        id: String,
    },
    /// Print when a cron expression fires, as the scheduler computes it (adds nothing): the next
    /// times in its zone with their UTC offsets, and what it means in words
    Next {
        /// 5 fields (`30 1-3 * * *`), 6 with seconds first, or a nickname (`@daily`)
        expr: String,
        /// Time zone of the expression [default: [agent] timezone]
        #[arg(long)]
        tz: Option<String>,
        /// Start after this time: RFC 3339, or `YYYY-MM-DD HH:MM` in the zone [default: now]
        #[arg(long, value_name = "TIME")]
        from: Option<String>,
        /// How many times to print (1 to 1000)
        #[arg(long, short = 'n', default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
        count: u32,
    },
}

impl Command {
    /// Commands that print something and exit (no children, no long-lived connections).
    pub fn prints_and_exits(&self) -> bool {
        match self {
            Command::Init { .. }
            | Command::Status { .. }
            | Command::Check { .. }
            | Command::Logs { .. }
            | Command::Doctor { .. }
            | Command::Completions { .. }
            | Command::Man
            | Command::Audit { .. }
            | Command::Outbox(_)
            | Command::Fleet(_)
            | Command::Pair { .. } => true,
            Command::Cron(c) => !matches!(**c, CronCommand::Run { .. }),
            // login talks to servers and its loopback: EPIPE stays an error there.
            Command::Mcp(c) => !matches!(c, McpCommand::Login { .. }),
            Command::Run | Command::Agent { .. } | Command::Heartbeat { .. } => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}

/// `bramble init`'s answers given as flags (for scripts; a terminal is asked the rest).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct InitSetup {
    /// Where the model is
    #[arg(long, value_enum)]
    pub provider: Option<ProviderChoice>,
    /// The server's URL (Ollama/LAN, OpenRouter or another OpenAI-compatible server)
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// The model's name as the server knows it
    #[arg(long)]
    pub model: Option<String>,
    /// The variable that holds the API key [default: by provider, e.g. OPENAI_API_KEY]
    #[arg(long, value_name = "NAME")]
    pub key_env: Option<String>,
    /// The variable that holds the Telegram bot's token (from @BotFather)
    #[arg(long, value_name = "NAME")]
    pub telegram_token_env: Option<String>,
    /// A Telegram user id the bot answers (repeatable; or `bramble pair` later)
    #[arg(long, value_name = "ID")]
    pub allow_from: Vec<i64>,
    /// The MQTT broker's URL (mqtt://host:1883)
    #[arg(long, value_name = "URL")]
    pub mqtt: Option<String>,
    /// Ask nothing, even on a terminal
    #[arg(long)]
    pub non_interactive: bool,
}

/// The providers `init` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProviderChoice {
    Openai,
    Anthropic,
    /// Ollama or another server on the LAN
    Ollama,
    Openrouter,
    /// Another OpenAI-compatible server (give --base-url)
    Other,
}
