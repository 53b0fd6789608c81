//! The JSON shape of a master, shared by the server (built from a [`Master`]) and the CLI client
//! (parsed from the answer), so the two cannot drift apart.

use std::net::{IpAddr, SocketAddr};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::topology::{Master, Node, Replica, SentinelCounts, Withdrawn};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MasterView {
    pub name: String,
    /// The DNS label (`<dns_name>.<zone>` resolves to the primary).
    pub dns_name: String,
    /// `null` until a primary is confirmed.
    pub primary: Option<NodeView>,
    pub epoch: Option<u64>,
    /// RFC 3339 UTC time the primary was first published.
    pub since: Option<String>,
    /// `ok`, `failover`, `stale` or `unknown`.
    pub state: String,
    pub replicas: Vec<ReplicaView>,
    pub sentinels: SentinelsView,
    /// Set when a provisional flip was withdrawn (the failover was aborted): the primary it
    /// had named and that primary's epoch, above the `epoch` served now. Absent otherwise
    /// (and from older polestars).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub withdrawn: Option<WithdrawnView>,
}

/// The header of an event stream's answer that says it carries `masters` events (the feed's
/// format version): a polestar without the feed ignores `?masters=` and answers without it,
/// which tells an agent to read `GET /v1/masters` instead.
pub const MASTERS_HEADER: &str = "polestar-masters";

/// The `data` of a `masters` event, which `GET /v1/events/stream?masters=only` (or `=also`)
/// sends at the start (every master, `after` absent) and at every published change (the
/// masters that changed since the stream's previous one, and the names of those removed), so
/// that an agent follows the state without reading `GET /v1/masters` again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MastersEvent {
    /// The published snapshot these views are from; it grows with every change (a restarted
    /// polestar starts again: it only orders the events of one stream).
    pub version: u64,
    /// The `version` of the stream's previous `masters` event: `masters` holds only what
    /// changed since. Absent: `masters` is every master.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<u64>,
    pub masters: Vec<MasterView>,
    /// Masters gone since `after`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WithdrawnView {
    pub ip: IpAddr,
    pub port: u16,
    pub epoch: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeView {
    pub ip: IpAddr,
    pub port: u16,
    /// Set when the Sentinels run with `announce-hostnames yes`; `null` otherwise.
    pub hostname: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaView {
    pub ip: IpAddr,
    pub port: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    pub healthy: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SentinelsView {
    pub configured: usize,
    pub reachable: usize,
    pub agreeing: usize,
    /// `host:port` of Sentinels the configured ones know but polestar is not configured with:
    /// never trusted, shown so operators can add them (absent from older polestars).
    #[serde(default)]
    pub discovered: Vec<String>,
}

impl NodeView {
    /// `ip:port`, with IPv6 in brackets.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip, self.port)
    }
}

impl From<&Master> for MasterView {
    fn from(m: &Master) -> Self {
        Self {
            name: m.name.clone(),
            dns_name: m.label.clone(),
            primary: m.primary.as_ref().map(NodeView::from),
            epoch: m.epoch,
            since: m.since.map(rfc3339),
            state: m.state.as_str().to_owned(),
            replicas: m.replicas.iter().map(ReplicaView::from).collect(),
            sentinels: (&m.sentinels).into(),
            withdrawn: m.withdrawn.as_ref().map(WithdrawnView::from),
        }
    }
}

impl From<&Withdrawn> for WithdrawnView {
    fn from(w: &Withdrawn) -> Self {
        Self { ip: w.node.ip, port: w.node.port, epoch: w.epoch }
    }
}

impl From<&Node> for NodeView {
    fn from(n: &Node) -> Self {
        Self { ip: n.ip, port: n.port, hostname: n.hostname.clone() }
    }
}

impl From<&Replica> for ReplicaView {
    fn from(r: &Replica) -> Self {
        Self { ip: r.ip, port: r.port, hostname: r.hostname.clone(), healthy: r.healthy }
    }
}

impl From<&SentinelCounts> for SentinelsView {
    fn from(s: &SentinelCounts) -> Self {
        Self {
            configured: s.configured,
            reachable: s.reachable,
            agreeing: s.agreeing,
            discovered: s.discovered.clone(),
        }
    }
}

/// Milliseconds matter when lining up a failover against client logs.
fn rfc3339(time: SystemTime) -> String {
    humantime::format_rfc3339_millis(time).to_string()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use serde_json::json;

    use super::*;
    use crate::topology::MasterState;

    #[test]
    fn a_master_serializes_to_the_documented_fields() {
        let master = Master {
            withdrawn: None,
            provisional: false,
            name: "mymaster".into(),
            label: "cache".into(),
            primary: Some(Node { ip: [10, 0, 0, 1].into(), port: 6379, hostname: None }),
            epoch: Some(3),
            since: Some(UNIX_EPOCH + Duration::from_millis(1_700_000_000_250)),
            state: MasterState::Ok,
            replicas: vec![Replica {
                ip: "::1".parse().expect("a literal IPv6 address"),
                port: 6380,
                hostname: Some("r2.lan".into()),
                healthy: true,
                down: false,
            }],
            sentinels: SentinelCounts {
                configured: 3,
                reachable: 3,
                agreeing: 2,
                discovered: vec!["10.0.0.9:26379".into()],
            },
        };
        let value = serde_json::to_value(MasterView::from(&master)).expect("plain data");
        let expected = json!({
            "name": "mymaster", "dns_name": "cache",
            "primary": {"ip": "10.0.0.1", "port": 6379, "hostname": null},
            "epoch": 3, "since": "2023-11-14T22:13:20.250Z", "state": "ok",
            "replicas": [{"ip": "::1", "port": 6380, "hostname": "r2.lan", "healthy": true}],
            "sentinels": {"configured": 3, "reachable": 3, "agreeing": 2,
                "discovered": ["10.0.0.9:26379"]},
        });
        assert_eq!(value, expected);
    }
}
