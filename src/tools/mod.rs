//! Tools the model can call, and the registry that runs them.
//!
//! A tool is a name, a description, a JSON schema and an async `execute` that
//! returns text. The registry is the one place where a model's tool call meets
//! the real world, so it owns the rules that keep a bad call from hurting the
//! daemon: arguments that are not JSON, an unknown tool name, a failing tool —
//! each becomes an `Error: …` string the model reads on its next step. Nothing
//! a model sends can panic or abort a turn.
//!
//! - [`fs`]: `read_file`, `write_file`, `edit_file`, `list_dir`, confined to the workspace.
//! - [`exec`]: `exec`, a shell command through [`crate::sandbox`].
//! - [`web`]: `web_fetch` with an SSRF guard.
//! - [`message`]: `message`, a report to a delivery target.
//! - [`mqtt`]: `mqtt_publish`, limited to `[mqtt] publish_allow` topics.
//! - [`mcp`]: the tools of MCP servers (`[[mcp.server]]`), a [`ToolSource`]:
//!   known only once a server is connected, so the registry asks for them per turn.
//! - [`homeassistant`]: `ha_call_service` and `ha_get_state`, limited to `[homeassistant] allow`.
//!
//! ## The lean profile
//!
//! A small local model reads the whole prompt before its first word (on a
//! Pi's CPU ~160 tokens a second), and its window may be 4k. Under
//! `[agent] profile = "lean"` ([`crate::provider::window::WindowProbe::profile`])
//! a turn is offered the fewest tools its kind needs ([`lean_tools`]), each
//! with a one-line description ([`Tool::brief`]) and a compact schema
//! ([`Tool::lean_parameters`]: no descriptions inside the properties). Only
//! what is offered changes: a call to any tool the policy grants still runs.
//!
//! ## Who is asking: [`Origin`]
//!
//! A turn's tools act with bramble's own rights, outside the sandbox, so what
//! they may do depends on who started the turn. The origin is decided once,
//! from the channel the turn came in on, when the turn's [`ToolContext`] is
//! made ([`ToolContext::new`]), and the tools ask it ([`Origin::may_manage_jobs`],
//! [`Origin::check_delivery`], [`Origin::searches_all_sessions`]). MQTT is not
//! trusted: anyone who can publish to `<prefix>/in`, a command in the sandbox
//! included, starts such a turn. Unknown channels count as untrusted too.

pub mod audit;
pub mod cron;
pub mod exec;
pub mod fs;
#[cfg(feature = "homeassistant")]
pub mod homeassistant;
#[cfg(feature = "mcp")]
pub mod mcp;
pub mod message;
pub mod mqtt;
pub mod policy;
#[cfg(feature = "web-search")]
pub mod search;
pub mod web;

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::bus::{Channel, Conversation, Principal};
use crate::provider::{ToolCall, ToolSpec};
use crate::util::BoxFuture;

/// Who started a turn, and so what its tools may do (see the module header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The local terminal (`bramble agent`): the owner at the keyboard.
    Cli,
    /// A Telegram chat, started by an `allow_from` user.
    Telegram,
    /// Mail from an `[email] allow_from` sender the receiving server authenticated.
    Email,
    /// A Feishu / Lark chat, started by a `[feishu] allow_from` user.
    Feishu,
    /// A Matrix room, started by a `[matrix] allow_from` user.
    Matrix,
    /// A Signal chat, started by a `[signal] allow_from` person.
    Signal,
    /// A Discord DM or allowed channel, started by a `[discord] allow_from` user.
    Discord,
    /// The scheduler: the heartbeat, and job runs whose job was made by a trusted origin.
    System,
    /// `<prefix>/in` and MQTT triggers: whoever can publish to the broker.
    Mqtt,
    /// A `[[webhook]]` endpoint: whoever holds its secret, with a payload from outside.
    Webhook,
    /// An `[ntfy] subscribe` topic: whoever can publish to it.
    Ntfy,
    /// `[[homeassistant.trigger]]` turns: their text carries entity states and
    /// attributes, which any device or integration in Home Assistant can set.
    HomeAssistant,
    /// A channel this build does not know: treated like MQTT.
    Unknown,
}

impl Origin {
    /// The origin of a turn that came in on `channel`: the one place trust
    /// is decided (exhaustive: a new channel must be placed here).
    pub fn of(channel: &Channel) -> Origin {
        match channel {
            Channel::Cli => Origin::Cli,
            Channel::Telegram => Origin::Telegram,
            Channel::Feishu => Origin::Feishu,
            Channel::Email => Origin::Email,
            Channel::Matrix => Origin::Matrix,
            Channel::Signal => Origin::Signal,
            Channel::Discord => Origin::Discord,
            Channel::System => Origin::System,
            Channel::Mqtt => Origin::Mqtt,
            Channel::Webhook => Origin::Webhook,
            Channel::Ntfy => Origin::Ntfy,
            Channel::HomeAssistant => Origin::HomeAssistant,
            Channel::Other(_) => Origin::Unknown,
        }
    }

    /// Whether the origin is the owner (or acts for them). Untrusted turns may
    /// not schedule work nor reach Telegram chats.
    pub fn trusted(self) -> bool {
        matches!(
            self,
            Origin::Cli
                | Origin::Telegram
                | Origin::Feishu
                | Origin::Matrix
                | Origin::Signal
                | Origin::Discord
                | Origin::Email
                | Origin::System
        )
    }

    /// The name used in refusals and logs.
    pub fn name(self) -> &'static str {
        match self {
            Origin::Cli => "the terminal",
            Origin::Telegram => "Telegram",
            Origin::Feishu => "Feishu / Lark",
            Origin::Email => "email",
            Origin::Matrix => "Matrix",
            Origin::Signal => "Signal",
            Origin::Discord => "Discord",
            Origin::System => "the scheduler",
            Origin::Mqtt => "MQTT",
            Origin::Webhook => "a webhook",
            Origin::Ntfy => "an ntfy topic",
            Origin::HomeAssistant => "a Home Assistant trigger",
            Origin::Unknown => "an unknown channel",
        }
    }

    /// Creating, changing or removing jobs: trusted origins only.
    pub fn may_manage_jobs(self) -> Result<(), ToolError> {
        if self.trusted() {
            return Ok(());
        }
        Err(ToolError::new(format!(
            "this turn came from {} (an untrusted origin): it cannot create, change or remove jobs",
            self.name()
        )))
    }

    /// Whether a turn may send to `target` (the `message` tool, a job's
    /// `deliver` list). A Telegram chat must be an `allow_from` user's chat
    /// (`chats`), or the very chat the turn came from; untrusted origins reach
    /// no Telegram chat and no Home Assistant notify service (the owner's
    /// phone) at all. Blocking (reads the username pins): call it off the
    /// runtime thread.
    pub fn check_delivery(
        self,
        ctx: &ToolContext,
        target: &crate::bus::Target,
        chats: &crate::policy::AllowedChats,
    ) -> Result<(), ToolError> {
        if let crate::bus::Target::HomeAssistant(_) = target {
            return match self.trusted() {
                true => Ok(()),
                false => Err(ToolError::new(format!(
                    "this turn came from {} (an untrusted origin): it cannot send to {target}",
                    self.name()
                ))),
            };
        }
        if let crate::bus::Target::Email(t) = target {
            // A model turn mails only `[email] allow_from` addresses, whoever asked.
            return match self.trusted() && chats.allows_email(&t.address) {
                true => Ok(()),
                false => Err(ToolError::new(format!(
                    "email:{} is not in [email] allow_from (or this turn came from {}): mail goes only to allowed addresses",
                    t.address,
                    self.name()
                ))),
            };
        }
        if let crate::bus::Target::Matrix(room) = target {
            return self.check_matrix_room(ctx, room, chats);
        }
        if let crate::bus::Target::Signal(chat) = target {
            // Trusted turns only, to the chat the turn came from, an allowed person or a configured group.
            let own = self == Origin::Signal && *chat == ctx.conversation.chat_id;
            return match self.trusted() && (own || chats.signal().chat_allowed(chat)) {
                true => Ok(()),
                false => Err(ToolError::new(format!(
                    "signal:{chat} is not a person of [signal] allow_from nor a group of [signal] groups \
                     (or this turn came from {}, an untrusted origin)",
                    self.name()
                ))),
            };
        }
        if let crate::bus::Target::Feishu(chat) = target {
            // Trusted turns only: the chat the turn came from, a configured one, or one an allowed user wrote in.
            let own = self == Origin::Feishu && *chat == ctx.conversation.chat_id;
            return match self.trusted() && (own || chats.feishu().chat_allowed(chat)) {
                true => Ok(()),
                false => Err(ToolError::new(format!(
                    "feishu:{chat} is not a chat of [feishu] chats nor one a user in [feishu] allow_from wrote in (or this turn came from {})",
                    self.name()
                ))),
            };
        }
        if let crate::bus::Target::Discord(channel) = target {
            return self.check_discord_channel(ctx, *channel, chats);
        }
        let crate::bus::Target::Telegram(chat) = target else { return Ok(()) };
        if !self.trusted() {
            return Err(ToolError::new(format!(
                "this turn came from {} (an untrusted origin): it cannot send to Telegram chats",
                self.name()
            )));
        }
        // The chat the turn came from (a group an allowed user wrote in) is its own reply target.
        if self == Origin::Telegram && *chat == ctx.conversation.chat_id {
            return Ok(());
        }
        if chats.contains(chat) {
            return Ok(());
        }
        Err(ToolError::new(format!(
            "telegram:{chat} is not the chat of a user in [telegram] allow_from: messages go only to allowed users"
        )))
    }

    /// [`Origin::check_delivery`] for a Matrix room: trusted turns only, to
    /// the room the turn came from, a configured room, or one an allowed user
    /// invited bramble to.
    fn check_matrix_room(
        self,
        ctx: &ToolContext,
        room: &str,
        chats: &crate::policy::AllowedChats,
    ) -> Result<(), ToolError> {
        if !self.trusted() {
            return Err(ToolError::new(format!(
                "this turn came from {} (an untrusted origin): it cannot send to Matrix rooms",
                self.name()
            )));
        }
        if (self == Origin::Matrix && room == ctx.conversation.chat_id) || chats.matrix().room_allowed(room) {
            return Ok(());
        }
        Err(ToolError::new(format!(
            "matrix:{room} is not a room of [matrix] rooms nor one a user in [matrix] allow_from invited bramble to"
        )))
    }

    /// [`Origin::check_delivery`] for a Discord channel: trusted turns only,
    /// to the channel the turn came from, a configured channel, or an allowed
    /// user's DM.
    fn check_discord_channel(
        self,
        ctx: &ToolContext,
        channel: u64,
        chats: &crate::policy::AllowedChats,
    ) -> Result<(), ToolError> {
        if !self.trusted() {
            return Err(ToolError::new(format!(
                "this turn came from {} (an untrusted origin): it cannot send to Discord channels",
                self.name()
            )));
        }
        let own = self == Origin::Discord && ctx.conversation.chat_id == channel.to_string();
        if own || chats.discord().channel_allowed(channel) {
            return Ok(());
        }
        Err(ToolError::new(format!(
            "discord:{channel} is not a channel of [discord] channels nor the DM of a user in [discord] allow_from"
        )))
    }

    /// Whether `memory_search` may look at every session's journal entries
    /// (the local terminal), or only at the turn's own session (everyone else).
    pub fn searches_all_sessions(self) -> bool {
        self == Origin::Cli
    }
}

/// Where a tool call comes from: which session, which chat, and how to stop it.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The turn's conversation: its channel (`cli`, `telegram`, `mqtt`,
    /// `system`), chat and session (`cli:direct`, `telegram:42`, `heartbeat`, `cron:<job>`).
    pub conversation: Conversation,
    /// True while a scheduled job runs the turn: tools that would schedule more
    /// work refuse (no feedback loops).
    pub in_job: bool,
    /// Cancelled by `/stop` or shutdown; long-running tools watch it.
    pub cancel: CancellationToken,
    /// Who started the turn ([`Origin::of`] its channel).
    pub origin: Origin,
    /// Where the turn came from, for `[policy.<source>]` (which tools it is offered).
    pub source: policy::Source,
    /// Who the turn acts for: the sender of a chat's message, the creator of
    /// a job. A job made in this turn remembers them.
    pub principal: Principal,
    /// A job's turn: its creator's source, whose tools it may not exceed.
    pub ceiling: Option<policy::Source>,
}

impl ToolContext {
    /// The context of a turn; its [`Origin`] follows from the conversation's
    /// channel, and it acts for [`Principal::presumed`] of it until
    /// [`acting_for`](Self::acting_for) says who.
    pub fn new(conversation: Conversation, in_job: bool, cancel: CancellationToken) -> Self {
        let source = policy::Source::of(&conversation, in_job);
        let principal = presumed(&conversation);
        ToolContext {
            origin: Origin::of(&conversation.channel),
            conversation,
            in_job,
            cancel,
            source,
            principal,
            ceiling: None,
        }
    }

    /// The same context acting for `principal`; a job's turn (`in_job`) gets
    /// its creator's ceiling.
    pub fn acting_for(mut self, principal: Principal) -> Self {
        self.ceiling = if self.in_job { policy::Source::ceiling_of(&principal) } else { None };
        self.principal = principal;
        self
    }

    /// What the turn may be offered: its source's tools within its ceiling.
    pub fn grant(&self) -> policy::Grant {
        policy::Grant { source: self.source, ceiling: self.ceiling }
    }

    /// The same context with another policy source (a sub-agent keeps its parent's).
    pub fn with_source(mut self, source: policy::Source) -> Self {
        self.source = source;
        self
    }

    /// The same context as seen from `channel`/`chat_id` (tests).
    pub fn from_chat(mut self, channel: &str, chat_id: &str) -> Self {
        self.conversation.channel = Channel::from(channel);
        self.conversation.chat_id = chat_id.to_string();
        self.origin = Origin::of(&self.conversation.channel);
        self.source = policy::Source::of(&self.conversation, self.in_job);
        self.principal = presumed(&self.conversation);
        self
    }

    /// A context for a turn with no particular chat (tests, one-off runs).
    pub fn detached(session_key: impl Into<String>) -> Self {
        ToolContext::new(Conversation::cli(session_key), false, CancellationToken::new())
    }

    /// The turn's session key.
    pub fn session_key(&self) -> &str {
        &self.conversation.session_key
    }
}

/// Who a turn in `conversation` acts for when nothing says better (a turn
/// run again after a crash, a test): the owner at the terminal and in the
/// scheduler's own sessions, the user of a private Telegram chat (whose id is
/// the chat's), and nobody in particular elsewhere.
pub fn presumed(conversation: &Conversation) -> Principal {
    match conversation.channel {
        Channel::Cli | Channel::System => Principal::Owner,
        Channel::Telegram => match conversation.chat_id.parse::<i64>() {
            Ok(id) if id > 0 => Principal::Telegram(id),
            _ => Principal::Anonymous,
        },
        Channel::Email if crate::bus::is_plain_address(&conversation.chat_id) => {
            Principal::Email(conversation.chat_id.clone())
        }
        // A room's (or a Discord channel's) id says nothing of who wrote in it.
        Channel::Matrix
        | Channel::Signal
        | Channel::Feishu
        | Channel::Discord
        | Channel::Email
        | Channel::Mqtt
        | Channel::Webhook
        | Channel::Ntfy
        | Channel::HomeAssistant
        | Channel::Other(_) => Principal::Anonymous,
    }
}

/// A failure the model should read. The text is shown to the model after `Error: `.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ToolError(pub String);

impl ToolError {
    pub fn new(msg: impl Into<String>) -> Self {
        ToolError(msg.into())
    }
}

/// One callable tool.
pub trait Tool: Send + Sync {
    /// The name the model calls it by (`read_file`, `homeassistant__HassTurnOn`).
    /// Tied to `&self`: MCP tools learn their names at run time.
    fn name(&self) -> &str;
    /// What it does, for the model.
    fn description(&self) -> &str;
    /// JSON schema of the arguments object.
    fn parameters(&self) -> Value;
    /// One line for the lean profile: by default the description's first sentence.
    fn brief(&self) -> String {
        first_sentence(self.description())
    }
    /// The schema for the lean profile: by default [`compact_schema`] of [`Tool::parameters`].
    fn lean_parameters(&self) -> Value {
        compact_schema(self.parameters())
    }
    /// Run it. `args` is always a JSON object (the registry checks).
    fn execute<'a>(&'a self, args: Value, ctx: &'a ToolContext) -> BoxFuture<'a, Result<String, ToolError>>;
    /// [`execute`](Tool::execute), with images for a model that can see them
    /// (an MCP server's screenshot). Most tools return text only.
    fn execute_rich<'a>(&'a self, args: Value, ctx: &'a ToolContext) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move { self.execute(args, ctx).await.map(|text| ToolOutput { text, images: Vec::new() }) })
    }
}

/// A tool's result: text for the model, and images shown to a model that can
/// see them (in a user message after the round's results; never stored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutput {
    pub text: String,
    pub images: Vec<crate::provider::Image>,
}

/// Images one call may hand the model; more are named in the text only.
pub const MAX_TOOL_IMAGES: usize = 4;

/// Deserialize a tool's arguments, turning serde's complaint into a message the model can act on.
pub fn parse_args<T: DeserializeOwned>(tool: &str, args: Value) -> Result<T, ToolError> {
    serde_json::from_value(args).map_err(|e| ToolError(format!("invalid arguments for {tool}: {e}")))
}

/// The result of one call as the model will see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutcome {
    pub text: String,
    pub is_error: bool,
    /// Images the tool returned (at most [`MAX_TOOL_IMAGES`]).
    pub images: Vec<crate::provider::Image>,
}

/// Tools that are known only at run time (an MCP server's, listed when it
/// connects): the registry asks the source for its current set whenever it
/// builds the specs or looks a name up.
pub trait ToolSource: Send + Sync {
    /// The tools offered now (a snapshot: cheap handles, built on each call).
    fn tools(&self) -> Vec<Arc<dyn Tool>>;
    /// Wait, at most a bounded time, until the source knows its tools (the
    /// first connection attempts are over); starts them if nothing has.
    fn prepare(&self) -> BoxFuture<'_, ()>;
    /// Why `name`, which is not among [`ToolSource::tools`], is missing, if
    /// it is this source's (a tool of a server that is down).
    fn missing(&self, _name: &str) -> Option<String> {
        None
    }
    /// Start connecting now (the daemon: at its start, not at the first turn).
    fn start(&self);
    /// Stop what was started and wait (bounded) until it is gone.
    fn shutdown(&self) -> BoxFuture<'_, ()>;
    /// One line per part for `status` (an MCP server and its state).
    fn status(&self) -> Vec<String>;
}

/// Characters of a description's first sentence at most.
const BRIEF_CHARS: usize = 120;

/// The first sentence of `text` (to a `. ` or the end), at most [`BRIEF_CHARS`] characters.
pub fn first_sentence(text: &str) -> String {
    let text = text.trim();
    let end = text.find(". ").map_or(text.len(), |i| i + 1);
    let first = text[..end].trim();
    if first.chars().count() <= BRIEF_CHARS {
        return first.to_string();
    }
    let cut: String = first.chars().take(BRIEF_CHARS - 1).collect();
    format!("{}…", cut.trim_end())
}

/// `schema` without what only explains: every `description`, `title`,
/// `examples` and `default` below the top level (types, enums, bounds and
/// `required` stay: they are what a call is checked against).
pub fn compact_schema(mut schema: Value) -> Value {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(map) => {
                for key in ["description", "title", "examples", "default"] {
                    map.remove(key);
                }
                map.values_mut().for_each(strip);
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        for (_, p) in props.iter_mut() {
            strip(p);
        }
    }
    if let Some(map) = schema.as_object_mut() {
        map.remove("description");
        map.remove("title");
        map.remove("$schema");
    }
    schema
}

/// The built-in tools a lean turn from `source` is offered: what its kind
/// of work needs. A chat gets a small core set; a job's turn (a `message`
/// job: a task carried out when due) what a task needs, and no `cron` (a job
/// schedules no more work); the heartbeat and triggers what a check needs,
/// and the `report` / `nothing_to_report` decision pair where it is
/// registered. Reminders and `exec` jobs never reach the model (no prompt,
/// no tools: a reminder's text is delivered as it is, a command runs in the
/// sandbox). The integrations the owner configured on purpose (Home
/// Assistant, `mqtt_publish`, MCP servers' tools) are offered as well.
pub fn lean_tools(source: policy::Source) -> &'static [&'static str] {
    use policy::Source;
    match source {
        Source::Terminal
        | Source::Telegram
        | Source::Feishu
        | Source::Discord
        | Source::Matrix
        | Source::Signal
        | Source::Email
        | Source::Mqtt
        | Source::Webhook
        | Source::Ntfy => &["exec", "read_file", "write_file", "cron", "web_fetch"],
        Source::Fleet => &["exec", "read_file", "write_file", "web_fetch"],
        Source::Job => &["exec", "read_file", "write_file", "web_fetch", "report", "nothing_to_report"],
        Source::Heartbeat | Source::Trigger => &["exec", "read_file", "report", "nothing_to_report"],
    }
}

/// Built-in tools a lean turn keeps whatever its source: integrations the
/// owner configured on purpose.
fn configured_integration(name: &str) -> bool {
    name.starts_with("ha_") || name == "mqtt_publish"
}

/// The set of tools offered in a turn.
pub struct ToolRegistry {
    tools: Vec<Arc<dyn Tool>>,
    sources: Vec<Arc<dyn ToolSource>>,
    /// The context window and the profile it chooses (`None`: the default profile, no window).
    window: Option<Arc<crate::provider::window::WindowProbe>>,
    max_result_chars: usize,
    /// Which tools each source of turns is offered (`[policy.*]`).
    policy: Arc<policy::ToolPolicy>,
    /// Where calls that change something are recorded (`None`: nowhere, tests).
    audit: Option<Arc<audit::Audit>>,
}

impl ToolRegistry {
    /// An empty registry; results longer than `max_result_chars` are cut (head and tail kept).
    pub fn new(max_result_chars: usize) -> Self {
        ToolRegistry {
            tools: Vec::new(),
            sources: Vec::new(),
            window: None,
            max_result_chars: max_result_chars.max(256),
            policy: Arc::new(policy::ToolPolicy::default()),
            audit: None,
        }
    }

    /// Record calls that change something in `audit`.
    pub fn with_audit(mut self, audit: audit::Audit) -> Self {
        self.audit = Some(Arc::new(audit));
        self
    }

    /// Offer tools by `policy` (the defaults until this is called: untrusted
    /// sources get no tool that changes things).
    pub fn with_policy(mut self, policy: policy::ToolPolicy) -> Self {
        self.policy = Arc::new(policy);
        self
    }

    pub fn policy(&self) -> &policy::ToolPolicy {
        &self.policy
    }

    /// Offer tools by the profile `window` chooses, and cut results to fit it.
    pub fn with_window(mut self, window: Arc<crate::provider::window::WindowProbe>) -> Self {
        self.window = Some(window);
        self
    }

    /// The profile turns are offered tools by.
    pub fn profile(&self) -> crate::config::Profile {
        self.window.as_ref().map_or(crate::config::Profile::Default, |w| w.profile())
    }

    /// Characters of one result at most: `[agent] max_tool_result_chars`,
    /// and no more than a quarter of the context window (at ~4 characters a
    /// token), so one `cat` cannot push the prompt out of a 4k window.
    pub fn result_cap(&self) -> usize {
        let window = self.window.as_ref().and_then(|w| w.current()).map_or(usize::MAX, |w| w.tokens as usize);
        self.max_result_chars.min(window).max(256)
    }

    /// Whether a lean turn under `grant` is offered the built-in tool `name`.
    fn lean_offers(grant: policy::Grant, name: &str) -> bool {
        lean_tools(grant.source).contains(&name) || configured_integration(name)
    }

    /// Add a tool; a tool with the same name replaces the earlier one.
    pub fn register(&mut self, tool: Arc<dyn Tool>) {
        self.tools.retain(|t| t.name() != tool.name());
        self.tools.push(tool);
    }

    /// Add a source of run-time tools. Its tools never replace a registered one.
    pub fn register_source(&mut self, source: Arc<dyn ToolSource>) {
        self.sources.push(source);
    }

    /// A copy without the named tools (sub-agents, job runs); sources are kept.
    pub fn without(&self, names: &[&str]) -> ToolRegistry {
        ToolRegistry {
            tools: self.tools.iter().filter(|t| !names.contains(&t.name())).cloned().collect(),
            sources: self.sources.clone(),
            window: self.window.clone(),
            max_result_chars: self.max_result_chars,
            policy: Arc::clone(&self.policy),
            audit: self.audit.clone(),
        }
    }

    /// Every tool offered now: the registered ones, then the sources' (a
    /// source's tool whose name is taken is left out).
    fn all(&self) -> Vec<Arc<dyn Tool>> {
        self.all_marked().into_iter().map(|(t, _)| t).collect()
    }

    /// [`Self::all`], each marked whether it is a run-time source's (an MCP server's).
    fn all_marked(&self) -> Vec<(Arc<dyn Tool>, bool)> {
        let mut all: Vec<(Arc<dyn Tool>, bool)> = self.tools.iter().map(|t| (Arc::clone(t), false)).collect();
        for source in &self.sources {
            for tool in source.tools() {
                if !all.iter().any(|(t, _)| t.name() == tool.name()) {
                    all.push((tool, true));
                }
            }
        }
        all
    }

    /// The tools a turn under `grant` is offered: its policy's, and under
    /// the lean profile only those [`lean_tools`] names (and the MCP servers').
    fn offered(&self, grant: policy::Grant) -> Vec<Arc<dyn Tool>> {
        let lean = self.profile() == crate::config::Profile::Lean;
        self.all_marked()
            .into_iter()
            .filter(|(t, from_source)| !lean || *from_source || Self::lean_offers(grant, t.name()))
            .map(|(t, _)| t)
            .filter(|t| self.policy.grants(grant, t.name()))
            .collect()
    }

    pub fn names(&self) -> Vec<String> {
        self.all().iter().map(|t| t.name().to_string()).collect()
    }

    /// The names of the tools a turn under `grant` is offered.
    pub fn names_for(&self, grant: impl Into<policy::Grant>) -> Vec<String> {
        self.offered(grant.into()).iter().map(|t| t.name().to_string()).collect()
    }

    pub fn get(&self, name: &str) -> Option<Arc<dyn Tool>> {
        if let Some(t) = self.tools.iter().find(|t| t.name() == name) {
            return Some(Arc::clone(t));
        }
        self.sources.iter().flat_map(|s| s.tools()).find(|t| t.name() == name)
    }

    /// Run the run-time sources until `stop` fires (the daemon's generation).
    pub async fn run_sources(&self, stop: CancellationToken) {
        for source in &self.sources {
            source.start();
        }
        stop.cancelled().await;
        for source in &self.sources {
            source.shutdown().await;
        }
    }

    /// The run-time sources' status lines (MCP servers).
    pub fn sources_status(&self) -> Vec<String> {
        self.sources.iter().flat_map(|s| s.status()).collect()
    }

    /// Let the run-time sources finish their first connection (bounded), so
    /// that a turn's first call sees their tools.
    pub async fn prepare(&self) {
        for source in &self.sources {
            source.prepare().await;
        }
    }

    /// The specs offered to the model.
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.specs_where(|_| true)
    }

    /// The specs offered to a turn under `grant` (`[policy.*]`), as the
    /// profile writes them (lean: one-line descriptions, compact schemas).
    pub fn specs_for(&self, grant: impl Into<policy::Grant>) -> Vec<ToolSpec> {
        let lean = self.profile() == crate::config::Profile::Lean;
        self.offered(grant.into())
            .iter()
            .map(|t| match lean {
                true => {
                    ToolSpec { name: t.name().to_string(), description: t.brief(), parameters: t.lean_parameters() }
                }
                false => ToolSpec {
                    name: t.name().to_string(),
                    description: t.description().to_string(),
                    parameters: t.parameters(),
                },
            })
            .collect()
    }

    fn specs_where(&self, offered: impl Fn(&str) -> bool) -> Vec<ToolSpec> {
        self.all()
            .iter()
            .filter(|t| offered(t.name()))
            .map(|t| ToolSpec {
                name: t.name().to_string(),
                description: t.description().to_string(),
                parameters: t.parameters(),
            })
            .collect()
    }

    /// Run one call. Never fails: every problem becomes an `Error: …` outcome.
    pub async fn execute(&self, call: &ToolCall, ctx: &ToolContext) -> ToolOutcome {
        let name = call.function.name.as_str();
        if !self.policy.grants(ctx.grant(), name) {
            if let Some(audit) = &self.audit {
                let args = parse_arguments(&call.function.arguments).unwrap_or_default();
                if audit::Audit::audited(name, &args) {
                    audit.record(ctx, name, &args, false).await;
                }
            }
            return error_outcome(format!(
                "`{name}` is not offered to turns from {} ({} in the config). Tools here: {}.",
                ctx.origin.name(),
                ctx.grant().tables(),
                self.names_for(ctx.grant()).join(", ")
            ));
        }
        let Some(tool) = self.get(name) else {
            if let Some(why) = self.sources.iter().find_map(|s| s.missing(name)) {
                return error_outcome(why);
            }
            return error_outcome(format!(
                "there is no tool named `{name}`. Available tools: {}.",
                self.names().join(", ")
            ));
        };
        let args = match parse_arguments(&call.function.arguments) {
            Ok(args) => args,
            Err(why) => {
                return error_outcome(format!(
                    "the arguments of this `{name}` call are {why}. Call it again with a JSON object that matches its schema."
                ))
            }
        };
        let audited = self.audit.as_ref().filter(|_| audit::Audit::audited(name, &args)).map(|a| (a, args.clone()));
        let result = tokio::select! {
            r = tool.execute_rich(args, ctx) => r,
            _ = ctx.cancel.cancelled() => Err(ToolError::new("the call was cancelled (stop requested)")),
        };
        if let Some((audit, args)) = audited {
            audit.record(ctx, name, &args, result.is_ok()).await;
        }
        match result {
            Ok(mut out) => {
                out.images.truncate(MAX_TOOL_IMAGES);
                ToolOutcome { text: truncate_middle(&out.text, self.result_cap()), is_error: false, images: out.images }
            }
            Err(e) => {
                tracing::debug!(tool = name, error = %e, "tool call failed");
                error_outcome(truncate_middle(&e.0, self.result_cap()))
            }
        }
    }
}

fn error_outcome(msg: String) -> ToolOutcome {
    ToolOutcome { text: format!("Error: {msg}"), is_error: true, images: Vec::new() }
}

/// Parse a model's raw argument text into a JSON object. Empty text means `{}`
/// (several servers send that for argument-less calls).
fn parse_arguments(raw: &str) -> Result<Value, ArgumentsError> {
    let raw = raw.trim();
    if raw.is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    match serde_json::from_str::<Value>(raw) {
        Ok(v @ Value::Object(_)) => Ok(v),
        // Some models double-encode: a JSON string holding the object.
        Ok(Value::String(inner)) => match serde_json::from_str::<Value>(&inner) {
            Ok(v @ Value::Object(_)) => Ok(v),
            _ => Err(ArgumentsError::NotObject("string")),
        },
        Ok(other) => Err(ArgumentsError::NotObject(json_kind(&other))),
        Err(e) => Err(ArgumentsError::Json(e)),
    }
}

/// What a model's argument text is instead of a JSON object: the end of
/// "the arguments of this `<tool>` call are <this>".
#[derive(Debug, thiserror::Error)]
enum ArgumentsError {
    #[error("a JSON {0}, not an object")]
    NotObject(&'static str),
    #[error("not valid JSON ({0})")]
    Json(serde_json::Error),
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Cut `text` to at most `max` characters, keeping the head and the tail and
/// saying how much was left out in between (the end of a log is often what matters).
pub fn truncate_middle(text: &str, max: usize) -> String {
    let total = text.chars().count();
    if total <= max {
        return text.to_string();
    }
    let keep = max.saturating_sub(60) / 2;
    let head: String = text.chars().take(keep).collect();
    let tail_start = text.char_indices().nth(total - keep).map(|(i, _)| i).unwrap_or(text.len());
    let omitted = total - 2 * keep;
    format!("{head}\n... ({omitted} characters truncated) ...\n{}", &text[tail_start..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct Echo;
    impl Tool for Echo {
        fn name(&self) -> &str {
            "echo"
        }
        fn description(&self) -> &str {
            "echo the text"
        }
        fn parameters(&self) -> Value {
            json!({"type":"object","properties":{"text":{"type":"string"}},"required":["text"]})
        }
        fn execute<'a>(&'a self, args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<String, ToolError>> {
            Box::pin(async move {
                #[derive(serde::Deserialize)]
                struct A {
                    text: String,
                }
                let a: A = parse_args("echo", args)?;
                if a.text == "fail" {
                    return Err(ToolError::new("asked to fail"));
                }
                Ok(a.text)
            })
        }
    }

    fn registry() -> ToolRegistry {
        let mut r = ToolRegistry::new(1000);
        r.register(Arc::new(Echo));
        r
    }

    async fn call(raw_name: &str, raw_args: &str) -> ToolOutcome {
        registry().execute(&ToolCall::new("c1", raw_name, raw_args), &ToolContext::detached("t")).await
    }

    #[tokio::test]
    async fn good_call_returns_text() {
        let out = call("echo", r#"{"text":"hi"}"#).await;
        assert_eq!(out, ToolOutcome { text: "hi".into(), is_error: false, images: Vec::new() });
    }

    #[tokio::test]
    async fn malformed_json_is_an_error_string() {
        for raw in [r#"{"text":"hi""#, "not json", "{'text': 'x'}", "\u{0}"] {
            let out = call("echo", raw).await;
            assert!(out.is_error, "{raw}");
            assert!(
                out.text.starts_with("Error: the arguments of this `echo` call are not valid JSON"),
                "{}",
                out.text
            );
        }
        let out = call("echo", "[1,2]").await;
        assert!(out.text.contains("a JSON array, not an object"), "{}", out.text);
    }

    #[tokio::test]
    async fn double_encoded_arguments_are_accepted() {
        let out = call("echo", r#""{\"text\":\"hi\"}""#).await;
        assert_eq!(out.text, "hi");
    }

    #[tokio::test]
    async fn a_source_is_offered_and_may_call_only_what_its_policy_allows() {
        struct Named(&'static str);
        impl Tool for Named {
            fn name(&self) -> &str {
                self.0
            }
            fn description(&self) -> &str {
                "x"
            }
            fn parameters(&self) -> Value {
                json!({"type": "object", "properties": {}})
            }
            fn execute<'a>(&'a self, _: Value, _: &'a ToolContext) -> BoxFuture<'a, Result<String, ToolError>> {
                Box::pin(async { Ok("ran".to_string()) })
            }
        }
        let mut r = ToolRegistry::new(1000);
        for n in ["read_file", "exec", "mqtt_publish"] {
            r.register(Arc::new(Named(n)));
        }
        let mqtt = ToolContext::detached("mqtt:x").from_chat("mqtt", "home/reply");
        assert_eq!(mqtt.source, policy::Source::Mqtt);
        let offered: Vec<String> = r.specs_for(mqtt.source).into_iter().map(|s| s.name).collect();
        assert_eq!(offered, ["read_file"]);
        let out = r.execute(&ToolCall::new("1", "exec", "{}"), &mqtt).await;
        assert!(out.is_error && out.text.contains("not offered to turns from MQTT ([policy.mqtt]"), "{}", out.text);
        assert!(out.text.ends_with("Tools here: read_file."), "{}", out.text);
        let chat = ToolContext::detached("telegram:1").from_chat("telegram", "1");
        assert_eq!(r.execute(&ToolCall::new("1", "exec", "{}"), &chat).await.text, "ran");
        // A table in the config changes it.
        let mut cfg = std::collections::BTreeMap::new();
        cfg.insert(
            "mqtt".to_string(),
            crate::config::PolicyRule { tools: None, deny: Some(vec!["exec".into()]), memory: None },
        );
        let r = r.with_policy(policy::ToolPolicy::from_config(&cfg));
        assert_eq!(r.execute(&ToolCall::new("1", "mqtt_publish", "{}"), &mqtt).await.text, "ran");
        assert!(
            r.without(&[]).execute(&ToolCall::new("1", "exec", "{}"), &mqtt).await.is_error,
            "copies keep the policy"
        );
    }

    struct Wordy(&'static str);
    impl Tool for Wordy {
        fn name(&self) -> &str {
            self.0
        }
        fn description(&self) -> &str {
            "Does the thing. Then explains at length how, why, and when it does it."
        }
        fn parameters(&self) -> Value {
            json!({"type": "object", "description": "top", "properties": {
                "path": {"type": "string", "description": "A long explanation", "default": "x"},
                "mode": {"type": "string", "enum": ["a", "b"], "title": "Mode"},
                "list": {"type": "array", "items": {"type": "string", "description": "each"}}
            }, "required": ["path"]})
        }
        fn execute<'a>(&'a self, _: Value, _: &'a ToolContext) -> BoxFuture<'a, Result<String, ToolError>> {
            Box::pin(async { Ok("o".repeat(50_000)) })
        }
    }

    #[tokio::test]
    async fn the_lean_profile_offers_what_the_task_needs_in_few_words() {
        use crate::config::Profile;
        use crate::provider::window::WindowProbe;
        let names =
            ["read_file", "write_file", "edit_file", "list_dir", "exec", "web_fetch", "cron", "spawn", "ha_get_state"];
        let mut r = ToolRegistry::new(16_000);
        for n in names {
            r.register(Arc::new(Wordy(n)));
        }
        let default = r.without(&[]).with_window(Arc::new(WindowProbe::fixed(Some(131_072), None)));
        assert_eq!(default.profile(), Profile::Default);
        assert_eq!(default.specs_for(policy::Source::Terminal).len(), names.len());
        let lean = r.with_window(Arc::new(WindowProbe::fixed(Some(4096), None)));
        assert_eq!(lean.profile(), Profile::Lean);
        let offered = |s: policy::Source| lean.names_for(s);
        assert_eq!(
            offered(policy::Source::Terminal),
            ["read_file", "write_file", "exec", "web_fetch", "cron", "ha_get_state"]
        );
        assert_eq!(offered(policy::Source::Job), ["read_file", "write_file", "exec", "web_fetch", "ha_get_state"]);
        assert_eq!(offered(policy::Source::Heartbeat), ["read_file", "exec", "ha_get_state"]);
        // The policy still applies on top: no exec for a trigger.
        assert_eq!(offered(policy::Source::Trigger), ["read_file", "ha_get_state"]);
        let spec = &lean.specs_for(policy::Source::Terminal)[0];
        assert_eq!(spec.description, "Does the thing.");
        assert_eq!(
            spec.parameters,
            json!({"type": "object", "properties": {
                "path": {"type": "string"}, "mode": {"type": "string", "enum": ["a", "b"]},
                "list": {"type": "array", "items": {"type": "string"}}
            }, "required": ["path"]})
        );
        // Not offered is not forbidden: a call the policy grants still runs.
        let out = lean.execute(&ToolCall::new("1", "spawn", "{}"), &ToolContext::detached("t")).await;
        assert!(!out.is_error, "{}", out.text);
        // A result is cut to a quarter of the window's characters, with a marker.
        assert!(out.text.chars().count() <= 4096 && out.text.contains("characters truncated"), "{}", out.text.len());
        let big = default.execute(&ToolCall::new("1", "spawn", "{}"), &ToolContext::detached("t")).await;
        assert!(big.text.chars().count() > 15_000 && big.text.chars().count() <= 16_000);
    }

    #[test]
    fn first_sentences_are_short() {
        assert_eq!(first_sentence("One. Two."), "One.");
        assert_eq!(first_sentence("No stop here"), "No stop here");
        assert_eq!(first_sentence("Version 2.5 is fine. More."), "Version 2.5 is fine.");
        let long = first_sentence(&"é".repeat(500));
        assert_eq!(long.chars().count(), BRIEF_CHARS);
        assert!(long.ends_with('…'));
    }

    #[tokio::test]
    async fn unknown_tool_lists_the_known_ones() {
        let out = call("rm_rf", "{}").await;
        assert!(out.is_error);
        assert_eq!(out.text, "Error: there is no tool named `rm_rf`. Available tools: echo.");
    }

    #[tokio::test]
    async fn tool_failures_and_schema_mismatches_are_error_strings() {
        let out = call("echo", r#"{"text":"fail"}"#).await;
        assert_eq!(out.text, "Error: asked to fail");
        let out = call("echo", r#"{"txt":"x"}"#).await;
        assert!(out.text.contains("invalid arguments for echo: missing field `text`"), "{}", out.text);
        let out = call("echo", "").await;
        assert!(out.text.contains("missing field `text`"), "{}", out.text);
    }

    #[test]
    fn truncation_keeps_head_and_tail() {
        let text: String = (0..5000).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
        let cut = truncate_middle(&text, 500);
        assert!(cut.chars().count() <= 500);
        assert!(cut.starts_with(&text[..100]));
        assert!(cut.ends_with(&text[text.len() - 100..]));
        assert!(cut.contains("characters truncated"));
        assert_eq!(truncate_middle("short", 500), "short");
        // multi-byte characters are never split
        let wide = "é".repeat(2000);
        assert!(truncate_middle(&wide, 300).chars().count() <= 300);
    }
}
