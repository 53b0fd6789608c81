//! `polestar run`: load, bind, spawn, wait for shutdown.
//!
//! Startup is a short sequence of named steps: bind every listener (so a busy port fails the
//! start, before anything is served), start the Sentinel watcher, serve, and say `ready` once
//! a first state is loaded. Shutdown cancels one token that every task holds.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use futures::FutureExt;

use crate::config::Config;
use crate::drain::Coordinator;
use crate::events::EventLog;
use crate::topology::{self, TopologyReader};

/// How long startup waits for a first confirmed state before saying `ready` anyway.
const FIRST_STATE_DEADLINE: Duration = Duration::from_secs(10);

/// Runs the daemon until `shutdown` is cancelled (or a component fails, which stops the rest).
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let metrics = crate::metrics::install();
    let (writer, reader) = topology::channel();
    let events = Arc::new(EventLog::new());
    let dns = match &config.dns {
        Some(d) => Some(crate::dns::Listeners::bind(d).await?),
        None => None,
    };
    let http = match &config.http {
        Some(h) => Some(crate::http::bind(h.listen).await?),
        None => None,
    };

    crate::sweep::start(&config, reader.clone(), events.clone(), shutdown.clone()).await?;
    let mut tasks = JoinSet::new();
    let (drain_tx, drain_rx) = tokio::sync::mpsc::unbounded_channel();
    let coordinator = Coordinator::new(
        config.drain.clone(),
        config.nodes.clone(),
        events.clone(),
        reader.clone(),
    );
    let drain = coordinator.handle();
    tasks.spawn(coordinator.run(drain_rx, shutdown.clone()).map(Ok));
    let (watcher, control) =
        crate::source::spawn(&config, writer, events.clone(), drain_tx, shutdown.clone());
    if let (Some(listeners), Some(d)) = (dns, &config.dns) {
        let (cfg, topology, stop) = (d.clone(), reader.clone(), shutdown.clone());
        tasks.spawn(async move {
            crate::dns::serve(listeners, cfg, topology, stop).await.context("DNS server failed")
        });
    }
    if let (Some(listener), Some(h)) = (http, &config.http) {
        let api = crate::http::Api {
            topology: reader.clone(),
            events: events.clone(),
            admin_token: h.admin_token.clone(),
            control,
            metrics,
            drain: Some(drain),
        };
        let stop = shutdown.clone();
        tasks.spawn(async move {
            crate::http::serve(listener, api, stop).await.context("HTTP server failed")
        });
    }

    tokio::select! {
        _ = wait_first_state(reader.clone()) => tracing::info!("ready"),
        _ = shutdown.cancelled() => {}
    }
    let result = supervise(&mut tasks, &shutdown).await;
    shutdown.cancel();
    while tasks.join_next().await.is_some() {}
    watcher.await.context("the Sentinel watcher failed")?;
    result
}

/// Waits for shutdown or for the first component to stop, whichever comes first.
async fn supervise(
    tasks: &mut JoinSet<anyhow::Result<()>>,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    tokio::select! {
        _ = shutdown.cancelled() => Ok(()),
        Some(done) = tasks.join_next() => match done {
            Ok(result) => result,
            Err(e) => Err(anyhow::anyhow!("a component panicked: {e}")),
        },
    }
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
