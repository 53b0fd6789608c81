//! Binding the DNS sockets: done first at startup so a taken port is reported before anything
//! runs, and handed to [`super::serve`] already bound.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, UdpSocket};

use super::DnsError;
use crate::config;

/// Attempts at finding a port free for both UDP and TCP when the configured port is 0.
const PORT_ATTEMPTS: usize = 16;
/// Receive buffer asked for on each UDP socket, to absorb bursts (the kernel may cap it).
const UDP_RECV_BUFFER: usize = 4 << 20;

/// The bound sockets of every `dns.listen` address.
pub struct Listeners {
    pub(super) udp: Vec<Arc<UdpSocket>>,
    pub(super) tcp: Vec<TcpListener>,
    addrs: Vec<SocketAddr>,
}

impl Listeners {
    /// Binds UDP (one SO_REUSEPORT socket per core) and TCP on every `dns.listen` address.
    /// A listen port of 0 picks a free port: UDP first, then TCP and the other UDP sockets on
    /// the same actual port.
    pub async fn bind(cfg: &config::Dns) -> Result<Self, DnsError> {
        let per_address = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut listeners = Self { udp: Vec::new(), tcp: Vec::new(), addrs: Vec::new() };
        for addr in &cfg.listen {
            let (udp, tcp, actual) = bind_address(*addr, per_address)?;
            tracing::info!("listening for DNS on {actual} (udp)");
            tracing::info!("listening for DNS on {actual} (tcp)");
            listeners.udp.extend(udp.into_iter().map(Arc::new));
            listeners.tcp.push(tcp);
            listeners.addrs.push(actual);
        }
        Ok(listeners)
    }

    /// The actual UDP addresses (TCP listens on the same ones).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.addrs.clone()
    }
}

/// Binds `count` UDP sockets and one TCP listener on one address, retrying with another port
/// when the port was chosen by the kernel and turns out to be taken for TCP.
fn bind_address(
    addr: SocketAddr,
    count: usize,
) -> Result<(Vec<UdpSocket>, TcpListener, SocketAddr), DnsError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let first = udp_socket(addr).map_err(|source| DnsError::BindUdp { addr, source })?;
        let actual = first.local_addr().map_err(|source| DnsError::BindUdp { addr, source })?;
        match bind_rest(first, actual, count) {
            Ok((udp, tcp)) => return Ok((udp, tcp, actual)),
            Err(_) if addr.port() == 0 && attempt < PORT_ATTEMPTS => continue,
            Err(error) => return Err(error),
        }
    }
}

fn bind_rest(
    first: UdpSocket,
    actual: SocketAddr,
    count: usize,
) -> Result<(Vec<UdpSocket>, TcpListener), DnsError> {
    let tcp = tcp_listener(actual).map_err(|source| DnsError::BindTcp { addr: actual, source })?;
    let mut udp = vec![first];
    for _ in 1..count {
        udp.push(udp_socket(actual).map_err(|source| DnsError::BindUdp { addr: actual, source })?);
    }
    Ok((udp, tcp))
}

fn udp_socket(addr: SocketAddr) -> io::Result<UdpSocket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_reuse_port(true)?;
    let _ = socket.set_recv_buffer_size(UDP_RECV_BUFFER); // best effort: the kernel caps it
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    UdpSocket::from_std(socket.into())
}

fn tcp_listener(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}
