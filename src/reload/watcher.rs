//! Restarting the Sentinel watcher when a reload changes what it watches, without a gap.
//!
//! The watcher (links and decider) is built from the configuration once; a new masters list,
//! new Sentinel addresses or new node credentials take a new watcher. Stopping the old one and
//! starting a fresh one would publish an empty topology (SERVFAIL, 503) until the new one had
//! reconciled, and restart the SOA serial. So the new watcher first runs beside the old one,
//! writing into a private channel and a private event log, until it has a confirmed primary for
//! every master, none below what the old one publishes, and the old one has no provisional
//! flip left to confirm or withdraw (or [`WARMUP`], then [`SETTLE`], have passed); then the
//! old one is stopped and a forwarding task copies the new one's snapshots into the daemon's
//! topology (with versions that continue the old sequence) and its events into the daemon's
//! event log.
//!
//! What the old watcher published last, once it has stopped, sets the [`Floors`]: the new one
//! cannot lower a confirmed epoch (it may have missed the failover that raised it), and a
//! provisional flip the old one left unresolved is not held up by a watcher that never saw its
//! promotion and so could never withdraw it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast::{self, error::RecvError};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{Changes, ConfigReader};
use crate::config::Config;
use crate::events::{Event, EventLog};
use crate::topology::{self, Master, Publisher, Snapshot, TopologyReader, Withdrawn};

/// How long a new watcher may take to get a full picture before it takes over anyway.
pub const WARMUP: Duration = Duration::from_secs(10);

/// How long, past the warm-up, the takeover waits for the old watcher to confirm or withdraw a
/// provisional flip it published: it alone saw the promotion (a healthy one is confirmed
/// within about a second; one the Sentinels contradict is withdrawn within seconds).
pub const SETTLE: Duration = Duration::from_secs(30);

/// Starts a watcher: the signature of [`crate::sentinel::spawn`].
pub trait Start:
    Fn(&Config, Publisher, Arc<EventLog>, CancellationToken) -> JoinHandle<()>
{
}
impl<F> Start for F where
    F: Fn(&Config, Publisher, Arc<EventLog>, CancellationToken) -> JoinHandle<()>
{
}

/// Runs the watcher for the current configuration and replaces it whenever a reload changes
/// its inputs ([`Changes::watcher`]); returns once `shutdown` is cancelled and the running
/// watcher has stopped. The daemon calls it as
/// `watcher::follow_reloads(config, writer, events, shutdown, crate::source::spawn)`.
pub async fn follow_reloads(
    mut config: ConfigReader,
    writer: Publisher,
    events: Arc<EventLog>,
    shutdown: CancellationToken,
    start: impl Start,
) {
    let mut running = config.borrow_and_update().clone();
    let stop = shutdown.child_token();
    let mut current = Generation {
        handle: start(&running, writer.clone(), events.clone(), stop.clone()),
        stop,
        forward: None,
    };
    loop {
        tokio::select! {
            changed = config.changed() => if changed.is_err() { break },
            _ = shutdown.cancelled() => break,
        }
        let new = config.borrow_and_update().clone();
        if !Changes::watcher(&running, &new) {
            continue;
        }
        tracing::info!("restarting the Sentinel watcher for the new configuration");
        let Some(warmed) = warm_up(&new, &writer, &shutdown, &start).await else { break };
        // The old one stops first: what it published last is what the floors are taken from.
        current.stop().await;
        current = warmed.take_over(&writer, &events);
        running = new;
    }
    current.stop().await;
}

/// One running watcher and, after a restart, the task forwarding its output.
struct Generation {
    handle: JoinHandle<()>,
    stop: CancellationToken,
    forward: Option<JoinHandle<()>>,
}

impl Generation {
    async fn stop(self) {
        self.stop.cancel();
        if let Err(e) = self.handle.await {
            tracing::error!("the Sentinel watcher panicked: {e}");
        }
        if let Some(forward) = self.forward {
            let _ = forward.await;
        }
    }
}

/// A new watcher that ran beside the old one and is ready to take over.
struct Warmed {
    handle: JoinHandle<()>,
    stop: CancellationToken,
    side: TopologyReader,
    /// Its events from the end of the warm-up on.
    live: broadcast::Receiver<Event>,
}

impl Warmed {
    /// Forwards the new watcher's output into the daemon's, over floors taken from what the
    /// daemon publishes now (the old watcher has stopped).
    fn take_over(self, writer: &Publisher, events: &Arc<EventLog>) -> Generation {
        let floors = floors(&writer.current());
        let writer = writer.clone();
        let forward =
            Forward { side: self.side, live: self.live, writer, events: events.clone(), floors };
        let forward = Some(tokio::spawn(forward.run(self.stop.clone())));
        Generation { handle: self.handle, stop: self.stop, forward }
    }
}

/// Starts a watcher for `config` on the side and waits until it may take over (see the module
/// documentation); `None` when shutdown came first.
async fn warm_up(
    config: &Config,
    writer: &Publisher,
    shutdown: &CancellationToken,
    start: &impl Start,
) -> Option<Warmed> {
    let (side_publisher, mut side) = topology::channel();
    let side_events = Arc::new(EventLog::new());
    let stop = shutdown.child_token();
    let handle = start(config, side_publisher, side_events.clone(), stop.clone());
    let mut daemon = writer.reader();
    let waited = async {
        let may = |d: &Snapshot, s: &Snapshot| ready(d, s) && !provisional(d);
        if tokio::time::timeout(WARMUP, until(&mut side, &mut daemon, may)).await.is_err() {
            tracing::warn!(
                "the new Sentinel watcher has no primary for every master, or is behind the \
                 old one, after {WARMUP:?}; switching anyway"
            );
        }
        let settled = until(&mut side, &mut daemon, |d, _| !provisional(d));
        if tokio::time::timeout(SETTLE, settled).await.is_err() {
            tracing::warn!(
                "the old Sentinel watcher still has a provisional flip after {SETTLE:?}; the new \
                 one takes over and publishes what it sees"
            );
        }
    };
    tokio::select! {
        () = waited => {}
        _ = shutdown.cancelled() => {
            stop.cancel();
            let _ = handle.await;
            return None;
        }
    }
    // Events from the warm-up (its Sentinels coming up, its first primaries) describe the new
    // watcher starting, not the world changing: only later ones are forwarded.
    let (_, live) = side_events.follow(side_events.last_id());
    Some(Warmed { handle, stop, side, live })
}

/// Until `cond(daemon's snapshot, new watcher's snapshot)` holds, re-checked whenever either
/// changes (or the new watcher's channel closes: it has nothing more to say).
async fn until(
    side: &mut TopologyReader,
    daemon: &mut TopologyReader,
    cond: impl Fn(&Snapshot, &Snapshot) -> bool,
) {
    loop {
        if cond(&daemon.borrow_and_update(), &side.borrow_and_update()) {
            return;
        }
        tokio::select! {
            changed = side.changed() => if changed.is_err() { return },
            // The supervisor holds the daemon's writer: this channel outlives the wait.
            _ = daemon.changed() => {}
        }
    }
}

/// The new watcher may take over from what the daemon publishes: it has a full picture
/// ([`complete`]) and is behind no confirmed primary ([`behind`]).
pub fn ready(daemon: &Snapshot, side: &Snapshot) -> bool {
    complete(side) && !behind(&floors(daemon), side)
}

/// Every master has a confirmed primary and a Sentinel is reachable.
pub fn complete(s: &Snapshot) -> bool {
    s.source_reachable && !s.masters.is_empty() && s.masters.values().all(|m| m.primary.is_some())
}

/// Some master's primary is a provisional flip.
pub fn provisional(s: &Snapshot) -> bool {
    s.masters.values().any(|m| m.provisional)
}

/// What the daemon published for one master when a restarted watcher took over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Floor {
    /// A confirmed primary: the new watcher may not publish a lower epoch for the master until
    /// it reaches that epoch itself (a reload in the middle of a failover: the old watcher had
    /// flipped, the new one's first majority is still the old primary), or names this one
    /// withdrawn (an agent following its upstreams).
    Hold(Arc<Master>),
    /// A provisional flip the old watcher left unresolved ([`SETTLE`] ran out). The new watcher
    /// never saw its promotion, so it could never confirm nor withdraw it: its own view is
    /// published, naming the flip withdrawn while below it (agents follow a lower epoch only
    /// then).
    Undo(Withdrawn),
}

/// The floors, per master, emptied as the new watcher reaches each.
pub type Floors = BTreeMap<String, Floor>;

/// The floors the daemon's current snapshot sets.
pub fn floors(current: &Snapshot) -> Floors {
    let floor = |m: &Arc<Master>| {
        let flip = Withdrawn { node: m.primary.clone()?, epoch: m.epoch? };
        Some(if m.provisional { Floor::Undo(flip) } else { Floor::Hold(m.clone()) })
    };
    current.masters.iter().filter_map(|(n, m)| Some((n.clone(), floor(m)?))).collect()
}

/// Whether the restarted watcher still has a lower epoch than a confirmed floor for some
/// master (and does not name it withdrawn).
pub fn behind(floors: &Floors, side: &Snapshot) -> bool {
    side.masters.iter().any(|(n, m)| matches!(floors.get(n), Some(Floor::Hold(f)) if holds(f, m)))
}

/// Whether the confirmed floor `f` is above `m` and not withdrawn by it.
fn holds(f: &Master, m: &Master) -> bool {
    let withdrawn = |w: &Withdrawn| Some(w.epoch) == f.epoch && f.primary.as_ref() == Some(&w.node);
    f.epoch > m.epoch && !m.withdrawn.as_ref().is_some_and(withdrawn)
}

/// The restarted watcher's snapshot over the floors: a master below a confirmed floor is kept
/// at the floor; one below a flip that was withdrawn (by the old watcher) or left unresolved
/// names it withdrawn, so that agents follow the lower epoch; a floor the watcher has reached
/// is dropped for good.
pub fn hold(floors: &mut Floors, mut side: Snapshot) -> Snapshot {
    for (name, master) in side.masters.iter_mut() {
        let undone = match floors.get(name) {
            None => continue,
            Some(Floor::Hold(f)) if holds(f, master) => {
                *master = f.clone();
                continue;
            }
            Some(Floor::Hold(f)) => f.withdrawn.clone(),
            Some(Floor::Undo(flip)) => Some(flip.clone()),
        };
        match undone.filter(|flip| Some(flip.epoch) > master.epoch) {
            Some(flip) => {
                if master.withdrawn.is_none() {
                    Arc::make_mut(master).withdrawn = Some(flip.clone());
                }
                floors.insert(name.clone(), Floor::Undo(flip));
            }
            None => {
                floors.remove(name);
            }
        }
    }
    side
}

/// Copies a restarted watcher's snapshots and events into the daemon's.
struct Forward {
    side: TopologyReader,
    /// The restarted watcher's events from the moment it took over.
    live: broadcast::Receiver<Event>,
    writer: Publisher,
    events: Arc<EventLog>,
    /// See [`Floors`]; emptied as the new watcher reaches each.
    floors: Floors,
}

impl Forward {
    async fn run(mut self, stop: CancellationToken) {
        self.publish();
        loop {
            tokio::select! {
                changed = self.side.changed() => match changed {
                    Ok(()) => self.publish(),
                    Err(_) => return,
                },
                event = self.live.recv() => match event {
                    Ok(event) => forward_event(&self.events, event),
                    Err(RecvError::Lagged(n)) => tracing::warn!("{n} watcher events lost in forwarding"),
                    Err(RecvError::Closed) => return,
                },
                _ = stop.cancelled() => return,
            }
        }
    }

    /// Publishes the side snapshot when it differs, with the next version of the daemon's own
    /// sequence (the SOA serial is derived from it and must only grow).
    fn publish(&mut self) {
        let side = self.side.borrow_and_update().clone();
        let held = hold(&mut self.floors, (*side).clone());
        self.writer.replace(held);
    }
}

fn forward_event(log: &EventLog, event: Event) {
    log.push(event.kind, event.master.as_deref(), serde_json::Value::Object(event.data));
}

#[cfg(test)]
mod tests;
