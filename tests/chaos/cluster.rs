//! The soak's deployment in network namespaces, with polestar on all sides:
//!
//! - `d1..d3` (10.77.0.11-13): redis-server on 6379 (d1 starts as the primary) and a node-side
//!   polestar with `sweep.local_ports: [6379]`;
//! - `s1..s3` (10.77.0.21-23): one Sentinel each, apart from the data nodes so that the primary
//!   can be partitioned from the Sentinels and not from its clients;
//! - `ct` (10.77.0.30): the central polestar, DNS on :53 and HTTP on :8053, with drain;
//! - `ap` (10.77.0.40): an agent polestar (`upstream:` the central one, `sweep.remote`) on
//!   127.0.0.1:8053, the clients and the monitor.
//!
//! Processes that a fault restarts get a new generation in their label (`redis-0.2`), so each
//! run keeps its own log.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::signal::Signal;
use polestar_lab::conf::{self, Listen, Monitor};
use polestar_lab::{Flavor, Kind};

use crate::netns::{self, Host, Net, field, get_json, run, until};

pub const MASTER: &str = "mymaster";
pub const DNS_NAME: &str = "cache.redis.test.";
pub const HTTP_PORT: u16 = 8053;
pub const REDIS_PORT: u16 = 6379;
pub const SENTINEL_PORT: u16 = 26379;
pub const QUORUM: usize = 2;
const DOWN_AFTER_MS: u64 = 1000;
const SETUP: Duration = Duration::from_secs(40);

pub struct Cluster {
    pub net: Net,
    pub db: Vec<Host>,
    pub sentinels: Vec<Host>,
    pub ctl: Host,
    pub app: Host,
    generations: Mutex<HashMap<String, u32>>,
    /// Redis or Valkey.
    flavor: Flavor,
}

impl Cluster {
    pub async fn start(flavor: &Flavor) -> anyhow::Result<Cluster> {
        let net = Net::new()?;
        let db = (1..=3).map(|i| net.host(&format!("d{i}"), 10 + i)).collect::<Result<_, _>>()?;
        let sentinels =
            (1..=3).map(|i| net.host(&format!("s{i}"), 20 + i)).collect::<Result<_, _>>()?;
        let ctl = net.host("ct", 30)?;
        let app = net.host("ap", 40)?;
        let cluster = Cluster {
            net,
            db,
            sentinels,
            ctl,
            app,
            generations: Mutex::new(HashMap::new()),
            flavor: flavor.clone(),
        };
        let setup = cluster.setup().await;
        cluster.net.with_logs(setup)?;
        Ok(cluster)
    }

    async fn setup(&self) -> anyhow::Result<()> {
        for i in 0..self.db.len() {
            self.write_redis_conf(i)?;
            self.start_redis(i)?;
        }
        let primary = self.db[0].clone();
        until("replication", SETUP, || async {
            let info = self.cli(&primary, self.node(0), &["INFO", "replication"]);
            info.contains("connected_slaves:2").then_some(())
        })
        .await?;
        for i in 0..self.sentinels.len() {
            self.write_sentinel_conf(i)?;
            self.start_sentinel(i)?;
        }
        for (i, host) in self.sentinels.iter().enumerate() {
            until("sentinels to converge", SETUP, || async {
                let m = self.cli(host, self.sentinel(i), &["SENTINEL", "MASTER", MASTER]);
                (field(&m, "num-slaves") == Some("2")
                    && field(&m, "num-other-sentinels") == Some("2"))
                .then_some(())
            })
            .await?;
        }
        for i in 0..self.db.len() {
            self.start_node_polestar(i).await?;
        }
        self.start_central().await?;
        self.start_agent().await
    }

    pub fn node(&self, i: usize) -> SocketAddr {
        SocketAddr::new(self.db[i].ip, REDIS_PORT)
    }

    pub fn sentinel(&self, i: usize) -> SocketAddr {
        SocketAddr::new(self.sentinels[i].ip, SENTINEL_PORT)
    }

    pub fn db_index(&self, node: SocketAddr) -> Option<usize> {
        self.db.iter().position(|h| h.ip == node.ip())
    }

    fn write_redis_conf(&self, i: usize) -> anyhow::Result<()> {
        let listen = self.listen(self.db[i].ip, REDIS_PORT, &format!("redis-{i}"));
        let primary = (i > 0).then(|| self.db[0].ip.to_string());
        let text = conf::data_node(&listen, primary.as_deref().map(|ip| (ip, REDIS_PORT)));
        conf::write(&listen.dir, Kind::Server, &text)?;
        Ok(())
    }

    /// Starts (or restarts, on the config Sentinel may have rewritten) redis-server `i`.
    pub fn start_redis(&self, i: usize) -> anyhow::Result<()> {
        let conf = self.net.dir.path().join(format!("redis-{i}/redis.conf"));
        let label = self.next_label(&format!("redis-{i}"));
        self.net.spawn_server(&self.db[i], &label, &self.flavor, Kind::Server, &conf)?;
        Ok(())
    }

    fn write_sentinel_conf(&self, i: usize) -> anyhow::Result<()> {
        let listen = self.listen(self.sentinels[i].ip, SENTINEL_PORT, &format!("sentinel-{i}"));
        let monitor = Monitor {
            name: MASTER.into(),
            host: self.db[0].ip.to_string(),
            port: REDIS_PORT,
            quorum: QUORUM,
            down_after: Duration::from_millis(DOWN_AFTER_MS),
            failover_timeout: Duration::from_millis(5000),
            parallel_syncs: 2,
        };
        conf::write(&listen.dir, Kind::Sentinel, &conf::sentinel(&listen, &monitor))?;
        Ok(())
    }

    /// Starts (or restarts, on its rewritten config) Sentinel `i`.
    pub fn start_sentinel(&self, i: usize) -> anyhow::Result<()> {
        let conf = self.net.dir.path().join(format!("sentinel-{i}/sentinel.conf"));
        let label = self.next_label(&format!("sentinel-{i}"));
        let host = &self.sentinels[i];
        self.net.spawn_server(host, &label, &self.flavor, Kind::Sentinel, &conf)?;
        Ok(())
    }

    /// Where a process on `ip` listens: `port`, its directory `name` in the network's; it logs
    /// to its output (`<label>.log`).
    fn listen(&self, ip: IpAddr, port: u16, name: &str) -> Listen {
        Listen { ip, port, dir: self.net.dir.path().join(name), logfile: None }
    }

    fn sentinels_yaml(&self) -> String {
        let list: Vec<String> =
            (0..self.sentinels.len()).map(|i| format!("\"{}\"", self.sentinel(i))).collect();
        format!(
            "sentinels:\n  addresses: [{}]\nmasters: [{{name: {MASTER}, dns_name: cache}}]\n",
            list.join(", ")
        )
    }

    async fn start_node_polestar(&self, i: usize) -> anyhow::Result<()> {
        let host = &self.db[i];
        let yaml = format!(
            "{}http:\n  listen: \"{}:{HTTP_PORT}\"\nsweep:\n  local_ports: [{REDIS_PORT}]\n",
            self.sentinels_yaml(),
            host.ip
        );
        self.polestar(host, &format!("node-polestar-{i}"), &yaml).await
    }

    /// Starts (or restarts) the central polestar: DNS, HTTP, drain.
    pub async fn start_central(&self) -> anyhow::Result<()> {
        let ip = self.ctl.ip;
        let yaml = format!(
            "{}http:\n  listen: \"{ip}:{HTTP_PORT}\"\n\
             dns:\n  listen: [\"{ip}:53\"]\n  zone: redis.test.\n  ttl: 1s\n\
             drain:\n  enabled: true\n",
            self.sentinels_yaml()
        );
        self.polestar(&self.ctl, "ctl-polestar", &yaml).await
    }

    async fn start_agent(&self) -> anyhow::Result<()> {
        let yaml = format!(
            "upstream: {{urls: [\"http://{}:{HTTP_PORT}\"], allow_plaintext: true}}\nhttp:\n  listen: \"127.0.0.1:{HTTP_PORT}\"\n\
             sweep:\n  remote: true\n",
            self.ctl.ip
        );
        self.polestar(&self.app, "app-polestar", &yaml).await
    }

    async fn polestar(&self, host: &Host, base: &str, yaml: &str) -> anyhow::Result<()> {
        let path = self.net.dir.path().join(format!("{base}.yaml"));
        std::fs::write(&path, yaml)?;
        let label = self.next_label(base);
        let path = path.to_str().unwrap_or("").to_string();
        self.net.spawn(host, &label, netns::BIN, &["run", "-c", &path])?;
        self.net.ready(&label, SETUP).await
    }

    fn next_label(&self, base: &str) -> String {
        let mut generations = self.generations.lock().unwrap_or_else(|p| p.into_inner());
        let g = generations.entry(base.to_string()).or_insert(0);
        *g += 1;
        format!("{base}.{g}")
    }

    /// The label of the running generation of `base`.
    pub fn label(&self, base: &str) -> String {
        let generations = self.generations.lock().unwrap_or_else(|p| p.into_inner());
        format!("{base}.{}", generations.get(base).copied().unwrap_or(0))
    }

    pub fn signal(&self, base: &str, signal: Signal) -> anyhow::Result<()> {
        self.net.signal(&self.label(base), signal)
    }

    /// SIGKILLs the running generation of `base` and reaps it.
    pub fn kill(&self, base: &str) {
        self.net.stop(&self.label(base));
    }

    /// `redis-cli` from inside `from`'s namespace, bounded to 2 s (a hung server answers
    /// nothing).
    pub fn cli(&self, from: &Host, to: SocketAddr, args: &[&str]) -> String {
        let (ip, port) = (to.ip().to_string(), to.port().to_string());
        let mut all = vec!["2", "redis-cli", "-h", ip.as_str(), "-p", port.as_str()];
        all.extend_from_slice(args);
        self.net.exec(from, "timeout", &all)
    }

    /// Brings a dark host's link back.
    pub fn go_light(&self, host: &Host) -> anyhow::Result<()> {
        run("ip", &["-n", &host.ns, "link", "set", "eth0", "up"])
    }

    /// Drops everything between `host` and the Sentinels, both ways, inside `host`'s
    /// namespace; clients and polestar still reach it.
    pub fn partition_from_sentinels(&self, host: &Host) -> anyhow::Result<()> {
        for s in &self.sentinels {
            let ip = s.ip.to_string();
            iptables(host, &["-I", "INPUT", "-s", &ip, "-j", "DROP"])?;
            iptables(host, &["-I", "OUTPUT", "-d", &ip, "-j", "DROP"])?;
        }
        Ok(())
    }

    pub fn heal(&self, host: &Host) -> anyhow::Result<()> {
        iptables(host, &["-F", "INPUT"])?;
        iptables(host, &["-F", "OUTPUT"])
    }

    /// `SENTINEL FAILOVER` on Sentinel `i`, retried while it refuses (a previous failover's
    /// replicas still resynchronising, or one still in progress).
    /// `SENTINEL FAILOVER` on Sentinel `i`, or the next one if `i` is in TILT mode (as
    /// polestar's own `POST .../failover` does: a Sentinel in TILT, for 30 s after it was
    /// stopped, answers `OK` and does nothing until TILT ends).
    pub async fn failover(&self, i: usize) -> anyhow::Result<()> {
        until("SENTINEL FAILOVER accepted", Duration::from_secs(30), || async {
            let n = self.sentinels.len();
            let ready = (i..i + n).map(|j| j % n).find(|&j| {
                let info = self.cli(&self.sentinels[j], self.sentinel(j), &["INFO", "sentinel"]);
                info.lines().any(|l| l.trim() == "sentinel_tilt:0")
            })?;
            let out = self.cli(
                &self.sentinels[ready],
                self.sentinel(ready),
                &["SENTINEL", "FAILOVER", MASTER],
            );
            (out.trim() == "OK").then_some(())
        })
        .await
    }

    /// Which node the majority of the Sentinels name (asked from the application host).
    pub fn sentinels_primary(&self) -> Option<SocketAddr> {
        let answers: Vec<SocketAddr> = (0..self.sentinels.len())
            .filter_map(|i| {
                let out = self.cli(
                    &self.app,
                    self.sentinel(i),
                    &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER],
                );
                let mut lines = out.lines();
                let ip: IpAddr = lines.next()?.parse().ok()?;
                Some(SocketAddr::new(ip, lines.next()?.parse().ok()?))
            })
            .collect();
        answers.iter().copied().find(|a| answers.iter().filter(|b| *b == a).count() >= QUORUM)
    }

    /// Waits until the Sentinels' majority names a node other than `old`.
    pub async fn new_primary(
        &self,
        old: SocketAddr,
        limit: Duration,
    ) -> anyhow::Result<SocketAddr> {
        until("the Sentinels to name a new primary", limit, || async {
            self.sentinels_primary().filter(|p| *p != old)
        })
        .await
    }

    /// Steady state: every Sentinel names the same primary and has no failover running, the
    /// primary has both replicas online, and both polestars serve it as `ok`.
    pub async fn steady(&self, limit: Duration) -> anyhow::Result<SocketAddr> {
        until("a steady cluster", limit, || async {
            let primary = self.sentinels_primary()?;
            for i in 0..self.sentinels.len() {
                let m = self.cli(&self.app, self.sentinel(i), &["SENTINEL", "MASTER", MASTER]);
                let ip = primary.ip().to_string();
                if field(&m, "flags") != Some("master") || field(&m, "ip") != Some(ip.as_str()) {
                    return None;
                }
            }
            let info = self.cli(&self.app, primary, &["INFO", "replication"]);
            let online = info.lines().filter(|l| l.contains("state=online")).count();
            if !info.contains("role:master") || online < 2 {
                return None;
            }
            for url in [self.central_url(), self.agent_url()] {
                let v = get_json(&self.app, url.replace("/primary", "")).await?;
                if v["state"] != "ok" || v["primary"]["ip"] != primary.ip().to_string() {
                    return None;
                }
            }
            Some(primary)
        })
        .await
    }

    pub fn central_url(&self) -> String {
        format!("http://{}:{HTTP_PORT}/v1/masters/{MASTER}/primary", self.ctl.ip)
    }

    pub fn agent_url(&self) -> String {
        format!("http://127.0.0.1:{HTTP_PORT}/v1/masters/{MASTER}/primary")
    }

    pub fn dns_server(&self) -> SocketAddr {
        SocketAddr::new(self.ctl.ip, 53)
    }
}

fn iptables(host: &Host, args: &[&str]) -> anyhow::Result<()> {
    let mut all = vec!["netns", "exec", host.ns.as_str(), "iptables", "-w"];
    all.extend_from_slice(args);
    run("ip", &all)
}
