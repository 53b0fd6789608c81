//! One Sentinel, watched over one connection: `PSUBSCRIBE *` for its events, a `PING` with a
//! deadline every second, a reconciliation of the masters an event names as soon as it
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
use tokio::sync::{Notify, mpsc};
use tokio::time::{MissedTickBehavior, interval, sleep, timeout};
use tokio_util::sync::CancellationToken;

use super::core::Follower;
use super::message::{
    Addr, Borrowed, Event, MasterRecord, PeerRecord, ReplicaRecord, borrowed_records,
    coordinated_failover, master_addr, records, text,
};
use super::{LinkId, MasterReport, Observation, Report, Scope};
use crate::node::{Endpoint, PushSink, connect};
use crate::readiness::facts::MasterFacts;
use crate::readiness::heard::{Heard, Records};
use crate::readiness::{self};
use crate::topology::{Node, Replica};

mod translate;

use translate::{Tell, translate};

const PING_EVERY: Duration = Duration::from_secs(1);
const PING_DEADLINE: Duration = Duration::from_millis(1500);
/// The full reconciliation runs every `RECONCILE_PER_MASTER` × masters, within these bounds.
const RECONCILE_MIN: Duration = Duration::from_secs(1);
const RECONCILE_MAX: Duration = Duration::from_secs(30);
const RECONCILE_PER_MASTER: Duration = Duration::from_millis(10);
const RESOLVE_DEADLINE: Duration = Duration::from_secs(1);
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Pushes read from the connection but not yet handled; a flood past it is dropped.
const PUSH_QUEUE: usize = 1024;
/// Events waiting for a lookup (a hostname, an epoch) before they are passed on.
const MAX_PENDING: usize = 64;
/// Observations of events passed on per second on average (and in a burst).
const EVENT_BUDGET: u16 = 1000;
/// Dropped events are logged at most this often per Sentinel.
const DROP_LOG_EVERY: Duration = Duration::from_secs(10);
/// Failovers whose epoch a session remembers.
const MAX_FAILOVERS: usize = 4096;
/// Every this many full reconciliations a link asks every master's peers, changed or not.
const PEERS_EVERY: u32 = 6;

#[derive(Debug, thiserror::Error)]
enum LinkError {
    #[error("{0}")]
    Redis(#[from] redis::RedisError),
    #[error("no answer to PING within {0:?}")]
    PingTimeout(Duration),
    #[error("connection closed")]
    Closed,
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
    pub id: LinkId,
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
                    Observation::NotSentinel { link: self.id, reason: e.to_string() }
                }
                Err(e) => Observation::Down { link: self.id, reason: e.to_string() },
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

    async fn session(&self) -> Result<(), LinkError> {
        let (sink, mut pushes) = push_queue();
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
        // Subscribe before the first reconciliation so that no change falls in between.
        conn.psubscribe("*").await?;
        self.send(Observation::Up { link: self.id, myid: text(&myid) });
        let mut state = Session::default();
        let keep = self.heard.is_some();
        let peers = Some(PeerCounts::default());
        let first = reconcile(self.id, Scope::All, self.masters.clone(), conn.clone(), keep, peers);
        let (first, mut read) = first.await?;
        let mut peers = read.peers.take();
        self.hear(read);
        let mut full_every = full_every(first.masters.len());
        self.send(Observation::Report(first));
        let mut ping = interval(PING_EVERY);
        let mut every = interval(full_every);
        for timer in [&mut ping, &mut every] {
            timer.set_missed_tick_behavior(MissedTickBehavior::Delay);
        }
        every.reset();
        // Nothing in this loop awaits the network: the PING, a reconciliation and the lookups
        // an event needs (hostnames, an epoch) run beside it on clones of the connection, so
        // the PING deadline holds and a `+promoted-slave` is passed on at once whatever else
        // is in flight.
        let mut pinging: Option<InFlight<()>> = None;
        let mut running: Option<InFlight<(Report, Read)>> = None;
        let mut pending = Pending::default();
        let mut due = Due::default();
        let mut drops = Drops::default();
        loop {
            // Pushes come last: a flood of them must not starve the PING or the reports.
            tokio::select! {
                biased;
                pong = async { pinging.as_mut().expect("guarded by the condition").await }, if pinging.is_some() => {
                    pinging = None;
                    pong?;
                }
                report = async { running.as_mut().expect("guarded by the condition").await }, if running.is_some() => {
                    running = None;
                    let (report, mut read) = report?;
                    if let Some(counts) = read.peers.take() {
                        peers = Some(counts);
                    }
                    self.hear(read);
                    if report.scope == Scope::All {
                        let pace = self::full_every(report.masters.len());
                        if pace != full_every {
                            full_every = pace;
                            every = interval(full_every);
                            every.set_missed_tick_behavior(MissedTickBehavior::Delay);
                            every.reset();
                        }
                    }
                    self.send(Observation::Report(report));
                }
                Some(observation) = pending.queue.next(), if !pending.queue.is_empty() => {
                    if let Some(observation) = observation? {
                        self.send(observation);
                    }
                }
                _ = ping.tick(), if pinging.is_none() => {
                    pinging = Some(Box::pin(ping_once(conn.clone())));
                }
                _ = every.tick() => due.add(Scope::All),
                () = pushes.lost.notified() => {
                    if pushes.disconnected.load(Ordering::Relaxed) {
                        return Err(LinkError::Closed);
                    }
                    drops.note(&self.endpoint, "sends events faster than they are read");
                    due.add(Scope::All);
                }
                push = pushes.rx.recv() => {
                    let push = push.ok_or(LinkError::Closed)?;
                    if let Some(scope) = self.on_push(push, &mut state, &conn, &mut pending)? {
                        due.add(scope);
                    }
                }
            }
            if pending.overflowed() {
                drops.note(&self.endpoint, "sends more events than the budget");
                due.add(Scope::All);
            }
            if running.is_none()
                && let Some(scope) = due.take()
            {
                if scope == Scope::All {
                    every.reset();
                }
                let only = self.masters.clone();
                let keep = self.heard.is_some();
                let counts = match scope {
                    Scope::All => Some(peers.take().unwrap_or_default()),
                    Scope::Masters(_) => None,
                };
                let conn = conn.clone();
                running = Some(Box::pin(reconcile(self.id, scope, only, conn, keep, counts)));
            }
        }
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
            Some(Tell::Epoch(epoch)) => self.send(Observation::Epoch { link: self.id, epoch }),
            Some(tell) => pending.push(lookup(self.id, tell, at, conn)),
            None => {}
        }
        told.reconcile
    }
}

/// What the decider is told of `tell`, once the lookups it needs are done: the Sentinel's
/// coordinated flag or epoch over `conn`, and the addresses resolved.
fn lookup(link: LinkId, tell: Tell, at: Instant, conn: &MultiplexedConnection) -> Telling {
    let mut conn = conn.clone();
    match tell {
        Tell::Epoch(epoch) => ready(Observation::Epoch { link, epoch }),
        // Asked now: the answer reaches the decider before this Sentinel's `+selected-slave`,
        // which waits behind it (an election or a tick later).
        Tell::FailoverStarted { master, elected } => Box::pin(async move {
            let coordinated = coordinated(&mut conn, &master).await;
            let (in_progress, aborted) = (true, false);
            Ok(Some(Observation::Failover {
                link,
                master,
                in_progress,
                aborted,
                coordinated,
                elected,
            }))
        }),
        Tell::Promoting { master, replica, epoch } => Box::pin(async move {
            let promoted = match epoch {
                Some(epoch) => resolve(&replica).await.map(|node| (node, epoch)),
                None => None,
            };
            Ok(Some(Observation::Promoting { link, master, replica, promoted, at }))
        }),
        Tell::Promoted { master, primary, epoch } => Box::pin(async move {
            let epoch = match epoch {
                Some(e) => e,
                None => config_epoch(&mut conn, &master).await?,
            };
            let node = resolve(&primary).await;
            Ok(node.map(|node| Observation::Promoted { link, master, node, epoch, at }))
        }),
        Tell::FailoverEnded { master, aborted } => {
            let (in_progress, coordinated, elected) = (false, false, false);
            ready(Observation::Failover {
                link,
                master,
                in_progress,
                aborted,
                coordinated,
                elected,
            })
        }
        Tell::NodeBack { master, node, converted_to } => Box::pin(async move {
            let node = resolve(&node).await;
            Ok(node.map(|node| Observation::NodeBack { link, master, node, converted_to }))
        }),
        Tell::MasterDown { master, node, down } => {
            ready(Observation::MasterDown { link, master, node, down })
        }
    }
}

/// What this Sentinel knows of the masters in `scope`: their primaries and replicas, and for
/// a full reconciliation every master it monitors and the peers it knows; with `keep`, also
/// its records as the readiness poll reads them.
async fn reconcile(
    link: LinkId,
    scope: Scope,
    only: Option<Arc<HashSet<String>>>,
    mut conn: MultiplexedConnection,
    keep: bool,
    peers: Option<PeerCounts>,
) -> Result<(Report, Read), LinkError> {
    let conn = &mut conn;
    let full = scope == Scope::All;
    let served = |m: &MasterRecord| only.as_ref().is_none_or(|names| names.contains(&m.name));
    let masters: Vec<(MasterRecord, Option<MasterFacts>)> = match &scope {
        Scope::All => {
            let masters: Value = redis::cmd("SENTINEL").arg("MASTERS").query_async(conn).await?;
            let records = borrowed_records(&masters).filter_map(|r| read_master(&r, keep));
            records.filter(|(m, _)| served(m)).collect()
        }
        Scope::Masters(names) => {
            // A master this Sentinel no longer monitors answers an error: it is left out of
            // the report, which the scope tells the decider is news.
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for name in names {
                pipe.cmd("SENTINEL").arg("MASTER").arg(name);
            }
            let replies: Vec<Value> = pipe.query_async(conn).await?;
            let records = replies.iter().filter_map(Borrowed::new);
            records.filter_map(|r| read_master(&r, keep)).collect()
        }
    };
    let mut peers = peers.filter(|_| full);
    if let Some(p) = &mut peers {
        p.rounds = p.rounds.wrapping_add(1);
    }
    let asks: Vec<Asks> = masters.iter().map(|(m, _)| Asks::of(m, peers.as_ref())).collect();
    let replies: Vec<Value> = match asks.iter().any(Asks::any) {
        true => pipeline(&masters, &asks).query_async(conn).await?,
        false => Vec::new(),
    };
    let mut report = Report { link, scope: scope.clone(), masters: Vec::new(), with_peers: full };
    let mut read = Read { scope, masters: HashMap::new(), peers: None };
    let mut replies = replies.into_iter();
    let none = Value::Array(Vec::new());
    for ((m, facts), asked) in masters.into_iter().zip(asks) {
        let addr = if asked.addr { Some(replies.next().unwrap_or(Value::Nil)) } else { None };
        let replicas = if asked.replicas { replies.next() } else { None };
        let listed = if asked.peers { replies.next() } else { None };
        let replicas = replicas.as_ref().unwrap_or(&none);
        let listed = listed.map(|v| {
            let records = records(&v);
            records.iter().filter_map(PeerRecord::from_record).collect::<Vec<_>>()
        });
        if let (Some(p), Some(listed)) = (&mut peers, &listed) {
            p.asked.insert(m.name.clone(), listed.len());
        }
        if let Some(master) = facts {
            let replicas = readiness::parse::replicas(replicas);
            read.masters.insert(m.name.clone(), Records { master: Ok(master), replicas });
        }
        if let Some(master) = master_report(&m, addr.as_ref(), replicas, listed).await {
            report.masters.push(master);
        }
    }
    read.peers = peers;
    Ok((report, read))
}

/// One master of `SENTINEL MASTERS`/`MASTER`, read in place, and with `keep` its facts for the
/// readiness poll (the same fields: every record that reads has them).
fn read_master(r: &Borrowed<'_>, keep: bool) -> Option<(MasterRecord, Option<MasterFacts>)> {
    let m = MasterRecord::from_record(r)?;
    let facts = if keep { Some(readiness::parse::master_record(r)?) } else { None };
    Some((m, facts))
}

/// What a reconciliation asks of one master besides its record.
struct Asks {
    /// `SENTINEL GET-MASTER-ADDR-BY-NAME`: only while the record shows a failover in
    /// progress. Sentinel answers it with the record's own address except while it leads a
    /// failover past the promotion (`sentinelGetCurrentMasterAddress`: the promoted replica
    /// from `RECONF_SLAVES` on, when the record already holds the new epoch and still the old
    /// address), and only a Sentinel with `failover_in_progress` is in that state. Otherwise the
    /// record's address and epoch are one reading, changed together by Sentinel
    /// (`sentinelResetMasterAndChangeAddress` on a switch, a hello's configuration). Asking it
    /// of every master was a third of a full reconciliation's commands at 1,000 masters.
    addr: bool,
    /// `SENTINEL REPLICAS`: unless `num-slaves` says there are none.
    replicas: bool,
    /// `SENTINEL SENTINELS`: in a full reconciliation, when [`PeerCounts`] says so.
    peers: bool,
}

impl Asks {
    fn of(m: &MasterRecord, peers: Option<&PeerCounts>) -> Self {
        Self {
            addr: m.failover_in_progress,
            replicas: m.replicas != Some(0),
            peers: peers.is_some_and(|p| p.due(m)),
        }
    }

    fn any(&self) -> bool {
        self.addr || self.replicas || self.peers
    }
}

/// The commands `asks` calls for, in the order [`reconcile`] reads their replies.
fn pipeline(masters: &[(MasterRecord, Option<MasterFacts>)], asks: &[Asks]) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    for ((m, _), asked) in masters.iter().zip(asks) {
        let mut ask = |sub: &str| {
            pipe.cmd("SENTINEL").arg(sub).arg(&m.name);
        };
        if asked.addr {
            ask("GET-MASTER-ADDR-BY-NAME");
        }
        if asked.replicas {
            ask("REPLICAS");
        }
        if asked.peers {
            ask("SENTINELS");
        }
    }
    pipe
}

/// One reconciliation's records for the readiness poll (empty unless asked to keep them),
/// and the peer counts a full one was given back.
struct Read {
    scope: Scope,
    masters: HashMap<String, Records>,
    peers: Option<PeerCounts>,
}

/// A full reconciliation asks a master's peers (`SENTINEL SENTINELS`, a record per peer) only
/// when its `num-other-sentinels` differs from the number listed last time, and every
/// [`PEERS_EVERY`]th full reconciliation: peers are shown, never trusted, and at 1,000 masters
/// asking them every time was a third of a link's commands and most of what it parsed.
#[derive(Default)]
struct PeerCounts {
    /// Peers listed for each master when last asked.
    asked: HashMap<String, usize>,
    rounds: u32,
}

impl PeerCounts {
    fn due(&self, m: &MasterRecord) -> bool {
        self.rounds % PEERS_EVERY == 1
            || m.peers.is_none()
            || self.asked.get(&m.name) != m.peers.as_ref()
    }
}

/// The full reconciliation's period for a Sentinel that monitors `masters` masters.
fn full_every(masters: usize) -> Duration {
    let masters = u32::try_from(masters).unwrap_or(u32::MAX);
    RECONCILE_PER_MASTER.saturating_mul(masters).clamp(RECONCILE_MIN, RECONCILE_MAX)
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

/// What the events since the last reconciliation ask to look at again.
#[derive(Default)]
struct Due(Option<Scope>);

impl Due {
    fn add(&mut self, scope: Scope) {
        self.0 = Some(match (self.0.take(), scope) {
            (None, s) => s,
            (Some(Scope::All), _) | (_, Scope::All) => Scope::All,
            (Some(Scope::Masters(mut a)), Scope::Masters(b)) => {
                a.extend(b);
                Scope::Masters(a)
            }
        });
    }

    fn take(&mut self) -> Option<Scope> {
        self.0.take()
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

/// Events dropped in a session, logged at most every [`DROP_LOG_EVERY`] (a flood must not
/// become a flood of log lines).
#[derive(Default)]
struct Drops {
    count: u64,
    logged: Option<Instant>,
}

impl Drops {
    fn note(&mut self, endpoint: &Endpoint, why: &str) {
        self.count += 1;
        if self.logged.is_some_and(|at| at.elapsed() < DROP_LOG_EVERY) {
            return;
        }
        self.logged = Some(Instant::now());
        let (sentinel, dropped) = (endpoint.name(), std::mem::take(&mut self.count));
        tracing::warn!(%sentinel, dropped, "Sentinel {why}: events dropped, reconciling instead");
    }
}

/// A command in flight beside the event loop.
type InFlight<T> = Pin<Box<dyn Future<Output = Result<T, LinkError>> + Send>>;

/// What an event tells the decider once its lookups are done (`None`: nothing, e.g. a
/// hostname that does not resolve).
type Telling = InFlight<Option<Observation>>;

fn ready(observation: Observation) -> Telling {
    Box::pin(std::future::ready(Ok(Some(observation))))
}

/// The observations of events, in the order of the events, within a budget: at most
/// [`MAX_PENDING`] waiting for a lookup and [`EVENT_BUDGET`] a second on average (bursts of as
/// many), so that a Sentinel flooding events can neither grow this queue nor the decider's.
/// What does not fit is dropped and a full reconciliation is asked for instead.
struct Pending {
    queue: FuturesOrdered<Telling>,
    tokens: f64,
    refilled: Instant,
    dropped: bool,
}

impl Default for Pending {
    fn default() -> Self {
        let tokens = f64::from(EVENT_BUDGET);
        Self { queue: FuturesOrdered::new(), tokens, refilled: Instant::now(), dropped: false }
    }
}

impl Pending {
    fn push(&mut self, telling: Telling) {
        let now = Instant::now();
        let budget = f64::from(EVENT_BUDGET);
        let refill = now.duration_since(self.refilled).as_secs_f64() * budget;
        self.tokens = (self.tokens + refill).min(budget);
        self.refilled = now;
        if self.tokens < 1.0 || self.queue.len() >= MAX_PENDING {
            self.dropped = true;
            return;
        }
        self.tokens -= 1.0;
        self.queue.push_back(telling);
    }

    /// Whether events were dropped since the last call.
    fn overflowed(&mut self) -> bool {
        std::mem::take(&mut self.dropped)
    }
}

/// The receiving end of a connection's pushes: at most [`PUSH_QUEUE`] of them wait. The
/// connection's reader never waits on it: a push that does not fit is dropped and `lost` is
/// notified (once for any number of drops), which the link answers with a full
/// reconciliation; a disconnection that did not fit also sets `disconnected`.
struct Pushes {
    /// The connection's push sink holds the sender; it closes with the connection.
    rx: mpsc::Receiver<PushInfo>,
    lost: Arc<Notify>,
    disconnected: Arc<AtomicBool>,
}

fn push_queue() -> (PushSink, Pushes) {
    let (tx, rx) = mpsc::channel(PUSH_QUEUE);
    let lost = Arc::new(Notify::new());
    let disconnected = Arc::new(AtomicBool::new(false));
    let pushes = Pushes { rx, lost: lost.clone(), disconnected: disconnected.clone() };
    let sink: PushSink = Box::new(move |push: PushInfo| {
        let is_disconnection = push.kind == PushKind::Disconnection;
        match tx.try_send(push) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(_)) => {
                if is_disconnection {
                    disconnected.store(true, Ordering::Relaxed);
                }
                lost.notify_one();
                Ok(())
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Err(()),
        }
    });
    (sink, pushes)
}

async fn ping_once(mut conn: MultiplexedConnection) -> Result<(), LinkError> {
    let ping = redis::cmd("PING");
    match timeout(PING_DEADLINE, ping.query_async::<Value>(&mut conn)).await {
        Ok(r) => r.map(drop).map_err(LinkError::from),
        Err(_) => Err(LinkError::PingTimeout(PING_DEADLINE)),
    }
}

/// The config epoch this Sentinel holds for `master` (`SENTINEL MASTER <name>`).
/// Whether this Sentinel runs the failover of `master` as Valkey 9's coordinated one
/// ([`coordinated_failover`]). An error or an odd reply counts as a plain failover: its
/// promotion is fenced, as every failover's was before Valkey 9. The events behind it wait
/// for it at most the connection's response timeout (a Sentinel answers in a round trip;
/// its `+selected-slave` comes an election or a timer tick after `+try-failover`).
async fn coordinated(conn: &mut MultiplexedConnection, master: &str) -> bool {
    let reply = redis::cmd("SENTINEL").arg("MASTER").arg(master).query_async::<Value>(conn).await;
    let record = reply.ok().as_ref().and_then(super::message::record);
    record.is_some_and(|r| coordinated_failover(&r))
}

async fn config_epoch(conn: &mut MultiplexedConnection, master: &str) -> Result<u64, LinkError> {
    let reply: Value = redis::cmd("SENTINEL").arg("MASTER").arg(master).query_async(conn).await?;
    let epoch = super::message::record(&reply)
        .and_then(|r| r.get("config-epoch").and_then(|e| e.parse().ok()));
    epoch.ok_or_else(|| {
        LinkError::Redis(redis::RedisError::from((
            redis::ErrorKind::Parse,
            "no config-epoch in SENTINEL MASTER reply",
        )))
    })
}

async fn master_report(
    m: &MasterRecord,
    addr: Option<&Value>,
    replicas: &Value,
    peers: Option<Vec<PeerRecord>>,
) -> Option<MasterReport> {
    // During a failover the address comes from get-master-addr-by-name, read after the epoch:
    // it already names the promoted replica, never the old primary with the new epoch (see
    // [`Asks::addr`]); otherwise the record's own address is the one it would answer.
    let primary = addr.and_then(master_addr).unwrap_or_else(|| m.addr.clone());
    let primary = resolve(&primary).await?;
    let (mut nodes, mut followers) = (Vec::new(), Vec::new());
    for r in records(replicas).iter().filter_map(ReplicaRecord::from_record) {
        if let Some(n) = resolve(&r.addr).await {
            if let Some(upstream) = r.follows(&m.addr) {
                followers.push(Follower { node: n.clone(), upstream });
            }
            nodes.push(Replica {
                ip: n.ip,
                port: n.port,
                hostname: n.hostname,
                healthy: r.healthy,
                down: r.down,
            });
        }
    }
    nodes.sort_by_key(|r| (r.ip, r.port));
    Some(MasterReport {
        name: m.name.clone(),
        primary,
        epoch: m.epoch,
        failover_in_progress: m.failover_in_progress,
        replicas: nodes,
        followers,
        peers,
    })
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
        assert!(!Asks::of(&record(false, Some(0), Some(2)), None).any(), "a scoped one");
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
        let up = || ready(Observation::Up { link: 0, myid: None });
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
