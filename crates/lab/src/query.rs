//! One-shot commands to the lab's processes, each with a deadline.
//!
//! The lab hangs processes on purpose (SIGSTOP), so no command may wait without a bound: a
//! stopped process still completes the TCP handshake (the kernel does it) and then never
//! answers. A fresh connection per command keeps the helpers free of connection state that a
//! restart or a hang would spoil; the lab is not performance-sensitive.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use redis::FromRedisValue;

/// Long enough for a busy 2-core machine, short enough that a hung process is skipped quickly.
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// Sends `cmd` to `addr` and parses the reply, failing after [`TIMEOUT`].
/// A TLS lab's process ([`crate::tls`]) is dialled over TLS with the lab's client certificate.
pub async fn query<T: FromRedisValue>(addr: SocketAddr, cmd: &redis::Cmd) -> anyhow::Result<T> {
    let client = redis::Client::open(format!("redis://{addr}/"))
        .with_context(|| format!("{addr}: bad address"))?;
    let certs = crate::tls::for_port(addr.port());
    let exchange = async {
        let mut conn = match certs {
            Some(certs) => tls_connection(addr, &certs).await?,
            None => client.get_multiplexed_async_connection().await?,
        };
        anyhow::Ok(cmd.query_async::<T>(&mut conn).await?)
    };
    tokio::time::timeout(TIMEOUT, exchange)
        .await
        .with_context(|| format!("{addr}: no answer within {TIMEOUT:?}"))?
        .with_context(|| format!("{addr}: command failed"))
}

/// RESP2 (as the plain connections speak) over TLS, verified against the lab's CA.
async fn tls_connection(
    addr: SocketAddr,
    certs: &crate::tls::Certs,
) -> anyhow::Result<redis::aio::MultiplexedConnection> {
    let config = certs.client_config()?;
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let stream = tokio_rustls::TlsConnector::from(config).connect(name, tcp).await?;
    let info = redis::RedisConnectionInfo::default();
    let (conn, driver) =
        redis::aio::MultiplexedConnection::new_with_config(&info, stream, Default::default())
            .await?;
    // Ends when the connection is dropped, after the one command.
    tokio::spawn(driver);
    Ok(conn)
}

/// `SENTINEL <sub> <args...>`.
pub fn sentinel(sub: &str, args: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd("SENTINEL");
    cmd.arg(sub);
    for arg in args {
        cmd.arg(*arg);
    }
    cmd
}

/// A flat `[key, value, key, value...]` reply (`SENTINEL MASTER`, each `SENTINEL REPLICAS` item).
pub fn pairs(flat: Vec<String>) -> HashMap<String, String> {
    let mut map = HashMap::new();
    let mut items = flat.into_iter();
    while let (Some(k), Some(v)) = (items.next(), items.next()) {
        map.insert(k, v);
    }
    map
}

/// The `key:value` lines of an `INFO` section.
pub fn info_fields(info: &str) -> HashMap<String, String> {
    info.lines()
        .filter_map(|line| line.trim_end().split_once(':'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Resolves `host:port` as Sentinel reports it (an IP, or a hostname with
/// `announce-hostnames`), preferring IPv4 since the lab binds 127.0.0.1 only.
pub async fn resolve(host: &str, port: u16) -> anyhow::Result<SocketAddr> {
    if let Ok(ip) = host.parse() {
        return Ok(SocketAddr::new(ip, port));
    }
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .with_context(|| format!("cannot resolve {host}"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .with_context(|| format!("{host} resolves to no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_and_info_fields() {
        let map = pairs(vec!["a".into(), "1".into(), "b".into(), "2".into(), "odd".into()]);
        assert_eq!(map.len(), 2);
        assert_eq!(map["b"], "2");
        let info = info_fields("# Replication\r\nrole:master\r\nconnected_slaves:2\r\n");
        assert_eq!(info["connected_slaves"], "2");
    }
}
