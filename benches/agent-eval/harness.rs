//! The agent eval's harness: a case is a request a user would type and the
//! job it should make; the harness runs one real agent turn on it (a fresh
//! home, the real tools, any OpenAI-compatible `base_url`) and scores what
//! happened, from the outside: the session file and the job store.
//!
//! Scores per case: a **well-formed call** (a tool call whose arguments are
//! a JSON object; a call the model wrote as text and bramble recovered
//! counts, and is flagged), the **right tool**, the **right arguments** (the
//! job's kind and text, and its schedule compared by its next three fire
//! times, not by its text: `0 7 * * 1-5` and `0 7 * * MON-FRI` are the same
//! job; for the BFCL file-system cases, the file or directory made), and
//! the **loop ended** (the turn answered in text). A case that expects no
//! tool scores right when none was called.
//!
//! Shared by `main.rs` (the runner) and `tests/it/agent_eval.rs` (the CI
//! test, against a scripted provider: it tests the harness, not a model).

use std::path::Path;

use jiff::{SignedDuration, Timestamp};
use serde::Deserialize;
use serde_json::Value;

use crate::support::setup::TestHome;
use bramble::agent::{TurnEnd, TurnRequest};
use bramble::scheduler::{JobKind, JobStore, Schedule};

/// Fire times may differ this much (a model rounds "in 20 minutes" to its clock's minute).
const TOLERANCE: SignedDuration = SignedDuration::from_secs(120);
/// Fire times compared.
const FIRES: usize = 3;

/// One case, one line of `cases.jsonl`.
#[derive(Debug, Clone, Deserialize)]
pub struct Case {
    pub id: String,
    #[serde(default)]
    pub lang: String,
    pub request: String,
    pub expect: Expect,
    /// Where a case taken from elsewhere comes from (file, id, license).
    #[serde(default)]
    pub source: Option<String>,
}

/// What the turn should do.
#[derive(Debug, Clone, Deserialize)]
pub struct Expect {
    /// The tool to call; `null`: no tool at all.
    pub tool: Option<String>,
    /// `remind` or `message`, for a job.
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub schedule: Option<When>,
    /// Text the job's reminder or task must contain (case-insensitive).
    #[serde(default)]
    pub contains: Option<String>,
    /// A file or directory of this name the turn must have made somewhere
    /// in the workspace (the BFCL file-system cases).
    #[serde(default)]
    pub made: Option<String>,
    /// The job must be a watcher: a command run on schedule that gates its
    /// task ("tell me when the disk is over 90 %"); its schedule is not scored.
    #[serde(default)]
    pub watch: bool,
}

/// An expected schedule: a cron expression (in the home's zone, UTC), an
/// interval from the job's creation, or one time that long after it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum When {
    Cron(String),
    Every(String),
    In(String),
}

/// How one case went.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Score {
    pub id: String,
    pub well_formed: bool,
    /// The call was written as text and recovered.
    pub recovered: bool,
    pub right_tool: bool,
    pub right_args: bool,
    /// After its first tool call, the turn's answer quotes the tool's result
    /// (a word of it that was not in the request or the call): the model read it.
    pub result_used: bool,
    pub ended: bool,
    /// What went wrong, for the table.
    pub note: String,
}

/// The cases in a JSON-lines file (blank lines and `#` lines skipped).
pub fn load(path: &Path) -> Result<Vec<Case>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| format!("{}:{}: {e}", path.display(), i + 1)))
        .collect()
}

/// How bramble is set up for a run: `[agent] profile` and `[provider]
/// text_tool_calls`, as they would be written in `config.toml`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setup {
    /// `default` or `lean`.
    pub profile: String,
    /// `recover` or `off`.
    pub text_tool_calls: String,
    /// One workspace path for every case (emptied and set up afresh per
    /// case) instead of a new temporary one: the system prompt, which names
    /// it, is then the same in every turn, as on a real board, and a server
    /// that caches the prompt's prefix (llama.cpp's) reads it once per run.
    pub workspace: Option<std::path::PathBuf>,
}

impl Default for Setup {
    fn default() -> Self {
        Setup { profile: "default".into(), text_tool_calls: "recover".into(), workspace: None }
    }
}

/// What the eval sets beside the setup, so that a slow or looping model
/// cannot stall a run: a model call may take 15 minutes (a CPU reading a
/// 3,000-token prompt), a turn at most 8 tool rounds (a turn that needs more
/// scores "loop ended: no"), an answer at most 256 tokens (a call needs
/// under 100; a 135M model otherwise rambles on at 7 tokens a second).
const AGENT_LIMITS: &str = "max_iterations = 8\nmax_tokens = 256\n";
const PROVIDER_LIMITS: &str = "timeout = \"15m\"\njob_timeout = \"15m\"\n";

/// Run `case` as one turn against `base_url` with `model`, bramble set up
/// as `setup` says, and score it.
pub async fn run_case(case: &Case, base_url: &str, model: &str, setup: &Setup) -> Score {
    let agent_extra = format!("profile = {:?}\n{AGENT_LIMITS}", setup.profile);
    let provider_extra = format!("text_tool_calls = {:?}\n{PROVIDER_LIMITS}", setup.text_tool_calls);
    let mut home = TestHome::new("openai", base_url, &agent_extra, &provider_extra, "");
    let mut score = Score { id: case.id.clone(), ..Score::default() };
    if let Some(ws) = &setup.workspace {
        if let Err(e) = move_workspace(&mut home, ws) {
            score.note = format!("cannot set up the workspace {}: {e}", ws.display());
            return score;
        }
    }
    let (agent, _out) = home.agent();
    let mut req = TurnRequest::cli("cli:eval", case.request.clone());
    req.model = Some(model.to_string());
    let report = match agent.turn(req).await {
        Ok(r) => r,
        Err(e) => {
            score.note = format!("turn failed: {e}");
            return score;
        }
    };
    score.ended = report.end == TurnEnd::Answered;
    let calls = session_calls(&home);
    let first = calls.first();
    score.result_used = first.is_some_and(|c| quotes_result(&report.text, &c.3, &case.request, &c.1));
    score.well_formed = first.is_some_and(|c| c.1.is_object());
    score.recovered = first.is_some_and(|c| c.0.starts_with("call_text_"));
    match (&case.expect.tool, first) {
        (None, None) => {
            score.right_tool = true;
            score.right_args = true;
            score.well_formed = true;
        }
        (None, Some(c)) => score.note = format!("called {} but no tool was expected", c.2),
        (Some(want), None) => score.note = format!("no tool call (expected {want}); answered {}", gist(&report.text)),
        (Some(want), Some(c)) => {
            score.right_tool = c.2 == *want;
            if !score.right_tool {
                score.note = format!("called {} (expected {want})", c.2);
            } else {
                match check_effect(&case.expect, &home) {
                    Ok(()) => score.right_args = true,
                    Err(why) => score.note = format!("{why}; {} said {}", c.2, gist(&c.3)),
                }
            }
        }
    }
    score
}

/// The start of an answer, on one line, for a note.
fn gist(text: &str) -> String {
    let line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let cut: String = line.chars().take(80).collect();
    if cut.len() < line.len() {
        format!("{cut:?}…")
    } else {
        format!("{cut:?}")
    }
}

/// `(id, arguments, name, result)` of every tool call in the eval session, in order.
fn session_calls(home: &TestHome) -> Vec<(String, Value, String, String)> {
    let path = home.state.join("sessions");
    let Ok(dir) = std::fs::read_dir(&path) else { return Vec::new() };
    let mut calls = Vec::new();
    let mut results = std::collections::HashMap::new();
    for entry in dir.flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        for line in text.lines() {
            let Ok(m) = serde_json::from_str::<Value>(line) else { continue };
            if m["role"] == "tool" {
                let id = m["tool_call_id"].as_str().unwrap_or_default().to_string();
                results.insert(id, m["content"].as_str().unwrap_or_default().to_string());
            }
            for c in m["tool_calls"].as_array().into_iter().flatten() {
                let args =
                    serde_json::from_str(c["function"]["arguments"].as_str().unwrap_or("")).unwrap_or(Value::Null);
                let name = c["function"]["name"].as_str().unwrap_or_default().to_string();
                calls.push((c["id"].as_str().unwrap_or_default().to_string(), args, name, String::new()));
            }
        }
    }
    for c in &mut calls {
        c.3 = results.remove(&c.0).unwrap_or_default();
    }
    calls
}

/// Whether `answer` quotes `result`: a word of it (4 characters or more, a
/// letter or digit in it) that is neither in the request nor in the call's
/// arguments, so an answer that only repeats the question does not count.
fn quotes_result(answer: &str, result: &str, request: &str, args: &Value) -> bool {
    let known = format!("{request} {args}").to_lowercase();
    let answer = answer.to_lowercase();
    result
        .to_lowercase()
        .split(|c: char| c.is_whitespace() || "\"'`,;()[]{}<>".contains(c))
        .map(|w| w.trim_end_matches(['.', ':']))
        .filter(|w| w.chars().count() >= 4 && w.chars().any(char::is_alphanumeric))
        .any(|w| !known.contains(w) && answer.contains(w))
}

/// Put the case's fresh workspace at `ws` (emptied first) and point the
/// home's config at it.
fn move_workspace(home: &mut TestHome, ws: &Path) -> std::io::Result<()> {
    if ws.exists() {
        std::fs::remove_dir_all(ws)?;
    }
    copy_dir(&home.workspace, ws)?;
    let config = std::fs::read_to_string(&home.config)?;
    let from = format!("workspace = \"{}\"", home.workspace.display());
    std::fs::write(&home.config, config.replace(&from, &format!("workspace = \"{}\"", ws.display())))?;
    home.workspace = ws.to_path_buf();
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// What the right call should have done: the job for `cron`, the file or
/// directory `made` names, else nothing to check.
fn check_effect(expect: &Expect, home: &TestHome) -> Result<(), String> {
    if let Some(name) = &expect.made {
        return if found(&home.workspace, name, 4) {
            Ok(())
        } else {
            Err(format!("nothing named {name:?} was made in the workspace"))
        };
    }
    if expect.tool.as_deref() == Some("cron") {
        return check_job(expect, &JobStore::open(&home.state));
    }
    Ok(())
}

/// Whether `dir` or a directory below it, at most `depth` levels down, holds an entry `name`.
fn found(dir: &Path, name: &str, depth: u32) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else { return false };
    entries.flatten().any(|e| {
        e.file_name().to_str() == Some(name) || (depth > 0 && e.path().is_dir() && found(&e.path(), name, depth - 1))
    })
}

/// The one job made, against what was expected.
fn check_job(expect: &Expect, store: &JobStore) -> Result<(), String> {
    let jobs = store.list().map_err(|e| format!("cannot read the jobs: {e}"))?;
    let [job] = jobs.as_slice() else { return Err(format!("{} jobs made, expected 1", jobs.len())) };
    let (kind, text) = match &job.kind {
        JobKind::Remind { text } => ("remind", text),
        JobKind::Message { text } => ("message", text),
        JobKind::Exec { command } => ("exec", command),
    };
    if let Some(want) = &expect.kind {
        if kind != want {
            return Err(format!("a {kind} job (expected {want})"));
        }
    }
    if let Some(want) = &expect.contains {
        if !text.to_lowercase().contains(&want.to_lowercase()) {
            return Err(format!("its text {text:?} lacks {want:?}"));
        }
    }
    if expect.watch && job.watch.is_none() {
        return Err("a job without `watch` (expected a watcher: a command that gates the task)".into());
    }
    let Some(when) = &expect.schedule else { return Ok(()) };
    let want = expected(when, job.created)?;
    let (got, wanted) = (fires(&job.schedule, job.created), fires(&want, job.created));
    let close =
        got.len() == wanted.len() && got.iter().zip(&wanted).all(|(a, b)| a.duration_since(*b).abs() <= TOLERANCE);
    if close {
        Ok(())
    } else {
        Err(format!("fires at {} (expected {})", list(&got), list(&wanted)))
    }
}

fn expected(when: &When, created: Timestamp) -> Result<Schedule, String> {
    let dur = |d: &str| bramble::scheduler::parse_every(d).map_err(|e| format!("bad case: {e}"));
    Ok(match when {
        When::Cron(expr) => bramble::scheduler::parse_cron(expr, None).map_err(|e| format!("bad case: {e}"))?,
        When::Every(d) => Schedule::Every { every: dur(d)?, anchor: created },
        When::In(d) => {
            let d = SignedDuration::try_from(dur(d)?.get()).map_err(|e| format!("bad case: {e}"))?;
            Schedule::at(created.checked_add(d).map_err(|e| format!("bad case: {e}"))?)
        }
    })
}

/// The first [`FIRES`] fire times after `from` (UTC, the home's zone).
fn fires(s: &Schedule, from: Timestamp) -> Vec<Timestamp> {
    let mut out = Vec::new();
    let mut t = from;
    while out.len() < FIRES {
        match s.next_after(t, &jiff::tz::TimeZone::UTC) {
            Some(next) => {
                out.push(next);
                t = next;
            }
            None => break,
        }
    }
    out
}

fn list(ts: &[Timestamp]) -> String {
    ts.iter().map(|t| t.strftime("%a %m-%d %H:%M").to_string()).collect::<Vec<_>>().join(", ")
}

/// The table the runner prints, and its totals line.
pub fn table(scores: &[Score]) -> String {
    let mark = |b: bool| if b { "yes" } else { "-" };
    let mut out = String::from("case                     call  text  tool  args  used  ended  note\n");
    for s in scores {
        out.push_str(&format!(
            "{:<24} {:<5} {:<5} {:<5} {:<5} {:<5} {:<6} {}\n",
            s.id,
            mark(s.well_formed),
            mark(s.recovered),
            mark(s.right_tool),
            mark(s.right_args),
            mark(s.result_used),
            mark(s.ended),
            s.note
        ));
    }
    let n = scores.len();
    let count = |f: fn(&Score) -> bool| scores.iter().filter(|s| f(s)).count();
    out.push_str(&format!(
        "total {n}: well-formed {}, recovered from text {}, right tool {}, right arguments {}, result used {}, loop ended {}\n",
        count(|s| s.well_formed),
        count(|s| s.recovered),
        count(|s| s.right_tool),
        count(|s| s.right_args),
        count(|s| s.result_used),
        count(|s| s.ended)
    ));
    out
}

/// One line for scripts: the setup, the counts, the median and the 95th
/// percentile turn time (nearest rank).
pub fn summary(setup: &Setup, scores: &[Score], secs: &[f64]) -> String {
    let count = |f: fn(&Score) -> bool| scores.iter().filter(|s| f(s)).count();
    let mut sorted = secs.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    };
    // Nearest rank: the smallest value with at least 95 % of them at or below it.
    let p95 = match sorted.len() {
        0 => 0.0,
        n => sorted[(n * 95).div_ceil(100) - 1],
    };
    format!(
        "summary: profile={} text_tool_calls={} cases={} well_formed={} recovered={} right_tool={} right_args={} \
         result_used={} ended={} median_turn_s={median:.1} p95_turn_s={p95:.1}",
        setup.profile,
        setup.text_tool_calls,
        scores.len(),
        count(|s| s.well_formed),
        count(|s| s.recovered),
        count(|s| s.right_tool),
        count(|s| s.right_args),
        count(|s| s.result_used),
        count(|s| s.ended)
    )
}
