//! The shell around the publication rule ([`super::core`]): one task that owns the state of
//! every master, turns what the links report into [`Evidence`], applies [`decide`] and carries
//! out the actions (the snapshot first, then logs, events, metrics and signals to the drain
//! side). Its only I/O is spawning: `ROLE` watches and warm-ups run as tasks that report back.
//!
//! Beside the loop and the carrying out of actions here: [`links`] (the configured Sentinels'
//! tasks, started by [`Decider::run`], never by the constructor), [`peers`] (discovered
//! Sentinels), [`downs`] (a primary's own down states) and [`view`] (what is published).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::core::{
    Action, Candidate, Cause, Evidence, Now, Publication, Quorum, SentinelId, State, decide,
};
use super::hello_acl;
use super::link::Link;
use super::message::{Addr, Down, PeerRecord};
use super::{MasterReport, Observation, Report, Scope};
use crate::config::{Auth, Config, HostPort};
use crate::events::{EventLog, Kind};
use crate::failover::Signal;
use crate::metrics as m;
use crate::node::{Endpoint, Nodes, Role};
use crate::phases::{self, Mark, Timeline};
use crate::readiness::Heard;
use crate::topology::{Master, MasterState, Node, Publisher, SentinelCounts, Withdrawn};

/// How long one `ROLE` answer of a watched node may take.
const ROLE_DEADLINE: Duration = Duration::from_millis(1000);
/// After the leader sent `SLAVEOF NO ONE`, the chosen replica's `ROLE` is asked this often...
const PROMOTION_POLL: Duration = Duration::from_millis(2);
/// ...for at most this long (Sentinel itself notices within about a second).
const PROMOTION_WATCH: Duration = Duration::from_secs(10);
/// A connection to a data node unused this long is closed (it is opened again when a failover
/// of its master starts).
const NODE_IDLE: Duration = Duration::from_secs(60);
/// Time passes for the rule this often ([`Evidence::Tick`]), and idle connections are closed.
const TICK: Duration = Duration::from_secs(1);

/// One master: its label and the rule's state.
#[derive(Default)]
struct Entry {
    label: String,
    state: State,
    /// `ROLE` watches in flight, so a target is watched once at a time.
    watching: HashSet<Candidate>,
    /// The peers each configured Sentinel lists for this master (shown, never trusted).
    peers: BTreeMap<SentinelId, Vec<PeerRecord>>,
    /// Those of them that are not configured (kept with `peers`), shown bounded.
    discovered: super::discovered::Discovered,
    /// The primary's down states already recorded.
    downs: Downs,
    /// The failover under way, for `polestar_failover_seconds`.
    phases: Timeline,
    /// The last provisional flip withdrawn, shown (for agents) while it is above what is
    /// published; a switch clears it.
    withdrawn: Option<Candidate>,
}

/// What a `ROLE` watch found, sent back to the decider's loop.
struct Checked {
    master: String,
    target: Candidate,
    role: Role,
    at: Instant,
}

pub struct Decider {
    masters: BTreeMap<String, Entry>,
    /// `Some`: only these masters, with their labels.
    wanted: Option<BTreeMap<String, String>>,
    /// The names in `wanted`, shared with the links.
    wanted_names: Option<Arc<HashSet<String>>>,
    links: Vec<LinkState>,
    quorum: Quorum,
    sentinel_auth: Auth,
    /// The drain coordinator's inbox (none when draining is off or in tests); the coordinator
    /// lives as long as the daemon, so a closed inbox only happens at shutdown.
    drain: Option<mpsc::UnboundedSender<Signal>>,
    /// Connections to data nodes for role watches, shared with the watch tasks.
    nodes: Arc<Nodes>,
    topology: Publisher,
    events: Arc<EventLog>,
    reachable: bool,
    /// Every link holds a clone of `tx`; the decider holds the receiver and one sender (for
    /// links it restarts), so the channel never closes while the decider runs.
    tx: mpsc::UnboundedSender<Observation>,
    rx: mpsc::UnboundedReceiver<Observation>,
    /// Every `ROLE` watch task holds a clone of `checks_tx` and sends once; the decider holds
    /// the receiver and a sender, so the channel never closes while it runs.
    checks_tx: mpsc::UnboundedSender<Checked>,
    checks_rx: mpsc::UnboundedReceiver<Checked>,
    shutdown: CancellationToken,
    /// Data nodes already asked whether their `default` user may publish Sentinel hellos.
    acl_checked: HashSet<std::net::SocketAddr>,
    /// The questions in flight (at most [`hello_acl::AT_ONCE`]) and the warning's interval.
    acl_checks: Arc<hello_acl::Checks>,
    /// The links' stop token (a child of `shutdown`), cancelled when the decider is dropped,
    /// also by a panic: a restarted decider does not leave its predecessor's links running.
    links_stop: CancellationToken,
    /// `Some` while one report is being read: the actions its masters' rules decided, carried
    /// out together once every master of the report is decided (see [`Decider::report`]).
    batch: Option<Vec<(String, Action)>>,
    /// Where the links leave what they read for the readiness poll.
    heard: Option<Heard>,
    /// The masters whose published view may have changed since the last snapshot.
    dirty: Dirty,
}

impl Drop for Decider {
    fn drop(&mut self) {
        self.links_stop.cancel();
    }
}

/// The configured masters, name to DNS label (`None`: every master the Sentinels monitor).
fn wanted(config: &Config) -> Option<BTreeMap<String, String>> {
    let masters = config.masters.as_ref()?;
    Some(masters.iter().map(|m| (m.name.clone(), m.label.clone())).collect())
}

/// An entry, with nothing known yet, for each configured master.
fn entries(wanted: Option<&BTreeMap<String, String>>) -> BTreeMap<String, Entry> {
    let entry = |(name, label): (&String, &String)| {
        (name.clone(), Entry { label: label.clone(), ..Entry::default() })
    };
    wanted.into_iter().flatten().map(entry).collect()
}

impl Decider {
    /// The decider of `config`'s Sentinels and masters; it spawns nothing: the links start when
    /// it runs. With `heard`, they leave their records of each master there for the readiness
    /// poll (given here: a `with_heard` after `new` once left every link without it, and the
    /// poll asked every Sentinel everything).
    pub fn new(
        config: &Config,
        topology: Publisher,
        events: Arc<EventLog>,
        heard: Option<Heard>,
        shutdown: CancellationToken,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let (checks_tx, checks_rx) = mpsc::unbounded_channel();
        let sentinels = config.sentinels().cloned();
        let wanted = wanted(config);
        let wanted_names = wanted.as_ref().map(|w| Arc::new(w.keys().cloned().collect()));
        let mut decider = Self {
            masters: entries(wanted.as_ref()),
            wanted,
            wanted_names,
            links: Vec::new(),
            quorum: Quorum::default(),
            sentinel_auth: sentinels.as_ref().map(|s| s.auth.clone()).unwrap_or_default(),
            nodes: Arc::new(Nodes::new(config.nodes.clone())),
            drain: None,
            topology,
            events,
            reachable: false,
            tx,
            rx,
            checks_tx,
            checks_rx,
            links_stop: shutdown.child_token(),
            shutdown,
            acl_checked: HashSet::new(),
            acl_checks: Arc::default(),
            batch: None,
            heard,
            dirty: Dirty::All,
        };
        decider.add_links(sentinels.map(|s| s.addresses).unwrap_or_default());
        decider
    }

    /// Sends fence/drain signals to `tx` from now on.
    pub fn with_drain(mut self, tx: mpsc::UnboundedSender<Signal>) -> Self {
        self.drain = Some(tx);
        self
    }

    pub async fn run(mut self) {
        self.start_links();
        self.publish_snapshot();
        let mut tick = tokio::time::interval(TICK);
        loop {
            tokio::select! {
                Some(o) = self.rx.recv() => self.observe(o),
                Some(c) = self.checks_rx.recv() => self.checked(c),
                _ = tick.tick() => self.tick(),
                _ = self.shutdown.cancelled() => break,
            }
            self.publish_snapshot();
        }
        self.join_links().await;
    }

    /// Once a second: the rule sees time pass (where it waits for it), idle node connections
    /// close, and a link task that ended on its own (only a panic ends one before shutdown) is
    /// restarted.
    fn tick(&mut self) {
        self.nodes.prune(NODE_IDLE);
        self.restart_ended_links();
        let timed = self.masters.iter().filter(|(_, e)| e.state.waits_for_time());
        let names: Vec<String> = timed.map(|(name, _)| name.clone()).collect();
        for name in names {
            self.apply(&name, Evidence::Tick);
        }
        self.check_hello_acls();
    }

    /// Asks every node of a master's lineage not asked yet whether its `default` user may
    /// publish a Sentinel hello, and warns if so (docs/operating.md gives the ACL that denies it).
    fn check_hello_acls(&mut self) {
        let lineage = self
            .masters
            .iter()
            .flat_map(|(name, e)| e.state.lineage.nodes().map(move |n| (name, n.addr())));
        // Cloned only when new: this runs every second over every master.
        let fresh = lineage.filter(|(_, a)| !self.acl_checked.contains(a));
        let fresh: Vec<_> = fresh.map(|(name, a)| (name.clone(), a)).collect();
        for (master, addr) in fresh {
            self.acl_checked.insert(addr);
            let (nodes, events, checks) =
                (self.nodes.clone(), self.events.clone(), self.acl_checks.clone());
            // Ends by itself: one question with a deadline, once a permit is free.
            let check = hello_acl::check(nodes, events, checks, master, addr);
            crate::supervise::detached("a hello ACL check", check);
        }
    }

    fn observe(&mut self, observation: Observation) {
        match observation {
            Observation::Up { from, myid } => self.link_up(from, myid),
            Observation::Down { from, reason } => self.link_down(from, &reason),
            Observation::NotSentinel { from, reason } => self.not_a_sentinel(from, &reason),
            Observation::Report(report) => self.report(report),
            Observation::NewEpoch { from, epoch } => self.new_epoch(from, epoch),
            Observation::FailoverStarted { from, master, coordinated, elected } => {
                self.apply(&master, Evidence::FailoverStarted { from, coordinated, elected });
            }
            Observation::FailoverEnded { from, master, aborted } => {
                self.apply(&master, Evidence::FailoverEnded { from, aborted });
            }
            Observation::Promoting { from, master, replica, target, at } => {
                if let Some(t) = &target {
                    self.new_epoch(from, t.epoch);
                }
                self.mark(&master, Mark::Selected { leader: from, at });
                self.apply(&master, Evidence::Promoting { from, replica, target, at });
            }
            Observation::NodeBack { from, master, node, converted_to } => {
                if let Some(converted_to) = converted_to {
                    let converted = Evidence::Converted { from, node: node.clone(), converted_to };
                    self.apply(&master, converted);
                }
                self.apply(&master, Evidence::NodeBack { from, node });
            }
            Observation::MasterDown { from, master, node, down } => {
                self.master_down(from, &master, &node, &down);
            }
            Observation::Promoted { from, master, target, at } => {
                self.new_epoch(from, target.epoch);
                self.apply(&master, Evidence::Promoted { from, target, at });
            }
        }
    }

    /// Runs the rule on one piece of evidence about `master` and carries out what it decides.
    fn apply(&mut self, master: &str, evidence: Evidence) {
        let Some(entry) = self.masters.get_mut(master) else { return };
        self.dirty.master(master);
        let state = std::mem::take(&mut entry.state);
        let now = Now { at: Instant::now(), wall: std::time::SystemTime::now() };
        let (state, actions) = decide(master, state, &self.quorum, evidence, now);
        entry.state = state;
        if let Some(batch) = &mut self.batch {
            batch.extend(actions.into_iter().map(|a| (master.to_string(), a)));
            return;
        }
        for action in actions {
            self.act(master, action, Published::Not);
        }
    }

    fn act(&mut self, master: &str, action: Action, published: Published) {
        match action {
            Action::Switched { old, new, cause, at } => {
                // The snapshot goes out before anything else is done with the change.
                if published == Published::Not {
                    self.publish_snapshot();
                }
                self.switched(master, old, new, cause, at);
            }
            Action::Withdrawn { undone, back, why } => self.withdrawn(master, undone, back, why),
            Action::Suspected(suspect) => {
                let (node, epoch) = (suspect.candidate.node.to_string(), suspect.candidate.epoch);
                tracing::error!(%master, refused = %node, epoch, reason = %suspect.reason, "suspect: primary refused");
                let data = json!({ "refused": node, "epoch": epoch, "reason": suspect.reason });
                self.events.push(Kind::Suspect, Some(master), data);
            }
            Action::Cleared => {
                tracing::info!(%master, "no longer suspect: the Sentinels agree on an acceptable primary");
                self.events.push(Kind::SuspectCleared, Some(master), json!({}));
            }
            Action::Signal(signal) => {
                if matches!(signal, Signal::Aborted { .. }) {
                    self.mark(master, Mark::Aborted);
                }
                self.signal(signal);
            }
            Action::WatchRole { target, at } => self.watch_role(master, target, at, false),
            Action::CheckRole { target } => self.watch_role(master, target, Instant::now(), true),
            Action::Warm(replicas) => {
                for r in replicas {
                    self.nodes.warm(std::net::SocketAddr::new(r.ip, r.port));
                }
            }
        }
    }

    /// After the snapshot that carries it is out: the entry and the failover timeline follow
    /// the switch from `old` to `new`, which is logged, counted and recorded as a `switch`
    /// event (`from`, `to`).
    fn switched(
        &mut self,
        master: &str,
        old: Option<Node>,
        new: Candidate,
        cause: Cause,
        at: Instant,
    ) {
        let (first, flipped) = (old.is_none(), Instant::now());
        if let Some(entry) = self.entry_mut(master) {
            let old_odown = old.as_ref().is_some_and(|o| entry.downs.odown_of(o));
            entry.downs.primary_is(&new.node);
            entry.withdrawn = None;
            self.mark(master, Mark::Flipped { at: flipped, first, old_odown });
        }
        let latency = at.elapsed();
        let from = old.as_ref().map(ToString::to_string);
        let (to, epoch, via) = (new.node, new.epoch, cause.as_str());
        let ms = crate::events::millis(latency);
        tracing::info!(%master, from = from.as_deref().unwrap_or("-"), to = %to, epoch, via, latency_ms = ms, "switch");
        metrics::histogram!(m::PUBLISH_LATENCY).record(latency.as_secs_f64());
        if from.is_some() {
            metrics::counter!(m::PRIMARY_CHANGES, "master" => master.to_string()).increment(1);
        }
        let data = json!({
            "from": from, "to": to.to_string(), "hostname": to.hostname, "epoch": epoch,
            "via": via, "latency_ms": ms,
        });
        self.events.push(Kind::Switch, Some(master), data);
    }

    /// A provisional flip to `undone` was withdrawn (`why`), `back` published again.
    fn withdrawn(&mut self, master: &str, undone: Candidate, back: Option<Candidate>, why: &str) {
        if let Some(entry) = self.entry_mut(master) {
            entry.withdrawn = Some(undone.clone());
        }
        let (undone, back) = (undone.node.to_string(), back.map(|b| b.node.to_string()));
        tracing::warn!(%master, %undone, back = back.as_deref().unwrap_or("-"), why, "provisional primary withdrawn");
        let data = json!({ "from": undone, "to": back, "why": why });
        self.events.push(Kind::Revert, Some(master), data);
    }

    /// Moves `master`'s failover timeline on and records the phases that ended.
    fn mark(&mut self, master: &str, mark: Mark) {
        let Some(entry) = self.entry_mut(master) else { return };
        let (timeline, ended) = phases::decide(entry.phases, mark);
        entry.phases = timeline;
        phases::record(&ended);
    }

    /// Tells the drain side; only ever for changes the configured Sentinels agreed on.
    fn signal(&mut self, signal: Signal) {
        if let Some(tx) = &self.drain {
            // The coordinator lives as long as the daemon; a send after it stopped is moot.
            let _ = tx.send(signal);
        }
    }

    /// Watches the replica a configured leader promotes, and reports the moment it answers
    /// `ROLE` master (a second before the leader's `+promoted-slave`, which waits for its next
    /// `INFO`), or what it last answered when the watch ends. `once`: one question, its answer
    /// reported whatever it is (the provisional primary, asked each tick whether it is still a
    /// master: an answer of replica withdraws the flip).
    fn watch_role(&mut self, master: &str, target: Candidate, at: Instant, once: bool) {
        let Some(entry) = self.entry_mut(master) else { return };
        if !entry.watching.insert(target.clone()) {
            return;
        }
        let (tx, master, nodes) = (self.checks_tx.clone(), master.to_string(), self.nodes.clone());
        let stop = self.shutdown.clone();
        // Ends by itself within PROMOTION_WATCH, or at shutdown.
        crate::supervise::detached("a ROLE watch", async move {
            let addr = target.node.addr();
            if once {
                let role = nodes.role(addr, ROLE_DEADLINE).await;
                // The decider holds the receiver for as long as it runs; after, this is moot.
                let _ = tx.send(Checked {
                    master,
                    target,
                    role: role.unwrap_or(Role::Other("no answer".into())),
                    at,
                });
                return;
            }
            let mut role = Role::Other("no answer".into());
            while !role.is_master() && at.elapsed() < PROMOTION_WATCH && !stop.is_cancelled() {
                role = nodes.role(addr, ROLE_DEADLINE).await.unwrap_or(role);
                if !role.is_master() {
                    tokio::time::sleep(PROMOTION_POLL).await;
                }
            }
            // The decider holds the receiver for as long as it runs; after, this is moot.
            let _ = tx.send(Checked { master, target, role, at });
        });
    }

    fn checked(&mut self, c: Checked) {
        let Some(entry) = self.entry_mut(&c.master) else { return };
        entry.watching.remove(&c.target);
        if !c.role.is_master() {
            tracing::debug!(master = %c.master, node = %c.target.node, role = ?c.role, "promoted replica never answered ROLE master");
        }
        self.apply(&c.master, Evidence::Role { target: c.target, role: c.role, at: c.at });
    }

    fn new_epoch(&mut self, from: SentinelId, epoch: u64) {
        let reached = self.quorum.epochs.entry(from).or_default();
        if epoch > *reached {
            *reached = epoch;
            // Whether a master is failing over reads these epochs (`failing_over_published`).
            self.dirty.all();
        }
    }

    /// A master's entry, to change: its published view is built again at the next snapshot.
    fn entry_mut(&mut self, name: &str) -> Option<&mut Entry> {
        let entry = self.masters.get_mut(name)?;
        self.dirty.master(name);
        Some(entry)
    }

    /// One Sentinel's answer about its masters. Their rules are all run first and what they
    /// decided is carried out after, with one snapshot published before any of it: a report of
    /// a thousand masters that each switch (every start-up) published a thousand snapshots of a
    /// thousand masters, one per switch, and woke every reader each time.
    fn report(&mut self, report: Report) {
        self.batch = Some(Vec::new());
        self.read_report(report);
        let actions = self.batch.take().unwrap_or_default();
        if actions.iter().any(|(_, a)| matches!(a, Action::Switched { .. })) {
            self.publish_snapshot();
        }
        for (master, action) in actions {
            self.act(&master, action, Published::Already);
        }
    }

    fn read_report(&mut self, report: Report) {
        let from = report.from;
        let Some(link) = self.links.get_mut(from) else { return };
        if !link.up {
            return;
        }
        let seen: HashSet<String> = report.masters.iter().map(|m| m.name.clone()).collect();
        let asked = |name: &str| match &report.scope {
            Scope::All => true,
            Scope::Masters(names) => names.contains(name),
        };
        let full = report.scope == Scope::All;
        if full {
            link.reconciled = true;
        }
        let gone: Vec<String> =
            self.masters.keys().filter(|n| asked(n) && !seen.contains(*n)).cloned().collect();
        for name in gone {
            tracing::trace!(master = %name, "not reported by this Sentinel");
            self.forget_peers(&name, from);
            self.apply(&name, Evidence::Gone { from });
        }
        for master in report.masters {
            self.master_report(from, master, report.with_peers);
        }
        if full {
            self.drop_unmonitored(from, &seen);
        }
    }

    fn master_report(&mut self, from: SentinelId, report: MasterReport, with_peers: bool) {
        let label = match &self.wanted {
            Some(w) => w.get(&report.name).cloned(),
            None => Some(crate::topology::label_for(&report.name)),
        };
        let Some(label) = label else { return };
        self.new_epoch(from, report.epoch);
        self.dirty.master(&report.name);
        let entry = self.masters.entry(report.name.clone()).or_default();
        entry.label = label;
        if with_peers && let Some(peers) = report.peers {
            self.set_peers(&report.name, from, peers);
        }
        let primary = Candidate { node: report.primary, epoch: report.epoch };
        let (failover_in_progress, replicas, followers) =
            (report.failover_in_progress, report.replicas, report.followers);
        let evidence =
            Evidence::Report { from, primary, failover_in_progress, replicas, followers };
        self.apply(&report.name, evidence);
    }

    /// Forgets masters no reachable, reconciled Sentinel monitors any more (`-monitor`), when
    /// polestar serves every monitored master.
    fn drop_unmonitored(&mut self, from: SentinelId, seen: &HashSet<String>) {
        if self.wanted.is_some() {
            return;
        }
        let all_reconciled = self.links.iter().filter(|l| l.up).all(|l| l.reconciled);
        if !all_reconciled {
            return;
        }
        let gone: Vec<String> = self
            .masters
            .iter()
            .filter(|(name, e)| !seen.contains(*name) && e.state.reports.is_empty())
            .map(|(name, _)| name.clone())
            .collect();
        for name in gone {
            self.masters.remove(&name);
            self.dirty.master(&name);
            record_discovered(&name, 0);
            let by = self.links[from].addr.to_string();
            tracing::info!(master = %name, "no Sentinel monitors this master any more");
            self.events.push(Kind::MasterRemoved, Some(&name), json!({ "sentinel": by }));
        }
    }
}

/// Whether the snapshot already holds the states an action comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Published {
    Not,
    Already,
}

/// Whether `node` is the instance a Sentinel named `a` (by address or announced hostname).
fn names(node: &Node, a: &Addr) -> bool {
    let by_name = node.hostname.as_deref() == Some(a.host.as_str());
    a.port == node.port && (by_name || a.host.parse() == Ok(node.ip))
}

mod downs;
mod links;
mod peers;
mod view;

use downs::Downs;
use links::LinkState;
use peers::record_discovered;
use view::Dirty;

#[cfg(test)]
mod tests;
