//! What one poll round learned about one master, as typed values: the input of
//! [`super::verdict::judge`]. Raw replies become these at the edge ([`super::parse`]); a reply
//! that does not parse is kept as its text, so the verdict can show it.

use std::collections::BTreeMap;
use std::time::Duration;

/// One master's facts: one entry per configured Sentinel, and the lag of each replica.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Facts {
    /// How many Sentinels are configured (the majority is counted against this).
    pub configured: usize,
    /// Each configured Sentinel's answers, in configuration order.
    pub sentinels: Vec<SentinelFacts>,
    /// Bytes behind the primary, by replica `ip:port`; a replica absent here has no known lag.
    pub lags: BTreeMap<String, u64>,
    /// How long the reachable Sentinels have disagreed without a break, as of this round
    /// (zero when they agree, or just started to disagree): see
    /// [`super::verdict::DISAGREE_GRACE`].
    pub disagreeing_for: Duration,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentinelFacts {
    /// `host:port` as configured.
    pub addr: String,
    /// `Err`: why it did not answer (connection refused, no answer within the deadline).
    pub answer: Result<SentinelAnswer, String>,
}

/// What a reachable Sentinel said. Each part is `Err(text)` when its reply made no sense.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentinelAnswer {
    /// `INFO sentinel`'s `sentinel_tilt`.
    pub tilt: Result<bool, String>,
    /// `SENTINEL CKQUORUM`: `Ok` when it says OK, else its text.
    pub ckquorum: Result<(), String>,
    /// `SENTINEL MASTER`: the primary it names and its config epoch.
    pub master: Result<MasterFacts, String>,
    /// `SENTINEL REPLICAS`.
    pub replicas: Result<Vec<ReplicaFacts>, String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MasterFacts {
    /// `ip:port`.
    pub primary: String,
    pub epoch: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaFacts {
    /// `ip:port`.
    pub addr: String,
    /// `s_down`, `o_down`, `disconnected`, ...
    pub flags: Vec<String>,
    /// `master-link-status` is `ok`.
    pub link_ok: bool,
    /// `slave-priority` (`replica-priority`); 0 means never promoted.
    pub priority: u64,
    /// How long it has been `s_down` (`s-down-time`), when it is.
    pub down_for: Option<Duration>,
}

impl ReplicaFacts {
    pub fn flagged(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    /// Sentinel counts it out: subjectively or objectively down, or not connected.
    pub fn down(&self) -> bool {
        self.flagged("s_down") || self.flagged("o_down") || self.flagged("disconnected")
    }
}
