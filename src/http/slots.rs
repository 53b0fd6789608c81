//! Capacity, by who is asking: what the HTTP server holds open (connections, long-polls,
//! event streams, waiting failovers) is bounded, and split so that no class of caller can
//! take what another needs.
//!
//! - Requests held open draw from a pool of their caller's class ([`auth::Caller`]): agents
//!   presenting the agent token and the admin API each have slots of their own, which
//!   anonymous clients (who share theirs) cannot take. Past its pool a request answers 503.
//! - Connections are capped in all and per client address ([`crate::limits::Clients`]), so
//!   one host cannot hold every connection: past its share its new connections are closed.
//!
//! [`auth::Caller`]: super::auth::Caller

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::ApiError;
use super::auth::Caller;

/// Long-polls and event streams of anonymous callers, shared by all of them.
pub const ANONYMOUS_WAITERS: usize = 1024;
/// Long-polls and event streams of agents presenting the agent token: one upstream serves this many
/// agents (an agent holds one stream), whatever anonymous clients hold. Sized for 10,000 agents on
/// one polestar (docs/limits.md, "HTTP"; `bench/agents-crowd.sh`).
pub const AGENT_WAITERS: usize = 16_384;
/// Waiting failovers and long-polls of the admin token's holders.
pub const ADMIN_WAITERS: usize = 64;
/// Connections open at once from one client address (IPv6: one /64).
pub const CONNECTIONS_PER_CLIENT: usize = 512;

/// The pools of requests held open, one per class of caller.
pub struct Waiters {
    anonymous: Arc<Semaphore>,
    agent: Arc<Semaphore>,
    admin: Arc<Semaphore>,
}

impl Default for Waiters {
    fn default() -> Self {
        Self {
            anonymous: Arc::new(Semaphore::new(ANONYMOUS_WAITERS)),
            agent: Arc::new(Semaphore::new(AGENT_WAITERS)),
            admin: Arc::new(Semaphore::new(ADMIN_WAITERS)),
        }
    }
}

impl Waiters {
    /// A slot for a request of `caller` that will be held open, or 503 when its pool is full.
    pub fn take(&self, caller: Caller) -> Result<OwnedSemaphorePermit, ApiError> {
        let (pool, whose) = match caller {
            Caller::Anonymous => (&self.anonymous, "anonymous long-polls and event streams"),
            Caller::Agent => (&self.agent, "agent long-polls and event streams"),
            Caller::Admin => (&self.admin, "admin requests held open"),
        };
        let permit = pool.clone().try_acquire_owned();
        permit.map_err(|_| {
            full(caller, whose);
            ApiError::unavailable(format!("too many {whose} open"))
        })
    }
}

/// Logs, once per interval per class of caller, that its pool is full (each refusal is
/// counted as a 503 in `polestar_http_requests_total`).
fn full(caller: Caller, whose: &str) {
    static EVERY: [crate::log_every::LogEvery; 3] =
        [const { crate::log_every::LogEvery::new() }; 3];
    let i = match caller {
        Caller::Anonymous => 0,
        Caller::Agent => 1,
        Caller::Admin => 2,
    };
    if let Some(hits) = EVERY[i].hit(std::time::Instant::now()) {
        tracing::warn!(hits, "HTTP: too many {whose} open: a request answered 503");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_caller_has_a_pool_of_its_own() {
        let waiters = Waiters::default();
        let held: Vec<_> =
            (0..ANONYMOUS_WAITERS).map(|_| waiters.take(Caller::Anonymous)).collect();
        assert!(held.iter().all(Result::is_ok));
        assert_eq!(waiters.take(Caller::Anonymous).err().map(|e| e.status.as_u16()), Some(503));
        assert!(waiters.take(Caller::Agent).is_ok(), "anonymous clients cannot take it");
        assert!(waiters.take(Caller::Admin).is_ok(), "anonymous clients cannot take it");
        drop(held);
        assert!(waiters.take(Caller::Anonymous).is_ok(), "released");
    }
}
