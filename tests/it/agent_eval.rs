//! The agent eval's harness (`benches/agent-eval/`) against a scripted
//! provider: it tests the harness (parsing the cases, running the turn,
//! reading calls and jobs, comparing schedules by fire times, scoring), not a
//! model. Each scripted answer is chosen to make one score right or wrong.

#[path = "../../benches/agent-eval/harness.rs"]
mod harness;

use serde_json::{json, Value};

use crate::support::fake_llm::{Dialect, FakeLlm, Reply};

fn cron_add(args: Value) -> Reply {
    let mut a = args;
    a["action"] = json!("add");
    Reply::tool_call("cron", a.to_string())
}

/// The scripted model: a fixed answer per request, `Done.` after any tool
/// result, but for the pills, which quotes the result (the job's id).
fn script(request: &Value) -> Option<Reply> {
    let messages = request["messages"].as_array()?;
    let last = messages.last()?;
    if last["role"] == "tool" {
        let pills = messages.iter().any(|m| m["content"] == "Remind me every weekday at 7 to take the pills.");
        return Some(if pills {
            Reply::text(format!("Done. {}", last["content"].as_str().unwrap_or_default()))
        } else {
            Reply::text("Done.")
        });
    }
    let in_20m = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::from_mins(20))
        .ok()?
        .strftime("%Y-%m-%d %H:%M")
        .to_string();
    Some(match last["content"].as_str()? {
        // Right in every way (another spelling of the same cron schedule).
        "Remind me every weekday at 7 to take the pills." => {
            cron_add(json!({"cron": "0 7 * * MON-FRI", "remind": "Take the pills"}))
        }
        // Right, but written as text: recovered.
        "In 20 minutes tell me to check the oven." => Reply::text(format!(
            "```json\n{}\n```",
            json!({"name": "cron", "arguments": {"action": "add", "at": in_20m, "remind": "Check the oven"}})
        )),
        // The right tool with the wrong interval.
        "Remind me to drink water every 2 hours." => cron_add(json!({"every": "1h", "remind": "Drink water"})),
        // The wrong tool.
        "Every day at 9am remind me to stand up and stretch." => Reply::tool_call("exec", r#"{"command":"true"}"#),
        // No tool, as expected.
        "What is a cron expression?" => Reply::text("Five fields: minute, hour, day, month, weekday."),
        "每周一早上九点提醒我交周报" => cron_add(json!({"cron": "0 9 * * 1", "remind": "交周报"})),
        // A watcher: the command gates the task.
        "Tell me when the disk is over 90 %." => cron_add(json!({
            "every": "10m", "watch": "df --output=pcent / | tail -1", "watch_mode": "changed",
            "message": "The disk is at {output}: tell the user if it is over 90 %."
        })),
        // A plain recurring task where a watcher was asked for.
        "磁盘使用率超过90%的时候告诉我" => cron_add(json!({"every": "10m", "message": "检查磁盘使用率"})),
        // A call where none was expected.
        "你好，你是谁？" => cron_add(json!({"every": "1d", "remind": "你好"})),
        // BFCL file-system cases: the directory is made, or it is not.
        "I need you to set up a fresh folder named 'WebDevProjects' wherever you're currently working." => {
            Reply::tool_call("exec", r#"{"command":"mkdir WebDevProjects"}"#)
        }
        "Hey, can you set up a new directory named 'Projects' right in workspace folder?" => {
            Reply::tool_call("exec", r#"{"command":"mkdir Project"}"#)
        }
        _ => return None,
    })
}

#[tokio::test]
async fn the_harness_scores_what_the_turn_did() {
    let file = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/benches/agent-eval/cases.jsonl"));
    let cases = harness::load(file).unwrap();
    assert_eq!(cases.len(), 62, "every line parses");
    assert_eq!(cases.iter().filter(|c| c.lang == "zh").count(), 29);

    let fake = FakeLlm::start(Dialect::OpenAi).await;
    fake.route(script);
    let mut scores = Vec::new();
    for id in [
        "en-pills-weekdays",
        "en-oven-20m",
        "en-water-2h",
        "en-daily-9",
        "en-no-call",
        "zh-weekly-report",
        "zh-no-call",
        "en-disk-watch",
        "zh-disk-watch",
    ] {
        let case = cases.iter().find(|c| c.id == id).unwrap();
        scores.push(harness::run_case(case, &fake.base_url(), "scripted", &harness::Setup::default()).await);
    }
    let table = harness::table(&scores);
    // (well-formed, recovered, right tool, right args, ended) per case.
    let got: Vec<(&str, [bool; 5])> = scores
        .iter()
        .map(|s| (s.id.as_str(), [s.well_formed, s.recovered, s.right_tool, s.right_args, s.ended]))
        .collect();
    assert_eq!(
        got,
        [
            ("en-pills-weekdays", [true, false, true, true, true]),
            ("en-oven-20m", [true, true, true, true, true]),
            ("en-water-2h", [true, false, true, false, true]),
            ("en-daily-9", [true, false, false, false, true]),
            ("en-no-call", [true, false, true, true, true]),
            ("zh-weekly-report", [true, false, true, true, true]),
            ("zh-no-call", [true, false, false, false, true]),
            ("en-disk-watch", [true, false, true, true, true]),
            ("zh-disk-watch", [true, false, true, false, true]),
        ],
        "{table}"
    );
    assert!(scores[2].note.contains("fires at"), "the schedule is compared by fire times: {table}");
    assert!(scores[8].note.contains("without `watch`"), "a watcher needs its command: {table}");
    // Only the pills' answer quotes its tool's result; `Done.` reads nothing.
    let used: Vec<&str> = scores.iter().filter(|s| s.result_used).map(|s| s.id.as_str()).collect();
    assert_eq!(used, ["en-pills-weekdays"], "{table}");
    assert!(
        table.contains(
            "total 9: well-formed 9, recovered from text 1, right tool 7, right arguments 5, result used 1, loop ended 9"
        ),
        "{table}"
    );
    let secs = [3.0, 1.0, 2.0, 9.0, 1.0, 1.0, 5.0, 4.0, 30.0];
    assert_eq!(
        harness::summary(&harness::Setup::default(), &scores, &secs),
        "summary: profile=default text_tool_calls=recover cases=9 well_formed=9 recovered=1 right_tool=7 \
         right_args=5 result_used=1 ended=9 median_turn_s=3.0 p95_turn_s=30.0"
    );

    // The BFCL cases load with their source, and the file-system ones are
    // scored by what the call made in the workspace.
    let bfcl_file = file.with_file_name("bfcl.jsonl");
    let bfcl = harness::load(&bfcl_file).unwrap();
    assert!(bfcl.len() >= 10, "{}", bfcl.len());
    assert!(
        bfcl.iter().all(|c| c.source.as_deref().is_some_and(|s| s.contains("Apache-2.0"))),
        "each names its source"
    );
    // They run in one fixed workspace (as `AGENT_EVAL_WORKSPACE` sets), which
    // each case finds empty but for the files `bramble init` writes.
    let fixed = tempfile::tempdir().unwrap();
    let ws = fixed.path().join("ws");
    let one_workspace = harness::Setup { workspace: Some(ws.clone()), ..harness::Setup::default() };
    let mut fs_scores = Vec::new();
    for id in ["bfcl-multi_turn_base_39", "bfcl-multi_turn_base_10"] {
        let case = bfcl.iter().find(|c| c.id == id).unwrap();
        fs_scores.push(harness::run_case(case, &fake.base_url(), "scripted", &one_workspace).await);
    }
    let got: Vec<[bool; 3]> = fs_scores.iter().map(|s| [s.well_formed, s.right_tool, s.right_args]).collect();
    assert_eq!(got, [[true, true, true], [true, true, false]], "{}", harness::table(&fs_scores));
    assert!(fs_scores[1].note.contains("\"Projects\""), "{}", fs_scores[1].note);
    assert!(ws.join("Project").is_dir(), "the second case ran in the fixed workspace");
    assert!(!ws.join("WebDevProjects").exists(), "the first case's directory was cleared");
    assert!(ws.join("AGENTS.md").is_file(), "the workspace files are written afresh");

    // Without the recovery, the call written as text is no call: the turn
    // answers with the JSON, and the case scores nothing but the ended loop.
    let off = harness::Setup { profile: "lean".into(), text_tool_calls: "off".into(), workspace: None };
    let case = cases.iter().find(|c| c.id == "en-oven-20m").unwrap();
    let score = harness::run_case(case, &fake.base_url(), "scripted", &off).await;
    assert_eq!(
        [score.well_formed, score.recovered, score.right_tool, score.right_args, score.ended],
        [false, false, false, false, true],
        "{}",
        score.note
    );
    assert!(score.note.contains("no tool call"), "{}", score.note);
}
