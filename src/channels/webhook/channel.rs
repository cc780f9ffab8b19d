//! The `webhook:<name>` delivery target: a report POSTed as JSON
//! (`{source, job, text, time, id}`) to the `[[webhook]]`'s `url`, signed
//! like an inbound call (or with its bearer token), with the outbox report's
//! id as the idempotency id: every retry of one report carries the same `id`
//! (body and `X-Bramble-Id`), so a receiver drops a duplicate by it.
//!
//! Failures are sorted for the outbox honestly: no answer, a timeout, `408`,
//! `429` and `5xx` are retried with its backoff; another `4xx` is the
//! receiver's refusal of this report (dropped, logged); a redirect to another
//! origin is not followed (the report would carry its signature somewhere the
//! user did not say) and counts as a refusal too. A secret that is not set
//! keeps the report waiting: nothing is lost while the config is fixed.

use std::collections::HashMap;

use crate::bus::{ReportSource, Target};
use crate::clients::webhook::{self as wire, PostAuth, PostError};
use crate::config::{WebhookAuth, WebhookConfig};
use crate::delivery::{Channel, DeliveryError, Report};
use crate::util::BoxFuture;

/// One outbound target.
struct Out {
    url: String,
    auth: WebhookAuth,
}

/// The `webhook` delivery channel.
pub struct WebhookChannel {
    targets: HashMap<String, Out>,
    http: reqwest::Client,
    origin: String,
}

impl WebhookChannel {
    /// The channel for the `[[webhook]]` tables with a `url` (`None`: none has one).
    pub fn new(webhooks: &[WebhookConfig], origin: String) -> Option<WebhookChannel> {
        let targets: HashMap<String, Out> = webhooks
            .iter()
            .filter_map(|w| {
                w.url.as_ref().map(|u| (w.name.clone(), Out { url: u.as_str().to_string(), auth: w.auth.clone() }))
            })
            .collect();
        if targets.is_empty() {
            return None;
        }
        match wire::http_client() {
            Ok(http) => Some(WebhookChannel { targets, http, origin }),
            Err(e) => {
                tracing::error!("webhook targets are off: cannot make an HTTP client: {e}");
                None
            }
        }
    }
}

/// The JSON a report is posted as.
pub fn body(report: &Report<'_>) -> serde_json::Value {
    let job = match report.source {
        ReportSource::Job(name) => Some(name.as_str()),
        _ => None,
    };
    serde_json::json!({
        "source": report.source.to_string(),
        "job": job,
        "text": report.text_naming_files(),
        "time": report.created.to_string(),
        "id": idempotency_id(report),
    })
}

/// The same for every retry of one report: when it was queued and its outbox id.
pub fn idempotency_id(report: &Report<'_>) -> String {
    format!("{}-{}", report.created.as_second(), report.id)
}

impl Channel for WebhookChannel {
    fn name(&self) -> &'static str {
        "webhook"
    }

    fn deliver<'a>(&'a self, report: Report<'a>) -> BoxFuture<'a, Result<(), DeliveryError>> {
        Box::pin(async move {
            let Target::Webhook(name) = report.target else {
                return Err(DeliveryError::permanent(format!("`{}` is not a webhook target", report.target)));
            };
            let Some(out) = self.targets.get(name) else {
                return Err(DeliveryError::permanent(format!(
                    "no [[webhook]] named `{name}` has a `url`: the report cannot be posted"
                )));
            };
            let Some(secret) = out.auth.secret() else {
                return Err(DeliveryError::retryable(format!(
                    "webhook `{name}`: `{}` is not set (a variable or systemd credential); the report waits",
                    out.auth.env()
                )));
            };
            let auth = match out.auth {
                WebhookAuth::Hmac { .. } => PostAuth::Hmac(secret.expose()),
                WebhookAuth::Bearer { .. } => PostAuth::Bearer(secret.expose()),
            };
            let id = idempotency_id(&report);
            let post = wire::Post {
                url: &out.url,
                body: body(&report).to_string().into_bytes(),
                auth,
                id: &id,
                origin: &self.origin,
                now: jiff::Timestamp::now().as_second(),
            };
            match wire::post(&self.http, post).await {
                Ok(_) => Ok(()),
                Err(e) => Err(classify(name, e)),
            }
        })
    }
}

/// Retry what may pass later; refuse what the receiver refused.
fn classify(name: &str, e: PostError) -> DeliveryError {
    let text = format!("webhook `{name}`: {e}");
    match e {
        PostError::Transport(_) => DeliveryError::retryable(text),
        PostError::Status { status, .. } if status == 408 || status == 429 || status >= 500 => {
            DeliveryError::retryable(text)
        }
        PostError::Status { .. } | PostError::Redirect(_) => DeliveryError::permanent(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_posts_its_source_job_text_time_and_id() {
        let target = Target::Webhook("red".into());
        let source = ReportSource::Job("backup".into());
        let created: jiff::Timestamp = "2026-11-27T00:00:00Z".parse().unwrap();
        let report = Report { id: 7, created, ..Report::text(&target, "done", &source) };
        let v = body(&report);
        assert_eq!(v["source"], "job:backup");
        assert_eq!(v["job"], "backup");
        assert_eq!(v["text"], "done");
        assert_eq!(v["time"], "2026-11-27T00:00:00Z");
        assert_eq!(v["id"], format!("{}-7", created.as_second()));
        let agent = ReportSource::Agent;
        assert!(body(&Report::text(&target, "x", &agent))["job"].is_null());
        for (e, retry) in [
            (PostError::Transport("refused".into()), true),
            (PostError::Status { status: 503, body: String::new() }, true),
            (PostError::Status { status: 429, body: String::new() }, true),
            (PostError::Status { status: 404, body: String::new() }, false),
            (PostError::Redirect("https://elsewhere/".into()), false),
        ] {
            assert_eq!(classify("red", e).retryable, retry);
        }
    }
}
