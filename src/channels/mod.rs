//! Channels: where reports are delivered and where messages come from.
//!
//! A channel delivers [`OutboundMessage`](crate::bus::OutboundMessage)s to the
//! targets it owns (`telegram:<chat>`, `mqtt[:topic]`, `log`) and may feed
//! inbound messages onto the bus. The outbox (see [`crate::daemon::outbox`])
//! calls [`Channel::deliver`] and retries on a retryable failure, so a channel
//! reports failure honestly instead of retrying on its own.

pub mod log;
pub mod mqtt;
pub mod telegram;

use crate::bus::Target;
use crate::util::BoxFuture;

/// Why a delivery failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct DeliveryError {
    pub message: String,
    /// Whether trying again later may succeed (broker down, network, 429) or
    /// not (chat does not exist, bot blocked): permanent failures are dropped with a log line.
    pub retryable: bool,
}

impl DeliveryError {
    pub fn retryable(message: impl Into<String>) -> Self {
        DeliveryError { message: message.into(), retryable: true }
    }
    pub fn permanent(message: impl Into<String>) -> Self {
        DeliveryError { message: message.into(), retryable: false }
    }
}

/// One report to deliver: where, what, and what produced it.
#[derive(Debug, Clone, Copy)]
pub struct Report<'a> {
    pub target: &'a Target,
    pub text: &'a str,
    /// What produced it: `agent` (an answer or the `message` tool), `heartbeat`,
    /// `job:<name>`, `trigger:<topic>`. A channel may route on it (MQTT publishes
    /// heartbeat reports on `<prefix>/heartbeat`).
    pub source: &'a str,
}

/// Something that can deliver text to some targets.
pub trait Channel: Send + Sync {
    /// `telegram`, `mqtt`, `log`: matches [`Target::channel`].
    fn name(&self) -> &'static str;
    /// Deliver one report. Ok means the other side accepted it.
    fn deliver<'a>(&'a self, report: Report<'a>) -> BoxFuture<'a, Result<(), DeliveryError>>;
}
