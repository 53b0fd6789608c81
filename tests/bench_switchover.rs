//! The measurement, as a benchmark (ignored; `bench/switchover.sh` runs it): the same
//! shaped links (`tbf` at 40 Mbit/s toward both replicas), the same writer (`SETRANGE` 4 KiB
//! plus `RPUSH` of an increasing id, each acknowledged before the next), a planned failover 3 s
//! in, once as a plain `SENTINEL FAILOVER` on a Sentinel (polestar running, fencing at
//! `+selected-slave`) and once through polestar's switchover, in one run. Prints the
//! acknowledged and lost writes and the lag of each.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::netns::SERIAL;
use crate::netns::cluster::{Cluster, HTTP_PORT};
use crate::switchover_netns::{post, primary, start_shaped, stored, writer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: bench/switchover.sh"]
async fn bench_switchover_loss_beside_a_plain_sentinel_failover() {
    let _serial = SERIAL.lock().await;
    // down-after 60 s: the switchover may hold its fence up to 24 s (40% of it).
    let cluster = Cluster::start(60_000).await.unwrap();
    let result = run(&cluster).await;
    cluster.net.with_logs(result).unwrap();
}

async fn run(cluster: &Cluster) -> anyhow::Result<()> {
    start_shaped(cluster).await?;
    let plain = round(cluster, "plain", "ids_plain").await?;
    tokio::time::sleep(Duration::from_secs(15)).await;
    let ours = round(cluster, "polestar", "ids_polestar").await?;
    println!("| how the switchover was started | acknowledged | lost | lag at the failover |");
    println!("|---|---|---|---|");
    for (how, (acked, lost, lag)) in
        [("SENTINEL FAILOVER (polestar running)", plain), ("polestar failover", ours)]
    {
        println!("| {how} | {acked} | {lost} | {lag} |");
    }
    Ok(())
}

/// One planned failover 3 s into the writer's run: (acknowledged, lost, lag in bytes).
async fn round(
    cluster: &Cluster,
    how: &str,
    key: &'static str,
) -> anyhow::Result<(usize, usize, String)> {
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let limit = Duration::from_secs(120);
    let writing =
        writer(&cluster.app, key, cluster.central_url(), stop.clone(), acked.clone(), limit);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let old = primary(cluster).await.ok_or_else(|| anyhow::anyhow!("no primary"))?;
    let host = cluster
        .db
        .iter()
        .find(|h| h.ip == old.ip())
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no host"))?;
    let info = cluster.cli(&host, 6379, &["INFO", "replication"]);
    let lag = lag_of(&info);
    if how == "plain" {
        let sentinel = cluster.db[0].clone();
        cluster.cli(&sentinel, 26379, &["SENTINEL", "FAILOVER", "mymaster"]);
    } else {
        let url = format!(
            "http://{}:{HTTP_PORT}/v1/masters/mymaster/failover?wait=60s&max_wait=30s",
            cluster.ctl.ip
        );
        let (status, body) = post(&cluster.ctl, url).await?;
        anyhow::ensure!(status == 200, "switchover: {status} {body}");
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
    Ok((written.ids.len(), lost, lag))
}

/// The largest lag among the primary's replicas, from its `INFO replication`.
fn lag_of(info: &str) -> String {
    let field = |k: &str| info.lines().find_map(|l| l.trim().strip_prefix(k)?.parse::<u64>().ok());
    let top = field("master_repl_offset:").unwrap_or(0);
    let behind = info
        .lines()
        .filter(|l| l.starts_with("slave"))
        .filter_map(|l| l.split(',').find_map(|p| p.strip_prefix("offset=")?.parse::<u64>().ok()))
        .map(|o| top.saturating_sub(o))
        .max()
        .unwrap_or(0);
    format!("{:.1} MB", behind as f64 / 1e6)
}
