//! The switchover-under-lag measurement (bench/README.md, "Planned switchover under lag"), as a
//! benchmark (ignored; `bench/switchover.sh` runs it): the same shaped links (`tbf` at 40 Mbit/s
//! toward both replicas), the same writer (`SETRANGE` 4 KiB plus `RPUSH` of an increasing id, each
//! acknowledged before the next, [`PACE`] steps a second at most), and a planned failover started
//! once the replicas are [`TARGET_LAG`] behind (within [`BAND`]), so that every way of starting it
//! meets the same lag: a plain `SENTINEL FAILOVER` on a Sentinel (polestar running, fencing at
//! `+selected-slave`), polestar's switchover, and on Valkey 9 also Valkey's own `SENTINEL FAILOVER
//! ... COORDINATED`. On Redis 7.0, Valkey 8.1 and Valkey 9.1 (polestar's switchover uses
//! `COORDINATED` there), in one run. Prints one Markdown table.
//!
//! The lag is the primary's `master_repl_offset` minus the furthest replica's own
//! `slave_repl_offset` ([`lag`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use polestar_lab::Flavor;

use crate::netns::SERIAL;
use crate::netns::cluster::{Cluster, HTTP_PORT};
use crate::switchover_netns::{
    RATE, lag, lag_now, post, primary, settled, start_shaped, stored, writer_at,
};

/// The replication lag at which every failover starts, in bytes (`BENCH_LAG_MB` overrides).
const TARGET_LAG: u64 = 8_000_000;
/// How far from [`TARGET_LAG`] the lag may be when a failover starts, in bytes (the lag grows
/// by about 8.5 MB/s, and one reading of it takes up to a few hundred milliseconds).
const BAND: u64 = 2_000_000;
/// The writer's steps a second: the reported scenario, on any machine.
const PACE: u32 = 3_300;

#[derive(Clone, Copy, PartialEq, Eq)]
enum How {
    Plain,
    Coordinated,
    Polestar,
}

impl How {
    fn label(self) -> &'static str {
        match self {
            How::Plain => "`SENTINEL FAILOVER` (polestar running)",
            How::Coordinated => "`SENTINEL FAILOVER ... COORDINATED` (polestar running)",
            How::Polestar => "polestar's switchover",
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: bench/switchover.sh"]
async fn bench_switchover_loss_beside_a_plain_sentinel_failover() {
    let _serial = SERIAL.lock().await;
    let target = std::env::var("BENCH_LAG_MB")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(TARGET_LAG, |mb| mb * 1_000_000);
    let flavors = [
        ("Redis 7.0", Flavor::Redis, vec![How::Plain, How::Polestar]),
        ("Valkey 8.1", crate::common::valkey(), vec![How::Plain, How::Polestar]),
        ("Valkey 9.1", crate::common::valkey9(), vec![How::Plain, How::Coordinated, How::Polestar]),
    ];
    let mut rows = Vec::new();
    for (server, flavor, hows) in flavors {
        // down-after 60 s: the switchover may hold its fence up to 24 s (40% of it).
        let cluster = Cluster::start_on(60_000, flavor).await.unwrap();
        let result = run(&cluster, server, &hows, target).await;
        crate::switchover_netns::keep(&cluster);
        rows.extend(cluster.net.with_logs(result).unwrap());
        drop(cluster);
    }
    println!(
        "\nfailover started at {:.1} MB ± {:.1} MB of replication lag\n",
        target as f64 / 1e6,
        BAND as f64 / 1e6
    );
    println!(
        "| server | how the switchover was started | acknowledged | lost | lag at the start | coordinated |"
    );
    println!("|---|---|---|---|---|---|");
    for row in rows {
        println!("{row}");
    }
}

async fn run(
    cluster: &Cluster,
    server: &str,
    hows: &[How],
    target: u64,
) -> anyhow::Result<Vec<String>> {
    // Sentinel's own FAILOVER TO (COORDINATED) must see the replica caught up within what is
    // left of the failover-timeout: the lab's 5 s is short at this lag (the default is 180 s).
    for host in &cluster.db {
        let args = ["SENTINEL", "SET", "mymaster", "failover-timeout", "30000"];
        let out = cluster.cli(host, 26379, &args);
        anyhow::ensure!(out.trim() == "OK", "{args:?}: {out}");
    }
    start_shaped(cluster).await?;
    let mut rows = Vec::new();
    for (i, how) in hows.iter().enumerate() {
        let key = ["ids_0", "ids_1", "ids_2"][i];
        let r = round(cluster, *how, key, target).await?;
        rows.push(format!(
            "| {server} | {} | {} | {} | {:.1} MB | {} |",
            how.label(),
            r.acked,
            r.lost,
            r.lag as f64 / 1e6,
            if r.coordinated { "yes" } else { "no" }
        ));
    }
    Ok(rows)
}

struct Round {
    acked: usize,
    lost: usize,
    lag: u64,
    coordinated: bool,
}

/// One planned failover, started once the lag is within [`BAND`] of `target`: the failover
/// before is over everywhere, the links toward the two replicas of the primary now are shaped
/// (not the primary's own, which the writer uses), and the Sentinel asked is the one beside
/// the primary.
async fn round(
    cluster: &Cluster,
    how: How,
    key: &'static str,
    target: u64,
) -> anyhow::Result<Round> {
    let old = primary(cluster).await.ok_or_else(|| anyhow::anyhow!("no primary"))?;
    settled(cluster, old).await?;
    let beside = cluster.db.iter().find(|h| h.ip == old.ip()).cloned();
    let beside = beside.ok_or_else(|| anyhow::anyhow!("{old} is no data node"))?;
    for host in &cluster.db {
        let _ = cluster.net.unshape(host);
        if host.ip != old.ip() {
            cluster.net.shape(host, RATE)?;
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let limit = Duration::from_secs(120);
    let url = cluster.central_url();
    let writing = writer_at(&cluster.app, key, url, stop.clone(), acked.clone(), limit, Some(PACE));
    let band = target.saturating_sub(BAND)..=target + BAND;
    let at = crate::netns::until("the lag to reach the band", Duration::from_secs(60), || async {
        let now = lag_now(cluster, old).await;
        band.contains(&now).then_some(now)
    })
    .await;
    let at = match at {
        Ok(at) => at,
        Err(e) => {
            stop.store(true, Ordering::SeqCst);
            let _ = writing.await;
            return Err(e.context(format!("lag now {} bytes", lag(cluster, old))));
        }
    };
    let mut coordinated = how == How::Coordinated;
    match how {
        How::Plain | How::Coordinated => {
            let mut args = vec!["SENTINEL", "FAILOVER", "mymaster"];
            if how == How::Coordinated {
                args.push("COORDINATED");
            }
            let out = cluster.cli(&beside, 26379, &args);
            anyhow::ensure!(out.trim() == "OK", "{args:?}: {out}");
        }
        How::Polestar => {
            let url = format!(
                "http://{}:{HTTP_PORT}/v1/masters/mymaster/failover?wait=60s&max_wait=30s",
                cluster.ctl.ip
            );
            let (status, body) = post(&cluster.ctl, url).await?;
            anyhow::ensure!(status == 200, "switchover: {status} {body}");
            // With `?wait=` the answer is the master's new state; the event says what was done.
            let url = format!("http://{}:{HTTP_PORT}/v1/events", cluster.ctl.ip);
            let events = crate::netns::get_json(&cluster.ctl, url).await.unwrap_or_default();
            let done = events.as_array().and_then(|e| {
                e.iter()
                    .rev()
                    .find(|e| e["kind"] == "switchover" && e["outcome"] == "failed_over")
                    .cloned()
            });
            coordinated = done.is_some_and(|e| e["coordinated"] == true);
        }
    }
    crate::netns::until("a new primary", Duration::from_secs(60), || async {
        primary(cluster).await.filter(|p| *p != old).map(|_| ())
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    let written = writing.await??;
    let now = primary(cluster).await.ok_or_else(|| anyhow::anyhow!("no primary"))?;
    let kept = stored(cluster, now, key);
    let lost = written.ids.iter().filter(|id| !kept.contains(id)).count();
    Ok(Round { acked: written.ids.len(), lost, lag: at, coordinated })
}
