//! The transport of every connection polestar opens to a Redis or Valkey process, Sentinels
//! and data nodes alike, all with the same guarantees: a connect timeout, a response timeout,
//! TCP keepalive and `TCP_USER_TIMEOUT`, so that no socket of ours can hang silently on a dead
//! peer, and TLS as configured. The Sentinel side keeps its own sessions over it
//! (`sentinel::link`); data nodes are talked to through a [`super::Link`].
//!
//! The redis crate does not reconnect on a response timeout and a pub/sub stream can stay
//! silent forever; callers treat any error as fatal for the connection and build a new one.

use std::net::SocketAddr;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::io::tcp::{TcpSettings, socket2::TcpKeepalive};
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, ErrorKind, IntoConnectionInfo, ProtocolVersion,
    PushInfo, RedisConnectionInfo, RedisError, RedisResult,
};
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::config::Auth;

/// How long a connect (TCP, TLS and the HELLO handshake) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long any single command may take before the connection is given up.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
/// Unacknowledged data older than this kills the socket in the kernel.
const USER_TIMEOUT: Duration = Duration::from_secs(5);

fn tcp_settings() -> TcpSettings {
    let keepalive = TcpKeepalive::new()
        .with_time(Duration::from_secs(5))
        .with_interval(Duration::from_secs(1))
        .with_retries(3);
    TcpSettings::default().set_nodelay(true).set_keepalive(keepalive).set_user_timeout(USER_TIMEOUT)
}

/// Where and how to connect: one endpoint with the credentials of its kind.
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    pub auth: Auth,
}

impl Endpoint {
    pub fn new(host: impl Into<String>, port: u16, auth: &Auth) -> Self {
        Self { host: host.into(), port, auth: auth.clone() }
    }

    /// A node at the address Sentinel reports: with TLS, its certificate is verified against
    /// that IP address.
    pub fn at(addr: SocketAddr, auth: &Auth) -> Self {
        Self::new(addr.ip().to_string(), addr.port(), auth)
    }

    pub fn name(&self) -> String {
        crate::config::HostPort { host: self.host.clone(), port: self.port }.to_string()
    }
}

/// Where a connection's pub/sub messages and disconnects go. Called by the connection's
/// reader for every push, so it must not block (a bounded queue that drops what does not fit:
/// see the Sentinel links, `sentinel::link`); an `Err` stops the pushes.
pub type PushSink = Box<dyn Fn(PushInfo) -> Result<(), ()> + Send + Sync>;

/// Opens a RESP3 connection; with `push`, pub/sub messages and disconnects arrive there.
/// Every failure, TLS ones included, is an error naming the endpoint (never a panic), and is
/// recorded for `/readyz` ([`crate::reach`]) until a connect to the same endpoint succeeds.
pub async fn connect(
    endpoint: &Endpoint,
    push: Option<PushSink>,
) -> RedisResult<MultiplexedConnection> {
    let mut config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(RESPONSE_TIMEOUT));
    if let Some(push) = push {
        config = config.set_push_sender(push);
    }
    let result = if endpoint.auth.tls.enabled {
        match tokio::time::timeout(CONNECT_TIMEOUT, connect_tls(endpoint, config)).await {
            Ok(result) => result,
            Err(_) => {
                Err(failure(endpoint, "connect", format!("no answer within {CONNECT_TIMEOUT:?}")))
            }
        }
    } else {
        match Client::open(info(endpoint)?) {
            Ok(client) => client.get_multiplexed_async_connection_with_config(&config).await,
            Err(e) => Err(e),
        }
    };
    crate::reach::record(&endpoint.name(), result.as_ref().err());
    result
}

/// TCP with our socket settings, then TLS with the configuration of [`crate::tls`]: the
/// certificate is verified against the host dialled (a name or an IP address, as the
/// endpoint says), then HELLO and AUTH.
async fn connect_tls(
    endpoint: &Endpoint,
    config: AsyncConnectionConfig,
) -> RedisResult<MultiplexedConnection> {
    let stream = tls_stream(endpoint).await?;
    let redis = redis_settings(endpoint);
    let (conn, driver) = MultiplexedConnection::new_with_config(&redis, stream, config)
        .await
        // A server that refuses our certificate (or none) says so after the handshake.
        .map_err(|e| failure(endpoint, "TLS session", e.to_string()))?;
    // The driver ends when the last clone of the connection is dropped or the socket fails.
    tokio::spawn(driver);
    Ok(conn)
}

/// TCP with our socket settings, then TLS with the configuration of [`crate::tls`], the
/// certificate verified against the host dialled.
pub(super) async fn tls_stream(endpoint: &Endpoint) -> RedisResult<TlsStream<TcpStream>> {
    let tls = crate::tls::client_config(&endpoint.auth.tls)
        .map_err(|e| failure(endpoint, "TLS configuration", e.to_string()))?;
    let server_name = ServerName::try_from(endpoint.host.clone())
        .map_err(|e| failure(endpoint, "TLS server name", e.to_string()))?;
    let tcp = tcp_stream(endpoint).await?;
    TlsConnector::from(tls)
        .connect(server_name, tcp)
        .await
        .map_err(|e| failure(endpoint, "TLS handshake", e.to_string()))
}

/// TCP with our socket settings.
pub(super) async fn tcp_stream(endpoint: &Endpoint) -> RedisResult<TcpStream> {
    let tcp = TcpStream::connect((endpoint.host.as_str(), endpoint.port))
        .await
        .map_err(|e| failure(endpoint, "connect", e.to_string()))?;
    set_socket_options(&tcp);
    Ok(tcp)
}

/// The settings `tcp_settings` gives redis' own sockets, on ours.
fn set_socket_options(tcp: &TcpStream) {
    let socket = socket2::SockRef::from(tcp);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(5))
        .with_interval(Duration::from_secs(1))
        .with_retries(3);
    // Best effort, as redis does: a socket without keepalive still works.
    let _ = socket.set_tcp_nodelay(true);
    let _ = socket.set_tcp_keepalive(&keepalive);
    let _ = socket.set_tcp_user_timeout(Some(USER_TIMEOUT));
}

pub(super) fn failure(endpoint: &Endpoint, stage: &'static str, detail: String) -> RedisError {
    RedisError::from((ErrorKind::Io, stage, format!("{}: {detail}", endpoint.name())))
}

fn redis_settings(endpoint: &Endpoint) -> RedisConnectionInfo {
    let mut redis = RedisConnectionInfo::default()
        .set_protocol(ProtocolVersion::RESP3)
        .set_lib_name("polestar", env!("CARGO_PKG_VERSION"));
    if let Some(user) = &endpoint.auth.username {
        redis = redis.set_username(user);
    }
    if let Some(password) = &endpoint.auth.password {
        redis = redis.set_password(password.expose());
    }
    redis
}

fn info(endpoint: &Endpoint) -> RedisResult<redis::ConnectionInfo> {
    let addr = ConnectionAddr::Tcp(endpoint.host.clone(), endpoint.port);
    Ok(addr
        .into_connection_info()?
        .set_tcp_settings(tcp_settings())
        .set_redis_settings(redis_settings(endpoint)))
}
