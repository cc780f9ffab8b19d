//! What arrives in a data frame's payload, read into the few fields the
//! channel needs; everything else stays unread. Two kinds matter:
//!
//! - `im.message.receive_v1` (an event, schema 2.0: `{"schema","header":
//!   {"event_id","event_type","app_id",…},"event":{"sender","message"}}`):
//!   the sender's open_id and type, the message's id, chat, chat type
//!   (`p2p` / `group`), message type, its `content` (a JSON string:
//!   `{"text":"@_user_1 hi"}`) and mentions (`@_user_1` → an open_id).
//! - A card button press: `card.action.trigger` as an event (the current
//!   callback: `event.operator.open_id`, `event.action.value`,
//!   `event.context.open_message_id` / `open_chat_id`), or the older card
//!   callback in a frame of type `card` (`open_id`, `action.value`,
//!   `open_message_id`, `open_chat_id` at the top level).
//!
//! Fields are read leniently (a missing one is empty) and judged by the caller.

use serde_json::Value;

/// A message to the bot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Message {
    pub sender: String,
    /// `user` for people; `app` for bots.
    pub sender_type: String,
    pub message_id: String,
    pub chat_id: String,
    pub chat_type: String,
    pub message_type: String,
    /// `content`, still a JSON string.
    pub content: String,
    /// `(key, open_id)`: `@_user_1` stands for that user in the text.
    pub mentions: Vec<(String, String)>,
}

impl Message {
    /// The text of a `text` message with mentions taken out; `None` for other types.
    pub fn text(&self) -> Option<String> {
        if self.message_type != "text" {
            return None;
        }
        let v: Value = serde_json::from_str(&self.content).ok()?;
        let mut text = v["text"].as_str()?.to_string();
        for (key, _) in &self.mentions {
            if !key.is_empty() {
                text = text.replace(key.as_str(), "");
            }
        }
        Some(text.trim().to_string())
    }

    /// Whether `open_id` is mentioned (`None`: anyone mentioned will do).
    pub fn mentions(&self, open_id: Option<&str>) -> bool {
        match open_id {
            Some(me) => self.mentions.iter().any(|(_, id)| id == me),
            None => !self.mentions.is_empty(),
        }
    }
}

/// A button press on a card.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CardAction {
    pub operator: String,
    pub value: Value,
    pub message_id: String,
    pub chat_id: String,
}

/// What a payload is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Message(Message),
    Card(CardAction),
    /// Another event type (named), not for us.
    Other(String),
}

/// An event payload: its `event_id`, the app it is for, and what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub event_id: String,
    pub app_id: String,
    pub event: Event,
}

fn s(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

/// Read a frame's payload of type `event`.
pub fn parse_event(payload: &[u8]) -> Result<Envelope, String> {
    let v: Value = serde_json::from_slice(payload).map_err(|e| format!("not JSON: {e}"))?;
    let header = &v["header"];
    let kind = header["event_type"].as_str().ok_or("no header.event_type (not a schema 2.0 event)")?;
    let e = &v["event"];
    let event = match kind {
        "im.message.receive_v1" => {
            let m = &e["message"];
            let mentions = m["mentions"]
                .as_array()
                .map(|a| a.iter().map(|x| (s(&x["key"]), s(&x["id"]["open_id"]))).collect())
                .unwrap_or_default();
            Event::Message(Message {
                sender: s(&e["sender"]["sender_id"]["open_id"]),
                sender_type: s(&e["sender"]["sender_type"]),
                message_id: s(&m["message_id"]),
                chat_id: s(&m["chat_id"]),
                chat_type: s(&m["chat_type"]),
                message_type: s(&m["message_type"]),
                content: s(&m["content"]),
                mentions,
            })
        }
        "card.action.trigger" => Event::Card(CardAction {
            operator: s(&e["operator"]["open_id"]),
            value: e["action"]["value"].clone(),
            message_id: s(&e["context"]["open_message_id"]),
            chat_id: s(&e["context"]["open_chat_id"]),
        }),
        other => Event::Other(other.to_string()),
    };
    Ok(Envelope { event_id: s(&header["event_id"]), app_id: s(&header["app_id"]), event })
}

/// Read a frame's payload of type `card` (the older card callback).
pub fn parse_card(payload: &[u8]) -> Result<CardAction, String> {
    let v: Value = serde_json::from_slice(payload).map_err(|e| format!("not JSON: {e}"))?;
    Ok(CardAction {
        operator: s(&v["open_id"]),
        value: v["action"]["value"].clone(),
        message_id: s(&v["open_message_id"]),
        chat_id: s(&v["open_chat_id"]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_message_with_a_mention_is_read() {
        let content = serde_json::json!({"text": "@_user_1  what time is it?"}).to_string();
        let payload = serde_json::json!({
            "schema": "2.0",
            "header": {"event_id": "5e3702a84e847582be8db7fb73283c02", "event_type": "im.message.receive_v1",
                       "app_id": "cli_a1", "tenant_key": "t"},
            "event": {
                "sender": {"sender_id": {"open_id": "ou_owner"}, "sender_type": "user"},
                "message": {"message_id": "om_1", "chat_id": "oc_g", "chat_type": "group", "message_type": "text",
                            "content": content,
                            "mentions": [{"key": "@_user_1", "id": {"open_id": "ou_bot"}, "name": "bramble"}]}
            }
        });
        let env = parse_event(payload.to_string().as_bytes()).unwrap();
        assert_eq!((env.event_id.as_str(), env.app_id.as_str()), ("5e3702a84e847582be8db7fb73283c02", "cli_a1"));
        let Event::Message(m) = env.event else { panic!("not a message") };
        assert_eq!(m.text().as_deref(), Some("what time is it?"));
        assert!(m.mentions(Some("ou_bot")) && !m.mentions(Some("ou_other")) && m.mentions(None));
        assert_eq!((m.sender.as_str(), m.chat_type.as_str()), ("ou_owner", "group"));
        let image = Message { message_type: "image".into(), ..m };
        assert_eq!(image.text(), None);
    }

    #[test]
    fn card_presses_are_read_in_both_forms() {
        let new = serde_json::json!({
            "schema": "2.0",
            "header": {"event_id": "e2", "event_type": "card.action.trigger"},
            "event": {"operator": {"open_id": "ou_owner"}, "action": {"tag": "button", "value": {"r": "r:d:abc"}},
                      "context": {"open_message_id": "om_2", "open_chat_id": "oc_c"}}
        });
        let Event::Card(c) = parse_event(new.to_string().as_bytes()).unwrap().event else { panic!() };
        assert_eq!((c.operator.as_str(), c.value["r"].as_str()), ("ou_owner", Some("r:d:abc")));
        let old = serde_json::json!({"open_id": "ou_x", "open_message_id": "om_3", "open_chat_id": "oc_d",
                                     "action": {"value": {"r": "r:t:abc"}, "tag": "button"}});
        let c = parse_card(old.to_string().as_bytes()).unwrap();
        assert_eq!((c.operator.as_str(), c.chat_id.as_str()), ("ou_x", "oc_d"));
        assert!(parse_event(b"{}").is_err() && parse_event(b"\xff").is_err());
        let other = serde_json::json!({"header": {"event_type": "im.chat.member.bot.added_v1"}, "event": {}});
        assert_eq!(
            parse_event(other.to_string().as_bytes()).unwrap().event,
            Event::Other("im.chat.member.bot.added_v1".into())
        );
    }
}
