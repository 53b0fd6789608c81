//! What the recovery measurements share: seconds between wall-clock instants, a median and a
//! maximum, report lines that go both to stdout and to a results file, and Sentinel's own view
//! of a failover (when a subscriber saw each of its events).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

/// The leader's `+failover-state-send-slaveof-noone`: it is promoting the replica now.
pub const NOONE: &str = "+failover-state-send-slaveof-noone";
/// The leader's `+promoted-slave`: it saw the replica report `role:master` (INFO).
pub const PROMOTED: &str = "+promoted-slave";
/// A Sentinel's `+switch-master`: it names the new primary.
pub const SWITCH: &str = "+switch-master";

/// Seconds from `from` to `to`, negative when `to` came first.
pub fn secs(from: SystemTime, to: SystemTime) -> f64 {
    to.duration_since(from).map(|d| d.as_secs_f64()).unwrap_or_else(|e| -e.duration().as_secs_f64())
}

pub fn median_max(values: &[f64]) -> Option<(f64, f64)> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let max = *v.last()?;
    let n = v.len();
    let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
    Some((median, max))
}

/// Prints `line` and keeps it in `out`, the report the bench writes to its results file.
pub fn emit(out: &mut String, line: String) {
    println!("{line}");
    out.push_str(&line);
    out.push('\n');
}

/// A bench knob from the environment, `default` when unset or unparsable.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Sentinel events ([`NOONE`], [`PROMOTED`], [`SWITCH`]) with when a subscriber saw them; the
/// clones share one list, one subscription per Sentinel writes to it.
#[derive(Clone, Default)]
pub struct SentinelEvents(Arc<Mutex<Vec<(String, SystemTime)>>>);

impl SentinelEvents {
    /// Subscribes to the Sentinel at `addr` and records every event until `stop` or until the
    /// Sentinel closes the connection.
    pub async fn record(self, addr: SocketAddr, stop: CancellationToken) -> anyhow::Result<()> {
        let client = redis::Client::open(format!("redis://{addr}"))?;
        let mut pubsub = client.get_async_pubsub().await?;
        pubsub.subscribe(&[NOONE, PROMOTED, SWITCH]).await?;
        let mut stream = pubsub.on_message();
        loop {
            tokio::select! {
                msg = stream.next() => {
                    let Some(msg) = msg else { return Ok(()) };
                    let at = SystemTime::now();
                    self.lock().push((msg.get_channel_name().to_string(), at));
                }
                _ = stop.cancelled() => return Ok(()),
            }
        }
    }

    /// When `channel` was first seen at or after `after`, on any Sentinel.
    pub fn first(&self, channel: &str, after: SystemTime) -> Option<SystemTime> {
        let seen = self.lock();
        seen.iter().filter(|(c, t)| c == channel && *t >= after).map(|(_, t)| *t).min()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(String, SystemTime)>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}
