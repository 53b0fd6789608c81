//! The coordinator: turns signals into orders for one episode per (master, node), starting
//! episodes as needed. It never does network I/O, so no node can delay a signal.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::episode::{DrainOrder, Episode, FENCE_HOLD, Orders, Stop};
use super::handle::{Coordinated, DrainHandle};
use super::{Reason, Shared};
use crate::config;
use crate::events::EventLog;
use crate::failover::Signal;
use crate::node::KeptLink;
use crate::topology::{Node, TopologyReader};

pub struct Coordinator {
    /// The current settings; replaced on a reload. Episodes keep the settings they started
    /// with; the manual drain's handles read the current ones.
    shared: watch::Sender<Arc<Shared>>,
    settings: Option<watch::Receiver<Settings>>,
    /// Per master, until when a promotion announced (or flipped provisionally) and neither
    /// confirmed nor aborted counts as under way: no returning-node drain meanwhile.
    promoting: HashMap<String, Instant>,
    /// The links to old primaries, by node, while something holds them: a link opened at the
    /// first sign of a failover ([`WARM_HOLD`]) or a running episode. An episode that starts
    /// for the node takes the link up, already connected.
    links: HashMap<SocketAddr, Weak<KeptLink>>,
    /// The coordinated failovers polestar asked for: their promotion is not fenced.
    coordinated: Coordinated,
}

/// How long a link opened at the first sign of a failover stays open if no episode takes it
/// up: Sentinel's election alone may take up to 10 s before the leader selects a replica.
const WARM_HOLD: Duration = Duration::from_secs(15);

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
        Self {
            shared: watch::Sender::new(Arc::new(shared)),
            settings: None,
            promoting: HashMap::new(),
            links: HashMap::new(),
            coordinated: Coordinated::default(),
        }
    }

    /// Follows `settings` (a reloaded configuration): what starts after a change uses it.
    pub fn follow(mut self, settings: watch::Receiver<Settings>) -> Self {
        self.settings = Some(settings);
        self
    }

    pub fn handle(&self) -> DrainHandle {
        DrainHandle::new(self.shared.subscribe(), self.coordinated.clone())
    }

    fn shared(&self) -> Arc<Shared> {
        self.shared.borrow().clone()
    }

    fn reconfigure(&mut self, (cfg, auth): Settings) {
        // Links carry the old credentials: the next ones are opened with the new.
        self.links.clear();
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

    fn apply(&mut self, signal: Signal, episodes: &mut Episodes, shutdown: &CancellationToken) {
        tracing::debug!(?signal, "drain signal");
        match signal {
            Signal::FailoverStarted { master, primary } => self.warm_fence_link(&master, &primary),
            Signal::Promoting { master, old, new, coordinated, .. } => {
                self.promoting(episodes, shutdown, &master, &old, new.as_ref(), coordinated);
            }
            Signal::Flipped { old: None, master, new, .. } => {
                // A first publication (a watcher restarted by a reload, or after a panic):
                // it undoes nothing, least of all a fence another watcher set for a
                // promotion still under way.
                tracing::debug!(%master, %new, "first publication: no fence or drain changes");
            }
            Signal::Flipped { master, old, new, provisional, at, .. } => {
                if provisional {
                    self.promoting.insert(master.clone(), Instant::now() + FENCE_HOLD);
                } else {
                    self.promoting.remove(&master);
                }
                let at = Instant::from_std(at);
                self.flipped(episodes, shutdown, &master, old, &new, at, provisional);
            }
            Signal::Confirmed { master, new, .. } => {
                self.promoting.remove(&master);
                confirm(episodes, &master, &new);
            }
            Signal::Aborted { master, gave_up } => {
                // Undoes every fence and drain of a promotion not confirmed yet, a provisional
                // flip's included: the node stays the primary.
                self.promoting.remove(&master);
                let stop = if gave_up { Stop::GaveUp } else { Stop::Aborted };
                stop_where(episodes, &master, stop, |_, o| o.demote.is_none());
            }
            Signal::Returning { master, node, published, epoch } => {
                self.returning(episodes, shutdown, &master, &node, &published, epoch)
            }
        }
    }

    /// A failover starts: the link the fence will go over is opened now, so that fencing
    /// takes one round trip.
    fn warm_fence_link(&mut self, master: &str, primary: &Node) {
        tracing::debug!(%master, node = %primary, "failover started: opening the fence's link");
        let link = self.link(primary);
        // Ends by itself after the link's deadline and WARM_HOLD.
        crate::supervise::detached("the fence link's warm-up", async move {
            link.warm().await;
            tokio::time::sleep(WARM_HOLD).await;
        });
    }

    /// `new` is being promoted: the old primary is fenced until the flip (unless Sentinel's
    /// coordinated failover fences it itself).
    fn promoting(
        &mut self,
        episodes: &mut Episodes,
        shutdown: &CancellationToken,
        master: &str,
        old: &Node,
        new: Option<&Node>,
        coordinated: bool,
    ) {
        // The replica being promoted may be an old primary still in its window: its
        // episode must neither sweep nor demote it any more.
        if let Some(new) = new {
            stop_node(episodes, master, new.addr(), Stop::Primary);
        }
        // Fenced until the flip: from now on O's writes are lost. Lifted within
        // FENCE_HOLD if no flip or confirmation follows.
        let hold = Instant::now() + FENCE_HOLD;
        self.promoting.insert(master.to_string(), hold);
        if !fence_at_promotion(coordinated, self.coordinated.holds(master)) {
            tracing::info!(%master, node = %old, "coordinated failover: Sentinel's FAILOVER fences the old primary itself; no fence of ours");
            return;
        }
        self.order(episodes, shutdown, master, old, |o| {
            o.until = o.until.max(hold);
            o.fence_until = o.fence_until.max(hold);
        });
    }

    #[allow(clippy::too_many_arguments)]
    fn flipped(
        &mut self,
        episodes: &mut Episodes,
        shutdown: &CancellationToken,
        master: &str,
        old: Option<Node>,
        new: &Node,
        at: Instant,
        provisional: bool,
    ) {
        stop_node(episodes, master, new.addr(), Stop::Primary);
        let Some(old) = old.filter(|o| o.addr() != new.addr()) else { return };
        // A fence set at a promotion of another node than the one that turned out to be old.
        let others = |node, o: &Orders| o.drain.is_none() && node != old.addr();
        stop_where(episodes, master, Stop::Superseded, others);
        let flipped = Some(Instant::now());
        let order = DrainOrder { at, reason: Reason::Flip, only_if_master: false, flipped };
        let demote = (!provisional).then(|| new.clone());
        self.drain_order(episodes, shutdown, master, &old, order, new, demote);
    }

    /// A node back while another is published: fenced, drained and demoted at once, but only
    /// if the signal still matches what is published (primary and epoch) and no failover of
    /// the master is under way (the node could be the replica being promoted). The episode
    /// itself checks that the node still answers `ROLE` master and the published one too.
    fn returning(
        &mut self,
        episodes: &mut Episodes,
        shutdown: &CancellationToken,
        master: &str,
        node: &Node,
        published: &Node,
        epoch: u64,
    ) {
        if let Some(why) = self.not_returning(master, node, published, epoch) {
            tracing::debug!(master, %node, why, "not draining a returning node");
            return;
        }
        let order = DrainOrder {
            at: Instant::now(),
            reason: Reason::Returning,
            only_if_master: true,
            flipped: None,
        };
        self.drain_order(
            episodes,
            shutdown,
            master,
            node,
            order,
            published,
            Some(published.clone()),
        );
    }

    /// Why `node` is not to be treated as a returning old primary, if it is not.
    fn not_returning(
        &self,
        master: &str,
        node: &Node,
        published: &Node,
        epoch: u64,
    ) -> Option<&'static str> {
        if node.addr() == published.addr() {
            return Some("it is the published primary");
        }
        if self.promoting.get(master).is_some_and(|until| Instant::now() < *until) {
            return Some("a failover of the master is under way");
        }
        let topology = self.shared().topology.clone();
        let snapshot = topology.borrow();
        let Some(m) = snapshot.master(master) else { return Some("unknown master") };
        match &m.primary {
            None => Some("no primary is published"),
            Some(p) if p.addr() == node.addr() => Some("it is the published primary"),
            Some(p) if p.addr() != published.addr() => Some("the signal names another primary"),
            Some(_) if m.epoch.is_some_and(|e| e != epoch) => {
                Some("the signal's epoch is not the published one")
            }
            Some(_) => None,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn drain_order(
        &mut self,
        episodes: &mut Episodes,
        shutdown: &CancellationToken,
        master: &str,
        node: &Node,
        order: DrainOrder,
        target: &Node,
        demote: Option<Node>,
    ) {
        let until = order.at + self.shared().cfg.window;
        let hold = Instant::now() + FENCE_HOLD;
        self.order(episodes, shutdown, master, node, |o| {
            o.until = o.until.max(until);
            o.fence_until = o.fence_until.max(hold);
            // A returning node's order that takes over a flip's (its pass had not reached the
            // node yet) keeps the flip's instant: the failover is still timed, once.
            let flipped = order.flipped.or(o.drain.and_then(|d| d.flipped));
            o.drain = Some(DrainOrder { flipped, ..order });
            o.target = Some(target.clone());
            o.demote = demote.clone();
        });
    }

    /// Changes the orders of the episode for (`master`, `node`), starting one if none runs.
    /// New orders cancel an earlier stop the episode may not have acted on yet.
    fn order(
        &mut self,
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
        let mut orders = Orders::none(Instant::now());
        change(&mut orders);
        episodes.insert(key, self.start_episode(shutdown, master, node, orders));
    }

    /// A new episode for (`master`, `node`) on `orders`: the sender of its orders.
    fn start_episode(
        &mut self,
        shutdown: &CancellationToken,
        master: &str,
        node: &Node,
        orders: Orders,
    ) -> watch::Sender<Orders> {
        let (tx, _) = watch::channel(orders);
        let episode = Episode::new(self.shared(), master.to_string(), self.link(node));
        let stop = shutdown.child_token();
        let running = tx.clone();
        // Ends with its window, its orders (the coordinator holds `tx`), or shutdown.
        crate::supervise::detached("a drain episode", async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = episode.run(running) => {}
            }
        });
        tx
    }
}

impl Coordinator {
    /// The link to `node`: the one some holder keeps open, or a new one.
    fn link(&mut self, node: &Node) -> Arc<KeptLink> {
        self.links.retain(|_, link| link.strong_count() > 0);
        if let Some(link) = self.links.get(&node.addr()).and_then(Weak::upgrade) {
            return link;
        }
        let link = Arc::new(KeptLink::new(node, &self.shared().auth));
        self.links.insert(node.addr(), Arc::downgrade(&link));
        link
    }
}

/// Whether the old primary is fenced at the leader's election or promotion (`+elected-leader`,
/// `+selected-slave`): yes, unless the failover is Valkey 9's coordinated one, as its leader
/// said at the start (`reported`, which every polestar reads) or as this polestar asked for it
/// (`asked`, its own switchover: which also covers a leader whose record could not be read).
/// That leader fences the old primary itself, in one transaction on its command link with the
/// node (`CLIENT PAUSE WRITE`, `FAILOVER TO`), and the node hands over only once the replica
/// has its whole stream. A pause of ours would hold that transaction behind the Sentinels' hello
/// `PUBLISH` on the same link until the failover times out (`-failover-abort-*`), or stall it
/// until our fence lapses. Nothing is lost without ours: the node takes no write between its
/// own pause and its demotion, and the flip's drain and demotion run as for any failover.
pub fn fence_at_promotion(reported: bool, asked: bool) -> bool {
    !(reported || asked)
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

/// The promotion of `new` is confirmed: every episode whose flip named it demotes its node.
fn confirm(episodes: &Episodes, master: &str, new: &Node) {
    let hold = Instant::now() + FENCE_HOLD;
    for ((_, node), tx) in episodes.iter().filter(|((m, _), _)| m == master) {
        let named = {
            let orders = tx.borrow();
            orders.stop.is_none() && orders.target.as_ref().is_some_and(|t| t.addr() == new.addr())
        };
        if named {
            tracing::debug!(master, %node, %new, "promotion confirmed: demoting");
            update(tx, &|o: &mut Orders| {
                o.demote = Some(new.clone());
                o.fence_until = o.fence_until.max(hold);
            });
        }
    }
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

#[cfg(test)]
mod tests;
