//! Connections to data nodes, kept open between uses so that the `ROLE` check on the path
//! from `+promoted-slave` to publication costs one round trip, not a TCP and HELLO handshake.
//!
//! A connection that fails or times out is dropped and rebuilt on the next use.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
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
}

impl Nodes {
    pub fn new(auth: Auth) -> Self {
        Self { auth, open: Mutex::new(HashMap::new()) }
    }

    /// The role the node reports (`master`, `slave`, ...), or `None` if it does not answer
    /// within `deadline`.
    pub async fn role(&self, addr: SocketAddr, deadline: Duration) -> Option<String> {
        let check = async {
            let mut conn = self.connection(addr).await?;
            match redis::cmd("ROLE").query_async::<Value>(&mut conn).await {
                Ok(reply) => role(&reply),
                Err(_) => {
                    self.forget(addr);
                    None
                }
            }
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
