//! The command line: `bramble init | run | agent | cron | heartbeat | status | logs | check`.
//!
//! [`args`] defines the commands (clap); each command is one file here, a
//! small function over the library that builds what it needs through the
//! composition root ([`crate::daemon::assemble`]). Errors go up as `anyhow`
//! with context that names the file or setting involved; `main` prints them
//! as `bramble: error: …`.

mod args;
mod chat;
mod check;
mod cron;
mod heartbeat;
mod init;
mod logs;
mod status;

use std::process::ExitCode;

use clap::Parser as _;

pub use args::{Cli, Command, CronCommand};

use crate::config;

/// Parse the process's arguments (exits with usage on error, as clap does).
pub fn parse() -> Cli {
    Cli::parse()
}

/// Run a parsed command.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let explicit = cli.config.as_deref();
    match cli.command {
        Command::Check { reload: false } => return Ok(check::check(explicit)),
        Command::Check { reload: true } => return Ok(check::reload(explicit)),
        Command::Init { workspace } => return init::init(explicit, workspace.as_deref()),
        Command::Logs { follow, lines } => return logs::logs(follow, lines),
        _ => {}
    }
    let loaded = config::load(explicit)?;
    // Commands started by this process never see the state dir, config or credentials.
    crate::sandbox::configure(&loaded);
    let default_level = if matches!(cli.command, Command::Run) { "info" } else { "warn" };
    crate::logging::init(loaded.config.daemon.log_level.as_deref(), default_level);
    match cli.command {
        Command::Run => crate::daemon::run(explicit, loaded).await.map(|()| ExitCode::SUCCESS),
        Command::Cron(cmd) => cron::cron(&loaded, *cmd).await,
        Command::Agent { message, session } => chat::agent(&loaded, message, session).await,
        Command::Heartbeat { dry_run } => heartbeat::heartbeat(&loaded, dry_run).await,
        Command::Status => status::status(&loaded),
        Command::Check { .. } | Command::Init { .. } | Command::Logs { .. } => unreachable!("handled above"),
    }
}

/// A time in the configured zone, or `-`.
fn when(t: Option<jiff::Timestamp>, tz: &config::TzName) -> String {
    crate::scheduler::schedule::local_time(t, tz.tz())
}
