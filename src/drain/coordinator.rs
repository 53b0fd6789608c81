//! The coordinator: turns signals into orders for one episode per (master, node), starting
//! episodes as needed. It never does network I/O, so no node can delay a signal.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::episode::{DrainOrder, Episode, Orders, Stop};
use super::handle::DrainHandle;
use super::{Reason, Shared};
use crate::config;
use crate::events::EventLog;
use crate::failover::Signal;
use crate::topology::{Node, TopologyReader};

pub struct Coordinator {
    /// The current settings; replaced on a reload. Episodes keep the settings they started
    /// with; the manual drain's handles read the current ones.
    shared: watch::Sender<Arc<Shared>>,
    settings: Option<watch::Receiver<Settings>>,
}

/// What a reload can change: the `drain` section and the data nodes' credentials.
pub type Settings = (config::Drain, config::Auth);

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
        let shared = Shared::new(cfg, nodes_auth, events, topology);
        Self { shared: watch::Sender::new(Arc::new(shared)), settings: None }
    }

    /// Follows `settings` (a reloaded configuration): what starts after a change uses it.
    pub fn follow(mut self, settings: watch::Receiver<Settings>) -> Self {
        self.settings = Some(settings);
        self
    }

    pub fn handle(&self) -> DrainHandle {
        DrainHandle::new(self.shared.subscribe())
    }

    fn shared(&self) -> Arc<Shared> {
        self.shared.borrow().clone()
    }

    fn reconfigure(&self, (cfg, auth): Settings) {
        let old = self.shared();
        let shared = Shared::new(cfg, auth, old.events.clone(), old.topology.clone());
        tracing::info!(
            enabled = shared.cfg.enabled,
            rate = shared.cfg.rate,
            "drain settings reloaded"
        );
        self.shared.send_replace(Arc::new(shared));
    }

    /// Runs until shutdown. Signals are applied in order and never wait for a node; when the
    /// sending side goes away, running episodes still finish their windows.
    pub async fn run(
        mut self,
        mut signals: mpsc::UnboundedReceiver<Signal>,
        shutdown: CancellationToken,
    ) {
        let mut episodes = Episodes::new();
        let mut settings = self.settings.take();
        loop {
            let reloaded = async {
                let Some(rx) = settings.as_mut() else { return std::future::pending().await };
                match rx.changed().await {
                    Ok(()) => rx.borrow_and_update().clone(),
                    Err(_) => std::future::pending().await,
                }
            };
            let signal = tokio::select! {
                () = shutdown.cancelled() => break,
                new = reloaded => {
                    self.reconfigure(new);
                    continue;
                }
                signal = signals.recv() => signal,
            };
            let Some(signal) = signal else {
                shutdown.cancelled().await;
                break;
            };
            if self.shared().cfg.enabled {
                episodes.retain(|_, tx| !tx.borrow().closed);
                self.apply(signal, &mut episodes, &shutdown);
            }
        }
    }

    fn apply(&self, signal: Signal, episodes: &mut Episodes, shutdown: &CancellationToken) {
        tracing::debug!(?signal, "drain signal");
        match signal {
            Signal::Promoting { master, old, at, .. } => {
                // Fenced until the flip (or the abort): from now on O's writes are lost.
                let until = Instant::from_std(at) + self.shared().cfg.window;
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
            // Demotion of the old primary: not built yet.
            Signal::Confirmed { .. } => {}
            Signal::Returning { master, node, .. } => {
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
            self.shared().topology.borrow().master(master).and_then(|m| m.primary.clone());
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
        let cfg = &self.shared().cfg;
        let (until, fence_until) = (order.at + cfg.window, order.at + cfg.grace);
        self.order(episodes, shutdown, master, node, |o| {
            o.until = o.until.max(until);
            o.fence_until = fence_until;
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
        let episode = Episode::new(self.shared(), master.to_string(), node);
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
