//! The readiness series: `polestar_failover_ready{master}`,
//! `polestar_failover_blocked{master,reason}` (one series per reason, from the start) and
//! `polestar_replica_lag_bytes{master,replica}`.

use std::collections::BTreeMap;

use super::{MasterReadiness, Reason};
use crate::metrics::{FAILOVER_BLOCKED, FAILOVER_READY, REPLICA_LAG};

/// Registers every readiness series of `master`: not ready, no blocker, until judged.
pub fn register_master(master: &str) {
    metrics::gauge!(FAILOVER_READY, "master" => master.to_string()).set(0.0);
    for reason in Reason::ALL {
        blocked(master, reason).set(0.0);
    }
}

/// Sets the series of one judged master; a replica whose lag is no longer known (gone, or
/// its primary and itself unreachable) gets NaN, not its last value.
pub fn set(master: &str, now: &MasterReadiness, before: Option<&BTreeMap<String, u64>>) {
    let ready = if now.verdict.ready { 1.0 } else { 0.0 };
    metrics::gauge!(FAILOVER_READY, "master" => master.to_string()).set(ready);
    for reason in Reason::ALL {
        blocked(master, reason).set(if now.verdict.blocked_by(reason) { 1.0 } else { 0.0 });
    }
    for (replica, lag) in &now.lags {
        let labels = [("master", master.to_string()), ("replica", replica.clone())];
        metrics::gauge!(REPLICA_LAG, &labels).set(*lag as f64);
    }
    for gone in before.into_iter().flatten().filter(|(r, _)| !now.lags.contains_key(*r)) {
        let labels = [("master", master.to_string()), ("replica", gone.0.clone())];
        metrics::gauge!(REPLICA_LAG, &labels).set(f64::NAN);
    }
}

/// `polestar_failover_blocked{master,reason}`; the reason is a static label (no copy of it per
/// series: there are six per master).
fn blocked(master: &str, reason: Reason) -> metrics::Gauge {
    metrics::gauge!(FAILOVER_BLOCKED, "master" => master.to_string(), "reason" => reason.as_str())
}
