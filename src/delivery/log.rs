//! The `log` channel: a report written to the daemon's log (journald under
//! systemd). Always available, so a report has somewhere to go even on a board
//! with no Telegram or MQTT configured.

use super::{Channel, DeliveryError, Report};
use crate::util::BoxFuture;

pub struct LogChannel;

impl Channel for LogChannel {
    fn name(&self) -> &'static str {
        "log"
    }

    fn deliver<'a>(&'a self, report: Report<'a>) -> BoxFuture<'a, Result<(), DeliveryError>> {
        Box::pin(async move {
            tracing::info!(
                channel = "log",
                source = report.source.to_string(),
                "report: {}",
                report.text_naming_files()
            );
            Ok(())
        })
    }
}
