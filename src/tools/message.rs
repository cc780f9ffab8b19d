//! `message`: send a message to a delivery target now, mid-turn.
//!
//! The final answer of a turn already goes back to where the turn came from;
//! this tool is for everything else: a progress note, a report to another
//! chat, a publish to the MQTT report topic. It only puts the message on the
//! bus — delivery (and retrying it) is the channels' business.
//!
//! Because the tool runs with bramble's rights, a target is checked against
//! the turn's [`super::Origin`] first: Telegram chats only of `allow_from`
//! users (usernames by their pinned ids), and none at all for an untrusted
//! origin (MQTT) — a sandboxed command that publishes to `<prefix>/in` must not
//! be able to write to arbitrary chats through the bot.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::{parse_args, Tool, ToolContext, ToolError};
use crate::bus::{OutboundMessage, Target};
use crate::policy::AllowedChats;
use crate::util::BoxFuture;

/// How long to wait for room on a full outbound queue.
const SEND_TIMEOUT: Duration = Duration::from_secs(5);

pub struct MessageTool {
    outbound: mpsc::Sender<OutboundMessage>,
    /// `[mqtt] publish_allow`: `mqtt:<topic>` targets must match one, or this
    /// tool would be a way around `mqtt_publish`'s limits. (`mqtt`, the
    /// device's own report topic, is always fine.)
    mqtt_allow: super::mqtt::MqttPublish,
    /// The chats of `[telegram] allow_from`: the only Telegram chats it sends to.
    telegram: AllowedChats,
    /// Where `attach` paths are found (`None`: attachments are refused).
    workspace: Option<crate::workspace::Workspace>,
}

/// Files one message may carry.
const MAX_ATTACH: usize = 10;
/// The largest file a Telegram bot may upload.
const MAX_UPLOAD: u64 = 50 * 1024 * 1024;

impl MessageTool {
    pub fn new(outbound: mpsc::Sender<OutboundMessage>, mqtt_allow: Vec<String>, telegram: AllowedChats) -> Self {
        MessageTool { outbound, mqtt_allow: super::mqtt::MqttPublish::new(mqtt_allow, None), telegram, workspace: None }
    }

    /// Refuse `mqtt:<topic>` targets bramble listens to.
    pub fn with_mqtt_inputs(mut self, inputs: Option<crate::util::mqtt::InputTopics>) -> Self {
        self.mqtt_allow = self.mqtt_allow.refusing(inputs);
        self
    }

    /// Let messages carry workspace files (`attach`).
    pub fn with_workspace(mut self, workspace: crate::workspace::Workspace) -> Self {
        self.workspace = Some(workspace);
        self
    }

    /// Each path of `attach`, checked now (a regular file in the workspace,
    /// within Telegram's upload limit), as a path relative to the workspace.
    async fn check_attach(&self, paths: Vec<String>) -> Result<Vec<String>, ToolError> {
        if paths.is_empty() {
            return Ok(paths);
        }
        let Some(ws) = self.workspace.clone() else {
            return Err(ToolError::new("this message tool cannot attach files"));
        };
        if paths.len() > MAX_ATTACH {
            return Err(ToolError::new(format!("at most {MAX_ATTACH} files per message")));
        }
        crate::util::tasks::blocking(move || {
            paths
                .iter()
                .map(|p| {
                    let (_, stat) =
                        ws.open_regular(p).map_err(|e| ToolError::new(format!("cannot attach {p}: {e}")))?;
                    let limit = MAX_UPLOAD;
                    if stat.st_size as u64 > limit {
                        return Err(ToolError::new(format!(
                            "cannot attach {p}: it is {}; Telegram takes files up to 50 MB",
                            crate::bus::human_size(stat.st_size as u64)
                        )));
                    }
                    let rel = ws.relative(p).map_err(|e| ToolError::new(e.to_string()))?;
                    Ok(rel.to_string_lossy().into_owned())
                })
                .collect()
        })
        .await
    }
}

#[derive(Deserialize)]
struct Args {
    content: String,
    target: Option<String>,
    #[serde(default)]
    attach: Vec<String>,
}

impl Tool for MessageTool {
    fn name(&self) -> &str {
        "message"
    }

    fn description(&self) -> &str {
        "Send a message now. Without `target` it goes to the current chat. Targets: \
         `telegram:<chat_id>`, `mqtt` (the device's report topic), `mqtt:<topic>`, `log`. \
         `attach` sends workspace files with it (Telegram: images as photos, others as documents). \
         Your final answer is delivered anyway; use this for extra or cross-channel messages or files."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "content": {"type": "string", "description": "The message text."},
                "target": {"type": "string", "description": "Delivery target; default: the current chat."},
                "attach": {"type": "array", "items": {"type": "string"},
                           "description": "Workspace paths of files to send with the message (up to 10, 50 MB each)."}
            },
            "required": ["content"]
        })
    }

    fn execute<'a>(&'a self, args: Value, ctx: &'a ToolContext) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let args: Args = parse_args("message", args)?;
            if args.content.trim().is_empty() {
                return Err(ToolError::new("`content` is empty"));
            }
            let target = match args.target.as_deref().map(str::trim).filter(|t| !t.is_empty()) {
                Some(t) => t.parse::<Target>().map_err(ToolError)?,
                None => ctx.conversation.reply_target(),
            };
            if let Target::Mqtt(Some(topic)) = &target {
                self.mqtt_allow.check(topic)?;
            }
            check_delivery(ctx, std::slice::from_ref(&target), &self.telegram).await?;
            let attach = self.check_attach(args.attach).await?;
            let files = attach.len();
            let msg = OutboundMessage { target: target.clone(), text: args.content, attach };
            match tokio::time::timeout(SEND_TIMEOUT, self.outbound.send(msg)).await {
                Ok(Ok(())) if files > 0 => Ok(format!("Message with {files} file(s) queued for {target}.")),
                Ok(Ok(())) => Ok(format!("Message queued for {target}.")),
                Ok(Err(_)) => Err(ToolError::new("messages cannot be sent right now (the daemon is shutting down)")),
                Err(_) => Err(ToolError::new("the outbound queue is full; try again later")),
            }
        })
    }
}

/// [`super::Origin::check_delivery`] for each target, off the runtime thread (it reads the pins file).
pub(crate) async fn check_delivery(
    ctx: &ToolContext,
    targets: &[Target],
    chats: &AllowedChats,
) -> Result<(), ToolError> {
    if !targets.iter().any(|t| {
        matches!(
            t,
            Target::Telegram(_)
                | Target::Feishu(_)
                | Target::Discord(_)
                | Target::Matrix(_)
                | Target::Email(_)
                | Target::HomeAssistant(_)
        )
    }) {
        return Ok(());
    }
    let (ctx, targets, chats) = (ctx.clone(), targets.to_vec(), chats.clone());
    tokio::task::spawn_blocking(move || targets.iter().try_for_each(|t| ctx.origin.check_delivery(&ctx, t, &chats)))
        .await
        .map_err(|e| ToolError::new(format!("the target check stopped: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sends_to_the_current_chat_or_a_named_target() {
        let (tx, mut rx) = mpsc::channel(4);
        let tool =
            MessageTool::new(tx, vec!["home/#".into()], AllowedChats::new(&[], std::path::Path::new("/nonexistent")));
        let ctx = ToolContext::detached("telegram:42").from_chat("telegram", "42");
        let out = tool.execute(json!({"content": "hi"}), &ctx).await.unwrap();
        assert_eq!(out, "Message queued for telegram:42.");
        assert_eq!(rx.recv().await.unwrap(), OutboundMessage::text(Target::Telegram("42".into()), "hi"));
        tool.execute(json!({"content": "x", "target": "mqtt:home/note"}), &ctx).await.unwrap();
        assert_eq!(rx.recv().await.unwrap().target, Target::Mqtt(Some("home/note".into())));
        // `mqtt:<topic>` obeys `[mqtt] publish_allow` like `mqtt_publish` does; `mqtt` is the device's own.
        let err = tool.execute(json!({"content": "x", "target": "mqtt:garage/door/set"}), &ctx).await.unwrap_err();
        assert!(err.0.contains("not allowed"), "{err}");
        tool.execute(json!({"content": "x", "target": "mqtt"}), &ctx).await.unwrap();
        assert_eq!(rx.recv().await.unwrap().target, Target::Mqtt(None));
    }

    #[tokio::test]
    async fn bad_target_and_empty_content_are_errors() {
        let (tx, _rx) = mpsc::channel(4);
        let tool = MessageTool::new(tx, Vec::new(), AllowedChats::new(&[], std::path::Path::new("/nonexistent")));
        let ctx = ToolContext::detached("k");
        let err = tool.execute(json!({"content": "x", "target": "email:me"}), &ctx).await.unwrap_err();
        assert!(err.0.contains("not a delivery target"), "{err}");
        assert!(tool.execute(json!({"content": "  "}), &ctx).await.is_err());
    }

    #[tokio::test]
    async fn telegram_chats_only_of_allowed_users_and_never_from_mqtt() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut rx) = mpsc::channel(4);
        let chats = AllowedChats::new(&["42".into(), "@alice".into()], dir.path());
        let tool = MessageTool::new(tx, Vec::new(), chats);
        let cli = ToolContext::detached("cli:direct");
        tool.execute(json!({"content": "x", "target": "telegram:42"}), &cli).await.unwrap();
        assert_eq!(rx.recv().await.unwrap().target, Target::Telegram("42".into()));
        // A chat of nobody in allow_from, and an unpinned name, are refused for every origin.
        for t in ["telegram:777", "telegram:@alice"] {
            let err = tool.execute(json!({"content": "x", "target": t}), &cli).await.unwrap_err();
            assert!(err.0.contains("not the chat of a user in [telegram] allow_from"), "{err}");
        }
        // Once @alice is pinned to 5, her chat is reachable.
        crate::policy::pins::save_pins(dir.path(), &[("alice".to_string(), 5)].into()).unwrap();
        tool.execute(json!({"content": "x", "target": "telegram:5"}), &cli).await.unwrap();
        assert_eq!(rx.recv().await.unwrap().target, Target::Telegram("5".into()));
        // A group chat the turn came from is its own reply target.
        let group = ToolContext::detached("telegram:-100").from_chat("telegram", "-100");
        tool.execute(json!({"content": "x"}), &group).await.unwrap();
        assert_eq!(rx.recv().await.unwrap().target, Target::Telegram("-100".into()));
        // MQTT turns reach no Telegram chat, not even an allowed one; their own topic is fine.
        let mqtt = ToolContext::detached("mqtt:in").from_chat("mqtt", "");
        let err = tool.execute(json!({"content": "x", "target": "telegram:42"}), &mqtt).await.unwrap_err();
        assert!(err.0.contains("untrusted origin"), "{err}");
        tool.execute(json!({"content": "x"}), &mqtt).await.unwrap();
        assert_eq!(rx.recv().await.unwrap().target, Target::Mqtt(None));
        assert!(rx.try_recv().is_err());
    }

    #[tokio::test]
    async fn mail_goes_only_to_allowed_addresses_whoever_asks() {
        let (tx, mut rx) = mpsc::channel(4);
        let chats = AllowedChats::new(&[], std::path::Path::new("/nonexistent")).with_email(["Me@Example.org".into()]);
        let tool = MessageTool::new(tx, Vec::new(), chats);
        let cli = ToolContext::detached("cli:direct");
        tool.execute(json!({"content": "x", "target": "email:me@example.org?digest=07:00"}), &cli).await.unwrap();
        assert_eq!(rx.recv().await.unwrap().target.to_string(), "email:me@example.org?digest=07:00");
        // Not even the owner's terminal turn mails an address outside [email] allow_from.
        let err = tool.execute(json!({"content": "x", "target": "email:boss@example.org"}), &cli).await.unwrap_err();
        assert!(err.0.contains("not in [email] allow_from"), "{err}");
        // A mail turn answers into its own thread; an MQTT turn mails nobody.
        let mail = ToolContext::detached("email:me@example.org:1").from_chat("email", "me@example.org");
        tool.execute(json!({"content": "x"}), &mail).await.unwrap();
        assert_eq!(rx.recv().await.unwrap().target.to_string(), "email:me@example.org");
        let mqtt = ToolContext::detached("mqtt:in").from_chat("mqtt", "");
        assert!(tool.execute(json!({"content": "x", "target": "email:me@example.org"}), &mqtt).await.is_err());
        assert!(rx.try_recv().is_err());
    }

    #[tokio::test]
    async fn matrix_rooms_only_configured_invited_or_the_turns_own() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut rx) = mpsc::channel(4);
        let policy = crate::policy::matrix::MatrixPolicy::new(&["@o:x".into()], &["#ops:x".into()], dir.path());
        let mut rooms = crate::policy::matrix::Rooms::default();
        let by = |u: &str| crate::policy::matrix::RoomRecord { invited_by: Some(u.into()), ..Default::default() };
        rooms.rooms.insert("!dm:x".into(), by("@o:x"));
        rooms.rooms.insert("!theirs:x".into(), by("@mallory:x"));
        rooms.save(dir.path()).unwrap();
        let chats = AllowedChats::new(&[], dir.path()).with_matrix(policy);
        let tool = MessageTool::new(tx, Vec::new(), chats);
        let cli = ToolContext::detached("cli:direct");
        for t in ["matrix:#ops:x", "matrix:!dm:x"] {
            tool.execute(json!({"content": "x", "target": t}), &cli).await.unwrap();
            assert_eq!(rx.recv().await.unwrap().target.to_string(), t);
        }
        for t in ["matrix:!theirs:x", "matrix:!elsewhere:x", "matrix:#other:x"] {
            let err = tool.execute(json!({"content": "x", "target": t}), &cli).await.unwrap_err();
            assert!(err.0.contains("not a room of [matrix] rooms"), "{t}: {err}");
        }
        // The room a Matrix turn came from is its own reply target; an MQTT turn reaches no room.
        let room = ToolContext::detached("matrix:!new:x").from_chat("matrix", "!new:x");
        tool.execute(json!({"content": "x"}), &room).await.unwrap();
        assert_eq!(rx.recv().await.unwrap().target, Target::Matrix("!new:x".into()));
        let mqtt = ToolContext::detached("mqtt:in").from_chat("mqtt", "");
        let err = tool.execute(json!({"content": "x", "target": "matrix:!dm:x"}), &mqtt).await.unwrap_err();
        assert!(err.0.contains("untrusted origin"), "{err}");
    }
}
