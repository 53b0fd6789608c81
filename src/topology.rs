//! The published view of every master: what DNS, HTTP and (later) drain and sweep answer from.
//!
//! The Sentinel side (`crate::sentinel::decider`) is the only writer. It builds a complete new
//! [`Snapshot`] for every change and publishes it through a `watch` channel, so a reader always
//! sees one consistent state: a DNS answer and an HTTP answer taken from the same snapshot never
//! disagree, and nothing is ever half-applied.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::SystemTime;

use serde::Serialize;
use tokio::sync::watch;

/// One data node, as Sentinel reports it and as clients reach it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Node {
    pub ip: IpAddr,
    pub port: u16,
    /// The name Sentinel reported when it runs with `announce-hostnames yes`.
    pub hostname: Option<String>,
}

impl Node {
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip, self.port)
    }
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.addr())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Replica {
    pub ip: IpAddr,
    pub port: u16,
    pub hostname: Option<String>,
    /// Sentinel considers it up (not `s_down`/`o_down`/`disconnected`) and linked to its primary.
    pub healthy: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum MasterState {
    /// A confirmed primary and at least one Sentinel reachable.
    Ok,
    /// A Sentinel reports a failover of this master in progress.
    Failover,
    /// No Sentinel is reachable: the last confirmed primary is still served.
    Stale,
    /// No primary has been confirmed yet.
    Unknown,
}

impl MasterState {
    pub const ALL: [MasterState; 4] = [Self::Ok, Self::Failover, Self::Stale, Self::Unknown];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Failover => "failover",
            Self::Stale => "stale",
            Self::Unknown => "unknown",
        }
    }
}

impl fmt::Display for MasterState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the configured Sentinels see one master.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SentinelCounts {
    /// Sentinel addresses in the configuration.
    pub configured: usize,
    /// Of those, how many polestar is connected to right now.
    pub reachable: usize,
    /// Of those, how many report the published primary at the published epoch.
    pub agreeing: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Master {
    pub name: String,
    /// The DNS label: `dns_name` from the config or derived from the name.
    pub label: String,
    pub primary: Option<Node>,
    /// The config epoch of the published primary.
    pub epoch: Option<u64>,
    /// When the published primary was first published.
    pub since: Option<SystemTime>,
    pub state: MasterState,
    pub replicas: Vec<Replica>,
    pub sentinels: SentinelCounts,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Grows by one with every published change; DNS derives its SOA serial from it.
    pub version: u64,
    pub masters: BTreeMap<String, Arc<Master>>,
    /// Whether any Sentinel (or the upstream) is reachable.
    pub source_reachable: bool,
}

impl Snapshot {
    pub fn master(&self, name: &str) -> Option<&Arc<Master>> {
        self.masters.get(name)
    }

    pub fn by_label(&self, label: &str) -> Option<&Arc<Master>> {
        self.masters.values().find(|m| m.label == label)
    }
}

/// The readers' end: clone it freely, `borrow()` for the current snapshot, `changed()` to wait.
pub type TopologyReader = watch::Receiver<Arc<Snapshot>>;
/// The one writer's end, held by the decider.
pub type TopologyWriter = watch::Sender<Arc<Snapshot>>;

pub fn channel() -> (TopologyWriter, TopologyReader) {
    watch::channel(Arc::new(Snapshot::default()))
}

/// The DNS label for a master name: lower-cased, anything outside `[a-z0-9-]` mapped to `-`.
pub fn label_for(name: &str) -> String {
    name.chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' { c } else { '-' })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_lower_case_and_safe() {
        assert_eq!(label_for("mymaster"), "mymaster");
        assert_eq!(label_for("Cache_Main.eu"), "cache-main-eu");
        assert_eq!(label_for("a b"), "a-b");
    }
}
