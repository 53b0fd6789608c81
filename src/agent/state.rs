//! Turning an upstream's `GET /v1/masters` answer into this polestar's next snapshot (pure).
//!
//! The upstream's view is taken as published truth, with the same two guards the Sentinel side
//! applies: a known primary is never replaced by "unknown" (an upstream that has just restarted
//! answers before it has a confirmed state), and a lower epoch is never published.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::http::view::{MasterView, NodeView};
use crate::topology::{Master, MasterState, Node, Replica, SentinelCounts, Snapshot};

/// Which masters to follow and under which DNS labels (from this polestar's own config).
pub trait Labels {
    /// `None`: not followed. `Some(label)`: followed under `label`.
    fn label(&self, master: &str, upstream_label: &str) -> Option<String>;
}

/// An epoch above this is no Sentinel's (one per failover attempt: billions of failovers).
pub const MAX_EPOCH: u64 = 1 << 32;
/// A master's epoch grows by one per failover attempt; more than this at once is not believed.
pub const MAX_EPOCH_JUMP: u64 = 1000;

/// The views to publish from the latest answers of every upstream that answers: per master,
/// the highest epoch among the plausible ones ([`plausible`]). Returns them and why the others
/// were refused.
pub fn combine(current: &Snapshot, upstreams: &[&[MasterView]]) -> (Vec<MasterView>, Vec<String>) {
    let mut best: BTreeMap<&str, &MasterView> = BTreeMap::new();
    let mut refused = Vec::new();
    for view in upstreams.iter().flat_map(|views| views.iter()) {
        if let Err(why) = plausible(current.master(&view.name).map(|m| &**m), view) {
            refused.push(format!("{}: {why}", view.name));
            continue;
        }
        // On equal epochs an upstream that is `ok` beats one that has lost its Sentinels.
        let better = best.get(view.name.as_str()).is_none_or(|b| {
            view.epoch > b.epoch || (view.epoch == b.epoch && b.state != "ok" && view.state == "ok")
        });
        if better {
            best.insert(&view.name, view);
        }
    }
    let mut views: Vec<MasterView> = best.into_values().cloned().collect();
    // A master whose every view was refused keeps what this agent published for it.
    let kept = upstreams.iter().flat_map(|v| v.iter()).filter_map(|v| current.master(&v.name));
    for old in kept {
        if !views.iter().any(|v| v.name == old.name) {
            views.push(MasterView::from(&**old));
        }
    }
    (views, refused)
}

/// Whether a view of a master can be believed, given what this agent published for it: an
/// upstream that invents an epoch (to pin the agent), or a primary without a failover, or one
/// that was never a data node of the master, is refused; the master keeps what it has.
fn plausible(old: Option<&Master>, view: &MasterView) -> Result<(), String> {
    let epoch = view.epoch.unwrap_or(0);
    if epoch > MAX_EPOCH {
        return Err(format!("epoch {epoch} is not a Sentinel epoch"));
    }
    let Some(old) = old else { return Ok(()) };
    let (Some(old_primary), Some(new_primary)) = (&old.primary, &view.primary) else {
        return Ok(());
    };
    let old_epoch = old.epoch.unwrap_or(0);
    if epoch > old_epoch.saturating_add(MAX_EPOCH_JUMP) {
        return Err(format!("epoch jumps from {old_epoch} to {epoch}"));
    }
    let moved = old_primary.addr() != new_primary.addr();
    if moved && epoch == old_epoch {
        return Err(format!(
            "primary {} at the same epoch {epoch} as {old_primary}",
            new_primary.addr()
        ));
    }
    let was_replica =
        old.replicas.iter().any(|r| (r.ip, r.port) == (new_primary.ip, new_primary.port));
    if moved && epoch > old_epoch && !was_replica {
        return Err(format!("new primary {} was not a replica of it", new_primary.addr()));
    }
    Ok(())
}

/// The snapshot after reading `views` from the upstream, given the current one.
pub fn merge(current: &Snapshot, views: &[MasterView], labels: &dyn Labels) -> Snapshot {
    let mut masters = BTreeMap::new();
    for view in views {
        let Some(label) = labels.label(&view.name, &view.dns_name) else { continue };
        let old = current.master(&view.name);
        let master = from_view(view, label, old.map(|m| &**m));
        masters.insert(view.name.clone(), Arc::new(master));
    }
    if views.is_empty() {
        // An upstream with no masters at all is still loading: keep ours, marked stale.
        return stale(current);
    }
    next(current, masters, true)
}

/// Every master kept as it is, marked `stale`: the upstream is unreachable.
pub fn stale(current: &Snapshot) -> Snapshot {
    let masters = current
        .masters
        .iter()
        .map(|(name, m)| {
            let state = if m.primary.is_some() { MasterState::Stale } else { MasterState::Unknown };
            (name.clone(), Arc::new(Master { state, ..(**m).clone() }))
        })
        .collect();
    next(current, masters, false)
}

fn next(current: &Snapshot, masters: BTreeMap<String, Arc<Master>>, reachable: bool) -> Snapshot {
    Snapshot { version: current.version + 1, masters, source_reachable: reachable }
}

fn from_view(view: &MasterView, label: String, old: Option<&Master>) -> Master {
    let mut master = Master {
        name: view.name.clone(),
        label,
        primary: view.primary.as_ref().map(node),
        epoch: view.epoch,
        since: view.since.as_deref().and_then(|s| humantime::parse_rfc3339(s).ok()),
        state: state(&view.state),
        replicas: view.replicas.iter().map(replica).collect(),
        sentinels: SentinelCounts {
            configured: view.sentinels.configured,
            reachable: view.sentinels.reachable,
            agreeing: view.sentinels.agreeing,
            discovered: view.sentinels.discovered.clone(),
        },
    };
    if let Some(old) = old.filter(|old| keeps_old_primary(old, &master)) {
        master.primary = old.primary.clone();
        master.epoch = old.epoch;
        master.since = old.since;
        if master.state == MasterState::Unknown {
            master.state = MasterState::Stale;
        }
    }
    master
}

/// An unknown primary or a lower epoch upstream never replaces what this polestar published.
fn keeps_old_primary(old: &Master, new: &Master) -> bool {
    old.primary.is_some() && (new.primary.is_none() || new.epoch < old.epoch)
}

fn node(view: &NodeView) -> Node {
    Node { ip: view.ip, port: view.port, hostname: view.hostname.clone() }
}

fn replica(view: &crate::http::view::ReplicaView) -> Replica {
    Replica { ip: view.ip, port: view.port, hostname: view.hostname.clone(), healthy: view.healthy }
}

fn state(text: &str) -> MasterState {
    MasterState::ALL.into_iter().find(|s| s.as_str() == text).unwrap_or(MasterState::Unknown)
}

#[cfg(test)]
mod tests;
