//! `handoff` of a node, run just before it is stopped (a systemd `ExecStop` step, a Kubernetes
//! `preStop` hook). A primary: the lossless switchover to a caught-up replica; the answer comes
//! once the new primary is published and the node's clients are drained. A replica: out of
//! every replica answer at once ([`super::mask`]), its clients drained. Either way the node
//! stays out until it is back ([`super::back`]: looked at every [`LOOK`] in the background, and
//! directly whenever another node of its master is asked for), or for [`HOLD`].
//!
//! Refused (nothing done), whatever the node's role: during a failover of its master, while
//! another node of the master is out and not back (one node at a time), and when it would
//! leave the master without a healthy replica (with none, a failure of the primary could not be
//! failed over). Those blockers can clear, and the handoff waits for them within its `wait`
//! (another node coming back, a failover ending, a replica catching up), then is done; the
//! answer says what it waited for. Once the wait is over with a blocker still there, the
//! refusal names it and how long it waited, and for a primary what stopping it now would
//! cost ([`cost`]), also as a `handoff_refused` event.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::{Instant, sleep};

use super::back::{self, Facts, Mark, NodeInfo};
use super::link::{NODE_DEADLINE, SentinelLink, open_node};
use super::{Deps, Maintenance, lock};
use crate::config::Auth;
use crate::control::{HandedOff, SwitchoverError, SwitchoverOptions, Waited};
use crate::events::{EventLog, Kind};
use crate::node::Endpoint;
use crate::topology::{MasterState, Snapshot, TopologyReader};

/// How long a node stays out when it is never back.
pub const HOLD: Duration = Duration::from_secs(600);
/// How often a node that is out is looked at, and a blocked handoff tried again.
const LOOK: Duration = Duration::from_millis(500);
/// The blockers a handoff's answer names, at most.
const NAMED: usize = 4;

/// A node out: what was known of it at its handoff, and when that was.
#[derive(Clone, Debug)]
pub struct Marked {
    mark: Mark,
    at: Instant,
    /// The Sentinels listed it healthy then: their word that it is not any more is its stop
    /// (an old primary is listed only once demoted, which is no stop).
    listed: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Primary,
    Replica,
}

pub async fn handoff(
    maintenance: &Arc<Maintenance>,
    deps: &Deps,
    node: SocketAddr,
    asked: Option<&str>,
    options: SwitchoverOptions,
    wait: Duration,
) -> Result<HandedOff, SwitchoverError> {
    if let Some(asked) = asked {
        deps.master(asked)?;
    }
    let _asking = maintenance.asking(node)?;
    let started = Instant::now();
    let mut waited_for: Vec<(&'static str, String)> = Vec::new();
    loop {
        let error = match attempt(maintenance, deps, node, asked, options, wait).await {
            Ok(mut done) => {
                if !waited_for.is_empty() {
                    let ms = started.elapsed().as_millis() as u64;
                    let for_ = waited_for.into_iter().map(|(_, why)| why).collect();
                    done.waited = Some(Waited { ms, for_ });
                }
                return Ok(done);
            }
            Err(error) => error,
        };
        let Some(kind) = blocker(&error) else { return Err(error) };
        let why = error.to_string();
        match waited_for.iter().position(|(k, _)| *k == kind) {
            Some(i) => waited_for[i].1 = why,
            None if waited_for.len() < NAMED => waited_for.push((kind, why)),
            None => {}
        }
        let elapsed = started.elapsed();
        if elapsed >= wait {
            let before = waited_for.into_iter().filter(|(k, _)| *k != kind).map(|(_, w)| w);
            return Err(blocked(deps, node, error, elapsed, before.collect()).await);
        }
        sleep(LOOK.min(wait - elapsed)).await;
    }
}

/// What kind of blocker `error` is, if it is one that can clear by itself.
fn blocker(error: &SwitchoverError) -> Option<&'static str> {
    use SwitchoverError as E;
    match error {
        E::Busy { .. } | E::NoPrimary(_) => Some("the master busy"),
        E::Refused { why, .. } if why.contains("failover") => Some("a failover"),
        E::Refused { .. } | E::HandedOff { .. } => Some("the master's nodes"),
        E::NoCandidate { .. } | E::TooFarBehind { .. } => Some("a replica to promote"),
        _ => None,
    }
}

/// The refusal once the wait is over; a primary's names what stopping it now would cost, and
/// is an event.
async fn blocked(
    deps: &Deps,
    node: SocketAddr,
    error: SwitchoverError,
    waited: Duration,
    before: Vec<String>,
) -> SwitchoverError {
    let role = locate(deps, node).ok();
    let cost = match &role {
        Some((master, Role::Primary)) => Some(cost(deps, master, node).await),
        _ => None,
    };
    let why = Box::new(error);
    let refused = SwitchoverError::Blocked { why, waited, before, cost: cost.clone() };
    if let Some((master, role)) = role {
        let role = if role == Role::Primary { "primary" } else { "replica" };
        let data = json!({
            "node": node, "role": role, "error": refused.to_string(),
            "waited_ms": waited.as_millis() as u64, "cost": cost,
        });
        deps.events.push(Kind::HandoffRefused, Some(&master), data);
        if role == "primary" {
            tracing::error!(%master, %node, error = %refused, "handoff refused: stopping this primary now is not safe");
        } else {
            tracing::warn!(%master, %node, error = %refused, "handoff refused");
        }
    }
    refused
}

/// One try: refused with a blocker, or done.
async fn attempt(
    maintenance: &Arc<Maintenance>,
    deps: &Deps,
    node: SocketAddr,
    asked: Option<&str>,
    options: SwitchoverOptions,
    wait: Duration,
) -> Result<HandedOff, SwitchoverError> {
    let of = |master: &str| match asked {
        Some(asked) if asked != master => Err(SwitchoverError::OtherMaster {
            node,
            master: master.to_string(),
            asked: asked.to_string(),
        }),
        _ => Ok(()),
    };
    // A node handed off already (an old primary Sentinel does not list as a replica yet),
    // unless it has been promoted since: then it is the primary, to be handed off as one.
    if let Some(master) = maintenance.handoffs.master_of(node) {
        of(&master)?;
        if published_primary(deps, &master) != Some(node) {
            return Ok(already(deps, &master, node).await);
        }
        end(maintenance, &deps.events, &master, node, false, "promoted since its handoff");
    }
    let (master, role) = locate(deps, node)?;
    of(&master)?;
    let busy = maintenance.take(&master)?;
    let (back, not_back) = settle(maintenance, deps, &master, node).await;
    refuse(maintenance, deps, &master, node, role, &back, &not_back)?;
    match role {
        Role::Primary => primary(maintenance, busy, deps, &master, node, options, wait).await,
        Role::Replica => {
            let done = replica(maintenance, deps, &master, node).await;
            drop(busy);
            Ok(done)
        }
    }
}

/// The master `node` belongs to, and what it is there.
fn locate(deps: &Deps, node: SocketAddr) -> Result<(String, Role), SwitchoverError> {
    let snapshot = deps.topology.borrow();
    for (name, m) in &snapshot.masters {
        if m.primary.as_ref().is_some_and(|p| p.addr() == node) {
            return Ok((name.clone(), Role::Primary));
        }
        if m.replicas.iter().any(|r| SocketAddr::new(r.ip, r.port) == node) {
            return Ok((name.clone(), Role::Replica));
        }
    }
    Err(SwitchoverError::UnknownNode(node))
}

fn published_primary(deps: &Deps, master: &str) -> Option<SocketAddr> {
    let snapshot = deps.topology.borrow();
    snapshot.master(master).and_then(|m| m.primary.as_ref()).map(|p| p.addr())
}

/// Looks at every node of `master` still out (but `node`) directly, and ends the handoff of
/// each that is back: those back, and why each other one is not.
async fn settle(
    maintenance: &Arc<Maintenance>,
    deps: &Deps,
    master: &str,
    node: SocketAddr,
) -> (Vec<SocketAddr>, Vec<(SocketAddr, String)>) {
    let (mut back, mut not_back) = (Vec::new(), Vec::new());
    for other in maintenance.handoffs.of(master).into_iter().filter(|n| *n != node) {
        match is_back(maintenance, deps, master, other).await {
            Ok(restarted) => {
                end(maintenance, &deps.events, master, other, restarted, "seen back directly");
                back.push(other);
            }
            Err(why) => not_back.push((other, why)),
        }
    }
    (back, not_back)
}

/// [`back::back`] over one direct look at `node` and at its master's published primary.
async fn is_back(
    maintenance: &Maintenance,
    deps: &Deps,
    master: &str,
    node: SocketAddr,
) -> Result<bool, String> {
    let marked = lock(&maintenance.marks).get(&node).cloned();
    let (mark, at) = match marked {
        Some(m) => (m.mark, m.at),
        None => (Mark { run_id: None, gone: true }, Instant::now()),
    };
    let seen = look(node, &deps.nodes).await;
    let primary = published_primary(deps, master);
    let primary_offset = match primary {
        Some(p) => primary_offset(p, &deps.nodes).await,
        None => None,
    };
    let facts = Facts {
        mark,
        out_for: at.elapsed(),
        node: seen,
        primary,
        primary_offset,
        max_lag: deps.max_lag,
    };
    back::back(&facts)
}

/// Why a handoff of `node` is refused, if it is. `back`: the nodes [`settle`] just found back
/// (healthy, whatever the published view says yet); `not_back`: those still out, and why.
fn refuse(
    maintenance: &Maintenance,
    deps: &Deps,
    master: &str,
    node: SocketAddr,
    role: Role,
    back: &[SocketAddr],
    not_back: &[(SocketAddr, String)],
) -> Result<(), SwitchoverError> {
    let m = deps.master(master)?;
    let refused = |why: String| Err(SwitchoverError::Refused { node, why });
    if m.state == MasterState::Failover {
        return refused(format!("a failover of {master} is in progress"));
    }
    if !not_back.is_empty() {
        let each: Vec<String> = not_back.iter().map(|(n, why)| format!("{n} ({why})")).collect();
        return refused(format!(
            "{} of {master} is handed off now and not back: one node at a time",
            each.join(", ")
        ));
    }
    // Sentinel's view, unmasked, less the nodes out, plus those just seen back.
    let raw = deps.raw.borrow();
    let replicas = raw.master(master).map_or(&[][..], |m| &m.replicas);
    let healthy: Vec<SocketAddr> = replicas
        .iter()
        .map(|r| (SocketAddr::new(r.ip, r.port), r.healthy))
        .filter(|(a, h)| {
            *a != node && (back.contains(a) || (*h && !maintenance.handoffs.contains(master, *a)))
        })
        .map(|(a, _)| a)
        .collect();
    match (role, healthy.as_slice()) {
        (Role::Replica, [])
            if replicas.iter().any(|r| r.healthy && node == SocketAddr::new(r.ip, r.port)) =>
        {
            refused(format!(
                "it is the last healthy replica of {master}: without it a failure of the primary \
                 could not be failed over"
            ))
        }
        (Role::Primary, []) => refused(format!("no replica of {master} is healthy to take over")),
        (Role::Primary, [only]) => refused(format!(
            "{only} is the last healthy replica of {master}: promoted, it would have no replica \
             to fail over to while this node restarts"
        )),
        _ => Ok(()),
    }
}

async fn primary(
    maintenance: &Arc<Maintenance>,
    busy: impl Send + 'static,
    deps: &Deps,
    master: &str,
    node: SocketAddr,
    options: SwitchoverOptions,
    wait: Duration,
) -> Result<HandedOff, SwitchoverError> {
    let handed_off = maintenance.handoffs.of(master);
    let switched = super::run::to_the_end(busy, deps, master, node, handed_off, options).await?;
    let mut topology = deps.topology.clone();
    let moved = |s: &Snapshot| {
        s.master(master).and_then(|m| m.primary.as_ref()).is_some_and(|p| p.addr() != node)
    };
    let published = {
        let waited = tokio::time::timeout(wait, topology.wait_for(|s| moved(s))).await;
        matches!(waited, Ok(Ok(_)))
    };
    if !published {
        return Err(SwitchoverError::TimedOut(format!(
            "Sentinel {} accepted the failover of {master}, but no new primary was published \
             within {}",
            switched.sentinel,
            crate::config::duration::format(wait)
        )));
    }
    // From now on it is a replica about to stop: out of the replica answers too.
    let run_id = look(node, &deps.nodes).await.and_then(|n| n.run_id);
    take_out(maintenance, deps, master, node, run_id);
    let drained = drain(deps, master, node).await;
    let done = HandedOff {
        node,
        master: master.to_string(),
        role: "primary",
        switchover: Some(switched),
        drained,
        already: false,
        waited: None,
    };
    push(&deps.events, &done);
    Ok(done)
}

fn replica_done(master: &str, node: SocketAddr, drained: usize, already: bool) -> HandedOff {
    HandedOff {
        node,
        master: master.to_string(),
        role: "replica",
        switchover: None,
        drained,
        already,
        waited: None,
    }
}

/// A node out already: drained again, nothing else.
async fn already(deps: &Deps, master: &str, node: SocketAddr) -> HandedOff {
    replica_done(master, node, drain(deps, master, node).await, true)
}

async fn replica(
    maintenance: &Arc<Maintenance>,
    deps: &Deps,
    master: &str,
    node: SocketAddr,
) -> HandedOff {
    let run_id = look(node, &deps.nodes).await.and_then(|n| n.run_id);
    take_out(maintenance, deps, master, node, run_id);
    // Drained once every reader of the topology has it unhealthy, so no client is sent back.
    let mut topology = deps.topology.clone();
    let hidden = |s: &Snapshot| {
        let m = s.master(master);
        m.is_none_or(|m| {
            !m.replicas.iter().any(|r| r.healthy && SocketAddr::new(r.ip, r.port) == node)
        })
    };
    let waited = tokio::time::timeout(Duration::from_secs(1), topology.wait_for(|s| hidden(s)));
    drop(waited.await);
    let done = replica_done(master, node, drain(deps, master, node).await, false);
    push(&deps.events, &done);
    done
}

/// Kills the node's clients that are not spared (Sentinels, replication, polestars), as a
/// manual drain does; 0 when draining is off or the node does not answer.
async fn drain(deps: &Deps, master: &str, node: SocketAddr) -> usize {
    let Some(handle) = &deps.drain else { return 0 };
    match handle.drain_addr(master, node).await {
        Ok(report) => report.killed,
        Err(error) => {
            tracing::warn!(master, %node, %error, "handoff: draining failed");
            0
        }
    }
}

fn push(events: &EventLog, done: &HandedOff) {
    let data = serde_json::to_value(done).unwrap_or_default();
    events.push(Kind::Handoff, Some(&done.master), data);
    tracing::info!(master = %done.master, node = %done.node, role = done.role, drained = done.drained, "handoff: the node is safe to stop");
}

/// Takes `node` out, with what is known of it now, and starts following it, in one step (no
/// await between: a request dropped here leaves no node out that nothing follows).
fn take_out(
    maintenance: &Arc<Maintenance>,
    deps: &Deps,
    master: &str,
    node: SocketAddr,
    run_id: Option<String>,
) {
    let listed = healthy(&deps.raw, master, node);
    let marked = Marked { mark: Mark { run_id, gone: false }, at: Instant::now(), listed };
    lock(&maintenance.marks).insert(node, marked);
    maintenance.handoffs.take_out(master, node);
    away(maintenance.clone(), deps.clone(), master.to_string(), node);
}

/// Ends the handoff of `node` (if it still is out): back in the replica answers, an event.
fn end(
    maintenance: &Maintenance,
    events: &EventLog,
    master: &str,
    node: SocketAddr,
    restarted: bool,
    how: &str,
) {
    if !maintenance.handoffs.bring_back(master, node) {
        return;
    }
    lock(&maintenance.marks).remove(&node);
    let data = json!({ "node": node, "restarted": restarted, "how": how });
    events.push(Kind::HandoffEnded, Some(master), data);
    tracing::info!(%master, %node, restarted, how, "handoff over: the node is back in the replica answers");
}

/// Follows a node that is out: it comes back once [`back::back`] says so, or after [`HOLD`].
/// Seen gone (it does not answer, or the Sentinels report it unhealthy) is remembered in its
/// mark: that is its restart.
fn away(maintenance: Arc<Maintenance>, deps: Deps, master: String, node: SocketAddr) {
    // Ends by itself within HOLD (nothing else needs its result).
    crate::supervise::detached("a node's handoff", async move {
        let deadline = Instant::now() + HOLD;
        while Instant::now() < deadline && maintenance.handoffs.contains(&master, node) {
            sleep(LOOK).await;
            let listed = lock(&maintenance.marks).get(&node).is_some_and(|m| m.listed);
            let unlisted = listed && !healthy(&deps.raw, &master, node);
            if (unlisted || look(node, &deps.nodes).await.is_none())
                && let Some(m) = lock(&maintenance.marks).get_mut(&node)
            {
                m.mark.gone = true;
            }
            if let Ok(restarted) = is_back(&maintenance, &deps, &master, node).await {
                end(&maintenance, &deps.events, &master, node, restarted, "seen back");
                return;
            }
        }
        end(&maintenance, &deps.events, &master, node, false, "held out for its longest");
    });
}

fn healthy(raw: &TopologyReader, master: &str, node: SocketAddr) -> bool {
    let snapshot = raw.borrow();
    let m = snapshot.master(master);
    m.is_some_and(|m| m.replicas.iter().any(|r| r.healthy && SocketAddr::new(r.ip, r.port) == node))
}

/// What the node says of itself (`INFO server` and `INFO replication`); `None`: it does not
/// answer.
async fn look(node: SocketAddr, auth: &Auth) -> Option<NodeInfo> {
    let link =
        tokio::time::timeout(Duration::from_secs(2), open_node(node, auth)).await.ok()?.ok()?;
    let server = link.info("server", NODE_DEADLINE).await.ok()?;
    let replication = link.info("replication", NODE_DEADLINE).await.ok()?;
    Some(NodeInfo::parse(&server, &replication))
}

async fn primary_offset(primary: SocketAddr, auth: &Auth) -> Option<u64> {
    let link =
        tokio::time::timeout(Duration::from_secs(2), open_node(primary, auth)).await.ok()?.ok()?;
    let text = link.info("replication", NODE_DEADLINE).await.ok()?;
    super::info::Primary::parse(&text).filter(|p| p.role_master).map(|p| p.offset)
}

/// What stopping the primary `node` of `master` now would cost, from its `INFO persistence`
/// and `INFO keyspace` and a Sentinel's `down-after-milliseconds`.
async fn cost(deps: &Deps, master: &str, node: SocketAddr) -> String {
    let link = tokio::time::timeout(Duration::from_secs(2), open_node(node, &deps.nodes)).await;
    let (persistence, keyspace) = match link {
        Ok(Ok(link)) => (
            link.info("persistence", NODE_DEADLINE).await.unwrap_or_default(),
            link.info("keyspace", NODE_DEADLINE).await.unwrap_or_default(),
        ),
        _ => (String::new(), String::new()),
    };
    let down_after = down_after(deps, master).await;
    stop_cost(&persistence, &keyspace, down_after)
}

/// The first answering Sentinel's `down-after-milliseconds` for `master`.
async fn down_after(deps: &Deps, master: &str) -> Option<Duration> {
    for address in &deps.sentinels.addresses {
        let endpoint = Endpoint::new(address.host.clone(), address.port, &deps.sentinels.auth);
        let Ok(mut sentinel) = SentinelLink::open(&endpoint).await else { continue };
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg("MASTER").arg(master);
        let Ok(reply) = sentinel.query::<redis::Value>(cmd).await else { continue };
        let record = crate::sentinel::message::record(&reply)?;
        let ms = record.get("down-after-milliseconds")?.parse().ok()?;
        return Some(Duration::from_millis(ms));
    }
    None
}

/// The cost of stopping a primary now, in words: what it keeps over a restart (nothing
/// without persistence: its replicas then full-sync an empty dataset; the writes since its
/// last save with RDB only), and that no failover comes before `down-after`.
pub fn stop_cost(persistence: &str, keyspace: &str, down_after: Option<Duration>) -> String {
    let field = |key: &str| {
        persistence.lines().find_map(|l| l.trim_end().strip_prefix(key)?.strip_prefix(':'))
    };
    let number = |key: &str| field(key).and_then(|v| v.parse::<u64>().ok());
    let keys: u64 = keyspace
        .lines()
        .filter_map(|l| l.split_once(":keys=")?.1.split(',').next()?.parse::<u64>().ok())
        .sum();
    let kept = match (field("aof_enabled"), number("rdb_saves")) {
        (Some("1"), _) => "with AOF on, it keeps what its last fsync wrote".to_string(),
        (Some(_), Some(0)) => format!(
            "no persistence (no AOF, no RDB save since it started): if it restarts without a \
             dump it comes back empty, and its replicas full-sync the empty dataset (keys \
             lost: {keys})"
        ),
        (Some(_), _) => match number("rdb_changes_since_last_save") {
            Some(changes) => format!("RDB only: the {changes} writes since its last save are lost"),
            None => "RDB only: the writes since its last save are lost".to_string(),
        },
        (None, _) => {
            "what it keeps over a restart is unknown (its INFO persistence did not answer)".into()
        }
    };
    let failover = match down_after {
        Some(d) => format!(
            "no failover unless it stays down longer than down-after-milliseconds ({})",
            crate::config::duration::format(d)
        ),
        None => "no failover unless it stays down longer than down-after-milliseconds".to_string(),
    };
    format!("{kept}; {failover}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cost_of_stopping_a_primary_says_what_it_loses_and_when_a_failover_comes() {
        let keyspace = "# Keyspace\r\ndb0:keys=120,expires=0,avg_ttl=0\r\ndb1:keys=3,expires=0\r\n";
        let none = "aof_enabled:0\r\nrdb_saves:0\r\nrdb_changes_since_last_save:9000\r\n";
        let rdb = "aof_enabled:0\r\nrdb_saves:4\r\nrdb_changes_since_last_save:17\r\n";
        let aof = "aof_enabled:1\r\nrdb_saves:0\r\n";
        let s = Duration::from_secs;
        let cost = stop_cost(none, keyspace, Some(s(20)));
        assert!(cost.contains("comes back empty") && cost.contains("keys lost: 123"), "{cost}");
        assert!(cost.contains("full-sync the empty dataset") && cost.contains("20s"), "{cost}");
        let cost = stop_cost(rdb, keyspace, Some(s(5)));
        assert!(cost.contains("the 17 writes since its last save"), "{cost}");
        assert!(stop_cost(aof, "", None).contains("AOF on"));
        assert!(stop_cost("", "", None).contains("unknown"));
    }
}
