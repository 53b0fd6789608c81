//! The readiness verdict against real faults in a real cluster: each condition sets its
//! reason soon after the Sentinels show it and clears soon after the cure, and planned
//! failovers raise no false blocker. The delays measured are printed (`readiness: ...`).

use crate::common;

use std::time::Duration;

use std::collections::HashMap;

use polestar::lab::{Lab, LabOptions, query};
use serde_json::Value;
use tokio::time::{Instant, sleep};

use common::*;

/// A reason set or cleared later than this after the Sentinels show it fails the test; the
/// promise is 2 s, the rest is headroom for a loaded machine (the real delays are printed).
pub const FOLLOW: Duration = Duration::from_secs(6);
/// Sentinel refreshes a replica's INFO every 10 s: it may take that long to show a change.
const SENTINEL_SHOWS: Duration = Duration::from_secs(40);

/// A lab whose polestar judges stale entries after 2 s (instead of 60 s) to keep tests short.
pub async fn start() -> Env {
    let lab = Lab::start(LabOptions::default()).await.expect("start the lab");
    let mut config = PolestarConfig::for_lab(&lab);
    config.extra = "readiness:\n  stale_after: 2s\n  interval: 500ms\n".into();
    let env = Env::with_config(lab, &config).await;
    env.wait_reachable(3, STARTUP).await;
    wait_ready(&env, true, STARTUP).await;
    env
}

/// `GET .../readiness`: the verdict (200 or 503 both carry it).
pub async fn verdict(env: &Env) -> anyhow::Result<Value> {
    let path = format!("/v1/masters/{}/readiness", env.master_name());
    let (status, body) = env.ps.get_json(&path).await?;
    anyhow::ensure!(body["ready"].is_boolean(), "{status}: {body}");
    let ready = body["ready"] == true;
    anyhow::ensure!((status == 200) == ready, "status {status} with {body}");
    Ok(body)
}

pub fn blocked(verdict: &Value, reason: &str) -> bool {
    let blockers = verdict["blockers"].as_array().cloned().unwrap_or_default();
    blockers.iter().any(|b| b["reason"] == reason)
}

async fn wait_ready(env: &Env, ready: bool, deadline: Duration) -> Value {
    env.wait_until(deadline, &format!("ready {ready}"), || async {
        let v = verdict(env).await?;
        anyhow::ensure!(v["ready"] == ready, "{v}");
        Ok(v)
    })
    .await
}

/// Waits until `shown` (what the Sentinels say) holds, then until the verdict has `reason`
/// (`set`) or has not; returns the verdict and how long after `shown` polestar followed
/// (zero when polestar was first).
async fn follow<F, Fut>(
    env: &Env,
    what: &str,
    reason: &str,
    set: bool,
    shown: F,
) -> (Value, Duration)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + SENTINEL_SHOWS;
    let mut shown_at = None;
    let mut followed_at = None;
    let mut last = Value::Null;
    loop {
        let now = Instant::now();
        if shown_at.is_none() && shown().await {
            shown_at = Some(now);
        }
        if followed_at.is_none()
            && let Ok(v) = verdict(env).await
        {
            if blocked(&v, reason) == set {
                followed_at = Some(now);
            }
            last = v;
        }
        if let (Some(s), Some(f)) = (shown_at, followed_at) {
            let delay = f.saturating_duration_since(s);
            let verb = if set { "set" } else { "cleared" };
            eprintln!("readiness: {reason} {verb} {:.2}s after {what}", delay.as_secs_f64());
            if delay > FOLLOW {
                env.fail(&format!("{reason} {verb} {delay:?} after {what}: {last}"));
            }
            return (last, delay);
        }
        if Instant::now() > end {
            env.fail(&format!("{what}: shown {shown_at:?}, {reason} set={set}: {last}"));
        }
        sleep(POLL).await;
    }
}

/// What a Sentinel lists about each replica.
async fn replica_records(addr: std::net::SocketAddr, master: &str) -> Vec<HashMap<String, String>> {
    let mut cmd = redis::cmd("SENTINEL");
    cmd.arg("REPLICAS").arg(master);
    let records: Vec<Vec<String>> = query(addr, &cmd).await.unwrap_or_default();
    let pairs = |flat: Vec<String>| {
        flat.chunks(2).filter_map(|c| Some((c.first()?.clone(), c.get(1)?.clone()))).collect()
    };
    records.into_iter().map(pairs).collect()
}

/// Every running Sentinel lists every replica with `check` true.
async fn every_sentinel_shows(env: &Env, check: impl Fn(&HashMap<String, String>) -> bool) -> bool {
    let master = env.master_name();
    for addr in env.lab.running_sentinels() {
        let records = replica_records(addr, &master).await;
        if records.is_empty() || !records.iter().all(&check) {
            return false;
        }
    }
    true
}

fn flagged(r: &HashMap<String, String>, flag: &str) -> bool {
    r.get("flags").is_some_and(|f| f.split(',').any(|x| x == flag))
}

async fn set_priority(env: &Env, priority: &str) {
    let primary = env.lab.primary().await.expect("the primary");
    for node in env.lab.node_addrs().into_iter().filter(|n| *n != primary) {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("SET").arg("replica-priority").arg(priority);
        query::<String>(node, &cmd).await.expect("CONFIG SET replica-priority");
    }
}

#[tokio::test]
async fn priority_zero_everywhere_blocks_and_the_cure_clears() {
    let env = start().await;
    set_priority(&env, "0").await;
    let shown =
        || every_sentinel_shows(&env, |r| r.get("slave-priority").map(String::as_str) == Some("0"));
    let (v, _) =
        follow(&env, "every Sentinel showed priority 0", "no_promotable_replica", true, shown)
            .await;
    assert!(v.to_string().contains("replica-priority 0"), "{v}");
    let line = status_failover_line(&env).await;
    assert!(line.contains("NOT POSSIBLE: no_promotable_replica"), "polestar status: {line}");
    set_priority(&env, "100").await;
    let shown = || {
        every_sentinel_shows(&env, |r| r.get("slave-priority").map(String::as_str) == Some("100"))
    };
    follow(&env, "every Sentinel showed priority 100", "no_promotable_replica", false, shown).await;
    wait_ready(&env, true, FOLLOW).await;
    let line = status_failover_line(&env).await;
    assert!(line.ends_with("possible") && !line.contains("NOT"), "polestar status: {line}");
}

/// The line `polestar status` prints for the lab's master under FAILOVER.
async fn status_failover_line(env: &Env) -> String {
    let api = env.ps.api();
    let out = crate::common::cli(&["status", "--api", &api], Duration::from_secs(20)).await;
    assert_eq!(out.status.code(), Some(0), "{}", crate::common::shown(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let below = text.split_once("\nFAILOVER\n").map(|(_, b)| b).unwrap_or("");
    let master = env.master_name();
    let line = below.lines().find(|l| l.split_whitespace().next() == Some(master.as_str()));
    line.unwrap_or_else(|| panic!("no FAILOVER line for {master}: {text}")).trim().to_string()
}

#[tokio::test]
async fn two_sentinels_down_block_and_their_return_clears() {
    let env = start().await;
    env.lab.stop_sentinel(1).expect("stop sentinel 1");
    env.lab.stop_sentinel(2).expect("stop sentinel 2");
    let (v, _) =
        follow(&env, "two Sentinels were killed", "sentinels_unreachable", true, || async { true })
            .await;
    assert!(v.to_string().contains("1 of 3 configured Sentinels reachable"), "{v}");
    env.lab.start_sentinel(1).await.expect("start sentinel 1");
    let sentinel = env.lab.sentinel_addrs()[1];
    let answers = || async move { query::<String>(sentinel, &redis::cmd("PING")).await.is_ok() };
    follow(&env, "a second Sentinel answered again", "sentinels_unreachable", false, answers).await;
    env.lab.start_sentinel(2).await.expect("start sentinel 2");
}

#[tokio::test]
async fn every_replica_down_blocks_and_a_stale_entry_is_named() {
    let env = start().await;
    let primary = env.lab.primary().await.expect("the primary");
    let replicas: Vec<usize> = (0..3).filter(|i| env.lab.node_addrs()[*i] != primary).collect();
    // One replica gone: still promotable (the other), but its entry goes stale after 2 s.
    env.lab.kill_node(replicas[0]).expect("kill a replica");
    let gone = env.lab.node_addrs()[replicas[0]].to_string();
    let stale = || async {
        let master = env.master_name();
        let records = replica_records(env.lab.sentinel_addrs()[0], &master).await;
        records.iter().any(|r| {
            flagged(r, "s_down")
                && format!("{}:{}", r["ip"], r["port"]) == gone
                && r.get("s-down-time")
                    .and_then(|t| t.parse::<u64>().ok())
                    .is_some_and(|t| t >= 2000)
        })
    };
    let (v, _) =
        follow(&env, "a Sentinel showed a replica s_down for 2 s", "stale_replicas", true, stale)
            .await;
    assert!(!blocked(&v, "no_promotable_replica"), "one replica is left: {v}");
    // The other replica too: nothing left to promote.
    env.lab.kill_node(replicas[1]).expect("kill the other replica");
    let down = || every_sentinel_shows(&env, |r| flagged(r, "s_down"));
    follow(&env, "every Sentinel showed every replica s_down", "no_promotable_replica", true, down)
        .await;
    // The cure: both back.
    env.lab.restart_node(replicas[0]).await.expect("restart");
    env.lab.restart_node(replicas[1]).await.expect("restart");
    let up = || {
        every_sentinel_shows(&env, |r| {
            !flagged(r, "s_down") && r.get("master-link-status").map(String::as_str) == Some("ok")
        })
    };
    follow(&env, "every Sentinel showed every replica up", "no_promotable_replica", false, up)
        .await;
    follow(&env, "every Sentinel showed every replica up", "stale_replicas", false, up).await;
    wait_ready(&env, true, FOLLOW).await;
}

#[tokio::test]
async fn a_sentinel_held_for_3s_is_in_tilt_and_then_it_passes() {
    let env = start().await;
    env.lab.hang_sentinel(0).expect("SIGSTOP");
    sleep(Duration::from_secs(3)).await;
    env.lab.unhang_sentinel(0).expect("SIGCONT");
    let s = env.lab.sentinel_addrs()[0];
    let tilted = move || async move { tilt(s).await == Some(true) };
    let (v, _) =
        follow(&env, "the Sentinel's INFO showed sentinel_tilt:1", "sentinel_tilt", true, tilted)
            .await;
    assert!(v.to_string().contains("TILT"), "{v}");
    // TILT lasts 30 s.
    let calm = move || async move { tilt(s).await == Some(false) };
    follow(&env, "the Sentinel's INFO showed sentinel_tilt:0", "sentinel_tilt", false, calm).await;
}

async fn tilt(addr: std::net::SocketAddr) -> Option<bool> {
    let mut cmd = redis::cmd("INFO");
    cmd.arg("sentinel");
    let info: String = query(addr, &cmd).await.ok()?;
    Some(info.contains("sentinel_tilt:1"))
}

/// Planned failovers one after another: once every Sentinel and the API show the new primary,
/// the master is ready again within seconds and stays so (a blocker then would be false:
/// nothing is wrong). Every blocker seen on the way is printed.
#[tokio::test]
async fn planned_failovers_raise_no_false_blocker() {
    let env = start().await;
    for round in 0..10 {
        env.failover().await;
        let started = Instant::now();
        wait_ready(&env, true, FOLLOW).await;
        let took = started.elapsed().as_secs_f64();
        eprintln!("readiness: ready {took:.2}s after planned failover {round} was seen");
        let end = Instant::now() + Duration::from_secs(3);
        while Instant::now() < end {
            let v = verdict(&env).await.expect("a verdict");
            if v["ready"] != true {
                env.fail(&format!("a false blocker after failover {round}: {v}"));
            }
            sleep(Duration::from_millis(200)).await;
        }
    }
}

#[tokio::test]
async fn lag_aware_replica_answers() {
    let env = start().await;
    let master = env.master_name();
    let replicas = format!("/v1/masters/{master}/replicas?max_lag=1MB");
    let listed = env
        .wait_until(FOLLOW, "replicas with a lag", || async {
            let (status, body) = env.ps.get_json(&replicas).await?;
            anyhow::ensure!(
                status == 200 && body.as_array().is_some_and(|a| a.len() == 2),
                "{status} {body}"
            );
            Ok(body)
        })
        .await;
    let first = &listed[0];
    let addr = format!("{}:{}", first["ip"].as_str().unwrap_or_default(), first["port"]);
    let check = |q: &str| format!("/v1/masters/{master}/replica?{q}");
    let (status, text) =
        env.ps.get_text(&check(&format!("is={addr}&max_lag=1MB"))).await.expect("GET");
    assert_eq!(status, 200, "{text}");
    let (status, body) =
        env.ps.get_json(&check(&format!("is={addr}&max_lag=lots"))).await.expect("GET");
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().is_some_and(|e| e.contains("max_lag") && e.contains("lots")),
        "{body}"
    );
    let primary = env.lab.primary().await.expect("primary");
    let (status, body) = env.ps.get_json(&check(&format!("is={primary}"))).await.expect("GET");
    assert_eq!(status, 404, "the primary is no replica: {body}");
    let (status, body) =
        env.ps.get_json("/v1/masters/nope/replica?is=127.0.0.1:1").await.expect("GET");
    assert_eq!(status, 404, "{body}");
    let (status, body) = env.ps.get_json("/v1/masters/nope/readiness").await.expect("GET");
    assert_eq!(status, 404, "{body}");
    // A replica that stops is not healthy: 503 at once from Sentinel's flags.
    let i = env.lab.index_of(addr.parse().expect("an address")).expect("a lab node");
    env.lab.kill_node(i).expect("kill");
    env.wait_until(FAILOVER, "the killed replica answers 503", || async {
        let (status, text) = env.ps.get_text(&check(&format!("is={addr}"))).await?;
        anyhow::ensure!(status == 503, "{status} {text}");
        Ok(())
    })
    .await;
}

/// The last command of each of polestar's connections to the Sentinel at `addr` that is
/// neither its link's subscription nor a Sentinel peer's (`CLIENT LIST`'s `cmd`).
async fn polestar_commands(addr: std::net::SocketAddr) -> Vec<String> {
    let list: String = query(addr, redis::cmd("CLIENT").arg("LIST")).await.unwrap_or_default();
    let field = |line: &str, key: &str| {
        line.split_whitespace().find_map(|f| f.strip_prefix(key)).unwrap_or("").to_string()
    };
    let ours = |line: &&str| {
        !field(line, "name=").starts_with("sentinel-")
            && field(line, "psub=") == "0"
            && field(line, "cmd=") != "client|list"
    };
    list.lines().filter(ours).map(|line| field(line, "cmd=")).collect()
}

/// Issue 24, regression (`links_started_before_they_were_given_heard`): the Sentinel links
/// were started before the decider was given the place for their records, so the readiness
/// poll asked every Sentinel `SENTINEL MASTER` of every master every round instead of taking
/// what the links had read. Once the links have reconciled, a round asks `INFO`, then per
/// master `REPLICAS` (it has replicas) and `CKQUORUM`, never `MASTER`: the poll's last
/// command on every Sentinel is `CKQUORUM`, round after round (without the links' records
/// it is `REPLICAS`, after `CKQUORUM` and `MASTER`).
#[tokio::test]
async fn the_readiness_poll_takes_the_links_records_instead_of_asking_again() {
    let env = start().await;
    // The rounds before the links' first full reconciliation ask everything, as they must.
    env.wait_until(STARTUP, "a round that took the links' records", || async {
        for addr in env.lab.running_sentinels() {
            let commands = polestar_commands(addr).await;
            anyhow::ensure!(
                commands.iter().any(|c| c == "sentinel|ckquorum"),
                "{addr}: {commands:?}"
            );
        }
        Ok(())
    })
    .await;
    let mut seen = Vec::new();
    let end = Instant::now() + Duration::from_secs(4);
    while Instant::now() < end {
        for addr in env.lab.running_sentinels() {
            seen.extend(polestar_commands(addr).await);
        }
        sleep(Duration::from_millis(100)).await;
    }
    let asked_again = |c: &String| c == "sentinel|master" || c == "sentinel|replicas";
    assert!(!seen.iter().any(asked_again), "a round without the links' records: {seen:?}");
    assert!(seen.iter().any(|c| c == "sentinel|ckquorum"), "no poll round seen: {seen:?}");
}
