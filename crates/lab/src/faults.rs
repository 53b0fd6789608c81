//! The failures the tests inflict: planned failover, kill, hang, restart.

use std::time::Duration;

use tokio::time::{Instant, sleep};

use crate::query::{query, sentinel};
use crate::{Lab, Slot};

/// How long `failover` keeps retrying while Sentinel is not ready for one (`NOGOODSLAVE` while
/// replicas resynchronise after a previous failover, `INPROG` while one is still running).
const FAILOVER_RETRY: Duration = Duration::from_secs(30);

impl Lab {
    /// `SENTINEL FAILOVER <name>` on a running Sentinel, retried until one accepts it.
    pub async fn failover(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + FAILOVER_RETRY;
        let cmd = sentinel("failover", &[self.master_name()]);
        loop {
            let mut last = None;
            for addr in self.running_sentinels() {
                match query::<String>(addr, &cmd).await {
                    Ok(_) => return Ok(()),
                    Err(e) => last = Some(e),
                }
            }
            if Instant::now() > deadline {
                let e = last.unwrap_or_else(|| anyhow::anyhow!("no sentinel is running"));
                return Err(self.explain(e.context("SENTINEL FAILOVER never accepted")));
            }
            sleep(Duration::from_millis(250)).await;
        }
    }

    /// SIGKILL node `i` (its socket closes: clients see a reset).
    pub fn kill_node(&self, i: usize) -> anyhow::Result<()> {
        self.with(Slot::Node(i), |p| {
            p.kill();
            Ok(())
        })
    }

    /// SIGSTOP node `i`: it keeps its sockets open and answers nothing.
    pub fn stop_node(&self, i: usize) -> anyhow::Result<()> {
        self.with(Slot::Node(i), |p| p.stop())
    }

    /// SIGCONT node `i`.
    pub fn cont_node(&self, i: usize) -> anyhow::Result<()> {
        self.with(Slot::Node(i), |p| p.cont())
    }

    /// Kills node `i` if it runs and starts it again on the same port and config (which
    /// Sentinel rewrites with `CONFIG REWRITE` when it reconfigures a node).
    pub async fn restart_node(&self, i: usize) -> anyhow::Result<()> {
        self.relaunch(Slot::Node(i)).await
    }

    /// SIGKILL Sentinel `i`; its rewritten config stays for `start_sentinel`.
    pub fn stop_sentinel(&self, i: usize) -> anyhow::Result<()> {
        self.with(Slot::Sentinel(i), |p| {
            p.kill();
            Ok(())
        })
    }

    /// Starts Sentinel `i` again on its port with its own rewritten config.
    pub async fn start_sentinel(&self, i: usize) -> anyhow::Result<()> {
        self.relaunch(Slot::Sentinel(i)).await
    }

    /// SIGSTOP Sentinel `i`: connections to it stay open and go silent.
    pub fn hang_sentinel(&self, i: usize) -> anyhow::Result<()> {
        self.with(Slot::Sentinel(i), |p| p.stop())
    }

    /// SIGCONT Sentinel `i`.
    pub fn unhang_sentinel(&self, i: usize) -> anyhow::Result<()> {
        self.with(Slot::Sentinel(i), |p| p.cont())
    }
}
