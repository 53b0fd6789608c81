//! What to sweep, decided from two consecutive topology snapshots (pure, no I/O).
//!
//! Only a published change of primary from O to N starts a sweep. A master that goes `stale`
//! keeps its primary, so losing the Sentinels (or the upstream) never selects anything.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use super::diag::TcpSocket;
use crate::topology::{Master, Node, Snapshot};

/// A published change of a master's primary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub master: String,
    pub from: Node,
    pub to: Node,
    /// Hosts of the master's data nodes (new primary and replicas, before and after): their
    /// connections to the old primary are replication links, never swept on the node side.
    pub data_hosts: BTreeSet<IpAddr>,
}

/// Every master whose primary moved between `old` and `new`.
pub fn changes(old: &Snapshot, new: &Snapshot) -> Vec<Change> {
    new.masters
        .values()
        .filter_map(|m| {
            let before = old.master(&m.name)?;
            let (from, to) = (before.primary.as_ref()?, m.primary.as_ref()?);
            (from != to).then(|| Change {
                master: m.name.clone(),
                from: from.clone(),
                to: to.clone(),
                data_hosts: data_hosts(before, m),
            })
        })
        .collect()
}

fn data_hosts(before: &Master, after: &Master) -> BTreeSet<IpAddr> {
    let replicas = before.replicas.iter().chain(&after.replicas).map(|r| r.ip.to_canonical());
    let primary = after.primary.iter().map(|p| p.ip.to_canonical());
    replicas.chain(primary).collect()
}

/// Which sockets of this host one sweep destroys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// Node side: clients of a local port, except the spared peer hosts (replicas, Sentinels).
    Local { port: u16, spared: BTreeSet<IpAddr> },
    /// Client side: this host's sockets to the old primary.
    Remote { peer: SocketAddr },
}

impl Target {
    pub fn selects(&self, socket: &TcpSocket) -> bool {
        match self {
            Self::Local { port, spared } => {
                socket.local.port() == *port && !spared.contains(&socket.peer.ip())
            }
            Self::Remote { peer } => socket.peer == canonical(*peer),
        }
    }

    pub fn side(&self) -> &'static str {
        match self {
            Self::Local { .. } => "local",
            Self::Remote { .. } => "remote",
        }
    }
}

fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

#[cfg(test)]
mod tests;
