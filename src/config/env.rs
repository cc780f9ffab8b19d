//! The per-user env file, `~/.config/bramble/env`: `KEY=VALUE` lines that
//! the daemon and every command read alike.
//!
//! Why: without systemd, secrets lived in the daemon's shell, and a second
//! terminal's `bramble status` then said "telegram: not configured" while the
//! daemon delivered. One file both read makes them agree. It holds secrets,
//! so it is read only when no one but its owner may read it (0600); a
//! variable already set in the environment wins (and `status` says so).
//! Values are never printed: only the names.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use super::ProviderConfig;

/// The file's name inside the config directory.
pub const FILE: &str = "env";

/// `$XDG_CONFIG_HOME/bramble/env`, else `~/.config/bramble/env`.
pub fn path() -> PathBuf {
    match std::env::var_os("XDG_CONFIG_HOME").map(PathBuf::from).filter(|p| p.is_absolute()) {
        Some(dir) => dir.join("bramble").join(FILE),
        None => super::home_dir().join(".config/bramble").join(FILE),
    }
}

/// Why the env file was not read.
#[derive(Debug, thiserror::Error)]
pub enum EnvFileError {
    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error(
        "{} may be read by others (mode {mode:04o}) and holds secrets: not read; `chmod 600 {}`",
        path.display(),
        path.display()
    )]
    Open { path: PathBuf, mode: u32 },
    #[error("{} belongs to another user (uid {uid}): not read", path.display())]
    NotOurs { path: PathBuf, uid: u32 },
    #[error("{}:{line}: {message}", path.display())]
    Line { path: PathBuf, line: usize, message: String },
}

/// The variables of an env file, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvFile {
    pub path: PathBuf,
    pub vars: Vec<(String, String)>,
}

/// Read `path`: `Ok(None)` when it does not exist. Refused when group or
/// others may read or write it, or when another user owns it.
pub fn read(path: &Path) -> Result<Option<EnvFile>, EnvFileError> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(EnvFileError::Read { path: path.to_path_buf(), source }),
    };
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me && meta.uid() != 0 {
        return Err(EnvFileError::NotOurs { path: path.to_path_buf(), uid: meta.uid() });
    }
    if meta.mode() & 0o077 != 0 {
        return Err(EnvFileError::Open { path: path.to_path_buf(), mode: meta.mode() & 0o7777 });
    }
    let text =
        std::fs::read_to_string(path).map_err(|source| EnvFileError::Read { path: path.to_path_buf(), source })?;
    parse(path, &text).map(Some)
}

/// `KEY=VALUE` lines; `#` comments and blank lines skipped; an `export `
/// prefix and one pair of matching quotes around the value allowed.
fn parse(path: &Path, text: &str) -> Result<EnvFile, EnvFileError> {
    let mut vars = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").map(str::trim_start).unwrap_or(line);
        let bad = |message: String| EnvFileError::Line { path: path.to_path_buf(), line: i + 1, message };
        let Some((key, value)) = line.split_once('=') else {
            return Err(bad("expected KEY=VALUE".into()));
        };
        let key = key.trim();
        if !valid_name(key) {
            return Err(bad(format!("`{}` is not a variable name (letters, digits, _)", key.escape_debug())));
        }
        let value = value.trim();
        let value =
            ['"', '\''].iter().find_map(|q| value.strip_prefix(*q).and_then(|v| v.strip_suffix(*q))).unwrap_or(value);
        if value.contains('\0') {
            return Err(bad(format!("the value of {key} holds a NUL byte")));
        }
        vars.push((key.to_string(), value.to_string()));
    }
    Ok(EnvFile { path: path.to_path_buf(), vars })
}

fn valid_name(key: &str) -> bool {
    let mut chars = key.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// What reading the env file into this process did: the names only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Set from the file.
    pub set: Vec<String>,
    /// Already set in the environment, which wins.
    pub kept: Vec<String>,
}

/// Set the file's variables that the environment does not set yet.
///
/// Must run before any other thread exists (the command line does it first
/// thing): changing the environment races with threads reading it.
pub fn apply(file: &EnvFile) -> Applied {
    let mut applied = Applied::default();
    for (key, value) in &file.vars {
        if std::env::var_os(key).is_some_and(|v| !v.is_empty()) {
            applied.kept.push(key.clone());
        } else {
            std::env::set_var(key, value);
            applied.set.push(key.clone());
        }
    }
    applied
}

/// One line on where each variable of the file came from, for `status`
/// (read after [`apply`]: a variable whose value differs from the file's
/// was set in the shell, which wins).
pub fn describe(path: &Path) -> String {
    match read(path) {
        Ok(None) => format!("{} (none)", path.display()),
        Err(e) => format!("NOT READ: {e}"),
        Ok(Some(file)) if file.vars.is_empty() => format!("{} (no variables)", path.display()),
        Ok(Some(file)) => {
            let (mut from_file, mut shell) = (Vec::new(), Vec::new());
            for (key, value) in &file.vars {
                match std::env::var(key) {
                    Ok(v) if v != *value && !v.is_empty() => shell.push(key.as_str()),
                    _ => from_file.push(key.as_str()),
                }
            }
            let mut line = format!("{}: {}", path.display(), from_file.join(", "));
            if !shell.is_empty() {
                line.push_str(&format!(
                    "{}{} set in this shell, which wins over the file",
                    if from_file.is_empty() { "" } else { "; " },
                    shell.join(", ")
                ));
            }
            line
        }
    }
}

/// Where a provider's key stands.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "env")]
pub enum KeyState {
    Set,
    /// A key is needed (the public endpoint) or was named (`api_key_env`), and the variable is not set.
    Unset(String),
    /// No key configured at all, and the server is the owner's own (`base_url`).
    NotNeeded,
}

/// Where `p`'s key stands: a variable named by `api_key_env` that is not
/// set is [`KeyState::Unset`] even for an own `base_url`.
pub fn key_state(p: &ProviderConfig) -> KeyState {
    if p.api_key().is_some() {
        KeyState::Set
    } else if p.key_required() || p.api_key_env.is_some() {
        KeyState::Unset(p.key_env().to_string())
    } else {
        KeyState::NotNeeded
    }
}

impl KeyState {
    /// For `status`'s key line.
    pub fn describe(&self) -> String {
        match self {
            KeyState::Set => "set".into(),
            KeyState::Unset(env) => format!("MISSING: set {env}"),
            KeyState::NotNeeded => "not needed (own base_url, no api_key_env)".into(),
        }
    }
}

/// The commented env file `bramble init` writes (0600).
pub const TEMPLATE: &str = "\
# bramble's environment: KEY=VALUE lines, read by `bramble run` and every
# other bramble command alike (so a second terminal sees what the daemon sees).
# A variable already set in the environment wins over this file.
# Keep it private: bramble refuses to read it when others may (chmod 600).
# Under systemd, the service reads /etc/bramble/env instead.
#
# OPENAI_API_KEY=sk-...
# ANTHROPIC_API_KEY=...
# OPENROUTER_API_KEY=...
# TELEGRAM_BOT_TOKEN=123456:ABC...
";

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn lines_comments_quotes_and_export() {
        let f = parse(Path::new("env"), "# c\n\nA=1\nexport B = \"two words\"\nC='x=y'\nD=\n").unwrap();
        let got: Vec<(&str, &str)> = f.vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(got, [("A", "1"), ("B", "two words"), ("C", "x=y"), ("D", "")]);
        let e = parse(Path::new("env"), "A=1\nnot a line\n").unwrap_err().to_string();
        assert_eq!(e, "env:2: expected KEY=VALUE");
        assert!(parse(Path::new("env"), "1A=x\n").unwrap_err().to_string().contains("not a variable name"));
    }

    #[test]
    fn a_file_others_may_read_is_refused_without_its_values() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("env");
        std::fs::write(&p, "SECRET_X=hunter2\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = read(&p).unwrap_err().to_string();
        assert!(e.contains("mode 0640") && e.contains("chmod 600"), "{e}");
        assert!(!e.contains("hunter2"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read(&p).unwrap().unwrap().vars, [("SECRET_X".to_string(), "hunter2".to_string())]);
        assert_eq!(read(&dir.path().join("none")).unwrap(), None);
    }

    #[test]
    fn a_named_unset_key_is_missing_even_for_an_own_server() {
        let mut p =
            ProviderConfig { base_url: Some("http://127.0.0.1:1/v1".parse().unwrap()), ..ProviderConfig::default() };
        assert_eq!(key_state(&p), KeyState::NotNeeded);
        p.api_key_env = Some("BRAMBLE_TEST_UNSET_KEY_51c2".into());
        assert_eq!(key_state(&p), KeyState::Unset("BRAMBLE_TEST_UNSET_KEY_51c2".into()));
    }
}
