//! Connections polestar opens to Sentinels and data nodes, all with the same guarantees:
//! a connect timeout, a response timeout, TCP keepalive and `TCP_USER_TIMEOUT`, so that no
//! socket of ours can hang silently on a dead peer.
//!
//! The redis crate does not reconnect on a response timeout and a pub/sub stream can stay
//! silent forever; callers treat any error as fatal for the connection and build a new one.

use std::time::Duration;

use crate::config::Auth;
use redis::aio::MultiplexedConnection;
use redis::io::tcp::{TcpSettings, socket2::TcpKeepalive};
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, IntoConnectionInfo, ProtocolVersion, PushInfo,
    RedisConnectionInfo, RedisResult, TlsCertificates,
};

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

    pub fn name(&self) -> String {
        crate::config::HostPort { host: self.host.clone(), port: self.port }.to_string()
    }
}

/// Where a connection's pub/sub messages and disconnects go. Called by the connection's
/// reader for every push, so it must not block (a bounded queue that drops what does not fit:
/// see [`super::link`]); an `Err` stops the pushes.
pub type PushSink = Box<dyn Fn(PushInfo) -> Result<(), ()> + Send + Sync>;

/// Opens a RESP3 connection; with `push`, pub/sub messages and disconnects arrive there.
pub async fn connect(
    endpoint: &Endpoint,
    push: Option<PushSink>,
) -> RedisResult<MultiplexedConnection> {
    let client = client(endpoint)?;
    let mut config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(RESPONSE_TIMEOUT));
    if let Some(push) = push {
        config = config.set_push_sender(push);
    }
    client.get_multiplexed_async_connection_with_config(&config).await
}

fn client(endpoint: &Endpoint) -> RedisResult<Client> {
    let tls = &endpoint.auth.tls;
    let addr = if tls.enabled {
        ConnectionAddr::TcpTls {
            host: endpoint.host.clone(),
            port: endpoint.port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(endpoint.host.clone(), endpoint.port)
    };
    let mut redis = RedisConnectionInfo::default()
        .set_protocol(ProtocolVersion::RESP3)
        .set_lib_name("polestar", env!("CARGO_PKG_VERSION"));
    if let Some(user) = &endpoint.auth.username {
        redis = redis.set_username(user);
    }
    if let Some(password) = &endpoint.auth.password {
        redis = redis.set_password(password.expose());
    }
    let info =
        addr.into_connection_info()?.set_tcp_settings(tcp_settings()).set_redis_settings(redis);
    if !tls.enabled {
        return Client::open(info);
    }
    Client::build_with_tls(info, certificates(&endpoint.auth)?)
}

fn certificates(auth: &Auth) -> RedisResult<TlsCertificates> {
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|e| {
            redis::RedisError::from((
                redis::ErrorKind::Io,
                "cannot read TLS file",
                format!("{}: {e}", path.display()),
            ))
        })
    };
    let root_cert = auth.tls.ca_file.as_deref().map(read).transpose()?;
    let client_tls = match (&auth.tls.cert_file, &auth.tls.key_file) {
        (Some(cert), Some(key)) => {
            Some(redis::ClientTlsConfig { client_cert: read(cert)?, client_key: read(key)? })
        }
        _ => None,
    };
    Ok(TlsCertificates { client_tls, root_cert })
}
