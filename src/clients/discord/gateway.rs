//! The Discord gateway's wire format (docs: "Gateway" and "Gateway Events",
//! https://discord.com/developers/docs/events/gateway and
//! …/events/gateway-events; "Opcodes and Status Codes" for the close codes).
//!
//! Every message is a JSON text frame `{"op", "d", "s", "t"}`; `s` and `t`
//! are set only on dispatches (op 0). The session goes:
//!
//! 1. the server's **Hello** (op 10) with `heartbeat_interval` (ms);
//! 2. our first **Heartbeat** (op 1, `d` = the last sequence or null) after
//!    `interval × jitter` (jitter in [0, 1)), then one every interval; each
//!    must be acknowledged (op 11) before the next is due, or the connection
//!    is a zombie: close it (not with 1000/1001, which would end the session)
//!    and resume. A Heartbeat *from* the server asks for one at once.
//! 3. **Identify** (op 2: token, intents, properties) for a new session; the
//!    **Ready** dispatch gives `session_id`, `resume_gateway_url` and our user;
//!    or **Resume** (op 6: token, session_id, seq) on `resume_gateway_url`
//!    after a drop: missed dispatches are replayed, then **Resumed**.
//! 4. **Reconnect** (op 7): close and resume. **Invalid Session** (op 9):
//!    `d` says whether the session can be resumed; if not, wait 1–5 s and
//!    identify afresh.
//!
//! This module builds and reads those messages; the channel runs the loop.

use serde::Deserialize;
use serde_json::{json, Value};

/// Opcodes (Gateway Opcodes table).
pub mod op {
    pub const DISPATCH: u8 = 0;
    pub const HEARTBEAT: u8 = 1;
    pub const IDENTIFY: u8 = 2;
    pub const RESUME: u8 = 6;
    pub const RECONNECT: u8 = 7;
    pub const INVALID_SESSION: u8 = 9;
    pub const HELLO: u8 = 10;
    pub const HEARTBEAT_ACK: u8 = 11;
}

/// Gateway intents (bit flags): guild messages, DMs, and their content (a
/// privileged intent: switched on in the developer portal's Bot page).
pub const GUILD_MESSAGES: u64 = 1 << 9;
pub const DIRECT_MESSAGES: u64 = 1 << 12;
pub const MESSAGE_CONTENT: u64 = 1 << 15;
/// What bramble asks for.
pub const INTENTS: u64 = GUILD_MESSAGES | DIRECT_MESSAGES | MESSAGE_CONTENT;

/// The query every gateway connection carries.
pub const QUERY: &str = "?v=10&encoding=json";
/// The largest gateway message read. Without the GUILDS intent no
/// GUILD_CREATE with a guild's members arrives; a message with files and
/// embeds is a few KB. A peer sending more is broken.
pub const MAX_PAYLOAD: usize = 1024 * 1024;

/// A close code we send for a drop we want to resume after (any but 1000/1001).
pub const CLOSE_RESUME: u16 = 4000;

/// One gateway message as read.
#[derive(Debug, Clone, Deserialize)]
pub struct Payload {
    pub op: u8,
    #[serde(default)]
    pub d: Value,
    #[serde(default)]
    pub s: Option<u64>,
    #[serde(default)]
    pub t: Option<String>,
}

impl Payload {
    /// Read a text frame; `Err` says why it is not a gateway message.
    pub fn parse(text: &str) -> Result<Payload, String> {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        if !v.is_object() {
            return Err("not a gateway message (not a JSON object)".into());
        }
        serde_json::from_value(v).map_err(|e| format!("not a gateway message: {e}"))
    }

    /// Hello's interval, in milliseconds (at least 1 s: a smaller one is a broken peer).
    pub fn heartbeat_interval(&self) -> Option<u64> {
        self.d["heartbeat_interval"].as_u64().filter(|ms| *ms >= 1000)
    }
}

/// op 1: `d` is the last sequence number received, or null.
pub fn heartbeat(seq: Option<u64>) -> String {
    json!({"op": op::HEARTBEAT, "d": seq}).to_string()
}

/// op 2: a new session.
pub fn identify(token: &str) -> String {
    json!({"op": op::IDENTIFY, "d": {
        "token": token,
        "intents": INTENTS,
        "properties": {"os": std::env::consts::OS, "browser": "bramble", "device": "bramble"},
    }})
    .to_string()
}

/// op 6: continue `session_id` after `seq`.
pub fn resume(token: &str, session_id: &str, seq: Option<u64>) -> String {
    json!({"op": op::RESUME, "d": {"token": token, "session_id": session_id, "seq": seq}}).to_string()
}

/// What READY tells us.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ready {
    pub session_id: String,
    pub resume_gateway_url: Option<String>,
    pub user_id: u64,
}

impl Ready {
    pub fn read(d: &Value) -> Option<Ready> {
        Some(Ready {
            session_id: d["session_id"].as_str().filter(|s| !s.is_empty())?.to_string(),
            resume_gateway_url: d["resume_gateway_url"].as_str().map(str::to_string),
            user_id: d["user"]["id"].as_str().and_then(|s| s.parse().ok())?,
        })
    }
}

/// What a close code from the gateway means for the next connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterClose {
    /// Resume the session.
    Resume,
    /// Start a new session (4007 invalid seq, 4009 session timed out).
    Identify,
    /// Do not reconnect: the token or the intents are wrong (4004, 4010–4014).
    Stop,
}

/// Gateway Close Event Codes.
pub fn after_close(code: Option<u16>) -> AfterClose {
    match code {
        Some(4004 | 4010 | 4011 | 4012 | 4013 | 4014) => AfterClose::Stop,
        Some(4007 | 4009) => AfterClose::Identify,
        _ => AfterClose::Resume,
    }
}

/// Why the gateway refused us, in words that say what to do.
pub fn close_advice(code: u16) -> &'static str {
    match code {
        4004 => "the bot token was refused: check [discord] token_env",
        4013 => "the gateway refused the intents (a bug: please report it)",
        4014 => {
            "the Message Content intent is not enabled: Discord developer portal → your application → Bot → \
             Privileged Gateway Intents → Message Content Intent"
        }
        4010..=4012 => "the gateway refused the connection's settings (shard or API version)",
        _ => "the gateway closed the connection",
    }
}

/// A fraction in [0, 1) for the first heartbeat's jitter.
pub fn jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(crate::util::unique::next());
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_follow_the_documented_shapes() {
        let v: Value = serde_json::from_str(&heartbeat(Some(251))).unwrap();
        assert_eq!(v, json!({"op": 1, "d": 251}));
        assert_eq!(serde_json::from_str::<Value>(&heartbeat(None)).unwrap(), json!({"op": 1, "d": null}));
        let v: Value = serde_json::from_str(&identify("tok")).unwrap();
        assert_eq!((v["op"].as_u64(), v["d"]["token"].as_str()), (Some(2), Some("tok")));
        assert_eq!(v["d"]["intents"], 37376, "GUILD_MESSAGES | DIRECT_MESSAGES | MESSAGE_CONTENT");
        let v: Value = serde_json::from_str(&resume("tok", "abc", Some(7))).unwrap();
        assert_eq!(v, json!({"op": 6, "d": {"token": "tok", "session_id": "abc", "seq": 7}}));
    }

    #[test]
    fn hello_ready_and_close_codes_are_read() {
        let p = Payload::parse(r#"{"op":10,"d":{"heartbeat_interval":41250},"s":null,"t":null}"#).unwrap();
        assert_eq!((p.op, p.heartbeat_interval()), (op::HELLO, Some(41250)));
        assert_eq!(Payload::parse(r#"{"op":10,"d":{"heartbeat_interval":0}}"#).unwrap().heartbeat_interval(), None);
        assert!(Payload::parse("[1,2]").is_err() && Payload::parse("{\"op\":\"x\"}").is_err());
        let r = Ready::read(&json!({"session_id": "s1", "resume_gateway_url": "wss://r", "user": {"id": "42"}}));
        assert_eq!(r.unwrap().user_id, 42);
        assert!(Ready::read(&json!({"session_id": "s1", "user": {}})).is_none());
        assert_eq!(after_close(Some(4004)), AfterClose::Stop);
        assert_eq!(after_close(Some(4009)), AfterClose::Identify);
        assert_eq!(after_close(None), AfterClose::Resume);
        assert!((0.0..1.0).contains(&jitter()));
    }
}
