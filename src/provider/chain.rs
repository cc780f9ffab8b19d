//! Fallback chains: one model asked for, others tried in order when it fails.
//!
//! On a Pi the model lives elsewhere — a cloud API that rate-limits or goes
//! down, a LAN Ollama box that sleeps at night — and a scheduled 07:00
//! briefing should not be lost to either. [`Chain`] is the [`Provider`] the
//! agent talks to. A request's model is resolved to a provider and a model
//! (`lan/qwen2.5:3b`, a provider's name alone, or a plain model name of the
//! first provider), then `[agent] fallback` follows. Each candidate gets its
//! provider's retries ([`super::retry`]); what makes the chain move on is
//! [`ProviderError::falls_back`]. While another model waits, a call is
//! *hurried*: a timeout is not retried and a long `Retry-After` not waited.
//!
//! A provider that failed is skipped for `[agent] fallback_cooldown` (or
//! its `Retry-After`, if longer), so a dead host does not cost every turn its
//! timeout; it is tried again after the cooldown, and — last, rather than not
//! at all — when every other candidate has failed too. A provider over its
//! `daily_token_budget` (counted by a [`Meter`], the agent's usage ledger) is
//! never tried. The answer carries a [`Route`]: who answered, and why the
//! model asked for did not.
//!
//! A single provider without fallbacks behaves as before: its error comes
//! back unchanged.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::retry::{self, Patience, RetryPolicy};
use super::{ChatRequest, ChatResponse, Provider, ProviderError, ProviderSlot, Route, Unconfigured};
use crate::config::{Config, ProviderConfig};
use crate::util::BoxFuture;

/// Tokens a provider has used today, for per-provider budgets.
pub trait Meter: Send + Sync {
    fn used_today(&self, provider: &str) -> u64;
}

/// One configured provider.
pub struct Backend {
    /// `[provider] name`, else its kind.
    pub name: String,
    /// Whether `name/model` refers to it (only explicitly named providers).
    pub named: bool,
    /// Its model when only its name is given.
    pub default_model: String,
    /// The client, or why there is none (no key): then it fails with
    /// [`ProviderError::NotConfigured`] and the chain moves on.
    pub client: ProviderSlot,
    pub policy: RetryPolicy,
    /// Tokens per day; 0: unlimited.
    pub budget: u64,
}

impl Backend {
    /// The backend `cfg` describes (its client not retried: the chain does that).
    pub fn from_config(cfg: &ProviderConfig) -> Backend {
        Backend {
            name: cfg.name().to_string(),
            named: cfg.is_named(),
            default_model: cfg.default_model().to_string(),
            client: ProviderSlot::of(super::client(cfg).map_err(|e| match e {
                ProviderError::NotConfigured(why) => Unconfigured::new(why),
                other => Unconfigured::new(other.to_string()),
            })),
            policy: RetryPolicy { max_retries: cfg.max_retries, ..Default::default() },
            budget: cfg.daily_token_budget,
        }
    }
}

/// A model on a provider: an index into the chain's backends.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Candidate {
    backend: usize,
    model: String,
}

/// Why a provider is being skipped for now.
#[derive(Debug, Clone)]
struct Cooling {
    until: Instant,
    reason: String,
}

/// The providers, the fallback list and what the chain has learnt about them.
pub struct Chain {
    backends: Vec<Backend>,
    fallback: Vec<Candidate>,
    cooldown: Duration,
    cooling: Mutex<HashMap<usize, Cooling>>,
    meter: Option<Arc<dyn Meter>>,
}

impl Chain {
    /// A chain of `backends` (the first is the default) with `fallback`
    /// entries as `[agent] fallback` writes them (`provider/model` or `provider`).
    pub fn new(backends: Vec<Backend>, fallback: &[String], cooldown: Duration) -> Chain {
        let mut chain =
            Chain { backends, fallback: Vec::new(), cooldown, cooling: Mutex::new(HashMap::new()), meter: None };
        // The config check has made sure each names a provider; one that does not is skipped.
        chain.fallback = fallback.iter().filter_map(|f| chain.named(f)).collect();
        chain
    }

    /// The chain `[provider]`/`[[provider]]` and `[agent] fallback` describe.
    /// `Err` when no provider can be used at all (the one there is has no key).
    pub fn from_config(c: &Config) -> Result<Chain, Unconfigured> {
        let backends: Vec<Backend> = c.providers.iter().map(Backend::from_config).collect();
        if let [only] = backends.as_slice() {
            if let Some(why) = only.client.problem() {
                return Err(why.clone());
            }
        }
        let fallback: Vec<String> = c.agent.fallback.iter().map(|f| f.get_ref().trim().to_string()).collect();
        Ok(Chain::new(backends, &fallback, c.agent.fallback_cooldown.get()))
    }

    /// Count per-provider budgets with `meter`.
    pub fn with_meter(mut self, meter: Arc<dyn Meter>) -> Chain {
        self.meter = Some(meter);
        self
    }

    /// `provider/model` or `provider` with an explicitly named provider.
    fn named(&self, text: &str) -> Option<Candidate> {
        named_in(self.backends.iter().map(|b| (b.name.as_str(), b.named, b.default_model.as_str())), text)
    }

    /// The model a request names: a named provider's (`lan/qwen2.5:3b`,
    /// `lan`), else a model of the first provider — so OpenRouter's
    /// `openai/gpt-4o` on an unnamed provider stays one model name.
    fn resolve(&self, model: &str) -> Candidate {
        let model = model.trim();
        self.named(model).unwrap_or_else(|| Candidate { backend: 0, model: model.to_string() })
    }

    /// `provider/model` for a model as a request would name it, from the
    /// config alone (no client is built): for `bramble status`.
    pub fn label_in(c: &Config, model: &str) -> String {
        let model = model.trim();
        let providers = || c.providers.iter().map(|p| (p.name(), p.is_named(), p.default_model()));
        match named_in(providers(), model) {
            Some(found) => format!("{}/{}", c.providers[found.backend].name(), found.model),
            None => format!("{}/{model}", c.provider().name()),
        }
    }

    /// The requested model, then the fallbacks, each once.
    fn candidates(&self, model: &str) -> Vec<Candidate> {
        let mut out = vec![self.resolve(model)];
        for f in &self.fallback {
            if !out.contains(f) {
                out.push(f.clone());
            }
        }
        out
    }

    fn label_of(&self, c: &Candidate) -> String {
        format!("{}/{}", self.backends[c.backend].name, c.model)
    }

    fn cooling(&self) -> std::sync::MutexGuard<'_, HashMap<usize, Cooling>> {
        self.cooling.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Why `backend` is skipped for now, if it is.
    fn cooling_reason(&self, backend: usize, now: Instant) -> Option<String> {
        let cooling = self.cooling();
        cooling.get(&backend).filter(|c| c.until > now).map(|c| c.reason.clone())
    }

    /// `(used, budget)` when `backend` has used up its daily budget.
    fn over_budget(&self, backend: usize) -> Option<(u64, u64)> {
        let b = &self.backends[backend];
        let meter = self.meter.as_ref().filter(|_| b.budget > 0)?;
        let used = meter.used_today(&b.name);
        (used >= b.budget).then_some((used, b.budget))
    }

    async fn run(&self, req: ChatRequest<'_>) -> Result<ChatResponse, ProviderError> {
        let candidates = self.candidates(req.model);
        let single = candidates.len() == 1;
        let now = Instant::now();
        // Why each candidate did not answer, in the order asked.
        let mut failures: Vec<(usize, String)> = Vec::new();
        // Usable now first, cooling ones after them: tried last rather than not at all.
        let mut fresh = Vec::new();
        let mut cooling = Vec::new();
        for (i, c) in candidates.iter().enumerate() {
            if let Some((used, budget)) = self.over_budget(c.backend) {
                failures.push((i, format!("today's budget of this provider is used up ({used} of {budget} tokens)")));
            } else if let Some(reason) = self.cooling_reason(c.backend, now) {
                cooling.push((i, reason));
            } else {
                fresh.push(i);
            }
        }
        for (i, reason) in &cooling {
            tracing::debug!(model = %self.label_of(&candidates[*i]), "skipped while cooling down: {reason}");
        }
        let order: Vec<usize> = fresh.iter().copied().chain(cooling.iter().map(|(i, _)| *i)).collect();
        if order.is_empty() {
            return Err(self.exhausted(&candidates, failures, false));
        }
        let mut unreachable = false;
        for (k, &i) in order.iter().enumerate() {
            let c = &candidates[i];
            let backend = &self.backends[c.backend];
            let last = k + 1 == order.len();
            let patience = if last { Patience::Full } else { Patience::Hurried };
            let result = match backend.client.get() {
                Ok(client) => {
                    let req = ChatRequest { model: &c.model, ..req };
                    retry::call(client.as_ref(), backend.policy, req, patience).await
                }
                Err(e) => Err(e),
            };
            match result {
                Ok(mut resp) => {
                    self.cooling().remove(&c.backend);
                    let fallback = (i != 0).then(|| self.why_not_first(&candidates, &failures, &cooling));
                    if let Some(why) = &fallback {
                        tracing::info!(model = %self.label_of(c), asked = %self.label_of(&candidates[0]), "a fallback answered: {why}");
                    }
                    resp.route = Some(Route { provider: backend.name.clone(), model: c.model.clone(), fallback });
                    return Ok(resp);
                }
                Err(e) if single || !e.falls_back() => {
                    if e.falls_back() {
                        // The call's one warning (its retries were `info`): the provider failed, not our request.
                        tracing::warn!(model = %self.label_of(c), error = %e, "model failed");
                    }
                    return Err(e);
                }
                Err(e) => {
                    let wait = self.cooldown.max(e.retry_after().unwrap_or_default());
                    let reason = short(&e);
                    unreachable |= matches!(e, ProviderError::Unreachable { .. });
                    let mut all = self.cooling();
                    all.insert(c.backend, Cooling { until: Instant::now() + wait, reason: reason.clone() });
                    drop(all);
                    match order.get(k + 1).map(|&n| self.label_of(&candidates[n])) {
                        Some(next) => tracing::warn!(
                            model = %self.label_of(c), %next, cooldown_s = wait.as_secs(), error = %e,
                            "model failed, trying the next one"
                        ),
                        None => tracing::warn!(
                            model = %self.label_of(c), cooldown_s = wait.as_secs(), error = %e,
                            "model failed, and it was the last one"
                        ),
                    }
                    failures.push((i, reason));
                }
            }
        }
        Err(self.exhausted(&candidates, failures, unreachable))
    }

    /// Why the model asked for did not answer.
    fn why_not_first(
        &self,
        candidates: &[Candidate],
        failures: &[(usize, String)],
        cooling: &[(usize, String)],
    ) -> String {
        let label = self.label_of(&candidates[0]);
        if let Some((_, why)) = failures.iter().find(|(i, _)| *i == 0) {
            return format!("{label}: {why}");
        }
        match cooling.iter().find(|(i, _)| *i == 0) {
            Some((_, why)) => format!("{label} is cooling down after: {why}"),
            None => format!("{label} did not answer"),
        }
    }

    /// Every candidate failed: why, each; when one could not be reached, the
    /// last reason ends with where to look (`bramble doctor`).
    fn exhausted(
        &self,
        candidates: &[Candidate],
        mut failures: Vec<(usize, String)>,
        unreachable: bool,
    ) -> ProviderError {
        failures.sort_by_key(|(i, _)| *i);
        let mut reasons: Vec<String> =
            failures.into_iter().map(|(i, why)| format!("{}: {why}", self.label_of(&candidates[i]))).collect();
        if let Some(last) = reasons.last_mut().filter(|_| unreachable) {
            last.push_str(". Are the servers running and their `base_url` right? `bramble doctor` checks each");
        }
        ProviderError::Exhausted(reasons)
    }
}

/// The candidate `text` names among `(name, named, default model)` providers, if it names one.
fn named_in<'a>(providers: impl Iterator<Item = (&'a str, bool, &'a str)>, text: &str) -> Option<Candidate> {
    let (name, model) = match text.split_once('/') {
        Some((name, model)) => (name, Some(model.trim()).filter(|m| !m.is_empty())),
        None => (text, None),
    };
    let (backend, (_, _, default_model)) = providers.enumerate().find(|(_, (n, named, _))| *named && *n == name)?;
    Some(Candidate { backend, model: model.unwrap_or(default_model).to_string() })
}

/// An error as a short reason: the last of a retried one, with the attempts.
fn short(e: &ProviderError) -> String {
    match e {
        // Without the `doctor` hint: [`Chain::exhausted`] gives it once, at the end.
        ProviderError::Unreachable { url, message } => format!("could not reach the provider at {url}: {message}"),
        ProviderError::GaveUp { attempts, last } => format!("{last} (after {attempts} attempts)"),
        other => other.to_string(),
    }
}

impl Provider for Chain {
    fn name(&self) -> &str {
        self.backends.first().map_or("none", |b| b.name.as_str())
    }

    fn chat<'a>(&'a self, req: ChatRequest<'a>) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
        Box::pin(self.run(req))
    }

    fn label(&self, model: &str) -> String {
        let c = self.resolve(model);
        if self.backends.len() == 1 && self.fallback.is_empty() {
            return c.model;
        }
        self.label_of(&c)
    }

    fn health(&self) -> Vec<String> {
        if self.backends.len() == 1 && self.fallback.is_empty() {
            return Vec::new();
        }
        let now = Instant::now();
        let cooling = self.cooling().clone();
        let mut lines: Vec<String> = self
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let used = self.meter.as_ref().map(|m| m.used_today(&b.name));
                let mut line = format!("{}: ", b.name);
                if let Some(why) = b.client.problem() {
                    line.push_str(&format!("not usable: {why}"));
                } else if let Some((used, budget)) = self.over_budget(i) {
                    line.push_str(&format!("budget used up today ({used} of {budget} tokens)"));
                } else if let Some(c) = cooling.get(&i).filter(|c| c.until > now) {
                    let left = c.until.saturating_duration_since(now).as_secs().max(1);
                    line.push_str(&format!("cooling down for {}, after: {}", human(left), c.reason));
                } else {
                    line.push_str("ok");
                }
                if let Some(used) = used.filter(|u| *u > 0) {
                    line.push_str(&format!(" · {used} tokens today"));
                    if b.budget > 0 {
                        line.push_str(&format!(" of {}", b.budget));
                    }
                }
                line
            })
            .collect();
        if !self.fallback.is_empty() {
            let chain: Vec<String> = self.fallback.iter().map(|c| self.label_of(c)).collect();
            lines.push(format!("fallback: {}", chain.join(" → ")));
        }
        lines
    }
}

/// `90` → `1m30s`, `3600` → `1h0m`.
fn human(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{}s", s / 60, s % 60),
        s => format!("{}h{}m", s / 3600, (s % 3600) / 60),
    }
}
