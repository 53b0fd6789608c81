//! `polestar run`: load, bind, spawn, wait for shutdown.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, Source};
use crate::events::EventLog;
use crate::topology::{self, TopologyReader};

/// How long startup waits for a first confirmed state before saying `ready` anyway.
const FIRST_STATE_DEADLINE: Duration = Duration::from_secs(10);

/// Runs the daemon until `shutdown` is cancelled.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let metrics = crate::metrics::install();
    let (writer, reader) = topology::channel();
    let events = Arc::new(EventLog::new());
    let Source::Sentinels(sentinels) = &config.source else {
        anyhow::bail!("upstream: following another polestar is not supported by this version yet");
    };
    let _ = (&metrics, sentinels);
    let watcher = crate::sentinel::spawn(&config, writer, events.clone(), shutdown.clone());
    wait_first_state(reader.clone()).await;
    tracing::info!("ready");
    log_changes(reader, shutdown.clone()).await;
    watcher.await.context("the Sentinel watcher failed")?;
    Ok(())
}

/// Waits until every master has a confirmed primary (or the deadline passes).
async fn wait_first_state(mut reader: TopologyReader) {
    let loaded = |s: &topology::Snapshot| {
        s.source_reachable
            && !s.masters.is_empty()
            && s.masters.values().all(|m| m.primary.is_some())
    };
    let wait = reader.wait_for(|s| loaded(s));
    if tokio::time::timeout(FIRST_STATE_DEADLINE, wait).await.is_err() {
        tracing::warn!("no confirmed primary for every master yet; serving what is known");
    }
}

async fn log_changes(mut reader: TopologyReader, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            r = reader.changed() => if r.is_err() { return },
            _ = shutdown.cancelled() => return,
        }
        let snapshot = reader.borrow_and_update().clone();
        for m in snapshot.masters.values() {
            tracing::debug!(master = %m.name, primary = ?m.primary.as_ref().map(|p| p.to_string()), epoch = ?m.epoch, state = %m.state, agreeing = m.sentinels.agreeing, reachable = m.sentinels.reachable, "snapshot");
        }
    }
}
