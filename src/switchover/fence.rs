//! The switchover's own fence on the primary: `CLIENT PAUSE <ms> WRITE`, renewed every
//! `drain.interval` as the drain side's fence is, each pause lasting [`pause_length`] (two
//! intervals and a renewal's deadline). So a polestar killed mid-switchover leaves a pause that
//! lapses by itself within one `pause_length`: nothing renews it once we are gone.
//!
//! Renewal also stops at a hard limit given at the start, whatever happens to the caller.
//!
//! `CLIENT UNPAUSE` lifts every pause on the node, another polestar's switchover fence
//! included, so the fence's connection is named [`FENCE_CONNECTION_NAME`] and a lift that
//! sees another such connection in `CLIENT LIST` leaves its own pause to lapse instead.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

use redis::Value;

use super::link::NODE_DEADLINE;
use crate::config::Auth;
use crate::node::clients::parse_list;
use crate::node::{DEFAULT_OPEN_DEADLINE, Endpoint, Link};

/// The name of a switchover fence's connection (spared by every drain: it begins with
/// [`crate::node::CONNECTION_NAME`]).
pub const FENCE_CONNECTION_NAME: &str = "polestar-fence";

/// A link to `node` named [`FENCE_CONNECTION_NAME`]; an error names the node.
async fn open_fence_link(node: SocketAddr, auth: &Auth) -> Result<Link, String> {
    let mut name = redis::cmd("CLIENT");
    name.arg("SETNAME").arg(FENCE_CONNECTION_NAME);
    let endpoint = Endpoint::at(node, auth);
    let opened =
        Link::open_with::<Value>(&endpoint, "CLIENT SETNAME", &name, DEFAULT_OPEN_DEADLINE);
    opened.await.map(|(link, _)| link).map_err(|e| e.to_string())
}

/// Whether another connection than `link` is a switchover fence's (another polestar's, or
/// ours from before a reconnection); `Err` when the node cannot tell (its `CLIENT LIST`
/// refused or unanswered).
async fn another_fence_on(link: &Link) -> Result<bool, String> {
    let mut list = redis::cmd("CLIENT");
    list.arg("LIST").arg("TYPE").arg("normal");
    let text: String =
        link.query("CLIENT LIST", &list, NODE_DEADLINE).await.map_err(|e| e.to_string())?;
    let own = link.id().ok();
    let clients = parse_list(&text).clients;
    Ok(clients.iter().any(|c| c.name == FENCE_CONNECTION_NAME && Some(c.id) != own))
}

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
        let link = open_fence_link(node, auth).await?;
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
    /// the renewal's connection, or a new one if that one is gone; unless another switchover
    /// fence is on the node, or the node cannot say: then the pause is left to lapse, since
    /// `UNPAUSE` would lift that fence too.
    pub async fn lift(mut self) -> Result<(), String> {
        self.stop.cancel();
        let mut link = match (&mut self.renewal).await {
            Ok(link) => link,
            Err(_) => open_fence_link(self.node, &self.auth).await?,
        };
        let mut seen = another_fence_on(&link).await;
        if seen.is_err() {
            link = open_fence_link(self.node, &self.auth).await?;
            seen = another_fence_on(&link).await;
        }
        match seen {
            Ok(false) => link.unpause(NODE_DEADLINE).await.map_err(|e| e.to_string()),
            Ok(true) => {
                tracing::info!(node = %self.node, "another switchover's fence is on the node: ours is left to lapse, not lifted");
                Ok(())
            }
            Err(why) => Err(format!("cannot tell whether another fence is on the node ({why})")),
        }
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
            match open_fence_link(node, &auth).await {
                Ok(fresh) => link = fresh,
                Err(error) => tracing::warn!(%node, %error, "switchover: fence node unreachable"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use polestar_lab::{Server, ServerOptions};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// Whether a plain client's `SET` is answered within `within` (a paused node holds it).
    async fn writes_answered(node: SocketAddr, within: Duration) -> bool {
        let mut c = TcpStream::connect(node).await.expect("connect");
        c.write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n").await.expect("send");
        let mut buf = [0u8; 64];
        matches!(tokio::time::timeout(within, c.read(&mut buf)).await, Ok(Ok(n)) if n > 0)
    }

    /// Two polestars fence one primary (two switchovers at once; one gives up): the one that
    /// gives up leaves the other's fence in place, and the last one lifts it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lifted_fence_never_lifts_another_switchovers_fence() {
        let server = Server::start(ServerOptions::node()).await.expect("redis-server");
        let node = server.addr();
        let auth = Auth::default();
        let (interval, limit) = (Duration::from_millis(250), Duration::from_secs(20));
        let theirs = Fence::start(node, &auth, interval, limit).await.expect("their fence");
        let ours = Fence::start(node, &auth, interval, limit).await.expect("our fence");
        ours.lift().await.expect("our fence is let go");
        assert!(!writes_answered(node, Duration::from_millis(800)).await, "their fence was lifted");
        theirs.lift().await.expect("their fence is lifted");
        assert!(writes_answered(node, Duration::from_secs(2)).await, "the last fence stayed");
    }
}
