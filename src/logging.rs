//! Logging setup: human-readable lines on stderr.
//!
//! The level comes from `RUST_LOG` when set, else `[daemon] log_level`, else
//! the command's default (`info` for the daemon, `warn` for one-shot commands
//! so their output stays clean). Secrets never reach a log line: they live in
//! [`crate::config::Secret`], whose `Debug` prints `***`.

use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Install the global subscriber. Safe to call once; later calls are ignored.
///
/// Filters are `level` or `target=level` lists (`info`, `bramble=debug,warn`):
/// `tracing_subscriber`'s `Targets`, which needs no regex engine (that would
/// add about half a megabyte to the binary for span filters nobody uses here).
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
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_target(false);
    let _ = tracing_subscriber::registry().with(fmt).with(targets).try_init();
}
