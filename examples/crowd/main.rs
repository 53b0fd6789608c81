//! Crowds on one release polestar (bench/README.md, "Crowds"), all on loopback, every count
//! bounded:
//!
//! - `crowd sentinel N`: a real lab (3 nodes, 3 Sentinels), polestar with its Sentinel
//!   endpoint, N subscribers of `+switch-master`, then a real failover (`SENTINEL FAILOVER`).
//! - `crowd agents N [feed|reread]`: the same lab, polestar with an agent token, N
//!   agent-equivalents that do what an agent's follower does (`src/agent/mod.rs`) with the
//!   token: `feed` (the default), one connection holds `GET /v1/events/stream?masters=only`
//!   and applies every `masters` event with the agent's own reader and `feed::Served`;
//!   `reread`, what agents did before the feed, the event stream plus a second, kept-alive
//!   connection that reads `GET /v1/masters` at the start, after every chunk holding an
//!   event, and after 5 s without one.
//! - `crowd hold ADDR N`: N subscribers on a running Sentinel endpoint, held until killed (for
//!   `bench/dns.sh` with `SUBSCRIBERS=N`); prints `attached N` once they are.
//!
//! The latency of each client is (the instant it has the new primary: the kernel's receive
//! stamp of the bytes that told it) minus polestar's publication, the `time_ms` of the
//! `switch` event in `/v1/events` (the event is recorded just after the snapshot is
//! published, in whole milliseconds, so a client can be up to about a millisecond "early");
//! also shown relative to the first client, and for agents, when this (niced) client had
//! parsed and applied it. RSS of polestar: before
//! the crowd, with it attached, after the switch, and its peak (VmHWM).
//!
//! Sources are spread over 127.0.x.y so that the per-address caps (256 on the Sentinel
//! endpoint, 512 on HTTP) hold. A process cannot hold more descriptors than RLIMIT_NOFILE's
//! hard limit: N is clamped to what both this process and polestar can hold, and the output
//! says so. Run by `bench/sentinel-api-crowd.sh`, `bench/agents-crowd.sh` and `bench/dns.sh`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod probe;
mod stamp;

use anyhow::{Context, bail};
use polestar::agent::{feed, sse};
use polestar::http::view::{MasterView, MastersEvent};
use polestar_lab::{Lab, LabOptions};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, timeout};

/// Connections opened at once while the crowd is set up.
const WAVE: usize = 500;
const SETUP: Duration = Duration::from_secs(240);
/// From `SENTINEL FAILOVER` accepted to the last client that may still hear it.
const HEAR: Duration = Duration::from_secs(30);
/// The agent's `RESYNC`: re-read `/v1/masters` after this long without a chunk.
const RESYNC: Duration = Duration::from_secs(5);
const TOKEN: &str = "crowd-bench-agent-token";
/// Descriptors kept free for everything else of a process.
const SPARE_FDS: u64 = 400;

/// Kills polestar when dropped, also on an error or a panic.
struct Daemon {
    child: Child,
    log: std::path::PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    fn start(dir: &Path, yaml: &str) -> anyhow::Result<Daemon> {
        let bin =
            std::env::var("POLESTAR_BIN").unwrap_or_else(|_| "target/release/polestar".into());
        let config = dir.join("polestar.yaml");
        std::fs::write(&config, yaml)?;
        let log = dir.join("polestar.log");
        let out = std::fs::File::create(&log)?;
        let child = Command::new(&bin)
            .args(["run", "-c"])
            .arg(&config)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("cannot start {bin}"))?;
        Ok(Daemon { child, log })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The address logged after `prefix`, once `ready` is logged too.
    async fn wait_addr(&self, prefix: &str) -> anyhow::Result<SocketAddr> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let found = log.lines().find_map(|line| {
                let rest = &line[line.find(prefix)? + prefix.len()..];
                rest.split_whitespace().next()?.parse().ok()
            });
            let ready = log.lines().any(|l| l.trim_end().ends_with("ready"));
            if let Some(addr) = found.filter(|_| ready) {
                return Ok(addr);
            }
            if Instant::now() > deadline {
                bail!("polestar not ready within 60 s:\n{log}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn proc_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap_or("");
    line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or(0)
}

/// CPU time (user + system) of process `pid` ("self" for this one) in milliseconds.
fn cpu_ms(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at the last ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Clock ticks of 10 ms (CLK_TCK 100 on Linux).
    (field(11) + field(12)) * 10.0
}

/// CPU time (ns) of the threads of process `pid` named `name` (every thread for `None`), from
/// the scheduler's account.
fn threads_cpu_ns(pid: u32, name: Option<&str>) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten();
    let named = |t: &std::fs::DirEntry| {
        name.is_none_or(|n| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == n)
        })
    };
    tasks
        .filter(named)
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()))
        .sum()
}

/// CPU used so far: polestar's (ms), its Sentinel-endpoint threads' (ns), this process's (ms).
#[derive(Clone, Copy)]
struct Cpu {
    polestar: f64,
    endpoint: u64,
    client: f64,
}

impl Cpu {
    fn now(pid: u32) -> Cpu {
        Cpu {
            polestar: cpu_ms(&pid.to_string()),
            endpoint: threads_cpu_ns(pid, Some("sentinel-api")),
            client: cpu_ms("self"),
        }
    }

    /// What was used since `self`, for `count` clients.
    fn since(self, pid: u32, count: usize) -> String {
        let now = Cpu::now(pid);
        let endpoint = now.endpoint.saturating_sub(self.endpoint) as f64 / 1e6;
        format!(
            "CPU from the failover until the last one heard it: polestar {:.0} ms (its Sentinel \
             endpoint's threads {endpoint:.1} ms, {:.1} us per client), this client {:.0} ms",
            now.polestar - self.polestar,
            endpoint * 1e3 / count.max(1) as f64,
            now.client - self.client
        )
    }
}

fn mb(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Raises the soft RLIMIT_NOFILE to the hard limit; returns that limit.
fn raise_fd_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else { return 1024 };
    let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    hard
}

/// At most `per_client` connections of one source address, sources spread round-robin.
fn source(i: usize, addresses: usize) -> SocketAddr {
    let a = i % addresses;
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 20 + (a / 250) as u8, 1 + (a % 250) as u8)), 0)
}

async fn connect(from: SocketAddr, to: SocketAddr) -> anyhow::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(from)?;
    Ok(socket.connect(to).await?)
}

fn now_ms() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs_f64() * 1e3
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim().to_string()
}

/// `p` (0..=100) of sorted `values`.
fn pct(values: &[f64], p: usize) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values[((values.len() - 1) * p).div_ceil(100)]
}

/// Prints p50, p99, max and the share within 100 ms of `arrivals` (Unix ms) after `from`.
fn summary(what: &str, arrivals: &[f64], from: f64, count: usize) -> String {
    let lat: Vec<f64> = arrivals.iter().map(|a| a - from).collect();
    let within = lat.iter().filter(|l| **l <= 100.0).count();
    format!(
        "{what}: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms, within 100 ms {within} of {count} \
         ({:.2} %)",
        pct(&lat, 50),
        pct(&lat, 99),
        lat.last().copied().unwrap_or(f64::NAN),
        100.0 * within as f64 / count.max(1) as f64
    )
}

/// The `time_ms` of the first `switch` of `master` at or after `since` (Unix ms).
async fn switch_time(http: SocketAddr, master: &str, since: f64) -> anyhow::Result<f64> {
    // With the token: the crowd may hold every anonymous connection slot.
    let url = format!("http://{http}/v1/events");
    let events: Vec<Value> =
        reqwest::Client::new().get(url).bearer_auth(TOKEN).send().await?.json().await?;
    let switch = events.iter().find(|e| {
        e["kind"] == "switch"
            && e["master"] == master
            && e["time_ms"].as_f64().is_some_and(|t| t + 1.0 >= since)
    });
    switch.and_then(|e| e["time_ms"].as_f64()).context("no switch event in /v1/events")
}

fn lab_yaml(lab: &Lab) -> String {
    let sentinels: Vec<String> = lab.sentinel_addrs().iter().map(|s| format!("\"{s}\"")).collect();
    format!(
        "sentinels:\n  addresses: [{}]\nmasters:\n  - name: \"{}\"\nhttp:\n  listen: \
         \"127.0.0.1:0\"\n",
        sentinels.join(", "),
        lab.master_name()
    )
}

/// What a crowd heard of one real failover: when each member first had the new primary
/// (Unix ms), how many heard something else first, and polestar's cost over it.
struct Heard {
    new: SocketAddr,
    arrivals: Vec<f64>,
    other: usize,
    /// polestar's `switch` event.
    published: f64,
    first: f64,
    cpu: String,
    /// polestar's CPU from its publication to the last arrival, and what share of the cores it
    /// had over that time.
    fanout: String,
    after: u64,
    peak: u64,
    load_before: String,
}

/// Fails `lab` over and collects what the crowd reports on `rx` (`Some(at)`: has the new
/// primary; `None`: heard something else first) until `count` reported or [`HEAR`] passed.
async fn hear_failover(
    lab: &Lab,
    daemon: &Daemon,
    http: SocketAddr,
    rx: &mut mpsc::UnboundedReceiver<Option<f64>>,
    count: usize,
) -> anyhow::Result<Heard> {
    let load_before = loadavg();
    let cpu = Cpu::now(daemon.pid());
    let sampler = CpuSampler::start(daemon.pid());
    let (asked, new) = failover(lab).await?;
    let (mut arrivals, mut other) = (Vec::with_capacity(count), 0);
    let end = Instant::now() + HEAR;
    while arrivals.len() + other < count {
        match timeout(end.saturating_duration_since(Instant::now()), rx.recv()).await {
            Ok(Some(Some(at))) => arrivals.push(at),
            Ok(Some(None)) => other += 1,
            _ => break,
        }
    }
    let cpu = cpu.since(daemon.pid(), count);
    let samples = sampler.finish();
    let after = proc_kib(daemon.pid(), "VmRSS:");
    let peak = proc_kib(daemon.pid(), "VmHWM:");
    let published = switch_time(http, lab.master_name(), asked).await?;
    arrivals.sort_by(f64::total_cmp);
    let first = arrivals.first().copied().unwrap_or(f64::NAN);
    let last = arrivals.last().copied().unwrap_or(published);
    let fanout = fanout(&samples, published, last, count);
    Ok(Heard { new, arrivals, other, published, first, cpu, fanout, after, peak, load_before })
}

/// polestar's CPU time (every thread's, the scheduler's account in ns) sampled with the time
/// (Unix ms) every millisecond, from a thread of its own, until finished.
struct CpuSampler {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<(f64, u64)>>,
}

impl CpuSampler {
    fn start(pid: u32) -> CpuSampler {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut samples = Vec::with_capacity(60_000);
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) && samples.len() < 600_000 {
                samples.push((now_ms(), threads_cpu_ns(pid, None)));
                std::thread::sleep(Duration::from_millis(1));
            }
            samples
        });
        CpuSampler { stop, thread }
    }

    fn finish(self) -> Vec<(f64, u64)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// polestar's CPU between `from` and `to` (Unix ms: its publication and the last arrival),
/// per client, and the cores it had meanwhile (CPU over wall time).
fn fanout(samples: &[(f64, u64)], from: f64, to: f64, count: usize) -> String {
    let at = |t: f64| samples.iter().rev().find(|(when, _)| *when <= t).or(samples.first());
    let (Some((t0, c0)), Some((t1, c1))) = (at(from), samples.iter().find(|(when, _)| *when >= to))
    else {
        return "polestar's CPU over the fan-out: not sampled".into();
    };
    let cpu = c1.saturating_sub(*c0) as f64 / 1e6;
    format!(
        "polestar's CPU from its publication to the last arrival: {cpu:.1} ms ({:.1} us per \
         client) over {:.1} ms ({:.2} cores)",
        cpu * 1e3 / count.max(1) as f64,
        t1 - t0,
        cpu / (t1 - t0).max(1e-3)
    )
}

/// polestar's RSS before the crowd, with it attached, and after the failover.
fn print_rss(who: &str, before: u64, attached: u64, count: usize, heard: &Heard) {
    println!(
        "  polestar RSS: before {:.1} MB, attached {:.1} MB (+{:.1} KiB per {who}), after the \
         switch {:.1} MB, peak {:.1} MB",
        mb(before),
        mb(attached),
        attached.saturating_sub(before) as f64 / count.max(1) as f64,
        mb(heard.after),
        mb(heard.peak)
    );
}

/// The failover, and how long until every Sentinel names the new primary.
async fn failover(lab: &Lab) -> anyhow::Result<(f64, SocketAddr)> {
    let old = lab.primary().await?;
    let started = now_ms();
    lab.failover().await?;
    let new = lab.wait_for_primary_change(old, HEAR).await?;
    Ok((started, new))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let hard = raise_fd_limit();
    let number = |i: usize, default: usize| {
        args.get(i).and_then(|a| a.parse::<usize>().ok()).unwrap_or(default)
    };
    match args.first().map(String::as_str) {
        Some("sentinel") => sentinel_crowd(number(1, 20_000), hard).await,
        Some("agents") => {
            let follow = Follow::parse(args.get(2).map(String::as_str))?;
            agent_crowd(number(1, 10_000), follow, hard).await
        }
        Some("hold") => {
            let addr: SocketAddr = args.get(1).context("crowd hold ADDR N")?.parse()?;
            hold(addr, number(2, 20_000), hard).await
        }
        _ => bail!("usage: crowd sentinel N | crowd agents N [feed|reread] | crowd hold ADDR N"),
    }
}

/// Clamps `want` clients of `per_client` descriptors each to the hard limit.
fn clamp(want: usize, per_client: u64, hard: u64) -> usize {
    let most = (hard.saturating_sub(SPARE_FDS) / per_client) as usize;
    if want > most {
        println!(
            "note: {want} asked, {most} run: RLIMIT_NOFILE's hard limit is {hard} here (for this \
             process and polestar alike, and raising it needs CAP_SYS_RESOURCE)"
        );
    }
    want.min(most)
}

// --- Sentinel-endpoint subscribers --------------------------------------------------------

/// One subscriber of `+switch-master`, confirmed.
async fn subscriber(api: SocketAddr, from: SocketAddr) -> anyhow::Result<TcpStream> {
    let mut s = connect(from, api).await?;
    stamp::enable(&s)?;
    s.write_all(b"SUBSCRIBE +switch-master\r\n").await?;
    let (mut seen, mut chunk) = (Vec::new(), [0u8; 256]);
    while !seen.ends_with(b":1\r\n") {
        let n = s.read(&mut chunk).await?;
        anyhow::ensure!(n > 0, "closed: {:?}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&chunk[..n]);
    }
    Ok(s)
}

/// `count` confirmed subscribers, 200 per source address (the cap is 256).
async fn subscribers(api: SocketAddr, count: usize) -> anyhow::Result<Vec<TcpStream>> {
    let addresses = count.div_ceil(200).max(1);
    let mut streams = Vec::with_capacity(count);
    let deadline = Instant::now() + SETUP;
    for wave in (0..count).collect::<Vec<_>>().chunks(WAVE) {
        let connects = wave.iter().map(|&i| subscriber(api, source(i, addresses)));
        let left = deadline.saturating_duration_since(Instant::now());
        let done = timeout(left, futures::future::join_all(connects)).await;
        for s in done.context("setup took too long")? {
            streams.push(s.context("a subscriber")?);
        }
    }
    Ok(streams)
}

async fn sentinel_crowd(want: usize, hard: u64) -> anyhow::Result<()> {
    let count = clamp(want, 1, hard);
    let lab = Lab::start(LabOptions::default()).await?;
    let dir = tempfile::tempdir()?;
    // DNS for the probes, without the rate limit (they ask one name 500 times a second).
    let yaml = format!(
        "{}dns:\n  listen: [\"127.0.0.1:0\"]\n  zone: {ZONE}\n  rate_limit: 0\nsentinel_api:\n  \
         listen: [\"127.0.0.1:0\"]\n  max_connections: {}\n",
        lab_yaml(&lab),
        count + 100
    );
    let daemon = Daemon::start(dir.path(), &yaml)?;
    let api = daemon.wait_addr("listening for Sentinel API on ").await?;
    let http = daemon.wait_addr("listening for HTTP on ").await?;
    let dns = daemon.wait_addr("listening for DNS on ").await?;
    let before = proc_kib(daemon.pid(), "VmRSS:");

    let started = Instant::now();
    let streams = subscribers(api, count).await?;
    let setup = started.elapsed();
    let attached = proc_kib(daemon.pid(), "VmRSS:");

    let (tx, mut rx) = mpsc::unbounded_channel();
    let unstamped = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for s in streams {
        let (tx, unstamped) = (tx.clone(), unstamped.clone());
        tokio::spawn(async move {
            let mut chunk = [0u8; 512];
            if let Ok((n @ 1.., at)) = stamp::read(&s, &mut chunk).await {
                if at.is_none() {
                    unstamped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                let at = at.unwrap_or_else(now_ms);
                let switch = chunk[..n].windows(14).any(|w| w == b"+switch-master");
                let _ = tx.send(switch.then_some(at));
            }
            // Held until the end.
            let _ = stamp::read(&s, &mut chunk).await;
        });
    }
    drop(tx);
    let prober = probe::Prober::start(probe::Target {
        dns,
        name: format!("{}.{ZONE}", dns_label(http, lab.master_name()).await?),
        http,
        master: lab.master_name().to_string(),
    })?;
    let nice = renice_crowd(prober.tid);
    let polestar_nice = renice_polestar(daemon.pid());
    tokio::time::sleep(PROBE_BASELINE).await;
    let heard = hear_failover(&lab, &daemon, http, &mut rx, count).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let probes = prober.finish();
    let heard = heard?;
    let Heard { new, ref arrivals, other, published, first, ref cpu, ref load_before, .. } = heard;
    println!(
        "SENTINEL_API_CROWD subscribers={count} setup={:.1}s new_primary={new}",
        setup.as_secs_f64()
    );
    print_rss("subscriber", before, attached, count, &heard);
    println!(
        "  heard +switch-master: {} of {count} (other first message: {other}; arrival is the \
         kernel's receive stamp, missing for {}; this client's threads at nice {nice}, \
         polestar's at {polestar_nice})",
        arrivals.len(),
        unstamped.load(std::sync::atomic::Ordering::Relaxed)
    );
    println!("  {}", summary("from polestar's publication", arrivals, published, count));
    println!("  {}", summary("from the first subscriber", arrivals, first, count));
    let last = arrivals.last().copied().unwrap_or(published).max(published + 10.0);
    for (kind, what) in [(probe::Kind::Dns, "DNS A"), (probe::Kind::Http, "HTTP .../primary")] {
        let base = probe::summary(&probes, kind, published - PROBE_BASELINE_MS, published - 50.0);
        let during = probe::summary(&probes, kind, published, last);
        println!("  {what}: before the failover {base}; during the fan-out {during}");
    }
    println!("  {cpu}");
    println!("  loadavg before the failover: {load_before}; after: {}", loadavg());
    anyhow::ensure!(arrivals.len() == count, "not every subscriber heard the switch");
    Ok(())
}

const ZONE: &str = "redis.internal.";
/// How long the probes run before the failover, for the unloaded figures.
const PROBE_BASELINE: Duration = Duration::from_secs(2);
const PROBE_BASELINE_MS: f64 = 2000.0;

/// The master's DNS label, as `/v1/masters` names it.
async fn dns_label(http: SocketAddr, master: &str) -> anyhow::Result<String> {
    let url = format!("http://{http}/v1/masters/{master}");
    let view: Value = reqwest::Client::new().get(url).send().await?.json().await?;
    view["dns_name"].as_str().map(str::to_string).with_context(|| format!("no dns_name: {view}"))
}

/// Lowers every thread of this process but `keep` (the probes; -1 for none), and of the lab's
/// Redis and Sentinel processes, to nice `CROWD_NICE` (default 10), so that while polestar fans
/// out its threads take the CPU first: in a deployment the clients and the data nodes are
/// other hosts (measured: without it, redis-server resyncing after the failover preempted the
/// fan-out more than anything else). The clients' arrivals are the kernel's stamps, which
/// this does not move. Returns the niceness.
fn renice_crowd(keep: i32) -> i32 {
    let nice = std::env::var("CROWD_NICE").ok().and_then(|n| n.parse().ok()).unwrap_or(10);
    let mut tids = threads("self");
    tids.retain(|t| t.parse::<i32>().ok() != Some(keep));
    for lab in lab_processes() {
        tids.extend(threads(&lab));
    }
    if !renice(nice, &tids) {
        println!("note: renice failed; the crowd runs at its parent's priority");
        return 0;
    }
    nice
}

/// With `POLESTAR_NICE=N` (root: N may be negative), sets every thread of polestar to nice N,
/// as if it had a host of its own on a machine shared with other work; 0 otherwise.
fn renice_polestar(pid: u32) -> i32 {
    let Some(nice) = std::env::var("POLESTAR_NICE").ok().and_then(|n| n.parse::<i32>().ok()) else {
        return 0;
    };
    if !renice(nice, &threads(&pid.to_string())) {
        println!("note: renice of polestar failed");
        return 0;
    }
    nice
}

/// The thread ids of process `pid` ("self" for this one).
fn threads(pid: &str) -> Vec<String> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten();
    tasks.filter_map(|e| e.file_name().into_string().ok()).collect()
}

/// The lab's redis-server and redis-sentinel (or Valkey's) processes: this one's children.
fn lab_processes() -> Vec<String> {
    let me = std::process::id().to_string();
    let procs = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    let pids = procs.filter_map(|e| e.file_name().into_string().ok());
    pids.filter(|pid| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let Some((name, rest)) = stat.split_once(" (").and_then(|(_, r)| r.rsplit_once(") "))
        else {
            return false;
        };
        let parent = rest.split_whitespace().nth(1);
        parent == Some(me.as_str()) && (name.starts_with("redis-") || name.starts_with("valkey-"))
    })
    .collect()
}

fn renice(nice: i32, tids: &[String]) -> bool {
    let status = Command::new("renice")
        .args(["-n", &nice.to_string(), "-p"])
        .args(tids)
        .stdout(Stdio::null())
        .status();
    status.is_ok_and(|s| s.success())
}

async fn hold(api: SocketAddr, want: usize, hard: u64) -> anyhow::Result<()> {
    let count = clamp(want, 1, hard);
    let streams = subscribers(api, count).await?;
    println!("attached {}", streams.len());
    // Until killed; reads what comes so that no buffer fills.
    let mut tasks = tokio::task::JoinSet::new();
    for mut s in streams {
        tasks.spawn(async move {
            let mut chunk = [0u8; 512];
            while let Ok(1..) = s.read(&mut chunk).await {}
        });
    }
    while tasks.join_next().await.is_some() {}
    Ok(())
}

// --- Agents -----------------------------------------------------------------------------

/// How the agent-equivalents follow polestar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Follow {
    /// What `src/agent` does with an upstream that has the masters feed: one connection holds
    /// `GET /v1/events/stream?masters=only` with the token, and the agent's own SSE reader and
    /// `feed::Served` apply every `masters` event; no other request.
    Feed,
    /// What agents did before the feed (and still do with an upstream without it): the event
    /// stream, and `GET /v1/masters` on a second, kept-alive connection at the start, after
    /// every chunk holding an event, and after 5 s without one.
    Reread,
}

impl Follow {
    fn parse(arg: Option<&str>) -> anyhow::Result<Self> {
        match arg {
            None | Some("feed") => Ok(Self::Feed),
            Some("reread") => Ok(Self::Reread),
            Some(other) => bail!("crowd agents N [feed|reread]: not {other:?}"),
        }
    }

    /// Descriptors per agent, here and in polestar.
    fn connections(self) -> u64 {
        match self {
            Self::Feed => 1,
            Self::Reread => 2,
        }
    }
}

/// What the agent-equivalents share.
struct Agents {
    http: SocketAddr,
    master: String,
    old_port: u16,
    addresses: usize,
    follow: Follow,
    /// When each one first had another primary than `old_port`: the kernel's receive stamp
    /// (Unix ms) of the bytes that completed the event or the answer naming it.
    heard: mpsc::UnboundedSender<Option<f64>>,
    /// When each one had applied it: this process's clock once parsed (Unix ms), which also
    /// counts the wait for this crowd's own (niced) threads on the cores polestar uses.
    applied: std::sync::Mutex<Vec<f64>>,
    /// Reconnects of the keep-alive connection (the agent's HTTP client does the same).
    reconnects: std::sync::atomic::AtomicUsize,
}

/// Reads one HTTP/1.1 response head from `s` (plus whatever body bytes came with it), and the
/// kernel's receive stamp of the last bytes read.
async fn read_head(s: &mut TcpStream, buf: &mut Vec<u8>) -> anyhow::Result<(usize, Option<f64>)> {
    let mut chunk = [0u8; 4096];
    let mut at = None;
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Ok((end + 4, at));
        }
        let (n, stamp) = stamp::read(s, &mut chunk).await?;
        anyhow::ensure!(n > 0, "closed before the answer's head");
        buf.extend_from_slice(&chunk[..n]);
        at = stamp.or(at);
    }
}

fn status_ok(head: &[u8]) -> anyhow::Result<()> {
    if head.starts_with(b"HTTP/1.1 200") {
        Ok(())
    } else {
        let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
        bail!("{}", String::from_utf8_lossy(line))
    }
}

/// The value of header `name` in a response head.
fn header<'a>(head: &'a [u8], name: &str) -> Option<&'a str> {
    let text = std::str::from_utf8(head).ok()?;
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

fn request(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nhost: polestar\r\nauthorization: Bearer {TOKEN}\r\n\r\n")
        .into_bytes()
}

/// The port of `master`'s primary in `views`.
fn port_of(views: &[MasterView], master: &str) -> Option<u16> {
    Some(views.iter().find(|m| m.name == master)?.primary.as_ref()?.port)
}

impl Agents {
    /// Starts agent `i` as `self.follow` says; it tells `ready` once it follows.
    async fn agent(self: Arc<Self>, i: usize, ready: oneshot::Sender<anyhow::Result<()>>) {
        match self.follow {
            Follow::Feed => self.feed_agent(i, ready).await,
            Follow::Reread => self.reread_agent(i, ready).await,
        }
    }

    /// Records that an agent has the new primary: the bytes' stamp, and now.
    fn has_it(&self, at: Option<f64>) {
        let now = now_ms();
        let _ = self.heard.send(Some(at.unwrap_or(now)));
        self.applied.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(now);
    }

    // The feed: the event stream carries the masters.

    /// Subscribes with `?masters=only`, applies the full list, tells `ready`, then applies
    /// every change, forever.
    async fn feed_agent(self: Arc<Self>, i: usize, ready: oneshot::Sender<anyhow::Result<()>>) {
        let from = source(i, self.addresses);
        let mut reader = sse::Reader::default();
        let mut served = feed::Served::default();
        let setup = async {
            let mut stream = connect(from, self.http).await?;
            stamp::enable(&stream)?;
            stream.write_all(&request("/v1/events/stream?masters=only")).await?;
            let mut buf = Vec::new();
            let (head, _) = read_head(&mut stream, &mut buf).await?;
            status_ok(&buf[..head])?;
            let feed = header(&buf[..head], polestar::http::view::MASTERS_HEADER);
            anyhow::ensure!(feed.is_some(), "the stream carries no masters: an older polestar?");
            let mut items = reader.feed(&buf[head..])?;
            let mut chunk = [0u8; 4096];
            while !apply(&mut served, items)? {
                let (n, _) = stamp::read(&stream, &mut chunk).await?;
                anyhow::ensure!(n > 0, "closed before the first masters event");
                items = reader.feed(&chunk[..n])?;
            }
            let port = port_of(&served.views(), &self.master);
            anyhow::ensure!(port == Some(self.old_port), "primary {port:?} before the failover");
            anyhow::Ok(stream)
        };
        let stream = match setup.await {
            Ok(s) => {
                let _ = ready.send(Ok(()));
                s
            }
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        let mut heard = false;
        let mut chunk = [0u8; 4096];
        loop {
            let (n, at) = match stamp::read(&stream, &mut chunk).await {
                Ok((0, _)) | Err(_) => return,
                Ok(read) => read,
            };
            let Ok(items) = reader.feed(&chunk[..n]) else { return };
            if !matches!(apply(&mut served, items), Ok(true)) || heard {
                continue;
            }
            if port_of(&served.views(), &self.master).is_some_and(|p| p != self.old_port) {
                heard = true;
                self.has_it(at);
            }
        }
    }

    // Re-reading: the event stream says when, `GET /v1/masters` says what.

    /// `GET /v1/masters` on the kept-alive connection (opened again if the server closed it):
    /// the port of the master's primary, and the stamp of the answer's last bytes.
    async fn refresh(
        &self,
        from: SocketAddr,
        conn: &mut Option<TcpStream>,
    ) -> anyhow::Result<(u16, Option<f64>)> {
        for attempt in 0..2 {
            if conn.is_none() {
                let s = connect(from, self.http).await?;
                stamp::enable(&s)?;
                *conn = Some(s);
                if attempt > 0 {
                    self.reconnects.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
            let Some(s) = conn.as_mut() else { continue };
            match self.masters(s).await {
                Ok(read) => return Ok(read),
                Err(e) if attempt == 0 && e.downcast_ref::<Closed>().is_some() => *conn = None,
                Err(e) => return Err(e),
            }
        }
        bail!("the keep-alive connection closed twice")
    }

    async fn masters(&self, s: &mut TcpStream) -> anyhow::Result<(u16, Option<f64>)> {
        if s.write_all(&request("/v1/masters")).await.is_err() {
            return Err(Closed.into());
        }
        let mut buf = Vec::with_capacity(2048);
        let (head, mut at) = match read_head(s, &mut buf).await {
            Ok(h) => h,
            Err(_) if buf.is_empty() => return Err(Closed.into()),
            Err(e) => return Err(e),
        };
        status_ok(&buf[..head])?;
        let length = header(&buf[..head], "content-length").and_then(|l| l.parse().ok());
        let length: usize = length.context("no content-length")?;
        let mut chunk = [0u8; 8192];
        while buf.len() < head + length {
            let (n, stamp) = stamp::read(s, &mut chunk).await?;
            anyhow::ensure!(n > 0, "closed in the body");
            buf.extend_from_slice(&chunk[..n]);
            at = stamp.or(at);
        }
        let views: Vec<MasterView> = serde_json::from_slice(&buf[head..head + length])?;
        let port = port_of(&views, &self.master).context("no primary")?;
        Ok((port, at))
    }

    /// Subscribes, reads the state, tells `ready`, then follows like the agent, forever.
    async fn reread_agent(self: Arc<Self>, i: usize, ready: oneshot::Sender<anyhow::Result<()>>) {
        let from = source(i, self.addresses);
        let mut reads = None;
        let setup = async {
            let mut stream = connect(from, self.http).await?;
            stream.write_all(&request("/v1/events/stream")).await?;
            let mut buf = Vec::new();
            let (head, _) = read_head(&mut stream, &mut buf).await?;
            status_ok(&buf[..head])?;
            let (port, _) = self.refresh(from, &mut reads).await?;
            anyhow::ensure!(port == self.old_port, "primary {port} before the failover");
            anyhow::Ok((stream, buf.split_off(head)))
        };
        let (mut stream, mut pending) = match setup.await {
            Ok(s) => {
                let _ = ready.send(Ok(()));
                s
            }
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        let mut heard = false;
        let mut chunk = [0u8; 4096];
        loop {
            let events = match timeout(RESYNC, stream.read(&mut chunk)).await {
                Err(_) => 1, // the agent's resync: read the state anyway
                Ok(Ok(0) | Err(_)) => return,
                Ok(Ok(n)) => {
                    pending.extend_from_slice(&chunk[..n]);
                    let cut = pending.iter().rposition(|b| *b == b'\n').map_or(0, |p| p + 1);
                    let lines = pending.drain(..cut).collect::<Vec<u8>>();
                    lines.split(|b| *b == b'\n').filter(|l| l.starts_with(b"event:")).count()
                }
            };
            if events == 0 {
                continue;
            }
            match self.refresh(from, &mut reads).await {
                Ok((port, at)) if port != self.old_port && !heard => {
                    heard = true;
                    self.has_it(at);
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    }
}

/// Applies the `masters` events among `items` as the agent does; whether any was applied.
fn apply(served: &mut feed::Served, items: Vec<sse::Item>) -> anyhow::Result<bool> {
    let mut applied = false;
    for item in items {
        if let sse::Item::Event { kind, data, .. } = item
            && kind == polestar::events::MASTERS
        {
            served.apply(serde_json::from_str::<MastersEvent>(&data)?)?;
            applied = true;
        }
    }
    Ok(applied)
}

#[derive(Debug, thiserror::Error)]
#[error("the server closed the kept-alive connection")]
struct Closed;

async fn agent_crowd(want: usize, follow: Follow, hard: u64) -> anyhow::Result<()> {
    let count = clamp(want, follow.connections(), hard);
    let lab = Lab::start(LabOptions::default()).await?;
    let dir = tempfile::tempdir()?;
    let token = dir.path().join("agent.token");
    std::fs::write(&token, format!("{TOKEN}\n"))?;
    let yaml = format!("{}  agent_token_file: {}\n", lab_yaml(&lab), token.display());
    let daemon = Daemon::start(dir.path(), &yaml)?;
    let http = daemon.wait_addr("listening for HTTP on ").await?;
    let before = proc_kib(daemon.pid(), "VmRSS:");
    let old = lab.primary().await?;

    let (heard, mut rx) = mpsc::unbounded_channel();
    let agents = Arc::new(Agents {
        http,
        master: lab.master_name().to_string(),
        old_port: old.port(),
        // 100 agents (200 connections at most) per source address: the HTTP cap is 512.
        addresses: count.div_ceil(100).max(1),
        follow,
        heard,
        applied: Default::default(),
        reconnects: Default::default(),
    });
    let started = Instant::now();
    let (mut up, mut failed, mut first_error) = (0, 0, None);
    for wave in (0..count).collect::<Vec<_>>().chunks(WAVE) {
        let mut waits = Vec::with_capacity(wave.len());
        for &i in wave {
            let (tx, rx) = oneshot::channel();
            tokio::spawn(agents.clone().agent(i, tx));
            waits.push(rx);
        }
        let left = SETUP.saturating_sub(started.elapsed());
        let done = timeout(left, futures::future::join_all(waits)).await;
        for r in done.context("setup took too long")? {
            match r {
                Ok(Ok(())) => up += 1,
                Ok(Err(e)) => {
                    failed += 1;
                    first_error.get_or_insert(format!("{e:#}"));
                }
                Err(_) => failed += 1,
            }
        }
    }
    let setup = started.elapsed();
    let attached = proc_kib(daemon.pid(), "VmRSS:");
    println!(
        "AGENTS_CROWD agents={count} follow={follow:?} following={up} refused={failed}{} \
         setup={:.1}s",
        first_error.map(|e| format!(" (first: {e})")).unwrap_or_default(),
        setup.as_secs_f64()
    );
    anyhow::ensure!(up > 0, "no agent follows");

    let nice = renice_crowd(-1);
    let polestar_nice = renice_polestar(daemon.pid());
    let heard = hear_failover(&lab, &daemon, http, &mut rx, up).await?;
    let Heard { new, ref arrivals, published, first, ref cpu, ref fanout, ref load_before, .. } =
        heard;
    println!(
        "  new primary {new}; {} of {up} agents have it (this client's threads at nice {nice}, \
         polestar's at {polestar_nice})",
        arrivals.len()
    );
    print_rss("agent", before, attached, up, &heard);
    println!("  {}", summary("from polestar's publication", arrivals, published, up));
    println!("  {}", summary("from the first agent", arrivals, first, up));
    let mut applied =
        agents.applied.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
    applied.sort_by(f64::total_cmp);
    println!(
        "  {}",
        summary("applied by this client, from the publication", &applied, published, up)
    );
    println!("  {fanout}");
    println!("  {cpu}");
    println!(
        "  keep-alive reconnects: {}",
        agents.reconnects.load(std::sync::atomic::Ordering::Relaxed)
    );
    println!("  loadavg before the failover: {load_before}; after: {}", loadavg());
    anyhow::ensure!(arrivals.len() == up, "not every agent has the new primary");
    Ok(())
}
