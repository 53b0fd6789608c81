//! NOTIFY (RFC 1996) to every `dns.notify` target after each change of the zone, so standard
//! secondaries (BIND, Knot, NSD) transfer the new version at once instead of at their refresh.
//!
//! One task per target: it sends NOTIFY for the newest serial and resends every
//! [`RETRY_INTERVAL`] until the target answers or [`ATTEMPTS`] are spent; a newer change
//! restarts the cycle with the newer serial.

use std::hash::{BuildHasher, RandomState};
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::{DNSClass, Name, RecordType};
use tokio::net::UdpSocket;
use tokio::sync::watch;
use tokio::time::{Instant, timeout_at};

use super::zone::Zone;

pub const RETRY_INTERVAL: Duration = Duration::from_secs(1);
pub const ATTEMPTS: usize = 5;

/// Notifies `target` of the current zone (secondaries learn of a restart too) and of every
/// change after it, until the zone sender is dropped.
pub async fn notify_target(target: SocketAddr, mut zone_rx: watch::Receiver<Arc<Zone>>) {
    loop {
        let zone = zone_rx.borrow_and_update().clone();
        let next = tokio::select! {
            acked = notify_until_acked(target, &zone) => {
                log_outcome(target, &zone, acked);
                zone_rx.changed().await
            }
            // A newer version arrived first: notify that one instead.
            changed = zone_rx.changed() => changed,
        };
        if next.is_err() {
            return;
        }
    }
}

fn log_outcome(target: SocketAddr, zone: &Zone, acked: io::Result<bool>) {
    match acked {
        Ok(true) => tracing::debug!(%target, serial = zone.serial(), "NOTIFY acknowledged"),
        Ok(false) => {
            tracing::warn!(%target, serial = zone.serial(), "NOTIFY not acknowledged after {ATTEMPTS} attempts")
        }
        Err(error) => tracing::warn!(%target, %error, "cannot send NOTIFY"),
    }
}

/// Sends NOTIFY up to [`ATTEMPTS`] times; `Ok(true)` once the target answered it.
async fn notify_until_acked(target: SocketAddr, zone: &Zone) -> io::Result<bool> {
    let socket = UdpSocket::bind(unspecified_for(target)).await?;
    socket.connect(target).await?;
    for _ in 0..ATTEMPTS {
        let id = random_id();
        socket.send(&notify_message(zone, id)?).await?;
        if wait_for_ack(&socket, id, Instant::now() + RETRY_INTERVAL).await {
            return Ok(true);
        }
    }
    Ok(false)
}

fn unspecified_for(target: SocketAddr) -> SocketAddr {
    match target {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    }
}

/// The NOTIFY for the zone's current SOA (carried in the answer section, RFC 1996 3.7).
pub fn notify_message(zone: &Zone, id: u16) -> io::Result<Vec<u8>> {
    let mut message = Message::new(id, MessageType::Query, OpCode::Notify);
    message.metadata.authoritative = true;
    let mut query = Query::query(Name::from(zone.origin().clone()), RecordType::SOA);
    query.set_query_class(DNSClass::IN);
    message.add_query(query);
    message.add_answers(zone.soa().iter().cloned());
    message.to_vec().map_err(io::Error::other)
}

/// Waits until `deadline` for a response to NOTIFY `id`; any response code counts as an
/// answer (a refusal will not change by resending).
async fn wait_for_ack(socket: &UdpSocket, id: u16, deadline: Instant) -> bool {
    let mut buf = [0u8; 512];
    while let Ok(received) = timeout_at(deadline, socket.recv(&mut buf)).await {
        let Ok(len) = received else { continue };
        let Some(reply) = buf.get(..len).and_then(|b| Message::from_vec(b).ok()) else { continue };
        let m = &reply.metadata;
        if m.id == id && m.message_type == MessageType::Response && m.op_code == OpCode::Notify {
            if m.response_code != hickory_proto::op::ResponseCode::NoError {
                tracing::warn!(target = ?socket.peer_addr().ok(), rcode = %m.response_code, "NOTIFY answered with an error");
            }
            return true;
        }
    }
    false
}

fn random_id() -> u16 {
    RandomState::new().hash_one(std::time::SystemTime::now()) as u16
}
