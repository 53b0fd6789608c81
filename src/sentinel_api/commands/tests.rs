#![allow(clippy::unwrap_used)] // tests fail loudly on purpose
use super::*;
use crate::topology::{MasterState, Node, Replica, SentinelCounts};
use std::collections::BTreeMap;
use std::sync::Arc;

fn snapshot() -> Snapshot {
    let master = Master {
        withdrawn: None,
        provisional: false,
        name: "mymaster".into(),
        label: "mymaster".into(),
        primary: Some(Node { ip: [10, 0, 0, 1].into(), port: 6379, hostname: None }),
        epoch: Some(7),
        since: None,
        state: MasterState::Ok,
        replicas: vec![Replica {
            ip: [10, 0, 0, 2].into(),
            port: 6379,
            hostname: None,
            healthy: false,
            down: true,
        }],
        sentinels: SentinelCounts {
            configured: 3,
            reachable: 2,
            agreeing: 2,
            ..Default::default()
        },
    };
    let unknown =
        Master { name: "fresh".into(), label: "fresh".into(), primary: None, ..master.clone() };
    Snapshot {
        version: 3,
        masters: BTreeMap::from([
            ("mymaster".to_string(), Arc::new(master)),
            ("fresh".to_string(), Arc::new(unknown)),
        ]),
        source_reachable: true,
    }
}

fn server() -> ServerInfo {
    ServerInfo { run_id: "0".repeat(40), port: 26380, pid: 1, uptime_secs: 5, connected_clients: 1 }
}

/// The replies to `line` (inline syntax), encoded in RESP2.
fn ask(session: &mut Session, password: Option<&Secret>, line: &str) -> String {
    let snapshot = snapshot();
    let peers = [HostPort::parse("10.0.0.9:26380").unwrap()];
    let server = server();
    let ctx = Context { snapshot: &snapshot, peers: &peers, password, server: &server };
    let request: Request = line.split(' ').map(|w| w.as_bytes().to_vec()).collect();
    let mut out = Vec::new();
    for reply in answer(&request, session, &ctx) {
        reply.encode(session.proto, &mut out);
    }
    String::from_utf8(out).unwrap()
}

fn open() -> Session {
    Session::new(1, false)
}

#[test]
fn the_master_address_and_sentinels_nil_for_unknown_masters() {
    let s = &mut open();
    assert_eq!(
        ask(s, None, "SENTINEL get-master-addr-by-name mymaster"),
        "*2\r\n$8\r\n10.0.0.1\r\n$4\r\n6379\r\n"
    );
    assert_eq!(ask(s, None, "sentinel GET-MASTER-ADDR-BY-NAME nope"), "*-1\r\n");
    assert_eq!(ask(s, None, "SENTINEL get-master-addr-by-name fresh"), "*-1\r\n", "no primary yet");
    for sub in ["MASTER", "REPLICAS", "SLAVES", "SENTINELS", "CKQUORUM"] {
        let line = format!("SENTINEL {sub} nope");
        assert_eq!(ask(s, None, &line), "-ERR No such master with that name\r\n", "{sub}");
    }
}

#[test]
fn master_replicas_and_sentinels_carry_the_fields_clients_parse() {
    let s = &mut open();
    let master = ask(s, None, "SENTINEL MASTER mymaster");
    for field in [
        "$4\r\nname\r\n$8\r\nmymaster",
        "$5\r\nflags\r\n$6\r\nmaster",
        "$12\r\nconfig-epoch\r\n$1\r\n7",
        "$19\r\nnum-other-sentinels\r\n$1\r\n1",
    ] {
        assert!(master.contains(field), "{field:?} in {master:?}");
    }
    let masters = ask(s, None, "SENTINEL MASTERS");
    assert!(masters.starts_with("*1\r\n"), "only masters with a primary: {masters:?}");
    let replicas = ask(s, None, "SENTINEL REPLICAS mymaster");
    assert!(replicas.contains("slave,s_down"), "{replicas:?}");
    let sentinels = ask(s, None, "SENTINEL SENTINELS mymaster");
    assert!(sentinels.contains("10.0.0.9") && sentinels.contains("26380"), "{sentinels:?}");
    assert!(ask(s, None, "SENTINEL CKQUORUM mymaster").starts_with("+OK 2 usable Sentinels"));
    assert!(ask(s, None, "ROLE").starts_with("*2\r\n$8\r\nsentinel\r\n*2\r\n"));
    assert!(ask(s, None, "INFO").contains("master0:name=fresh,status=sdown"));
}

#[test]
fn writes_and_admin_commands_are_refused_naming_the_http_api() {
    let s = &mut open();
    for line in [
        "SENTINEL SET mymaster quorum 1",
        "SENTINEL FAILOVER mymaster",
        "SENTINEL MONITOR x 1.2.3.4 1 2",
        "SENTINEL REMOVE mymaster",
        "CONFIG SET x y",
        "SENTINEL CONFIG SET x y",
    ] {
        let reply = ask(s, None, line);
        assert!(reply.starts_with("-ERR ") && reply.contains("HTTP API"), "{line}: {reply:?}");
    }
    assert!(
        ask(s, None, "SENTINEL FAILOVER mymaster").contains("POST /v1/masters/{name}/failover")
    );
    assert!(ask(s, None, "SENTINEL bogus").starts_with("-ERR Unknown sentinel subcommand"));
    assert!(ask(s, None, "FLUSHALL").starts_with("-ERR unknown command 'flushall'"));
}

#[test]
fn a_password_gates_everything_but_auth_and_hello() {
    let secret = Secret::new("s3cret");
    let s = &mut Session::new(1, true);
    assert_eq!(ask(s, Some(&secret), "PING"), "-NOAUTH Authentication required.\r\n");
    assert!(ask(s, Some(&secret), "AUTH wrong").starts_with("-WRONGPASS"));
    assert!(ask(s, Some(&secret), "HELLO 3").starts_with("-NOAUTH HELLO must be called"));
    assert_eq!(ask(s, Some(&secret), "AUTH default s3cret"), "+OK\r\n");
    assert_eq!(ask(s, Some(&secret), "PING"), "+PONG\r\n");
    let fresh = &mut Session::new(2, true);
    let hello = ask(fresh, Some(&secret), "HELLO 3 AUTH default s3cret SETNAME app");
    assert!(hello.starts_with("%7\r\n") && hello.contains("sentinel"), "{hello:?}");
    assert_eq!(fresh.proto, Proto::Resp3);
    assert_eq!(fresh.name.as_deref(), Some("app"));
    assert!(ask(&mut open(), None, "AUTH x").starts_with("-ERR AUTH <password> called without"));
}

#[test]
fn subscriptions_count_and_restrict_resp2_sessions() {
    let s = &mut open();
    let reply = ask(s, None, "SUBSCRIBE +switch-master +sdown");
    assert_eq!(reply.matches("$9\r\nsubscribe\r\n").count(), 2);
    assert!(reply.ends_with(":2\r\n"));
    assert!(ask(s, None, "PSUBSCRIBE *").ends_with(":3\r\n"));
    assert!(ask(s, None, "SENTINEL MASTERS").starts_with("-ERR Can't execute 'sentinel'"));
    assert_eq!(ask(s, None, "PING"), "*2\r\n$4\r\npong\r\n$0\r\n\r\n");
    assert!(ask(s, None, "UNSUBSCRIBE").ends_with(":1\r\n"));
    assert!(ask(s, None, "PUNSUBSCRIBE").ends_with(":0\r\n"));
    assert_eq!(ask(s, None, "UNSUBSCRIBE"), "*3\r\n$11\r\nunsubscribe\r\n$-1\r\n:0\r\n");
    assert_eq!(ask(s, None, "PING"), "+PONG\r\n");
}

#[test]
fn subscriptions_per_connection_are_capped() {
    let s = &mut open();
    let channels: Vec<String> = (0..MAX_SUBSCRIPTIONS + 5).map(|i| format!("c{i}")).collect();
    let reply = ask(s, None, &format!("SUBSCRIBE {}", channels.join(" ")));
    assert!(reply.contains("too many subscriptions"));
    assert_eq!(s.subscriptions(), MAX_SUBSCRIPTIONS);
}

#[test]
fn client_names_and_info_are_accepted() {
    let s = &mut open();
    assert_eq!(ask(s, None, "CLIENT SETNAME app-1"), "+OK\r\n");
    assert_eq!(ask(s, None, "CLIENT GETNAME"), "$5\r\napp-1\r\n");
    assert_eq!(ask(s, None, "CLIENT SETINFO LIB-NAME redis-py"), "+OK\r\n");
    assert!(ask(s, None, "CLIENT KILL ID 1").starts_with("-ERR unknown subcommand"));
}

#[test]
fn metric_names_are_a_bounded_set() {
    let name = |line: &str| metric_name(&line.split(' ').map(|w| w.as_bytes().to_vec()).collect());
    assert_eq!(name("SENTINEL get-master-addr-by-name m"), "sentinel get-master-addr-by-name");
    assert_eq!(name("sentinel MASTERS"), "sentinel masters");
    assert_eq!(name("SENTINEL whatever"), "sentinel other");
    assert_eq!(name("PSUBSCRIBE *"), "psubscribe");
    assert_eq!(name("FLUSHALL"), "other");
}

/// Regression (docs/limits.md, "Sentinel endpoint"): 256 patterns of 64 KiB each (16 MiB a
/// connection, matched against every channel at every flip) were accepted. Patterns are capped in
/// count, and the names of a connection's subscriptions in total bytes.
#[test]
fn patterns_are_capped_in_count_and_subscriptions_in_bytes() {
    let s = &mut open();
    let many: Vec<String> = (0..MAX_PATTERNS + 5).map(|i| format!("p{i}*")).collect();
    let reply = ask(s, None, &format!("PSUBSCRIBE {}", many.join(" ")));
    assert!(reply.contains("too many patterns"), "{reply}");
    assert_eq!(s.patterns.len(), MAX_PATTERNS);
    let s = &mut open();
    let long = "x".repeat(MAX_SUBSCRIPTION_BYTES / 4);
    let names: Vec<String> = (0..8).map(|i| format!("{i}{long}")).collect();
    let reply = ask(s, None, &format!("SUBSCRIBE {}", names.join(" ")));
    assert!(reply.contains("too many subscription bytes"), "{reply}");
    let held: usize = s.channels.iter().chain(&s.patterns).map(Vec::len).sum();
    assert!(held <= MAX_SUBSCRIPTION_BYTES, "{held} bytes held");
}
