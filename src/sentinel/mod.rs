//! The Sentinel side: the only writer of the topology.
//!
//! One [`link::Link`] task per configured Sentinel address, forever, turns what its Sentinel
//! says into [`Observation`]s; the single [`decider::Decider`] task turns them into evidence
//! for the pure publication rule ([`core::decide`]) and carries out what it decides. Links
//! never decide and the decider never does network I/O in its loop (role watches run as
//! separate tasks and report back), so one hung Sentinel or node cannot delay a publication.
//!
//! The trust model: only the configured Sentinels are evidence. Sentinels learn their peers
//! from hello messages that any client of a data node can publish, so the peers the configured
//! Sentinels list (`SENTINEL SENTINELS`) are shown in the API (`sentinels.discovered`), the
//! metrics and a log line suggesting to configure them, and nothing more: polestar never
//! connects to them. A connection could only be a liability (their reports never count, the
//! configured credentials must not reach them, and a fake one could flood or stall us), and
//! without one there is nothing to forget when a peer disappears from the lists.

pub mod admin;
mod core;
mod decider;
mod discovered;
mod hello_acl;
mod link;
pub mod message;

use std::sync::Arc;
use std::time::Instant;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use core::{Candidate, SentinelId};
pub use decider::Decider;
use message::{Addr, Down, PeerRecord};

use crate::config::Config;
use crate::events::EventLog;
use crate::topology::{Node, Publisher, Replica};

/// What a link tells the decider.
#[derive(Debug)]
pub enum Observation {
    Up {
        from: SentinelId,
        myid: Option<String>,
    },
    Down {
        from: SentinelId,
        reason: String,
    },
    /// The address answered, but refused `SENTINEL` commands: it is something other than a
    /// Sentinel, and does not count towards the majority (until it answers as one).
    NotSentinel {
        from: SentinelId,
        reason: String,
    },
    Report(Report),
    /// The Sentinel's current epoch reached `epoch` (`+new-epoch`, `+vote-for-leader`).
    NewEpoch {
        from: SentinelId,
        epoch: u64,
    },
    /// The Sentinel reports a failover of `master` starting (`+try-failover`), or that it won
    /// the election and leads it (`+elected-leader`, `elected`).
    FailoverStarted {
        from: SentinelId,
        master: String,
        /// The Sentinel runs it as Valkey 9's coordinated failover (its record's
        /// `coordinated_failover` flag, read at the start).
        coordinated: bool,
        elected: bool,
    },
    /// The Sentinel reports a failover of `master` over, finished or `aborted`.
    FailoverEnded {
        from: SentinelId,
        master: String,
        aborted: bool,
    },
    /// The leader is about to promote `replica`.
    Promoting {
        from: SentinelId,
        master: String,
        replica: Addr,
        /// The replica, resolved, with the failover's epoch: present once the leader has sent
        /// `SLAVEOF NO ONE` and the epoch of this failover is known, so the decider may watch
        /// the replica's `ROLE` and flip the moment it is a master.
        target: Option<Candidate>,
        at: Instant,
    },
    /// A replica of `master` came back or changed role; it may be a returning old primary.
    NodeBack {
        from: SentinelId,
        master: String,
        node: Node,
        /// For `+convert-to-slave`: the primary the Sentinel told the node to replicate from.
        converted_to: Option<Addr>,
    },
    /// A master's own `+sdown`/`-sdown`/`+odown`/`-odown`: recorded for subscribers, never
    /// evidence for the publication rule.
    MasterDown {
        from: SentinelId,
        master: String,
        node: Addr,
        down: Down,
    },
    /// The leader's `+promoted-slave`: the promoted replica, resolved, with the failover's
    /// epoch.
    Promoted {
        from: SentinelId,
        master: String,
        target: Candidate,
        at: Instant,
    },
}

/// A reconciliation from one Sentinel: of every master it monitors, or of some of them.
#[derive(Debug)]
pub struct Report {
    pub from: SentinelId,
    /// What was asked: a master of the scope missing from `masters` is one this Sentinel does
    /// not monitor (any more).
    pub scope: Scope,
    pub masters: Vec<MasterReport>,
    /// Whether `masters` lists the other Sentinels it knows of each (full reconciliations).
    pub with_peers: bool,
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
    /// The replicas that say they replicate, and from where (the lineage check of a new
    /// primary reads them).
    pub followers: Vec<core::Follower>,
    /// The other Sentinels it knows for this master (`SENTINEL SENTINELS`; full
    /// reconciliations only, and `None` when not asked again because the count is unchanged,
    /// see [`link`]): shown, never trusted.
    pub peers: Option<Vec<PeerRecord>>,
}

/// Starts the links and the decider; they stop when `shutdown` is cancelled. Fence and drain
/// signals go to `drain` when given (the drain coordinator holds the receiver; it lives as long
/// as the daemon), and the links' records for the readiness poll to `heard`. A decider that panics is started afresh (and its links with it): it
/// publishes nothing new until a majority reports again, about a second, but it is not left
/// deaf.
pub fn spawn(
    config: &Config,
    writer: Publisher,
    events: Arc<EventLog>,
    drain: Option<tokio::sync::mpsc::UnboundedSender<crate::failover::Signal>>,
    heard: Option<crate::readiness::Heard>,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    let config = config.clone();
    let stop = shutdown.clone();
    let start = move || {
        let (writer, events) = (writer.clone(), events.clone());
        let mut decider = Decider::new(&config, writer, events, heard.clone(), stop.clone());
        if let Some(tx) = &drain {
            decider = decider.with_drain(tx.clone());
        }
        decider.run()
    };
    tokio::spawn(crate::supervise::restarting("the Sentinel decider", shutdown, start))
}
