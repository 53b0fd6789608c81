//! One connection to a data node or a Sentinel for the length of a switchover, with the
//! deadlines of [`crate::sentinel::connect`] (2 s to connect, 2 s per command). Connections to
//! data nodes are named [`CONNECTION_NAME`] so that no drain, ours or another polestar's,
//! cuts them.

use std::net::SocketAddr;

use redis::aio::MultiplexedConnection;
use redis::{Cmd, FromRedisValue, Value};

use crate::config::Auth;
use crate::node::CONNECTION_NAME;
use crate::sentinel::{Endpoint, connect};

pub struct Link {
    name: String,
    conn: MultiplexedConnection,
}

impl Link {
    /// A data node at `addr`, its connection named.
    pub async fn node(addr: SocketAddr, auth: &Auth) -> Result<Self, String> {
        let endpoint = Endpoint::new(addr.ip().to_string(), addr.port(), auth);
        let mut link = Self::open(&endpoint).await?;
        let mut name = redis::cmd("CLIENT");
        name.arg("SETNAME").arg(CONNECTION_NAME);
        let _ = link.query::<Value>(name).await;
        Ok(link)
    }

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

    /// `CLIENT PAUSE <ms> WRITE`.
    pub async fn pause(&mut self, ms: u64) -> Result<(), String> {
        let mut cmd = redis::cmd("CLIENT");
        cmd.arg("PAUSE").arg(ms.max(1)).arg("WRITE");
        self.query::<Value>(cmd).await.map(drop).map_err(|e| format!("CLIENT PAUSE: {e}"))
    }

    pub async fn unpause(&mut self) -> Result<(), String> {
        let mut cmd = redis::cmd("CLIENT");
        cmd.arg("UNPAUSE");
        self.query::<Value>(cmd).await.map(drop).map_err(|e| format!("CLIENT UNPAUSE: {e}"))
    }
}
