//! The Sentinel deployment that the sweep tests and the HAProxy bench build in namespaces:
//!
//! - `d1..d3` (10.77.0.11-13): a redis-server on 6379 (d1 starts as the primary, the others
//!   replicate it) and a Sentinel on 26379 each, monitoring `mymaster` with quorum 2;
//! - `ap` (10.77.0.20): the application host, where the clients run;
//! - `ct` (10.77.0.30): the control host, for a central polestar.
//!
//! The tests start the polestars they need with [`Cluster::polestar`]. The chaos soak has its own
//! deployment (`tests/chaos/cluster.rs`): Sentinels apart from the data nodes, restarts.

use std::net::SocketAddr;
use std::time::Duration;

use polestar_lab::conf::{self, Listen, Monitor};
use polestar_lab::{Flavor, Kind};

use super::{Host, Net, field, until};

/// Where every polestar of these tests serves HTTP.
pub const HTTP_PORT: u16 = 8053;
const SETUP: Duration = Duration::from_secs(30);

pub struct Cluster {
    pub net: Net,
    pub db: Vec<Host>,
    pub app: Host,
    pub ctl: Host,
    /// Redis or Valkey.
    pub flavor: Flavor,
    /// Lines added to every data node's config (e.g. an ACL user for the Sentinels).
    pub node_conf: String,
    /// Lines added to every Sentinel's config, after `sentinel monitor`.
    pub sentinel_conf: String,
}

impl Cluster {
    /// Builds the hosts, starts the data nodes and their Sentinels (with Sentinel's
    /// `down-after-milliseconds` at `down_after_ms`), and waits until replication is up and
    /// every Sentinel sees both replicas and the two other Sentinels.
    pub async fn start(down_after_ms: u64) -> anyhow::Result<Cluster> {
        Self::start_on(down_after_ms, Flavor::Redis).await
    }

    /// The same with `flavor`'s servers (Valkey: `valkey-server`, `--sentinel`).
    pub async fn start_on(down_after_ms: u64, flavor: Flavor) -> anyhow::Result<Cluster> {
        Self::start_with(down_after_ms, flavor, String::new(), String::new()).await
    }

    /// The same with `node_conf` and `sentinel_conf` added to the data nodes' and the
    /// Sentinels' configs.
    pub async fn start_with(
        down_after_ms: u64,
        flavor: Flavor,
        node_conf: String,
        sentinel_conf: String,
    ) -> anyhow::Result<Cluster> {
        let net = Net::new()?;
        let db =
            (1..=3).map(|i| net.host(&format!("d{i}"), 10 + i)).collect::<Result<Vec<_>, _>>()?;
        let app = net.host("ap", 20)?;
        let ctl = net.host("ct", 30)?;
        let cluster = Cluster { net, db, app, ctl, flavor, node_conf, sentinel_conf };
        let started = cluster.start_redis(down_after_ms).await;
        cluster.net.with_logs(started)?;
        Ok(cluster)
    }

    /// The first primary: redis-server on d1.
    pub fn primary(&self) -> SocketAddr {
        SocketAddr::new(self.db[0].ip, 6379)
    }

    async fn start_redis(&self, down_after_ms: u64) -> anyhow::Result<()> {
        for i in 0..self.db.len() {
            self.spawn_redis(i)?;
        }
        let primary = self.db[0].clone();
        until("replication", SETUP, || async {
            let info = self.cli(&primary, 6379, &["INFO", "replication"]);
            info.contains("connected_slaves:2").then_some(())
        })
        .await?;
        for i in 0..self.db.len() {
            self.spawn_sentinel(i, down_after_ms)?;
        }
        for host in &self.db {
            until("sentinels to converge", SETUP, || async {
                let m = self.cli(host, 26379, &["SENTINEL", "MASTER", "mymaster"]);
                (field(&m, "num-slaves") == Some("2")
                    && field(&m, "num-other-sentinels") == Some("2"))
                .then_some(())
            })
            .await?;
        }
        Ok(())
    }

    fn spawn_redis(&self, i: usize) -> anyhow::Result<()> {
        let primary = (i > 0).then(|| self.db[0].ip);
        self.start_redis_of(i, primary)
    }

    /// (Re)starts the redis-server of `db[i]` as `redis-{i}`, a replica of `primary` if given.
    pub fn start_redis_of(
        &self,
        i: usize,
        primary: Option<std::net::IpAddr>,
    ) -> anyhow::Result<()> {
        let host = &self.db[i];
        let listen = self.listen(host, 6379, &format!("redis-{i}"));
        let primary = primary.map(|ip| ip.to_string());
        let text = conf::data_node(&listen, primary.as_deref().map(|ip| (ip, 6379)));
        let path = conf::write(&listen.dir, Kind::Server, &(text + &self.node_conf))?;
        self.net.spawn_server(host, &format!("redis-{i}"), &self.flavor, Kind::Server, &path)?;
        Ok(())
    }

    fn spawn_sentinel(&self, i: usize, down_after_ms: u64) -> anyhow::Result<()> {
        let host = &self.db[i];
        let listen = self.listen(host, 26379, &format!("sentinel-{i}"));
        let monitor = Monitor {
            name: "mymaster".into(),
            host: self.db[0].ip.to_string(),
            port: 6379,
            quorum: 2,
            down_after: Duration::from_millis(down_after_ms),
            failover_timeout: Duration::from_millis(5000),
            parallel_syncs: 1,
        };
        let text = conf::sentinel(&listen, &monitor) + &self.sentinel_conf;
        let path = conf::write(&listen.dir, Kind::Sentinel, &text)?;
        let label = format!("sentinel-{i}");
        self.net.spawn_server(host, &label, &self.flavor, Kind::Sentinel, &path)?;
        Ok(())
    }

    /// Where a process of `host` listens: its address, `port`, its directory `name` in the
    /// network's; it logs to its output (`<label>.log`).
    fn listen(&self, host: &Host, port: u16, name: &str) -> Listen {
        let dir = self.net.dir.path().join(name);
        Listen { ip: host.ip, port, dir, logfile: None }
    }

    /// `redis-cli` against `host:port`, from inside `host`'s namespace.
    pub fn cli(&self, host: &Host, port: u16, args: &[&str]) -> String {
        let ip = host.ip.to_string();
        let port = port.to_string();
        let mut all = vec!["-h", ip.as_str(), "-p", port.as_str()];
        all.extend_from_slice(args);
        self.net.exec(host, "redis-cli", &all)
    }

    /// The `sentinels:` section of a polestar config that follows this cluster's Sentinels.
    pub fn sentinels_yaml(&self) -> String {
        let list: Vec<String> = self.db.iter().map(|h| format!("\"{}:26379\"", h.ip)).collect();
        format!("sentinels:\n  addresses: [{}]\n", list.join(", "))
    }

    /// Starts polestar in `host`'s namespace with `source` YAML (its `sentinels:` or
    /// `upstream:`), HTTP on `listen`, and `extra`; waits for `ready`.
    pub async fn polestar(
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
        self.net.spawn(host, label, super::BIN, &["run", "-c", &path])?;
        self.net.ready(label, SETUP).await
    }

    /// Starts the central polestar as `label`: on the control host, following the Sentinels,
    /// HTTP on the control host's address.
    pub async fn central(&self, label: &str) -> anyhow::Result<()> {
        let listen = format!("{}:{HTTP_PORT}", self.ctl.ip);
        self.polestar(&self.ctl, label, &self.sentinels_yaml(), &listen, "").await
    }

    /// Starts the node-side polestar (`node-polestar`) beside the first primary, on d1:
    /// following the Sentinels, HTTP on d1's address, with `sweep` (its `sweep:` section).
    pub async fn node_polestar(&self, sweep: &str) -> anyhow::Result<()> {
        let db1 = &self.db[0];
        let listen = format!("{}:{HTTP_PORT}", db1.ip);
        self.polestar(db1, "node-polestar", &self.sentinels_yaml(), &listen, sweep).await
    }

    /// The central polestar's URL for the primary.
    pub fn central_url(&self) -> String {
        format!("http://{}:{HTTP_PORT}/v1/masters/mymaster/primary", self.ctl.ip)
    }
}
