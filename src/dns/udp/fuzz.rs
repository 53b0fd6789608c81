//! Property tests of the DNS request path, from the bytes of a datagram to the bytes of the
//! answer: arbitrary bytes and mutated valid queries (names in and out of the zone, every
//! type and class, EDNS versions and sizes, several questions, other opcodes) go through the
//! same `handle_packet` the UDP loop uses. Every datagram that is a query gets exactly one
//! answer, which decodes, is a response with the query's id, fits what the client accepts
//! and repeats a decodable question; responses and runts get none (no reflection).
#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Edns, Message, MessageType, Query, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RecordType};
use proptest::prelude::*;

use super::super::zone::{Zone, ZoneSettings};
use super::*;
use crate::config;
use crate::topology::{Master, MasterState, Node, Replica, SentinelCounts, Snapshot};

fn cases(default: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok());
    ProptestConfig { cases: cases.unwrap_or(default), ..ProptestConfig::default() }
}

const ZONE: &str = "redis.internal.";

fn master(label: &str, primary: Option<&str>, replicas: usize) -> Master {
    Master {
        withdrawn: None,
        provisional: false,
        name: label.to_string(),
        label: label.to_string(),
        primary: primary.map(|ip| Node { ip: ip.parse().unwrap(), port: 6379, hostname: None }),
        epoch: Some(3),
        since: None,
        state: if primary.is_some() { MasterState::Ok } else { MasterState::Unknown },
        replicas: (0..replicas)
            .map(|i| Replica {
                ip: std::net::Ipv4Addr::from(0x0a00_0000 + i as u32).into(),
                port: 6379,
                hostname: None,
                healthy: true,
                down: false,
            })
            .collect(),
        sentinels: SentinelCounts::default(),
    }
}

/// A zone with a plain master, an IPv6 one, one without a primary and one whose replicas do
/// not fit in 512 bytes.
fn zone() -> Zone {
    let masters = [
        master("cache", Some("10.0.0.1"), 2),
        master("six", Some("fd00::1"), 0),
        master("lost", None, 0),
        master("big", Some("10.0.0.2"), 120),
    ];
    let masters: BTreeMap<_, _> =
        masters.into_iter().map(|m| (m.name.clone(), Arc::new(m))).collect();
    let snapshot = Snapshot { version: 1, masters, source_reachable: true };
    let cfg = config::Dns {
        listen: vec![],
        zone: ZONE.into(),
        ttl: Duration::from_secs(1),
        nameservers: vec!["ns1.redis.internal.".into()],
        transfer_allow: vec!["127.0.0.1/32".parse().unwrap()],
        notify: vec![],
        rate_limit: crate::config::DEFAULT_RATE_LIMIT,
        replica_max_lag: None,
        rate_limit_slip: crate::config::DEFAULT_SLIP,
    };
    Zone::build(&snapshot, &ZoneSettings::from_config(&cfg).unwrap(), 7)
}

fn qname() -> impl Strategy<Value = Name> {
    let known = prop::sample::select(vec![
        "redis.internal.",
        "cache.redis.internal.",
        "CaChE.ReDiS.InTeRnAl.",
        "_redis._tcp.cache.redis.internal.",
        "_tcp.cache.redis.internal.",
        "replicas.big.redis.internal.",
        "six.redis.internal.",
        "lost.redis.internal.",
        "nope.redis.internal.",
        "a.b.c.cache.redis.internal.",
        "internal.",
        ".",
        "example.com.",
    ])
    .prop_map(|n| Name::from_ascii(n).unwrap());
    let random = prop::collection::vec(prop::collection::vec(any::<u8>(), 1..20), 0..6)
        .prop_filter_map("a valid name", |labels| {
            Name::from_labels(labels)
                .ok()
                .and_then(|n| n.append_domain(&Name::from_ascii(ZONE).ok()?).ok())
        });
    prop_oneof![4 => known, 1 => random]
}

fn rtype() -> impl Strategy<Value = RecordType> {
    prop_oneof![
        4 => prop::sample::select(vec![
            RecordType::A, RecordType::AAAA, RecordType::TXT, RecordType::SRV, RecordType::SOA,
            RecordType::NS, RecordType::ANY, RecordType::AXFR, RecordType::IXFR, RecordType::MX,
            RecordType::OPT,
        ]),
        1 => any::<u16>().prop_map(RecordType::from),
    ]
}

#[derive(Clone, Debug)]
struct Shape {
    id: u16,
    questions: Vec<(Name, RecordType, u16)>,
    edns: Option<(u8, u16)>,
    /// Header byte 2 (QR, opcode, AA, TC, RD) and byte 3 (RA, Z, AD, CD, rcode), or-ed in.
    flags: (u8, u8),
    /// Bytes to flip (offset, mask) and where to cut, applied after encoding.
    flips: Vec<(usize, u8)>,
    cut: Option<usize>,
}

fn shape() -> impl Strategy<Value = Shape> {
    let class = prop_oneof![4 => Just(1u16), 1 => any::<u16>()];
    (
        any::<u16>(),
        prop::collection::vec((qname(), rtype(), class), 0..3),
        prop::option::of((prop_oneof![4 => Just(0u8), 1 => any::<u8>()], any::<u16>())),
        prop_oneof![4 => Just((0u8, 0u8)), 1 => (any::<u8>(), any::<u8>())],
        prop_oneof![3 => Just(vec![]), 1 => prop::collection::vec((any::<usize>(), 1u8..), 1..4)],
        prop_oneof![4 => Just(None), 1 => any::<usize>().prop_map(Some)],
    )
        .prop_map(|(id, questions, edns, flags, flips, cut)| Shape {
            id,
            questions,
            edns,
            flags,
            flips,
            cut,
        })
}

fn encode(shape: &Shape) -> Vec<u8> {
    let mut msg = Message::new(shape.id, MessageType::Query, hickory_proto::op::OpCode::Query);
    for (name, rtype, class) in &shape.questions {
        let mut q = Query::query(name.clone(), *rtype);
        q.set_query_class(DNSClass::from(*class));
        msg.add_query(q);
    }
    if let Some((version, payload)) = shape.edns {
        let mut edns = Edns::new();
        edns.set_version(version).set_max_payload(payload);
        msg.set_edns(edns);
    }
    let mut bytes = msg.to_vec().unwrap();
    bytes[2] |= shape.flags.0;
    bytes[3] |= shape.flags.1;
    for (at, mask) in &shape.flips {
        let at = at % bytes.len();
        bytes[at] ^= mask;
    }
    if let Some(cut) = shape.cut {
        bytes.truncate(cut % (bytes.len() + 1));
    }
    bytes
}

/// Runs one datagram through the UDP path and returns what it queued.
fn answer(service: &Service, zone: &Zone, packet: &[u8]) -> Vec<(Vec<u8>, SocketAddr)> {
    let outbox: Outbox = Arc::default();
    let src: SocketAddr = "127.0.0.1:5300".parse().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    // A fresh limiter each time: one datagram is never past the rate.
    let now = std::time::Instant::now();
    let settings = rrl::Settings {
        rate: crate::config::DEFAULT_RATE_LIMIT,
        slip: crate::config::DEFAULT_SLIP,
    };
    let rrl = Rrl { limit: &mut RateLimit::new(settings), now };
    runtime.block_on(handle_packet(&outbox, service, zone, packet, src, rrl));
    std::mem::take(&mut *lock(&outbox))
}

/// The properties of the answers to one datagram.
fn check(packet: &[u8], answers: &[(Vec<u8>, SocketAddr)]) {
    let is_query = packet.len() >= 12 && packet[2] & 0x80 == 0;
    if !is_query {
        assert!(answers.is_empty(), "a response or a runt was answered: {packet:?}");
        return;
    }
    assert_eq!(answers.len(), 1, "a query got {} answers: {packet:?}", answers.len());
    let bytes = &answers[0].0;
    let reply = Message::from_vec(bytes)
        .unwrap_or_else(|e| panic!("undecodable answer {bytes:?} to {packet:?}: {e}"));
    assert_eq!(reply.metadata.message_type, MessageType::Response);
    assert_eq!(reply.metadata.id, u16::from_be_bytes([packet[0], packet[1]]));
    let request = Message::from_vec(packet).ok();
    let limit = match request.as_ref().and_then(|r| r.edns.as_ref()) {
        Some(_) => request.as_ref().map_or(512, |r| r.max_payload()).clamp(512, UDP_PAYLOAD),
        None => 512,
    };
    assert!(bytes.len() <= usize::from(limit), "{} bytes > {limit}", bytes.len());
    let answered =
        reply.metadata.response_code == ResponseCode::NoError && !reply.answers.is_empty();
    if let Some(request) = request.as_ref().filter(|_| answered) {
        assert_eq!(reply.queries, request.queries, "the question is repeated");
    }
}

proptest! {
    #![proptest_config(cases(3000))]

    #[test]
    fn arbitrary_datagrams_get_no_answer_or_a_well_formed_one(
        packet in prop::collection::vec(any::<u8>(), 0..600)
    ) {
        let (service, zone) = (Service::new(vec![]), zone());
        check(&packet, &answer(&service, &zone, &packet));
    }

    #[test]
    fn mutated_queries_get_no_answer_or_a_well_formed_one(shape in shape()) {
        let (service, zone) = (Service::new(vec!["127.0.0.1/32".parse().unwrap()]), zone());
        let packet = encode(&shape);
        check(&packet, &answer(&service, &zone, &packet));
    }
}

#[test]
fn a_question_with_a_compression_pointer_gets_a_header_only_formerr() {
    // Found by a long run of `mutated_queries_get_no_answer_or_a_well_formed_one`: the second
    // question's name pointed into the header (offset 2); the FORMERR repeated the question
    // bytes, and in the answer that offset holds other flags, so it did not decode.
    let packet: &[u8] = &[
        32, 136, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 4, 110, 111, 112, 101, 5, 70, 101, 100, 105, 115, 8,
        105, 110, 116, 101, 114, 110, 97, 108, 0, 0, 41, 0, 1, 5, 99, 97, 99, 104, 101, 192, 2, 0,
        41, 0, 1,
    ];
    let answers = answer(&Service::new(vec![]), &zone(), packet);
    check(packet, &answers);
    let reply = Message::from_vec(&answers[0].0).unwrap();
    assert_eq!(reply.metadata.response_code, ResponseCode::FormErr);
    assert!(reply.queries.is_empty());
}
