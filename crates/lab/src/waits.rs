//! Waiting for the cluster to reach a state: polled conditions with deadlines, never sleeps
//! that guess. A failed wait reports what it last saw and the tail of every log.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use tokio::time::{Instant, sleep};

use crate::query::{info_fields, pairs, query, sentinel};
use crate::{Lab, POLL};

impl Lab {
    /// Polls `check` until it succeeds; on the deadline fails with its last error and the logs.
    pub async fn wait_for<T, F, Fut>(
        &self,
        deadline: Duration,
        what: &str,
        mut check: F,
    ) -> anyhow::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = anyhow::Result<T>>,
    {
        let end = Instant::now() + deadline;
        loop {
            let error = match check().await {
                Ok(value) => return Ok(value),
                Err(e) => e,
            };
            if Instant::now() > end {
                let error = error.context(format!("{what}: not reached within {deadline:?}"));
                return Err(self.explain(error));
            }
            sleep(POLL).await;
        }
    }

    /// Until the first node has every other node as an online replica.
    pub(super) async fn wait_replication(&self, deadline: Duration) -> anyhow::Result<()> {
        let primary = self.node_addrs()[0];
        let expected = self.opts.nodes - 1;
        self.wait_for(deadline, "replication", || async move {
            let info: String = query(primary, redis::cmd("INFO").arg("replication")).await?;
            let fields = info_fields(&info);
            let online = fields.values().filter(|v| v.contains("state=online")).count();
            ensure!(online == expected, "{online} of {expected} replicas online");
            Ok(())
        })
        .await
    }

    /// Until every running Sentinel reports the same primary, all replicas healthy and linked,
    /// and all other Sentinels known. Call it again after restoring what a test broke.
    pub async fn wait_converged(&self, deadline: Duration) -> anyhow::Result<()> {
        self.wait_for(deadline, "sentinels converged", || async {
            let mut primaries = Vec::new();
            for addr in self.running_sentinels() {
                self.check_sentinel_view(addr).await?;
                primaries.push(self.primary_per(addr).await?);
            }
            primaries.dedup();
            ensure!(primaries.len() == 1, "sentinels disagree on the primary: {primaries:?}");
            Ok(())
        })
        .await
    }

    async fn check_sentinel_view(&self, addr: SocketAddr) -> anyhow::Result<()> {
        let name = self.master_name();
        let master = pairs(query(addr, &sentinel("master", &[name])).await?);
        let field = |k: &str| master.get(k).cloned().unwrap_or_default();
        ensure!(field("flags") == "master", "{addr}: master flags {:?}", field("flags"));
        let replicas = (self.opts.nodes - 1).to_string();
        ensure!(field("num-slaves") == replicas, "{addr}: {} replicas", field("num-slaves"));
        let others = (self.opts.sentinels - 1).to_string();
        let seen = field("num-other-sentinels");
        ensure!(seen == others, "{addr}: knows {seen} other sentinels");
        let list: Vec<Vec<String>> = query(addr, &sentinel("replicas", &[name])).await?;
        for replica in list.into_iter().map(pairs) {
            let (flags, link) = (replica.get("flags"), replica.get("master-link-status"));
            ensure!(flags.is_some_and(|f| f == "slave"), "{addr}: replica flags {flags:?}");
            ensure!(link.is_some_and(|l| l == "ok"), "{addr}: replica link {link:?}");
        }
        Ok(())
    }

    /// Until every running Sentinel reports one and the same primary other than `old`.
    pub async fn wait_for_primary_change(
        &self,
        old: SocketAddr,
        deadline: Duration,
    ) -> anyhow::Result<SocketAddr> {
        self.wait_for(deadline, "primary change", || async {
            let mut seen = Vec::new();
            for addr in self.running_sentinels() {
                seen.push(self.primary_per(addr).await?);
            }
            seen.dedup();
            match seen.as_slice() {
                [new] if *new != old => Ok(*new),
                [] => bail!("no sentinel is running"),
                _ => bail!("sentinels report {seen:?} (old primary {old})"),
            }
        })
        .await
        .context("waiting for the failover")
    }
}
