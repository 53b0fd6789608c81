//! The switchover's own fence on the primary: `CLIENT PAUSE <ms> WRITE`, renewed every
//! `drain.interval` as the drain side's fence is, each pause lasting [`pause_length`] (two
//! intervals and a renewal's deadline). So a polestar killed mid-switchover leaves a pause that
//! lapses by itself within one `pause_length`: nothing renews it once we are gone.
//!
//! Renewal also stops at a hard limit given at the start, whatever happens to the caller.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

use super::link::{NODE_DEADLINE, open_node};
use crate::config::Auth;
use crate::node::Link;

/// How long each pause lasts.
pub fn pause_length(interval: Duration) -> Duration {
    interval * 2 + Duration::from_millis(500)
}

pub struct Fence {
    node: SocketAddr,
    auth: Auth,
    /// Cancelled to stop renewing; the renewal task holds a clone.
    stop: CancellationToken,
    /// The renewal task: ends when `stop` is cancelled or its hard limit passes, and gives
    /// its connection back (the lift goes over it: one round trip).
    renewal: JoinHandle<Link>,
}

impl Fence {
    /// Pauses `node`'s writes now (an error if it cannot) and renews the pause every `interval`
    /// until stopped, and never past `limit` from now.
    pub async fn start(
        node: SocketAddr,
        auth: &Auth,
        interval: Duration,
        limit: Duration,
    ) -> Result<Self, String> {
        let link = open_node(node, auth).await?;
        link.pause(pause_length(interval), NODE_DEADLINE).await.map_err(|e| e.to_string())?;
        let stop = CancellationToken::new();
        let renewal = tokio::spawn(renew(
            link,
            node,
            auth.clone(),
            interval,
            Instant::now() + limit,
            stop.clone(),
        ));
        Ok(Self { node, auth: auth.clone(), stop, renewal })
    }

    /// Stops renewing: the pause lapses within [`pause_length`] (someone else, the drain side,
    /// holds the node from here on).
    pub async fn release(mut self) {
        self.stop.cancel();
        let _ = (&mut self.renewal).await;
    }

    /// Stops renewing and lifts the pause at once (only when no failover follows it), over
    /// the renewal's connection, or a new one if that one fails or its task is gone.
    pub async fn lift(mut self) -> Result<(), String> {
        self.stop.cancel();
        if let Ok(link) = (&mut self.renewal).await
            && link.unpause(NODE_DEADLINE).await.is_ok()
        {
            return Ok(());
        }
        let link = open_node(self.node, &self.auth).await?;
        link.unpause(NODE_DEADLINE).await.map_err(|e| e.to_string())
    }

    /// Renews until `done` (the new primary is published) or `limit`, whichever comes first;
    /// the task that does it is the fence's own renewal, which ends by itself at its limit.
    pub fn release_when(self, done: impl Future<Output = ()> + Send + 'static, limit: Duration) {
        crate::supervise::detached("a switchover fence's release", async move {
            let _ = tokio::time::timeout(limit, done).await;
            self.release().await;
        });
    }
}

/// A fence dropped unreleased (its switchover's future dropped halfway) is renewed no more:
/// it lapses within [`pause_length`], as when polestar dies.
impl Drop for Fence {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn renew(
    mut link: Link,
    node: SocketAddr,
    auth: Auth,
    interval: Duration,
    until: Instant,
    stop: CancellationToken,
) -> Link {
    let length = pause_length(interval);
    loop {
        tokio::select! {
            () = stop.cancelled() => return link,
            () = sleep(interval) => {}
        }
        if Instant::now() >= until || stop.is_cancelled() {
            return link;
        }
        if let Err(error) = link.pause(length, NODE_DEADLINE).await {
            tracing::warn!(%node, %error, "switchover: renewing the fence failed; reconnecting");
            match open_node(node, &auth).await {
                Ok(fresh) => link = fresh,
                Err(error) => tracing::warn!(%node, %error, "switchover: fence node unreachable"),
            }
        }
    }
}
