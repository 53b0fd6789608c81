//! Fence and drain: after a failover, make the old primary stop acknowledging writes and make
//! its clients reconnect, so that they find the new primary within about a second instead of
//! hanging on a dead socket or writing into a node that is about to be demoted.
//!
//! The Sentinel side sends [`Signal`]s for changes the Sentinels agreed on (never because
//! polestar lost them). The [`Coordinator`] turns each into orders for one *episode* per
//! (master, node): a task that fences the node while it still claims master and drains its
//! clients (see [`episode`] for the timeline). Episodes run apart, so a node that is down or
//! hung delays nothing but its own episode; the coordinator itself never does network I/O.
//!
//! # Timeline of a failover from O to N, and why
//!
//! - **Promoting** (the leader chose N): O is fenced at once with `CLIENT PAUSE <ms> WRITE`,
//!   because from now until Sentinel demotes O (seconds later) both nodes accept writes and
//!   O's are lost. Reads go on. The pause is short and renewed every `interval`, so that it
//!   lapses by itself if polestar dies.
//! - **Flipped** (DNS and HTTP answer N): fence again, and kill every client of O that is not
//!   spared, at once. Clients that resolve afresh land on N; one whose DNS cache still names O
//!   reconnects to a paused node (or, later, a replica), so it cannot lose a write, and the
//!   next sweep catches it.
//! - **Sweeps** every `interval` until the cutoff `flip + grace`, and one at the cutoff: every
//!   client present then connected before the cutoff, so may hold a stale answer, and is
//!   killed. After the cutoff new connections to O are intended (replica reads) and left alone.
//! - The pause is lifted once O answers `ROLE` as a replica, on **Aborted**, when O becomes
//!   the published primary again, or at the cutoff once the sweeps are done (a promotion that
//!   is never published nor aborted: at the end of the window). Paused writes never run on
//!   O: their clients are killed first (at the cutoff in the same transaction as the unpause).
//! - An unreachable O is retried every `interval` until `window` after the flip; the first pass
//!   that reaches it after the cutoff kills the clients that may have connected before it.
//! - **Returning**: a node that comes back still claiming master while another is published
//!   is fenced and drained at once, with its own grace and window.
//!
//! Why the fence ends at the cutoff and not when Sentinel demotes O (as SPEC step 4 has it): a
//! paused node holds Sentinel's hello `PUBLISH` and every command pipelined behind it,
//! including the `REPLICAOF` that demotes it, so a pause renewed until demotion is never lifted
//! (measured; see [`episode`]). Connections made to O after the cutoff are intended replica
//! reads, so O needs no fence any more by then.
//!
//! On shutdown episodes are dropped without unpausing: a pause lapses by itself within
//! [`episode::pause_length`], and lifting it early would only let held writes run sooner.

pub mod clients;
mod episode;
pub mod killer;
pub mod node;
mod pace;
pub mod spare;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use killer::{DrainReport, Reason};
pub use node::NodeError;
pub use spare::{CONNECTION_NAME, SpareReason};

use crate::config;
use crate::events::EventLog;
use crate::topology::{Node, TopologyReader};
use episode::{DrainOrder, Episode, Orders, Stop};
use killer::{Scope, drain, record};
use node::NodeLink;
use pace::Pacers;
use spare::Rules;

/// What the Sentinel side tells the drain side. Sent only for changes the Sentinels agreed on,
/// never because polestar lost contact with Sentinels.
#[derive(Clone, Debug)]
pub enum Signal {
    /// The leader announced the promotion (+selected-slave / +failover-state-send-slaveof-noone):
    /// fence `old` early.
    Promoting { master: String, old: Node, at: std::time::Instant },
    /// The published primary changed (DNS and HTTP already answer `new`).
    Flipped { master: String, old: Option<Node>, new: Node, epoch: u64, at: std::time::Instant },
    /// The failover was aborted: lift the pause on `old` if we set one.
    Aborted { master: String },
    /// Sentinel reports a node of this master coming back (-sdown, +convert-to-slave,
    /// +role-change, +reboot); if it still answers ROLE master and is not the published
    /// primary, fence and drain it at once.
    Returning { master: String, node: Node },
}

/// Why a manual drain was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error("draining is disabled (drain.enabled: false)")]
    Disabled,
    #[error("unknown master {0:?}")]
    UnknownMaster(String),
    #[error("{node} is neither the primary nor a replica of {master:?}")]
    UnknownNode { master: String, node: SocketAddr },
    #[error(transparent)]
    Node(#[from] NodeError),
}

/// What every episode and the manual drain share.
pub(crate) struct Shared {
    cfg: config::Drain,
    rules: Rules,
    auth: config::Auth,
    events: Arc<EventLog>,
    pacers: Pacers,
    topology: TopologyReader,
}

pub struct Coordinator {
    shared: Arc<Shared>,
}

/// A running episode: the coordinator holds the sender, the episode a clone of it and the
/// receivers. The episode marks the orders `closed` when it ends.
type Episodes = HashMap<(String, SocketAddr), watch::Sender<Orders>>;

impl Coordinator {
    pub fn new(
        cfg: config::Drain,
        nodes_auth: config::Auth,
        events: Arc<EventLog>,
        topology: TopologyReader,
    ) -> Self {
        let rules = Rules::new(&cfg.spare);
        let pacers = Pacers::new(cfg.rate);
        Self { shared: Arc::new(Shared { cfg, rules, auth: nodes_auth, events, pacers, topology }) }
    }

    pub fn handle(&self) -> DrainHandle {
        DrainHandle { shared: self.shared.clone() }
    }

    /// Runs until shutdown. Signals are applied in order and never wait for a node; when the
    /// sending side goes away, running episodes still finish their windows.
    pub async fn run(
        self,
        mut signals: mpsc::UnboundedReceiver<Signal>,
        shutdown: CancellationToken,
    ) {
        let mut episodes = Episodes::new();
        loop {
            let signal = tokio::select! {
                () = shutdown.cancelled() => break,
                signal = signals.recv() => signal,
            };
            let Some(signal) = signal else {
                shutdown.cancelled().await;
                break;
            };
            if self.shared.cfg.enabled {
                episodes.retain(|_, tx| !tx.borrow().closed);
                self.apply(signal, &mut episodes, &shutdown);
            }
        }
    }

    fn apply(&self, signal: Signal, episodes: &mut Episodes, shutdown: &CancellationToken) {
        tracing::debug!(?signal, "drain signal");
        match signal {
            Signal::Promoting { master, old, at } => {
                // Fenced until the flip (or the abort): from now on O's writes are lost.
                let until = Instant::from_std(at) + self.shared.cfg.window;
                self.order(episodes, shutdown, &master, &old, |o| {
                    o.until = o.until.max(until);
                    if o.drain.is_none() {
                        o.fence_until = o.until;
                    }
                });
            }
            Signal::Flipped { master, old, new, at, .. } => {
                self.flipped(episodes, shutdown, &master, old, &new, Instant::from_std(at));
            }
            Signal::Aborted { master } => {
                stop_where(episodes, &master, Stop::Aborted, |_, o| o.drain.is_none());
            }
            Signal::Returning { master, node } => {
                self.returning(episodes, shutdown, &master, &node)
            }
        }
    }

    fn flipped(
        &self,
        episodes: &mut Episodes,
        shutdown: &CancellationToken,
        master: &str,
        old: Option<Node>,
        new: &Node,
        at: Instant,
    ) {
        stop_node(episodes, master, new.addr(), Stop::Primary);
        let Some(old) = old.filter(|o| o.addr() != new.addr()) else { return };
        // A fence set at a promotion of another node than the one that turned out to be old.
        let others = |node, o: &Orders| o.drain.is_none() && node != old.addr();
        stop_where(episodes, master, Stop::Superseded, others);
        let order = DrainOrder { at, reason: Reason::Flip, only_if_master: false };
        self.drain_order(episodes, shutdown, master, &old, order);
    }

    fn returning(
        &self,
        episodes: &mut Episodes,
        shutdown: &CancellationToken,
        master: &str,
        node: &Node,
    ) {
        let published =
            self.shared.topology.borrow().master(master).and_then(|m| m.primary.clone());
        if published.is_none_or(|p| p.addr() == node.addr()) {
            tracing::debug!(master, %node, "returning node is the published primary (or none is): nothing to do");
            return;
        }
        let order =
            DrainOrder { at: Instant::now(), reason: Reason::Returning, only_if_master: true };
        self.drain_order(episodes, shutdown, master, node, order);
    }

    fn drain_order(
        &self,
        episodes: &mut Episodes,
        shutdown: &CancellationToken,
        master: &str,
        node: &Node,
        order: DrainOrder,
    ) {
        let until = order.at + self.shared.cfg.window;
        self.order(episodes, shutdown, master, node, |o| {
            o.until = o.until.max(until);
            o.fence_until = order.at + self.shared.cfg.grace;
            o.drain = Some(order);
        });
    }

    /// Changes the orders of the episode for (`master`, `node`), starting one if none runs.
    /// New orders cancel an earlier stop the episode may not have acted on yet.
    fn order(
        &self,
        episodes: &mut Episodes,
        shutdown: &CancellationToken,
        master: &str,
        node: &Node,
        change: impl Fn(&mut Orders),
    ) {
        let key = (master.to_string(), node.addr());
        let change = |o: &mut Orders| {
            o.stop = None;
            change(o);
        };
        if let Some(tx) = episodes.get(&key)
            && update(tx, &change)
        {
            return;
        }
        let now = Instant::now();
        let mut orders = Orders {
            generation: 0,
            closed: false,
            until: now,
            fence_until: now,
            drain: None,
            stop: None,
        };
        change(&mut orders);
        let (tx, _) = watch::channel(orders);
        let episode = Episode::new(self.shared.clone(), master.to_string(), node);
        let stop = shutdown.child_token();
        let running = tx.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = episode.run(running) => {}
            }
        });
        episodes.insert(key, tx);
    }
}

/// Applies `change` unless the episode has closed; false when it has (start a new one).
fn update(tx: &watch::Sender<Orders>, change: &impl Fn(&mut Orders)) -> bool {
    tx.send_if_modified(|o| {
        if o.closed {
            return false;
        }
        change(o);
        o.generation += 1;
        true
    })
}

fn stop_node(episodes: &Episodes, master: &str, node: SocketAddr, stop: Stop) {
    stop_where(episodes, master, stop, |n, _| n == node);
}

/// Stops the episodes of `master` that `pick` chooses and that no earlier word stopped.
fn stop_where(
    episodes: &Episodes,
    master: &str,
    stop: Stop,
    pick: impl Fn(SocketAddr, &Orders) -> bool,
) {
    for ((_, node), tx) in episodes.iter().filter(|((m, _), _)| m == master) {
        let chosen = {
            let orders = tx.borrow();
            orders.stop.is_none() && pick(*node, &orders)
        };
        if chosen {
            tracing::debug!(master, %node, ?stop, "stopping episode");
            update(tx, &|o: &mut Orders| o.stop = Some(stop));
        }
    }
}

/// Drains a node by hand (`POST /v1/masters/{name}/drain`). Cheap to clone.
#[derive(Clone)]
pub struct DrainHandle {
    shared: Arc<Shared>,
}

impl DrainHandle {
    /// Kills every client of `node` that is not spared, at the configured rate, and reports.
    /// `node` must be the primary or a replica of `master` in the published topology.
    pub async fn drain_now(
        &self,
        master: &str,
        node: SocketAddr,
    ) -> Result<DrainReport, DrainError> {
        if !self.shared.cfg.enabled {
            return Err(DrainError::Disabled);
        }
        let node = self.known_node(master, node)?;
        let link = NodeLink::new(&node, &self.shared.auth);
        let pacer = self.shared.pacers.of(node.addr());
        let report = drain(&link, &self.shared.rules, &pacer, Scope::All, Reason::Manual).await?;
        record(&self.shared.events, master, &report, true);
        Ok(report)
    }

    fn known_node(&self, master: &str, addr: SocketAddr) -> Result<Node, DrainError> {
        let snapshot = self.shared.topology.borrow();
        let m =
            snapshot.master(master).ok_or_else(|| DrainError::UnknownMaster(master.to_string()))?;
        let primary = m.primary.iter().cloned();
        let replicas = m.replicas.iter().map(|r| Node {
            ip: r.ip,
            port: r.port,
            hostname: r.hostname.clone(),
        });
        let mut known = primary.chain(replicas);
        known
            .find(|n| n.addr() == addr)
            .ok_or_else(|| DrainError::UnknownNode { master: master.to_string(), node: addr })
    }
}
