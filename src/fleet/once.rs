//! "Once across the fleet" (`cron add --on any`, docs/fleet.md): every board
//! that holds the job plans it, and at each due slot asks NATS JetStream's
//! key-value store to `create` the key `job.<id>.<slot>` (a put-if-absent;
//! the slot is the occurrence's *scheduled* time, the same on every board).
//! The one board whose `create` succeeds runs it, with the key's revision as
//! its fencing token; the others record the slot as run elsewhere.
//!
//! Why an existing engine and not our own agreement between boards: a
//! put-if-absent on a replicated, persisted store is the whole of what is
//! needed, and NATS's is tested far beyond what a home fleet could test of a
//! protocol of ours.
//!
//! A board that cannot reach NATS does not run the slot (never silently
//! twice) and raises one alert for the outage, closed when NATS answers
//! again. A board that dies mid-run is the scheduler's crash mid-run: the
//! slot is marked started before it runs, so it is not run again, and the
//! key in NATS keeps the other boards off it.

use std::time::Duration;

use jiff::Timestamp;

use crate::clients::nats::{Bucket, Conn, Created, NatsError, Settings};
use crate::config::fleet::{BoardName, FleetConfig, FleetConfigError};
use crate::scheduler::{Job, RunOutcome};
use crate::work::alerts::Alerts;
use crate::work::jobs::OnceGate;

/// How long one claim may take (connect, and each request).
pub const CLAIM_TIMEOUT: Duration = Duration::from_secs(10);
/// In a board's presence: it has `[fleet] nats_url`, so it takes jobs for any board.
pub const CAPABILITY: &str = "nats";
/// The alert condition of an unreachable NATS (one per outage).
pub const ALERT_KEY: &str = "fleet:nats";

/// The slot's key in the bucket.
pub fn slot_key(job_id: &str, scheduled: Timestamp) -> String {
    format!("job.{job_id}.{}", scheduled.as_second())
}

/// This board's gate for jobs placed on `any` board.
pub struct Once {
    me: BoardName,
    settings: Settings,
    bucket: Bucket,
    alerts: Alerts,
}

impl Once {
    /// The gate for `[fleet]` (`Ok(None)`: no fleet or no `nats_url`).
    pub fn new(c: &FleetConfig, alerts: Alerts) -> Result<Option<Once>, FleetConfigError> {
        let (Some(me), Some(url)) = (c.board(), c.nats_url.as_deref()) else { return Ok(None) };
        c.check_nats()?;
        let mut settings =
            Settings::from_url(url, CLAIM_TIMEOUT).map_err(|_| FleetConfigError::NatsUrl(url.to_string()))?;
        settings.user = c.nats_user.clone();
        settings.password = c.nats_password()?;
        let bucket = Bucket { name: c.nats_bucket.clone(), max_age: c.nats_max_age.get() };
        Ok(Some(Once { me: me.clone(), settings, bucket, alerts }))
    }

    /// One claim on its own short connection (no idle connection is kept).
    pub async fn try_claim(&self, key: &str, value: &[u8]) -> Result<Created, NatsError> {
        let mut conn = Conn::connect(&self.settings).await?;
        let created = self.bucket.create(&mut conn, key, value).await;
        conn.close().await;
        created
    }

    async fn decide(&self, job: &Job, scheduled: Timestamp) -> Result<u64, RunOutcome> {
        let key = slot_key(&job.id, scheduled);
        let value = serde_json::json!({ "board": self.me, "job": job.name, "slot": scheduled.to_string() });
        match self.try_claim(&key, value.to_string().as_bytes()).await {
            Ok(Created::Won(fence)) => {
                self.reachable().await;
                tracing::info!(job = %job.name, %scheduled, fence, "fleet: this board won the slot: running it");
                Ok(fence)
            }
            Ok(Created::Taken) => {
                self.reachable().await;
                tracing::debug!(job = %job.name, %scheduled, "fleet: another board has the slot");
                Err(RunOutcome::skipped(format!(
                    "slot {scheduled} already claimed in NATS: run by another board (or by this one before a restart)"
                )))
            }
            Err(e) => {
                tracing::warn!(job = %job.name, %scheduled, "fleet: not run: cannot claim the slot in NATS: {e}");
                let text = format!(
                    "Alert: {} cannot reach NATS to claim the slots of jobs for any board, so it runs none of \
                     them (another board may): {e}. Is nats-server running, with JetStream (-js), and reachable from here?",
                    self.me
                );
                self.alerts.raise(ALERT_KEY, text).await;
                Err(RunOutcome::error(format!("not run: cannot claim the slot in NATS: {e}")))
            }
        }
    }

    async fn reachable(&self) {
        let me = self.me.clone();
        self.alerts
            .clear(ALERT_KEY, move |_| {
                format!("Recovered: {me} reaches NATS again and claims slots of jobs for any board.")
            })
            .await;
    }
}

impl OnceGate for Once {
    fn claim<'a>(&'a self, job: &'a Job, scheduled: Timestamp) -> crate::util::BoxFuture<'a, Result<u64, RunOutcome>> {
        Box::pin(self.decide(job, scheduled))
    }
}
