//! `bramble cron add | list | show | remove | run | enable | disable`.
//!
//! Edits go straight to the job store (a running daemon sees the file change
//! at once); `cron run` runs the job in this process and queues its report.
//!
//! The same code answers the daemon's control socket ([`serve`]: a member of
//! the installed service's group, plain `bramble cron …`): the arguments are
//! parsed with the same clap definitions ([`argv`] makes them from what the
//! member's CLI parsed), `[service] members` is applied, and [`edit`] writes
//! to the reply instead of the terminal. There `run` is the scheduler's
//! (`run_now`): the job runs in the daemon, as the service.

use std::io::Write;
use std::process::ExitCode;

use crate::bus::Target;
use crate::config::Loaded;
use crate::daemon::{assemble, control};

use super::cron_view::{esc, in_zone, kind_name_of, limits, list, show};
use super::{when, AddArgs, CronCommand};

pub(super) async fn cron(loaded: &Loaded, cmd: CronCommand) -> anyhow::Result<ExitCode> {
    if let CronCommand::Run { id } = &cmd {
        let store = crate::scheduler::JobStore::open(&loaded.paths.state_dir);
        return cron_run(loaded, &store, id).await;
    }
    // The fleet: `--on <board>` and `--fleet` ask the boards over the broker.
    match cmd {
        CronCommand::Add(add) if add.on.is_some() => {
            let on = add.on.clone().unwrap_or_default();
            return super::fleet::add_on(loaded, add, &on).await;
        }
        CronCommand::List { fleet: true, .. } => return super::fleet::list_fleet(loaded).await,
        CronCommand::Remove { id, on: Some(on) } => return super::fleet::remove_on(loaded, &id, &on).await,
        _ => {}
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    // At this terminal: root, the service's user or the owner's own account.
    edit(loaded, cmd, crate::bus::Principal::Owner, &mut out, &mut std::io::stderr())?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// Every `cron` command but `run`, writing what it says to `out` and its
/// warnings to `err`: this terminal's, or a control socket client's. A job
/// added is `creator`'s: it runs with their rights as they are when it runs.
pub(super) fn edit(
    loaded: &Loaded,
    cmd: CronCommand,
    creator: crate::bus::Principal,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<()> {
    let store = crate::scheduler::JobStore::open(&loaded.paths.state_dir);
    let now = jiff::Timestamp::now();
    match cmd {
        CronCommand::Add(AddArgs { on: Some(_), .. }) | CronCommand::List { fleet: true, .. } => {
            anyhow::bail!(
                "--on and --fleet are the owner's (they sign with the fleet key): run them as the service's owner"
            )
        }
        CronCommand::Add(add) => {
            // A done job past its keeping frees its name.
            store.prune_done(now - super::cron_view::KEEP_DONE)?;
            // `--at … --tz ZONE`: said back in that zone (a cron job keeps its own).
            let zone = add.tz.as_deref().and_then(|z| crate::scheduler::parse_tz(z).ok());
            let job = store.add(new_job(loaded, CronCommand::Add(add), creator, now)?)?;
            added(loaded, &store, &job, zone, out, err)?;
        }
        CronCommand::Next { expr, tz: job_tz, from, count } => {
            next(&expr, job_tz.as_deref(), from.as_deref(), count, &loaded.config.timezone(), now, out)?;
        }
        CronCommand::List { all, json, .. } => list(loaded, &store, all, json, now, out)?,
        CronCommand::Show { id, json } => show(loaded, &store.get(&id)?, json, out)?,
        CronCommand::Remove { id, .. } => {
            let j = store.remove(&id)?;
            writeln!(out, "removed job {} ({})", j.name, j.id)?;
            set_aside_reports(loaded, &j, now, out)?;
        }
        CronCommand::Enable { id } => {
            let j = store.set_enabled(&id, true)?;
            writeln!(out, "enabled job {} ({})", j.name, j.id)?;
        }
        CronCommand::Disable { id } => {
            let j = store.set_enabled(&id, false)?;
            writeln!(out, "disabled job {} ({})", j.name, j.id)?;
        }
        CronCommand::Run { .. } => anyhow::bail!("`cron run` runs a job in the process that asks (see `cron`)"),
    }
    Ok(())
}

/// After `cron remove`: the removed job's reports that failed and wait for
/// another try are set aside (recorded as dropped): nothing will ask for
/// them again, and a report that cannot be delivered would be retried
/// forever. One not tried yet still goes out (the job's last report).
fn set_aside_reports(
    loaded: &Loaded,
    job: &crate::scheduler::Job,
    now: jiff::Timestamp,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let outbox = crate::delivery::outbox::Outbox::new(&loaded.paths.state_dir);
    let source = crate::bus::ReportSource::Job(job.name.to_string());
    let reason = format!("its job {} was removed", job.name);
    let of_job = |e: &crate::delivery::outbox::Entry| {
        (e.job.as_ref().is_some_and(|r| r.id == job.id) || e.source == source) && (e.attempts > 0 || e.refusals > 0)
    };
    let dropped = outbox.drop_where(of_job, &reason, now)?;
    if !dropped.is_empty() {
        let n = dropped.len();
        writeln!(
            out,
            "  set aside {n} report{} of it that could not be delivered ({})",
            if n == 1 { "" } else { "s" },
            dropped.iter().map(|e| format!("{} to {}", e.id, e.target)).collect::<Vec<_>>().join(", ")
        )?;
    }
    Ok(())
}

/// The job `cron add` describes, `creator`'s, checked but not stored.
pub(super) fn new_job(
    loaded: &Loaded,
    cmd: CronCommand,
    creator: crate::bus::Principal,
    now: jiff::Timestamp,
) -> anyhow::Result<crate::scheduler::Job> {
    use crate::scheduler::{self as sched, CatchUp, Job, JobKind};
    let CronCommand::Add(add) = cmd else {
        anyhow::bail!("not a `cron add`");
    };
    let AddArgs {
        name,
        message,
        remind,
        exec,
        deliver,
        catch_up,
        ha_button,
        attach,
        model,
        watch,
        watch_mode,
        jitter,
        max_runs,
        until,
        ..
    } = add.clone();
    let tz = loaded.config.timezone();
    let schedule = schedule_of(&add, &tz, now)?;
    // Checked here: clap's `requires` does not hold against the `action` group.
    if message.is_none() && (model.is_some() || watch.is_some()) {
        anyhow::bail!("--model and --watch are for --message jobs (a reminder or a command calls no model)");
    }
    let kind = match (message, remind, exec) {
        (Some(text), _, _) => JobKind::Message { text },
        (_, Some(text), _) => JobKind::Remind { text },
        (_, _, Some(command)) => JobKind::Exec { command },
        _ => anyhow::bail!("one of --message, --remind or --exec is needed"),
    };
    let deliver =
        deliver.iter().map(|t| t.parse::<Target>().map_err(anyhow::Error::msg)).collect::<anyhow::Result<Vec<_>>>()?;
    crate::channels::mqtt::refuse_targets(&loaded.config.mqtt, &deliver).map_err(anyhow::Error::msg)?;
    let mut job = Job::new(&name, schedule, kind, deliver, now, tz.tz())?;
    if let Some(policy) = catch_up {
        job.catch_up = policy.parse::<CatchUp>().map_err(anyhow::Error::msg)?;
    }
    job.ha_button = ha_button;
    job.creator = Some(creator);
    sched::job::check_attach(&attach).map_err(|e| anyhow::anyhow!("--attach {e}"))?;
    job.attach = attach;
    job.model = model.map(|m| m.trim().to_string()).filter(|m| !m.is_empty());
    if let Some(command) = watch {
        anyhow::ensure!(!command.trim().is_empty(), "--watch needs a command");
        let mode = watch_mode.parse::<sched::WatchMode>().map_err(anyhow::Error::msg)?;
        job.watch = Some(sched::Watch { command, mode });
    }
    if let Some(j) = jitter {
        job.jitter = Some(j.parse::<crate::config::Dur>().map_err(|e| anyhow::anyhow!("--jitter: {e}"))?);
    }
    anyhow::ensure!(max_runs != Some(0), "--max-runs must be at least 1");
    job.max_runs = max_runs;
    if let Some(u) = until {
        let u = sched::schedule::parse_when(&u, tz.tz(), now).map_err(|e| anyhow::anyhow!("--until: {e}"))?;
        anyhow::ensure!(u > now, "--until {u} is already past");
        job.until = Some(u);
    }
    Ok(job)
}

/// The schedule of `cron add`'s `--every`, `--cron`, `--at` or `--in` (clap
/// asks for one); `--tz` is the zone `--cron` and `--at` are read in.
fn schedule_of(
    add: &AddArgs,
    tz: &crate::config::TzName,
    now: jiff::Timestamp,
) -> anyhow::Result<crate::scheduler::Schedule> {
    use crate::scheduler::{self as sched, Schedule};
    let zone = match &add.tz {
        Some(name) => sched::parse_tz(name)?,
        None => tz.tz().clone(),
    };
    if add.tz.is_some() && (add.every.is_some() || add.in_.is_some()) {
        let which = if add.every.is_some() { "--every" } else { "--in" };
        anyhow::bail!(
            "--tz is for --cron and --at (the zone their clock times are read in); {which} counts time from now, \
             the same in every zone: leave --tz out"
        );
    }
    Ok(if let Some(every) = &add.every {
        Schedule::Every { every: sched::parse_every(every)?, anchor: now }
    } else if let Some(expr) = &add.cron {
        sched::parse_cron(expr, add.tz.as_deref())?
    } else if let Some(at) = &add.at {
        // The zone it was given in is where its time is shown (list, show).
        let tz = add.tz.as_ref().map(|_| zone.iana_name().unwrap_or_default().to_string()).filter(|n| !n.is_empty());
        Schedule::At { at: sched::schedule::parse_when(at, &zone, now)?, tz }
    } else if let Some(after) = &add.in_ {
        Schedule::at(sched::schedule::parse_when(&format!("+{}", after.trim()), &zone, now)?)
    } else {
        anyhow::bail!("one of --every, --cron, --at or --in is needed")
    })
}

/// What `cron add` says of the job it stored, and its warnings: a part it
/// needs that is not configured, a clock that holds it.
fn added(
    loaded: &Loaded,
    store: &crate::scheduler::JobStore,
    job: &crate::scheduler::Job,
    zone: Option<jiff::tz::TimeZone>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<()> {
    let tz = loaded.config.timezone();
    if job.ha_button && !(loaded.config.mqtt.url.is_some() && loaded.config.mqtt.discovery) {
        writeln!(err, "warning: --ha-button needs [mqtt] with discovery = true; the button appears once it is set")?;
    }
    writeln!(out, "added job {} ({})", job.name, job.id)?;
    for t in &job.deliver {
        let configured = match t {
            Target::Telegram(_) => loaded.config.telegram.token().is_some(),
            Target::Email(_) => cfg!(feature = "email") && loaded.config.email.smtp.is_some(),
            Target::Matrix(_) => cfg!(feature = "matrix") && loaded.config.matrix.homeserver.is_some(),
            Target::Signal(_) => cfg!(feature = "signal") && loaded.config.signal.endpoint.is_some(),
            Target::Feishu(_) => cfg!(feature = "feishu") && loaded.config.feishu.app_id.is_some(),
            Target::Discord(_) => cfg!(feature = "discord") && loaded.config.discord.configured(),
            Target::Mqtt(_) => loaded.config.mqtt.url.is_some(),
            Target::HomeAssistant(_) => loaded.config.homeassistant.url.is_some(),
            Target::Webhook(name) => loaded.config.has_webhook_target(name),
            Target::Ntfy(topic) => cfg!(feature = "ntfy") && loaded.config.ntfy.publishes_to(topic),
            Target::Log | Target::Cli => true,
        };
        if !configured {
            writeln!(
                err,
                "warning: {} is not configured: reports for {t} wait in the outbox until it is",
                t.channel()
            )?;
        }
    }
    writeln!(out, "  schedule: {}", job.schedule.describe(tz.tz()))?;
    let next = match zone {
        Some(zone) if job.schedule.is_one_shot() => crate::scheduler::schedule::local_time(job.state.next_run, &zone),
        _ => in_zone(job.state.next_run, &job.schedule, &tz),
    };
    writeln!(out, "  next run: {next}")?;
    if !matches!(job.schedule, crate::scheduler::Schedule::Every { .. }) {
        let jobs = store.list().unwrap_or_default();
        let wait = loaded.config.daemon.clock_sync_wait.get();
        if let Some(note) = crate::scheduler::engine::clock_hold_note(&jobs, wait, tz.tz()) {
            writeln!(err, "note: {note}")?;
        }
    }
    if let Some(m) = &job.model {
        writeln!(out, "  model:    {}", crate::provider::chain::Chain::label_in(&loaded.config, m))?;
    }
    if let Some(w) = &job.watch {
        writeln!(out, "  watch:    {} (the turn runs when: {})", w.command, w.mode.as_str())?;
    }
    for line in limits(job, &tz) {
        writeln!(out, "  {line}")?;
    }
    Ok(())
}

/// `bramble cron …` as the control socket receives it: the arguments after `cron`.
#[derive(Debug, clap::Parser)]
#[command(name = "bramble cron", disable_help_subcommand = true, max_term_width = 100)]
struct Remote {
    #[command(subcommand)]
    cmd: CronCommand,
}

/// The arguments after `bramble cron` that make `cmd` again (what a member's
/// CLI sends; the daemon parses them with the same definitions). Every value
/// as `--flag=value` and the positional after `--`, so no text is taken for a flag.
pub(super) fn argv(cmd: &CronCommand) -> Vec<String> {
    fn opt(a: &mut Vec<String>, flag: &str, v: &Option<String>) {
        if let Some(v) = v {
            a.push(format!("--{flag}={v}"));
        }
    }
    let mut a: Vec<String> = Vec::new();
    let id = match cmd {
        CronCommand::Add(add) => {
            a.push("add".into());
            for (flag, v) in [
                ("every", &add.every),
                ("cron", &add.cron),
                ("tz", &add.tz),
                ("at", &add.at),
                ("in", &add.in_),
                ("message", &add.message),
                ("remind", &add.remind),
                ("exec", &add.exec),
                ("catch-up", &add.catch_up),
                ("model", &add.model),
                ("watch", &add.watch),
                ("jitter", &add.jitter),
                ("until", &add.until),
                ("on", &add.on),
            ] {
                opt(&mut a, flag, v);
            }
            a.extend(add.deliver.iter().map(|d| format!("--deliver={d}")));
            a.extend(add.attach.iter().map(|f| format!("--attach={f}")));
            if add.ha_button {
                a.push("--ha-button".into());
            }
            if add.watch.is_some() {
                a.push(format!("--watch-mode={}", add.watch_mode));
            }
            opt(&mut a, "max-runs", &add.max_runs.map(|n| n.to_string()));
            &add.name
        }
        CronCommand::List { all, json, fleet } => {
            let mut a = vec!["list".to_string()];
            a.extend(all.then(|| "--all".to_string()));
            a.extend(fleet.then(|| "--fleet".to_string()));
            a.extend(json.then(|| "--json".to_string()));
            return a;
        }
        CronCommand::Next { expr, tz, from, count } => {
            a.push("next".into());
            opt(&mut a, "tz", tz);
            opt(&mut a, "from", from);
            a.push(format!("--count={count}"));
            expr
        }
        CronCommand::Show { id, json } => {
            a.push("show".into());
            if *json {
                a.push("--json".into());
            }
            id
        }
        CronCommand::Remove { id, .. } => {
            a.push("remove".into());
            id
        }
        CronCommand::Run { id } => {
            a.push("run".into());
            id
        }
        CronCommand::Enable { id } => {
            a.push("enable".into());
            id
        }
        CronCommand::Disable { id } => {
            a.push("disable".into());
            id
        }
    };
    a.push("--".into());
    a.push(id.clone());
    a
}

/// `cron next`: when `expr` fires after `from` (default now), in `zone` (default the
/// configured one), computed by the scheduler's own code, with the English reading.
fn next(
    expr: &str,
    zone: Option<&str>,
    from: Option<&str>,
    count: u32,
    default_tz: &crate::config::TzName,
    now: jiff::Timestamp,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    use crate::scheduler::{self as sched, Schedule};
    let schedule = sched::parse_cron(expr, zone)?;
    let tz = match zone {
        Some(name) => sched::parse_tz(name)?,
        None => default_tz.tz().clone(),
    };
    let mut t = match from {
        Some(f) => sched::parse_at(f, &tz).map_err(|e| anyhow::anyhow!("--from: {e}"))?,
        None => now,
    };
    writeln!(out, "{}", schedule.describe(&tz))?;
    if let Schedule::Cron { expr, .. } = &schedule {
        let fixed = crate::scheduler::cron::CronExpr::parse(expr).map(|c| c.is_fixed_time()).unwrap_or(false);
        writeln!(
            out,
            "{}",
            match fixed {
                true => "fixed-time: a run in an hour the clocks skip happens when they have changed; a repeated hour runs once",
                false => "wildcard (minute or hour starts with `*`, or seconds given): runs at the local times that exist",
            }
        )?;
    }
    for _ in 0..count {
        let Some(next) = schedule.next_after(t, &tz) else {
            writeln!(out, "  (no more runs in the next 50 years)")?;
            break;
        };
        let local = next.to_zoned(tz.clone());
        writeln!(
            out,
            "  {}  {}",
            local.strftime("%a %Y-%m-%d %H:%M:%S %Z (%:z)"),
            next.strftime("%Y-%m-%dT%H:%M:%SZ")
        )?;
        t = next;
    }
    Ok(())
}

/// The control socket's handler (`bramble run` hands it to the daemon): the
/// request parsed with the CLI's own definitions, `[service] members`
/// applied to a member, then the same code as `bramble cron …` in a terminal
/// — except `run`, which the daemon's scheduler starts (its report goes
/// where the job's go). A change makes the scheduler read the jobs at once.
pub(super) fn serve(call: control::Call) -> control::Answer {
    use clap::Parser as _;
    let remote = match Remote::try_parse_from(std::iter::once("bramble cron".to_string()).chain(call.argv)) {
        Ok(r) => r,
        Err(e) => {
            let text = e.render().to_string();
            let mut reply = control::Reply { code: e.exit_code(), ..control::Reply::default() };
            if e.use_stderr() {
                reply.err = text;
            } else {
                reply.out = text;
            }
            return control::Answer { reply, audit: None };
        }
    };
    let cmd = remote.cmd;
    let audit = change(&cmd);
    let loaded = &call.loaded;
    let store = crate::scheduler::JobStore::open(&loaded.paths.state_dir);
    if call.peer.member {
        if let Err(why) = members_allow(loaded, &cmd, &store) {
            return control::Answer {
                reply: control::Reply::error(why),
                audit: audit.map(|a| format!("{a} (refused)")),
            };
        }
    }
    let result = match cmd {
        CronCommand::Run { id } => run_in_daemon(loaded, &store, &call.scheduler, &id).map(|out| (out, String::new())),
        cmd => {
            let (mut out, mut err) = (Vec::new(), Vec::new());
            // Root and the service's user are the owner; a member is who the kernel says.
            let creator = match call.peer.member {
                true => crate::bus::Principal::Member(call.peer.name.clone()),
                false => crate::bus::Principal::Owner,
            };
            edit(loaded, cmd, creator, &mut out, &mut err)
                .map(|()| (String::from_utf8_lossy(&out).into_owned(), String::from_utf8_lossy(&err).into_owned()))
        }
    };
    let reply = match result {
        Ok((out, err)) => {
            if audit.is_some() {
                call.scheduler.reload();
            }
            control::Reply { out, err, code: 0 }
        }
        Err(e) => {
            let mut err = format!("bramble: error: {e}\n");
            for cause in e.chain().skip(1) {
                err.push_str(&format!("  caused by: {cause}\n"));
            }
            control::Reply { out: String::new(), err, code: 1 }
        }
    };
    control::Answer { reply, audit }
}

/// What a command changes, for the audit trail (`None`: it only reads).
fn change(cmd: &CronCommand) -> Option<String> {
    Some(match cmd {
        CronCommand::Add(AddArgs { name, message, remind, exec, watch, .. }) => {
            let what = match (message, remind, exec) {
                (Some(t), _, _) => format!("message: {t}"),
                (_, Some(t), _) => format!("remind: {t}"),
                (_, _, Some(c)) => format!("exec: {c}"),
                _ => String::new(),
            };
            let watch = watch.as_ref().map(|w| format!(" (watch: {w})")).unwrap_or_default();
            format!("add {name} {what}{watch}")
        }
        CronCommand::Remove { id, .. } => format!("remove {id}"),
        CronCommand::Run { id } => format!("run {id}"),
        CronCommand::Enable { id } => format!("enable {id}"),
        CronCommand::Disable { id } => format!("disable {id}"),
        CronCommand::List { .. } | CronCommand::Show { .. } | CronCommand::Next { .. } => return None,
    })
}

/// Whether `[service] members` lets a member of the service's group do `cmd`.
fn members_allow(loaded: &Loaded, cmd: &CronCommand, store: &crate::scheduler::JobStore) -> Result<(), String> {
    use crate::config::Members;
    use crate::scheduler::JobKind;
    const SUDO: &str = "use sudo (`sudo bramble …` acts as the service's user)";
    match loaded.config.service.members {
        Members::Jobs => Ok(()),
        Members::None => Err(format!(
            "the service does not take job commands from its group's members ([service] members = \"none\"): {SUDO}"
        )),
        Members::Reminders => match cmd {
            CronCommand::List { .. } | CronCommand::Show { .. } | CronCommand::Next { .. } => Ok(()),
            // A reminder with files would send the agent's workspace (memory, USER.md) where the member says.
            CronCommand::Add(AddArgs { remind: Some(_), attach, .. }) if !attach.is_empty() => Err(format!(
                "members of the service's group may not attach workspace files ([service] members = \"reminders\"); {SUDO}"
            )),
            // A delivery target is a capability: a member's reminder may go to chats and report
            // topics, never to a device's command topic or into bramble's own inputs.
            CronCommand::Add(AddArgs { remind: Some(_), deliver, .. }) => {
                let c = &loaded.config;
                let chats = crate::policy::AllowedChats::new(&c.telegram.allow_from, &loaded.paths.state_dir);
                for t in deliver {
                    let target = t.parse::<Target>()?;
                    crate::policy::standing::member_target(&target, &chats, &c.mqtt.publish_allow)
                        .map_err(|why| format!("--deliver {why} ([service] members = \"reminders\"); {SUDO}"))?;
                }
                Ok(())
            }
            CronCommand::Add(_) => Err(format!(
                "members of the service's group may add reminders (--remind) only ([service] members = \"reminders\"): \
                 --message and --exec jobs run as the service, with its key; {SUDO}"
            )),
            CronCommand::Remove { id, .. }
            | CronCommand::Run { id }
            | CronCommand::Enable { id }
            | CronCommand::Disable { id } => {
                let job = store.get(id).map_err(|e| e.to_string())?;
                if matches!(job.kind, JobKind::Remind { .. }) && job.watch.is_none() {
                    return Ok(());
                }
                Err(format!(
                    "job {} is a{} {} job: members of the service's group may change reminders only \
                     ([service] members = \"reminders\"); {SUDO}",
                    job.name,
                    if kind_name_of(&job).starts_with('e') { "n" } else { "" },
                    kind_name_of(&job)
                ))
            }
        },
    }
}

/// `cron run` through the control socket: the daemon's scheduler runs the job
/// now, as the service (outside its schedule); its report goes where the job's go.
fn run_in_daemon(
    loaded: &Loaded,
    store: &crate::scheduler::JobStore,
    scheduler: &crate::scheduler::SchedulerHandle,
    key: &str,
) -> anyhow::Result<String> {
    let job = store.get(key)?;
    if let Some(since) = job.state.running_since {
        anyhow::bail!(
            "job {} is running right now (since {}); try again when it has finished",
            job.name,
            when(Some(since), &loaded.config.timezone())
        );
    }
    anyhow::ensure!(scheduler.run_now(&job.id), "the daemon's scheduler is busy; try again in a moment");
    Ok(format!(
        "started job {} ({}) in the service; its report goes to {} (`bramble cron show {}` has the run)\n",
        job.name,
        job.id,
        job.report_target_names().join(", "),
        job.name
    ))
}

/// Run a job in this process, record the run in the store, queue its report.
async fn cron_run(loaded: &Loaded, store: &crate::scheduler::JobStore, key: &str) -> anyhow::Result<ExitCode> {
    use crate::scheduler::{engine, RunStatus};
    let job = store.get(key)?;
    if let Some(since) = job.state.running_since {
        anyhow::bail!(
            "job {} is running right now (since {}) in the daemon; try again when it has finished",
            job.name,
            when(Some(since), &loaded.config.timezone())
        );
    }
    let run = assemble::queued(loaded);
    let abort = run.cancel.clone();
    let runner = crate::work::jobs::JobRunner {
        runner: crate::work::Runner::new(
            run.agent.clone(),
            loaded.config.exec.clone(),
            loaded.paths.workspace.clone(),
            run.sandbox.clone(),
        ),
        reports: run.reports(),
        abort: abort.clone(),
        alerts: crate::work::alerts::Alerts::new(&loaded.paths.state_dir, &loaded.config.alerts, run.reports()),
        standing: assemble::standing(loaded),
    };
    let started = jiff::Timestamp::now();
    let ctrl_c = abort.clone();
    let stop = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            ctrl_c.cancel();
        }
    });
    let outcome = runner.run_job(&job).await;
    stop.abort();
    drop(runner);
    let interrupted = abort.is_cancelled();
    run.finish().await;
    if interrupted {
        // Ctrl-C: nothing recorded, nothing reported; the job keeps its schedule.
        eprintln!("(stopped)");
        return Ok(ExitCode::from(130));
    }
    let tz = loaded.config.timezone();
    store.update(|jobs| {
        if let Some(i) = crate::scheduler::store::find(jobs, &job.id) {
            let summary = crate::scheduler::job::truncate(&outcome.summary, 200);
            let err = outcome.error.as_deref();
            engine::mark_finished(
                &mut jobs[i],
                started,
                started,
                jiff::Timestamp::now(),
                outcome.status,
                &summary,
                err,
                None,
                true,
                tz.tz(),
            );
            jobs[i].state.note_run(outcome.model.as_deref(), outcome.watch.as_ref());
        }
        Ok(())
    })?;
    let targets: Vec<String> = job.report_target_names();
    match outcome.status {
        // A watcher that found nothing new reports nothing.
        RunStatus::Ok
            if job.watch.is_some() && outcome.model.is_none() && outcome.summary.ends_with("(no model call)") =>
        {
            println!("{}", crate::util::text::escape_controls(&outcome.summary));
            Ok(ExitCode::SUCCESS)
        }
        RunStatus::Ok => {
            let summary = crate::util::text::escape_controls(&outcome.summary);
            println!("{summary}\n\n(report queued for {}; the daemon delivers it)", esc(&targets.join(", ")));
            Ok(ExitCode::SUCCESS)
        }
        _ => {
            let why = outcome.error.unwrap_or(outcome.summary);
            eprintln!("bramble: job {} failed: {}", esc(&job.name), crate::util::text::escape_controls(&why));
            Ok(ExitCode::FAILURE)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    fn parsed(args: &[&str]) -> CronCommand {
        let cli = crate::cli::Cli::try_parse_from(["bramble", "cron"].iter().chain(args)).unwrap();
        match cli.command {
            crate::cli::Command::Cron(c) => *c,
            other => panic!("{other:?}"),
        }
    }

    /// What a member's CLI sends is what it parsed, whatever the texts look like.
    #[test]
    fn argv_parses_back_to_the_same_command() {
        for args in [
            &["add", "tea", "--every", "1h", "--remind=--every 2s -- tea", "--deliver", "log"][..],
            &[
                "add",
                "--cron",
                "0 9 * * 1-5",
                "--tz",
                "UTC",
                "--exec=-rf",
                "--catch-up",
                "2h",
                "--jitter",
                "5m",
                "--",
                "-x",
            ],
            &["add", "w", "--at", "2030-01-01 08:00", "--message", "m", "--watch", "df", "--watch-mode", "nonempty"],
            &["add", "n", "--every", "1d", "--message", "m", "--model", "lan/x", "--ha-button", "--attach", "a.png"],
            &["add", "l", "--every", "1d", "--remind", "r", "--max-runs", "3", "--until", "2030-01-01 08:00"],
            &["add", "i", "--in", "2m", "--remind", "r"],
            &["add", "b", "--at", "tomorrow 07:00", "--tz", "Europe/Berlin", "--remind", "r"],
            &["list"],
            &["list", "--all", "--json"],
            &["show", "--json", "--", "--help-me"],
            &["show", "--", "--help-me"],
            &["remove", "--", "-1"],
            &["run", "a"],
            &["enable", "a"],
            &["disable", "a"],
        ] {
            let cmd = parsed(args);
            let sent = argv(&cmd);
            let back = Remote::try_parse_from(std::iter::once("bramble cron".to_string()).chain(sent.clone()))
                .unwrap_or_else(|e| panic!("{args:?} → {sent:?}: {e}"));
            assert_eq!(format!("{:?}", back.cmd), format!("{cmd:?}"), "{args:?} → {sent:?}");
        }
    }

    #[test]
    fn the_socket_takes_cron_subcommands_only() {
        for argv in [&["--config", "/tmp/x", "list"][..], &["agent", "-m", "hi"], &["list", "--config=/tmp/x"]] {
            let e = Remote::try_parse_from(["bramble cron"].iter().chain(argv)).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{argv:?}");
        }
    }

    fn loaded(dir: &std::path::Path) -> Loaded {
        let config = crate::config::Config::parse("[agent]\ntimezone = \"UTC\"\n", "t.toml".as_ref()).unwrap();
        let paths = crate::config::Paths { workspace: dir.join("ws"), state_dir: dir.join("state") };
        Loaded { config, path: None, paths }
    }

    #[test]
    fn new_job_checks_what_clap_cannot() {
        let dir = tempfile::tempdir().unwrap();
        let l = loaded(dir.path());
        let now = jiff::Timestamp::now();
        let new = |args: &[&str]| new_job(&l, parsed(args), crate::bus::Principal::Owner, now);
        let job = new(&["add", "tea", "--every", "1h", "--remind", "tea", "--max-runs", "2"]).unwrap();
        assert_eq!((job.name.as_str(), job.max_runs), ("tea", Some(2)));
        assert_eq!(job.creator, Some(crate::bus::Principal::Owner));
        for (args, says) in [
            (&["add", "t", "--every", "1h", "--remind", "r", "--model", "m"][..], "--model and --watch"),
            (&["add", "t", "--every", "1h", "--remind", "r", "--max-runs", "0"], "--max-runs"),
            (&["add", "t", "--every", "1h", "--remind", "r", "--until", "2001-01-01 08:00"], "already past"),
            (&["add", "t", "--every", "1h", "--message", "m", "--watch", " "], "--watch needs"),
        ] {
            let e = new(args).unwrap_err().to_string();
            assert!(e.contains(says), "{args:?}: {e}");
        }
        assert!(new_job(&l, parsed(&["list"]), crate::bus::Principal::Owner, now).is_err());
    }

    #[test]
    fn show_and_list_write_what_the_store_holds() {
        let dir = tempfile::tempdir().unwrap();
        let l = loaded(dir.path());
        let store = crate::scheduler::JobStore::open(&l.paths.state_dir);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let now = jiff::Timestamp::now();
        list(&l, &store, false, false, now, &mut out).unwrap();
        assert!(String::from_utf8_lossy(&out).starts_with("no jobs."));
        let cmd = parsed(&["add", "tea", "--every", "1h", "--remind", "tea\u{1b}[2J"]);
        let job = store.add(new_job(&l, cmd, crate::bus::Principal::Owner, jiff::Timestamp::now()).unwrap()).unwrap();
        out.clear();
        added(&l, &store, &job, None, &mut out, &mut err).unwrap();
        assert!(String::from_utf8_lossy(&out).starts_with(&format!("added job tea ({})", job.id)));
        out.clear();
        show(&l, &job, false, &mut out).unwrap();
        let shown = String::from_utf8_lossy(&out);
        assert!(shown.contains("  kind:      remind"), "{shown}");
        assert!(!shown.contains('\u{1b}'), "a control character reached the terminal: {shown}");
        out.clear();
        list(&l, &store, false, false, now, &mut out).unwrap();
        assert!(String::from_utf8_lossy(&out).contains("tea"));
    }
}
