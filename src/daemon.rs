//! `polestar run`: load, bind, spawn, wait for shutdown.
//!
//! Startup is a short sequence of named steps: raise the open-file limit, bind every listener
//! (so a busy port fails the start, before anything is served), check the socket sweeper's
//! permission, start the writer side (the drain coordinator, the topology's writer: Sentinels
//! or an upstream polestar, the readiness poll), start the readers (DNS, HTTP, the Sentinel
//! endpoint), say `ready` once a first state is loaded, and serve until shutdown. Shutdown
//! cancels one token that every task holds; the daemon owns and joins every task it starts.
//!
//! Settings that a reload can change reach the components through the configuration channel
//! of [`crate::reload`]; systemd hears about each stage through [`crate::service`].

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures::FutureExt;
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::drain::{Coordinator, DrainHandle};
use crate::events::EventLog;
use crate::failover::Signal;
use crate::reload::{self, ConfigReader, Reloader, watcher};
use crate::service;
use crate::switchover::Maintenance;
use crate::topology::{self, Publisher, TopologyReader};

/// How long startup waits for a first confirmed state before saying `ready` anyway.
const FIRST_STATE_DEADLINE: Duration = Duration::from_secs(10);

/// Runs the daemon until `shutdown` is cancelled (or a component fails, which stops the rest).
/// SIGHUP reloads `config.file`.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    crate::limits::raise_open_files();
    crate::tls::install();
    let metrics = crate::metrics::install();
    let listeners = Listeners::bind(&config).await?;
    let (reloader, live) = Reloader::new(config.clone());
    let (mut daemon, published) = Daemon::new(live, shutdown.clone());
    daemon.start_sweeper().await?;
    daemon.tasks.spawn(reload::on_sighup(reloader, shutdown.clone()));
    let series = register_master_series(&config, daemon.reader.clone(), shutdown);
    daemon.tasks.spawn(series);
    let writing = daemon.start_writer(&config, published);
    daemon.start_readers(&config, listeners, writing, metrics);
    daemon.wait_until_ready().await;
    daemon.serve_until_shutdown().await
}

/// Every listener, bound before anything is served: a busy port fails the start.
struct Listeners {
    dns: Option<crate::dns::Listeners>,
    http: Option<tokio::net::TcpListener>,
    sentinel_api: Option<Vec<tokio::net::TcpListener>>,
}

impl Listeners {
    async fn bind(config: &Config) -> anyhow::Result<Self> {
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
        Ok(Self { dns, http, sentinel_api })
    }
}

/// What every step shares: the running configuration, the one shutdown token, the tasks the
/// daemon owns, the event log, and the published topology.
///
/// Every component runs until shutdown as one of `tasks`; the first that ends before stops
/// the daemon (see [`first_to_stop`]), so a panic is a loud exit for systemd to restart, never
/// a silent hole. (The Sentinel decider, the agent and the readiness poll are restarted in
/// place instead: see [`crate::supervise::restarting`].)
struct Daemon {
    live: ConfigReader,
    shutdown: CancellationToken,
    tasks: JoinSet<anyhow::Result<()>>,
    events: Arc<EventLog>,
    /// What everyone reads: the writer's view masked by the handoffs under way.
    reader: TopologyReader,
}

/// What the topology's writer side hands the readers: the writer's own (unmasked) view, the
/// switchovers and handoffs under way, the drain coordinator and the readiness verdicts.
struct Writing {
    raw: TopologyReader,
    maintenance: Arc<Maintenance>,
    drain: DrainHandle,
    readiness: crate::readiness::Reader,
}

impl Daemon {
    /// The daemon, and the writer of the published topology (the mask's).
    fn new(live: ConfigReader, shutdown: CancellationToken) -> (Self, Publisher) {
        let (published, reader) = topology::channel();
        let daemon = Self {
            live,
            shutdown,
            tasks: JoinSet::new(),
            events: Arc::new(EventLog::new()),
            reader,
        };
        (daemon, published)
    }

    /// Checks the socket sweeper's permission (when `sweep` is configured) and starts it.
    async fn start_sweeper(&mut self) -> anyhow::Result<()> {
        let (live, reader, events) = (self.live.clone(), self.reader.clone(), self.events.clone());
        let sweeper = crate::sweep::start(live, reader, events, self.shutdown.clone()).await?;
        self.tasks.spawn(until_shutdown("the socket sweeper", sweeper, self.shutdown.clone()));
        Ok(())
    }

    /// The drain coordinator, the topology's writer (Sentinels or an upstream, restarted on a
    /// reload that changes them), the handoff mask and the readiness poll.
    fn start_writer(&mut self, config: &Config, published: Publisher) -> Writing {
        let (raw_publisher, raw) = topology::channel();
        let maintenance = Arc::new(Maintenance::default());
        let handoffs = maintenance.handoffs.subscribe();
        let mask = crate::switchover::mask::run(raw.clone(), handoffs, published, self.stop());
        self.tasks.spawn(mask);
        let (drain, drain_tx) = self.start_drain(config);
        // The links leave their records of each master here; the readiness poll reads them.
        let heard = crate::readiness::Heard::default();
        let heard_by_links = heard.clone();
        let start = move |c: &Config, w: Publisher, e: Arc<EventLog>, s: CancellationToken| {
            crate::source::spawn(c, w, e, drain_tx.clone(), heard_by_links.clone(), s)
        };
        let (readiness_tx, readiness) = crate::readiness::channel();
        let (live, reader, stop) = (self.live.clone(), self.reader.clone(), self.stop());
        // Restarted in place if it ends (a bug): it reads untrusted replies from every
        // configured Sentinel and published node, and its end must cost the verdicts only.
        let poll = crate::supervise::restarting("the readiness poll", self.stop(), move || {
            let (live, reader, heard) = (live.clone(), reader.clone(), heard.clone());
            crate::readiness::poll::run(live, reader, heard, readiness_tx.clone(), stop.clone())
        });
        self.tasks.spawn(poll.map(Ok));
        let events = self.events.clone();
        let watch =
            watcher::follow_reloads(self.live.clone(), raw_publisher, events, self.stop(), start);
        let watch = tokio::spawn(watch);
        self.tasks.spawn(until_shutdown("the topology watcher", watch, self.stop()));
        Writing { raw, maintenance, drain, readiness }
    }

    /// The drain coordinator: its handle, and the sender of its fence and drain signals.
    fn start_drain(&mut self, config: &Config) -> (DrainHandle, mpsc::UnboundedSender<Signal>) {
        let (drain_tx, drain_rx) = mpsc::unbounded_channel();
        let (reader, events) = (self.reader.clone(), self.events.clone());
        let coordinator =
            Coordinator::new(config.drain.clone(), config.nodes.clone(), events, reader);
        let coordinator =
            coordinator.follow(reload::project(&self.live, |c| (c.drain.clone(), c.nodes.clone())));
        let drain = coordinator.handle();
        self.tasks.spawn(coordinator.run(drain_rx, self.stop()).map(Ok));
        (drain, drain_tx)
    }

    /// DNS, the HTTP API and the Sentinel endpoint, on the listeners bound at the start.
    fn start_readers(
        &mut self,
        config: &Config,
        listeners: Listeners,
        writing: Writing,
        metrics: crate::metrics::Handle,
    ) {
        if let (Some(listeners), Some(d)) = (listeners.dns, &config.dns) {
            self.serve_dns(listeners, d, writing.readiness.clone());
        }
        if let Some(listener) = listeners.http {
            self.serve_http(listener, writing, metrics);
        }
        if let (Some(listeners), Some(s)) = (listeners.sentinel_api, &config.sentinel_api) {
            self.serve_sentinel_api(listeners, s);
        }
    }

    fn serve_dns(
        &mut self,
        listeners: crate::dns::Listeners,
        d: &crate::config::Dns,
        readiness: crate::readiness::Reader,
    ) {
        let (cfg, mut topology, stop) = (d.clone(), self.reader.clone(), self.stop());
        if let Some(max_lag) = d.replica_max_lag {
            let follow = crate::readiness::lagging::follow;
            let (filtered, feed) = follow(topology, readiness, max_lag, stop.clone());
            self.tasks.spawn(feed);
            topology = filtered;
        }
        self.tasks.spawn(async move {
            crate::dns::serve(listeners, cfg, topology, stop).await.context("DNS server failed")
        });
    }

    fn serve_http(
        &mut self,
        listener: tokio::net::TcpListener,
        writing: Writing,
        metrics: crate::metrics::Handle,
    ) {
        let live = &self.live;
        let api = crate::http::Api {
            topology: self.reader.clone(),
            events: self.events.clone(),
            admin_token: reload::project(live, |c| c.http.as_ref()?.admin_token.clone()),
            agent_token: reload::project(live, |c| c.http.as_ref()?.agent_token.clone()),
            control: crate::source::maintenance_control(
                live.clone(),
                writing.maintenance,
                (self.reader.clone(), writing.raw),
                self.events.clone(),
                Some(writing.drain.clone()),
            ),
            metrics,
            drain: Some(writing.drain),
            readiness: writing.readiness,
            tls: reload::project(live, |c| c.http.as_ref()?.tls.clone()),
        };
        let stop = self.stop();
        self.tasks.spawn(async move {
            crate::http::serve(listener, api, stop).await.context("HTTP server failed")
        });
    }

    fn serve_sentinel_api(
        &mut self,
        listeners: Vec<tokio::net::TcpListener>,
        s: &crate::config::SentinelApi,
    ) {
        let live = &self.live;
        let api = crate::sentinel_api::Api {
            topology: self.reader.clone(),
            peers: reload::project(live, |c| {
                c.sentinel_api.as_ref().map(|s| s.peers.clone()).unwrap_or_default()
            }),
            password: reload::project(live, |c| c.sentinel_api.as_ref()?.password.clone()),
            max_connections: s.max_connections,
            idle_timeout: s.idle_timeout,
            input_budget: crate::sentinel_api::INPUT_BUDGET,
            events: self.events.clone(),
        };
        let stop = self.stop();
        self.tasks.spawn(async move {
            crate::sentinel_api::serve(listeners, api, stop).await.context("Sentinel API failed")
        });
    }

    /// Says `ready` (and tells systemd) once a first state is loaded, or after
    /// [`FIRST_STATE_DEADLINE`] without one.
    async fn wait_until_ready(&self) {
        tokio::select! {
            _ = wait_first_state(self.reader.clone()) => {
                tracing::info!("ready");
                service::ready();
            }
            _ = self.shutdown.cancelled() => {}
        }
    }

    /// Serves until shutdown or until a component stops, then stops the rest and waits for
    /// every task to end.
    async fn serve_until_shutdown(mut self) -> anyhow::Result<()> {
        self.tasks.spawn(service::watchdog(self.stop()));
        self.tasks.spawn(crate::alloc::trim(self.stop()));
        let result = first_to_stop(&mut self.tasks, &self.shutdown).await;
        service::stopping();
        self.shutdown.cancel();
        while self.tasks.join_next().await.is_some() {}
        result
    }

    fn stop(&self) -> CancellationToken {
        self.shutdown.clone()
    }
}

/// A task that must run until shutdown: its end before (a panic included) is an error that
/// stops the daemon.
async fn until_shutdown(
    name: &'static str,
    task: JoinHandle<()>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    task.await.map_err(|e| anyhow::anyhow!("{name} panicked: {e}"))?;
    anyhow::ensure!(shutdown.is_cancelled(), "{name} stopped unexpectedly");
    Ok(())
}

/// Waits for shutdown or for the first component to stop, whichever comes first.
async fn first_to_stop(
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
                changed = reader.changed() => if changed.is_err() {
                    return topology::input_closed("the per-master metric series", &shutdown);
                },
                _ = shutdown.cancelled() => return Ok(()),
            }
        }
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
