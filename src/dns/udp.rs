//! The UDP fast path: one task per `SO_REUSEPORT` socket reads a datagram, decodes it with
//! hickory-server's `Request`, answers through [`Service`] and writes the reply straight back,
//! with no task spawned and no channel crossed per query.
//!
//! Garbage never gets further than the decoder: fewer than 12 bytes or the QR bit set is
//! dropped silently (no reflection), an undecodable body gets FORMERR.

use std::net::SocketAddr;
use std::sync::Arc;

use hickory_proto::ProtoError;
use hickory_proto::op::{Header, Message, MessageType, ResponseCode};
use hickory_proto::rr::Record;
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder, BinEncoder};
use hickory_server::net::NetError;
use hickory_server::net::xfer::Protocol;
use hickory_server::server::{Request, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponse;
use tokio::net::UdpSocket;
use tokio::sync::watch;

use super::handler::{Service, UDP_PAYLOAD};
use super::zone::Zone;

/// Larger requests than this are not DNS queries polestar answers; they are cut and then fail
/// to decode (FORMERR).
const RECV_BUFFER: usize = 4096;

/// Serves one socket until the task is dropped (the caller races it against shutdown).
pub async fn serve_socket(
    socket: Arc<UdpSocket>,
    service: Arc<Service>,
    mut zone_rx: watch::Receiver<Arc<Zone>>,
) {
    let mut zone = zone_rx.borrow_and_update().clone();
    let mut buf = vec![0u8; RECV_BUFFER];
    loop {
        let (len, src) = match socket.recv_from(&mut buf).await {
            Ok(received) => received,
            Err(error) => {
                tracing::debug!(%error, "DNS UDP receive failed");
                continue;
            }
        };
        // A cheap atomic check per packet; the zone is cloned only after a change.
        if zone_rx.has_changed().unwrap_or(false) {
            zone = zone_rx.borrow_and_update().clone();
        }
        let Some(packet) = buf.get(..len) else { continue };
        handle_packet(&socket, &service, &zone, packet, src).await;
    }
}

async fn handle_packet(
    socket: &Arc<UdpSocket>,
    service: &Service,
    zone: &Zone,
    packet: &[u8],
    src: SocketAddr,
) {
    let Ok(header) = Header::read(&mut BinDecoder::new(packet)) else { return };
    if header.metadata.message_type == MessageType::Response || src.port() == 0 {
        return;
    }
    match Request::from_bytes(packet.to_vec(), src, Protocol::Udp) {
        Ok(request) => {
            let responder =
                UdpResponder { socket: socket.clone(), dst: src, max_size: max_size(&request) };
            service.respond(zone, &request, responder).await;
        }
        Err(_) => {
            service.count(ResponseCode::FormErr);
            send_error(socket, &header, ResponseCode::FormErr, src).await;
        }
    }
}

/// The largest answer this client accepts over UDP: 512 without EDNS (RFC 1035), otherwise
/// its advertised size capped at ours.
fn max_size(request: &Request) -> u16 {
    match &request.edns {
        Some(_) => request.max_payload().min(UDP_PAYLOAD),
        None => 512,
    }
}

/// A header-only error response, for requests hickory could not decode.
async fn send_error(socket: &UdpSocket, header: &Header, code: ResponseCode, dst: SocketAddr) {
    let message = Message::error_msg(header.metadata.id, header.metadata.op_code, code);
    if let Ok(bytes) = message.to_vec() {
        let _ = socket.send_to(&bytes, dst).await;
    }
}

/// Sends one response datagram to the client, truncated (TC) to what the client accepts.
#[derive(Clone)]
struct UdpResponder {
    socket: Arc<UdpSocket>,
    dst: SocketAddr,
    max_size: u16,
}

impl UdpResponder {
    fn encode<'a>(
        &self,
        response: MessageResponse<
            '_,
            'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
        >,
    ) -> Result<(ResponseInfo, Vec<u8>), ProtoError> {
        let mut bytes = Vec::with_capacity(512);
        let mut encoder = BinEncoder::new(&mut bytes);
        encoder.set_max_size(self.max_size);
        let info = response.destructive_emit(&mut encoder)?;
        Ok((info, bytes))
    }
}

#[async_trait::async_trait]
impl ResponseHandler for UdpResponder {
    async fn send_response<'a>(
        &mut self,
        response: MessageResponse<
            '_,
            'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
        >,
    ) -> Result<ResponseInfo, NetError> {
        let (info, bytes) = self.encode(response)?;
        self.socket.send_to(&bytes, self.dst).await?;
        Ok(info)
    }
}
