//! The Home Assistant channel: reports out to the companion app
//! (`ha:notify.<service>`), state changes in (`[[homeassistant.trigger]]`).
//!
//! ## Layout
//!
//! - this file: [`NotifyChannel`], the `ha` delivery channel, and what
//!   `bramble status` / `bramble check` say about `[homeassistant]`.
//! - [`events`]: Home Assistant's WebSocket API on [`crate::clients::ws`] — auth, `subscribe_events`,
//!   the connection task with its backoff and its state file.
//! - [`state_triggers`]: which events fire which trigger (globs, `from`/`to`, `for`,
//!   `min_interval`), and their runs through [`crate::work::firing`].
//!
//! The protocol clients are in `clients/` (`ha_rest`, `ws`), a layer
//! below; the REST tools (`tools::homeassistant`) and this channel's
//! notifications share one [`HaRest`].

pub mod events;
pub mod state_triggers;

use std::sync::Arc;

use serde_json::json;

use crate::bus::Target;
use crate::clients::ha_rest::HaRest;
use crate::clients::ws;
use crate::config::Config;
use crate::delivery::{Channel, DeliveryError, Report};
use crate::util::BoxFuture;

/// The `ha` delivery channel: `ha:notify.<service>` posts the report to
/// `/api/services/notify/<service>` as `{"message", "title": "bramble"}`.
pub struct NotifyChannel {
    rest: Arc<HaRest>,
}

impl NotifyChannel {
    pub fn new(rest: Arc<HaRest>) -> NotifyChannel {
        NotifyChannel { rest }
    }
}

impl Channel for NotifyChannel {
    fn name(&self) -> &'static str {
        "ha"
    }

    fn deliver<'a>(&'a self, report: Report<'a>) -> BoxFuture<'a, Result<(), DeliveryError>> {
        Box::pin(async move {
            let Target::HomeAssistant(service) = report.target else {
                return Err(DeliveryError::permanent(format!("`{}` is not a Home Assistant target", report.target)));
            };
            let body = json!({"message": report.text_naming_files(), "title": "bramble"});
            match self.rest.call_service("notify", service, &body).await {
                Ok(_) => Ok(()),
                Err(e) if e.retryable() => Err(DeliveryError::retryable(e.to_string())),
                Err(e) => Err(DeliveryError::permanent(e.to_string())),
            }
        })
    }
}

/// `bramble doctor`: the REST API answers `GET /api/` with the token and,
/// when triggers need it, the WebSocket API logs in. `Ok(None)` without `[homeassistant]`.
pub async fn probe(c: &crate::config::HomeAssistantConfig) -> Result<Option<String>, String> {
    let rest = match HaRest::from_config(c) {
        Ok(None) => return Ok(None),
        Ok(Some(rest)) => rest,
        Err(e) => return Err(e.to_string()),
    };
    rest.request("/api/", None).await.map_err(|e| e.to_string())?;
    let mut found = format!("{}: the REST API accepts the token", rest.base());
    if !c.trigger.is_empty() {
        let endpoint = ws::Endpoint::under(rest.base(), "/api/websocket")?;
        let socket = events::login(&endpoint, rest.token())
            .await
            .map_err(|e| format!("{}: {}", endpoint.describe(), rest.scrub(&e.to_string())))?;
        socket.close().await;
        found.push_str(&format!(", and so does the WebSocket API ({} trigger(s))", c.trigger.len()));
    }
    Ok(Some(found))
}

/// `bramble status`: where Home Assistant is, whether there is a token, the
/// WebSocket's last state as the daemon recorded it, the triggers and the allow list.
pub fn status_line(c: &Config, state_dir: &std::path::Path) -> String {
    let ha = &c.homeassistant;
    let Some(url) = &ha.url else { return "not configured".into() };
    let token = match ha.token() {
        Some(_) => "token set".to_string(),
        None => format!("token MISSING: set {}", ha.token_env()),
    };
    let ws = if ha.trigger.is_empty() {
        "websocket not used (no triggers)".to_string()
    } else {
        format!("websocket {}", events::StateFile::new(state_dir).describe())
    };
    let allow: Vec<&str> = ha.allow.iter().map(|g| g.as_str()).collect();
    format!(
        "{} ({token}); {ws}; {} trigger(s); tools may touch {}",
        url.as_str(),
        ha.trigger.len(),
        if allow.is_empty() { "nothing ([homeassistant] allow is empty)".to_string() } else { allow.join(", ") }
    )
}

/// `bramble check`: what would keep Home Assistant from working as configured.
pub fn check_warnings(c: &Config) -> Vec<String> {
    let ha = &c.homeassistant;
    let mut out = Vec::new();
    let uses_target = |targets: &[Target]| targets.iter().any(|t| matches!(t, Target::HomeAssistant(_)));
    let elsewhere = uses_target(&c.alerts.deliver)
        || uses_target(&c.heartbeat.deliver)
        || c.mqtt.trigger.iter().any(|t| uses_target(&t.deliver));
    match &ha.url {
        None if !ha.trigger.is_empty() || !ha.allow.is_empty() || elsewhere => out.push(
            "Home Assistant is used (triggers, allow or an ha:notify target) but [homeassistant] has no `url`: \
             it stays off and ha:notify reports wait in the outbox"
                .to_string(),
        ),
        Some(_) if ha.token().is_none() => out.push(format!(
            "[homeassistant] has no token: set {} (a long-lived access token); Home Assistant stays off",
            ha.token_env()
        )),
        Some(_) if ha.allow.is_empty() => {
            out.push("[homeassistant] allow is empty: the ha_* tools may touch nothing".to_string())
        }
        _ => {}
    }
    if let Some(url) = &ha.url {
        if url.as_str().trim_end_matches('/').ends_with("/api") {
            out.push(format!("[homeassistant] url `{}` should be the base URL, without /api", url.as_str()));
        }
    }
    for t in &ha.trigger {
        if let crate::config::TriggerAction::Message(template) = &t.action {
            let unknown = state_triggers::unknown_fields(template);
            if !unknown.is_empty() {
                out.push(format!(
                    "trigger `{}`: {} stay as written; a Home Assistant template knows {{entity}}, {{name}}, \
                     {{from}}, {{to}}, {{attributes.<name>}} and {{old_attributes.<name>}}",
                    t.label(),
                    unknown.join(", ")
                ));
            }
        }
        for target in &t.deliver {
            if let Target::Telegram(_) = target {
                if c.telegram.token().is_none() {
                    out.push(format!("trigger `{}` delivers to {target} but Telegram is not configured", t.label()));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Config {
        Config::parse(text, "c.toml".as_ref()).unwrap()
    }

    #[test]
    fn check_says_what_keeps_home_assistant_off() {
        let w = check_warnings(&parse("[alerts]\ndeliver = [\"ha:notify.mobile_app_x\"]\n"));
        assert!(w[0].contains("no `url`"), "{w:?}");
        let w = check_warnings(&parse(
            "[homeassistant]\nurl = \"http://ha:8123\"\ntoken_env = \"BRAMBLE_TEST_UNSET_HA\"\n",
        ));
        assert!(w[0].contains("no token: set BRAMBLE_TEST_UNSET_HA"), "{w:?}");
        let w = check_warnings(&parse("[homeassistant]\nurl = \"http://ha:8123/api\"\ntoken = \"t\"\n"));
        assert!(w.iter().any(|l| l.contains("allow is empty")) && w.iter().any(|l| l.contains("without /api")));
        let w = check_warnings(&parse(
            "[homeassistant]\nurl = \"http://ha:8123\"\ntoken = \"t\"\nallow = [\"light.*\"]\n\
             [[homeassistant.trigger]]\nentity_id = \"sensor.x\"\nmessage = \"{entity} is {payload}\"\n",
        ));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].starts_with("trigger `sensor.x`: {payload} stay as written"), "{w:?}");
        assert!(check_warnings(&parse("")).is_empty());
    }

    #[test]
    fn status_never_shows_the_token() {
        let c = parse("[homeassistant]\nurl = \"http://ha:8123\"\ntoken = \"s3cr3t-token\"\nallow = [\"light.*\"]\n");
        let line = status_line(&c, std::path::Path::new("/nonexistent"));
        assert!(line.starts_with("http://ha:8123 (token set); websocket not used"), "{line}");
        assert!(!line.contains("s3cr3t"));
    }
}
