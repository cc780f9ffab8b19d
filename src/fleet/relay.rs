//! On a node: reports for the chats the primary owns (`telegram:…`,
//! `matrix:…`, `email:…`) go to the primary as signed `report` messages on
//! `bramble/<node>/fleet/up`, QoS 1. The node's outbox keeps a report until
//! the broker acknowledged it (so a report made while the broker is down goes
//! out when it is back); its idempotency key, `<job>@<slot>` (the report's
//! queue time and outbox id, the same on every retry and across restarts),
//! lets the primary drop the copy a retry after a lost acknowledgement sends.

use std::sync::Arc;

use super::auth::Signer;
use super::{topics, wire};
use crate::channels::mqtt::{Link, PublishError, ACK_TIMEOUT};
use crate::config::fleet::BoardName;
use crate::delivery::{Channel, DeliveryError, Report};
use crate::util::BoxFuture;

/// The chat channels a node relays when it has none of its own.
pub const RELAYED: [&str; 3] = ["telegram", "matrix", "email"];

pub struct Relay {
    pub name: &'static str,
    pub me: BoardName,
    pub primary: BoardName,
    pub link: Arc<Link>,
    pub signer: Signer,
}

/// A report's idempotency key: `<source>@<slot>`.
pub fn key(report: &Report<'_>) -> String {
    format!("{}@{}.{}", report.source, report.created.as_millisecond(), report.id)
}

impl Channel for Relay {
    fn name(&self) -> &'static str {
        self.name
    }

    fn deliver<'a>(&'a self, report: Report<'a>) -> BoxFuture<'a, Result<(), DeliveryError>> {
        Box::pin(async move {
            let topic = topics::up(&self.me);
            let body = wire::ReportBody {
                target: report.target.to_string(),
                text: report.text_naming_files().into_owned(),
                source: report.source.to_string(),
            };
            let body = serde_json::to_string(&body).map_err(|e| DeliveryError::permanent(e.to_string()))?;
            let e = self.signer.seal(&topic, &self.me, &self.primary, wire::REPORT, &key(&report), body);
            let bytes = serde_json::to_vec(&e).map_err(|e| DeliveryError::permanent(e.to_string()))?;
            match self.link.publish_acked(&topic, bytes, false, ACK_TIMEOUT).await {
                Ok(()) => Ok(()),
                Err(e @ PublishError::TooLarge(_)) => {
                    Err(DeliveryError::permanent(format!("to {}: {e}", self.primary)))
                }
                Err(e) => Err(DeliveryError::retryable(format!("to {} over the broker: {e}", self.primary))),
            }
        })
    }
}
