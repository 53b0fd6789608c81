//! One old (or returning) primary of one master, from the first signal about it to the end of
//! its window: the fence side and the drain side, run side by side in one task per node so
//! that a slow or dead node delays nothing but itself.
//!
//! What the episode does next is one pure transition, [`state::step`] (the episode's state,
//! the orders, what the node answered, the time: the next state and the I/O to do),
//! table-tested; the fence side's rules are [`phase::step`], the drain side's
//! [`passes::step`]. [`Episode::run`] is the shell: it owns the state, ticks each side, does
//! the I/O of each (one command sequence at a time per side, the two side by side, so that a
//! drain pass delays no renewal of the pause) and reports each answer back.
//!
//! The fence side runs every `interval`. Before the promotion is confirmed it fences: while the
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
//! The drain side runs once per drain order (a flip, a returning node): a first pass at once,
//! then a sweep every `interval` and one exactly at the cutoff (`order.at + grace`). Every pass
//! kills the clients that may have connected before the cutoff. After the cutoff, until the
//! window ends, every [`STALE_SWEEP`] it kills the clients whose last command is a write: on a
//! demoted node they got `READONLY`, so they hold a stale cached or pinned address and must
//! resolve again; readers stay. A node first reached after the cutoff gets one pass that spares
//! the clients whose `age` proves they connected after it.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};

mod passes;
mod phase;
mod state;

use super::Shared;
use super::killer::{Reason, Scope, drain, record, select, stale_left};
use crate::events::Kind;
use crate::node::{DEMOTION_DEADLINES, KeptLink, NodeError, Role};
use crate::topology::Node;
use passes::{Pace, Pass};
use phase::Demotion;
use state::{Action, Probe, State, step};

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

impl Orders {
    /// No orders yet: a window that ends `now`, nothing to fence, drain or demote.
    pub fn none(now: Instant) -> Self {
        Self {
            generation: 0,
            closed: false,
            until: now,
            fence_until: now,
            drain: None,
            target: None,
            demote: None,
            stop: None,
        }
    }
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
    link: Arc<KeptLink>,
    /// When the episode started (its first orders): the fence event says how long it took.
    started: Instant,
    /// The new primary, asked for `ROLE` before the node is made its replica.
    target: Mutex<Option<Arc<KeptLink>>>,
    /// What is logged once rather than on every attempt.
    noted: Noted,
}

/// Failures an episode reports once (with an event), not on every attempt of either side.
#[derive(Default)]
struct Noted {
    /// The node did not answer, and has not answered since.
    unreachable: AtomicBool,
    /// A demotion was refused.
    refused: AtomicBool,
}

/// One command sequence of one side of the episode: what the node answered, if it asked.
type Io<'a> = Pin<Box<dyn Future<Output = Option<Probe>> + Send + 'a>>;

/// The shell's bookkeeping for one run of [`Episode::drive`] (the decisions are [`State`]'s).
struct Shell<'a> {
    /// The fence side's command sequence under way, and the drain side's: a side is not
    /// ticked while its own runs, and reports its answer when it is done.
    fence_io: Option<Io<'a>>,
    drain_io: Option<Io<'a>>,
    /// When the fence side ticks next, and when its current tick began (the time its answers
    /// are stepped at).
    next: Instant,
    tick: Instant,
    /// The orders changed since the fence side's last tick, since the drain side's.
    fence_news: bool,
    drain_news: bool,
    /// The drain order the fence side saw at its last tick: a new returning node's order makes
    /// it forget that the node answered replica.
    last_drain: Option<DrainOrder>,
}

impl Shell<'_> {
    fn new(now: Instant) -> Self {
        Self {
            fence_io: None,
            drain_io: None,
            next: now,
            tick: now,
            fence_news: false,
            drain_news: true,
            last_drain: None,
        }
    }

    /// When the fence loop and the drain loop are next due.
    fn due(&self, state: &State, orders: &Orders) -> (Instant, Option<Instant>) {
        (self.fence_due(orders), self.drain_due(state, orders))
    }

    fn fence_due(&self, orders: &Orders) -> Instant {
        if self.fence_news { Instant::now() } else { self.next.min(orders.until) }
    }

    fn drain_due(&self, state: &State, orders: &Orders) -> Option<Instant> {
        if self.drain_news { Some(Instant::now()) } else { state.drain.wake(orders) }
    }

    fn fence_tick(&mut self, orders: &Orders, interval: Duration) -> (Probe, Instant) {
        let now = Instant::now();
        let returning = orders.drain != self.last_drain
            && orders.drain.is_some_and(|d| d.reason == Reason::Returning);
        self.last_drain = orders.drain;
        let changed = std::mem::take(&mut self.fence_news);
        (self.tick, self.next) = (now, now + interval);
        (Probe::Fence(phase::Probe::Tick { changed, returning }), now)
    }

    fn drain_tick(&mut self) -> (Probe, Instant) {
        self.drain_news = false;
        (Probe::Drain(passes::Probe::Tick), Instant::now())
    }
}

/// What woke the shell.
enum Event {
    FenceTick,
    DrainTick,
    /// A side's command sequence is over, with what the node answered, if it asked.
    Done(Option<Probe>, Instant),
}

impl Episode {
    /// `link`: the connection to the node, opened already if the coordinator warmed it.
    pub fn new(shared: Arc<Shared>, master: String, link: Arc<KeptLink>) -> Self {
        Self {
            shared,
            master,
            link,
            started: Instant::now(),
            target: Mutex::new(None),
            noted: Noted::default(),
        }
    }

    fn node(&self) -> SocketAddr {
        self.link.addr()
    }

    /// Runs until the fence side ends on orders that are still the latest (the drain side never
    /// ends the episode on its own). `orders` is the coordinator's sender, shared so that the
    /// episode can mark itself closed atomically with respect to new orders.
    pub async fn run(self, orders: watch::Sender<Orders>) {
        let cfg = &self.shared.cfg;
        let mut state = State::new(Pace { grace: cfg.grace, interval: cfg.interval });
        loop {
            let ended_on = self.drive(&mut state, orders.subscribe()).await;
            if close(&orders, ended_on) {
                break;
            }
            // Going on with newer orders: a drain attempt whose command was dropped is made
            // again.
            state.drain = state.drain.interrupted(Instant::now());
        }
        tracing::debug!(master = %self.master, node = %self.node(), "episode over");
        metrics::gauge!(crate::metrics::OLD_PRIMARY_CLIENTS, "master" => self.master.clone())
            .set(0.0);
    }

    /// Ticks both sides and steps every answer until the fence side ends; returns the
    /// generation of the orders it ended on.
    async fn drive(&self, state: &mut State, mut orders: watch::Receiver<Orders>) -> u64 {
        let mut shell = Shell::new(Instant::now());
        loop {
            let (fence_at, drain_at) = shell.due(state, &orders.borrow());
            let (fence_idle, drain_idle) = (shell.fence_io.is_none(), shell.drain_io.is_none());
            let event = tokio::select! {
                answer = finished(&mut shell.fence_io), if !fence_idle => {
                    shell.fence_io = None;
                    Event::Done(answer, shell.tick)
                }
                answer = finished(&mut shell.drain_io), if !drain_idle => {
                    shell.drain_io = None;
                    Event::Done(answer, Instant::now())
                }
                () = sleep_until(fence_at), if fence_idle => Event::FenceTick,
                () = sleep_until_some(drain_at), if drain_idle => Event::DrainTick,
                changed = orders.changed() => {
                    if changed.is_err() {
                        return 0;
                    }
                    (shell.fence_news, shell.drain_news) = (true, true);
                    continue;
                }
            };
            let current = orders.borrow().clone();
            let (probe, now) = match event {
                Event::FenceTick => shell.fence_tick(&current, self.shared.cfg.interval),
                Event::DrainTick => shell.drain_tick(),
                Event::Done(Some(answer), at) => (answer, at),
                Event::Done(None, _) => continue,
            };
            let (next, actions) = step(*state, &current, probe, now);
            *state = next;
            if let Some(generation) = self.dispatch(actions, &mut shell, &current).await {
                return generation;
            }
        }
    }

    /// Sets the fence side's next tick and starts each side's commands; at the end of the
    /// episode, does the fence side's last ones and returns the generation of `orders`.
    async fn dispatch<'a>(
        &'a self,
        actions: Vec<Action>,
        shell: &mut Shell<'a>,
        orders: &Orders,
    ) -> Option<u64> {
        let (mut fence, mut drain, mut end) = (Vec::new(), Vec::new(), false);
        for action in actions {
            match action {
                Action::Fence(phase::Action::End) => end = true,
                Action::Fence(phase::Action::SleepUntil(at)) => shell.next = at,
                Action::Fence(phase::Action::WakeBy(at)) => shell.next = shell.next.min(at),
                Action::Fence(phase::Action::RetryIfSlow) => {
                    if shell.tick.elapsed() >= self.shared.cfg.interval {
                        shell.next = Instant::now();
                    }
                }
                Action::Fence(action) => fence.push(action),
                Action::Drain(action) => drain.push(action),
            }
        }
        if end {
            self.fence_io(fence, orders.clone()).await;
            return Some(orders.generation);
        }
        if !fence.is_empty() {
            shell.fence_io = Some(Box::pin(self.fence_io(fence, orders.clone())));
        }
        if !drain.is_empty() {
            // Only a side at rest is given commands (the drain side's first pass waits for the
            // fence side's first attempt without one running).
            debug_assert!(shell.drain_io.is_none(), "drain commands while others run");
            shell.drain_io = Some(Box::pin(self.drain_io(drain)));
        }
        None
    }

    /// The fence side's commands, in order; the answer of the one that asks (a fence, a
    /// demotion).
    async fn fence_io(&self, actions: Vec<phase::Action>, orders: Orders) -> Option<Probe> {
        let mut answer = None;
        for action in actions {
            answer = self.fence_command(action, &orders).await.or(answer);
        }
        answer.map(Probe::Fence)
    }

    async fn fence_command(&self, action: phase::Action, orders: &Orders) -> Option<phase::Probe> {
        use phase::Action as A;
        match action {
            A::Fence => {
                let (role, round_trips) = self.check_and_fence().await;
                return Some(phase::Probe::Role { role, round_trips });
            }
            A::Demote { to, seen_replica, fenced } => {
                let demotion = self.demote(&to, seen_replica, fenced).await;
                return Some(phase::Probe::Demotion(demotion));
            }
            A::Paused { first: true, round_trips } => self.fenced(round_trips),
            A::Lift(reason) => self.lift(reason).await,
            A::LeaveToLapse => self.left_to_lapse(),
            A::Abandon => self.abandon(),
            A::FenceOver(reason) => self.fence_over(orders, reason).await,
            A::Unpause => self.unpause().await,
            // Timing, done by the shell; or nothing to do.
            A::Paused { first: false, .. }
            | A::SleepUntil(_)
            | A::WakeBy(_)
            | A::RetryIfSlow
            | A::End => {}
        }
        None
    }

    /// The drain side's commands (one per step), in order; the answer of the last.
    async fn drain_io(&self, actions: Vec<passes::Action>) -> Option<Probe> {
        let mut answer = None;
        for action in actions {
            answer = Some(self.drain_command(action).await);
        }
        answer.map(Probe::Drain)
    }

    async fn drain_command(&self, action: passes::Action) -> passes::Probe {
        use passes::Action as A;
        match action {
            A::AskRole => match self.link.role().await {
                Ok(role) => passes::Probe::Role(Some(role)),
                Err(e) => passes::Probe::Role(self.unreachable(e, "drain")),
            },
            A::FirstPass { cutoff, reason, timed } => {
                passes::Probe::Passed(self.pass(cutoff, reason, true, timed).await)
            }
            A::Sweep { cutoff, timed } => {
                passes::Probe::Passed(self.pass(cutoff, Reason::Sweep, false, timed).await)
            }
            A::SweepWriters { last } => {
                let found = self.stale_writers().await;
                if last {
                    let window = self.shared.cfg.window;
                    stale_left(&self.shared.events, &self.master, self.node(), found, window);
                }
                passes::Probe::Swept
            }
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
        self.shared.events.push(Kind::Fence, Some(&self.master), data);
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
        self.shared.events.push(Kind::Unfence, Some(&self.master), data);
    }

    fn unfenced(&self, reason: &'static str) {
        tracing::info!(master = %self.master, node = %self.node(), reason, "unfenced: pause lifted");
        let data = json!({ "node": self.node(), "reason": reason });
        self.shared.events.push(Kind::Unfence, Some(&self.master), data);
    }

    /// Demotes the node to `to` if it still claims master (refused if it answered replica
    /// before: promoted again). `fenced`: our pause is on it, renewed first.
    async fn demote(&self, to: &Node, seen_replica: bool, fenced: bool) -> Demotion {
        let started = Instant::now();
        let outcome = self.try_demote(to, seen_replica, fenced).await;
        let demotion = match outcome {
            Ok(Outcome::Done { killed }) => {
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

    /// Asks the node's `ROLE`: `None` when it is a master this demotion may turn into a
    /// replica, else what the attempt comes to.
    async fn not_a_master_to_demote(
        &self,
        seen_replica: bool,
        fenced: bool,
    ) -> Result<Option<Outcome>, NodeError> {
        // Our pause must hold until REPLICAOF runs, and the fence loop renews nothing while it
        // waits here: it is renewed first, in one pipeline with ROLE, for the demotion's own
        // deadlines. (It lapsed during a demotion that took 1.5 s on a loaded machine, and the
        // node acknowledged writes that REPLICAOF then lost.)
        let role = if fenced && !seen_replica {
            self.link.fence(demotion_pause(self.shared.cfg.interval)).await?.role
        } else {
            self.link.role().await?
        };
        Ok(match role {
            // A replica earlier, a master now: promoted again (by Sentinel), not ours.
            Role::Master if seen_replica => {
                Some(Outcome::Refused("it answered replica before: promoted again".into()))
            }
            Role::Master => None,
            Role::Replica => Some(Outcome::AlreadyReplica),
            Role::Other(other) => Some(Outcome::Refused(format!("it answers ROLE {other}"))),
        })
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
        if let Some(outcome) = self.not_a_master_to_demote(seen_replica, fenced).await? {
            return Ok(outcome);
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

    fn target_link(&self, to: &Node) -> Arc<KeptLink> {
        // Held to read or replace the slot; a poisoned slot is still a valid value.
        let mut slot = self.target.lock().unwrap_or_else(|p| p.into_inner());
        match slot.as_ref() {
            Some(link) if link.addr() == to.addr() => link.clone(),
            _ => slot.insert(Arc::new(KeptLink::new(to, &self.shared.auth))).clone(),
        }
    }

    fn demoted(&self, to: &Node, killed: usize, took: Duration) {
        let duration_ms = took.as_millis() as u64;
        tracing::info!(master = %self.master, node = %self.node(), to = %to, killed, duration_ms, "demoted the old primary: REPLICAOF the new primary, pause lifted");
        if killed > 0 {
            metrics::counter!(crate::metrics::DRAIN_KILLED, "master" => self.master.clone(), "method" => "client_kill").increment(killed as u64);
        }
        let data = json!({ "node": self.node(), "to": to.addr(), "killed": killed, "duration_ms": duration_ms });
        self.shared.events.push(Kind::Demote, Some(&self.master), data);
    }

    fn refused(&self, to: &Node, why: &str) {
        if self.noted.refused.swap(true, Ordering::SeqCst) {
            tracing::debug!(master = %self.master, node = %self.node(), to = %to, why, "still not demoting");
            return;
        }
        tracing::warn!(master = %self.master, node = %self.node(), to = %to, why, "not demoting the old primary; it stays fenced for now");
        let data = json!({ "node": self.node(), "to": to.addr(), "why": why });
        self.shared.events.push(Kind::DemoteRefused, Some(&self.master), data);
    }

    /// The end of a fence that no demotion ended. Unconfirmed: the pause is left to lapse (no
    /// `UNPAUSE`, which would also lift the fence of another polestar that saw the flip).
    /// Confirmed but not demotable: the clients are killed in the transaction that lifts the
    /// pause, so the writes the pause held never run on the node.
    async fn fence_over(&self, orders: &Orders, reason: &'static str) {
        if orders.demote.is_none() {
            tracing::info!(master = %self.master, node = %self.node(), "no confirmed promotion followed the fence: left to lapse");
            let data = json!({ "node": self.node(), "reason": "unconfirmed" });
            self.shared.events.push(Kind::Unfence, Some(&self.master), data);
            return;
        }
        if self.link.role().await.ok() == Some(Role::Master) {
            self.kill_and_unpause().await;
        } else if let Err(e) = self.link.unpause().await {
            tracing::warn!(master = %self.master, node = %self.node(), error = %e, "cannot lift the pause; it lapses by itself");
        }
        self.unfenced(reason);
    }

    /// The end of the window, while no pass reached the node: the drain is reported abandoned.
    fn abandon(&self) {
        let window = self.shared.cfg.window.as_millis() as u64;
        tracing::warn!(master = %self.master, node = %self.node(), window_ms = window, "gave up draining: the old primary never answered within the window");
        let data = json!({ "node": self.node(), "window_ms": window });
        self.shared.events.push(Kind::DrainAbandoned, Some(&self.master), data);
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
                self.shared.events.push(Kind::Drain, Some(&self.master), data);
            }
            Err(e) => {
                tracing::warn!(master = %self.master, node = %self.node(), error = %e, "cannot lift the pause at the end of the fence; it lapses by itself");
            }
        }
    }

    /// One pass over the clients that may have connected before `cutoff`; `loud`: the order's
    /// first, reported even when it finds no one. `timed`: the flip whose `flip_to_drained` a
    /// pass that reached every client records.
    async fn pass(
        &self,
        cutoff: Instant,
        reason: Reason,
        loud: bool,
        timed: Option<Instant>,
    ) -> Pass {
        let pacer = self.shared.pacers.of(self.node());
        let scope = Scope::ConnectedBefore(cutoff);
        let report = match drain(&self.link, &self.shared.rules, &pacer, scope, reason).await {
            Ok(report) => report,
            Err(e) => {
                self.unreachable::<()>(e, "drain");
                return Pass::Unreachable;
            }
        };
        self.reachable_again();
        let complete = report.interrupted.is_none();
        if complete && let Some(flipped) = timed {
            let now = Instant::now().into_std();
            crate::phases::record(&[crate::phases::drained(flipped.into_std(), now)]);
        }
        record(&self.shared.events, &self.master, &report, loud);
        if complete { Pass::Complete } else { Pass::Interrupted }
    }

    /// After the cutoff and until the window ends: kills the clients whose last command is a
    /// write (on a demoted node, they got `READONLY`), so that they resolve the name again.
    /// Returns how many it found (0 when the node did not answer).
    async fn stale_writers(&self) -> usize {
        let pacer = self.shared.pacers.of(self.node());
        let sweep =
            drain(&self.link, &self.shared.rules, &pacer, Scope::Writers, Reason::StaleWriter);
        match sweep.await {
            Ok(report) => {
                self.reachable_again();
                record(&self.shared.events, &self.master, &report, false);
                report.killed
            }
            Err(e) => {
                let _ = self.unreachable::<()>(e, "stale writers");
                0
            }
        }
    }

    /// Records the first failure of an episode; always `None` for the caller to pass on.
    fn unreachable<T>(&self, error: NodeError, during: &'static str) -> Option<T> {
        if self.noted.unreachable.swap(true, Ordering::SeqCst) {
            tracing::debug!(master = %self.master, node = %self.node(), %error, during, "node still unreachable");
            return None;
        }
        tracing::warn!(master = %self.master, node = %self.node(), %error, during, "old primary unreachable; retrying within the window");
        let data = json!({ "node": self.node(), "during": during, "error": error.to_string() });
        self.shared.events.push(Kind::NodeUnreachable, Some(&self.master), data);
        None
    }

    fn reachable_again(&self) {
        if self.noted.unreachable.swap(false, Ordering::SeqCst) {
            tracing::info!(master = %self.master, node = %self.node(), "old primary reachable again");
        }
    }
}

/// Waits for a side's command sequence to be over.
async fn finished(io: &mut Option<Io<'_>>) -> Option<Probe> {
    match io {
        Some(io) => io.await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `at`, or for ever.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
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
