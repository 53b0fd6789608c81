//! What the lab looks like: addresses, pids, logs, and what its Sentinels report.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;

use anyhow::Context;

use crate::process::Run;
use crate::query::{self, pairs, query, sentinel};
use crate::{Lab, LabOptions};

impl Lab {
    pub fn options(&self) -> &LabOptions {
        &self.opts
    }

    pub fn master_name(&self) -> &str {
        &self.opts.master_name
    }

    /// The certificates of a TLS lab (`LabOptions::tls`).
    pub fn certs(&self) -> Option<&crate::tls::Certs> {
        self.certs.as_ref()
    }

    /// Where the lab keeps its files (configs, logs); removed on drop.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn sentinel_addrs(&self) -> Vec<SocketAddr> {
        self.lock().sentinels.iter().map(|p| p.addr()).collect()
    }

    pub fn node_addrs(&self) -> Vec<SocketAddr> {
        self.lock().nodes.iter().map(|p| p.addr()).collect()
    }

    /// The node listening on `addr`'s port (every lab process listens on 127.0.0.1).
    pub fn index_of(&self, addr: SocketAddr) -> Option<usize> {
        self.lock().nodes.iter().position(|p| p.port == addr.port())
    }

    pub fn node_pid(&self, i: usize) -> Option<u32> {
        self.lock().nodes.get(i)?.pid()
    }

    pub fn sentinel_pid(&self, i: usize) -> Option<u32> {
        self.lock().sentinels.get(i)?.pid()
    }

    /// Sentinels neither killed nor hung: the ones expected to answer.
    pub fn running_sentinels(&self) -> Vec<SocketAddr> {
        let procs = self.lock();
        procs.sentinels.iter().filter(|p| p.run == Run::Running).map(|p| p.addr()).collect()
    }

    /// The last lines of every process's log.
    pub fn logs_tail(&self, lines: usize) -> String {
        let procs = self.lock();
        let all = procs.nodes.iter().chain(procs.sentinels.iter());
        all.map(|p| p.tail(lines)).collect::<Vec<_>>().join("")
    }

    /// The primary per `SENTINEL get-master-addr-by-name` on the first Sentinel that answers.
    pub async fn primary(&self) -> anyhow::Result<SocketAddr> {
        let mut last = None;
        for addr in self.running_sentinels() {
            match self.primary_per(addr).await {
                Ok(primary) => return Ok(primary),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("no sentinel is running")))
    }

    /// The primary that the Sentinel at `sentinel_addr` reports.
    pub async fn primary_per(&self, sentinel_addr: SocketAddr) -> anyhow::Result<SocketAddr> {
        let cmd = sentinel("get-master-addr-by-name", &[self.master_name()]);
        let reply: Option<(String, u16)> = query(sentinel_addr, &cmd).await?;
        let (host, port) = reply.with_context(|| format!("{sentinel_addr} knows no master"))?;
        query::resolve(&host, port).await
    }

    /// `SENTINEL MASTER <name>` on the first Sentinel that answers.
    pub async fn master_info(&self) -> anyhow::Result<HashMap<String, String>> {
        let cmd = sentinel("master", &[self.master_name()]);
        self.ask_any(&cmd).await.map(pairs)
    }

    /// The master's config epoch, per the first Sentinel that answers.
    pub async fn epoch(&self) -> anyhow::Result<u64> {
        let info = self.master_info().await?;
        let epoch = info.get("config-epoch").context("SENTINEL MASTER has no config-epoch")?;
        epoch.parse().with_context(|| format!("bad config-epoch {epoch:?}"))
    }

    /// The replicas a Sentinel knows (healthy or not), as it reports them.
    pub async fn replicas(&self) -> anyhow::Result<Vec<SocketAddr>> {
        let mut out = Vec::new();
        for fields in self.replica_fields().await? {
            let ip = fields.get("ip").context("replica without ip")?;
            let port = fields.get("port").context("replica without port")?;
            out.push(query::resolve(ip, port.parse().context("bad replica port")?).await?);
        }
        out.sort();
        Ok(out)
    }

    /// `SENTINEL REPLICAS <name>`, each replica as its key/value fields.
    pub async fn replica_fields(&self) -> anyhow::Result<Vec<HashMap<String, String>>> {
        let cmd = sentinel("replicas", &[self.master_name()]);
        let reply: Vec<Vec<String>> = self.ask_any(&cmd).await?;
        Ok(reply.into_iter().map(pairs).collect())
    }

    /// The first element of `ROLE` on node `i` (`master`, `slave`).
    pub async fn role(&self, i: usize) -> anyhow::Result<String> {
        let addr = *self.node_addrs().get(i).with_context(|| format!("no node {i}"))?;
        let reply: Vec<redis::Value> = query(addr, &redis::cmd("ROLE")).await?;
        let first = reply.into_iter().next().context("empty ROLE reply")?;
        redis::from_redis_value::<String>(first).context("ROLE reply is not a string")
    }

    /// Sends `cmd` to each running Sentinel in turn until one answers.
    pub async fn ask_any<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> anyhow::Result<T> {
        let mut last = None;
        for addr in self.running_sentinels() {
            match query(addr, cmd).await {
                Ok(reply) => return Ok(reply),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("no sentinel is running")))
    }
}
