//! The published view of every master: what DNS, HTTP and (later) drain and sweep answer from.
//!
//! One writer at a time (the Sentinel side's decider, an agent following an upstream, or the
//! reload watcher forwarding a restarted decider) builds a complete new [`Snapshot`] for every
//! change and publishes it through a `watch` channel, so a reader always sees one consistent
//! state: a DNS answer and an HTTP answer taken from the same snapshot never disagree, and
//! nothing is ever half-applied. Every writer goes through a [`Publisher`], which alone bumps
//! the version (the SOA serial derives from it, so it must only grow, whoever writes).

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::SystemTime;

use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

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

    /// Whether `other` is the same instance: the same address, or, where the Sentinels name
    /// nodes by hostname (`announce-hostnames yes`), the same hostname and port, whatever
    /// address the name resolves to now (a pod or VM that came back with a new IP).
    pub fn same_instance(&self, other: &Node) -> bool {
        let named = matches!((&self.hostname, &other.hostname), (Some(a), Some(b)) if a == b);
        self.addr() == other.addr() || (named && self.port == other.port)
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
    /// Sentinel marks it `s_down`/`o_down`: what Sentinel's own `+sdown` and `-sdown` of a
    /// replica follow. A replica that is up but not linked (resyncing after a failover, or an
    /// entry Sentinel has just made and not yet connected) is neither healthy nor down.
    #[serde(skip)]
    pub down: bool,
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
    /// The configured Sentinels name a primary polestar refuses (it was never a replica of
    /// the master: a forged hello): the last good primary is still served.
    Suspect,
}

impl MasterState {
    pub const ALL: [MasterState; 5] =
        [Self::Ok, Self::Failover, Self::Stale, Self::Unknown, Self::Suspect];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Failover => "failover",
            Self::Stale => "stale",
            Self::Unknown => "unknown",
            Self::Suspect => "suspect",
        }
    }
}

impl fmt::Display for MasterState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the configured Sentinels see one master.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SentinelCounts {
    /// Sentinel addresses in the configuration.
    pub configured: usize,
    /// Of those, how many polestar is connected to right now.
    pub reachable: usize,
    /// Of those, how many report the published primary at the published epoch.
    pub agreeing: usize,
    /// `host:port` of the Sentinels the configured ones list for this master that are not
    /// configured: shown so operators can add them, never trusted nor contacted.
    pub discovered: Vec<String>,
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
    /// The provisional flip (above `epoch`) a failover's abort took back, when that is why
    /// `primary` is what it is: the one case in which a master's epoch goes down, said
    /// explicitly so that agents follow it (they refuse a lower epoch otherwise).
    pub withdrawn: Option<Withdrawn>,
    /// `primary` was flipped to on its own `ROLE` while a configured leader promotes it, and is
    /// not confirmed yet: the watcher that published it alone can confirm or withdraw it (a
    /// reload waits for that before a new watcher takes over).
    pub provisional: bool,
}

/// The provisional primary a failover's abort took back, at the epoch it was published with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Withdrawn {
    pub node: Node,
    pub epoch: u64,
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

/// What a stage of the topology pipeline returns when its main input closed: nothing wrong at
/// shutdown (the writers stop first), an error before it, since every reader downstream would
/// otherwise wait for changes that never come while looking healthy (STYLE rule 14).
pub fn input_closed(stage: &str, shutdown: &CancellationToken) -> anyhow::Result<()> {
    anyhow::ensure!(
        shutdown.is_cancelled(),
        "{stage} stopped: the topology it follows has no writer"
    );
    Ok(())
}

/// A new topology: the writer's end, only ever a [`Publisher`], and a reader.
pub fn channel() -> (Publisher, TopologyReader) {
    let (writer, reader) = watch::channel(Arc::new(Snapshot::default()));
    (Publisher { writer }, reader)
}

/// The one place that bumps [`Snapshot::version`]: the writer's end of a topology is only
/// handed out as one of these. Clones publish into the same channel, one version sequence
/// (the daemon hands one to each watcher generation and to the forwarding of a restarted
/// one); the channel closes, and readers' `changed()` fails, when the last clone is dropped.
#[derive(Clone)]
pub struct Publisher {
    writer: watch::Sender<Arc<Snapshot>>,
}

impl Publisher {
    /// Publishes these masters if anything differs from the current snapshot (or nothing was
    /// published yet), with the next version; returns the new snapshot when it did. A master
    /// that did not change keeps its `Arc`: snapshots share what did not change.
    pub fn publish(
        &self,
        masters: impl IntoIterator<Item = Master>,
        source_reachable: bool,
    ) -> Option<Arc<Snapshot>> {
        let current = self.writer.borrow().clone();
        let masters: BTreeMap<String, Arc<Master>> = masters
            .into_iter()
            .map(|view| {
                let master = match current.masters.get(&view.name) {
                    Some(m) if **m == view => m.clone(),
                    _ => Arc::new(view),
                };
                (master.name.clone(), master)
            })
            .collect();
        self.replace(Snapshot { version: 0, masters, source_reachable })
    }

    /// Publishes the current snapshot with some masters' views replaced (`None`: the master is
    /// gone), if that changes anything; every other master keeps its `Arc`. Nothing is copied
    /// unless a view differs: the decider calls this after every observation.
    pub fn update(
        &self,
        views: impl IntoIterator<Item = (Option<Master>, String)>,
        source_reachable: bool,
    ) -> Option<Arc<Snapshot>> {
        let current = self.writer.borrow().clone();
        let differs =
            |(view, name): &(Option<Master>, String)| match (current.masters.get(name), view) {
                (Some(old), Some(new)) => **old != *new,
                (None, None) => false,
                _ => true,
            };
        let changed: Vec<(Option<Master>, String)> = views.into_iter().filter(differs).collect();
        let same = changed.is_empty() && current.source_reachable == source_reachable;
        if same && current.version > 0 {
            return None;
        }
        let mut masters = current.masters.clone();
        for (view, name) in changed {
            match view {
                Some(view) => masters.insert(name, Arc::new(view)),
                None => masters.remove(&name),
            };
        }
        self.replace(Snapshot { version: 0, masters, source_reachable })
    }

    /// Publishes `snapshot`'s content (its version is ignored) if it differs from the
    /// current one, with the next version.
    pub fn replace(&self, snapshot: Snapshot) -> Option<Arc<Snapshot>> {
        let mut published = None;
        self.writer.send_if_modified(|current| {
            let same = current.masters == snapshot.masters
                && current.source_reachable == snapshot.source_reachable;
            if same && current.version > 0 {
                return false;
            }
            let next = Arc::new(Snapshot { version: current.version + 1, ..snapshot.clone() });
            *current = next.clone();
            published = Some(next);
            true
        });
        published
    }

    pub fn reader(&self) -> TopologyReader {
        self.writer.subscribe()
    }

    /// How many readers hold the topology now.
    pub fn readers(&self) -> usize {
        self.writer.receiver_count()
    }

    /// The snapshot published last.
    pub fn current(&self) -> Arc<Snapshot> {
        self.writer.borrow().clone()
    }
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

    fn master(name: &str, epoch: u64) -> Master {
        Master {
            withdrawn: None,
            provisional: false,
            name: name.into(),
            label: name.into(),
            primary: None,
            epoch: Some(epoch),
            since: None,
            state: MasterState::Ok,
            replicas: Vec::new(),
            sentinels: SentinelCounts::default(),
        }
    }

    #[test]
    fn the_publisher_bumps_the_version_only_on_a_change() {
        let (publisher, reader) = channel();
        assert!(publisher.publish([master("m", 1)], true).is_some(), "the first one counts");
        assert_eq!(reader.borrow().version, 1);
        assert!(publisher.publish([master("m", 1)], true).is_none(), "nothing changed");
        assert!(publisher.publish([master("m", 2)], true).is_some());
        assert!(publisher.publish([master("m", 2)], false).is_some(), "reachability counts");
        assert_eq!(reader.borrow().version, 3);
        let unchanged = reader.borrow().masters["m"].clone();
        publisher.publish([master("m", 2), master("n", 1)], false);
        assert!(Arc::ptr_eq(&unchanged, &reader.borrow().masters["m"]), "shared, not rebuilt");
    }

    #[test]
    fn an_update_replaces_only_the_views_given_and_shares_the_rest() {
        let (publisher, reader) = channel();
        publisher.publish([master("a", 1), master("b", 1)], true);
        let a = reader.borrow().masters["a"].clone();
        let same = [(Some(master("b", 1)), "b".to_string())];
        assert!(publisher.update(same, true).is_none(), "nothing changed");
        assert_eq!(reader.borrow().version, 1);
        let snapshot = publisher.update([(Some(master("b", 2)), "b".into())], true);
        assert_eq!(snapshot.map(|s| s.version), Some(2));
        assert_eq!(reader.borrow().masters["b"].epoch, Some(2));
        assert!(Arc::ptr_eq(&a, &reader.borrow().masters["a"]), "a is shared, not rebuilt");
        assert!(publisher.update([(None, "a".into())], true).is_some(), "a is gone");
        assert!(!reader.borrow().masters.contains_key("a"));
        assert!(publisher.update([(None, "a".into())], true).is_none(), "gone already");
        assert!(publisher.update([], false).is_some(), "reachability counts");
        assert_eq!(reader.borrow().version, 4);
    }

    #[test]
    fn labels_are_lower_case_and_safe() {
        assert_eq!(label_for("mymaster"), "mymaster");
        assert_eq!(label_for("Cache_Main.eu"), "cache-main-eu");
        assert_eq!(label_for("a b"), "a-b");
    }
}
