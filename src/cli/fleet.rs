//! `bramble fleet status|acl`, and the fleet's side of `cron add --on` and
//! `cron list --fleet` (docs/fleet.md): short MQTT sessions of the command
//! line's own (`crate::fleet::remote`), never through the daemon.

use std::process::ExitCode;

use super::args::{AddArgs, FleetCommand};
use crate::config::Loaded;

#[cfg(not(feature = "fleet"))]
const NOT_BUILT: &str = "this bramble was built without the `fleet` feature";

/// `bramble fleet …`.
pub(super) async fn fleet(loaded: &Loaded, cmd: FleetCommand) -> anyhow::Result<ExitCode> {
    #[cfg(not(feature = "fleet"))]
    {
        let _ = (loaded, cmd);
        anyhow::bail!(NOT_BUILT)
    }
    #[cfg(feature = "fleet")]
    match cmd {
        FleetCommand::Acl => {
            let c = &loaded.config.fleet;
            let primaries: Vec<_> = match (c.role, c.board(), c.primary.as_ref()) {
                (crate::config::fleet::FleetRole::Primary, Some(me), _) => vec![me.clone()],
                (_, _, Some(p)) => vec![p.clone()],
                _ => Vec::new(),
            };
            print!("{}", crate::fleet::topics::mosquitto_acl(&primaries));
            Ok(ExitCode::SUCCESS)
        }
        FleetCommand::Status => {
            let (me, boards) = crate::fleet::remote::snapshot(&loaded.config).await?;
            print!("{}", boards.render(&me, jiff::Timestamp::now().as_second()));
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `bramble cron add … --on <board>`: the job, checked here as `cron add`
/// checks it, stored and scheduled on that board.
pub(super) async fn add_on(loaded: &Loaded, add: AddArgs, on: &str) -> anyhow::Result<ExitCode> {
    #[cfg(not(feature = "fleet"))]
    {
        let _ = (loaded, add, on);
        anyhow::bail!(NOT_BUILT)
    }
    #[cfg(feature = "fleet")]
    {
        use crate::config::fleet::{BoardName, BoardNameError};
        use crate::scheduler::Placement;
        let board = match on.parse::<BoardName>() {
            Ok(b) => b,
            Err(BoardNameError::Any) if loaded.config.fleet.nats_url.is_none() => {
                anyhow::bail!(crate::fleet::FleetError::AnyWithoutNats)
            }
            Err(BoardNameError::Any) => return add_any(loaded, add).await,
            Err(e) => anyhow::bail!("--on: {e}"),
        };
        let now = jiff::Timestamp::now();
        let mut job =
            super::cron::new_job(loaded, super::args::CronCommand::Add(add), crate::bus::Principal::Owner, now)?;
        job.placement = Placement::Board(board.clone());
        let body = serde_json::to_string(&job)?;
        let reply = crate::fleet::remote::command(&loaded.config, &board, crate::fleet::wire::CRON_ADD, body).await?;
        if !reply.ok {
            anyhow::bail!("{board} refused the job: {}", reply.text);
        }
        println!("{}", reply.text);
        Ok(ExitCode::SUCCESS)
    }
}

/// `bramble cron remove <job> --on <board>`: removed on that board, by a
/// signed `cron.remove` (the board answers what it removed, or why not).
pub(super) async fn remove_on(loaded: &Loaded, id: &str, on: &str) -> anyhow::Result<ExitCode> {
    #[cfg(not(feature = "fleet"))]
    {
        let _ = (loaded, id, on);
        anyhow::bail!(NOT_BUILT)
    }
    #[cfg(feature = "fleet")]
    {
        use crate::config::fleet::{BoardName, BoardNameError};
        let board = match on.parse::<BoardName>() {
            Ok(b) => b,
            Err(BoardNameError::Any) => anyhow::bail!(
                "--on any: a job for any board is on every board that took it; remove it with `cron remove {id} --on <board>` for each (`cron list --fleet` shows them)"
            ),
            Err(e) => anyhow::bail!("--on: {e}"),
        };
        let body = serde_json::to_string(&crate::fleet::wire::Remove { id: id.to_string() })?;
        let reply =
            crate::fleet::remote::command(&loaded.config, &board, crate::fleet::wire::CRON_REMOVE, body).await?;
        if !reply.ok {
            anyhow::bail!("{board} did not remove it: {}", reply.text);
        }
        println!("{}", reply.text);
        Ok(ExitCode::SUCCESS)
    }
}

/// `bramble cron add … --on any`: the job, checked here, stored on this board
/// and sent to every other board that can claim slots in NATS (online, with
/// `nats` and, for a command, `exec` in its presence); each board plans it and
/// the one that wins a slot's key in NATS runs it.
#[cfg(feature = "fleet")]
async fn add_any(loaded: &Loaded, add: AddArgs) -> anyhow::Result<ExitCode> {
    use crate::fleet::once::CAPABILITY;
    use crate::scheduler::{JobKind, Placement, Schedule};
    let c = &loaded.config;
    if c.fleet.role != crate::config::fleet::FleetRole::Primary {
        anyhow::bail!("only the primary sends jobs to the boards: run `cron add --on any` on it");
    }
    c.fleet.check(&c.mqtt)?;
    let now = jiff::Timestamp::now();
    let mut job = super::cron::new_job(loaded, super::args::CronCommand::Add(add), crate::bus::Principal::Owner, now)?;
    job.placement = Placement::Any;
    // The slots must be the same instants on every board, whatever its zone.
    if let Schedule::Cron { tz: tz @ None, .. } = &mut job.schedule {
        *tz = c.timezone().tz().iana_name().map(str::to_string);
    }
    let (me, boards) = crate::fleet::remote::snapshot(c).await?;
    let store = crate::scheduler::JobStore::open(&loaded.paths.state_dir);
    store.prune_done(now - super::cron_view::KEEP_DONE)?;
    let job = store.add(job)?;
    let mut on = vec![me.to_string()];
    let mut not = Vec::new();
    let body = serde_json::to_string(&job)?;
    let needs_exec = matches!(job.kind, JobKind::Exec { .. });
    for (name, seen) in boards.0.iter().filter(|(b, _)| **b != me) {
        let caps = seen.presence.as_ref().map(|p| p.capabilities.clone()).unwrap_or_default();
        let why = if !seen.online {
            Some("offline")
        } else if !caps.iter().any(|c| c == CAPABILITY) {
            Some("no [fleet] nats_url")
        } else if needs_exec && !caps.iter().any(|c| c == "exec") {
            Some("no [exec]")
        } else {
            None
        };
        if let Some(why) = why {
            not.push(format!("{name} ({why})"));
            continue;
        }
        match crate::fleet::remote::command(c, name, crate::fleet::wire::CRON_ADD, body.clone()).await {
            Ok(reply) if reply.ok => on.push(name.to_string()),
            Ok(reply) => not.push(format!("{name} (refused: {})", reply.text)),
            Err(e) => not.push(format!("{name} ({e})")),
        }
    }
    println!("added job {} ({}) for any board: on {}", job.name, job.id, on.join(", "));
    if !not.is_empty() {
        println!("  not on {}", not.join("; "));
    }
    Ok(ExitCode::SUCCESS)
}

/// `bramble cron list --fleet`: every board's jobs from its presence.
pub(super) async fn list_fleet(loaded: &Loaded) -> anyhow::Result<ExitCode> {
    #[cfg(not(feature = "fleet"))]
    {
        let _ = loaded;
        anyhow::bail!(NOT_BUILT)
    }
    #[cfg(feature = "fleet")]
    {
        let (_, boards) = crate::fleet::remote::snapshot(&loaded.config).await?;
        let mut any = false;
        for (name, seen) in &boards.0 {
            let state = if seen.online { "online" } else { "offline" };
            let Some(p) = &seen.presence else { continue };
            for j in &p.jobs {
                any = true;
                let next = j.next_run.as_deref().unwrap_or("-");
                let off = if j.enabled { "" } else { " (disabled)" };
                println!("{name} ({state})  {}  {}  next {next}{off}", j.name, j.schedule);
            }
        }
        if !any {
            println!("no jobs on any board");
        }
        Ok(ExitCode::SUCCESS)
    }
}
