//! Issue 5's comparison, as a measurement (not a check): the fault cases of `sweep_netns.rs`
//! (hung primary: SIGSTOP of redis-server; dark primary host: its link down, no RST, no FIN),
//! each with a persistent INCR writer and a `BLPOP 0` client on the application host, measured
//! from the fault to the first success on the new primary:
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

mod netns;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use netns::{Host, Net, until};
use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

const HTTP_PORT: u16 = 8053;
/// Where a failed round's error and process logs go.
const FAILURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/target/bench-haproxy-failures.log");
const NOONE: &str = "+failover-state-send-slaveof-noone";
const HAPROXY_PORT: u16 = 6380;
/// Longest a client may take to recover before the round counts it as not recovered.
const RECOVERY_LIMIT: Duration = Duration::from_secs(30);
/// Reconnection attempts of one client in one round, at most (one every 20 ms or slower).
const MAX_ATTEMPTS: usize = 5_000;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

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
// The cluster: three DB hosts (redis-server + redis-sentinel), an application host, a control
// host, on one bridge.

struct Cluster {
    net: Net,
    db: Vec<Host>,
    app: Host,
    ctl: Host,
}

impl Cluster {
    async fn start(down_after_ms: u64) -> anyhow::Result<Cluster> {
        let net = Net::new()?;
        let db =
            (1..=3).map(|i| net.host(&format!("d{i}"), 10 + i)).collect::<Result<Vec<_>, _>>()?;
        let app = net.host("ap", 20)?;
        let ctl = net.host("ct", 30)?;
        let cluster = Cluster { net, db, app, ctl };
        if let Err(e) = cluster.start_redis(down_after_ms).await {
            anyhow::bail!("{e:#}\n{}", cluster.net.logs());
        }
        Ok(cluster)
    }

    fn primary(&self) -> SocketAddr {
        SocketAddr::new(self.db[0].ip, 6379)
    }

    async fn start_redis(&self, down_after_ms: u64) -> anyhow::Result<()> {
        for (i, host) in self.db.iter().enumerate() {
            let dir = self.net.dir.path().join(format!("redis-{i}"));
            std::fs::create_dir_all(&dir)?;
            let mut conf = format!(
                "bind {ip}\nprotected-mode no\nport 6379\ndaemonize no\ndir {d}\nsave \"\"\nappendonly no\n\
                 repl-diskless-sync yes\nrepl-diskless-sync-delay 0\nrepl-ping-replica-period 1\n",
                ip = host.ip,
                d = dir.display()
            );
            if i > 0 {
                conf.push_str(&format!("replicaof {} 6379\n", self.db[0].ip));
            }
            let path = dir.join("redis.conf");
            std::fs::write(&path, conf)?;
            let path = path.to_str().unwrap_or("").to_string();
            self.net.spawn(host, &format!("redis-{i}"), "redis-server", &[&path])?;
        }
        let primary = self.db[0].clone();
        until("replication", Duration::from_secs(30), || async {
            let info = self.cli(&primary, 6379, &["INFO", "replication"]);
            info.contains("connected_slaves:2").then_some(())
        })
        .await?;
        for (i, host) in self.db.iter().enumerate() {
            let dir = self.net.dir.path().join(format!("sentinel-{i}"));
            std::fs::create_dir_all(&dir)?;
            let conf = format!(
                "bind {ip}\nprotected-mode no\nport 26379\ndaemonize no\ndir {d}\n\
                 sentinel monitor mymaster {p} 6379 2\n\
                 sentinel down-after-milliseconds mymaster {down_after_ms}\n\
                 sentinel failover-timeout mymaster 5000\nsentinel parallel-syncs mymaster 1\n",
                ip = host.ip,
                d = dir.display(),
                p = self.db[0].ip
            );
            let path = dir.join("sentinel.conf");
            std::fs::write(&path, conf)?;
            let path = path.to_str().unwrap_or("").to_string();
            self.net.spawn(host, &format!("sentinel-{i}"), "redis-sentinel", &[&path])?;
        }
        for host in &self.db {
            until("sentinels to converge", Duration::from_secs(30), || async {
                let m = self.cli(host, 26379, &["SENTINEL", "MASTER", "mymaster"]);
                let fields: Vec<&str> = m.lines().collect();
                let get = |k: &str| {
                    fields.iter().position(|l| *l == k).and_then(|i| fields.get(i + 1)).copied()
                };
                (get("num-slaves") == Some("2") && get("num-other-sentinels") == Some("2"))
                    .then_some(())
            })
            .await?;
        }
        Ok(())
    }

    fn cli(&self, host: &Host, port: u16, args: &[&str]) -> String {
        let ip = host.ip.to_string();
        let port = port.to_string();
        let mut all = vec!["-h", ip.as_str(), "-p", port.as_str()];
        all.extend_from_slice(args);
        self.net.exec(host, "redis-cli", &all)
    }

    fn sentinels_yaml(&self) -> String {
        let list: Vec<String> = self.db.iter().map(|h| format!("\"{}:26379\"", h.ip)).collect();
        format!("sentinels:\n  addresses: [{}]\n", list.join(", "))
    }

    /// Starts polestar in `host`'s namespace and waits for `ready`.
    async fn polestar(
        &self,
        host: &Host,
        label: &str,
        listen: &str,
        extra: &str,
    ) -> anyhow::Result<()> {
        let yaml = format!("{}http:\n  listen: \"{listen}\"\n{extra}", self.sentinels_yaml());
        let path = self.net.dir.path().join(format!("{label}.yaml"));
        std::fs::write(&path, yaml)?;
        let path = path.to_str().unwrap_or("").to_string();
        self.net.spawn(host, label, netns::BIN, &["run", "-c", &path])?;
        let what = format!("{label} ready");
        let ready = until(&what, Duration::from_secs(30), || async {
            let log = self.net.log(label);
            if log.contains("Error:") {
                return Some(Err(anyhow::anyhow!("{label} failed:\n{log}")));
            }
            log.lines().any(|l| l.trim_end().ends_with("ready")).then_some(Ok(()))
        });
        ready.await?
    }

    /// HAProxy on the application host, listening on 127.0.0.1:6380 there, in front of the
    /// three redis-servers with the role checks issue 5 names.
    fn haproxy(&self) -> anyhow::Result<()> {
        let servers: String = self
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
        let path = self.net.dir.path().join("haproxy.cfg");
        std::fs::write(&path, conf)?;
        let path = path.to_str().unwrap_or("").to_string();
        self.net.spawn(&self.app, "haproxy", "haproxy", &["-db", "-f", &path])?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// A Lettuce-like client (as `netns/client.rs`): one persistent connection, no read timeout,
// reconnect only on a socket error. It asks polestar's HTTP API for the primary, or connects to
// a fixed address (HAProxy); either way it learns the serving node from `CLIENT INFO`.

#[derive(Clone, Debug)]
enum Target {
    Ask(String),
    Fixed(SocketAddr),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// `INCR` every 50 ms.
    Writer,
    /// `PING`, then `BLPOP <key> 0`, forever.
    Blocked,
}

#[derive(Default)]
struct Log {
    ok: Mutex<Vec<(SystemTime, SocketAddr)>>,
}

impl Log {
    fn first_ok_elsewhere(&self, old: SocketAddr, after: SystemTime) -> Option<SystemTime> {
        let ok = self.ok.lock().unwrap_or_else(|p| p.into_inner());
        ok.iter().find(|(t, a)| *a != old && *t >= after).map(|(t, _)| *t)
    }

    fn last_ok(&self) -> Option<(SystemTime, SocketAddr)> {
        self.ok.lock().unwrap_or_else(|p| p.into_inner()).last().copied()
    }

    fn ok(&self, node: SocketAddr) {
        self.ok.lock().unwrap_or_else(|p| p.into_inner()).push((SystemTime::now(), node));
    }
}

fn start_client(app: &Host, target: Target, mode: Mode, stop: CancellationToken) -> Arc<Log> {
    let log = Arc::new(Log::default());
    let log2 = log.clone();
    drop(netns::in_ns(app, move || async move {
        run_client(&target, mode, &log2, &stop).await;
        Ok(())
    }));
    log
}

async fn run_client(target: &Target, mode: Mode, log: &Log, stop: &CancellationToken) {
    let http =
        reqwest::Client::builder().timeout(Duration::from_secs(1)).build().unwrap_or_default();
    for _ in 0..MAX_ATTEMPTS {
        if stop.is_cancelled() {
            return;
        }
        let addr = match target {
            Target::Fixed(addr) => *addr,
            Target::Ask(url) => match ask(&http, url).await {
                Some(addr) => addr,
                None => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let session = async {
            let stream = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr))
                .await
                .map_err(|_| std::io::Error::other("connect timed out"))??;
            let _ = stream.set_nodelay(true);
            let mut stream = BufReader::new(stream);
            let node = serving_node(&mut stream).await?;
            serve(stream, node, mode, log).await
        };
        tokio::select! {
            _ = session => {}
            _ = stop.cancelled() => return,
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn ask(http: &reqwest::Client, url: &str) -> Option<SocketAddr> {
    let response = http.get(url).send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    response.text().await.ok()?.trim().parse().ok()
}

/// `CLIENT INFO`'s `laddr=`: the address of the node at the other end (also behind HAProxy).
async fn serving_node(stream: &mut BufReader<TcpStream>) -> std::io::Result<SocketAddr> {
    stream.get_mut().write_all(b"*2\r\n$6\r\nCLIENT\r\n$4\r\nINFO\r\n").await?;
    let mut header = String::new();
    if stream.read_line(&mut header).await? == 0 {
        return Err(std::io::Error::other("connection closed"));
    }
    let len: usize = header
        .strip_prefix('$')
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("CLIENT INFO: {}", header.trim())))?;
    let mut body = vec![0u8; len + 2];
    stream.read_exact(&mut body).await?;
    let text = String::from_utf8_lossy(&body);
    text.split_whitespace()
        .find_map(|f| f.strip_prefix("laddr="))
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| std::io::Error::other("CLIENT INFO without laddr"))
}

async fn serve(
    mut stream: BufReader<TcpStream>,
    node: SocketAddr,
    mode: Mode,
    log: &Log,
) -> std::io::Result<()> {
    loop {
        match mode {
            Mode::Writer => {
                command(&mut stream, "*2\r\n$4\r\nINCR\r\n$7\r\ncounter\r\n", 1).await?;
                log.ok(node);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Mode::Blocked => {
                command(&mut stream, "*1\r\n$4\r\nPING\r\n", 1).await?;
                log.ok(node);
                command(&mut stream, "*3\r\n$5\r\nBLPOP\r\n$5\r\nqueue\r\n$1\r\n0\r\n", 5).await?;
            }
        }
    }
}

/// Sends a command and reads `lines` reply lines, with no timeout (as the clients that hang).
async fn command(
    stream: &mut BufReader<TcpStream>,
    cmd: &str,
    lines: usize,
) -> std::io::Result<()> {
    stream.get_mut().write_all(cmd.as_bytes()).await?;
    for _ in 0..lines {
        let mut line = String::new();
        if stream.read_line(&mut line).await? == 0 {
            return Err(std::io::Error::other("connection closed"));
        }
        if line.starts_with('-') {
            return Err(std::io::Error::other(line.trim().to_string()));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Sentinel's own view: when each event was first seen, from the control host.

type Seen = Arc<Mutex<Vec<(String, SystemTime)>>>;

fn watch_sentinels(cluster: &Cluster, stop: &CancellationToken) -> Seen {
    let seen: Seen = Arc::default();
    for host in &cluster.db {
        let addr = SocketAddr::new(host.ip, 26379);
        let (seen, stop) = (seen.clone(), stop.clone());
        drop(netns::in_ns(&cluster.ctl, move || async move {
            let client = redis::Client::open(format!("redis://{addr}"))?;
            let mut pubsub = client.get_async_pubsub().await?;
            let channels =
                ["+failover-state-send-slaveof-noone", "+promoted-slave", "+switch-master"];
            pubsub.subscribe(&channels).await?;
            let mut stream = pubsub.on_message();
            loop {
                tokio::select! {
                    msg = stream.next() => {
                        let Some(msg) = msg else { return Ok(()) };
                        let at = SystemTime::now();
                        seen.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push((msg.get_channel_name().to_string(), at));
                    }
                    _ = stop.cancelled() => return Ok(()),
                }
            }
        }));
    }
    seen
}

fn first_seen(seen: &Seen, channel: &str) -> Option<SystemTime> {
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner());
    seen.iter().filter(|(c, _)| c == channel).map(|(_, t)| *t).min()
}

fn secs(from: SystemTime, to: SystemTime) -> f64 {
    to.duration_since(from).map(|d| d.as_secs_f64()).unwrap_or_else(|e| -e.duration().as_secs_f64())
}

// ---------------------------------------------------------------------------------------------
// One round.

async fn round(case: Case, method: Method, down_after_ms: u64) -> anyhow::Result<Round> {
    let cluster = Cluster::start(down_after_ms).await?;
    match round_in(&cluster, case, method).await {
        Ok(r) => Ok(r),
        Err(e) => Err(anyhow::anyhow!("{e:#}\n{}", cluster.net.logs())),
    }
}

async fn round_in(cluster: &Cluster, case: Case, method: Method) -> anyhow::Result<Round> {
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let seen = watch_sentinels(cluster, &stop);
    let target = match (method, case) {
        (Method::Polestar, Case::Hung) => {
            let ctl = &cluster.ctl;
            cluster.polestar(ctl, "ctl-polestar", &format!("{}:{HTTP_PORT}", ctl.ip), "").await?;
            let db1 = &cluster.db[0];
            let sweep = "sweep:\n  local_ports: [6379]\n";
            let listen = format!("{}:{HTTP_PORT}", db1.ip);
            cluster.polestar(db1, "node-polestar", &listen, sweep).await?;
            Target::Ask(format!("http://{}:{HTTP_PORT}/v1/masters/mymaster/primary", ctl.ip))
        }
        (Method::Polestar, Case::Dark) => {
            let listen = format!("127.0.0.1:{HTTP_PORT}");
            let sweep = "sweep:\n  remote: true\n";
            cluster.polestar(&cluster.app, "app-polestar", &listen, sweep).await?;
            Target::Ask(format!("http://{listen}/v1/masters/mymaster/primary"))
        }
        (Method::Haproxy, _) => {
            cluster.haproxy()?;
            // Let the first checks mark the replicas down (fall 2 x inter 500ms).
            tokio::time::sleep(Duration::from_millis(1500)).await;
            Target::Fixed(SocketAddr::from(([127, 0, 0, 1], HAPROXY_PORT)))
        }
    };
    let writer = start_client(&cluster.app, target.clone(), Mode::Writer, stop.clone());
    let blocked = start_client(&cluster.app, target, Mode::Blocked, stop.clone());
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
        out.writer = writer.first_ok_elsewhere(old, fault).map(|t| secs(fault, t));
        out.blocked = blocked.first_ok_elsewhere(old, fault).map(|t| secs(fault, t));
        out.noone = first_seen(&seen, NOONE).map(|t| secs(fault, t));
        out.promoted = first_seen(&seen, "+promoted-slave").map(|t| secs(fault, t));
        out.switched = first_seen(&seen, "+switch-master").map(|t| secs(fault, t));
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

fn median_max(values: &[f64]) -> Option<(f64, f64)> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let max = *v.last()?;
    let n = v.len();
    let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
    Some((median, max))
}

fn fmt(v: Option<f64>) -> String {
    v.map(|s| format!("{s:.3}")).unwrap_or_else(|| format!(">{}", RECOVERY_LIMIT.as_secs()))
}

fn emit(out: &mut String, line: String) {
    println!("{line}");
    out.push_str(&line);
    out.push('\n');
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
