//! One connection to a data node, opened the one way every side of polestar opens it: TCP
//! (keepalive, `TCP_USER_TIMEOUT`), TLS as configured and `HELLO` with the node credentials
//! ([`super::conn`]), then, in one round trip, `CLIENT SETNAME` [`CONNECTION_NAME`] (so that no
//! drain or sweep, ours or another polestar's, cuts it) and `CLIENT ID` (so that a drain over
//! it knows which client is its own). Every command has a deadline; a link that fails is not
//! repaired: the caller drops it and opens another ([`super::KeptLink`] does so for the drain).
//!
//! A question asked once (a sweep's `ROLE` probe, its `CLIENT LIST`) travels in the naming's
//! round trip ([`Link::open_with`]), so that naming the connection costs no round trip.
//!
//! A node that refuses the naming (an ACL without `+client|setname` or `+client|id`, against
//! the README's) still gives a link for questions; only a caller that must know its own client
//! id ([`Link::id`], the drain) finds it unusable.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{Cmd, ErrorKind, FromRedisValue, Pipeline, RedisError, RedisResult, Value};
use tokio::time::timeout;

use super::conn::{CONNECT_TIMEOUT, Endpoint, RESPONSE_TIMEOUT, connect};
use super::{CONNECTION_NAME, Role};

/// For a caller with no tighter bound of its own: a link opens within the transport's own
/// bounds (its connect timeout, then the naming's round trip within its response timeout)...
pub const DEFAULT_OPEN_DEADLINE: Duration = CONNECT_TIMEOUT.saturating_add(RESPONSE_TIMEOUT);
/// ...and each command answers within the transport's response timeout.
pub const DEFAULT_COMMAND_DEADLINE: Duration = RESPONSE_TIMEOUT;

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("cannot connect to {node}: {source}")]
    Connect { node: String, source: RedisError },
    #[error("{node} did not answer {command} within {}ms", after.as_millis())]
    Timeout { node: String, command: &'static str, after: Duration },
    #[error("{node}: {command} failed: {source}")]
    Command { node: String, command: &'static str, source: RedisError },
}

impl NodeError {
    /// The connection is gone (closed by the node, reset): a command sent again on a new one
    /// may well succeed.
    pub fn connection_gone(&self) -> bool {
        matches!(self, Self::Command { source, .. }
            if source.is_connection_dropped() || source.is_io_error())
    }
}

#[derive(Clone)]
pub struct Link {
    /// The endpoint's name (`ip:port`, `host:port`), for errors.
    node: Arc<str>,
    conn: MultiplexedConnection,
    /// The connection's client id, or why the node did not name it or tell its id.
    identity: Result<u64, RedisError>,
}

impl Link {
    /// Connects to `endpoint` and names the connection, all within `deadline`.
    pub async fn open(endpoint: &Endpoint, deadline: Duration) -> Result<Self, NodeError> {
        let opened = timeout(deadline, Self::connect(endpoint, "CLIENT ID", None)).await;
        let (link, _) = opened.map_err(|_| timed_out(endpoint, "connect", deadline))??;
        Ok(link)
    }

    /// [`Self::open`], with `first` (called `command` in errors) sent in the naming's round
    /// trip, and its reply; all within `deadline`.
    pub async fn open_with<T: FromRedisValue>(
        endpoint: &Endpoint,
        command: &'static str,
        first: &Cmd,
        deadline: Duration,
    ) -> Result<(Self, T), NodeError> {
        let opened = timeout(deadline, Self::connect(endpoint, command, Some(first))).await;
        let (link, reply) = opened.map_err(|_| timed_out(endpoint, command, deadline))??;
        let value = reply.and_then(|v| Ok(redis::from_redis_value(v)?));
        let value = value.map_err(|source| link.failed(command, source))?;
        Ok((link, value))
    }

    /// Connects, then sends the naming and `first` in one pipeline. Errors of the pipeline's
    /// commands are kept apart: a refused `SETNAME` leaves a link without identity, a refused
    /// `first` an error as its reply.
    async fn connect(
        endpoint: &Endpoint,
        command: &'static str,
        first: Option<&Cmd>,
    ) -> Result<(Self, RedisResult<Value>), NodeError> {
        let node: Arc<str> = endpoint.name().into();
        let failed = |source| NodeError::Command { node: node.to_string(), command, source };
        let connected = connect(endpoint, None).await;
        let mut conn =
            connected.map_err(|source| NodeError::Connect { node: endpoint.name(), source })?;
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        pipe.cmd("CLIENT").arg("SETNAME").arg(CONNECTION_NAME);
        pipe.cmd("CLIENT").arg("ID");
        if let Some(first) = first {
            pipe.add_command(first.clone());
        }
        let replies: Vec<RedisResult<Value>> = pipe.query_async(&mut conn).await.map_err(failed)?;
        let mut replies = replies.into_iter();
        let mut next = || replies.next().unwrap_or_else(|| Err(no_reply()));
        let identity = identity(next(), next());
        Ok((Self { node, conn, identity }, next()))
    }

    /// The connection's client id; an error when the node did not name the connection or
    /// did not tell its id.
    pub fn id(&self) -> Result<u64, NodeError> {
        self.identity.clone().map_err(|source| self.failed("CLIENT ID", source))
    }

    /// Sends `cmd`; `command` names it in errors.
    pub async fn query<T: FromRedisValue>(
        &self,
        command: &'static str,
        cmd: &Cmd,
        deadline: Duration,
    ) -> Result<T, NodeError> {
        self.send(command, &Request::Cmd(cmd), deadline).await
    }

    /// Sends one command or one pipeline within `deadline`.
    pub(super) async fn send<T: FromRedisValue>(
        &self,
        command: &'static str,
        request: &Request<'_>,
        deadline: Duration,
    ) -> Result<T, NodeError> {
        let mut conn = self.conn.clone();
        match timeout(deadline, request.send(&mut conn)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(source)) => Err(self.failed(command, source)),
            Err(_) => {
                Err(NodeError::Timeout { node: self.node.to_string(), command, after: deadline })
            }
        }
    }

    pub async fn role(&self, deadline: Duration) -> Result<Role, NodeError> {
        let reply: Value = self.query("ROLE", &redis::cmd("ROLE"), deadline).await?;
        Ok(Role::parse(&reply))
    }

    /// `INFO <section>` as text.
    pub async fn info(&self, section: &str, deadline: Duration) -> Result<String, NodeError> {
        let mut cmd = redis::cmd("INFO");
        cmd.arg(section);
        self.query("INFO", &cmd, deadline).await
    }

    /// `CLIENT PAUSE <length> WRITE`: writes (and PUBLISH, EVAL...) wait, reads go on.
    pub async fn pause(&self, length: Duration, deadline: Duration) -> Result<(), NodeError> {
        self.query::<Value>("CLIENT PAUSE", &pause(length), deadline).await.map(drop)
    }

    pub async fn unpause(&self, deadline: Duration) -> Result<(), NodeError> {
        let mut cmd = redis::cmd("CLIENT");
        cmd.arg("UNPAUSE");
        self.query::<Value>("CLIENT UNPAUSE", &cmd, deadline).await.map(drop)
    }

    fn failed(&self, command: &'static str, source: RedisError) -> NodeError {
        NodeError::Command { node: self.node.to_string(), command, source }
    }
}

/// `CLIENT PAUSE <length> WRITE`, at least a millisecond.
pub(super) fn pause(length: Duration) -> Cmd {
    let mut cmd = redis::cmd("CLIENT");
    cmd.arg("PAUSE").arg(length.as_millis().max(1) as u64).arg("WRITE");
    cmd
}

/// The client id the naming's replies give, or the first refusal among them.
fn identity(setname: RedisResult<Value>, id: RedisResult<Value>) -> Result<u64, RedisError> {
    setname?;
    Ok(redis::from_redis_value(id?)?)
}

fn timed_out(endpoint: &Endpoint, command: &'static str, after: Duration) -> NodeError {
    NodeError::Timeout { node: endpoint.name(), command, after }
}

fn no_reply() -> RedisError {
    RedisError::from((ErrorKind::UnexpectedReturnType, "no reply in the pipeline"))
}

/// One command or one pipeline, sent as is (a retry sends it again).
pub(super) enum Request<'a> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(text: &'static str) -> RedisResult<Value> {
        Err(RedisError::from((ErrorKind::Client, "NOPERM", text.to_string())))
    }

    #[test]
    fn a_link_knows_its_id_only_once_named() {
        let ok = || Ok(Value::Okay);
        assert_eq!(identity(ok(), Ok(Value::Int(42))).ok(), Some(42));
        assert!(identity(refused("no SETNAME"), Ok(Value::Int(42))).is_err());
        assert!(identity(ok(), refused("no CLIENT ID")).is_err());
        assert!(identity(ok(), Ok(Value::Nil)).is_err());
        assert!(identity(ok(), Err(no_reply())).is_err());
    }

    #[test]
    fn a_pause_lasts_at_least_a_millisecond_and_holds_only_writes() {
        let packed = |d| String::from_utf8_lossy(&pause(d).get_packed_command()).into_owned();
        assert_eq!(packed(Duration::ZERO), packed(Duration::from_millis(1)));
        assert!(packed(Duration::from_millis(2500)).contains("\r\n2500\r\n"));
        assert!(packed(Duration::from_millis(2500)).ends_with("WRITE\r\n"));
    }
}
