//! Connections to data nodes, kept open between uses so that the `ROLE` check on the path
//! from `+promoted-slave` to publication costs one round trip, not a TCP and HELLO handshake.
//!
//! A connection that fails or times out is dropped and rebuilt on the next use.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::Value;
use redis::aio::MultiplexedConnection;
use tokio::time::timeout;

use super::conn::{Endpoint, connect};
use super::message::role;
use crate::config::Auth;

pub struct Nodes {
    auth: Auth,
    open: Mutex<HashMap<SocketAddr, MultiplexedConnection>>,
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
        tokio::spawn(async move {
            let _ = timeout(Duration::from_secs(3), nodes.connection(addr)).await;
            nodes.warming.lock().unwrap_or_else(|p| p.into_inner()).remove(&addr);
        });
    }

    /// The role the node reports (`master`, `slave`, ...), or `None` if it does not answer
    /// within `deadline`.
    pub async fn role(&self, addr: SocketAddr, deadline: Duration) -> Option<String> {
        let check = async {
            // A kept-open connection may have died since its last use: one fresh retry.
            for _ in 0..2 {
                let mut conn = self.connection(addr).await?;
                match redis::cmd("ROLE").query_async::<Value>(&mut conn).await {
                    Ok(reply) => return role(&reply),
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

    async fn connection(&self, addr: SocketAddr) -> Option<MultiplexedConnection> {
        if let Some(conn) = self.lock().get(&addr) {
            return Some(conn.clone());
        }
        let endpoint = Endpoint::new(addr.ip().to_string(), addr.port(), &self.auth);
        let conn = connect(&endpoint, None).await.ok()?;
        self.lock().insert(addr, conn.clone());
        Some(conn)
    }

    fn forget(&self, addr: SocketAddr) {
        self.lock().remove(&addr);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, MultiplexedConnection>> {
        // Held only for map operations that cannot panic; a poisoned map is still consistent.
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}
