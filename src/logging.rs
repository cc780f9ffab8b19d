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
//! Without systemd (a shell, tmux, cron `@reboot`) nothing keeps stderr:
//! `[daemon] log_file` makes `bramble run` append its lines to a file as
//! well ([`LogFile`]: mode 0600, created with its directory, renamed to
//! `<file>.1` at [`LOG_FILE_CAP`] so an SD card never fills with it); stderr
//! then gets them only when it is a terminal (cron would mail them).
//!
//! Log lines carry text from outside (a refused command an MQTT publisher
//! asked for, a server's error): on stderr, which is often a terminal, every
//! message and field value is written with its control characters escaped
//! ([`escaped_fields`]), so an escape sequence cannot reach the terminal and
//! a newline cannot forge a log line. The journal stores fields as bytes and
//! `journalctl` shows a value with control characters as `[blob data]`
//! unless asked for `--all`: that path is left as it is.

use std::fs::File;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

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
///
/// `log_file`: also append every line to this file ([`LogFile`]); stderr then
/// gets them only when it is a terminal. A file that cannot be opened is
/// said on stderr, and logging goes on without it.
pub fn init(config_level: Option<&str>, default_level: &str, log_file: Option<&Path>) {
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
    let file = log_file.and_then(|path| match LogFile::open(path) {
        Ok(file) => Some(file),
        Err(e) => {
            eprintln!("bramble: warning: cannot write the log file {} ([daemon] log_file): {e}", path.display());
            None
        }
    });
    let has_file = file.is_some();
    let to_file = file.map(|file| {
        tracing_subscriber::fmt::layer()
            .fmt_fields(escaped_fields())
            .with_writer(file)
            .with_target(false)
            .with_ansi(false)
    });
    let stderr_terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = (journald.is_none() && (!has_file || stderr_terminal)).then(|| {
        tracing_subscriber::fmt::layer()
            .fmt_fields(escaped_fields())
            .with_writer(std::io::stderr)
            .with_target(false)
            .with_ansi(colour(stderr_terminal, std::env::var_os("NO_COLOR").as_deref()))
    });
    let (targets, handle) = reload::Layer::new(targets);
    if tracing_subscriber::registry().with(targets).with(journald).with(fmt).with(to_file).try_init().is_ok() {
        let _ = FILTER.set((handle, default_level.to_string()));
    }
}

/// A log file grows to this size, then becomes `<file>.1` (the one before
/// it is dropped): at most twice this on the disk.
pub const LOG_FILE_CAP: u64 = 10 * 1024 * 1024;

/// `[daemon] log_file`: appended to, 0600, rotated at [`LOG_FILE_CAP`].
/// Each event is one `write` (the formatter writes a whole line at once), so
/// a line is never split between two files.
pub struct LogFile {
    path: PathBuf,
    /// The open file and its length; `None` after a failed rotation (the
    /// next line tries to open it again).
    state: Mutex<Option<(File, u64)>>,
    cap: u64,
}

impl LogFile {
    /// Open (or create, with its directory, 0700) `path` for appending, mode 0600.
    pub fn open(path: &Path) -> std::io::Result<LogFile> {
        LogFile::with_cap(path, LOG_FILE_CAP)
    }

    fn with_cap(path: &Path, cap: u64) -> std::io::Result<LogFile> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        }
        let file = open_append(path)?;
        let len = file.metadata()?.len();
        Ok(LogFile { path: path.to_path_buf(), state: Mutex::new(Some((file, len))), cap })
    }

    /// Append `line`, first moving a full file to `<file>.1`.
    fn append(&self, line: &[u8]) -> std::io::Result<()> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let full = state.as_ref().is_some_and(|(_, len)| *len > 0 && len + line.len() as u64 > self.cap);
        if full || state.is_none() {
            *state = None;
            if full {
                let mut old = self.path.clone().into_os_string();
                old.push(".1");
                std::fs::rename(&self.path, old)?;
            }
            let file = open_append(&self.path)?;
            let len = file.metadata()?.len();
            *state = Some((file, len));
        }
        let Some((file, len)) = state.as_mut() else { return Ok(()) };
        file.write_all(line)?;
        *len += line.len() as u64;
        Ok(())
    }
}

/// `path` opened for appending, created 0600; an existing file is set to 0600 too.
fn open_append(path: &Path) -> std::io::Result<File> {
    let file = std::fs::OpenOptions::new().append(true).create(true).mode(0o600).open(path)?;
    if file.metadata()?.permissions().mode() & 0o777 != 0o600 {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(file)
}

/// One event's line, written to a [`LogFile`] at once.
pub struct LogLine<'a>(&'a LogFile);

impl std::io::Write for LogLine<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.append(buf)?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogFile {
    type Writer = LogLine<'a>;
    fn make_writer(&'a self) -> LogLine<'a> {
        LogLine(self)
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
    fn the_log_file_is_private_appended_to_and_rotated_at_its_cap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("logs/deeper/bramble.log");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "from before\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let file = LogFile::with_cap(&path, 40).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600, "made private");
        file.append(b"line one\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "from before\nline one\n", "appended");
        file.append(b"a line that does not fit any more\n").unwrap();
        let old = std::fs::read_to_string(dir.path().join("logs/deeper/bramble.log.1")).unwrap();
        assert_eq!(old, "from before\nline one\n");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a line that does not fit any more\n");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        // A line longer than the cap still goes into a file of its own; only one `.1` is kept.
        file.append(&[b'x'; 100]).unwrap();
        assert_eq!(std::fs::read(&path).unwrap().len(), 100);
        assert!(std::fs::read_to_string(dir.path().join("logs/deeper/bramble.log.1")).unwrap().starts_with("a line"));
        assert!(!dir.path().join("logs/deeper/bramble.log.2").exists());
        // A directory that does not exist yet is created, private.
        let fresh = dir.path().join("new/dir/b.log");
        LogFile::open(&fresh).unwrap();
        assert_eq!(std::fs::metadata(fresh.parent().unwrap()).unwrap().permissions().mode() & 0o777, 0o700);
    }

    #[test]
    fn colour_only_on_a_terminal_and_without_no_color() {
        assert!(colour(true, None));
        assert!(colour(true, Some("".as_ref())), "an empty NO_COLOR is unset");
        assert!(!colour(true, Some("1".as_ref())));
        assert!(!colour(false, None), "a pipe or a file");
    }
}
