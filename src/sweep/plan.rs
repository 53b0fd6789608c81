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
    /// Node side: clients of the old primary's local port, except the spared peer hosts
    /// (replicas, Sentinels) and the spared peers (the Sentinels', polestars' and replication
    /// connections the node's own `CLIENT LIST` named), on the local addresses that reach
    /// that node (`served`). `listed`: when the node answered `CLIENT LIST` this round, only
    /// the peers it listed; a connection made since (a polestar's fence or demotion opening
    /// one at the flip) waits for the next round's listing, which names it; so does one the
    /// listing shows still in its handshake, not yet named.
    Local {
        port: u16,
        spared: BTreeSet<IpAddr>,
        peers: BTreeSet<SocketAddr>,
        listed: Option<BTreeSet<SocketAddr>>,
        served: Served,
    },
    /// Client side: this host's sockets to the old primary.
    Remote { peer: SocketAddr },
}

/// The local addresses on which connections to a port reach one particular node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Served {
    /// The node listens on this address itself.
    Exactly(IpAddr),
    /// The node listens on the wildcard address: any local address but those other listeners
    /// on the same port are bound to (the kernel prefers a specific bind).
    Except(BTreeSet<IpAddr>),
}

impl Served {
    /// For the node at `node`, from this host's listening sockets (any port).
    pub fn find(node: SocketAddr, listeners: &[TcpSocket]) -> Self {
        let node = canonical(node);
        let on_port =
            listeners.iter().map(|l| canonical(l.local)).filter(|l| l.port() == node.port());
        let bound: BTreeSet<IpAddr> =
            on_port.map(|l| l.ip()).filter(|ip| !ip.is_unspecified()).collect();
        if bound.contains(&node.ip()) { Self::Exactly(node.ip()) } else { Self::Except(bound) }
    }

    fn contains(&self, ip: IpAddr) -> bool {
        match self {
            Self::Exactly(own) => *own == ip,
            Self::Except(others) => !others.contains(&ip),
        }
    }
}

impl Target {
    pub fn selects(&self, socket: &TcpSocket) -> bool {
        match self {
            Self::Local { port, spared, peers, listed, served } => {
                socket.local.port() == *port
                    && served.contains(socket.local.ip().to_canonical())
                    && !spared.contains(&socket.peer.ip())
                    && !peers.contains(&canonical(socket.peer))
                    && listed.as_ref().is_none_or(|l| l.contains(&canonical(socket.peer)))
            }
            Self::Remote { peer } => socket.peer == canonical(*peer),
        }
    }

    /// The same target, its `served` addresses found afresh for `node` from `listeners`.
    pub fn with_listeners(&self, node: SocketAddr, listeners: &[TcpSocket]) -> Self {
        match self {
            Self::Local { port, spared, peers, listed, .. } => Self::Local {
                port: *port,
                spared: spared.clone(),
                peers: peers.clone(),
                listed: listed.clone(),
                served: Served::find(node, listeners),
            },
            remote => remote.clone(),
        }
    }

    /// The same target, sparing exactly these peers and, when the node listed its clients this
    /// round, keeping to those (a node-side target only).
    pub fn sparing(
        &self,
        infrastructure: &BTreeSet<SocketAddr>,
        listed: Option<&BTreeSet<SocketAddr>>,
    ) -> Self {
        match self {
            Self::Local { port, spared, served, .. } => Self::Local {
                port: *port,
                spared: spared.clone(),
                peers: infrastructure.iter().map(|p| canonical(*p)).collect(),
                listed: listed.map(|l| l.iter().map(|p| canonical(*p)).collect()),
                served: served.clone(),
            },
            remote => remote.clone(),
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
