//! What `bramble status` and `bramble doctor` say about webhooks: the
//! listening address and the endpoints; whether the address can be bound
//! (or is the running daemon's), the secrets are set, and the targets' hosts
//! answer a TCP connection (nothing is posted: a probe carries no report).

use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::config::{Config, WebhookAction, WebhookAuth, WebhookConfig};

fn describe(w: &WebhookConfig) -> String {
    let auth = match w.auth {
        WebhookAuth::Hmac { .. } => "signed",
        WebhookAuth::Bearer { .. } => "bearer",
    };
    match &w.action {
        Some(WebhookAction::Job(job)) => format!("{} ({auth}, runs job {job})", w.name),
        Some(WebhookAction::Message(_)) => format!("{} ({auth}, a turn)", w.name),
        None => String::new(),
    }
}

/// `bramble status`'s line: where it listens, the endpoints, the targets.
pub fn status_line(c: &Config) -> String {
    if c.webhook.is_empty() {
        return "not configured".into();
    }
    let endpoints: Vec<String> = c.webhook.iter().filter(|w| w.action.is_some()).map(describe).collect();
    let targets: Vec<&str> = c.webhook.iter().filter(|w| w.url.is_some()).map(|w| w.name.as_str()).collect();
    let listen = match c.webhooks.refusal() {
        _ if endpoints.is_empty() => "no endpoints".to_string(),
        Some(why) => format!("OFF: {why}"),
        None => {
            let up = TcpStream::connect_timeout(&c.webhooks.listen, Duration::from_secs(1)).is_ok();
            let state = if up { "listening" } else { "NOT listening (is the daemon running?)" };
            let scheme = if c.webhooks.tls() { "https" } else { "http" };
            format!("{scheme}://{}/hook/<name> {state}; endpoints: {}", c.webhooks.listen, endpoints.join(", "))
        }
    };
    let out =
        if targets.is_empty() { String::new() } else { format!("; targets: webhook:{}", targets.join(", webhook:")) };
    format!("{listen}{out}")
}

/// `bramble doctor`'s check: `None` when nothing is configured, else what
/// was found, or the first problem. `daemon_running`: a daemon holds the
/// state directory (then the address in use is its own).
pub fn probe(c: &Config, daemon_running: bool, limit: Duration) -> Result<Option<String>, String> {
    if c.webhook.is_empty() {
        return Ok(None);
    }
    let mut found = Vec::new();
    for w in &c.webhook {
        if w.auth.secret().is_none() {
            return Err(format!(
                "webhook `{}`: `{}` is not set: export it (or give the service a credential of that name)",
                w.name,
                w.auth.env()
            ));
        }
    }
    if c.webhook.iter().any(|w| w.action.is_some()) {
        if let Some(why) = c.webhooks.refusal() {
            return Err(why);
        }
        found.push(listen_state(c.webhooks.listen, daemon_running)?);
    }
    for w in c.webhook.iter().filter(|w| w.url.is_some()) {
        let url = w.url.as_ref().map(|u| u.as_str()).unwrap_or_default();
        found.push(reach(&w.name, url, limit)?);
    }
    Ok(Some(found.join("; ")))
}

fn listen_state(addr: SocketAddr, daemon_running: bool) -> Result<String, String> {
    match TcpListener::bind(addr) {
        Ok(_) => Ok(format!("{addr} can be bound")),
        Err(_) if daemon_running => Ok(format!("{addr} in use (by the running daemon)")),
        Err(e) => {
            Err(format!("cannot listen on {addr} ({e}): another program uses the port; change [webhooks] listen"))
        }
    }
}

fn reach(name: &str, url: &str, limit: Duration) -> Result<String, String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("webhook `{name}`: {e}"))?;
    let host = parsed.host_str().unwrap_or_default().trim_start_matches('[').trim_end_matches(']').to_string();
    let port = parsed.port_or_known_default().unwrap_or(443);
    let addr = (host.as_str(), port).to_socket_addrs().ok().and_then(|mut a| a.next());
    match addr.map(|a| TcpStream::connect_timeout(&a, limit)) {
        Some(Ok(_)) => Ok(format!("webhook:{name} reachable")),
        Some(Err(e)) => {
            Err(format!("webhook:{name}: {host}:{port} is not reachable ({e}); its reports wait in the outbox"))
        }
        None => Err(format!("webhook:{name}: cannot resolve {host}")),
    }
}
