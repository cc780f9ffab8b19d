//! A backend's two HTTP clients: one for calls someone waits on, limited by
//! `[provider] timeout`, and one for scheduled work (jobs, the heartbeat,
//! sub-agents), limited by `[provider] job_timeout`.
//!
//! A small model on a CPU takes minutes for a prompt with a dozen tool
//! schemas (gemma3:4b: p95 4 m 38 s per task, gemmaclaw #325). A chat user
//! wants an error after two minutes rather than silence; a 07:00 briefing
//! nobody watches should rather wait for the answer than fail at 120 s and
//! be retried from scratch. The limit is the client's (`reqwest`'s total
//! timeout, connect to the last byte), so each limit has its client; they
//! share nothing but their settings, and a LAN model over plain http never
//! loads the CA store for either.

use crate::config::{Dur, ProviderConfig};

use super::ProviderError;

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Clients {
    waited: reqwest::Client,
    scheduled: reqwest::Client,
    timeout: Dur,
    job_timeout: Dur,
}

impl Clients {
    /// The clients `cfg`'s `timeout` and `job_timeout` describe.
    pub(crate) fn new(cfg: &ProviderConfig) -> Result<Clients, ProviderError> {
        Ok(Clients {
            waited: super::http_client(cfg.timeout.get())?,
            scheduled: super::http_client(cfg.job_timeout.get())?,
            timeout: cfg.timeout,
            job_timeout: cfg.job_timeout,
        })
    }

    /// The client for a call someone waits on, or (`scheduled`) one nobody does.
    pub(crate) fn get(&self, scheduled: bool) -> &reqwest::Client {
        if scheduled {
            &self.scheduled
        } else {
            &self.waited
        }
    }

    /// `e`, a timeout naming the setting that set its limit.
    pub(crate) fn explain(&self, e: ProviderError, scheduled: bool) -> ProviderError {
        match e {
            ProviderError::Timeout { url, message } => {
                let (key, limit) =
                    if scheduled { ("job_timeout", self.job_timeout) } else { ("timeout", self.timeout) };
                ProviderError::Timeout { url, message: format!("{message} (the limit is [provider] {key} = {limit})") }
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_names_its_setting() {
        let cfg = ProviderConfig { timeout: Dur::secs(5), job_timeout: Dur::secs(600), ..Default::default() };
        let c = Clients::new(&cfg).unwrap();
        let e = || ProviderError::Timeout { url: "http://lan".into(), message: "operation timed out".into() };
        let chat = c.explain(e(), false).to_string();
        assert!(chat.ends_with("operation timed out (the limit is [provider] timeout = 5s)"), "{chat}");
        let job = c.explain(e(), true).to_string();
        assert!(job.ends_with("(the limit is [provider] job_timeout = 10m)"), "{job}");
        let other = c.explain(ProviderError::Decode("x".into()), true).to_string();
        assert_eq!(other, "the provider's answer could not be read: x");
    }
}
