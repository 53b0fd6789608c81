//! One Sentinel, watched over two connections: on one, `PSUBSCRIBE *` for its events and a
//! `PING` with a deadline every second; on the other (replies read in place: `SENTINEL MASTERS`
//! is some 40 strings a master), a reconciliation of the masters an event names as soon as it
//! arrives, and a full reconciliation (`SENTINEL MASTERS` and friends) at start and
//! periodically: every second for a few masters, paced by the number of masters for many
//! (10 ms per master, at most 30 s), so that 1,000 masters cost Sentinel and polestar a
//! full picture every 10 s rather than 4,000 commands a second per Sentinel.
//!
//! Whatever the Sentinel sends costs bounded memory: its pushes wait in a bounded queue that
//! the connection's reader never waits on, and the events it turns into observations are
//! held to a budget; what does not fit is dropped and a full reconciliation (which reads the
//! same truth) is asked for instead. Nothing in the event loop awaits the network, so a flood
//! or a slow lookup cannot stall the `PING` deadline.
//!
//! A link never gives up: any error ends the session, the decider is told the Sentinel is
//! down, and the link reconnects to the same address with backoff, forever. Links exist only
//! for configured addresses (see the trust model in `super`).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesOrdered;

use redis::aio::MultiplexedConnection;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::{Mutex, Notify, mpsc};
use tokio::time::{MissedTickBehavior, interval, sleep, timeout};
use tokio_util::sync::CancellationToken;

use super::core::{Candidate, Follower, SentinelId};
use super::message::{
    Addr, Event, Fields, MasterRecord, PeerRecord, ReplicaRecord, coordinated_failover,
    master_addr, records, text,
};
use super::{MasterReport, Observation, Report, Scope};
use crate::node::reply::{Replies, Reply};
use crate::node::{Endpoint, PushSink, RawConn, connect};
use crate::readiness::facts::MasterFacts;
use crate::readiness::heard::{Heard, Records};
use crate::readiness::{self};
use crate::topology::{Node, Replica};

mod flow;
mod reconcile;
mod translate;

use flow::*;
use reconcile::*;
use translate::{Tell, translate};

/// The name of a link's connection for reconciliations (`CLIENT LIST` shows it).
pub const RECONCILE_CONNECTION_NAME: &str = "polestar-reconcile";
const PING_EVERY: Duration = Duration::from_secs(1);
const PING_DEADLINE: Duration = Duration::from_millis(1500);
const RESOLVE_DEADLINE: Duration = Duration::from_secs(1);
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Failovers whose epoch a session remembers.
const MAX_FAILOVERS: usize = 4096;
#[derive(Debug, thiserror::Error)]
enum LinkError {
    #[error("{0}")]
    Redis(#[from] redis::RedisError),
    #[error("no answer to PING within {0:?}")]
    PingTimeout(Duration),
    #[error("connection closed")]
    Closed,
    /// It refused a question of a reconciliation.
    #[error("refused: {0}")]
    Refused(String),
    /// It answered, and refused `SENTINEL`: something other than a Sentinel.
    #[error("not a Sentinel: {0}")]
    NotSentinel(redis::RedisError),
}

/// Whether a refusal of `SENTINEL MYID` proves the server is no Sentinel (a plain data node
/// answers "unknown command"), rather than a Sentinel that denied it (auth, ACL).
fn is_not_sentinel(e: &redis::RedisError) -> bool {
    e.to_string().to_ascii_lowercase().contains("unknown command")
}

/// Whether a failed connection proves the peer is no Sentinel: it answered, but not in RESP
/// (a Sentinel always does). A timeout or a refused connection proves nothing: that may be a
/// Sentinel that is down or cut off, and it keeps counting towards the majority.
fn speaks_no_resp(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Parse
}

pub struct Link {
    pub id: SentinelId,
    pub endpoint: Endpoint,
    /// Only these masters are reported (`None`: all).
    pub masters: Option<Arc<HashSet<String>>>,
    /// The decider; closing it ends the link.
    pub tx: mpsc::UnboundedSender<Observation>,
    pub stop: CancellationToken,
    /// Where the readiness poll finds this Sentinel's records of its masters, read by the
    /// reconciliations (none in tests that have no poll).
    pub heard: Option<Heard>,
}

impl Link {
    /// Watches the Sentinel until `stop` is cancelled.
    pub async fn run(self) {
        let _forget = Forget(self.heard.clone(), self.endpoint.name());
        let mut backoff = BACKOFF_MIN;
        loop {
            let started = Instant::now();
            let result = tokio::select! {
                r = self.session() => r,
                _ = self.stop.cancelled() => return,
            };
            if let Some(heard) = &self.heard {
                heard.forget(&self.endpoint.name());
            }
            let observation = match result {
                Ok(()) => return,
                Err(LinkError::NotSentinel(e)) => {
                    Observation::NotSentinel { from: self.id, reason: e.to_string() }
                }
                Err(e) => Observation::Down { from: self.id, reason: e.to_string() },
            };
            if self.tx.send(observation).is_err() {
                return;
            }
            if started.elapsed() > BACKOFF_MAX * 5 {
                backoff = BACKOFF_MIN;
            }
            tokio::select! {
                _ = sleep(backoff) => {}
                _ = self.stop.cancelled() => return,
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// Connects, checks that the address is a Sentinel (`SENTINEL MYID`) and subscribes to
    /// all its events, before the first reconciliation so that no change falls in between.
    async fn open(&self) -> Result<(MultiplexedConnection, Pushes), LinkError> {
        let (sink, pushes) = push_queue();
        let connected = connect(&self.endpoint, Some(sink)).await;
        let mut conn = connected.map_err(|e| match speaks_no_resp(&e) {
            true => LinkError::NotSentinel(e),
            false => LinkError::Redis(e),
        })?;
        let myid = redis::cmd("SENTINEL").arg("MYID").query_async::<Value>(&mut conn).await;
        let myid = myid.map_err(|e| match is_not_sentinel(&e) {
            true => LinkError::NotSentinel(e),
            false => LinkError::Redis(e),
        })?;
        conn.psubscribe("*").await?;
        self.send(Observation::Up { from: self.id, myid: text(&myid) });
        Ok((conn, pushes))
    }

    /// A reconciliation of `scope`, run beside the event loop on a clone of the connection;
    /// `peers`: the peer counts a full one compares against (`None` for a scoped one).
    fn reconciliation(
        &self,
        scope: Scope,
        peers: Option<PeerCounts>,
        raw: &Arc<Mutex<RawConn>>,
    ) -> InFlight<(Report, Read)> {
        let (only, keep, raw) = (self.masters.clone(), self.heard.is_some(), raw.clone());
        Box::pin(reconcile(self.id, scope, only, raw, keep, peers))
    }

    /// One connection's life: the first full reconciliation, then, until an error, a loop
    /// that awaits nothing on the network itself: the PING and the lookups an event needs
    /// (hostnames, an epoch) run beside it on clones of the connection, the reconciliations on
    /// a second connection whose replies are read in place ([`RawConn`]), so the PING deadline
    /// holds and a `+promoted-slave` is passed on at once whatever else is in flight.
    async fn session(&self) -> Result<(), LinkError> {
        let (conn, mut pushes) = self.open().await?;
        let raw = RawConn::open(&self.endpoint, RECONCILE_CONNECTION_NAME).await?;
        let raw = Arc::new(Mutex::new(raw));
        let mut reconciling = self.first_reconciliation(&raw).await?;
        let mut ping = interval(PING_EVERY);
        ping.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut pinging: Option<InFlight<()>> = None;
        let (mut state, mut pending, mut drops) =
            (Session::default(), Pending::default(), Drops::default());
        loop {
            // Pushes come last: a flood of them must not starve the PING or the reports.
            tokio::select! {
                biased;
                pong = async { pinging.as_mut().expect("guarded by the condition").await }, if pinging.is_some() => {
                    pinging = None;
                    pong?;
                }
                report = async { reconciling.running.as_mut().expect("guarded by the condition").await }, if reconciling.running.is_some() => {
                    reconciling.running = None;
                    self.reconciled(report?, &mut reconciling);
                }
                Some(observation) = pending.queue.next(), if !pending.queue.is_empty() => {
                    if let Some(observation) = observation? {
                        self.send(observation);
                    }
                }
                _ = ping.tick(), if pinging.is_none() => pinging = Some(Box::pin(ping_once(conn.clone()))),
                () = reconciling.pace.tick() => reconciling.due.add(Scope::All),
                () = pushes.lost.notified() => self.pushes_lost(&pushes, &mut drops, &mut reconciling.due)?,
                push = pushes.rx.recv() => {
                    let push = push.ok_or(LinkError::Closed)?;
                    if let Some(scope) = self.on_push(push, &mut state, &conn, &mut pending)? {
                        reconciling.due.add(scope);
                    }
                }
            }
            self.over_budget(&mut pending, &mut drops, &mut reconciling.due);
            self.start_due(&mut reconciling, &raw);
        }
    }

    /// The first full reconciliation, before any event is read: passed on, and the pace and
    /// peer counts of the next full ones taken from it.
    async fn first_reconciliation(
        &self,
        raw: &Arc<Mutex<RawConn>>,
    ) -> Result<Reconciling, LinkError> {
        let first = self.reconciliation(Scope::All, Some(PeerCounts::default()), raw);
        let (first, mut read) = first.await?;
        let peers = read.peers.take();
        self.hear(read);
        let pace = Pace::new(first.masters.len());
        self.send(Observation::Report(first));
        Ok(Reconciling { running: None, due: Due::default(), pace, peers })
    }

    /// A reconciliation is done: its records go to the readiness poll, its report to the
    /// decider; a full one re-paces the next ones to its number of masters.
    fn reconciled(&self, (report, mut read): (Report, Read), reconciling: &mut Reconciling) {
        if let Some(counts) = read.peers.take() {
            reconciling.peers = Some(counts);
        }
        self.hear(read);
        if report.scope == Scope::All {
            reconciling.pace.follow(report.masters.len());
        }
        self.send(Observation::Report(report));
    }

    /// Starts the reconciliation of what is due, unless one runs; a full one restarts the
    /// pace and takes the peer counts to compare against.
    fn start_due(&self, reconciling: &mut Reconciling, raw: &Arc<Mutex<RawConn>>) {
        if reconciling.running.is_some() {
            return;
        }
        let Some(scope) = reconciling.due.take() else { return };
        let counts = match scope {
            Scope::All => {
                reconciling.pace.restart();
                Some(reconciling.peers.take().unwrap_or_default())
            }
            Scope::Masters(_) => None,
        };
        reconciling.running = Some(self.reconciliation(scope, counts, raw));
    }

    /// Events past the budget were dropped: a full reconciliation reads the same truth.
    fn over_budget(&self, pending: &mut Pending, drops: &mut Drops, due: &mut Due) {
        if pending.overflowed() {
            drops.note(&self.endpoint, "sends more events than the budget");
            due.add(Scope::All);
        }
    }

    /// The push queue dropped some: the connection is gone, or the Sentinel sends events
    /// faster than they are read and a full reconciliation reads the same truth instead.
    fn pushes_lost(
        &self,
        pushes: &Pushes,
        drops: &mut Drops,
        due: &mut Due,
    ) -> Result<(), LinkError> {
        if pushes.disconnected.load(Ordering::Relaxed) {
            return Err(LinkError::Closed);
        }
        drops.note(&self.endpoint, "sends events faster than they are read");
        due.add(Scope::All);
        Ok(())
    }

    /// Passes a reconciliation's records on to the readiness poll.
    fn hear(&self, read: Read) {
        let Some(heard) = &self.heard else { return };
        let name = self.endpoint.name();
        match &read.scope {
            Scope::All => heard.all(&name, read.masters),
            Scope::Masters(names) => heard.some(&name, names, read.masters),
        }
    }

    fn send(&self, observation: Observation) {
        // The decider only goes away at shutdown, when this link is being stopped anyway.
        let _ = self.tx.send(observation);
    }

    /// Handles one pushed message; returns what it asks to reconcile.
    fn on_push(
        &self,
        push: PushInfo,
        state: &mut Session,
        conn: &MultiplexedConnection,
        pending: &mut Pending,
    ) -> Result<Option<Scope>, LinkError> {
        let at = Instant::now();
        let (channel, payload) = match (push.kind, push.data.as_slice()) {
            (PushKind::Disconnection, _) => return Err(LinkError::Closed),
            (PushKind::PMessage, [_, channel, payload]) => (text(channel), text(payload)),
            _ => return Ok(None),
        };
        let (Some(channel), Some(payload)) = (channel, payload) else { return Ok(None) };
        let Some(event) = Event::parse(&channel, &payload) else { return Ok(None) };
        tracing::debug!(sentinel = %self.endpoint.name(), %channel, %payload, "sentinel event");
        Ok(self.on_event(event, at, state, conn, pending))
    }

    /// Carries out what one event asks ([`translate`]): tells the decider (now, or once its
    /// lookups are done, in the order of the events); returns what is to be reconciled.
    fn on_event(
        &self,
        event: Event,
        at: Instant,
        state: &mut Session,
        conn: &MultiplexedConnection,
        pending: &mut Pending,
    ) -> Option<Scope> {
        let told = translate(event, state, self.masters.as_deref());
        match told.tell {
            Some(Tell::NewEpoch(epoch)) => {
                self.send(Observation::NewEpoch { from: self.id, epoch })
            }
            Some(tell) => pending.push(lookup(self.id, tell, at, conn)),
            None => {}
        }
        told.reconcile
    }
}

/// What the decider is told of `tell`, once the lookups it needs are done: the Sentinel's
/// coordinated flag or epoch over `conn`, and the addresses resolved.
fn lookup(from: SentinelId, tell: Tell, at: Instant, conn: &MultiplexedConnection) -> Telling {
    let mut conn = conn.clone();
    match tell {
        Tell::NewEpoch(epoch) => ready(Observation::NewEpoch { from, epoch }),
        // Asked now: the answer reaches the decider before this Sentinel's `+selected-slave`,
        // which waits behind it (an election or a tick later).
        Tell::FailoverStarted { master, elected } => Box::pin(async move {
            let coordinated = coordinated(&mut conn, &master).await;
            Ok(Some(Observation::FailoverStarted { from, master, coordinated, elected }))
        }),
        Tell::Promoting { master, replica, epoch } => Box::pin(async move {
            let target = match epoch {
                Some(epoch) => resolve(&replica).await.map(|node| Candidate { node, epoch }),
                None => None,
            };
            Ok(Some(Observation::Promoting { from, master, replica, target, at }))
        }),
        Tell::Promoted { master, replica, epoch } => Box::pin(async move {
            let epoch = match epoch {
                Some(e) => e,
                None => config_epoch(&mut conn, &master).await?,
            };
            let target = resolve(&replica).await.map(|node| Candidate { node, epoch });
            Ok(target.map(|target| Observation::Promoted { from, master, target, at }))
        }),
        Tell::FailoverEnded { master, aborted } => {
            ready(Observation::FailoverEnded { from, master, aborted })
        }
        Tell::NodeBack { master, node, converted_to } => Box::pin(async move {
            let node = resolve(&node).await;
            Ok(node.map(|node| Observation::NodeBack { from, master, node, converted_to }))
        }),
        Tell::MasterDown { master, node, down } => {
            ready(Observation::MasterDown { from, master, node, down })
        }
    }
}

/// Forgets the Sentinel's records when the link ends, whichever way.
struct Forget(Option<Heard>, String);

impl Drop for Forget {
    fn drop(&mut self) {
        if let Some(heard) = &self.0 {
            heard.forget(&self.1);
        }
    }
}

/// Per-session memory of the failover epochs announced on this connection.
#[derive(Default)]
struct Session {
    last_epoch: Option<u64>,
    /// Bound at `+try-failover`, which Sentinel announces right after the `+new-epoch` of the
    /// failover; read at `+promoted-slave`. At most [`MAX_FAILOVERS`] names (they come from
    /// the network); past that `+promoted-slave` asks Sentinel for the epoch instead.
    failover_epoch: HashMap<String, u64>,
}

impl Session {
    fn remember(&mut self, master: &str, epoch: u64) {
        if self.failover_epoch.len() < MAX_FAILOVERS || self.failover_epoch.contains_key(master) {
            self.failover_epoch.insert(master.to_owned(), epoch);
        }
    }
}

async fn ping_once(mut conn: MultiplexedConnection) -> Result<(), LinkError> {
    let ping = redis::cmd("PING");
    match timeout(PING_DEADLINE, ping.query_async::<Value>(&mut conn)).await {
        Ok(r) => r.map(drop).map_err(LinkError::from),
        Err(_) => Err(LinkError::PingTimeout(PING_DEADLINE)),
    }
}

/// An address as clients will use it: IPs as they are, hostnames (`announce-hostnames`)
/// resolved, keeping the name.
pub async fn resolve(addr: &Addr) -> Option<Node> {
    if let Ok(ip) = addr.host.parse::<IpAddr>() {
        return Some(Node { ip, port: addr.port, hostname: None });
    }
    let lookup = tokio::net::lookup_host((addr.host.as_str(), addr.port));
    match timeout(RESOLVE_DEADLINE, lookup).await {
        Ok(Ok(addrs)) => {
            // IPv4 first where the name has both, so every polestar answers the same.
            let mut ips: Vec<IpAddr> = addrs.map(|sa| sa.ip()).collect();
            ips.sort_by_key(|ip| ip.is_ipv6());
            let ip = *ips.first()?;
            Some(Node { ip, port: addr.port, hostname: Some(addr.host.clone()) })
        }
        _ => {
            tracing::warn!(host = %addr.host, "cannot resolve the hostname Sentinel reported");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn masters(names: &[&str]) -> Scope {
        Scope::Masters(names.iter().map(|n| n.to_string()).collect())
    }

    #[test]
    fn a_reconciliation_asks_the_address_only_during_a_failover() {
        let record = |failover: bool, replicas: Option<usize>, peers: Option<usize>| {
            let addr = Addr { host: "10.0.0.1".into(), port: 6379 };
            let name = "m".to_string();
            MasterRecord { name, addr, epoch: 1, failover_in_progress: failover, replicas, peers }
        };
        let mut counts = PeerCounts { asked: HashMap::from([("m".into(), 2)]), rounds: 2 };
        // (failover, num-slaves, num-other-sentinels) -> (address, replicas, peers)
        let cases = [
            ((false, Some(0), Some(2)), (false, false, false)),
            ((true, Some(0), Some(2)), (true, false, false)),
            ((false, Some(1), Some(2)), (false, true, false)),
            ((false, None, Some(2)), (false, true, false)),
            ((false, Some(0), Some(3)), (false, false, true)),
            ((false, Some(0), None), (false, false, true)),
        ];
        for ((failover, replicas, peers), want) in cases {
            let asks = Asks::of(&record(failover, replicas, peers), Some(&counts));
            assert_eq!(
                (asks.addr, asks.replicas, asks.peers),
                want,
                "{failover} {replicas:?} {peers:?}"
            );
        }
        counts.rounds = 1;
        let due = Asks::of(&record(false, Some(0), Some(2)), Some(&counts));
        assert!(due.peers && !due.addr && !due.replicas, "every PEERS_EVERY-th round");
        let scoped = Asks::of(&record(false, Some(0), Some(2)), None);
        assert!(!scoped.addr && !scoped.replicas && !scoped.peers, "a scoped one");
    }

    #[test]
    fn full_reconciliation_is_paced_by_the_number_of_masters() {
        assert_eq!(full_every(0), RECONCILE_MIN);
        assert_eq!(full_every(3), Duration::from_secs(1));
        assert_eq!(full_every(1000), Duration::from_secs(10));
        assert_eq!(full_every(usize::MAX), RECONCILE_MAX);
    }

    fn pmessage() -> PushInfo {
        let data = ["*", "+sdown", "x"].map(|s| Value::BulkString(s.into()));
        PushInfo { kind: PushKind::PMessage, data: data.to_vec() }
    }

    #[tokio::test]
    async fn a_push_flood_is_dropped_and_reported_not_buffered() {
        let (sink, pushes) = push_queue();
        for _ in 0..PUSH_QUEUE * 10 {
            assert!(sink(pmessage()).is_ok(), "the reader is never refused while we live");
        }
        assert_eq!(pushes.rx.len(), PUSH_QUEUE, "only the queue's worth is held");
        let lost = tokio::time::timeout(Duration::from_secs(1), pushes.lost.notified()).await;
        assert!(lost.is_ok(), "the drops are reported");
        assert!(!pushes.disconnected.load(Ordering::Relaxed));
        assert!(sink(PushInfo { kind: PushKind::Disconnection, data: vec![] }).is_ok());
        assert!(pushes.disconnected.load(Ordering::Relaxed), "a lost disconnection is kept");
        drop(pushes);
        assert!(sink(pmessage()).is_err(), "the link is gone: stop pushing");
    }

    #[test]
    fn events_past_the_budget_are_dropped() {
        let mut pending = Pending::default();
        let up = || ready(Observation::Up { from: 0, myid: None });
        for _ in 0..MAX_PENDING {
            pending.push(up());
        }
        assert!(!pending.overflowed());
        pending.push(up());
        assert!(pending.overflowed(), "no more than MAX_PENDING wait");
        assert!(!pending.overflowed(), "reported once");
        assert_eq!(pending.queue.len(), MAX_PENDING);
        pending.queue = FuturesOrdered::new();
        pending.tokens = 0.5;
        pending.push(up());
        assert!(pending.overflowed(), "no more than the budget a second");
    }

    #[test]
    fn the_failovers_remembered_are_bounded() {
        let mut session = Session::default();
        for i in 0..MAX_FAILOVERS * 2 {
            session.remember(&format!("m{i}"), 1);
        }
        assert_eq!(session.failover_epoch.len(), MAX_FAILOVERS);
        session.remember("m0", 7);
        assert_eq!(session.failover_epoch.get("m0"), Some(&7), "a known one is updated");
    }

    #[test]
    fn events_between_reconciliations_add_up() {
        let mut due = Due::default();
        assert_eq!(due.take(), None);
        due.add(masters(&["a"]));
        due.add(masters(&["b", "a"]));
        assert_eq!(due.take(), Some(masters(&["a", "b"])));
        assert_eq!(due.take(), None, "taken");
        due.add(masters(&["a"]));
        due.add(Scope::All);
        due.add(masters(&["c"]));
        assert_eq!(due.take(), Some(Scope::All), "a full reconciliation covers every master");
    }
}
