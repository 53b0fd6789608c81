//! Where the truth comes from: the Sentinels, or an upstream polestar (agent mode).
//!
//! Either way exactly one task writes the topology; this picks it, and the matching answer to
//! the API's planned-failover request, so that `daemon::run` does not branch on the source.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, Source};
use crate::control::{BoxFuture, Control, ControlError};
use crate::events::EventLog;
use crate::failover::Signal;
use crate::reload::ConfigReader;
use crate::sentinel::admin::SentinelControl;
use crate::topology::TopologyWriter;

/// Starts the topology's writer. Only the Sentinel side sends fence/drain signals: an agent
/// leaves that to the polestar it follows.
pub fn spawn(
    config: &Config,
    writer: TopologyWriter,
    events: Arc<EventLog>,
    drain: mpsc::UnboundedSender<Signal>,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    match &config.source {
        Source::Sentinels(_) => {
            crate::sentinel::spawn(config, writer, events, Some(drain), shutdown)
        }
        Source::Upstream(upstream) => {
            crate::agent::spawn(config, upstream, writer, events, shutdown)
        }
    }
}

/// What serves `POST .../failover`, from the running configuration (a reload that changes the
/// Sentinels applies to the next request): the Sentinels, or a refusal naming the upstream.
pub fn control(config: ConfigReader) -> Arc<dyn Control> {
    Arc::new(Current(config))
}

struct Current(ConfigReader);

impl Control for Current {
    fn failover<'a>(&'a self, master: &'a str) -> BoxFuture<'a, Result<String, ControlError>> {
        let source = self.0.borrow().source.clone();
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
