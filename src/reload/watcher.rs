//! Restarting the Sentinel watcher when a reload changes what it watches, without a gap.
//!
//! The watcher (links and decider) is built from the configuration once; a new masters list,
//! new Sentinel addresses or new node credentials take a new watcher. Stopping the old one and
//! starting a fresh one would publish an empty topology (SERVFAIL, 503) until the new one had
//! reconciled, and restart the SOA serial. So the new watcher first runs beside the old one,
//! writing into a private channel and a private event log, until it has a confirmed primary for
//! every master (or [`WARMUP`] has passed); then the old one is stopped and a forwarding task
//! copies the new one's snapshots into the daemon's topology (with versions that continue the
//! old sequence) and its events into the daemon's event log.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast::{self, error::RecvError};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{Changes, ConfigReader};
use crate::config::Config;
use crate::events::{Event, EventLog};
use crate::topology::{self, Master, Snapshot, TopologyReader, TopologyWriter};

/// How long a new watcher may take to get a full picture before it takes over anyway.
pub const WARMUP: Duration = Duration::from_secs(10);

/// Starts a watcher: the signature of [`crate::sentinel::spawn`].
pub trait Start:
    Fn(&Config, TopologyWriter, Arc<EventLog>, CancellationToken) -> JoinHandle<()>
{
}
impl<F> Start for F where
    F: Fn(&Config, TopologyWriter, Arc<EventLog>, CancellationToken) -> JoinHandle<()>
{
}

/// Runs the watcher for the current configuration and replaces it whenever a reload changes
/// its inputs ([`Changes::watcher`]); returns once `shutdown` is cancelled and the running
/// watcher has stopped. The daemon calls it as
/// `tokio::spawn(watcher::supervise(config, writer, events, shutdown, crate::sentinel::spawn))`.
pub async fn supervise(
    mut config: ConfigReader,
    writer: TopologyWriter,
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
        let Some(next) = warm_up(&new, &writer, &events, &shutdown, &start).await else { break };
        current.stop().await;
        current = next;
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

/// Starts a watcher for `config` on the side and waits until it has a full picture; `None`
/// when shutdown came first. The returned generation already forwards into `writer`.
async fn warm_up(
    config: &Config,
    writer: &TopologyWriter,
    events: &Arc<EventLog>,
    shutdown: &CancellationToken,
    start: &impl Start,
) -> Option<Generation> {
    let (side_writer, mut side) = topology::channel();
    let side_events = Arc::new(EventLog::new());
    let stop = shutdown.child_token();
    let handle = start(config, side_writer, side_events.clone(), stop.clone());
    let mut floors = floors(&writer.borrow());
    let ready = async { side.wait_for(|s| complete(s) && !behind(&floors, s)).await.is_ok() };
    tokio::select! {
        ready = tokio::time::timeout(WARMUP, ready) => if !matches!(ready, Ok(true)) {
            tracing::warn!(
                "the new Sentinel watcher has no primary for every master after {WARMUP:?}; \
                 switching anyway"
            );
        },
        _ = shutdown.cancelled() => {
            stop.cancel();
            let _ = handle.await;
            return None;
        }
    }
    // Events from the warm-up (its Sentinels coming up, its first primaries) describe the new
    // watcher starting, not the world changing: only later ones are forwarded.
    let (_, live) = side_events.follow(side_events.last_id());
    let writer = topology::Publisher::new(writer.clone());
    floors.retain(|_, m| m.epoch.is_some());
    let forward = Forward { side, live, writer, events: events.clone(), floors };
    let forward = Some(tokio::spawn(forward.run(stop.clone())));
    Some(Generation { handle, stop, forward })
}

/// Every master has a confirmed primary and a Sentinel is reachable.
pub fn complete(s: &Snapshot) -> bool {
    s.source_reachable && !s.masters.is_empty() && s.masters.values().all(|m| m.primary.is_some())
}

/// What the daemon published for each master when a restarted watcher took over: the new
/// watcher may not publish a lower epoch for it until it has reached that epoch itself (a
/// reload in the middle of a failover: the old watcher had flipped, the new one's first
/// majority is still the old primary). Its own withdrawals happen above the floor.
pub type Floors = BTreeMap<String, Arc<Master>>;

/// The floors the daemon's current snapshot sets.
pub fn floors(current: &Snapshot) -> Floors {
    current.masters.iter().map(|(n, m)| (n.clone(), m.clone())).collect()
}

/// Whether the restarted watcher still has a lower epoch than a floor for some master.
pub fn behind(floors: &Floors, side: &Snapshot) -> bool {
    side.masters.iter().any(|(n, m)| floors.get(n).is_some_and(|f| f.epoch > m.epoch))
}

/// The restarted watcher's snapshot with every master below its floor kept at the floor;
/// a floor the watcher has reached is dropped for good.
pub fn hold(floors: &mut Floors, mut side: Snapshot) -> Snapshot {
    for (name, master) in side.masters.iter_mut() {
        match floors.get(name) {
            Some(floor) if floor.epoch > master.epoch => *master = floor.clone(),
            Some(_) => {
                floors.remove(name);
            }
            None => {}
        }
    }
    side
}

/// Copies a restarted watcher's snapshots and events into the daemon's.
struct Forward {
    side: TopologyReader,
    /// The restarted watcher's events from the moment it took over.
    live: broadcast::Receiver<Event>,
    writer: topology::Publisher,
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
