//! Serves polestar's DNS for a static (or churning) topology, for `bench/dns.sh`.
//!
//! `dns_bench LISTEN [MASTERS] [CHURN_MS]`: MASTERS masters `m0..` with a primary and two
//! replicas each; with CHURN_MS the primary of `m0` moves every CHURN_MS milliseconds.
//! With `SENTINEL_API=ADDR` it also serves polestar's Sentinel endpoint there (its own
//! runtime, as in the daemon) for the same topology, so that `bench/dns.sh` can attach a crowd
//! of subscribers (`SUBSCRIBERS=N`) while dnsperf runs.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use polestar::config;
use polestar::dns::{Listeners, serve};
use polestar::topology::{self, Master, MasterState, Node, Replica, SentinelCounts, Snapshot};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter("warn,polestar=info").init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let listen = args.first().context("usage: dns_bench LISTEN [MASTERS] [CHURN_MS]")?.parse()?;
    let masters: usize = args.get(1).map_or(Ok(10), |m| m.parse())?;
    let churn: Option<u64> = args.get(2).map(|c| c.parse()).transpose()?;
    let cfg = config::Dns {
        listen: vec![listen],
        zone: "redis.internal.".into(),
        ttl: Duration::from_secs(1),
        nameservers: vec!["ns1.redis.internal.".into()],
        transfer_allow: vec![],
        notify: vec![],
        // knotd serves the comparison without RRL: the same here, and dnsperf asks few names
        // from one address, which RRL would turn into truncated answers.
        rate_limit: 0,
        replica_max_lag: None,
        rate_limit_slip: config::DEFAULT_SLIP,
    };
    let (publisher, reader) = topology::channel();
    publisher.replace(snapshot(masters, 0));
    let listeners = Listeners::bind(&cfg).await?;
    let shutdown = CancellationToken::new();
    if let Some(ms) = churn {
        tokio::spawn(churn_topology(publisher, masters, Duration::from_millis(ms)));
    }
    if let Ok(addr) = std::env::var("SENTINEL_API") {
        let listeners = polestar::sentinel_api::bind(&[addr.parse()?]).await?;
        let (keep_peers, peers) = tokio::sync::watch::channel(Vec::new());
        let (keep_password, password) = tokio::sync::watch::channel(None);
        let api = polestar::sentinel_api::Api {
            topology: reader.clone(),
            peers,
            password,
            max_connections: 30_000,
            idle_timeout: Duration::from_secs(3600),
            input_budget: polestar::sentinel_api::INPUT_BUDGET,
            events: Arc::new(polestar::events::EventLog::new()),
        };
        let stop = shutdown.clone();
        tokio::spawn(async move {
            // The senders live as long as the endpoint: nothing is ever reloaded here.
            let _keep = (keep_peers, keep_password);
            polestar::sentinel_api::serve(listeners, api, stop).await
        });
    }
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        stop.cancel();
    });
    serve(listeners, cfg, reader, shutdown).await
}

async fn churn_topology(publisher: topology::Publisher, masters: usize, every: Duration) {
    let mut tick = tokio::time::interval(every);
    for round in 1u64.. {
        tick.tick().await;
        publisher.replace(snapshot(masters, round));
    }
}

fn snapshot(count: usize, round: u64) -> Snapshot {
    let masters =
        (0..count).map(|i| master(i, if i == 0 { round } else { 0 })).collect::<BTreeMap<_, _>>();
    Snapshot { version: 0, masters, source_reachable: true }
}

fn master(i: usize, round: u64) -> (String, Arc<Master>) {
    let ip =
        |host: usize| IpAddr::V4(Ipv4Addr::new(10, (i / 250) as u8, (i % 250) as u8, host as u8));
    let primary = (round % 3) as usize + 1;
    let replicas = (1..=3).filter(|h| *h != primary);
    let master = Master {
        name: format!("m{i}"),
        label: format!("m{i}"),
        primary: Some(Node { ip: ip(primary), port: 6379, hostname: None }),
        epoch: Some(round + 1),
        since: None,
        state: MasterState::Ok,
        replicas: replicas
            .map(|h| Replica { ip: ip(h), port: 6379, hostname: None, healthy: true, down: false })
            .collect(),
        sentinels: SentinelCounts::default(),
        withdrawn: None,
        provisional: false,
    };
    (master.name.clone(), Arc::new(master))
}
