//! The switchover's connections, kept for its length: one to the Sentinel that plans and asks
//! for the failover ([`SentinelLink`]) and links to the primary and the replicas waited for
//! ([`open_node`]), all with the deadlines of the transport ([`crate::node::connect`]: 2 s to
//! connect, 2 s per command). Node links are [`crate::node::Link`]s, named so that no drain,
//! ours or another polestar's, cuts them.

use std::net::SocketAddr;

use redis::aio::MultiplexedConnection;
use redis::{Cmd, FromRedisValue};

use crate::config::Auth;
use crate::node::{DEFAULT_OPEN_DEADLINE, Endpoint, Link, connect};

pub use crate::node::DEFAULT_COMMAND_DEADLINE as NODE_DEADLINE;

/// A link to the data node at `addr`; an error names it.
pub async fn open_node(addr: SocketAddr, auth: &Auth) -> Result<Link, String> {
    let endpoint = Endpoint::at(addr, auth);
    Link::open(&endpoint, DEFAULT_OPEN_DEADLINE).await.map_err(|e| e.to_string())
}

pub struct SentinelLink {
    name: String,
    conn: MultiplexedConnection,
}

impl SentinelLink {
    pub async fn open(endpoint: &Endpoint) -> Result<Self, String> {
        let conn =
            connect(endpoint, None).await.map_err(|e| format!("{}: {e}", endpoint.name()))?;
        Ok(Self { name: endpoint.name(), conn })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub async fn query<T: FromRedisValue>(&mut self, cmd: Cmd) -> Result<T, redis::RedisError> {
        cmd.query_async(&mut self.conn).await
    }

    /// `INFO <section>` as text; an error names the peer.
    pub async fn info(&mut self, section: &str) -> Result<String, String> {
        let mut cmd = redis::cmd("INFO");
        cmd.arg(section);
        self.query::<String>(cmd).await.map_err(|e| format!("{}: INFO {section}: {e}", self.name))
    }
}
