//! Component tests of the authoritative DNS server: real sockets on loopback, port 0, a
//! topology channel fed by the test, and raw DNS messages (or `dig`, hickory-resolver, knotd)
//! checking what the docs/using.md, "DNS" section promises.
#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use crate::dns_support;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use dns_support::*;
use hickory_proto::op::{OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, SRV};
use hickory_proto::rr::{DNSClass, RData, RecordType};
use polestar::dns::Listeners;
use polestar::topology::MasterState;

#[tokio::test]
async fn answers_every_name_of_a_master_over_udp_and_tcp() {
    let server = Server::start(|_| {}).await;
    server
        .publish(vec![master(
            "cache",
            Some(("10.0.0.1", 6380)),
            &[("10.0.0.2", true), ("fd00::3", true)],
        )])
        .await;
    for proto in [Proto::Udp, Proto::Tcp] {
        let a = server.ask(proto, "cache.redis.internal.", RecordType::A).await;
        assert_eq!(a.metadata.response_code, ResponseCode::NoError);
        assert!(a.metadata.authoritative, "{proto:?}: AA must be set");
        assert_eq!(rdata(&a), vec![RData::A(A("10.0.0.1".parse().unwrap()))]);
        assert_eq!(a.answers[0].ttl, 1);
        let srv = server.ask(proto, "_redis._tcp.cache.redis.internal.", RecordType::SRV).await;
        let target = name("cache.redis.internal.");
        assert_eq!(rdata(&srv), vec![RData::SRV(SRV::new(0, 0, 6380, target))]);
        let txt = server.ask(proto, "cache.redis.internal.", RecordType::TXT).await;
        assert_eq!(texts(&txt), vec!["epoch=1", "state=ok"]);
        let v4 = server.ask(proto, "replicas.cache.redis.internal.", RecordType::A).await;
        assert_eq!(rdata(&v4), vec![RData::A(A("10.0.0.2".parse().unwrap()))]);
        let v6 = server.ask(proto, "replicas.cache.redis.internal.", RecordType::AAAA).await;
        assert_eq!(rdata(&v6), vec![RData::AAAA(AAAA("fd00::3".parse().unwrap()))]);
        let ns = server.ask(proto, "redis.internal.", RecordType::NS).await;
        assert_eq!(
            rdata(&ns),
            vec![RData::NS(hickory_proto::rr::rdata::NS(name("ns1.redis.internal.")))]
        );
        let soa = soa_of(&server.ask(proto, "redis.internal.", RecordType::SOA).await);
        assert_eq!(soa.minimum, 1, "SOA minimum is dns.ttl");
    }
}

#[tokio::test]
async fn ipv6_primary_is_served_as_aaaa() {
    let server = Server::start(|_| {}).await;
    server.publish(vec![master("cache", Some(("fd00::1", 6379)), &[])]).await;
    let aaaa = server.ask(Proto::Udp, "cache.redis.internal.", RecordType::AAAA).await;
    assert_eq!(rdata(&aaaa), vec![RData::AAAA(AAAA("fd00::1".parse().unwrap()))]);
    let a = server.ask(Proto::Udp, "cache.redis.internal.", RecordType::A).await;
    assert_nodata(&a);
}

#[tokio::test]
async fn every_rcode_case_over_udp_and_tcp() {
    let server = Server::start(|_| {}).await;
    server
        .publish(vec![master("cache", Some(("10.0.0.1", 6379)), &[]), master("down", None, &[])])
        .await;
    for proto in [Proto::Udp, Proto::Tcp] {
        let nx = server.ask(proto, "nothing.redis.internal.", RecordType::A).await;
        assert_eq!(nx.metadata.response_code, ResponseCode::NXDomain, "{proto:?}");
        assert!(nx.metadata.authoritative);
        assert_eq!(nx.authorities[0].record_type(), RecordType::SOA, "{proto:?}: SOA in authority");
        assert_nodata(&server.ask(proto, "cache.redis.internal.", RecordType::AAAA).await);
        assert_nodata(&server.ask(proto, "cache.redis.internal.", RecordType::MX).await);
        assert_nodata(&server.ask(proto, "_tcp.cache.redis.internal.", RecordType::A).await);
        let outside = server.ask(proto, "example.com.", RecordType::A).await;
        assert_eq!(outside.metadata.response_code, ResponseCode::Refused, "{proto:?}");
        assert!(outside.answers.is_empty());
        for (qname, rtype) in [
            ("down.redis.internal.", RecordType::A),
            ("down.redis.internal.", RecordType::AAAA),
            ("_redis._tcp.down.redis.internal.", RecordType::SRV),
        ] {
            let fail = server.ask(proto, qname, rtype).await;
            assert_eq!(
                fail.metadata.response_code,
                ResponseCode::ServFail,
                "{proto:?} {qname} {rtype}"
            );
            assert!(fail.answers.is_empty());
        }
        let txt = server.ask(proto, "down.redis.internal.", RecordType::TXT).await;
        assert_eq!(texts(&txt), vec!["epoch=1", "state=unknown"]);

        let mut two = query("cache.redis.internal.", RecordType::A);
        two.add_query(hickory_proto::op::Query::query(
            name("cache.redis.internal."),
            RecordType::TXT,
        ));
        assert_eq!(
            server.exchange(proto, &two).await.metadata.response_code,
            ResponseCode::FormErr
        );
        for op in [OpCode::Update, OpCode::Status, OpCode::Notify, OpCode::Unknown(9)] {
            let mut msg = query("cache.redis.internal.", RecordType::SOA);
            msg.metadata.op_code = op;
            let reply = server.exchange(proto, &msg).await;
            assert_eq!(reply.metadata.response_code, ResponseCode::NotImp, "{proto:?} {op:?}");
        }
        let mut chaos = query("cache.redis.internal.", RecordType::TXT);
        chaos.queries[0].set_query_class(DNSClass::CH);
        assert_eq!(
            server.exchange(proto, &chaos).await.metadata.response_code,
            ResponseCode::Refused
        );
        let mut future_edns = query("cache.redis.internal.", RecordType::A);
        future_edns.edns.get_or_insert_with(Default::default).set_version(1);
        let reply = server.exchange(proto, &future_edns).await;
        // 16 is BADVERS in an OPT answer (the decoder names it BADSIG, its TSIG alias).
        assert_eq!(u16::from(reply.metadata.response_code), 16, "{proto:?}: BADVERS");
        assert!(reply.edns.is_some(), "BADVERS travels in OPT");
        let any = server.ask(proto, "cache.redis.internal.", RecordType::ANY).await;
        assert_eq!(rdata(&any).len(), 1, "RFC 8482: one RRset for ANY");
    }
}

#[tokio::test]
async fn edns_is_answered_with_edns() {
    let server = Server::start(|_| {}).await;
    server.publish(vec![master("cache", Some(("10.0.0.1", 6379)), &[])]).await;
    let mut msg = query("cache.redis.internal.", RecordType::A);
    msg.edns.get_or_insert_with(Default::default).set_max_payload(4096);
    let reply = server.exchange(Proto::Udp, &msg).await;
    let edns = reply.edns.expect("an EDNS query gets an OPT record back");
    assert_eq!(edns.max_payload(), 1232);
    let plain = server.ask(Proto::Udp, "cache.redis.internal.", RecordType::A).await;
    assert!(plain.edns.is_none(), "no OPT to a query without EDNS");
}

#[tokio::test]
async fn a_topology_change_moves_a_srv_txt_and_raises_the_serial() {
    let server = Server::start(|_| {}).await;
    server.publish(vec![master("cache", Some(("10.0.0.1", 6379)), &[("10.0.0.2", true)])]).await;
    let before = soa_of(&server.ask(Proto::Udp, "redis.internal.", RecordType::SOA).await).serial;

    let mut moved = master("cache", Some(("10.0.0.2", 6390)), &[("10.0.0.1", true)]);
    moved.epoch = Some(2);
    server.publish(vec![moved]).await;
    let a = server.ask(Proto::Udp, "cache.redis.internal.", RecordType::A).await;
    assert_eq!(rdata(&a), vec![RData::A(A("10.0.0.2".parse().unwrap()))]);
    let srv = server.ask(Proto::Tcp, "_redis._tcp.cache.redis.internal.", RecordType::SRV).await;
    assert!(matches!(&rdata(&srv)[0], RData::SRV(s) if s.port == 6390));
    let txt = server.ask(Proto::Udp, "cache.redis.internal.", RecordType::TXT).await;
    assert_eq!(texts(&txt), vec!["epoch=2", "state=ok"]);
    let replicas = server.ask(Proto::Udp, "replicas.cache.redis.internal.", RecordType::A).await;
    assert_eq!(rdata(&replicas), vec![RData::A(A("10.0.0.1".parse().unwrap()))]);
    let after = soa_of(&server.ask(Proto::Udp, "redis.internal.", RecordType::SOA).await).serial;
    assert!(serial_gt(after, before), "serial {after} must exceed {before}");
    assert!(
        u64::from(before) + 1 >= polestar::dns::zone::now_unix() - 5,
        "serial derives from the clock"
    );

    // A change that no record shows (Sentinel counts) keeps the serial.
    let mut same = master("cache", Some(("10.0.0.2", 6390)), &[("10.0.0.1", true)]);
    same.epoch = Some(2);
    same.sentinels.reachable = 3;
    server.publish_quiet(vec![same]).await;
    let unchanged =
        soa_of(&server.ask(Proto::Udp, "redis.internal.", RecordType::SOA).await).serial;
    assert_eq!(unchanged, after);
}

#[tokio::test]
async fn replicas_lists_only_healthy_ones_and_states_show_in_txt() {
    let server = Server::start(|_| {}).await;
    let mut m = master(
        "cache",
        Some(("10.0.0.1", 6379)),
        &[("10.0.0.2", true), ("10.0.0.3", false), ("10.0.0.4", true)],
    );
    m.state = MasterState::Stale;
    server.publish(vec![m]).await;
    let replicas = server.ask(Proto::Udp, "replicas.cache.redis.internal.", RecordType::A).await;
    let mut ips: Vec<String> = rdata(&replicas).iter().map(ToString::to_string).collect();
    ips.sort();
    assert_eq!(ips, vec!["10.0.0.2", "10.0.0.4"]);
    let txt = server.ask(Proto::Udp, "cache.redis.internal.", RecordType::TXT).await;
    assert_eq!(texts(&txt), vec!["epoch=1", "state=stale"]);
    server.publish(vec![master("cache", Some(("10.0.0.1", 6379)), &[("10.0.0.2", false)])]).await;
    assert_nodata(&server.ask(Proto::Udp, "replicas.cache.redis.internal.", RecordType::A).await);
}

#[tokio::test]
async fn large_answers_are_truncated_over_udp_and_complete_over_tcp() {
    let server = Server::start(|_| {}).await;
    let replicas: Vec<(String, bool)> = (1..=120).map(|i| (format!("10.1.0.{i}"), true)).collect();
    let refs: Vec<(&str, bool)> = replicas.iter().map(|(ip, h)| (ip.as_str(), *h)).collect();
    server.publish(vec![master("big", Some(("10.0.0.1", 6379)), &refs)]).await;
    let qname = "replicas.big.redis.internal.";

    let plain = server.exchange_raw(Proto::Udp, &query(qname, RecordType::A)).await;
    assert!(plain.len() <= 512, "{} bytes without EDNS", plain.len());
    assert!(parse(&plain).metadata.truncation, "TC without EDNS");
    let mut edns = query(qname, RecordType::A);
    edns.edns.get_or_insert_with(Default::default).set_max_payload(4096);
    let big = server.exchange_raw(Proto::Udp, &edns).await;
    assert!(big.len() <= 1232, "{} bytes: capped at our advertised payload", big.len());
    assert!(parse(&big).metadata.truncation);
    let tcp = server.ask(Proto::Tcp, qname, RecordType::A).await;
    assert!(!tcp.metadata.truncation);
    assert_eq!(tcp.answers.len(), 120);

    // dig retries over TCP on TC, as resolvers do.
    let out = dig(server.addr, &["+noedns", qname, "A"]).await;
    assert_eq!(out.lines().filter(|l| l.contains("\tA\t")).count(), 120, "{out}");
}

#[tokio::test]
async fn garbage_does_not_disturb_the_server() {
    // Thousands of the same query from one address: past the response-rate limit, which
    // hostile_load tests; here the server's answers after the garbage are what counts.
    let server = Server::start(|c| c.rate_limit = 0).await;
    server.publish(vec![master("cache", Some(("10.0.0.1", 6379)), &[])]).await;
    let valid = query("cache.redis.internal.", RecordType::A).to_vec().unwrap();
    let replies = send_garbage(server.addr, &valid, 6000).await;
    // Responses (QR set) and runts are never answered: no reflection.
    assert_eq!(replies.qr_answered, 0);
    tcp_garbage(server.addr, &valid, 50).await;
    for proto in [Proto::Udp, Proto::Tcp] {
        let a = server.ask(proto, "cache.redis.internal.", RecordType::A).await;
        assert_eq!(rdata(&a), vec![RData::A(A("10.0.0.1".parse().unwrap()))], "{proto:?}");
    }
    let formerr = server.exchange_bytes(&valid[..valid.len() - 3]).await;
    assert_eq!(parse(&formerr).metadata.response_code, ResponseCode::FormErr);
}

#[tokio::test]
async fn axfr_only_to_transfer_allow() {
    let server = Server::start(|_| {}).await;
    server
        .publish(vec![
            master("cache", Some(("10.0.0.1", 6379)), &[("10.0.0.2", true)]),
            master("down", None, &[]),
        ])
        .await;
    let messages =
        server.transfer(from("127.0.0.1"), &query("redis.internal.", RecordType::AXFR)).await;
    let records: Vec<_> = messages.iter().flat_map(|m| m.answers.iter()).collect();
    assert!(messages.iter().all(|m| m.metadata.response_code == ResponseCode::NoError));
    assert_eq!(records.first().unwrap().record_type(), RecordType::SOA);
    assert_eq!(records.last().unwrap().record_type(), RecordType::SOA);
    let owners: Vec<String> =
        records.iter().map(|r| format!("{} {}", r.name, r.record_type())).collect();
    for expected in [
        "cache.redis.internal. A",
        "cache.redis.internal. TXT",
        "_redis._tcp.cache.redis.internal. SRV",
        "replicas.cache.redis.internal. A",
        "down.redis.internal. TXT",
        "redis.internal. NS",
    ] {
        assert!(owners.iter().any(|o| o == expected), "{expected} missing from {owners:?}");
    }

    let refused =
        server.transfer(from("127.0.0.2"), &query("redis.internal.", RecordType::AXFR)).await;
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].metadata.response_code, ResponseCode::Refused);
    assert!(refused[0].answers.is_empty());
    let udp = server.exchange(Proto::Udp, &query("redis.internal.", RecordType::AXFR)).await;
    assert_eq!(udp.metadata.response_code, ResponseCode::FormErr, "AXFR needs TCP");
}

#[tokio::test]
async fn axfr_of_a_large_zone_spans_several_messages() {
    let server = Server::start(|_| {}).await;
    let masters =
        (0..300).map(|i| master(&format!("m{i}"), Some(("10.0.0.1", 6379)), &[])).collect();
    server.publish(masters).await;
    let messages =
        server.transfer(from("127.0.0.1"), &query("redis.internal.", RecordType::AXFR)).await;
    assert!(messages.len() > 1);
    let count: usize = messages.iter().map(|m| m.answers.len()).sum();
    // SOA + NS + 300 × (A + 2 TXT + SRV) + SOA
    assert_eq!(count, 2 + 1 + 300 * 4);
}

#[tokio::test]
async fn ixfr_gets_the_full_zone_never_an_empty_noerror() {
    let server = Server::start(|_| {}).await;
    server.publish(vec![master("cache", Some(("10.0.0.1", 6379)), &[])]).await;
    let serial = soa_of(&server.ask(Proto::Udp, "redis.internal.", RecordType::SOA).await).serial;

    let old = ixfr(serial.wrapping_sub(10));
    let messages = server.transfer(from("127.0.0.1"), &old).await;
    let records: Vec<_> = messages.iter().flat_map(|m| m.answers.iter()).collect();
    assert!(records.len() > 3, "full zone expected, got {records:?}");
    assert_eq!(records.first().unwrap().record_type(), RecordType::SOA);
    assert_ne!(records[1].record_type(), RecordType::SOA, "AXFR-style, not a diff");
    assert_eq!(records.last().unwrap().record_type(), RecordType::SOA);
    assert!(
        records
            .iter()
            .any(|r| r.name.to_string() == "cache.redis.internal."
                && r.record_type() == RecordType::A)
    );

    let current = server.transfer(from("127.0.0.1"), &ixfr(serial)).await;
    let records: Vec<_> = current.iter().flat_map(|m| m.answers.iter()).collect();
    assert_eq!(records.len(), 1, "up to date: the current SOA alone");
    assert_eq!(soa_of(&current[0]).serial, serial);

    let udp = server.exchange(Proto::Udp, &old).await;
    assert_eq!(udp.metadata.response_code, ResponseCode::NoError);
    assert_eq!(soa_of(&udp).serial, serial, "over UDP: the SOA, meaning 'use TCP'");
    let refused = server.transfer(from("127.0.0.2"), &old).await;
    assert_eq!(refused[0].metadata.response_code, ResponseCode::Refused);
}

#[tokio::test]
async fn notify_is_sent_after_each_change_and_retried_until_acknowledged() {
    let target = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let target_addr = target.local_addr().unwrap();
    let server = Server::start(|cfg| cfg.notify = vec![target_addr]).await;

    // At startup: NOTIFY for the current zone. Leave it unanswered: it must come again.
    let (first, _) = recv_notify(&target).await;
    let (again, from) = recv_notify(&target).await;
    assert_eq!(soa_of(&again).serial, soa_of(&first).serial, "a retry of the same serial");
    ack(&target, &again, from).await;

    server.publish(vec![master("cache", Some(("10.0.0.9", 6379)), &[])]).await;
    let (changed, from) = recv_notify(&target).await;
    assert!(serial_gt(soa_of(&changed).serial, soa_of(&first).serial));
    assert_eq!(changed.queries[0].name(), &name("redis.internal."));
    assert_eq!(changed.queries[0].query_type(), RecordType::SOA);
    assert!(changed.metadata.authoritative);
    ack(&target, &changed, from).await;
    // Acknowledged: no further NOTIFY for that serial.
    let mut buf = [0u8; 512];
    let quiet = tokio::time::timeout(Duration::from_millis(1500), target.recv_from(&mut buf)).await;
    assert!(quiet.is_err(), "NOTIFY resent after acknowledgement");
}

#[tokio::test]
async fn a_resolver_library_finds_the_primary() {
    use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig};
    use hickory_resolver::net::runtime::TokioRuntimeProvider;
    let server = Server::start(|_| {}).await;
    server.publish(vec![master("cache", Some(("10.0.0.1", 6380)), &[])]).await;
    let mut udp = ConnectionConfig::udp();
    udp.port = server.addr.port();
    let ns = NameServerConfig::new(server.addr.ip(), true, vec![udp]);
    let config = ResolverConfig::from_name_servers(vec![ns]);
    let resolver =
        hickory_resolver::Resolver::builder_with_config(config, TokioRuntimeProvider::default())
            .build()
            .unwrap();
    let ips: Vec<IpAddr> =
        resolver.lookup_ip("cache.redis.internal.").await.unwrap().iter().collect();
    assert_eq!(ips, vec!["10.0.0.1".parse::<IpAddr>().unwrap()]);
    let srv = resolver.lookup("_redis._tcp.cache.redis.internal.", RecordType::SRV).await.unwrap();
    assert!(matches!(&srv.answers()[0].data, RData::SRV(s) if s.port == 6380));
}

#[tokio::test]
async fn queries_are_counted_by_rcode() {
    let handle = polestar::metrics::install();
    let server = Server::start(|_| {}).await;
    server.publish(vec![master("cache", Some(("10.0.0.1", 6379)), &[])]).await;
    server.ask(Proto::Udp, "nothing.redis.internal.", RecordType::A).await;
    server.ask(Proto::Tcp, "example.org.", RecordType::A).await;
    let text = handle.render();
    assert!(text.contains("polestar_dns_queries_total{rcode=\"NXDOMAIN\"}"), "{text}");
    assert!(text.contains("polestar_dns_queries_total{rcode=\"REFUSED\"}"), "{text}");
}

#[tokio::test]
async fn a_taken_port_is_reported_with_its_address() {
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let mut cfg = dns_config();
    cfg.listen = vec![addr];
    let error = Listeners::bind(&cfg).await.err().expect("the port is taken");
    assert_eq!(
        error.to_string().split(": ").next().unwrap(),
        format!("failed to bind DNS UDP socket on {addr}")
    );
}

#[tokio::test]
async fn serve_returns_when_cancelled() {
    let server = Server::start(|_| {}).await;
    server.stop().await;
}

#[tokio::test]
async fn knot_secondary_follows_the_zone_by_notify_and_axfr() {
    let Some(knot) = Knot::prepare(ZONE) else {
        // CI installs knot (tests/deps.sh): there a missing knotd is a failure, not a skip.
        assert!(std::env::var_os("CI").is_none(), "knotd not installed (apt-get install knot)");
        eprintln!("knotd not installed: skipping");
        return;
    };
    let server = Server::start(|cfg| cfg.notify = vec![knot.addr]).await;
    server.publish(vec![master("cache", Some(("10.0.0.1", 6379)), &[])]).await;
    let _running = knot.start(server.addr);
    knot.wait_for(server.addr, "cache.redis.internal.", "10.0.0.1", Duration::from_secs(10)).await;

    let mut moved = master("cache", Some(("10.0.0.2", 6379)), &[]);
    moved.epoch = Some(2);
    server.publish(vec![moved]).await;
    let started = std::time::Instant::now();
    knot.wait_for(server.addr, "cache.redis.internal.", "10.0.0.2", Duration::from_secs(5)).await;
    eprintln!("knotd followed the change in {:?}", started.elapsed());
    let log = knot.log();
    assert!(log.contains("notify, incoming"), "the change reached knotd by NOTIFY:\n{log}");
}

fn ixfr(serial: u32) -> hickory_proto::op::Message {
    let mut msg = query("redis.internal.", RecordType::IXFR);
    let soa = soa_record(serial);
    msg.add_authority(soa);
    msg
}

fn from(ip: &str) -> SocketAddr {
    SocketAddr::new(ip.parse().unwrap(), 0)
}
