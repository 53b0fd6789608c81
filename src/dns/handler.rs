//! What a request gets: the DNS semantics of polestar's zone, independent of the transport.
//!
//! [`Service::respond`] is called by the UDP loops and the TCP connections, each with its own
//! response sink. Both read the same immutable zone.

use std::iter;
use std::net::{IpAddr, SocketAddr};

use hickory_proto::op::{Edns, Header, HeaderCounts, LowerQuery, Metadata, OpCode, ResponseCode};
use hickory_proto::rr::{DNSClass, RData, Record, RecordType};
use hickory_server::net::xfer::Protocol;
use hickory_server::server::{Request, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use ipnet::IpNet;
use metrics::Counter;

use super::zone::{Answer, Zone, serial_gt};
use crate::metrics::DNS_QUERIES;

/// The UDP payload size polestar advertises and caps UDP answers at (DNS flag day 2020).
pub const UDP_PAYLOAD: u16 = 1232;

/// Records per message of a zone transfer: well under 64 KiB whatever the names.
const TRANSFER_CHUNK: usize = 100;

/// The response codes counted in `polestar_dns_queries_total{rcode}`.
const RCODES: [(ResponseCode, &str); 8] = [
    (ResponseCode::NoError, "NOERROR"),
    (ResponseCode::FormErr, "FORMERR"),
    (ResponseCode::ServFail, "SERVFAIL"),
    (ResponseCode::NXDomain, "NXDOMAIN"),
    (ResponseCode::NotImp, "NOTIMP"),
    (ResponseCode::Refused, "REFUSED"),
    (ResponseCode::NotAuth, "NOTAUTH"),
    (ResponseCode::BADVERS, "BADVERS"),
];

/// Decodes a request, or `None` for one that gets a header-only FORMERR. Besides what
/// hickory refuses, that is a question with a compression pointer: answers repeat the question
/// bytes as received, and a pointer into the request's header (or past the question) would
/// point at other bytes in the answer, making it undecodable. No client compresses its one
/// question; several questions are a FORMERR anyway.
pub fn decode(bytes: Vec<u8>, src: SocketAddr, protocol: Protocol) -> Option<Request> {
    let request = Request::from_bytes(bytes, src, protocol).ok()?;
    (!has_pointer(request.queries.as_bytes())).then_some(request)
}

/// Whether the wire form of a question section holds a compression pointer.
fn has_pointer(mut questions: &[u8]) -> bool {
    while let Some((&len, rest)) = questions.split_first() {
        match len {
            0 => questions = rest.get(4..).unwrap_or_default(), // QTYPE and QCLASS follow
            l if l & 0xc0 != 0 => return true,
            l => questions = rest.get(usize::from(l)..).unwrap_or_default(),
        }
    }
    false
}

/// Answers requests from a zone; shared by every listener.
pub struct Service {
    transfer_allow: Vec<IpNet>,
    /// The OPT record of every answer to an EDNS request.
    edns: Edns,
    /// One counter per entry of [`RCODES`], then one for any other code; registered once so
    /// a query does not look its counter up by name.
    counters: Vec<Counter>,
}

impl Service {
    pub fn new(transfer_allow: Vec<IpNet>) -> Self {
        let mut edns = Edns::new();
        edns.set_max_payload(UDP_PAYLOAD).set_version(0);
        let names = RCODES.iter().map(|(_, name)| *name).chain(iter::once("OTHER"));
        let counters = names.map(|n| metrics::counter!(DNS_QUERIES, "rcode" => n)).collect();
        Self { transfer_allow, edns, counters }
    }

    /// Answers `request` from `zone` through `handle` and counts the response code.
    pub async fn respond<R: ResponseHandler>(
        &self,
        zone: &Zone,
        request: &Request,
        handle: R,
    ) -> ResponseInfo {
        let info = self.dispatch(zone, request, handle).await;
        self.count(info.response_code);
        info
    }

    pub fn count(&self, code: ResponseCode) {
        let index = RCODES.iter().position(|(c, _)| *c == code).unwrap_or(RCODES.len());
        if let Some(counter) = self.counters.get(index) {
            counter.increment(1);
        }
    }

    async fn dispatch<R: ResponseHandler>(
        &self,
        zone: &Zone,
        request: &Request,
        handle: R,
    ) -> ResponseInfo {
        let reply = Reply { request, edns: request.edns.as_ref().map(|_| &self.edns) };
        if request.edns.as_ref().is_some_and(|e| e.version() > 0) {
            return reply.error(ResponseCode::BADVERS, handle).await;
        }
        if request.metadata.op_code != OpCode::Query {
            return reply.error(ResponseCode::NotImp, handle).await;
        }
        let [query] = request.queries.queries() else {
            return reply.error(ResponseCode::FormErr, handle).await;
        };
        if query.query_class() != DNSClass::IN {
            return reply.error(ResponseCode::Refused, handle).await;
        }
        match query.query_type() {
            RecordType::AXFR | RecordType::IXFR => self.transfer(zone, query, reply, handle).await,
            rtype => lookup(zone, query, rtype, reply, handle).await,
        }
    }

    /// Whether `ip` may transfer the zone (`dns.transfer_allow`).
    pub fn transfer_allowed(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.transfer_allow.iter().any(|net| net.contains(&ip))
    }

    /// AXFR, and IXFR answered with the full zone (RFC 1995 section 4) since polestar keeps no
    /// history; over UDP, IXFR gets the current SOA alone, which tells the client to use TCP.
    async fn transfer<R: ResponseHandler>(
        &self,
        zone: &Zone,
        query: &LowerQuery,
        reply: Reply<'_>,
        handle: R,
    ) -> ResponseInfo {
        if query.name() != zone.origin() {
            let code = if zone.contains(query.name()) {
                ResponseCode::NotAuth
            } else {
                ResponseCode::Refused
            };
            return reply.error(code, handle).await;
        }
        if !self.transfer_allowed(reply.request.src().ip()) {
            tracing::debug!(src = %reply.request.src(), "zone transfer refused");
            return reply.error(ResponseCode::Refused, handle).await;
        }
        let udp = reply.request.protocol() == Protocol::Udp;
        match query.query_type() {
            RecordType::AXFR if udp => reply.error(ResponseCode::FormErr, handle).await,
            RecordType::IXFR if udp || up_to_date(zone, reply.request) => {
                reply.send(ResponseCode::NoError, zone.soa(), &[], handle).await
            }
            _ => reply.stream_zone(zone, handle).await,
        }
    }
}

/// Whether an IXFR client already has the current serial (its SOA in the authority section).
fn up_to_date(zone: &Zone, request: &Request) -> bool {
    let serial = request.authorities.iter().find_map(|r| match &r.data {
        RData::SOA(soa) => Some(soa.serial),
        _ => None,
    });
    serial.is_some_and(|s| !serial_gt(zone.serial(), s))
}

async fn lookup<R: ResponseHandler>(
    zone: &Zone,
    query: &LowerQuery,
    rtype: RecordType,
    reply: Reply<'_>,
    handle: R,
) -> ResponseInfo {
    match zone.lookup(query.name(), rtype) {
        Answer::Records(records) => reply.send(ResponseCode::NoError, records, &[], handle).await,
        Answer::NoData => reply.send(ResponseCode::NoError, &[], zone.soa(), handle).await,
        Answer::NxDomain => reply.send(ResponseCode::NXDomain, &[], zone.soa(), handle).await,
        Answer::ServFail => reply.error(ResponseCode::ServFail, handle).await,
        Answer::Refused => reply.error(ResponseCode::Refused, handle).await,
    }
}

/// Builds and sends the response messages for one request.
#[derive(Clone, Copy)]
struct Reply<'q> {
    request: &'q Request,
    edns: Option<&'q Edns>,
}

impl<'q> Reply<'q> {
    fn metadata(&self, code: ResponseCode) -> Metadata {
        let mut metadata = Metadata::response_from_request(&self.request.metadata);
        metadata.authoritative = matches!(code, ResponseCode::NoError | ResponseCode::NXDomain);
        metadata.response_code = code;
        metadata
    }

    fn builder(&self) -> MessageResponseBuilder<'q> {
        let mut builder = MessageResponseBuilder::from_message_request(self.request);
        if let Some(edns) = self.edns {
            builder.edns(edns);
        }
        builder
    }

    async fn error<R: ResponseHandler>(self, code: ResponseCode, handle: R) -> ResponseInfo {
        self.send(code, &[], &[], handle).await
    }

    async fn send<R: ResponseHandler>(
        self,
        code: ResponseCode,
        answers: &[Record],
        authority: &[Record],
        mut handle: R,
    ) -> ResponseInfo {
        let none = iter::empty::<&Record>();
        let response =
            self.builder().build(self.metadata(code), answers, none, authority, iter::empty());
        match handle.send_response(response).await {
            Ok(info) => info,
            Err(error) => self.failed(&error),
        }
    }

    /// SOA, every record, SOA (RFC 5936), in messages of [`TRANSFER_CHUNK`] records.
    async fn stream_zone<R: ResponseHandler>(self, zone: &Zone, mut handle: R) -> ResponseInfo {
        let all: Vec<&Record> =
            zone.soa().iter().chain(zone.transfer_records()).chain(zone.soa()).collect();
        let mut last = None;
        for chunk in all.chunks(TRANSFER_CHUNK) {
            let none = iter::empty::<&Record>();
            let response = self.builder().build(
                self.metadata(ResponseCode::NoError),
                chunk.iter().copied(),
                none,
                iter::empty(),
                iter::empty(),
            );
            match handle.send_response(response).await {
                Ok(info) => last = Some(info),
                Err(error) => return self.failed(&error),
            }
        }
        last.unwrap_or_else(|| self.failed(&"empty zone transfer"))
    }

    /// What is reported when the response could not be sent.
    fn failed(&self, error: &dyn std::fmt::Display) -> ResponseInfo {
        tracing::debug!(src = %self.request.src(), %error, "failed to send DNS response");
        let metadata = self.metadata(ResponseCode::ServFail);
        ResponseInfo::from(Header { metadata, counts: HeaderCounts::default() })
    }
}
