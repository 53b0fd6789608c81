//! One data node's link kept open between uses, as the drain side talks to the old primary:
//! the handful of commands fencing, draining and demoting need, each with a deadline. Any
//! failure drops the connection; the next call opens a new [`Link`]. A node that is down, hung
//! (SIGSTOP: the kernel still accepts, nothing answers) or partitioned costs at most one
//! deadline per call and never blocks anything but the caller.
//!
//! A link can be opened ahead of need ([`KeptLink::warm`], at the first sign of a failover of
//! the node): the fence is then one round trip ([`KeptLink::fence`]), not the four or five of
//! a connection opened when the promotion is announced (TCP, `HELLO`/`AUTH`, the naming, `ROLE`,
//! the pause), which on a loaded machine took longer than Sentinel takes to promote the replica.
//! Callers that arrive while a connection is being opened wait for it rather than open another.
//! A command that fails on a connection opened earlier because that connection is gone (the
//! node's `timeout` closed an idle one) is sent once more on a new connection at once.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use redis::{Cmd, FromRedisValue, Pipeline, Value};
use tokio::time::Instant;

use super::Role;
use super::clients::{ClientList, parse_list};
use super::conn::Endpoint;
use super::link::{self, Link, NodeError, Request};
use crate::config::Auth;
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

pub struct KeptLink {
    addr: SocketAddr,
    endpoint: Endpoint,
    /// The open link, if any; it always knows its client id.
    open: Mutex<Option<Link>>,
    /// Held while a connection is being opened, so that a second caller waits for it.
    opening: tokio::sync::Mutex<()>,
}

/// A link as [`KeptLink::connection`] hands it out: `fresh` when this call opened it.
struct Got {
    link: Link,
    fresh: bool,
}

impl KeptLink {
    pub fn new(node: &Node, auth: &Auth) -> Self {
        // The address Sentinel reports, as role checks dial it (`node::Nodes`): with TLS the
        // certificate is verified against that IP address, the same way on both paths.
        Self {
            addr: node.addr(),
            endpoint: Endpoint::at(node.addr(), auth),
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
        let reply: Value = self.query("ROLE", &redis::cmd("ROLE"), COMMAND_DEADLINE).await?;
        Ok(Role::parse(&reply))
    }

    /// `CLIENT PAUSE <for> WRITE`: writes (and PUBLISH, EVAL...) wait, reads go on.
    pub async fn pause(&self, duration: Duration) -> Result<(), NodeError> {
        self.query::<Value>("CLIENT PAUSE", &link::pause(duration), COMMAND_DEADLINE)
            .await
            .map(drop)
    }

    /// `ROLE` and `CLIENT PAUSE <for> WRITE` in one pipeline: one round trip on an open link.
    /// The pause is applied whatever the role; the caller lifts it from a node that does not
    /// answer master (a replica needs no fence, for anyone).
    pub async fn fence(&self, duration: Duration) -> Result<Fenced, NodeError> {
        let mut pipe = redis::pipe();
        pipe.cmd("ROLE");
        pipe.add_command(link::pause(duration));
        let ((role, _), got): ((Value, Value), Got) =
            self.run("ROLE + CLIENT PAUSE", COMMAND_DEADLINE, &Request::Pipe(&pipe)).await?;
        let round_trips = 1 + if got.fresh { CONNECT_ROUND_TRIPS } else { 0 };
        Ok(Fenced { role: Role::parse(&role), round_trips })
    }

    pub async fn unpause(&self) -> Result<(), NodeError> {
        let mut cmd = redis::cmd("CLIENT");
        cmd.arg("UNPAUSE");
        self.query::<Value>("CLIENT UNPAUSE", &cmd, COMMAND_DEADLINE).await.map(drop)
    }

    pub async fn clients(&self) -> Result<Listing, NodeError> {
        let mut cmd = redis::cmd("CLIENT");
        cmd.arg("LIST");
        let (text, got): (String, Got) =
            self.run("CLIENT LIST", LIST_DEADLINE, &Request::Cmd(&cmd)).await?;
        let own_id = got.link.id()?;
        Ok(Listing { list: parse_list(&text), at: Instant::now(), own_id })
    }

    /// Kills the clients with these ids in one pipeline; returns how many existed.
    pub async fn kill(&self, ids: &[u64]) -> Result<usize, NodeError> {
        let mut pipe = redis::pipe();
        kill_each(&mut pipe, ids);
        let replies: Vec<Value> = self.pipeline("CLIENT KILL", pipe).await?;
        Ok(replies.iter().map(killed).sum())
    }

    /// Kills these clients and lifts the pause in one transaction, so that no write held by
    /// the pause runs on a node that still claims master: its client is gone first.
    pub async fn kill_and_unpause(&self, ids: &[u64]) -> Result<usize, NodeError> {
        let mut pipe = redis::pipe();
        pipe.atomic();
        kill_each(&mut pipe, ids);
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
        kill_each(&mut pipe, held);
        pipe.cmd("REPLICAOF").arg(host).arg(to.port);
        let replies: Vec<Value> = self.pipeline("MULTI CLIENT KILL REPLICAOF", pipe).await?;
        Ok(replies.iter().map(killed).sum())
    }

    async fn query<T: FromRedisValue>(
        &self,
        command: &'static str,
        cmd: &Cmd,
        deadline: Duration,
    ) -> Result<T, NodeError> {
        self.run(command, deadline, &Request::Cmd(cmd)).await.map(|(value, _)| value)
    }

    async fn pipeline<T: FromRedisValue>(
        &self,
        command: &'static str,
        pipe: Pipeline,
    ) -> Result<T, NodeError> {
        let request = Request::Pipe(&pipe);
        self.run(command, COMMAND_DEADLINE, &request).await.map(|(value, _)| value)
    }

    /// Sends `request` under `deadline`, with the link that sent it (`fresh` when it needed a
    /// new connection).
    async fn run<T: FromRedisValue>(
        &self,
        command: &'static str,
        deadline: Duration,
        request: &Request<'_>,
    ) -> Result<(T, Got), NodeError> {
        let got = self.connection().await?;
        match got.link.send(command, request, deadline).await {
            // A connection opened earlier and gone since (the node's `timeout`, a restart):
            // once more on a new one, at once, rather than at the next attempt.
            Err(e) if !got.fresh && e.connection_gone() => {
                tracing::debug!(node = %self.addr, error = %e, command, "link gone: reconnecting");
                self.forget();
                let got = self.connection().await?;
                let reply = got.link.send(command, request, deadline).await;
                self.settle(reply).map(|value| (value, Got { fresh: true, ..got }))
            }
            reply => self.settle(reply).map(|value| (value, got)),
        }
    }

    /// Drops the connection on any failure.
    fn settle<T>(&self, reply: Result<T, NodeError>) -> Result<T, NodeError> {
        if reply.is_err() {
            self.forget();
        }
        reply
    }

    /// The open link, or a new one (waiting for one another caller is opening). A new link
    /// that does not know its client id is refused: the drain could not spare its own.
    async fn connection(&self) -> Result<Got, NodeError> {
        if let Some(link) = self.lock().clone() {
            return Ok(Got { link, fresh: false });
        }
        let _opening = self.opening.lock().await;
        if let Some(link) = self.lock().clone() {
            return Ok(Got { link, fresh: false });
        }
        let link = Link::open(&self.endpoint, CONNECT_DEADLINE).await?;
        link.id()?;
        *self.lock() = Some(link.clone());
        Ok(Got { link, fresh: true })
    }

    fn forget(&self) {
        *self.lock() = None;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Link>> {
        // Held only to clone or replace the slot; a poisoned slot is still a valid value.
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `CLIENT KILL ID <id>` for each of `ids`.
fn kill_each(pipe: &mut Pipeline, ids: &[u64]) {
    for id in ids {
        pipe.cmd("CLIENT").arg("KILL").arg("ID").arg(*id);
    }
}

/// `CLIENT KILL ID` answers how many clients it closed (0 when the client had already gone).
fn killed(reply: &Value) -> usize {
    match reply {
        Value::Int(n) => usize::try_from(*n).unwrap_or(0),
        _ => 0,
    }
}
