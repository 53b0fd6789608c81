//! Connections to data nodes, kept open between uses so that the `ROLE` polls on the path
//! from the leader's `SLAVEOF NO ONE` to publication cost one round trip, not a TCP and HELLO
//! handshake each.
//!
//! The replicas of a master are dialled when a failover of it starts ([`Nodes::warm`]), well
//! before the leader promotes one; a connection unused for a while is closed
//! ([`Nodes::prune`]), so that a fleet of a thousand masters does not keep thousands of idle
//! connections. A connection that fails or times out is dropped and rebuilt on the next use.
//!
//! Note that Sentinel promotes a replica with `SLAVEOF NO ONE` and `CLIENT KILL TYPE normal`
//! in one transaction: the kept-open connection dies at the very moment the replica becomes a
//! master, so the first master answer always comes over a fresh connection. [`Nodes::role`]
//! rebuilds it at once, without waiting for the next poll.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::Value;
use tokio::time::timeout;

use super::Role;
use super::conn::Endpoint;
use super::link::{DEFAULT_COMMAND_DEADLINE, DEFAULT_OPEN_DEADLINE, Link, NodeError};
use crate::config::Auth;

pub struct Nodes {
    auth: Auth,
    /// Each with when it was last used.
    open: Mutex<HashMap<SocketAddr, (Link, Instant)>>,
    /// Connects in flight from `warm`, so a node is dialled once at a time.
    warming: Mutex<HashSet<SocketAddr>>,
}

impl Nodes {
    pub fn new(auth: Auth) -> Self {
        Self { auth, open: Mutex::default(), warming: Mutex::default() }
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
        // Ends by itself within 3 s.
        crate::supervise::detached("a node connection's warm-up", async move {
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
                let link = self.connection(addr).await?;
                match link.role(DEFAULT_COMMAND_DEADLINE).await {
                    Ok(role) => return Some(role),
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

    /// Sends `cmd` to `addr` over a connection of its own, closed once it answered: for a
    /// question asked once per node (the hello ACL check of every node at start-up), which
    /// must not leave a kept-open connection per node behind (at 1,000 masters those were
    /// 1,000 connections for a minute and a third of the memory).
    pub async fn query_once(
        &self,
        addr: SocketAddr,
        cmd: &redis::Cmd,
        deadline: Duration,
    ) -> Option<redis::RedisResult<Value>> {
        let ask = async {
            let link = self.dial(addr).await?;
            match link.query("query", cmd, DEFAULT_COMMAND_DEADLINE).await {
                Ok(reply) => Some(Ok(reply)),
                Err(NodeError::Command { source, .. }) => Some(Err(source)),
                Err(_) => None,
            }
        };
        timeout(deadline, ask).await.ok().flatten()
    }

    async fn connection(&self, addr: SocketAddr) -> Option<Link> {
        if let Some((link, used)) = self.lock().get_mut(&addr) {
            *used = Instant::now();
            return Some(link.clone());
        }
        let link = self.dial(addr).await?;
        self.lock().insert(addr, (link.clone(), Instant::now()));
        Some(link)
    }

    /// A new link, named so that a drain of this node spares it (Redis before 7.2 shows no
    /// lib-name); one the node refuses to name still asks.
    async fn dial(&self, addr: SocketAddr) -> Option<Link> {
        Link::open(&Endpoint::at(addr, &self.auth), DEFAULT_OPEN_DEADLINE).await.ok()
    }

    /// Closes the connections unused for longer than `idle`.
    pub fn prune(&self, idle: Duration) {
        self.lock().retain(|_, (_, used)| used.elapsed() < idle);
    }

    fn forget(&self, addr: SocketAddr) {
        self.lock().remove(&addr);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, (Link, Instant)>> {
        // Held only for map operations that cannot panic; a poisoned map is still consistent.
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}
