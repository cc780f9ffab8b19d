//! `[email]`: the email channel's settings (IMAP in, SMTP out, who is trusted).
//!
//! Every value that decides where a password goes or whose mail is read is
//! checked while the file is read, so `bramble check` points at its line:
//! server URLs (`imaps://` implicit TLS, `imap://` STARTTLS, `imap+plain://`
//! only to 127.0.0.1; the same for `smtps://`, `smtp://`, `smtp+plain://`),
//! addresses (one plain address each), and the `authserv_id` whose
//! `Authentication-Results` are believed. The password only by `password_env`.

use std::ops::Range;

use serde::{Deserialize, Deserializer};

use super::{secret_from_env, Dur, Secret};

/// `[email]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EmailConfig {
    /// Our address: the `From` of what we send; mail from it coming back is ignored.
    pub address: Option<MailAddress>,
    /// The IMAP and SMTP login; default: `address`.
    pub username: Option<String>,
    /// The variable holding the (app) password.
    pub password_env: Option<String>,
    /// `imaps://host[:993]`, `imap://host[:143]` (STARTTLS), `imap+plain://127.0.0.1:PORT`.
    pub imap: Option<MailServer>,
    /// `smtps://host[:465]`, `smtp://host[:587]` (STARTTLS), `smtp+plain://127.0.0.1:PORT`.
    pub smtp: Option<MailServer>,
    /// The folder watched for mail.
    pub folder: String,
    /// Senders served. Empty: nobody.
    pub allow_from: Vec<MailAddress>,
    /// The receiving server's name in its `Authentication-Results` header
    /// (RFC 8601): only its verdict (DKIM or SPF pass for the sender's domain) is believed.
    pub authserv_id: Option<String>,
    /// Mail larger than this is not read (marked seen, logged).
    pub max_mail_mb: u64,
    /// Files sent with a report larger than this (in total) are named instead of attached.
    pub max_attach_mb: u64,
    /// Without IDLE on the server: how often the folder is checked.
    pub poll_every: Dur,
}

impl Default for EmailConfig {
    fn default() -> Self {
        EmailConfig {
            address: None,
            username: None,
            password_env: None,
            imap: None,
            smtp: None,
            folder: "INBOX".into(),
            allow_from: Vec::new(),
            authserv_id: None,
            max_mail_mb: 25,
            max_attach_mb: 10,
            poll_every: Dur(std::time::Duration::from_secs(120)),
        }
    }
}

impl EmailConfig {
    /// Whether the channel is configured at all (an address and a server).
    pub fn enabled(&self) -> bool {
        self.address.is_some() && (self.imap.is_some() || self.smtp.is_some())
    }

    /// The password from `password_env`.
    pub fn password(&self) -> Option<Secret> {
        self.password_env.as_deref().and_then(secret_from_env)
    }

    /// The login: `username`, else the address.
    pub fn login(&self) -> Option<String> {
        self.username.clone().or_else(|| self.address.as_ref().map(|a| a.0.clone()))
    }

    /// Whether `addr` is an `allow_from` sender (case-insensitive).
    pub fn allows(&self, addr: &str) -> bool {
        self.allow_from.iter().any(|a| a.0.eq_ignore_ascii_case(addr))
    }

    /// What the keys cannot check alone: a server without our address, an
    /// inbox without the `authserv_id` its trust rests on.
    pub(super) fn check(&self, text: &str) -> Result<(), (Option<Range<usize>>, String)> {
        let at = |key: &str| text.find("[email]").and_then(|s| text[s..].find(key).map(|i| s + i..s + i + key.len()));
        if (self.imap.is_some() || self.smtp.is_some()) && self.address.is_none() {
            return Err((at("[email]"), "[email] needs `address` (the mailbox bramble reads and sends as)".into()));
        }
        if self.imap.is_some() && !self.allow_from.is_empty() && self.authserv_id.is_none() {
            return Err((
                at("allow_from"),
                "[email] needs `authserv_id`: the name your mail server writes in its Authentication-Results \
                 header (open a mail it received and look); without it no sender can be trusted"
                    .into(),
            ));
        }
        if let Some(id) = &self.authserv_id {
            if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b)) {
                return Err((at("authserv_id"), format!("[email] authserv_id = {id:?} is not a host name")));
            }
        }
        if self.max_mail_mb == 0 || self.max_mail_mb > 100 {
            return Err((at("max_mail_mb"), "[email] max_mail_mb is between 1 and 100".into()));
        }
        Ok(())
    }
}

/// One plain mail address (`me@example.org`), checked when read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MailAddress(pub String);

impl<'de> Deserialize<'de> for MailAddress {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        let s = s.trim();
        if crate::bus::is_plain_address(s) {
            Ok(MailAddress(s.to_string()))
        } else {
            Err(serde::de::Error::custom(format!("`{s}` is not one plain mail address like `me@example.org`")))
        }
    }
}

/// How a connection to a mail server is protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MailTls {
    /// TLS from the first byte (`imaps://`, `smtps://`).
    Implicit,
    /// Plain, then STARTTLS, required (`imap://`, `smtp://`).
    StartTls,
    /// No TLS at all: only to this machine (`imap+plain://127.0.0.1`).
    None,
}

/// A mail server from `imap = "…"` or `smtp = "…"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MailServer {
    pub host: String,
    pub port: u16,
    pub tls: MailTls,
}

impl std::fmt::Display for MailServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = match self.tls {
            MailTls::Implicit => "TLS",
            MailTls::StartTls => "STARTTLS",
            MailTls::None => "no TLS",
        };
        write!(f, "{}:{} ({how})", self.host, self.port)
    }
}

impl MailServer {
    /// `scheme://host[:port]` for the `proto` (`imap` or `smtp`).
    fn parse(text: &str) -> Result<MailServer, String> {
        let bad = || {
            format!(
                "`{text}` is not a mail server: expected imaps://host, imap://host (STARTTLS), \
                 smtps://host, smtp://host (STARTTLS), or imap+plain:// / smtp+plain:// to 127.0.0.1 only"
            )
        };
        let (scheme, rest) = text.split_once("://").ok_or_else(bad)?;
        let (tls, port) = match scheme {
            "imaps" => (MailTls::Implicit, 993),
            "imap" => (MailTls::StartTls, 143),
            "imap+plain" => (MailTls::None, 143),
            "smtps" => (MailTls::Implicit, 465),
            "smtp" => (MailTls::StartTls, 587),
            "smtp+plain" => (MailTls::None, 25),
            _ => return Err(bad()),
        };
        let rest = rest.trim_end_matches('/');
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) => (h, p.parse::<u16>().map_err(|_| bad())?),
            None => (rest, port),
        };
        if host.is_empty() || !host.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b)) {
            return Err(bad());
        }
        if tls == MailTls::None && !matches!(host, "127.0.0.1" | "localhost") {
            return Err(format!(
                "`{text}`: a password goes over this connection; without TLS only to 127.0.0.1 (use {}s://)",
                scheme.trim_end_matches("+plain")
            ));
        }
        Ok(MailServer { host: host.to_string(), port, tls })
    }
}

impl<'de> Deserialize<'de> for MailServer {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        MailServer::parse(s.trim()).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "email")]
    fn parse(text: &str) -> Result<crate::config::Config, String> {
        crate::config::Config::parse(text, std::path::Path::new("/etc/bramble/config.toml")).map_err(|e| e.to_string())
    }

    #[test]
    #[cfg(feature = "email")]
    fn bramble_check_points_at_the_line() {
        let err = parse("[agent]\n[email]\naddress = \"bot@example.org\"\nsmtp = \"smtp+plain://mail.example.org\"\n")
            .unwrap_err();
        assert!(err.contains("config.toml:4:") && err.contains("only to 127.0.0.1"), "{err}");
        let err = parse("[email]\naddress = \"bot\"\n").unwrap_err();
        assert!(err.contains(":2:") && err.contains("not one plain mail address"), "{err}");
        let err = parse("[email]\naddress = \"b@example.org\"\nimap = \"imaps://x.example.org\"\nallow_from = [\"me@example.org\"]\n")
            .unwrap_err();
        assert!(err.contains(":4:") && err.contains("authserv_id"), "{err}");
        let err = parse("[email]\nimap = \"imaps://x.example.org\"\n").unwrap_err();
        assert!(err.contains("needs `address`"), "{err}");
        let ok = parse(
            "[email]\naddress = \"b@example.org\"\nimap = \"imaps://x.example.org\"\n\
                        allow_from = [\"Me@Example.org\"]\nauthserv_id = \"mx.example.org\"\n",
        )
        .unwrap();
        assert!(ok.email.enabled() && ok.email.allows("me@example.org"));
    }

    #[test]
    fn servers_say_how_they_are_protected() {
        let s = MailServer::parse("imaps://mail.example.org").unwrap();
        assert_eq!((s.port, s.tls), (993, MailTls::Implicit));
        let s = MailServer::parse("smtp://mail.example.org").unwrap();
        assert_eq!((s.port, s.tls), (587, MailTls::StartTls));
        let s = MailServer::parse("imap+plain://127.0.0.1:1143").unwrap();
        assert_eq!((s.port, s.tls), (1143, MailTls::None));
        let err = MailServer::parse("smtp+plain://mail.example.org:25").unwrap_err();
        assert!(err.contains("only to 127.0.0.1") && err.contains("smtps://"), "{err}");
        for bad in ["http://x", "imaps://", "imaps://a b", "imap://x:99999", "x"] {
            assert!(MailServer::parse(bad).is_err(), "{bad}");
        }
    }
}
