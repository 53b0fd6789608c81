//! Can this master fail over right now, and if not, why: the readiness verdict, and the
//! replication lag of every replica that it (and the lag-aware replica answers) rest on.
//!
//! Sentinel alone answers neither question in one place: `CKQUORUM` knows the quorum, `INFO`
//! the TILT mode, `SENTINEL REPLICAS` the flags and priorities, and only the primary's
//! `INFO replication` the lag. A poller ([`poll`]) asks the configured Sentinels (never the
//! ones they merely list) and the nodes they name, every `readiness.interval`, each question
//! under a deadline; the verdict is a pure function of what it learned ([`verdict::judge`]).
//! The result is published as a [`Board`] on a `watch` channel that the HTTP API and DNS read,
//! and as the `polestar_failover_ready`, `polestar_failover_blocked` and
//! `polestar_replica_lag_bytes` series.

mod ask;
mod changes;
pub mod facts;
pub mod heard;
pub mod lag;
pub mod lagging;
pub mod parse;
pub mod poll;
mod series;
pub mod verdict;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

pub use heard::Heard;
pub use series::register_master;

/// Why a master cannot fail over now. The `as_str` names are the `reason` label of
/// `polestar_failover_blocked` and the `reason` field of the API: stable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Fewer than a majority of the configured Sentinels answer.
    SentinelsUnreachable,
    /// `SENTINEL CKQUORUM` fails on a reachable Sentinel.
    Ckquorum,
    /// A Sentinel is in TILT mode (or its `INFO` makes no sense).
    SentinelTilt,
    /// The reachable Sentinels name different primaries or epochs.
    SentinelsDisagree,
    /// Every replica is down, unlinked, of priority 0 or lagging past `readiness.max_lag`.
    NoPromotableReplica,
    /// A replica entry has been `s_down` longer than `readiness.stale_after`.
    StaleReplicas,
}

impl Reason {
    pub const ALL: [Reason; 6] = [
        Self::SentinelsUnreachable,
        Self::Ckquorum,
        Self::SentinelTilt,
        Self::SentinelsDisagree,
        Self::NoPromotableReplica,
        Self::StaleReplicas,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::SentinelsUnreachable => "sentinels_unreachable",
            Self::Ckquorum => "ckquorum",
            Self::SentinelTilt => "sentinel_tilt",
            Self::SentinelsDisagree => "sentinels_disagree",
            Self::NoPromotableReplica => "no_promotable_replica",
            Self::StaleReplicas => "stale_replicas",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One reason a failover is not possible, with what shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blocker {
    pub reason: Reason,
    pub detail: String,
}

/// The answer of `GET /v1/masters/{name}/readiness`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    pub ready: bool,
    pub blockers: Vec<Blocker>,
}

impl Verdict {
    pub fn blocked_by(&self, reason: Reason) -> bool {
        self.blockers.iter().any(|b| b.reason == reason)
    }
}

/// What the poller knows of one master after its last round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MasterReadiness {
    pub verdict: Verdict,
    /// Bytes behind the primary, by replica `ip:port` (absent: unknown).
    pub lags: BTreeMap<String, u64>,
}

/// Every judged master, by name; empty until the first round (or without Sentinels).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Board {
    pub masters: BTreeMap<String, MasterReadiness>,
}

/// The readers' end (HTTP, DNS); the poller holds the only sender.
pub type Reader = watch::Receiver<Arc<Board>>;
pub type Writer = watch::Sender<Arc<Board>>;

pub fn channel() -> (Writer, Reader) {
    watch::channel(Arc::new(Board::default()))
}

/// A board that never changes (tests, embedding, agents): nothing judged.
pub fn nothing() -> Reader {
    channel().1
}
