//! A server's OAuth grant on disk: one file per server,
//! `<state dir>/mcp-oauth/<name>.json`, 0600 in a 0700 directory, replaced
//! atomically ([`crate::util::fs::write_atomic`]) so a power cut leaves the
//! old grant or the new one, never half of one.
//!
//! The file holds what refreshing needs without discovery (the token
//! endpoint, the client, the resource) and, when a refresh failed, why — so
//! `bramble mcp list` and `doctor` can say "run `bramble mcp login NAME`"
//! without reaching the server. Tokens are secrets: the record's `Debug`
//! shows none, and nothing here logs them.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Largest token file read (a grant is a few KiB; more is not ours).
const MAX_FILE: u64 = 256 * 1024;

/// How bramble authenticates at the token endpoint.
#[derive(Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClientInfo {
    pub client_id: String,
    /// A registered client's secret (dynamic registration); a configured one stays in its variable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
    /// `none`, `client_secret_basic`, `client_secret_post` or `private_key_jwt`.
    pub auth_method: String,
    /// `private_key_jwt`: the assertion's audience (the authorization server's issuer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    /// `private_key_jwt`: the private key (PKCS#8 PEM), from its variable; never written.
    #[serde(skip)]
    pub key_pem: Option<String>,
}

impl std::fmt::Debug for ClientInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientInfo")
            .field("client_id", &self.client_id)
            .field("auth_method", &self.auth_method)
            .finish_non_exhaustive()
    }
}

/// One server's grant.
#[derive(Clone, Default, Serialize, Deserialize)]
pub struct Record {
    #[serde(default)]
    pub access_token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_token: Option<String>,
    /// Unix seconds when the access token expires, where the server said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    /// The scopes granted (or asked for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    #[serde(default)]
    pub token_endpoint: String,
    /// The `resource` (RFC 8707) the token is for.
    #[serde(default)]
    pub resource: String,
    #[serde(default)]
    pub client: ClientInfo,
    /// `authorization_code` or `client_credentials`.
    #[serde(default)]
    pub grant_type: String,
    /// Why the grant no longer works (a refresh was refused): `bramble mcp login` is needed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needs_login: Option<String>,
}

impl std::fmt::Debug for Record {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Record")
            .field("expires_at", &self.expires_at)
            .field("scope", &self.scope)
            .field("token_endpoint", &self.token_endpoint)
            .field("client", &self.client)
            .field("needs_login", &self.needs_login)
            .finish_non_exhaustive()
    }
}

impl Record {
    /// Whether the access token is usable at `now` (unix seconds) with `margin` seconds to spare.
    pub fn fresh(&self, now: u64, margin: u64) -> bool {
        !self.access_token.is_empty() && self.expires_at.is_none_or(|at| at > now + margin)
    }
}

/// Why a token file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} is not a token file bramble wrote ({why}); remove it with `bramble mcp logout`")]
    Malformed { path: PathBuf, why: String },
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

/// The token file of server `name` under `state_dir`.
pub fn path(state_dir: &Path, name: &str) -> PathBuf {
    state_dir.join("mcp-oauth").join(format!("{name}.json"))
}

/// The record at `path`; `None` when there is none.
pub fn load(path: &Path) -> Result<Option<Record>, StoreError> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(StoreError::Read { path: path.to_path_buf(), source }),
    };
    if meta.len() > MAX_FILE {
        return Err(StoreError::Malformed { path: path.to_path_buf(), why: format!("larger than {MAX_FILE} bytes") });
    }
    let bytes = std::fs::read(path).map_err(|source| StoreError::Read { path: path.to_path_buf(), source })?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| StoreError::Malformed { path: path.to_path_buf(), why: e.to_string() })
}

/// Write `record` to `path` (0600, atomically).
pub fn save(path: &Path, record: &Record) -> Result<(), StoreError> {
    let bytes = serde_json::to_vec_pretty(record)
        .map_err(|e| StoreError::Write { path: path.to_path_buf(), source: std::io::Error::other(e.to_string()) })?;
    crate::util::fs::write_atomic(path, &bytes).map_err(|source| StoreError::Write { path: path.to_path_buf(), source })
}

/// Remove the record at `path`; whether there was one.
pub fn remove(path: &Path) -> Result<bool, StoreError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(StoreError::Write { path: path.to_path_buf(), source }),
    }
}

/// Seconds since the epoch.
pub fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn records_are_private_whole_and_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let p = path(dir.path(), "srv");
        assert!(load(&p).unwrap().is_none());
        let rec = Record {
            access_token: "at-SECRET".into(),
            refresh_token: Some("rt-SECRET".into()),
            expires_at: Some(100),
            client: ClientInfo {
                client_id: "c".into(),
                client_secret: Some("cs-SECRET".into()),
                auth_method: "none".into(),
                audience: None,
                key_pem: Some("KEY-SECRET".into()),
            },
            ..Record::default()
        };
        save(&p, &rec).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(p.parent().unwrap()).unwrap().permissions().mode() & 0o777, 0o700);
        assert!(!std::fs::read_to_string(&p).unwrap().contains("KEY-SECRET"), "a private key was written");
        let back = load(&p).unwrap().unwrap();
        assert_eq!(back.refresh_token.as_deref(), Some("rt-SECRET"));
        assert!(!format!("{back:?}").contains("SECRET"), "{back:?}");
        assert!(back.fresh(10, 60) && !back.fresh(50, 60));
        std::fs::write(&p, b"{not json").unwrap();
        assert!(load(&p).unwrap_err().to_string().contains("bramble mcp logout"));
        assert!(remove(&p).unwrap());
        assert!(!remove(&p).unwrap());
    }
}
