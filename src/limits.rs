//! Limits that bound what peers can make polestar hold: the process's open-file soft limit,
//! raised to the hard limit at start so that the caps of the listeners (16,384 HTTP
//! connections, about a thousand DNS TCP connections per listener, the Sentinel and node
//! connections) are what bounds polestar, not a soft limit of 1,024 that a shell or an init
//! system left behind; and the per-client shares of connections that the HTTP and DNS
//! servers keep.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// Raises `RLIMIT_NOFILE`'s soft limit to its hard limit; returns the limit now in force.
/// A failure is logged and the start goes on with the limit there was.
pub fn raise_open_files() -> u64 {
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(error) => {
            tracing::warn!(%error, "cannot read the open-file limit (RLIMIT_NOFILE)");
            return 0;
        }
    };
    if soft >= hard {
        return soft;
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => {
            tracing::debug!(from = soft, to = hard, "open-file soft limit raised");
            hard
        }
        Err(error) => {
            tracing::warn!(%error, soft, hard, "cannot raise the open-file soft limit");
            soft
        }
    }
}

/// Open connections per client (an IPv4 address, an IPv6 /64), at most `per_client` each:
/// the HTTP and DNS TCP servers keep one host from holding every connection.
#[derive(Clone)]
pub struct Clients {
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
    per_client: usize,
}

impl Clients {
    pub fn new(per_client: usize) -> Self {
        Self { open: Arc::default(), per_client }
    }

    /// A share of the connections for a new one from `ip`, or `None` when it holds its cap.
    pub fn admit(&self, ip: IpAddr) -> Option<ClientShare> {
        let key = client_key(ip);
        let mut open = self.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let count = open.entry(key).or_default();
        if *count >= self.per_client {
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

    const CAP: usize = 8;

    #[test]
    fn one_client_holds_at_most_its_share_of_connections() {
        let clients = Clients::new(CAP);
        let ip: IpAddr = [10, 0, 0, 1].into();
        let held: Vec<_> = (0..CAP).filter_map(|_| clients.admit(ip)).collect();
        assert_eq!(held.len(), CAP);
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

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_limit() {
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("readable");
        assert_eq!(raise_open_files(), hard);
        assert_eq!(getrlimit(Resource::RLIMIT_NOFILE).expect("readable"), (hard, hard));
    }
}
