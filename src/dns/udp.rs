//! The UDP fast path: one task per `SO_REUSEPORT` socket reads a batch of datagrams, decodes
//! each with hickory-server's `Request`, answers through [`Service`] and writes the replies
//! back in one batch, with no task spawned and no channel crossed per query.
//!
//! Garbage never gets further than the decoder: fewer than 12 bytes or the QR bit set is
//! dropped silently (no reflection), an undecodable body gets FORMERR.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use hickory_proto::ProtoError;
use hickory_proto::op::{Header, LowerQuery, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::{DNSClass, Record, RecordType};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder, BinEncoder};
use hickory_server::net::NetError;
use hickory_server::net::xfer::Protocol;
use hickory_server::server::{Request, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponse;
use tokio::net::UdpSocket;
use tokio::sync::watch;

use super::batch::{self, RecvBuffers};
use super::handler::{self, Service, UDP_PAYLOAD};
use super::rrl::{self, Class, Limiter, Verdict};
use super::zone::{Answer, Zone};
use crate::log_every::LogEvery;
use crate::metrics::{DNS_RATE_LIMIT_EVICTIONS, DNS_RATE_LIMITED};

/// Answers waiting to be sent at the end of the current batch. Only the socket's own task
/// touches it (the mutex is never contended); `ResponseHandler` requires `Send + Sync`.
type Outbox = Arc<Mutex<Vec<(Vec<u8>, SocketAddr)>>>;

const RECV_ERROR_PAUSE: std::time::Duration = std::time::Duration::from_millis(1);

/// Serves one socket until the task is dropped (the caller aborts it at shutdown).
pub async fn serve_socket(
    socket: Arc<UdpSocket>,
    service: Arc<Service>,
    mut zone_rx: watch::Receiver<Arc<Zone>>,
    rate_limit: rrl::Settings,
) {
    let mut zone = zone_rx.borrow_and_update().clone();
    let mut buffers = RecvBuffers::new();
    let outbox: Outbox = Arc::default();
    let mut rrl = RateLimit::new(rate_limit);
    loop {
        let batch = match batch::recv(&socket, &mut buffers).await {
            Ok(batch) => batch,
            Err(error) => {
                tracing::debug!(%error, "DNS UDP receive failed");
                tokio::time::sleep(RECV_ERROR_PAUSE).await; // never spin on a failing socket
                continue;
            }
        };
        // A cheap atomic check per batch; the zone is cloned only after a change.
        if zone_rx.has_changed().unwrap_or(false) {
            zone = zone_rx.borrow_and_update().clone();
        }
        let now = Instant::now();
        for datagram in batch {
            let packet = buffers.datagram(datagram.index, datagram.len);
            let rrl = Rrl { limit: &mut rrl, now };
            handle_packet(&outbox, &service, &zone, packet, datagram.src, rrl).await;
        }
        let answers = std::mem::take(&mut *lock(&outbox));
        batch::send(&socket, &answers).await;
    }
}

fn lock(outbox: &Outbox) -> std::sync::MutexGuard<'_, Vec<(Vec<u8>, SocketAddr)>> {
    // A panic while holding it cannot leave the list inconsistent: take it over.
    outbox.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn handle_packet(
    outbox: &Outbox,
    service: &Service,
    zone: &Zone,
    packet: &[u8],
    src: SocketAddr,
    rrl: Rrl<'_>,
) {
    let Ok(header) = Header::read(&mut BinDecoder::new(packet)) else { return };
    if header.metadata.message_type == MessageType::Response || src.port() == 0 {
        return;
    }
    match handler::decode(packet.to_vec(), src, Protocol::Udp) {
        Some(request) => match rrl.check(&request, zone) {
            Verdict::Answer => {
                let max_size = max_size(&request);
                let responder = UdpResponder { outbox: outbox.clone(), dst: src, max_size };
                service.respond(zone, &request, responder).await;
            }
            Verdict::Slip => {
                if let Some(bytes) = truncated(&header, &request) {
                    lock(outbox).push((bytes, src));
                }
            }
            Verdict::Drop => {}
        },
        None => {
            service.count(ResponseCode::FormErr);
            if let Some(bytes) = error_message(&header, ResponseCode::FormErr) {
                lock(outbox).push((bytes, src));
            }
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

/// The rate limiter of one socket with its counters.
pub(super) struct RateLimit {
    limiter: Limiter,
    slipped: metrics::Counter,
    dropped: metrics::Counter,
    evicted: metrics::Counter,
}

/// Every socket's limits, logged together once per interval.
static LIMITED: LogEvery = LogEvery::new();
static EVICTED: LogEvery = LogEvery::new();

impl RateLimit {
    pub(super) fn new(settings: rrl::Settings) -> Self {
        let counter = |action| metrics::counter!(DNS_RATE_LIMITED, "action" => action);
        let (slipped, dropped) = (counter("slip"), counter("drop"));
        let evicted = metrics::counter!(DNS_RATE_LIMIT_EVICTIONS);
        for c in [&slipped, &dropped, &evicted] {
            c.increment(0); // the series exist from the start
        }
        Self { limiter: Limiter::new(settings, Instant::now()), slipped, dropped, evicted }
    }

    fn check(&mut self, client: std::net::IpAddr, class: Class<'_>, now: Instant) -> Verdict {
        let checked = self.limiter.check(client, class, now);
        if checked.evicted {
            self.evicted.increment(1);
            if let Some(n) = EVICTED.hit(now) {
                tracing::warn!(
                    keys_forgotten = n,
                    "DNS rate-limit table full: oldest keys forgotten (answered as new)"
                );
            }
        }
        let counter = match checked.verdict {
            Verdict::Answer => return Verdict::Answer,
            Verdict::Slip => &self.slipped,
            Verdict::Drop => &self.dropped,
        };
        counter.increment(1);
        if let Some(n) = LIMITED.hit(now) {
            tracing::info!(%client, limited = n, "DNS UDP answers past dns.rate_limit (sent truncated per dns.rate_limit_slip)");
        }
        checked.verdict
    }
}

/// The rate limit of one socket, and the time of the batch being answered.
struct Rrl<'a> {
    limit: &'a mut RateLimit,
    now: Instant,
}

impl Rrl<'_> {
    fn check(self, request: &Request, zone: &Zone) -> Verdict {
        match request.queries.queries() {
            [query] => {
                self.limit.check(request.src().ip(), class_of(request, query, zone), self.now)
            }
            _ => Verdict::Answer, // FORMERR, as small as the query
        }
    }
}

/// What the answer to `query` is limited as: looked up in the zone as the answer will be.
fn class_of<'q>(request: &Request, query: &'q LowerQuery, zone: &Zone) -> Class<'q> {
    let (name, rtype) = (query.name(), query.query_type());
    let query_in = request.metadata.op_code == OpCode::Query && query.query_class() == DNSClass::IN;
    if !query_in || matches!(rtype, RecordType::AXFR | RecordType::IXFR) {
        return Class::Error;
    }
    match zone.lookup(name, rtype) {
        Answer::Records(_) | Answer::ServFail => Class::Records(name, rtype),
        Answer::NoData => Class::NoData(name),
        Answer::NxDomain => Class::NxDomain,
        Answer::Refused => Class::Error,
    }
}

/// The answer slipped past the rate: the question alone with TC set, no larger than the
/// query, which tells a real resolver to ask again over TCP.
fn truncated(header: &Header, request: &Request) -> Option<Vec<u8>> {
    let [query] = request.queries.queries() else { return None };
    let mut message = Message::response(header.metadata.id, header.metadata.op_code);
    message.metadata.truncation = true;
    message.metadata.authoritative = true;
    message.metadata.recursion_desired = header.metadata.recursion_desired;
    message.add_query(query.original().clone());
    message.to_vec().ok()
}

/// A header-only error response, for requests hickory could not decode.
fn error_message(header: &Header, code: ResponseCode) -> Option<Vec<u8>> {
    Message::error_msg(header.metadata.id, header.metadata.op_code, code).to_vec().ok()
}

/// Queues one response datagram for the client, truncated (TC) to what the client accepts.
#[derive(Clone)]
struct UdpResponder {
    outbox: Outbox,
    dst: SocketAddr,
    max_size: u16,
}

/// Encodes a response into at most `max_size` bytes (truncating, with TC, beyond that); the
/// one encoder of both transports.
pub(super) fn encode<'a>(
    response: MessageResponse<
        '_,
        'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
    >,
    max_size: u16,
) -> Result<(ResponseInfo, Vec<u8>), ProtoError> {
    let mut bytes = Vec::with_capacity(512);
    let mut encoder = BinEncoder::new(&mut bytes);
    encoder.set_max_size(max_size);
    let info = response.destructive_emit(&mut encoder)?;
    Ok((info, bytes))
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
        let (info, bytes) = encode(response, self.max_size)?;
        lock(&self.outbox).push((bytes, self.dst));
        Ok(info)
    }
}

#[cfg(test)]
mod fuzz;
