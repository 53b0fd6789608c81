//! Socket sweeping across network namespaces (docs/failover.md, "Socket sweeping"): a hung or dark
//! primary, a Lettuce-like client with one persistent connection and no timeouts, and how long
//! it takes that client to write to the new primary. Needs root (namespaces, CAP_NET_ADMIN).
//!
//! Each test prints `RECOVERY <case> ...` lines: fault -> first success on the new primary, and
//! the Sentinels' switch (as polestar published it) -> that success.

use crate::netns;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use netns::client::{self, Client, Target};
use netns::cluster::{Cluster, HTTP_PORT};
use netns::measure::secs;
use netns::{Host, until};
use nix::sys::signal::Signal;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

const DOWN_AFTER_MS: u64 = 1000;
const FAILOVER: Duration = Duration::from_secs(20);

/// The events of `kind` that the polestar at `url_host` has published, asked from `host`.
async fn events(host: &Host, url_host: &str, kind: &str) -> Vec<Value> {
    let url = format!("http://{url_host}:{HTTP_PORT}/v1/events");
    let all = netns::get_json(host, url).await.unwrap_or(Value::Null);
    let list = all.as_array().cloned().unwrap_or_default();
    list.into_iter().filter(|e| e["kind"] == kind).collect()
}

/// When the polestar at `url_host` (asked from `host`) published a switch away from the first
/// primary.
async fn switch_time(host: &Host, url_host: &str) -> anyhow::Result<SystemTime> {
    let url = format!("http://{url_host}:{HTTP_PORT}/v1/events");
    let ms = until("a published switch", FAILOVER, || async {
        let all = netns::get_json(host, url.clone()).await?;
        let events = all.as_array()?.clone();
        events
            .iter()
            .filter(|e| e["kind"] == "switch" && !e["from"].is_null())
            .find_map(|e| e["time_ms"].as_u64())
    })
    .await?;
    Ok(UNIX_EPOCH + Duration::from_millis(ms))
}

/// Waits for the clients to recover onto a new primary and reports the times.
async fn recovered(
    case: &str,
    clients: &[(&str, &Arc<client::Log>)],
    old: SocketAddr,
    fault: SystemTime,
    switch: SystemTime,
) -> anyhow::Result<()> {
    for (name, log) in clients {
        let (at, node) =
            until(&format!("{case}: the {name} client on a new primary"), FAILOVER, || async {
                log.first_ok_elsewhere(old, fault)
            })
            .await?;
        let line = format!(
            "RECOVERY {case} {name}: fault->success {:.3}s, switch->success {:.3}s (fault->switch {:.3}s) on {node}",
            secs(fault, at),
            secs(switch, at),
            secs(fault, switch)
        );
        eprintln!("{line}");
        let file = concat!(env!("CARGO_MANIFEST_DIR"), "/target/sweep-recovery.txt");
        let _ =
            std::fs::OpenOptions::new().create(true).append(true).open(file).and_then(|mut f| {
                use std::io::Write;
                writeln!(f, "{line}")
            });
    }
    Ok(())
}

async fn clients_on(
    cluster: &Cluster,
    url: &str,
    stop: &CancellationToken,
) -> anyhow::Result<(Arc<client::Log>, Arc<client::Log>)> {
    let target = Target::Ask(url.to_string());
    let writer = Client::writer(target.clone()).start_in(&cluster.app, stop.clone());
    let blocked = Client::blocked(target).start_in(&cluster.app, stop.clone());
    let primary = cluster.primary();
    for log in [&writer, &blocked] {
        until("the clients on the first primary", Duration::from_secs(20), || async {
            log.last_ok().filter(|(_, a)| *a == primary).map(|_| ())
        })
        .await?;
    }
    Ok((writer, blocked))
}

/// Runs `test` on a fresh cluster, one test at a time; a failure shows every process's log.
async fn on_fresh_cluster(test: impl AsyncFnOnce(&Cluster) -> anyhow::Result<()>) {
    let _serial = netns::SERIAL.lock().await;
    let cluster = Cluster::start(DOWN_AFTER_MS).await.unwrap_or_else(|e| panic!("{e:#}"));
    let result = test(&cluster).await;
    cluster.net.with_logs(result).unwrap_or_else(|e| panic!("{e:#}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_primary_is_swept_by_the_node_side_polestar() {
    on_fresh_cluster(async |cluster| hung_primary(cluster, true).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_hung_primary_without_sweeper_leaves_the_client_stuck() {
    on_fresh_cluster(async |cluster| hung_primary(cluster, false).await).await;
}

async fn hung_primary(cluster: &Cluster, sweeper: bool) -> anyhow::Result<()> {
    cluster.central("ctl-polestar").await?;
    let db1 = &cluster.db[0];
    if sweeper {
        let sweep = "sweep:\n  local_ports: [6379]\n";
        cluster.node_polestar(sweep).await?;
    }
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let (writer, blocked) = clients_on(cluster, &cluster.central_url(), &stop).await?;

    let fault = SystemTime::now();
    cluster.net.signal("redis-0", Signal::SIGSTOP)?;
    let switch = switch_time(&cluster.ctl, &cluster.ctl.ip.to_string()).await?;
    let old = cluster.primary();
    if !sweeper {
        tokio::time::sleep(Duration::from_secs(5)).await;
        for (name, log) in [("writer", &writer), ("blocked", &blocked)] {
            anyhow::ensure!(
                log.first_ok_elsewhere(old, fault).is_none(),
                "the {name} client recovered without a sweeper"
            );
        }
        eprintln!("RECOVERY control-hung: both clients still stuck on {old} 5 s after the switch");
        return Ok(());
    }
    recovered("hung-node-side", &[("writer", &writer), ("blocked", &blocked)], old, fault, switch)
        .await?;
    let sweeps = events(db1, &db1.ip.to_string(), "sweep").await;
    anyhow::ensure!(!sweeps.is_empty(), "no sweep event on the node");
    let db_ips: Vec<String> = cluster.db.iter().map(|h| h.ip.to_string()).collect();
    for event in &sweeps {
        for peer in event["peers"].as_array().into_iter().flatten() {
            let ip = peer.as_str().unwrap_or("").rsplit_once(':').map(|(ip, _)| ip).unwrap_or("");
            anyhow::ensure!(
                !db_ips.iter().any(|d| d == ip),
                "a replication or Sentinel link was swept: {event}"
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dark_primary_is_swept_by_the_client_side_polestar() {
    on_fresh_cluster(async |cluster| dark_primary(cluster, false).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_following_an_upstream_sweeps_and_survives_its_restart() {
    on_fresh_cluster(async |cluster| dark_primary(cluster, true).await).await;
}

/// The application host runs polestar with `sweep.remote` (following the Sentinels, or the
/// control host's polestar as upstream); its clients find the primary through it.
async fn dark_primary(cluster: &Cluster, agent: bool) -> anyhow::Result<()> {
    let src = cluster.sentinels_yaml();
    let sweep = "sweep:\n  remote: true\n";
    let app_listen = format!("127.0.0.1:{HTTP_PORT}");
    let upstream = format!(
        "upstream: {{urls: [\"http://{}:{HTTP_PORT}\"], allow_plaintext: true}}\n",
        cluster.ctl.ip
    );
    if agent {
        cluster.central("ctl-polestar").await?;
        cluster.polestar(&cluster.app, "app-polestar", &upstream, &app_listen, sweep).await?;
    } else {
        cluster.polestar(&cluster.app, "app-polestar", &src, &app_listen, sweep).await?;
    }
    let url = format!("http://{app_listen}/v1/masters/mymaster/primary");
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let (writer, blocked) = clients_on(cluster, &url, &stop).await?;

    let fault = SystemTime::now();
    cluster.net.go_dark(&cluster.db[0])?;
    let switch = switch_time(&cluster.app, "127.0.0.1").await?;
    if agent {
        // At once: the upstream comes back while the Sentinels are still failing over.
        upstream_restart(cluster).await?;
    }
    let case = if agent { "dark-agent-upstream" } else { "dark-client-side" };
    recovered(
        case,
        &[("writer", &writer), ("blocked", &blocked)],
        cluster.primary(),
        fault,
        switch,
    )
    .await?;
    let sweeps = events(&cluster.app, "127.0.0.1", "sweep").await;
    anyhow::ensure!(!sweeps.is_empty(), "no sweep event on the application host");
    Ok(())
}

/// The upstream goes away (the agent marks stale, keeps the primary) and comes back, right
/// after the agent followed its flip to the promoted replica: the restarted upstream may meet
/// the Sentinels in the middle of the failover (the promoted replica already answers master,
/// the Sentinels still name the old primary), and it must still follow them to the new one.
async fn upstream_restart(cluster: &Cluster) -> anyhow::Result<()> {
    // `failover` is fine too: the old primary is dark, so the failover ends only at its timeout.
    let state = |stale: bool| async move {
        let url = format!("http://127.0.0.1:{HTTP_PORT}/v1/masters/mymaster");
        let m = netns::get_json(&cluster.app, url).await?;
        let is_stale = m["state"] == "stale";
        (is_stale == stale).then(|| m["primary"]["ip"].as_str().unwrap_or("").to_string())
    };
    let before = until("agent ok", Duration::from_secs(10), || state(false)).await?;
    cluster.net.stop("ctl-polestar");
    let stale = until("agent stale", Duration::from_secs(10), || state(true)).await?;
    anyhow::ensure!(stale == before, "the agent lost its primary when the upstream went away");
    let started = SystemTime::now();
    cluster.central("ctl-polestar-2").await?;
    let after = match until("agent ok again", Duration::from_secs(20), || state(false)).await {
        Ok(after) => after,
        Err(e) => return Err(e.context(restart_views(cluster).await)),
    };
    anyhow::ensure!(after == before, "the agent's primary moved across the restart");
    eprintln!(
        "RECOVERY agent-upstream-restart: agent ok again {:.3}s after the upstream was started",
        secs(started, SystemTime::now())
    );
    Ok(())
}

/// What the agent and the restarted upstream serve, and why the agent refused the upstream's
/// answers: for the failure of [`upstream_restart`].
async fn restart_views(cluster: &Cluster) -> String {
    let agent = format!("http://127.0.0.1:{HTTP_PORT}/v1/masters");
    let upstream = format!("http://{}:{HTTP_PORT}/v1/masters", cluster.ctl.ip);
    let agent = netns::get_json(&cluster.app, agent).await;
    let upstream = netns::get_json(&cluster.ctl, upstream).await;
    let log = cluster.net.log("app-polestar");
    let refused: Vec<&str> = log.lines().filter(|l| l.contains("refused")).collect();
    format!(
        "the agent serves {agent:?}\nthe restarted upstream serves {upstream:?}\nthe agent refused: {refused:#?}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_swept_when_the_sentinels_are_unreachable() {
    on_fresh_cluster(async |cluster| sentinels_unreachable(cluster).await).await;
}

async fn sentinels_unreachable(cluster: &Cluster) -> anyhow::Result<()> {
    let db1 = &cluster.db[0];
    let sweep = "sweep:\n  local_ports: [6379]\n  remote: true\n";
    cluster.node_polestar(sweep).await?;
    let url = format!("http://{}:{HTTP_PORT}/v1/masters/mymaster/primary", db1.ip);
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let (writer, _blocked) = clients_on(cluster, &url, &stop).await?;
    for i in 0..3 {
        cluster.net.signal(&format!("sentinel-{i}"), Signal::SIGSTOP)?;
    }
    let master_url = format!("http://{}:{HTTP_PORT}/v1/masters/mymaster", db1.ip);
    until("stale", Duration::from_secs(20), || async {
        let m = netns::get_json(db1, master_url.clone()).await?;
        (m["state"] == "stale").then_some(())
    })
    .await?;
    let errors = writer.error_count();
    tokio::time::sleep(Duration::from_secs(3)).await;
    anyhow::ensure!(
        events(db1, &db1.ip.to_string(), "sweep").await.is_empty(),
        "swept while the Sentinels were unreachable"
    );
    anyhow::ensure!(writer.error_count() == errors, "the client lost its connection");
    // Still writing on the primary: a next success within 2 s (a fence would hold it 5 s;
    // the writer's own pace on a busy machine is not what is judged here).
    let now = SystemTime::now();
    let next = until("the client writes on", Duration::from_secs(2), || async {
        writer.last_ok().filter(|(at, _)| secs(now, *at) >= 0.0)
    })
    .await;
    let (_, node) = next.map_err(|e| anyhow::anyhow!("the client stopped writing: {e:#}"))?;
    anyhow::ensure!(node == cluster.primary(), "the client writes on {node}, not the primary");
    for i in 0..3 {
        cluster.net.signal(&format!("sentinel-{i}"), Signal::SIGCONT)?;
    }
    Ok(())
}

/// Regression (docs/decisions.md D16): on every planned failover the node-side sweep reset the
/// central polestar's connections to the old primary (its ROLE checks failed with broken pipe,
/// raising `node_unreachable`, and its drain killed nothing): they come from a host that is
/// neither a data node nor a Sentinel. The node's own `CLIENT LIST` names them `polestar`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_side_sweep_spares_the_central_polestars_connections() {
    on_fresh_cluster(async |cluster| planned_with_node_sweep(cluster).await).await;
}

async fn planned_with_node_sweep(cluster: &Cluster) -> anyhow::Result<()> {
    cluster.central("ctl-polestar").await?;
    let db1 = &cluster.db[0];
    cluster.node_polestar("sweep:\n  local_ports: [6379]\n").await?;
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let (writer, _blocked) = clients_on(cluster, &cluster.central_url(), &stop).await?;
    let fault = SystemTime::now();
    let reply = cluster.cli(db1, 26379, &["SENTINEL", "FAILOVER", "mymaster"]);
    anyhow::ensure!(reply.trim() == "OK", "SENTINEL FAILOVER: {reply}");
    let switch = switch_time(&cluster.ctl, &cluster.ctl.ip.to_string()).await?;
    recovered("planned-node-side", &[("writer", &writer)], cluster.primary(), fault, switch)
        .await?;
    // The job ends once the old primary answers ROLE as a replica (Sentinel demotes it ~10 s
    // after the switch): every round it swept is in the events by then.
    let done = format!("sweep of {} done", cluster.primary());
    until("the node-side sweep to finish", Duration::from_secs(40), || async {
        cluster.net.log("node-polestar").contains(&done).then_some(())
    })
    .await?;
    let sweeps = events(db1, &db1.ip.to_string(), "sweep").await;
    let central = cluster.ctl.ip.to_string();
    for event in &sweeps {
        for peer in event["peers"].as_array().into_iter().flatten() {
            let ip = peer.as_str().unwrap_or("").rsplit_once(':').map(|(ip, _)| ip).unwrap_or("");
            anyhow::ensure!(ip != central, "the central polestar's connection was swept: {event}");
        }
    }
    let unreachable = events(&cluster.ctl, &central, "node_unreachable").await;
    anyhow::ensure!(unreachable.is_empty(), "the central polestar lost the node: {unreachable:?}");
    Ok(())
}
