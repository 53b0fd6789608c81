//! The planned-failover figures (`bench/drain.sh`; docs/failover.md, "Timeline of a failover from O
//! to N"), as a measurement (not a check), on the loopback lab with the real binary: over several
//! planned failovers (`SENTINEL FAILOVER`), how long an INCR writer and a `BLPOP 0` client that
//! find the primary through polestar's DNS name (SRV) take to succeed on the new primary, from the
//! failover command and from the leader's `+promoted-slave` as a subscriber on every Sentinel saw
//! it; and how many acknowledged INCRs the final primary lacks.
//!
//! Both clients behave like Lettuce (`netns/client.rs`, here on the loopback lab): one
//! persistent connection, no read timeout, re-resolve and reconnect only on an error (socket
//! closed, or an error reply such as READONLY).
//!
//! Run with `bench/drain.sh` (`BENCH_ROUNDS`, default 5). Results also go to
//! `target/bench-drain.txt`.

use crate::common;
use crate::netns;

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use common::*;
use netns::client::{Client, Pace, Target};
use netns::measure::{NOONE, PROMOTED, SWITCH, SentinelEvents, emit, env_or, median_max, secs};
use polestar_lab::{Lab, LabOptions};
use tokio::time::{sleep, timeout};
use tokio_util::sync::CancellationToken;

/// A client not on the new primary by then counts as not recovered.
const RECOVERY_LIMIT: Duration = Duration::from_secs(20);
/// Short pauses, for figures at millisecond resolution: an `INCR` every 2 ms, and a new
/// lookup or connection 10 ms after a failure.
const PACE: Pace = Pace {
    incr: Duration::from_millis(2),
    lookup_retry: Duration::from_millis(10),
    reconnect: Duration::from_millis(10),
};

/// A subscriber on every Sentinel, for as long as the bench runs.
fn watch_sentinels(lab: &Lab) -> SentinelEvents {
    let seen = SentinelEvents::default();
    for addr in lab.sentinel_addrs() {
        tokio::spawn(seen.clone().record(addr, CancellationToken::new()));
    }
    seen
}

async fn get_u64(addr: SocketAddr, key: &str) -> anyhow::Result<u64> {
    let client = redis::Client::open(format!("redis://{addr}/"))?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let value: Option<u64> = redis::cmd("GET").arg(key).query_async(&mut conn).await?;
    Ok(value.unwrap_or(0))
}

async fn push(addr: SocketAddr, key: &str) {
    if let Ok(client) = redis::Client::open(format!("redis://{addr}/"))
        && let Ok(mut conn) = client.get_multiplexed_async_connection().await
    {
        let _: Result<i64, _> = redis::cmd("RPUSH").arg(key).arg("x").query_async(&mut conn).await;
    }
}

/// The time polestar published the last switch (Unix ms in the event).
async fn flip_time(env: &Env) -> Option<SystemTime> {
    let (_, events) = env.ps.get_json("/v1/events").await.ok()?;
    let ms = events
        .as_array()?
        .iter()
        .filter(|e| e["kind"] == "switch" && !e["from"].is_null())
        .filter_map(|e| e["time_ms"].as_u64())
        .max()?;
    Some(UNIX_EPOCH + Duration::from_millis(ms))
}

#[derive(Default)]
struct Round {
    noone: Option<f64>,
    promoted: Option<f64>,
    switched: Option<f64>,
    flip: Option<f64>,
    writer: Option<f64>,
    blocked: Option<f64>,
    acked: u64,
    stored: u64,
}

async fn one_failover(env: &Env, seen: &SentinelEvents, r: usize) -> anyhow::Result<Round> {
    let dns = env.ps.dns.context("no DNS listener")?;
    let old = env.lab.primary().await?;
    let (wkey, bkey) = (format!("counter:{r}"), format!("queue:{r}"));
    let stop = CancellationToken::new();
    let target = Target::lookup(move || async move { resolve_srv(dns).await.ok() });
    let writer = Client::writer(target.clone()).key(&wkey).pace(PACE);
    let (writer, wtask) = writer.spawn(stop.clone());
    let (blocked, btask) = Client::blocked(target).key(&bkey).pace(PACE).spawn(stop.clone());
    env.wait_until(FAILOVER, "the clients on the primary", || async {
        for log in [&writer, &blocked] {
            anyhow::ensure!(log.last_ok().is_some_and(|(_, a)| a == old), "not yet");
        }
        Ok(())
    })
    .await;
    sleep(Duration::from_millis(500)).await;

    let fault = SystemTime::now();
    env.lab.failover().await?;
    let accepted = secs(fault, SystemTime::now());
    let mut out = Round::default();
    let limit = tokio::time::Instant::now() + RECOVERY_LIMIT;
    while tokio::time::Instant::now() < limit {
        out.writer = writer.first_ok_elsewhere(old, fault).map(|(t, _)| secs(fault, t));
        out.blocked = blocked.first_ok_elsewhere(old, fault).map(|(t, _)| secs(fault, t));
        out.noone = seen.first(NOONE, fault).map(|t| secs(fault, t));
        out.promoted = seen.first(PROMOTED, fault).map(|t| secs(fault, t));
        out.switched = seen.first(SWITCH, fault).map(|t| secs(fault, t));
        if out.writer.is_some() && out.blocked.is_some() && out.switched.is_some() {
            break;
        }
        sleep(Duration::from_millis(50)).await;
    }
    out.flip = flip_time(env).await.map(|t| secs(fault, t));
    if accepted > 0.5 {
        eprintln!("(round {r}: SENTINEL FAILOVER accepted only after {accepted:.3} s)");
    }
    // Let the writer go on for a while on the new primary, then stop both clients.
    sleep(Duration::from_secs(1)).await;
    stop.cancel();
    let new = env.lab.wait_for_primary_change(old, FAILOVER).await?;
    push(new, &bkey).await;
    for mut task in [wtask, btask] {
        if timeout(Duration::from_secs(10), &mut task).await.is_err() {
            eprintln!("(round {r}: a client did not stop within 10 s; aborted)");
            task.abort();
        }
    }
    out.acked = writer.successes();
    out.stored = get_u64(new, &wkey).await?;
    Ok(out)
}

fn fmt(v: Option<f64>) -> String {
    v.map(|s| format!("{s:.3}")).unwrap_or_else(|| "-".to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: several planned failovers; run with bench/drain.sh"]
async fn planned_failover_recovery() {
    let rounds: usize = env_or("BENCH_ROUNDS", 5);
    let opts = LabOptions::default();
    let down_after = opts.down_after;
    let lab = Lab::start(opts).await.expect("the lab starts");
    let mut config = PolestarConfig::for_lab(&lab);
    config.masters = vec![(lab.master_name().to_string(), Some("cache".to_string()))];
    config.dns = true;
    config.drain = true;
    let env = Env::with_config(lab, &config).await;
    let seen = watch_sentinels(&env.lab);

    let mut out = String::new();
    emit(
        &mut out,
        format!(
            "# issue 4: {rounds} planned failovers (SENTINEL FAILOVER), loopback lab, down-after {down_after:?}, drain defaults (dns.ttl 1s)"
        ),
    );
    emit(
        &mut out,
        "# seconds from the failover command; Sentinel events as first seen by a subscriber: noone = \
         leader's +failover-state-send-slaveof-noone, promoted = +promoted-slave, switch = first \
         +switch-master; recovery = first success on the new primary (found via polestar's DNS)"
            .into(),
    );
    let mut rows = Vec::new();
    for r in 1..=rounds {
        env.lab.wait_converged(FAILOVER * 4).await.expect("the lab converges");
        env.wait_state("ok", FAILOVER).await;
        let row =
            one_failover(&env, &seen, r).await.unwrap_or_else(|e| env.fail(&format!("{e:#}")));
        emit(
            &mut out,
            format!(
                "round {r}: noone {}  promoted {}  switch {}  polestar flip {}  writer {}  blocked {}  acked {}  stored {}  lost {}",
                fmt(row.noone),
                fmt(row.promoted),
                fmt(row.switched),
                fmt(row.flip),
                fmt(row.writer),
                fmt(row.blocked),
                row.acked,
                row.stored,
                row.acked.saturating_sub(row.stored)
            ),
        );
        rows.push(row);
    }
    emit(&mut out, String::new());
    for (name, pick) in [
        ("writer", (|r: &Round| r.writer) as fn(&Round) -> Option<f64>),
        ("blocked", |r: &Round| r.blocked),
    ] {
        let from_cmd: Vec<f64> = rows.iter().filter_map(pick).collect();
        let from_promoted: Vec<f64> =
            rows.iter().filter_map(|r| Some(pick(r)? - r.promoted?)).collect();
        let show = |v: &[f64]| {
            median_max(v).map(|(m, x)| format!("median {m:.3} s, max {x:.3} s")).unwrap_or_default()
        };
        emit(
            &mut out,
            format!(
                "{name:<7} command->success: {}; promoted->success: {}; not recovered in {}/{rounds}",
                show(&from_cmd),
                show(&from_promoted),
                rows.len() - from_cmd.len()
            ),
        );
    }
    let flips: Vec<f64> = rows.iter().filter_map(|r| Some(r.flip? - r.promoted?)).collect();
    if let Some((m, x)) = median_max(&flips) {
        emit(
            &mut out,
            format!("promoted->polestar flip: median {:.1} ms, max {:.1} ms", m * 1e3, x * 1e3),
        );
    }
    let lost: u64 = rows.iter().map(|r| r.acked.saturating_sub(r.stored)).sum();
    let acked: u64 = rows.iter().map(|r| r.acked).sum();
    emit(&mut out, format!("lost acknowledged writes: {lost} of {acked} over {rounds} failovers"));
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/target/bench-drain.txt");
    let _ = std::fs::write(file, out);
}
