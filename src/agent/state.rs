//! Turning the upstreams' `GET /v1/masters` answers into this polestar's next snapshot (pure).
//!
//! No one upstream is believed: an agent may destroy sockets and send node credentials on
//! what it publishes, so a primary is published only when a majority of the configured
//! upstreams serve it ([`decide`]), the way the Sentinel side counts only a majority of its
//! configured Sentinels. The same majority decides everything else an upstream could point
//! clients with ([`combine`]): whether a master exists at all, its DNS label, and its replicas.
//! Against what is published: a known primary is never replaced by "unknown" (an upstream
//! that has just restarted answers before it has a confirmed state), and a lower epoch only
//! by an explicit withdrawal. One merge is linear in what the upstreams serve (each answer is
//! indexed by name once), and what one upstream may serve is bounded ([`super::feed`]).

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::http::view::{MasterView, NodeView, ReplicaView};
use crate::topology::{Master, MasterState, Node, Replica, SentinelCounts, Snapshot, Withdrawn};

/// Under which DNS label this agent publishes a master (from its own config).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Label<'a> {
    /// Not followed (`masters:` does not list it).
    Unfollowed,
    /// The label a majority of the configured upstreams give it (no `masters:`).
    Agreed,
    /// This one (`masters[].dns_name`), whatever the upstreams call it.
    Own(&'a str),
}

/// Which masters to follow and under which DNS labels.
pub trait Labels {
    fn label(&self, master: &str) -> Label<'_>;
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
    /// [`LINEAGE_TTL`]. Linear in the nodes published (each master's nodes are looked up by
    /// address and by hostname), not their product with what is remembered.
    pub fn record(&mut self, snapshot: &Snapshot, now: Instant) {
        for (name, m) in &snapshot.masters {
            let known = self.0.entry(name.clone()).or_default();
            let replicas = m.replicas.iter().map(|r| Node {
                ip: r.ip,
                port: r.port,
                hostname: r.hostname.clone(),
            });
            let mut index = Index::of(known);
            for node in m.primary.iter().cloned().chain(replicas) {
                index.remember(known, node, now);
            }
            known.retain(|(_, seen)| now.saturating_duration_since(*seen) < LINEAGE_TTL);
            let excess = known.len().saturating_sub(LINEAGE_CAP);
            known.drain(..excess);
        }
    }
}

/// Where each node of one master's lineage is, by address and by hostname and port.
struct Index {
    by_addr: HashMap<SocketAddr, usize>,
    by_name: HashMap<(String, u16), usize>,
}

impl Index {
    fn of(known: &[(Node, Instant)]) -> Self {
        let mut index = Self { by_addr: HashMap::new(), by_name: HashMap::new() };
        for (i, (node, _)) in known.iter().enumerate().rev() {
            index.point(node, i);
        }
        index
    }

    fn point(&mut self, node: &Node, i: usize) {
        self.by_addr.insert(node.addr(), i);
        if let Some(h) = &node.hostname {
            self.by_name.insert((h.clone(), node.port), i);
        }
    }

    /// The entry of the same instance ([`Node::same_instance`]) is now `node`, seen `now`; a
    /// new one is added.
    fn remember(&mut self, known: &mut Vec<(Node, Instant)>, node: Node, now: Instant) {
        let named = node.hostname.as_ref().and_then(|h| self.by_name.get(&(h.clone(), node.port)));
        let i = match self.by_addr.get(&node.addr()).or(named).copied() {
            Some(i) => {
                let was = known[i].0.addr();
                if was != node.addr() && self.by_addr.get(&was) == Some(&i) {
                    self.by_addr.remove(&was);
                }
                known[i] = (node, now);
                i
            }
            None => {
                known.push((node, now));
                known.len() - 1
            }
        };
        self.point(&known[i].0, i);
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
    view.replicas = agreed_replicas(agreeing, majority);
    let same = |w: &Option<_>| agreeing.iter().filter(|v| v.withdrawn == *w).count();
    view.withdrawn = view.withdrawn.clone().filter(|_| same(&view.withdrawn) >= majority);
    view
}

/// A replica as the upstreams must agree on it: its address and the hostname it goes by.
type ReplicaKey = (IpAddr, u16, Option<String>);

/// The replicas at least `majority` of `views` list (each view counts once, however often it
/// lists one), healthy where a majority says so, in the order they are first listed. Linear in
/// the replicas listed.
fn agreed_replicas(views: &[&MasterView], majority: usize) -> Vec<ReplicaView> {
    // Each replica in the order first listed: that entry, the views listing it, and those
    // calling it healthy.
    let mut order: Vec<(ReplicaView, usize, usize)> = Vec::new();
    let mut at: HashMap<ReplicaKey, usize> = HashMap::new();
    for view in views {
        // This view's replicas (where in `order`), and whether it calls each healthy.
        let mut this: HashMap<usize, bool> = HashMap::with_capacity(view.replicas.len());
        for r in &view.replicas {
            let i = *at.entry((r.ip, r.port, r.hostname.clone())).or_insert_with(|| {
                order.push((r.clone(), 0, 0));
                order.len() - 1
            });
            *this.entry(i).or_default() |= r.healthy;
        }
        for (i, healthy) in this {
            order[i].1 += 1;
            order[i].2 += usize::from(healthy);
        }
    }
    let agreed = order.into_iter().filter(|(_, listed, _)| *listed >= majority);
    agreed.map(|(r, _, healthy)| ReplicaView { healthy: healthy >= majority, ..r }).collect()
}

/// The label a majority of the configured upstreams give a master (`slots`: each one's view
/// of it), if any.
fn agreed_label<'a>(slots: &[Option<&'a MasterView>], majority: usize) -> Option<&'a str> {
    let mut votes: HashMap<&str, usize> = HashMap::new();
    for view in slots.iter().flatten() {
        let n = votes.entry(view.dns_name.as_str()).or_default();
        *n += 1;
        if *n >= majority {
            return Some(view.dns_name.as_str());
        }
    }
    None
}

/// One upstream's answer, by master name (a name it lists twice: its first view).
fn by_name(views: &[MasterView]) -> HashMap<&str, &MasterView> {
    let mut index = HashMap::with_capacity(views.len());
    for view in views {
        index.entry(view.name.as_str()).or_insert(view);
    }
    index
}

/// The views to publish, each under the DNS label to publish it by (its `dns_name`), and why
/// what was offered was refused.
///
/// A master is published when a majority of the configured upstreams name it, or while this
/// agent publishes it (it is dropped only when a majority of them answer without it; an
/// upstream with no masters at all is still loading and says nothing): a master only a
/// minority names is not published at all, so one upstream cannot add a name, nor take one
/// from a real master (the DNS zone serves one master per label). Its primary is what
/// [`decide`] follows, or what this agent published (`stale`), or `unknown`; its replicas those
/// a majority lists; its label its own (`masters:`), or the one a majority gives it, or the
/// one it is published under while no majority gives another (a master no majority labels is
/// not published). A label two masters would be published under is published for neither.
/// `upstreams` holds one slot per configured upstream (`None`: down); `lineage` is what this
/// agent published before. Linear in what the upstreams serve.
pub fn combine(
    current: &Snapshot,
    upstreams: &[Option<&[MasterView]>],
    lineage: &Lineage,
    labels: &dyn Labels,
) -> (Vec<MasterView>, Vec<String>) {
    let configured = upstreams.len();
    let index: Vec<Option<HashMap<&str, &MasterView>>> =
        upstreams.iter().map(|u| u.map(by_name)).collect();
    // An upstream with no masters at all is still loading: it names nothing and removes nothing.
    let answering = index.iter().flatten().filter(|names| !names.is_empty()).count();
    let mut naming: BTreeMap<&str, usize> = BTreeMap::new();
    for name in index.iter().flatten().flat_map(|names| names.keys()) {
        *naming.entry(name).or_default() += 1;
    }
    for name in current.masters.keys() {
        naming.entry(name.as_str()).or_default();
    }
    let mut refused = Vec::new();
    let mut minority = Minority::default();
    let mut out = Vec::new();
    for (name, named) in naming {
        let label = labels.label(name);
        if label == Label::Unfollowed {
            continue;
        }
        let old = current.master(name).map(|m| &**m);
        let published = old.is_some() && answering - named <= configured / 2;
        if named <= configured / 2 && !published {
            minority.add(name, named);
            continue;
        }
        let slots: Vec<Option<&MasterView>> =
            index.iter().map(|u| u.as_ref().and_then(|names| names.get(name).copied())).collect();
        out.extend(one_master(name, old, &slots, &lineage.of(name), label, &mut refused));
    }
    refused.extend(minority.reason(configured));
    refused.extend(unshared(&mut out));
    (out, refused)
}

/// The view of master `name` to publish (`slots`: each configured upstream's view of it), or
/// `None` when no label may be given to it; why something offered was refused goes to
/// `refused`.
fn one_master(
    name: &str,
    old: Option<&Master>,
    slots: &[Option<&MasterView>],
    known: &[Node],
    label: Label<'_>,
    refused: &mut Vec<String>,
) -> Option<MasterView> {
    let configured = slots.len();
    let majority = configured / 2 + 1;
    let mut view = match decide(old, slots, configured, known) {
        Decision::Follow(view) => view,
        Decision::Keep(why) => {
            refused.extend(why.map(|why| format!("{name}: {why}")));
            old.map_or_else(|| unknown(name, slots, majority), kept)
        }
    };
    let label = match label {
        Label::Own(own) => Some(own),
        _ => agreed_label(slots, majority).or(old.map(|m| m.label.as_str())),
    };
    let Some(label) = label else {
        refused.push(format!(
            "{name}: no DNS label is given by a majority of the {configured} configured \
             upstreams; not published"
        ));
        return None;
    };
    view.dns_name = label.to_string();
    Some(view)
}

/// The masters only a minority of the upstreams name, told in one line (one upstream may name
/// thousands).
#[derive(Default)]
struct Minority<'a> {
    count: usize,
    first: Option<(&'a str, usize)>,
}

impl<'a> Minority<'a> {
    fn add(&mut self, name: &'a str, named: usize) {
        self.count += 1;
        self.first.get_or_insert((name, named));
    }

    fn reason(&self, configured: usize) -> Option<String> {
        let (name, named) = self.first?;
        Some(format!(
            "{} master(s) named by fewer than a majority of the {configured} configured \
             upstreams are not published (the first, {name:?}, by {named})",
            self.count
        ))
    }
}

/// Removes every master whose label another master has too, and says so.
fn unshared(views: &mut Vec<MasterView>) -> Vec<String> {
    let mut holders: HashMap<String, Vec<String>> = HashMap::new();
    for view in views.iter() {
        holders.entry(view.dns_name.clone()).or_default().push(view.name.clone());
    }
    views.retain(|v| holders.get(&v.dns_name).is_some_and(|names| names.len() == 1));
    let mut shared: Vec<String> = holders
        .into_iter()
        .filter(|(_, names)| names.len() > 1)
        .map(|(label, names)| {
            format!("label {label:?} is given to masters {names:?}: published for none of them")
        })
        .collect();
    shared.sort();
    shared
}

/// What this agent published for a master, kept while no majority moves it.
fn kept(old: &Master) -> MasterView {
    let state = if old.primary.is_some() { MasterState::Stale } else { MasterState::Unknown };
    MasterView { state: state.as_str().into(), ..MasterView::from(old) }
}

/// A master no majority names a primary for yet: the replicas a majority lists, the rest of
/// the first view of it.
fn unknown(name: &str, slots: &[Option<&MasterView>], majority: usize) -> MasterView {
    let views: Vec<&MasterView> = slots.iter().flatten().copied().collect();
    let empty = crate::http::view::SentinelsView {
        configured: 0,
        reachable: 0,
        agreeing: 0,
        discovered: Vec::new(),
    };
    let sentinels = views.first().map_or(empty, |v| v.sentinels.clone());
    MasterView {
        name: name.to_string(),
        dns_name: String::new(),
        primary: None,
        epoch: None,
        since: None,
        state: MasterState::Unknown.as_str().into(),
        replicas: agreed_replicas(&views, majority),
        sentinels,
        withdrawn: None,
    }
}

/// The snapshot that publishes `views` (from [`combine`]: each under its `dns_name`), given
/// the current one.
pub fn merge(current: &Snapshot, views: &[MasterView]) -> Snapshot {
    let masters = views
        .iter()
        .map(|view| (view.name.clone(), Arc::new(from_view(view, view.dns_name.clone()))))
        .collect();
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
