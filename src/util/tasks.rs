//! Tasks: the daemon's long-running [`Service`]s under a [`Supervisor`];
//! taking work from a bounded queue with a bounded number of tasks at once
//! ([`run_bounded`]: the pattern the agent's bus server and the trigger
//! runners share, as mini-redis's listener does with its connection
//! semaphore); and [`blocking`], the way durable writes leave the runtime thread.
//!
//! Only the composition root (`src/daemon/`) and this module spawn
//! long-running tasks (`src/layers.rs` checks it): a loop elsewhere is a
//! struct with `async fn run(self, shutdown: Shutdown)`, and the daemon hands
//! it to the supervisor as a named [`Service`] with a [`Policy`] that says
//! what happens when it ends while the daemon is not stopping.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::shutdown::Shutdown;
use super::BoxFuture;

/// What happens when a [`Service`] ends while the daemon is not stopping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Logged at error, and made again after a backoff (1 s, doubling up to
    /// [`RESTART_MAX`]; back to 1 s once a run lasted [`RESTART_RESET`]).
    Restart,
    /// Logged at error, and the daemon stops with an error (a non-zero exit
    /// status: systemd's `Restart=` starts it again, fresh).
    Exit,
    /// Ending is what it does (a one-shot task, or an end it has logged and
    /// explained itself): logged at debug, not replaced. A panic is a fault
    /// all the same and stops the daemon as [`Policy::Exit`] does.
    Ends,
}

/// The longest wait before a [`Policy::Restart`] service is made again.
pub const RESTART_MAX: Duration = Duration::from_secs(300);
/// A run at least this long puts the restart backoff back to its start.
pub const RESTART_RESET: Duration = Duration::from_secs(60);

type Make = Box<dyn FnMut(Shutdown) -> BoxFuture<'static, ()> + Send>;

/// A named long-running task: what to run, and its [`Policy`].
pub struct Service {
    name: &'static str,
    policy: Policy,
    make: Make,
}

impl Service {
    /// A service that runs once; ending before the stop stops the daemon ([`Policy::Exit`]).
    pub fn new<F, Fut>(name: &'static str, run: F) -> Service
    where
        F: FnOnce(Shutdown) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        Service::once(name, Policy::Exit, run)
    }

    /// A service whose end is normal ([`Policy::Ends`]): a one-shot task.
    pub fn ends<F, Fut>(name: &'static str, run: F) -> Service
    where
        F: FnOnce(Shutdown) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        Service::once(name, Policy::Ends, run)
    }

    /// A service made again by `make` whenever it ends before the stop ([`Policy::Restart`]).
    pub fn restarting<F, Fut>(name: &'static str, mut make: F) -> Service
    where
        F: FnMut(Shutdown) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        Service { name, policy: Policy::Restart, make: Box::new(move |shutdown| Box::pin(make(shutdown))) }
    }

    fn once<F, Fut>(name: &'static str, policy: Policy, run: F) -> Service
    where
        F: FnOnce(Shutdown) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut run = Some(run);
        let make = move |shutdown| -> BoxFuture<'static, ()> {
            match run.take() {
                Some(run) => Box::pin(run(shutdown)),
                // Never asked for: a run-once service is not made again.
                None => Box::pin(async {}),
            }
        };
        Service { name, policy, make: Box::new(make) }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }
}

/// A service ended while the daemon was not stopping, and its policy stops the daemon.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the `{name}` task ended unexpectedly{}; the daemon stops so that it is started again (under systemd, \
     `Restart=on-failure` does that; see `journalctl -u bramble` for what came before)",
    if *panicked { " (it panicked)" } else { "" }
)]
pub struct ServiceFailed {
    pub name: &'static str,
    pub panicked: bool,
}

/// One supervised service and its restart state.
struct Supervised {
    service: Service,
    backoff: super::timer::Backoff,
    started: tokio::time::Instant,
}

/// The daemon's long-running tasks, each a named [`Service`], all stopped by one [`Shutdown`].
pub struct Supervisor {
    shutdown: Shutdown,
    running: JoinSet<()>,
    /// Which service each running task is.
    tasks: HashMap<tokio::task::Id, usize>,
    services: Vec<Supervised>,
}

impl Supervisor {
    pub fn new(shutdown: Shutdown) -> Supervisor {
        Supervisor { shutdown, running: JoinSet::new(), tasks: HashMap::new(), services: Vec::new() }
    }

    /// Start `service` now.
    pub fn spawn(&mut self, service: Service) {
        let backoff = super::timer::Backoff::new(RESTART_MAX);
        self.services.push(Supervised { service, backoff, started: tokio::time::Instant::now() });
        self.start(self.services.len() - 1, Duration::ZERO);
    }

    /// The names of the services, in the order they were started.
    pub fn names(&self) -> Vec<&'static str> {
        self.services.iter().map(|s| s.service.name).collect()
    }

    fn start(&mut self, i: usize, after: Duration) {
        let entry = &mut self.services[i];
        let run = (entry.service.make)(self.shutdown.clone());
        entry.started = tokio::time::Instant::now() + after;
        let shutdown = self.shutdown.clone();
        let handle = self.running.spawn(async move {
            if !after.is_zero() {
                tokio::select! {
                    () = super::timer::sleep(after) => {}
                    () = shutdown.stopped() => return,
                }
            }
            run.await
        });
        self.tasks.insert(handle.id(), i);
    }

    /// Look after the services until one whose policy is [`Policy::Exit`]
    /// ends while the daemon is not stopping; restart the [`Policy::Restart`]
    /// ones meanwhile. Once the stop has begun, ends are expected and this
    /// waits for ever (the caller is waiting for its signal instead).
    pub async fn watch(&mut self) -> ServiceFailed {
        loop {
            let joined = match self.running.join_next_with_id().await {
                Some(joined) => joined,
                None => std::future::pending().await,
            };
            let (id, panicked) = match joined {
                Ok((id, ())) => (id, false),
                Err(e) => (e.id(), e.is_panic()),
            };
            let Some(i) = self.tasks.remove(&id) else { continue };
            if self.shutdown.is_stopping() {
                continue;
            }
            let (name, policy) = (self.services[i].service.name, self.services[i].service.policy);
            match policy {
                Policy::Ends if !panicked => tracing::debug!(task = name, "task finished"),
                Policy::Restart => {
                    let entry = &mut self.services[i];
                    if entry.started.elapsed() >= RESTART_RESET {
                        entry.backoff.reset();
                    }
                    let wait = entry.backoff.next_wait();
                    let how = if panicked { "panicked" } else { "ended unexpectedly" };
                    tracing::error!(task = name, retry_in = ?wait, "the `{name}` task {how}; starting it again");
                    self.start(i, wait);
                }
                Policy::Exit | Policy::Ends => {
                    let failed = ServiceFailed { name, panicked };
                    tracing::error!(task = name, "{failed}");
                    return failed;
                }
            }
        }
    }

    /// Wait up to `grace` for every task to end (the caller has stopped and
    /// aborted the shutdown), then cancel what is left.
    pub async fn join(mut self, grace: Duration) {
        let _ = tokio::time::timeout(grace, async { while self.running.join_next().await.is_some() {} }).await;
        self.running.abort_all();
    }
}

/// Take items from `rx` until `stop` fires or the queue closes, and run
/// `handle(item)` for each in its own task, at most `limit` at once: when all
/// are busy, items wait in the (bounded) queue, not in memory here. Once
/// `stop` has fired, no further item is taken. Finished
/// tasks are reaped as it goes. Returns the tasks still running, for the caller
/// to wait for (or abort) once it has dealt with what is left in `rx`.
pub async fn run_bounded<T, F, Fut>(
    rx: &mut mpsc::Receiver<T>,
    limit: usize,
    stop: &CancellationToken,
    mut handle: F,
) -> JoinSet<()>
where
    F: FnMut(T) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(limit.max(1)));
    let mut running = JoinSet::new();
    loop {
        // Biased, stop first: once stopping, nothing more is taken (what is
        // left stays in the queue for the caller).
        let permit = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
        };
        let item = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            m = rx.recv() => match m { Some(m) => m, None => break },
            Some(_) = running.join_next(), if !running.is_empty() => continue,
        };
        let task = handle(item);
        running.spawn(async move {
            let _permit = permit;
            task.await;
        });
    }
    running
}

/// Run `f` (a durable write: it waits on `fsync`) on tokio's blocking pool
/// and wait for it, so the daemon's one runtime thread goes on with Telegram
/// polling, MQTT keep-alives and the scheduler meanwhile.
///
/// `f` always runs to its end once: if this future is dropped, the write
/// still finishes on its thread; if the runtime is already shutting down and
/// refuses new blocking work, `f` runs right here instead of being lost. A
/// panic in `f` is resumed in the caller.
pub async fn blocking<T, F>(f: F) -> T
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let slot = Arc::new(std::sync::Mutex::new(Some(f)));
    let theirs = Arc::clone(&slot);
    let taken = |s: &std::sync::Mutex<Option<F>>| s.lock().unwrap_or_else(|p| p.into_inner()).take();
    let ran = match tokio::task::spawn_blocking(move || taken(&theirs).map(|f| f())).await {
        Ok(out) => out,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Refused (the runtime is shutting down): never started.
        Err(_) => None,
    };
    match ran {
        Some(out) => out,
        None => match taken(&slot) {
            Some(f) => f(),
            None => unreachable!("a blocking job that did not run was taken by nobody"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn blocking_work_leaves_the_runtime_thread_and_comes_back() {
        let here = std::thread::current().id();
        let (there, v) = blocking(move || (std::thread::current().id(), 41 + 1)).await;
        assert_eq!(v, 42);
        assert_ne!(there, here, "ran on another thread");
    }

    #[test]
    fn blocking_work_refused_at_shutdown_runs_inline() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let handle = rt.handle().clone();
        // A runtime shut down refuses new blocking work; the write must still happen.
        rt.shutdown_background();
        let v = handle.block_on(blocking(|| 7));
        assert_eq!(v, 7);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_panic_in_blocking_work_reaches_the_caller() {
        let caught = tokio::spawn(blocking(|| -> u8 { panic!("disk on fire") })).await.unwrap_err();
        assert!(caught.is_panic());
    }
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn at_most_limit_run_at_once_and_all_run() {
        let (tx, mut rx) = mpsc::channel(16);
        for i in 0..10 {
            tx.send(i).await.unwrap();
        }
        drop(tx);
        let (now, peak, done) =
            (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let stop = CancellationToken::new();
        let (n, p, d) = (now.clone(), peak.clone(), done.clone());
        let mut left = run_bounded(&mut rx, 3, &stop, move |_| {
            let (n, p, d) = (n.clone(), p.clone(), d.clone());
            async move {
                let c = n.fetch_add(1, Ordering::SeqCst) + 1;
                p.fetch_max(c, Ordering::SeqCst);
                tokio::task::yield_now().await;
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                n.fetch_sub(1, Ordering::SeqCst);
                d.fetch_add(1, Ordering::SeqCst);
            }
        })
        .await;
        while left.join_next().await.is_some() {}
        assert_eq!(done.load(Ordering::SeqCst), 10);
        assert_eq!(peak.load(Ordering::SeqCst), 3, "three at once, never more");
    }

    /// A service that returns `early` times at once, then runs until the stop.
    fn flaky(
        runs: &Arc<AtomicUsize>,
        early: usize,
        running: &Arc<tokio::sync::Notify>,
    ) -> impl FnMut(Shutdown) -> BoxFuture<'static, ()> {
        let (runs, running) = (runs.clone(), running.clone());
        move |shutdown: Shutdown| {
            let (runs, running) = (runs.clone(), running.clone());
            Box::pin(async move {
                if runs.fetch_add(1, Ordering::SeqCst) < early {
                    return;
                }
                running.notify_one();
                shutdown.stopped().await
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_restarting_service_that_ends_early_is_made_again() {
        let (runs, running) = (Arc::new(AtomicUsize::new(0)), Arc::new(tokio::sync::Notify::new()));
        let shutdown = Shutdown::new();
        let mut tasks = Supervisor::new(shutdown.clone());
        tasks.spawn(Service::restarting("flaky", flaky(&runs, 2, &running)));
        assert_eq!(tasks.names(), ["flaky"]);
        // Paused time: the backoff's sleeps pass at once; an hour means "never".
        let made_again = tokio::time::timeout(Duration::from_secs(3600), async {
            tokio::select! {
                failed = tasks.watch() => panic!("a restarting service stopped the daemon: {failed}"),
                () = running.notified() => {}
            }
        });
        assert!(made_again.await.is_ok(), "made again after ending early");
        assert_eq!(runs.load(Ordering::SeqCst), 3, "ended twice, made again twice");
        shutdown.stop();
        shutdown.abort();
        tasks.join(Duration::from_secs(5)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_service_that_ends_early_stops_the_daemon_unless_ending_is_its_job() {
        let shutdown = Shutdown::new();
        let mut tasks = Supervisor::new(shutdown.clone());
        let (one_shot_ran, go) = (Arc::new(AtomicUsize::new(0)), Arc::new(tokio::sync::Notify::new()));
        let ran = one_shot_ran.clone();
        tasks.spawn(Service::ends("one-shot", move |_| async move {
            ran.fetch_add(1, Ordering::SeqCst);
        }));
        let wait = go.clone();
        tasks.spawn(Service::new("loop", move |_| async move { wait.notified().await }));
        go.notify_one();
        let failed = tasks.watch().await;
        assert_eq!(failed, ServiceFailed { name: "loop", panicked: false });
        assert_eq!(one_shot_ran.load(Ordering::SeqCst), 1, "the one-shot ran and its end was not a failure");
        assert!(failed.to_string().contains("the `loop` task ended unexpectedly"), "{failed}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_panic_stops_the_daemon_even_for_a_one_shot() {
        let mut tasks = Supervisor::new(Shutdown::new());
        tasks.spawn(Service::ends("one-shot", |_| async { panic!("bug") }));
        assert_eq!(tasks.watch().await, ServiceFailed { name: "one-shot", panicked: true });
    }

    #[tokio::test(start_paused = true)]
    async fn ends_after_the_stop_are_expected() {
        let (runs, running) = (Arc::new(AtomicUsize::new(0)), Arc::new(tokio::sync::Notify::new()));
        let shutdown = Shutdown::new();
        let mut tasks = Supervisor::new(shutdown.clone());
        tasks.spawn(Service::restarting("restarting", flaky(&runs, 0, &running)));
        tasks.spawn(Service::new("once", |sd: Shutdown| async move { sd.stopped().await }));
        running.notified().await;
        shutdown.stop();
        // Both end now; neither is restarted nor a failure, and the watch goes quiet.
        let quiet = tokio::time::timeout(Duration::from_secs(3600), tasks.watch()).await;
        assert!(quiet.is_err(), "no failure after the stop: {quiet:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "not made again after the stop");
    }

    #[tokio::test]
    async fn stop_ends_taking_and_leaves_the_rest_in_the_queue() {
        let (tx, mut rx) = mpsc::channel(4);
        tx.send(1).await.unwrap();
        let stop = CancellationToken::new();
        stop.cancel();
        let left = run_bounded(&mut rx, 2, &stop, |_| async {}).await;
        assert!(left.is_empty());
        assert_eq!(rx.try_recv().ok(), Some(1), "not taken");
    }
}
