//! The manual drain behind `POST /v1/masters/{name}/drain`.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::watch;

use super::killer::{Reason, Scope, drain, record};
use super::node::NodeLink;
use super::{DrainError, DrainReport, Shared};
use crate::topology::Node;

/// Drains a node by hand (`POST /v1/masters/{name}/drain`). Cheap to clone.
#[derive(Clone)]
pub struct DrainHandle {
    /// The coordinator's current settings.
    shared: watch::Receiver<Arc<Shared>>,
}

impl DrainHandle {
    pub(super) fn new(shared: watch::Receiver<Arc<Shared>>) -> Self {
        Self { shared }
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
    let link = NodeLink::new(node, &shared.auth);
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
