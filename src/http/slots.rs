//! Capacity, by who is asking: what the HTTP server holds open (connections, long-polls,
//! event streams, waiting failovers) is bounded, and split so that no class of caller can
//! take what another needs.
//!
//! - Requests held open draw from a pool of their caller's class ([`auth::Caller`]): agents
//!   presenting the agent token and the admin API each have slots of their own, which
//!   anonymous clients (who share theirs) cannot take. Past its pool a request answers 503.
//! - Connections are capped in all and per client address (per /64 for IPv6), so one host
//!   cannot hold every connection: past its share its new connections are closed at once.
//!
//! [`auth::Caller`]: super::auth::Caller

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::ApiError;
use super::auth::Caller;

/// Long-polls and event streams of anonymous callers, shared by all of them.
pub const ANONYMOUS_WAITERS: usize = 1024;
/// Long-polls and event streams of agents presenting the agent token: one upstream serves
/// this many agents, whatever anonymous clients hold.
pub const AGENT_WAITERS: usize = 8192;
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
        permit.map_err(|_| ApiError::unavailable(format!("too many {whose} open")))
    }
}

/// Open connections per client address.
#[derive(Clone, Default)]
pub struct Clients {
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl Clients {
    /// A share of the connections for a new one from `ip`, or `None` when it holds its cap.
    pub fn admit(&self, ip: IpAddr) -> Option<ClientShare> {
        let key = client_key(ip);
        let mut open = self.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let count = open.entry(key).or_default();
        if *count >= CONNECTIONS_PER_CLIENT {
            return None;
        }
        *count += 1;
        Some(ClientShare { clients: self.clone(), key })
    }

    fn release(&self, key: IpAddr) {
        let mut open = self.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(count) = open.get_mut(&key) {
            *count -= 1;
            if *count == 0 {
                open.remove(&key);
            }
        }
    }
}

/// One connection's place in its client's share; released when dropped.
pub struct ClientShare {
    clients: Clients,
    key: IpAddr,
}

impl Drop for ClientShare {
    fn drop(&mut self) {
        self.clients.release(self.key);
    }
}

/// What one client is: its IPv4 address, or the /64 of its IPv6 address (one host's share).
fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(Ipv6Addr::from(prefix))
            }
        },
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

    #[test]
    fn one_client_holds_at_most_its_share_of_connections() {
        let clients = Clients::default();
        let ip: IpAddr = [10, 0, 0, 1].into();
        let held: Vec<_> = (0..CONNECTIONS_PER_CLIENT).filter_map(|_| clients.admit(ip)).collect();
        assert_eq!(held.len(), CONNECTIONS_PER_CLIENT);
        assert!(clients.admit(ip).is_none());
        assert!(clients.admit([10, 0, 0, 2].into()).is_some(), "another client is not affected");
        drop(held);
        assert!(clients.admit(ip).is_some());
        assert!(clients.open.lock().expect("valid").len() <= 1, "empty entries are removed");
    }

    #[test]
    fn an_ipv6_client_is_its_64() {
        let a: IpAddr = "2001:db8:1:2::1".parse().expect("valid");
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().expect("valid");
        let c: IpAddr = "2001:db8:1:3::1".parse().expect("valid");
        assert_eq!(client_key(a), client_key(b));
        assert_ne!(client_key(a), client_key(c));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().expect("valid");
        assert_eq!(client_key(mapped), IpAddr::from([10, 0, 0, 1]));
    }
}
