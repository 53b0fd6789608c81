//! Socket sweeping across network namespaces (SPEC "Failover behaviour" step 5): a hung or dark
//! primary, a Lettuce-like client with one persistent connection and no timeouts, and how long
//! it takes that client to write to the new primary. Needs root (namespaces, CAP_NET_ADMIN).
//!
//! Each test prints `RECOVERY <case> ...` lines: fault -> first success on the new primary, and
//! the Sentinels' switch (as polestar published it) -> that success.

mod netns;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use netns::client::{self, Mode};
use netns::{Host, Net, until};
use nix::sys::signal::Signal;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

const DOWN_AFTER_MS: u64 = 1000;
const FAILOVER: Duration = Duration::from_secs(20);
const HTTP_PORT: u16 = 8053;

struct Cluster {
    net: Net,
    db: Vec<Host>,
    app: Host,
    ctl: Host,
}

impl Cluster {
    async fn start() -> anyhow::Result<Cluster> {
        let net = Net::new()?;
        let db =
            (1..=3).map(|i| net.host(&format!("d{i}"), 10 + i)).collect::<Result<Vec<_>, _>>()?;
        let app = net.host("ap", 20)?;
        let ctl = net.host("ct", 30)?;
        let cluster = Cluster { net, db, app, ctl };
        if let Err(e) = cluster.start_redis().await {
            anyhow::bail!("{e:#}\n{}", cluster.net.logs());
        }
        Ok(cluster)
    }

    fn primary(&self) -> SocketAddr {
        SocketAddr::new(self.db[0].ip, 6379)
    }

    async fn start_redis(&self) -> anyhow::Result<()> {
        for (i, host) in self.db.iter().enumerate() {
            let dir = self.net.dir.path().join(format!("redis-{i}"));
            std::fs::create_dir_all(&dir)?;
            let mut conf = format!(
                "bind {ip}\nprotected-mode no\nport 6379\ndaemonize no\ndir {d}\nsave \"\"\nappendonly no\n\
                 repl-diskless-sync yes\nrepl-diskless-sync-delay 0\nrepl-ping-replica-period 1\n",
                ip = host.ip,
                d = dir.display()
            );
            if i > 0 {
                conf.push_str(&format!("replicaof {} 6379\n", self.db[0].ip));
            }
            let path = dir.join("redis.conf");
            std::fs::write(&path, conf)?;
            self.net.spawn(
                host,
                &format!("redis-{i}"),
                "redis-server",
                &[path.to_str().unwrap_or("")],
            )?;
        }
        let primary = self.db[0].clone();
        until("replication", Duration::from_secs(30), || async {
            let info = self.cli(&primary, 6379, &["INFO", "replication"]);
            info.contains("connected_slaves:2").then_some(())
        })
        .await?;
        for (i, host) in self.db.iter().enumerate() {
            let dir = self.net.dir.path().join(format!("sentinel-{i}"));
            std::fs::create_dir_all(&dir)?;
            let conf = format!(
                "bind {ip}\nprotected-mode no\nport 26379\ndaemonize no\ndir {d}\n\
                 sentinel monitor mymaster {p} 6379 2\n\
                 sentinel down-after-milliseconds mymaster {DOWN_AFTER_MS}\n\
                 sentinel failover-timeout mymaster 5000\nsentinel parallel-syncs mymaster 1\n",
                ip = host.ip,
                d = dir.display(),
                p = self.db[0].ip
            );
            let path = dir.join("sentinel.conf");
            std::fs::write(&path, conf)?;
            self.net.spawn(
                host,
                &format!("sentinel-{i}"),
                "redis-sentinel",
                &[path.to_str().unwrap_or("")],
            )?;
        }
        for host in &self.db {
            until("sentinels to converge", Duration::from_secs(30), || async {
                let m = self.cli(host, 26379, &["SENTINEL", "MASTER", "mymaster"]);
                let fields: Vec<&str> = m.lines().collect();
                let get = |k: &str| {
                    fields.iter().position(|l| *l == k).and_then(|i| fields.get(i + 1)).copied()
                };
                (get("num-slaves") == Some("2") && get("num-other-sentinels") == Some("2"))
                    .then_some(())
            })
            .await?;
        }
        Ok(())
    }

    fn cli(&self, host: &Host, port: u16, args: &[&str]) -> String {
        let ip = host.ip.to_string();
        let port = port.to_string();
        let mut all = vec!["-h", ip.as_str(), "-p", port.as_str()];
        all.extend_from_slice(args);
        self.net.exec(host, "redis-cli", &all)
    }

    fn sentinels_yaml(&self) -> String {
        let list: Vec<String> = self.db.iter().map(|h| format!("\"{}:26379\"", h.ip)).collect();
        format!("sentinels:\n  addresses: [{}]\n", list.join(", "))
    }

    /// Starts polestar in `host`'s namespace with `source` YAML, HTTP on `listen`, and `extra`.
    async fn polestar(
        &self,
        host: &Host,
        label: &str,
        source: &str,
        listen: &str,
        extra: &str,
    ) -> anyhow::Result<()> {
        let yaml = format!("{source}http:\n  listen: \"{listen}\"\n{extra}");
        let path = self.net.dir.path().join(format!("{label}.yaml"));
        std::fs::write(&path, yaml)?;
        let path = path.to_str().unwrap_or("").to_string();
        self.net.spawn(host, label, netns::BIN, &["run", "-c", &path])?;
        let what = format!("{label} ready");
        let ready = until(&what, Duration::from_secs(30), || async {
            let log = self.net.log(label);
            if log.contains("Error:") {
                return Some(Err(anyhow::anyhow!("{label} failed:\n{log}")));
            }
            log.lines().any(|l| l.trim_end().ends_with("ready")).then_some(Ok(()))
        });
        ready.await?
    }

    /// `GET path` on a polestar inside `host`'s namespace.
    async fn get_json(&self, host: &Host, url: String) -> Option<Value> {
        netns::in_ns(host, move || async move {
            let http = reqwest::Client::builder().timeout(Duration::from_secs(1)).build()?;
            Ok(http.get(url).send().await?.json::<Value>().await?)
        })
        .await
        .ok()?
        .ok()
    }

    async fn events(&self, host: &Host, kind: &str) -> Vec<Value> {
        let url = format!("http://{}:{HTTP_PORT}/v1/events", host.ip);
        let all = self.get_json(host, url).await.unwrap_or(Value::Null);
        let list = all.as_array().cloned().unwrap_or_default();
        list.into_iter().filter(|e| e["kind"] == kind).collect()
    }

    /// When the polestar on `host` published a switch away from `old` (Unix ms).
    async fn switch_time(&self, host: &Host, url_host: &str) -> anyhow::Result<SystemTime> {
        let url = format!("http://{url_host}:{HTTP_PORT}/v1/events");
        let ms = until("a published switch", FAILOVER, || async {
            let all = self.get_json(host, url.clone()).await?;
            let events = all.as_array()?.clone();
            events
                .iter()
                .filter(|e| e["kind"] == "switch" && !e["from"].is_null())
                .find_map(|e| e["time_ms"].as_u64())
        })
        .await?;
        Ok(UNIX_EPOCH + Duration::from_millis(ms))
    }
}

fn secs(from: SystemTime, to: SystemTime) -> f64 {
    to.duration_since(from).map(|d| d.as_secs_f64()).unwrap_or_else(|e| -e.duration().as_secs_f64())
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
    let writer = client::start(&cluster.app, url.to_string(), Mode::Writer, stop.clone());
    let blocked = client::start(&cluster.app, url.to_string(), Mode::Blocked, stop.clone());
    let primary = cluster.primary();
    for log in [&writer, &blocked] {
        until("the clients on the first primary", Duration::from_secs(20), || async {
            log.last_ok().filter(|(_, a)| *a == primary).map(|_| ())
        })
        .await?;
    }
    Ok((writer, blocked))
}

fn ctl_url(cluster: &Cluster) -> String {
    format!("http://{}:{HTTP_PORT}/v1/masters/mymaster/primary", cluster.ctl.ip)
}

async fn with_logs<T>(cluster: &Cluster, result: anyhow::Result<T>) -> T {
    match result {
        Ok(v) => v,
        Err(e) => panic!("{e:#}\n{}", cluster.net.logs()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_primary_is_swept_by_the_node_side_polestar() {
    let _serial = netns::SERIAL.lock().await;
    let cluster = Cluster::start().await.unwrap_or_else(|e| panic!("{e:#}"));
    let result = hung_primary(&cluster, true).await;
    with_logs(&cluster, result).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_hung_primary_without_sweeper_leaves_the_client_stuck() {
    let _serial = netns::SERIAL.lock().await;
    let cluster = Cluster::start().await.unwrap_or_else(|e| panic!("{e:#}"));
    let result = hung_primary(&cluster, false).await;
    with_logs(&cluster, result).await;
}

async fn hung_primary(cluster: &Cluster, sweeper: bool) -> anyhow::Result<()> {
    let src = cluster.sentinels_yaml();
    cluster
        .polestar(
            &cluster.ctl,
            "ctl-polestar",
            &src,
            &format!("{}:{HTTP_PORT}", cluster.ctl.ip),
            "",
        )
        .await?;
    let db1 = &cluster.db[0];
    if sweeper {
        let sweep = "sweep:\n  local_ports: [6379]\n";
        cluster
            .polestar(db1, "node-polestar", &src, &format!("{}:{HTTP_PORT}", db1.ip), sweep)
            .await?;
    }
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let (writer, blocked) = clients_on(cluster, &ctl_url(cluster), &stop).await?;

    let fault = SystemTime::now();
    cluster.net.signal("redis-0", Signal::SIGSTOP)?;
    let switch = cluster.switch_time(&cluster.ctl, &cluster.ctl.ip.to_string()).await?;
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
    let sweeps = cluster.events(db1, "sweep").await;
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
    let _serial = netns::SERIAL.lock().await;
    let cluster = Cluster::start().await.unwrap_or_else(|e| panic!("{e:#}"));
    let result = dark_primary(&cluster, false).await;
    with_logs(&cluster, result).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_following_an_upstream_sweeps_and_survives_its_restart() {
    let _serial = netns::SERIAL.lock().await;
    let cluster = Cluster::start().await.unwrap_or_else(|e| panic!("{e:#}"));
    let result = dark_primary(&cluster, true).await;
    with_logs(&cluster, result).await;
}

/// The application host runs polestar with `sweep.remote` (following the Sentinels, or the
/// control host's polestar as upstream); its clients find the primary through it.
async fn dark_primary(cluster: &Cluster, agent: bool) -> anyhow::Result<()> {
    let src = cluster.sentinels_yaml();
    let sweep = "sweep:\n  remote: true\n";
    let app_listen = format!("127.0.0.1:{HTTP_PORT}");
    let upstream = format!("upstream: http://{}:{HTTP_PORT}\n", cluster.ctl.ip);
    if agent {
        cluster
            .polestar(
                &cluster.ctl,
                "ctl-polestar",
                &src,
                &format!("{}:{HTTP_PORT}", cluster.ctl.ip),
                "",
            )
            .await?;
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
    let switch = cluster.switch_time(&cluster.app, "127.0.0.1").await?;
    let case = if agent { "dark-agent-upstream" } else { "dark-client-side" };
    recovered(
        case,
        &[("writer", &writer), ("blocked", &blocked)],
        cluster.primary(),
        fault,
        switch,
    )
    .await?;
    let sweeps = cluster.events_at(&cluster.app, "127.0.0.1", "sweep").await;
    anyhow::ensure!(!sweeps.is_empty(), "no sweep event on the application host");
    if agent {
        upstream_restart(cluster, &src).await?;
    }
    Ok(())
}

/// The upstream goes away (the agent marks stale, keeps the primary) and comes back.
async fn upstream_restart(cluster: &Cluster, src: &str) -> anyhow::Result<()> {
    // `failover` is fine too: the old primary is dark, so the failover ends only at its timeout.
    let state = |stale: bool| async move {
        let url = format!("http://127.0.0.1:{HTTP_PORT}/v1/masters/mymaster");
        let m = cluster.get_json(&cluster.app, url).await?;
        let is_stale = m["state"] == "stale";
        (is_stale == stale).then(|| m["primary"]["ip"].as_str().unwrap_or("").to_string())
    };
    let before = until("agent ok", Duration::from_secs(10), || state(false)).await?;
    cluster.net.stop("ctl-polestar");
    let stale = until("agent stale", Duration::from_secs(10), || state(true)).await?;
    anyhow::ensure!(stale == before, "the agent lost its primary when the upstream went away");
    let started = SystemTime::now();
    cluster
        .polestar(
            &cluster.ctl,
            "ctl-polestar-2",
            src,
            &format!("{}:{HTTP_PORT}", cluster.ctl.ip),
            "",
        )
        .await?;
    let after = until("agent ok again", Duration::from_secs(20), || state(false)).await?;
    anyhow::ensure!(after == before, "the agent's primary moved across the restart");
    eprintln!(
        "RECOVERY agent-upstream-restart: agent ok again {:.3}s after the upstream was started",
        secs(started, SystemTime::now())
    );
    Ok(())
}

impl Cluster {
    async fn events_at(&self, host: &Host, url_host: &str, kind: &str) -> Vec<Value> {
        let url = format!("http://{url_host}:{HTTP_PORT}/v1/events");
        let all = self.get_json(host, url).await.unwrap_or(Value::Null);
        all.as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e["kind"] == kind)
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_swept_when_the_sentinels_are_unreachable() {
    let _serial = netns::SERIAL.lock().await;
    let cluster = Cluster::start().await.unwrap_or_else(|e| panic!("{e:#}"));
    let result = sentinels_unreachable(&cluster).await;
    with_logs(&cluster, result).await;
}

async fn sentinels_unreachable(cluster: &Cluster) -> anyhow::Result<()> {
    let src = cluster.sentinels_yaml();
    let db1 = &cluster.db[0];
    let sweep = "sweep:\n  local_ports: [6379]\n  remote: true\n";
    cluster.polestar(db1, "node-polestar", &src, &format!("{}:{HTTP_PORT}", db1.ip), sweep).await?;
    let url = format!("http://{}:{HTTP_PORT}/v1/masters/mymaster/primary", db1.ip);
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let (writer, _blocked) = clients_on(cluster, &url, &stop).await?;
    for i in 0..3 {
        cluster.net.signal(&format!("sentinel-{i}"), Signal::SIGSTOP)?;
    }
    let master_url = format!("http://{}:{HTTP_PORT}/v1/masters/mymaster", db1.ip);
    until("stale", Duration::from_secs(20), || async {
        let m = cluster.get_json(db1, master_url.clone()).await?;
        (m["state"] == "stale").then_some(())
    })
    .await?;
    let errors = writer.error_count();
    tokio::time::sleep(Duration::from_secs(3)).await;
    anyhow::ensure!(
        cluster.events(db1, "sweep").await.is_empty(),
        "swept while the Sentinels were unreachable"
    );
    anyhow::ensure!(writer.error_count() == errors, "the client lost its connection");
    let (at, node) = writer.last_ok().ok_or_else(|| anyhow::anyhow!("no success"))?;
    anyhow::ensure!(
        node == cluster.primary() && secs(at, SystemTime::now()) < 1.0,
        "the client stopped writing"
    );
    for i in 0..3 {
        cluster.net.signal(&format!("sentinel-{i}"), Signal::SIGCONT)?;
    }
    Ok(())
}
