//! `[webhooks]` (the listener) and `[[webhook]]` (each endpoint, in or out):
//! the glue Home Assistant automations, Node-RED, n8n and scripts speak.
//!
//! One `[[webhook]]` table per name. It is an inbound endpoint
//! (`POST /hook/<name>`) when it has a `message` or a `job`, an outbound
//! target (`webhook:<name>`) when it has a `url`, or both: the one secret then
//! signs both ways. Secrets come only from `secret_env` / `token_env` (a
//! variable or a systemd credential), never inline. The shape (exactly one
//! secret, something to do, https out unless the host is on the LAN and
//! `allow_http` says so, unique names) is checked while the table is read,
//! so every mistake is a `FILE:LINE:COL` error of `bramble check`.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{secret_from_env, HttpUrl, Secret};
use crate::bus::{is_webhook_name, Target};

/// `[webhooks] listen` by default: loopback only.
pub const WEBHOOK_LISTEN: &str = "127.0.0.1:8787";
/// `[[webhook]] max_body` by default: 64 KiB.
pub const WEBHOOK_MAX_BODY: usize = 64 * 1024;

/// `[webhooks]`: where the endpoints are served.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebhooksConfig {
    /// The address the endpoints listen on (`127.0.0.1:8787`). An address
    /// other than loopback needs `tls_cert` and `tls_key` (HTTPS), or
    /// `allow_plain = true` (a TLS proxy in front, or a LAN you trust with the
    /// signatures).
    pub listen: SocketAddr,
    /// Listen on a non-loopback address without TLS.
    pub allow_plain: bool,
    /// The listener's certificate chain (PEM), for HTTPS.
    pub tls_cert: Option<PathBuf>,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1), for HTTPS.
    pub tls_key: Option<PathBuf>,
    /// Connections served at once; more wait in the kernel's backlog.
    pub max_connections: u32,
    /// Model turns a minute the endpoints may start together; more are
    /// answered `429`. 0: no limit.
    pub turns_per_minute: u32,
    /// How many of those may come at once.
    pub turn_burst: u32,
}

impl Default for WebhooksConfig {
    fn default() -> Self {
        WebhooksConfig {
            listen: WEBHOOK_LISTEN.parse().unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 8787))),
            allow_plain: false,
            tls_cert: None,
            tls_key: None,
            max_connections: 32,
            turns_per_minute: 20,
            turn_burst: 5,
        }
    }
}

impl WebhooksConfig {
    /// Why the listener may not start as configured (`None`: it may).
    pub fn refusal(&self) -> Option<String> {
        (!self.listen.ip().is_loopback() && !self.allow_plain && !self.tls()).then(|| {
            format!(
                "[webhooks] listen = \"{}\" is not a loopback address, and has no TLS: set `tls_cert` and `tls_key` \
                 (PEM files), or put a TLS proxy in front and set `allow_plain = true`, or listen on 127.0.0.1",
                self.listen
            )
        })
    }

    /// Whether the listener speaks HTTPS (`tls_cert` and `tls_key` are set).
    pub fn tls(&self) -> bool {
        self.tls_cert.is_some() && self.tls_key.is_some()
    }

    /// The certificate chain and key of `tls_cert` / `tls_key`, read and
    /// parsed; `None` when TLS is not configured. The error names the key
    /// (`tls_cert` or `tls_key`) and says what is wrong with its file.
    pub fn tls_files(&self) -> Option<Result<TlsFiles, (&'static str, String)>> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let (cert, key) = (self.tls_cert.as_ref()?, self.tls_key.as_ref()?);
        let read = |which: &'static str, p: &Path| {
            std::fs::read(p).map_err(|e| {
                (
                    which,
                    format!(
                        "[webhooks] {which} = \"{}\" cannot be read ({e}): the daemon's user must be able to read it",
                        p.display()
                    ),
                )
            })
        };
        Some((|| {
            let pem = read("tls_cert", cert)?;
            let chain: Vec<CertificateDer<'static>> =
                CertificateDer::pem_slice_iter(&pem).collect::<Result<_, _>>().map_err(|e| {
                    ("tls_cert", format!("[webhooks] tls_cert = \"{}\" is not PEM certificates: {e}", cert.display()))
                })?;
            if chain.is_empty() {
                return Err((
                    "tls_cert",
                    format!("[webhooks] tls_cert = \"{}\" holds no PEM certificate", cert.display()),
                ));
            }
            let pem = read("tls_key", key)?;
            let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
                (
                    "tls_key",
                    format!(
                        "[webhooks] tls_key = \"{}\" holds no PEM private key (PKCS#8, PKCS#1 or SEC1): {e}",
                        key.display()
                    ),
                )
            })?;
            Ok(TlsFiles { chain, key })
        })())
    }

    /// What one key cannot check alone: both TLS files or neither, and both readable and PEM.
    pub(super) fn check(&self, text: &str) -> Result<(), (Option<std::ops::Range<usize>>, String)> {
        let at =
            |key: &str| text.find("[webhooks]").and_then(|s| text[s..].find(key).map(|i| s + i..s + i + key.len()));
        match (&self.tls_cert, &self.tls_key) {
            (Some(_), None) => {
                return Err((at("tls_cert"), "[webhooks] tls_cert needs tls_key too (its private key)".into()))
            }
            (None, Some(_)) => {
                return Err((at("tls_key"), "[webhooks] tls_key needs tls_cert too (its certificate chain)".into()))
            }
            _ => {}
        }
        match self.tls_files() {
            Some(Err((which, why))) => Err((at(which), why)),
            _ => Ok(()),
        }
    }
}

/// The listener's certificate chain and private key, parsed.
#[derive(Debug)]
pub struct TlsFiles {
    pub chain: Vec<rustls::pki_types::CertificateDer<'static>>,
    pub key: rustls::pki_types::PrivateKeyDer<'static>,
}

/// How a caller proves itself, and how bramble signs what it posts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebhookAuth {
    /// HMAC-SHA256 of `<t>.<body>` with the secret in this variable
    /// (`X-Bramble-Signature: t=<unix>,v1=<hex>`).
    Hmac { env: String },
    /// `Authorization: Bearer <token>` with the token in this variable.
    Bearer { env: String },
}

impl WebhookAuth {
    /// The variable (or credential) the secret is read from.
    pub fn env(&self) -> &str {
        match self {
            WebhookAuth::Hmac { env } | WebhookAuth::Bearer { env } => env,
        }
    }

    /// The secret, if the variable (or credential) is set.
    pub fn secret(&self) -> Option<Secret> {
        secret_from_env(self.env())
    }
}

/// What a call to an inbound endpoint does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebhookAction {
    /// A template rendered into an agent turn: `{payload}`, `{payload.a.b}`, `{name}`.
    Message(String),
    /// Run this job now (by name or id).
    Job(String),
}

/// `[[webhook]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, try_from = "RawWebhook")]
pub struct WebhookConfig {
    pub name: String,
    pub auth: WebhookAuth,
    /// Inbound: what a call does (`None`: outbound only).
    pub action: Option<WebhookAction>,
    /// Where a `message` turn's answer goes (`log` when empty).
    pub deliver: Vec<Target>,
    /// The largest body accepted, in bytes; a larger one is answered `413`.
    pub max_body: usize,
    /// Outbound: where `webhook:<name>` reports are POSTed.
    pub url: Option<HttpUrl>,
    /// Outbound over plain `http://` (a loopback or LAN host only).
    pub allow_http: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWebhook {
    name: String,
    secret_env: Option<String>,
    token_env: Option<String>,
    message: Option<String>,
    job: Option<String>,
    #[serde(default)]
    deliver: Vec<Target>,
    max_body: Option<usize>,
    url: Option<HttpUrl>,
    #[serde(default)]
    allow_http: bool,
}

impl TryFrom<RawWebhook> for WebhookConfig {
    type Error = String;
    fn try_from(r: RawWebhook) -> Result<Self, String> {
        let name = r.name.trim().to_string();
        if !is_webhook_name(&name) {
            return Err(format!(
                "`{}` is not a webhook name: 1 to 64 of `a-z 0-9 _ -` (it is the `/hook/<name>` path)",
                r.name
            ));
        }
        let auth = match (r.secret_env, r.token_env) {
            (Some(env), None) if !env.trim().is_empty() => WebhookAuth::Hmac { env: env.trim().to_string() },
            (None, Some(env)) if !env.trim().is_empty() => WebhookAuth::Bearer { env: env.trim().to_string() },
            _ => {
                return Err(format!(
                    "webhook `{name}` needs exactly one of `secret_env` (HMAC-SHA256 signatures) or `token_env` \
                     (a bearer token): the name of the variable or systemd credential holding it"
                ))
            }
        };
        let action = match (r.message, r.job) {
            (Some(m), None) => Some(WebhookAction::Message(m)),
            (None, Some(j)) if !j.trim().is_empty() => Some(WebhookAction::Job(j.trim().to_string())),
            (None, None) => None,
            _ => return Err(format!("webhook `{name}` takes one of `message` or `job`, not both")),
        };
        if action.is_none() && r.url.is_none() {
            return Err(format!(
                "webhook `{name}` does nothing: give it a `message` or a `job` (an endpoint at /hook/{name}), \
                 a `url` (a `webhook:{name}` target), or both"
            ));
        }
        if let Some(url) = &r.url {
            check_url(&name, url, r.allow_http)?;
        }
        let max_body = r.max_body.unwrap_or(WEBHOOK_MAX_BODY);
        if !(1..=16 * 1024 * 1024).contains(&max_body) {
            return Err(format!("webhook `{name}`: max_body is in bytes, 1 to 16777216 (16 MiB)"));
        }
        Ok(WebhookConfig { name, auth, action, deliver: r.deliver, max_body, url: r.url, allow_http: r.allow_http })
    }
}

/// https, or http to a loopback or LAN host with `allow_http = true`.
fn check_url(name: &str, url: &HttpUrl, allow_http: bool) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url.as_str()).map_err(|e| format!("webhook `{name}`: {e}"))?;
    if parsed.scheme() == "https" {
        return Ok(());
    }
    let host = parsed.host_str().unwrap_or_default();
    if !is_lan_host(host) {
        return Err(format!(
            "webhook `{name}`: url `{url}` is plain http to a host that is not on this machine or the LAN: \
             use https (the report and its signature would cross the internet in clear)",
            url = url.as_str()
        ));
    }
    if !allow_http {
        return Err(format!(
            "webhook `{name}`: url `{}` is plain http: use https, or set `allow_http = true` for a host on the LAN",
            url.as_str()
        ));
    }
    Ok(())
}

/// A loopback or private address, `localhost`, or a LAN-only name
/// (`*.local`, `*.lan`, `*.home.arpa`, a name without dots).
pub fn is_lan_host(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return match ip {
            IpAddr::V4(v4) => v4.is_loopback() || v4.is_private() || v4.is_link_local(),
            IpAddr::V6(v6) => {
                v6.is_loopback() || (v6.segments()[0] & 0xfe00) == 0xfc00 || (v6.segments()[0] & 0xffc0) == 0xfe80
            }
        };
    }
    let lower = bare.to_ascii_lowercase();
    lower == "localhost"
        || !lower.contains('.')
        || [".local", ".lan", ".home.arpa", ".localhost"].iter().any(|s| lower.ends_with(s))
}

impl super::Config {
    /// Whether `webhook:<name>` can be delivered: a `[[webhook]]` of that name
    /// has a `url` (and this build has webhooks).
    pub fn has_webhook_target(&self, name: &str) -> bool {
        cfg!(feature = "webhook") && self.webhook.iter().any(|w| w.name == name && w.url.is_some())
    }
}

/// `[[webhook]]` tables with unique names.
pub fn webhooks<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<WebhookConfig>, D::Error> {
    let list = Vec::<WebhookConfig>::deserialize(d)?;
    for (i, w) in list.iter().enumerate() {
        if list[..i].iter().any(|o| o.name == w.name) {
            return Err(serde::de::Error::custom(format!("two [[webhook]] tables are named `{}`", w.name)));
        }
        for t in &w.deliver {
            if let Target::Webhook(to) = t {
                if !list.iter().any(|o| o.name == *to && o.url.is_some()) {
                    return Err(serde::de::Error::custom(format!(
                        "webhook `{}` delivers to `{t}`, but no [[webhook]] named `{to}` has a `url`",
                        w.name
                    )));
                }
            }
        }
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    #[cfg(feature = "webhook")]
    fn parse(text: &str) -> Result<crate::config::Config, String> {
        crate::config::Config::parse(text, "c.toml".as_ref()).map_err(|e| e.to_string())
    }

    #[test]
    #[cfg(feature = "webhook")]
    fn tls_needs_both_files_readable_and_pem_and_lets_a_lan_address_listen() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        let conf = |extra: &str| format!("[webhooks]\nlisten = \"0.0.0.0:8787\"\n{extra}");
        let only = parse(&conf(&format!("tls_cert = \"{}\"\n", cert.display()))).unwrap_err();
        assert!(only.contains("c.toml:3:") && only.contains("tls_cert needs tls_key too"), "{only}");
        let both = format!("tls_cert = \"{}\"\ntls_key = \"{}\"\n", cert.display(), key.display());
        let missing = parse(&conf(&both)).unwrap_err();
        assert!(
            missing.contains("c.toml:3:") && missing.contains("tls_cert") && missing.contains("cannot be read"),
            "{missing}"
        );
        std::fs::write(&cert, "not pem").unwrap();
        let bad = parse(&conf(&both)).unwrap_err();
        assert!(bad.contains("holds no PEM certificate"), "{bad}");
        // A certificate (any well-formed one: the pair is matched when the listener starts) and no key in the key file.
        let pem = "-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n";
        std::fs::write(&cert, pem).unwrap();
        std::fs::write(&key, pem).unwrap();
        let nokey = parse(&conf(&both)).unwrap_err();
        assert!(
            nokey.contains("c.toml:4:") && nokey.contains("tls_key") && nokey.contains("no PEM private key"),
            "{nokey}"
        );
        std::fs::write(&key, "-----BEGIN PRIVATE KEY-----\nMAA=\n-----END PRIVATE KEY-----\n").unwrap();
        let c = parse(&conf(&both)).unwrap();
        assert!(c.webhooks.tls() && c.webhooks.refusal().is_none(), "a LAN address with TLS");
    }

    #[test]
    #[cfg(feature = "webhook")]
    fn endpoints_and_targets_read_and_refuse_what_is_unsafe() {
        let c = parse(
            "[[webhook]]\nname = \"door\"\nsecret_env = \"DOOR_SECRET\"\nmessage = \"Door: {payload.state}\"\n\
             deliver = [\"log\"]\n\n[[webhook]]\nname = \"red\"\ntoken_env = \"RED\"\nurl = \"http://192.168.1.5:1880/in\"\n\
             allow_http = true\n",
        )
        .unwrap();
        assert_eq!(c.webhook.len(), 2);
        assert_eq!(c.webhook[0].max_body, super::WEBHOOK_MAX_BODY);
        assert!(c.webhooks.refusal().is_none(), "loopback by default");
        for (text, says) in [
            ("name = \"Door\"\nsecret_env = \"S\"\nmessage = \"x\"", "not a webhook name"),
            ("name = \"d\"\nmessage = \"x\"", "exactly one of `secret_env`"),
            ("name = \"d\"\nsecret_env = \"S\"\ntoken_env = \"T\"\nmessage = \"x\"", "exactly one"),
            ("name = \"d\"\nsecret_env = \"S\"", "does nothing"),
            ("name = \"d\"\nsecret_env = \"S\"\nmessage = \"x\"\njob = \"y\"", "not both"),
            ("name = \"d\"\nsecret_env = \"S\"\nurl = \"http://example.com/x\"\nallow_http = true", "use https"),
            ("name = \"d\"\nsecret_env = \"S\"\nurl = \"http://127.0.0.1:9/x\"", "allow_http = true"),
        ] {
            let err = parse(&format!("[[webhook]]\n{text}\n")).unwrap_err();
            assert!(err.contains(says) && err.starts_with("c.toml:"), "{text}: {err}");
        }
        let twice = "[[webhook]]\nname = \"d\"\nsecret_env = \"S\"\nmessage = \"x\"\n";
        assert!(parse(&format!("{twice}{twice}")).unwrap_err().contains("two [[webhook]] tables are named `d`"));
        let nowhere = "[[webhook]]\nname = \"d\"\nsecret_env = \"S\"\nmessage = \"x\"\ndeliver = [\"webhook:gone\"]\n";
        assert!(parse(nowhere).unwrap_err().contains("no [[webhook]] named `gone` has a `url`"));
        let open = parse("[webhooks]\nlisten = \"0.0.0.0:8787\"\n").unwrap();
        assert!(open.webhooks.refusal().unwrap().contains("allow_plain"));
    }

    #[test]
    fn lan_hosts() {
        for h in ["127.0.0.1", "192.168.1.2", "[::1]", "nodered.local", "homeassistant", "fd00::1"] {
            assert!(super::is_lan_host(h), "{h}");
        }
        for h in ["example.com", "8.8.8.8", "[2001:db8::1]"] {
            assert!(!super::is_lan_host(h), "{h}");
        }
    }
}
