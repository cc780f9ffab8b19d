//! When a job fires: a fixed interval, a cron expression in a time zone, or one instant.
//!
//! A schedule is pure data plus one question, [`Schedule::next_after`]: the
//! first occurrence strictly after a given instant. Everything the runner does
//! with time (missed runs, clock jumps, DST) is built on that one question, so
//! it is answered here the same way for the CLI, the daemon and the tests.
//!
//! - `every` is anchored: occurrences are `anchor + k·every`, so a restart of
//!   the daemon never shifts or resets the interval.
//! - `cron` is evaluated in the job's IANA zone as Debian's cron does it
//!   ([`super::cron`]): a fixed-time job's slot inside a spring-forward gap
//!   runs once at the first instant after the gap, one inside a repeated
//!   (fall-back) hour once, at its first instance; a job whose minute or hour
//!   starts with `*` runs at the local times that exist. croner is kept for
//!   the English reading of an expression only.
//! - `at` happens once.

use std::fmt;
use std::time::Duration;

use croner::parser::{CronParser, Seconds, Year};

use super::cron::CronExpr;
use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use crate::config::Dur;

/// An example shown with every cron parse error.
const CRON_EXAMPLE: &str =
    "expected 5 fields `min hour day-of-month month day-of-week` (like `0 9 * * mon-fri`), or 6 with seconds first (like `*/30 * * * * *`)";

/// Why a schedule could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("`{text}` is not an interval: {reason}")]
    Every { text: String, reason: String },
    #[error("`{expr}` is not a cron expression: {reason}; {CRON_EXAMPLE}")]
    Cron { expr: String, reason: String },
    #[error("`{text}` is not a time: {reason}")]
    At { text: String, reason: String },
    #[error(
        "`{0}` is not a known time zone: expected an IANA name like `Europe/Berlin`, `America/New_York` or `UTC` (is the tzdata package installed?)"
    )]
    Tz(String),
}

/// When a job fires. Stored in `jobs.json` as an object tagged by `kind`:
/// `{"kind":"every","every":"10m","anchor":"2026-01-01T00:00:00Z"}`,
/// `{"kind":"cron","expr":"0 9 * * *","tz":"Europe/Berlin"}`,
/// `{"kind":"at","at":"2026-11-22T08:00:00Z"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Schedule {
    /// Every `every`, at `anchor + k·every` (k ≥ 0).
    Every {
        #[serde(serialize_with = "ser_dur", deserialize_with = "de_dur")]
        every: Dur,
        #[serde(with = "super::timeser::ts")]
        anchor: Timestamp,
    },
    /// A cron expression (5 fields, or 6 with seconds first) in an IANA zone;
    /// `tz: None` means the daemon's default zone.
    Cron {
        expr: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tz: Option<String>,
    },
    /// Once, at this instant; `tz`: the zone it was given in (`--at … --tz`),
    /// where its time is shown (`None`: the daemon's default zone).
    At {
        #[serde(with = "super::timeser::ts")]
        at: Timestamp,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tz: Option<String>,
    },
}

/// A stored interval: what [`ser_dur`] writes (`"10m"`, `"1500ms"`), and, as
/// earlier versions read a hand-edited file, a bare number of seconds: a
/// typed duration needs its unit ([`Dur`]), a stored one is not refused (a
/// refusal here would set the whole job list aside as corrupt).
fn de_dur<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Dur, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Secs(u64),
        Text(String),
    }
    match Raw::deserialize(d)? {
        Raw::Secs(n) => Ok(Dur::secs(n)),
        Raw::Text(t) => match t.trim().parse::<u64>() {
            Ok(n) => Ok(Dur::secs(n)),
            Err(_) => t.parse().map_err(serde::de::Error::custom),
        },
    }
}

/// `Dur` reads itself (`"10m"`) but has no `Serialize`; write it
/// the way a person would, without losing sub-second parts.
fn ser_dur<S: serde::Serializer>(d: &Dur, s: S) -> Result<S::Ok, S::Error> {
    if d.0.subsec_nanos() == 0 {
        s.collect_str(d)
    } else {
        s.collect_str(&format_args!("{}ms", d.0.as_millis()))
    }
}

impl Schedule {
    /// The first occurrence strictly after `after`, or `None` if there is none
    /// (an `at` in the past, a cron expression that never matches again, a
    /// stored schedule that no longer parses, a zero interval).
    ///
    /// `default_tz` is used by cron schedules without their own zone.
    pub fn next_after(&self, after: Timestamp, default_tz: &TimeZone) -> Option<Timestamp> {
        match self {
            Schedule::Every { every, anchor } => {
                let step = i128::try_from(every.0.as_nanos()).ok().filter(|n| *n > 0)?;
                let (a, t) = (anchor.as_nanosecond(), after.as_nanosecond());
                let k = if t < a { 0 } else { (t - a) / step + 1 };
                Timestamp::from_nanosecond(a.checked_add(k.checked_mul(step)?)?).ok()
            }
            Schedule::Cron { expr, tz } => {
                let cron = CronExpr::parse(expr).ok()?;
                let zone = match tz {
                    Some(name) => TimeZone::get(name).ok()?,
                    None => default_tz.clone(),
                };
                cron.next_after(after, &zone)
            }
            Schedule::At { at, .. } => (*at > after).then_some(*at),
        }
    }

    /// The last occurrence at or before `t`, if any. Used to find the newest
    /// occurrence of a missed span without walking it.
    pub fn last_at_or_before(&self, t: Timestamp, default_tz: &TimeZone) -> Option<Timestamp> {
        match self {
            Schedule::Every { every, anchor } => {
                let step = i128::try_from(every.0.as_nanos()).ok().filter(|n| *n > 0)?;
                let (a, t) = (anchor.as_nanosecond(), t.as_nanosecond());
                if t < a {
                    return None;
                }
                Timestamp::from_nanosecond(a + (t - a) / step * step).ok()
            }
            Schedule::Cron { expr, tz } => {
                let cron = CronExpr::parse(expr).ok()?;
                let zone = match tz {
                    Some(name) => TimeZone::get(name).ok()?,
                    None => default_tz.clone(),
                };
                cron.last_at_or_before(t, &zone)
            }
            Schedule::At { at, .. } => (*at <= t).then_some(*at),
        }
    }

    /// Whether the schedule is defined by the wall clock (`cron`, `at`): such
    /// jobs are held while the clock is not trusted. `every` is not.
    pub fn is_wall_clock(&self) -> bool {
        !matches!(self, Schedule::Every { .. })
    }

    /// Once at `at`, shown in the default zone.
    pub fn at(at: Timestamp) -> Schedule {
        Schedule::At { at, tz: None }
    }

    /// The zone its times are shown in: a cron or `at` job's own, else `default`.
    pub fn zone(&self, default: &TimeZone) -> TimeZone {
        match self {
            Schedule::Cron { tz: Some(name), .. } | Schedule::At { tz: Some(name), .. } => {
                TimeZone::get(name).unwrap_or_else(|_| default.clone())
            }
            _ => default.clone(),
        }
    }

    /// Whether the schedule happens once (`at`).
    pub fn is_one_shot(&self) -> bool {
        matches!(self, Schedule::At { .. })
    }

    /// Check a schedule read from anywhere (CLI, agent tool, hand-edited file).
    pub fn validate(&self) -> Result<(), ScheduleError> {
        match self {
            Schedule::Every { every, .. } => check_every(&every.to_string(), *every).map(|_| ()),
            Schedule::Cron { expr, tz } => {
                parse_cron(expr, tz.as_deref())?;
                Ok(())
            }
            Schedule::At { .. } => Ok(()),
        }
    }

    /// The schedule for a table row (`bramble cron list`): like
    /// [`describe`](Self::describe) without the English reading of a cron
    /// expression — working that out parses the expression, ~20 µs a job,
    /// most of a listing of thousands.
    pub fn summary(&self, default_tz: &TimeZone) -> String {
        match self {
            Schedule::Cron { expr, tz } => {
                let zone = tz.as_deref().unwrap_or_else(|| default_tz.iana_name().unwrap_or("local"));
                format!("cron `{expr}` ({zone})")
            }
            other => other.describe(default_tz),
        }
    }

    /// One line for `bramble cron show` and `cron add`, times shown in
    /// `default_tz` (or the job's own zone for cron).
    pub fn describe(&self, default_tz: &TimeZone) -> String {
        match self {
            Schedule::Every { every, anchor } => {
                format!("every {every} (from {})", local_time(Some(*anchor), default_tz))
            }
            Schedule::Cron { expr, tz } => {
                let zone = tz.as_deref().unwrap_or_else(|| default_tz.iana_name().unwrap_or("local"));
                // The words are croner's, told how Debian's cron pairs the two day fields.
                match CronExpr::parse(expr) {
                    Ok(ours) => match cron_parser(ours.days_anded()).parse(expr) {
                        Ok(cron) => format!("cron `{expr}` ({zone}): {}", cron.describe()),
                        Err(_) => format!("cron `{expr}` ({zone})"),
                    },
                    Err(e) => format!("cron `{expr}` ({zone}): invalid: {e}"),
                }
            }
            Schedule::At { at, .. } => {
                format!("once at {}", local_time(Some(*at), &self.zone(default_tz)))
            }
        }
    }
}

impl fmt::Display for Schedule {
    /// The compact form (`every 10m`, `cron 0 9 * * * Europe/Berlin`, `at 2026-…Z`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Schedule::Every { every, .. } => write!(f, "every {every}"),
            Schedule::Cron { expr, tz: Some(tz) } => write!(f, "cron {expr} {tz}"),
            Schedule::Cron { expr, tz: None } => write!(f, "cron {expr}"),
            Schedule::At { at, .. } => write!(f, "at {at}"),
        }
    }
}

/// croner, for the English reading only: 5 fields, or 6 with seconds first;
/// the day fields ANDed as [`CronExpr`] decides.
fn cron_parser(days_anded: bool) -> CronParser {
    CronParser::builder().seconds(Seconds::Optional).year(Year::Disallowed).dom_and_dow(days_anded).build()
}

fn check_every(text: &str, every: Dur) -> Result<Dur, ScheduleError> {
    let bad = |reason: &str| ScheduleError::Every { text: text.to_string(), reason: reason.to_string() };
    if every.0 < Duration::from_secs(1) {
        return Err(bad("the interval must be at least 1s"));
    }
    if every.0.subsec_nanos() != 0 {
        return Err(bad("the interval must be whole seconds, like `90s` or `1h30m`"));
    }
    Ok(every)
}

/// Read an interval for `--every`: `90s`, `10m`, `2h`, `1d`, `1h30m` (at least 1 s, whole seconds).
/// A time as users read it in `zone` (`2026-11-22 09:00:00 CET`), or `-` for none.
pub fn local_time(t: Option<Timestamp>, zone: &TimeZone) -> String {
    match t {
        Some(t) => t.to_zoned(zone.clone()).strftime("%Y-%m-%d %H:%M:%S %Z").to_string(),
        None => "-".into(),
    }
}

pub fn parse_every(text: &str) -> Result<Dur, ScheduleError> {
    let every: Dur = text.parse().map_err(|reason: String| ScheduleError::Every { text: text.to_string(), reason })?;
    check_every(text, every)
}

/// Read a cron expression for `--cron`, with an optional IANA zone for `--tz`.
///
/// Accepts 5 fields (`min hour dom month dow`), or 6 with seconds first, and
/// croner's nicknames (`@daily`, `@hourly`, …). 7 fields (with a year) are
/// refused: the year field surprises more than it helps. Returns the schedule
/// with the expression trimmed.
pub fn parse_cron(expr: &str, tz: Option<&str>) -> Result<Schedule, ScheduleError> {
    let trimmed = expr.trim();
    CronExpr::parse(trimmed).map_err(|e| ScheduleError::Cron { expr: expr.to_string(), reason: e.0 })?;
    let tz = match tz {
        Some(name) => Some(parse_tz(name)?.iana_name().unwrap_or(name.trim()).to_string()),
        None => None,
    };
    Ok(Schedule::Cron { expr: trimmed.to_string(), tz })
}

/// Look up an IANA zone name in the system tz database.
pub fn parse_tz(name: &str) -> Result<TimeZone, ScheduleError> {
    let name = name.trim();
    if name.is_empty() {
        return Err(ScheduleError::Tz(name.to_string()));
    }
    TimeZone::get(name).map_err(|_| ScheduleError::Tz(name.to_string()))
}

/// Read a time for `--at`.
///
/// - RFC 3339 with an offset: `2026-11-22T09:00:00+01:00`, `2026-11-22T08:00:00Z`.
/// - Local civil time in `default_tz`: `2026-11-22 09:00`, `2026-11-22 09:00:30`
///   (a `T` instead of the space works too).
///
/// A civil time that does not exist in the zone (inside a spring-forward gap)
/// is an **error** — a reminder should not silently move. A civil time that
/// exists twice (inside a fall-back repeat) means the **earlier** instant.
pub fn parse_at(text: &str, default_tz: &TimeZone) -> Result<Timestamp, ScheduleError> {
    let t = text.trim();
    let bad = |reason: String| ScheduleError::At { text: text.to_string(), reason };
    let expected =
        "expected `YYYY-MM-DD HH:MM[:SS]` (in the default time zone) or RFC 3339 like `2026-11-22T09:00:00+01:00`";
    if let Ok(ts) = t.parse::<Timestamp>() {
        return Ok(ts);
    }
    // Only the documented civil shapes: a date, a space or `T`, a time; nothing after.
    let shape_ok = t.len() >= 16
        && t.is_char_boundary(10)
        && matches!(t.as_bytes()[10], b' ' | b'T' | b't')
        && !t[10..].contains(['+', 'Z', 'z', '['])
        && !t[11..].contains('-');
    if !shape_ok {
        return Err(bad(expected.to_string()));
    }
    let normalized = format!("{}T{}", &t[..10], &t[11..]);
    let civil: jiff::civil::DateTime = normalized.parse().map_err(|e| bad(format!("{e}; {expected}")))?;
    let zone_name = default_tz.iana_name().unwrap_or("the default time zone");
    let ambiguous = default_tz.to_ambiguous_timestamp(civil);
    match ambiguous.offset() {
        AmbiguousOffset::Gap { .. } => Err(bad(format!(
            "{civil} does not exist in {zone_name} (the clocks skip it for daylight saving time); pick a time after the change"
        ))),
        _ => ambiguous.earlier().map_err(|e| bad(e.to_string())),
    }
}

/// Read a time as people type it, for `--at` and `--until`: what
/// [`parse_at`] reads, and times relative to `now` in `zone`:
///
/// - `+2m`, `+1h30m`: this long from now;
/// - `16:30`, `16:30:15`: the next time the clocks in `zone` show it (today
///   if it is still ahead, else tomorrow);
/// - `today 16:30`, `tomorrow 07:00`.
///
/// A clock time that does not exist that day (a spring-forward gap) is an
/// error, as in [`parse_at`].
pub fn parse_when(text: &str, zone: &TimeZone, now: Timestamp) -> Result<Timestamp, ScheduleError> {
    let t = text.trim();
    let bad = |reason: String| ScheduleError::At { text: text.to_string(), reason };
    if let Some(after) = t.strip_prefix('+') {
        let d: Dur = after.trim().parse().map_err(|e: String| bad(e))?;
        if d.0 < Duration::from_secs(1) {
            return Err(bad("a time from now must be at least 1s ahead, like `+2m`".into()));
        }
        let d = SignedDuration::try_from(d.0).map_err(|e| bad(e.to_string()))?;
        return now.checked_add(d).map_err(|e| bad(e.to_string()));
    }
    let lower = t.to_ascii_lowercase();
    let (day, clock) = match lower.split_once(char::is_whitespace) {
        Some((word @ ("today" | "tomorrow"), rest)) => (Some(word), rest.trim()),
        _ => (None, lower.as_str()),
    };
    let Some(time) = clock_time(clock) else {
        return parse_at(text, zone).map_err(|e| match e {
            ScheduleError::At { text, reason } => ScheduleError::At {
                text,
                reason: format!("{reason}, `16:30` (the next 16:30), `tomorrow 07:00` or `+2m`"),
            },
            other => other,
        });
    };
    let today = now.to_zoned(zone.clone()).date();
    let on = |date: jiff::civil::Date| -> Result<Timestamp, ScheduleError> {
        let civil = date.to_datetime(time);
        let ambiguous = zone.to_ambiguous_timestamp(civil);
        if let AmbiguousOffset::Gap { .. } = ambiguous.offset() {
            let zone_name = zone.iana_name().unwrap_or("the time zone");
            return Err(bad(format!(
                "{civil} does not exist in {zone_name} (the clocks skip it for daylight saving time); pick a time after the change"
            )));
        }
        ambiguous.earlier().map_err(|e| bad(e.to_string()))
    };
    let tomorrow = || today.tomorrow().map_err(|e| bad(e.to_string()));
    match day {
        Some("today") => {
            let at = on(today)?;
            if at <= now {
                return Err(bad(format!(
                    "{clock} today has passed; `tomorrow {clock}` or just `{clock}` is the next one"
                )));
            }
            Ok(at)
        }
        Some(_) => on(tomorrow()?),
        None => match on(today) {
            Ok(at) if at > now => Ok(at),
            _ => on(tomorrow()?),
        },
    }
}

/// `HH:MM` or `HH:MM:SS` (one-digit hours too), a time of day.
fn clock_time(text: &str) -> Option<jiff::civil::Time> {
    let parts: Vec<&str> = text.split(':').collect();
    let num = |p: &str, widths: std::ops::RangeInclusive<usize>, max: i8| -> Option<i8> {
        let ok = widths.contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit());
        ok.then(|| p.parse::<i8>().ok()).flatten().filter(|n| *n <= max)
    };
    let (h, m, s) = match parts[..] {
        [h, m] => (num(h, 1..=2, 23)?, num(m, 2..=2, 59)?, 0),
        [h, m, s] => (num(h, 1..=2, 23)?, num(m, 2..=2, 59)?, num(s, 2..=2, 59)?),
        _ => return None,
    };
    jiff::civil::Time::new(h, m, s, 0).ok()
}

/// `a - b`, as a std duration, zero if negative.
pub(crate) fn dur_since(a: Timestamp, b: Timestamp) -> Duration {
    let d: SignedDuration = a.duration_since(b);
    Duration::try_from(d).unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn tz(name: &str) -> TimeZone {
        TimeZone::get(name).unwrap()
    }

    fn every(text: &str, anchor: &str) -> Schedule {
        Schedule::Every { every: parse_every(text).unwrap(), anchor: ts(anchor) }
    }

    #[test]
    fn every_is_anchored_and_strictly_after() {
        let s = every("10m", "2026-01-01T00:00:00Z");
        let utc = TimeZone::UTC;
        // Before the anchor: the anchor itself.
        assert_eq!(s.next_after(ts("2025-12-31T23:00:00Z"), &utc), Some(ts("2026-01-01T00:00:00Z")));
        // Exactly on an occurrence: the next one (strictly after).
        assert_eq!(s.next_after(ts("2026-01-01T00:10:00Z"), &utc), Some(ts("2026-01-01T00:20:00Z")));
        // A restart at an odd time does not reset the interval.
        assert_eq!(s.next_after(ts("2026-01-01T05:03:17Z"), &utc), Some(ts("2026-01-01T05:10:00Z")));
        assert_eq!(s.last_at_or_before(ts("2026-01-01T05:03:17Z"), &utc), Some(ts("2026-01-01T05:00:00Z")));
        assert_eq!(s.last_at_or_before(ts("2025-12-31T00:00:00Z"), &utc), None);
        // A zero interval from a hand-edited file never fires instead of dividing by zero.
        let zero = Schedule::Every { every: Dur::secs(0), anchor: ts("2026-01-01T00:00:00Z") };
        assert_eq!(zero.next_after(ts("2026-01-01T00:00:00Z"), &utc), None);
        assert!(zero.validate().is_err());
    }

    #[test]
    fn at_fires_only_if_still_ahead() {
        let s = Schedule::at(ts("2026-11-22T08:00:00Z"));
        assert_eq!(s.next_after(ts("2026-11-22T07:59:59Z"), &TimeZone::UTC), Some(ts("2026-11-22T08:00:00Z")));
        assert_eq!(s.next_after(ts("2026-11-22T08:00:00Z"), &TimeZone::UTC), None);
        assert!(s.is_one_shot() && s.is_wall_clock());
    }

    #[test]
    fn cron_new_york_follows_dst() {
        let s = parse_cron("0 9 * * *", Some("America/New_York")).unwrap();
        let any = TimeZone::UTC; // ignored: the job has its own zone
                                 // January: EST (UTC-5) → 14:00 UTC.
        assert_eq!(s.next_after(ts("2026-01-15T00:00:00Z"), &any), Some(ts("2026-01-15T14:00:00Z")));
        // July: EDT (UTC-4) → 13:00 UTC.
        assert_eq!(s.next_after(ts("2026-07-15T00:00:00Z"), &any), Some(ts("2026-07-15T13:00:00Z")));
        // Without its own zone, the default zone applies.
        let local = parse_cron("0 9 * * *", None).unwrap();
        assert_eq!(
            local.next_after(ts("2026-07-15T00:00:00Z"), &tz("America/New_York")),
            Some(ts("2026-07-15T13:00:00Z"))
        );
        assert_eq!(local.next_after(ts("2026-07-15T00:00:00Z"), &TimeZone::UTC), Some(ts("2026-07-15T09:00:00Z")));
    }

    #[test]
    fn cron_spring_forward_gap_fires_once_after_the_gap() {
        // Berlin, 2026-03-29: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist.
        let s = parse_cron("30 2 * * *", Some("Europe/Berlin")).unwrap();
        let utc = TimeZone::UTC;
        let day_before = s.next_after(ts("2026-03-28T00:00:00Z"), &utc).unwrap();
        assert_eq!(day_before, ts("2026-03-28T01:30:00Z")); // 02:30 CET
        let gap_day = s.next_after(day_before, &utc).unwrap();
        // The first real instant after the gap: 03:00 CEST = 01:00 UTC.
        assert_eq!(gap_day, ts("2026-03-29T01:00:00Z"));
        let day_after = s.next_after(gap_day, &utc).unwrap();
        assert_eq!(day_after, ts("2026-03-30T00:30:00Z")); // 02:30 CEST
    }

    #[test]
    fn cron_fall_back_repeat_fires_once() {
        // Berlin, 2026-10-25: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice.
        let s = parse_cron("30 2 * * *", Some("Europe/Berlin")).unwrap();
        let utc = TimeZone::UTC;
        let first = s.next_after(ts("2026-10-24T12:00:00Z"), &utc).unwrap();
        assert_eq!(first, ts("2026-10-25T00:30:00Z")); // 02:30 CEST, the first instance
        let next = s.next_after(first, &utc).unwrap();
        assert_eq!(next, ts("2026-10-26T01:30:00Z")); // not 01:30Z on the 25th (02:30 CET)
                                                      // Also when asked from inside the repeated hour, after the first instance.
        assert_eq!(s.next_after(ts("2026-10-25T01:10:00Z"), &utc), Some(ts("2026-10-26T01:30:00Z")));
        // An interval pattern does run in both halves: they are different instants.
        let half_hourly = parse_cron("*/30 * * * *", Some("Europe/Berlin")).unwrap();
        let mut t = ts("2026-10-25T00:00:00Z");
        let mut seen = Vec::new();
        for _ in 0..4 {
            t = half_hourly.next_after(t, &utc).unwrap();
            seen.push(t);
        }
        let want: Vec<Timestamp> =
            ["2026-10-25T00:30:00Z", "2026-10-25T01:00:00Z", "2026-10-25T01:30:00Z", "2026-10-25T02:00:00Z"]
                .into_iter()
                .map(ts)
                .collect();
        assert_eq!(seen, want);
    }

    #[test]
    fn cron_with_seconds_and_last_occurrence() {
        let s = parse_cron("*/20 * * * * *", None).unwrap();
        let utc = TimeZone::UTC;
        assert_eq!(s.next_after(ts("2026-01-01T00:00:00Z"), &utc), Some(ts("2026-01-01T00:00:20Z")));
        // Sub-second "after" still yields the next whole occurrence, strictly after.
        assert_eq!(s.next_after(ts("2026-01-01T00:00:20.5Z"), &utc), Some(ts("2026-01-01T00:00:40Z")));
        assert_eq!(s.last_at_or_before(ts("2026-01-01T00:00:59Z"), &utc), Some(ts("2026-01-01T00:00:40Z")));
        assert_eq!(s.last_at_or_before(ts("2026-01-01T00:00:40Z"), &utc), Some(ts("2026-01-01T00:00:40Z")));
    }

    #[test]
    fn cron_errors_say_what_was_expected() {
        for bad in ["", "* * * *", "0 0 1 1 * 2030 x", "61 * * * *", "0 9 * * funday", "every day"] {
            let err = parse_cron(bad, None).unwrap_err().to_string();
            assert!(err.contains("expected 5 fields"), "{bad}: {err}");
        }
        let seven = parse_cron("0 0 9 * * * 2027", None).unwrap_err().to_string();
        assert!(seven.contains("7 fields"), "{seven}");
        let err = parse_cron("0 9 * * *", Some("Mars/Olympus")).unwrap_err().to_string();
        assert!(err.contains("not a known time zone"), "{err}");
        assert!(parse_cron("@daily", None).is_ok());
        assert!(parse_cron(" 0 9 * * mon-fri ", Some("Europe/Berlin")).is_ok());
    }

    #[test]
    fn every_parsing() {
        assert_eq!(parse_every("10m").unwrap(), Dur::secs(600));
        assert_eq!(parse_every("1h30m").unwrap(), Dur::secs(5400));
        for bad in ["0s", "500ms", "1s500ms", "ten", ""] {
            let err = parse_every(bad).unwrap_err().to_string();
            assert!(err.contains("is not an interval"), "{bad}: {err}");
        }
    }

    #[test]
    fn at_parsing_in_a_zone() {
        let berlin = tz("Europe/Berlin");
        assert_eq!(parse_at("2026-11-22 09:00", &berlin).unwrap(), ts("2026-11-22T08:00:00Z"));
        assert_eq!(parse_at("2026-07-22T09:00:30", &berlin).unwrap(), ts("2026-07-22T07:00:30Z"));
        assert_eq!(parse_at("2026-11-22T09:00:00-05:00", &berlin).unwrap(), ts("2026-11-22T14:00:00Z"));
        assert_eq!(parse_at("2026-11-22T08:00:00Z", &berlin).unwrap(), ts("2026-11-22T08:00:00Z"));
        // In the spring-forward gap: an error that says why.
        let gap = parse_at("2026-03-29 02:30", &berlin).unwrap_err().to_string();
        assert!(gap.contains("does not exist"), "{gap}");
        // In the fall-back repeat: the earlier instant (CEST).
        assert_eq!(parse_at("2026-10-25 02:30", &berlin).unwrap(), ts("2026-10-25T00:30:00Z"));
        for bad in ["tomorrow", "2026-11-22", "09:00", "2026-13-01 09:00", "2026-11-22 25:00", "2026-11-22 09:00 +01"] {
            let err = parse_at(bad, &berlin).unwrap_err().to_string();
            assert!(err.contains("is not a time"), "{bad}: {err}");
        }
    }

    #[test]
    fn times_as_people_type_them() {
        let berlin = tz("Europe/Berlin");
        let now = ts("2026-11-26T15:00:00Z"); // 16:00 in Berlin
        let when = |t: &str| parse_when(t, &berlin, now);
        assert_eq!(when("+2m").unwrap(), ts("2026-11-26T15:02:00Z"));
        assert_eq!(when(" +1h30m ").unwrap(), ts("2026-11-26T16:30:00Z"));
        assert_eq!(when("16:30").unwrap(), ts("2026-11-26T15:30:00Z"), "still ahead today");
        assert_eq!(when("15:59").unwrap(), ts("2026-11-27T14:59:00Z"), "passed: tomorrow");
        assert_eq!(when("16:00").unwrap(), ts("2026-11-27T15:00:00Z"), "now is not ahead");
        assert_eq!(when("7:05:30").unwrap(), ts("2026-11-27T06:05:30Z"));
        assert_eq!(when("Tomorrow 07:00").unwrap(), ts("2026-11-27T06:00:00Z"));
        assert_eq!(when("today 18:00").unwrap(), ts("2026-11-26T17:00:00Z"));
        assert_eq!(when("2026-12-01 09:00").unwrap(), ts("2026-12-01T08:00:00Z"));
        let passed = when("today 09:00").unwrap_err().to_string();
        assert!(passed.contains("has passed"), "{passed}");
        // The night the clocks skip 02:00-03:00: tomorrow's 02:30 does not exist.
        let gap = parse_when("tomorrow 02:30", &berlin, ts("2026-03-28T12:00:00Z")).unwrap_err().to_string();
        assert!(gap.contains("does not exist"), "{gap}");
        for bad in [
            "+0s",
            "+10",
            "+",
            "+-5m",
            "+99999999999999d",
            "24:00",
            "12:60",
            "12:5",
            "1:2:3:4",
            "noon",
            "tomorrow",
            "today 7",
            "",
        ] {
            let err = when(bad).unwrap_err().to_string();
            assert!(err.contains("is not a time"), "{bad}: {err}");
        }
        assert!(when("+10").unwrap_err().to_string().contains("has no unit"));
    }

    #[test]
    fn a_stored_interval_without_a_unit_still_reads() {
        let s: Schedule =
            serde_json::from_str(r#"{"kind":"every","every":"60","anchor":"2026-01-01T00:00:00Z"}"#).unwrap();
        assert_eq!(s, every("1m", "2026-01-01T00:00:00Z"));
        let s: Schedule =
            serde_json::from_str(r#"{"kind":"every","every":90,"anchor":"2026-01-01T00:00:00Z"}"#).unwrap();
        assert_eq!(s, every("90s", "2026-01-01T00:00:00Z"));
        assert!(parse_every("60").unwrap_err().to_string().contains("`60` has no unit: did you mean `60m`?"));
    }

    #[test]
    fn serde_is_tagged_and_humane() {
        let s = every("10m", "2026-01-01T00:00:00Z");
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(json, r#"{"kind":"every","every":"10m","anchor":"2026-01-01T00:00:00Z"}"#);
        assert_eq!(serde_json::from_str::<Schedule>(&json).unwrap(), s);
        let c = parse_cron("0 9 * * *", None).unwrap();
        assert_eq!(serde_json::to_string(&c).unwrap(), r#"{"kind":"cron","expr":"0 9 * * *"}"#);
        let a: Schedule = serde_json::from_str(r#"{"kind":"at","at":"2026-11-22T08:00:00Z"}"#).unwrap();
        assert_eq!(a, Schedule::at(ts("2026-11-22T08:00:00Z")));
        let odd = Schedule::Every { every: Dur(Duration::from_millis(1500)), anchor: ts("2026-01-01T00:00:00Z") };
        let back: Schedule = serde_json::from_str(&serde_json::to_string(&odd).unwrap()).unwrap();
        assert_eq!(back, odd);
    }

    #[test]
    fn describe_reads_well() {
        let berlin = tz("Europe/Berlin");
        assert_eq!(every("10m", "2026-01-01T00:00:00Z").describe(&berlin), "every 10m (from 2026-01-01 01:00:00 CET)");
        let c = parse_cron("0 9 * * *", Some("America/New_York")).unwrap().describe(&berlin);
        assert!(c.starts_with("cron `0 9 * * *` (America/New_York): "), "{c}");
        assert_eq!(Schedule::at(ts("2026-11-22T08:00:00Z")).describe(&berlin), "once at 2026-11-22 09:00:00 CET");
    }
}
