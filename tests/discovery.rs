//! The discovery contract (docs/using.md, "HTTP API"; docs/deciding.md) against real Sentinels and the
//! real binary: what the HTTP API says about a master, and that it follows every kind of failover,
//! never goes backwards, and survives losing and regaining Sentinels.

use crate::common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::ensure;
use common::*;
use polestar_lab::{Lab, LabOptions};
use serde_json::Value;
use tokio::time::Instant;

fn replica_set(master: &Value) -> BTreeSet<SocketAddr> {
    let list = master["replicas"].as_array().cloned().unwrap_or_default();
    list.iter()
        .filter_map(|r| {
            Some(SocketAddr::new(r["ip"].as_str()?.parse().ok()?, r["port"].as_u64()? as u16))
        })
        .collect()
}

#[tokio::test]
async fn initial_discovery_matches_sentinel() {
    initial_discovery_matches_sentinel_on(LabOptions::default()).await;
}

/// Valkey 8 (the same discovery on `valkey-server` and `valkey-server --sentinel`).
#[tokio::test]
async fn valkey_initial_discovery_matches_sentinel() {
    initial_discovery_matches_sentinel_on(LabOptions { flavor: valkey(), ..LabOptions::default() })
        .await;
}

#[tokio::test]
async fn valkey_hung_primary_is_followed() {
    let opts = LabOptions { flavor: valkey(), ..LabOptions::default() };
    primary_failure_is_followed_on(opts, true).await;
}

async fn initial_discovery_matches_sentinel_on(opts: LabOptions) {
    let env = Env::start_on(opts).await;
    let m = env.wait_reachable(3, STARTUP).await;
    let primary = env.lab.primary().await.expect("SENTINEL get-master-addr-by-name");
    assert_eq!(primary_of(&m), Some(primary), "{m}");
    assert_eq!(epoch_of(&m), Some(env.lab.epoch().await.expect("config epoch")), "{m}");
    assert_eq!(m["name"], "mymaster");
    assert_eq!(m["dns_name"], "mymaster");
    assert_eq!(m["sentinels"]["configured"], 3);
    assert!(m["since"].is_string() || m["since"].is_number(), "since: {m}");
    let expected: BTreeSet<_> = env.lab.replicas().await.expect("replicas").into_iter().collect();
    let m = env
        .wait_until(FAILOVER, "replicas listed and healthy", || async {
            let m = env.master().await?;
            ensure!(replica_set(&m) == expected, "replicas {} vs {expected:?}", m["replicas"]);
            let healthy =
                m["replicas"].as_array().into_iter().flatten().all(|r| r["healthy"] == true);
            ensure!(healthy, "unhealthy replica in {}", m["replicas"]);
            Ok(m)
        })
        .await;
    assert_eq!(m["state"], "ok");

    let (status, all) = env.ps.get_json("/v1/masters").await.expect("GET /v1/masters");
    assert_eq!(status, 200);
    assert!(all.as_array().is_some_and(|a| a.iter().any(|x| x["name"] == "mymaster")), "{all}");
    let (status, ctype, text) = env.ps.get("/v1/masters/mymaster/primary").await.expect("primary");
    assert_eq!((status, text.trim()), (200, primary.to_string().as_str()));
    assert!(ctype.starts_with("text/plain"), "{ctype}");
    let (status, _) = env.ps.get_text("/readyz").await.expect("readyz");
    assert_eq!(status, 200);
}

#[tokio::test]
async fn sentinel_failover_moves_the_api_wakes_long_polls_and_streams() {
    let env = Env::start().await;
    let m = env.master().await.expect("master");
    let (old, epoch) = (primary_of(&m).expect("primary"), epoch_of(&m).expect("epoch"));
    let is = |addr: SocketAddr| format!("/v1/masters/mymaster/primary?is={addr}");
    assert_eq!(env.ps.get_text(&is(old)).await.expect("is").0, 200);

    let poll_url = format!("/v1/masters/mymaster?wait=60s&after={epoch}");
    let long_poll = async {
        let answer = env.ps.get_json(&poll_url).await;
        (answer, Instant::now())
    };
    let mut stream = env.ps.event_stream().await.expect("event stream");
    let watch_switch = async {
        let event = tokio::time::timeout(FAILOVER * 2, stream.next_of_kind("switch")).await;
        event.map_err(|_| anyhow::anyhow!("no switch event")).and_then(|e| e)
    };
    let switch = async {
        env.lab.failover().await.unwrap_or_else(|e| env.fail(&format!("{e:#}")));
        let seen = env.wait_until(FAILOVER, "API moves", || async {
            let m = env.master().await?;
            ensure!(primary_of(&m).is_some_and(|p| p != old), "still {}", m["primary"]);
            Ok((m, Instant::now()))
        });
        seen.await
    };
    let ((polled, poll_done), event, (moved, moved_at)) =
        tokio::join!(long_poll, watch_switch, switch);

    let new = primary_of(&moved).expect("new primary");
    assert!(epoch_of(&moved).expect("epoch") > epoch, "epoch grows: {moved}");
    let (status, polled) = polled.expect("long poll answered");
    assert_eq!(status, 200);
    assert!(epoch_of(&polled).is_some_and(|e| e > epoch), "long poll returned early: {polled}");
    let late = poll_done.saturating_duration_since(moved_at);
    assert!(late < Duration::from_secs(1), "long poll returned {late:?} after the switch");
    let event = event.unwrap_or_else(|e| env.fail(&format!("event stream: {e:#}")));
    assert_eq!(event["kind"], "switch", "{event}");
    assert_eq!(env.ps.get_text(&is(new)).await.expect("is").0, 200);
    assert_eq!(env.ps.get_text(&is(old)).await.expect("is").0, 503);
    assert_eq!(env.lab.wait_for_primary_change(old, FAILOVER).await.expect("sentinels"), new);
}

/// Kills (SIGKILL) or hangs (SIGSTOP) the primary and checks the API follows Sentinel.
async fn primary_failure_is_followed(hang: bool) {
    primary_failure_is_followed_on(LabOptions::default(), hang).await;
}

async fn primary_failure_is_followed_on(opts: LabOptions, hang: bool) {
    let env = Env::start_on(opts).await;
    let old = env.lab.primary().await.expect("primary");
    let i = env.lab.index_of(old).expect("a lab node");
    let epoch = epoch_of(&env.master().await.expect("master")).expect("epoch");
    if hang { env.lab.stop_node(i) } else { env.lab.kill_node(i) }.expect("fault");
    let new = env.lab.wait_for_primary_change(old, FAILOVER * 2).await;
    let new = new.unwrap_or_else(|e| env.fail(&format!("{e:#}")));
    let m = env.wait_api_primary(new, FAILOVER).await;
    assert!(epoch_of(&m).expect("epoch") > epoch, "{m}");
}

#[tokio::test]
async fn killed_primary_is_followed() {
    primary_failure_is_followed(false).await;
}

#[tokio::test]
async fn hung_primary_is_followed() {
    primary_failure_is_followed(true).await;
}

#[tokio::test]
async fn losing_sentinels_one_is_ok_all_is_stale_and_back_is_ok() {
    let env = Env::start().await;
    let primary = env.lab.primary().await.expect("primary");
    env.wait_reachable(3, STARTUP).await;
    env.lab.stop_sentinel(0).expect("stop");
    let m = env.wait_reachable(2, STALE).await;
    assert_eq!(m["state"], "ok", "{m}");

    env.lab.stop_sentinel(1).expect("stop");
    env.lab.stop_sentinel(2).expect("stop");
    let m = env.wait_state("stale", STALE).await;
    assert_eq!(primary_of(&m), Some(primary), "the last primary is still served: {m}");
    let (status, text) = env.ps.get_text("/v1/masters/mymaster/primary").await.expect("primary");
    assert_eq!((status, text.trim()), (200, primary.to_string().as_str()));
    let (status, reason) = env.ps.get_text("/readyz").await.expect("readyz");
    assert_eq!(status, 503, "{reason}");
    assert!(!reason.trim().is_empty(), "/readyz gives a reason");

    for i in 0..3 {
        env.lab.start_sentinel(i).await.expect("start");
    }
    env.wait_state("ok", FAILOVER).await;
    env.wait_reachable(3, FAILOVER).await;
    env.wait_until(FAILOVER, "/readyz 200", || async {
        let (status, body) = env.ps.get_text("/readyz").await?;
        ensure!(status == 200, "{status} {body}");
        Ok(())
    })
    .await;
    env.lab.wait_converged(FAILOVER * 2).await.expect("sentinels converge again");
    let new = env.failover().await;
    assert_ne!(new, primary, "a failover after the outage is seen");
}

#[tokio::test]
async fn a_sentinel_down_at_start_is_used_once_it_starts() {
    let lab = Lab::start(LabOptions::default()).await.expect("the lab starts");
    lab.stop_sentinel(2).expect("stop");
    let config = PolestarConfig::for_lab(&lab);
    let env = Env::with_config(lab, &config).await;
    env.wait_reachable(2, STARTUP).await;
    env.lab.start_sentinel(2).await.expect("start");
    env.wait_reachable(3, FAILOVER).await;
    env.lab.stop_sentinel(0).expect("stop");
    env.lab.stop_sentinel(1).expect("stop");
    let m = env.wait_reachable(1, STALE).await;
    assert_eq!(m["state"], "ok", "the late Sentinel alone keeps the master fresh: {m}");
    assert_eq!(primary_of(&m), Some(env.lab.node_addrs()[0]));
}

#[tokio::test]
async fn a_hung_sentinel_is_detected_and_does_not_block_updates() {
    let env = Env::start().await;
    env.wait_reachable(3, STARTUP).await;
    env.lab.hang_sentinel(0).expect("hang");
    let hung_at = Instant::now();
    env.wait_reachable(2, STALE).await;
    let detected = hung_at.elapsed();
    assert!(detected < STALE, "hung Sentinel detected after {detected:?}");
    let old = env.lab.primary().await.expect("primary");
    let new = env.failover().await;
    assert_ne!(new, old);
    let m = env.master().await.expect("master");
    assert_eq!(m["sentinels"]["reachable"], 2, "{m}");
    env.lab.unhang_sentinel(0).expect("resume");
    env.wait_reachable(3, FAILOVER).await;
}

#[tokio::test]
async fn a_lower_epoch_is_never_published() {
    let env = Env::start().await;
    let old = env.lab.primary().await.expect("primary");
    let i = env.lab.index_of(old).expect("a lab node");
    env.lab.stop_node(i).expect("hang the primary");
    let new = env.lab.wait_for_primary_change(old, FAILOVER * 2).await;
    let new = new.unwrap_or_else(|e| env.fail(&format!("{e:#}")));
    let m = env.wait_api_primary(new, FAILOVER).await;
    let epoch = epoch_of(&m).expect("epoch");
    env.lab.cont_node(i).expect("the old primary wakes up, still claiming master");
    // Until Sentinel has demoted the old primary (and a while longer), the API keeps the new one.
    let end = Instant::now() + Duration::from_secs(4);
    let mut demoted = false;
    while Instant::now() < end || !demoted {
        let m = env.master().await.expect("master");
        assert_eq!(primary_of(&m), Some(new), "went back to the old primary: {m}");
        assert!(epoch_of(&m).is_some_and(|e| e >= epoch), "epoch went down: {m}");
        demoted = demoted || env.lab.role(i).await.is_ok_and(|r| r == "slave");
        if Instant::now() > end + FAILOVER * 2 {
            env.fail("the old primary was never demoted");
        }
        tokio::time::sleep(POLL).await;
    }
}

#[tokio::test]
async fn bad_http_input_is_a_json_error() {
    let env = Env::start().await;
    let cases = [
        ("/v1/masters/no-such-master", 404),
        ("/v1/masters/no-such-master/primary", 404),
        ("/v1/masters/mymaster?wait=banana", 400),
        ("/v1/masters/mymaster?wait=30s&after=x", 400),
        ("/v1/masters/mymaster/primary?is=banana", 400),
    ];
    for (path, expected) in cases {
        let (status, body) =
            env.ps.get_json(path).await.unwrap_or_else(|e| env.fail(&format!("{e:#}")));
        assert_eq!(status, expected, "GET {path}: {body}");
        assert!(body["error"].as_str().is_some_and(|e| !e.is_empty()), "GET {path}: {body}");
    }
}

#[tokio::test]
async fn announced_hostnames_are_resolved_and_kept_visible() {
    let opts = LabOptions { hostnames: true, ..LabOptions::default() };
    let lab = Lab::start(opts).await.expect("the lab starts with announce-hostnames");
    let config = PolestarConfig::for_lab(&lab);
    let env = Env::with_config(lab, &config).await;
    let m = env.master().await.expect("master");
    assert_eq!(primary_of(&m), Some(env.lab.node_addrs()[0]), "{m}");
    assert_eq!(m["primary"]["hostname"], "localhost", "{m}");
    let new = env.failover().await;
    let m = env.master().await.expect("master");
    assert_eq!(primary_of(&m), Some(new), "{m}");
    assert_eq!(m["primary"]["hostname"], "localhost", "{m}");
}

/// Runs `SENTINEL <args>` on every Sentinel of the lab.
async fn on_every_sentinel(lab: &Lab, args: &[&str]) {
    for addr in lab.sentinel_addrs() {
        let mut cmd = redis::cmd("SENTINEL");
        for arg in args {
            cmd.arg(*arg);
        }
        polestar_lab::query::<String>(addr, &cmd).await.expect("the Sentinel accepts it");
    }
}

#[tokio::test]
async fn without_a_masters_list_every_monitored_master_is_served() {
    let lab = Lab::start(LabOptions::default()).await.expect("the lab starts");
    let mut config = PolestarConfig::for_lab(&lab);
    config.masters.clear();
    let env = Env::with_config(lab, &config).await;
    let primary = env.lab.primary().await.expect("primary");
    let port = primary.port().to_string();
    on_every_sentinel(&env.lab, &["MONITOR", "Second_M", "127.0.0.1", &port, "2"]).await;
    let second = env
        .wait_until(FAILOVER, "the new master is served", || async {
            let m = env.ps.master("Second_M").await?;
            ensure!(primary_of(&m) == Some(primary), "{m}");
            Ok(m)
        })
        .await;
    assert_eq!(second["dns_name"], "second-m", "{second}");
    on_every_sentinel(&env.lab, &["REMOVE", "Second_M"]).await;
    env.wait_until(FAILOVER, "the removed master is gone", || async {
        let (status, body) = env.ps.get_json("/v1/masters/Second_M").await?;
        ensure!(status == 404, "{status} {body}");
        Ok(())
    })
    .await;
    let m = env.master().await.expect("mymaster is still served");
    assert_eq!(primary_of(&m), Some(primary));
}

/// Regression (found at scale, bench/README.md "Scale"): the start-up `ROLE` check of a primary
/// (the first Sentinel's report comes before a majority) left its connection open for the life of
/// the process: at 1,000 masters, 1,000 idle connections and most of polestar's memory. An idle
/// polestar now holds no connection to any data node (its connections are named `polestar`).
#[tokio::test]
async fn an_idle_polestar_keeps_no_connection_to_data_nodes() {
    let env = Env::start().await;
    env.wait_reachable(3, STARTUP).await;
    let nodes = env.lab.node_addrs();
    env.wait_until(FAILOVER, "no polestar connection on any data node", || async {
        for node in &nodes {
            let list: String = polestar_lab::query(*node, redis::cmd("CLIENT").arg("LIST")).await?;
            let ours = list.lines().filter(|l| l.contains(" name=polestar ")).count();
            ensure!(ours == 0, "{node} has {ours} polestar connection(s):\n{list}");
        }
        Ok(())
    })
    .await;
}
