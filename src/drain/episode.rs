//! One old (or returning) primary of one master, from the first signal about it to the end of
//! its window: the fence loop and the drain loop, run side by side in one task per node so that
//! a slow or dead node delays nothing but itself.
//!
//! The fence loop runs every `interval`; its rules are one pure transition,
//! [`phase::step`] (where the fence stands, the orders, what the node answered, the time:
//! the next phase and the I/O to do), table-tested, and the loop is the shell that does the
//! I/O. Before the promotion is confirmed it fences: while the
//! node answers `ROLE` master it is paused for [`pause_length`] (longer than the gap between
//! renewals, short enough to lapse on its own soon after a polestar crash), renewed until
//! `fence_until` ([`FENCE_HOLD`] after the latest signal of the failover). Once the promotion is
//! confirmed (`demote`), it demotes: it renews the pause for as long as the demotion may take
//! ([`demotion_pause`]: the loop renews nothing while it waits on the new primary), kills the
//! clients the pause holds and sends `REPLICAOF <new primary>` in one transaction, and lifts
//! the pause only once `ROLE` confirms the node is a replica. From then on the node refuses every write (`READONLY`), whatever address its
//! clients hold, so it never acknowledges a write that will be lost. A node that does not
//! answer is retried every `interval` until the window ends; when it answers (a hung primary
//! resumed) it is demoted at once.
//!
//! Why demote rather than hold the pause: a paused node also holds Sentinel's hello `PUBLISH`
//! and every command Sentinel pipelines behind it on that link, including the `REPLICAOF` that
//! demotes it. Measured with Redis 7.0: a pause renewed every 250 ms left the old primary a
//! master 52 s after a planned failover. Demoting it ourselves ends the pause within
//! milliseconds of the confirmation, and Sentinel's own `REPLICAOF` later changes nothing.
//!
//! When the pause is lifted, and why that is safe beside other polestars (a `CLIENT UNPAUSE`
//! lifts every client's pause, and `CLIENT PAUSE` only ever extends one): only once the node is
//! a replica (it needs no fence any more, for anyone), on an abort or when the node is
//! published again (the Sentinels agreed it stays the primary). A fence that no confirmation
//! follows is never lifted: polestar stops renewing it and it lapses by itself, so a fence
//! another polestar still renews stays. If the node cannot be demoted (the new primary does not
//! answer `ROLE` master), the fence ends at `fence_until` as it did before demotion existed:
//! the clients are killed in the transaction that lifts the pause.
//!
//! The drain loop runs once per drain order (a flip, a returning node): a first pass at once,
//! then a sweep every `interval` and one exactly at the cutoff (`order.at + grace`). Every pass
//! kills the clients that may have connected before the cutoff. After the cutoff, until the
//! window ends, every [`STALE_SWEEP`] it kills the clients whose last command is a write: on a
//! demoted node they got `READONLY`, so they hold a stale cached or pinned address and must
//! resolve again; readers stay. A node first reached after the cutoff gets one pass that spares
//! the clients whose `age` proves they connected after it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};

mod phase;

use super::Shared;
use super::killer::{Reason, Scope, drain, record, select, stale_left};
use super::node::{DEMOTION_DEADLINES, NodeError, NodeLink, Role};
use crate::topology::Node;
use phase::{Action, Demotion, Phase, Probe, step};

/// How long a fence lasts after the latest signal of its failover (a promotion, a provisional
/// flip, a confirmation) when no demotion ends it first: a fence that no promotion follows
/// (the leader died, an event was lost) is lifted within seconds, not held for the window.
pub const FENCE_HOLD: Duration = Duration::from_secs(5);

/// How often, at most, a demoted node is swept for clients that still write to it.
pub const STALE_SWEEP: Duration = Duration::from_secs(1);

/// What the coordinator wants of one episode. It only ever replaces the whole value; the
/// episode acts on the latest one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Orders {
    /// Grows with every change the coordinator makes.
    pub generation: u64,
    /// Set by the episode, under the channel's lock, when it ends on orders it has seen in
    /// full: the coordinator then starts a new episode instead of sending to this one.
    pub closed: bool,
    /// The end of the window: nothing is fenced, swept or demoted after it.
    pub until: Instant,
    /// No pause is set or renewed after this.
    pub fence_until: Instant,
    pub drain: Option<DrainOrder>,
    /// The new primary the flip (or the return) named.
    pub target: Option<Node>,
    /// The promotion of this primary is confirmed: demote the node to it.
    pub demote: Option<Node>,
    /// Lift the pause and end now.
    pub stop: Option<Stop>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainOrder {
    /// The flip (or the return); the cutoff is `at + grace`.
    pub at: Instant,
    pub reason: Reason,
    /// Drain only if the node still answers `ROLE` master (a returning node).
    pub only_if_master: bool,
    /// A flip's: when the coordinator got it (just after it was published), where the
    /// `flip_to_drained` phase counts from until a pass reached every client.
    pub flipped: Option<Instant>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The failover was aborted: the node stays the primary.
    Aborted,
    /// polestar gave the promotion up (no flip followed the fence in time): the pause is left
    /// to lapse, since another polestar that saw the flip may still renew its own.
    GaveUp,
    /// The node is the published primary (again).
    Primary,
    /// The master's failover resolved to another old primary.
    Superseded,
}

impl Stop {
    fn as_str(self) -> &'static str {
        match self {
            Self::Aborted => "aborted",
            Self::GaveUp => "gave_up",
            Self::Primary => "primary",
            Self::Superseded => "superseded",
        }
    }
}

/// How long each pause lasts: two intervals plus the deadline of one renewal attempt.
pub fn pause_length(interval: Duration) -> Duration {
    interval * 2 + Duration::from_millis(500)
}

/// How long the pause a demotion renews lasts: a fence's, plus the demotion's own deadlines
/// until its `REPLICAOF` runs. The demotion lifts it once the node answers replica; if the
/// node cannot be demoted the fence ends it (`fence_over`); if polestar dies meanwhile it
/// lapses by itself.
pub fn demotion_pause(interval: Duration) -> Duration {
    pause_length(interval) + DEMOTION_DEADLINES
}

/// What one demotion attempt found, as the shell reports it.
enum Outcome {
    /// We sent `REPLICAOF`; the node answers replica now.
    Done { killed: usize },
    /// The node already answers replica (Sentinel or another polestar demoted it).
    AlreadyReplica,
    /// Not demoted, and why (the node stays fenced until `fence_until`).
    Refused(String),
}

pub struct Episode {
    shared: Arc<Shared>,
    master: String,
    /// Shared with the coordinator's warm links: opened ahead of the promotion, if signs of
    /// the failover came first.
    link: Arc<NodeLink>,
    /// When the episode started (its first orders): the fence event says how long it took.
    started: Instant,
    /// Where the fence stands ([`phase::step`]'s state); only the fence loop reads or writes
    /// it, across its restarts.
    phase: Mutex<Phase>,
    /// We demoted it ourselves: a returning node's drain goes ahead although it answers replica.
    demoted_by_us: AtomicBool,
    /// The drain loop reached the node for the current order.
    drained: AtomicBool,
    /// An unreachable node is reported once per episode, not every interval.
    unreachable: AtomicBool,
    /// A refused demotion is reported once per episode.
    refused: AtomicBool,
    /// The drain order the drain loop last took up.
    handled: Mutex<Option<DrainOrder>>,
    /// Becomes true after the first fence or demotion attempt, whatever its outcome: the first
    /// drain pass waits for it, so that a client killed at the flip reconnects to a paused (or
    /// demoted) node.
    fence_tried: watch::Sender<bool>,
    /// The new primary, asked for `ROLE` before the node is made its replica.
    target: Mutex<Option<Arc<NodeLink>>>,
    /// The flip whose `flip_to_drained` was recorded last: a returning-node order that took
    /// over a flip's carries its instant, and each flip is timed once.
    timed: Mutex<Option<Instant>>,
}

/// How long the first drain pass waits for the first fence attempt (a connect and a command).
const FENCE_FIRST: Duration = Duration::from_secs(2);

impl Episode {
    /// `link`: the connection to the node, opened already if the coordinator warmed it.
    pub fn new(shared: Arc<Shared>, master: String, link: Arc<NodeLink>) -> Self {
        Self {
            shared,
            master,
            link,
            started: Instant::now(),
            phase: Mutex::new(Phase::default()),
            demoted_by_us: AtomicBool::new(false),
            drained: AtomicBool::new(true),
            unreachable: AtomicBool::new(false),
            refused: AtomicBool::new(false),
            handled: Mutex::new(None),
            fence_tried: watch::Sender::new(false),
            target: Mutex::new(None),
            timed: Mutex::new(None),
        }
    }

    /// True the first time the flip at `flipped` is timed by this episode.
    fn first_timing(&self, flipped: Instant) -> bool {
        // Held for one comparison; a poisoned slot still holds a valid value.
        let mut timed = self.timed.lock().unwrap_or_else(|p| p.into_inner());
        timed.replace(flipped) != Some(flipped)
    }

    fn node(&self) -> SocketAddr {
        self.link.addr()
    }

    /// Runs until the fence loop ends on orders that are still the latest (the drain loop never
    /// ends the episode on its own). `orders` is the coordinator's sender, shared so that the
    /// episode can mark itself closed atomically with respect to new orders.
    pub async fn run(self, orders: watch::Sender<Orders>) {
        loop {
            let ended_on = tokio::select! {
                generation = self.fence_loop(orders.subscribe()) => generation,
                () = self.drain_loop(orders.subscribe()) => continue,
            };
            if close(&orders, ended_on) {
                break;
            }
        }
        tracing::debug!(master = %self.master, node = %self.node(), "episode over");
        metrics::gauge!(crate::metrics::OLD_PRIMARY_CLIENTS, "master" => self.master.clone())
            .set(0.0);
    }

    /// Returns the generation of the orders it ended on. The rules are [`phase::step`]'s;
    /// this does the I/O it asks for and reports each answer back on the same tick.
    async fn fence_loop(&self, mut orders: watch::Receiver<Orders>) -> u64 {
        let interval = self.shared.cfg.interval;
        let mut next = Instant::now();
        let mut last_drain = None;
        let mut round_trips = 0;
        loop {
            let until = orders.borrow().until;
            let mut changed = false;
            tokio::select! {
                () = sleep_until(next.min(until)) => {}
                result = orders.changed() => {
                    if result.is_err() { return 0 }
                    changed = true;
                }
            }
            let current = orders.borrow_and_update().clone();
            let returning = current.drain != last_drain
                && current.drain.is_some_and(|d| d.reason == Reason::Returning);
            last_drain = current.drain;
            let now = Instant::now();
            next = now + interval;
            let mut probe = Some(Probe::Tick { changed, returning });
            while let Some(seen) = probe.take() {
                let (phase, actions) = step(self.phase(), &current, seen, now);
                self.set_phase(phase);
                for action in actions {
                    match action {
                        Action::End => return current.generation,
                        Action::SleepUntil(at) => next = at,
                        Action::WakeBy(at) => next = next.min(at),
                        Action::RetryIfSlow if now.elapsed() >= interval => next = Instant::now(),
                        Action::RetryIfSlow => {}
                        Action::Fence => {
                            let (role, trips) = self.check_and_fence().await;
                            round_trips = trips;
                            probe = Some(Probe::Role(role));
                        }
                        Action::Paused { first: true } => self.fenced(round_trips),
                        Action::Paused { first: false } => {}
                        Action::Demote { to, seen_replica, fenced } => {
                            let demotion = self.demote(&to, seen_replica, fenced).await;
                            probe = Some(Probe::Demotion(demotion));
                        }
                        other => self.perform(other, &current).await,
                    }
                }
            }
        }
    }

    fn phase(&self) -> Phase {
        // Held to copy or replace the value; a poisoned slot still holds a valid phase.
        *self.phase.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_phase(&self, phase: Phase) {
        *self.phase.lock().unwrap_or_else(|p| p.into_inner()) = phase;
    }

    /// The actions of [`phase::step`] that report nothing back.
    async fn perform(&self, action: Action, orders: &Orders) {
        match action {
            Action::Lift(reason) => self.lift(reason).await,
            Action::LeaveToLapse => self.left_to_lapse(),
            Action::Abandon => self.abandon(),
            Action::FenceOver(reason) => self.fence_over(orders, reason).await,
            Action::Unpause => self.unpause().await,
            Action::FenceTried => drop(self.fence_tried.send_replace(true)),
            // Done by the fence loop itself.
            Action::Fence
            | Action::Paused { .. }
            | Action::Demote { .. }
            | Action::SleepUntil(_)
            | Action::WakeBy(_)
            | Action::RetryIfSlow
            | Action::End => {}
        }
    }

    /// `ROLE` and the pause in one pipeline: one round trip on a link opened at the first
    /// sign of the failover. Returns the role and the round trips it took.
    async fn check_and_fence(&self) -> (Option<Role>, u32) {
        let length = pause_length(self.shared.cfg.interval);
        match self.link.fence(length).await {
            Ok(fenced) => {
                if let Role::Other(other) = &fenced.role {
                    tracing::warn!(master = %self.master, node = %self.node(), role = %other, "not fencing: unexpected role");
                }
                (Some(fenced.role), fenced.round_trips)
            }
            Err(e) => (self.unreachable(e, "fence"), 0),
        }
    }

    fn fenced(&self, round_trips: u32) {
        let length = pause_length(self.shared.cfg.interval);
        let took_ms = self.started.elapsed().as_millis() as u64;
        tracing::info!(master = %self.master, node = %self.node(), round_trips, took_ms, "fenced: writes paused on the old primary");
        let data = json!({
            "node": self.node(), "pause_ms": length.as_millis() as u64,
            "round_trips": round_trips, "took_ms": took_ms,
        });
        self.shared.events.push("fence", Some(&self.master), data);
    }

    /// Lifts the pause the fence just set on a node that is no master, which we had not
    /// fenced: silently, there was no fence of ours.
    async fn unpause(&self) {
        if let Err(e) = self.link.unpause().await {
            tracing::warn!(master = %self.master, node = %self.node(), error = %e, "cannot lift the pause; it lapses by itself");
        }
    }

    /// Lifts our pause at once: the node is a replica, or the Sentinels agreed it stays the
    /// primary. Either way no polestar needs a fence on it.
    async fn lift(&self, reason: &'static str) {
        if let Err(e) = self.link.unpause().await {
            tracing::warn!(master = %self.master, node = %self.node(), error = %e, "cannot lift the pause; it lapses by itself");
        }
        self.unfenced(reason);
    }

    /// Stops renewing our pause without lifting it: it lapses within [`pause_length`].
    fn left_to_lapse(&self) {
        tracing::info!(master = %self.master, node = %self.node(), "no flip followed the fence: left to lapse");
        let data = json!({ "node": self.node(), "reason": "gave_up" });
        self.shared.events.push("unfence", Some(&self.master), data);
    }

    fn unfenced(&self, reason: &'static str) {
        tracing::info!(master = %self.master, node = %self.node(), reason, "unfenced: pause lifted");
        let data = json!({ "node": self.node(), "reason": reason });
        self.shared.events.push("unfence", Some(&self.master), data);
    }

    /// Demotes the node to `to` if it still claims master (refused if it answered replica
    /// before: promoted again). `fenced`: our pause is on it, renewed first.
    async fn demote(&self, to: &Node, seen_replica: bool, fenced: bool) -> Demotion {
        let started = Instant::now();
        let outcome = self.try_demote(to, seen_replica, fenced).await;
        self.fence_tried.send_replace(true);
        let demotion = match outcome {
            Ok(Outcome::Done { killed }) => {
                self.demoted_by_us.store(true, Ordering::SeqCst);
                self.demoted(to, killed, started.elapsed());
                Demotion::Done
            }
            Ok(Outcome::AlreadyReplica) => Demotion::AlreadyReplica,
            Ok(Outcome::Refused(why)) => {
                self.refused(to, &why);
                return Demotion::Refused;
            }
            // Refused by the node (an ACL without REPLICAOF, a FAILOVER in progress): keep
            // fencing, so the fence ends as it would without demotion.
            Err(e @ NodeError::Command { .. }) => {
                self.refused(to, &e.to_string());
                return Demotion::Refused;
            }
            Err(e) => {
                self.unreachable::<()>(e, "demote");
                return Demotion::Unreachable;
            }
        };
        self.reachable_again();
        demotion
    }

    async fn try_demote(
        &self,
        to: &Node,
        seen_replica: bool,
        fenced: bool,
    ) -> Result<Outcome, NodeError> {
        if let Some(why) = self.not_published_to(to) {
            return Ok(Outcome::Refused(why));
        }
        // Our pause must hold until REPLICAOF runs, and the fence loop renews nothing while it
        // waits here: it is renewed first, in one pipeline with ROLE, for the demotion's own
        // deadlines. (It lapsed during a demotion that took 1.5 s on a loaded machine, and the
        // node acknowledged writes that REPLICAOF then lost.)
        let role = if fenced && !seen_replica {
            self.link.fence(demotion_pause(self.shared.cfg.interval)).await?.role
        } else {
            self.link.role().await?
        };
        match role {
            Role::Master if seen_replica => {
                // A replica earlier, a master now: promoted again (by Sentinel), not ours.
                return Ok(Outcome::Refused("it answered replica before: promoted again".into()));
            }
            Role::Master => {}
            Role::Replica => return Ok(Outcome::AlreadyReplica),
            Role::Other(other) => return Ok(Outcome::Refused(format!("it answers ROLE {other}"))),
        }
        if let Some(why) = self.target_not_master(to).await {
            return Ok(Outcome::Refused(why));
        }
        let listing = self.link.clients().await?;
        let held = select(&listing, &self.shared.rules, Scope::Held).kill;
        let killed = self.link.demote(&held, to).await?;
        match self.link.role().await? {
            Role::Replica => {}
            other => return Ok(Outcome::Refused(format!("still {other:?} after REPLICAOF"))),
        }
        // The pause is ours no more (the phase says so once this is reported).
        if let Err(e) = self.link.unpause().await {
            tracing::warn!(master = %self.master, node = %self.node(), error = %e, "demoted, but cannot lift the pause; it lapses by itself");
        }
        Ok(Outcome::Done { killed })
    }

    /// Why the node must not be made a replica of `to` by what is published, if it must not:
    /// the published primary is the node itself or another than `to`. Asked before anything
    /// is sent to the node, so that no published primary is paused.
    fn not_published_to(&self, to: &Node) -> Option<String> {
        let published = {
            let topology = self.shared.topology.borrow();
            topology.master(&self.master).and_then(|m| m.primary.as_ref().map(Node::addr))
        };
        match published {
            Some(p) if p == self.node() => Some("it is the published primary".into()),
            Some(p) if p != to.addr() => Some(format!("{p} is published, not {to}")),
            _ => None,
        }
    }

    /// Why the node must not be made a replica of `to` yet, if `to` does not answer `ROLE`
    /// master.
    async fn target_not_master(&self, to: &Node) -> Option<String> {
        match self.target_link(to).role().await {
            Ok(Role::Master) => None,
            Ok(role) => Some(format!("{to} answers ROLE {role:?}, not master")),
            Err(e) => Some(format!("the new primary does not answer: {e}")),
        }
    }

    fn target_link(&self, to: &Node) -> Arc<NodeLink> {
        // Held to read or replace the slot; a poisoned slot is still a valid value.
        let mut slot = self.target.lock().unwrap_or_else(|p| p.into_inner());
        match slot.as_ref() {
            Some(link) if link.addr() == to.addr() => link.clone(),
            _ => slot.insert(Arc::new(NodeLink::new(to, &self.shared.auth))).clone(),
        }
    }

    fn demoted(&self, to: &Node, killed: usize, took: Duration) {
        let duration_ms = took.as_millis() as u64;
        tracing::info!(master = %self.master, node = %self.node(), to = %to, killed, duration_ms, "demoted the old primary: REPLICAOF the new primary, pause lifted");
        if killed > 0 {
            metrics::counter!(crate::metrics::DRAIN_KILLED, "master" => self.master.clone(), "method" => "client_kill").increment(killed as u64);
        }
        let data = json!({ "node": self.node(), "to": to.addr(), "killed": killed, "duration_ms": duration_ms });
        self.shared.events.push("demote", Some(&self.master), data);
    }

    fn refused(&self, to: &Node, why: &str) {
        if self.refused.swap(true, Ordering::SeqCst) {
            tracing::debug!(master = %self.master, node = %self.node(), to = %to, why, "still not demoting");
            return;
        }
        tracing::warn!(master = %self.master, node = %self.node(), to = %to, why, "not demoting the old primary; it stays fenced for now");
        let data = json!({ "node": self.node(), "to": to.addr(), "why": why });
        self.shared.events.push("demote_refused", Some(&self.master), data);
    }

    /// The end of a fence that no demotion ended. Unconfirmed: the pause is left to lapse (no
    /// `UNPAUSE`, which would also lift the fence of another polestar that saw the flip).
    /// Confirmed but not demotable: the clients are killed in the transaction that lifts the
    /// pause, so the writes the pause held never run on the node.
    async fn fence_over(&self, orders: &Orders, reason: &'static str) {
        if orders.demote.is_none() {
            tracing::info!(master = %self.master, node = %self.node(), "no confirmed promotion followed the fence: left to lapse");
            let data = json!({ "node": self.node(), "reason": "unconfirmed" });
            self.shared.events.push("unfence", Some(&self.master), data);
            return;
        }
        if self.link.role().await.ok() == Some(Role::Master) {
            self.kill_and_unpause().await;
        } else if let Err(e) = self.link.unpause().await {
            tracing::warn!(master = %self.master, node = %self.node(), error = %e, "cannot lift the pause; it lapses by itself");
        }
        self.unfenced(reason);
    }

    /// The end of the window: a drain that never reached the node is reported.
    fn abandon(&self) {
        if !self.drained.load(Ordering::SeqCst) {
            let window = self.shared.cfg.window.as_millis() as u64;
            tracing::warn!(master = %self.master, node = %self.node(), window_ms = window, "gave up draining: the old primary never answered within the window");
            let data = json!({ "node": self.node(), "window_ms": window });
            self.shared.events.push("drain_abandoned", Some(&self.master), data);
        }
    }

    async fn kill_and_unpause(&self) {
        let result = async {
            let listing = self.link.clients().await?;
            let selection = select(&listing, &self.shared.rules, Scope::All);
            self.link.kill_and_unpause(&selection.kill).await
        };
        match result.await {
            Ok(killed) => {
                tracing::info!(master = %self.master, node = %self.node(), killed, "fence over: killed the clients the pause held, then lifted it");
                metrics::counter!(crate::metrics::DRAIN_KILLED, "master" => self.master.clone(), "method" => "client_kill").increment(killed as u64);
                let data = json!({ "node": self.node(), "reason": Reason::Unfence.as_str(), "killed": killed });
                self.shared.events.push("drain", Some(&self.master), data);
            }
            Err(e) => {
                tracing::warn!(master = %self.master, node = %self.node(), error = %e, "cannot lift the pause at the end of the fence; it lapses by itself");
            }
        }
    }

    async fn drain_loop(&self, mut orders: watch::Receiver<Orders>) {
        loop {
            let order = orders.borrow_and_update().drain;
            match order {
                Some(order) if Some(order) != self.take_up(order) => {
                    self.drained.store(false, Ordering::SeqCst);
                    self.run_order(order, &mut orders).await;
                }
                _ => {
                    if orders.changed().await.is_err() {
                        return std::future::pending().await;
                    }
                }
            }
        }
    }

    /// The passes of one drain order; returns early when a newer order arrives.
    async fn run_order(&self, order: DrainOrder, orders: &mut watch::Receiver<Orders>) {
        let cutoff = order.at + self.shared.cfg.grace;
        let mut next = Instant::now();
        let mut first = true;
        let mut timing = order.flipped;
        loop {
            tokio::select! {
                () = sleep_until(next) => {}
                _ = orders.changed() => {
                    if orders.borrow().drain != Some(order) { return }
                    continue;
                }
            }
            let started = Instant::now();
            match self.pass(order, first, cutoff, &mut timing).await {
                Some(true) => first = false,
                Some(false) => {
                    self.drained.store(true, Ordering::SeqCst);
                    return;
                }
                None => {}
            }
            if !first && started >= cutoff {
                break;
            }
            next = started + self.shared.cfg.interval;
            if started < cutoff {
                next = next.min(cutoff);
            }
        }
        self.drained.store(true, Ordering::SeqCst);
        self.stale_writers(order, orders).await;
    }

    /// After the cutoff and until the window ends: kills the clients whose last command is a
    /// write (on a demoted node, they got `READONLY`), so that they resolve the name again.
    /// Those the window's last sweep still found are reported when it ends: nothing cuts them
    /// any more.
    async fn stale_writers(&self, order: DrainOrder, orders: &mut watch::Receiver<Orders>) {
        let every = self.shared.cfg.interval.max(STALE_SWEEP);
        let mut found = 0;
        loop {
            let next = Instant::now() + every;
            if next >= orders.borrow().until {
                let window = self.shared.cfg.window;
                stale_left(&self.shared.events, &self.master, self.node(), found, window);
                return;
            }
            tokio::select! {
                () = sleep_until(next) => {}
                _ = orders.changed() => {
                    if orders.borrow().drain != Some(order) { return }
                    continue;
                }
            }
            let pacer = self.shared.pacers.of(self.node());
            let sweep =
                drain(&self.link, &self.shared.rules, &pacer, Scope::Writers, Reason::StaleWriter);
            match sweep.await {
                Ok(report) => {
                    self.reachable_again();
                    found = report.killed;
                    record(&self.shared.events, &self.master, &report, false);
                }
                Err(e) => {
                    found = 0;
                    self.unreachable::<()>(e, "stale writers");
                }
            }
        }
    }

    /// One pass. `Some(true)` when it ran, `Some(false)` when the order does not apply (a
    /// returning node that is no longer master), `None` when the node did not answer.
    /// `timing`: the flip, until a pass that reached every client records `flip_to_drained`.
    async fn pass(
        &self,
        order: DrainOrder,
        first: bool,
        cutoff: Instant,
        timing: &mut Option<Instant>,
    ) -> Option<bool> {
        if first && order.only_if_master {
            match self.link.role().await {
                Ok(Role::Master) => {}
                // Demoted a moment ago by this episode's fence loop: still drain it.
                Ok(Role::Replica) if self.demoted_by_us.load(Ordering::SeqCst) => {}
                Ok(_) => return Some(false),
                Err(e) => return self.unreachable(e, "drain"),
            }
        }
        if first && Instant::now() < cutoff {
            let mut tried = self.fence_tried.subscribe();
            let _ = tokio::time::timeout(FENCE_FIRST, tried.wait_for(|t| *t)).await;
        }
        let reason = if first { order.reason } else { Reason::Sweep };
        let pacer = self.shared.pacers.of(self.node());
        let scope = Scope::ConnectedBefore(cutoff);
        match drain(&self.link, &self.shared.rules, &pacer, scope, reason).await {
            Ok(report) => {
                self.reachable_again();
                if report.interrupted.is_none()
                    && let Some(flipped) = timing.take()
                    && self.first_timing(flipped)
                {
                    let now = Instant::now().into_std();
                    crate::phases::record(&[crate::phases::drained(flipped.into_std(), now)]);
                }
                record(&self.shared.events, &self.master, &report, first);
                Some(true)
            }
            Err(e) => self.unreachable(e, "drain"),
        }
    }

    /// Marks `order` as taken up and returns the order taken up before it.
    fn take_up(&self, order: DrainOrder) -> Option<DrainOrder> {
        // Held for one assignment; a poisoned slot still holds a valid value.
        let mut handled = self.handled.lock().unwrap_or_else(|p| p.into_inner());
        handled.replace(order)
    }

    /// Records the first failure of an episode; always `None` for the caller to pass on.
    fn unreachable<T>(&self, error: NodeError, during: &'static str) -> Option<T> {
        if self.unreachable.swap(true, Ordering::SeqCst) {
            tracing::debug!(master = %self.master, node = %self.node(), %error, during, "node still unreachable");
            return None;
        }
        tracing::warn!(master = %self.master, node = %self.node(), %error, during, "old primary unreachable; retrying within the window");
        let data = json!({ "node": self.node(), "during": during, "error": error.to_string() });
        self.shared.events.push("node_unreachable", Some(&self.master), data);
        None
    }

    fn reachable_again(&self) {
        if self.unreachable.swap(false, Ordering::SeqCst) {
            tracing::info!(master = %self.master, node = %self.node(), "old primary reachable again");
        }
    }
}

/// Marks the episode closed if the coordinator has not changed its orders since `seen`.
fn close(orders: &watch::Sender<Orders>, seen: u64) -> bool {
    let mut closed = false;
    orders.send_if_modified(|o| {
        closed = o.generation == seen;
        o.closed |= closed;
        false
    });
    closed
}
