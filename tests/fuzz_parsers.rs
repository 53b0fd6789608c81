//! Property tests of the parsers that read what peers send: Sentinel events and replies
//! (arbitrary channel/payload text and arbitrary `redis::Value` trees) and `CLIENT LIST`.
//! Nothing a peer sends may panic them, and what they accept is well-formed (no port 0, no
//! empty host, the master named in the payload).
//!
//! Bounded for CI by `PROPTEST_CASES` (default below); `bench/README.md` says how to run long
//! campaigns.

use std::collections::HashMap;

use polestar::node::clients::{self, ClientInfo};
use polestar::sentinel::message::{self, Addr, Event, MasterRecord, PeerRecord, ReplicaRecord};
use proptest::prelude::*;
use redis::Value;

fn cases(default: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok());
    ProptestConfig { cases: cases.unwrap_or(default), ..ProptestConfig::default() }
}

const CHANNELS: &[&str] = &[
    "+new-epoch",
    "+vote-for-leader",
    "+try-failover",
    "+elected-leader",
    "+selected-slave",
    "+failover-state-send-slaveof-noone",
    "+promoted-slave",
    "+switch-master",
    "+failover-end",
    "+failover-end-for-timeout",
    "-failover-abort-no-good-slave",
    "-failover-abort-",
    "+sdown",
    "-sdown",
    "+odown",
    "-odown",
    "+role-change",
    "-role-change",
    "+config-update-from",
    "+convert-to-slave",
    "+monitor",
    "-monitor",
    "+reset-master",
    "+slave",
    "+sentinel",
    "+reboot",
    "__sentinel__:hello",
];

fn channel() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(CHANNELS).prop_map(str::to_string),
        1 => "\\PC{0,24}",
    ]
}

/// A word of a payload: sometimes what Sentinel would send there, sometimes not.
fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "master",
            "slave",
            "sentinel",
            "@",
            "mymaster",
            "127.0.0.1",
            "::1",
            "h.internal",
            "6379",
            "0",
            "65535",
            "65536",
            "-1",
            "",
            "7",
        ])
        .prop_map(str::to_string),
        any::<u64>().prop_map(|n| n.to_string()),
        "\\PC{0,12}",
        "[ \t\r\n\u{0}\u{a0}\u{2028}]{1,3}",
    ]
}

fn payload() -> impl Strategy<Value = String> {
    prop_oneof![prop::collection::vec(word(), 0..10).prop_map(|w| w.join(" ")), "\\PC{0,80}",]
}

fn well_formed(addr: &Addr) {
    assert!(addr.port != 0 && !addr.host.is_empty(), "{addr:?}");
    assert!(!addr.host.contains(char::is_whitespace), "{addr:?}");
}

fn check_event(event: &Event) {
    match event {
        Event::Promoting { master, replica: a, .. } | Event::Promoted { master, replica: a } => {
            assert!(!master.is_empty());
            well_formed(a);
        }
        Event::NodeBack { master, node, .. } | Event::MasterDown { master, node, .. } => {
            assert!(!master.is_empty());
            well_formed(node);
        }
        Event::Switched { master, old, new } => {
            assert!(!master.is_empty());
            well_formed(old);
            well_formed(new);
        }
        Event::FailoverStarted { master, .. }
        | Event::FailoverEnded { master, .. }
        | Event::Changed { master } => assert!(!master.is_empty()),
        Event::NewEpoch(_) | Event::Voted(_) | Event::Topology => {}
    }
}

/// Raw `INFO` or `CLIENT LIST` text as a node may send it: the pieces those are made of,
/// line ends whole and split, and bytes that are not UTF-8.
fn text_bytes() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        3 => prop::sample::select(vec![
            "id=", "addr=", "laddr=", "name=", "age=", "idle=", "flags=", "cmd=", "fd=",
            "10.0.0.1:6379", "[::1]:6379", "7", "-1", "18446744073709551616", " ", "=", ":",
            "\n", "\r\n", "\r", "#", "# Replication", "role:", "master", "slave",
            "slave0:", "ip=", ",port=", ",offset=", "master_repl_offset:", "sentinel_tilt:",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        1 => prop::collection::vec(any::<u8>(), 0..8),
    ];
    prop::collection::vec(piece, 0..48).prop_map(|p| p.concat())
}

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::sample::select(vec![
            "name",
            "ip",
            "port",
            "flags",
            "config-epoch",
            "runid",
            "master-link-status",
            "mymaster",
            "10.0.0.1",
            "6379",
            "0",
            "master",
            "slave,s_down",
            "ok",
            "err",
            "-3",
            "18446744073709551616",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        prop::collection::vec(any::<u8>(), 0..12),
    ]
}

/// Arbitrary RESP2/RESP3 replies, nested a few levels.
fn resp() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Nil),
        Just(Value::Okay),
        any::<i64>().prop_map(Value::Int),
        bytes().prop_map(Value::BulkString),
        bytes().prop_map(|b| Value::SimpleString(String::from_utf8_lossy(&b).into_owned())),
        any::<f64>().prop_map(Value::Double),
        any::<bool>().prop_map(Value::Boolean),
    ];
    leaf.prop_recursive(4, 64, 12, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..12).prop_map(Value::Array),
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Set),
            prop::collection::vec((inner.clone(), inner), 0..6).prop_map(Value::Map),
        ]
    })
}

fn check_reply(value: &Value) {
    let _ = message::text(value);
    let _ = polestar::node::Role::parse(value);
    if let Some(addr) = message::master_addr(value) {
        well_formed(&addr);
    }
    let mut all: Vec<HashMap<String, String>> = message::records(value);
    all.extend(message::record(value));
    for r in &all {
        if let Some(m) = MasterRecord::from_record(r) {
            well_formed(&m.addr);
        }
        if let Some(r) = ReplicaRecord::from_record(r) {
            well_formed(&r.addr);
        }
        if let Some(p) = PeerRecord::from_record(r) {
            well_formed(&p.addr);
        }
    }
}

/// A `CLIENT LIST` line, with fields Redis and Valkey send and some they do not.
fn client_line() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        prop::sample::select(vec![
            "id", "addr", "laddr", "name", "age", "idle", "flags", "db", "user", "cmd", "lib-name",
            "lib-ver", "fd", "", "=",
        ])
        .prop_map(str::to_string),
        "[a-z-]{1,8}",
    ];
    let value = prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        prop::sample::select(vec![
            "127.0.0.1:6379",
            "[::1]:1",
            "/tmp/r.sock:0",
            "N",
            "client|list"
        ])
        .prop_map(str::to_string),
        "\\PC{0,16}",
    ];
    prop::collection::vec((key, prop::option::of(value)), 0..12).prop_map(|fields| {
        fields
            .into_iter()
            .map(|(k, v)| match v {
                Some(v) => format!("{k}={v}"),
                None => k,
            })
            .collect::<Vec<_>>()
            .join(" ")
    })
}

proptest! {
    #![proptest_config(cases(2000))]

    #[test]
    fn sentinel_events_never_panic_and_are_well_formed(c in channel(), p in payload()) {
        if let Some(event) = Event::parse(&c, &p) {
            check_event(&event);
        }
    }

    #[test]
    fn instance_events_name_their_master(
        c in prop::sample::select(CHANNELS),
        kind in prop::sample::select(vec!["master", "slave"]),
        master in "[A-Za-z0-9_.:-]{1,20}",
        port in 1u16..,
    ) {
        let payload = if kind == "master" {
            format!("master {master} 10.0.0.1 {port}")
        } else {
            format!("slave 10.0.0.2:{port} 10.0.0.2 {port} @ {master} 10.0.0.1 6379")
        };
        match Event::parse(c, &payload) {
            Some(Event::Promoted { master: m, replica: a }) => {
                prop_assert_eq!(m, master);
                prop_assert_eq!(a, Addr { host: "10.0.0.2".into(), port });
            }
            Some(e) => check_event(&e),
            None => {}
        }
    }

    #[test]
    fn sentinel_replies_never_panic(value in resp()) {
        check_reply(&value);
    }

    #[test]
    fn client_list_lines_never_panic(lines in prop::collection::vec(client_line(), 0..8)) {
        let text = lines.join("\n");
        let list = clients::parse_list(&text);
        let nonblank = text.lines().filter(|l| !l.trim().is_empty()).count();
        prop_assert_eq!(list.clients.len() + list.unreadable, nonblank);
    }

    /// Whatever bytes a node answers `CLIENT LIST` or `INFO` with (read as the readers do,
    /// lossily), nothing panics, every line is a client or counted unreadable, and every
    /// field found is in the text.
    #[test]
    fn client_list_and_info_from_raw_bytes_never_panic(raw in text_bytes()) {
        let text = String::from_utf8_lossy(&raw);
        let list = clients::parse_list(&text);
        let nonblank = text.lines().filter(|l| !l.trim().is_empty()).count();
        prop_assert_eq!(list.clients.len() + list.unreadable, nonblank);
        for (field, value) in polestar::readiness::parse::info_fields(&text) {
            let line = format!("{field}:{value}");
            prop_assert!(text.contains(&line));
        }
    }

    #[test]
    fn client_list_round_trips(
        id in any::<u64>(),
        port in 1u16..,
        name in "[a-z0-9=_-]{0,12}",
        flags in "[NPSMbxOA]{1,4}",
        age in any::<u64>(),
    ) {
        let line = format!("id={id} addr=10.1.2.3:{port} name={name} age={age} flags={flags} cmd=GET");
        let c: ClientInfo = clients::parse_line(&line).expect("a valid line");
        prop_assert_eq!(c.id, id);
        prop_assert_eq!(c.addr, Some(([10, 1, 2, 3], port).into()));
        prop_assert_eq!(&c.name, &name);
        prop_assert_eq!(c.age.map(|a| a.as_secs()), Some(age));
        prop_assert_eq!(c.command(), "get");
    }
}
