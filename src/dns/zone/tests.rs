#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::rr::{LowerName, Name, RData, RecordType};

use super::*;
use crate::topology::{MasterState, Node, Replica, SentinelCounts};

fn settings(nameservers: &[&str]) -> ZoneSettings {
    let cfg = config::Dns {
        listen: vec![],
        zone: "redis.internal.".into(),
        ttl: Duration::from_secs(3),
        nameservers: nameservers.iter().map(|s| s.to_string()).collect(),
        transfer_allow: vec![],
        notify: vec![],
        rate_limit: crate::config::DEFAULT_RATE_LIMIT,
        replica_max_lag: None,
        rate_limit_slip: crate::config::DEFAULT_SLIP,
    };
    ZoneSettings::from_config(&cfg).unwrap()
}

fn master(label: &str, primary: Option<&str>, replicas: &[(&str, bool)]) -> Master {
    Master {
        withdrawn: None,
        provisional: false,
        name: label.to_string(),
        label: label.to_string(),
        primary: primary.map(|ip| Node { ip: ip.parse().unwrap(), port: 6380, hostname: None }),
        epoch: Some(7),
        since: None,
        state: if primary.is_some() { MasterState::Ok } else { MasterState::Unknown },
        replicas: replicas
            .iter()
            .map(|(ip, healthy)| Replica {
                ip: ip.parse().unwrap(),
                port: 6379,
                hostname: None,
                healthy: *healthy,
                down: !*healthy,
            })
            .collect(),
        sentinels: SentinelCounts::default(),
    }
}

fn snapshot(masters: Vec<Master>) -> Snapshot {
    let masters: BTreeMap<_, _> =
        masters.into_iter().map(|m| (m.name.clone(), Arc::new(m))).collect();
    Snapshot { version: 1, masters, source_reachable: true }
}

fn name(text: &str) -> LowerName {
    LowerName::new(&Name::from_ascii(text).unwrap())
}

fn rdata(answer: Answer<'_>) -> Vec<RData> {
    match answer {
        Answer::Records(records) => records.iter().map(|r| r.data.clone()).collect(),
        other => panic!("expected records, got {other:?}"),
    }
}

#[test]
fn primary_srv_txt_and_replicas() {
    let replicas = [("10.0.0.2", true), ("10.0.0.3", false), ("fd00::4", true)];
    let zone = Zone::build(
        &snapshot(vec![master("cache", Some("10.0.0.1"), &replicas)]),
        &settings(&[]),
        5,
    );
    let a = rdata(zone.lookup(&name("CACHE.redis.internal."), RecordType::A));
    assert_eq!(a, vec![RData::A(A("10.0.0.1".parse().unwrap()))]);
    let srv = rdata(zone.lookup(&name("_redis._tcp.cache.redis.internal."), RecordType::SRV));
    let target = Name::from_ascii("cache.redis.internal.").unwrap();
    assert_eq!(srv, vec![RData::SRV(SRV::new(0, 0, 6380, target))]);
    let txt = rdata(zone.lookup(&name("cache.redis.internal."), RecordType::TXT));
    assert_eq!(txt.len(), 2);
    assert_eq!(txt[0].to_string(), "epoch=7");
    assert_eq!(txt[1].to_string(), "state=ok");
    let healthy_v4 = rdata(zone.lookup(&name("replicas.cache.redis.internal."), RecordType::A));
    assert_eq!(healthy_v4, vec![RData::A(A("10.0.0.2".parse().unwrap()))]);
    let healthy_v6 = rdata(zone.lookup(&name("replicas.cache.redis.internal."), RecordType::AAAA));
    assert_eq!(healthy_v6, vec![RData::AAAA(AAAA("fd00::4".parse().unwrap()))]);
}

#[test]
fn every_record_has_the_configured_ttl_also_as_soa_minimum() {
    let zone = Zone::build(
        &snapshot(vec![master("cache", Some("10.0.0.1"), &[])]),
        &settings(&["ns1.redis.internal."]),
        5,
    );
    assert!(zone.transfer_records().into_iter().chain(zone.soa()).all(|r| r.ttl == 3));
    let Some(RData::SOA(soa)) = zone.soa().first().map(|r| &r.data) else { panic!("no SOA") };
    assert_eq!(soa.minimum, 3);
    assert_eq!(soa.serial, 5);
    assert_eq!(soa.mname.to_string(), "ns1.redis.internal.");
}

#[test]
fn rcode_cases() {
    let zone = Zone::build(
        &snapshot(vec![master("cache", Some("10.0.0.1"), &[]), master("down", None, &[])]),
        &settings(&[]),
        1,
    );
    assert_eq!(zone.lookup(&name("nope.redis.internal."), RecordType::A), Answer::NxDomain);
    assert_eq!(zone.lookup(&name("example.com."), RecordType::A), Answer::Refused);
    assert_eq!(zone.lookup(&name("cache.redis.internal."), RecordType::AAAA), Answer::NoData);
    assert_eq!(zone.lookup(&name("cache.redis.internal."), RecordType::MX), Answer::NoData);
    assert_eq!(zone.lookup(&name("down.redis.internal."), RecordType::A), Answer::ServFail);
    assert_eq!(zone.lookup(&name("down.redis.internal."), RecordType::AAAA), Answer::ServFail);
    assert_eq!(
        zone.lookup(&name("_redis._tcp.down.redis.internal."), RecordType::SRV),
        Answer::ServFail
    );
    // The TXT of a master without a primary still tells why.
    let txt = rdata(zone.lookup(&name("down.redis.internal."), RecordType::TXT));
    assert_eq!(txt[1].to_string(), "state=unknown");
    // Empty non-terminal: exists, no data (RFC 8020: not NXDOMAIN).
    assert_eq!(zone.lookup(&name("_tcp.cache.redis.internal."), RecordType::A), Answer::NoData);
    // No nameservers configured: the apex has SOA but no NS.
    assert_eq!(zone.lookup(&name("redis.internal."), RecordType::NS), Answer::NoData);
}

#[test]
fn any_gets_one_rrset() {
    let zone =
        Zone::build(&snapshot(vec![master("cache", Some("10.0.0.1"), &[])]), &settings(&[]), 1);
    let any = rdata(zone.lookup(&name("cache.redis.internal."), RecordType::ANY));
    assert_eq!(any, vec![RData::A(A("10.0.0.1".parse().unwrap()))]);
}

#[test]
fn duplicate_and_invalid_labels_are_skipped() {
    let mut twin = master("cache", Some("10.0.0.9"), &[]);
    twin.name = "zz".into();
    let long = master(&"x".repeat(64), Some("10.0.0.8"), &[]);
    let zone = Zone::build(
        &snapshot(vec![master("cache", Some("10.0.0.1"), &[]), twin, long]),
        &settings(&[]),
        1,
    );
    let a = rdata(zone.lookup(&name("cache.redis.internal."), RecordType::A));
    assert_eq!(a, vec![RData::A(A("10.0.0.1".parse().unwrap()))]);
}

#[test]
fn with_serial_changes_only_the_serial() {
    let snap = snapshot(vec![master("cache", Some("10.0.0.1"), &[])]);
    let zone = Zone::build(&snap, &settings(&[]), 1).with_serial(2);
    assert_eq!(zone, Zone::build(&snap, &settings(&[]), 2));
    let soa = rdata(zone.lookup(&name("redis.internal."), RecordType::SOA));
    assert!(matches!(&soa[0], RData::SOA(s) if s.serial == 2));
}

#[test]
fn serial_follows_the_clock_and_always_grows() {
    assert_eq!(next_serial(100, 200), 200);
    assert_eq!(next_serial(200, 200), 201);
    assert_eq!(next_serial(300, 200), 301);
    assert_eq!(next_serial(u32::MAX, u64::from(u32::MAX) + 5), 4);
    assert!(serial_gt(next_serial(u32::MAX, 0), u32::MAX));
}

#[test]
fn snapshots_that_differ_only_outside_the_records_give_the_same_zone() {
    let a = snapshot(vec![master("m", Some("10.0.0.1"), &[("10.0.0.2", true)])]);
    let mut counted = master("m", Some("10.0.0.1"), &[("10.0.0.2", true)]);
    counted.sentinels =
        SentinelCounts { configured: 3, reachable: 3, agreeing: 2, ..SentinelCounts::default() };
    counted.since = Some(std::time::SystemTime::now());
    let b = snapshot(vec![counted]);
    assert!(same_records(&a, &b));
    let settings = settings(&[]);
    assert_eq!(Zone::build(&a, &settings, 1), Zone::build(&b, &settings, 1));

    let unhealthy = snapshot(vec![master("m", Some("10.0.0.1"), &[("10.0.0.2", false)])]);
    let moved = snapshot(vec![master("m", Some("10.0.0.3"), &[("10.0.0.2", true)])]);
    let more = snapshot(vec![
        master("m", Some("10.0.0.1"), &[("10.0.0.2", true)]),
        master("n", Some("10.0.0.4"), &[]),
    ]);
    for other in [&unhealthy, &moved, &more] {
        assert!(!same_records(&a, other));
        assert_ne!(Zone::build(&a, &settings, 1), Zone::build(other, &settings, 1));
    }
}
