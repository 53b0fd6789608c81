//! DNS over TCP (RFC 7766): length-prefixed messages on a connection, answered in order
//! through the same [`Service`] as UDP, zone transfers included.
//!
//! Served here rather than by hickory-server's `Server`, whose accept loop has no cap on
//! connections and retries a failed `accept` at once: with the file descriptors exhausted by
//! a flood of idle connections it spun a core until they timed out. Here:
//!
//! - at most [`MAX_CONNECTIONS`] are served at once, [`CONNECTIONS_PER_CLIENT`] per client,
//!   and [`TRANSFER_CONNECTIONS`] more are kept for the `dns.transfer_allow` addresses, so
//!   that secondaries can always AXFR;
//! - a connection past its client's share waits up to [`SLOT_WAIT`] for one of that client's
//!   connections to end ([`QUEUED_PER_CLIENT`] of them at once, [`QUEUED`] in all) rather
//!   than being closed: a fleet behind one NAT address whose truncated answers all come back
//!   over TCP at once (a reconnect storm past `dns.rate_limit`) is answered in turn, since
//!   each of its connections lasts one query; a host that holds its connections open gains
//!   nothing by it (its queued ones are closed after [`SLOT_WAIT`]);
//! - a connection closes when idle for [`IDLE_TIMEOUT`], when a message once begun does not
//!   arrive whole within [`MESSAGE_TIMEOUT`], or when it does not take its answer within
//!   [`IDLE_TIMEOUT`];
//! - when every slot is taken, the idle connections are closed at once to make room for the
//!   new one (RFC 7766 section 6.2.3: under pressure, close idle connections), which waits
//!   up to [`SLOT_WAIT`] for a slot: clients that hold connections open by sending a query
//!   now and then cannot lock out new ones;
//! - an `accept` error pauses the loop;
//! - every connection closed unserved is counted (`polestar_dns_tcp_refused_total{reason}`)
//!   and logged once per interval.

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
use crate::limits::{ClientShare, Clients};
use crate::log_every::LogEvery;

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
/// Connections waiting for their client's share at once, in all and per client; past that a
/// new one is closed. A storm of 500 stubs behind one address sends about 400 (the answers
/// past the rate limit).
pub const QUEUED: usize = 1024;
pub const QUEUED_PER_CLIENT: usize = 512;
/// A connection that has not yet sent a first message is not shed this soon after it came.
const FIRST_MESSAGE_GRACE: Duration = Duration::from_millis(500);
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// The slots of one listener.
struct Slots {
    shared: Arc<Semaphore>,
    transfer: Arc<Semaphore>,
    waiting: Arc<Semaphore>,
    clients: Clients,
    waiting_clients: Clients,
    queued: Arc<Semaphore>,
    queued_clients: Clients,
    /// Bumped when every shared slot is taken; the idle connections of the shared pool hold
    /// receivers and close on a bump.
    shed: watch::Sender<u64>,
}

/// What a connection holds while it is served; dropping it frees its slots.
struct Held {
    _slot: OwnedSemaphorePermit,
    _client: ClientShare,
    /// `None` for a secondary's reserved slot, which is never shed.
    shed: Option<watch::Receiver<u64>>,
}

/// Why a connection was closed unserved (the `reason` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refused {
    /// Past its client's share, with too many of that client's (or of all) already queued, or
    /// none of its client's connections ended within [`SLOT_WAIT`].
    PerClient,
    /// Every slot taken, with too many waiting already, or none freed within [`SLOT_WAIT`].
    Full,
}

impl Refused {
    const ALL: [Refused; 2] = [Refused::PerClient, Refused::Full];

    fn as_str(self) -> &'static str {
        match self {
            Refused::PerClient => "per_client",
            Refused::Full => "full",
        }
    }
}

/// Counts one connection closed unserved and logs it once per interval.
fn refused(reason: Refused) {
    static PER_CLIENT: LogEvery = LogEvery::new();
    static FULL: LogEvery = LogEvery::new();
    metrics::counter!(crate::metrics::DNS_TCP_REFUSED, "reason" => reason.as_str()).increment(1);
    let (every, what) = match reason {
        Refused::PerClient => (&PER_CLIENT, "a DNS TCP client past its share of connections"),
        Refused::Full => (&FULL, "every DNS TCP connection taken"),
    };
    if let Some(hits) = every.hit(std::time::Instant::now()) {
        tracing::warn!(reason = reason.as_str(), hits, "{what}: a new connection closed unserved");
    }
}

/// Serves one listener until the task is dropped (which drops every connection with it).
pub async fn serve_listener(
    listener: TcpListener,
    service: Arc<Service>,
    zone: watch::Receiver<Arc<Zone>>,
) {
    for reason in Refused::ALL {
        metrics::counter!(crate::metrics::DNS_TCP_REFUSED, "reason" => reason.as_str())
            .increment(0);
    }
    let slots = Arc::new(Slots {
        shared: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
        transfer: Arc::new(Semaphore::new(TRANSFER_CONNECTIONS)),
        waiting: Arc::new(Semaphore::new(WAITING)),
        clients: Clients::new(CONNECTIONS_PER_CLIENT),
        waiting_clients: Clients::new(WAITING_PER_CLIENT),
        queued: Arc::new(Semaphore::new(QUEUED)),
        queued_clients: Clients::new(QUEUED_PER_CLIENT),
        shed: watch::channel(0).0,
    });
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

/// A connection's share of its client's connections: now, or once one of them ends.
enum Share {
    Now(ClientShare),
    /// Queued (holding its places in the queue) for one of its client's to end.
    Queued(OwnedSemaphorePermit, ClientShare),
}

/// The slot a new connection from `src` is to be served in, or `None` (the connection is
/// closed, counted and logged) when too many wait already. The future waits for its client's
/// share when the client holds it, then for a shared slot when every one is taken (after
/// asking the idle connections to close); it is `None` when either wait runs out.
fn admit(
    slots: &Arc<Slots>,
    service: &Service,
    src: SocketAddr,
) -> Option<impl Future<Output = Option<Held>> + Send + 'static> {
    let ip = src.ip();
    let share = match slots.clients.admit(ip) {
        Some(share) => Share::Now(share),
        None => {
            let place = slots.queued_clients.admit(ip);
            let queued = place.zip(slots.queued.clone().try_acquire_owned().ok());
            let Some((place, queued)) = queued else {
                refused(Refused::PerClient);
                return None;
            };
            Share::Queued(queued, place)
        }
    };
    let transfer = service.transfer_allowed(ip);
    let slots = slots.clone();
    Some(async move {
        let client = match share {
            Share::Now(share) => share,
            Share::Queued(_queued, _place) => {
                let share = slots.clients.admit_within(ip, SLOT_WAIT).await;
                share.or_else(|| {
                    refused(Refused::PerClient);
                    None
                })?
            }
        };
        slot(&slots, transfer, ip, client).await
    })
}

/// The slot for a connection that has its client's share: a secondary's reserved one, a free
/// shared one, or the first shared one freed within [`SLOT_WAIT`] after the idle connections
/// were asked to close.
async fn slot(
    slots: &Slots,
    transfer: bool,
    ip: std::net::IpAddr,
    client: ClientShare,
) -> Option<Held> {
    if transfer && let Ok(slot) = slots.transfer.clone().try_acquire_owned() {
        return Some(Held { _slot: slot, _client: client, shed: None });
    }
    let mut shed = slots.shed.subscribe();
    let slot = match slots.shared.clone().try_acquire_owned() {
        Ok(slot) => slot,
        Err(_) => {
            let share = slots.waiting_clients.admit(ip);
            let waiting = share.zip(slots.waiting.clone().try_acquire_owned().ok());
            if waiting.is_none() {
                refused(Refused::Full);
                return None;
            }
            slots.shed.send_modify(|generation| *generation += 1);
            let slot = tokio::time::timeout(SLOT_WAIT, slots.shared.clone().acquire_owned()).await;
            drop(waiting);
            match slot {
                Ok(Ok(slot)) => slot,
                _ => {
                    refused(Refused::Full);
                    return None;
                }
            }
        }
    };
    shed.mark_unchanged(); // only pressure from now on concerns it
    Some(Held { _slot: slot, _client: client, shed: Some(shed) })
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
