//! Logging setup: human-readable lines on stderr.
//!
//! The level comes from `RUST_LOG` when set, else `[daemon] log_level`, else
//! the command's default (`info` for the daemon, `warn` for one-shot commands
//! so their output stays clean). Secrets never reach a log line: they live in
//! [`crate::config::Secret`], whose `Debug` prints `***`.

use tracing_subscriber::EnvFilter;

/// Install the global subscriber. Safe to call once; later calls are ignored.
pub fn init(config_level: Option<&str>, default_level: &str) {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .or_else(|| config_level.map(str::to_string))
        .unwrap_or_else(|| default_level.to_string());
    let filter = EnvFilter::try_new(&filter).unwrap_or_else(|e| {
        eprintln!("bramble: warning: ignoring log filter `{filter}`: {e}");
        EnvFilter::new(default_level)
    });
    let _ =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false).try_init();
}
