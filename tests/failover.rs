//! Issue 4's promise end to end, with real Sentinels, the real binary and real clients: on a
//! planned failover every client of the old primary but the spared ones is cut after the DNS
//! flip (never before), a writer that re-resolves polestar's DNS name after an error ends up on
//! the new primary without losing an acknowledged write, a returning old primary is fenced
//! and drained, and losing every Sentinel pauses and kills nothing.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::ensure;
use common::*;
use polestar::lab::{Lab, LabOptions};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

const SPARED: &str = "keepme";

async fn start() -> Env {
    start_on(LabOptions::default()).await
}

async fn start_on(opts: LabOptions) -> Env {
    let lab = Lab::start(opts).await.expect("the lab starts");
    let mut config = PolestarConfig::for_lab(&lab);
    config.masters = vec![(lab.master_name().to_string(), Some("cache".to_string()))];
    config.dns = true;
    config.drain = true;
    config.drain_settings = vec![format!("spare: {{names: [{SPARED}]}}")];
    Env::with_config(lab, &config).await
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// A raw RESP connection that runs `setup` commands, then waits for the server to close it;
/// returns the wall-clock millisecond it was cut (or `None` if `stop` came first).
async fn held_client(
    addr: SocketAddr,
    setup: Vec<&'static str>,
    stop: Arc<AtomicBool>,
) -> Option<u64> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    for line in setup {
        stream.write_all(format!("{line}\r\n").as_bytes()).await.ok()?;
    }
    let mut buf = [0u8; 1024];
    loop {
        match timeout(Duration::from_millis(200), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(now_ms()),
            Ok(Ok(_)) => {}
            Err(_) if stop.load(Ordering::Relaxed) => return None,
            Err(_) => {}
        }
    }
}

/// INCRs `counter` forever through whatever DNS names, reconnecting (after re-resolving) on
/// any error, like a client with one persistent connection. Counts acknowledged INCRs.
fn writer(dns: SocketAddr, acked: Arc<AtomicU64>, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            let Ok(addr) = resolve_srv(dns).await else { continue };
            let Ok(client) = redis::Client::open(format!("redis://{addr}/")) else { continue };
            let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
                sleep(Duration::from_millis(10)).await;
                continue;
            };
            while !stop.load(Ordering::Relaxed) {
                let mut incr = redis::cmd("INCR");
                incr.arg("counter");
                match timeout(Duration::from_secs(5), incr.query_async::<i64>(&mut conn)).await {
                    Ok(Ok(_)) => acked.fetch_add(1, Ordering::SeqCst),
                    _ => break,
                };
            }
        }
    })
}

async fn counter(addr: SocketAddr) -> anyhow::Result<u64> {
    let client = redis::Client::open(format!("redis://{addr}/"))?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let value: Option<u64> = redis::cmd("GET").arg("counter").query_async(&mut conn).await?;
    Ok(value.unwrap_or(0))
}

async fn events_of(env: &Env, kind: &str) -> Vec<Value> {
    let (_, events) = env.ps.get_json("/v1/events").await.expect("events");
    events.as_array().into_iter().flatten().filter(|e| e["kind"] == kind).cloned().collect()
}

#[tokio::test]
async fn planned_failover_cuts_every_stale_client_after_the_flip_and_loses_no_write() {
    planned_failover_on(LabOptions::default()).await;
}

/// Valkey 8: fence, drain (its `CLIENT LIST`), demotion and no lost write, as on Redis.
#[tokio::test]
async fn valkey_planned_failover_cuts_every_stale_client_after_the_flip_and_loses_no_write() {
    planned_failover_on(LabOptions { flavor: valkey(), ..LabOptions::default() }).await;
}

async fn planned_failover_on(opts: LabOptions) {
    let env = start_on(opts).await;
    let old = env.lab.primary().await.expect("primary");
    let dns = env.ps.dns.expect("DNS listener");
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for i in 0..60 {
        let setup = match i % 4 {
            0 => vec!["PING"],
            1 => vec!["BLPOP nothing-comes 0"],
            2 => vec!["SUBSCRIBE news"],
            _ => vec!["SET k v", "GET k"],
        };
        clients.push(tokio::spawn(held_client(old, setup, stop.clone())));
    }
    let spared = tokio::spawn(held_client(old, vec!["CLIENT SETNAME keepme"], stop.clone()));
    let acked = Arc::new(AtomicU64::new(0));
    let writing = writer(dns, acked.clone(), stop.clone());
    env.wait_until(FAILOVER, "the writer writes", || async {
        ensure!(acked.load(Ordering::SeqCst) > 100, "not yet");
        Ok(())
    })
    .await;

    let new = env.failover().await;
    let cut =
        timeout(FAILOVER, futures::future::join_all(clients)).await.expect("every client cut");
    let cut: Vec<u64> =
        cut.into_iter().map(|c| c.expect("client task").expect("was cut")).collect();
    let switch = events_of(&env, "switch").await;
    let flip_ms = switch.last().and_then(|e| e["time_ms"].as_u64()).expect("a switch event");
    let first_cut = cut.iter().min().copied().unwrap_or(0);
    assert!(
        first_cut + 1 >= flip_ms,
        "a client was cut at {first_cut}, before the flip at {flip_ms}"
    );

    // The writer lands on the new primary and keeps writing there.
    let before = acked.load(Ordering::SeqCst);
    env.wait_until(FAILOVER, "the writer writes on the new primary", || async {
        ensure!(acked.load(Ordering::SeqCst) > before + 100, "not yet");
        Ok(())
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    writing.await.expect("writer task");
    let acked = acked.load(Ordering::SeqCst);
    let stored = counter(new).await.expect("counter on the new primary");
    assert!(stored >= acked, "lost {} acknowledged writes ({stored} stored)", acked - stored);
    assert!(stored <= acked + 1, "{stored} stored for {acked} acknowledged");

    assert_eq!(spared.await.expect("spared task"), None, "the spared client was cut");
    let drains = events_of(&env, "drain").await;
    assert!(drains.iter().any(|d| d["killed"].as_u64() >= Some(60)), "{drains:?}");
    // The Sentinels still monitor everything and replication is up.
    env.lab.wait_converged(FAILOVER * 2).await.expect("Sentinels and replicas converge again");
}

#[tokio::test]
async fn a_returning_old_primary_is_fenced_and_drained() {
    let env = start().await;
    let old = env.lab.primary().await.expect("primary");
    let i = env.lab.index_of(old).expect("index");
    let stop = Arc::new(AtomicBool::new(false));
    let held = tokio::spawn(held_client(old, vec!["PING"], stop.clone()));
    sleep(Duration::from_millis(200)).await;
    env.lab.stop_node(i).expect("SIGSTOP the primary");
    let new =
        env.lab.wait_for_primary_change(old, FAILOVER * 2).await.expect("Sentinel fails over");
    env.wait_api_primary(new, FAILOVER).await;
    let resumed = now_ms();
    env.lab.cont_node(i).expect("SIGCONT the old primary");
    let cut = timeout(FAILOVER, held).await.expect("cut in time").expect("task").expect("was cut");
    assert!(cut >= resumed, "cut at {cut}, before the old primary resumed at {resumed}");
    env.wait_until(FAILOVER, "fence and drain events for the old primary", || async {
        let node = old.to_string();
        let fenced = events_of(&env, "fence").await.iter().any(|e| e["node"] == node);
        let drained = events_of(&env, "drain").await.iter().any(|e| {
            // The flip's episode, still retrying the hung node, or a returning-node drain.
            e["node"] == node && e["killed"].as_u64() >= Some(1)
        });
        ensure!(fenced && drained, "fence {fenced}, drain {drained}");
        Ok(())
    })
    .await;
    stop.store(true, Ordering::Relaxed);
}

#[tokio::test]
async fn losing_every_sentinel_pauses_and_kills_nothing() {
    let env = start().await;
    let primary = env.lab.primary().await.expect("primary");
    let stop = Arc::new(AtomicBool::new(false));
    let held = tokio::spawn(held_client(primary, vec!["PING"], stop.clone()));
    for s in 0..env.lab.sentinel_addrs().len() {
        env.lab.stop_sentinel(s).expect("stop a Sentinel");
    }
    env.wait_state("stale", STALE).await;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        // Writes go through at once: nothing is paused.
        let client = redis::Client::open(format!("redis://{primary}/")).expect("url");
        let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
        let mut set = redis::cmd("SET");
        set.arg("alive").arg("1");
        let set = timeout(Duration::from_millis(500), set.query_async::<()>(&mut conn)).await;
        set.expect("not paused").expect("SET");
        sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, Ordering::Relaxed);
    assert_eq!(held.await.expect("task"), None, "a client was cut while Sentinels were away");
    for kind in ["fence", "drain"] {
        assert!(events_of(&env, kind).await.is_empty(), "{kind} while Sentinels were away");
    }
}
