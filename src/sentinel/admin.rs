//! Planned failovers asked for through the API: `SENTINEL FAILOVER` on the first configured
//! Sentinel that answers and is not in TILT mode.
//!
//! A Sentinel in TILT (for 30 s after its timer stalled: the process was stopped, the host
//! overloaded, the clock jumped) accepts `SENTINEL FAILOVER` with `OK` and does nothing until
//! TILT ends, so it is skipped like an unreachable one.

use redis::{ErrorKind, Value};

use crate::config::Sentinels;
use crate::control::{BoxFuture, Control, ControlError};
use crate::node::{Endpoint, connect};

pub struct SentinelControl {
    endpoints: Vec<Endpoint>,
}

impl SentinelControl {
    pub fn new(sentinels: &Sentinels) -> Self {
        let endpoints = sentinels
            .addresses
            .iter()
            .map(|a| Endpoint::new(a.host.clone(), a.port, &sentinels.auth));
        Self { endpoints: endpoints.collect() }
    }

    async fn failover_via(endpoint: &Endpoint, master: &str) -> Result<(), ControlError> {
        let unreachable =
            |e: redis::RedisError| ControlError::Unreachable(format!("{}: {e}", endpoint.name()));
        let mut conn = connect(endpoint, None).await.map_err(unreachable)?;
        // A Sentinel whose ACL does not allow INFO cannot say: ask it anyway.
        let info = redis::cmd("INFO").arg("sentinel").query_async::<String>(&mut conn).await;
        let info = match info {
            Err(e) if e.kind() == ErrorKind::Io || e.is_timeout() => return Err(unreachable(e)),
            other => other.unwrap_or_default(),
        };
        if in_tilt(&info) {
            return Err(ControlError::Unreachable(format!("{}: in TILT mode", endpoint.name())));
        }
        let reply = redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(master)
            .query_async::<Value>(&mut conn)
            .await;
        match reply {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == ErrorKind::Io || e.is_timeout() => Err(unreachable(e)),
            Err(e) if e.to_string().contains("No such master") => {
                Err(ControlError::UnknownMaster(master.to_string()))
            }
            Err(e) => {
                Err(ControlError::Refused { sentinel: endpoint.name(), message: e.to_string() })
            }
        }
    }
}

/// Whether `INFO sentinel` says the Sentinel is in TILT mode.
fn in_tilt(info: &str) -> bool {
    info.lines().any(|l| l.trim() == "sentinel_tilt:1")
}

impl Control for SentinelControl {
    fn failover<'a>(&'a self, master: &'a str) -> BoxFuture<'a, Result<String, ControlError>> {
        Box::pin(async move {
            let mut failures = Vec::new();
            for endpoint in &self.endpoints {
                match Self::failover_via(endpoint, master).await {
                    Ok(()) => return Ok(endpoint.name()),
                    Err(ControlError::Unreachable(why)) => failures.push(why),
                    Err(other) => return Err(other),
                }
            }
            Err(ControlError::Unreachable(failures.join("; ")))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tilt_is_read_from_info_sentinel() {
        let info = "# Sentinel\r\nsentinel_masters:1\r\nsentinel_tilt:1\r\nsentinel_tilt_since_seconds:3\r\n";
        assert!(in_tilt(info));
        assert!(!in_tilt(&info.replace("sentinel_tilt:1", "sentinel_tilt:0")));
        assert!(!in_tilt(""));
    }
}
