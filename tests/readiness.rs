//! The readiness verdict against real faults in a real cluster: each condition sets its
//! reason soon after the Sentinels show it and clears soon after the cure, and planned
//! failovers raise no false blocker. The delays measured are printed (`readiness: ...`).

use crate::common;

use std::time::Duration;

use std::collections::{BTreeMap, HashMap};

use polestar_lab::{Lab, LabOptions, query};
use serde_json::Value;
use tokio::time::{Instant, sleep};

use common::*;

/// How long the tests wait for what follows a verdict (ready again, an answer to change).
pub const FOLLOW: Duration = Duration::from_secs(6);
/// A reason set or cleared later than this after the test saw the Sentinels show it fails the
/// test. The promise is 2 s, and at the default `readiness.interval` (1 s, which these tests
/// run at) the design keeps to about 1 s: the poll asks TILT, `CKQUORUM`, reachability and
/// lag every interval, and judges again at once when a Sentinel link's reconciliation (on an
/// event at once, in full every second) brings changed records. The bound is twice the promise
/// because what is measured here also holds the test's own sampling (every [`POLL`], after it
/// asked each Sentinel) and a loaded 2-core machine's scheduling; the real delays are printed
/// (`readiness: ...`) and docs/operating.md gives them.
pub const WITHIN: Duration = Duration::from_secs(4);
/// Sentinel refreshes a replica's INFO every 10 s: it may take that long to show a change.
const SENTINEL_SHOWS: Duration = Duration::from_secs(40);

/// A lab whose polestar judges stale entries after 2 s (instead of 60 s) to keep tests short;
/// `readiness.interval` is the default (1 s).
pub async fn start() -> Env {
    let lab = Lab::start(LabOptions::default()).await.expect("start the lab");
    let mut config = PolestarConfig::for_lab(&lab);
    config.extra = "readiness:\n  stale_after: 2s\n".into();
    let env = Env::with_config(lab, &config).await;
    env.wait_reachable(3, STARTUP).await;
    wait_ready(&env, true, STARTUP).await;
    env
}

/// Sleeps part of a `readiness.interval` (0-1 s) drawn from the clock, so that the injection
/// that follows falls at any phase of polestar's rounds and of the Sentinel links'
/// reconciliations, not always just after a round (as it would right after [`wait_ready`]):
/// the printed delays then sample the whole range, the worst phase included.
pub async fn any_phase() {
    let clock = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    let micros = clock.map(|d| d.subsec_micros()).unwrap_or_default();
    sleep(Duration::from_millis(u64::from(micros % 1000))).await;
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
/// (zero when polestar was first), failing past [`WITHIN`].
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
            if delay > WITHIN {
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
    any_phase().await;
    set_priority(&env, "0").await;
    let shown =
        || every_sentinel_shows(&env, |r| r.get("slave-priority").map(String::as_str) == Some("0"));
    let (v, _) =
        follow(&env, "every Sentinel showed priority 0", "no_promotable_replica", true, shown)
            .await;
    assert!(v.to_string().contains("replica-priority 0"), "{v}");
    let line = status_failover_line(&env).await;
    assert!(line.contains("NOT POSSIBLE: no_promotable_replica"), "polestar status: {line}");
    any_phase().await;
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
    any_phase().await;
    env.lab.stop_sentinel(1).expect("stop sentinel 1");
    env.lab.stop_sentinel(2).expect("stop sentinel 2");
    let (v, _) =
        follow(&env, "two Sentinels were killed", "sentinels_unreachable", true, || async { true })
            .await;
    assert!(v.to_string().contains("1 of 3 configured Sentinels reachable"), "{v}");
    any_phase().await;
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
    any_phase().await;
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
    any_phase().await;
    env.lab.kill_node(replicas[1]).expect("kill the other replica");
    let down = || every_sentinel_shows(&env, |r| flagged(r, "s_down"));
    follow(&env, "every Sentinel showed every replica s_down", "no_promotable_replica", true, down)
        .await;
    // The cure: both back.
    any_phase().await;
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
    any_phase().await;
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

/// Planned failovers one after another, the verdict sampled throughout each (from just before
/// the `SENTINEL FAILOVER` until it has been ready for 3 s after every Sentinel showed the new
/// primary and every replica's link up): every blocker seen is printed, and any that the failover does not explain fails
/// the test. Explained: `no_promotable_replica` naming only replicas that are down or whose
/// link is down, while the replicas resynchronize with the new primary (Sentinel shows them so
/// too: it would not promote them either). Anything else (a disagreement past its 5 s grace,
/// a Sentinel unreachable, `CKQUORUM`, a lag, a blocker once the failover is over) is false.
/// The Sentinels show a replica's link `err` for about 20 s after each failover (their INFO of
/// the replicas runs every 10 s), so each failover is sampled that long: no blocker was seen in
/// it (with `DISAGREE_GRACE` at 0 the test fails on the first failover).
#[tokio::test]
async fn planned_failovers_raise_no_false_blocker() {
    let env = start().await;
    let mut seen: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for round in 0..10 {
        let started = Instant::now();
        let done = std::cell::Cell::new(None);
        let failover = async {
            let new = env.failover().await;
            let shown = started.elapsed();
            let converged = env.lab.wait_converged(FAILOVER * 2).await;
            converged.unwrap_or_else(|e| env.fail(&format!("failover {round}: {e:#}")));
            done.set(Some((shown, started.elapsed())));
            new
        };
        let sampling = sample_until_ready(&env, started, &done);
        let (_, samples) = tokio::join!(failover, sampling);
        let (shown, converged) = done.get().unwrap_or_default();
        let (shown, converged) = (shown.as_secs_f64(), converged.as_secs_f64());
        let mut blocked = 0;
        for (at, v) in &samples {
            for b in v["blockers"].as_array().into_iter().flatten() {
                blocked += 1;
                let key = format!("{}: {}", b["reason"].as_str().unwrap_or("?"), shape(b));
                seen.entry(key).or_default().push(at.as_secs_f64());
                if !explained(b) {
                    env.fail(&format!(
                        "failover {round}: a false blocker {:.2}s after it was asked (the API showed the new primary at {shown:.2}s): {v}",
                        at.as_secs_f64()
                    ));
                }
            }
        }
        let ready = samples.iter().rev().take_while(|(_, v)| v["ready"] == true).last();
        let ready = ready.map(|(at, _)| at.as_secs_f64()).unwrap_or_default();
        eprintln!(
            "readiness: planned failover {round}: {} samples, {blocked} blockers, the API showed it at {shown:.2}s, the Sentinels converged at {converged:.2}s, ready for good from {ready:.2}s",
            samples.len()
        );
    }
    if seen.is_empty() {
        eprintln!("readiness: planned failovers: no blocker seen");
    }
    for (blocker, at) in &seen {
        let (first, last) = at.iter().fold((f64::MAX, 0.0f64), |(a, b), t| (a.min(*t), b.max(*t)));
        eprintln!(
            "readiness: seen {} times, {first:.2}-{last:.2}s after the failover was asked: {blocker}",
            at.len()
        );
    }
}

/// Samples the verdict every 100 ms from `started` until `done` (the failover is over: every
/// Sentinel names the new primary, every replica's link is up) and the master has been ready
/// for 3 s since; each sample with its time since `started`.
async fn sample_until_ready(
    env: &Env,
    started: Instant,
    done: &std::cell::Cell<Option<(Duration, Duration)>>,
) -> Vec<(Duration, Value)> {
    let mut samples = Vec::new();
    let mut ready_since = None;
    loop {
        let v = verdict(env).await.unwrap_or_else(|e| env.fail(&format!("no verdict: {e:#}")));
        let now = Instant::now();
        let ready = v["ready"] == true;
        samples.push((now - started, v));
        ready_since = if ready { ready_since.or(Some(now)) } else { None };
        let over =
            done.get().is_some() && ready_since.is_some_and(|s| now - s >= Duration::from_secs(3));
        if over {
            return samples;
        }
        if now - started > FAILOVER * 3 {
            let last = samples.last().map(|(_, v)| v.to_string()).unwrap_or_default();
            env.fail(&format!("not ready for 3 s within {:?} of a failover: {last}", FAILOVER * 3));
        }
        sleep(Duration::from_millis(100)).await;
    }
}

/// Whether a failover explains `blocker`: no promotable replica because every replica is down
/// or has its link down (resynchronizing with the new primary).
fn explained(blocker: &Value) -> bool {
    let detail = blocker["detail"].as_str().unwrap_or_default();
    blocker["reason"] == "no_promotable_replica"
        && detail
            .split("; ")
            .all(|c| c.ends_with(" has master-link-status err") || c.contains(" is down ("))
}

/// A blocker's detail with the addresses taken out, to count alike blockers together.
fn shape(blocker: &Value) -> String {
    let detail = blocker["detail"].as_str().unwrap_or_default();
    let words = detail.split(' ').map(|w| {
        let addr = w.trim_end_matches([';', ':', ',']).parse::<std::net::SocketAddr>().is_ok();
        if addr { "ADDR" } else { w }
    });
    words.collect::<Vec<_>>().join(" ")
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
    let (status, body) =
        env.ps.get_json(&format!("/v1/masters/{master}/replicas?max_lag=lots")).await.expect("GET");
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().is_some_and(|e| e.contains("max_lag") && e.contains("lots")),
        "{body}"
    );
    let (status, body) = env.ps.get_json("/v1/masters/nope/replicas").await.expect("GET");
    assert_eq!(status, 404, "{body}");
    assert!(body["error"].as_str().is_some_and(|e| e.contains("nope")), "{body}");
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

/// `polestar_replica_lag_bytes` of `replica` (`None`: no such series, or not a number).
async fn lag_series(env: &Env, replica: std::net::SocketAddr) -> Option<f64> {
    let (_, _, metrics) = env.ps.get("/metrics").await.ok()?;
    let label = format!("replica=\"{replica}\"");
    let line = metrics
        .lines()
        .find(|l| l.starts_with("polestar_replica_lag_bytes{") && l.contains(&label))?;
    line.rsplit(' ').next()?.parse().ok().filter(|v: &f64| v.is_finite())
}

/// `lag_bytes` of each replica in `GET .../replicas` (`None` for `null`).
async fn listed_lags(env: &Env) -> anyhow::Result<HashMap<String, Option<u64>>> {
    let path = format!("/v1/masters/{}/replicas", env.master_name());
    let (status, body) = env.ps.get_json(&path).await?;
    anyhow::ensure!(status == 200, "{status} {body}");
    let listed = body.as_array().cloned().unwrap_or_default();
    let addr = |r: &Value| format!("{}:{}", r["ip"].as_str().unwrap_or_default(), r["port"]);
    Ok(listed.iter().map(|r| (addr(r), r["lag_bytes"].as_u64())).collect())
}

/// A replica's own `slave_repl_offset`.
async fn own_offset(replica: std::net::SocketAddr) -> anyhow::Result<u64> {
    let mut cmd = redis::cmd("INFO");
    cmd.arg("replication");
    let info: String = query(replica, &cmd).await?;
    let field = info.lines().find_map(|l| l.trim().strip_prefix("slave_repl_offset:"));
    let offset = field.and_then(|o| o.parse().ok());
    offset.ok_or_else(|| anyhow::anyhow!("{replica}: no slave_repl_offset in {info}"))
}

/// The primary stopped (SIGSTOP: it answers nothing, and with every replica at priority 0 no
/// failover replaces it): the lag of each replica stays known, from the replicas' own offsets
/// (behind the most advanced one), in `polestar_replica_lag_bytes` and in `/replicas`. One
/// replica is made to lag for real: it is stopped while 32 MiB are written, and the primary is
/// stopped before it could send it the rest.
#[tokio::test]
async fn lag_stays_known_from_the_replicas_own_offsets_while_the_primary_is_stopped() {
    let env = start().await;
    let primary = env.lab.primary().await.expect("the primary");
    let replicas: Vec<_> = env.lab.node_addrs().into_iter().filter(|n| *n != primary).collect();
    let index = |addr| env.lab.index_of(addr).expect("a lab node");
    set_priority(&env, "0").await;
    let env = &env;
    for r in replicas.iter().copied() {
        env.wait_until(FOLLOW, "the primary's lag of each replica", || async move {
            lag_series(env, r).await.ok_or_else(|| anyhow::anyhow!("no lag of {r}"))
        })
        .await;
    }
    // The second replica falls behind: stopped while the primary takes 32 MiB, and the primary
    // stopped before it could send the rest.
    let (ahead, behind) = (replicas[0], replicas[1]);
    env.lab.stop_node(index(behind)).expect("SIGSTOP a replica");
    let client = redis::Client::open(format!("redis://{primary}/")).expect("a client");
    // The default response deadline is too short for 32 MiB on a busy machine.
    let patient = redis::AsyncConnectionConfig::new().set_response_timeout(Some(FAILOVER));
    let conn = client.get_multiplexed_async_connection_with_config(&patient).await;
    let mut conn = conn.expect("connect");
    let mut pipe = redis::pipe();
    for i in 0..32 {
        pipe.cmd("SET").arg(format!("lag:{i}")).arg(vec![b'x'; 1 << 20]).ignore();
    }
    pipe.query_async::<()>(&mut conn).await.expect("32 MiB written");
    env.lab.stop_node(index(primary)).expect("SIGSTOP the primary");
    env.lab.cont_node(index(behind)).expect("SIGCONT the replica");
    // Once the replicas took in what reached them, their offsets stay put.
    let offsets = env
        .wait_until(FAILOVER, "the replicas' offsets settle", || async {
            let first = (own_offset(ahead).await?, own_offset(behind).await?);
            sleep(Duration::from_millis(500)).await;
            let again = (own_offset(ahead).await?, own_offset(behind).await?);
            anyhow::ensure!(first == again, "{first:?} then {again:?}");
            Ok(again)
        })
        .await;
    assert!(offsets.0 > offsets.1 + (1 << 20), "the stopped replica is not behind: {offsets:?}");
    let expected = HashMap::from([
        (ahead.to_string(), Some(0)),
        (behind.to_string(), Some(offsets.0 - offsets.1)),
    ]);
    let known = || async {
        let series = (lag_series(env, ahead).await, lag_series(env, behind).await);
        let listed = listed_lags(env).await?;
        let wanted = (Some(0.0), Some((offsets.0 - offsets.1) as f64));
        anyhow::ensure!(series == wanted && listed == expected, "{series:?} {listed:?}");
        Ok(())
    };
    env.wait_until(FOLLOW, "lags from the replicas' own offsets", known).await;
    // And they stay known, round after round, while the primary answers nothing.
    let end = Instant::now() + Duration::from_secs(3);
    while Instant::now() < end {
        if let Err(e) = known().await {
            env.fail(&format!("the lag did not stay known: {e:#}"));
        }
        sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "readiness: primary stopped: lags from the replicas' offsets {offsets:?}: {expected:?}"
    );
    env.lab.cont_node(index(primary)).expect("SIGCONT the primary");
}

/// The last command of each of the readiness poll's connections to the Sentinel at `addr`
/// (`CLIENT LIST`'s `cmd`): named `polestar-readiness` (the links' are `polestar-reconcile`
/// and, subscribed, unnamed).
async fn polestar_commands(addr: std::net::SocketAddr) -> Vec<String> {
    let list: String = query(addr, redis::cmd("CLIENT").arg("LIST")).await.unwrap_or_default();
    let field = |line: &str, key: &str| {
        line.split_whitespace().find_map(|f| f.strip_prefix(key)).unwrap_or("").to_string()
    };
    let ours = |line: &&str| field(line, "name=") == "polestar-readiness";
    list.lines().filter(ours).map(|line| field(line, "cmd=")).collect()
}

/// Regression (`links_started_before_they_were_given_heard`, docs/decisions.md D27): the Sentinel
/// links were started before the decider was given the place for their records, so the readiness
/// poll asked every Sentinel `SENTINEL MASTER` of every master every round instead of taking what
/// the links had read. Once the links have reconciled, a round asks `INFO`, then per master
/// `REPLICAS` (it has replicas) and `CKQUORUM`, never `MASTER`: the poll's last command on every
/// Sentinel is `CKQUORUM`, round after round (without the links' records it is `REPLICAS`, after
/// `CKQUORUM` and `MASTER`).
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
