//! Logging setup: journald under systemd, human-readable lines on stderr otherwise.
//!
//! journald is used when stderr *is* the journal: `JOURNAL_STREAM` is set and
//! names the device and inode of our stderr (the check systemd documents;
//! the variable alone is inherited by children whose stderr was redirected).
//! Fields such as `job`, `session` and `channel` become journal fields
//! (`journalctl -u bramble JOB=morning`). Levels map to syslog priorities as
//! journald users expect — error 3, warn 4, info 6, debug and trace 7 — so
//! `journalctl -p info` shows what `info` shows, and `-p notice` only warnings
//! and errors (tracing-journald's default puts info at notice, 5).
//!
//! The level comes from `RUST_LOG` when set, else `[daemon] log_level`, else
//! the command's default (`info` for the daemon, `warn` for one-shot commands
//! so their output stays clean). A daemon reload applies a changed
//! `log_level` ([`set_level`]). Secrets never reach a log line: they live in
//! [`crate::config::Secret`], whose `Debug` prints `***`.
//!
//! Log lines carry text from outside (a refused command an MQTT publisher
//! asked for, a server's error): on stderr, which is often a terminal, every
//! message and field value is written with its control characters escaped
//! ([`escaped_fields`]), so an escape sequence cannot reach the terminal and
//! a newline cannot forge a log line. The journal stores fields as bytes and
//! `journalctl` shows a value with control characters as `[blob data]`
//! unless asked for `--all`: that path is left as it is.

use std::os::unix::fs::MetadataExt;

use std::sync::OnceLock;

use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, Registry};

/// The installed filter, and the command's default level, for [`set_level`].
static FILTER: OnceLock<(reload::Handle<Targets, Registry>, String)> = OnceLock::new();

/// Install the global subscriber. Safe to call once; later calls are ignored.
///
/// Filters are `level` or `target=level` lists (`info`, `bramble=debug,warn`):
/// `tracing_subscriber`'s `Targets`, which needs no regex engine (that would
/// add about 300 KB to the binary for span filters nobody uses here).
pub fn init(config_level: Option<&str>, default_level: &str) {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .or_else(|| config_level.map(str::to_string))
        .unwrap_or_else(|| default_level.to_string());
    let targets: Targets = filter.parse().unwrap_or_else(|e| {
        eprintln!(
            "bramble: warning: ignoring log filter `{filter}` ({e}); expected e.g. `info` or `bramble=debug,warn`"
        );
        default_level.parse().unwrap_or_default()
    });
    let journald = stderr_is_journal().then(|| tracing_journald::layer().ok()).flatten().map(|l| {
        l.with_syslog_identifier("bramble".into()).with_field_prefix(None).with_priority_mappings(priorities())
    });
    let fmt = journald.is_none().then(|| {
        tracing_subscriber::fmt::layer()
            .fmt_fields(escaped_fields())
            .with_writer(std::io::stderr)
            .with_target(false)
            .with_ansi(colour(
                std::io::IsTerminal::is_terminal(&std::io::stderr()),
                std::env::var_os("NO_COLOR").as_deref(),
            ))
    });
    let (targets, handle) = reload::Layer::new(targets);
    if tracing_subscriber::registry().with(targets).with(journald).with(fmt).try_init().is_ok() {
        let _ = FILTER.set((handle, default_level.to_string()));
    }
}

/// Apply `[daemon] log_level` from a reloaded config (unless `RUST_LOG` is
/// set, which wins as at start). An invalid filter keeps the current one.
pub fn set_level(config_level: Option<&str>) {
    let Some((handle, default_level)) = FILTER.get() else { return };
    if std::env::var("RUST_LOG").is_ok_and(|v| !v.trim().is_empty()) {
        return;
    }
    let filter = config_level.unwrap_or(default_level);
    match filter.parse::<Targets>() {
        Ok(targets) => {
            if let Err(e) = handle.reload(targets) {
                tracing::warn!("cannot change the log level: {e}");
            }
        }
        Err(e) => tracing::warn!("ignoring log filter `{filter}` ({e}); keeping the current one"),
    }
}

/// The fields of a stderr log line as the default formatter writes them
/// (`message key=value …`, `log.*` left out), each with its control
/// characters escaped: one event, one line, nothing a terminal would run.
fn escaped_fields() -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> + 'static {
    use tracing_subscriber::field::MakeExt;
    tracing_subscriber::fmt::format::debug_fn(|w, field, value| {
        let text = format!("{value:?}");
        let text = crate::util::text::escape_line(&text);
        match field.name() {
            "message" => write!(w, "{text}"),
            name if name.starts_with("log.") => Ok(()),
            name => write!(w, "{name}={text}"),
        }
    })
    .delimited(" ")
}

/// Colour in log lines only on a terminal, and not when `NO_COLOR` is set to
/// anything but the empty string (no-color.org): a pipe, a file or a CI log
/// gets plain text.
fn colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Each tracing level's syslog priority.
fn priorities() -> tracing_journald::PriorityMappings {
    use tracing_journald::Priority;
    tracing_journald::PriorityMappings {
        error: Priority::Error,
        warn: Priority::Warning,
        info: Priority::Informational,
        debug: Priority::Debug,
        trace: Priority::Debug,
    }
}

/// Whether stderr is connected to the journal (`JOURNAL_STREAM=<dev>:<ino>`).
pub fn stderr_is_journal() -> bool {
    is_stderr(std::env::var_os("JOURNAL_STREAM").as_deref())
}

/// Whether `stream` (a `JOURNAL_STREAM` value) names this process's stderr.
fn is_stderr(stream: Option<&std::ffi::OsStr>) -> bool {
    let Some(stream) = stream else { return false };
    let Some((dev, ino)) = stream.to_str().and_then(|s| s.split_once(':')) else { return false };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else { return false };
    // fstat(2) of stderr, through /proc to avoid unsafe code.
    std::fs::metadata("/proc/self/fd/2").is_ok_and(|m| m.dev() == dev && m.ino() == ino)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_is_detected_only_when_the_stream_is_our_stderr() {
        let m = std::fs::metadata("/proc/self/fd/2").unwrap();
        let ours = format!("{}:{}", m.dev(), m.ino());
        assert!(is_stderr(Some(ours.as_ref())));
        // Inherited by a child whose stderr went elsewhere: not the journal.
        let elsewhere = format!("{}:{}", m.dev(), m.ino() + 1);
        assert!(!is_stderr(Some(elsewhere.as_ref())));
        assert!(!is_stderr(Some("garbage".as_ref())));
        assert!(!is_stderr(None));
    }

    /// A `MakeWriter` into a shared buffer.
    #[derive(Clone, Default)]
    struct Buffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn stderr_lines_escape_control_characters() {
        let buffer = Buffer::default();
        let out = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .fmt_fields(escaped_fields())
            .with_writer(move || out.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let command = "ls \u{1b}]52;c;ZXZpbA==\u{7}\u{9b}2J";
            tracing::info!(detail = %command, session = "mqtt:x\nFAKE", "audit: exec refused: {command}\nINFO forged");
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        assert!(!text.contains(['\u{1b}', '\u{7}', '\u{9b}']), "{text:?}");
        assert_eq!(text.lines().count(), 1, "one event, one line: {text:?}");
        assert!(text.contains("audit: exec refused: ls \\x1b]52;c;ZXZpbA==\\x07\\u{9b}2J\\nINFO forged"), "{text}");
        assert!(text.contains("detail=ls \\x1b]52") && text.contains(r#"session="mqtt:x\nFAKE""#), "{text}");
    }

    #[test]
    fn colour_only_on_a_terminal_and_without_no_color() {
        assert!(colour(true, None));
        assert!(colour(true, Some("".as_ref())), "an empty NO_COLOR is unset");
        assert!(!colour(true, Some("1".as_ref())));
        assert!(!colour(false, None), "a pipe or a file");
    }
}
