//! Kernel socket sweeping (docs/failover.md, "Socket sweeping"): when a master's primary moves
//! from O to N, destroy this host's TCP sockets that still tie clients to O.
//!
//! `CLIENT KILL` needs O to answer; a stopped redis-server or a dark host does not. The kernel
//! of O's host can still reset O's clients (node side, `sweep.local_ports`), and the kernel of
//! an application host can abort its own sockets to O (client side, `sweep.remote`). Both are
//! driven only by published topology changes, read from the [`TopologyReader`] like DNS and
//! HTTP, so they work the same whether this polestar follows Sentinels or an upstream polestar,
//! and never because contact was lost (a `stale` master keeps its primary).

pub mod diag;
mod job;
mod local;
pub mod plan;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::config::{Auth, Config, Source, Sweep};
use crate::events::EventLog;
use crate::reload::ConfigReader;
use crate::topology::TopologyReader;
pub use diag::DiagError;
use plan::{Change, Served, Target};

#[derive(Debug, thiserror::Error)]
#[error("sweep: {0}")]
pub struct SweepError(#[from] DiagError);

/// What a sweep job reads: the settings in force when it started, and the shared parts.
struct Context {
    sweep: Sweep,
    /// Node side: repeat while the old primary is hung or still claims master, this long.
    window: Duration,
    /// Client side: repeat this long, for clients whose DNS cache still names O.
    grace: Duration,
    interval: Duration,
    /// Configured Sentinel hosts: their connections to a local node are never swept.
    sentinel_hosts: BTreeSet<IpAddr>,
    /// For the `ROLE` check that ends a node-side sweep early.
    nodes: Auth,
    topology: TopologyReader,
    events: Arc<EventLog>,
    shutdown: CancellationToken,
}

/// What does not change with the configuration.
#[derive(Clone)]
struct Base {
    topology: TopologyReader,
    events: Arc<EventLog>,
    shutdown: CancellationToken,
}

impl Context {
    /// The context for `config`, or `None` when it does not sweep.
    fn of(config: &Config, base: &Base) -> Option<Arc<Self>> {
        let sweep = config.sweep.clone()?;
        Some(Arc::new(Self {
            sweep,
            window: config.drain.window,
            grace: config.drain.grace,
            interval: config.drain.interval,
            sentinel_hosts: sentinel_hosts(config),
            nodes: config.nodes.clone(),
            topology: base.topology.clone(),
            events: base.events.clone(),
            shutdown: base.shutdown.clone(),
        }))
    }

    fn announce(&self) {
        tracing::info!(
            local_ports = ?self.sweep.local_ports,
            remote = self.sweep.remote,
            "sweeping sockets on primary changes (SOCK_DESTROY permitted)"
        );
    }
}

/// Starts the sweeper, following the configuration through reloads. When `sweep` is
/// configured at start, this process's permission to destroy sockets is checked first (a
/// missing capability is a startup error, never a surprise during a failover); a reload that
/// turns sweeping on checks it then, and is not applied (logged) if it is missing.
///
/// Returns the sweeper's task, which runs until shutdown: the daemon watches it.
pub async fn start(
    config: ConfigReader,
    topology: TopologyReader,
    events: Arc<EventLog>,
    shutdown: CancellationToken,
) -> Result<JoinHandle<()>, SweepError> {
    let base = Base { topology, events, shutdown };
    let context = Context::of(&config.borrow(), &base);
    if let Some(context) = &context {
        probe().await?;
        context.announce();
    }
    Ok(tokio::spawn(follow(config, base, context)))
}

async fn probe() -> Result<(), DiagError> {
    tokio::task::spawn_blocking(diag::probe)
        .await
        .unwrap_or_else(|e| Err(DiagError::Probe(format!("the probe task failed: {e}"))))
}

/// Follows the topology until shutdown and starts the jobs for every primary change; follows
/// the configuration too (jobs already running keep the settings they started with). The jobs
/// are its own: a job that panics is logged (the next change starts new ones).
async fn follow(mut config: ConfigReader, base: Base, mut context: Option<Arc<Context>>) {
    let mut topology = base.topology.clone();
    let mut permitted = context.is_some();
    let mut reloads = true;
    let mut last = topology.borrow_and_update().clone();
    let mut jobs = JoinSet::new();
    loop {
        tokio::select! {
            _ = base.shutdown.cancelled() => return,
            Some(ended) = jobs.join_next(), if !jobs.is_empty() => {
                if let Err(e) = ended.map_err(|e| e.is_panic().then_some(e)) {
                    tracing::error!("a sweep job panicked: {e:?}");
                }
                continue;
            }
            changed = config.changed(), if reloads => {
                match changed {
                    Ok(()) => {
                        let new = config.borrow_and_update().clone();
                        context = reconfigure(&new, &base, context.is_some(), &mut permitted).await;
                    }
                    Err(_) => reloads = false,
                }
                continue;
            }
            changed = topology.changed() => if changed.is_err() { return },
        }
        let next = topology.borrow_and_update().clone();
        if let Some(context) = &context {
            for change in plan::changes(&last, &next) {
                for target in targets(context, &change) {
                    jobs.spawn(job::run(context.clone(), change.clone(), target));
                }
            }
        }
        last = next;
    }
}

/// The sweeper's context after a reload to `config`.
async fn reconfigure(
    config: &Config,
    base: &Base,
    was_on: bool,
    permitted: &mut bool,
) -> Option<Arc<Context>> {
    let Some(context) = Context::of(config, base) else {
        if was_on {
            tracing::info!("socket sweeping turned off by the reloaded configuration");
        }
        return None;
    };
    if !*permitted {
        if let Err(e) = probe().await {
            tracing::error!("sweep settings not applied: {e}");
            return None;
        }
        *permitted = true;
    }
    context.announce();
    Some(context)
}

/// The configured Sentinel addresses that are IP addresses (hostnames are resolved when
/// connecting and are not known here).
fn sentinel_hosts(config: &Config) -> BTreeSet<IpAddr> {
    let Source::Sentinels(s) = &config.source else { return BTreeSet::new() };
    s.addresses
        .iter()
        .filter_map(|a| a.host.parse::<IpAddr>().ok())
        .map(|ip| ip.to_canonical())
        .collect()
}

/// The sweeps one change calls for on this host.
fn targets(context: &Context, change: &Change) -> Vec<Target> {
    let mut targets = Vec::new();
    let old = &change.from;
    if context.sweep.local_ports.contains(&old.port) && local::is_local(old.ip) {
        let spared = change.data_hosts.union(&context.sentinel_hosts).copied().collect();
        // The local addresses that reach O are found from the listeners when the job sweeps.
        let served = Served::Except(BTreeSet::new());
        let peers = BTreeSet::new();
        targets.push(Target::Local { port: old.port, spared, peers, listed: None, served });
    }
    if context.sweep.remote {
        targets.push(Target::Remote { peer: old.addr() });
    }
    targets
}
