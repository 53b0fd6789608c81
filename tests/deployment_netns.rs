//! Every deployment shape as shipped (conf/examples/), in one network-namespace lab with real
//! redis-server and redis-sentinel, the files run unmodified but for addresses, ports and
//! paths (replaced textually: [`crate::examples::install`]), no section added to watch them,
//! through a planned failover (`SENTINEL FAILOVER`), a hung primary (SIGSTOP) and a dark
//! primary host (its link down). Observed only from outside, as their users see them:
//!
//! - `d1..d3`: redis-server and Sentinel; a central polestar (central.yaml: DNS, HTTPS with the
//!   agent token, drain) and a node-side sweeper (node-sweeper.yaml) on each. Observed: their
//!   DNS and HTTPS answers; the old primary's `CLIENT LIST` (an idle client is drained); the old
//!   primary's socket table (no application connection left on a hung node).
//! - `ct`: the DNS-only (dns-only.yaml), HTTP-only (http-only.yaml) and Sentinel endpoint
//!   (sentinel-endpoint.yaml) polestars. Observed: DNS queries, `GET .../primary`,
//!   `SENTINEL GET-MASTER-ADDR-BY-NAME` after `AUTH`.
//! - `ap`: an agent following the Sentinels (agent-sentinels.yaml); `a2`: an agent following
//!   the three centrals over https (agent-upstreams.yaml); `a3`: no polestar. On each a
//!   Lettuce-like writer (one persistent connection, no read timeout, the primary looked up
//!   in the DNS-only polestar's zone before each connection). Observed: when each writes to the
//!   new primary, and the hosts' socket tables. On a hung primary a3's writer is freed by the
//!   node-side sweeper alone (CLIENT KILL reaches no stopped process); on a dark host only by an
//!   agent, so a3's writer stays stuck there (the control) while ap's and a2's come back.
//!
//! Before the handoff mask kept publishing without an `http:` section (issue 34) every shape
//! here but the central and HTTP-only ones served nothing: DNS-only answered NXDOMAIN, the
//! endpoint no primary, and no sweeper or agent swept.

use crate::examples;
use crate::netns;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use netns::client::{Client, Log, Target};
use netns::cluster::Cluster;
use netns::measure::secs;
use netns::{Host, until};
use nix::sys::signal::Signal;
use polestar_lab::tls::Certs;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio_util::sync::CancellationToken;

const DOWN_AFTER_MS: u64 = 1000;
/// A polestar's start, to `ready` (or its 10 s warning and `ready`).
const START: Duration = Duration::from_secs(30);
/// From a fault to every shape serving the new primary: Sentinel's detection and election,
/// then each polestar following.
const FOLLOW: Duration = Duration::from_secs(30);
/// From a fault to a writer writing on the new primary.
const RECOVER: Duration = Duration::from_secs(30);
/// An old primary rejoining as a replica once it runs again (Sentinel converts it).
const REJOIN: Duration = Duration::from_secs(60);
const ZONE_NAME: &str = "mymaster.redis.internal.";
const ENDPOINT_PASSWORD: &str = "endpoint-pa55";

/// The lab: the cluster, the extra application hosts, every polestar started from its example.
struct Deployment {
    cluster: Cluster,
    /// The agent following the three centrals.
    a2: Host,
    /// No polestar: its clients depend on the node-side sweepers and the drain.
    a3: Host,
    /// The CA that signed the centrals' HTTPS certificate.
    ca: PathBuf,
}

/// Where each shape answers, and where the writers look the primary up.
impl Deployment {
    fn dns_only(&self) -> SocketAddr {
        SocketAddr::new(self.cluster.ctl.ip, 53)
    }

    fn http_only(&self) -> String {
        format!("http://{}:8053/v1/masters/mymaster/primary", self.cluster.ctl.ip)
    }

    fn endpoint(&self) -> SocketAddr {
        SocketAddr::new(self.cluster.ctl.ip, 26379)
    }

    fn central_https(&self, i: usize) -> String {
        format!("https://{}:8053/v1/masters/mymaster/primary", self.cluster.db[i].ip)
    }

    fn central_dns(&self, i: usize) -> SocketAddr {
        SocketAddr::new(self.cluster.db[i].ip, 53)
    }

    /// Which `db` host serves `node`.
    fn db_of(&self, node: SocketAddr) -> usize {
        self.cluster.db.iter().position(|h| h.ip == node.ip()).unwrap_or(0)
    }
}

/// The address replacements for every example: the shipped Sentinel/data hosts 10.0.0.1-3 are
/// d1..d3, the DNS-only, HTTP-only and endpoint hosts (10.0.0.5, .6, .7) are all `ct`.
fn addresses(cluster: &Cluster) -> Vec<(String, String)> {
    let mut map: Vec<(String, String)> = cluster
        .db
        .iter()
        .enumerate()
        .map(|(i, h)| (format!("10.0.0.{}", i + 1), h.ip.to_string()))
        .collect();
    for shipped in ["10.0.0.5", "10.0.0.6", "10.0.0.7"] {
        map.push((shipped.to_string(), cluster.ctl.ip.to_string()));
    }
    map
}

/// Starts every shape from its example file, each in its place, and waits for each `ready`.
async fn start_shapes(cluster: &Cluster, a2: &Host) -> anyhow::Result<PathBuf> {
    let net = &cluster.net;
    let certs = Certs::generate(&net.dir.path().join("certs"))?;
    let ips: Vec<IpAddr> = cluster.db.iter().map(|h| h.ip).collect();
    let server = Certs::server(&net.dir.path().join("certs"), "api", &ips)?;
    let etc = net.dir.path().join("etc");
    examples::secrets(&etc, &certs, (&server.0, &server.1))?;
    let generic = addresses(cluster);
    let start = async |host: &Host, label: &str, example: &str, own: Vec<(String, String)>| {
        let dir = net.dir.path().join(label);
        std::fs::create_dir_all(&dir)?;
        let replace: Vec<(String, String)> = own.into_iter().chain(generic.clone()).collect();
        let path = examples::install(example, &dir, &etc, &replace)?;
        let path = path.to_string_lossy().into_owned();
        net.spawn(host, label, netns::BIN, &["run", "-c", &path])?;
        anyhow::Ok(())
    };
    let mut labels = Vec::new();
    for (i, host) in cluster.db.iter().enumerate() {
        // central.yaml is 10.0.0.1's: on the others its two listen addresses are the host's.
        let own = ["53", "8053"]
            .iter()
            .map(|port| (format!("\"10.0.0.1:{port}\""), format!("\"{}:{port}\"", host.ip)))
            .collect();
        start(host, &format!("central-{i}"), "central.yaml", own).await?;
        start(host, &format!("sweeper-{i}"), "node-sweeper.yaml", Vec::new()).await?;
        labels.extend([format!("central-{i}"), format!("sweeper-{i}")]);
    }
    for (label, example) in [
        ("dns-only", "dns-only.yaml"),
        ("http-only", "http-only.yaml"),
        ("endpoint", "sentinel-endpoint.yaml"),
    ] {
        start(&cluster.ctl, label, example, Vec::new()).await?;
        labels.push(label.to_string());
    }
    start(&cluster.app, "agent-sentinels", "agent-sentinels.yaml", Vec::new()).await?;
    start(a2, "agent-upstreams", "agent-upstreams.yaml", Vec::new()).await?;
    labels.extend(["agent-sentinels".to_string(), "agent-upstreams".to_string()]);
    for label in &labels {
        net.ready(label, START).await?;
    }
    Ok(certs.ca)
}

/// The A record of [`ZONE_NAME`] at `server`, asked over UDP from the current namespace.
async fn query_a(server: SocketAddr) -> anyhow::Result<Option<IpAddr>> {
    use hickory_proto::op::{Message, Query};
    use hickory_proto::rr::{Name, RData, RecordType};
    let socket = tokio::net::UdpSocket::bind("0.0.0.0:0").await?;
    let mut query = Message::query();
    query.add_query(Query::query(Name::from_ascii(ZONE_NAME)?, RecordType::A));
    socket.send_to(&query.to_vec()?, server).await?;
    let mut buf = vec![0u8; 1500];
    let (n, _) =
        tokio::time::timeout(Duration::from_millis(500), socket.recv_from(&mut buf)).await??;
    let answer = Message::from_vec(&buf[..n])?;
    Ok(answer.answers.iter().find_map(|r| match &r.data {
        RData::A(a) => Some(IpAddr::V4(a.0)),
        _ => None,
    }))
}

/// `SENTINEL GET-MASTER-ADDR-BY-NAME mymaster` at `endpoint`, after `AUTH`, as a
/// Sentinel-aware client asks it.
async fn ask_endpoint(endpoint: SocketAddr) -> anyhow::Result<Option<SocketAddr>> {
    let stream =
        tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(endpoint))
            .await??;
    let mut stream = BufReader::new(stream);
    let command = |args: &[&str]| {
        let mut out = format!("*{}\r\n", args.len());
        for a in args {
            out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        out
    };
    let line = async |stream: &mut BufReader<tokio::net::TcpStream>| {
        let mut line = String::new();
        let read = tokio::time::timeout(Duration::from_secs(1), stream.read_line(&mut line));
        read.await??;
        anyhow::Ok(line.trim_end().to_string())
    };
    stream.get_mut().write_all(command(&["AUTH", ENDPOINT_PASSWORD]).as_bytes()).await?;
    let auth = line(&mut stream).await?;
    anyhow::ensure!(auth == "+OK", "AUTH: {auth}");
    let ask = command(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"]);
    stream.get_mut().write_all(ask.as_bytes()).await?;
    let header = line(&mut stream).await?;
    if header != "*2" {
        return Ok(None);
    }
    let mut parts = Vec::new();
    for _ in 0..2 {
        let _length = line(&mut stream).await?;
        parts.push(line(&mut stream).await?);
    }
    Ok(format!("{}:{}", parts[0], parts[1]).parse().ok())
}

/// `GET url` (`ip:port` as text), verified against `ca` when given.
async fn ask_http(url: String, ca: Option<PathBuf>) -> anyhow::Result<Option<SocketAddr>> {
    let mut http = reqwest::Client::builder().timeout(Duration::from_secs(1));
    if let Some(ca) = &ca {
        http = http.use_preconfigured_tls(polestar::tls::https_client_config(Some(ca))?);
    }
    let response = http.build()?.get(url).send().await?;
    if !response.status().is_success() {
        return Ok(None);
    }
    Ok(response.text().await?.trim().parse().ok())
}

/// What one shape answers now, asked from `from`'s namespace: the primary, or why none.
async fn answer<F, Fut>(from: &Host, ask: F) -> String
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<Option<SocketAddr>>>,
{
    match netns::in_ns(from, ask).await {
        Ok(Ok(Some(addr))) => addr.to_string(),
        Ok(Ok(None)) => "no primary".to_string(),
        Ok(Err(e)) => format!("error: {e:#}"),
        Err(e) => format!("error: {e}"),
    }
}

/// Every publishing shape's answer, asked from a3, skipping the centrals on `dark`.
async fn answers(d: &Deployment, dark: Option<usize>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let a3 = &d.a3;
    let server = d.dns_only();
    let dns = |server: SocketAddr| async move {
        Ok(query_a(server).await?.map(|ip| SocketAddr::new(ip, 6379)))
    };
    out.push(("dns-only (DNS)".to_string(), answer(a3, move || dns(server)).await));
    let url = d.http_only();
    out.push(("http-only (HTTP)".to_string(), answer(a3, move || ask_http(url, None)).await));
    let endpoint = d.endpoint();
    let ask = move || ask_endpoint(endpoint);
    out.push(("endpoint (SENTINEL GET-MASTER-ADDR-BY-NAME)".to_string(), answer(a3, ask).await));
    for i in (0..d.cluster.db.len()).filter(|i| Some(*i) != dark) {
        let server = d.central_dns(i);
        out.push((format!("central-{i} (DNS)"), answer(a3, move || dns(server)).await));
        let (url, ca) = (d.central_https(i), Some(d.ca.clone()));
        out.push((format!("central-{i} (HTTPS)"), answer(a3, move || ask_http(url, ca)).await));
    }
    out
}

/// Waits until every publishing shape serves `primary`; fails listing what each serves.
async fn all_serve(d: &Deployment, primary: SocketAddr, dark: Option<usize>) -> anyhow::Result<()> {
    let want = primary.to_string();
    let deadline = tokio::time::Instant::now() + FOLLOW;
    loop {
        let now = answers(d, dark).await;
        if now.iter().all(|(_, a)| *a == want) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            let table: Vec<String> = now.iter().map(|(s, a)| format!("  {s}: {a}")).collect();
            anyhow::bail!("not every shape serves {want} after {FOLLOW:?}:\n{}", table.join("\n"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The primary the Sentinels on the hosts other than `skip` name, once one names another
/// than `old`.
async fn new_primary(d: &Deployment, old: SocketAddr, skip: usize) -> anyhow::Result<SocketAddr> {
    until("the Sentinels to name a new primary", FOLLOW, || async {
        (0..d.cluster.db.len()).filter(|i| *i != skip).find_map(|i| {
            let host = &d.cluster.db[i];
            let reply =
                d.cluster.cli(host, 26379, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"]);
            let mut lines = reply.lines();
            let addr: SocketAddr = format!("{}:{}", lines.next()?, lines.next()?).parse().ok()?;
            (addr != old).then_some(addr)
        })
    })
    .await
}

/// The writers of the three application hosts.
struct Writers {
    logs: Vec<(&'static str, Arc<Log>)>,
}

impl Writers {
    /// A Lettuce-like writer on `ap`, `a2` and `a3`, each looking the primary up in the
    /// DNS-only polestar's zone before every connection.
    fn start(d: &Deployment, stop: &CancellationToken) -> Writers {
        let server = d.dns_only();
        let target = Target::lookup(move || async move {
            query_a(server).await.ok().flatten().map(|ip| SocketAddr::new(ip, 6379))
        });
        let hosts = [("ap", &d.cluster.app), ("a2", &d.a2), ("a3", &d.a3)];
        let logs = hosts
            .into_iter()
            .map(|(name, host)| (name, Client::writer(target.clone()).start_in(host, stop.clone())))
            .collect();
        Writers { logs }
    }

    fn log(&self, name: &str) -> &Arc<Log> {
        &self.logs.iter().find(|(n, _)| *n == name).expect("a writer").1
    }

    /// Waits until the writers named write on `primary` after `fault`; returns each one's
    /// fault -> first write there, in seconds.
    async fn on(
        &self,
        names: &[&str],
        old: SocketAddr,
        primary: SocketAddr,
        fault: SystemTime,
    ) -> anyhow::Result<Vec<(String, f64)>> {
        let mut times = Vec::new();
        for name in names {
            let log = self.log(name);
            let what = format!("the {name} writer on {primary}");
            let (at, node) =
                until(&what, RECOVER, || async { log.first_ok_elsewhere(old, fault) }).await?;
            anyhow::ensure!(node == primary, "the {name} writer went to {node}, not {primary}");
            times.push((name.to_string(), secs(fault, at)));
        }
        Ok(times)
    }
}

/// An idle client of the primary on a3, named `deploy-idle` (a pooled connection): only a drain
/// disconnects it when the primary is demoted. Held until `stop`.
fn idle_client(d: &Deployment, primary: SocketAddr, stop: &CancellationToken) {
    let stop = stop.clone();
    drop(netns::in_ns(&d.a3, move || async move {
        let mut stream = BufReader::new(tokio::net::TcpStream::connect(primary).await?);
        stream
            .get_mut()
            .write_all(b"*3\r\n$6\r\nCLIENT\r\n$7\r\nSETNAME\r\n$11\r\ndeploy-idle\r\n")
            .await?;
        let mut line = String::new();
        stream.read_line(&mut line).await?;
        let mut rest = String::new();
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = stream.read_line(&mut rest) => {}
        }
        anyhow::Ok(())
    }));
}

/// The established TCP connections of `host` on local (`sport`) or remote (`dport`) port 6379,
/// as `ss` lists them: `local peer` per line.
fn sockets(d: &Deployment, host: &Host, side: &str) -> String {
    let filter = format!("( {side} = :6379 )");
    d.cluster.net.exec(host, "ss", &["-Htn", "state", "established", &filter])
}

/// Waits until `node` (on `db[i]`) is a replica with its link up, once it runs again.
async fn rejoined(d: &Deployment, i: usize) -> anyhow::Result<()> {
    let host = &d.cluster.db[i];
    until("the old primary to rejoin as a replica", REJOIN, || async {
        let info = d.cluster.cli(host, 6379, &["INFO", "replication"]);
        (info.contains("role:slave") && info.contains("master_link_status:up")).then_some(())
    })
    .await
}

fn report(line: String) {
    eprintln!("DEPLOYMENT {line}");
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/target/deployment-shapes.txt");
    let _ = std::fs::OpenOptions::new().create(true).append(true).open(file).and_then(|mut f| {
        use std::io::Write;
        writeln!(f, "{line}")
    });
}

fn times(list: &[(String, f64)]) -> String {
    list.iter().map(|(n, t)| format!("{n} {t:.2}s")).collect::<Vec<_>>().join(", ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shipped_shape_serves_and_sweeps_through_planned_hung_and_dark_failovers() {
    let _serial = netns::SERIAL.lock().await;
    let cluster = Cluster::start(DOWN_AFTER_MS).await.unwrap_or_else(|e| panic!("{e:#}"));
    let hosts = cluster.net.host("a2", 21).and_then(|a2| Ok((a2, cluster.net.host("a3", 22)?)));
    let (a2, a3) = hosts.unwrap_or_else(|e| panic!("{e:#}"));
    let ca = start_shapes(&cluster, &a2).await;
    let ca = cluster.net.with_logs(ca).unwrap_or_else(|e| panic!("{e:#}"));
    let d = Deployment { cluster, a2, a3, ca };
    let result = through_faults(&d).await;
    d.cluster.net.with_logs(result).unwrap_or_else(|e| panic!("{e:#}"));
}

async fn through_faults(d: &Deployment) -> anyhow::Result<()> {
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let first = d.cluster.primary();
    all_serve(d, first, None).await.map_err(|e| e.context("at start"))?;
    let writers = Writers::start(d, &stop);
    writers.on(&["ap", "a2", "a3"], "0.0.0.0:0".parse()?, first, SystemTime::now()).await?;

    // Planned: every shape follows; the drain disconnects the idle client of the old primary.
    idle_client(d, first, &stop);
    let old_db = d.db_of(first);
    let listed = |node: &Host| d.cluster.cli(node, 6379, &["CLIENT", "LIST"]);
    until("the idle client on the primary", START, || async {
        listed(&d.cluster.db[old_db]).contains("name=deploy-idle").then_some(())
    })
    .await?;
    let fault = SystemTime::now();
    let reply = d.cluster.cli(&d.cluster.db[1], 26379, &["SENTINEL", "FAILOVER", "mymaster"]);
    anyhow::ensure!(reply.trim() == "OK", "SENTINEL FAILOVER: {reply}");
    let planned = new_primary(d, first, usize::MAX).await?;
    all_serve(d, planned, None).await.map_err(|e| e.context("after the planned failover"))?;
    let recovered = writers.on(&["ap", "a2", "a3"], first, planned, fault).await?;
    until("the drain of the idle client", FOLLOW, || async {
        (!listed(&d.cluster.db[old_db]).contains("name=deploy-idle")).then_some(())
    })
    .await?;
    report(format!(
        "planned {first} -> {planned}: writers {}; idle client drained",
        times(&recovered)
    ));
    rejoined(d, old_db).await?;

    // Hung: a3's writer has only the node-side sweeper of the hung node's host.
    let hung_db = d.db_of(planned);
    let fault = SystemTime::now();
    d.cluster.net.signal(&format!("redis-{hung_db}"), Signal::SIGSTOP)?;
    let hung = new_primary(d, planned, hung_db).await?;
    all_serve(d, hung, None).await.map_err(|e| e.context("with the primary hung"))?;
    let recovered = writers.on(&["a3", "ap", "a2"], planned, hung, fault).await?;
    let apps: Vec<String> =
        [&d.cluster.app, &d.a2, &d.a3].iter().map(|h| format!(" {}:", h.ip)).collect();
    until("no application connection left on the hung node", FOLLOW, || async {
        let table = sockets(d, &d.cluster.db[hung_db], "sport");
        (!apps.iter().any(|a| table.contains(a.as_str()))).then_some(())
    })
    .await?;
    report(format!(
        "hung {planned} -> {hung}: writers {}; the hung node's socket table holds no application connection",
        times(&recovered)
    ));
    d.cluster.net.signal(&format!("redis-{hung_db}"), Signal::SIGCONT)?;
    rejoined(d, hung_db).await?;

    // Dark: the node-side sweeper and the central there are dark too; the agents free their
    // hosts' writers, a3's stays on the dark node (the control).
    let dark_db = d.db_of(hung);
    let fault = SystemTime::now();
    d.cluster.net.go_dark(&d.cluster.db[dark_db])?;
    let dark = new_primary(d, hung, dark_db).await?;
    all_serve(d, dark, Some(dark_db)).await.map_err(|e| e.context("with the primary dark"))?;
    let recovered = writers.on(&["ap", "a2"], hung, dark, fault).await?;
    let to_old = format!(" {hung}");
    for host in [&d.cluster.app, &d.a2] {
        let table = sockets(d, host, "dport");
        anyhow::ensure!(!table.contains(&to_old), "{} still holds {to_old}: {table}", host.ns);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let a3 = writers.log("a3").first_ok_elsewhere(hung, fault);
    anyhow::ensure!(a3.is_none(), "a3's writer, with no agent, left the dark node: {a3:?}");
    anyhow::ensure!(
        sockets(d, &d.a3, "dport").contains(&to_old),
        "a3's writer is no longer connected to the dark node"
    );
    report(format!(
        "dark {hung} -> {dark}: writers {}; a3 (no agent) still on the dark node",
        times(&recovered)
    ));
    d.cluster.net.go_light(&d.cluster.db[dark_db])?;
    Ok(())
}
