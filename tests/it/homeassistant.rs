//! Home Assistant against a fake HA (`support::fake_ha`, built from HA's
//! published REST and WebSocket formats) and the real binary: the `ha_*`
//! tools with their allow list and origins, `ha:notify.<service>` reports,
//! and `[[homeassistant.trigger]]` over a real RFC 6455 connection.

use std::path::PathBuf;

use serde_json::{json, Value};

use crate::support::daemon::{wait_until, Daemon};
use crate::support::fake_ha::FakeHa;
use crate::support::fake_llm::{Dialect, FakeLlm, Reply};
use crate::support::setup::TestHome;
use bramble::provider::ToolCall;
use bramble::tools::ToolContext;

const TOKEN: &str = "ha-test-token-abc123";

struct Setup {
    ha: FakeHa,
    fake: FakeLlm,
    home: TestHome,
    log: PathBuf,
}

impl Setup {
    /// A fake HA, a fake LLM and a config with `[homeassistant]` (`ha_extra`
    /// goes into that section; `extra` after it: other sections, triggers).
    async fn new(ha_extra: &str, extra: &str) -> Setup {
        let ha = FakeHa::start(TOKEN).await;
        let fake = FakeLlm::start(Dialect::OpenAi).await;
        let extra = format!(
            "clock_sync_wait = \"0s\"\n[heartbeat]\nenabled = false\n\
             [homeassistant]\nurl = \"{}\"\ntoken = \"{TOKEN}\"\n{ha_extra}\n{extra}\n",
            ha.url()
        );
        let home = TestHome::new("openai", &fake.base_url(), "", "", &extra);
        let log = home.path().join("daemon.log");
        Setup { ha, fake, home, log }
    }

    fn start(&self) -> Daemon {
        Daemon::start_logging_to(self.home.path(), Some(&self.home.config), &self.log)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn cli(&self, args: &[&str]) -> String {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_bramble"))
            .arg("--config")
            .arg(&self.home.config)
            .args(args)
            .env_clear()
            .env("HOME", self.home.path())
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .output()
            .await
            .expect("bramble");
        assert!(out.status.success(), "bramble {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

async fn call(agent: &bramble::agent::Agent, channel: &str, tool: &str, args: Value) -> (String, bool) {
    let ctx = ToolContext::detached("t").from_chat(channel, "1");
    let out = agent.tools().execute(&ToolCall::new("c1", tool, args.to_string()), &ctx).await;
    (out.text, out.is_error)
}

#[tokio::test]
async fn tools_call_allowed_services_and_refuse_the_rest() {
    let s = Setup::new(r#"allow = ["light.*", "sensor.outdoor_*", "notify.mobile_app_*"]"#, "").await;
    s.ha.set_state("sensor.outdoor_temperature", "7.5", json!({"unit_of_measurement": "°C"}));
    s.ha.set_state("lock.front_door", "locked", json!({}));
    let (agent, _rx) = s.home.agent();
    assert!(agent.tools().names().iter().any(|n| n == "ha_call_service"), "{:?}", agent.tools().names());

    // Allowed: the right path, body and bearer token.
    let args =
        json!({"domain": "light", "service": "turn_on", "entity_id": "light.kitchen", "data": {"brightness_pct": 40}});
    let (text, err) = call(&agent, "telegram", "ha_call_service", args).await;
    assert!(!err, "{text}");
    assert_eq!(text, "Called light.turn_on for light.kitchen. Now: light.kitchen is on.");
    let c = s.ha.calls().pop().unwrap();
    assert_eq!((c.method.as_str(), c.path.as_str()), ("POST", "/api/services/light/turn_on"));
    assert_eq!(c.header("authorization"), Some(format!("Bearer {TOKEN}").as_str()));
    assert_eq!(c.json().unwrap(), json!({"brightness_pct": 40, "entity_id": ["light.kitchen"]}));
    // An entity-less service is checked as domain.service.
    let args = json!({"domain": "notify", "service": "mobile_app_pixel", "data": {"message": "hi"}});
    let (text, err) = call(&agent, "cli", "ha_call_service", args).await;
    assert!(!err, "{text}");
    assert_eq!(s.ha.calls().pop().unwrap().path, "/api/services/notify/mobile_app_pixel");

    let calls_before = s.ha.calls().len();
    // Not allowed: refused with a reason the model can act on, nothing sent.
    let args = json!({"domain": "lock", "service": "unlock", "entity_id": "lock.front_door"});
    let (text, err) = call(&agent, "telegram", "ha_call_service", args).await;
    assert!(
        err && text.contains("`lock.front_door` is not allowed; allowed patterns ([homeassistant] allow)"),
        "{text}"
    );
    // An untrusted origin (an MQTT turn) cannot call services at all: `[policy.mqtt]`
    // does not even offer the tool (and the tool itself refuses untrusted origins too).
    let args = json!({"domain": "light", "service": "turn_off", "entity_id": "light.kitchen"});
    let (text, err) = call(&agent, "mqtt", "ha_call_service", args).await;
    assert!(err && text.contains("not offered to turns from MQTT ([policy.mqtt]"), "{text}");
    assert_eq!(s.ha.calls().len(), calls_before, "refusals send nothing");

    // Reads: allowed entities, also from MQTT; others refused; unknown ones said so.
    let (text, err) = call(&agent, "mqtt", "ha_get_state", json!({"entity_id": "sensor.outdoor_temperature"})).await;
    assert!(!err, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!((v["state"].as_str(), v["attributes"]["unit_of_measurement"].as_str()), (Some("7.5"), Some("°C")));
    assert_eq!(s.ha.calls().pop().unwrap().path, "/api/states/sensor.outdoor_temperature");
    let (text, err) = call(&agent, "cli", "ha_get_state", json!({"entity_id": "lock.front_door"})).await;
    assert!(err && text.contains("not allowed"), "{text}");
    let (text, err) = call(&agent, "cli", "ha_get_state", json!({"entity_id": "light.nowhere"})).await;
    assert!(err && text.contains("Home Assistant has no entity `light.nowhere`"), "{text}");

    // HA's errors reach the model; the token never does.
    s.ha.fail_next(&[500]);
    let (text, err) = call(&agent, "cli", "ha_get_state", json!({"entity_id": "light.kitchen"})).await;
    assert!(err && text.contains("answered 500") && !text.contains(TOKEN), "{text}");
}

#[tokio::test]
async fn the_allow_list_judges_the_service_and_every_entity() {
    let s = Setup::new(r#"allow = ["light.*", "notify.mobile_app_*", "switch.kitchen_*"]"#, "").await;
    let (agent, _rx) = s.home.agent();
    let ha_call = |args: serde_json::Value| {
        let agent = &agent;
        async move { call(agent, "telegram", "ha_call_service", args).await }
    };
    let refused = [
        // An allowed entity is no alibi for another domain's service.
        (
            json!({"domain": "script", "service": "unlock_front_door", "entity_id": "light.kitchen"}),
            "`script.unlock_front_door` is not allowed (it is not a `script` service acting on `script` entities",
        ),
        (
            json!({"domain": "homeassistant", "service": "turn_off", "data": {"entity_id": "light.kitchen"}}),
            "`homeassistant.turn_off` is not allowed",
        ),
        (
            json!({"domain": "script", "service": "unlock_front_door", "data": {"target": {"entity_id": ["light.kitchen"]}}}),
            "`script.unlock_front_door` is not allowed",
        ),
        // Every entity: a list mixing allowed and not, in any of the three places.
        (
            json!({"domain": "light", "service": "turn_on", "entity_id": ["light.kitchen", "lock.front_door"]}),
            "`lock.front_door` is not allowed",
        ),
        (
            json!({"domain": "light", "service": "turn_on", "entity_id": "light.kitchen", "data": {"target": {"entity_id": "lock.front_door"}}}),
            "`lock.front_door` is not allowed",
        ),
        (
            json!({"domain": "switch", "service": "turn_on", "data": {"entity_id": ["switch.kitchen_1", "switch.garage"]}}),
            "`switch.garage` is not allowed",
        ),
        // Areas and devices expand inside Home Assistant: refused wherever they are.
        (
            json!({"domain": "light", "service": "turn_on", "data": {"target": {"area_id": "kitchen"}}}),
            "`target.area_id` is not accepted",
        ),
        (
            json!({"domain": "light", "service": "turn_on", "entity_id": "light.kitchen", "data": {"target": {"entity_id": "light.kitchen", "device_id": "abc"}}}),
            "`target.device_id` is not accepted",
        ),
        (json!({"domain": "light", "service": "turn_on", "data": {"device_id": "abc"}}), "`device_id` is not accepted"),
        // No entity: the service's own name decides.
        (json!({"domain": "script", "service": "unlock_front_door"}), "`script.unlock_front_door` is not allowed"),
        (
            json!({"domain": "notify", "service": "persistent_notification", "data": {"message": "x"}}),
            "`notify.persistent_notification` is not allowed",
        ),
    ];
    for (args, want) in refused {
        let (text, err) = ha_call(args.clone()).await;
        assert!(err && text.contains(want), "{args}: {text}");
    }
    assert!(s.ha.calls().is_empty(), "refusals send nothing: {:?}", s.ha.calls());

    let allowed = [
        (
            json!({"domain": "light", "service": "turn_on", "entity_id": "light.kitchen"}),
            json!({"entity_id": ["light.kitchen"]}),
        ),
        // A service of the entities' own domain, not listed by name: its entities decide.
        (
            json!({"domain": "switch", "service": "turn_on", "data": {"target": {"entity_id": "switch.kitchen_kettle"}}}),
            json!({"entity_id": ["switch.kitchen_kettle"]}),
        ),
        (
            json!({"domain": "notify", "service": "mobile_app_pixel", "data": {"message": "hi"}}),
            json!({"message": "hi"}),
        ),
    ];
    for (args, body) in allowed {
        let (text, err) = ha_call(args.clone()).await;
        assert!(!err, "{args}: {text}");
        assert_eq!(s.ha.calls().pop().unwrap().json().unwrap(), body, "{args}");
    }
}

#[tokio::test]
async fn an_error_quoting_the_token_back_reaches_the_model_without_it() {
    use crate::support::fake_ha::Echo;
    let s = Setup::new(r#"allow = ["light.*"]"#, "").await;
    let (agent, _rx) = s.home.agent();
    s.ha.echo_next(&[Echo::Json, Echo::Text, Echo::Json]);
    let (text, err) = call(&agent, "cli", "ha_get_state", json!({"entity_id": "light.kitchen"})).await;
    assert!(err && text.contains("answered 400") && text.contains("Invalid request, headers"), "{text}");
    assert!(!text.contains(TOKEN) && text.contains("'authorization': 'Bearer ***'"), "{text}");
    let (text, err) = call(&agent, "cli", "ha_get_state", json!({"entity_id": "light.kitchen"})).await;
    assert!(err && text.contains("answered 502") && text.contains("authorization: Bearer ***"), "{text}");
    assert!(!text.contains(TOKEN), "{text}");
    let args = json!({"domain": "light", "service": "turn_on", "entity_id": "light.kitchen"});
    let (text, err) = call(&agent, "telegram", "ha_call_service", args).await;
    assert!(err && text.contains("answered 400") && !text.contains(TOKEN), "{text}");
}

#[tokio::test]
async fn a_refused_token_is_said_without_the_token() {
    let s = Setup::new(r#"allow = ["light.*"]"#, "").await;
    let text = std::fs::read_to_string(&s.home.config).unwrap().replace(TOKEN, "wrong-token-xyz");
    std::fs::write(&s.home.config, text).unwrap();
    let (agent, _rx) = s.home.agent();
    let (text, err) = call(&agent, "cli", "ha_get_state", json!({"entity_id": "light.kitchen"})).await;
    assert!(err && text.contains("answered 401") && text.contains("token was refused"), "{text}");
    assert!(!text.contains("wrong-token-xyz"), "{text}");
}

#[tokio::test]
async fn a_reminder_reaches_the_phone_through_ha_notify_after_a_500() {
    let s = Setup::new("", "").await;
    s.ha.fail_next(&[500]);
    let daemon = s.start();
    daemon.scheduler_idle().await;
    let at = jiff::Timestamp::now().checked_add(jiff::SignedDuration::from_secs(1)).unwrap().to_string();
    let out = s
        .cli(&[
            "cron",
            "add",
            "tea",
            "--at",
            &at,
            "--remind",
            "Tea is ready",
            "--deliver",
            "ha:notify.mobile_app_phone",
        ])
        .await;
    assert!(out.contains("added job tea"), "{out}");
    let notify = |s: &Setup| {
        s.ha.calls().into_iter().filter(|c| c.path == "/api/services/notify/mobile_app_phone").collect::<Vec<_>>()
    };
    // The first attempt gets a 500 (retryable); the outbox's backoff tries again.
    assert!(wait_until(40, || notify(&s).len() >= 2).await, "{}", s.log());
    assert!(s.log().contains("delivery failed; will retry"), "{}", s.log());
    let last = notify(&s).pop().unwrap();
    assert_eq!(last.json().unwrap(), json!({"message": "Tea is ready", "title": "bramble"}));
    assert_eq!(last.header("authorization"), Some(format!("Bearer {TOKEN}").as_str()));
    let outbox = bramble::delivery::outbox::Outbox::new(&s.home.state);
    assert!(wait_until(10, || outbox.pending().is_ok_and(|p| p.is_empty())).await, "delivered");
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0), "{log}");
    assert!(!log.contains(TOKEN), "the token is never logged");
    assert_eq!(s.fake.request_count(), 0, "a reminder calls no model");

    // Status says what is configured, never the token.
    let status = s.cli(&["status"]).await;
    assert!(status.contains(&format!("ha:         {} (token set)", s.ha.url())), "{status}");
    assert!(status.contains("channels:   ha, log"), "{status}");
    assert!(!status.contains(TOKEN));
}

#[tokio::test]
async fn a_4xx_from_notify_drops_the_report() {
    let s = Setup::new("", "").await;
    s.ha.fail_next(&[400]);
    let daemon = s.start();
    daemon.scheduler_idle().await;
    let at = jiff::Timestamp::now().checked_add(jiff::SignedDuration::from_secs(1)).unwrap().to_string();
    s.cli(&["cron", "add", "x", "--at", &at, "--remind", "hello", "--deliver", "ha:notify.nope"]).await;
    assert!(wait_until(20, || s.log().contains("delivery refused; report dropped")).await, "{}", s.log());
    assert_eq!(s.ha.calls().len(), 1, "not retried");
    daemon.stop().await;
}

const ALICE: i64 = 1111;
const TG_TOKEN: &str = "123456:TEST-token-do-not-log";

#[tokio::test]
async fn a_door_opening_becomes_a_turn_reported_to_telegram() {
    let tg = crate::support::telegram::FakeTelegram::start(TG_TOKEN).await;
    let extra = format!(
        r#"[telegram]
token = "{TG_TOKEN}"
allow_from = ["{ALICE}"]
api_base = "{}"

[[homeassistant.trigger]]
entity_id = ["binary_sensor.*_door", "binary_sensor.garage"]
from = "off"
to = "on"
message = "{{name}} opened ({{entity}}: {{from}} -> {{to}}, battery {{attributes.battery}}%)"
deliver = ["telegram:{ALICE}"]
min_interval = "0s"
"#,
        tg.url()
    );
    let s = Setup::new(r#"allow = ["light.*"]"#, &extra).await;
    s.fake.push(Reply::text("The front door just opened."));
    let daemon = s.start();
    assert!(wait_until(15, || s.ha.subscribed() == 1).await, "subscribed: {}", s.log());
    assert!(s.log().contains("Home Assistant connected"), "{}", s.log());
    let status = s.cli(&["status"]).await;
    assert!(status.contains("websocket connected since"), "{status}");

    // Frames as HA sends them: a big result (under the 1 MiB cap), a control
    // ping (answered), events in fragments with a ping between them.
    s.ha.send_big(600 * 1024);
    s.ha.ping();
    assert!(wait_until(10, || s.ha.ws().pongs >= 1).await, "the ping was answered: {:?}", s.ha.ws());
    s.ha.fragment_events(Some(7));
    // Not matching: another entity, the wrong direction, attributes only.
    s.ha.state_changed("binary_sensor.front_window", "off", "on", json!({}));
    s.ha.state_changed("binary_sensor.front_door", "on", "off", json!({}));
    s.ha.state_changed("binary_sensor.front_door", "off", "off", json!({"battery": 80}));
    // The one that matches.
    s.ha.state_changed("binary_sensor.front_door", "off", "on", json!({"friendly_name": "Front door", "battery": 91}));
    assert!(tg.wait_sent(1, 20).await, "reported to Telegram: {}", s.log());
    assert_eq!(tg.sent()[0]["chat_id"], ALICE);
    assert_eq!(tg.sent_texts()[0], "The front door just opened.");
    let reqs: Vec<String> = s.fake.requests().iter().map(Value::to_string).collect();
    assert_eq!(reqs.len(), 1, "one turn: {reqs:?}");
    assert!(reqs[0].contains("Front door opened (binary_sensor.front_door: off -> on, battery 91%)"), "{}", reqs[0]);
    let ws = s.ha.ws();
    assert!(ws.protocol_errors.is_empty(), "every client frame was masked and well-formed: {ws:?}");
    assert_eq!((ws.upgrades, ws.auth_ok, ws.subscriptions), (1, 1, 1), "{ws:?}");
    let (code, log) = daemon.stop().await;
    assert_eq!(code, Some(0));
    assert!(!log.contains(TOKEN), "the HA token is never logged");
    assert!(s.ha.ws().closes >= 1, "a clean stop sends a close frame");
}

#[tokio::test]
async fn a_dropped_socket_reconnects_resubscribes_and_invents_nothing() {
    let extra = r#"
[[homeassistant.trigger]]
entity_id = "binary_sensor.back_door"
to = "on"
for = "2s"
exec = "cat >> fired.jsonl; echo >> fired.jsonl"
min_interval = "0s"
"#;
    let s = Setup::new("", extra).await;
    let fired = s.home.workspace.join("fired.jsonl");
    let lines = || std::fs::read_to_string(&fired).map(|t| t.lines().filter(|l| !l.is_empty()).count()).unwrap_or(0);
    let daemon = s.start();
    assert!(wait_until(15, || s.ha.subscribed() == 1).await, "{}", s.log());

    // Held for less than `for`: cancelled.
    s.ha.state_changed("binary_sensor.back_door", "off", "on", json!({}));
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    s.ha.state_changed("binary_sensor.back_door", "on", "off", json!({}));
    // Opened, then the connection drops before `for` has passed: the match is
    // dropped with the connection, not fired from what was seen before.
    s.ha.state_changed("binary_sensor.back_door", "off", "on", json!({}));
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    s.ha.drop_sockets();
    assert!(
        wait_until(20, || s.ha.ws().subscriptions == 2 && s.ha.subscribed() == 1).await,
        "re-subscribed: {}",
        s.log()
    );
    assert!(s.log().contains("Home Assistant connection lost"), "{}", s.log());
    assert!(s.log().contains("1 `for` trigger(s) waiting were cancelled"), "{}", s.log());
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(lines(), 0, "nothing fired: {}", s.log());

    // After the reconnect, a change held for 2 s fires once, with the event on stdin.
    s.ha.state_changed("binary_sensor.back_door", "off", "on", json!({"friendly_name": "Back door"}));
    assert!(wait_until(15, || lines() == 1).await, "{}", s.log());
    let event: Value = serde_json::from_str(std::fs::read_to_string(&fired).unwrap().lines().next().unwrap()).unwrap();
    assert_eq!(event["entity_id"], "binary_sensor.back_door");
    assert_eq!(event["new_state"]["state"], "on");
    assert_eq!(event["new_state"]["attributes"]["friendly_name"], "Back door");
    daemon.stop().await;
    assert_eq!(s.fake.request_count(), 0, "exec triggers call no model");
}

#[tokio::test]
async fn a_refused_token_is_reported_and_not_retried_in_a_loop() {
    let extra = "[[homeassistant.trigger]]\nentity_id = \"sensor.x\"\nexec = \"cat\"\n";
    let s = Setup::new("", extra).await;
    let text = std::fs::read_to_string(&s.home.config).unwrap().replace(TOKEN, "revoked-token-123");
    std::fs::write(&s.home.config, text).unwrap();
    let daemon = s.start();
    assert!(wait_until(15, || s.log().contains("Home Assistant refused the token")).await, "{}", s.log());
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    let ws = s.ha.ws();
    assert_eq!((ws.upgrades, ws.auth_invalid), (1, 1), "one attempt, then a long wait: {ws:?}");
    let status = s.cli(&["status"]).await;
    assert!(status.contains("websocket REFUSED since") && status.contains("long-lived access token"), "{status}");
    let (_, log) = daemon.stop().await;
    assert!(!log.contains("revoked-token-123") && !status.contains("revoked-token-123"), "never the token");
}

#[tokio::test]
async fn without_homeassistant_ha_notify_reports_wait_in_the_outbox() {
    let fake = FakeLlm::start(Dialect::OpenAi).await;
    let home = TestHome::new(
        "openai",
        &fake.base_url(),
        "",
        "",
        "clock_sync_wait = \"0s\"\n[heartbeat]\nenabled = false\n[alerts]\ndeliver = [\"ha:notify.mobile_app_x\"]\n",
    );
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_bramble"))
            .arg("--config")
            .arg(&home.config)
            .args(args)
            .env_clear()
            .env("HOME", home.path())
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .output()
            .expect("bramble")
    };
    let check = run(&["check"]);
    let out = String::from_utf8_lossy(&check.stdout);
    assert!(out.contains("[homeassistant] has no `url`"), "{out}");
    let log = home.path().join("daemon.log");
    let daemon = Daemon::start_logging_to(home.path(), Some(&home.config), &log);
    daemon.scheduler_idle().await;
    let at = jiff::Timestamp::now().checked_add(jiff::SignedDuration::from_secs(1)).unwrap().to_string();
    let added = run(&["cron", "add", "x", "--at", &at, "--remind", "hi", "--deliver", "ha:notify.mobile_app_x"]);
    let err = String::from_utf8_lossy(&added.stderr);
    assert!(
        err.contains("warning: ha is not configured: reports for ha:notify.mobile_app_x wait in the outbox"),
        "{err}"
    );
    assert!(
        daemon.wait_log("no `ha` channel is configured: its reports wait in the outbox", 20).await,
        "{}",
        daemon.log()
    );
    let outbox = bramble::delivery::outbox::Outbox::new(&home.state);
    assert_eq!(outbox.pending().unwrap().len(), 1, "kept for when [homeassistant] is configured");
    daemon.stop().await;
}

#[tokio::test]
async fn doctor_logs_in_to_both_apis_and_names_a_refused_token() {
    let s = Setup::new("", "[[homeassistant.trigger]]\nentity_id = \"sensor.x\"\nexec = \"cat\"\n").await;
    async fn doctor(s: &Setup) -> String {
        // Not `std::process`: the fake HA runs on this test's runtime.
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_bramble"))
            .arg("--config")
            .arg(&s.home.config)
            .arg("doctor")
            .env_clear()
            .env("HOME", s.home.path())
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .output()
            .await
            .expect("bramble doctor");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines().find(|l| l.contains("homeassistant")).unwrap_or_default().to_string()
    }
    let line = doctor(&s).await;
    assert!(line.contains("the REST API accepts the token, and so does the WebSocket API (1 trigger(s))"), "{line}");
    assert_eq!((s.ha.ws().auth_ok, s.ha.ws().closes), (1, 1), "logged in, then closed cleanly");
    let text = std::fs::read_to_string(&s.home.config).unwrap().replace(TOKEN, "old-token-456");
    std::fs::write(&s.home.config, text).unwrap();
    let line = doctor(&s).await;
    assert!(line.contains("answered 401") && line.contains("token was refused"), "{line}");
    assert!(!line.contains("old-token-456"));
}
