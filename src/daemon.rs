//! `polestar run`: load, bind, spawn, wait for shutdown.
//!
//! Startup is a short sequence of named steps: raise the open-file limit, bind every listener (so a busy port fails the
//! start, before anything is served), check the socket sweeper's permission, start the drain
//! coordinator and the topology's writer (Sentinels or an upstream polestar), serve, and say
//! `ready` once a first state is loaded. Shutdown cancels one token that every task holds.
//!
//! Settings that a reload can change reach the components through the configuration channel
//! of [`crate::reload`]; systemd hears about each stage through [`crate::service`].

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures::FutureExt;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::drain::Coordinator;
use crate::events::EventLog;
use crate::reload::{self, Reloader, watcher};
use crate::service;
use crate::topology::{self, TopologyReader, TopologyWriter};

/// How long startup waits for a first confirmed state before saying `ready` anyway.
const FIRST_STATE_DEADLINE: Duration = Duration::from_secs(10);

/// Runs the daemon until `shutdown` is cancelled (or a component fails, which stops the rest).
/// SIGHUP reloads `config.file`.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    crate::limits::raise_open_files();
    crate::tls::install();
    let metrics = crate::metrics::install();
    // The writer's own view (`raw`) and, masked by the handoffs under way, what everyone reads.
    let (raw_writer, raw) = topology::channel();
    let (writer, reader) = topology::channel();
    let maintenance = Arc::new(crate::switchover::Maintenance::default());
    let events = Arc::new(EventLog::new());
    let dns = match &config.dns {
        Some(d) => Some(crate::dns::Listeners::bind(d).await?),
        None => None,
    };
    let http = match &config.http {
        Some(h) => Some(crate::http::bind(h.listen).await?),
        None => None,
    };
    let sentinel_api = match &config.sentinel_api {
        Some(s) => Some(crate::sentinel_api::bind(&s.listen).await?),
        None => None,
    };
    let (reloader, live) = Reloader::new(config.clone());
    let sweeper =
        crate::sweep::start(live.clone(), reader.clone(), events.clone(), shutdown.clone()).await?;

    // Every component runs until shutdown; the first that ends before stops the daemon (see
    // `supervise`), so a panic is a loud exit for systemd to restart, never a silent hole.
    let mut tasks = JoinSet::new();
    let stop = shutdown.clone();
    tasks.spawn(async move {
        sweeper.await.map_err(|e| anyhow::anyhow!("the socket sweeper panicked: {e}"))?;
        anyhow::ensure!(stop.is_cancelled(), "the socket sweeper stopped unexpectedly");
        Ok(())
    });
    tasks.spawn(reload::on_sighup(reloader, shutdown.clone()));
    tasks.spawn(register_master_series(&config, reader.clone(), shutdown.clone()));
    let handoffs = maintenance.handoffs.subscribe();
    let mask = crate::switchover::mask::run(raw.clone(), handoffs, writer, shutdown.clone());
    tasks.spawn(mask.map(Ok));
    let (drain_tx, drain_rx) = mpsc::unbounded_channel();
    let coordinator = Coordinator::new(
        config.drain.clone(),
        config.nodes.clone(),
        events.clone(),
        reader.clone(),
    );
    let coordinator =
        coordinator.follow(reload::project(&live, |c| (c.drain.clone(), c.nodes.clone())));
    let drain = coordinator.handle();
    tasks.spawn(coordinator.run(drain_rx, shutdown.clone()).map(Ok));
    // The links leave their records of each master here; the readiness poll reads them.
    let heard = crate::readiness::Heard::default();
    let heard_by_links = heard.clone();
    let start = move |c: &Config, w: TopologyWriter, e: Arc<EventLog>, s: CancellationToken| {
        crate::source::spawn(c, w, e, drain_tx.clone(), heard_by_links.clone(), s)
    };
    let (readiness_tx, readiness) = crate::readiness::channel();
    let poll = crate::readiness::poll::run(
        live.clone(),
        reader.clone(),
        heard,
        readiness_tx,
        shutdown.clone(),
    );
    tasks.spawn(poll.map(Ok));
    let watch =
        watcher::supervise(live.clone(), raw_writer, events.clone(), shutdown.clone(), start);
    let watcher = tokio::spawn(watch);
    if let (Some(listeners), Some(d)) = (dns, &config.dns) {
        let (cfg, mut topology, stop) = (d.clone(), reader.clone(), shutdown.clone());
        if let Some(max_lag) = d.replica_max_lag {
            let follow = crate::readiness::lagging::follow;
            let (filtered, feed) = follow(topology, readiness.clone(), max_lag, stop.clone());
            tasks.spawn(feed.map(Ok));
            topology = filtered;
        }
        tasks.spawn(async move {
            crate::dns::serve(listeners, cfg, topology, stop).await.context("DNS server failed")
        });
    }
    if let Some(listener) = http {
        let api = crate::http::Api {
            topology: reader.clone(),
            events: events.clone(),
            admin_token: reload::project(&live, |c| c.http.as_ref()?.admin_token.clone()),
            agent_token: reload::project(&live, |c| c.http.as_ref()?.agent_token.clone()),
            control: crate::source::maintenance_control(
                live.clone(),
                maintenance.clone(),
                (reader.clone(), raw.clone()),
                events.clone(),
                Some(drain.clone()),
            ),
            metrics,
            drain: Some(drain),
            readiness: readiness.clone(),
            tls: reload::project(&live, |c| c.http.as_ref()?.tls.clone()),
        };
        let stop = shutdown.clone();
        tasks.spawn(async move {
            crate::http::serve(listener, api, stop).await.context("HTTP server failed")
        });
    }
    if let (Some(listeners), Some(s)) = (sentinel_api, &config.sentinel_api) {
        let api = crate::sentinel_api::Api {
            topology: reader.clone(),
            peers: reload::project(&live, |c| {
                c.sentinel_api.as_ref().map(|s| s.peers.clone()).unwrap_or_default()
            }),
            password: reload::project(&live, |c| c.sentinel_api.as_ref()?.password.clone()),
            max_connections: s.max_connections,
            idle_timeout: s.idle_timeout,
            input_budget: crate::sentinel_api::INPUT_BUDGET,
            events: events.clone(),
        };
        let stop = shutdown.clone();
        tasks.spawn(async move {
            crate::sentinel_api::serve(listeners, api, stop).await.context("Sentinel API failed")
        });
    }

    tokio::select! {
        _ = wait_first_state(reader.clone()) => {
            tracing::info!("ready");
            service::ready();
        }
        _ = shutdown.cancelled() => {}
    }
    tasks.spawn(service::watchdog(shutdown.clone()));
    let result = supervise(&mut tasks, &shutdown).await;
    service::stopping();
    shutdown.cancel();
    while tasks.join_next().await.is_some() {}
    watcher.await.context("the topology watcher's supervisor failed")?;
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

/// Registers the per-master metric series of every configured master at once and of every
/// master that appears in the topology later (discovered ones), until shutdown.
fn register_master_series(
    config: &Config,
    mut reader: TopologyReader,
    shutdown: CancellationToken,
) -> impl std::future::Future<Output = anyhow::Result<()>> + use<> {
    for master in config.masters.iter().flatten() {
        crate::metrics::register_master(&master.name);
    }
    async move {
        let mut known = std::collections::BTreeSet::new();
        loop {
            let names: Vec<String> = reader.borrow_and_update().masters.keys().cloned().collect();
            for name in names {
                if known.insert(name.clone()) {
                    crate::metrics::register_master(&name);
                }
            }
            tokio::select! {
                changed = reader.changed() => if changed.is_err() { break },
                _ = shutdown.cancelled() => break,
            }
        }
        // The writer went away or shutdown: wait for shutdown so as not to stop the daemon.
        shutdown.cancelled().await;
        Ok(())
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
        // Why, when it is a connection problem (a TLS certificate, a refused token...).
        let errors = crate::reach::errors(None).join("; ");
        tracing::warn!(%errors, "no confirmed primary for every master yet; serving what is known");
    }
}
