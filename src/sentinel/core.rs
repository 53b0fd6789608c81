//! The publication rule as a pure function: `decide(state, quorum, evidence) -> (state,
//! actions)`, per master, with no I/O. The decider (`super::decider`) is the thin shell
//! around it: it turns what the links and the `ROLE` watches report into [`Evidence`], and
//! carries out the [`Action`]s (publish the snapshot, signal the drain side, watch a node).
//!
//! The rule (docs/deciding.md; the reasons: docs/decisions.md D1 to D8):
//! - Only configured Sentinels are evidence. The type says so: every piece of evidence names
//!   a [`SentinelId`], the index of a configured address; a Sentinel polestar merely
//!   discovered has no id and never reaches this module.
//! - A primary is published when a configured Sentinel reports it with a config epoch higher
//!   than the published one, and either a majority of the configured Sentinels report exactly
//!   that node and epoch ([`Cause::Majority`]), or the node answers `ROLE` master while a
//!   configured leader promotes it with that epoch ([`Cause::RolePoll`], provisional, or
//!   [`Cause::Promoted`] after the leader's `+promoted-slave`). A lower or equal epoch is never
//!   published, and neither is an epoch beyond the reach of the configured Sentinels
//!   ([`Quorum::within_reach`]): one Sentinel's word cannot freeze polestar at epoch 999.
//! - A new primary was a replica: a change of primary is published only to a node of the
//!   master's [`State::lineage`] (a node a configured Sentinel showed replicating from a node
//!   of it, or a primary published before). Anyone who can `PUBLISH` on a data node can move
//!   every Sentinel to an unrelated node with a hello one epoch ahead; such a "primary" is
//!   refused, the last good one kept, and the master marked [`Suspect`] with the reason. Its
//!   `ROLE` is never asked (that would send it the node credentials).
//!   The lineage forgets a node no configured Sentinel has listed for [`LINEAGE_TTL`] while
//!   they report (an address Sentinel dropped may be reused by an unrelated node), and knows a
//!   node by its hostname too where the Sentinels announce hostnames (its IP may change).
//! - The fence, the drain and their undoing come out of the same transitions: a promotion
//!   signals [`Signal::Promoting`]; an abort, or a promotion that no flip follows within
//!   [`FENCE_WITHOUT_FLIP`], signals [`Signal::Aborted`] and withdraws a provisional flip.
//! - A provisional flip is withdrawn without any event, too (an event can be lost): when its
//!   node answers `ROLE` replica again (it is asked every tick while the flip is provisional),
//!   and when its leader is gone (or reports the old primary with no failover under way) while
//!   a majority reports the primary before it, for [`CONTRADICTED_FLIP`].
//! - The rule reads no clock: the shell passes [`Now`] with every piece of evidence.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime};

use super::message::Addr;
use crate::failover::Signal;
use crate::node::Role;
use crate::topology::{Node, Replica};

/// The index of a configured Sentinel address (`sentinels.addresses`).
pub type SentinelId = usize;

/// A promotion that no flip follows within this is given up: its fence is lifted (the leader
/// died, the failover stalled, an event was lost). A healthy promotion flips within ~1 s.
pub const FENCE_WITHOUT_FLIP: Duration = Duration::from_secs(5);

/// A provisional flip whose leader is gone while a majority of the configured Sentinels report
/// the primary before it is withdrawn once that has lasted this long: Sentinel's own wait
/// before it turns back a replica that claims master with no newer configuration (four hello
/// periods). A leader that lost only its link to polestar finishes the promotion, and the
/// others adopt it from its hello within about three seconds of the flip.
pub const CONTRADICTED_FLIP: Duration = Duration::from_secs(8);

/// A node of a master's lineage that no configured Sentinel has listed for this long, while a
/// majority of them report, is forgotten (see [`Lineage`]). Sentinel lists every replica it
/// knows, down ones included, until it is reset; a live replica it dropped is listed again
/// within seconds.
pub const LINEAGE_TTL: Duration = Duration::from_secs(600);

/// When the shell applies a piece of evidence: the rule reads no clock of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Now {
    pub at: Instant,
    /// The same moment on the wall clock, for `since`.
    pub wall: SystemTime,
}

/// A replica a configured Sentinel reports, with the primary the replica itself says it
/// replicates from (`master-host`/`master-port`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Follower {
    pub node: Node,
    pub upstream: Addr,
}

/// Why the master is marked suspect: the configured Sentinels name a primary polestar refuses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Suspect {
    pub candidate: Candidate,
    pub reason: String,
}

/// How many nodes a master's lineage remembers (the oldest are forgotten first).
const LINEAGE_CAP: usize = 256;

/// A primary as a configured Sentinel reports it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Candidate {
    pub node: Node,
    pub epoch: u64,
}

/// What is published for one master.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Publication {
    /// Nothing yet: DNS answers SERVFAIL, HTTP 503.
    Unknown,
    Confirmed {
        primary: Candidate,
        since: SystemTime,
    },
    /// Flipped on the promoted replica's own `ROLE` while `leader` promotes it, before the
    /// leader's `+promoted-slave` or a majority confirms it; `before` comes back on an abort.
    Provisional {
        primary: Candidate,
        since: SystemTime,
        leader: SentinelId,
        before: Box<Self>,
        /// Since when the Sentinels contradict it (its leader gone, a majority reporting
        /// `before`): withdrawn after [`CONTRADICTED_FLIP`].
        doubted: Option<Instant>,
    },
}

impl Publication {
    pub fn primary(&self) -> Option<&Candidate> {
        match self {
            Self::Unknown => None,
            Self::Confirmed { primary, .. } | Self::Provisional { primary, .. } => Some(primary),
        }
    }

    pub fn since(&self) -> Option<SystemTime> {
        match self {
            Self::Unknown => None,
            Self::Confirmed { since, .. } | Self::Provisional { since, .. } => Some(*since),
        }
    }

    /// Whether `candidate` may replace what is published: a strictly higher epoch.
    fn superseded_by(&self, candidate: &Candidate) -> bool {
        self.primary().is_none_or(|p| candidate.epoch > p.epoch)
    }

    fn node(&self) -> Option<&Node> {
        self.primary().map(|p| &p.node)
    }
}

/// A failover a configured leader runs, from its `+selected-slave` (or a later event, when
/// earlier ones were lost) until it ends, aborts, or gives up ([`FENCE_WITHOUT_FLIP`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Promotion {
    pub leader: SentinelId,
    /// The replica the leader chose, as it named it.
    pub replica: Addr,
    /// Resolved, with the failover's epoch, once the leader sent it `SLAVEOF NO ONE` (or
    /// announced `+promoted-slave`): its `ROLE` is watched from then on.
    pub target: Option<Candidate>,
    /// The leader announced `+promoted-slave`: a flip on its `ROLE` is confirmed at once.
    pub promoted: bool,
    /// The published primary the drain side was told to fence ([`Signal::Promoting`]).
    pub fenced: Option<Node>,
    pub started: Instant,
}

/// Everything the rule knows about one master.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct State {
    pub publication: Publication,
    /// The latest report of each reachable configured Sentinel that monitors this master.
    pub reports: BTreeMap<SentinelId, Candidate>,
    /// Configured Sentinels that report a failover of it in progress.
    pub failover: BTreeSet<SentinelId>,
    /// Configured Sentinels that run theirs as Valkey 9's coordinated failover (their word at
    /// its start): its promotion is not to be fenced ([`Signal::Promoting`]).
    pub coordinated: BTreeSet<SentinelId>,
    pub promotion: Option<Promotion>,
    /// The replicas a majority of the Sentinels' lists name (see [`State::agreed_replicas`]).
    pub replicas: Vec<Replica>,
    /// The replica list each reachable configured Sentinel reported last, at an epoch not
    /// below the published one.
    pub listed: BTreeMap<SentinelId, Vec<Replica>>,
    /// The only nodes a change of primary may go to, whose `ROLE` may be asked, and that may
    /// be warmed (see [`Lineage`]).
    pub lineage: Lineage,
    /// The configured Sentinels name a primary that was refused (see [`Suspect`]).
    pub suspect: Option<Suspect>,
    /// The configured leader whose `+elected-leader` fenced the published primary, until its
    /// `+selected-slave` (a [`Promotion`] then) or the end of its failover.
    pub elected: Option<SentinelId>,
}

impl Default for State {
    fn default() -> Self {
        Self {
            publication: Publication::Unknown,
            reports: BTreeMap::new(),
            failover: BTreeSet::new(),
            coordinated: BTreeSet::new(),
            promotion: None,
            replicas: Vec::new(),
            listed: BTreeMap::new(),
            lineage: Lineage::default(),
            suspect: None,
            elected: None,
        }
    }
}

impl State {
    /// Configured Sentinels whose latest report is exactly `candidate`.
    pub fn agreeing(&self, candidate: &Candidate) -> usize {
        self.reports.values().filter(|c| *c == candidate).count()
    }

    /// The replicas to publish: those named by `majority` of the Sentinels' lists (by all of
    /// them, when fewer lists are at hand), healthy when as many call them healthy, never the
    /// published primary. One Sentinel's list is not the answer: the configured Sentinels
    /// see a failover's old primary come and go as a replica at different moments, and
    /// following whichever reported last made replica answers flicker (and the Sentinel
    /// endpoint relay a `+sdown`/`-sdown` for every flicker).
    pub fn agreed_replicas(&self, majority: usize) -> Vec<Replica> {
        let lists: Vec<&Vec<Replica>> = self.listed.values().collect();
        let need = majority.min(lists.len()).max(1);
        let primary = self.publication.node().map(Node::addr);
        let same = |a: &Replica, b: &Replica| (a.ip, a.port) == (b.ip, b.port);
        let mut out: Vec<Replica> = Vec::new();
        for r in lists.iter().flat_map(|l| l.iter()) {
            let is_primary = primary == Some(std::net::SocketAddr::new(r.ip, r.port));
            if is_primary || out.iter().any(|o| same(o, r)) {
                continue;
            }
            let naming: Vec<&Replica> =
                lists.iter().filter_map(|l| l.iter().find(|o| same(o, r))).collect();
            if naming.len() >= need {
                let healthy = naming.iter().filter(|o| o.healthy).count() >= need;
                let up = naming.iter().filter(|o| !o.down).count() >= need;
                out.push(Replica { healthy, down: !up, ..r.clone() });
            }
        }
        out.sort_by_key(|r| (r.ip, r.port));
        out
    }

    /// Whether `node` may become the primary: nothing is published yet (there is no history
    /// to check against), or it is of the lineage.
    pub fn may_lead(&self, node: &Node) -> bool {
        self.publication.primary().is_none() || self.lineage.contains(node)
    }

    /// Adds the followers that replicate from a node of the lineage, until none is left to add
    /// (a replica of a replica joins once its upstream has).
    fn extend_lineage(&mut self, followers: &[Follower], now: Instant) {
        loop {
            let known = |f: &&Follower| {
                self.lineage.nodes().any(|n| names(n, &f.upstream))
                    && !self.lineage.contains(&f.node)
            };
            let Some(f) = followers.iter().find(known).cloned() else { return };
            self.lineage.descend(&f.node, now);
        }
    }

    /// The nodes the lineage keeps whatever the Sentinels list: what is published, what a
    /// withdrawal would bring back, and what is being promoted.
    fn kept(&self) -> Vec<&Node> {
        let before = match &self.publication {
            Publication::Provisional { before, .. } => before.node(),
            _ => None,
        };
        let target = self.promotion.as_ref().and_then(|p| p.target.as_ref()).map(|t| &t.node);
        [self.publication.node(), before, target].into_iter().flatten().collect()
    }

    /// Whether a failover *of the published primary* is under way: a Sentinel reports a
    /// failover in progress at an epoch above the published one (or at an epoch not yet
    /// known). Once polestar has published the promoted replica at the failover's epoch,
    /// ahead of Sentinel's `+switch-master`, the failover is over for clients even though the
    /// leader finishes it (reconfiguring the replicas) seconds later.
    pub fn failing_over_published(&self, quorum: &Quorum) -> bool {
        let Some(published) = self.publication.primary() else { return false };
        self.failover.iter().any(|s| quorum.epochs.get(s).is_none_or(|e| *e > published.epoch))
    }

    /// Whether [`Evidence::Tick`] can change anything: a promotion has a deadline
    /// ([`FENCE_WITHOUT_FLIP`]), and a provisional flip is checked every tick (its node's
    /// `ROLE`, how long it has been contradicted). The shell ticks only these, not a thousand
    /// idle masters a second; the lineage is pruned at each report instead.
    pub fn waits_for_time(&self) -> bool {
        self.promotion.is_some() || matches!(self.publication, Publication::Provisional { .. })
    }
}

/// How the configured Sentinels stand, across masters: the context every decision reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Quorum {
    /// The configured Sentinels the majority is counted over: every configured address that
    /// has not been shown to be something other than a Sentinel (it answered, and refused
    /// `SENTINEL`). An address that is merely unreachable still counts: a polestar started
    /// while it reaches one Sentinel of three must not follow that one alone.
    pub voters: BTreeSet<SentinelId>,
    /// The highest epoch each configured Sentinel has shown (`+new-epoch`, config epochs).
    pub epochs: BTreeMap<SentinelId, u64>,
}

impl Quorum {
    pub fn majority(&self) -> usize {
        self.voters.len() / 2 + 1
    }

    /// Whether `epoch` is within reach of the configured Sentinels: a majority of them has
    /// reached at least the epoch before it. A real failover's epoch is one more than the
    /// epoch the Sentinels share (they converge through each other's hellos): an elected
    /// leader's voters announce it as they vote, and `SENTINEL FAILOVER`, which skips the
    /// election, is at most one ahead of them. One Sentinel's claim beyond that (epoch 999) is
    /// not believed on its own word and a node's `ROLE`.
    pub fn within_reach(&self, epoch: u64) -> bool {
        let floor = epoch.saturating_sub(1);
        let at = self.voters.iter().filter(|s| self.epochs.get(s).is_some_and(|e| *e >= floor));
        at.count() >= self.majority()
    }
}

/// The nodes of one master: every node a configured Sentinel showed replicating from a node
/// of it, and every primary published. A node is known by its address, or by its hostname and
/// port where the Sentinels announce hostnames ([`Node::same_instance`]). Each remembers when
/// a configured Sentinel last listed it (as a replica or a follower) or it was published; one
/// not listed for [`LINEAGE_TTL`] while a majority of the Sentinels report is forgotten, so an
/// address the Sentinels dropped long ago (and that an unrelated node may hold now) does not
/// pass forever. At most [`LINEAGE_CAP`] nodes (the oldest are forgotten first).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lineage(Vec<(Node, Instant)>);

impl Lineage {
    pub fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.0.iter().map(|(n, _)| n)
    }

    pub fn contains(&self, node: &Node) -> bool {
        self.nodes().any(|n| n.same_instance(node))
    }

    /// Records `node` as one of the master's (once), listed `now`.
    fn descend(&mut self, node: &Node, now: Instant) {
        if self.name(node, now) {
            return;
        }
        if self.0.len() >= LINEAGE_CAP {
            self.0.remove(0);
        }
        self.0.push((node.clone(), now));
    }

    /// A configured Sentinel listed `node` `now` (or it is published): true if it is known. A
    /// node known by its hostname takes the address it has now.
    fn name(&mut self, node: &Node, now: Instant) -> bool {
        let Some(entry) = self.0.iter_mut().find(|(n, _)| n.same_instance(node)) else {
            return false;
        };
        *entry = (node.clone(), now);
        true
    }

    /// Forgets the nodes not listed for [`LINEAGE_TTL`], except `kept`.
    fn prune(&mut self, now: Instant, kept: &[&Node]) {
        self.0.retain(|(n, named)| {
            kept.iter().any(|k| k.same_instance(n))
                || now.saturating_duration_since(*named) < LINEAGE_TTL
        });
    }
}

/// One thing a configured Sentinel said, or one answer of a watched node.
#[derive(Clone, Debug)]
pub enum Evidence {
    /// A reconciliation: `from` reports `primary` (and the replicas it sees, and which of
    /// them say they replicate from where), and whether its record flags a failover in
    /// progress.
    Report {
        from: SentinelId,
        primary: Candidate,
        failover_in_progress: bool,
        replicas: Vec<Replica>,
        followers: Vec<Follower>,
    },
    /// `from` no longer monitors this master, or is unreachable: its report is void.
    Gone { from: SentinelId },
    /// `+try-failover` / `+elected-leader` (`elected`): `from` starts a failover or leads it;
    /// `coordinated`: as Valkey 9's coordinated one (`SENTINEL FAILOVER <master> COORDINATED`,
    /// its record's flag).
    FailoverStarted { from: SentinelId, coordinated: bool, elected: bool },
    /// `+selected-slave` (`target: None`) or `+failover-state-send-slaveof-noone` (`target`:
    /// the replica resolved, with the failover's epoch).
    Promoting { from: SentinelId, replica: Addr, target: Option<Candidate>, at: Instant },
    /// The leader's `+promoted-slave`, with the failover's epoch.
    Promoted { from: SentinelId, target: Candidate, at: Instant },
    /// `+failover-end` (`aborted: false`) or `-failover-abort-*`.
    FailoverEnded { from: SentinelId, aborted: bool },
    /// A node of the master is back or changed role (`-sdown`, `+convert-to-slave`, ...).
    NodeBack { from: SentinelId, node: Node },
    /// `+convert-to-slave`: `from` just told `node` to replicate from `converted_to` (a
    /// Sentinel that saw a replica claim master for seconds with no newer configuration turns
    /// it back).
    Converted { from: SentinelId, node: Node, converted_to: Addr },
    /// What a watched promotion target answered to `ROLE` (`at`: when the promotion event
    /// that started the watch reached polestar, for the latency).
    Role { target: Candidate, role: Role, at: Instant },
    /// Time passes (the shell ticks every second).
    Tick,
}

/// Why a primary was published.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// A majority of the configured Sentinels reports it.
    Majority,
    /// It answered `ROLE` master while a configured leader promotes it: provisional.
    RolePoll,
    /// It answered `ROLE` master after the leader's `+promoted-slave`.
    Promoted,
}

impl Cause {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Majority => "sentinels-agree",
            Self::RolePoll => "role-poll",
            Self::Promoted => "promoted-slave",
        }
    }
}

/// What the shell must do.
#[derive(Clone, Debug)]
pub enum Action {
    /// The published primary changed: publish the snapshot now, then log, count and record.
    Switched { old: Option<Node>, new: Candidate, cause: Cause, at: Instant },
    /// A provisional flip was withdrawn: `back` is published again; `why`: what withdrew it.
    Withdrawn { undone: Candidate, back: Option<Candidate>, why: &'static str },
    /// Tell the drain side.
    Signal(Signal),
    /// Poll `target`'s `ROLE` until it answers master or the watch ends; report back with
    /// [`Evidence::Role`].
    WatchRole { target: Candidate, at: Instant },
    /// Ask `target`, the provisional primary, `ROLE` once; report back with
    /// [`Evidence::Role`] (an answer of replica withdraws the flip).
    CheckRole { target: Candidate },
    /// Open connections to these replicas now, so the watch of the promoted one is one
    /// round trip.
    Warm(Vec<Replica>),
    /// The configured Sentinels name a primary that is refused (it was never a replica of the
    /// master): the published one stays, the master is marked suspect. Once per suspicion.
    Suspected(Suspect),
    /// The suspicion ended: the Sentinels agree on an acceptable primary again.
    Cleared,
}

/// The rule: the next state of one master and what to do about it, given the evidence and
/// the moment the shell applies it.
pub fn decide(
    master: &str,
    state: State,
    quorum: &Quorum,
    evidence: Evidence,
    now: Now,
) -> (State, Vec<Action>) {
    let mut d = Decision { master, quorum, state, actions: Vec::new(), now };
    match evidence {
        Evidence::Report { from, primary, failover_in_progress, replicas, followers } => {
            d.report(from, primary, failover_in_progress, replicas);
            d.state.extend_lineage(&followers, now.at);
            d.prune_lineage(now.at);
        }
        Evidence::Gone { from } => d.gone(from),
        Evidence::FailoverStarted { from, coordinated, elected } => {
            d.failover_started(from, coordinated);
            if elected {
                d.elected(from, coordinated);
            }
        }
        Evidence::Promoting { from, replica, target, at } => d.promoting(from, replica, target, at),
        Evidence::Promoted { from, target, at } => d.promoted(from, target, at),
        Evidence::FailoverEnded { from, aborted } => d.failover_ended(from, aborted),
        Evidence::NodeBack { from, node } => d.node_back(node, from),
        Evidence::Converted { from, node, converted_to } => d.converted(from, &node, &converted_to),
        Evidence::Role { target, role, at } => d.role(target, &role, at),
        Evidence::Tick => d.tick(now.at),
    }
    d.doubt();
    d.state.replicas = d.state.agreed_replicas(quorum.majority());
    (d.state, d.actions)
}

/// One decision in the making.
struct Decision<'a> {
    master: &'a str,
    quorum: &'a Quorum,
    state: State,
    actions: Vec<Action>,
    now: Now,
}

impl Decision<'_> {
    fn report(
        &mut self,
        from: SentinelId,
        primary: Candidate,
        failover_in_progress: bool,
        r: Vec<Replica>,
    ) {
        for replica in &r {
            let node =
                Node { ip: replica.ip, port: replica.port, hostname: replica.hostname.clone() };
            self.state.lineage.name(&node, self.now.at);
        }
        if self.state.publication.primary().is_none_or(|p| primary.epoch >= p.epoch) {
            self.state.listed.insert(from, r);
        }
        self.state.reports.insert(from, primary.clone());
        // Reconciliation is authoritative for the flag: it also clears a lost +failover-end.
        if failover_in_progress {
            self.state.failover.insert(from);
        } else {
            self.state.failover.remove(&from);
            self.state.coordinated.remove(&from);
        }
        self.majority(primary);
    }

    /// Publishes (or confirms) `candidate` if a majority of the configured Sentinels reports it.
    fn majority(&mut self, candidate: Candidate) {
        if self.state.agreeing(&candidate) < self.quorum.majority() {
            return;
        }
        if self.state.publication.node() == Some(&candidate.node) {
            self.clear_suspect();
        }
        if self.is_provisional(&candidate) {
            return self.confirm();
        }
        if !self.state.publication.superseded_by(&candidate) {
            return;
        }
        if self.state.publication.node() == Some(&candidate.node) {
            return self.raise_epoch(candidate);
        }
        self.switch(candidate, Cause::Majority, self.now.at);
    }

    fn gone(&mut self, from: SentinelId) {
        self.state.reports.remove(&from);
        self.state.listed.remove(&from);
        self.state.failover.remove(&from);
        self.state.coordinated.remove(&from);
    }

    fn failover_started(&mut self, from: SentinelId, coordinated: bool) {
        self.state.failover.insert(from);
        if coordinated {
            self.state.coordinated.insert(from);
        } else {
            self.state.coordinated.remove(&from);
        }
        // The leader will promote one of them: have a connection ready (to the master's own
        // nodes only: a connection carries the node credentials).
        let ours = self.state.replicas.iter().filter(|r| {
            let node = Node { ip: r.ip, port: r.port, hostname: r.hostname.clone() };
            self.state.may_lead(&node)
        });
        self.actions.push(Action::Warm(ours.cloned().collect()));
        // And the fence its promotion calls for, on the primary it will replace.
        if let Some(primary) = self.state.publication.node().cloned() {
            let master = self.master.to_string();
            self.actions.push(Action::Signal(Signal::FailoverStarted { master, primary }));
        }
    }

    /// The leader won its election: it selects the replica at its next timer tick and sends it
    /// `SLAVEOF NO ONE` at the tick after. The published primary is fenced now, two ticks
    /// before the promotion rather than the one `+selected-slave` leaves, so a fence that
    /// reaches the node late (a loaded host) still lands before the replica takes writes
    /// (docs/decisions.md D9). Only a confirmed primary that the leader itself reports as the
    /// master: the replica it will choose is then certainly another node. An abort lifts the
    /// fence; a leader that goes silent leaves it to lapse (`FENCE_HOLD`).
    fn elected(&mut self, from: SentinelId, coordinated: bool) {
        let Publication::Confirmed { primary, .. } = &self.state.publication else { return };
        let leader_names_it = self.state.reports.get(&from).is_some_and(|r| r.node == primary.node);
        if self.state.promotion.is_some() || !leader_names_it {
            return;
        }
        self.state.elected = Some(from);
        let (master, old, at) = (self.master.to_string(), primary.node.clone(), self.now.at);
        let fence = Signal::Promoting { master, old, new: None, at, coordinated };
        self.actions.push(Action::Signal(fence));
    }

    fn promoting(
        &mut self,
        from: SentinelId,
        replica: Addr,
        target: Option<Candidate>,
        at: Instant,
    ) {
        self.state.failover.insert(from);
        self.state.elected = None;
        let fenced = self.state.publication.node().filter(|n| !names(n, &replica)).cloned();
        let promotion = self.state.promotion.take().filter(|p| p.leader == from);
        let promotion = promotion.unwrap_or_else(|| Promotion {
            leader: from,
            replica: replica.clone(),
            target: None,
            promoted: false,
            fenced: None,
            started: at,
        });
        let mut promotion = Promotion { replica, ..promotion };
        if let Some(old) = fenced.clone() {
            let new = target.as_ref().map(|t| t.node.clone());
            let master = self.master.to_string();
            promotion.fenced = Some(promotion.fenced.unwrap_or_else(|| old.clone()));
            let coordinated = self.state.coordinated.contains(&from);
            let promoting = Signal::Promoting { master, old, new, at, coordinated };
            self.actions.push(Action::Signal(promoting));
        }
        if let Some(target) = target {
            self.watch(&target, at);
            promotion.target = Some(target);
        }
        self.state.promotion = Some(promotion);
    }

    fn promoted(&mut self, from: SentinelId, target: Candidate, at: Instant) {
        self.state.failover.insert(from);
        if self.is_provisional(&target) {
            return self.confirm();
        }
        let replica = Addr { host: target.node.ip.to_string(), port: target.node.port };
        let promotion = self.state.promotion.take().filter(|p| p.leader == from);
        let promotion = promotion.unwrap_or(Promotion {
            leader: from,
            replica,
            target: None,
            promoted: false,
            fenced: None,
            started: at,
        });
        self.watch(&target, at);
        let target = Some(target);
        self.state.promotion = Some(Promotion { target, promoted: true, ..promotion });
    }

    /// Asks the shell to watch `target`'s `ROLE`, when it could be published at all.
    fn watch(&mut self, target: &Candidate, at: Instant) {
        let fresh = self.state.publication.superseded_by(target);
        if !self.state.may_lead(&target.node) {
            return self.suspect(target.clone());
        }
        if fresh && self.state.publication.node() != Some(&target.node) {
            self.actions.push(Action::WatchRole { target: target.clone(), at });
        }
    }

    /// The watched target answered: flip to it if a configured leader promotes it, and the
    /// epoch is new and within the Sentinels' reach.
    fn role(&mut self, target: Candidate, role: &Role, at: Instant) {
        if *role == Role::Replica && self.is_provisional(&target) {
            // The node the flip named is a replica again: whoever turned it back (an abort, a
            // Sentinel's conversion) said so in an event polestar may never have heard.
            return self.abort(true, "replica-again");
        }
        let Some(promotion) = &self.state.promotion else { return };
        let ours = promotion.target.as_ref() == Some(&target);
        let fresh = self.state.publication.superseded_by(&target)
            && self.state.publication.node() != Some(&target.node);
        if !(ours && fresh && role.is_master() && self.quorum.within_reach(target.epoch)) {
            return;
        }
        let cause = if promotion.promoted { Cause::Promoted } else { Cause::RolePoll };
        self.switch(target, cause, at);
    }

    fn failover_ended(&mut self, from: SentinelId, aborted: bool) {
        self.state.failover.remove(&from);
        self.state.coordinated.remove(&from);
        let fenced_at_election = self.state.elected.take_if(|l| *l == from).is_some();
        let leads = self.state.promotion.as_ref().is_some_and(|p| p.leader == from);
        let provisional_by = match &self.state.publication {
            Publication::Provisional { leader, .. } => Some(*leader),
            _ => None,
        };
        if !aborted {
            // `+failover-end` (or `-for-timeout`, while reconfiguring the replicas) comes after
            // the promotion succeeded: it confirms a flip its leader's lost `+promoted-slave`
            // would have.
            if provisional_by == Some(from) {
                self.confirm();
            }
            if leads {
                self.state.promotion = None;
            }
            return;
        }
        if leads || provisional_by == Some(from) || fenced_at_election {
            // The abort names no epoch. When another leader's promotion has replaced this
            // one's (a newer attempt, run side by side until the higher epoch wins), it ends
            // only the older attempt: its flip is withdrawn, but a `CLIENT UNPAUSE` would
            // lift the pauses other polestars hold for the newer failover, which did not
            // abort. What was fenced is left to lapse, and the newer promotion stays watched.
            let newer = self.state.promotion.take_if(|p| p.leader != from);
            self.abort(newer.is_some(), "aborted");
            self.state.promotion = newer;
        }
    }

    /// Gives the failover up: withdraws a provisional flip and lifts what was started for it.
    /// `gave_up`: no Sentinel aborted the failover under way (polestar's own timeout, a
    /// withdrawal, an older attempt's abort; see [`Signal::Aborted`]).
    fn abort(&mut self, gave_up: bool, why: &'static str) {
        self.state.promotion = None;
        self.state.elected = None;
        let current = std::mem::replace(&mut self.state.publication, Publication::Unknown);
        self.state.publication = match current {
            Publication::Provisional { primary, before, .. } => {
                let back = before.primary().cloned();
                self.actions.push(Action::Withdrawn { undone: primary, back, why });
                *before
            }
            other => other,
        };
        let master = self.master.to_string();
        self.actions.push(Action::Signal(Signal::Aborted { master, gave_up }));
    }

    /// A node is back: a returning old primary is fenced, drained and demoted, but only on the
    /// word of a Sentinel that reports what is published (address and epoch) while a majority
    /// does: a Sentinel that missed a failover (a healed partition) names the new primary as
    /// a replica of the old one before it learns better. The published primary, a promotion
    /// target and a node that never was the master's are never demoted.
    fn node_back(&mut self, node: Node, from: SentinelId) {
        let Publication::Confirmed { primary, .. } = &self.state.publication else { return };
        let promoting = self.state.promotion.as_ref();
        let is_target = promoting.and_then(|p| p.target.as_ref()).is_some_and(|t| t.node == node);
        let quiet = self.state.failover.is_empty() && promoting.is_none();
        let current = self.state.reports.get(&from) == Some(primary)
            && self.state.agreeing(primary) >= self.quorum.majority();
        let ours = self.state.lineage.contains(&node);
        if primary.node.addr() == node.addr() || is_target || !quiet || !current || !ours {
            return;
        }
        let (published, epoch) = (primary.node.clone(), primary.epoch);
        let master = self.master.to_string();
        self.actions.push(Action::Signal(Signal::Returning { master, node, published, epoch }));
    }

    /// The Sentinels turn the provisionally published node back into a replica of the
    /// primary before it: the leader never finished (it died before `+promoted-slave`, so no
    /// Sentinel ever learned the new configuration) and the others convert the node back once
    /// it has claimed master for a while. The flip is withdrawn, on the word of a Sentinel
    /// other than the leader whose own report is that primary at its epoch while a majority
    /// agrees: one stale or lying Sentinel cannot undo a flip. Nobody aborted, so the fence
    /// is left to lapse (`gave_up`) rather than lifted under another polestar.
    fn converted(&mut self, from: SentinelId, node: &Node, converted_to: &Addr) {
        let Publication::Provisional { primary, leader, before, .. } = &self.state.publication
        else {
            return;
        };
        let Some(back) = before.primary() else { return };
        let speaker = self.state.reports.get(&from) == Some(back);
        let majority = self.state.agreeing(back) >= self.quorum.majority();
        let undone = primary.node.addr() == node.addr() && names(&back.node, converted_to);
        if undone && *leader != from && speaker && majority {
            self.abort(true, "converted");
        }
    }

    /// Time passes: the lineage forgets what the Sentinels stopped listing, a provisional flip
    /// the Sentinels contradict long enough is withdrawn (else its node is asked `ROLE`
    /// again), and a promotion that no flip followed in time is given up (its fence lifted).
    /// Forgets the lineage nodes no configured Sentinel listed for [`LINEAGE_TTL`], while a
    /// majority of them report (a lineage is never forgotten for want of reports).
    fn prune_lineage(&mut self, now: Instant) {
        if self.state.listed.len() >= self.quorum.majority() {
            let kept: Vec<Node> = self.state.kept().into_iter().cloned().collect();
            self.state.lineage.prune(now, &kept.iter().collect::<Vec<_>>());
        }
    }

    fn tick(&mut self, now: Instant) {
        if let Publication::Provisional { primary, doubted, .. } = &self.state.publication {
            if doubted.is_some_and(|t| now.saturating_duration_since(t) >= CONTRADICTED_FLIP) {
                return self.abort(true, "contradicted");
            }
            self.actions.push(Action::CheckRole { target: primary.clone() });
        }
        let Some(p) = &self.state.promotion else { return };
        let flipped = matches!(&self.state.publication,
            Publication::Provisional { primary, .. } if p.target.as_ref() == Some(primary));
        if !flipped && now.saturating_duration_since(p.started) >= FENCE_WITHOUT_FLIP {
            if p.fenced.is_some() {
                self.abort(true, "no-flip");
            } else {
                self.state.promotion = None;
            }
        }
    }

    /// Starts or stops the clock of a provisional flip the Sentinels contradict: its leader
    /// is gone (no report: its link is lost, or it stopped monitoring the master) or reports
    /// the primary before the flip with no failover under way (a lost abort), while a
    /// majority of the configured Sentinels report that primary at its epoch.
    fn doubt(&mut self) {
        let contradicted = self.contradicted();
        if let Publication::Provisional { doubted, .. } = &mut self.state.publication {
            *doubted = if contradicted { Some(doubted.unwrap_or(self.now.at)) } else { None };
        }
    }

    fn contradicted(&self) -> bool {
        let Publication::Provisional { leader, before, .. } = &self.state.publication else {
            return false;
        };
        let Some(back) = before.primary() else { return false };
        let gone = match self.state.reports.get(leader) {
            None => true,
            Some(said) => said == back && !self.state.failover.contains(leader),
        };
        gone && self.state.agreeing(back) >= self.quorum.majority()
    }

    fn is_provisional(&self, candidate: &Candidate) -> bool {
        matches!(&self.state.publication,
            Publication::Provisional { primary, .. } if primary == candidate)
    }

    /// Confirms the provisional flip: the old primary may be demoted.
    fn confirm(&mut self) {
        let current = std::mem::replace(&mut self.state.publication, Publication::Unknown);
        let Publication::Provisional { primary, since, .. } = current else {
            self.state.publication = current;
            return;
        };
        let (master, new, epoch) = (self.master.to_string(), primary.node.clone(), primary.epoch);
        self.actions.push(Action::Signal(Signal::Confirmed { master, new, epoch }));
        self.state.publication = Publication::Confirmed { primary, since };
        // The promotion is done: a late abort of it changes nothing any more.
        self.state.promotion = None;
    }

    /// The published node stays; a majority reports it at a higher epoch.
    fn raise_epoch(&mut self, candidate: Candidate) {
        if let Publication::Confirmed { primary, .. } = &mut self.state.publication {
            primary.epoch = candidate.epoch;
        }
    }

    fn switch(&mut self, new: Candidate, cause: Cause, at: Instant) {
        if !self.state.may_lead(&new.node) {
            return self.suspect(new);
        }
        self.clear_suspect();
        self.state.lineage.descend(&new.node, self.now.at);
        let old = self.state.publication.node().cloned();
        let since = self.now.wall;
        let primary = new.clone();
        let leader = self.state.promotion.as_ref().map(|p| p.leader);
        let before = std::mem::replace(&mut self.state.publication, Publication::Unknown);
        self.state.publication = match (cause, leader) {
            (Cause::RolePoll, Some(leader)) => {
                // Over another provisional flip, the confirmed one before it is what comes back.
                let before = match before {
                    Publication::Provisional { before, .. } => before,
                    confirmed => Box::new(confirmed),
                };
                Publication::Provisional { primary, since, leader, before, doubted: None }
            }
            _ => Publication::Confirmed { primary, since },
        };
        let provisional = matches!(self.state.publication, Publication::Provisional { .. });
        if !provisional {
            // A confirmed switch ends the promotion that led to it.
            self.state.promotion = None;
        }
        self.actions.push(Action::Switched { old: old.clone(), new: new.clone(), cause, at });
        let (master, epoch, new) = (self.master.to_string(), new.epoch, new.node);
        let flipped = Signal::Flipped { master, old, new, epoch, provisional, at };
        self.actions.push(Action::Signal(flipped));
    }
}

impl Decision<'_> {
    /// Refuses `candidate` (never a replica of the master) and marks the master suspect.
    fn suspect(&mut self, candidate: Candidate) {
        if self.state.suspect.as_ref().is_some_and(|s| s.candidate == candidate) {
            return;
        }
        let published = self.state.publication.node().map_or("-".into(), ToString::to_string);
        let reason = format!(
            "the Sentinels name {} (epoch {}) as the primary, but no configured Sentinel ever \
             showed it replicating from this master: a forged hello? {published} stays \
             published; deny application users PUBLISH on __sentinel__:*",
            candidate.node, candidate.epoch
        );
        let suspect = Suspect { candidate, reason };
        self.state.suspect = Some(suspect.clone());
        self.actions.push(Action::Suspected(suspect));
    }

    fn clear_suspect(&mut self) {
        if self.state.suspect.take().is_some() {
            self.actions.push(Action::Cleared);
        }
    }
}

/// Whether `node` is the instance Sentinel reported as `addr` (by IP or announced hostname).
fn names(node: &Node, addr: &Addr) -> bool {
    node.port == addr.port
        && (node.ip.to_string() == addr.host || node.hostname.as_deref() == Some(&addr.host))
}

#[cfg(test)]
mod tests;
