//! The measurement, as a benchmark (ignored; `bench/switchover.sh` runs it): the same
//! shaped links (`tbf` at 40 Mbit/s toward both replicas), the same writer (`SETRANGE` 4 KiB
//! plus `RPUSH` of an increasing id, each acknowledged before the next), and a planned
//! failover started once the replicas are [`TARGET_LAG`] behind (within [`BAND`]), so that every
//! way of starting it meets the same lag: a plain `SENTINEL FAILOVER` on a Sentinel (polestar
//! running, fencing at `+selected-slave`), polestar's switchover, and on Valkey 9 also
//! Valkey's own `SENTINEL FAILOVER ... COORDINATED`. On Redis 7.0, Valkey 8.1 and Valkey 9.1
//! (polestar's switchover uses `COORDINATED` there), in one run. Prints one Markdown table.
//!
//! The lag is the primary's `master_repl_offset` minus the furthest replica's own
//! `slave_repl_offset` ([`lag`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use polestar::lab::Flavor;

use crate::netns::SERIAL;
use crate::netns::cluster::{Cluster, HTTP_PORT};
use crate::switchover_netns::{lag, post, primary, start_shaped, stored, writer};

/// The replication lag at which every failover starts, in bytes (`BENCH_LAG_MB` overrides).
const TARGET_LAG: u64 = 8_000_000;
/// How far from [`TARGET_LAG`] the lag may be when a failover starts, in bytes.
const BAND: u64 = 1_000_000;

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
    start_shaped(cluster).await?;
    let mut rows = Vec::new();
    for (i, how) in hows.iter().enumerate() {
        if i > 0 {
            // Sentinel refuses a new failover of the master for a while after the last.
            tokio::time::sleep(Duration::from_secs(15)).await;
        }
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

/// One planned failover, started once the lag is within [`BAND`] of `target`.
async fn round(
    cluster: &Cluster,
    how: How,
    key: &'static str,
    target: u64,
) -> anyhow::Result<Round> {
    let old = primary(cluster).await.ok_or_else(|| anyhow::anyhow!("no primary"))?;
    crate::netns::until(
        "the replicas to catch up before the round",
        Duration::from_secs(60),
        || async { (lag(cluster, old) < 64 * 1024).then_some(()) },
    )
    .await?;
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let limit = Duration::from_secs(120);
    let writing =
        writer(&cluster.app, key, cluster.central_url(), stop.clone(), acked.clone(), limit);
    let band = target.saturating_sub(BAND)..=target + BAND;
    let at = crate::netns::until("the lag to reach the band", Duration::from_secs(60), || async {
        let now = lag(cluster, old);
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
            let out = cluster.cli(&cluster.db[0], 26379, &args);
            anyhow::ensure!(out.trim() == "OK", "{args:?}: {out}");
        }
        How::Polestar => {
            let url = format!(
                "http://{}:{HTTP_PORT}/v1/masters/mymaster/failover?wait=60s&max_wait=30s",
                cluster.ctl.ip
            );
            let (status, body) = post(&cluster.ctl, url).await?;
            anyhow::ensure!(status == 200, "switchover: {status} {body}");
            coordinated = body["coordinated"] == true;
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
