//! Port choice on 127.0.0.1. A port is only free at the moment it is checked: a process that
//! then fails to bind it is started again on another (see `process::launch`).

use std::net::{TcpListener, UdpSocket};

use anyhow::{Context, bail, ensure};

/// Which ports a process may take.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Ports {
    /// Any port the kernel hands out ([`free_port`]).
    #[default]
    Ephemeral,
    /// One below the ephemeral range ([`free_service_port`]).
    Service,
}

impl Ports {
    pub fn pick(self) -> anyhow::Result<u16> {
        match self {
            Self::Ephemeral => free_port(),
            Self::Service => free_service_port(),
        }
    }
}

/// A port that was free a moment ago; the caller retries if a process still fails to bind it.
pub fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot bind 127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// A port below the kernel's ephemeral range, free for both TCP and UDP on 127.0.0.1 right
/// now: for a server that another program binds later (knotd). A port from `free_port` lies
/// in the ephemeral range, where any outgoing connection of a busy test run may take it
/// before that program binds it (seen in CI: knotd's TCP bind failed).
pub fn free_service_port() -> anyhow::Result<u16> {
    let first = ephemeral_start();
    let low = 10_000u16.min(first / 2);
    let span = u32::from(first.saturating_sub(low)).max(1);
    // Spread concurrent test processes over the range; no randomness needed beyond that.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let seed = std::process::id().wrapping_mul(7919).wrapping_add(nanos);
    for i in 0..span.min(2000) {
        let port = low + ((seed.wrapping_add(i * 131)) % span) as u16;
        if tcp_and_udp_free(port) {
            return Ok(port);
        }
    }
    bail!("no port free for TCP and UDP below {first}")
}

/// `count` ports free for TCP right now, from `first` up: for benches that start hundreds of
/// processes below the ephemeral range, where their own clients' sockets do not take them.
pub fn free_ports_from(first: u16, count: usize) -> anyhow::Result<Vec<u16>> {
    let ports: Vec<u16> = (first..u16::MAX)
        .filter(|p| TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .take(count)
        .collect();
    ensure!(ports.len() == count, "not enough free ports from {first}");
    Ok(ports)
}

fn ephemeral_start() -> u16 {
    let range =
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    range.split_whitespace().next().and_then(|p| p.parse().ok()).unwrap_or(32768)
}

fn tcp_and_udp_free(port: u16) -> bool {
    let tcp = TcpListener::bind(("127.0.0.1", port));
    let udp = UdpSocket::bind(("127.0.0.1", port));
    tcp.is_ok() && udp.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_ports_lie_below_the_ephemeral_range() {
        let port = free_service_port().expect("a free port");
        assert!(port < ephemeral_start(), "{port}");
        let ports = free_ports_from(port, 3).expect("three ports");
        assert!(ports.windows(2).all(|w| w[0] < w[1]) && ports[0] >= port, "{ports:?}");
    }
}
