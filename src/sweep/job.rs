//! One sweep job: destroy the target's sockets at once, then again every `drain.interval`
//! until its deadline, so that a client which reconnects to the old primary (a hung process
//! still completes handshakes from its accept queue; a stale DNS cache still names O) is cut
//! again.
//!
//! A node-side job sweeps through `drain.window` and ends early once the local node answers
//! `ROLE` as a replica (it is no longer hung and no longer claims master; the drain takes it
//! from there). A client-side job sweeps until `drain.grace`, then on through `drain.window`
//! while the old primary is dark, hung or still a master: found with ioredis behind unbound,
//! which named the old primary up to 1.9 s after the flip, after the last sweep; connections
//! opened to a dark old primary in that gap hung for the library's connect timeout (15 s).
//! Any job ends when the node it sweeps is published as the primary again.

//!
//! Before each node-side round the node is asked its `CLIENT LIST` (briefly: a hung node does
//! not answer, and then the last answer stands), and the Sentinels', polestars' and
//! replication connections it names are spared: in agent mode, for Sentinels given by
//! hostname or not configured at all, and for the central polestar whose fence and drain run
//! over its own connections to this node.

use std::collections::BTreeSet;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::Context;
use super::diag::{self, States, TcpSocket};
use super::plan::{Change, Target};
use crate::events::Kind;
use crate::node::clients::parse_list;
use crate::node::{Endpoint, Link, NodeError, Role};

/// Peers named in one event at most (the count is always complete).
const PEERS_IN_EVENT: usize = 50;
/// The `ROLE` check of the local node; a hung process does not answer within it.
const ROLE_TIMEOUT: Duration = Duration::from_millis(300);
/// The `CLIENT LIST` of the local node before a round; a hung process does not answer.
const LIST_TIMEOUT: Duration = Duration::from_millis(200);

pub async fn run(context: Arc<Context>, change: Change, target: Target) {
    let started = Instant::now();
    let (grace_end, window_end) = (started + context.grace, started + context.window);
    let mut total = 0;
    let mut spared = BTreeSet::new();
    for round in 1.. {
        if republished(&context, &change) {
            break;
        }
        // A hung node does not answer: then the infrastructure it named last is spared and
        // every other client swept.
        let listing = infrastructure(&context, &change, &target).await;
        if let Some((now, _)) = &listing {
            spared = now.clone();
        }
        let listed = listing.as_ref().map(|(_, all)| all);
        total += sweep_once(&context, &change, &target.sparing(&spared, listed), round).await;
        let next = Instant::now() + context.interval;
        if next >= window_end.max(grace_end) {
            break;
        }
        let past_grace = next >= grace_end;
        if !keep_sweeping(&target, past_grace, || probe(&context, &change)).await {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = context.shutdown.cancelled() => break,
        }
    }
    // To the millisecond: a log line, not a benchmark.
    let elapsed = Duration::from_millis(started.elapsed().as_millis() as u64);
    tracing::info!(
        master = %change.master, node = %change.from, side = target.side(),
        "sweep of {} done: {total} socket(s) destroyed in {elapsed:?}", change.from
    );
}

/// What the old primary answered to this host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Probe {
    /// No TCP connection or no reply within [`ROLE_TIMEOUT`]: dark host or hung process.
    /// Every client that (re)connects to it from a stale cache hangs until its own timeout.
    Silent,
    /// Connections are refused at once: clients fail fast and resolve again by themselves.
    Refused,
    /// It answers, as a master (a returning or not yet demoted old primary).
    Master,
    /// It answers as a replica: demoted, the drain takes it from here.
    Replica,
    /// It answers, with an error (no credentials for it here): alive, role unknown.
    Answers,
}

/// Whether the job sweeps another round (both sides; docs/failover.md, "Socket sweeping").
/// The node side sweeps through `drain.window` until its node answers as a replica. The client
/// side sweeps unconditionally until `drain.grace` (a stale DNS cache may still name O), then,
/// through `drain.window`, only while O is useless to every client: silent (dark or hung: a
/// client's connect would hang, and the sweep aborts it at once) or still claiming master.
async fn keep_sweeping<F: Future<Output = Probe>>(
    target: &Target,
    past_grace: bool,
    probe: impl FnOnce() -> F,
) -> bool {
    match target {
        Target::Local { .. } => probe().await != Probe::Replica,
        Target::Remote { .. } if !past_grace => true,
        Target::Remote { .. } => matches!(probe().await, Probe::Silent | Probe::Master),
    }
}

/// Whether the swept node is the published primary again (a failback): stop cutting it.
fn republished(context: &Context, change: &Change) -> bool {
    let snapshot = context.topology.borrow().clone();
    snapshot.master(&change.master).and_then(|m| m.primary.as_ref()) == Some(&change.from)
}

/// Asks the old primary `ROLE`, each step within [`ROLE_TIMEOUT`].
async fn probe(context: &Context, change: &Change) -> Probe {
    let addr = change.from.addr();
    match tokio::time::timeout(ROLE_TIMEOUT, tokio::net::TcpStream::connect(addr)).await {
        Err(_) => return Probe::Silent,
        Ok(Err(_)) => return Probe::Refused,
        Ok(Ok(stream)) => drop(stream),
    }
    let endpoint = Endpoint::at(addr, &context.nodes);
    let role = Link::open_with(&endpoint, "ROLE", &redis::cmd("ROLE"), ROLE_TIMEOUT).await;
    match role.map(|(_, reply): (Link, redis::Value)| Role::parse(&reply)) {
        Err(NodeError::Timeout { .. }) => Probe::Silent,
        Ok(Role::Replica) => Probe::Replica,
        Ok(Role::Master) => Probe::Master,
        _ => Probe::Answers,
    }
}

/// The peers of the connections the local node names as the infrastructure's (Sentinels,
/// polestars, replication), and of all it lists; `None` for a client-side target or when the
/// node does not answer.
async fn infrastructure(
    context: &Context,
    change: &Change,
    target: &Target,
) -> Option<(BTreeSet<SocketAddr>, BTreeSet<SocketAddr>)> {
    if !matches!(target, Target::Local { .. }) {
        return None;
    }
    let endpoint = Endpoint::at(change.from.addr(), &context.nodes);
    let mut cmd = redis::cmd("CLIENT");
    cmd.arg("LIST");
    let mut listing = Link::open_with(&endpoint, "CLIENT LIST", &cmd, LIST_TIMEOUT).await;
    // A drain of the same node may kill this connection before it is named (it is not yet
    // `polestar`): asked again at once on a new one, or the first round spares nothing. A node
    // that does not answer in time is not asked twice.
    if listing.as_ref().is_err_and(NodeError::connection_gone) {
        listing = Link::open_with(&endpoint, "CLIENT LIST", &cmd, LIST_TIMEOUT).await;
    }
    let spared = listing.ok().map(|(_, text): (Link, String)| {
        let list = parse_list(&text);
        (list.infrastructure_peers(), list.settled_peers())
    });
    if spared.is_none() {
        tracing::debug!(master = %change.master, node = %change.from, "no CLIENT LIST: sparing the peers it named last");
    }
    spared
}

/// Destroys the target's sockets once; reports and returns how many.
async fn sweep_once(context: &Context, change: &Change, target: &Target, round: u32) -> usize {
    let states = match target {
        Target::Local { .. } => States::Established,
        Target::Remote { .. } => States::EstablishedOrOpening,
    };
    let select = match target {
        // Which local addresses reach the old primary: asked each round, listeners change.
        Target::Local { .. } => match diag::tcp_sockets(States::Listening).await {
            Ok(listeners) => target.with_listeners(change.from.addr(), &listeners),
            Err(e) => {
                tracing::error!(master = %change.master, node = %change.from, "sweep failed: {e}");
                return 0;
            }
        },
        Target::Remote { .. } => target.clone(),
    };
    match diag::destroy_where(states, move |s| select.selects(s)).await {
        Ok(destroyed) => {
            report(context, change, target, round, &destroyed);
            destroyed.len()
        }
        Err(e) => {
            tracing::error!(master = %change.master, node = %change.from, "sweep failed: {e}");
            0
        }
    }
}

fn report(context: &Context, change: &Change, target: &Target, round: u32, gone: &[TcpSocket]) {
    if gone.is_empty() {
        return;
    }
    let peers: Vec<String> = gone.iter().take(PEERS_IN_EVENT).map(|s| s.peer.to_string()).collect();
    tracing::info!(
        master = %change.master, node = %change.from, side = target.side(), round,
        "swept {} socket(s) of {} (sock_destroy): peers {}", gone.len(), change.from, peers.join(", ")
    );
    let labels = [("master", change.master.clone()), ("method", "sock_destroy".to_string())];
    metrics::counter!(crate::metrics::DRAIN_KILLED, &labels).increment(gone.len() as u64);
    let data = json!({
        "node": change.from.to_string(),
        "side": target.side(),
        "method": "sock_destroy",
        "round": round,
        "destroyed": gone.len(),
        "peers": peers,
    });
    context.events.push(Kind::Sweep, Some(&change.master), data);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::plan::Served;
    use std::collections::BTreeSet;

    fn keeps(target: &Target, past_grace: bool, answer: Probe) -> bool {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        rt.block_on(keep_sweeping(target, past_grace, || async move { answer }))
    }

    /// Found with ioredis behind unbound: the agent's last sweep ran ~1.27 s after the switch
    /// (the grace), unbound named the dark old primary until 1.9 s, and the connections opened
    /// in that gap hung 15 s. Past the grace, a silent old primary is still swept.
    #[test]
    fn agent_stopped_sweeping_before_the_resolver_stopped_naming_the_old_primary() {
        let remote = Target::Remote { peer: "10.0.0.1:6379".parse().expect("addr") };
        let local = Target::Local {
            port: 6379,
            spared: BTreeSet::new(),
            peers: BTreeSet::new(),
            listed: None,
            served: Served::Except(BTreeSet::new()),
        };
        use Probe::*;
        let table = [
            // (target, past grace, answer) -> keep sweeping
            (&remote, false, Replica, true),
            (&remote, false, Refused, true),
            (&remote, true, Silent, true),
            (&remote, true, Master, true),
            (&remote, true, Replica, false),
            (&remote, true, Refused, false),
            (&remote, true, Answers, false),
            (&local, false, Silent, true),
            (&local, true, Answers, true),
            (&local, true, Master, true),
            (&local, false, Replica, false),
        ];
        for (target, past_grace, answer, want) in table {
            assert_eq!(
                keeps(target, past_grace, answer),
                want,
                "{target:?} {past_grace} {answer:?}"
            );
        }
    }
}
