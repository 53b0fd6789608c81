//! Turning the upstreams' `GET /v1/masters` answers into this polestar's next snapshot (pure).
//!
//! No one upstream is believed: an agent may destroy sockets and send node credentials on
//! what it publishes, so a primary is published only when a majority of the configured
//! upstreams serve it ([`decide`]), the way the Sentinel side counts only a majority of its
//! configured Sentinels. Against what is published: a known primary is never replaced by
//! "unknown" (an upstream that has just restarted answers before it has a confirmed state),
//! and a lower epoch only by an explicit withdrawal.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::http::view::{MasterView, NodeView, ReplicaView};
use crate::topology::{Master, MasterState, Node, Replica, SentinelCounts, Snapshot, Withdrawn};

/// Which masters to follow and under which DNS labels (from this polestar's own config).
pub trait Labels {
    /// `None`: not followed. `Some(label)`: followed under `label`.
    fn label(&self, master: &str, upstream_label: &str) -> Option<String>;
}

/// How many nodes of a master [`Lineage`] remembers (the oldest are forgotten first).
const LINEAGE_CAP: usize = 256;

/// A node this agent has not published for this long is forgotten by its [`Lineage`]: the
/// upstreams list every replica their Sentinels know, down ones included, so a node none of
/// them has listed for ten minutes was dropped by the Sentinels, and its address may be an
/// unrelated node's now.
pub const LINEAGE_TTL: Duration = Duration::from_secs(600);

/// Per master, every node this agent published as its primary or one of its replicas (only
/// what a majority of the upstreams served gets published), with when it last did. A new
/// primary must be one of them: the replicas published right now are not enough, since an
/// upstream publishes the replicas of whichever Sentinel answered last, and a failover that
/// came while that list lacked the promoted replica was refused for good (every later view
/// names the new primary at a higher epoch, and it never was a replica in what the agent
/// kept). A node is known by its address, or by hostname and port where the Sentinels
/// announce hostnames (its IP may change: [`Node::same_instance`]); one not published for
/// [`LINEAGE_TTL`] is forgotten.
#[derive(Debug, Default)]
pub struct Lineage(BTreeMap<String, Vec<(Node, Instant)>>);

impl Lineage {
    pub fn of(&self, master: &str) -> Vec<Node> {
        self.0.get(master).into_iter().flatten().map(|(n, _)| n.clone()).collect()
    }

    /// Remembers what `snapshot` publishes `now`, and forgets what it has not for
    /// [`LINEAGE_TTL`].
    pub fn record(&mut self, snapshot: &Snapshot, now: Instant) {
        for (name, m) in &snapshot.masters {
            let known = self.0.entry(name.clone()).or_default();
            let replicas = m.replicas.iter().map(|r| Node {
                ip: r.ip,
                port: r.port,
                hostname: r.hostname.clone(),
            });
            for node in m.primary.iter().cloned().chain(replicas) {
                match known.iter_mut().find(|(n, _)| n.same_instance(&node)) {
                    Some(entry) => *entry = (node, now),
                    None => known.push((node, now)),
                }
            }
            known.retain(|(_, seen)| now.saturating_duration_since(*seen) < LINEAGE_TTL);
            let excess = known.len().saturating_sub(LINEAGE_CAP);
            known.drain(..excess);
        }
    }
}

/// What the configured upstreams say of one master, taken together.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)] // one short-lived decision per master and merge
pub enum Decision {
    /// Publish this view: a majority of the configured upstreams serve its primary at its
    /// epoch (its replicas: those a majority lists), and it may follow what is published.
    Follow(MasterView),
    /// Keep what is published (marked `stale`): no majority serves a primary it may follow;
    /// `Some(why)` when one was offered and refused.
    Keep(Option<String>),
}

/// A primary at an epoch, as the upstreams name it.
type Key = (SocketAddr, u64);

/// The one rule of an agent's trust, for one master: a primary (address and epoch) is
/// published only when a majority of the `configured` upstreams serve it (`views` holds the
/// latest view of each upstream that answers and has the master, `None` for the others: an
/// unreachable upstream still counts in the denominator). Against what is published, a
/// higher epoch needs the new primary to have been a replica (as a majority listed them, now
/// or before: `known`, the master's [`Lineage`]); an
/// equal epoch never names another primary; a lower epoch is taken only as the explicit
/// withdrawal of the provisional flip that is published.
///
/// No bound on the epoch itself, neither a step size nor a ceiling: Sentinel's epoch is one
/// counter for every master (one master's epoch jumps by thousands between two of its
/// failovers), and a forged hello can push every real Sentinel's epoch as high as it likes (a
/// ceiling, 2^32 once, then refused every real failover after it, for good). The bound is what
/// the Sentinels have reached, as a majority of the upstreams report it: each upstream
/// publishes an epoch only when a majority of its configured Sentinels report it, or when its
/// leader promotes it within the Sentinels' reach, so the epoch a majority of the upstreams
/// serve is one their Sentinels reached. (A separate "epoch the Sentinels reached" field from
/// the same upstreams would be vouched for by the same majority, and add nothing.)
pub fn decide(
    current: Option<&Master>,
    views: &[Option<&MasterView>],
    configured: usize,
    known: &[Node],
) -> Decision {
    let majority = configured / 2 + 1;
    let named: Vec<&MasterView> = views.iter().flatten().copied().filter(|v| sane(v)).collect();
    let count = |key: Key| named.iter().filter(|v| key_of(v) == Some(key)).count();
    let agreed = named.iter().filter_map(|v| key_of(v)).find(|k| count(*k) >= majority);
    let Some(key) = agreed else {
        return Decision::Keep(offered(current, &named, configured, &count));
    };
    let agreeing: Vec<&MasterView> =
        named.iter().copied().filter(|v| key_of(v) == Some(key)).collect();
    let view = agreed_view(&agreeing, majority);
    match follows(current, &view, &agreeing, majority, known) {
        Ok(()) => Decision::Follow(view),
        Err(why) => Decision::Keep(Some(why)),
    }
}

/// The view names a primary (one that does not counts for nothing).
fn sane(view: &MasterView) -> bool {
    view.primary.is_some()
}

fn key_of(view: &MasterView) -> Option<Key> {
    Some((view.primary.as_ref()?.addr(), view.epoch.unwrap_or(0)))
}

fn key_of_master(master: &Master) -> Option<Key> {
    Some((master.primary.as_ref()?.addr(), master.epoch.unwrap_or(0)))
}

/// Why nothing is followed, when an upstream offers something other than what is published.
fn offered(
    current: Option<&Master>,
    named: &[&MasterView],
    configured: usize,
    count: &dyn Fn(Key) -> usize,
) -> Option<String> {
    let published = current.and_then(key_of_master);
    let other = named.iter().filter_map(|v| key_of(v)).find(|k| Some(*k) != published)?;
    let (addr, epoch) = other;
    Some(format!(
        "primary {addr} at epoch {epoch} is served by {} of the {configured} configured \
         upstreams, not a majority",
        count(other)
    ))
}

/// Whether the agreed view may replace what is published.
fn follows(
    current: Option<&Master>,
    view: &MasterView,
    agreeing: &[&MasterView],
    majority: usize,
    known: &[Node],
) -> Result<(), String> {
    let Some((old_addr, old_epoch)) = current.and_then(key_of_master) else { return Ok(()) };
    let Some((addr, epoch)) = key_of(view) else { return Ok(()) };
    let Some(new) = view.primary.as_ref().map(node) else { return Ok(()) };
    let replica = |r: &Replica| Node { ip: r.ip, port: r.port, hostname: r.hostname.clone() };
    let listed = current.is_some_and(|m| m.replicas.iter().any(|r| replica(r).same_instance(&new)));
    let was_replica = listed || known.iter().any(|n| n.same_instance(&new));
    match epoch.cmp(&old_epoch) {
        _ if addr == old_addr && epoch >= old_epoch => Ok(()),
        std::cmp::Ordering::Greater if was_replica => Ok(()),
        std::cmp::Ordering::Greater => Err(format!("new primary {addr} was not a replica of it")),
        std::cmp::Ordering::Equal => {
            Err(format!("primary {addr} at the same epoch {epoch} as {old_addr}"))
        }
        std::cmp::Ordering::Less => {
            let undone = |v: &&&MasterView| {
                v.withdrawn
                    .as_ref()
                    .is_some_and(|w| ((w.ip, w.port).into(), w.epoch) == (old_addr, old_epoch))
            };
            if agreeing.iter().filter(undone).count() >= majority {
                Ok(())
            } else {
                Err(format!(
                    "epoch {epoch} is below the published {old_epoch} and no majority withdrew {old_addr}"
                ))
            }
        }
    }
}

/// The view a majority agrees on: the primary, epoch and the rest of one of them (one that
/// sees its Sentinels first), with the replicas and the withdrawal a majority lists.
fn agreed_view(agreeing: &[&MasterView], majority: usize) -> MasterView {
    // `decide` calls this with at least a majority (one or more) of views.
    let base = agreeing.iter().find(|v| v.state == "ok").unwrap_or(&agreeing[0]);
    let mut view = (*base).clone();
    let listed = |r: &ReplicaView| {
        agreeing
            .iter()
            .filter(|v| v.replicas.iter().any(|o| (o.ip, o.port) == (r.ip, r.port)))
            .count()
    };
    let healthy = |r: &ReplicaView| {
        agreeing
            .iter()
            .filter(|v| v.replicas.iter().any(|o| (o.ip, o.port) == (r.ip, r.port) && o.healthy))
            .count()
    };
    let mut replicas: Vec<ReplicaView> = Vec::new();
    for r in agreeing.iter().flat_map(|v| v.replicas.iter()) {
        if listed(r) >= majority && !replicas.iter().any(|o| (o.ip, o.port) == (r.ip, r.port)) {
            replicas.push(ReplicaView { healthy: healthy(r) >= majority, ..r.clone() });
        }
    }
    view.replicas = replicas;
    let same = |w: &Option<_>| agreeing.iter().filter(|v| v.withdrawn == *w).count();
    view.withdrawn = view.withdrawn.clone().filter(|_| same(&view.withdrawn) >= majority);
    view
}

/// The views to publish, one per master some upstream that answers has or this agent
/// publishes: what [`decide`] follows, or what this agent published (`stale`), or `unknown`
/// for a master it has none of. A master this agent publishes is dropped only when a majority
/// of the configured upstreams answer without it (an upstream with no masters at all is still
/// loading and says nothing). `upstreams` holds one slot per configured upstream (`None`:
/// down); `lineage` is what this agent published before. Returns them and why offered changes
/// were refused.
pub fn combine(
    current: &Snapshot,
    upstreams: &[Option<&[MasterView]>],
    lineage: &Lineage,
) -> (Vec<MasterView>, Vec<String>) {
    let all = || upstreams.iter().flatten().flat_map(|views| views.iter());
    let answering = || upstreams.iter().flatten().filter(|views| !views.is_empty());
    let without = |name: &str| answering().filter(|vs| !vs.iter().any(|v| v.name == name)).count();
    let removed = |name: &str| without(name) > upstreams.len() / 2;
    let published = current.masters.keys().map(String::as_str).filter(|n| !removed(n));
    let mut names: Vec<&str> = all().map(|v| v.name.as_str()).chain(published).collect();
    names.sort_unstable();
    names.dedup();
    let mut refused = Vec::new();
    let mut out = Vec::new();
    for name in names {
        let slots: Vec<Option<&MasterView>> =
            upstreams.iter().map(|u| u.and_then(|vs| vs.iter().find(|v| v.name == name))).collect();
        let old = current.master(name).map(|m| &**m);
        match decide(old, &slots, upstreams.len(), &lineage.of(name)) {
            Decision::Follow(view) => out.push(view),
            Decision::Keep(why) => {
                refused.extend(why.map(|why| format!("{name}: {why}")));
                // A name listed here is in some slot, or published (and so kept).
                let any = slots.iter().flatten().next().copied();
                out.extend(old.map(kept).or_else(|| any.map(unknown)));
            }
        }
    }
    (out, refused)
}

/// What this agent published for a master, kept while no majority moves it.
fn kept(old: &Master) -> MasterView {
    let state = if old.primary.is_some() { MasterState::Stale } else { MasterState::Unknown };
    MasterView { state: state.as_str().into(), ..MasterView::from(old) }
}

/// A master no majority names a primary for yet.
fn unknown(view: &MasterView) -> MasterView {
    MasterView {
        primary: None,
        epoch: None,
        since: None,
        state: MasterState::Unknown.as_str().into(),
        withdrawn: None,
        ..view.clone()
    }
}

/// The snapshot after reading `views` from the upstream, given the current one.
pub fn merge(current: &Snapshot, views: &[MasterView], labels: &dyn Labels) -> Snapshot {
    let mut masters = BTreeMap::new();
    for view in views {
        let Some(label) = labels.label(&view.name, &view.dns_name) else { continue };
        let master = from_view(view, label);
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

fn from_view(view: &MasterView, label: String) -> Master {
    Master {
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
        withdrawn: view.withdrawn.as_ref().map(|w| Withdrawn {
            node: Node { ip: w.ip, port: w.port, hostname: None },
            epoch: w.epoch,
        }),
        // What the upstreams confirm or withdraw reaches the agent as a new view.
        provisional: false,
    }
}

fn node(view: &NodeView) -> Node {
    Node { ip: view.ip, port: view.port, hostname: view.hostname.clone() }
}

fn replica(view: &crate::http::view::ReplicaView) -> Replica {
    // The view has no `down`: an upstream's unhealthy replica is taken as down.
    Replica {
        ip: view.ip,
        port: view.port,
        hostname: view.hostname.clone(),
        healthy: view.healthy,
        down: !view.healthy,
    }
}

fn state(text: &str) -> MasterState {
    MasterState::ALL.into_iter().find(|s| s.as_str() == text).unwrap_or(MasterState::Unknown)
}

#[cfg(test)]
mod tests;
