//! The Sentinel side: the only writer of the topology.
//!
//! One [`link::Link`] task per Sentinel (every configured address, forever, plus Sentinels
//! discovered through `SENTINEL SENTINELS`) turns what its Sentinel says into
//! [`Observation`]s; the single [`decider::Decider`] task applies the publication rule to them
//! and publishes snapshots. Links never decide and the decider never does network I/O in its
//! loop (role checks run as separate tasks and report back), so one hung Sentinel or node
//! cannot delay a publication.

pub mod admin;
mod conn;
mod decider;
mod link;
pub mod message;
mod nodes;

use std::sync::Arc;
use std::time::Instant;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use conn::{Endpoint, connect};
pub use decider::Decider;
use message::{Addr, PeerRecord};

use crate::config::Config;
use crate::events::EventLog;
use crate::topology::{Node, Replica, TopologyWriter};

/// Index of a link in the decider's table.
pub type LinkId = usize;

/// What a link tells the decider.
#[derive(Debug)]
pub enum Observation {
    Up {
        link: LinkId,
        myid: Option<String>,
    },
    Down {
        link: LinkId,
        reason: String,
    },
    Report(Report),
    /// The Sentinel reports a failover of `master` starting (true) or over (false, and then
    /// whether it was aborted).
    Failover {
        link: LinkId,
        master: String,
        in_progress: bool,
        aborted: bool,
    },
    /// The leader is about to promote `replica`.
    Promoting {
        link: LinkId,
        master: String,
        replica: Addr,
        /// The replica, resolved, and the failover's epoch: present once the leader has sent
        /// `SLAVEOF NO ONE` and the epoch of this failover is known, so the decider may watch
        /// the replica's `ROLE` and flip the moment it is a master.
        promoted: Option<(Node, u64)>,
        at: Instant,
    },
    /// A replica of `master` came back or changed role; it may be a returning old primary.
    NodeBack {
        link: LinkId,
        master: String,
        node: Node,
    },
    /// The leader's `+promoted-slave`, with the failover's epoch.
    Promoted {
        link: LinkId,
        master: String,
        node: Node,
        epoch: u64,
        at: Instant,
    },
}

/// A reconciliation from one Sentinel: of every master it monitors, or of some of them.
#[derive(Debug)]
pub struct Report {
    pub link: LinkId,
    /// What was asked: a master of the scope missing from `masters` is one this Sentinel does
    /// not monitor (any more).
    pub scope: Scope,
    pub masters: Vec<MasterReport>,
    /// The other Sentinels it knows (full reconciliations only).
    pub peers: Vec<PeerRecord>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    All,
    Masters(std::collections::BTreeSet<String>),
}

#[derive(Debug, Clone)]
pub struct MasterReport {
    pub name: String,
    pub primary: Node,
    pub epoch: u64,
    pub failover_in_progress: bool,
    pub replicas: Vec<Replica>,
}

/// Starts the links and the decider; they stop when `shutdown` is cancelled. Fence and drain
/// signals go to `drain` when given.
pub fn spawn(
    config: &Config,
    writer: TopologyWriter,
    events: Arc<EventLog>,
    drain: Option<tokio::sync::mpsc::UnboundedSender<crate::failover::Signal>>,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    let mut decider = Decider::new(config, writer, events, shutdown);
    if let Some(tx) = drain {
        decider = decider.with_drain(tx);
    }
    tokio::spawn(decider.run())
}
