//! DNS over TCP (RFC 7766): length-prefixed messages on a connection, answered in order
//! through the same [`Service`] as UDP, zone transfers included.
//!
//! Served here rather than by hickory-server's `Server`, whose accept loop has no cap on
//! connections and retries a failed `accept` at once: with the file descriptors exhausted by
//! a flood of idle connections it spun a core until they timed out. Here at most
//! [`MAX_CONNECTIONS`] are served at once (the rest wait in the listen backlog), an `accept`
//! error pauses the loop, and a connection that does not deliver a whole message within
//! [`IDLE_TIMEOUT`] (or does not take its answer within it) is closed.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Header, MessageType, ResponseCode};
use hickory_proto::rr::Record;
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};
use hickory_server::net::NetError;
use hickory_server::net::xfer::Protocol;
use hickory_server::server::{ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponse;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;

use super::handler::{self, Service};
use super::zone::Zone;

/// A client that sends no whole message (or reads no answer) for this long is disconnected.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once per listener.
pub const MAX_CONNECTIONS: usize = 1024;
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// Serves one listener until the task is dropped (which drops every connection with it).
pub async fn serve_listener(
    listener: TcpListener,
    service: Arc<Service>,
    zone: watch::Receiver<Arc<Zone>>,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    loop {
        // The semaphore is never closed: `None` cannot happen while `slots` lives.
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        match listener.accept().await {
            Ok((stream, src)) => {
                let (service, zone) = (service.clone(), zone.clone());
                connections.spawn(serve_connection(stream, src, service, zone, slot));
            }
            Err(error) => {
                tracing::debug!(%error, "DNS TCP accept failed");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
            }
        }
        while connections.try_join_next().is_some() {} // reap the finished ones
    }
}

async fn serve_connection(
    stream: TcpStream,
    src: SocketAddr,
    service: Arc<Service>,
    zone: watch::Receiver<Arc<Zone>>,
    _slot: OwnedSemaphorePermit,
) {
    let (mut reader, writer) = stream.into_split();
    let responder = TcpResponder { writer: Arc::new(Mutex::new(writer)) };
    while let Ok(Some(message)) = read_message(&mut reader).await {
        let zone = zone.borrow().clone();
        if !answer(&service, &zone, message, src, responder.clone()).await {
            return;
        }
    }
}

/// The next length-prefixed message; `None` at a clean end of the stream.
async fn read_message(reader: &mut OwnedReadHalf) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 2];
    let read = async {
        match reader.read_exact(&mut len).await {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            other => other?,
        };
        let mut message = vec![0u8; usize::from(u16::from_be_bytes(len))];
        reader.read_exact(&mut message).await?;
        Ok(Some(message))
    };
    tokio::time::timeout(IDLE_TIMEOUT, read).await.map_err(|_| io::ErrorKind::TimedOut)?
}

/// Answers one message; `false` when the connection should be closed (a message that is not
/// a query, or an answer that could not be written).
async fn answer(
    service: &Service,
    zone: &Zone,
    message: Vec<u8>,
    src: SocketAddr,
    responder: TcpResponder,
) -> bool {
    let Ok(header) = Header::read(&mut BinDecoder::new(&message)) else { return false };
    if header.metadata.message_type == MessageType::Response {
        return false;
    }
    match handler::decode(message, src, Protocol::Tcp) {
        Some(request) => {
            // A failed write is logged by the service; the next read then ends the connection.
            service.respond(zone, &request, responder).await;
            true
        }
        None => {
            service.count(ResponseCode::FormErr);
            let error = hickory_proto::op::Message::error_msg(
                header.metadata.id,
                header.metadata.op_code,
                ResponseCode::FormErr,
            );
            match error.to_vec() {
                Ok(bytes) => responder.write(&bytes).await.is_ok(),
                Err(_) => false,
            }
        }
    }
}

/// Writes each response message to the connection with its length prefix.
#[derive(Clone)]
struct TcpResponder {
    /// Shared by the answers of one connection, which are written in order.
    writer: Arc<Mutex<OwnedWriteHalf>>,
}

impl TcpResponder {
    async fn write(&self, bytes: &[u8]) -> io::Result<()> {
        let len = u16::try_from(bytes.len()).map_err(|_| io::ErrorKind::InvalidData)?;
        let mut writer = self.writer.lock().await;
        let write = async {
            writer.write_all(&len.to_be_bytes()).await?;
            writer.write_all(bytes).await
        };
        tokio::time::timeout(IDLE_TIMEOUT, write).await.map_err(|_| io::ErrorKind::TimedOut)?
    }
}

#[async_trait::async_trait]
impl ResponseHandler for TcpResponder {
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
        let (info, bytes) = super::udp::encode(response, u16::MAX)?;
        self.write(&bytes).await?;
        Ok(info)
    }
}
