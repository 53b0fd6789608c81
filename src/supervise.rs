//! Every spawned task has an owner that awaits it or restarts it, so none ends unseen. This is the
//! restarting kind: a long-lived task that must run until shutdown (the Sentinel decider)
//! and that, should it end before (a panic: a bug, never network input), is started afresh
//! with a log line rather than leaving the process up but deaf.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Pause between a task's unexpected end and its restart, so a task that fails at once does
/// not spin.
const RESTART_DELAY: Duration = Duration::from_secs(1);

/// Runs the task `start` builds until `shutdown` is cancelled (the task must itself stop on
/// it); restarts it whenever it ends before.
pub async fn restarting<F, Fut>(name: &'static str, shutdown: CancellationToken, mut start: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    loop {
        let ended = tokio::spawn(start()).await;
        if shutdown.is_cancelled() {
            return;
        }
        match ended {
            Err(e) if e.is_panic() => tracing::error!("{name} panicked: restarting it"),
            _ => tracing::error!("{name} stopped unexpectedly: restarting it"),
        }
        tokio::select! {
            _ = tokio::time::sleep(RESTART_DELAY) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_task_that_panics_is_restarted_until_shutdown() {
        let runs = Arc::new(AtomicUsize::new(0));
        let shutdown = CancellationToken::new();
        let (count, stop) = (runs.clone(), shutdown.clone());
        let supervisor = tokio::spawn(restarting("test task", shutdown.clone(), move || {
            let (count, stop) = (count.clone(), stop.clone());
            async move {
                if count.fetch_add(1, Ordering::SeqCst) < 2 {
                    panic!("a bug");
                }
                stop.cancelled().await;
            }
        }));
        while runs.load(Ordering::SeqCst) < 3 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        shutdown.cancel();
        supervisor.await.expect("the supervisor itself never panics");
        assert_eq!(runs.load(Ordering::SeqCst), 3, "restarted twice, then ran until shutdown");
    }
}
