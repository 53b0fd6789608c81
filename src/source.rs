//! Where the truth comes from: the Sentinels, or an upstream polestar (agent mode).
//!
//! Either way exactly one task writes the topology; this picks it, and the matching answer to
//! the API's planned-failover request, so that `daemon::run` does not branch on the source.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, Source};
use crate::control::{
    BoxFuture, Control, ControlError, HandedOff, Switched, SwitchoverError, SwitchoverOptions,
};
use crate::drain::DrainHandle;
use crate::events::EventLog;
use crate::failover::Signal;
use crate::reload::ConfigReader;
use crate::sentinel::admin::SentinelControl;
use crate::switchover::{Deps, Maintenance};
use crate::topology::{Publisher, TopologyReader};

/// Starts the topology's writer. Only the Sentinel side sends fence/drain signals: an agent
/// leaves that to the polestar it follows; nor does it leave records for the readiness poll.
pub fn spawn(
    config: &Config,
    writer: Publisher,
    events: Arc<EventLog>,
    drain: mpsc::UnboundedSender<Signal>,
    heard: crate::readiness::Heard,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    match &config.source {
        Source::Sentinels(_) => {
            crate::sentinel::spawn(config, writer, events, Some(drain), Some(heard), shutdown)
        }
        Source::Upstream(upstream) => {
            crate::agent::spawn(config, upstream, writer, events, shutdown)
        }
    }
}

/// What serves `POST .../failover`, from the running configuration (a reload that changes the
/// Sentinels applies to the next request): the Sentinels, or a refusal naming the upstream.
pub fn control(config: ConfigReader) -> Arc<dyn Control> {
    Arc::new(Current { config, maintenance: None })
}

/// The same, with the lossless switchover and the node handoff of [`crate::switchover`]:
/// `topology` is the published (masked) view, `raw` the writer's own.
pub fn maintenance_control(
    config: ConfigReader,
    maintenance: Arc<Maintenance>,
    views: (TopologyReader, TopologyReader),
    events: Arc<EventLog>,
    drain: Option<DrainHandle>,
) -> Arc<dyn Control> {
    let (topology, raw) = views;
    let with = With { maintenance, topology, raw, events, drain };
    Arc::new(Current { config, maintenance: Some(with) })
}

struct Current {
    config: ConfigReader,
    maintenance: Option<With>,
}

/// What a switchover or a handoff needs besides the configuration.
struct With {
    maintenance: Arc<Maintenance>,
    topology: TopologyReader,
    raw: TopologyReader,
    events: Arc<EventLog>,
    drain: Option<DrainHandle>,
}

impl Current {
    /// The switchover's dependencies from the running configuration, or why there are none.
    fn deps(&self) -> Result<(&Arc<Maintenance>, Deps), SwitchoverError> {
        let Some(with) = &self.maintenance else {
            return Err(SwitchoverError::Unsupported("switchovers are not available".into()));
        };
        let config = self.config.borrow().clone();
        let sentinels = match &config.source {
            Source::Sentinels(s) => s.clone(),
            Source::Upstream(u) => {
                return Err(ControlError::Unreachable(format!(
                    "this polestar follows {}: ask it for a switchover or a handoff",
                    u.urls.join(", ")
                ))
                .into());
            }
        };
        let deps = Deps {
            sentinels,
            nodes: config.nodes.clone(),
            interval: config.drain.interval,
            topology: with.topology.clone(),
            raw: with.raw.clone(),
            events: with.events.clone(),
            drain: with.drain.clone(),
            max_lag: config.readiness.max_lag,
        };
        Ok((&with.maintenance, deps))
    }
}

impl Control for Current {
    fn switchover<'a>(
        &'a self,
        master: &'a str,
        options: SwitchoverOptions,
    ) -> BoxFuture<'a, Result<Switched, SwitchoverError>> {
        Box::pin(async move {
            let (maintenance, deps) = self.deps()?;
            maintenance.switchover(&deps, master, options).await
        })
    }

    fn handoff<'a>(
        &'a self,
        node: SocketAddr,
        master: Option<&'a str>,
        options: SwitchoverOptions,
        wait: Duration,
    ) -> BoxFuture<'a, Result<HandedOff, SwitchoverError>> {
        Box::pin(async move {
            let (maintenance, deps) = self.deps()?;
            maintenance.handoff(&deps, node, master, options, wait).await
        })
    }

    fn failover<'a>(&'a self, master: &'a str) -> BoxFuture<'a, Result<String, ControlError>> {
        let source = self.config.borrow().source.clone();
        Box::pin(async move {
            match source {
                Source::Sentinels(s) => SentinelControl::new(&s).failover(master).await,
                // An agent has no Sentinels to ask: planned failovers go to the upstream.
                Source::Upstream(u) => Err(ControlError::Unreachable(format!(
                    "this polestar follows {}: ask it for a failover",
                    u.urls.join(", ")
                ))),
            }
        })
    }
}
