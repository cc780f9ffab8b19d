//! The two Home Assistant tools, `ha_call_service` and `ha_get_state`, on
//! the REST client [`HaRest`] (`clients::ha_rest`).
//!
//! ## Why it is shaped like this
//!
//! - **The operator's URL, not the model's.** Every request goes to
//!   `[homeassistant] url`, a LAN address the owner wrote down, so the
//!   `web_fetch` SSRF guard (and `[web] allow_private`) does not apply. What
//!   the model does choose — domain, service, entity ids — goes into the
//!   *path*, so each is checked to be a plain `[a-z0-9_]` name first: no
//!   `../`, no query string.
//! - **An allow list is the boundary.** `[homeassistant] allow` lists entity
//!   patterns (`light.*`, `switch.kitchen_*`); a service call is checked on
//!   both what it calls and what it targets. Every entity it names —
//!   `entity_id`, `data.entity_id` and `data.target.entity_id` alike — must
//!   be allowed, and so must the service: `domain.service` listed by name, or
//!   a service of the entities' own domain (`light.turn_on` on lights). An
//!   allowed entity is no alibi for another domain's service
//!   (`script.unlock_front_door` naming `light.kitchen` is refused), and a
//!   service without an entity (`notify.mobile_app_pixel`) is judged by its
//!   name. `area_id`, `device_id`, `floor_id` and `label_id` (in `data` or
//!   its `target`) are refused: they expand to entities inside Home
//!   Assistant, where the list cannot see them. Empty list: nothing is allowed.
//! - **Who is asking.** Untrusted turns (MQTT, Home Assistant triggers, see
//!   [`super::Origin`]) cannot call services: anyone on the broker, or any
//!   device whose state reaches a trigger's text, would otherwise drive the
//!   house. They may *read* allowed entities' states: a trigger often needs
//!   another sensor's value, and a read changes nothing.
//! - **The token and the size** are the client's: never in an error, a
//!   response read up to [`crate::clients::ha_rest::BODY_CAP`]; the registry
//!   cuts what the model sees to `max_tool_result_chars`.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{parse_args, Tool, ToolContext, ToolError};
use crate::clients::ha_rest::{HaError, HaRest};
use crate::config::EntityGlob;
use crate::util::BoxFuture;

/// Keys of a service call's data (or of its `target`) that select entities the allow list cannot see.
const INDIRECT: [&str; 4] = ["area_id", "device_id", "floor_id", "label_id"];

/// Whether `name` is a plain Home Assistant name: `[a-z0-9_]+`.
fn is_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// Whether `id` is an entity id: `<name>.<name>`.
fn is_entity(id: &str) -> bool {
    id.split_once('.').is_some_and(|(d, o)| is_name(d) && is_name(o))
}

/// The allow list and its checks, shared by both tools.
#[derive(Clone)]
struct Allow(Arc<[EntityGlob]>);

impl Allow {
    fn check(&self, what: &str) -> Result<(), ToolError> {
        self.check_or(what, "")
    }

    /// [`Self::check`], with `why` said when `what` is refused.
    fn check_or(&self, what: &str, why: &str) -> Result<(), ToolError> {
        if self.0.is_empty() {
            return Err(ToolError::new(
                "nothing in Home Assistant is allowed: the user has to list entity patterns in [homeassistant] allow",
            ));
        }
        if self.0.iter().any(|g| g.matches(what)) {
            return Ok(());
        }
        let list: Vec<&str> = self.0.iter().map(EntityGlob::as_str).collect();
        Err(ToolError::new(format!(
            "`{what}` is not allowed{why}; allowed patterns ([homeassistant] allow): {}",
            list.join(", ")
        )))
    }

    /// Whether the service `domain.service` may be called on `ids` (each of
    /// them checked on its own): it is listed itself, or it is a service of
    /// the entities' own domain (`light.turn_on` on lights), which acts on
    /// nothing but them. A service of another domain (`script.unlock_door`
    /// naming `light.kitchen`) or without an entity must be listed by name.
    fn check_service(&self, domain: &str, service: &str, ids: &[String]) -> Result<(), ToolError> {
        let name = format!("{domain}.{service}");
        let own_domain = !ids.is_empty() && ids.iter().all(|id| id.split_once('.').is_some_and(|(d, _)| d == domain));
        if own_domain && !self.0.is_empty() {
            return Ok(());
        }
        let why = match ids.is_empty() {
            true => String::new(),
            false => format!(
                " (it is not a `{domain}` service acting on `{domain}` entities, so the service itself must be listed, whatever entities it names)"
            ),
        };
        self.check_or(&name, &why)
    }
}

/// The entities a service call targets: `entity_id`, `data.entity_id` and
/// `data.target.entity_id`, all moved to `data.entity_id`'s place (returned).
/// Targets the allow list cannot see (areas, devices, floors, labels) are refused.
fn targets(entity_id: Option<Ids>, data: &mut Map<String, Value>) -> Result<Vec<String>, ToolError> {
    let indirect = |key: &str| {
        ToolError::new(format!(
            "`{key}` is not accepted: name the entities in `entity_id` (only listed entities may be controlled)"
        ))
    };
    let mut ids: Vec<String> = entity_id.map(Ids::into_vec).unwrap_or_default();
    let mut take = |v: Value, what: &str| -> Result<(), ToolError> {
        let more: Ids = serde_json::from_value(v)
            .map_err(|_| ToolError::new(format!("`{what}` must be an entity id or a list of them")))?;
        ids.extend(more.into_vec());
        Ok(())
    };
    if let Some(target) = data.remove("target") {
        let Value::Object(mut target) = target else {
            return Err(ToolError::new("`data.target` must be an object like {\"entity_id\": \"light.kitchen\"}"));
        };
        if let Some(v) = target.remove("entity_id") {
            take(v, "data.target.entity_id")?;
        }
        if let Some(key) = target.keys().next() {
            return Err(indirect(&format!("target.{key}")));
        }
    }
    if let Some(key) = INDIRECT.iter().find(|k| data.contains_key(**k)) {
        return Err(indirect(key));
    }
    if let Some(v) = data.remove("entity_id") {
        take(v, "data.entity_id")?;
    }
    let ids: Vec<String> = ids.iter().map(|s| s.trim().to_string()).collect();
    if let Some(bad) = ids.iter().find(|id| !is_entity(id)) {
        return Err(ToolError::new(format!("`{bad}` is not an entity id (like `light.kitchen`)")));
    }
    Ok(ids)
}

/// One entity id or a list, as models write them.
#[derive(Deserialize)]
#[serde(untagged)]
enum Ids {
    One(String),
    Many(Vec<String>),
}

impl Ids {
    fn into_vec(self) -> Vec<String> {
        match self {
            Ids::One(s) => vec![s],
            Ids::Many(v) => v,
        }
    }
}

#[derive(Deserialize)]
struct CallArgs {
    domain: String,
    service: String,
    entity_id: Option<Ids>,
    #[serde(default)]
    data: Option<Map<String, Value>>,
}

/// `ha_call_service`.
pub struct HaCallService {
    rest: Arc<HaRest>,
    allow: Allow,
}

impl HaCallService {
    pub fn new(rest: Arc<HaRest>, allow: &[EntityGlob]) -> HaCallService {
        HaCallService { rest, allow: Allow(allow.into()) }
    }

    /// The checked request: the body to post, or why not.
    fn prepare(&self, args: CallArgs, ctx: &ToolContext) -> Result<(String, String, Value, String), ToolError> {
        if !ctx.origin.trusted() {
            return Err(ToolError::new(format!(
                "this turn came from {} (an untrusted origin): it cannot call Home Assistant services",
                ctx.origin.name()
            )));
        }
        let (domain, service) = (args.domain.trim().to_string(), args.service.trim().to_string());
        if !is_name(&domain) || !is_name(&service) {
            return Err(ToolError::new(format!(
                "`{domain}.{service}` is not a service: domain and service are lower-case names like `light` and `turn_on`"
            )));
        }
        let mut data = args.data.unwrap_or_default();
        let ids = targets(args.entity_id, &mut data)?;
        // Both: every entity named, and the service itself.
        for id in &ids {
            self.allow.check(id)?;
        }
        self.allow.check_service(&domain, &service, &ids)?;
        let subject = if ids.is_empty() {
            format!("{domain}.{service}")
        } else {
            data.insert("entity_id".into(), json!(ids));
            ids.join(", ")
        };
        Ok((domain, service, Value::Object(data), subject))
    }
}

impl Tool for HaCallService {
    fn name(&self) -> &'static str {
        "ha_call_service"
    }

    fn description(&self) -> &'static str {
        "Call a Home Assistant service (turn a light on, set a thermostat, send a phone notification). Only \
         entities allowed by the user's [homeassistant] allow patterns work, with a service of their own domain \
         (`light.turn_on` on lights) or one the patterns list by name (`notify.mobile_app_pixel`). Name entities \
         in `entity_id`; put other service fields in `data`."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "domain": {"type": "string", "description": "Like `light`, `switch`, `climate`, `notify`."},
                "service": {"type": "string", "description": "Like `turn_on`, `toggle`, `set_temperature`, `mobile_app_pixel`."},
                "entity_id": {
                    "description": "The entity or entities, like `light.kitchen`.",
                    "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]
                },
                "data": {"type": "object", "description": "Other service fields, like {\"brightness_pct\": 40} or {\"message\": \"…\"}."}
            },
            "required": ["domain", "service"]
        })
    }

    fn execute<'a>(&'a self, args: Value, ctx: &'a ToolContext) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let args: CallArgs = parse_args(self.name(), args)?;
            let (domain, service, body, subject) = self.prepare(args, ctx)?;
            let bytes =
                self.rest.call_service(&domain, &service, &body).await.map_err(|e| ToolError::new(e.to_string()))?;
            // The answer lists the states that changed while the call ran.
            let changed: Vec<String> = serde_json::from_slice::<Vec<Value>>(&bytes)
                .unwrap_or_default()
                .iter()
                .filter_map(|s| Some(format!("{} is {}", s.get("entity_id")?.as_str()?, s.get("state")?.as_str()?)))
                .collect();
            Ok(match changed.is_empty() {
                true => format!("Called {domain}.{service} for {subject}. No state changed (yet)."),
                false => format!("Called {domain}.{service} for {subject}. Now: {}.", changed.join("; ")),
            })
        })
    }
}

/// `ha_get_state`.
pub struct HaGetState {
    rest: Arc<HaRest>,
    allow: Allow,
}

impl HaGetState {
    pub fn new(rest: Arc<HaRest>, allow: &[EntityGlob]) -> HaGetState {
        HaGetState { rest, allow: Allow(allow.into()) }
    }
}

#[derive(Deserialize)]
struct StateArgs {
    entity_id: String,
}

impl Tool for HaGetState {
    fn name(&self) -> &'static str {
        "ha_get_state"
    }

    fn description(&self) -> &'static str {
        "Read the current state of a Home Assistant entity (a sensor's value, whether a light is on), with its \
         attributes and when it last changed. Only entities allowed by [homeassistant] allow."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"entity_id": {"type": "string", "description": "Like `sensor.living_room_temperature`."}},
            "required": ["entity_id"]
        })
    }

    fn execute<'a>(&'a self, args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let args: StateArgs = parse_args(self.name(), args)?;
            let id = args.entity_id.trim();
            if !is_entity(id) {
                return Err(ToolError::new(format!("`{id}` is not an entity id (like `sensor.outdoor_temperature`)")));
            }
            self.allow.check(id)?;
            let bytes = self.rest.request(&format!("/api/states/{id}"), None).await.map_err(|e| match e {
                HaError::Status { status: 404, .. } => ToolError::new(format!("Home Assistant has no entity `{id}`")),
                e => ToolError::new(e.to_string()),
            })?;
            let v: Value = serde_json::from_slice(&bytes)
                .map_err(|_| ToolError::new("Home Assistant's answer was not JSON".to_string()))?;
            let pick = json!({
                "entity_id": v.get("entity_id"),
                "state": v.get("state"),
                "attributes": v.get("attributes"),
                "last_changed": v.get("last_changed"),
            });
            Ok(pick.to_string())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;

    fn tool() -> HaCallService {
        let allow: Vec<EntityGlob> =
            ["light.*", "switch.kitchen_*", "notify.mobile_app_*"].iter().map(|g| g.parse().unwrap()).collect();
        HaCallService::new(Arc::new(HaRest::new("http://ha.invalid", Secret::new("t"))), &allow)
    }

    fn prepare(args: Value, channel: &str) -> Result<Value, String> {
        let ctx = ToolContext::detached("s").from_chat(channel, "1");
        tool().prepare(serde_json::from_value(args).unwrap(), &ctx).map(|(_, _, body, _)| body).map_err(|e| e.0)
    }

    #[test]
    fn entities_and_entityless_services_are_checked_against_allow() {
        let body = prepare(
            json!({"domain":"light","service":"turn_on","entity_id":"light.kitchen","data":{"brightness_pct":40}}),
            "telegram",
        )
        .unwrap();
        assert_eq!(body, json!({"brightness_pct":40,"entity_id":["light.kitchen"]}));
        let body =
            prepare(json!({"domain":"notify","service":"mobile_app_pixel","data":{"message":"hi"}}), "cli").unwrap();
        assert_eq!(body, json!({"message":"hi"}));
        let err = prepare(json!({"domain":"lock","service":"unlock","entity_id":"lock.front"}), "cli").unwrap_err();
        assert!(err.contains("`lock.front` is not allowed") && err.contains("light.*"), "{err}");
        // Smuggled through data, or through a list with one allowed entity: still checked.
        let err = prepare(json!({"domain":"light","service":"turn_on","data":{"entity_id":"lock.front"}}), "cli")
            .unwrap_err();
        assert!(err.contains("lock.front"), "{err}");
        let err = prepare(
            json!({"domain":"switch","service":"turn_on","entity_id":["switch.kitchen_1","switch.garage"]}),
            "cli",
        )
        .unwrap_err();
        assert!(err.contains("switch.garage"), "{err}");
        let err =
            prepare(json!({"domain":"light","service":"turn_on","data":{"area_id":"kitchen"}}), "cli").unwrap_err();
        assert!(err.contains("`area_id` is not accepted"), "{err}");
        let err = prepare(json!({"domain":"notify","service":"persistent_notification"}), "cli").unwrap_err();
        assert!(err.contains("notify.persistent_notification"), "{err}");
    }

    #[test]
    fn names_cannot_walk_out_of_the_path() {
        for (d, s) in [("light/../../api/config", "x"), ("light", "turn_on?x=1"), ("", "x"), ("Light", "on")] {
            let err = prepare(json!({"domain":d,"service":s,"entity_id":"light.a"}), "cli").unwrap_err();
            assert!(err.contains("is not a service"), "{err}");
        }
        let err = prepare(json!({"domain":"light","service":"turn_on","entity_id":"light.a/../b"}), "cli").unwrap_err();
        assert!(err.contains("not an entity id"), "{err}");
    }

    #[test]
    fn untrusted_turns_cannot_call_services() {
        for channel in ["mqtt", "homeassistant", "somewhere"] {
            let err =
                prepare(json!({"domain":"light","service":"turn_on","entity_id":"light.a"}), channel).unwrap_err();
            assert!(err.contains("untrusted origin"), "{channel}: {err}");
        }
    }

    #[test]
    fn an_empty_allow_list_allows_nothing() {
        let t = HaGetState::new(Arc::new(HaRest::new("http://x", Secret::new("t"))), &[]);
        assert!(t.allow.check("light.a").unwrap_err().0.contains("[homeassistant] allow"));
    }
}
