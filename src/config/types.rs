//! Value types of the config file that validate themselves while they are read.
//!
//! Each one implements `Deserialize` by parsing a string and failing with a
//! sentence that says what was expected. Because the check happens inside
//! deserialization, the TOML reader attaches the span of the offending value and
//! `bramble check` can point at `FILE:LINE:COL` — no second pass that has lost
//! the positions.

use std::fmt;
use std::net::IpAddr;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// A humane duration: `90s`, `10m`, `2h`, `1d`, `1h30m`, `500ms`. A number
/// without a unit is refused (earlier versions read it as seconds, which
/// surprised everyone who meant minutes); `0` alone is zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Dur(pub Duration);

impl Dur {
    pub const fn secs(s: u64) -> Dur {
        Dur(Duration::from_secs(s))
    }
    pub fn get(self) -> Duration {
        self.0
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = self.0.as_secs();
        let ms = self.0.subsec_millis();
        if s == 0 && ms > 0 {
            return write!(f, "{ms}ms");
        }
        if s == 0 {
            return f.write_str("0s");
        }
        for (unit, len) in [("d", 86_400), ("h", 3600), ("m", 60), ("s", 1)] {
            if s >= len {
                write!(f, "{}{unit}", s / len)?;
                s %= len;
            }
        }
        Ok(())
    }
}

impl FromStr for Dur {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "`{text}` is not a duration: expected a number with a unit, like `90s`, `10m`, `2h`, `1d` or `1h30m`"
            )
        };
        let t = text.trim();
        if t.is_empty() {
            return Err(bad());
        }
        if t.bytes().all(|b| b.is_ascii_digit()) {
            return match t.trim_start_matches('0') {
                "" => Ok(Dur::secs(0)),
                _ => Err(no_unit(t)),
            };
        }
        let mut total = Duration::ZERO;
        let mut rest = t;
        while !rest.is_empty() {
            let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
            if digits == 0 {
                return Err(bad());
            }
            let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
            rest = &rest[digits..];
            let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
            let unit = rest[..unit_len].trim();
            rest = &rest[unit_len..];
            let part = match unit {
                "ms" => Duration::from_millis(n),
                "s" | "sec" | "secs" => Duration::from_secs(n),
                "m" | "min" | "mins" => Duration::from_secs(n.saturating_mul(60)),
                "h" | "hr" | "hrs" => Duration::from_secs(n.saturating_mul(3600)),
                "d" | "day" | "days" => Duration::from_secs(n.saturating_mul(86_400)),
                "w" => Duration::from_secs(n.saturating_mul(7 * 86_400)),
                _ => return Err(bad()),
            };
            total = total.saturating_add(part);
        }
        Ok(Dur(total))
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Text(String),
        }
        match Raw::deserialize(d).map_err(|_: D::Error| {
            serde::de::Error::custom("expected a duration like \"90s\", \"10m\", \"2h\" or \"1d\"")
        })? {
            Raw::Int(0) => Ok(Dur::secs(0)),
            Raw::Int(n) => Err(serde::de::Error::custom(format!(
                "{}; write it in quotes with its unit, like `\"{n}m\"`",
                no_unit(&n.to_string())
            ))),
            Raw::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// The refusal of a number without a unit (`10`).
fn no_unit(n: &str) -> String {
    format!("`{n}` has no unit: did you mean `{n}m`? (a duration needs its unit: `{n}s`, `{n}m`, `{n}h`, `{n}d`)")
}

/// An IANA time zone name (`Europe/Berlin`), checked against the system's tz database.
#[derive(Clone)]
pub struct TzName {
    name: String,
    tz: jiff::tz::TimeZone,
}

impl TzName {
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn tz(&self) -> &jiff::tz::TimeZone {
        &self.tz
    }
    /// The system's zone (`/etc/localtime`, `TZ`), falling back to UTC.
    ///
    /// jiff finds the zone's name through its database, whose first use lists
    /// the whole zoneinfo tree (two dozen directories, ~600 names): a quarter
    /// of a millisecond of every CLI command. The common case, no `TZ` and
    /// `/etc/localtime` a link into a zoneinfo directory, is read directly.
    pub fn system() -> TzName {
        if std::env::var_os("TZ").is_none() {
            if let Some(tz) = TzName::from_link(Path::new("/etc/localtime")) {
                return tz;
            }
        }
        let tz = jiff::tz::TimeZone::try_system().unwrap_or(jiff::tz::TimeZone::UTC);
        let name = tz.iana_name().unwrap_or("UTC").to_string();
        TzName { name, tz }
    }

    /// The zone a link such as `/etc/localtime -> /usr/share/zoneinfo/Europe/Berlin`
    /// points to, named as jiff names it (what follows `zoneinfo/`).
    fn from_link(link: &Path) -> Option<TzName> {
        let target = std::fs::read_link(link).ok()?;
        let target = target.to_str()?;
        let name = &target[target.rfind("zoneinfo/")? + "zoneinfo/".len()..];
        if name.is_empty() || name.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
            return None;
        }
        let tz = jiff::tz::TimeZone::tzif(name, &std::fs::read(link).ok()?).ok()?;
        Some(TzName { name: name.to_string(), tz })
    }
}

impl fmt::Debug for TzName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TzName({})", self.name)
    }
}

impl PartialEq for TzName {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl FromStr for TzName {
    type Err = String;
    fn from_str(name: &str) -> Result<Self, String> {
        let name = name.trim();
        match jiff::tz::TimeZone::get(name) {
            Ok(tz) => Ok(TzName { name: name.to_string(), tz }),
            Err(_) => Err(format!(
                "`{name}` is not a known time zone: expected an IANA name like `Europe/Berlin`, `America/New_York` or `UTC` (is the tzdata package installed?)"
            )),
        }
    }
}

impl<'de> Deserialize<'de> for TzName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A secret value (API key, bot token, password). Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// An address range: `192.168.1.0/24`, `10.0.0.5` (one host), `fd00::/8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            (IpAddr::V6(_), IpAddr::V4(ip)) => self.contains(IpAddr::V6(ip.to_ipv6_mapped())),
            (IpAddr::V4(_), IpAddr::V6(ip)) => ip.to_ipv4_mapped().is_some_and(|v4| self.contains(IpAddr::V4(v4))),
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl FromStr for Cidr {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        let bad =
            || format!("`{text}` is not an address range: expected CIDR like `192.168.1.0/24` or a single address");
        let (addr, prefix) = match text.trim().split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text.trim(), None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p.parse::<u8>().ok().filter(|p| *p <= max).ok_or_else(bad)?,
            None => max,
        };
        Ok(Cidr { addr, prefix })
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// A daily window in local time, `23:00-07:00` (may wrap past midnight).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuietHours {
    /// Minutes after midnight.
    pub start: u16,
    pub end: u16,
}

impl QuietHours {
    /// Whether `minute_of_day` (0..1440) falls inside the window.
    pub fn contains(&self, minute_of_day: u16) -> bool {
        if self.start <= self.end {
            (self.start..self.end).contains(&minute_of_day)
        } else {
            minute_of_day >= self.start || minute_of_day < self.end
        }
    }
}

impl FromStr for QuietHours {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || format!("`{text}` is not a time window: expected `HH:MM-HH:MM`, like `23:00-07:00`");
        let (a, b) = text.split_once('-').ok_or_else(bad)?;
        let hm = |s: &str| -> Option<u16> {
            let (h, m) = s.trim().split_once(':')?;
            let (h, m): (u16, u16) = (h.parse().ok()?, m.parse().ok()?);
            (h < 24 && m < 60).then_some(h * 60 + m)
        };
        Ok(QuietHours { start: hm(a).ok_or_else(bad)?, end: hm(b).ok_or_else(bad)? })
    }
}

impl<'de> Deserialize<'de> for QuietHours {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// An `http://` or `https://` URL with a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpUrl(pub String);

impl HttpUrl {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for HttpUrl {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        let url = reqwest::Url::parse(text.trim())
            .map_err(|e| format!("`{text}` is not a URL ({e}): expected something like `https://api.openai.com/v1`"))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(format!("`{text}` must be an http:// or https:// URL with a host"));
        }
        Ok(HttpUrl(text.trim().trim_end_matches('/').to_string()))
    }
}

impl<'de> Deserialize<'de> for HttpUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// `[provider] context_window`: how many tokens the model reads at most
/// (prompt and answer together). A plain integer; below 512 no prompt fits
/// and above 10 million no model exists, so both are refused as typos.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ContextWindow(pub u32);

impl ContextWindow {
    /// The smallest and the largest window accepted, from the config or a server.
    pub const MIN: u32 = 512;
    pub const MAX: u32 = 10_000_000;

    /// `tokens` if it is a believable window.
    pub fn checked(tokens: u64) -> Option<ContextWindow> {
        u32::try_from(tokens).ok().filter(|t| (Self::MIN..=Self::MAX).contains(t)).map(ContextWindow)
    }

    pub fn get(self) -> u32 {
        self.0
    }
}

impl<'de> Deserialize<'de> for ContextWindow {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = i64::deserialize(d)
            .map_err(|_: D::Error| serde::de::Error::custom("expected a number of tokens, like 8192 (no quotes)"))?;
        u64::try_from(n).ok().and_then(ContextWindow::checked).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "`{n}` is not a context window: expected tokens between {} and {}, like 8192",
                ContextWindow::MIN,
                ContextWindow::MAX
            ))
        })
    }
}

/// `[agent] profile`: how much the prompt carries. `lean` is for small local
/// models: the fewest tools for the task, one-line descriptions, compact
/// schemas, shorter bootstrap files. Unset: `lean` when the context window
/// is at most [`Profile::LEAN_WINDOW`] tokens, else `default`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    #[default]
    Default,
    Lean,
}

impl Profile {
    /// The window at or below which an unset profile is `lean`.
    pub const LEAN_WINDOW: u32 = 8192;

    /// The profile for `setting` (the config's) and a known `window`.
    pub fn choose(setting: Option<Profile>, window: Option<u32>) -> Profile {
        match (setting, window) {
            (Some(p), _) => p,
            (None, Some(w)) if w <= Self::LEAN_WINDOW => Profile::Lean,
            (None, _) => Profile::Default,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Profile::Default => "default",
            Profile::Lean => "lean",
        }
    }
}

/// `[provider] text_tool_calls`: what becomes of a tool call the model wrote
/// in its answer's text instead of the API's `tool_calls` (bare JSON, a
/// fenced block, `<tool_call>` tags). `recover`: taken as the call when it
/// names an offered tool with valid arguments; `off`: it stays text (to
/// measure a model as it is, or for a model that quotes JSON on purpose).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TextToolCalls {
    #[default]
    Recover,
    Off,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_humanely() {
        assert_eq!("90s".parse::<Dur>().unwrap(), Dur::secs(90));
        assert_eq!("10m".parse::<Dur>().unwrap(), Dur::secs(600));
        assert_eq!("2h".parse::<Dur>().unwrap(), Dur::secs(7200));
        assert_eq!("1d".parse::<Dur>().unwrap(), Dur::secs(86_400));
        assert_eq!("1h30m".parse::<Dur>().unwrap(), Dur::secs(5400));
        let e = "45".parse::<Dur>().unwrap_err();
        assert!(e.starts_with("`45` has no unit: did you mean `45m`?"), "{e}");
        assert_eq!("0".parse::<Dur>().unwrap(), Dur::secs(0));
        assert_eq!("250ms".parse::<Dur>().unwrap(), Dur(Duration::from_millis(250)));
        for bad in ["", "m", "10x", "ten minutes", "-5s", "1.5h"] {
            assert!(bad.parse::<Dur>().is_err(), "{bad}");
        }
        assert_eq!(Dur::secs(5400).to_string(), "1h30m");
        assert_eq!(Dur::secs(0).to_string(), "0s");
    }

    #[test]
    fn time_zones_are_checked() {
        assert_eq!("UTC".parse::<TzName>().unwrap().name(), "UTC");
        assert!("Europe/Berlin".parse::<TzName>().is_ok());
        let err = "Mars/Olympus".parse::<TzName>().unwrap_err();
        assert!(err.contains("not a known time zone"), "{err}");
    }

    #[test]
    fn the_system_zone_is_read_from_its_link_as_jiff_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("localtime");
        std::os::unix::fs::symlink("/usr/share/zoneinfo/Europe/Berlin", &link).unwrap();
        let berlin = TzName::from_link(&link).expect("tzdata is installed");
        assert_eq!(berlin.name(), "Europe/Berlin");
        let jiffs = jiff::tz::TimeZone::get("Europe/Berlin").unwrap();
        for t in [0, 1_700_000_000, 1_711_846_800, 1_729_990_800] {
            let t = jiff::Timestamp::from_second(t).unwrap();
            assert_eq!(berlin.tz().to_offset(t), jiffs.to_offset(t), "{t}");
        }
        // Not a link, a link out of any zoneinfo tree, or a name that climbs out: jiff's way.
        let file = dir.path().join("plain");
        std::fs::write(&file, "x").unwrap();
        assert!(TzName::from_link(&file).is_none());
        for target in ["/etc/hostname", "/usr/share/zoneinfo/Europe/../../../../etc/hostname", "/usr/share/zoneinfo/"] {
            let other = dir.path().join("other");
            let _ = std::fs::remove_file(&other);
            std::os::unix::fs::symlink(target, &other).unwrap();
            assert!(TzName::from_link(&other).is_none(), "{target}");
        }
        assert!(!TzName::system().name().is_empty());
    }

    #[test]
    fn cidr_matching() {
        let lan: Cidr = "192.168.1.0/24".parse().unwrap();
        assert!(lan.contains("192.168.1.77".parse().unwrap()));
        assert!(!lan.contains("192.168.2.1".parse().unwrap()));
        assert!(lan.contains("::ffff:192.168.1.9".parse().unwrap()));
        let host: Cidr = "10.0.0.5".parse().unwrap();
        assert!(host.contains("10.0.0.5".parse().unwrap()));
        assert!(!host.contains("10.0.0.6".parse().unwrap()));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("8.8.8.8".parse().unwrap()));
        let v6: Cidr = "fd00::/8".parse().unwrap();
        assert!(v6.contains("fd12::1".parse().unwrap()));
        assert!("192.168.1.0/33".parse::<Cidr>().is_err());
        assert!("lan".parse::<Cidr>().is_err());
    }

    #[test]
    fn quiet_hours_wrap_midnight() {
        let q: QuietHours = "23:00-07:00".parse().unwrap();
        assert!(q.contains(23 * 60 + 30));
        assert!(q.contains(3 * 60));
        assert!(!q.contains(7 * 60));
        assert!(!q.contains(12 * 60));
        let day: QuietHours = "12:00-13:00".parse().unwrap();
        assert!(day.contains(12 * 60 + 59));
        assert!(!day.contains(13 * 60));
        assert!("25:00-07:00".parse::<QuietHours>().is_err());
        assert!("late".parse::<QuietHours>().is_err());
    }

    #[test]
    fn context_windows_and_profiles() {
        #[derive(Deserialize)]
        struct W {
            w: ContextWindow,
        }
        let w = |t: &str| toml::from_str::<W>(&format!("w = {t}")).map(|w| w.w.get()).map_err(|e| e.to_string());
        assert_eq!(w("8192"), Ok(8192));
        for bad in ["0", "-1", "100", "99999999999", "\"8k\"", "8192.5"] {
            assert!(w(bad).is_err(), "{bad}");
        }
        assert!(w("1").unwrap_err().contains("between 512 and 10000000"));
        assert_eq!(Profile::choose(None, Some(8192)), Profile::Lean);
        assert_eq!(Profile::choose(None, Some(8193)), Profile::Default);
        assert_eq!(Profile::choose(None, None), Profile::Default);
        assert_eq!(Profile::choose(Some(Profile::Default), Some(2048)), Profile::Default);
        assert_eq!(Profile::choose(Some(Profile::Lean), Some(128_000)), Profile::Lean);
    }

    #[test]
    fn secrets_do_not_debug_print() {
        assert_eq!(format!("{:?}", Secret::new("sk-123")), "Secret(***)");
    }
}
