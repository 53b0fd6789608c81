//! One sweep job: destroy the target's sockets at once, then again every `drain.interval`
//! until its deadline, so that a client which reconnects to the old primary (a hung process
//! still completes handshakes from its accept queue; a stale DNS cache still names O) is cut
//! again.
//!
//! A node-side job ends early once the local node answers `ROLE` as a replica (it is no longer
//! hung and no longer claims master; the drain takes it from there). Any job ends when the node
//! it sweeps is published as the primary again.
//!
//! Before each node-side round the node is asked its `CLIENT LIST` (briefly: a hung node does
//! not answer, and then the last answer stands), and the Sentinels', polestars' and
//! replication connections it names are spared: in agent mode, for Sentinels given by
//! hostname or not configured at all, and for the central polestar whose fence and drain run
//! over its own connections to this node.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::Context;
use super::diag::{self, States, TcpSocket};
use super::plan::{Change, Target};
use crate::sentinel::{Endpoint, connect};

/// Peers named in one event at most (the count is always complete).
const PEERS_IN_EVENT: usize = 50;
/// The `ROLE` check of the local node; a hung process does not answer within it.
const ROLE_TIMEOUT: Duration = Duration::from_millis(300);
/// The `CLIENT LIST` of the local node before a round; a hung process does not answer.
const LIST_TIMEOUT: Duration = Duration::from_millis(200);

pub async fn run(context: Arc<Context>, change: Change, target: Target) {
    let started = Instant::now();
    let deadline = started + lifetime(&context, &target);
    let mut total = 0;
    let mut spared = BTreeSet::new();
    for round in 1.. {
        if republished(&context, &change) {
            break;
        }
        if let Some(now) = infrastructure(&context, &change, &target).await {
            spared = now;
        }
        total += sweep_once(&context, &change, &target.sparing(&spared), round).await;
        let next = Instant::now() + context.interval;
        if next >= deadline || settled(&context, &change, &target).await {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = context.shutdown.cancelled() => break,
        }
    }
    let elapsed = started.elapsed();
    tracing::info!(
        master = %change.master, node = %change.from, side = target.side(),
        "sweep of {} done: {total} socket(s) destroyed in {elapsed:?}", change.from
    );
}

fn lifetime(context: &Context, target: &Target) -> Duration {
    match target {
        Target::Local { .. } => context.window,
        Target::Remote { .. } => context.grace,
    }
}

/// Whether the swept node is the published primary again (a failback): stop cutting it.
fn republished(context: &Context, change: &Change) -> bool {
    let snapshot = context.topology.borrow().clone();
    snapshot.master(&change.master).and_then(|m| m.primary.as_ref()) == Some(&change.from)
}

/// Node side: the local node answers as a replica, so it is neither hung nor a false master.
async fn settled(context: &Context, change: &Change, target: &Target) -> bool {
    if !matches!(target, Target::Local { .. }) {
        return false;
    }
    let endpoint = Endpoint::new(change.from.ip.to_string(), change.from.port, &context.nodes);
    let check = async {
        let mut conn = connect(&endpoint, None).await.ok()?;
        let reply = redis::cmd("ROLE").query_async::<redis::Value>(&mut conn).await.ok()?;
        Some(crate::node::Role::parse(&reply))
    };
    let role = tokio::time::timeout(ROLE_TIMEOUT, check).await.ok().flatten();
    role == Some(crate::node::Role::Replica)
}

/// The peers of the connections the local node names as the infrastructure's (Sentinels,
/// polestars, replication); `None` for a client-side target or when the node does not answer.
async fn infrastructure(
    context: &Context,
    change: &Change,
    target: &Target,
) -> Option<BTreeSet<SocketAddr>> {
    if !matches!(target, Target::Local { .. }) {
        return None;
    }
    let endpoint = Endpoint::new(change.from.ip.to_string(), change.from.port, &context.nodes);
    let list = async {
        let mut conn = connect(&endpoint, None).await.ok()?;
        let mut pipe = redis::pipe();
        pipe.cmd("CLIENT").arg("SETNAME").arg(crate::node::CONNECTION_NAME).ignore();
        pipe.cmd("CLIENT").arg("LIST");
        let (list,): (String,) = pipe.query_async(&mut conn).await.ok()?;
        Some(crate::node::clients::infrastructure(&list))
    };
    let spared = tokio::time::timeout(LIST_TIMEOUT, list).await.ok().flatten();
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
    context.events.push("sweep", Some(&change.master), data);
}
