//! Planned failovers asked for through the API: `SENTINEL FAILOVER` on the first configured
//! Sentinel that answers.

use redis::{ErrorKind, Value};

use super::conn::{Endpoint, connect};
use crate::config::Sentinels;
use crate::control::{BoxFuture, Control, ControlError};

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
