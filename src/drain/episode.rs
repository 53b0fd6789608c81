//! One old (or returning) primary of one master, from the first signal about it to the end of
//! its window: the fence loop and the drain loop, run side by side in one task per node so that
//! a slow or dead node delays nothing but itself.
//!
//! The fence loop runs every `interval` until the fence ends (`fence_until`: the cutoff of the
//! drain order, or the end of the window for a promotion that is never published): while the node answers
//! `ROLE` master it is paused for [`pause_length`] (longer than the gap between renewals, so
//! the pause never lapses between two of them, short enough to lapse on its own soon after a
//! polestar crash); when it answers replica the pause is lifted. At the end of the fence, once
//! the drain loop has finished its sweeps, a node that still claims master has its remaining
//! clients killed in the same transaction that lifts the pause, so no held write ever runs on
//! it. The coordinator can end it sooner (abort, node published again).
//!
//! Why the fence does not last until Sentinel demotes the node: a paused node also holds
//! Sentinel's hello `PUBLISH` and every command Sentinel pipelines behind it on that link,
//! including the `REPLICAOF` that demotes it. Measured with Redis 7.0: after a planned
//! failover the old primary became a replica 11.5 s later without a pause, and was still a
//! master 52 s later with a pause renewed every 250 ms (Sentinel flapping it `+sdown`). Ending
//! the fence at the cutoff keeps the pause shorter than a typical `down-after-milliseconds`.
//!
//! The drain loop runs once per drain order (a flip, a returning node): a first pass at once,
//! then a sweep every `interval` and one exactly at the cutoff (`order.at + grace`). Every pass
//! kills the clients that may have connected before the cutoff, which until the cutoff means
//! every client that is not spared: whoever is connected then resolved the name before the
//! grace ran out, so may hold a stale DNS answer. After the cutoff no sweep runs; a node first
//! reached after the cutoff gets one pass that spares the clients whose `age` proves they
//! connected after it (replica reads).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};

use super::Shared;
use super::killer::{Reason, Scope, drain, record, select};
use super::node::{NodeError, NodeLink, Role};
use crate::topology::Node;

/// What the coordinator wants of one episode. It only ever replaces the whole value; the
/// episode acts on the latest one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Orders {
    /// Grows with every change the coordinator makes.
    pub generation: u64,
    /// Set by the episode, under the channel's lock, when it ends on orders it has seen in
    /// full: the coordinator then starts a new episode instead of sending to this one.
    pub closed: bool,
    /// The end of the window: nothing is fenced or swept after it.
    pub until: Instant,
    /// No pause is set or renewed after this (the cutoff of the drain order).
    pub fence_until: Instant,
    pub drain: Option<DrainOrder>,
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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The failover was aborted: the node stays the primary.
    Aborted,
    /// The node is the published primary (again).
    Primary,
    /// The master's failover resolved to another old primary.
    Superseded,
}

impl Stop {
    fn as_str(self) -> &'static str {
        match self {
            Self::Aborted => "aborted",
            Self::Primary => "primary",
            Self::Superseded => "superseded",
        }
    }
}

/// How long each pause lasts: two intervals plus the deadline of one renewal attempt.
pub fn pause_length(interval: Duration) -> Duration {
    interval * 2 + Duration::from_millis(500)
}

pub struct Episode {
    shared: Arc<Shared>,
    master: String,
    link: NodeLink,
    /// Whether polestar holds a pause on the node (set before the command is sent).
    paused: AtomicBool,
    /// The drain loop has nothing more to do for the current order.
    drained: AtomicBool,
    /// An unreachable node is reported once per episode, not every interval.
    unreachable: AtomicBool,
    /// The drain order the drain loop last took up.
    handled: Mutex<Option<DrainOrder>>,
    /// Becomes true after the first fence attempt, whatever its outcome: the first drain pass
    /// waits for it, so that a client killed at the flip reconnects to a paused node.
    fence_tried: watch::Sender<bool>,
}

/// How long the first drain pass waits for the first fence attempt (a connect and a command).
const FENCE_FIRST: Duration = Duration::from_secs(2);

impl Episode {
    pub fn new(shared: Arc<Shared>, master: String, node: &Node) -> Self {
        let link = NodeLink::new(node, &shared.auth);
        Self {
            shared,
            master,
            link,
            paused: AtomicBool::new(false),
            drained: AtomicBool::new(true),
            unreachable: AtomicBool::new(false),
            handled: Mutex::new(None),
            fence_tried: watch::Sender::new(false),
        }
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
    }

    /// Returns the generation of the orders it ended on.
    async fn fence_loop(&self, mut orders: watch::Receiver<Orders>) -> u64 {
        let interval = self.shared.cfg.interval;
        let mut next = Instant::now();
        loop {
            let until = orders.borrow().until;
            tokio::select! {
                () = sleep_until(next.min(until)) => {}
                changed = orders.changed() => if changed.is_err() { return 0 },
            }
            let current = orders.borrow_and_update().clone();
            let now = Instant::now();
            next = now + interval;
            if let Some(stop) = current.stop {
                self.lift(stop.as_str()).await;
                return current.generation;
            }
            if now >= current.until {
                self.expire(&current).await;
                return current.generation;
            }
            let drained = self.drained.load(Ordering::SeqCst);
            if now >= current.fence_until && drained {
                self.release(&current).await;
                return current.generation;
            }
            if now < current.fence_until || self.paused.load(Ordering::SeqCst) {
                // Past the fence's end a pause is still renewed until the sweeps are done.
                let role = self.fence_once().await;
                if role == Some(Role::Replica) && drained {
                    return current.generation;
                }
            }
            if now < current.fence_until {
                next = next.min(current.fence_until);
            }
        }
    }

    /// One `ROLE` check and the pause or unpause it calls for.
    async fn fence_once(&self) -> Option<Role> {
        let role = self.check_and_fence().await;
        self.fence_tried.send_replace(true);
        role
    }

    async fn check_and_fence(&self) -> Option<Role> {
        let role = match self.link.role().await {
            Ok(role) => role,
            Err(e) => return self.unreachable(e, "fence"),
        };
        match role {
            Role::Master => self.fence().await,
            Role::Replica => self.lift("replica").await,
            Role::Other(ref other) => {
                tracing::warn!(master = %self.master, node = %self.node(), role = %other, "not fencing: unexpected role");
            }
        }
        Some(role)
    }

    async fn fence(&self) {
        let length = pause_length(self.shared.cfg.interval);
        let first = !self.paused.swap(true, Ordering::SeqCst);
        if let Err(e) = self.link.pause(length).await {
            self.unreachable::<()>(e, "fence");
            return;
        }
        if first {
            tracing::info!(master = %self.master, node = %self.node(), "fenced: writes paused on the old primary");
            let data = json!({ "node": self.node(), "pause_ms": length.as_millis() as u64 });
            self.shared.events.push("fence", Some(&self.master), data);
        }
    }

    async fn lift(&self, reason: &'static str) {
        if !self.paused.swap(false, Ordering::SeqCst) {
            return;
        }
        if let Err(e) = self.link.unpause().await {
            tracing::warn!(master = %self.master, node = %self.node(), error = %e, "cannot lift the pause; it lapses by itself");
        }
        self.unfenced(reason);
    }

    fn unfenced(&self, reason: &'static str) {
        tracing::info!(master = %self.master, node = %self.node(), reason, "unfenced: pause lifted");
        let data = json!({ "node": self.node(), "reason": reason });
        self.shared.events.push("unfence", Some(&self.master), data);
    }

    /// The end of the fence. A node that still claims master after a flip has its clients
    /// killed in the same transaction that lifts the pause, so the writes the pause held never
    /// run on it.
    async fn release(&self, orders: &Orders) {
        if !self.paused.swap(false, Ordering::SeqCst) {
            return;
        }
        self.unpause_finally(orders).await;
        self.unfenced("cutoff");
    }

    async fn unpause_finally(&self, orders: &Orders) {
        if orders.drain.is_some() && self.link.role().await.ok() == Some(Role::Master) {
            self.kill_and_unpause().await;
        } else if let Err(e) = self.link.unpause().await {
            tracing::warn!(master = %self.master, node = %self.node(), error = %e, "cannot lift the pause; it lapses by itself");
        }
    }

    /// The end of the window: the node never answered long enough to be drained.
    async fn expire(&self, orders: &Orders) {
        if !self.drained.load(Ordering::SeqCst) {
            let window = self.shared.cfg.window.as_millis() as u64;
            tracing::warn!(master = %self.master, node = %self.node(), window_ms = window, "gave up draining: the old primary never answered within the window");
            let data = json!({ "node": self.node(), "window_ms": window });
            self.shared.events.push("drain_abandoned", Some(&self.master), data);
        }
        if !self.paused.swap(false, Ordering::SeqCst) {
            return;
        }
        self.unpause_finally(orders).await;
        self.unfenced(if orders.drain.is_some() { "window" } else { "unpublished" });
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
                tracing::warn!(master = %self.master, node = %self.node(), error = %e, "cannot lift the pause at the end of the window; it lapses by itself");
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
        loop {
            tokio::select! {
                () = sleep_until(next) => {}
                _ = orders.changed() => {
                    if orders.borrow().drain != Some(order) { return }
                    continue;
                }
            }
            let started = Instant::now();
            match self.pass(order, first, cutoff).await {
                Some(true) => first = false,
                Some(false) => break,
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
    }

    /// One pass. `Some(true)` when it ran, `Some(false)` when the order does not apply (a
    /// returning node that is no longer master), `None` when the node did not answer.
    async fn pass(&self, order: DrainOrder, first: bool, cutoff: Instant) -> Option<bool> {
        if first && order.only_if_master {
            match self.link.role().await {
                Ok(Role::Master) => {}
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
