//! `handoff` of a node, run just before it is stopped (a systemd `ExecStop` step, a Kubernetes
//! `preStop` hook). A primary: the lossless switchover to a caught-up replica; the answer comes
//! once the new primary is published and the node's clients are drained. A replica: out of
//! every replica answer at once ([`super::mask`]), its clients drained. Either way the node
//! stays out until Sentinel reports it healthy after its restart ([`away`]), or for
//! [`HOLD`] if it is never restarted.
//!
//! Refused (nothing done): during a failover of its master, while another node of the master
//! is handed off (one node at a time), and for the last healthy replica (with it gone a failure
//! of the primary could not be failed over).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::{Instant, sleep};

use super::link::{NODE_DEADLINE, open_node};
use super::{Deps, Maintenance};
use crate::config::Auth;
use crate::control::{HandedOff, SwitchoverError, SwitchoverOptions};
use crate::events::{EventLog, Kind};
use crate::topology::{MasterState, TopologyReader};

/// How long a node stays out when it is never restarted.
pub const HOLD: Duration = Duration::from_secs(600);
/// How often a node that is out is looked at.
const LOOK: Duration = Duration::from_millis(500);

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
    let of = |master: &str| match asked {
        Some(asked) if asked != master => Err(SwitchoverError::OtherMaster {
            node,
            master: master.to_string(),
            asked: asked.to_string(),
        }),
        _ => Ok(()),
    };
    // A node handed off already (an old primary Sentinel does not list as a replica yet).
    if let Some(master) = maintenance.handoffs.master_of(node) {
        of(&master)?;
        return replica(maintenance, deps, &master, node).await;
    }
    let (master, role) = locate(deps, node)?;
    of(&master)?;
    match role {
        Role::Primary => primary(maintenance, deps, &master, node, options, wait).await,
        Role::Replica => replica(maintenance, deps, &master, node).await,
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

async fn primary(
    maintenance: &Arc<Maintenance>,
    deps: &Deps,
    master: &str,
    node: SocketAddr,
    options: SwitchoverOptions,
    wait: Duration,
) -> Result<HandedOff, SwitchoverError> {
    let switched = maintenance.switchover(deps, master, options).await?;
    let mut topology = deps.topology.clone();
    let moved = |s: &crate::topology::Snapshot| {
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
    maintenance.handoffs.take_out(master, node);
    let drained = drain(deps, master, node).await;
    away(maintenance.clone(), deps, master, node).await;
    let done = HandedOff {
        node,
        master: master.to_string(),
        role: "primary",
        switchover: Some(switched),
        drained,
        already: false,
    };
    push(&deps.events, &done);
    Ok(done)
}

async fn replica(
    maintenance: &Arc<Maintenance>,
    deps: &Deps,
    master: &str,
    node: SocketAddr,
) -> Result<HandedOff, SwitchoverError> {
    let handed = |drained, already| HandedOff {
        node,
        master: master.to_string(),
        role: "replica",
        switchover: None,
        drained,
        already,
    };
    if maintenance.handoffs.contains(master, node) {
        return Ok(handed(drain(deps, master, node).await, true));
    }
    let _busy = maintenance.take(master)?;
    refuse(maintenance, deps, master, node)?;
    maintenance.handoffs.take_out(master, node);
    // Drained once every reader of the topology has it unhealthy, so no client is sent back.
    let mut topology = deps.topology.clone();
    let hidden = |s: &crate::topology::Snapshot| {
        let m = s.master(master);
        m.is_none_or(|m| {
            !m.replicas.iter().any(|r| r.healthy && SocketAddr::new(r.ip, r.port) == node)
        })
    };
    let waited = tokio::time::timeout(Duration::from_secs(1), topology.wait_for(|s| hidden(s)));
    drop(waited.await);
    let done = handed(drain(deps, master, node).await, false);
    away(maintenance.clone(), deps, master, node).await;
    push(&deps.events, &done);
    Ok(done)
}

/// Why a replica's handoff is refused, if it is.
fn refuse(
    maintenance: &Maintenance,
    deps: &Deps,
    master: &str,
    node: SocketAddr,
) -> Result<(), SwitchoverError> {
    let m = deps.master(master)?;
    let refused = |why: String| Err(SwitchoverError::Refused { node, why });
    if m.state == MasterState::Failover {
        return refused(format!("a failover of {master} is in progress"));
    }
    let others: Vec<String> = maintenance
        .handoffs
        .of(master)
        .iter()
        .filter(|n| **n != node)
        .map(|n| n.to_string())
        .collect();
    if !others.is_empty() {
        return refused(format!(
            "{} of {master} is handed off now: one node at a time",
            others.join(", ")
        ));
    }
    let addr = |r: &crate::topology::Replica| SocketAddr::new(r.ip, r.port);
    let me = m.replicas.iter().find(|r| addr(r) == node).is_some_and(|r| r.healthy);
    let healthy_others = m.replicas.iter().filter(|r| r.healthy && addr(r) != node).count();
    if me && healthy_others == 0 {
        return refused(format!(
            "it is the last healthy replica of {master}: without it a failure of the primary \
             could not be failed over"
        ));
    }
    Ok(())
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

/// Starts looking after a node that is out: it comes back once Sentinel reports it healthy
/// after its restart ([`step`]), or after [`HOLD`].
async fn away(maintenance: Arc<Maintenance>, deps: &Deps, master: &str, node: SocketAddr) {
    let run_id = look(node, &deps.nodes).await.and_then(|n| n.run_id);
    let (raw, auth, events) = (deps.raw.clone(), deps.nodes.clone(), deps.events.clone());
    let master = master.to_string();
    // Ends by itself within HOLD (nothing else needs its result).
    crate::supervise::detached("a node's handoff", async move {
        let deadline = Instant::now() + HOLD;
        let mut state = Away { run_id, restarted: false };
        while Instant::now() < deadline && maintenance.handoffs.contains(&master, node) {
            sleep(LOOK).await;
            let seen = Seen {
                sentinel_healthy: healthy(&raw, &master, node),
                node: look(node, &auth).await,
            };
            let back;
            (state, back) = step(state, &seen);
            if back {
                break;
            }
        }
        maintenance.handoffs.bring_back(&master, node);
        let data = json!({ "node": node, "restarted": state.restarted });
        events.push(Kind::HandoffEnded, Some(&master), data);
        tracing::info!(%master, %node, restarted = state.restarted, "handoff over: the node is back in the replica answers");
    });
}

fn healthy(raw: &TopologyReader, master: &str, node: SocketAddr) -> bool {
    let snapshot = raw.borrow();
    let m = snapshot.master(master);
    m.is_some_and(|m| m.replicas.iter().any(|r| r.healthy && SocketAddr::new(r.ip, r.port) == node))
}

/// What the node itself says: its run id (it changes with every restart) and whether its
/// link to its primary is up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSeen {
    pub run_id: Option<String>,
    pub linked: bool,
}

async fn look(node: SocketAddr, auth: &Auth) -> Option<NodeSeen> {
    let link =
        tokio::time::timeout(Duration::from_secs(2), open_node(node, auth)).await.ok()?.ok()?;
    let server = link.info("server", NODE_DEADLINE).await.ok()?;
    let replication = link.info("replication", NODE_DEADLINE).await.ok()?;
    let field = |text: &str, key: &str| {
        text.lines()
            .find_map(|l| l.trim_end().strip_prefix(key)?.strip_prefix(':').map(str::to_string))
    };
    Some(NodeSeen {
        run_id: field(&server, "run_id"),
        linked: field(&replication, "master_link_status").as_deref() == Some("up"),
    })
}

/// A node that is out, as far as we followed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Away {
    /// Its run id when it was handed off.
    pub run_id: Option<String>,
    /// It has gone away since (Sentinel or we lost it, or its run id changed).
    pub restarted: bool,
}

/// One look at a node that is out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// The configured Sentinels report it up and linked (the unmasked topology).
    pub sentinel_healthy: bool,
    /// `None`: it does not answer.
    pub node: Option<NodeSeen>,
}

/// Whether the node is back: it went away (or restarted faster than we looked: a new run id),
/// and now Sentinel reports it healthy and it is linked to its primary.
pub fn step(mut away: Away, seen: &Seen) -> (Away, bool) {
    let rebooted = seen.node.as_ref().is_some_and(|n| n.run_id != away.run_id);
    away.restarted |= !seen.sentinel_healthy || seen.node.is_none() || rebooted;
    let linked = seen.node.as_ref().is_some_and(|n| n.linked);
    let back = away.restarted && seen.sentinel_healthy && linked;
    (away, back)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on purpose
mod tests {
    use super::*;

    fn node(run_id: &str, linked: bool) -> Option<NodeSeen> {
        Some(NodeSeen { run_id: Some(run_id.into()), linked })
    }

    #[test]
    fn a_node_comes_back_only_after_a_restart_once_sentinel_and_its_link_say_healthy() {
        let start = Away { run_id: Some("a".into()), restarted: false };
        let seen = |sentinel_healthy, node| Seen { sentinel_healthy, node };
        // Not stopped yet: it stays out, however healthy.
        let (state, back) = step(start.clone(), &seen(true, node("a", true)));
        assert!(!back && !state.restarted);
        // Stopped: gone for Sentinel and for us.
        let (state, back) = step(state, &seen(false, None));
        assert!(!back && state.restarted);
        // Started, resyncing: not yet.
        let (state, back) = step(state, &seen(false, node("b", false)));
        assert!(!back);
        let (state, back) = step(state, &seen(true, node("b", false)));
        assert!(!back, "its link is still down");
        let (_, back) = step(state, &seen(true, node("b", true)));
        assert!(back);
        // A restart faster than Sentinel noticed: the new run id says it.
        let (_, back) = step(start, &seen(true, node("c", true)));
        assert!(back);
    }
}
