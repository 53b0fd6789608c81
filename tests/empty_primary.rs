//! A primary without persistence (the lab's nodes run `save ""`, `appendonly no`, as caches
//! do) watched by Sentinels whose `down-after` is longer than a restart takes: the readiness
//! answer warns (without making the master unready), and a kill -9 with a restart 0.3 s later
//! on the same port, which no Sentinel fails over, is a `primary_restarted_empty` event, a
//! metric and a log line. The race polestar would have to win to keep the replicas' data is
//! measured and printed (`empty primary: ...`, docs/operating.md "An empty primary").

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use polestar_lab::{Lab, LabOptions, query};
use serde_json::Value;
use tokio::time::{Instant, sleep};

use common::*;

/// Keys written before the crash.
const KEYS: u64 = 20_000;
/// The Sentinels' `down-after`: far longer than the restart.
const DOWN_AFTER: Duration = Duration::from_secs(5);
/// How long the primary stays dead (the measurement: 0.3 s).
const DEAD: Duration = Duration::from_millis(300);

async fn verdict(env: &Env) -> anyhow::Result<Value> {
    let path = format!("/v1/masters/{}/readiness", env.master_name());
    Ok(env.ps.get_json(&path).await?.1)
}

fn warned(verdict: &Value) -> bool {
    let warnings = verdict["warnings"].as_array().into_iter().flatten();
    warnings.into_iter().any(|w| w["reason"] == "no_persistence")
}

/// The value of the series `name{master="...",...}` (its labels as exposed), if exposed.
async fn series(env: &Env, name_and_labels: &str) -> anyhow::Result<Option<f64>> {
    let (status, body) = env.ps.get_text("/metrics").await?;
    anyhow::ensure!(status == 200, "{status}: {body}");
    let line = body.lines().find(|l| l.starts_with(name_and_labels));
    Ok(line.and_then(|l| l.rsplit(' ').next()?.parse().ok()))
}

async fn dbsize(addr: SocketAddr) -> Option<u64> {
    query::<u64>(addr, &redis::cmd("DBSIZE")).await.ok()
}

async fn fill(primary: SocketAddr) {
    for batch in 0..KEYS / 1000 {
        let mut mset = redis::cmd("MSET");
        for i in batch * 1000..(batch + 1) * 1000 {
            mset.arg(format!("key:{i}")).arg("value");
        }
        query::<()>(primary, &mset).await.expect("MSET on the primary");
    }
}

#[tokio::test]
async fn a_primary_without_persistence_warns_and_its_empty_restart_is_an_event() {
    let lab = Lab::start(LabOptions { down_after: DOWN_AFTER, ..LabOptions::default() })
        .await
        .expect("the lab starts");
    let config = PolestarConfig::for_lab(&lab);
    let env = Env::with_config(lab, &config).await;
    let master = env.master_name();
    let primary = env.lab.primary().await.expect("the lab's primary");
    let index = env.lab.index_of(primary).expect("the primary is a lab node");
    let replicas: Vec<SocketAddr> =
        env.lab.node_addrs().into_iter().filter(|a| *a != primary).collect();

    // The warning, under `warnings`: the master stays ready.
    let shown = env
        .wait_until(STARTUP, "ready, with the no_persistence warning", || async {
            let v = verdict(&env).await?;
            anyhow::ensure!(v["ready"] == true && warned(&v), "{v}");
            Ok(v)
        })
        .await;
    let detail = shown["warnings"][0]["detail"].as_str().unwrap_or_default().to_string();
    assert!(detail.starts_with(&primary.to_string()) && detail.contains("5s"), "{detail}");
    let warning =
        format!("polestar_readiness_warning{{master=\"{master}\",reason=\"no_persistence\"}}");
    let restarts = format!("polestar_primary_empty_restarts_total{{master=\"{master}\"}}");
    assert_eq!(series(&env, &warning).await.expect("/metrics"), Some(1.0));
    assert_eq!(series(&env, &restarts).await.expect("/metrics"), Some(0.0));
    assert!(env.ps.logged("data at risk"), "the warning is logged");

    // With AOF on, the same primary is no risk: the warning is about persistence.
    let set = |on: &'static str| async move {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("SET").arg("appendonly").arg(on);
        query::<()>(primary, &cmd).await.expect("CONFIG SET appendonly");
    };
    set("yes").await;
    env.wait_until(FOLLOW, "no warning with AOF on", || async {
        let v = verdict(&env).await?;
        anyhow::ensure!(!warned(&v), "{v}");
        Ok(())
    })
    .await;
    set("no").await;
    env.wait_until(FOLLOW, "the warning again with AOF off", || async {
        let v = verdict(&env).await?;
        anyhow::ensure!(warned(&v), "{v}");
        Ok(())
    })
    .await;

    // Data on the primary and both replicas, and polestar's poll has seen the primary hold it.
    fill(primary).await;
    env.wait_until(FOLLOW, "the replicas hold every key", || async {
        for r in &replicas {
            let n = dbsize(*r).await;
            anyhow::ensure!(n == Some(KEYS), "{r}: {n:?} keys");
        }
        Ok(())
    })
    .await;
    sleep(Duration::from_secs(3)).await; // a readiness round (1 s) or two after the writes
    let epoch = env.lab.epoch().await.expect("the epoch");
    let mut stream = env.ps.event_stream().await.expect("the event stream");

    // kill -9, dead 0.3 s, started again on the same port and config (no data on disk).
    env.lab.kill_node(index).expect("kill -9 the primary");
    let killed = Instant::now();
    sleep(DEAD).await;
    env.lab.restart_node(index).await.expect("the primary starts again");
    let answered = killed.elapsed();

    // The race: when each replica has the empty dataset, against when polestar tells.
    let race = async {
        let mut emptied = vec![None; replicas.len()];
        while emptied.iter().any(Option::is_none) && killed.elapsed() < FAILOVER {
            for (i, r) in replicas.iter().enumerate() {
                if emptied[i].is_none() && dbsize(*r).await.is_some_and(|n| n < KEYS / 2) {
                    emptied[i] = Some(killed.elapsed());
                }
            }
            sleep(Duration::from_millis(10)).await;
        }
        emptied
    };
    let event = async {
        let event = tokio::time::timeout(FAILOVER, stream.next_of_kind("primary_restarted_empty"));
        let event = event.await.map_err(|_| anyhow::anyhow!("no event within {FAILOVER:?}"));
        (event.and_then(|e| e), killed.elapsed())
    };
    let (emptied, (event, told)) = tokio::join!(race, event);
    let event = event.unwrap_or_else(|e| env.fail(&format!("primary_restarted_empty: {e:#}")));
    eprintln!(
        "empty primary: restarted and answering {:.2}s after the kill; replicas emptied at {}; \
         polestar told at {:.2}s",
        answered.as_secs_f64(),
        emptied
            .iter()
            .map(|e| e.map_or("never".into(), |d| format!("{:.2}s", d.as_secs_f64())))
            .collect::<Vec<_>>()
            .join(", "),
        told.as_secs_f64()
    );
    assert_eq!(event["master"], master.as_str(), "{event}");
    assert_eq!(event["node"], primary.to_string(), "{event}");
    assert!(event["keys_before"].as_u64().is_some_and(|k| k >= KEYS), "{event}");
    assert!(event["keys"].as_u64().is_some_and(|k| k < KEYS), "{event}");
    let held: Vec<String> = replicas.iter().map(SocketAddr::to_string).collect();
    let named: Vec<&str> =
        event["replicas"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    assert!(held.iter().all(|r| named.contains(&r.as_str())), "{event}");
    env.wait_until(FOLLOW, "the counter and the log line", || async {
        let counted = series(&env, &restarts).await?;
        anyhow::ensure!(counted == Some(1.0), "{restarts} {counted:?}");
        anyhow::ensure!(env.ps.logged("the primary restarted empty"), "no log line");
        Ok(())
    })
    .await;
    // What the issue measured: no failover, the data gone everywhere, and the warning still up.
    assert_eq!(env.lab.epoch().await.expect("the epoch"), epoch, "no failover");
    assert_eq!(env.lab.primary().await.expect("the primary"), primary);
    for r in &replicas {
        assert!(dbsize(*r).await.is_some_and(|n| n < KEYS), "{r} resynced the empty dataset");
    }
    assert!(warned(&verdict(&env).await.expect("the verdict")));
}

/// What follows a change polestar is shown: a round (1 s) and its answers, with headroom.
const FOLLOW: Duration = Duration::from_secs(10);
