//! `[signal]`: a Signal account bramble talks through, by a signal-cli
//! daemon the owner runs (see docs/channels/signal.md). bramble starts
//! nothing of signal-cli; it connects to the endpoint configured.
//!
//! Its own file so the section's types and checks sit together. There is no
//! secret: signal-cli's JSON-RPC endpoints have no authentication, which is
//! why the documentation asks for a loopback address or a unix socket.

use serde::Deserialize;

use crate::bus::{is_signal_group, is_signal_number, is_signal_uuid};

/// `[signal]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SignalConfig {
    /// `http://127.0.0.1:8080` (`signal-cli daemon --http`), `tcp://127.0.0.1:7583`
    /// (`--tcp`) or a unix socket path (`--socket`); unset: no Signal.
    pub endpoint: Option<String>,
    /// Our own number (`+4915…`): sent as `account` (needed when the daemon
    /// serves several accounts) and used to recognise our own messages.
    pub account: Option<String>,
    /// Numbers (`+4915…`, E.164) and account uuids that may talk to the bot.
    /// Empty: nobody. A number is pinned to the uuid first seen with it.
    pub allow_from: Vec<String>,
    /// Group ids (base64, as `signal-cli listGroups` prints them) whose
    /// allowed members are answered in the group, and that may be targets.
    pub groups: Vec<String>,
    /// Files larger than this are neither taken in nor sent.
    pub max_file_mb: u64,
    /// A message longer than this many characters is cut to it.
    pub max_message_chars: usize,
}

impl Default for SignalConfig {
    fn default() -> Self {
        SignalConfig {
            endpoint: None,
            account: None,
            allow_from: Vec::new(),
            groups: Vec::new(),
            max_file_mb: 20,
            max_message_chars: 16_000,
        }
    }
}

/// Where the daemon listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignalEndpoint {
    /// `--http`: POST `/api/v1/rpc`, GET `/api/v1/events` (base URL, no trailing slash).
    Http(String),
    /// `--tcp`: newline-delimited JSON-RPC (`host:port`).
    Tcp(String),
    /// `--socket`: newline-delimited JSON-RPC on a unix socket.
    Unix(std::path::PathBuf),
}

impl SignalEndpoint {
    /// `http://…`, `tcp://host:port` or an absolute path.
    pub fn parse(text: &str) -> Result<SignalEndpoint, String> {
        let t = text.trim();
        if let Some(rest) = t.strip_prefix("http://").or_else(|| t.strip_prefix("https://")) {
            if rest.is_empty() || rest.contains(['?', '#', ' ']) {
                return Err(format!("[signal] endpoint `{t}` is not a base URL like \"http://127.0.0.1:8080\""));
            }
            return Ok(SignalEndpoint::Http(t.trim_end_matches('/').to_string()));
        }
        if let Some(addr) = t.strip_prefix("tcp://") {
            let ok = addr.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            if !ok {
                return Err(format!("[signal] endpoint `{t}` is not `tcp://host:port` like \"tcp://127.0.0.1:7583\""));
            }
            return Ok(SignalEndpoint::Tcp(addr.to_string()));
        }
        if t.starts_with('/') {
            return Ok(SignalEndpoint::Unix(t.into()));
        }
        Err(format!(
            "[signal] endpoint `{t}`: expected \"http://127.0.0.1:8080\" (signal-cli daemon --http), \
             \"tcp://127.0.0.1:7583\" (--tcp) or a unix socket path (--socket)"
        ))
    }
}

impl std::fmt::Display for SignalEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SignalEndpoint::Http(url) => f.write_str(url),
            SignalEndpoint::Tcp(addr) => write!(f, "tcp://{addr}"),
            SignalEndpoint::Unix(p) => write!(f, "{}", p.display()),
        }
    }
}

impl SignalConfig {
    /// The endpoint, parsed (`None`: not configured or invalid; `problem` says which).
    pub fn endpoint(&self) -> Option<SignalEndpoint> {
        self.endpoint.as_deref().and_then(|e| SignalEndpoint::parse(e).ok())
    }

    /// What `bramble check` says about the section (`None`: fine or not configured).
    pub fn problem(&self) -> Option<String> {
        let endpoint = self.endpoint.as_deref()?;
        if let Err(why) = SignalEndpoint::parse(endpoint) {
            return Some(why);
        }
        if let Some(a) = self.account.as_deref().filter(|a| !is_signal_number(a) && !is_signal_uuid(a)) {
            return Some(format!("[signal] account: `{a}` is not a number in E.164 like \"+4915112345678\""));
        }
        for id in &self.allow_from {
            if !is_signal_number(id) && !is_signal_uuid(id) {
                return Some(format!(
                    "[signal] allow_from: `{id}` is not a number in E.164 (\"+4915112345678\") nor an account uuid"
                ));
            }
        }
        for g in &self.groups {
            if !is_signal_group(g) {
                return Some(format!(
                    "[signal] groups: `{g}` is not a group id (base64, as `signal-cli listGroups` prints it)"
                ));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_and_ids_are_checked() {
        assert_eq!(
            SignalEndpoint::parse("http://127.0.0.1:8080/").unwrap(),
            SignalEndpoint::Http("http://127.0.0.1:8080".into())
        );
        assert_eq!(
            SignalEndpoint::parse("tcp://127.0.0.1:7583").unwrap(),
            SignalEndpoint::Tcp("127.0.0.1:7583".into())
        );
        assert_eq!(
            SignalEndpoint::parse("/run/signal-cli/socket").unwrap(),
            SignalEndpoint::Unix("/run/signal-cli/socket".into())
        );
        for bad in ["127.0.0.1:8080", "tcp://127.0.0.1", "ftp://x", "http://", "socket"] {
            assert!(SignalEndpoint::parse(bad).is_err(), "{bad}");
        }
        let c = SignalConfig {
            endpoint: Some("http://127.0.0.1:8080".into()),
            allow_from: vec!["015112345678".into()],
            ..Default::default()
        };
        assert!(c.problem().unwrap().contains("`015112345678` is not a number in E.164"));
        let c = SignalConfig { allow_from: vec!["+4915112345678".into()], groups: vec!["abc".into()], ..c };
        assert!(c.problem().unwrap().contains("groups"));
        let c = SignalConfig { groups: vec![], ..c };
        assert!(c.problem().is_none());
        assert!(SignalConfig::default().problem().is_none(), "not configured: nothing to say");
    }
}
