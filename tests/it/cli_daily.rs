//! Issue 37 through the real binary: times as people type them (`--in`,
//! `--at +2m`, `--at 16:30`, `--at tomorrow 07:00`, `--tz` with `--at`),
//! durations that need their unit, cron fields that name their range, a
//! config's errors all at once and in plain words, `cron list` as a table
//! with a header in each job's zone, `--json` for scripts, done one-shots
//! out of the way, and `bramble outbox` for a report that cannot be delivered.

use std::path::{Path, PathBuf};
use std::process::Output;

use jiff::{Timestamp, ToSpan as _};

use crate::support::setup::bramble;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A HOME with a config in `zone`; its state dir.
struct Home {
    dir: tempfile::TempDir,
    config: PathBuf,
    state: PathBuf,
}

impl Home {
    fn new(zone: &str, extra: &str) -> Home {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            format!(
                "[agent]\ntimezone = \"{zone}\"\nworkspace = \"{}\"\n[daemon]\nstate_dir = \"{}\"\n{extra}",
                dir.path().join("ws").display(),
                state.display()
            ),
        )
        .unwrap();
        Home { dir, config, state }
    }

    async fn run(&self, args: &[&str]) -> Output {
        let mut all = vec!["--config", self.config.to_str().unwrap()];
        all.extend_from_slice(args);
        bramble(self.dir.path(), &all, None).await
    }

    /// Run, expect success, return stdout.
    async fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args).await;
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}{}", text(&out.stdout), text(&out.stderr));
        text(&out.stdout)
    }

    /// Run, expect failure, return stderr.
    async fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args).await;
        assert_ne!(out.status.code(), Some(0), "{args:?} should fail: {}", text(&out.stdout));
        text(&out.stderr)
    }

    async fn job_json(&self, name: &str) -> serde_json::Value {
        serde_json::from_str(&self.ok(&["cron", "show", name, "--json"]).await).unwrap()
    }

    fn store(&self) -> bramble::scheduler::JobStore {
        bramble::scheduler::JobStore::open(&self.state)
    }
}

fn next_run(job: &serde_json::Value) -> Timestamp {
    job["next_run"].as_str().expect("a next run").parse().unwrap()
}

#[tokio::test]
async fn tz_is_the_zone_of_at_and_is_refused_with_every() {
    let home = Home::new("UTC", "");
    let added = home
        .ok(&["cron", "add", "dentist", "--at", "2030-12-02 09:00", "--tz", "Europe/Berlin", "--remind", "go"])
        .await;
    assert!(added.contains("next run: 2030-12-02 09:00:00 CET"), "said back in its zone: {added}");
    // 09:00 in Berlin (CET, +01:00), not 09:00 UTC.
    assert_eq!(home.job_json("dentist").await["next_run"], "2030-12-02T08:00:00Z");
    // The zone stays with the job: list and show say it in Berlin's time too.
    let list = home.ok(&["cron", "list"]).await;
    assert!(list.contains("2030-12-02 09:00 CET"), "{list}");
    let show = home.ok(&["cron", "show", "dentist"]).await;
    assert!(show.contains("09:00:00 CET"), "{show}");
    let err = home.fails(&["cron", "add", "tea", "--every", "1h", "--tz", "Europe/Berlin", "--remind", "tea"]).await;
    assert!(err.contains("--tz is for --cron and --at"), "{err}");
    let err = home.fails(&["cron", "add", "tea", "--in", "1h", "--tz", "Europe/Berlin", "--remind", "tea"]).await;
    assert!(err.contains("--in counts time from now"), "{err}");
    let err = home.fails(&["cron", "add", "x", "--at", "2030-12-02 09:00", "--tz", "Mars/Base", "--remind", "x"]).await;
    assert!(err.contains("`Mars/Base` is not a known time zone"), "{err}");
    assert!(!home.ok(&["cron", "list"]).await.contains("tea"), "nothing was added");
}

#[tokio::test]
async fn a_number_without_a_unit_is_refused_in_flags_and_in_the_config() {
    let home = Home::new("UTC", "");
    let err = home.fails(&["cron", "add", "tea", "--every", "10", "--remind", "tea"]).await;
    assert!(err.contains("`10` has no unit: did you mean `10m`?"), "{err}");
    let err = home.fails(&["cron", "add", "tea", "--every", "1h", "--jitter", "30", "--remind", "tea"]).await;
    assert!(err.contains("`30` has no unit"), "{err}");
    home.ok(&["cron", "add", "tea", "--every", "10m", "--remind", "tea"]).await;

    let bad = Home::new("UTC", "[heartbeat]\nevery = 60\n");
    let err = bad.fails(&["check"]).await;
    let at = format!("{}:7:9: `60` has no unit: did you mean `60m`?", bad.config.display());
    assert!(err.starts_with(&at), "{err}");
    let bad = Home::new("UTC", "[exec]\ntimeout = \"60\"\n");
    assert!(bad.fails(&["check"]).await.contains("`60` has no unit"));
}

#[tokio::test]
async fn times_people_type() {
    let home = Home::new("Europe/Berlin", "");
    let berlin = jiff::tz::TimeZone::get("Europe/Berlin").unwrap();
    let before = Timestamp::now();
    home.ok(&["cron", "add", "soon", "--in", "2m", "--remind", "r"]).await;
    home.ok(&["cron", "add", "plus", "--at", "+2m", "--remind", "r"]).await;
    home.ok(&["cron", "add", "clock", "--at", "16:30", "--remind", "r"]).await;
    home.ok(&["cron", "add", "morning", "--at", "tomorrow 07:00", "--remind", "r"]).await;
    home.ok(&["cron", "add", "dated", "--at", "2030-06-01 07:00", "--remind", "r"]).await;
    let after = Timestamp::now();
    for name in ["soon", "plus"] {
        let at = next_run(&home.job_json(name).await);
        // Stored to the second.
        assert!(at >= before + 2.minutes() - 1.second() && at <= after + 2.minutes(), "{name}: {at}");
    }
    // The next 16:30 on Berlin's clocks: ahead, within a day.
    let clock = next_run(&home.job_json("clock").await).to_zoned(berlin.clone());
    assert_eq!((clock.hour(), clock.minute()), (16, 30), "{clock}");
    assert!(clock.timestamp() > before && clock.timestamp() <= after + 24.hours(), "{clock}");
    let morning = next_run(&home.job_json("morning").await).to_zoned(berlin.clone());
    let tomorrow = before.to_zoned(berlin.clone()).date().tomorrow().unwrap();
    assert_eq!((morning.date(), morning.hour(), morning.minute()), (tomorrow, 7, 0), "{morning}");
    assert_eq!(home.job_json("dated").await["next_run"], "2030-06-01T05:00:00Z");
    let err = home.fails(&["cron", "add", "x", "--at", "25:00", "--remind", "r"]).await;
    assert!(err.contains("`tomorrow 07:00`"), "the error shows what is read: {err}");
}

#[tokio::test]
async fn a_cron_field_out_of_range_names_the_field_and_its_range() {
    let home = Home::new("UTC", "");
    let err = home.fails(&["cron", "add", "x", "--cron", "61 * * * *", "--remind", "r"]).await;
    assert!(err.contains("minute 61 is out of range 0–59"), "{err}");
    let err = home.fails(&["cron", "next", "0 9 * 13 *"]).await;
    assert!(err.contains("month 13 is out of range 1–12"), "{err}");
}

#[tokio::test]
async fn check_reports_every_error_of_the_file_in_plain_words() {
    let home =
        Home::new("UTC", "[hearbeat]\nenabled = true\n[telegram]\nallow_from = 111\n[exec]\nmax_output = \"lots\"\n");
    let err = home.fails(&["check"]).await;
    let cfg = home.config.display().to_string();
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 3, "{err}");
    assert_eq!(lines[0], format!("{cfg}:6:2: unknown section `hearbeat`: did you mean `heartbeat`?"));
    assert_eq!(lines[1], format!("{cfg}:9:14: [telegram] `allow_from`: expected a list like `[111]`, found `111`"));
    assert!(lines[2].starts_with(&format!("{cfg}:11:14: [exec] `max_output`: expected a whole number")), "{err}");
}

#[tokio::test]
async fn cron_list_is_a_table_with_a_header_in_each_jobs_zone() {
    let home = Home::new("UTC", "");
    let long = "a-very-long-job-name-that-goes-on-and-on-well-past-twenty";
    home.ok(&["cron", "add", long, "--every", "2h", "--remind", "r"]).await;
    home.ok(&["cron", "add", "ny", "--cron", "0 7 * * *", "--tz", "America/New_York", "--remind", "r"]).await;
    let list = home.ok(&["cron", "list"]).await;
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines.len(), 3, "{list}");
    assert!(lines[0].starts_with("ID ") && lines[0].contains("NEXT RUN"), "{list}");
    // Every row's kind starts under KIND, however long the name.
    let col = lines[0].find("KIND").unwrap();
    for line in &lines[1..] {
        assert_eq!(line.get(col..col + 6), Some("remind"), "{list}");
    }
    // The New York job's next run in New York's time.
    let ny = lines.iter().find(|l| l.contains(" ny ")).unwrap();
    assert!(ny.contains(" 07:00 E"), "{ny}");
    let added =
        home.ok(&["cron", "add", "ny2", "--cron", "0 7 * * *", "--tz", "America/New_York", "--remind", "r"]).await;
    assert!(added.contains("07:00:00 E"), "{added}");
}

#[tokio::test]
async fn cron_list_and_show_and_audit_speak_json() {
    let home = Home::new("UTC", "");
    home.ok(&["cron", "add", "tea", "--every", "2h", "--remind", "tea", "--deliver", "log"]).await;
    let list: serde_json::Value = serde_json::from_str(&home.ok(&["cron", "list", "--json"]).await).unwrap();
    let job = &list[0];
    for (key, want) in [("name", "tea"), ("kind", "remind"), ("text", "tea"), ("zone", "UTC")] {
        assert_eq!(job[key], want, "{key}: {job}");
    }
    assert_eq!(job["schedule"]["every"], "2h");
    assert_eq!((job["enabled"].as_bool(), job["done"].as_bool()), (Some(true), Some(false)));
    assert_eq!(job["deliver"], serde_json::json!(["log"]));
    assert!(job["next_run"].as_str().unwrap().ends_with('Z'), "{job}");
    let shown = home.job_json("tea").await;
    assert_eq!(shown["id"], job["id"]);
    assert_eq!(shown["runs"], serde_json::json!([]));

    // The audit trail: one object per line, the file's fields.
    home.ok(&["cron", "add", "gone", "--every", "1h", "--remind", "x"]).await;
    std::fs::write(
        home.state.join("audit.jsonl"),
        format!(
            "{}\n",
            serde_json::json!({"at": Timestamp::now().to_string(), "tool": "exec", "source": "terminal",
                "session": "cli:direct", "chat": "direct", "ok": true, "detail": "df -h"})
        ),
    )
    .unwrap();
    let out = home.ok(&["audit", "--json"]).await;
    let entry: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(
        (entry["tool"].as_str(), entry["detail"].as_str(), entry["ok"].as_bool()),
        (Some("exec"), Some("df -h"), Some(true))
    );
}

#[tokio::test]
async fn done_one_shots_are_hidden_then_pruned() {
    let home = Home::new("UTC", "");
    for name in ["single", "old", "live"] {
        home.ok(&["cron", "add", name, "--in", "1h", "--remind", "r"]).await;
    }
    let now = Timestamp::now();
    home.store()
        .update(|jobs| {
            for j in jobs.iter_mut().filter(|j| j.name != "live") {
                j.state.done = true;
                j.state.next_run = None;
                let ago = jiff::SignedDuration::from_hours(if j.name == "old" { 40 * 24 } else { 0 });
                j.state.last_run = Some(now - ago);
            }
            Ok(())
        })
        .unwrap();
    let list = home.ok(&["cron", "list"]).await;
    assert!(list.contains("live") && !list.contains("single"), "{list}");
    assert!(list.contains("(1 done job not shown: `bramble cron list --all`"), "{list}");
    let all = home.ok(&["cron", "list", "--all"]).await;
    assert!(all.contains("single") && all.contains("done"), "{all}");
    assert!(!all.contains("old"), "a job done 40 days ago is pruned: {all}");
    let names: Vec<String> = home.store().list().unwrap().into_iter().map(|j| j.name).collect();
    assert_eq!(names, ["single", "live"]);
    // A done job's name is free again once it is pruned: `cron add` prunes too.
    home.store()
        .update(|jobs| {
            jobs[0].state.last_run = Some(now - jiff::SignedDuration::from_hours(31 * 24));
            Ok(())
        })
        .unwrap();
    home.ok(&["cron", "add", "single", "--in", "1h", "--remind", "again"]).await;
}

fn outbox(state: &Path) -> bramble::delivery::outbox::Outbox {
    bramble::delivery::outbox::Outbox::new(state)
}

#[tokio::test]
async fn outbox_lists_retries_and_drops_a_report() {
    use bramble::bus::Target;
    use bramble::delivery::outbox::Attempt;
    let home = Home::new("UTC", "");
    std::fs::create_dir_all(&home.state).unwrap();
    assert!(home.ok(&["outbox", "list"]).await.contains("no reports waiting"));
    let ob = outbox(&home.state);
    let stuck = ob.enqueue(Target::Telegram("404".into()), "the report", "job:tea").unwrap();
    ob.record(stuck, Attempt::Retry("chat not found".into()), Timestamp::now()).unwrap();
    let other = ob.enqueue(Target::Log, "another", "heartbeat").unwrap();

    let list = home.ok(&["outbox", "list"]).await;
    assert!(list.lines().next().unwrap().starts_with("ID "), "{list}");
    assert!(list.contains("telegram:404") && list.contains("telegram is not configured"), "{list}");
    let json: serde_json::Value = serde_json::from_str(&home.ok(&["outbox", "list", "--json"]).await).unwrap();
    assert_eq!(json[0]["id"], stuck);
    assert_eq!((json[0]["attempts"].as_u64(), json[0]["last_error"].as_str()), (Some(1), Some("chat not found")));
    assert!(json[0]["next_attempt"].is_string(), "{json}");
    assert_eq!(json[0]["deliverable"], false);

    let out = home.ok(&["outbox", "retry", &stuck.to_string()]).await;
    assert!(out.contains("is due now"), "{out}");
    let waiting = ob.pending().unwrap();
    assert_eq!(waiting.iter().find(|e| e.id == stuck).unwrap().next_attempt, None, "its back-off is cleared");

    let out = home.ok(&["outbox", "drop", &stuck.to_string()]).await;
    assert!(out.contains(&format!("dropped report {stuck} to telegram:404")), "{out}");
    let ids: Vec<u64> = ob.pending().unwrap().iter().map(|e| e.id).collect();
    assert_eq!(ids, [other], "the other report stays");
    let recent = ob.recent().unwrap();
    assert!(recent.iter().any(|d| d.id == stuck && d.outcome.contains("bramble outbox drop")), "{recent:?}");
    for bad in ["999", "x1", "all"] {
        let err = home.fails(&["outbox", "drop", bad]).await;
        assert!(err.contains("bramble outbox list") || err.contains("not `all`"), "{bad}: {err}");
    }
}

#[tokio::test]
async fn removing_a_job_sets_aside_its_reports_that_failed() {
    use bramble::bus::Target;
    use bramble::delivery::outbox::Attempt;
    let home = Home::new("UTC", "");
    home.ok(&["cron", "add", "tea", "--every", "1h", "--remind", "tea"]).await;
    let ob = outbox(&home.state);
    let failed = ob.enqueue(Target::Telegram("404".into()), "tea", "job:tea").unwrap();
    ob.record(failed, Attempt::Retry("chat not found".into()), Timestamp::now()).unwrap();
    let fresh = ob.enqueue(Target::Log, "tea", "job:tea").unwrap();
    let others = ob.enqueue(Target::Telegram("404".into()), "hb", "heartbeat").unwrap();
    ob.record(others, Attempt::Retry("chat not found".into()), Timestamp::now()).unwrap();
    let out = home.ok(&["cron", "remove", "tea"]).await;
    assert!(
        out.contains(&format!("set aside 1 report of it that could not be delivered ({failed} to telegram:404)")),
        "{out}"
    );
    let ids: Vec<u64> = ob.pending().unwrap().iter().map(|e| e.id).collect();
    assert_eq!(ids, [fresh, others], "a report not tried yet, and other sources', stay");
}
