//! The manual drain behind `POST /v1/masters/{name}/drain`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::killer::{Reason, Scope, drain, record};
use super::{DrainError, DrainReport, Shared};
use crate::node::KeptLink;
use crate::topology::Node;

/// Drains a node by hand (`POST /v1/masters/{name}/drain`), and tells the drain side of a
/// coordinated failover polestar asked for. Cheap to clone.
#[derive(Clone)]
pub struct DrainHandle {
    /// The coordinator's current settings.
    shared: watch::Receiver<Arc<Shared>>,
    coordinated: Coordinated,
}

/// Per master, until when a failover polestar asked for is Valkey's coordinated one
/// (`SENTINEL FAILOVER <master> COORDINATED`): its leader fences the old primary itself
/// (`CLIENT PAUSE WRITE` and `FAILOVER TO` in one transaction, on its command link), and a
/// fence of ours set at `+selected-slave` would hold that link behind the Sentinel's paused
/// hello `PUBLISH` until its `failover-timeout` aborts the failover.
#[derive(Clone, Default)]
pub(crate) struct Coordinated(Arc<Mutex<HashMap<String, Instant>>>);

impl Coordinated {
    /// Whether a coordinated failover of `master` is marked now (an expired mark is dropped).
    pub(crate) fn holds(&self, master: &str) -> bool {
        let mut marks = self.0.lock().unwrap_or_else(|p| p.into_inner());
        marks.retain(|_, until| Instant::now() < *until);
        marks.contains_key(master)
    }

    fn set(&self, master: &str, until: Option<Instant>) {
        let mut marks = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match until {
            Some(until) => marks.insert(master.to_string(), until),
            None => marks.remove(master),
        };
    }
}

impl DrainHandle {
    pub(super) fn new(shared: watch::Receiver<Arc<Shared>>, coordinated: Coordinated) -> Self {
        Self { shared, coordinated }
    }

    /// Marks the failover of `master` about to be asked for as coordinated, for at most `for_`:
    /// its promotion sets no fence on the old primary (see [`Coordinated`]).
    pub fn coordinated(&self, master: &str, for_: Duration) {
        self.coordinated.set(master, Some(Instant::now() + for_));
    }

    /// Ends the mark of [`Self::coordinated`] (the failover is over, or was not coordinated).
    pub fn coordinated_done(&self, master: &str) {
        self.coordinated.set(master, None);
    }

    /// Kills every client of `node` that is not spared, at the configured rate, and reports.
    /// `node` must be the primary or a replica of `master` in the published topology.
    pub async fn drain_now(
        &self,
        master: &str,
        node: SocketAddr,
    ) -> Result<DrainReport, DrainError> {
        let shared = self.shared.borrow().clone();
        if !shared.cfg.enabled {
            return Err(DrainError::Disabled);
        }
        let node = known_node(&shared, master, node)?;
        drain_node(&shared, master, &node).await
    }

    /// The same for a node of `master` whatever the published topology says of it now (a
    /// node being handed off before it is stopped: the old primary of a switchover, a replica
    /// taken out of the replica answers).
    pub async fn drain_addr(
        &self,
        master: &str,
        node: SocketAddr,
    ) -> Result<DrainReport, DrainError> {
        let shared = self.shared.borrow().clone();
        if !shared.cfg.enabled {
            return Err(DrainError::Disabled);
        }
        let node = Node { ip: node.ip(), port: node.port(), hostname: None };
        drain_node(&shared, master, &node).await
    }
}

/// One manual pass over `node`: every client not spared, at the configured rate, recorded.
async fn drain_node(shared: &Shared, master: &str, node: &Node) -> Result<DrainReport, DrainError> {
    let link = KeptLink::new(node, &shared.auth);
    let pacer = shared.pacers.of(node.addr());
    let report = drain(&link, &shared.rules, &pacer, Scope::All, Reason::Manual).await?;
    record(&shared.events, master, &report, true);
    Ok(report)
}

/// `addr` as the published topology knows it: the primary or a replica of `master`.
fn known_node(shared: &Shared, master: &str, addr: SocketAddr) -> Result<Node, DrainError> {
    let snapshot = shared.topology.borrow();
    let m = snapshot.master(master).ok_or_else(|| DrainError::UnknownMaster(master.to_string()))?;
    let primary = m.primary.iter().cloned();
    let replicas =
        m.replicas.iter().map(|r| Node { ip: r.ip, port: r.port, hostname: r.hostname.clone() });
    let mut known = primary.chain(replicas);
    known
        .find(|n| n.addr() == addr)
        .ok_or_else(|| DrainError::UnknownNode { master: master.to_string(), node: addr })
}
