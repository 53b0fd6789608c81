//! The DNS request path over real sockets: mutated valid queries and arbitrary bytes sent over
//! UDP and TCP (length-prefixed) to a served zone on 127.0.0.1. Each gets no answer or a
//! well-formed one carrying its id, and the server answers a valid query after the run.
//! (`src/dns/udp/fuzz.rs` runs many more cases without sockets.)
#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use crate::dns_support;

use std::net::SocketAddr;
use std::time::Duration;

use dns_support::{Proto, Server, master, query};
use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::RecordType;
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

fn cases(default: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok());
    ProptestConfig { cases: cases.unwrap_or(default), ..ProptestConfig::default() }
}

const NAMES: &[&str] = &[
    "cache.redis.internal.",
    "_redis._tcp.cache.redis.internal.",
    "replicas.cache.redis.internal.",
    "redis.internal.",
    "nope.redis.internal.",
    "example.com.",
];

/// A valid query, then bit flips and a cut; or plain bytes.
fn packet() -> impl Strategy<Value = Vec<u8>> {
    let mutated = (
        prop::sample::select(NAMES),
        any::<u16>(),
        prop::collection::vec((any::<usize>(), 1u8..), 0..4),
        prop::option::of(any::<usize>()),
    )
        .prop_map(|(name, rtype, flips, cut)| {
            let mut bytes = query(name, RecordType::from(rtype % 260)).to_vec().unwrap();
            for (at, mask) in flips {
                let at = at % bytes.len();
                bytes[at] ^= mask;
            }
            if let Some(cut) = cut {
                bytes.truncate(cut % (bytes.len() + 1));
            }
            bytes
        });
    prop_oneof![3 => mutated, 1 => prop::collection::vec(any::<u8>(), 0..300)]
}

/// How long to wait for an answer: a query is answered at once; anything else must not be,
/// so waiting long for it would only slow the run.
fn wait(packet: &[u8]) -> Duration {
    let is_query = packet.len() >= 12 && packet[2] & 0x80 == 0;
    Duration::from_millis(if is_query { 1000 } else { 50 })
}

fn check(packet: &[u8], reply: Option<Vec<u8>>) {
    let Some(bytes) = reply else { return };
    let is_query = packet.len() >= 12 && packet[2] & 0x80 == 0;
    assert!(is_query, "a response or runt was answered: {packet:?}");
    let message = Message::from_vec(&bytes).unwrap_or_else(|e| panic!("{e}: {bytes:?}"));
    assert_eq!(message.metadata.message_type, MessageType::Response);
    assert_eq!(message.metadata.id, u16::from_be_bytes([packet[0], packet[1]]));
}

async fn over_udp(addr: SocketAddr, packet: &[u8]) -> Option<Vec<u8>> {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    socket.send_to(packet, addr).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(wait(packet), socket.recv(&mut buf)).await.ok()?.ok()?;
    buf.truncate(n);
    Some(buf)
}

async fn over_tcp(addr: SocketAddr, packet: &[u8]) -> Option<Vec<u8>> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let framed = [&(packet.len() as u16).to_be_bytes()[..], packet].concat();
    stream.write_all(&framed).await.ok()?;
    let read = async {
        let mut len = [0u8; 2];
        stream.read_exact(&mut len).await.ok()?;
        let mut body = vec![0u8; usize::from(u16::from_be_bytes(len))];
        stream.read_exact(&mut body).await.ok()?;
        Some(body)
    };
    tokio::time::timeout(wait(packet), read).await.ok()?
}

#[test]
fn mutated_queries_over_udp_and_tcp_get_no_answer_or_a_well_formed_one() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server = runtime.block_on(async {
        let server = Server::start(|_| {}).await;
        server
            .publish(vec![master("cache", Some(("10.0.0.1", 6379)), &[("10.0.0.2", true)])])
            .await;
        server
    });
    let addr = server.addr;
    let mut runner = proptest::test_runner::TestRunner::new(cases(150));
    runner
        .run(&packet(), |packet| {
            runtime.block_on(async {
                check(&packet, over_udp(addr, &packet).await);
                check(&packet, over_tcp(addr, &packet).await);
            });
            Ok(())
        })
        .unwrap();
    runtime.block_on(async {
        for proto in [Proto::Udp, Proto::Tcp] {
            let reply = server.ask(proto, "cache.redis.internal.", RecordType::A).await;
            assert_eq!(reply.metadata.response_code, ResponseCode::NoError, "{proto:?}");
        }
        server.stop().await;
    });
}
