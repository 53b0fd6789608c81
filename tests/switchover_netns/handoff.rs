//! The handoff's refusals and bad input against real Redis servers and Sentinels in
//! namespaces, each with a JSON error that names the problem and nothing fenced: a write to the
//! primary is acknowledged at once after every one. Also what a handoff does to every replica
//! answer (HTTP, DNS `replicas.<label>`, the Sentinel endpoint), its events, a switchover while
//! a replica is handed off (refused: Sentinel could promote a node about to stop), and the
//! `polestar handoff` and `polestar failover --max-lag` commands against the running daemon.

use std::net::SocketAddr;
use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use polestar_lab::Kind;
use polestar_lab::conf::{self, Listen};
use serde_json::Value;

use super::{RATE, TOKEN, events_of, lag, listed_healthy, writer};
use crate::netns::cluster::{Cluster, HTTP_PORT};
use crate::netns::{BIN, Host, SERIAL, in_ns, until};

/// The second master's node: a primary without replicas on the control host.
const OTHER_PORT: u16 = 6390;
/// polestar's Sentinel endpoint on the control host.
const SENTINEL_API_PORT: u16 = 26380;
const DNS_PORT: &str = "5353";

/// `POST url` from `host` with `token` as the bearer token (none: no header): the status and
/// the JSON body.
async fn post_as(
    host: &Host,
    url: String,
    token: Option<&'static str>,
) -> anyhow::Result<(u16, Value)> {
    in_ns(host, move || async move {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(90)).build()?;
        let mut request = http.post(url);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        Ok((status, response.json::<Value>().await.unwrap_or(Value::Null)))
    })
    .await?
}

/// How long a write to `addr` took to be acknowledged; an error if it was not within 750 ms
/// (a node fenced by us holds it for up to a pause, 1 s).
async fn write_now(cluster: &Cluster, addr: SocketAddr) -> anyhow::Result<Duration> {
    let took = in_ns(&cluster.app, move || async move {
        let client = redis::Client::open(format!("redis://{addr}/"))?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_response_timeout(Some(Duration::from_millis(750)));
        let mut conn = client.get_multiplexed_async_connection_with_config(&config).await?;
        let started = tokio::time::Instant::now();
        redis::cmd("SET").arg("handoff-probe").arg(1).query_async::<()>(&mut conn).await?;
        Ok(started.elapsed())
    });
    took.await?.map_err(|e| e.context(format!("a write to {addr} was not acknowledged at once")))
}

/// The lab with a second master and a central polestar that serves HTTP (admin token), DNS and
/// the Sentinel endpoint.
struct Lab<'a> {
    cluster: &'a Cluster,
    other: SocketAddr,
    token_file: String,
}

impl Lab<'_> {
    fn url(&self, path: &str) -> String {
        format!("http://{}:{HTTP_PORT}{path}", self.cluster.ctl.ip)
    }

    fn handoff_url(&self, node: &str, query: &str) -> String {
        self.url(&format!("/v1/nodes/{node}/handoff?{query}"))
    }

    /// A refusal: `status`, an error that says each of `names`, and nothing fenced on either
    /// master's primary.
    async fn refused(
        &self,
        what: &str,
        url: String,
        token: Option<&'static str>,
        status: u16,
        names: &[&str],
    ) -> anyhow::Result<()> {
        let (got, body) = post_as(&self.cluster.ctl, url, token).await?;
        let error = body["error"].as_str().unwrap_or("");
        anyhow::ensure!(got == status, "{what}: {got} {body}, not {status}");
        for name in names {
            anyhow::ensure!(error.contains(name), "{what}: {error:?} does not name {name:?}");
        }
        let primary =
            super::primary(self.cluster).await.ok_or_else(|| anyhow::anyhow!("no primary"))?;
        write_now(self.cluster, primary).await.map_err(|e| e.context(what.to_string()))?;
        write_now(self.cluster, self.other).await.map_err(|e| e.context(what.to_string()))?;
        eprintln!("{what}: {got} {error}");
        Ok(())
    }

    /// `polestar ARGS --api URL --token-file FILE` run in the control host's namespace.
    fn cli(&self, args: &[&str]) -> Output {
        let api = self.url("");
        let mut all: Vec<&str> = vec!["netns", "exec", &self.cluster.ctl.ns, BIN];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--api", &api, "--token-file", &self.token_file]);
        std::process::Command::new("ip").args(&all).env("NO_COLOR", "1").output().expect("ip runs")
    }

    /// The addresses `replicas.mymaster.redis.test.` answers, over DNS.
    fn dns_replicas(&self) -> Vec<String> {
        let server = format!("@{}", self.cluster.ctl.ip);
        let args = ["+short", &server, "-p", DNS_PORT, "replicas.mymaster.redis.test.", "A"];
        let out = self.cluster.net.exec(&self.cluster.ctl, "dig", &args);
        out.lines().map(|l| l.trim().to_string()).filter(|l| !l.is_empty()).collect()
    }

    /// The flags of each replica the Sentinel endpoint lists, by IP.
    fn endpoint_flags(&self) -> Vec<(String, String)> {
        let args = ["SENTINEL", "REPLICAS", "mymaster"];
        let out = self.cluster.cli(&self.cluster.ctl, SENTINEL_API_PORT, &args);
        let lines: Vec<&str> = out.lines().collect();
        let mut ip = String::new();
        let mut flags = Vec::new();
        for pair in lines.windows(2) {
            match pair[0] {
                "ip" => ip = pair[1].to_string(),
                "flags" => flags.push((ip.clone(), pair[1].to_string())),
                _ => {}
            }
        }
        flags
    }

    /// The central polestar's events of `kind` naming `node`.
    async fn events(&self, kind: &str, node: SocketAddr) -> Vec<Value> {
        let events = events_of(self.cluster, &self.cluster.ctl, 0).await;
        let names = |e: &Value| e["node"].as_str() == Some(&node.to_string());
        events.into_iter().filter(|e| e["kind"] == kind && names(e)).collect()
    }

    /// Restarts the data node of `db[i]` as a replica of the published primary, and waits
    /// until polestar lists it healthy again (which also ends its handoff, if any).
    async fn restart(&self, i: usize) -> anyhow::Result<()> {
        let node = SocketAddr::new(self.cluster.db[i].ip, 6379);
        self.cluster.net.stop(&format!("redis-{i}"));
        let primary =
            super::primary(self.cluster).await.ok_or_else(|| anyhow::anyhow!("no primary"))?;
        self.cluster.start_redis_of(i, Some(primary.ip()))?;
        until(&format!("{node} healthy again"), Duration::from_secs(60), || async {
            listed_healthy(self.cluster, node).await.then_some(())
        })
        .await
    }
}

/// Regression (docs/failover.md, "Handoff"): every refusal of a handoff, against real servers and
/// Sentinels, answers a 4xx whose JSON error names the problem, and fences nothing (a write to
/// either master's primary is acknowledged within 750 ms right after each): no token (401),
/// a wrong one (401), a polestar without an admin token (403), an unknown node (404), a node
/// that is no `ip:port` (400), `max_lag` or `wait` that are no size or duration (400), a node
/// of another master than `?master=` names (409), a master that does not exist (404), the
/// primary of a master without a replica (409), a second replica while one is handed off
/// (409: one at a time), the last healthy replica (409), and any handoff or switchover while
/// a failover runs (409). A handed-off replica leaves `replicas.<label>` and the Sentinel
/// endpoint's list (flagged `s_down`) and is `healthy: false` over HTTP; a handoff and its end
/// are events. While a replica is handed off and not stopped yet, a primary's handoff and a
/// plain switchover are refused (409 naming it), since Sentinel could promote it. The CLI:
/// `polestar handoff` (with `--master`) hands a replica off and refuses a node of another
/// master; `polestar failover --max-lag` refuses up front with the lag, fencing nothing, and a
/// `--max-lag` that is no size is a usage error (exit 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoff_refusals_name_the_problem_and_fence_nothing() {
    let _serial = SERIAL.lock().await;
    // down-after 5 s: a stopped replica is down for Sentinel soon.
    let cluster = Cluster::start(5_000).await.unwrap();
    let result = refusals(&cluster).await;
    super::keep(&cluster);
    cluster.net.with_logs(result).unwrap();
}

async fn refusals(cluster: &Cluster) -> anyhow::Result<()> {
    let lab = setup(cluster).await?;
    let [d1, d2, d3] = [0, 1, 2].map(|i| SocketAddr::new(cluster.db[i].ip, 6379));
    let token = Some(TOKEN);

    // Who may ask, and what is no request at all.
    let url = lab.handoff_url(&d2.to_string(), "");
    lab.refused("no token", url.clone(), None, 401, &["bearer token"]).await?;
    lab.refused("a wrong token", url.clone(), Some("nope"), 401, &["wrong bearer token"]).await?;
    let peer = format!("http://{}:{HTTP_PORT}/v1/nodes/{d2}/handoff", cluster.app.ip);
    lab.refused("no admin token configured", peer, token, 403, &["admin_token_file"]).await?;
    let url = lab.handoff_url("10.77.0.99:6379", "");
    lab.refused("an unknown node", url, token, 404, &["10.77.0.99:6379"]).await?;
    let url = lab.handoff_url("db-one", "");
    lab.refused("no ip:port", url, token, 400, &["db-one", "ip:port"]).await?;
    let url = lab.handoff_url(&d1.to_string(), "max_lag=lots");
    lab.refused("max_lag no size", url, token, 400, &["max_lag", "lots"]).await?;
    let url = lab.handoff_url(&d2.to_string(), "wait=soon");
    lab.refused("wait no duration", url, token, 400, &["wait", "soon"]).await?;

    // Nodes of the wrong master, and a master without a replica.
    let other = lab.other.to_string();
    let url = lab.handoff_url(&other, "master=mymaster");
    lab.refused("a node of another master", url, token, 409, &[&other, "other", "mymaster"])
        .await?;
    let url = lab.handoff_url(&d2.to_string(), "master=nosuch");
    lab.refused("no such master", url, token, 404, &["nosuch"]).await?;
    let url = lab.handoff_url(&other, "wait=5s");
    lab.refused(
        "the primary of a master without a replica",
        url,
        token,
        409,
        &["other", "no replica"],
    )
    .await?;

    // A replica out of every answer, one at a time, and no switchover meanwhile.
    let url = lab.handoff_url(&d2.to_string(), "master=mymaster");
    let (status, body) = post_as(&cluster.ctl, url, token).await?;
    anyhow::ensure!(status == 200 && body["role"] == "replica", "handoff of {d2}: {status} {body}");
    anyhow::ensure!(!listed_healthy(cluster, d2).await, "{d2} still listed healthy over HTTP");
    let answers = lab.dns_replicas();
    anyhow::ensure!(
        !answers.contains(&d2.ip().to_string()) && answers.contains(&d3.ip().to_string()),
        "replicas.mymaster over DNS: {answers:?}"
    );
    let flags = lab.endpoint_flags();
    let flagged = |ip: std::net::IpAddr| {
        flags.iter().any(|(i, f)| *i == ip.to_string() && f.split(',').any(|f| f == "s_down"))
    };
    anyhow::ensure!(flagged(d2.ip()) && !flagged(d3.ip()), "Sentinel endpoint: {flags:?}");
    anyhow::ensure!(!lab.events("handoff", d2).await.is_empty(), "no handoff event for {d2}");
    // Refusals once a short wait is over: naming the blocker and the wait. Meanwhile a
    // second request for the same node is refused at once.
    let d2s = d2.to_string();
    let url = lab.handoff_url(&d3.to_string(), "wait=3s");
    let first = {
        let (ctl, url) = (cluster.ctl.clone(), url.clone());
        tokio::spawn(async move { post_as(&ctl, url, token).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    lab.refused("the same node twice at once", url, token, 409, &[&d3.to_string(), "already"])
        .await?;
    let (status, body) = first.await??;
    let error = body["error"].as_str().unwrap_or("");
    anyhow::ensure!(
        status == 409 && error.contains(&d2s) && error.contains("one node at a time"),
        "a second replica: {status} {body}"
    );
    anyhow::ensure!(error.contains("after waiting 3s"), "the wait is not named: {error}");
    let url = lab.handoff_url(&d1.to_string(), "wait=1s");
    lab.refused("the primary while a replica is out", url, token, 409, &[&d2s, "handed off"])
        .await?;
    let refusals = events_of(cluster, &cluster.ctl, 0).await;
    let cost = refusals
        .iter()
        .rev()
        .find(|e| e["kind"] == "handoff_refused" && e["node"] == d1.to_string());
    anyhow::ensure!(
        cost.is_some_and(|e| e["cost"].as_str().is_some_and(|c| c.contains("down-after"))),
        "no handoff_refused event with the cost of stopping {d1}: {cost:?}"
    );
    let url = lab.url("/v1/masters/mymaster/failover?wait=5s");
    lab.refused("a switchover while a replica is out", url, token, 409, &[&d2s, "handed off"])
        .await?;
    // A handoff that waits: asked while d2 is out, done once d2 is back from its restart.
    let waiting = {
        let (ctl, url) = (cluster.ctl.clone(), lab.handoff_url(&d3.to_string(), "wait=90s"));
        tokio::spawn(async move { post_as(&ctl, url, token).await })
    };
    lab.restart(1).await?;
    let (status, body) = waiting.await??;
    let waited = body["waited"]["for"].to_string();
    anyhow::ensure!(
        status == 200 && body["role"] == "replica" && waited.contains(&d2s),
        "the handoff that waited for {d2}: {status} {body}"
    );
    until(&format!("the end of {d2}'s handoff"), Duration::from_secs(10), || async {
        let ended = lab.events("handoff_ended", d2).await;
        ended.iter().any(|e| e["restarted"] == true).then_some(())
    })
    .await?;
    lab.restart(2).await?;

    // The last healthy replica.
    cluster.net.stop("redis-1");
    until(&format!("{d2} down for the Sentinels"), Duration::from_secs(30), || async {
        (!listed_healthy(cluster, d2).await).then_some(())
    })
    .await?;
    let url = lab.handoff_url(&d3.to_string(), "wait=1s");
    let d3s = d3.to_string();
    lab.refused("the last healthy replica", url, token, 409, &[&d3s, "last healthy replica"])
        .await?;
    // A primary's handoff too: promoted, d3 would have no replica while d1 restarts.
    let url = lab.handoff_url(&d1.to_string(), "wait=1s");
    lab.refused("the primary, one healthy replica", url, token, 409, &[&d3s, "last healthy"])
        .await?;
    lab.restart(1).await?;

    // The commands, against the running daemon.
    let d3s = d3.to_string();
    let out = lab.cli(&["handoff", &d3s, "--master", "other"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(
        out.status.code() == Some(1) && stderr.contains("not of other"),
        "polestar handoff --master other: {}",
        crate::common::shown(&out)
    );
    let out = lab.cli(&["handoff", &d3s, "--master", "mymaster", "--wait", "10s"]);
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    anyhow::ensure!(
        out.status.success() && answer["role"] == "replica" && answer["node"] == d3s,
        "polestar handoff: {}",
        crate::common::shown(&out)
    );
    lab.restart(2).await?;
    max_lag_cli(&lab).await?;

    // While a failover runs.
    let out = cluster.cli(&cluster.db[0], 26379, &["SENTINEL", "FAILOVER", "mymaster"]);
    anyhow::ensure!(out.trim() == "OK", "SENTINEL FAILOVER: {out}");
    until("the failover to show", Duration::from_secs(10), || async {
        let m = crate::netns::get_json(&cluster.ctl, lab.url("/v1/masters/mymaster")).await?;
        (m["state"] == "failover").then_some(())
    })
    .await?;
    let (status, body) = post_as(&cluster.ctl, lab.handoff_url(&d3s, "wait=1s"), token).await?;
    let error = body["error"].as_str().unwrap_or("");
    anyhow::ensure!(
        status == 409 && error.contains("failover"),
        "during a failover: {status} {body}"
    );
    until("the failover to end", Duration::from_secs(30), || async {
        let m = crate::netns::get_json(&cluster.ctl, lab.url("/v1/masters/mymaster")).await?;
        (m["state"] == "ok" && super::primary(cluster).await != Some(d1)).then_some(())
    })
    .await?;
    Ok(())
}

/// `polestar failover --max-lag`: a replica further behind than it refuses the switchover up
/// front (exit 1, the lag named), the writer's writes go on (nothing fenced); no size: exit 2.
async fn max_lag_cli(lab: &Lab<'_>) -> anyhow::Result<()> {
    let cluster = lab.cluster;
    let out = lab.cli(&["failover", "mymaster", "--max-lag", "lots"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(
        out.status.code() == Some(2) && stderr.contains("--max-lag"),
        "polestar failover --max-lag lots: {}",
        crate::common::shown(&out)
    );
    let old = super::primary(cluster).await.ok_or_else(|| anyhow::anyhow!("no primary"))?;
    for replica in &cluster.db[1..] {
        cluster.net.shape(replica, RATE)?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let limit = Duration::from_secs(60);
    let writing =
        writer(&cluster.app, "ids", cluster.central_url(), stop.clone(), acked.clone(), limit);
    let result = async {
        until("the lag to build up", Duration::from_secs(30), || async {
            (lag(cluster, old) >= 1_000_000).then_some(())
        })
        .await?;
        let out = lab.cli(&["failover", "mymaster", "--max-lag", "64KB"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        anyhow::ensure!(
            out.status.code() == Some(1)
                && stderr.contains("max_lag")
                && stderr.contains("bytes behind"),
            "polestar failover --max-lag 64KB: {}",
            crate::common::shown(&out)
        );
        let before = acked.load(Ordering::SeqCst);
        until("writes after the refusal", Duration::from_secs(2), || async {
            (acked.load(Ordering::SeqCst) > before + 100).then_some(())
        })
        .await?;
        anyhow::ensure!(
            super::primary(cluster).await == Some(old),
            "a refused switchover moved the primary"
        );
        Ok(())
    }
    .await;
    stop.store(true, Ordering::SeqCst);
    let _ = writing.await;
    for replica in &cluster.db[1..] {
        cluster.net.unshape(replica)?;
    }
    result?;
    until("the replicas to catch up", Duration::from_secs(60), || async {
        (lag(cluster, old) < 64 * 1024).then_some(())
    })
    .await
}

/// A second master (`other`, a primary without replicas on the control host) for the three
/// Sentinels, a central polestar with the admin token, DNS and the Sentinel endpoint, and a
/// peer polestar without an admin token.
async fn setup(cluster: &Cluster) -> anyhow::Result<Lab<'_>> {
    let ctl = &cluster.ctl;
    let dir = cluster.net.dir.path().join("other");
    let listen = Listen { ip: ctl.ip, port: OTHER_PORT, dir: dir.clone(), logfile: None };
    let path = conf::write(&dir, Kind::Server, &conf::data_node(&listen, None))?;
    cluster.net.spawn_server(ctl, "redis-other", &cluster.flavor, Kind::Server, &path)?;
    let other = SocketAddr::new(ctl.ip, OTHER_PORT);
    until("the other master's node", Duration::from_secs(20), || async {
        (cluster.cli(ctl, OTHER_PORT, &["PING"]).trim() == "PONG").then_some(())
    })
    .await?;
    let (ip, port) = (ctl.ip.to_string(), OTHER_PORT.to_string());
    for host in &cluster.db {
        let out = cluster.cli(host, 26379, &["SENTINEL", "MONITOR", "other", &ip, &port, "2"]);
        anyhow::ensure!(out.trim() == "OK", "SENTINEL MONITOR other on {}: {out}", host.ip);
    }
    let token = cluster.net.dir.path().join("admin.token");
    std::fs::write(&token, TOKEN)?;
    let listen = format!("{}:{HTTP_PORT}", ctl.ip);
    let extra = format!(
        "  admin_token_file: {}\ndns:\n  listen: [\"{ip}:{DNS_PORT}\"]\n  zone: redis.test.\n\
         sentinel_api:\n  listen: [\"{ip}:{SENTINEL_API_PORT}\"]\n",
        token.display()
    );
    cluster.polestar(ctl, "central", &cluster.sentinels_yaml(), &listen, &extra).await?;
    let peer = format!("{}:{HTTP_PORT}", cluster.app.ip);
    cluster.polestar(&cluster.app, "peer", &cluster.sentinels_yaml(), &peer, "").await?;
    let lab = Lab { cluster, other, token_file: token.display().to_string() };
    until("polestar to serve the other master", Duration::from_secs(30), || async {
        let m = crate::netns::get_json(ctl, lab.url("/v1/masters/other")).await?;
        (m["primary"]["port"] == OTHER_PORT).then_some(())
    })
    .await?;
    Ok(lab)
}

/// Regression (issue 35): a replica handed off and then promoted (a failover polestar did not
/// ask for: `SENTINEL FAILOVER`, the other replica at `replica-priority 0`) is the primary
/// now. Asking for its handoff again does not answer "already handed off, safe to stop" and
/// drain the published primary (as it did): it is handed off as the primary it is, with a
/// switchover away from it, waiting (`?wait=60s`) for the failover to settle first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_handed_off_and_promoted_since_is_handed_off_as_the_primary() {
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::start(5_000).await.unwrap();
    let result = promoted_since(&cluster).await;
    cluster.net.with_logs(result).unwrap();
}

async fn promoted_since(cluster: &Cluster) -> anyhow::Result<()> {
    super::start_shaped_at(cluster, "1000mbit").await?;
    let [d1, d2, d3] = [0, 1, 2].map(|i| SocketAddr::new(cluster.db[i].ip, 6379));
    let url = |node: SocketAddr, query: &str| {
        format!("http://{}:{HTTP_PORT}/v1/nodes/{node}/handoff?{query}", cluster.ctl.ip)
    };
    let (status, body) = post_as(&cluster.ctl, url(d2, "wait=5s"), Some(TOKEN)).await?;
    anyhow::ensure!(status == 200 && body["role"] == "replica", "handoff of {d2}: {status} {body}");
    let out = cluster.cli(&cluster.db[2], 6379, &["CONFIG", "SET", "replica-priority", "0"]);
    anyhow::ensure!(out.trim() == "OK", "CONFIG SET replica-priority: {out}");
    until("every Sentinel to see d3's priority 0", Duration::from_secs(30), || async {
        let all = cluster.db.iter().all(|h| {
            let out = cluster.cli(h, 26379, &["SENTINEL", "REPLICAS", "mymaster"]);
            let lines: Vec<&str> = out.lines().map(str::trim).collect();
            let at = lines.windows(2).position(|w| w == ["ip", &d3.ip().to_string()]);
            at.is_some_and(|at| {
                lines[at..]
                    .windows(2)
                    .find(|w| w[0] == "slave-priority")
                    .is_some_and(|w| w[1] == "0")
            })
        });
        all.then_some(())
    })
    .await?;
    let out = cluster.cli(&cluster.db[0], 26379, &["SENTINEL", "FAILOVER", "mymaster"]);
    anyhow::ensure!(out.trim() == "OK", "SENTINEL FAILOVER: {out}");
    until(&format!("{d2} published as the primary"), Duration::from_secs(30), || async {
        (super::primary(cluster).await == Some(d2)).then_some(())
    })
    .await?;
    let (status, body) = post_as(&cluster.ctl, url(d2, "wait=60s"), Some(TOKEN)).await?;
    anyhow::ensure!(
        status == 200 && body["role"] == "primary" && body["already"] == false,
        "handoff of {d2}, promoted since its handoff: {status} {body}"
    );
    let now = super::primary(cluster).await;
    anyhow::ensure!(now == Some(d1), "the primary after the handoff of {d2}: {now:?}");
    eprintln!("handoff of the promoted {d2}: {body}");
    Ok(())
}
