//! The publication rule, applied in one task that owns the state of every master.
//!
//! A primary is published when a Sentinel reports it with a config epoch higher than the
//! published one (any epoch while none is published) and either the node itself answers
//! `ROLE` master or a majority of the configured Sentinels report the same node and epoch.
//! The leader's `+promoted-slave` is checked at once, so the flip happens at promotion rather
//! than seconds later at `+switch-master`. A lower epoch is never published.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::conn::Endpoint;
use super::link::Link;
use super::message::PeerRecord;
use super::nodes::Nodes;
use super::{LinkId, MasterReport, Observation, Report, Scope};
use crate::config::{Auth, Config, HostPort};
use crate::events::EventLog;
use crate::failover::Signal;
use crate::metrics as m;
use crate::topology::{
    Master, MasterState, Node, Replica, SentinelCounts, Snapshot, TopologyWriter,
};

/// How long a `ROLE` check of a candidate primary may take.
const ROLE_DEADLINE: Duration = Duration::from_millis(1000);
/// After the leader sent `SLAVEOF NO ONE`, the chosen replica's `ROLE` is asked this often...
const PROMOTION_POLL: Duration = Duration::from_millis(20);
/// ...for at most this long (Sentinel itself notices within about a second).
const PROMOTION_WATCH: Duration = Duration::from_secs(10);
/// A connection to a data node unused this long is closed (it is opened again when a failover
/// of its master starts).
const NODE_IDLE: Duration = Duration::from_secs(60);
/// A discovered Sentinel unreachable this long is forgotten (configured ones never are).
const FORGET_DISCOVERED: Duration = Duration::from_secs(300);

/// How a publication made on the promoted replica's own `ROLE` is labelled.
const VIA_ROLE_POLL: &str = "role-poll";

/// A primary as some Sentinel reports it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Candidate {
    node: Node,
    epoch: u64,
}

struct Published {
    candidate: Candidate,
    since: SystemTime,
    /// Published on the promoted replica's own `ROLE` before the leader announced
    /// `+promoted-slave`; confirmed by that announcement or a Sentinel's report, undone if the
    /// failover is aborted instead.
    provisional: bool,
}

#[derive(Default)]
struct Entry {
    label: String,
    published: Option<Published>,
    /// The latest report of each reachable link that knows this master.
    reports: HashMap<LinkId, Candidate>,
    /// Links that currently report a failover in progress.
    failover: HashSet<LinkId>,
    replicas: Vec<Replica>,
    /// What was published before a provisional publication, to restore on an abort.
    before: Option<Published>,
    /// Role checks in flight, so a candidate is checked once at a time.
    checking: HashSet<Candidate>,
}

struct LinkState {
    addr: HostPort,
    configured: bool,
    up: bool,
    /// Reported a full reconciliation since it came up.
    reconciled: bool,
    myid: Option<String>,
    down_since: Option<Instant>,
    stop: CancellationToken,
}

/// The outcome of a role check, sent back to the decider's loop.
struct Checked {
    master: String,
    candidate: Candidate,
    is_master: bool,
    via: &'static str,
    at: Instant,
}

pub struct Decider {
    masters: BTreeMap<String, Entry>,
    /// `Some`: only these masters, with their labels.
    wanted: Option<BTreeMap<String, String>>,
    /// The names in `wanted`, shared with the links.
    wanted_names: Option<Arc<HashSet<String>>>,
    links: Vec<LinkState>,
    sentinel_auth: Auth,
    /// The drain coordinator's inbox (none when draining is off or in tests).
    drain: Option<mpsc::UnboundedSender<Signal>>,
    /// Connections to data nodes for role checks, shared with the check tasks.
    nodes: Arc<Nodes>,
    writer: TopologyWriter,
    events: Arc<EventLog>,
    version: u64,
    reachable: bool,
    /// Links send here; the decider holds a sender to hand to links it discovers.
    tx: mpsc::UnboundedSender<Observation>,
    rx: mpsc::UnboundedReceiver<Observation>,
    checks_tx: mpsc::UnboundedSender<Checked>,
    checks_rx: mpsc::UnboundedReceiver<Checked>,
    shutdown: CancellationToken,
}

impl Decider {
    pub fn new(
        config: &Config,
        writer: TopologyWriter,
        events: Arc<EventLog>,
        shutdown: CancellationToken,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let (checks_tx, checks_rx) = mpsc::unbounded_channel();
        let sentinels = config.sentinels().cloned();
        let wanted = config.masters.as_ref().map(|ms| {
            ms.iter().map(|m| (m.name.clone(), m.label.clone())).collect::<BTreeMap<_, _>>()
        });
        let wanted_names =
            wanted.as_ref().map(|w| Arc::new(w.keys().cloned().collect::<HashSet<_>>()));
        let mut decider = Self {
            masters: BTreeMap::new(),
            wanted,
            wanted_names,
            links: Vec::new(),
            sentinel_auth: sentinels.as_ref().map(|s| s.auth.clone()).unwrap_or_default(),
            nodes: Arc::new(Nodes::new(config.nodes.clone())),
            drain: None,
            writer,
            events,
            version: 0,
            reachable: false,
            tx,
            rx,
            checks_tx,
            checks_rx,
            shutdown,
        };
        for (name, label) in decider.wanted.clone().into_iter().flatten() {
            decider.masters.insert(name, Entry { label, ..Entry::default() });
        }
        for addr in sentinels.map(|s| s.addresses).unwrap_or_default() {
            decider.add_link(addr, true);
        }
        decider
    }

    /// Sends fence/drain signals to `tx` from now on.
    pub fn with_drain(mut self, tx: mpsc::UnboundedSender<Signal>) -> Self {
        self.drain = Some(tx);
        self
    }

    pub async fn run(mut self) {
        self.publish_snapshot();
        let mut housekeeping = tokio::time::interval(Duration::from_secs(5));
        loop {
            tokio::select! {
                Some(o) = self.rx.recv() => self.observe(o),
                Some(c) = self.checks_rx.recv() => self.checked(c),
                _ = housekeeping.tick() => {
                    self.forget_discovered();
                    self.nodes.prune(NODE_IDLE);
                }
                _ = self.shutdown.cancelled() => break,
            }
            self.publish_snapshot();
        }
        for link in &self.links {
            link.stop.cancel();
        }
    }

    fn add_link(&mut self, addr: HostPort, configured: bool) {
        let id = self.links.len();
        let stop = self.shutdown.child_token();
        let link = Link {
            id,
            endpoint: Endpoint::new(addr.host.clone(), addr.port, &self.sentinel_auth),
            masters: self.wanted_names.clone(),
            tx: self.tx.clone(),
            stop: stop.clone(),
        };
        metrics::gauge!(m::SENTINEL_UP, "sentinel" => addr.to_string()).set(0.0);
        self.links.push(LinkState {
            addr,
            configured,
            up: false,
            reconciled: false,
            myid: None,
            down_since: Some(Instant::now()),
            stop,
        });
        tokio::spawn(link.run());
    }

    fn observe(&mut self, observation: Observation) {
        match observation {
            Observation::Up { link, myid } => self.link_up(link, myid),
            Observation::Down { link, reason } => self.link_down(link, &reason),
            Observation::Report(report) => self.report(report),
            Observation::Failover { link, master, in_progress, aborted } => {
                if let Some(e) = self.masters.get_mut(&master) {
                    if in_progress {
                        // The leader will promote one of them: have a connection ready.
                        for replica in &e.replicas {
                            self.nodes.warm(std::net::SocketAddr::new(replica.ip, replica.port));
                        }
                        e.failover.insert(link)
                    } else {
                        e.failover.remove(&link)
                    };
                }
                if aborted {
                    self.revert(&master);
                    self.signal(Signal::Aborted { master });
                }
            }
            Observation::Promoting { link, master, replica, promoted, at } => {
                let Some(e) = self.masters.get_mut(&master) else { return };
                e.failover.insert(link);
                let old = e.published.as_ref().map(|p| p.candidate.node.clone());
                let new = promoted.as_ref().map(|(node, _)| node.clone());
                if let Some((node, epoch)) = promoted {
                    self.watch_promotion(&master, Candidate { node, epoch }, at);
                }
                if let Some(old) = old.filter(|o| !names(o, &replica)) {
                    self.signal(Signal::Promoting { master, old, new, at });
                }
            }
            Observation::NodeBack { master, node, .. } => {
                let published = self.masters.get(&master).and_then(|e| e.published.as_ref());
                if let Some(p) = published.filter(|p| p.candidate.node.addr() != node.addr()) {
                    let (published, epoch) = (p.candidate.node.clone(), p.candidate.epoch);
                    self.signal(Signal::Returning { master, node, published, epoch });
                }
            }
            Observation::Promoted { link, master, node, epoch, at } => {
                if let Some(e) = self.masters.get_mut(&master) {
                    e.failover.insert(link);
                }
                self.consider(&master, Candidate { node, epoch }, "promoted-slave", at);
            }
        }
    }

    fn link_up(&mut self, id: LinkId, myid: Option<String>) {
        let duplicate = myid.as_ref().is_some_and(|id2| {
            self.links.iter().enumerate().any(|(i, l)| i != id && l.myid.as_ref() == Some(id2))
        });
        let Some(link) = self.links.get_mut(id) else { return };
        if duplicate && !link.configured {
            // A discovered Sentinel that a configured address already reaches.
            link.stop.cancel();
            return;
        }
        link.up = true;
        link.reconciled = false;
        link.down_since = None;
        link.myid = myid;
        let name = link.addr.to_string();
        tracing::info!(sentinel = %name, "connected to Sentinel");
        metrics::gauge!(m::SENTINEL_UP, "sentinel" => name.clone()).set(1.0);
        self.events.push("sentinel_up", None, json!({ "sentinel": name }));
    }

    fn link_down(&mut self, id: LinkId, reason: &str) {
        let Some(link) = self.links.get_mut(id) else { return };
        let was_up = link.up;
        link.up = false;
        link.reconciled = false;
        link.down_since.get_or_insert_with(Instant::now);
        let name = link.addr.to_string();
        for entry in self.masters.values_mut() {
            entry.reports.remove(&id);
            entry.failover.remove(&id);
        }
        if was_up {
            tracing::warn!(sentinel = %name, %reason, "lost Sentinel");
            metrics::gauge!(m::SENTINEL_UP, "sentinel" => name.clone()).set(0.0);
            self.events.push("sentinel_down", None, json!({ "sentinel": name, "reason": reason }));
        } else {
            tracing::debug!(sentinel = %name, %reason, "Sentinel unreachable");
        }
    }

    fn report(&mut self, report: Report) {
        let Some(link) = self.links.get_mut(report.link) else { return };
        if !link.up {
            return;
        }
        let id = report.link;
        let seen: HashSet<String> = report.masters.iter().map(|m| m.name.clone()).collect();
        let asked = |name: &str| match &report.scope {
            Scope::All => true,
            Scope::Masters(names) => names.contains(name),
        };
        let full = report.scope == Scope::All;
        if full {
            link.reconciled = true;
        }
        for (name, entry) in self.masters.iter_mut() {
            if asked(name) && !seen.contains(name) {
                tracing::trace!(master = %name, "not reported by this Sentinel");
                entry.reports.remove(&id);
                entry.failover.remove(&id);
            }
        }
        for master in report.masters {
            self.master_report(id, master);
        }
        if full {
            self.drop_unmonitored(id, &seen);
            self.discover(&report.peers);
        }
    }

    fn master_report(&mut self, link: LinkId, report: MasterReport) {
        let wanted = match &self.wanted {
            Some(w) => w.get(&report.name).cloned(),
            None => Some(crate::topology::label_for(&report.name)),
        };
        let Some(label) = wanted else { return };
        let entry = self.masters.entry(report.name.clone()).or_default();
        entry.label = label;
        let candidate = Candidate { node: report.primary, epoch: report.epoch };
        entry.reports.insert(link, candidate.clone());
        // Reconciliation is authoritative for the flag: it also clears a lost +failover-end.
        if report.failover_in_progress {
            entry.failover.insert(link);
        } else {
            entry.failover.remove(&link);
        }
        let current = entry.published.as_ref().map(|p| p.candidate.epoch);
        if current.is_none_or(|e| report.epoch >= e) {
            entry.replicas = report.replicas;
        }
        self.consider(&report.name, candidate, "reconcile", Instant::now());
    }

    /// Forgets masters no reachable, reconciled Sentinel monitors any more (`-monitor`), when
    /// polestar serves every monitored master.
    fn drop_unmonitored(&mut self, link: LinkId, seen: &HashSet<String>) {
        if self.wanted.is_some() {
            return;
        }
        let all_reconciled = self.links.iter().filter(|l| l.up).all(|l| l.reconciled);
        let gone: Vec<String> = self
            .masters
            .iter()
            .filter(|(name, e)| !seen.contains(*name) && e.reports.is_empty())
            .map(|(name, _)| name.clone())
            .collect();
        if !all_reconciled {
            return;
        }
        for name in gone {
            self.masters.remove(&name);
            let by = self.links[link].addr.to_string();
            tracing::info!(master = %name, "no Sentinel monitors this master any more");
            self.events.push("master_removed", Some(&name), json!({ "sentinel": by }));
        }
    }

    fn discover(&mut self, peers: &[PeerRecord]) {
        for peer in peers {
            let known = self.links.iter().any(|l| {
                l.myid.as_deref() == Some(peer.runid.as_str())
                    || (l.addr.host == peer.addr.host && l.addr.port == peer.addr.port)
            });
            if !known {
                let addr = HostPort { host: peer.addr.host.clone(), port: peer.addr.port };
                tracing::info!(sentinel = %addr, "discovered Sentinel");
                self.add_link(addr, false);
            }
        }
    }

    fn forget_discovered(&mut self) {
        for link in self.links.iter_mut().filter(|l| !l.configured && !l.stop.is_cancelled()) {
            if link.down_since.is_some_and(|t| t.elapsed() > FORGET_DISCOVERED) {
                tracing::info!(sentinel = %link.addr, "forgetting unreachable discovered Sentinel");
                link.stop.cancel();
            }
        }
    }

    /// Applies the publication rule to a candidate from `via`.
    fn consider(&mut self, master: &str, candidate: Candidate, via: &'static str, at: Instant) {
        let majority = self.majority();
        let agreeing = self.agreeing(master, &candidate);
        let Some(entry) = self.masters.get_mut(master) else { return };
        let confirms = |p: &&mut Published| p.provisional && p.candidate == candidate;
        if let Some(p) = entry.published.as_mut().filter(confirms) {
            p.provisional = false;
            entry.before = None;
            tracing::debug!(%master, node = %candidate.node, via, "promotion confirmed");
            let (new, epoch) = (candidate.node.clone(), candidate.epoch);
            self.signal(Signal::Confirmed { master: master.to_string(), new, epoch });
            return self.consider(master, candidate, via, at);
        }
        if !newer(entry, &candidate) {
            return;
        }
        if agreeing >= majority {
            self.publish(master, candidate, "sentinels-agree", at);
            return;
        }
        if entry.checking.insert(candidate.clone()) {
            let (tx, master, nodes) =
                (self.checks_tx.clone(), master.to_string(), self.nodes.clone());
            tokio::spawn(async move {
                let role = nodes.role_once(candidate.node.addr(), ROLE_DEADLINE).await;
                let is_master = role.as_deref() == Some("master");
                let _ = tx.send(Checked { master, candidate, is_master, via, at });
            });
        }
    }

    fn checked(&mut self, c: Checked) {
        let Some(entry) = self.masters.get_mut(&c.master) else { return };
        entry.checking.remove(&c.candidate);
        if !c.is_master {
            tracing::debug!(master = %c.master, node = %c.candidate.node, "candidate does not answer ROLE master");
            return;
        }
        if newer(entry, &c.candidate) {
            self.publish(&c.master, c.candidate, c.via, c.at);
        }
    }

    fn publish(&mut self, master: &str, candidate: Candidate, via: &'static str, at: Instant) {
        let Some(entry) = self.masters.get_mut(master) else { return };
        let old = entry.published.as_ref().map(|p| p.candidate.node.clone());
        let epoch = candidate.epoch;
        let node = candidate.node.clone();
        if old.as_ref() == Some(&node) {
            if let Some(p) = entry.published.as_mut() {
                p.candidate.epoch = epoch;
            }
            tracing::debug!(%master, %node, epoch, "epoch confirmed");
            return;
        }
        let provisional = via == VIA_ROLE_POLL;
        let before = entry.published.take();
        entry.before = if provisional { before } else { None };
        entry.published = Some(Published { candidate, since: SystemTime::now(), provisional });
        // The snapshot goes out before anything else is done with the change.
        self.publish_snapshot();
        let latency = at.elapsed();
        let from = old.as_ref().map(ToString::to_string);
        tracing::info!(%master, from = from.as_deref().unwrap_or("-"), to = %node, epoch, via, latency_ms = latency.as_secs_f64() * 1e3, "switch");
        metrics::histogram!(m::PUBLISH_LATENCY).record(latency.as_secs_f64());
        if old.is_some() {
            metrics::counter!(m::PRIMARY_CHANGES, "master" => master.to_string()).increment(1);
        }
        let data = json!({
            "from": from, "to": node.to_string(), "hostname": node.hostname, "epoch": epoch,
            "via": via, "latency_ms": latency.as_secs_f64() * 1e3,
        });
        self.events.push("switch", Some(master), data);
        let master = master.to_string();
        self.signal(Signal::Flipped { master, old, new: node, epoch, provisional, at });
    }

    /// Tells the drain side; only ever for changes the Sentinels agreed on.
    fn signal(&mut self, signal: Signal) {
        if let Some(tx) = &self.drain {
            // The coordinator lives as long as the daemon; a send after it stopped is moot.
            let _ = tx.send(signal);
        }
    }

    /// Watches the replica the leader just told to become master, and flips the moment it
    /// answers `ROLE` master: a second before the leader's `+promoted-slave`, which waits for
    /// its next `INFO` of that replica.
    fn watch_promotion(&mut self, master: &str, candidate: Candidate, at: Instant) {
        let Some(entry) = self.masters.get_mut(master) else { return };
        if !newer(entry, &candidate) || !entry.checking.insert(candidate.clone()) {
            return;
        }
        let (tx, master, nodes) = (self.checks_tx.clone(), master.to_string(), self.nodes.clone());
        let stop = self.shutdown.clone();
        tokio::spawn(async move {
            let addr = candidate.node.addr();
            let mut is_master = false;
            while !is_master && at.elapsed() < PROMOTION_WATCH && !stop.is_cancelled() {
                is_master = nodes.role(addr, ROLE_DEADLINE).await.as_deref() == Some("master");
                if !is_master {
                    tokio::time::sleep(PROMOTION_POLL).await;
                }
            }
            let _ = tx.send(Checked { master, candidate, is_master, via: VIA_ROLE_POLL, at });
        });
    }

    /// Undoes a provisional publication when the failover it anticipated was aborted.
    fn revert(&mut self, master: &str) {
        let Some(entry) = self.masters.get_mut(master) else { return };
        if !entry.published.as_ref().is_some_and(|p| p.provisional) {
            return;
        }
        let undone = entry.published.take().map(|p| p.candidate.node.to_string());
        entry.published = entry.before.take();
        let back = entry.published.as_ref().map(|p| p.candidate.node.to_string());
        tracing::warn!(%master, undone = ?undone, back = ?back, "failover aborted: provisional primary withdrawn");
        self.events.push("revert", Some(master), json!({ "from": undone, "to": back }));
    }

    fn majority(&self) -> usize {
        self.links.iter().filter(|l| l.configured).count() / 2 + 1
    }

    /// Configured, reachable Sentinels whose latest report is exactly `candidate`.
    fn agreeing(&self, master: &str, candidate: &Candidate) -> usize {
        let Some(entry) = self.masters.get(master) else { return 0 };
        entry
            .reports
            .iter()
            .filter(|(l, c)| {
                *c == candidate && self.links.get(**l).is_some_and(|l| l.configured && l.up)
            })
            .count()
    }

    /// Builds the snapshot from the current state and publishes it if anything changed.
    fn publish_snapshot(&mut self) {
        let reachable = self.links.iter().any(|l| l.up);
        if reachable != self.reachable {
            self.reachable = reachable;
            let kind = if reachable { "ok" } else { "stale" };
            if !reachable {
                tracing::warn!("no Sentinel reachable: serving the last confirmed primaries");
            }
            self.events.push(kind, None, json!({ "sentinels_reachable": reachable }));
        }
        let current = self.writer.borrow().clone();
        // An unchanged master keeps its `Arc`: snapshots share what did not change.
        let masters: BTreeMap<String, Arc<Master>> = self
            .masters
            .iter()
            .map(|(name, e)| {
                let view = self.view(name, e);
                let master = match current.masters.get(name) {
                    Some(m) if **m == view => m.clone(),
                    _ => Arc::new(view),
                };
                (name.clone(), master)
            })
            .collect();
        if current.masters == masters && current.source_reachable == reachable && self.version > 0 {
            return;
        }
        self.version += 1;
        for master in masters.values() {
            record_gauges(master);
        }
        let snapshot = Snapshot { version: self.version, masters, source_reachable: reachable };
        self.writer.send_replace(Arc::new(snapshot));
    }

    fn view(&self, name: &str, e: &Entry) -> Master {
        let published = e.published.as_ref();
        let configured = self.links.iter().filter(|l| l.configured).count();
        let reachable = self.links.iter().filter(|l| l.configured && l.up).count();
        let agreeing = published.map(|p| self.agreeing(name, &p.candidate)).unwrap_or(0);
        let state = match () {
            _ if published.is_none() => MasterState::Unknown,
            _ if !self.links.iter().any(|l| l.up) => MasterState::Stale,
            _ if !e.failover.is_empty() => MasterState::Failover,
            _ => MasterState::Ok,
        };
        Master {
            name: name.to_string(),
            label: e.label.clone(),
            primary: published.map(|p| p.candidate.node.clone()),
            epoch: published.map(|p| p.candidate.epoch),
            since: published.map(|p| p.since),
            state,
            replicas: e.replicas.clone(),
            sentinels: SentinelCounts { configured, reachable, agreeing },
        }
    }
}

/// Whether `node` is the instance Sentinel reported as `addr` (by IP or announced hostname).
fn names(node: &Node, addr: &super::message::Addr) -> bool {
    node.port == addr.port
        && (node.ip.to_string() == addr.host || node.hostname.as_deref() == Some(&addr.host))
}

/// Whether `candidate` may replace what `entry` publishes: a higher epoch, or anything while
/// nothing is published.
fn newer(entry: &Entry, candidate: &Candidate) -> bool {
    match &entry.published {
        None => true,
        Some(p) => candidate.epoch > p.candidate.epoch,
    }
}

fn record_gauges(master: &Master) {
    let name = master.name.clone();
    metrics::gauge!(m::MASTER_EPOCH, "master" => name.clone())
        .set(master.epoch.unwrap_or(0) as f64);
    for state in MasterState::ALL {
        let value = if state == master.state { 1.0 } else { 0.0 };
        metrics::gauge!(m::MASTER_STATE, "master" => name.clone(), "state" => state.as_str())
            .set(value);
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::path::Path;

    use super::*;

    /// A decider whose three configured Sentinels are unreachable ports: links exist (and fail
    /// quietly); observations are injected by hand.
    fn decider() -> (Decider, crate::topology::TopologyReader) {
        let text = "sentinels: {addresses: ['127.0.0.1:1', '127.0.0.1:2', '127.0.0.1:3']}\n\
                    masters: [{name: m}]";
        let config = Config::parse(text, Path::new("/")).expect("valid test config");
        let (writer, reader) = crate::topology::channel();
        let events = Arc::new(EventLog::new());
        (Decider::new(&config, writer, events, CancellationToken::new()), reader)
    }

    fn node(port: u16) -> Node {
        Node { ip: IpAddr::V4(Ipv4Addr::LOCALHOST), port, hostname: None }
    }

    fn report(link: LinkId, port: u16, epoch: u64) -> Observation {
        let master = MasterReport {
            name: "m".into(),
            primary: node(port),
            epoch,
            failover_in_progress: false,
            replicas: Vec::new(),
        };
        Observation::Report(Report {
            link,
            scope: Scope::All,
            masters: vec![master],
            peers: Vec::new(),
        })
    }

    fn up(d: &mut Decider, link: LinkId) {
        d.observe(Observation::Up { link, myid: Some(format!("id{link}")) });
    }

    fn primary(d: &mut Decider) -> Option<(u16, u64)> {
        d.publish_snapshot();
        let snapshot = d.writer.borrow().clone();
        let m = snapshot.master("m")?;
        Some((m.primary.as_ref()?.port, m.epoch?))
    }

    #[tokio::test]
    async fn a_majority_of_configured_sentinels_publishes() {
        let (mut d, _r) = decider();
        for l in 0..3 {
            up(&mut d, l);
        }
        d.observe(report(0, 7001, 3));
        assert_eq!(primary(&mut d), None, "one Sentinel of three is not a majority");
        d.observe(report(1, 7001, 3));
        assert_eq!(primary(&mut d), Some((7001, 3)));
    }

    fn agreeing(d: &mut Decider) -> usize {
        d.publish_snapshot();
        let snapshot = d.writer.borrow().clone();
        snapshot.master("m").map_or(0, |m| m.sentinels.agreeing)
    }

    fn scoped(link: LinkId, master: &str) -> Observation {
        let scope = Scope::Masters([master.to_string()].into());
        Observation::Report(Report { link, scope, masters: Vec::new(), peers: Vec::new() })
    }

    #[tokio::test]
    async fn a_scoped_report_only_speaks_for_the_masters_it_asked_about() {
        let (mut d, _r) = decider();
        for l in 0..3 {
            up(&mut d, l);
            d.observe(report(l, 7001, 3));
        }
        assert_eq!(agreeing(&mut d), 3);
        d.observe(scoped(1, "other"));
        assert_eq!(agreeing(&mut d), 3, "a reconciliation of another master says nothing of m");
        d.observe(scoped(1, "m"));
        assert_eq!(agreeing(&mut d), 2, "Sentinel 1 asked about m no longer monitors it");
        assert_eq!(primary(&mut d), Some((7001, 3)), "the published primary stays");
    }

    #[tokio::test]
    async fn a_lower_epoch_is_never_published() {
        let (mut d, _r) = decider();
        for l in 0..3 {
            up(&mut d, l);
            d.observe(report(l, 7002, 5));
        }
        assert_eq!(primary(&mut d), Some((7002, 5)));
        for l in 0..3 {
            d.observe(report(l, 7001, 4));
        }
        assert_eq!(primary(&mut d), Some((7002, 5)), "all three report an older epoch");
        d.observe(Observation::Promoted {
            link: 0,
            master: "m".into(),
            node: node(7001),
            epoch: 5,
            at: Instant::now(),
        });
        assert_eq!(primary(&mut d), Some((7002, 5)), "an equal epoch is not higher");
    }

    #[tokio::test]
    async fn a_promotion_needs_the_node_to_confirm() {
        let (mut d, _r) = decider();
        for l in 0..3 {
            up(&mut d, l);
            d.observe(report(l, 7001, 1));
        }
        // Nothing listens on port 9: the role check fails and nothing is published.
        let at = Instant::now();
        d.observe(Observation::Promoted {
            link: 0,
            master: "m".into(),
            node: node(9),
            epoch: 2,
            at,
        });
        let checked = d.checks_rx.recv().await.expect("the check reports back");
        assert!(!checked.is_master);
        d.checked(checked);
        assert_eq!(primary(&mut d), Some((7001, 1)));
        // A confirmed check of a higher epoch is published.
        let candidate = Candidate { node: node(7003), epoch: 2 };
        d.checked(Checked { master: "m".into(), candidate, is_master: true, via: "test", at });
        assert_eq!(primary(&mut d), Some((7003, 2)));
    }

    #[tokio::test]
    async fn losing_every_sentinel_is_stale_and_keeps_the_primary() {
        let (mut d, r) = decider();
        for l in 0..3 {
            up(&mut d, l);
            d.observe(report(l, 7001, 1));
        }
        d.publish_snapshot();
        assert_eq!(r.borrow().master("m").map(|m| m.state), Some(MasterState::Ok));
        for l in 0..3 {
            d.observe(Observation::Down { link: l, reason: "test".into() });
        }
        d.publish_snapshot();
        let snapshot = r.borrow().clone();
        let m = snapshot.master("m").expect("configured master stays");
        assert_eq!(m.state, MasterState::Stale);
        assert_eq!(m.primary.as_ref().map(|p| p.port), Some(7001));
        assert!(!snapshot.source_reachable);
    }

    fn role_poll(d: &mut Decider, port: u16, epoch: u64) {
        let candidate = Candidate { node: node(port), epoch };
        let at = Instant::now();
        d.checked(Checked {
            master: "m".into(),
            candidate,
            is_master: true,
            via: VIA_ROLE_POLL,
            at,
        });
    }

    fn abort(d: &mut Decider) {
        let master = "m".to_string();
        d.observe(Observation::Failover { link: 0, master, in_progress: false, aborted: true });
    }

    #[tokio::test]
    async fn a_provisional_promotion_is_withdrawn_when_the_failover_aborts() {
        let (mut d, _r) = decider();
        for l in 0..3 {
            up(&mut d, l);
            d.observe(report(l, 7001, 1));
        }
        role_poll(&mut d, 7002, 2);
        assert_eq!(primary(&mut d), Some((7002, 2)), "flipped on the replica's own ROLE");
        abort(&mut d);
        assert_eq!(primary(&mut d), Some((7001, 1)), "the aborted failover is undone");
    }

    #[tokio::test]
    async fn a_confirmed_promotion_stays_after_a_late_abort() {
        let (mut d, _r) = decider();
        for l in 0..3 {
            up(&mut d, l);
            d.observe(report(l, 7001, 1));
        }
        role_poll(&mut d, 7002, 2);
        let at = Instant::now();
        d.observe(Observation::Promoted {
            link: 0,
            master: "m".into(),
            node: node(7002),
            epoch: 2,
            at,
        });
        abort(&mut d);
        assert_eq!(primary(&mut d), Some((7002, 2)));
    }

    #[tokio::test]
    async fn reports_of_down_sentinels_do_not_count() {
        let (mut d, _r) = decider();
        up(&mut d, 0);
        up(&mut d, 1);
        d.observe(report(0, 7001, 1));
        d.observe(Observation::Down { link: 0, reason: "test".into() });
        d.observe(report(0, 7001, 1));
        d.observe(report(1, 7001, 1));
        assert_eq!(primary(&mut d), None, "link 0 is down: its report is ignored");
    }
}
