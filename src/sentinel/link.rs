//! One Sentinel, watched over one connection: `PSUBSCRIBE *` for its events, a `PING` with a
//! deadline every second, a reconciliation of the masters an event names as soon as it
//! arrives, and a full reconciliation (`SENTINEL MASTERS` and friends) at start and
//! periodically: every second for a few masters, paced by the number of masters for many
//! (10 ms per master, at most 30 s), so that 1,000 masters cost Sentinel and polestar a
//! full picture every 10 s rather than 4,000 commands a second per Sentinel.
//!
//! A link never gives up: any error ends the session, the decider is told the Sentinel is
//! down, and the link reconnects to the same address with backoff, forever. Links exist only
//! for configured addresses (see the trust model in `super`).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::mpsc;
use tokio::time::{MissedTickBehavior, interval, sleep, timeout};
use tokio_util::sync::CancellationToken;

use super::conn::{Endpoint, connect};
use super::message::{
    Addr, Event, MasterRecord, PeerRecord, ReplicaRecord, master_addr, records, text,
};
use super::{LinkId, MasterReport, Observation, Report, Scope};
use crate::topology::{Node, Replica};

const PING_EVERY: Duration = Duration::from_secs(1);
const PING_DEADLINE: Duration = Duration::from_millis(1500);
/// The full reconciliation runs every `RECONCILE_PER_MASTER` × masters, within these bounds.
const RECONCILE_MIN: Duration = Duration::from_secs(1);
const RECONCILE_MAX: Duration = Duration::from_secs(30);
const RECONCILE_PER_MASTER: Duration = Duration::from_millis(10);
const RESOLVE_DEADLINE: Duration = Duration::from_secs(1);
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
enum LinkError {
    #[error("{0}")]
    Redis(#[from] redis::RedisError),
    #[error("no answer to PING within {0:?}")]
    PingTimeout(Duration),
    #[error("connection closed")]
    Closed,
}

pub struct Link {
    pub id: LinkId,
    pub endpoint: Endpoint,
    /// Only these masters are reported (`None`: all).
    pub masters: Option<Arc<HashSet<String>>>,
    /// The decider; closing it ends the link.
    pub tx: mpsc::UnboundedSender<Observation>,
    pub stop: CancellationToken,
}

impl Link {
    /// Watches the Sentinel until `stop` is cancelled.
    pub async fn run(self) {
        let mut backoff = BACKOFF_MIN;
        loop {
            let started = Instant::now();
            let result = tokio::select! {
                r = self.session() => r,
                _ = self.stop.cancelled() => return,
            };
            let reason = match result {
                Ok(()) => return,
                Err(e) => e.to_string(),
            };
            if self.tx.send(Observation::Down { link: self.id, reason }).is_err() {
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
        let (push_tx, mut push_rx) = mpsc::unbounded_channel();
        let mut conn = connect(&self.endpoint, Some(push_tx)).await?;
        let myid: Value = redis::cmd("SENTINEL").arg("MYID").query_async(&mut conn).await?;
        // Subscribe before the first reconciliation so that no change falls in between.
        conn.psubscribe("*").await?;
        self.send(Observation::Up { link: self.id, myid: text(&myid) });
        let mut state = Session::default();
        let first = reconcile(self.id, Scope::All, self.masters.clone(), conn.clone()).await?;
        let mut full_every = full_every(first.masters.len());
        self.send(Observation::Report(first));
        let mut ping = interval(PING_EVERY);
        let mut every = interval(full_every);
        for timer in [&mut ping, &mut every] {
            timer.set_missed_tick_behavior(MissedTickBehavior::Delay);
        }
        every.reset();
        // A reconciliation runs beside the event loop on a clone of the connection, so that
        // a `+promoted-slave` arriving meanwhile is passed on at once.
        let mut running: Option<Reconciling> = None;
        let mut due = Due::default();
        loop {
            tokio::select! {
                biased;
                push = push_rx.recv() => {
                    let push = push.ok_or(LinkError::Closed)?;
                    if let Some(scope) = self.on_push(push, &mut state, &mut conn).await? {
                        due.add(scope);
                    }
                }
                report = async { running.as_mut().expect("guarded by the condition").await }, if running.is_some() => {
                    running = None;
                    let report = report?;
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
                _ = ping.tick() => ping_once(&mut conn).await?,
                _ = every.tick() => due.add(Scope::All),
            }
            if running.is_none()
                && let Some(scope) = due.take()
            {
                if scope == Scope::All {
                    every.reset();
                }
                let only = self.masters.clone();
                running = Some(Box::pin(reconcile(self.id, scope, only, conn.clone())));
            }
        }
    }

    fn send(&self, observation: Observation) {
        // The decider only goes away at shutdown, when this link is being stopped anyway.
        let _ = self.tx.send(observation);
    }

    /// Handles one pushed message; returns what it asks to reconcile.
    async fn on_push(
        &self,
        push: PushInfo,
        state: &mut Session,
        conn: &mut MultiplexedConnection,
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
        self.on_event(event, at, state, conn).await
    }

    async fn on_event(
        &self,
        event: Event,
        at: Instant,
        state: &mut Session,
        conn: &mut MultiplexedConnection,
    ) -> Result<Option<Scope>, LinkError> {
        let link = self.id;
        match event {
            Event::NewEpoch(epoch) => {
                state.last_epoch = Some(epoch);
                self.send(Observation::Epoch { link, epoch });
            }
            Event::FailoverStarted { master } => {
                if let Some(epoch) = state.last_epoch {
                    state.failover_epoch.insert(master.clone(), epoch);
                }
                self.send(Observation::Failover {
                    link,
                    master,
                    in_progress: true,
                    aborted: false,
                });
            }
            Event::Promoting { master, replica, sent } => {
                let epoch = state.failover_epoch.get(&master).copied().filter(|_| sent);
                let promoted = match epoch {
                    Some(epoch) => resolve(&replica).await.map(|node| (node, epoch)),
                    None => None,
                };
                self.send(Observation::Promoting { link, master, replica, promoted, at });
            }
            Event::Promoted { master, primary } => {
                let epoch = match state.failover_epoch.remove(&master) {
                    Some(e) => e,
                    None => config_epoch(conn, &master).await?,
                };
                if let Some(node) = resolve(&primary).await {
                    self.send(Observation::Promoted { link, master, node, epoch, at });
                }
            }
            Event::FailoverEnded { master, aborted } => {
                state.failover_epoch.remove(&master);
                self.send(Observation::Failover {
                    link,
                    master: master.clone(),
                    in_progress: false,
                    aborted,
                });
                return Ok(self.scope(master));
            }
            Event::NodeBack { master, node } => {
                if let Some(node) = resolve(&node).await {
                    self.send(Observation::NodeBack { link, master: master.clone(), node });
                }
                return Ok(self.scope(master));
            }
            Event::Switched { master, .. } | Event::Changed { master } => {
                return Ok(self.scope(master));
            }
            Event::Topology => return Ok(Some(Scope::All)),
        }
        Ok(None)
    }

    /// The reconciliation an event about `master` asks for: none for a master not served.
    fn scope(&self, master: String) -> Option<Scope> {
        let wanted = self.masters.as_ref().is_none_or(|names| names.contains(&master));
        wanted.then(|| Scope::Masters(BTreeSet::from([master])))
    }
}

/// What this Sentinel knows of the masters in `scope`: their primaries and replicas, and for
/// a full reconciliation every master it monitors and the peers it knows.
async fn reconcile(
    link: LinkId,
    scope: Scope,
    only: Option<Arc<HashSet<String>>>,
    mut conn: MultiplexedConnection,
) -> Result<Report, LinkError> {
    let conn = &mut conn;
    let full = scope == Scope::All;
    let masters: Vec<MasterRecord> = match &scope {
        Scope::All => {
            let masters: Value = redis::cmd("SENTINEL").arg("MASTERS").query_async(conn).await?;
            records(&masters)
                .iter()
                .filter_map(MasterRecord::from_record)
                .filter(|m| only.as_ref().is_none_or(|names| names.contains(&m.name)))
                .collect()
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
            let records = replies.iter().filter_map(super::message::record);
            records.filter_map(|r| MasterRecord::from_record(&r)).collect()
        }
    };
    let mut pipe = redis::pipe();
    for m in &masters {
        pipe.cmd("SENTINEL").arg("GET-MASTER-ADDR-BY-NAME").arg(&m.name);
        pipe.cmd("SENTINEL").arg("REPLICAS").arg(&m.name);
        if full {
            pipe.cmd("SENTINEL").arg("SENTINELS").arg(&m.name);
        }
    }
    let replies: Vec<Value> =
        if masters.is_empty() { Vec::new() } else { pipe.query_async(conn).await? };
    let mut report = Report { link, scope, masters: Vec::new(), with_peers: full };
    for (m, r) in masters.iter().zip(replies.chunks(if full { 3 } else { 2 })) {
        let (addr, replicas, peers) = match r {
            [addr, replicas] => (addr, replicas, Vec::new()),
            [addr, replicas, peers] => (
                addr,
                replicas,
                records(peers).iter().filter_map(PeerRecord::from_record).collect(),
            ),
            _ => continue,
        };
        if let Some(master) = master_report(m, addr, replicas, peers).await {
            report.masters.push(master);
        }
    }
    Ok(report)
}

/// The full reconciliation's period for a Sentinel that monitors `masters` masters.
fn full_every(masters: usize) -> Duration {
    let masters = u32::try_from(masters).unwrap_or(u32::MAX);
    RECONCILE_PER_MASTER.saturating_mul(masters).clamp(RECONCILE_MIN, RECONCILE_MAX)
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

/// A reconciliation in flight.
type Reconciling = Pin<Box<dyn Future<Output = Result<Report, LinkError>> + Send>>;

/// Per-session memory of the failover epochs announced on this connection.
#[derive(Default)]
struct Session {
    last_epoch: Option<u64>,
    /// Bound at `+try-failover`, which Sentinel announces right after the `+new-epoch` of the
    /// failover; read at `+promoted-slave`.
    failover_epoch: HashMap<String, u64>,
}

async fn ping_once(conn: &mut MultiplexedConnection) -> Result<(), LinkError> {
    let ping = redis::cmd("PING");
    match timeout(PING_DEADLINE, ping.query_async::<Value>(conn)).await {
        Ok(r) => r.map(drop).map_err(LinkError::from),
        Err(_) => Err(LinkError::PingTimeout(PING_DEADLINE)),
    }
}

/// The config epoch this Sentinel holds for `master` (`SENTINEL MASTER <name>`).
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
    addr: &Value,
    replicas: &Value,
    peers: Vec<PeerRecord>,
) -> Option<MasterReport> {
    // The address comes from get-master-addr-by-name, read after the epoch: during a failover
    // it already names the promoted replica, never the old primary with the new epoch.
    let primary = master_addr(addr).unwrap_or_else(|| m.addr.clone());
    let primary = resolve(&primary).await?;
    let mut nodes = Vec::new();
    for r in records(replicas).iter().filter_map(ReplicaRecord::from_record) {
        if let Some(n) = resolve(&r.addr).await {
            nodes.push(Replica {
                ip: n.ip,
                port: n.port,
                hostname: n.hostname,
                healthy: r.healthy,
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
    fn full_reconciliation_is_paced_by_the_number_of_masters() {
        assert_eq!(full_every(0), RECONCILE_MIN);
        assert_eq!(full_every(3), Duration::from_secs(1));
        assert_eq!(full_every(1000), Duration::from_secs(10));
        assert_eq!(full_every(usize::MAX), RECONCILE_MAX);
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
