//! bramble's cron schedules against an outside reference: `cronsim` (PyPI),
//! which follows Debian's cron on the two rules croner decides differently —
//! when day-of-month and day-of-week are ANDed, and what a job does when the
//! clocks change. Expressions from the red team's list and cronsim's own DST
//! cases, plus generated ones, in four zones with daylight saving time (Lord
//! Howe's change is 30 minutes), from before each clock change of 2026 and 2027.
//!
//! On purpose not compared: `W` (nearest weekday), `?` and the nicknames
//! (`@daily`), which cronsim does not read (their expansions are compared),
//! `@reboot`, which bramble refuses, and a one-value range with a step
//! (`11-11/4`): cronsim reads it as `11/4` (11, 15, 19, 23), Debian's cron
//! and bramble as the range it is (11). In Lord Howe only fixed-time jobs
//! are compared: cronsim moves a wildcard job on an hour at a time in UTC,
//! which after the 30-minute change lands on :30 and skips real slots
//! (`30 * * * *` has no 02:30 +11:00 on 2026-10-04); bramble's answers there
//! are checked by hand in `scheduler::cron`'s tests.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;

use bramble::scheduler::cron::CronExpr;
use jiff::tz::TimeZone;
use jiff::Timestamp;
use serde_json::{json, Value};

const ZONES: [&str; 4] = ["Europe/Berlin", "Europe/Riga", "America/New_York", "Australia/Lord_Howe"];

/// Hand-picked: the red team's disagreements and cronsim's DST test cases.
const PICKED: &[&str] = &[
    "30 1-3 * * *",
    "0,30 2 * * *",
    "30 2 * * *",
    "0 2-3 * * *",
    "15 0-4/2 * * *",
    "*/30 * * * *",
    "30 * * * *",
    "*/15 2 * * *",
    "0 */2 * * *",
    "0 1,2,3 * * *",
    "1 1 1-7 * */7",
    "0 9 */2 * 1",
    "0 9 */100,1-7 * 1",
    "0 9 13 * 5",
    "0 0 L * *",
    "0 12 LW * *",
    "0 12 * * 5L",
    "0 12 * * FRI#2",
    "0 8 * jan-mar mon-fri",
    "0 0 29 2 *",
    "0 0 30 2 *",
    "0 0 31 4,6,9,11 *",
    "30 2 * * * ",
    "0 30 2 * * *",
    "*/20 * 2 * * *",
];

/// A small deterministic generator (xorshift), so a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One field from the shapes crontabs use.
fn field(rng: &mut Rng, lo: u64, hi: u64) -> String {
    let span = hi - lo + 1;
    let v = |r: &mut Rng| lo + r.below(span);
    match rng.below(8) {
        0 => "*".into(),
        1 => format!("*/{}", 1 + rng.below(span.min(12))),
        2 => v(rng).to_string(),
        3 => {
            let a = v(rng);
            format!("{a}-{}", a + rng.below(hi - a + 1))
        }
        // A range of two values at least (see the module header).
        4 => {
            let a = lo + rng.below(span - 1);
            format!("{a}-{}/{}", a + 1 + rng.below(hi - a), 1 + rng.below(5))
        }
        5 => format!("{},{}", v(rng), v(rng)),
        6 => {
            let a = v(rng);
            format!("{},{a}-{}", v(rng), a + rng.below(hi - a + 1))
        }
        _ => format!("{}/{}", v(rng), 1 + rng.below(span.min(20))),
    }
}

fn generated(n: usize) -> Vec<String> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    (0..n)
        .map(|_| {
            // Mostly times of night, where the clocks change.
            let hour = match rng.below(3) {
                0 => field(&mut rng, 0, 23),
                _ => field(&mut rng, 0, 4),
            };
            let dom = match rng.below(4) {
                0 => field(&mut rng, 1, 31),
                _ => "*".into(),
            };
            let dow = match rng.below(4) {
                0 => field(&mut rng, 0, 7),
                _ => "*".into(),
            };
            let month = match rng.below(6) {
                0 => field(&mut rng, 1, 12),
                _ => "*".into(),
            };
            format!("{} {hour} {dom} {month} {dow}", field(&mut rng, 0, 59))
        })
        .collect()
}

/// Starting points: three hours and two days before each clock change of 2026 and 2027.
fn starts(zone: &TimeZone) -> Vec<Timestamp> {
    let from: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
    let until: Timestamp = "2028-01-01T00:00:00Z".parse().unwrap();
    let mut out = Vec::new();
    for t in zone.following(from).take(8) {
        let at = t.timestamp();
        if at >= until {
            break;
        }
        out.push(at - jiff::SignedDuration::from_hours(3));
        out.push(at - jiff::SignedDuration::from_hours(48));
    }
    assert!(out.len() >= 8, "{zone:?} has clock changes in 2026 and 2027");
    out
}

/// cronsim's answers to `requests`, one line each.
fn reference(requests: &[Value]) -> Vec<Value> {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cron");
    let python = crate::support::python::venv("cronsim", &fixtures.join("requirements.txt"));
    let mut child = std::process::Command::new(python)
        .arg(fixtures.join("reference.py"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the cronsim reference");
    let mut stdin = child.stdin.take().unwrap();
    let input: String = requests.iter().map(|r| format!("{r}\n")).collect();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let answers: Vec<Value> = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect();
    writer.join().unwrap().unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(answers.len(), requests.len());
    answers
}

/// bramble's answer, the same shape: the next `count` runs, or the error.
fn ours(expr: &str, zone: &TimeZone, from: Timestamp, count: usize) -> Result<Vec<i64>, String> {
    let cron = CronExpr::parse(expr).map_err(|e| e.0)?;
    let mut t = from;
    let mut out = Vec::new();
    for _ in 0..count {
        match cron.next_after(t, zone) {
            Some(next) => {
                out.push(next.as_second());
                t = next;
            }
            None => break,
        }
    }
    Ok(out)
}

#[test]
fn schedules_agree_with_debian_cron_as_cronsim_computes_it() {
    let mut exprs: Vec<String> = PICKED.iter().map(|e| e.trim().to_string()).collect();
    exprs.extend(generated(150));
    let mut cases = Vec::new();
    for name in ZONES {
        let zone = TimeZone::get(name).unwrap();
        for start in starts(&zone) {
            for expr in &exprs {
                cases.push((expr.clone(), name, zone.clone(), start));
            }
        }
    }
    const COUNT: usize = 12;
    let requests: Vec<Value> = cases
        .iter()
        .map(|(expr, name, _, start)| json!({"expr": expr, "tz": name, "from": start.as_second(), "count": COUNT}))
        .collect();
    let answers = reference(&requests);
    let show = |times: &[i64], zone: &TimeZone| -> Vec<String> {
        times
            .iter()
            .map(|s| Timestamp::from_second(*s).unwrap().to_zoned(zone.clone()).strftime("%F %T%:z").to_string())
            .collect()
    };
    let mut disagreements = Vec::new();
    let mut compared = 0usize;
    for ((expr, name, zone, start), answer) in cases.iter().zip(&answers) {
        let theirs: Result<Vec<i64>, String> = match answer.get("times") {
            Some(t) => Ok(t.as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect()),
            None => Err(answer["error"].as_str().unwrap_or("?").to_string()),
        };
        let fixed = CronExpr::parse(expr).is_ok_and(|c| c.is_fixed_time());
        if *name == "Australia/Lord_Howe" && !fixed {
            continue;
        }
        let mine = ours(expr, zone, *start, COUNT);
        compared += 1;
        match (&mine, &theirs) {
            (Ok(a), Ok(b)) if a == b => {}
            (Err(_), Err(_)) => {}
            _ => disagreements.push(format!(
                "`{expr}` in {name} after {start}:\n  bramble: {:?}\n  cronsim: {:?}",
                mine.as_ref().map(|t| show(t, zone)),
                theirs.as_ref().map(|t| show(t, zone)),
            )),
        }
    }
    assert!(compared > 4_500, "{compared} cases");
    assert!(
        disagreements.is_empty(),
        "{} of {compared} cases disagree; the first:\n{}",
        disagreements.len(),
        disagreements.iter().take(8).cloned().collect::<Vec<_>>().join("\n")
    );
}
