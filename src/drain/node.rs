//! One data node as the drain side talks to it: a kept-open connection named
//! [`CONNECTION_NAME`](super::spare::CONNECTION_NAME) (so that no drain, ours or another
//! polestar's, kills it), and the handful of commands fencing and draining need, each with a
//! deadline. Any failure drops the connection; the next call builds a new one. A node that is
//! down, hung (SIGSTOP: the kernel still accepts, nothing answers) or partitioned costs at most
//! one deadline per call and never blocks anything but the caller.
//!
//! A link can be opened ahead of need ([`NodeLink::warm`], at the first sign of a failover of
//! the node): the fence is then one round trip ([`NodeLink::fence`]), not the four or five of
//! a connection opened when the promotion is announced (TCP, `HELLO`/`AUTH`, the naming, `ROLE`,
//! the pause), which on a loaded machine took longer than Sentinel takes to promote the replica.
//! Callers that arrive while a connection is being opened wait for it rather than open another.
//! A command that fails on a connection opened earlier because that connection is gone (the
//! node's `timeout` closed an idle one) is sent once more on a new connection at once.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{Cmd, FromRedisValue, Pipeline, RedisError, Value};
use tokio::time::{Instant, timeout};

use super::clients::{ClientList, parse_list};
use super::spare::CONNECTION_NAME;
use crate::config::Auth;
use crate::sentinel::{Endpoint, connect};
use crate::topology::Node;

/// TCP, TLS, HELLO and naming together.
const CONNECT_DEADLINE: Duration = Duration::from_secs(1);
/// ROLE, PAUSE, KILL: cheap commands that a healthy node answers in microseconds.
const COMMAND_DEADLINE: Duration = Duration::from_secs(1);
/// `CLIENT LIST` of a node with tens of thousands of clients is a few megabytes.
const LIST_DEADLINE: Duration = Duration::from_secs(2);

/// The longest a demotion waits, from its `ROLE` of the old primary until its `REPLICAOF`
/// runs, with every step at its deadline: the new primary's `ROLE` on a link opened then,
/// `CLIENT LIST` and the transaction. The pause a demotion renews first lasts this much longer
/// than a fence's, so that it cannot lapse before `REPLICAOF` (writes it let through on a node
/// still claiming master would be acknowledged, then lost).
pub const DEMOTION_DEADLINES: Duration = CONNECT_DEADLINE
    .saturating_add(COMMAND_DEADLINE)
    .saturating_add(LIST_DEADLINE)
    .saturating_add(COMMAND_DEADLINE);

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("cannot connect to {node}: {source}")]
    Connect { node: SocketAddr, source: RedisError },
    #[error("{node} did not answer {command} within {}ms", after.as_millis())]
    Timeout { node: SocketAddr, command: &'static str, after: Duration },
    #[error("{node}: {command} failed: {source}")]
    Command { node: SocketAddr, command: &'static str, source: RedisError },
}

pub use crate::node::Role;

/// What one pipelined `ROLE` + `CLIENT PAUSE` found.
#[derive(Debug)]
pub struct Fenced {
    pub role: Role,
    /// How many round trips it took, the connection's own included (TCP, `HELLO`, naming).
    pub round_trips: u32,
}

/// Round trips of opening a connection: TCP, `HELLO` (with `AUTH`), `SETNAME` + `ID`.
const CONNECT_ROUND_TRIPS: u32 = 3;

/// `CLIENT LIST` with the moment it was answered and the id of the connection that asked.
#[derive(Debug)]
pub struct Listing {
    pub list: ClientList,
    pub at: Instant,
    pub own_id: u64,
}

#[derive(Clone)]
struct Open {
    conn: MultiplexedConnection,
    /// Our own client id on the node, never killed.
    id: u64,
}

pub struct NodeLink {
    addr: SocketAddr,
    endpoint: Endpoint,
    open: Mutex<Option<Open>>,
    /// Held while a connection is being opened, so that a second caller waits for it.
    opening: tokio::sync::Mutex<()>,
}

/// A connection as [`NodeLink::connection`] hands it out: `fresh` when this call opened it.
struct Got {
    open: Open,
    fresh: bool,
}

impl NodeLink {
    pub fn new(node: &Node, auth: &Auth) -> Self {
        // The address Sentinel reports, as role checks dial it (`sentinel::nodes`): with TLS
        // the certificate is verified against that IP address, the same way on both paths.
        Self {
            addr: node.addr(),
            endpoint: Endpoint::new(node.ip.to_string(), node.port, auth),
            open: Mutex::default(),
            opening: tokio::sync::Mutex::new(()),
        }
    }

    /// Opens the connection now if none is open (or being opened), so that the next command
    /// is one round trip. A failure is only logged: the next command tries again.
    pub async fn warm(&self) {
        if let Err(e) = self.connection().await {
            tracing::debug!(node = %self.addr, error = %e, "could not open a link ahead of need");
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub async fn role(&self) -> Result<Role, NodeError> {
        let reply: Value = self.query("ROLE", redis::cmd("ROLE"), COMMAND_DEADLINE).await?;
        Ok(Role::parse(&reply))
    }

    /// `CLIENT PAUSE <for> WRITE`: writes (and PUBLISH, EVAL...) wait, reads go on.
    pub async fn pause(&self, duration: Duration) -> Result<(), NodeError> {
        let mut cmd = redis::cmd("CLIENT");
        cmd.arg("PAUSE").arg(duration.as_millis().max(1) as u64).arg("WRITE");
        self.query::<Value>("CLIENT PAUSE", cmd, COMMAND_DEADLINE).await.map(drop)
    }

    /// `ROLE` and `CLIENT PAUSE <for> WRITE` in one pipeline: one round trip on an open link.
    /// The pause is applied whatever the role; the caller lifts it from a node that does not
    /// answer master (a replica needs no fence, for anyone).
    pub async fn fence(&self, duration: Duration) -> Result<Fenced, NodeError> {
        let mut pipe = redis::pipe();
        pipe.cmd("ROLE");
        pipe.cmd("CLIENT").arg("PAUSE").arg(duration.as_millis().max(1) as u64).arg("WRITE");
        let ((role, _), fresh): ((Value, Value), bool) =
            self.run("ROLE + CLIENT PAUSE", COMMAND_DEADLINE, &Request::Pipe(&pipe)).await?;
        let round_trips = 1 + if fresh { CONNECT_ROUND_TRIPS } else { 0 };
        Ok(Fenced { role: Role::parse(&role), round_trips })
    }

    pub async fn unpause(&self) -> Result<(), NodeError> {
        let mut cmd = redis::cmd("CLIENT");
        cmd.arg("UNPAUSE");
        self.query::<Value>("CLIENT UNPAUSE", cmd, COMMAND_DEADLINE).await.map(drop)
    }

    pub async fn clients(&self) -> Result<Listing, NodeError> {
        let mut cmd = redis::cmd("CLIENT");
        cmd.arg("LIST");
        let request = Request::Cmd(&cmd);
        let ((text, own_id), _): ((String, u64), bool) =
            self.run_with_id("CLIENT LIST", LIST_DEADLINE, &request).await?;
        Ok(Listing { list: parse_list(&text), at: Instant::now(), own_id })
    }

    /// Kills the clients with these ids in one pipeline; returns how many existed.
    pub async fn kill(&self, ids: &[u64]) -> Result<usize, NodeError> {
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.cmd("CLIENT").arg("KILL").arg("ID").arg(*id);
        }
        let replies: Vec<Value> = self.pipeline("CLIENT KILL", pipe).await?;
        Ok(replies.iter().map(killed).sum())
    }

    /// Kills these clients and lifts the pause in one transaction, so that no write held by
    /// the pause runs on a node that still claims master: its client is gone first.
    pub async fn kill_and_unpause(&self, ids: &[u64]) -> Result<usize, NodeError> {
        let mut pipe = redis::pipe();
        pipe.atomic();
        for id in ids {
            pipe.cmd("CLIENT").arg("KILL").arg("ID").arg(*id);
        }
        pipe.cmd("CLIENT").arg("UNPAUSE").ignore();
        let replies: Vec<Value> = self.pipeline("MULTI CLIENT KILL UNPAUSE", pipe).await?;
        Ok(replies.iter().map(killed).sum())
    }

    /// Demotes the node: kills `held` (the clients the pause holds) and makes it a replica of
    /// `to` in one transaction; returns how many clients it killed. From `REPLICAOF` on the
    /// node refuses writes (`READONLY`). The caller lifts the pause only once `ROLE` confirms
    /// the demotion, so no held write runs on a node that still claims master (`EXEC` does
    /// not roll back: a refused `REPLICAOF` would not stop an `UNPAUSE` in the same block).
    pub async fn demote(&self, held: &[u64], to: &Node) -> Result<usize, NodeError> {
        let host = to.hostname.clone().unwrap_or_else(|| to.ip.to_string());
        let mut pipe = redis::pipe();
        pipe.atomic();
        for id in held {
            pipe.cmd("CLIENT").arg("KILL").arg("ID").arg(*id);
        }
        pipe.cmd("REPLICAOF").arg(host).arg(to.port);
        let replies: Vec<Value> = self.pipeline("MULTI CLIENT KILL REPLICAOF", pipe).await?;
        Ok(replies.iter().map(killed).sum())
    }

    async fn query<T: FromRedisValue>(
        &self,
        command: &'static str,
        cmd: Cmd,
        deadline: Duration,
    ) -> Result<T, NodeError> {
        self.run(command, deadline, &Request::Cmd(&cmd)).await.map(|(value, _)| value)
    }

    async fn pipeline<T: FromRedisValue>(
        &self,
        command: &'static str,
        pipe: Pipeline,
    ) -> Result<T, NodeError> {
        let request = Request::Pipe(&pipe);
        self.run(command, COMMAND_DEADLINE, &request).await.map(|(value, _)| value)
    }

    /// Sends `request` under `deadline`; `true` with the reply when it needed a new connection.
    async fn run<T: FromRedisValue>(
        &self,
        command: &'static str,
        deadline: Duration,
        request: &Request<'_>,
    ) -> Result<(T, bool), NodeError> {
        let ((value, _), fresh) = self.run_with_id(command, deadline, request).await?;
        Ok((value, fresh))
    }

    /// [`Self::run`], with the id of the connection that sent it.
    async fn run_with_id<T: FromRedisValue>(
        &self,
        command: &'static str,
        deadline: Duration,
        request: &Request<'_>,
    ) -> Result<((T, u64), bool), NodeError> {
        let got = self.connection().await?;
        let (mut conn, id) = (got.open.conn.clone(), got.open.id);
        let reply = timeout(deadline, request.send::<T>(&mut conn)).await;
        match reply {
            // A connection opened earlier and gone since (the node's `timeout`, a restart):
            // once more on a new one, at once, rather than at the next attempt.
            Ok(Err(e)) if !got.fresh && (e.is_connection_dropped() || e.is_io_error()) => {
                tracing::debug!(node = %self.addr, error = %e, command, "link gone: reconnecting");
                self.forget();
                let got = self.connection().await?;
                let (mut conn, id) = (got.open.conn.clone(), got.open.id);
                let reply = timeout(deadline, request.send::<T>(&mut conn)).await;
                self.settle(command, deadline, reply).map(|v| ((v, id), true))
            }
            reply => self.settle(command, deadline, reply).map(|v| ((v, id), got.fresh)),
        }
    }

    /// Turns a reply under a deadline into a result, dropping the connection on any failure.
    fn settle<T>(
        &self,
        command: &'static str,
        after: Duration,
        reply: Result<Result<T, RedisError>, tokio::time::error::Elapsed>,
    ) -> Result<T, NodeError> {
        let node = self.addr;
        let result = match reply {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(source)) => NodeError::Command { node, command, source },
            Err(_) => NodeError::Timeout { node, command, after },
        };
        self.forget();
        Err(result)
    }

    /// The open connection, or a new one (waiting for one another caller is opening).
    async fn connection(&self) -> Result<Got, NodeError> {
        if let Some(open) = self.lock().clone() {
            return Ok(Got { open, fresh: false });
        }
        let _opening = self.opening.lock().await;
        if let Some(open) = self.lock().clone() {
            return Ok(Got { open, fresh: false });
        }
        let opened = timeout(CONNECT_DEADLINE, self.connect()).await;
        let open = opened.map_err(|_| NodeError::Timeout {
            node: self.addr,
            command: "connect",
            after: CONNECT_DEADLINE,
        })??;
        *self.lock() = Some(open.clone());
        Ok(Got { open, fresh: true })
    }

    async fn connect(&self) -> Result<Open, NodeError> {
        let node = self.addr;
        let mut conn = connect(&self.endpoint, None)
            .await
            .map_err(|source| NodeError::Connect { node, source })?;
        let mut pipe = redis::pipe();
        pipe.cmd("CLIENT").arg("SETNAME").arg(CONNECTION_NAME).ignore();
        pipe.cmd("CLIENT").arg("ID");
        let (id,): (u64,) = pipe
            .query_async(&mut conn)
            .await
            .map_err(|source| NodeError::Command { node, command: "CLIENT ID", source })?;
        Ok(Open { conn, id })
    }

    fn forget(&self) {
        *self.lock() = None;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Open>> {
        // Held only to clone or replace the slot; a poisoned slot is still a valid value.
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One command or one pipeline, sent as is (a retry sends it again).
enum Request<'a> {
    Cmd(&'a Cmd),
    Pipe(&'a Pipeline),
}

impl Request<'_> {
    async fn send<T: FromRedisValue>(
        &self,
        conn: &mut MultiplexedConnection,
    ) -> Result<T, RedisError> {
        match self {
            Self::Cmd(cmd) => cmd.query_async(conn).await,
            Self::Pipe(pipe) => pipe.query_async(conn).await,
        }
    }
}

/// `CLIENT KILL ID` answers how many clients it closed (0 when the client had already gone).
fn killed(reply: &Value) -> usize {
    match reply {
        Value::Int(n) => usize::try_from(*n).unwrap_or(0),
        _ => 0,
    }
}
