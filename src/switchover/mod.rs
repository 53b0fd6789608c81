//! Planned maintenance without loss: the switchover behind `POST /v1/masters/{name}/failover`
//! and `polestar failover`, and the node handoff behind `POST /v1/nodes/{ip:port}/handoff` and
//! `polestar handoff`.
//!
//! Why: Sentinel promotes a replica with `SLAVEOF NO ONE` whatever it has not received yet, so
//! a planned `SENTINEL FAILOVER` under write load loses about one acknowledged write per byte
//! of replication lag (redis/redis#6062). polestar's switchover fences the primary first
//! (`CLIENT PAUSE <ms> WRITE`, renewed, so it lapses if polestar dies), waits until every
//! replica Sentinel may promote has acknowledged the primary's whole replication offset
//! (at most `max_wait`, and never more than 40% of Sentinel's `down-after-milliseconds`,
//! `run::fence_bound`: a fence held about that long makes the Sentinels find the primary
//! down and fail over on their own), and only then asks the same Sentinel to fail over,
//! keeping the fence until the new primary is published (the drain side takes over from the
//! leader's `+selected-slave`: flip, drain, demote). If the replicas do not catch up in time
//! the fence is lifted and nothing fails over.
//!
//! With Valkey 9 on the Sentinel and every node (`version`) it asks for `SENTINEL FAILOVER
//! <master> COORDINATED` instead, after lifting its fence: the leader then has the primary
//! pause its writes and hand over itself (`CLIENT PAUSE WRITE` + `FAILOVER TO` in one
//! transaction on its command link), and a pause of ours would hold that transaction behind
//! the Sentinels' hello `PUBLISH`. No polestar fences such a failover's promotion: each reads
//! the leader's `coordinated_failover` flag when the failover starts (the Sentinel side), and
//! the one that asked for it also marks it for its drain side. A `COORDINATED` that Sentinel
//! refuses with an error is followed by a plain failover, fenced and waited for again. The
//! flip's drain and demotion run as for any failover.
//!
//! Refused before anything is fenced: during a failover, while another switchover or handoff
//! of the master runs, and while a replica Sentinel could promote is handed off (it is about
//! to be stopped: `choose::handed_off_candidate`).
//!
//! The handoff of a replica takes it out of every replica answer at once ([`mask`]: it is
//! published unhealthy), drains its clients, and lets it back once it is back ([`back`]:
//! restarted, a linked and caught-up replica of the published primary, looked at directly);
//! one node of a master at a time, never the last healthy replica, the primary's handoff
//! included, and (when the caller names the master) never a node of another master. What can
//! clear by itself is waited for within the handoff's `wait` ([`handoff`]).

mod back;
mod catchup;
mod choose;
mod fence;
mod handoff;
mod info;
mod link;
pub mod mask;
mod run;
mod version;

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::config::{Auth, Sentinels};
use crate::control::{HandedOff, Switched, SwitchoverError, SwitchoverOptions};
use crate::drain::DrainHandle;
use crate::events::EventLog;
use crate::topology::{Master, MasterState, TopologyReader};

pub use mask::Handoffs;

/// What a switchover or a handoff works with, from the running configuration.
#[derive(Clone)]
pub struct Deps {
    pub sentinels: Sentinels,
    pub nodes: Auth,
    /// `drain.interval`: how often the fence is renewed.
    pub interval: Duration,
    /// The published topology (the masked one: a handed-off replica is unhealthy in it).
    pub topology: TopologyReader,
    /// The topology as its writer published it, before the mask: Sentinel's own view of a
    /// handed-off replica.
    pub raw: TopologyReader,
    pub events: Arc<EventLog>,
    pub drain: Option<DrainHandle>,
    /// `readiness.max_lag`: how far behind a node handed off may be and count as back.
    pub max_lag: u64,
}

impl Deps {
    fn master(&self, name: &str) -> Result<Arc<Master>, SwitchoverError> {
        let snapshot = self.topology.borrow();
        let master = snapshot.master(name).cloned();
        master.ok_or_else(|| SwitchoverError::UnknownMaster(name.to_string()))
    }

    /// Whether the published state says a failover of `master` is under way.
    fn failing_over(&self, master: &str) -> bool {
        self.master(master).is_ok_and(|m| m.state == MasterState::Failover)
    }
}

/// What lives from one request to the next: the masters a switchover or a handoff runs for
/// now (one at a time per master), the nodes a handoff is asked for now (one request at a time
/// per node), and the nodes handed off, with what was known of each when it was.
#[derive(Default)]
pub struct Maintenance {
    busy: Mutex<BTreeSet<String>>,
    asking: Mutex<BTreeSet<SocketAddr>>,
    pub handoffs: Handoffs,
    marks: Mutex<HashMap<SocketAddr, handoff::Marked>>,
}

/// A key held in one of [`Maintenance`]'s sets; dropping it frees the key. It owns its
/// `Maintenance`, so that a switchover's task can keep it past a caller that went away.
struct Held<K: Ord + 'static> {
    maintenance: Arc<Maintenance>,
    set: fn(&Maintenance) -> &Mutex<BTreeSet<K>>,
    key: K,
}

impl<K: Ord + 'static> Drop for Held<K> {
    fn drop(&mut self) {
        lock((self.set)(&self.maintenance)).remove(&self.key);
    }
}

/// Only inserts and removes under these locks: a poisoned one is still consistent.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Maintenance {
    fn hold<K: Ord + Clone>(
        self: &Arc<Self>,
        set: fn(&Self) -> &Mutex<BTreeSet<K>>,
        key: &K,
    ) -> Option<Held<K>> {
        let fresh = lock(set(self)).insert(key.clone());
        fresh.then(|| Held { maintenance: self.clone(), set, key: key.clone() })
    }

    fn take(self: &Arc<Self>, master: &str) -> Result<Held<String>, SwitchoverError> {
        self.hold(|m| &m.busy, &master.to_string()).ok_or_else(|| {
            let why = "another switchover or handoff of it is running".to_string();
            SwitchoverError::Busy { master: master.to_string(), why }
        })
    }

    /// Holds `node` for one handoff request: a second one at the same time is refused.
    fn asking(self: &Arc<Self>, node: SocketAddr) -> Result<Held<SocketAddr>, SwitchoverError> {
        self.hold(|m| &m.asking, &node).ok_or(SwitchoverError::Twice(node))
    }

    /// The lossless switchover of `master` (see the module doc).
    pub async fn switchover(
        self: &Arc<Self>,
        deps: &Deps,
        master: &str,
        options: SwitchoverOptions,
    ) -> Result<Switched, SwitchoverError> {
        let m = deps.master(master)?;
        let primary =
            m.primary.as_ref().ok_or_else(|| SwitchoverError::NoPrimary(master.into()))?;
        if m.state == MasterState::Failover {
            let why = "a failover is in progress".to_string();
            return Err(SwitchoverError::Busy { master: master.to_string(), why });
        }
        let busy = self.take(master)?;
        let handed_off = self.handoffs.of(master);
        run::to_the_end(busy, deps, master, primary.addr(), handed_off, options).await
    }

    /// The handoff of `node` (see [`handoff`]), of `master` if given.
    pub async fn handoff(
        self: &Arc<Self>,
        deps: &Deps,
        node: SocketAddr,
        master: Option<&str>,
        options: SwitchoverOptions,
        wait: Duration,
    ) -> Result<HandedOff, SwitchoverError> {
        handoff::handoff(self, deps, node, master, options, wait).await
    }
}
