//! `[[mqtt.trigger]]`: a message on a topic starts work.
//!
//! A trigger's `message` template is rendered with the topic and payload
//! (`{topic}`, `{payload}`, `{payload.field.sub}` from a JSON payload) and run
//! as an agent turn directly (`in_job`: triggered work, not chat); an `exec`
//! trigger runs its command with the payload on stdin and no LLM. Results go
//! to the trigger's targets through the outbox, source `trigger:<topic>`.
//!
//! A chatty sensor must not run up an LLM bill: each trigger runs at most once
//! per `min_interval`; messages in between are dropped and counted, and the
//! count is logged with the next run. Matching and the rate limit happen in
//! the MQTT polling task without waiting; runs happen in [`run`], at most
//! [`MAX_CONCURRENT`] at a time, fed through a bounded queue. What a run does
//! (the turn or command, the report) and the template renderer are shared with
//! Home Assistant's triggers in [`crate::work::firing`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{TurnLimit, TurnRate};
use crate::bus::Conversation;
use crate::config::MqttTrigger;
pub use crate::work::firing::TriggerDeps;
use crate::work::firing::{lookup, text_of, Firing};

/// Trigger runs at once (each may hold an LLM turn or a process).
pub const MAX_CONCURRENT: usize = 2;
/// Matched messages waiting for a run slot; more are dropped with a warning.
const QUEUE: usize = 16;

/// One matched message, waiting to run.
pub struct Fire {
    index: usize,
    topic: String,
    payload: Vec<u8>,
}

struct Entry {
    config: MqttTrigger,
    last: Mutex<Option<Instant>>,
    dropped: AtomicU64,
}

/// The configured triggers and the queue to their runner.
pub struct Triggers {
    entries: Vec<Entry>,
    queue: Option<mpsc::Sender<Fire>>,
    /// Model turns the message triggers may start together ([`TurnLimit`]):
    /// each trigger's `min_interval` bounds one trigger, this bounds them all.
    turns: TurnLimit,
}

impl Triggers {
    /// The triggers, and the receiving end of their queue (`None` without triggers).
    pub fn new(config: &[MqttTrigger], rate: TurnRate) -> (Triggers, Option<mpsc::Receiver<Fire>>) {
        let turns = TurnLimit::new(rate, "the message triggers");
        let entries: Vec<Entry> = config
            .iter()
            .map(|c| Entry { config: c.clone(), last: Mutex::new(None), dropped: AtomicU64::new(0) })
            .collect();
        if entries.is_empty() {
            return (Triggers { entries, queue: None, turns }, None);
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        (Triggers { entries, queue: Some(tx), turns }, Some(rx))
    }

    /// A message arrived: queue a run for every trigger that matches and is
    /// not rate-limited. Never waits.
    pub fn dispatch(&self, topic: &str, payload: &[u8]) {
        let Some(queue) = &self.queue else { return };
        let now = Instant::now();
        for (index, e) in self.entries.iter().enumerate() {
            if !crate::util::mqtt::topic_matches(&e.config.topic, topic) {
                continue;
            }
            {
                let mut last = e.last.lock().unwrap_or_else(|p| p.into_inner());
                if last.is_some_and(|l| now.duration_since(l) < e.config.min_interval.get()) {
                    let n = e.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                    tracing::debug!(trigger = %e.config.topic, topic, dropped = n, "trigger rate-limited: message dropped");
                    continue;
                }
                let model = matches!(e.config.action, crate::config::TriggerAction::Message(_));
                if model && !self.turns.allow() {
                    continue;
                }
                *last = Some(now);
            }
            let dropped = e.dropped.swap(0, Ordering::Relaxed);
            if dropped > 0 {
                tracing::info!(
                    trigger = %e.config.topic, dropped,
                    "{dropped} message(s) dropped by the trigger's min_interval ({}) since its last run",
                    e.config.min_interval
                );
            }
            let fire = Fire { index, topic: topic.to_string(), payload: payload.to_vec() };
            if queue.try_send(fire).is_err() {
                tracing::warn!(trigger = %e.config.topic, topic, "too many trigger runs waiting: message dropped");
            }
        }
    }
}

/// Run queued triggers until `stop`; runs in flight end or are cancelled by `abort`.
pub async fn run(
    triggers: Arc<Triggers>,
    mut rx: mpsc::Receiver<Fire>,
    deps: TriggerDeps,
    stop: CancellationToken,
    abort: CancellationToken,
) {
    let deps = Arc::new(deps);
    let mut running = crate::util::tasks::run_bounded(&mut rx, MAX_CONCURRENT, &stop, |fire: Fire| {
        let entry = triggers.entries.get(fire.index).map(|e| e.config.clone());
        let deps = deps.clone();
        let abort = abort.clone();
        async move {
            if let Some(config) = entry {
                fire_one(&config, fire, &deps, &abort).await;
            }
        }
    })
    .await;
    while running.join_next().await.is_some() {}
}

async fn fire_one(config: &MqttTrigger, fire: Fire, deps: &TriggerDeps, abort: &CancellationToken) {
    let text = match &config.action {
        crate::config::TriggerAction::Message(template) => render(template, &fire.topic, &fire.payload),
        crate::config::TriggerAction::Exec(_) => String::new(),
    };
    let firing = Firing {
        action: &config.action,
        conversation: Conversation::new(
            crate::bus::Channel::Mqtt,
            fire.topic.clone(),
            format!("trigger:{}", config.topic),
        ),
        text,
        stdin: fire.payload,
        deliver: &config.deliver,
        label: &config.topic,
        source: crate::bus::ReportSource::Trigger(fire.topic.clone()),
    };
    crate::work::firing::fire(firing, deps, abort).await;
}

/// Render a trigger template: `{topic}`, `{payload}`, and `{payload.a.b}` /
/// `{payload.list.0}` from a JSON payload. A missing field or a payload that
/// is not JSON renders as a short note in parentheses; other braces stay as written.
pub fn render(template: &str, topic: &str, payload: &[u8]) -> String {
    let text = String::from_utf8_lossy(payload);
    let mut json: Option<Result<Value, ()>> = None;
    crate::work::firing::render(template, |name| match name {
        "topic" => Some(topic.to_string()),
        "payload" => Some(text.to_string()),
        _ => {
            let path = name.strip_prefix("payload.")?;
            let value = json.get_or_insert_with(|| serde_json::from_str::<Value>(&text).map_err(|_| ()));
            Some(match value {
                Ok(v) => match lookup(v, path) {
                    Some(v) => text_of(v),
                    None => format!("(no field `{path}` in the payload)"),
                },
                Err(()) => format!("(no field `{path}`: the payload is not JSON)"),
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn templates_render_topic_payload_and_fields() {
        let p = br#"{"contact":false,"battery":97,"nested":{"a":[1,"two"]}}"#;
        assert_eq!(render("{topic}: {payload.contact}", "z/door", p), "z/door: false");
        assert_eq!(render("b={payload.battery}%", "t", p), "b=97%");
        assert_eq!(render("{payload.nested.a.1}", "t", p), "two");
        assert_eq!(render("{payload.nested}", "t", p), r#"{"a":[1,"two"]}"#);
        assert_eq!(render("{payload.missing.x}", "t", p), "(no field `missing.x` in the payload)");
        assert_eq!(render("{payload.x}", "t", b"open"), "(no field `x`: the payload is not JSON)");
        assert_eq!(render("raw {payload}", "t", b"open"), "raw open");
        assert_eq!(render("{other} and {unclosed", "t", b""), "{other} and {unclosed");
        assert_eq!(render("ü{payload}ü", "t", "é".as_bytes()), "üéü");
    }

    fn trigger(topic: &str, min_interval: &str) -> MqttTrigger {
        let text =
            format!("[[mqtt.trigger]]\ntopic = \"{topic}\"\nexec = \"cat\"\nmin_interval = \"{min_interval}\"\n");
        crate::config::Config::parse(&text, "c.toml".as_ref()).unwrap().mqtt.trigger.remove(0)
    }

    #[tokio::test(start_paused = true)]
    async fn the_rate_limit_drops_a_burst() {
        let (t, rx) = Triggers::new(&[trigger("sensors/+/motion", "10s")], TurnRate { per_minute: 0, burst: 0 });
        let mut rx = rx.unwrap();
        for _ in 0..5 {
            t.dispatch("sensors/hall/motion", b"1");
        }
        t.dispatch("sensors/hall/other", b"1");
        assert!(rx.try_recv().is_ok());
        assert!(rx.try_recv().is_err(), "one run per interval");
        assert_eq!(t.entries[0].dropped.load(Ordering::Relaxed), 4);
        tokio::time::advance(Duration::from_secs(11)).await;
        t.dispatch("sensors/hall/motion", b"1");
        assert!(rx.try_recv().is_ok());
        assert_eq!(t.entries[0].dropped.load(Ordering::Relaxed), 0, "the count is reset when logged");
    }
}
