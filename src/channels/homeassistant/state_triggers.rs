//! `[[homeassistant.trigger]]`: which `state_changed` events fire which
//! trigger, and the runs they start.
//!
//! [`Matcher`] is the whole decision, as plain code over explicit instants
//! (tested without a socket or a clock):
//!
//! - an event counts only when the *state* changed (`old_state.state` ≠
//!   `new_state.state`): attribute updates (a battery level, a brightness)
//!   are frequent and are not what a trigger is about;
//! - `entity_id` globs, then `from` (the old state) and `to` (the new one);
//! - `for`: the match waits until the new state has held that long by our
//!   own monotonic clock (HA's `last_changed` is another machine's clock); a
//!   change of that entity's state in between cancels it. A lost connection
//!   cancels every waiting one ([`Matcher::reset`]): what happened during
//!   the outage is unknown, and nothing fires from stale data — nor is a
//!   state seen after the reconnect backdated;
//! - `min_interval`: at most one run per interval per trigger; the events in
//!   between are dropped, counted, and the count logged with the next run.
//!
//! Runs go through a bounded queue to [`run`], at most [`MAX_CONCURRENT`]
//! at once, and do what every trigger does ([`crate::work::firing`]): the
//! `message` template as an agent turn on the `homeassistant` channel (an
//! untrusted origin: entity states and attributes are anyone's text), or the
//! `exec` command with the event's JSON on stdin. Templates know `{entity}`,
//! `{from}`, `{to}`, `{name}` (the friendly name), `{attributes.x}` (of the
//! new state) and `{old_attributes.x}`.

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::bus::Conversation;
use crate::config::{HaTrigger, TriggerAction};
use crate::work::firing::{lookup, text_of, Firing, TriggerDeps};

/// Trigger runs at once (each may hold an LLM turn or a process).
pub const MAX_CONCURRENT: usize = 2;
/// Fired triggers waiting for a run slot; more are dropped with a warning.
pub const QUEUE: usize = 16;
/// `for` matches waiting at once; more are dropped with a warning.
const MAX_PENDING: usize = 256;

/// One `state_changed` event, as the fields triggers look at.
#[derive(Debug, Clone, PartialEq)]
pub struct StateChange {
    pub entity: String,
    /// `old_state.state`; `None` when the entity is new.
    pub from: Option<String>,
    /// `new_state.state`; `None` when it was removed.
    pub to: Option<String>,
    /// The event's `data` as HA sent it (for `exec` stdin and attributes).
    pub data: Value,
}

impl StateChange {
    /// From an `event` message's `event` object; `None` unless it is a `state_changed`.
    pub fn from_event(event: &Value) -> Option<StateChange> {
        if event.get("event_type")?.as_str()? != "state_changed" {
            return None;
        }
        let data = event.get("data")?;
        let state = |key: &str| data.get(key).and_then(|s| s.get("state")).and_then(Value::as_str).map(str::to_string);
        Some(StateChange {
            entity: data.get("entity_id")?.as_str()?.to_string(),
            from: state("old_state"),
            to: state("new_state"),
            data: data.clone(),
        })
    }
}

/// A trigger that fired, with the event that fired it.
#[derive(Debug, Clone)]
pub struct Fire {
    pub index: usize,
    pub change: StateChange,
}

struct Entry {
    config: HaTrigger,
    last: Option<Instant>,
    dropped: u64,
}

struct Pending {
    index: usize,
    change: StateChange,
    due: Instant,
}

/// The triggers' state: rate limits and the `for` matches waiting.
pub struct Matcher {
    entries: Vec<Entry>,
    pending: Vec<Pending>,
}

impl Matcher {
    pub fn new(config: &[HaTrigger]) -> Matcher {
        Matcher {
            entries: config.iter().map(|c| Entry { config: c.clone(), last: None, dropped: 0 }).collect(),
            pending: Vec::new(),
        }
    }

    pub fn config(&self, index: usize) -> Option<&HaTrigger> {
        self.entries.get(index).map(|e| &e.config)
    }

    /// An event arrived at `now`: the triggers that fire now (the `for` ones wait).
    pub fn on_event(&mut self, change: &StateChange, now: Instant) -> Vec<Fire> {
        if change.from == change.to {
            return Vec::new(); // attributes only
        }
        // The state moved on: waiting matches of this entity for another state are off.
        self.pending.retain(|p| {
            let keep = p.change.entity != change.entity || p.change.to == change.to;
            if !keep {
                tracing::debug!(entity = %change.entity, "Home Assistant trigger: the state changed within `for`; cancelled");
            }
            keep
        });
        let mut fires = Vec::new();
        for index in 0..self.entries.len() {
            let c = &self.entries[index].config;
            let matches = c.entity_id.iter().any(|g| g.matches(&change.entity))
                && c.from.as_ref().is_none_or(|f| change.from.as_ref() == Some(f))
                && c.to.as_ref().is_none_or(|t| change.to.as_ref() == Some(t));
            if !matches {
                continue;
            }
            match c.hold {
                Some(hold) if !hold.get().is_zero() => {
                    if self.pending.iter().any(|p| p.index == index && p.change.entity == change.entity) {
                        continue;
                    }
                    if self.pending.len() >= MAX_PENDING {
                        tracing::warn!(entity = %change.entity, "too many Home Assistant triggers waiting on `for`: event dropped");
                        continue;
                    }
                    self.pending.push(Pending { index, change: change.clone(), due: now + hold.get() });
                }
                _ => fires.extend(self.rate_limited(index, change.clone(), now)),
            }
        }
        fires
    }

    /// The `for` matches whose time has come at `now`.
    pub fn due(&mut self, now: Instant) -> Vec<Fire> {
        let (ready, waiting): (Vec<Pending>, Vec<Pending>) = self.pending.drain(..).partition(|p| p.due <= now);
        self.pending = waiting;
        ready.into_iter().filter_map(|p| self.rate_limited(p.index, p.change, now)).collect()
    }

    /// When the next `for` match is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.pending.iter().map(|p| p.due).min()
    }

    /// The connection was lost: what waited on `for` is unknown now. How many were dropped.
    pub fn reset(&mut self) -> usize {
        let n = self.pending.len();
        self.pending.clear();
        n
    }

    fn rate_limited(&mut self, index: usize, change: StateChange, now: Instant) -> Option<Fire> {
        let e = self.entries.get_mut(index)?;
        if e.last.is_some_and(|l| now.duration_since(l) < e.config.min_interval.get()) {
            e.dropped += 1;
            tracing::debug!(trigger = %e.config.label(), entity = %change.entity, dropped = e.dropped, "Home Assistant trigger rate-limited: event dropped");
            return None;
        }
        e.last = Some(now);
        if e.dropped > 0 {
            tracing::info!(
                trigger = %e.config.label(), dropped = e.dropped,
                "{} event(s) dropped by the trigger's min_interval ({}) since its last run",
                e.dropped, e.config.min_interval
            );
            e.dropped = 0;
        }
        Some(Fire { index, change })
    }
}

/// Render a trigger's `message` for a change.
pub fn render(template: &str, change: &StateChange) -> String {
    let attrs = |key: &str| change.data.get(key).and_then(|s| s.get("attributes"));
    crate::work::firing::render(template, |name| match name {
        "entity" => Some(change.entity.clone()),
        "from" => Some(change.from.clone().unwrap_or_else(|| "(none)".into())),
        "to" => Some(change.to.clone().unwrap_or_else(|| "(removed)".into())),
        "name" => Some(
            attrs("new_state")
                .or_else(|| attrs("old_state"))
                .and_then(|a| a.get("friendly_name"))
                .map(text_of)
                .unwrap_or_else(|| change.entity.clone()),
        ),
        _ => {
            let (state, path) = match name.split_once('.')? {
                ("attributes", path) => ("new_state", path),
                ("old_attributes", path) => ("old_state", path),
                _ => return None,
            };
            Some(match attrs(state).and_then(|a| lookup(a, path)) {
                Some(v) => text_of(v),
                None => format!("(no attribute `{path}`)"),
            })
        }
    })
}

/// The `{names}` in a template that [`render`] does not know (`bramble check`:
/// `{payload}` copied from an MQTT trigger would stay as written).
pub fn unknown_fields(template: &str) -> Vec<String> {
    let mut unknown = Vec::new();
    crate::work::firing::render(template, |name| {
        let known = matches!(name, "entity" | "from" | "to" | "name")
            || name
                .strip_prefix("attributes.")
                .or_else(|| name.strip_prefix("old_attributes."))
                .is_some_and(|p| !p.is_empty());
        if !known {
            unknown.push(format!("{{{name}}}"));
        }
        None
    });
    unknown
}

/// Run fired triggers until `stop`; runs in flight end or are cancelled by `abort`.
pub async fn run(
    config: Arc<[HaTrigger]>,
    mut rx: mpsc::Receiver<Fire>,
    deps: TriggerDeps,
    stop: CancellationToken,
    abort: CancellationToken,
) {
    let deps = Arc::new(deps);
    let mut running = crate::util::tasks::run_bounded(&mut rx, MAX_CONCURRENT, &stop, |fire: Fire| {
        let trigger = config.get(fire.index).cloned();
        let (deps, abort) = (deps.clone(), abort.clone());
        async move {
            let Some(t) = trigger else { return };
            let label = t.label();
            let text = match &t.action {
                TriggerAction::Message(template) => render(template, &fire.change),
                TriggerAction::Exec(_) => String::new(),
            };
            let entity = fire.change.entity.clone();
            let firing = Firing {
                action: &t.action,
                conversation: Conversation::new(
                    crate::bus::Channel::HomeAssistant,
                    entity.clone(),
                    format!("trigger:{label}"),
                ),
                text,
                stdin: fire.change.data.to_string().into_bytes(),
                deliver: &t.deliver,
                label: &label,
                source: crate::bus::ReportSource::Trigger(entity),
            };
            crate::work::firing::fire(firing, &deps, &abort).await;
        }
    })
    .await;
    while running.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    fn triggers(text: &str) -> Vec<HaTrigger> {
        crate::config::Config::parse(text, "c.toml".as_ref()).unwrap().homeassistant.trigger
    }

    fn change(entity: &str, from: &str, to: &str) -> StateChange {
        let event = json!({"event_type": "state_changed", "data": {
            "entity_id": entity,
            "old_state": {"state": from, "attributes": {"friendly_name": "Front door", "battery": 80}},
            "new_state": {"state": to, "attributes": {"friendly_name": "Front door", "battery": 79}},
        }});
        StateChange::from_event(&event).unwrap()
    }

    const DOOR: &str = "[[homeassistant.trigger]]\nentity_id = \"binary_sensor.*_door\"\nfrom = \"off\"\nto = \"on\"\n\
                        message = \"m\"\nmin_interval = \"0s\"\n";

    #[test]
    fn globs_and_from_to_filter() {
        let mut m = Matcher::new(&triggers(DOOR));
        let now = Instant::now();
        assert_eq!(m.on_event(&change("binary_sensor.front_door", "off", "on"), now).len(), 1);
        assert!(m.on_event(&change("binary_sensor.front_door", "on", "off"), now).is_empty(), "to");
        assert!(m.on_event(&change("binary_sensor.front_door", "unavailable", "on"), now).is_empty(), "from");
        assert!(m.on_event(&change("binary_sensor.front_window", "off", "on"), now).is_empty(), "glob");
        assert!(m.on_event(&change("binary_sensor.front_door", "on", "on"), now).is_empty(), "attributes only");
        let other = json!({"event_type": "call_service", "data": {}});
        assert!(StateChange::from_event(&other).is_none());
    }

    #[test]
    fn for_fires_after_the_hold_and_a_change_cancels_it() {
        let mut m = Matcher::new(&triggers(&format!("{DOOR}for = \"2m\"\n")));
        let t0 = Instant::now();
        assert!(m.on_event(&change("binary_sensor.front_door", "off", "on"), t0).is_empty());
        assert_eq!(m.next_due(), Some(t0 + Duration::from_secs(120)));
        assert!(m.due(t0 + Duration::from_secs(119)).is_empty());
        assert_eq!(m.due(t0 + Duration::from_secs(120)).len(), 1, "held for 2 minutes");
        assert!(m.next_due().is_none());
        // Opened, closed within the minute: nothing.
        m.on_event(&change("binary_sensor.front_door", "off", "on"), t0);
        m.on_event(&change("binary_sensor.front_door", "on", "off"), t0 + Duration::from_secs(60));
        assert!(m.due(t0 + Duration::from_secs(600)).is_empty(), "cancelled");
        // A reconnect forgets what waited.
        m.on_event(&change("binary_sensor.front_door", "off", "on"), t0);
        assert_eq!(m.reset(), 1);
        assert!(m.due(t0 + Duration::from_secs(600)).is_empty());
    }

    #[test]
    fn min_interval_drops_a_burst() {
        let t =
            triggers("[[homeassistant.trigger]]\nentity_id = \"sensor.*\"\nexec = \"cat\"\nmin_interval = \"10s\"\n");
        let mut m = Matcher::new(&t);
        let t0 = Instant::now();
        let fired: usize =
            (0..5).map(|i| m.on_event(&change("sensor.a", &i.to_string(), &(i + 1).to_string()), t0).len()).sum();
        assert_eq!(fired, 1);
        assert_eq!(m.entries[0].dropped, 4);
        assert_eq!(m.on_event(&change("sensor.a", "1", "2"), t0 + Duration::from_secs(11)).len(), 1);
        assert_eq!(m.entries[0].dropped, 0);
    }

    #[test]
    fn templates_name_the_entity_states_and_attributes() {
        let c = change("binary_sensor.front_door", "off", "on");
        let text = render("{name} ({entity}): {from} → {to}, battery {attributes.battery} (was {old_attributes.battery}), {attributes.nope} {other}", &c);
        assert_eq!(
            text,
            "Front door (binary_sensor.front_door): off → on, battery 79 (was 80), (no attribute `nope`) {other}"
        );
        assert_eq!(
            unknown_fields("{entity} {payload.x} {attributes.a.b} {attributes.} {to}"),
            ["{payload.x}", "{attributes.}"]
        );
    }
}
