//! Datagrams in batches: `recvmmsg`/`sendmmsg` (through nix's safe wrappers) move up to
//! [`BATCH`] queries and answers per system call, as Knot and other fast authoritative servers
//! do. Under load this halves the kernel work per query; when idle a batch is one datagram.

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::AsRawFd;

use nix::sys::socket::{
    ControlMessage, MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg, sendmmsg,
};
use tokio::io::Interest;
use tokio::net::UdpSocket;

/// Datagrams read or written per system call at most.
pub const BATCH: usize = 32;

/// Receive buffers for one batch, each [`RECV_SIZE`] bytes.
pub struct RecvBuffers {
    bytes: Vec<u8>,
}

/// Larger requests than this are not DNS queries polestar answers: they are cut, then fail to
/// decode (FORMERR).
pub const RECV_SIZE: usize = 4096;

impl RecvBuffers {
    pub fn new() -> Self {
        Self { bytes: vec![0; BATCH * RECV_SIZE] }
    }

    /// The `index`th datagram of the last batch, `len` bytes long.
    pub fn datagram(&self, index: usize, len: usize) -> &[u8] {
        let start = index * RECV_SIZE;
        self.bytes.get(start..start + len.min(RECV_SIZE)).unwrap_or(&[])
    }
}

/// One datagram of a batch: where it sits in the [`RecvBuffers`], its length and its source.
pub struct Received {
    pub index: usize,
    pub len: usize,
    pub src: SocketAddr,
}

/// Waits for datagrams and reads as many as are queued (up to [`BATCH`]). Datagrams from an
/// address that is not IP are skipped.
pub async fn recv(socket: &UdpSocket, buffers: &mut RecvBuffers) -> io::Result<Vec<Received>> {
    loop {
        socket.readable().await?;
        match socket.try_io(Interest::READABLE, || recv_now(socket, buffers)) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

fn recv_now(socket: &UdpSocket, buffers: &mut RecvBuffers) -> io::Result<Vec<Received>> {
    let mut slices: Vec<[IoSliceMut<'_>; 1]> =
        buffers.bytes.chunks_mut(RECV_SIZE).map(|b| [IoSliceMut::new(b)]).collect();
    let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(slices.len(), None);
    let fd = socket.as_raw_fd();
    let received = recvmmsg(fd, &mut headers, slices.iter_mut(), MsgFlags::MSG_DONTWAIT, None)?;
    let datagrams = received.enumerate().filter_map(|(index, m)| {
        let src = m.address.as_ref().and_then(to_std)?;
        Some(Received { index, len: m.bytes, src })
    });
    Ok(datagrams.collect())
}

fn to_std(addr: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = addr.as_sockaddr_in() {
        return Some(SocketAddr::V4(SocketAddrV4::from(*v4)));
    }
    addr.as_sockaddr_in6().map(|v6| SocketAddr::V6(SocketAddrV6::from(*v6)))
}

/// Sends every answer: in batches while the socket takes them, then one by one (waiting for
/// the socket) for whatever it did not take.
pub async fn send(socket: &UdpSocket, answers: &[(Vec<u8>, SocketAddr)]) {
    let mut sent = 0;
    while sent < answers.len() {
        let rest = answers.get(sent..).unwrap_or(&[]);
        let chunk = rest.get(..BATCH.min(rest.len())).unwrap_or(&[]);
        match socket.try_io(Interest::WRITABLE, || send_now(socket, chunk)) {
            Ok(0) | Err(_) => break,
            Ok(n) => sent += n,
        }
    }
    for (bytes, dst) in answers.get(sent..).unwrap_or(&[]) {
        if let Err(error) = socket.send_to(bytes, *dst).await {
            tracing::debug!(%dst, %error, "DNS UDP send failed");
        }
    }
}

fn send_now(socket: &UdpSocket, answers: &[(Vec<u8>, SocketAddr)]) -> io::Result<usize> {
    let slices: Vec<[IoSlice<'_>; 1]> = answers.iter().map(|(b, _)| [IoSlice::new(b)]).collect();
    let addrs: Vec<Option<SockaddrStorage>> =
        answers.iter().map(|(_, a)| Some(SockaddrStorage::from(*a))).collect();
    let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(answers.len(), None);
    let no_cmsgs: [ControlMessage<'_>; 0] = [];
    let fd = socket.as_raw_fd();
    let sent = sendmmsg(fd, &mut headers, &slices, addrs, no_cmsgs, MsgFlags::MSG_DONTWAIT)?;
    Ok(sent.count())
}
