//! Limits that bound what peers can make polestar hold: the process's open-file soft limit,
//! raised to the hard limit at start so that the caps of the listeners (16,384 HTTP
//! connections, about a thousand DNS TCP connections per listener, the Sentinel and node
//! connections) are what bounds polestar, not a soft limit of 1,024 that a shell or an init
//! system left behind; and the per-client shares of connections that the HTTP, DNS and
//! Sentinel-endpoint servers keep (and that a DNS TCP connection may wait its turn for).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::resource::{Resource, getrlimit, setrlimit};
use tokio::sync::Notify;

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
    open: Arc<Mutex<HashMap<IpAddr, Client>>>,
    per_client: usize,
}

/// One client's connections, and those waiting for one of them to end.
#[derive(Default)]
struct Client {
    open: usize,
    waiting: usize,
    /// Woken once per connection that ends while some wait ([`Clients::admit_within`]).
    freed: Arc<Notify>,
}

impl Clients {
    pub fn new(per_client: usize) -> Self {
        Self { open: Arc::default(), per_client }
    }

    /// A share of the connections for a new one from `ip`, or `None` when it holds its cap.
    pub fn admit(&self, ip: IpAddr) -> Option<ClientShare> {
        let key = client_key(ip);
        let mut open = self.lock();
        let client = open.entry(key).or_default();
        if client.open >= self.per_client {
            if client.open == 0 && client.waiting == 0 {
                open.remove(&key); // a cap of 0 leaves no entry behind
            }
            return None;
        }
        client.open += 1;
        Some(ClientShare { clients: self.clone(), key })
    }

    /// [`Self::admit`], or, when `ip` holds its cap, the share of the first of its connections
    /// to end within `wait` (in the order they began to wait); `None` past `wait`. For a
    /// client whose connections are short (a fleet behind one NAT address asking over TCP at
    /// once): each waits its turn instead of being closed.
    pub async fn admit_within(&self, ip: IpAddr, wait: Duration) -> Option<ClientShare> {
        let deadline = tokio::time::Instant::now() + wait;
        let key = client_key(ip);
        loop {
            let freed = {
                let mut open = self.lock();
                let client = open.entry(key).or_default();
                if client.open < self.per_client {
                    client.open += 1;
                    return Some(ClientShare { clients: self.clone(), key });
                }
                client.waiting += 1;
                client.freed.clone()
            };
            let notified = freed.notified();
            tokio::pin!(notified);
            // Registered before the count can change again: a connection that ends from now
            // on wakes this waiter or a later one, never nobody.
            notified.as_mut().enable();
            let woken = self.recheck(key);
            let woken = woken || tokio::time::timeout_at(deadline, notified).await.is_ok();
            self.stop_waiting(key);
            if !woken {
                return None;
            }
        }
    }

    /// Whether a share came free between counting this waiter and registering it.
    fn recheck(&self, key: IpAddr) -> bool {
        self.lock().get(&key).is_some_and(|c| c.open < self.per_client)
    }

    fn stop_waiting(&self, key: IpAddr) {
        let mut open = self.lock();
        if let Some(client) = open.get_mut(&key) {
            client.waiting -= 1;
            if client.open == 0 && client.waiting == 0 {
                open.remove(&key);
            }
        }
    }

    fn release(&self, key: IpAddr) {
        let mut open = self.lock();
        if let Some(client) = open.get_mut(&key) {
            client.open -= 1;
            if client.waiting > 0 {
                client.freed.notify_one();
            } else if client.open == 0 {
                open.remove(&key);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Client>> {
        // Only counts are behind the lock: a panic cannot leave them inconsistent.
        self.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
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

    #[tokio::test]
    async fn a_connection_past_its_share_gets_the_next_one_that_ends_or_gives_up() {
        let clients = Clients::new(1);
        let ip: IpAddr = [10, 0, 0, 1].into();
        let held = clients.admit(ip).expect("free");
        let waiting = {
            let clients = clients.clone();
            tokio::spawn(async move { clients.admit_within(ip, Duration::from_secs(30)).await })
        };
        tokio::task::yield_now().await;
        drop(held);
        let share = waiting.await.expect("no panic").expect("the freed share");
        let late = clients.admit_within(ip, Duration::from_millis(50)).await;
        assert!(late.is_none(), "nothing ends within the wait");
        drop(share);
        assert!(clients.open.lock().expect("valid").is_empty(), "nothing left behind");
    }

    /// A fleet behind one address: 300 connections, 8 at a time, each short. Every one is
    /// served in turn, none waits out its time (no wakeup is lost between two that end).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_short_connections_past_the_share_are_all_served_in_turn() {
        let clients = Clients::new(8);
        let ip: IpAddr = [10, 0, 0, 1].into();
        let tasks = (0..300).map(|_| {
            let clients = clients.clone();
            tokio::spawn(async move {
                let share = clients.admit_within(ip, Duration::from_secs(20)).await;
                tokio::task::yield_now().await;
                share.is_some()
            })
        });
        let served = futures::future::join_all(tasks.collect::<Vec<_>>()).await;
        assert!(served.into_iter().all(|s| s.expect("no panic")), "a connection waited in vain");
        assert!(clients.open.lock().expect("valid").is_empty());
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
