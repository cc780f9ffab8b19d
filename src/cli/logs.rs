//! `bramble logs [-f] [-n N]`: the service's log without remembering where it
//! goes. Under systemd that is the journal (`journalctl -u bramble.service`,
//! run in this process's place so paging, colours and Ctrl-C are
//! journalctl's own); anywhere else the daemon logs to its stderr, and this
//! says so instead of printing nothing.
//!
//! Log lines carry text from outside (a command an MQTT publisher asked for):
//! `journalctl` shows a field with control characters as `[… blob data]`
//! unless given `--all`/`-a`, which this never passes, so an escape sequence
//! in the journal does not reach the terminal.

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::ExitCode;

/// What `bramble logs` runs, or why it cannot.
fn journalctl_args(systemd_runs: bool, unit_known: bool, follow: bool, lines: u32) -> Result<Vec<String>, String> {
    if !systemd_runs {
        return Err("systemd does not run this machine, so there is no service log: `bramble run` logs to its \
                    stderr (keep it with `bramble run 2>> bramble.log`, and `RUST_LOG=debug` for more)"
            .into());
    }
    if !unit_known {
        return Err("bramble.service is not installed here: the package (README: Install on a Raspberry Pi) \
                    installs it; a `bramble run` started by hand logs to its stderr"
            .into());
    }
    let mut args = vec!["-u".into(), "bramble.service".into(), "-n".into(), lines.to_string()];
    if follow {
        args.push("-f".into());
    }
    Ok(args)
}

pub(super) fn logs(follow: bool, lines: u32) -> anyhow::Result<ExitCode> {
    let systemd_runs = Path::new("/run/systemd/system").is_dir();
    let unit_known = systemd_runs
        && std::process::Command::new("systemctl")
            .args(["cat", "bramble.service"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    match journalctl_args(systemd_runs, unit_known, follow, lines) {
        Ok(args) => {
            let err = std::process::Command::new("journalctl").args(&args).exec();
            Err(anyhow::anyhow!("cannot run journalctl: {err}"))
        }
        Err(why) => {
            eprintln!("bramble: {why}");
            Ok(ExitCode::from(1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_journal_of_the_unit_or_where_the_log_goes() {
        assert_eq!(journalctl_args(true, true, false, 100).unwrap(), ["-u", "bramble.service", "-n", "100"]);
        assert_eq!(journalctl_args(true, true, true, 5).unwrap(), ["-u", "bramble.service", "-n", "5", "-f"]);
        assert!(journalctl_args(false, false, false, 100).unwrap_err().contains("logs to its stderr"));
        assert!(journalctl_args(true, false, false, 100).unwrap_err().contains("not installed"));
        // Never `--all`: journalctl then prints control characters raw.
        let args = journalctl_args(true, true, true, 100).unwrap();
        assert!(!args.iter().any(|a| a == "-a" || a == "--all" || a.starts_with("-o")), "{args:?}");
    }
}
