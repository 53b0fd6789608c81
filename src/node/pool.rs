//! Connections to data nodes, kept open between uses so that the `ROLE` polls on the path
//! from the leader's `SLAVEOF NO ONE` to publication cost one round trip, not a TCP and HELLO
//! handshake each.
//!
//! The replicas of a master are dialled when a failover of it starts ([`Nodes::warm`]), well
//! before the leader promotes one; a connection unused for a while is closed
//! ([`Nodes::prune`]), so that a fleet of a thousand masters does not keep thousands of idle
//! connections. A connection that fails or times out is dropped and rebuilt on the next use.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::Value;
use redis::aio::MultiplexedConnection;
use tokio::sync::Semaphore;
use tokio::time::timeout;

use super::{CONNECTION_NAME, Role};
use crate::config::Auth;
use crate::sentinel::{Endpoint, connect};

pub struct Nodes {
    auth: Auth,
    /// Each with when it was last used.
    open: Mutex<HashMap<SocketAddr, (MultiplexedConnection, Instant)>>,
    /// Connects in flight from `warm`, so a node is dialled once at a time.
    warming: Mutex<HashSet<SocketAddr>>,
    /// Bounds the one-off checks in flight (at start, one per master of the fleet).
    one_off: Semaphore,
}

/// One-off role checks at once.
const ONE_OFF_CHECKS: usize = 64;

impl Nodes {
    pub fn new(auth: Auth) -> Self {
        Self {
            auth,
            open: Mutex::default(),
            warming: Mutex::default(),
            one_off: Semaphore::new(ONE_OFF_CHECKS),
        }
    }

    /// Opens a connection to `addr` in the background if none is open, so that the role
    /// check at its promotion is one round trip.
    pub fn warm(self: &Arc<Self>, addr: SocketAddr) {
        if self.lock().contains_key(&addr) {
            return;
        }
        let mut warming = self.warming.lock().unwrap_or_else(|p| p.into_inner());
        if !warming.insert(addr) {
            return;
        }
        let nodes = self.clone();
        tokio::spawn(async move {
            let _ = timeout(Duration::from_secs(3), nodes.connection(addr)).await;
            nodes.warming.lock().unwrap_or_else(|p| p.into_inner()).remove(&addr);
        });
    }

    /// The role the node reports, or `None` if it does not answer within `deadline`, over the
    /// kept-open connection (opened and kept if there is none).
    pub async fn role(&self, addr: SocketAddr, deadline: Duration) -> Option<Role> {
        let check = async {
            // A kept-open connection may have died since its last use: one fresh retry.
            for _ in 0..2 {
                let mut conn = self.connection(addr).await?;
                match redis::cmd("ROLE").query_async::<Value>(&mut conn).await {
                    Ok(reply) => return Some(Role::parse(&reply)),
                    Err(_) => self.forget(addr),
                }
            }
            None
        };
        let result = timeout(deadline, check).await.ok().flatten();
        if result.is_none() {
            self.forget(addr);
        }
        result
    }

    /// Like [`Nodes::role`], but a connection opened for it is closed again: for the one-off
    /// checks of reconciliation (at start, every primary), which must not leave a connection
    /// to every node of the fleet behind.
    pub async fn role_once(&self, addr: SocketAddr, deadline: Duration) -> Option<Role> {
        if self.lock().contains_key(&addr) {
            return self.role(addr, deadline).await;
        }
        let check = async {
            let _permit = self.one_off.acquire().await.ok()?;
            let mut conn = self.dial(addr).await?;
            let reply = redis::cmd("ROLE").query_async::<Value>(&mut conn).await.ok()?;
            Some(Role::parse(&reply))
        };
        timeout(deadline, check).await.ok().flatten()
    }

    async fn connection(&self, addr: SocketAddr) -> Option<MultiplexedConnection> {
        if let Some((conn, used)) = self.lock().get_mut(&addr) {
            *used = Instant::now();
            return Some(conn.clone());
        }
        let conn = self.dial(addr).await?;
        self.lock().insert(addr, (conn.clone(), Instant::now()));
        Some(conn)
    }

    async fn dial(&self, addr: SocketAddr) -> Option<MultiplexedConnection> {
        let endpoint = Endpoint::new(addr.ip().to_string(), addr.port(), &self.auth);
        let mut conn = connect(&endpoint, None).await.ok()?;
        // Named so that a drain of this node spares it (Redis before 7.2 shows no lib-name).
        let mut name = redis::cmd("CLIENT");
        name.arg("SETNAME").arg(CONNECTION_NAME);
        let _ = name.query_async::<Value>(&mut conn).await;
        Some(conn)
    }

    /// Closes the connections unused for longer than `idle`.
    pub fn prune(&self, idle: Duration) {
        self.lock().retain(|_, (_, used)| used.elapsed() < idle);
    }

    fn forget(&self, addr: SocketAddr) {
        self.lock().remove(&addr);
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, (MultiplexedConnection, Instant)>> {
        // Held only for map operations that cannot panic; a poisoned map is still consistent.
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}
