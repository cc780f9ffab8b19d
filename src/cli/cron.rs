//! `bramble cron add | list | show | remove | run | enable | disable`.
//!
//! Edits go straight to the job store (a running daemon sees the file change
//! at once); `cron run` runs the job in this process and queues its report.

use std::process::ExitCode;

use crate::bus::Target;
use crate::config::Loaded;
use crate::daemon::assemble;

use super::{when, CronCommand};

pub(super) async fn cron(loaded: &Loaded, cmd: CronCommand) -> anyhow::Result<ExitCode> {
    use crate::scheduler::{self as sched, CatchUp, Job, JobKind, JobStore, Schedule};
    let store = JobStore::open(&loaded.paths.state_dir);
    let tz = loaded.config.timezone();
    let now = jiff::Timestamp::now();
    match cmd {
        CronCommand::Add {
            name,
            every,
            cron,
            tz: job_tz,
            at,
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
        } => {
            let schedule = if let Some(every) = every {
                Schedule::Every { every: sched::parse_every(&every)?, anchor: now }
            } else if let Some(expr) = cron {
                sched::parse_cron(&expr, job_tz.as_deref())?
            } else if let Some(at) = at {
                Schedule::At { at: sched::parse_at(&at, tz.tz())? }
            } else {
                unreachable!("clap requires one schedule")
            };
            // Checked here: clap's `requires` does not hold against the `action` group.
            if message.is_none() && (model.is_some() || watch.is_some()) {
                anyhow::bail!("--model and --watch are for --message jobs (a reminder or a command calls no model)");
            }
            let kind = match (message, remind, exec) {
                (Some(text), _, _) => JobKind::Message { text },
                (_, Some(text), _) => JobKind::Remind { text },
                (_, _, Some(command)) => JobKind::Exec { command },
                _ => unreachable!("clap requires one action"),
            };
            let deliver = deliver
                .iter()
                .map(|t| t.parse::<Target>().map_err(anyhow::Error::msg))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let mut job = Job::new(&name, schedule, kind, deliver, now, tz.tz())?;
            if let Some(policy) = catch_up {
                job.catch_up = policy.parse::<CatchUp>().map_err(anyhow::Error::msg)?;
            }
            job.ha_button = ha_button;
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
                let u = sched::parse_at(&u, tz.tz())?;
                anyhow::ensure!(u > now, "--until {u} is already past");
                job.until = Some(u);
            }
            let job = store.add(job)?;
            if job.ha_button && !(loaded.config.mqtt.url.is_some() && loaded.config.mqtt.discovery) {
                eprintln!("warning: --ha-button needs [mqtt] with discovery = true; the button appears once it is set");
            }
            println!("added job {} ({})", job.name, job.id);
            for t in &job.deliver {
                let configured = match t {
                    Target::Telegram(_) => loaded.config.telegram.token().is_some(),
                    Target::Mqtt(_) => loaded.config.mqtt.url.is_some(),
                    Target::HomeAssistant(_) => loaded.config.homeassistant.url.is_some(),
                    Target::Log | Target::Cli => true,
                };
                if !configured {
                    eprintln!(
                        "warning: {} is not configured: reports for {t} wait in the outbox until it is",
                        t.channel()
                    );
                }
            }
            println!("  schedule: {}", job.schedule.describe(tz.tz()));
            println!("  next run: {}", when(job.state.next_run, &tz));
            if !matches!(job.schedule, Schedule::Every { .. }) {
                let jobs = store.list().unwrap_or_default();
                let wait = loaded.config.daemon.clock_sync_wait.get();
                if let Some(note) = crate::scheduler::engine::clock_hold_note(&jobs, wait, tz.tz()) {
                    eprintln!("note: {note}");
                }
            }
            if let Some(m) = &job.model {
                println!("  model:    {}", crate::provider::chain::Chain::label_in(&loaded.config, m));
            }
            if let Some(w) = &job.watch {
                println!("  watch:    {} (the turn runs when: {})", w.command, w.mode.as_str());
            }
            for line in limits(&job, &tz) {
                println!("  {line}");
            }
        }
        CronCommand::List => {
            use std::io::Write as _;
            let jobs = store.list()?;
            // One buffered writer: thousands of jobs are thousands of lines.
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            let corrupt = store.corrupt_notice();
            if let Some(notice) = &corrupt {
                writeln!(out, "job store: {notice}")?;
            }
            if jobs.is_empty() && corrupt.is_none() {
                writeln!(out, "no jobs. Add one: bramble cron add NAME --every 1h --remind \"stretch\"")?;
            }
            for j in jobs {
                let state = if j.state.done {
                    "done".to_string()
                } else if !j.enabled {
                    "disabled".to_string()
                } else {
                    format!("next {}", when(j.state.next_run, &tz))
                };
                let last = j.state.last_status.map(|s| format!(", last {s}")).unwrap_or_default();
                writeln!(
                    out,
                    "{:<8}  {:<20}  {:<7}  {:<34}  {state}{last}",
                    j.id,
                    j.name,
                    kind_name_of(&j),
                    j.schedule.summary(tz.tz())
                )?;
            }
            out.flush()?;
        }
        CronCommand::Show { id } => {
            let j = store.get(&id)?;
            println!("{} ({})", j.name, j.id);
            println!("  kind:      {}", kind_name_of(&j));
            match &j.kind {
                JobKind::Message { text } | JobKind::Remind { text } => println!("  text:      {text}"),
                JobKind::Exec { command } => println!("  command:   {command}"),
            }
            println!("  schedule:  {}", j.schedule.describe(tz.tz()));
            println!("  catch-up:  {}", j.catch_up);
            if let Some(m) = &j.model {
                println!("  model:     {}", crate::provider::chain::Chain::label_in(&loaded.config, m));
            }
            if let Some(w) = &j.watch {
                println!("  watch:     {} (the turn runs when: {})", w.command, w.mode.as_str());
                if let Some(seen) = &j.state.watch {
                    let first = seen.output.lines().next().unwrap_or("");
                    println!("  last seen: {}", crate::scheduler::job::truncate(first, 80));
                }
            }
            for line in limits(&j, &tz) {
                println!("  {}", line.replacen(": ", ":  ", 1));
            }
            if j.ha_button {
                println!("  HA button: yes (`{}`)", crate::channels::mqtt::discovery::button_object(&j.name));
            }
            let targets: Vec<String> = j.report_target_names();
            println!("  deliver:   {}", targets.join(", "));
            if !j.attach.is_empty() {
                println!("  attach:    {}", j.attach.join(", "));
            }
            println!("  enabled:   {}{}", j.enabled, if j.state.done { " (done)" } else { "" });
            println!("  next run:  {}", when(j.state.next_run, &tz));
            if let Some(e) = &j.state.last_error {
                println!("  last error: {e}");
            }
            for r in &j.state.history {
                let by = r.model.as_deref().map(|m| format!("  [{m}]")).unwrap_or_default();
                // One line per run: a report's lines joined.
                let summary = r.summary.split_whitespace().collect::<Vec<_>>().join(" ");
                println!("  {}  {:<7}  {summary}{by}", when(Some(r.started), &tz), r.status.to_string());
            }
        }
        CronCommand::Remove { id } => {
            let j = store.remove(&id)?;
            println!("removed job {} ({})", j.name, j.id);
        }
        CronCommand::Enable { id } => {
            let j = store.set_enabled(&id, true)?;
            println!("enabled job {} ({})", j.name, j.id);
        }
        CronCommand::Disable { id } => {
            let j = store.set_enabled(&id, false)?;
            println!("disabled job {} ({})", j.name, j.id);
        }
        CronCommand::Run { id } => return cron_run(loaded, &store, &id).await,
    }
    Ok(ExitCode::SUCCESS)
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
        runner: crate::work::Runner::new(run.agent.clone(), loaded.config.exec.clone(), loaded.paths.workspace.clone()),
        reports: run.reports(),
        abort: abort.clone(),
        alerts: crate::work::alerts::Alerts::new(&loaded.paths.state_dir, &loaded.config.alerts, run.reports()),
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
            println!("{}", outcome.summary);
            Ok(ExitCode::SUCCESS)
        }
        RunStatus::Ok => {
            println!("{}\n\n(report queued for {}; the daemon delivers it)", outcome.summary, targets.join(", "));
            Ok(ExitCode::SUCCESS)
        }
        _ => {
            eprintln!("bramble: job {} failed: {}", job.name, outcome.error.unwrap_or(outcome.summary));
            Ok(ExitCode::FAILURE)
        }
    }
}

/// `jitter`, `max runs` and `until` lines of a job, when set.
fn limits(j: &crate::scheduler::Job, tz: &crate::config::TzName) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(w) = j.jitter {
        out.push(format!("jitter:   up to {w} (this job starts {} late)", crate::config::Dur(j.jitter_offset())));
    }
    if let Some(m) = j.max_runs {
        out.push(format!("runs:     {} of {m}", j.state.runs));
    }
    if let Some(u) = j.until {
        out.push(format!("until:    {}", when(Some(u), tz)));
    }
    out
}

fn kind_name_of(j: &crate::scheduler::Job) -> &'static str {
    if j.watch.is_some() {
        "watch"
    } else {
        kind_name(&j.kind)
    }
}

fn kind_name(k: &crate::scheduler::JobKind) -> &'static str {
    match k {
        crate::scheduler::JobKind::Message { .. } => "message",
        crate::scheduler::JobKind::Remind { .. } => "remind",
        crate::scheduler::JobKind::Exec { .. } => "exec",
    }
}
