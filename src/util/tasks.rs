//! Taking work from a bounded queue with a bounded number of tasks at once:
//! the pattern the agent's bus server and MQTT's trigger runner share (as
//! mini-redis's listener does with its connection semaphore) — and
//! [`blocking`], the way durable writes leave the runtime thread.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

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
