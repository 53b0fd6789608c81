//! The kernel's socket table over `NETLINK_SOCK_DIAG`: list TCP sockets and destroy chosen ones.
//!
//! This is what `ss -tn` and `ss -K` do. Destroying a socket (`SOCK_DESTROY`, kernel option
//! `CONFIG_INET_DIAG_DESTROY`, capability `CAP_NET_ADMIN`) sends RST to the peer and makes the
//! owner's next call fail with `ECONNABORTED`, whether or not the owning process is running: it
//! is the one way to free the clients of a stopped redis-server, or an application's sockets to
//! a host that has gone dark. Everything here is blocking (one request, one answer from the
//! kernel); async callers go through [`spawn_blocking`](tokio::task::spawn_blocking).

use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6, IPPROTO_TCP};
use netlink_packet_sock_diag::inet::{ExtensionFlags, InetRequest, SocketId, StateFlags};
use netlink_packet_sock_diag::{SockDiagDestroy, SockDiagMessage};
use netlink_sys::protocols::NETLINK_SOCK_DIAG;

/// The kernel answers at once; a silent kernel means something is badly wrong.
const RECV_TIMEOUT: Duration = Duration::from_secs(2);
/// A dump datagram is at most 32 KiB; twice that never truncates.
const RECV_BUFFER: usize = 64 * 1024;
/// More datagrams than this in one dump is a runaway, not a socket table.
const MAX_DATAGRAMS: usize = 100_000;

#[derive(Debug, thiserror::Error)]
pub enum DiagError {
    #[error("cannot open a NETLINK_SOCK_DIAG socket: {0}")]
    Open(io::Error),
    #[error("NETLINK_SOCK_DIAG {op} failed: {source}")]
    Io { op: &'static str, source: io::Error },
    #[error("cannot decode the kernel's sock_diag answer: {0}")]
    Decode(String),
    #[error(
        "SOCK_DESTROY is not permitted: polestar needs CAP_NET_ADMIN for `sweep` \
         (run as root or grant the capability)"
    )]
    PermissionDenied,
    #[error(
        "SOCK_DESTROY is not supported by this kernel: `sweep` needs CONFIG_INET_DIAG_DESTROY=y"
    )]
    Unsupported,
    #[error("the kernel refused {op}: {source}")]
    Kernel { op: &'static str, source: io::Error },
    #[error("the SOCK_DESTROY self-test failed: {0}")]
    Probe(String),
}

/// The TCP states a dump asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum States {
    /// Connected sockets (including those waiting in a hung server's accept queue).
    Established,
    /// Connected sockets and connections still being opened (SYN sent to a dark host).
    EstablishedOrOpening,
    /// Listening sockets (their peer is the unspecified address).
    Listening,
}

impl States {
    fn flags(self) -> StateFlags {
        match self {
            Self::Established => StateFlags::ESTABLISHED,
            Self::EstablishedOrOpening => StateFlags::ESTABLISHED | StateFlags::SYN_SENT,
            Self::Listening => StateFlags::LISTEN,
        }
    }
}

/// One TCP socket of this network namespace, as the kernel reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpSocket {
    /// IPv4-mapped IPv6 addresses (dual-stack listeners) are given as IPv4.
    pub local: SocketAddr,
    pub peer: SocketAddr,
    /// The kernel's full identity (with its cookie), for an exact `SOCK_DESTROY`.
    id: SocketId,
    family: u8,
}

/// One open `NETLINK_SOCK_DIAG` socket.
pub struct Diag {
    socket: netlink_sys::Socket,
    seq: u32,
}

impl Diag {
    pub fn open() -> Result<Self, DiagError> {
        let mut socket = netlink_sys::Socket::new(NETLINK_SOCK_DIAG).map_err(DiagError::Open)?;
        socket.bind_auto().map_err(DiagError::Open)?;
        socket.connect(&netlink_sys::SocketAddr::new(0, 0)).map_err(DiagError::Open)?;
        socket2::SockRef::from(&socket)
            .set_read_timeout(Some(RECV_TIMEOUT))
            .map_err(DiagError::Open)?;
        Ok(Self { socket, seq: 0 })
    }

    /// Every TCP socket (IPv4 and IPv6) in the given states.
    pub fn tcp_sockets(&mut self, states: States) -> Result<Vec<TcpSocket>, DiagError> {
        let mut all = self.dump(AF_INET, states)?;
        all.extend(self.dump(AF_INET6, states)?);
        Ok(all)
    }

    /// Destroys one socket. `Ok(false)`: it was already gone.
    pub fn destroy(&mut self, socket: &TcpSocket) -> Result<bool, DiagError> {
        let request = InetRequest {
            family: socket.family,
            protocol: IPPROTO_TCP,
            extensions: ExtensionFlags::empty(),
            states: StateFlags::all(),
            socket_id: socket.id.clone(),
        };
        let payload = SockDiagDestroy::new(SockDiagMessage::InetRequest(request));
        self.send(payload, NLM_F_REQUEST | NLM_F_ACK)?;
        let datagram = self.recv()?;
        let message = NetlinkMessage::<SockDiagDestroy>::deserialize(&datagram)
            .map_err(|e| DiagError::Decode(e.to_string()))?;
        match message.payload {
            NetlinkPayload::Error(e) => match e.code.map(|c| -c.get()) {
                None => Ok(true),
                Some(nix::libc::ENOENT) => Ok(false),
                Some(nix::libc::EPERM) | Some(nix::libc::EACCES) => {
                    Err(DiagError::PermissionDenied)
                }
                Some(nix::libc::EOPNOTSUPP) => Err(DiagError::Unsupported),
                Some(errno) => Err(DiagError::Kernel {
                    op: "SOCK_DESTROY",
                    source: io::Error::from_raw_os_error(errno),
                }),
            },
            other => {
                Err(DiagError::Decode(format!("unexpected answer to SOCK_DESTROY: {other:?}")))
            }
        }
    }

    fn dump(&mut self, family: u8, states: States) -> Result<Vec<TcpSocket>, DiagError> {
        let socket_id = if family == AF_INET { SocketId::new_v4() } else { SocketId::new_v6() };
        let request = InetRequest {
            family,
            protocol: IPPROTO_TCP,
            extensions: ExtensionFlags::empty(),
            states: states.flags(),
            socket_id,
        };
        self.send(SockDiagMessage::InetRequest(request), NLM_F_REQUEST | NLM_F_DUMP)?;
        let mut found = Vec::new();
        for _ in 0..MAX_DATAGRAMS {
            let datagram = self.recv()?;
            if read_datagram(&datagram, &mut found)? {
                return Ok(found);
            }
        }
        Err(DiagError::Decode("the dump did not end".into()))
    }

    fn send<P>(&mut self, payload: P, flags: u16) -> Result<(), DiagError>
    where
        P: netlink_packet_core::NetlinkSerializable + Into<NetlinkPayload<P>>,
    {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = self.seq;
        let mut packet = NetlinkMessage::new(header, payload.into());
        packet.finalize();
        let mut buf = vec![0; packet.buffer_len()];
        packet.serialize(&mut buf);
        let op = "send";
        self.socket.send(&buf, 0).map_err(|source| DiagError::Io { op, source })?;
        Ok(())
    }

    fn recv(&mut self) -> Result<Vec<u8>, DiagError> {
        let mut buf = Vec::with_capacity(RECV_BUFFER);
        let op = "receive";
        let n = self.socket.recv(&mut buf, 0).map_err(|source| DiagError::Io { op, source })?;
        if n > buf.len() {
            return Err(DiagError::Decode(format!("a {n}-byte datagram was truncated")));
        }
        Ok(buf)
    }
}

/// Adds the sockets of one dump datagram to `found`; `true` once the dump is done.
fn read_datagram(mut bytes: &[u8], found: &mut Vec<TcpSocket>) -> Result<bool, DiagError> {
    while !bytes.is_empty() {
        let message = NetlinkMessage::<SockDiagMessage>::deserialize(bytes)
            .map_err(|e| DiagError::Decode(e.to_string()))?;
        let length = message.header.length as usize;
        match message.payload {
            NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => {
                found.push(TcpSocket::from_kernel(r.header.family, r.header.socket_id));
            }
            NetlinkPayload::Done(_) => return Ok(true),
            NetlinkPayload::Error(e) => {
                let errno = e.code.map_or(0, |c| -c.get());
                let source = io::Error::from_raw_os_error(errno);
                return Err(DiagError::Kernel { op: "the socket dump", source });
            }
            _ => {}
        }
        // Messages are 4-byte aligned within a datagram.
        let step = length.next_multiple_of(4);
        if length == 0 || step > bytes.len() {
            return Ok(false);
        }
        bytes = &bytes[step..];
    }
    Ok(false)
}

impl TcpSocket {
    fn from_kernel(family: u8, id: SocketId) -> Self {
        let local = SocketAddr::new(id.source_address.to_canonical(), id.source_port);
        let peer = SocketAddr::new(id.destination_address.to_canonical(), id.destination_port);
        Self { local, peer, id, family }
    }

    /// A socket as a dump would list it, for selection tests.
    #[cfg(test)]
    pub(crate) fn listed(local: SocketAddr, peer: SocketAddr) -> Self {
        Self { local, peer, id: SocketId::new_v4(), family: AF_INET }
    }
}

/// Lists sockets without blocking the runtime.
pub async fn tcp_sockets(states: States) -> Result<Vec<TcpSocket>, DiagError> {
    blocking(move || Diag::open()?.tcp_sockets(states)).await
}

/// Destroys the sockets that `select` picks; returns the destroyed ones.
pub async fn destroy_where<F>(states: States, select: F) -> Result<Vec<TcpSocket>, DiagError>
where
    F: Fn(&TcpSocket) -> bool + Send + 'static,
{
    blocking(move || {
        let mut diag = Diag::open()?;
        let chosen: Vec<TcpSocket> = diag.tcp_sockets(states)?.into_iter().filter(select).collect();
        let mut destroyed = Vec::with_capacity(chosen.len());
        for socket in chosen {
            if diag.destroy(&socket)? {
                destroyed.push(socket);
            }
        }
        Ok(destroyed)
    })
    .await
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, DiagError> + Send + 'static,
) -> Result<T, DiagError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(DiagError::Probe(format!("the netlink task failed: {e}"))))
}

/// Checks at startup that this process may destroy sockets: opens a loopback connection of its
/// own, destroys it through the kernel, and checks that its owner sees the abort.
pub fn probe() -> Result<(), DiagError> {
    let probe_err = |what: &str, e: io::Error| DiagError::Probe(format!("{what}: {e}"));
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| probe_err("cannot listen on 127.0.0.1 (is `lo` up?)", e))?;
    let server = listener.local_addr().map_err(|e| probe_err("listener address", e))?;
    let mut client =
        TcpStream::connect(server).map_err(|e| probe_err("cannot connect on loopback", e))?;
    let (_accepted, _) = listener.accept().map_err(|e| probe_err("accept", e))?;
    let local = client.local_addr().map_err(|e| probe_err("client address", e))?;

    let mut diag = Diag::open()?;
    let ours = diag
        .tcp_sockets(States::Established)?
        .into_iter()
        .find(|s| s.local == local && s.peer == server)
        .ok_or_else(|| DiagError::Probe(format!("the dump does not list {local}->{server}")))?;
    diag.destroy(&ours)?;
    expect_aborted(&mut client)
}

/// After a destroy, the owner's next read fails (ECONNABORTED) instead of waiting.
fn expect_aborted(client: &mut TcpStream) -> Result<(), DiagError> {
    use std::io::Read;
    let timeout = Some(Duration::from_secs(1));
    client.set_read_timeout(timeout).map_err(|e| DiagError::Probe(e.to_string()))?;
    match client.read(&mut [0u8; 1]) {
        Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut => {
            Err(DiagError::Probe("the destroyed socket still reads as open".into()))
        }
        other => Err(DiagError::Probe(format!("unexpected read after destroy: {other:?}"))),
    }
}

#[cfg(test)]
mod tests;
