//! Cron expressions as Debian's cron runs them: the fields, the day rule and
//! daylight saving time.
//!
//! croner reads the same text but decides two things differently from
//! Vixie/Debian cron (cron(8), and `cronsim` on PyPI, which follows it), and a
//! user who writes a crontab line expects cron's answer:
//!
//! - **Days.** Day-of-month and day-of-week are ANDed when either field
//!   *starts with* `*` (`*/2`, `*/7`, `*`), ORed otherwise — so the "first
//!   Sunday" idiom `0 9 1-7 * */7` runs on one day, not seven.
//! - **DST.** A job is *fixed-time* unless its minute or hour field starts
//!   with `*`. A fixed-time job's slot inside a spring-forward gap runs once,
//!   at the first instant after the gap; a slot in a repeated (fall-back) hour
//!   runs once, at its first instance. A *wildcard* job runs at the instants
//!   whose local time matches: not in the gap, twice in a repeated hour.
//!   Expressions with a seconds field are wildcard jobs (as in cronsim: they
//!   are not Debian's dialect).
//!
//! Accepted beyond plain numbers, ranges, lists and steps: month and weekday
//! names, `7` for Sunday, `?` (as `*`), `L` (last day), `LW` (last weekday),
//! `15W` (nearest weekday to the 15th), `5L` (last Friday), `5#2` (second
//! Friday), and the nicknames `@yearly` `@annually` `@monthly` `@weekly`
//! `@daily` `@midnight` `@hourly`. A range cannot wrap (`22-2`), and an
//! expression that can never fire (`0 0 30 2 *`) is refused.

use jiff::civil::{Date, DateTime, Time};
use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::{Timestamp, ToSpan};

/// Search at most this far ahead for the next occurrence (as cronsim does).
const HORIZON_YEARS: i16 = 50;
/// Longer than any clock change in the tz database (Troll's is 2 h).
const MAX_SHIFT_SECONDS: i64 = 3 * 3600;

/// A parsed cron expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CronExpr {
    seconds: u64,
    minutes: u64,
    hours: u32,
    /// Bits 1..=31.
    days: u32,
    last_day: bool,
    last_weekday: bool,
    /// `15W`: the weekday nearest to these days.
    nearest_weekday: Vec<u8>,
    months: u16,
    /// Bits 0..=6, Sunday = 0.
    weekdays: u8,
    /// `5#2`: (weekday, n).
    nth_weekdays: Vec<(u8, u8)>,
    /// `5L`: the last such weekday of the month.
    last_weekdays: u8,
    /// Day-of-month AND day-of-week (either field starts with `*`), else OR.
    day_and: bool,
    /// Debian's fixed-time job: neither the minute nor the hour starts with `*`.
    fixed: bool,
}

/// Why an expression was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CronError(pub String);

fn bad(msg: impl Into<String>) -> CronError {
    CronError(msg.into())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    Second,
    Minute,
    Hour,
    Day,
    Month,
    Weekday,
}

impl Field {
    fn name(self) -> &'static str {
        match self {
            Field::Second => "second",
            Field::Minute => "minute",
            Field::Hour => "hour",
            Field::Day => "day-of-month",
            Field::Month => "month",
            Field::Weekday => "day-of-week",
        }
    }

    fn range(self) -> (u8, u8) {
        match self {
            Field::Second | Field::Minute => (0, 59),
            Field::Hour => (0, 23),
            Field::Day => (1, 31),
            Field::Month => (1, 12),
            // 7 is Sunday too.
            Field::Weekday => (0, 7),
        }
    }

    fn names(self) -> &'static [&'static str] {
        match self {
            Field::Month => &["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"],
            Field::Weekday => &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"],
            _ => &[],
        }
    }

    fn value(self, text: &str) -> Result<u8, CronError> {
        if let Some(i) = self.names().iter().position(|n| *n == text) {
            return Ok(i as u8 + if self == Field::Month { 1 } else { 0 });
        }
        let (lo, hi) = self.range();
        let digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
        match text.parse::<u8>() {
            Ok(v) if (lo..=hi).contains(&v) && digits => Ok(v),
            // A number, but not one of this field's: name the field and its range.
            _ if digits => Err(bad(format!("{} {text} is out of range {lo}–{hi}", self.name()))),
            _ => Err(bad(format!("{} `{text}` is not a value from {lo} to {hi}", self.name()))),
        }
    }
}

/// What one field allows: a bit set, plus the day specials.
#[derive(Default)]
struct Parsed {
    bits: u64,
    last: bool,
    last_weekday: bool,
    nearest: Vec<u8>,
    nth: Vec<(u8, u8)>,
    last_of: u8,
}

fn parse_field(field: Field, text: &str) -> Result<Parsed, CronError> {
    let mut out = Parsed::default();
    for term in text.split(',') {
        parse_term(field, term, &mut out)?;
    }
    if field == Field::Weekday && out.bits & (1 << 7) != 0 {
        out.bits = (out.bits & !(1 << 7)) | 1;
    }
    Ok(out)
}

fn parse_term(field: Field, term: &str, out: &mut Parsed) -> Result<(), CronError> {
    let (lo, hi) = field.range();
    if term.is_empty() {
        return Err(bad(format!("the {} field has an empty list item", field.name())));
    }
    match (field, term) {
        (Field::Day, "L") => {
            out.last = true;
            return Ok(());
        }
        (Field::Day, "LW") => {
            out.last_weekday = true;
            return Ok(());
        }
        _ => {}
    }
    if field == Field::Day {
        if let Some(day) = term.strip_suffix('W') {
            out.nearest.push(field.value(day)?);
            return Ok(());
        }
    }
    if field == Field::Weekday {
        if let Some((day, nth)) = term.split_once('#') {
            let day = field.value(day)? % 7;
            let n = nth.parse::<u8>().ok().filter(|n| (1..=5).contains(n));
            let n = n.ok_or_else(|| bad(format!("`{term}`: the week after `#` is 1 to 5")))?;
            out.nth.push((day, n));
            return Ok(());
        }
        if let Some(day) = term.strip_suffix('L').filter(|d| !d.is_empty()) {
            out.last_of |= 1 << (field.value(day)? % 7);
            return Ok(());
        }
    }
    let (range, step) = match term.split_once('/') {
        Some((r, s)) => {
            let digits = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            let step = s.parse::<u8>().ok().filter(|n| *n > 0 && digits);
            (r, Some(step.ok_or_else(|| bad(format!("`{term}`: the step after `/` is a number from 1")))?))
        }
        None => (term, None),
    };
    let (start, end) = match range {
        "*" | "?" => (lo, if field == Field::Weekday { 6 } else { hi }),
        r => match r.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (field.value(a)?, field.value(b)?);
                if b < a {
                    return Err(bad(format!(
                        "{} range `{r}` runs backwards: a range cannot wrap around; write it as two, like `{a}-{hi},{lo}-{b}`",
                        field.name()
                    )));
                }
                (a, b)
            }
            // `5/15` means from 5 to the end, every 15.
            None if step.is_some() => (field.value(r)?, hi),
            None => {
                let v = field.value(r)?;
                (v, v)
            }
        },
    };
    let step = step.unwrap_or(1);
    let mut v = start;
    while v <= end {
        out.bits |= 1 << v;
        match v.checked_add(step) {
            Some(n) => v = n,
            None => break,
        }
    }
    Ok(())
}

/// The nicknames, as cron(8) lists them.
fn nickname(expr: &str) -> Option<&'static str> {
    Some(match expr {
        "@YEARLY" | "@ANNUALLY" => "0 0 1 1 *",
        "@MONTHLY" => "0 0 1 * *",
        "@WEEKLY" => "0 0 * * 0",
        "@DAILY" | "@MIDNIGHT" => "0 0 * * *",
        "@HOURLY" => "0 * * * *",
        _ => return None,
    })
}

fn days_in(year: i16, month: i8) -> i8 {
    Date::new(year, month, 1).map(|d| d.days_in_month()).unwrap_or(31)
}

impl CronExpr {
    /// Read `expr`: 5 fields (`min hour day-of-month month day-of-week`), 6
    /// with seconds first, or a nickname.
    pub fn parse(expr: &str) -> Result<CronExpr, CronError> {
        let upper = expr.trim().to_ascii_uppercase();
        if upper == "@REBOOT" {
            return Err(bad(
                "@reboot is not supported: bramble runs jobs by the clock. To do something when the board \
                 starts, use systemd: a unit of its own, or `ExecStartPost=` in a drop-in for bramble.service",
            ));
        }
        let text = match nickname(&upper) {
            Some(t) => t.to_string(),
            None if upper.starts_with('@') => {
                return Err(bad(format!(
                    "unknown nickname `{}`: use @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly",
                    expr.trim()
                )))
            }
            None => upper,
        };
        let parts: Vec<&str> = text.split_whitespace().collect();
        let (sec, rest) = match parts.len() {
            5 => ("0", &parts[..]),
            6 => (parts[0], &parts[1..]),
            7 => return Err(bad("7 fields (a year field) are not supported")),
            n => return Err(bad(format!("{n} field{} instead of 5 or 6", if n == 1 { "" } else { "s" }))),
        };
        let [min, hour, dom, month, dow] = [rest[0], rest[1], rest[2], rest[3], rest[4]];
        let seconds = parse_field(Field::Second, sec)?;
        let minutes = parse_field(Field::Minute, min)?;
        let hours = parse_field(Field::Hour, hour)?;
        let days = parse_field(Field::Day, dom)?;
        let months = parse_field(Field::Month, month)?;
        let weekdays = parse_field(Field::Weekday, dow)?;
        let star = |f: &str| f.starts_with('*') || f.starts_with('?');
        let cron = CronExpr {
            seconds: seconds.bits,
            minutes: minutes.bits,
            hours: hours.bits as u32,
            days: days.bits as u32,
            last_day: days.last,
            last_weekday: days.last_weekday,
            nearest_weekday: days.nearest,
            months: months.bits as u16,
            weekdays: weekdays.bits as u8,
            nth_weekdays: weekdays.nth,
            last_weekdays: weekdays.last_of,
            day_and: star(dom) || star(dow),
            fixed: parts.len() == 5 && !star(min) && !star(hour),
        };
        cron.check_can_fire()?;
        Ok(cron)
    }

    /// Refuse a day-of-month that no month of the expression has (`30 2`),
    /// when the days must match (ANDed with the weekday, or the weekday a bare `*`).
    fn check_can_fire(&self) -> Result<(), CronError> {
        let specials = self.last_day || self.last_weekday || !self.nearest_weekday.is_empty();
        if !self.day_and || specials || self.days == 0 {
            return Ok(());
        }
        let first = self.days.trailing_zeros() as i8;
        let longest = (1..=12).filter(|m| self.months & (1 << m) != 0).map(|m| days_in(2024, m)).max().unwrap_or(31);
        if first > longest {
            return Err(bad(format!(
                "this expression can never fire: day {first} does not occur in {}",
                if longest == 29 { "February".to_string() } else { "any month it names".to_string() }
            )));
        }
        Ok(())
    }

    /// Whether the day-of-month and day-of-week must both match.
    pub fn days_anded(&self) -> bool {
        self.day_and
    }

    /// Whether this is a fixed-time job in Debian's sense (see the module header).
    pub fn is_fixed_time(&self) -> bool {
        self.fixed
    }

    fn day_matches(&self, d: Date) -> bool {
        let day = d.day() as u8;
        let last = d.days_in_month() as u8;
        let dom = self.days & (1 << day) != 0
            || (self.last_day && day == last)
            || (self.last_weekday && day == last_weekday(d))
            || self.nearest_weekday.iter().any(|&n| nearest_weekday(d, n) == Some(day));
        let wd = d.weekday().to_sunday_zero_offset() as u8;
        let dow = self.weekdays & (1 << wd) != 0
            || (self.last_weekdays & (1 << wd) != 0 && day + 7 > last)
            || self.nth_weekdays.iter().any(|&(w, n)| w == wd && day.div_ceil(7) == n);
        if self.day_and {
            dom && dow
        } else {
            dom || dow
        }
    }

    /// The first civil time at or after `from` (whole seconds) that matches,
    /// within [`HORIZON_YEARS`].
    pub fn next_civil(&self, from: DateTime) -> Option<DateTime> {
        let limit = from.year().saturating_add(HORIZON_YEARS);
        let mut date = from.date();
        let mut start = Some(from.time());
        while date.year() <= limit {
            if self.months & (1 << date.month()) == 0 {
                date = date.first_of_month().checked_add(1.month()).ok()?;
                start = None;
                continue;
            }
            if self.day_matches(date) {
                if let Some(t) = self.next_time(start.unwrap_or(Time::midnight())) {
                    return Some(date.to_datetime(t));
                }
            }
            date = date.tomorrow().ok()?;
            start = None;
        }
        None
    }

    /// The last civil time at or before `from` that matches, within [`HORIZON_YEARS`].
    pub fn prev_civil(&self, from: DateTime) -> Option<DateTime> {
        let limit = from.year().saturating_sub(HORIZON_YEARS);
        let mut date = from.date();
        let mut start = Some(from.time());
        while date.year() >= limit {
            if self.months & (1 << date.month()) == 0 {
                date = date.first_of_month().yesterday().ok()?;
                start = None;
                continue;
            }
            if self.day_matches(date) {
                if let Some(t) = self.prev_time(start.unwrap_or(Time::MAX)) {
                    return Some(date.to_datetime(t));
                }
            }
            date = date.yesterday().ok()?;
            start = None;
        }
        None
    }

    /// The last time of day at or before `from` that matches, if any today.
    fn prev_time(&self, from: Time) -> Option<Time> {
        let (h0, m0, s0) = (from.hour() as u32, from.minute() as u32, from.second() as u32);
        for h in (0..=h0).rev() {
            if self.hours & (1 << h) == 0 {
                continue;
            }
            let m_from = if h == h0 { m0 } else { 59 };
            for m in (0..=m_from).rev() {
                if self.minutes & (1u64 << m) == 0 {
                    continue;
                }
                let s_to = if h == h0 && m == m0 { s0 } else { 59 };
                let mask = self.seconds & (u64::MAX >> (63 - s_to));
                if mask != 0 {
                    return Time::new(h as i8, m as i8, (63 - mask.leading_zeros()) as i8, 0).ok();
                }
            }
        }
        None
    }

    /// The last occurrence at or before `t` in `zone` (the newest slot of a
    /// missed span), by the same rules as [`next_after`](Self::next_after).
    pub fn last_at_or_before(&self, t: Timestamp, zone: &TimeZone) -> Option<Timestamp> {
        let t = Timestamp::from_second(t.as_second()).ok()?;
        let earlier = t.checked_sub(jiff::SignedDuration::from_secs(MAX_SHIFT_SECONDS)).unwrap_or(t);
        // After the clock went back, an instant before `t` can have a later local time.
        let ahead = i64::from((zone.to_offset(earlier).seconds() - zone.to_offset(t).seconds()).max(0));
        let mut civil = zone.to_datetime(t).checked_add(jiff::SignedDuration::from_secs(ahead)).ok()?;
        let mut best: Option<(Timestamp, DateTime)> = None;
        loop {
            let c = self.prev_civil(civil)?;
            if let Some((_, found_civil)) = best {
                if found_civil.duration_since(c).as_secs() > ahead {
                    break;
                }
            }
            for i in self.instants(c, zone) {
                if i <= t && best.is_none_or(|(b, _)| i > b) {
                    best = Some((i, c));
                }
            }
            if best.is_some() && ahead == 0 {
                break;
            }
            civil = c.checked_sub(jiff::SignedDuration::from_secs(1)).ok()?;
        }
        best.map(|(t, _)| t)
    }

    /// The first time of day at or after `from` that matches, if any today.
    fn next_time(&self, from: Time) -> Option<Time> {
        let (h0, m0, s0) = (from.hour() as u32, from.minute() as u32, from.second() as u32);
        for h in h0..24 {
            if self.hours & (1 << h) == 0 {
                continue;
            }
            let m_from = if h == h0 { m0 } else { 0 };
            for m in m_from..60 {
                if self.minutes & (1u64 << m) == 0 {
                    continue;
                }
                let s_from = if h == h0 && m == m0 { s0 } else { 0 };
                let mask = self.seconds & (u64::MAX << s_from) & ((1u64 << 60) - 1);
                if mask != 0 {
                    return Time::new(h as i8, m as i8, mask.trailing_zeros() as i8, 0).ok();
                }
            }
        }
        None
    }

    /// The first occurrence strictly after `after` in `zone`, by Debian's
    /// rules for daylight saving time (see the module header).
    pub fn next_after(&self, after: Timestamp, zone: &TimeZone) -> Option<Timestamp> {
        // Whole seconds: the first candidate is the next whole second.
        let floor = Timestamp::from_second(after.as_second()).ok()?;
        let first = floor.checked_add(jiff::SignedDuration::from_secs(1)).ok()?;
        // An instant after a clock goes back can have an earlier local time: look back that far.
        let back = zone_goes_back_within(zone, after);
        let mut civil = zone.to_datetime(first).checked_sub(jiff::SignedDuration::from_secs(back)).ok()?;
        let mut best: Option<(Timestamp, DateTime)> = None;
        loop {
            let c = self.next_civil(civil)?;
            if let Some((_, found_civil)) = best {
                if c.duration_since(found_civil).as_secs() > back {
                    break;
                }
            }
            for t in self.instants(c, zone) {
                if t > after && best.is_none_or(|(b, _)| t < b) {
                    best = Some((t, c));
                }
            }
            if best.is_some() && back == 0 {
                break;
            }
            civil = c.checked_add(jiff::SignedDuration::from_secs(1)).ok()?;
        }
        best.map(|(t, _)| t)
    }

    /// The instants at which the civil time `c` runs in `zone`.
    fn instants(&self, c: DateTime, zone: &TimeZone) -> Vec<Timestamp> {
        let amb = zone.to_ambiguous_timestamp(c);
        match amb.offset() {
            AmbiguousOffset::Unambiguous { offset } => offset.to_timestamp(c).ok().into_iter().collect(),
            AmbiguousOffset::Fold { before, .. } if self.fixed => before.to_timestamp(c).ok().into_iter().collect(),
            AmbiguousOffset::Fold { before, after } => {
                [before, after].iter().filter_map(|o| o.to_timestamp(c).ok()).collect()
            }
            // A fixed-time slot in the gap runs when the gap ends: the first
            // whole minute after it that exists (cron checks minutes).
            AmbiguousOffset::Gap { .. } if self.fixed => {
                let mut m = c.with().second(0).build().unwrap_or(c);
                for _ in 0..(MAX_SHIFT_SECONDS / 60) {
                    m = match m.checked_add(jiff::SignedDuration::from_mins(1)) {
                        Ok(m) => m,
                        Err(_) => return Vec::new(),
                    };
                    if let AmbiguousOffset::Unambiguous { offset } = zone.to_ambiguous_timestamp(m).offset() {
                        return offset.to_timestamp(m).ok().into_iter().collect();
                    }
                }
                Vec::new()
            }
            AmbiguousOffset::Gap { .. } => Vec::new(),
        }
    }
}

/// How far back the local clock jumps at a transition in the hours after
/// `t` (0 when it does not): an instant after such a change has an earlier
/// local time than `t`, so [`CronExpr::next_after`] looks back that far.
fn zone_goes_back_within(zone: &TimeZone, t: Timestamp) -> i64 {
    let later = t.checked_add(jiff::SignedDuration::from_secs(MAX_SHIFT_SECONDS)).unwrap_or(t);
    i64::from((zone.to_offset(t).seconds() - zone.to_offset(later).seconds()).max(0))
}

fn last_weekday(d: Date) -> u8 {
    let last = d.last_of_month();
    let back = match last.weekday() {
        jiff::civil::Weekday::Saturday => 1,
        jiff::civil::Weekday::Sunday => 2,
        _ => 0,
    };
    (last.day() - back) as u8
}

/// The weekday nearest to day `n` of `d`'s month, within the month (Quartz's `W`).
fn nearest_weekday(d: Date, n: u8) -> Option<u8> {
    let target = d.first_of_month().checked_add(((n as i64) - 1).days()).ok()?;
    if target.month() != d.month() {
        return None;
    }
    let last = d.days_in_month() as u8;
    Some(match target.weekday() {
        jiff::civil::Weekday::Saturday if n == 1 => 3,
        jiff::civil::Weekday::Saturday => n - 1,
        jiff::civil::Weekday::Sunday if n == last => n - 2,
        jiff::civil::Weekday::Sunday => n + 1,
        _ => n,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn berlin() -> TimeZone {
        TimeZone::get("Europe/Berlin").unwrap()
    }

    /// The next `n` runs after `from` (RFC 3339), as `HH:MM+offset` local times.
    fn runs(expr: &str, zone: &TimeZone, from: &str, n: usize) -> Vec<String> {
        let cron = CronExpr::parse(expr).unwrap();
        let mut t: Timestamp = from.parse().unwrap();
        let mut out = Vec::new();
        for _ in 0..n {
            t = cron.next_after(t, zone).unwrap();
            out.push(t.to_zoned(zone.clone()).strftime("%d %H:%M%:z").to_string());
        }
        out
    }

    #[test]
    fn a_range_in_the_hour_is_a_fixed_time_job_across_both_changes() {
        // Fall back (2026-10-25, 03:00 CEST -> 02:00 CET): 02:30 runs once, at its first instance.
        assert_eq!(
            runs("30 1-3 * * *", &berlin(), "2026-10-24T22:00:00Z", 4),
            ["25 01:30+02:00", "25 02:30+02:00", "25 03:30+01:00", "26 01:30+01:00"]
        );
        // Spring forward (2026-03-29, 02:00 CET -> 03:00 CEST): the skipped 02:30 runs at 03:00.
        assert_eq!(
            runs("30 1-3 * * *", &berlin(), "2026-03-28T23:00:00Z", 4),
            ["29 01:30+01:00", "29 03:00+02:00", "29 03:30+02:00", "30 01:30+02:00"]
        );
        // Two slots in the gap run once.
        assert_eq!(runs("0,30 2 * * *", &berlin(), "2026-03-28T23:00:00Z", 2), ["29 03:00+02:00", "30 02:00+02:00"]);
    }

    #[test]
    fn a_wildcard_job_runs_at_the_local_times_that_exist() {
        assert_eq!(
            runs("*/30 * * * *", &berlin(), "2026-10-24T23:50:00Z", 5),
            ["25 02:00+02:00", "25 02:30+02:00", "25 02:00+01:00", "25 02:30+01:00", "25 03:00+01:00"]
        );
        assert_eq!(runs("30 * * * *", &berlin(), "2026-03-29T00:00:00Z", 2), ["29 01:30+01:00", "29 03:30+02:00"]);
        // Fixed hour, wildcard minute: no run in the gap.
        assert_eq!(runs("*/30 2 * * *", &berlin(), "2026-03-28T23:00:00Z", 1), ["30 02:00+02:00"]);
        // From inside the first instance of the repeated hour, the second comes next.
        assert_eq!(runs("0 * * * *", &berlin(), "2026-10-25T00:40:00Z", 2), ["25 02:00+01:00", "25 03:00+01:00"]);
    }

    #[test]
    fn half_hour_changes_lord_howe() {
        let lh = TimeZone::get("Australia/Lord_Howe").unwrap();
        // Spring (2026-10-04, 02:00 +10:30 -> 02:30 +11:00): 02:30 exists, 02:00 does not.
        assert_eq!(
            runs("30 * * * *", &lh, "2026-10-03T14:00:00Z", 3),
            ["04 01:30+10:30", "04 02:30+11:00", "04 03:30+11:00"]
        );
        assert_eq!(runs("0 2 * * *", &lh, "2026-10-03T14:00:00Z", 2), ["04 02:30+11:00", "05 02:00+11:00"]);
        // Autumn (2026-04-05, 02:00 +11:00 -> 01:30 +10:30): 01:30-01:59 twice for a wildcard job.
        assert_eq!(
            runs("30 * * * *", &lh, "2026-04-04T13:00:00Z", 4),
            ["05 00:30+11:00", "05 01:30+11:00", "05 01:30+10:30", "05 02:30+10:30"]
        );
        assert_eq!(runs("45 1 * * *", &lh, "2026-04-04T13:00:00Z", 2), ["05 01:45+11:00", "06 01:45+10:30"]);
        assert_eq!(runs("*/15 2 * * *", &lh, "2026-04-04T13:00:00Z", 2), ["05 02:00+10:30", "05 02:15+10:30"]);
    }

    #[test]
    fn the_last_slot_at_or_before_follows_the_same_rules() {
        let cron = CronExpr::parse("45 * * * *").unwrap();
        // 02:10 CET, in the repeated hour: the newest slot is 02:45 CEST, 25 minutes before.
        let t: Timestamp = "2026-10-25T01:10:00Z".parse().unwrap();
        assert_eq!(cron.last_at_or_before(t, &berlin()).unwrap(), "2026-10-25T00:45:00Z".parse().unwrap());
        let fixed = CronExpr::parse("30 2 * * *").unwrap();
        let t: Timestamp = "2026-03-29T01:10:00Z".parse().unwrap(); // 03:10 CEST
        assert_eq!(fixed.last_at_or_before(t, &berlin()).unwrap(), "2026-03-29T01:00:00Z".parse().unwrap());
        let every: Timestamp = "2026-06-01T10:00:07Z".parse().unwrap();
        let secs = CronExpr::parse("*/5 * * * * *").unwrap();
        assert_eq!(secs.last_at_or_before(every, &TimeZone::UTC).unwrap(), "2026-06-01T10:00:05Z".parse().unwrap());
        assert_eq!(secs.next_after(every, &TimeZone::UTC).unwrap(), "2026-06-01T10:00:10Z".parse().unwrap());
    }

    #[test]
    fn days_are_anded_when_either_field_starts_with_a_star() {
        // The "first Sunday" idiom: */7 is Sunday only, and it starts with `*`.
        let utc = TimeZone::UTC;
        assert_eq!(runs("1 1 1-7 * */7", &utc, "2026-11-01T02:00:00Z", 2), ["06 01:01+00:00", "03 01:01+00:00"]);
        // Both plain: either day.
        assert_eq!(
            runs("0 9 13 * 5", &utc, "2026-11-01T00:00:00Z", 3),
            ["06 09:00+00:00", "13 09:00+00:00", "20 09:00+00:00"]
        );
        // `*/100,1-7` starts with `*`: the first Monday only (1 November 2026 is a Sunday).
        assert_eq!(runs("0 9 */100,1-7 * 1", &utc, "2026-11-01T00:00:00Z", 2), ["02 09:00+00:00", "07 09:00+00:00"]);
        assert!(CronExpr::parse("0 9 1-7 * */7").unwrap().day_and);
        assert!(!CronExpr::parse("0 9 1-7 * 0").unwrap().day_and);
    }

    #[test]
    fn specials_names_and_nicknames() {
        let utc = TimeZone::UTC;
        assert_eq!(runs("@midnight", &utc, "2026-11-01T10:00:00Z", 1), ["02 00:00+00:00"]);
        assert_eq!(runs("0 12 L * *", &utc, "2026-02-01T00:00:00Z", 1), ["28 12:00+00:00"]);
        assert_eq!(runs("0 12 * * 5L", &utc, "2026-11-01T00:00:00Z", 1), ["27 12:00+00:00"]);
        assert_eq!(runs("0 12 * * FRI#2", &utc, "2026-11-01T00:00:00Z", 1), ["13 12:00+00:00"]);
        assert_eq!(runs("0 12 LW * *", &utc, "2026-05-01T00:00:00Z", 1), ["29 12:00+00:00"]);
        assert_eq!(runs("0 12 15W * *", &utc, "2026-11-01T00:00:00Z", 1), ["16 12:00+00:00"]);
        assert_eq!(runs("0 9 * jan-mar mon-fri", &utc, "2026-11-01T00:00:00Z", 1), ["01 09:00+00:00"]);
        assert_eq!(runs("0 9 * * 7", &utc, "2026-11-02T00:00:00Z", 1), ["08 09:00+00:00"]);
    }

    #[test]
    fn what_cannot_work_is_refused_with_the_fix() {
        let err = |e: &str| CronExpr::parse(e).unwrap_err().0;
        assert!(err("@reboot").contains("@reboot is not supported"), "{}", err("@reboot"));
        assert!(
            err("0 0 30 2 *").contains("can never fire: day 30 does not occur in February"),
            "{}",
            err("0 0 30 2 *")
        );
        assert!(err("0 22-2 * * *").contains("`22-23,0-2`"), "{}", err("0 22-2 * * *"));
        assert!(err("+5 * * * *").contains("minute `+5`"), "{}", err("+5 * * * *"));
        assert!(err("0 0 * * * 2026 x").contains("7 fields"));
        assert!(err("* * *").contains("3 fields"));
        assert!(err("*/0 * * * *").contains("step"));
        assert!(err("@fortnightly").contains("unknown nickname"));
        // A number outside its field: the field and its range, by name.
        assert_eq!(err("61 * * * *"), "minute 61 is out of range 0–59");
        assert_eq!(err("0 24 * * *"), "hour 24 is out of range 0–23");
        assert_eq!(err("0 9 32 * *"), "day-of-month 32 is out of range 1–31");
        assert_eq!(err("0 9 * 13 *"), "month 13 is out of range 1–12");
        assert_eq!(err("0 9 * * 8"), "day-of-week 8 is out of range 0–7");
        assert_eq!(err("0 999 * * *"), "hour 999 is out of range 0–23");
        assert_eq!(err("0-70 9 * * *"), "minute 70 is out of range 0–59");
        // OR'd days make day 30 reachable through the weekday.
        assert!(CronExpr::parse("0 0 30 2 1").is_ok());
        assert!(CronExpr::parse("0 0 ? * mon").is_ok());
    }
}
