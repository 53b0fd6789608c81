//! The chaos soak (bench/README.md, "Chaos soak"): the namespace deployment of [`cluster`] with
//! polestar on all sides, Lettuce-like clients writing and reading through polestar's DNS name and
//! the agent's HTTP API, a monitor comparing what polestar says with what the Sentinels say, and a
//! seeded schedule of faults. The seed alone reproduces the schedule (which faults, in which order,
//! which Sentinel, the pauses between them); timings on a shared machine still vary.

pub mod clients;
pub mod cluster;
pub mod monitor;
pub mod report;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::sys::signal::Signal;
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

use clients::{Client, Find, Mode};
use cluster::{Cluster, DNS_NAME, MASTER};
use report::{Fault, Report};

/// How long after a fault every client must be serving from the new primary before it counts
/// as stuck.
const RECOVERY_LIMIT: Duration = Duration::from_secs(20);
/// The DNS cache time of the caching writer.
const CACHE: Duration = Duration::from_secs(30);
const FAILOVER_LIMIT: Duration = Duration::from_secs(30);
const STEADY_LIMIT: Duration = Duration::from_secs(90);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `SENTINEL FAILOVER`.
    Planned,
    /// SIGKILL of the primary's redis-server (restarted, empty, after the failover).
    KillPrimary,
    /// SIGSTOP of the primary (SIGCONT after the failover: a returning old primary).
    HangPrimary,
    /// The primary host's link down (up again after the failover).
    DarkPrimary,
    /// One Sentinel killed, then a planned failover without it.
    SentinelDown,
    /// One Sentinel SIGSTOPped (its connections go silent), then a planned failover.
    SentinelHung,
    /// A planned failover with the central polestar SIGKILLed and restarted in the middle.
    PolestarRestart,
    /// The primary cut from the Sentinels (iptables on its host) but not from its clients.
    Partition,
}

impl Kind {
    pub const ALL: [Kind; 8] = [
        Kind::Planned,
        Kind::KillPrimary,
        Kind::HangPrimary,
        Kind::DarkPrimary,
        Kind::SentinelDown,
        Kind::SentinelHung,
        Kind::PolestarRestart,
        Kind::Partition,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Planned => "planned",
            Kind::KillPrimary => "kill-primary",
            Kind::HangPrimary => "hang-primary",
            Kind::DarkPrimary => "dark-primary",
            Kind::SentinelDown => "sentinel-down",
            Kind::SentinelHung => "sentinel-hung",
            Kind::PolestarRestart => "polestar-restart",
            Kind::Partition => "partition",
        }
    }
}

/// splitmix64: a few lines, and the same sequence on every machine for a seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i as u64 + 1) as usize);
        }
    }
}

#[derive(Clone, Debug)]
pub struct Settings {
    pub seed: u64,
    pub faults: usize,
    /// No new fault starts after this.
    pub duration: Duration,
    /// Redis or Valkey.
    pub flavor: polestar_lab::Flavor,
}

impl Settings {
    /// `CHAOS_SEED`, `CHAOS_FAULTS`, `CHAOS_MINUTES` from the environment over `defaults`.
    pub fn from_env(defaults: Settings) -> Settings {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Settings {
            seed: var("CHAOS_SEED").and_then(|v| v.parse().ok()).unwrap_or(defaults.seed),
            faults: var("CHAOS_FAULTS").and_then(|v| v.parse().ok()).unwrap_or(defaults.faults),
            duration: var("CHAOS_MINUTES")
                .and_then(|v| v.parse::<f64>().ok())
                .map(|m| Duration::from_secs_f64(m * 60.0))
                .unwrap_or(defaults.duration),
            flavor: defaults.flavor,
        }
    }
}

/// The schedule: a planned failover first (the case with the strictest promise), then rounds
/// of every other kind in a seeded order, so that each kind comes up as often as the others.
pub fn plan(rng: &mut Rng, faults: usize) -> Vec<Kind> {
    let mut out = vec![Kind::Planned];
    while out.len() < faults {
        let mut round = Kind::ALL.to_vec();
        rng.shuffle(&mut round);
        if out.last() == round.first() {
            round.rotate_left(1);
        }
        out.extend(round);
    }
    out.truncate(faults);
    out
}

/// Builds the deployment, runs the schedule and reports; the namespaces and every process go
/// away with the cluster, also on failure.
pub async fn soak(settings: &Settings) -> anyhow::Result<Report> {
    let _serial = crate::netns::SERIAL.lock().await;
    let cluster = Cluster::start(&settings.flavor).await?;
    let result = run(&cluster, settings).await;
    cluster.net.with_logs(result)
}

async fn run(cluster: &Cluster, settings: &Settings) -> anyhow::Result<Report> {
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let dns = Find::Dns { server: cluster.dns_server(), name: DNS_NAME.to_string() };
    let agent = Find::Http(cluster.agent_url());
    let app = &cluster.app;
    let launched = Instant::now();
    let clients = vec![
        clients::start(app, "w1-dns", dns.clone(), Mode::Writer, stop.clone()),
        clients::start(app, "w2-dns", dns.clone(), Mode::Writer, stop.clone()),
        clients::start(app, "w3-agent", agent.clone(), Mode::Writer, stop.clone()),
        clients::start(app, "r1-dns", dns.clone(), Mode::Reader, stop.clone()),
        clients::start(app, "b1-agent", agent.clone(), Mode::Blocked, stop.clone()),
        // Caches the answer as the JVM does by default: never back within seconds, but it
        // must lose nothing (the old primary is demoted: docs/decisions.md D10).
        clients::start_caching(
            app,
            "w4-dns-cache30",
            dns.clone(),
            Mode::Writer,
            CACHE,
            stop.clone(),
        ),
    ];
    let targets = monitor::Targets {
        sentinels: (0..cluster.sentinels.len()).map(|i| cluster.sentinel(i)).collect(),
        master: MASTER.to_string(),
        dns,
        http: Find::Http(cluster.central_url()),
        agent,
    };
    let samples = monitor::start(app, targets, stop.clone());
    let first = cluster.steady(STEADY_LIMIT).await?;
    let began = Instant::now();
    let start = recovered(&clients, first, launched, RECOVERY_LIMIT).await;
    anyhow::ensure!(start.iter().all(|(_, r)| r.is_some()), "clients never started: {start:?}");

    let mut rng = Rng::new(settings.seed);
    let mut faults = Vec::new();
    for kind in plan(&mut rng, settings.faults) {
        if began.elapsed() > settings.duration {
            break;
        }
        sleep(Duration::from_millis(1000 + rng.below(2000))).await;
        let fault = inject(cluster, kind, &clients, &mut rng).await?;
        eprintln!("CHAOS {}", fault.line());
        faults.push(fault);
    }
    let last = cluster.steady(STEADY_LIMIT).await?;
    sleep(Duration::from_secs(2)).await;
    stop.cancel();
    sleep(Duration::from_millis(300)).await;
    let listing = cluster.cli(app, last, &["LRANGE", "ids", "0", "-1"]);
    let counter = cluster.cli(app, last, &["GET", "counter"]).trim().parse().unwrap_or(0);
    let samples = samples.lock().unwrap_or_else(|p| p.into_inner()).clone();
    Ok(Report::new(settings, began.elapsed(), faults, &clients, &listing, counter, &samples))
}

/// What a fault leaves to undo once the clients have recovered (or were found stuck).
enum Undo {
    Nothing,
    StartRedis(usize),
    Cont(String),
    Light(usize),
    StartSentinel(usize),
    Heal(usize),
}

async fn inject(
    cluster: &Cluster,
    kind: Kind,
    clients: &[Client],
    rng: &mut Rng,
) -> anyhow::Result<Fault> {
    let old = cluster.steady(STEADY_LIMIT).await?;
    let i = cluster.db_index(old).context("the primary is not a data node")?;
    let redis = format!("redis-{i}");
    let start = Instant::now();
    let undo = match kind {
        Kind::Planned => {
            cluster.failover(rng.below(3) as usize).await?;
            Undo::Nothing
        }
        Kind::KillPrimary => {
            cluster.kill(&redis);
            Undo::StartRedis(i)
        }
        Kind::HangPrimary => {
            cluster.signal(&redis, Signal::SIGSTOP)?;
            Undo::Cont(redis)
        }
        Kind::DarkPrimary => {
            cluster.net.go_dark(&cluster.db[i])?;
            Undo::Light(i)
        }
        Kind::SentinelDown => {
            let j = rng.below(3) as usize;
            cluster.kill(&format!("sentinel-{j}"));
            cluster.failover((j + 1) % 3).await?;
            Undo::StartSentinel(j)
        }
        Kind::SentinelHung => {
            let j = rng.below(3) as usize;
            let label = format!("sentinel-{j}");
            cluster.signal(&label, Signal::SIGSTOP)?;
            cluster.failover((j + 1) % 3).await?;
            Undo::Cont(label)
        }
        Kind::PolestarRestart => {
            cluster.failover(rng.below(3) as usize).await?;
            sleep(Duration::from_millis(rng.below(1000))).await;
            cluster.kill("ctl-polestar");
            sleep(Duration::from_millis(500)).await;
            cluster.start_central().await?;
            Undo::Nothing
        }
        Kind::Partition => {
            cluster.partition_from_sentinels(&cluster.db[i])?;
            Undo::Heal(i)
        }
    };
    let new = cluster.new_primary(old, FAILOVER_LIMIT).await;
    let recovery = match new {
        Ok(new) => recovered(clients, new, start, RECOVERY_LIMIT).await,
        Err(_) => Vec::new(),
    };
    undo_fault(cluster, undo).await?;
    let new = new.with_context(|| format!("{}: no failover", kind.name()))?;
    cluster.steady(STEADY_LIMIT).await?;
    Ok(Fault { kind, old, new, start, end: Instant::now(), recovery })
}

async fn undo_fault(cluster: &Cluster, undo: Undo) -> anyhow::Result<()> {
    match undo {
        Undo::Nothing => Ok(()),
        Undo::StartRedis(i) => cluster.start_redis(i),
        Undo::Cont(label) => cluster.signal(&label, Signal::SIGCONT),
        Undo::Light(i) => cluster.go_light(&cluster.db[i]),
        Undo::StartSentinel(j) => cluster.start_sentinel(j),
        Undo::Heal(i) => cluster.heal(&cluster.db[i]),
    }
}

/// Waits until every client has succeeded on `node` since `since` (or `limit` passes); gives
/// each client's time from `since` to that success, `None` for a stuck one.
async fn recovered(
    clients: &[Client],
    node: SocketAddr,
    since: Instant,
    limit: Duration,
) -> Vec<(String, Option<Duration>)> {
    let deadline = Instant::now() + limit;
    loop {
        let status: Vec<(String, Option<Duration>)> = clients
            .iter()
            .filter(|c| c.cache.is_zero())
            .map(|c| (c.name.clone(), c.log.first_ok_on(node, since).map(|t| t - since)))
            .collect();
        if status.iter().all(|(_, r)| r.is_some()) || Instant::now() > deadline {
            return status;
        }
        sleep(Duration::from_millis(50)).await;
    }
}
