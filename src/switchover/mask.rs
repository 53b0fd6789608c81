//! The replicas being handed off, and the stage that hides them: between the topology's one
//! writer (the Sentinel side, an agent, the reload watcher) and every reader (DNS, HTTP, the
//! Sentinel endpoint, drain, sweep), a replica being handed off is published unhealthy. So it
//! leaves `replicas.<label>`, the HTTP replica lists (as `healthy: false`) and `SENTINEL
//! REPLICAS` (flagged `s_down`, with a `+sdown` to subscribers) in one published change, and
//! comes back in one when its handoff ends.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::topology::{Publisher, Snapshot, TopologyReader};

/// (master, replica) pairs handed off now.
pub type Out = BTreeSet<(String, SocketAddr)>;

/// Who is handed off. The handoff requests change it; the mask stage ([`run`]) follows it.
pub struct Handoffs {
    tx: watch::Sender<Out>,
}

impl Default for Handoffs {
    fn default() -> Self {
        Self { tx: watch::Sender::new(Out::new()) }
    }
}

impl Handoffs {
    pub fn subscribe(&self) -> watch::Receiver<Out> {
        self.tx.subscribe()
    }

    pub fn contains(&self, master: &str, node: SocketAddr) -> bool {
        self.tx.borrow().contains(&(master.to_string(), node))
    }

    /// The nodes of `master` handed off now.
    pub fn of(&self, master: &str) -> Vec<SocketAddr> {
        self.tx.borrow().iter().filter(|(m, _)| m == master).map(|(_, n)| *n).collect()
    }

    /// The master whose handoff of `node` is under way, if any.
    pub fn master_of(&self, node: SocketAddr) -> Option<String> {
        self.tx.borrow().iter().find(|(_, n)| *n == node).map(|(m, _)| m.clone())
    }

    /// Takes `node` out; false if it already was.
    pub fn take_out(&self, master: &str, node: SocketAddr) -> bool {
        self.tx.send_if_modified(|out| out.insert((master.to_string(), node)))
    }

    /// Brings `node` back; false if it was not out.
    pub fn bring_back(&self, master: &str, node: SocketAddr) -> bool {
        self.tx.send_if_modified(|out| out.remove(&(master.to_string(), node)))
    }
}

/// `snapshot` with every handed-off replica unhealthy; masters without one keep their `Arc`.
pub fn mask(snapshot: &Snapshot, out: &Out) -> Snapshot {
    let mut masked = snapshot.clone();
    for (name, master) in masked.masters.iter_mut() {
        let hidden = |addr: SocketAddr| out.contains(&(name.clone(), addr));
        if !master.replicas.iter().any(|r| r.healthy && hidden(SocketAddr::new(r.ip, r.port))) {
            continue;
        }
        let mut copy = (**master).clone();
        for replica in &mut copy.replicas {
            if hidden(SocketAddr::new(replica.ip, replica.port)) {
                replica.healthy = false;
            }
        }
        *master = Arc::new(copy);
    }
    masked
}

/// Copies `raw` into `publisher`, masked, on every change of either, until shutdown. Nothing
/// is published before the raw side has published once.
///
/// `raw` is the main input: its writer going away while the daemon runs is an error, the
/// daemon's to report (STYLE rule 14). The handoffs are a side input: a polestar without an
/// HTTP API has nobody to ask for one, so their sender may be gone from the start, and the
/// last set (empty) simply stays in force.
pub async fn run(
    mut raw: TopologyReader,
    mut out: watch::Receiver<Out>,
    publisher: Publisher,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut handoffs_open = true;
    loop {
        let snapshot = raw.borrow_and_update().clone();
        if snapshot.version > 0 {
            publisher.replace(mask(&snapshot, &out.borrow_and_update()));
        }
        tokio::select! {
            changed = raw.changed() => if changed.is_err() {
                return crate::topology::input_closed("the handoff mask", &shutdown);
            },
            changed = out.changed(), if handoffs_open => handoffs_open = changed.is_ok(),
            () = shutdown.cancelled() => return Ok(()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on purpose
mod tests {
    use super::*;
    use crate::topology::{Master, MasterState, Replica, SentinelCounts};

    fn snapshot() -> Snapshot {
        let replica = |port, healthy| Replica {
            ip: [10, 0, 0, 2].into(),
            port,
            hostname: None,
            healthy,
            down: !healthy,
        };
        let master = |name: &str| Master {
            withdrawn: None,
            provisional: false,
            name: name.into(),
            label: name.into(),
            primary: None,
            epoch: Some(1),
            since: None,
            state: MasterState::Ok,
            replicas: vec![replica(1, true), replica(2, true), replica(3, false)],
            sentinels: SentinelCounts::default(),
        };
        let masters = [("a", master("a")), ("b", master("b"))];
        Snapshot {
            version: 4,
            masters: masters.into_iter().map(|(n, m)| (n.to_string(), Arc::new(m))).collect(),
            source_reachable: true,
        }
    }

    fn healthy(s: &Snapshot, master: &str) -> Vec<bool> {
        s.masters[master].replicas.iter().map(|r| r.healthy).collect()
    }

    #[test]
    fn a_handed_off_replica_is_unhealthy_in_its_own_master_only() {
        let raw = snapshot();
        let out: Out = [("a".to_string(), SocketAddr::from(([10, 0, 0, 2], 2)))].into();
        let masked = mask(&raw, &out);
        assert_eq!(healthy(&masked, "a"), [true, false, false]);
        assert_eq!(healthy(&masked, "b"), [true, true, false]);
        assert!(Arc::ptr_eq(&raw.masters["b"], &masked.masters["b"]), "untouched: shared");
        assert_eq!(mask(&raw, &Out::new()), raw);
    }

    #[tokio::test]
    async fn the_stage_republishes_when_a_handoff_starts_and_ends() {
        let (raw_publisher, raw) = crate::topology::channel();
        let (publisher, mut public) = crate::topology::channel();
        let handoffs = Handoffs::default();
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(raw, handoffs.subscribe(), publisher, stop.clone()));
        raw_publisher.replace(snapshot());
        let first = public.wait_for(|s| s.version > 0).await.unwrap().clone();
        assert_eq!(healthy(&first, "a"), [true, true, false]);
        let node = SocketAddr::from(([10, 0, 0, 2], 1));
        assert!(handoffs.take_out("a", node));
        assert!(!handoffs.take_out("a", node), "idempotent");
        let out = public.wait_for(|s| !s.masters["a"].replicas[0].healthy).await.unwrap().clone();
        assert!(out.version > first.version, "a new version: the SOA serial moves");
        handoffs.bring_back("a", node);
        public.wait_for(|s| s.masters["a"].replicas[0].healthy).await.unwrap();
        stop.cancel();
        task.await.unwrap().unwrap();
    }

    /// Without an HTTP API nothing holds the handoffs' sender: the mask must go on copying
    /// every change (it stopped, and a polestar without `http:` served nothing).
    #[tokio::test]
    async fn the_stage_follows_the_writer_when_nobody_can_ask_for_a_handoff() {
        let (raw_publisher, raw) = crate::topology::channel();
        let (publisher, mut public) = crate::topology::channel();
        let handoffs = Handoffs::default();
        let subscribed = handoffs.subscribe();
        drop(handoffs);
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(raw, subscribed, publisher, stop.clone()));
        raw_publisher.replace(snapshot());
        public.wait_for(|s| s.version > 0).await.unwrap();
        let mut next = snapshot();
        next.masters.remove("b");
        raw_publisher.replace(next);
        public.wait_for(|s| !s.masters.contains_key("b")).await.unwrap();
        stop.cancel();
        task.await.unwrap().unwrap();
    }

    /// The writer gone while the daemon runs is an error, not a quiet end.
    #[tokio::test]
    async fn the_writer_gone_before_shutdown_is_an_error() {
        let (raw_publisher, raw) = crate::topology::channel();
        let (publisher, _public) = crate::topology::channel();
        let handoffs = Handoffs::default();
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(raw, handoffs.subscribe(), publisher, stop.clone()));
        drop(raw_publisher);
        let ended = task.await.unwrap();
        assert!(ended.is_err(), "{ended:?}");
    }
}
