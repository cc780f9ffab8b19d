//! Retries for transient provider failures, shared by every backend.
//!
//! Rate limits (429), overload (529, 503) and dropped connections are routine
//! with hosted LLMs, and a daemon that runs scheduled jobs unattended should
//! ride them out rather than fail a turn. Backends stay retry-free; this
//! wrapper decides, using [`ProviderError::is_retryable`]: auth failures,
//! bad requests and a host that cannot be reached at all (refused, no such
//! host: [`ProviderError::Unreachable`]; a retry ladder would only delay the
//! error by 7 s) come back at once and unchanged, transient ones are retried
//! with exponential backoff (1 s, 2 s, 4 s by default), or after the server's
//! `Retry-After` when it gave one. When the retries run out the caller gets
//! [`ProviderError::GaveUp`] with the last error inside. Each retry is logged
//! at `info`; the one warning of a failed call is the caller's (the
//! [`super::chain`]), so a dead provider is one line in the log, not four.

use std::sync::Arc;
use std::time::Duration;

use super::{ChatRequest, ChatResponse, Provider, ProviderError};
use crate::util::BoxFuture;

/// How often and how patiently to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt (so at most `max_retries + 1` calls).
    pub max_retries: u32,
    /// The first backoff; it doubles on each retry.
    pub base_delay: Duration,
    /// No wait is longer than this, whatever the backoff or `Retry-After` says.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    /// 3 retries after 1, 2 and 4 s; never more than 60 s.
    fn default() -> Self {
        RetryPolicy { max_retries: 3, base_delay: Duration::from_secs(1), max_delay: Duration::from_secs(60) }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (0-based) after `err`: the
    /// server's `Retry-After` if it sent one, else `base_delay · 2^retry`;
    /// either capped at `max_delay`.
    pub fn delay(&self, retry: u32, err: &ProviderError) -> Duration {
        if let ProviderError::Http { retry_after: Some(after), .. } = err {
            return (*after).min(self.max_delay);
        }
        let factor = 2u32.checked_pow(retry).unwrap_or(u32::MAX);
        self.base_delay.checked_mul(factor).unwrap_or(self.max_delay).min(self.max_delay)
    }
}

/// A [`Provider`] that retries another one according to a [`RetryPolicy`].
#[derive(Debug)]
pub struct Retrying<P> {
    inner: P,
    policy: RetryPolicy,
}

impl<P: Provider> Retrying<P> {
    /// Wrap `inner`.
    pub fn new(inner: P, policy: RetryPolicy) -> Self {
        Retrying { inner, policy }
    }

    /// The wrapped provider.
    pub fn inner(&self) -> &P {
        &self.inner
    }

    /// The policy in use.
    pub fn policy(&self) -> RetryPolicy {
        self.policy
    }
}

/// Wrap `inner` in retries: the same as [`Retrying::new`].
pub fn with_retries<P: Provider>(inner: P, policy: RetryPolicy) -> Retrying<P> {
    Retrying::new(inner, policy)
}

impl<P: Provider> Provider for Retrying<P> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// Call the inner provider until it succeeds, fails for good, or the
    /// retries are used up. With `max_retries = 0` the error is returned as is.
    fn chat<'a>(&'a self, req: ChatRequest<'a>) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
        Box::pin(call(&self.inner, self.policy, req, Patience::Full))
    }
}

/// How long a call may keep trying before it gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Patience {
    /// Every retry of the policy, every wait the server asks for (up to `max_delay`).
    Full,
    /// Another model is waiting (a fallback chain): at most [`HURRIED_RETRIES`]
    /// retry, none after a timeout (a hung host would cost `timeout` once
    /// more) or when the server asks for more than [`HURRIED_WAIT`].
    Hurried,
}

/// Retries of a hurried call: one, for a blip; a host that is down costs 1 s, not 1 + 2 + 4.
pub const HURRIED_RETRIES: u32 = 1;

/// The longest `Retry-After` waited for when another model is waiting.
pub const HURRIED_WAIT: Duration = Duration::from_secs(10);

/// One call of `inner` with the retries of `policy`.
pub async fn call<P: Provider + ?Sized>(
    inner: &P,
    policy: RetryPolicy,
    req: ChatRequest<'_>,
    patience: Patience,
) -> Result<ChatResponse, ProviderError> {
    let mut retry = 0;
    loop {
        let err = match inner.chat(req).await {
            Ok(resp) => return Ok(resp),
            Err(err) if !err.is_retryable() => return Err(err),
            Err(err) => err,
        };
        let delay = policy.delay(retry, &err);
        let max_retries = match patience {
            Patience::Full => policy.max_retries,
            Patience::Hurried => policy.max_retries.min(HURRIED_RETRIES),
        };
        let hurried = patience == Patience::Hurried
            && (matches!(err, ProviderError::Timeout { .. }) || err.retry_after().is_some_and(|a| a > HURRIED_WAIT));
        if retry >= max_retries || hurried {
            if retry == 0 {
                return Err(err);
            }
            tracing::debug!(provider = inner.name(), attempts = retry + 1, error = %err, "giving up");
            return Err(ProviderError::GaveUp { attempts: retry + 1, last: Box::new(err) });
        }
        let status = match &err {
            ProviderError::Http { status, .. } => Some(*status),
            _ => None,
        };
        // One warning per call, from whoever gives up (the fallback chain): each retry is news only at `info`.
        tracing::info!(
            provider = inner.name(),
            status,
            attempt = retry + 1,
            max_attempts = max_retries + 1,
            delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            error = %err,
            "provider call failed, retrying"
        );
        tokio::time::sleep(delay).await;
        retry += 1;
    }
}

/// A shared provider is a provider, so `Retrying<Arc<dyn Provider>>` works.
impl<P: Provider + ?Sized> Provider for Arc<P> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn chat<'a>(&'a self, req: ChatRequest<'a>) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
        (**self).chat(req)
    }
    fn label(&self, model: &str) -> String {
        (**self).label(model)
    }
    fn health(&self) -> Vec<String> {
        (**self).health()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    use super::*;
    use crate::provider::Message;

    /// Answers from a script, counting calls; fails loudly when the script runs out.
    struct Scripted {
        script: Mutex<VecDeque<Result<ChatResponse, ProviderError>>>,
        calls: AtomicUsize,
    }

    impl Scripted {
        fn new(script: Vec<Result<ChatResponse, ProviderError>>) -> Self {
            Scripted { script: Mutex::new(script.into()), calls: AtomicUsize::new(0) }
        }
        fn calls(&self) -> usize {
            self.calls.load(Ordering::SeqCst)
        }
    }

    impl Provider for Scripted {
        fn name(&self) -> &str {
            "scripted"
        }
        fn chat<'a>(&'a self, _req: ChatRequest<'a>) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let next = self.script.lock().unwrap().pop_front();
            Box::pin(async move { next.unwrap_or_else(|| Err(ProviderError::Decode("script exhausted".into()))) })
        }
    }

    fn http(status: u16, retry_after: Option<u64>) -> Result<ChatResponse, ProviderError> {
        Err(ProviderError::Http { status, message: "boom".into(), retry_after: retry_after.map(Duration::from_secs) })
    }

    fn ok(text: &str) -> Result<ChatResponse, ProviderError> {
        Ok(ChatResponse { content: Some(text.into()), ..Default::default() })
    }

    async fn call(p: &impl Provider) -> Result<ChatResponse, ProviderError> {
        let msgs = [Message::user("hi")];
        p.chat(ChatRequest {
            model: "m",
            messages: &msgs,
            tools: &[],
            max_tokens: 10,
            temperature: None,
            tool_choice: None,
            scheduled: false,
        })
        .await
    }

    #[test]
    fn default_schedule_is_1_2_4_capped_at_60() {
        let p = RetryPolicy::default();
        let e = ProviderError::Transport { url: "u".into(), message: "m".into() };
        let delays: Vec<u64> = (0..8).map(|i| p.delay(i, &e).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(p.delay(200, &e), Duration::from_secs(60));
        let after = http(429, Some(5)).unwrap_err();
        assert_eq!(p.delay(0, &after), Duration::from_secs(5));
        let after = http(429, Some(3600)).unwrap_err();
        assert_eq!(p.delay(0, &after), Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn retries_with_backoff_then_succeeds() {
        let p = Retrying::new(
            Scripted::new(vec![
                http(500, None),
                Err(ProviderError::Transport { url: "u".into(), message: "reset".into() }),
                http(529, None),
                ok("finally"),
            ]),
            RetryPolicy::default(),
        );
        let start = tokio::time::Instant::now();
        let r = call(&p).await.unwrap();
        assert_eq!(r.content.as_deref(), Some("finally"));
        assert_eq!(p.inner().calls(), 4);
        assert_eq!(start.elapsed(), Duration::from_secs(1 + 2 + 4));
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_after_max_retries() {
        let p = Retrying::new(Scripted::new((0..10).map(|_| http(503, None)).collect()), RetryPolicy::default());
        let start = tokio::time::Instant::now();
        let err = call(&p).await.unwrap_err();
        assert_eq!(p.inner().calls(), 4);
        assert_eq!(start.elapsed(), Duration::from_secs(7));
        match err {
            ProviderError::GaveUp { attempts: 4, last } => {
                assert!(matches!(*last, ProviderError::Http { status: 503, .. }))
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn honours_retry_after() {
        let p = Retrying::new(Scripted::new(vec![http(429, Some(30)), ok("x")]), RetryPolicy::default());
        let start = tokio::time::Instant::now();
        call(&p).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(30));
        assert_eq!(p.inner().calls(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn permanent_errors_return_at_once_unchanged() {
        for err in [
            http(400, None),
            Err(ProviderError::Auth { status: 401, message: "bad key".into() }),
            Err(ProviderError::Decode("x".into())),
            Err(ProviderError::Unreachable { url: "u".into(), message: "Connection refused".into() }),
        ] {
            let p = Retrying::new(Scripted::new(vec![err, ok("never")]), RetryPolicy::default());
            let start = tokio::time::Instant::now();
            let got = call(&p).await.unwrap_err();
            assert_eq!(p.inner().calls(), 1);
            assert_eq!(start.elapsed(), Duration::ZERO);
            assert!(!matches!(got, ProviderError::GaveUp { .. }), "{got:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn zero_retries_returns_the_error_itself() {
        let policy = RetryPolicy { max_retries: 0, ..Default::default() };
        let p = Retrying::new(Arc::new(Scripted::new(vec![http(500, None)])) as Arc<dyn Provider>, policy);
        assert!(matches!(call(&p).await, Err(ProviderError::Http { status: 500, .. })));
        assert_eq!(p.name(), "scripted");
    }
}
