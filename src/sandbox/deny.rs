//! A short list of commands refused before they start — a courtesy, not a wall.
//!
//! Pattern lists are bypassed all the time (`rm --recursive --force`,
//! `c=rm; $c -rf`, `$(echo r)m`, see field.md). The boundary is the kernel
//! sandbox; this only answers the obvious cases early with a message that
//! helps the model pick a better action, instead of letting it learn from a
//! wall of "Read-only file system" errors.

/// `Err(message)` when `command` is one of the few obviously destructive forms.
pub fn check(command: &str) -> Result<(), String> {
    let squashed: String = command.split_whitespace().collect::<Vec<_>>().join(" ");
    let words: Vec<&str> = squashed.split([' ', ';', '&', '|']).filter(|w| !w.is_empty()).collect();
    let reason = if squashed.contains(":(){") || squashed.contains(":() {") {
        Some("a fork bomb")
    } else if words.windows(3).any(|w| w[0] == "rm" && w[1].starts_with('-') && is_root_like(w[2])) {
        Some("deleting the whole system or home directory")
    } else if words.iter().any(|w| w.starts_with("mkfs")) {
        Some("formatting a file system")
    } else if words.iter().any(|w| w.starts_with("of=/dev/")) {
        Some("writing to a raw device")
    } else if words.first().is_some_and(|w| ["shutdown", "reboot", "poweroff", "halt"].contains(w)) {
        Some("stopping the machine")
    } else {
        None
    };
    match reason {
        Some(what) => Err(format!(
            "refused: this looks like {what}. Commands run in a sandbox that would stop it anyway; \
             if the user really wants this, ask them to do it themselves"
        )),
        None => Ok(()),
    }
}

fn is_root_like(arg: &str) -> bool {
    matches!(arg, "/" | "/*" | "~" | "~/" | "~/*" | "$HOME" | "${HOME}" | "--no-preserve-root")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn obvious_cases_are_refused_with_a_reason() {
        for cmd in ["rm -rf /", "rm  -rf   /*", "cd x && rm -fr ~", ":(){ :|:& };:", "mkfs.ext4 /dev/sda1", "reboot"] {
            let err = check(cmd).unwrap_err();
            assert!(err.starts_with("refused: this looks like"), "{cmd}: {err}");
        }
        assert!(check("dd if=/dev/zero of=/dev/mmcblk0").unwrap_err().contains("raw device"));
    }

    #[test]
    fn ordinary_commands_pass() {
        for cmd in ["rm -rf build/", "ls /", "echo reboot", "dd if=a of=b", "curl wttr.in/Berlin", "rm -rf ./tmp"] {
            assert_eq!(check(cmd), Ok(()), "{cmd}");
        }
    }
}
