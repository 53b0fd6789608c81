//! The manual drain behind `POST /v1/masters/{name}/drain`.

use std::net::SocketAddr;
use std::sync::Arc;

use super::killer::{Reason, Scope, drain, record};
use super::node::NodeLink;
use super::{DrainError, DrainReport, Shared};
use crate::topology::Node;

/// Drains a node by hand (`POST /v1/masters/{name}/drain`). Cheap to clone.
#[derive(Clone)]
pub struct DrainHandle {
    shared: Arc<Shared>,
}

impl DrainHandle {
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// Kills every client of `node` that is not spared, at the configured rate, and reports.
    /// `node` must be the primary or a replica of `master` in the published topology.
    pub async fn drain_now(
        &self,
        master: &str,
        node: SocketAddr,
    ) -> Result<DrainReport, DrainError> {
        if !self.shared.cfg.enabled {
            return Err(DrainError::Disabled);
        }
        let node = self.known_node(master, node)?;
        let link = NodeLink::new(&node, &self.shared.auth);
        let pacer = self.shared.pacers.of(node.addr());
        let report = drain(&link, &self.shared.rules, &pacer, Scope::All, Reason::Manual).await?;
        record(&self.shared.events, master, &report, true);
        Ok(report)
    }

    fn known_node(&self, master: &str, addr: SocketAddr) -> Result<Node, DrainError> {
        let snapshot = self.shared.topology.borrow();
        let m =
            snapshot.master(master).ok_or_else(|| DrainError::UnknownMaster(master.to_string()))?;
        let primary = m.primary.iter().cloned();
        let replicas = m.replicas.iter().map(|r| Node {
            ip: r.ip,
            port: r.port,
            hostname: r.hostname.clone(),
        });
        let mut known = primary.chain(replicas);
        known
            .find(|n| n.addr() == addr)
            .ok_or_else(|| DrainError::UnknownNode { master: master.to_string(), node: addr })
    }
}
