//! On a node: reports for the chats the primary owns (`telegram:…`,
//! `matrix:…`, `email:…`) go to the primary as signed `report` messages on
//! `bramble/<node>/fleet/up`, QoS 1. The node's outbox keeps a report until
//! the primary itself said it has it (a signed `ack` on the node's command
//! topic, not only the broker's PUBACK: a broker that restarted without its
//! sessions would otherwise drop it for a primary not yet subscribed again),
//! so a report made while the broker or the primary is down goes out when
//! both are back. Its idempotency key, `<job>@<slot>` (the report's queue
//! time and outbox id, the same on every retry and across restarts), lets
//! the primary drop the copy a retry after a lost acknowledgement sends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::auth::Signer;
use super::{topics, wire};
use crate::channels::mqtt::{Link, PublishError, ACK_TIMEOUT};
use crate::config::fleet::BoardName;
use crate::delivery::{Channel, DeliveryError, Report};
use crate::util::BoxFuture;

/// How long a node waits for the primary's ack of a report.
const ACK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The chat channels a node relays when it has none of its own.
pub const RELAYED: [&str; 3] = ["telegram", "matrix", "email"];

pub struct Relay {
    pub name: &'static str,
    pub me: BoardName,
    pub primary: BoardName,
    pub link: Arc<Link>,
    pub signer: Signer,
    pub acks: Acks,
}

/// The reports waiting for the primary's `ack`, by key: shared by the relays
/// (which wait) and the fleet's task (which hears the acks).
#[derive(Clone, Default)]
pub struct Acks {
    waiting: Arc<Mutex<HashMap<String, oneshot::Sender<()>>>>,
    /// Told when the primary's status says `online` again.
    pub back: Arc<tokio::sync::Notify>,
}

impl Acks {
    fn wait(&self, key: &str) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().unwrap_or_else(|p| p.into_inner()).insert(key.to_string(), tx);
        rx
    }

    fn forget(&self, key: &str) {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
    }

    /// The primary's ack for `key` (an ack for no waiting report: ignored).
    pub fn acked(&self, key: &str) -> bool {
        let tx = self.waiting.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
        tx.is_some_and(|tx| tx.send(()).is_ok())
    }
}

/// A report's idempotency key: `<source>@<slot>`.
pub fn key(report: &Report<'_>) -> String {
    format!("{}@{}.{}", report.source, report.created.as_millisecond(), report.id)
}

impl Relay {
    /// Publish the report and wait for the primary's ack; published again
    /// (same key) when the primary comes back meanwhile, at most three times.
    async fn send_until_acked(
        &self,
        topic: &str,
        key: &str,
        body: String,
        acked: &mut oneshot::Receiver<()>,
    ) -> Result<(), DeliveryError> {
        for _ in 0..3 {
            let back = self.acks.back.notified();
            tokio::pin!(back);
            back.as_mut().enable();
            let e = self.signer.seal(topic, &self.me, &self.primary, wire::REPORT, key, body.clone());
            let bytes = serde_json::to_vec(&e).map_err(|e| DeliveryError::permanent(e.to_string()))?;
            match self.link.publish_acked(topic, bytes, false, ACK_TIMEOUT).await {
                Ok(()) => {}
                Err(e @ PublishError::TooLarge(_)) => {
                    return Err(DeliveryError::permanent(format!("to {}: {e}", self.primary)))
                }
                Err(e) => return Err(DeliveryError::retryable(format!("to {} over the broker: {e}", self.primary))),
            }
            tokio::select! {
                r = &mut *acked => {
                    return match r {
                        Ok(()) => {
                            tracing::info!(key, "fleet: {} has the report", self.primary);
                            Ok(())
                        }
                        Err(_) => Err(DeliveryError::retryable("the fleet stopped")),
                    };
                }
                () = &mut back => tracing::info!(key, "fleet: {} is back: sending the report again", self.primary),
                () = tokio::time::sleep(ACK_WAIT) => break,
            }
        }
        Err(DeliveryError::retryable(format!(
            "{} did not confirm it within {} s (offline?)",
            self.primary,
            ACK_WAIT.as_secs()
        )))
    }
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
            let key = key(&report);
            let mut acked = self.acks.wait(&key);
            let sent = self.send_until_acked(&topic, &key, body, &mut acked).await;
            self.acks.forget(&key);
            sent
        })
    }
}
