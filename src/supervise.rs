//! Every spawned task has an owner that awaits it or restarts it, or ends by itself and says
//! so if it panics: none ends unseen. [`restarting`]: a long-lived task that must run until
//! shutdown (the Sentinel decider, the agent, the readiness poll) and that, should it end
//! before (a panic: a bug, never network input), is started afresh with a log line rather
//! than leaving the process up but deaf. [`detached`]: a task that nothing waits for because
//! it ends by itself (bounded in time, or by the token it holds), whose panic is logged with
//! its name.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;

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

/// Spawns `task`, which ends by itself (the caller says why in a comment), and logs its panic
/// naming it `name`: the task is gone either way, but not silently.
pub fn detached<F>(name: &'static str, task: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        if let Err(panic) = AssertUnwindSafe(task).catch_unwind().await {
            tracing::error!("{name} panicked: {}", message(panic.as_ref()));
        }
    });
}

fn message(panic: &(dyn Any + Send)) -> &str {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(text), _) => text,
        (_, Some(text)) => text,
        _ => "(no message)",
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

    #[test]
    fn a_panic_is_told_by_its_message() {
        let caught = |f: fn()| std::panic::catch_unwind(f).expect_err("it panics");
        assert_eq!(message(caught(|| panic!("plain")).as_ref()), "plain");
        assert_eq!(message(caught(|| panic!("formatted {}", 7)).as_ref()), "formatted 7");
        assert_eq!(message(caught(|| std::panic::panic_any(7_u8)).as_ref()), "(no message)");
    }
}
