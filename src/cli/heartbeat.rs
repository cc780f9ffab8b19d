//! `bramble heartbeat [--dry-run]`: one heartbeat now, its report queued for the daemon.

use std::process::ExitCode;

use crate::bus::Target;
use crate::config::Loaded;
use crate::daemon::assemble;

pub(super) async fn heartbeat(loaded: &Loaded, dry_run: bool) -> anyhow::Result<ExitCode> {
    use crate::work::heartbeat_loop::{Heartbeat, HeartbeatOutcome};
    let c = &loaded.config;
    let run = assemble::queued(loaded);
    let hb = Heartbeat {
        config: c.heartbeat.clone(),
        workspace: loaded.paths.workspace.clone(),
        tz: c.timezone(),
        state: crate::scheduler::heartbeat::StateFile::new(&loaded.paths.state_dir),
        reports: run.reports(),
        pulse: crate::util::pulse::Pulse::new(),
    };
    let outcome = hb.tick(&run.agent, dry_run, &run.cancel).await;
    run.finish().await;
    let targets = |t: &[Target]| t.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
    let hb_file = loaded.paths.workspace.join("HEARTBEAT.md");
    match outcome {
        HeartbeatOutcome::NoTasks => {
            println!("{} lists no active tasks: nothing to do (no model call).", hb_file.display())
        }
        HeartbeatOutcome::Quiet => println!("inside quiet hours: skipped."),
        HeartbeatOutcome::DryRun(prompt) => println!(
            "would run one agent turn in session `heartbeat`, reporting to {}:\n\n{prompt}",
            targets(&c.heartbeat.deliver)
        ),
        HeartbeatOutcome::NothingToReport => println!("HEARTBEAT_OK: nothing to report, nothing delivered."),
        HeartbeatOutcome::Reported { text, targets: t } => {
            println!(
                "{}\n\n(queued for {}; the daemon delivers it)",
                crate::util::text::escape_controls(&text),
                targets(&t)
            )
        }
        HeartbeatOutcome::Cancelled => {
            println!("(stopped)");
            return Ok(ExitCode::from(130));
        }
        HeartbeatOutcome::Failed(why) => {
            eprintln!("bramble: error: {why}");
            return Ok(ExitCode::FAILURE);
        }
    }
    Ok(ExitCode::SUCCESS)
}
