//! The bodies of the fleet's envelopes (JSON inside [`super::auth::Envelope::body`]).

use serde::{Deserialize, Serialize};

pub const TURN: &str = "turn";
pub const CRON_ADD: &str = "cron.add";
pub const CRON_REMOVE: &str = "cron.remove";
pub const REPLY: &str = "reply";
pub const REPORT: &str = "report";
/// The primary has a node's report (queued or a duplicate): the envelope's id is the report's key.
pub const ACK: &str = "ack";

/// The longest `/on` text or report text carried (characters beyond are cut).
pub const MAX_TEXT: usize = 64 * 1024;

/// `turn`: run one agent turn with this text; the answer goes to `fleet/answer/<id>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Turn {
    pub text: String,
}

/// `cron.remove`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Remove {
    pub id: String,
}

/// `reply`: how a command went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    pub ok: bool,
    pub text: String,
}

/// `report`: one report of the node's for a chat the primary owns; the
/// envelope's id is its idempotency key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportBody {
    pub target: String,
    pub text: String,
    pub source: String,
}
