//! The comparison with HAProxy (docs/failover.md, "Socket sweeping"; bench/haproxy.sh), as a
//! measurement (not a check): the fault cases of `sweep_netns.rs` (hung primary: SIGSTOP of
//! redis-server; dark primary host: its link down, no RST, no FIN), each with a persistent INCR
//! writer and a `BLPOP 0` client on the application host, measured from the fault to the first
//! success on the new primary:
//!
//! - **polestar**: clients find the primary over polestar's HTTP API; a node-side polestar
//!   (`sweep.local_ports`) beside the hung redis-server, or a client-side one (`sweep.remote`) on
//!   the application host when the primary's host is dark;
//! - **haproxy**: HAProxy on the application host in front of the three redis-servers with
//!   `tcp-check` `PING`/`+PONG` and `info replication`/`role:master`, `inter 500ms fall 2 rise 1`,
//!   `on-marked-down shutdown-sessions`; the clients connect to HAProxy.
//!
//! Each round builds a fresh network-namespace cluster; rounds alternate case and method so
//! that the machine's load falls on both alike. A subscriber on every Sentinel records when the
//! leader's `+promoted-slave` and the first `+switch-master` were seen, so every recovery is also
//! shown against Sentinel's own switch. The clients learn which node serves them from
//! `CLIENT INFO` (`laddr=`), so a success through HAProxy is attributed to the right node.
//!
//! Needs root (namespaces, CAP_NET_ADMIN) and `haproxy`. Run with `bench/haproxy.sh`:
//! `BENCH_ROUNDS` (default 3) rounds of each case and method, Sentinel
//! `down-after-milliseconds` `BENCH_DOWN_AFTER_MS` (default 2000, as in the lab figure the
//! issue quotes for HAProxy). Results also go to `target/bench-haproxy.txt`.

use crate::netns;

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use netns::client::{Client, Target};
use netns::cluster::{Cluster, HTTP_PORT};
use netns::measure::{NOONE, PROMOTED, SWITCH, SentinelEvents, emit, env_or, median_max, secs};
use netns::until;
use nix::sys::signal::Signal;
use tokio_util::sync::CancellationToken;

/// Where a failed round's error and process logs go.
const FAILURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/target/bench-haproxy-failures.log");
const HAPROXY_PORT: u16 = 6380;
/// Longest a client may take to recover before the round counts it as not recovered.
const RECOVERY_LIMIT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Case {
    Hung,
    Dark,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Method {
    Polestar,
    Haproxy,
}

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::Hung => "hung (SIGSTOP)",
            Case::Dark => "dark (link down)",
        }
    }
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Method::Polestar => "polestar",
            Method::Haproxy => "haproxy",
        }
    }
}

/// One round's figures, in seconds from the fault.
#[derive(Clone, Debug, Default)]
struct Round {
    writer: Option<f64>,
    blocked: Option<f64>,
    /// The leader's `+failover-state-send-slaveof-noone`: it is promoting the replica now.
    noone: Option<f64>,
    /// The leader's `+promoted-slave`: it saw the replica report `role:master` (INFO).
    promoted: Option<f64>,
    switched: Option<f64>,
}

// ---------------------------------------------------------------------------------------------
// HAProxy, on the application host of the shared cluster (`netns/cluster.rs`).

/// HAProxy on the application host, listening on 127.0.0.1:6380 there, in front of the three
/// redis-servers with the usual role checks (see `bench/haproxy.sh`).
fn start_haproxy(cluster: &Cluster) -> anyhow::Result<()> {
    let servers: String = cluster
        .db
        .iter()
        .enumerate()
        .map(|(i, h)| format!("    server r{} {}:6379 check\n", i + 1, h.ip))
        .collect();
    let conf = format!(
        "global\n    maxconn 1024\n    log stdout format raw local0 info\n\
         defaults\n    mode tcp\n    log global\n    timeout connect 1s\n\
         \x20   timeout client 1h\n    timeout server 1h\n\
         frontend redis\n    no log\n    bind 127.0.0.1:{HAPROXY_PORT}\n    default_backend redis_primary\n\
         backend redis_primary\n    option tcp-check\n    tcp-check connect\n\
         \x20   tcp-check send PING\\r\\n\n    tcp-check expect string +PONG\n\
         \x20   tcp-check send info\\ replication\\r\\n\n    tcp-check expect string role:master\n\
         \x20   tcp-check send QUIT\\r\\n\n    tcp-check expect string +OK\n\
         \x20   default-server inter 500ms fall 2 rise 1 on-marked-down shutdown-sessions\n\
         {servers}"
    );
    let path = cluster.net.dir.path().join("haproxy.cfg");
    std::fs::write(&path, conf)?;
    let path = path.to_str().unwrap_or("").to_string();
    cluster.net.spawn(&cluster.app, "haproxy", "haproxy", &["-db", "-f", &path])?;
    Ok(())
}

/// Sentinel's own view: a subscriber on every Sentinel, from the control host, until `stop`.
fn watch_sentinels(cluster: &Cluster, stop: &CancellationToken) -> SentinelEvents {
    let seen = SentinelEvents::default();
    for host in &cluster.db {
        let addr = SocketAddr::new(host.ip, 26379);
        let (seen, stop) = (seen.clone(), stop.clone());
        drop(netns::in_ns(&cluster.ctl, move || seen.record(addr, stop)));
    }
    seen
}

// ---------------------------------------------------------------------------------------------
// One round.

async fn round(case: Case, method: Method, down_after_ms: u64) -> anyhow::Result<Round> {
    let cluster = Cluster::start(down_after_ms).await?;
    let result = round_in(&cluster, case, method).await;
    cluster.net.with_logs(result)
}

async fn round_in(cluster: &Cluster, case: Case, method: Method) -> anyhow::Result<Round> {
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let seen = watch_sentinels(cluster, &stop);
    let target = match (method, case) {
        (Method::Polestar, Case::Hung) => {
            cluster.central("ctl-polestar").await?;
            cluster.node_polestar("sweep:\n  local_ports: [6379]\n").await?;
            Target::Ask(cluster.central_url())
        }
        (Method::Polestar, Case::Dark) => {
            let listen = format!("127.0.0.1:{HTTP_PORT}");
            let sweep = "sweep:\n  remote: true\n";
            let src = cluster.sentinels_yaml();
            cluster.polestar(&cluster.app, "app-polestar", &src, &listen, sweep).await?;
            Target::Ask(format!("http://{listen}/v1/masters/mymaster/primary"))
        }
        (Method::Haproxy, _) => {
            start_haproxy(cluster)?;
            // Let the first checks mark the replicas down (fall 2 x inter 500ms).
            tokio::time::sleep(Duration::from_millis(1500)).await;
            Target::Fixed(SocketAddr::from(([127, 0, 0, 1], HAPROXY_PORT)))
        }
    };
    // Through HAProxy the address connected to is HAProxy's: `CLIENT INFO` names the node.
    let writer =
        Client::writer(target.clone()).node_from_client_info().start_in(&cluster.app, stop.clone());
    let blocked =
        Client::blocked(target).node_from_client_info().start_in(&cluster.app, stop.clone());
    let old = cluster.primary();
    for log in [&writer, &blocked] {
        until("the clients on the first primary", Duration::from_secs(20), || async {
            log.last_ok().filter(|(_, a)| *a == old).map(|_| ())
        })
        .await?;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    let fault = SystemTime::now();
    match case {
        Case::Hung => cluster.net.signal("redis-0", Signal::SIGSTOP)?,
        Case::Dark => cluster.net.go_dark(&cluster.db[0])?,
    }
    let mut out = Round::default();
    let limit = tokio::time::Instant::now() + RECOVERY_LIMIT;
    loop {
        out.writer = writer.first_ok_elsewhere(old, fault).map(|(t, _)| secs(fault, t));
        out.blocked = blocked.first_ok_elsewhere(old, fault).map(|(t, _)| secs(fault, t));
        // A fresh cluster each round: every event the watch saw is this round's.
        out.noone = seen.first(NOONE, UNIX_EPOCH).map(|t| secs(fault, t));
        out.promoted = seen.first(PROMOTED, UNIX_EPOCH).map(|t| secs(fault, t));
        out.switched = seen.first(SWITCH, UNIX_EPOCH).map(|t| secs(fault, t));
        let done = out.writer.is_some()
            && out.blocked.is_some()
            && out.promoted.is_some()
            && out.switched.is_some();
        if done || tokio::time::Instant::now() > limit {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::ensure!(out.promoted.is_some(), "no +promoted-slave within {RECOVERY_LIMIT:?}");
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// The report.

fn fmt(v: Option<f64>) -> String {
    v.map(|s| format!("{s:.3}")).unwrap_or_else(|| format!(">{}", RECOVERY_LIMIT.as_secs()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: several namespace clusters, HAProxy; run with bench/haproxy.sh"]
async fn haproxy_comparison() {
    let _serial = netns::SERIAL.lock().await;
    let rounds: usize = env_or("BENCH_ROUNDS", 3);
    let down_after_ms: u64 = env_or("BENCH_DOWN_AFTER_MS", 2000);
    let mut out = String::new();
    emit(
        &mut out,
        format!(
            "# issue 5 comparison: {rounds} rounds per case and method, Sentinel down-after-milliseconds {down_after_ms}"
        ),
    );
    emit(
        &mut out,
        "# seconds from the fault; Sentinel events as first seen by a subscriber: noone = leader's \
         +failover-state-send-slaveof-noone (it sends SLAVEOF NO ONE), promoted = leader's \
         +promoted-slave (it saw role:master in INFO), switch = first +switch-master"
            .into(),
    );
    let mut results: Vec<(Case, Method, Round)> = Vec::new();
    for r in 1..=rounds {
        for case in [Case::Hung, Case::Dark] {
            for method in [Method::Polestar, Method::Haproxy] {
                let result = round(case, method, down_after_ms).await;
                let row = match result {
                    Ok(row) => row,
                    Err(e) => {
                        let what = format!("round {r} {} {}", case.name(), method.name());
                        let first = format!("{e:#}");
                        let first = first.lines().next().unwrap_or("").to_string();
                        emit(&mut out, format!("{what} FAILED (not counted): {first}"));
                        let _ = std::fs::OpenOptions::new()
                            .create(true)
                            .append(true)
                            .open(FAILURES)
                            .and_then(|mut f| {
                                use std::io::Write;
                                writeln!(f, "=== {what}\n{e:#}")
                            });
                        continue;
                    }
                };
                emit(
                    &mut out,
                    format!(
                        "round {r} {:<17} {:<8}  noone {}  promoted {}  switch {}  writer {}  blocked {}",
                        case.name(),
                        method.name(),
                        fmt(row.noone),
                        fmt(row.promoted),
                        fmt(row.switched),
                        fmt(row.writer),
                        fmt(row.blocked)
                    ),
                );
                results.push((case, method, row));
            }
        }
    }
    emit(&mut out, String::new());
    emit(
        &mut out,
        format!(
            "{:<17} {:<8} {:<7}  {:>22}  {:>22}  {:>22}  {:>22}  {}",
            "case",
            "method",
            "client",
            "fault->success med/max",
            "noone->success",
            "promoted->success",
            "switch->success",
            "not recovered"
        ),
    );
    for case in [Case::Hung, Case::Dark] {
        for method in [Method::Polestar, Method::Haproxy] {
            let rows: Vec<&Round> = results
                .iter()
                .filter(|(c, m, _)| *c == case && *m == method)
                .map(|x| &x.2)
                .collect();
            for client in ["writer", "blocked"] {
                let pick = |r: &Round| if client == "writer" { r.writer } else { r.blocked };
                let recovered: Vec<&Round> =
                    rows.iter().copied().filter(|r| pick(r).is_some()).collect();
                let fault: Vec<f64> = recovered.iter().filter_map(|r| pick(r)).collect();
                let from = |base: fn(&Round) -> Option<f64>| -> Vec<f64> {
                    recovered.iter().filter_map(|r| Some(pick(r)? - base(r)?)).collect()
                };
                let noone = from(|r| r.noone);
                let promoted = from(|r| r.promoted);
                let switched = from(|r| r.switched);
                let show = |v: &[f64]| {
                    median_max(v)
                        .map(|(m, x)| format!("{m:.3} / {x:.3} s"))
                        .unwrap_or_else(|| "-".into())
                };
                emit(
                    &mut out,
                    format!(
                        "{:<17} {:<8} {:<7}  {:>22}  {:>22}  {:>22}  {:>22}  {}/{}",
                        case.name(),
                        method.name(),
                        client,
                        show(&fault),
                        show(&noone),
                        show(&promoted),
                        show(&switched),
                        rows.len() - recovered.len(),
                        rows.len()
                    ),
                );
            }
        }
    }
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/target/bench-haproxy.txt");
    let _ = std::fs::write(file, out);
}
