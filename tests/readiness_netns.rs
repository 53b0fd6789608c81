//! Replication lag injected for real (docs/operating.md, "Will it fail over?"): in a namespace cluster, the
//! link toward one replica is shaped with `tbf` and a bounded writer fills the primary faster than
//! that link carries, until the replica lags past `readiness.max_lag`. The other replica has
//! `replica-priority 0`, so the lagging one is the only one a failover could promote: the verdict
//! then names `no_promotable_replica` with the lag, `polestar_replica_lag_bytes` shows it, `dig`
//! leaves the replica out of `replicas.<label>` (`dns.replica_max_lag`), and the load-balancer
//! check answers non-200 for it; all of it undone once the shaping is removed. Needs root. The
//! delays measured are printed (`readiness: ...`).
//!
//! Also the failover phases of a primary whose link goes dark, timed in
//! `polestar_failover_seconds` (`phases: ...`).

use crate::netns;
use crate::readiness::{FOLLOW, WITHIN};

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use netns::cluster::{Cluster, HTTP_PORT};
use netns::{Host, SERIAL, field, in_ns, until};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

/// More than readiness.max_lag and dns.replica_max_lag (1MB) by a wide margin, written fast:
/// 256 values of 64 KiB. At RATE the shaped replica needs about a minute to take it in.
const WRITES: usize = 256;
const VALUE: usize = 64 << 10;
const RATE: &str = "2mbit";
const MAX_LAG: u64 = 1 << 20;
const LIMIT: Duration = Duration::from_secs(60);

fn url(cluster: &Cluster, path: &str) -> String {
    format!("http://{}:{HTTP_PORT}{path}", cluster.ctl.ip)
}

/// `GET url` from `host`: the status and the body as text.
async fn get(host: &Host, url: String) -> anyhow::Result<(u16, String)> {
    in_ns(host, move || async move {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
        let response = http.get(url).send().await?;
        Ok((response.status().as_u16(), response.text().await?))
    })
    .await?
}

async fn verdict(cluster: &Cluster) -> anyhow::Result<Value> {
    let (status, body) = get(&cluster.ctl, url(cluster, "/v1/masters/mymaster/readiness")).await?;
    let v: Value = serde_json::from_str(&body)?;
    anyhow::ensure!((status == 200) == (v["ready"] == true), "{status} {v}");
    Ok(v)
}

/// The `no_promotable_replica` blocker's detail, if the verdict has it.
fn lag_blocker(v: &Value) -> Option<String> {
    let blockers = v["blockers"].as_array()?;
    let b = blockers.iter().find(|b| b["reason"] == "no_promotable_replica")?;
    Some(b["detail"].as_str().unwrap_or("").to_string())
}

/// `replica`'s lag as the primary reports it (`master_repl_offset` minus its acknowledged
/// offset), asked from the primary's host.
fn primary_says(cluster: &Cluster, replica: SocketAddr) -> Option<u64> {
    let info = cluster.cli(&cluster.db[0], 6379, &["INFO", "replication"]);
    let fields: Vec<(&str, &str)> = info.lines().filter_map(|l| l.trim().split_once(':')).collect();
    let offset: u64 = fields.iter().find(|(k, _)| *k == "master_repl_offset")?.1.parse().ok()?;
    let ip = format!("ip={},", replica.ip());
    let port = format!("port={},", replica.port());
    let ours =
        |(k, v): &&(&str, &str)| k.starts_with("slave") && v.contains(&ip) && v.contains(&port);
    let line = fields.iter().find(ours)?.1;
    let acked = line.split(',').find_map(|p| p.strip_prefix("offset="))?.parse::<u64>().ok()?;
    Some(offset.saturating_sub(acked))
}

/// `polestar_replica_lag_bytes` of `replica`.
async fn lag_series(cluster: &Cluster, replica: SocketAddr) -> Option<f64> {
    let (_, text) = get(&cluster.ctl, url(cluster, "/metrics")).await.ok()?;
    let label = format!("replica=\"{replica}\"");
    let line = text
        .lines()
        .find(|l| l.starts_with("polestar_replica_lag_bytes{") && l.contains(&label))?;
    line.rsplit(' ').next()?.parse().ok()
}

/// The A records of `replicas.cache.redis.test.`, asked with `dig` from the application host.
fn dig_replicas(cluster: &Cluster) -> Vec<String> {
    let server = format!("@{}", cluster.ctl.ip);
    let args = [&server, "+short", "+tries=1", "+time=2", "replicas.cache.redis.test.", "A"];
    let out = cluster.net.exec(&cluster.app, "dig", &args);
    out.lines().map(|l| l.trim().to_string()).filter(|l| !l.is_empty()).collect()
}

/// The load-balancer check of `replica` with `max_lag=1MB`: its status.
async fn check(cluster: &Cluster, replica: SocketAddr) -> anyhow::Result<u16> {
    let path = format!("/v1/masters/mymaster/replica?is={replica}&max_lag=1MB");
    Ok(get(&cluster.ctl, url(cluster, &path)).await?.0)
}

/// `GET /v1/masters/mymaster/replicas{query}`: each replica listed, with its `lag_bytes`.
async fn listed(cluster: &Cluster, query: &str) -> anyhow::Result<BTreeMap<String, Option<u64>>> {
    let path = format!("/v1/masters/mymaster/replicas{query}");
    let (status, body) = get(&cluster.ctl, url(cluster, &path)).await?;
    anyhow::ensure!(status == 200, "{path}: {status} {body}");
    let v: Value = serde_json::from_str(&body)?;
    let addr = |r: &Value| format!("{}:{}", r["ip"].as_str().unwrap_or_default(), r["port"]);
    Ok(v.as_array().into_iter().flatten().map(|r| (addr(r), r["lag_bytes"].as_u64())).collect())
}

/// Polls until `shown` (the primary reports it) and the verdict has the lag blocker (`set`) or
/// not; the delay from the first to the second (zero when polestar was first), failing past
/// [`WITHIN`]; also the last verdict.
async fn follow(
    cluster: &Cluster,
    what: &str,
    set: bool,
    shown: impl Fn() -> bool,
) -> anyhow::Result<(Duration, Value)> {
    let end = Instant::now() + LIMIT;
    let (mut shown_at, mut followed_at, mut last) = (None, None, Value::Null);
    loop {
        let now = Instant::now();
        if shown_at.is_none() && shown() {
            shown_at = Some(now);
        }
        if followed_at.is_none()
            && let Ok(v) = verdict(cluster).await
        {
            if lag_blocker(&v).is_some() == set {
                followed_at = Some(now);
            }
            last = v;
        }
        if let (Some(s), Some(f)) = (shown_at, followed_at) {
            let delay = f.saturating_duration_since(s);
            let verb = if set { "set" } else { "cleared" };
            eprintln!(
                "readiness: no_promotable_replica (lag) {verb} {:.2}s after {what}",
                delay.as_secs_f64()
            );
            anyhow::ensure!(delay <= WITHIN, "{verb} {delay:?} after {what}: {last}");
            return Ok((delay, last));
        }
        anyhow::ensure!(Instant::now() < end, "{what}: shown {shown_at:?}, set={set}: {last}");
        sleep(Duration::from_millis(50)).await;
    }
}

/// Every Sentinel lists `replica` with `slave-priority` `priority`.
fn sentinels_show_priority(cluster: &Cluster, replica: SocketAddr, priority: &str) -> bool {
    cluster.db.iter().all(|host| {
        let out = cluster.cli(host, 26379, &["SENTINEL", "REPLICAS", "mymaster"]);
        let lines: Vec<&str> = out.lines().collect();
        // Records one after another, each starting with `name`.
        let starts: Vec<usize> = (0..lines.len()).filter(|i| lines[*i] == "name").collect();
        starts.iter().enumerate().any(|(n, &start)| {
            let end = starts.get(n + 1).copied().unwrap_or(lines.len());
            let record = lines[start..end].join("\n");
            field(&record, "name") == Some(&replica.to_string())
                && field(&record, "slave-priority") == Some(priority)
        })
    })
}

/// Writes [`WRITES`] values of [`VALUE`] bytes to the primary from the application host,
/// within [`LIMIT`].
fn writer(cluster: &Cluster) -> tokio::task::JoinHandle<anyhow::Result<usize>> {
    let primary = cluster.primary();
    in_ns(&cluster.app, move || async move {
        let client = redis::Client::open(format!("redis://{primary}/"))?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        let value = vec![b'x'; VALUE];
        let end = Instant::now() + LIMIT;
        let mut written = 0;
        while written < WRITES && Instant::now() < end {
            let mut set = redis::cmd("SET");
            set.arg(format!("lag:{written}")).arg(&value);
            set.query_async::<()>(&mut conn).await?;
            written += 1;
        }
        Ok(written)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_lagging_behind_a_shaped_link_blocks_and_leaves_the_replica_answers() {
    let _serial = SERIAL.lock().await;
    // Sentinel's down-after is generous: the shaped link delays its PINGs too.
    let cluster = Cluster::start(5000).await.unwrap();
    let result = lagging(&cluster).await;
    cluster.net.with_logs(result).unwrap();
}

async fn lagging(cluster: &Cluster) -> anyhow::Result<()> {
    let (other, lagging) = (cluster.db[1].clone(), cluster.db[2].clone());
    let (other_addr, lagging_addr) =
        (SocketAddr::new(other.ip, 6379), SocketAddr::new(lagging.ip, 6379));
    let set = cluster.cli(&other, 6379, &["CONFIG", "SET", "replica-priority", "0"]);
    anyhow::ensure!(set.trim() == "OK", "CONFIG SET: {set}");
    let extra = format!(
        "masters:\n  - name: mymaster\n    dns_name: cache\n\
         dns:\n  listen: [\"{}:53\"]\n  zone: redis.test.\n  ttl: 1s\n  replica_max_lag: 1MB\n\
         readiness:\n  max_lag: 1MB\n",
        cluster.ctl.ip
    );
    let listen = format!("{}:{HTTP_PORT}", cluster.ctl.ip);
    cluster.polestar(&cluster.ctl, "central", &cluster.sentinels_yaml(), &listen, &extra).await?;

    // One replica with priority 0 leaves the other to promote: no blocker.
    until("every Sentinel to show priority 0", Duration::from_secs(40), || async {
        sentinels_show_priority(cluster, other_addr, "0").then_some(())
    })
    .await?;
    let v = until("ready with one promotable replica", FOLLOW, || async {
        verdict(cluster).await.ok().filter(|v| v["ready"] == true)
    })
    .await?;
    anyhow::ensure!(lag_blocker(&v).is_none(), "{v}");
    let both = until("both replicas in replicas.cache", FOLLOW, || async {
        let a = dig_replicas(cluster);
        (a.contains(&other.ip.to_string()) && a.contains(&lagging.ip.to_string())).then_some(a)
    })
    .await?;
    anyhow::ensure!(both.len() == 2, "{both:?}");

    // The lag.
    cluster.net.shape(&lagging, RATE)?;
    let writes = writer(cluster);
    let lags = || primary_says(cluster, lagging_addr).is_some_and(|lag| lag > MAX_LAG);
    let (_, v) =
        follow(cluster, "the primary showed the replica lagging past 1MB", true, lags).await?;
    anyhow::ensure!(v["ready"] == false && lag_blocker(&v).is_some(), "{v}");
    // The blocker's first detail may still see the other replica at its old priority (the
    // links' records are up to a reconciliation old, and this can come within a second of the
    // Sentinels showing priority 0), or lagging too (the primary counts the offset a replica
    // acknowledged, once a second, and the writer is fast): the detail settles on both reasons.
    let named = |v: &Value| {
        lag_blocker(v).is_some_and(|d| {
            d.contains(&format!("{lagging_addr} lags"))
                && d.contains("readiness.max_lag is 1MB")
                && d.contains(&format!("{other_addr} has replica-priority 0"))
        })
    };
    until("the blocker naming the lag and the other's priority 0", FOLLOW, || async {
        verdict(cluster).await.ok().filter(named)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e:#}; first {v}"))?;
    let series = until("polestar_replica_lag_bytes past 1MB", FOLLOW, || async {
        lag_series(cluster, lagging_addr).await.filter(|l| *l > MAX_LAG as f64)
    })
    .await?;
    let left_out = until("the lagging replica left out of replicas.cache", FOLLOW, || async {
        let a = dig_replicas(cluster);
        (a == [other.ip.to_string()]).then_some(a)
    })
    .await?;
    let lb = (check(cluster, lagging_addr).await?, check(cluster, other_addr).await?);
    anyhow::ensure!(lb.0 != 200 && lb.1 == 200, "replica checks (lagging, other): {lb:?}");
    // `/replicas?max_lag=1MB` leaves the lagging replica out; without `max_lag` it is listed,
    // with its lag.
    let under = listed(cluster, "?max_lag=1MB").await?;
    let keys: Vec<&String> = under.keys().collect();
    anyhow::ensure!(keys == [&other_addr.to_string()], "replicas?max_lag=1MB: {under:?}");
    let all = listed(cluster, "").await?;
    let lag = all.get(&lagging_addr.to_string()).copied().flatten();
    anyhow::ensure!(all.len() == 2 && lag.is_some_and(|l| l > MAX_LAG), "replicas: {all:?}");
    // All of that seen while the replica still lagged.
    let still = primary_says(cluster, lagging_addr);
    anyhow::ensure!(still.is_some_and(|l| l > MAX_LAG), "no lag any more: {still:?}");
    let written = writes.await??;
    anyhow::ensure!(written == WRITES, "{written} writes");
    eprintln!(
        "readiness: lagging: series {series} bytes, replicas.cache {left_out:?}, checks {lb:?}, replicas?max_lag=1MB {under:?}, primary says {still:?}"
    );

    // The cure.
    cluster.net.unshape(&lagging)?;
    let caught_up = || primary_says(cluster, lagging_addr).is_some_and(|lag| lag <= MAX_LAG);
    let (_, v) =
        follow(cluster, "the primary showed the replica caught up", false, caught_up).await?;
    let v = if v["ready"] == true {
        v
    } else {
        until("ready again", FOLLOW, || async {
            verdict(cluster).await.ok().filter(|v| v["ready"] == true)
        })
        .await?
    };
    let back = until("the replica back in replicas.cache", FOLLOW, || async {
        let a = dig_replicas(cluster);
        (a.len() == 2 && a.contains(&lagging.ip.to_string())).then_some(a)
    })
    .await?;
    let ok = until("the replica check 200 again", FOLLOW, || async {
        check(cluster, lagging_addr).await.ok().filter(|s| *s == 200)
    })
    .await?;
    let series = until("polestar_replica_lag_bytes under 1MB", FOLLOW, || async {
        lag_series(cluster, lagging_addr).await.filter(|l| *l <= MAX_LAG as f64)
    })
    .await?;
    let under = until("both replicas in replicas?max_lag=1MB", FOLLOW, || async {
        listed(cluster, "?max_lag=1MB").await.ok().filter(|l| l.len() == 2)
    })
    .await?;
    eprintln!(
        "readiness: cured: {v}, series {series}, replicas.cache {back:?}, check {ok}, replicas?max_lag=1MB {under:?}"
    );
    Ok(())
}

/// Connections from the application host to `node` that name themselves `held` and wait;
/// each ends `true` when the node closes it, `false` after [`LIMIT`].
fn held(cluster: &Cluster, node: SocketAddr, n: usize) -> Vec<JoinHandle<anyhow::Result<bool>>> {
    (0..n)
        .map(|_| {
            in_ns(&cluster.app, move || async move {
                let mut stream = TcpStream::connect(node).await?;
                stream.write_all(b"CLIENT SETNAME held\r\n").await?;
                let mut buf = [0u8; 64];
                anyhow::ensure!(stream.read(&mut buf).await? > 0, "SETNAME unanswered");
                let closed = tokio::time::timeout(LIMIT, async {
                    loop {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                    }
                });
                Ok(closed.await.is_ok())
            })
        })
        .collect()
}

/// `polestar_failover_seconds` of the central polestar: per phase, its sum and count.
async fn phases(cluster: &Cluster) -> anyhow::Result<BTreeMap<String, (f64, u64)>> {
    let (status, text) = get(&cluster.ctl, url(cluster, "/metrics")).await?;
    anyhow::ensure!(status == 200, "/metrics: {status}");
    Ok(crate::observability::phases_in(&text))
}

/// A primary whose link goes dark (no RST, no FIN) is failed over; once it is back, its
/// clients are cut and the failover shows in every phase of `polestar_failover_seconds`, once
/// (`flip_to_drained` from the flip to the cut, the host's dark time included).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dark_primary_s_failover_is_timed_in_every_phase_once() {
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::start(1000).await.unwrap();
    let result = dark(&cluster).await;
    cluster.net.with_logs(result).unwrap();
}

async fn dark(cluster: &Cluster) -> anyhow::Result<()> {
    let listen = format!("{}:{HTTP_PORT}", cluster.ctl.ip);
    // Slow drain retries: the Sentinels see the node back (a returning-node drain order)
    // before the flip's drain reaches it, which once lost the flip's timing.
    let drain = "drain:\n  enabled: true\n  interval: 5s\n  grace: 10s\n";
    cluster.polestar(&cluster.ctl, "central", &cluster.sentinels_yaml(), &listen, drain).await?;
    let old = cluster.primary();
    let clients = held(cluster, old, 5);
    until("the held clients on the primary", LIMIT, || async {
        let list = cluster.cli(&cluster.db[0], 6379, &["CLIENT", "LIST"]);
        let n = list.lines().filter(|l| l.contains(" name=held ")).count();
        (n >= 5).then_some(())
    })
    .await?;
    let before = phases(cluster).await?;
    let started = Instant::now();
    cluster.net.go_dark(&cluster.db[0])?;
    let published = until("a new primary published", LIMIT, || async {
        let (_, text) = get(&cluster.ctl, cluster.central_url()).await.ok()?;
        text.trim().parse::<SocketAddr>().ok().filter(|p| *p != old)
    })
    .await?;
    let flipped = started.elapsed().as_secs_f64();
    // Dark for a while after the flip: the drain's attempts fail meanwhile.
    sleep(Duration::from_secs(2)).await;
    let lit = started.elapsed().as_secs_f64();
    cluster.net.go_light(&cluster.db[0])?;
    let counted = |now: &BTreeMap<String, (f64, u64)>| {
        let mut took = [0.0; 3];
        for (i, phase) in crate::observability::PHASES.iter().enumerate() {
            let (sum0, count0) = before.get(*phase).copied().unwrap_or_default();
            let (sum, count) = now.get(*phase).copied().unwrap_or_default();
            anyhow::ensure!(count == count0 + 1, "{phase}: {count0} -> {count}");
            took[i] = sum - sum0;
        }
        Ok(took)
    };
    let took = until("every phase counted", LIMIT, || async {
        counted(&phases(cluster).await.ok()?).ok()
    })
    .await;
    let took = took.map_err(|e| anyhow::anyhow!("{e:#}; before {before:?}"))?;
    for client in clients {
        anyhow::ensure!(client.await??, "a client of the dark primary was left open");
    }
    sleep(Duration::from_secs(1)).await;
    let again = counted(&phases(cluster).await?);
    anyhow::ensure!(again.is_ok(), "counted more than once: {again:?}");
    eprintln!(
        "phases: dark primary: odown_to_flip {:.3}s, selected_to_flip {:.3}s, flip_to_drained {:.3}s (dark to published {published} {flipped:.3}s, lit at {lit:.3}s)",
        took[0], took[1], took[2]
    );
    anyhow::ensure!(took[0] > 0.0 && took[0] < flipped, "odown_to_flip {took:?}");
    anyhow::ensure!(took[1] > 0.0 && took[1] <= took[0] + 1e-3, "selected_to_flip {took:?}");
    anyhow::ensure!(took[2] >= lit - flipped - 0.25, "flip_to_drained {took:?}");
    Ok(())
}
