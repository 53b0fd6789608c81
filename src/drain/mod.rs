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
//! - **Failover started** (`+try-failover`, `+elected-leader` of the published primary O): the
//!   link to O is opened (connected, authenticated, named `polestar`) and held a while, so
//!   that the fence below is one round trip on it rather than a connection opened then.
//! - **Promoting** (the leader won its election as the leader of O's failover, or chose N): O
//!   is fenced at once with `CLIENT PAUSE <ms> WRITE`, because from now until O is demoted
//!   both nodes accept writes and O's are lost. Reads go on. The pause is short and renewed
//!   every `interval`, so that it lapses by itself if
//!   polestar dies; a fence that no flip or confirmation follows within
//!   [`episode::FENCE_HOLD`] is left to lapse.
//! - **Flipped** (DNS and HTTP answer N): every client of O that is not spared is killed at
//!   once; then a sweep every `interval` until the cutoff `flip + grace`.
//! - **Confirmed** (or a flip that is not provisional): O is demoted: the pause is renewed for
//!   as long as the demotion may take (it asks N `ROLE` first, on a connection opened then),
//!   the clients the pause holds are killed and `REPLICAOF N` is sent in one transaction, and
//!   the pause is lifted once `ROLE` says replica. From then on O refuses every write (`READONLY`), whatever address its
//!   clients hold, so nothing it acknowledges after the promotion is lost.
//! - **Stale writers**: after the cutoff and until `window`, every client of O whose last
//!   command is a write (it got `READONLY`: a cached or pinned address) is killed every second,
//!   so it resolves again; readers of O (now a replica) stay.
//! - **Aborted**: every fence and drain of a promotion not confirmed yet (a provisional flip's
//!   included) is undone at once.
//! - An unreachable O is retried until `window` after the flip and demoted the moment it
//!   answers (a hung primary resumed).
//! - **Returning**: a node that comes back still claiming master while another is published is
//!   drained and demoted at once, with its own grace and window, if the signal matches what is
//!   published and no failover of the master is under way.
//!
//! Why demote rather than hold the pause until Sentinel does (8–11 s later): a paused node
//! holds Sentinel's hello `PUBLISH` and every command pipelined behind it, including the
//! `REPLICAOF` that demotes it, so a pause renewed until demotion is never lifted (measured;
//! see [`episode`]).
//!
//! Several polestars against the same Sentinels (the normal deployment) do all of this to the
//! same node: kills are by id, `REPLICAOF` to the same primary changes nothing, `CLIENT PAUSE`
//! only extends a pause, and `CLIENT UNPAUSE` (which lifts everyone's) is sent only when the
//! node is a replica or the failover was aborted; a fence no longer needed is left to lapse.
//!
//! On shutdown episodes are dropped without unpausing: a pause lapses by itself within
//! [`episode::pause_length`], and lifting it early would only let held writes run sooner.

mod coordinator;
mod episode;
mod handle;
pub mod killer;
mod pace;
pub mod spare;

use std::net::SocketAddr;
use std::sync::Arc;

pub use coordinator::Coordinator;
pub use handle::DrainHandle;
pub use killer::{DrainReport, Reason};
pub use spare::SpareReason;

use crate::config;
use crate::events::EventLog;
use crate::node::NodeError;
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
