//! When a subscriber's message arrived, as the kernel saw it: the software receive timestamp
//! (`SO_TIMESTAMPING`, `SOF_TIMESTAMPING_RX_SOFTWARE`) of the bytes a read returns, in Unix
//! milliseconds. On loopback the kernel stamps a segment as polestar's `write` hands it to the
//! receiving side, so the figure is polestar's: however late this (deliberately low-priority)
//! client gets round to reading, the stamp does not move.

use std::io::{self, IoSliceMut};
use std::os::fd::AsRawFd;

use nix::sys::socket::{
    ControlMessageOwned, MsgFlags, TimestampingFlag, recvmsg, setsockopt, sockopt,
};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Asks the kernel to stamp what `stream` receives.
pub fn enable(stream: &TcpStream) -> io::Result<()> {
    let flags = TimestampingFlag::SOF_TIMESTAMPING_RX_SOFTWARE
        | TimestampingFlag::SOF_TIMESTAMPING_SOFTWARE;
    setsockopt(stream, sockopt::Timestamping, &flags).map_err(io::Error::from)
}

/// Reads what is there: the byte count and the kernel's receive time of those bytes (Unix
/// ms), `None` when the kernel gave no stamp. `Ok((0, _))` at the end of the stream.
pub async fn read(stream: &TcpStream, buf: &mut [u8]) -> io::Result<(usize, Option<f64>)> {
    loop {
        stream.readable().await?;
        match stream.try_io(Interest::READABLE, || receive(stream, buf)) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

fn receive(stream: &TcpStream, buf: &mut [u8]) -> io::Result<(usize, Option<f64>)> {
    let mut iov = [IoSliceMut::new(buf)];
    let mut space = nix::cmsg_space!(nix::sys::socket::Timestamps);
    let fd = stream.as_raw_fd();
    let msg = recvmsg::<()>(fd, &mut iov, Some(&mut space), MsgFlags::MSG_DONTWAIT)
        .map_err(io::Error::from)?;
    let stamp = msg.cmsgs().map_err(io::Error::from)?.find_map(|c| match c {
        ControlMessageOwned::ScmTimestampsns(t) => Some(t.system),
        _ => None,
    });
    let ms = stamp.map(|t| t.tv_sec() as f64 * 1e3 + t.tv_nsec() as f64 / 1e6);
    Ok((msg.bytes, ms))
}
