//! Wiring: the zone publisher (topology → zone), the UDP loops, the TCP listeners and the
//! NOTIFY senders, all stopped by one cancellation token.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::handler::Service;
use super::listen::Listeners;
use super::zone::{Zone, ZoneSettings, initial_serial, next_serial, now_unix, same_records};
use super::{notify, rrl, tcp, udp};
use crate::config;
use crate::topology::{Snapshot, TopologyReader};

/// Serves until `shutdown` is cancelled.
pub async fn serve(
    listeners: Listeners,
    cfg: config::Dns,
    topology: TopologyReader,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let settings = ZoneSettings::from_config(&cfg)?;
    let first = Zone::build(&topology.borrow(), &settings, initial_serial());
    let (zone_tx, zone_rx) = watch::channel(Arc::new(first));
    let service = Arc::new(Service::new(cfg.transfer_allow.clone()));

    let mut tasks = JoinSet::new();
    tasks.spawn(publish(topology, settings, zone_tx));
    for target in &cfg.notify {
        tasks.spawn(notify::notify_target(*target, zone_rx.clone()));
    }
    for socket in listeners.udp {
        let limit = rrl::Settings { rate: cfg.rate_limit, slip: cfg.rate_limit_slip };
        tasks.spawn(udp::serve_socket(socket, service.clone(), zone_rx.clone(), limit));
    }
    for listener in listeners.tcp {
        tasks.spawn(tcp::serve_listener(listener, service.clone(), zone_rx.clone()));
    }

    // Every task here runs until shutdown; one that ends before (a panic) would leave the
    // zone frozen or a socket unserved, so it fails the server, and with it the daemon.
    let result = tokio::select! {
        biased;
        _ = shutdown.cancelled() => Ok(()),
        Some(ended) = tasks.join_next() => Err(match ended {
            Err(e) if e.is_panic() => anyhow::anyhow!("a DNS task panicked: {e}"),
            _ => anyhow::anyhow!("a DNS task stopped unexpectedly"),
        }),
    };
    tasks.abort_all();
    result
}

/// Turns every topology change into a new zone; the only writer of the zone channel. A change
/// that does not alter any record (e.g. a Sentinel count) keeps the zone and its serial.
async fn publish(
    mut topology: TopologyReader,
    settings: ZoneSettings,
    zone_tx: watch::Sender<Arc<Zone>>,
) {
    let mut last: Option<Arc<Snapshot>> = None;
    while topology.changed().await.is_ok() {
        let snapshot = topology.borrow_and_update().clone();
        // Most changes (Sentinel counts, `since`) touch no record: not worth building a zone
        // of every master to find that out.
        if last.as_ref().is_some_and(|l| same_records(l, &snapshot)) {
            continue;
        }
        last = Some(snapshot.clone());
        let current = zone_tx.borrow().clone();
        if let Some(next) = next_zone(&snapshot, &settings, &current) {
            tracing::debug!(serial = next.serial(), version = snapshot.version, "DNS zone updated");
            zone_tx.send_replace(Arc::new(next));
        }
    }
}

/// The zone for `snapshot`, or `None` when it has the same records as `current`.
pub fn next_zone(snapshot: &Snapshot, settings: &ZoneSettings, current: &Zone) -> Option<Zone> {
    let candidate = Zone::build(snapshot, settings, current.serial());
    if candidate == *current {
        return None;
    }
    Some(candidate.with_serial(next_serial(current.serial(), now_unix())))
}
