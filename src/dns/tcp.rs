//! DNS over TCP (RFC 7766): length-prefixed messages on a connection, answered in order
//! through the same [`Service`] as UDP, zone transfers included.
//!
//! Served here rather than by hickory-server's `Server`, whose accept loop has no cap on
//! connections and retries a failed `accept` at once: with the file descriptors exhausted by
//! a flood of idle connections it spun a core until they timed out. Here:
//!
//! - at most [`MAX_CONNECTIONS`] are served at once, [`CONNECTIONS_PER_CLIENT`] per client
//!   (past that a new connection is closed), and [`TRANSFER_CONNECTIONS`] more are kept for
//!   the `dns.transfer_allow` addresses, so that secondaries can always AXFR;
//! - a connection closes when idle for [`IDLE_TIMEOUT`], when a message once begun does not
//!   arrive whole within [`MESSAGE_TIMEOUT`], or when it does not take its answer within
//!   [`IDLE_TIMEOUT`];
//! - when every slot is taken, the idle connections are closed at once to make room for the
//!   new one (RFC 7766 section 6.2.3: under pressure, close idle connections), which waits
//!   up to [`SLOT_WAIT`] for a slot: clients that hold connections open by sending a query
//!   now and then cannot lock out new ones;
//! - an `accept` error pauses the loop.

use std::future::Future;
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

/// A client that sends nothing (or reads no answer) for this long is disconnected.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// A message whose first byte has arrived must arrive whole within this.
pub const MESSAGE_TIMEOUT: Duration = Duration::from_secs(2);
/// Connections served at once per listener, shared by every client.
pub const MAX_CONNECTIONS: usize = 1024;
/// Connections per listener kept for the `dns.transfer_allow` addresses (secondaries).
pub const TRANSFER_CONNECTIONS: usize = 32;
/// Connections one client (an IPv4 address, an IPv6 /64) holds at once per listener.
pub const CONNECTIONS_PER_CLIENT: usize = 32;
/// How long a new connection waits for the slot of an idle one closed to make room.
pub const SLOT_WAIT: Duration = Duration::from_secs(3);
/// New connections waiting so at once, and per client; past that a new one is closed.
const WAITING: usize = 256;
const WAITING_PER_CLIENT: usize = 1;
/// A connection that has not yet sent a first message is not shed this soon after it came.
const FIRST_MESSAGE_GRACE: Duration = Duration::from_millis(500);
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// The slots of one listener.
struct Slots {
    shared: Arc<Semaphore>,
    transfer: Arc<Semaphore>,
    waiting: Arc<Semaphore>,
    clients: crate::limits::Clients,
    waiting_clients: crate::limits::Clients,
    /// Bumped when every shared slot is taken; the idle connections of the shared pool hold
    /// receivers and close on a bump.
    shed: watch::Sender<u64>,
}

/// What a connection holds while it is served; dropping it frees its slots.
struct Held {
    _slot: OwnedSemaphorePermit,
    _client: crate::limits::ClientShare,
    /// `None` for a secondary's reserved slot, which is never shed.
    shed: Option<watch::Receiver<u64>>,
}

/// Serves one listener until the task is dropped (which drops every connection with it).
pub async fn serve_listener(
    listener: TcpListener,
    service: Arc<Service>,
    zone: watch::Receiver<Arc<Zone>>,
) {
    let slots = Slots {
        shared: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
        transfer: Arc::new(Semaphore::new(TRANSFER_CONNECTIONS)),
        waiting: Arc::new(Semaphore::new(WAITING)),
        clients: crate::limits::Clients::new(CONNECTIONS_PER_CLIENT),
        waiting_clients: crate::limits::Clients::new(WAITING_PER_CLIENT),
        shed: watch::channel(0).0,
    };
    let mut connections = JoinSet::new();
    loop {
        match listener.accept().await {
            Ok((stream, src)) => {
                let (service, zone) = (service.clone(), zone.clone());
                if let Some(admitted) = admit(&slots, &service, src) {
                    connections.spawn(async move {
                        let Some(held) = admitted.await else { return };
                        serve_connection(stream, src, service, zone, held).await;
                    });
                }
            }
            Err(error) => {
                tracing::debug!(%error, "DNS TCP accept failed");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
            }
        }
        while connections.try_join_next().is_some() {} // reap the finished ones
    }
}

/// The slot a new connection from `src` is to be served in, or `None` (the connection is
/// closed) when its client holds its share or too many wait. The future waits for a shared
/// slot when every one is taken, after asking the idle connections to close.
fn admit(
    slots: &Slots,
    service: &Service,
    src: SocketAddr,
) -> Option<impl Future<Output = Option<Held>> + Send + 'static> {
    let client = slots.clients.admit(src.ip())?;
    if service.transfer_allowed(src.ip())
        && let Ok(slot) = slots.transfer.clone().try_acquire_owned()
    {
        let held = Held { _slot: slot, _client: client, shed: None };
        return Some(futures::future::Either::Left(std::future::ready(Some(held))));
    }
    let shed = slots.shed.subscribe();
    let shared = slots.shared.clone();
    let ready = shared.clone().try_acquire_owned().ok();
    let waiting = match ready {
        Some(_) => None,
        None => {
            let share = slots.waiting_clients.admit(src.ip())?;
            let waiting = slots.waiting.clone().try_acquire_owned().ok()?;
            slots.shed.send_modify(|generation| *generation += 1);
            Some((waiting, share))
        }
    };
    Some(futures::future::Either::Right(async move {
        let slot = match ready {
            Some(slot) => slot,
            None => {
                let slot = tokio::time::timeout(SLOT_WAIT, shared.acquire_owned()).await;
                drop(waiting);
                slot.ok()?.ok()?
            }
        };
        let mut shed = shed;
        shed.mark_unchanged(); // only pressure from now on concerns it
        Some(Held { _slot: slot, _client: client, shed: Some(shed) })
    }))
}

async fn serve_connection(
    stream: TcpStream,
    src: SocketAddr,
    service: Arc<Service>,
    zone: watch::Receiver<Arc<Zone>>,
    mut held: Held,
) {
    let (mut reader, writer) = stream.into_split();
    let responder = TcpResponder { writer: Arc::new(Mutex::new(writer)) };
    let connected = tokio::time::Instant::now();
    let mut answered = false;
    loop {
        if !idle(&mut reader, &mut held, connected, answered).await {
            return;
        }
        let Ok(Some(message)) = read_message(&mut reader).await else { return };
        answered = true;
        let zone = zone.borrow().clone();
        if !answer(&service, &zone, message, src, responder.clone()).await {
            return;
        }
    }
}

/// Waits until the next message begins (`true`), or the idle timeout passes or pressure on
/// the slots sheds the connection (`false`). A connection is shed once it has had its
/// chance: an answer, or [`FIRST_MESSAGE_GRACE`] to send a first message.
async fn idle(
    reader: &mut OwnedReadHalf,
    held: &mut Held,
    connected: tokio::time::Instant,
    answered: bool,
) -> bool {
    let idle = tokio::time::sleep(IDLE_TIMEOUT);
    tokio::pin!(idle);
    loop {
        let shed = async {
            match held.shed.as_mut() {
                Some(shed) => shed.changed().await.is_ok(),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            ready = reader.readable() => return ready.is_ok(),
            () = &mut idle => return false,
            true = shed => {
                if answered || connected.elapsed() >= FIRST_MESSAGE_GRACE {
                    return false;
                }
            }
        }
    }
}

/// The next length-prefixed message, which must arrive within [`MESSAGE_TIMEOUT`]; `None` at
/// a clean end of the stream.
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
    tokio::time::timeout(MESSAGE_TIMEOUT, read).await.map_err(|_| io::ErrorKind::TimedOut)?
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
