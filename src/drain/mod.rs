//! Fence and drain: after a failover, make the old primary stop acknowledging writes and make
//! its clients reconnect, so that they find the new primary within about a second instead of
//! hanging on a dead socket or writing into a node that is about to be demoted.
//!
//! The Sentinel side sends [`Signal`]s (`crate::failover`) for changes the Sentinels agreed on (never because
//! polestar lost them). The [`Coordinator`] turns each into orders for one *episode* per
//! (master, node): a task that fences the node while it still claims master and drains its
//! clients (see [`episode`] for the timeline). Episodes run apart, so a node that is down or
//! hung delays nothing but its own episode; the coordinator itself never does network I/O.
//!
//! # Timeline of a failover from O to N, and why
//!
//! - **Promoting** (the leader chose N): O is fenced at once with `CLIENT PAUSE <ms> WRITE`,
//!   because from now until Sentinel demotes O (seconds later) both nodes accept writes and
//!   O's are lost. Reads go on. The pause is short and renewed every `interval`, so that it
//!   lapses by itself if polestar dies.
//! - **Flipped** (DNS and HTTP answer N): fence again, and kill every client of O that is not
//!   spared, at once. Clients that resolve afresh land on N; one whose DNS cache still names O
//!   reconnects to a paused node (or, later, a replica), so it cannot lose a write, and the
//!   next sweep catches it.
//! - **Sweeps** every `interval` until the cutoff `flip + grace`, and one at the cutoff: every
//!   client present then connected before the cutoff, so may hold a stale answer, and is
//!   killed. After the cutoff new connections to O are intended (replica reads) and left alone.
//! - The pause is lifted once O answers `ROLE` as a replica, on **Aborted**, when O becomes
//!   the published primary again, or at the cutoff once the sweeps are done (a promotion that
//!   is never published nor aborted: at the end of the window). Paused writes never run on
//!   O: their clients are killed first (at the cutoff in the same transaction as the unpause).
//! - An unreachable O is retried every `interval` until `window` after the flip; the first pass
//!   that reaches it after the cutoff kills the clients that may have connected before it.
//! - **Returning**: a node that comes back still claiming master while another is published
//!   is fenced and drained at once, with its own grace and window.
//!
//! Why the fence ends at the cutoff and not when Sentinel demotes O (as SPEC step 4 has it): a
//! paused node holds Sentinel's hello `PUBLISH` and every command pipelined behind it,
//! including the `REPLICAOF` that demotes it, so a pause renewed until demotion is never lifted
//! (measured; see [`episode`]). Connections made to O after the cutoff are intended replica
//! reads, so O needs no fence any more by then.
//!
//! On shutdown episodes are dropped without unpausing: a pause lapses by itself within
//! [`episode::pause_length`], and lifting it early would only let held writes run sooner.

pub mod clients;
mod coordinator;
mod episode;
mod handle;
pub mod killer;
pub mod node;
mod pace;
pub mod spare;

use std::net::SocketAddr;
use std::sync::Arc;

pub use coordinator::Coordinator;
pub use handle::DrainHandle;
pub use killer::{DrainReport, Reason};
pub use node::NodeError;
pub use spare::{CONNECTION_NAME, SpareReason};

use crate::config;
use crate::events::EventLog;
use crate::topology::TopologyReader;
use pace::Pacers;
use spare::Rules;

/// Why a manual drain was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error("draining is disabled (drain.enabled: false)")]
    Disabled,
    #[error("unknown master {0:?}")]
    UnknownMaster(String),
    #[error("{node} is neither the primary nor a replica of {master:?}")]
    UnknownNode { master: String, node: SocketAddr },
    #[error(transparent)]
    Node(#[from] NodeError),
}

/// What every episode and the manual drain share.
pub(crate) struct Shared {
    cfg: config::Drain,
    rules: Rules,
    auth: config::Auth,
    events: Arc<EventLog>,
    pacers: Pacers,
    topology: TopologyReader,
}

impl Shared {
    fn new(
        cfg: config::Drain,
        auth: config::Auth,
        events: Arc<EventLog>,
        topology: TopologyReader,
    ) -> Self {
        let rules = Rules::new(&cfg.spare);
        let pacers = Pacers::new(cfg.rate);
        Self { cfg, rules, auth, events, pacers, topology }
    }
}
