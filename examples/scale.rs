//! Scale: many master groups on loopback, watched by 3 Sentinels, served by one polestar.
//!
//! Starts MASTERS redis-server processes (tiny: no persistence, `maxmemory 2mb`, `hz 1`), a
//! replica for each of the first STORM of them, and 3 Sentinels monitoring all of them (from
//! their config file); then the release polestar (DNS, HTTP, drain). Prints: time from
//! polestar's start to every master published, its RSS, its CPU at idle over IDLE seconds, and
//! during a failover storm (`SENTINEL FAILOVER` for the STORM masters at once) with dnsperf and
//! a bounded HTTP load loop running: DNS QPS, HTTP requests/s, CPU, and how long until every
//! stormed master was published on its new primary. Loopback only; every process it started
//! is killed on exit.
//!
//! Run with `bench/scale.sh [MASTERS] [STORM] [IDLE]`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use polestar_lab::conf::{self, Listen, Monitor};
use polestar_lab::{Flavor, Kind, Launch, free_ports_from, leftovers, query};
use serde_json::Value;

/// The first port tried: below the ephemeral range, so that the Sentinels' and clients' own
/// sockets do not take the servers' ports.
const FIRST_PORT: u16 = 21000;
const LOAD_SECONDS: u64 = 15;
const HTTP_WORKERS: usize = 8;
/// From every master published to the idle measurement.
const IDLE_SETTLE: Duration = Duration::from_secs(20);

/// Kills every process it holds when dropped, also on an error or a panic.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
        }
        for child in &mut self.0 {
            let _ = child.wait();
        }
    }
}

fn arg(i: usize, default: usize) -> usize {
    std::env::args().nth(i).and_then(|a| a.parse().ok()).unwrap_or(default)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (masters, storm, idle) = (arg(1, 1000), arg(2, 50), arg(3, 30));
    let dir = lab_dir()?;
    let mut procs = Procs(Vec::new());
    let mut ports = free_ports(masters + storm + 3 + 2)?.into_iter();
    let nodes: Vec<u16> = ports.by_ref().take(masters).collect();
    let replicas: Vec<u16> = ports.by_ref().take(storm).collect();
    let sentinels: Vec<u16> = ports.by_ref().take(3).collect();
    let (http_port, dns_port) = (ports.next().context("ports")?, ports.next().context("ports")?);

    let t = Instant::now();
    for (i, port) in nodes.iter().enumerate() {
        procs.0.push(redis(dir.path(), *port, None).with_context(|| format!("master {i}"))?);
    }
    for (i, port) in replicas.iter().enumerate() {
        procs.0.push(redis(dir.path(), *port, Some(nodes[i]))?);
    }
    wait_all_up(&nodes).await?;
    println!("{masters} masters ({storm} with a replica) up in {:.1}s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    let seeded = std::env::var_os("SCALE_SEEDED").is_some();
    for port in &sentinels {
        let known = seeded.then_some(Known { sentinels: &sentinels, replicas: &replicas });
        procs.0.push(sentinel(dir.path(), *port, &nodes, known)?);
    }
    wait_sentinels(&sentinels, masters, &nodes[..storm]).await?;
    println!("3 sentinels know every master in {:.1}s", t.elapsed().as_secs_f64());

    let sentinel_pid = procs.0.last().map(Child::id).context("sentinel")?;
    // The reference for start-up, on this machine, now: one `SENTINEL MASTERS` to each
    // Sentinel at once, the least any watcher of these Sentinels must wait for.
    let round = masters_round(&sentinels).await?;

    let config = polestar_config(dir.path(), &sentinels, http_port, dns_port)?;
    let bin = std::env::var("POLESTAR_BIN").unwrap_or_else(|_| "target/release/polestar".into());
    let path = dir.path().to_path_buf();
    let mut held = Held { config, dir: path, http_port, sentinel_pid, round, bin };
    if std::env::var_os("SCALE_HOLD").is_some() {
        return hold(&mut held, &sentinels, masters, idle).await;
    }
    let (pid, all) = start_and_idle(&held, &mut procs, masters, idle).await?;
    let api = format!("http://127.0.0.1:{http_port}");
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;

    let names: Vec<String> = (0..storm).map(|i| format!("m{i}")).collect();
    let old: Vec<String> = names.iter().map(|n| primary_of(&all, n)).collect();
    let queries = query_file(dir.path(), masters)?;
    let before = cpu_ticks(pid)?;
    let load_started = Instant::now();
    let dnsperf = dnsperf(&queries, dns_port)?;
    let http_load = tokio::spawn(http_load(http.clone(), api.clone(), masters));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let since = last_event(&http, &api).await;
    let storm_wall = unix_ms();
    let storm_started = Instant::now();
    let started_names = failover_storm(&sentinels, &names).await;
    let storm_sent = storm_started.elapsed().as_secs_f64();
    let moved = |m: &Value| {
        let name = m["name"].as_str().unwrap_or("");
        match names.iter().position(|n| n == name) {
            Some(i) if started_names.contains(&names[i]) => {
                m["primary"]["port"].as_u64().map(|p| p.to_string()) != Some(old[i].clone())
            }
            _ => true,
        }
    };
    let storm_result = wait_published(&http, &api, masters, Duration::from_secs(60), moved).await;
    let storm_secs = storm_started.elapsed().as_secs_f64();
    let requests = http_load.await??;
    let dns_out = dnsperf.wait_with_output()?;
    let load_secs = load_started.elapsed().as_secs_f64();
    let cpu_storm = (cpu_ticks(pid)? - before) as f64 / clk_tck() / load_secs;
    println!(
        "storm: {} of {storm} failovers started (the last {storm_sent:.2}s after the first try; {} never started, see above)",
        started_names.len(),
        storm - started_names.len()
    );
    match storm_result {
        Ok(_) => println!(
            "  every started one published and state ok {storm_secs:.2}s after the first SENTINEL FAILOVER (the Sentinels' +failover-end)"
        ),
        Err(e) => println!("  not all published and ok within 60s: {e:#}"),
    }
    let flips = switches(&http, &api, since, &started_names).await?;
    println!("  {}", flip_summary(&flips, storm_wall, started_names.len()));
    println!(
        "during the storm ({load_secs:.1}s window): polestar CPU {:.1}% of one core, RSS {:.1} MB",
        cpu_storm * 100.0,
        rss_mb(pid)?
    );
    println!(
        "  DNS: {} (dnsperf -c 4 -T 1 -q 200 over {masters} names)",
        dnsperf_qps(&dns_out.stdout)
    );
    println!(
        "  HTTP: {requests} GET /v1/masters/{{name}}/primary in {LOAD_SECONDS}s = {:.0} req/s ({HTTP_WORKERS} keep-alive workers)",
        requests as f64 / LOAD_SECONDS as f64
    );
    drop(procs);
    Ok(())
}

/// What polestar is measured against: a cluster just started, or one held by another run.
struct Held {
    config: PathBuf,
    /// polestar's log goes here (`polestar.log`).
    dir: PathBuf,
    http_port: u16,
    sentinel_pid: u32,
    /// One `SENTINEL MASTERS` round to the 3 Sentinels, measured before polestar started.
    round: Duration,
    /// The polestar binary (`POLESTAR_BIN`, default the release build).
    bin: String,
}

/// Starts polestar against `held`, waits for every master published, and measures the idle
/// time: prints the start-up and idle figures; returns polestar's pid and the masters.
async fn start_and_idle(
    held: &Held,
    procs: &mut Procs,
    masters: usize,
    idle: usize,
) -> anyhow::Result<(u32, Vec<Value>)> {
    let started = Instant::now();
    procs.0.push(polestar(&held.bin, &held.config, &held.dir)?);
    let pid = procs.0.last().map(Child::id).context("polestar")?;
    let api = format!("http://127.0.0.1:{}", held.http_port);
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
    let all = wait_published(&http, &api, masters, Duration::from_secs(120), |_| true).await?;
    let publish = started.elapsed().as_secs_f64();
    println!(
        "polestar: all {masters} masters published {publish:.2}s after start; RSS {:.1} MB",
        rss_mb(pid)?
    );
    println!(
        "  against one SENTINEL MASTERS round to the 3 Sentinels ({:.3}s): {:.1}x",
        held.round.as_secs_f64(),
        publish / held.round.as_secs_f64()
    );
    // Idle is the steady state: past the start-up's first full reconciliations (every 10 s
    // at 1000 masters) and the data nodes' ACL checks, which now run after everything is
    // published instead of during it.
    tokio::time::sleep(IDLE_SETTLE).await;
    let span = Duration::from_secs(idle as u64);
    let (cpu, sentinel_cpu) =
        tokio::try_join!(cpu_over(pid, span), cpu_over(held.sentinel_pid, span))?;
    println!("polestar after the idle time: {}", memory(pid)?);
    println!(
        "polestar idle CPU over {idle}s ({}s after): {:.2}% of one core; a Sentinel over the same seconds: {:.2}% ({:.2}x)",
        IDLE_SETTLE.as_secs(),
        cpu * 100.0,
        sentinel_cpu * 100.0,
        cpu / sentinel_cpu.max(f64::MIN_POSITIVE)
    );
    println!("polestar's log until then: {}", log_lines(&held.dir.join("polestar.log"))?);
    Ok((pid, all))
}

/// How many lines polestar logged, and how many of them are warnings or errors.
fn log_lines(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)?;
    let count = |level: &str| text.lines().filter(|l| l.contains(level)).count();
    Ok(format!(
        "{} lines, {} WARN, {} ERROR",
        text.lines().count(),
        count(" WARN "),
        count(" ERROR ")
    ))
}

/// `SCALE_HOLD=1`: the cluster stays up until Ctrl-C, so that polestar can be started (and
/// profiled, restarted, rebuilt) against it by hand, or measured as the bench does: each line
/// on standard input starts one and measures it (an empty line: the same binary as before; a
/// path: that binary), its log `polestar.log` in the cluster's directory.
async fn hold(
    held: &mut Held,
    sentinels: &[u16],
    masters: usize,
    idle: usize,
) -> anyhow::Result<()> {
    println!("holding: {} run -c {}", held.bin, held.config.display());
    println!(
        "  a Sentinel's pid {}; a line on stdin measures one polestar; Ctrl-C stops everything",
        held.sentinel_pid
    );
    let stdin = tokio::io::BufReader::new(tokio::io::stdin());
    let mut lines = tokio::io::AsyncBufReadExt::lines(stdin);
    loop {
        let line = tokio::select! {
            line = lines.next_line() => line?,
            stop = tokio::signal::ctrl_c() => return Ok(stop?),
        };
        let Some(line) = line else { return Ok(tokio::signal::ctrl_c().await?) };
        if !line.trim().is_empty() {
            held.bin = line.trim().to_string();
        }
        // A Sentinel too slow to answer (a loaded machine) keeps the last figure: the cluster
        // stays up whatever happens to one measurement.
        match masters_round(sentinels).await {
            Ok(round) => held.round = round,
            Err(e) => println!("  SENTINEL MASTERS round not measured again ({e:#})"),
        }
        println!("measuring {}", held.bin);
        let mut one = Procs(Vec::new());
        if let Err(e) = start_and_idle(held, &mut one, masters, idle).await {
            println!("  failed: {e:#}");
        }
        drop(one);
        println!("ready for the next one");
    }
}

/// The id of the last event polestar retained (0: none).
async fn last_event(http: &reqwest::Client, api: &str) -> u64 {
    let events = async { http.get(format!("{api}/v1/events")).send().await?.json::<Value>().await };
    let list = events.await.ok().and_then(|v| v.as_array().cloned()).unwrap_or_default();
    list.iter().filter_map(|e| e["id"].as_u64()).max().unwrap_or(0)
}

/// polestar's `switch` events after `since` of the `names`: (unix ms of the flip, polestar's
/// own latency from the Sentinel event that decided it, in ms).
async fn switches(
    http: &reqwest::Client,
    api: &str,
    since: u64,
    names: &[String],
) -> anyhow::Result<Vec<(u64, f64)>> {
    let url = format!("{api}/v1/events?since={since}");
    let list: Value = http.get(url).send().await?.json().await?;
    let ours =
        |e: &&Value| e["kind"] == "switch" && names.iter().any(|n| e["master"].as_str() == Some(n));
    let events = list.as_array().map(Vec::as_slice).unwrap_or_default();
    Ok(events
        .iter()
        .filter(ours)
        .filter_map(|e| Some((e["time_ms"].as_u64()?, e["latency_ms"].as_f64()?)))
        .collect())
}

/// When polestar flipped the stormed masters, from its own `switch` events: the last flip
/// after the first `SENTINEL FAILOVER`, and polestar's share (event to flip).
fn flip_summary(flips: &[(u64, f64)], storm_ms: u64, started: usize) -> String {
    let Some(last) = flips.iter().map(|(at, _)| *at).max() else {
        return format!("polestar flipped none of the {started} started failovers");
    };
    let mut own: Vec<f64> = flips.iter().map(|(_, l)| *l).collect();
    own.sort_by(f64::total_cmp);
    let p50 = own[own.len() / 2];
    let max = own[own.len() - 1];
    format!(
        "polestar flipped {} of {started} (switch events), the last {:.2}s after the first SENTINEL FAILOVER; \
         its own share, Sentinel event to flip: p50 {p50:.1} ms, max {max:.1} ms",
        flips.len(),
        last.saturating_sub(storm_ms) as f64 / 1000.0
    )
}

fn unix_ms() -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    now.map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// A lab directory (see `polestar_lab::leftovers`): the servers of a run that died without
/// cleaning up are killed by the next run, or by any lab's start.
fn lab_dir() -> anyhow::Result<tempfile::TempDir> {
    leftovers::clean();
    leftovers::new_dir()
}

/// `count` loopback ports from FIRST_PORT up, skipping those in use.
fn free_ports(count: usize) -> anyhow::Result<Vec<u16>> {
    free_ports_from(FIRST_PORT, count)
}

/// A tiny data node in its own directory under `dir`: no persistence, `maxmemory 2mb`, `hz 1`.
fn redis(dir: &Path, port: u16, replica_of: Option<u16>) -> anyhow::Result<Child> {
    let listen = loopback(dir.join(format!("node-{port}")), port);
    let mut text = conf::common(&listen) + conf::NO_PERSISTENCE + conf::DISKLESS_SYNC;
    text.push_str("maxmemory 2mb\nhz 1\n");
    if let Some(primary) = replica_of {
        text += &conf::replica_of("127.0.0.1", primary);
    }
    let config = conf::write(&listen.dir, Kind::Server, &text)?;
    Launch::server(&Flavor::Redis, Kind::Server, &config).spawn()
}

/// `SCALE_SEEDED=1`: what every Sentinel's config already holds, as it does once the Sentinels
/// have run (they write what they learn into it): the other Sentinels and the replicas of
/// each master. Without it a Sentinel learns each of them from hellos and `INFO`, and rewrites
/// and fsyncs its whole config at every one: O(N²), 18 minutes for 4,000 masters here, during
/// which a Sentinel does little else (strace: 56 rewrites of a 1.2 MB file in 10 s).
struct Known<'a> {
    sentinels: &'a [u16],
    replicas: &'a [u16],
}

/// A Sentinel's run id, fixed by its port so that its peers' configs can name it.
fn sentinel_id(port: u16) -> String {
    format!("{port:040x}")
}

/// A Sentinel monitoring every one of `nodes` (`m0`, `m1`, ...), from its config file.
fn sentinel(dir: &Path, port: u16, nodes: &[u16], known: Option<Known>) -> anyhow::Result<Child> {
    let listen = loopback(dir.join(format!("sentinel-{port}")), port);
    let mut text = conf::common(&listen);
    if known.is_some() {
        text += &format!("sentinel myid {}\n", sentinel_id(port));
    }
    for (i, node) in nodes.iter().enumerate() {
        text += &conf::monitor(&Monitor {
            name: format!("m{i}"),
            host: "127.0.0.1".into(),
            port: *node,
            quorum: 2,
            down_after: Duration::from_secs(5),
            failover_timeout: Duration::from_secs(10),
            parallel_syncs: 1,
        });
        let Some(known) = &known else { continue };
        for peer in known.sentinels.iter().filter(|p| **p != port) {
            let id = sentinel_id(*peer);
            text += &format!("sentinel known-sentinel m{i} 127.0.0.1 {peer} {id}\n");
        }
        if let Some(replica) = known.replicas.get(i) {
            text += &format!("sentinel known-replica m{i} 127.0.0.1 {replica}\n");
        }
    }
    let config = conf::write(&listen.dir, Kind::Sentinel, &text)?;
    Launch::server(&Flavor::Redis, Kind::Sentinel, &config).spawn()
}

fn loopback(dir: PathBuf, port: u16) -> Listen {
    Listen { ip: [127, 0, 0, 1].into(), port, dir, logfile: None }
}

fn polestar_config(dir: &Path, sentinels: &[u16], http: u16, dns: u16) -> anyhow::Result<PathBuf> {
    let list: Vec<String> = sentinels.iter().map(|p| format!("\"127.0.0.1:{p}\"")).collect();
    let yaml = format!(
        "sentinels:\n  addresses: [{}]\nhttp:\n  listen: \"127.0.0.1:{http}\"\n\
         dns:\n  listen: [\"127.0.0.1:{dns}\"]\n  zone: scale.test.\ndrain:\n  enabled: true\n",
        list.join(", ")
    );
    let path = dir.join("polestar.yaml");
    std::fs::write(&path, yaml)?;
    Ok(path)
}

fn polestar(bin: &str, config: &Path, dir: &Path) -> anyhow::Result<Child> {
    let log = std::fs::File::create(dir.join("polestar.log"))?;
    let child = Command::new(bin)
        .args(["run", "-c", config.to_str().unwrap_or("")])
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("cannot start {bin}"))?;
    Ok(child)
}

async fn wait_all_up(ports: &[u16]) -> anyhow::Result<()> {
    for port in ports {
        let addr = SocketAddr::from(([127, 0, 0, 1], *port));
        let deadline = Instant::now() + Duration::from_secs(60);
        while query::<String>(addr, &redis::cmd("PING")).await.is_err() {
            if Instant::now() > deadline {
                bail!("redis on {addr} never answered");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(())
}

/// Until every Sentinel lists every master, the other two Sentinels on m0, and the replica
/// of each master that has one (a failover needs it).
async fn wait_sentinels(
    sentinels: &[u16],
    masters: usize,
    with_replica: &[u16],
) -> anyhow::Result<()> {
    // Their time to learn grows faster than linearly (6 s, 95 s and 296 s for 250, 1,000 and
    // 2,000 masters on the project's machine): 300 s, and N² / 8,000 s past 1,550 masters.
    let n = masters as u64;
    let deadline = Instant::now() + Duration::from_secs(300.max(n * n / 8_000));
    for port in sentinels {
        let addr = SocketAddr::from(([127, 0, 0, 1], *port));
        loop {
            let ready = sentinel_ready(addr, masters, with_replica.len()).await.unwrap_or(false);
            if ready {
                break;
            }
            if Instant::now() > deadline {
                bail!("sentinel {addr} did not learn every master and replica");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    Ok(())
}

async fn sentinel_ready(
    addr: SocketAddr,
    masters: usize,
    with_replica: usize,
) -> anyhow::Result<bool> {
    let list: Vec<std::collections::HashMap<String, String>> =
        query(addr, redis::cmd("SENTINEL").arg("MASTERS")).await?;
    let slaves = |m: &std::collections::HashMap<String, String>| {
        m.get("num-slaves").and_then(|v| v.parse::<usize>().ok()).unwrap_or(0)
    };
    let with = list.iter().filter(|m| slaves(m) >= 1).count();
    let others = list
        .iter()
        .filter(|m| m.get("num-other-sentinels").map(String::as_str) == Some("2"))
        .count();
    Ok(list.len() == masters && with >= with_replica && others == masters)
}

/// Polls `/v1/masters` until every one of `masters` has a primary, state `ok`, and `done`.
async fn wait_published(
    http: &reqwest::Client,
    api: &str,
    masters: usize,
    limit: Duration,
    done: impl Fn(&Value) -> bool,
) -> anyhow::Result<Vec<Value>> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(response) = http.get(format!("{api}/v1/masters")).send().await
            && let Ok(Value::Array(list)) = response.json::<Value>().await
        {
            let ok = list
                .iter()
                .filter(|m| m["state"] == "ok" && m["primary"]["port"].is_u64() && done(m))
                .count();
            if list.len() == masters && ok == masters {
                return Ok(list);
            }
            if Instant::now() > deadline {
                bail!("after {limit:?}: {ok} of {masters} published ({} listed)", list.len());
            }
        } else if Instant::now() > deadline {
            bail!("polestar's HTTP API never answered");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn primary_of(all: &[Value], name: &str) -> String {
    let m = all.iter().find(|m| m["name"] == name);
    m.and_then(|m| m["primary"]["port"].as_u64()).map(|p| p.to_string()).unwrap_or_default()
}

/// How long one `SENTINEL MASTERS` to every Sentinel at once takes (the slowest answer); a
/// round that times out (a loaded machine) is tried again, 5 times at most.
async fn masters_round(sentinels: &[u16]) -> anyhow::Result<Duration> {
    let mut tries = 1;
    loop {
        match one_masters_round(sentinels).await {
            Err(e) if tries < 5 => println!("  SENTINEL MASTERS round failed, again: {e:#}"),
            result => return result,
        }
        tries += 1;
    }
}

async fn one_masters_round(sentinels: &[u16]) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let asks = sentinels.iter().map(|port| {
        let addr = SocketAddr::from(([127, 0, 0, 1], *port));
        async move { query::<redis::Value>(addr, redis::cmd("SENTINEL").arg("MASTERS")).await }
    });
    for answer in futures::future::join_all(asks).await {
        answer?;
    }
    Ok(t.elapsed())
}

/// Tries before a `SENTINEL FAILOVER` counts as never started.
const STORM_TRIES: usize = 10;

/// `SENTINEL FAILOVER` for every name at once, spread over the Sentinels; one that times out
/// or is refused (`-INPROG`, `-NOGOODSLAVE`: a Sentinel under a storm is slow to agree) is
/// tried again a second later, up to [`STORM_TRIES`] times, on the next Sentinel. Returns the
/// names whose failover a Sentinel accepted; prints what the others last answered.
async fn failover_storm(sentinels: &[u16], names: &[String]) -> Vec<String> {
    let calls = names.iter().enumerate().map(|(i, name)| async move {
        let mut last = String::new();
        for attempt in 0..STORM_TRIES {
            let port = sentinels[(i + attempt) % sentinels.len()];
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            match query::<String>(addr, redis::cmd("SENTINEL").arg("FAILOVER").arg(name)).await {
                Ok(_) => return Ok(name.clone()),
                Err(e) => last = format!("{e:#}"),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        Err((name.clone(), last))
    });
    let mut started = Vec::new();
    let mut refused = std::collections::BTreeMap::<String, Vec<String>>::new();
    for result in futures::future::join_all(calls).await {
        match result {
            Ok(name) => started.push(name),
            Err((name, why)) => refused.entry(why).or_default().push(name),
        }
    }
    for (why, names) in &refused {
        println!(
            "  {} failover(s) never started after {STORM_TRIES} tries ({why}): {names:?}",
            names.len()
        );
    }
    started
}

fn query_file(dir: &Path, masters: usize) -> anyhow::Result<PathBuf> {
    let text: String = (0..masters).map(|i| format!("m{i}.scale.test. A\n")).collect();
    let path = dir.join("queries");
    std::fs::write(&path, text)?;
    Ok(path)
}

fn dnsperf(queries: &Path, port: u16) -> anyhow::Result<Child> {
    let child = Command::new("dnsperf")
        .args(["-s", "127.0.0.1", "-p", &port.to_string(), "-d", queries.to_str().unwrap_or("")])
        .args(["-c", "4", "-T", "1", "-q", "200", "-l", &LOAD_SECONDS.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start dnsperf (apt-get install -y dnsperf)")?;
    Ok(child)
}

fn dnsperf_qps(out: &[u8]) -> String {
    let text = String::from_utf8_lossy(out);
    let find = |key: &str| text.lines().find(|l| l.contains(key)).map(|l| l.trim().to_string());
    format!(
        "{}; {}",
        find("Queries per second").unwrap_or_else(|| "no QPS figure".into()),
        find("Queries lost").unwrap_or_default()
    )
}

/// GETs `/v1/masters/m<i>/primary` round-robin from HTTP_WORKERS keep-alive workers for
/// LOAD_SECONDS (and at most a million requests); returns how many answered 200.
async fn http_load(http: reqwest::Client, api: String, masters: usize) -> anyhow::Result<u64> {
    let deadline = Instant::now() + Duration::from_secs(LOAD_SECONDS);
    let workers = (0..HTTP_WORKERS).map(|w| {
        let (http, api) = (http.clone(), api.clone());
        tokio::spawn(async move {
            let mut ok = 0u64;
            for n in 0..1_000_000 / HTTP_WORKERS {
                if Instant::now() > deadline {
                    break;
                }
                let url = format!("{api}/v1/masters/m{}/primary", (n * HTTP_WORKERS + w) % masters);
                if let Ok(r) = http.get(url).send().await
                    && r.status().is_success()
                    && r.bytes().await.is_ok()
                {
                    ok += 1;
                }
            }
            ok
        })
    });
    let mut total = 0;
    for worker in futures::future::join_all(workers).await {
        total += worker?;
    }
    Ok(total)
}

fn clk_tck() -> f64 {
    let out = Command::new("getconf").arg("CLK_TCK").output().ok();
    out.and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok()).unwrap_or(100.0)
}

fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) start at the last ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    Ok(field(11) + field(12)) // utime + stime (fields 14 and 15 of stat)
}

async fn cpu_over(pid: u32, span: Duration) -> anyhow::Result<f64> {
    let before = cpu_ticks(pid)?;
    tokio::time::sleep(span).await;
    Ok((cpu_ticks(pid)? - before) as f64 / clk_tck() / span.as_secs_f64())
}

/// RSS now (anonymous, file-backed) and at its peak (`VmHWM`).
fn memory(pid: u32) -> anyhow::Result<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let mb = |key: &str| {
        let line = status.lines().find_map(|l| l.strip_prefix(key));
        let kb = line.and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok());
        kb.map(|kb| kb / 1024.0).unwrap_or(f64::NAN)
    };
    Ok(format!(
        "RSS {:.1} MB ({:.1} anonymous, {:.1} file), peak {:.1} MB",
        mb("VmRSS:"),
        mb("RssAnon:"),
        mb("RssFile:"),
        mb("VmHWM:")
    ))
}

fn rss_mb(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .context("no VmRSS")?;
    Ok(kb / 1024.0)
}
