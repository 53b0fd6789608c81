//! Agent mode (`upstream: http://host:port`): follow another polestar instead of the Sentinels.
//!
//! Thousands of application hosts each running a light polestar (for `sweep.remote`, or a local
//! DNS answer) must not each subscribe to the Sentinels. An agent reads the upstream's full
//! state (`GET /v1/masters`), then follows its event stream (`GET /v1/events/stream`) and reads
//! the full state again on every event, and after every gap: a reconnect, with backoff,
//! forever. It is the single writer of its own topology, so sweep, DNS and HTTP work on it
//! exactly as on a polestar that watches Sentinels. While the upstream is unreachable every
//! master is `stale` and keeps its primary, so nothing is swept because of the outage.

mod sse;
pub mod state;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::events::EventLog;
use crate::http::view::MasterView;
use crate::topology::{Snapshot, TopologyWriter};
use state::Labels;

/// The upstream sends a keep-alive every 15 s; three missed ones mean the stream is dead.
const IDLE_LIMIT: Duration = Duration::from_secs(45);
/// Not every change has an event (a failover's end, replica health): re-read this often anyway.
const RESYNC: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// For `GET /v1/masters`, which the upstream answers from memory.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
enum UpstreamError {
    #[error("{0}")]
    Http(#[from] reqwest::Error),
    #[error("{url}: HTTP {status}")]
    Status { url: String, status: reqwest::StatusCode },
    #[error("the event stream ended")]
    Ended,
    #[error("the event stream was silent for {0:?}")]
    Idle(Duration),
    #[error(transparent)]
    Stream(#[from] sse::LineTooLong),
}

/// Which masters this agent follows: its configured ones, or every one the upstream has.
struct Followed(Option<Vec<crate::config::MasterConfig>>);

impl Labels for Followed {
    fn label(&self, master: &str, upstream_label: &str) -> Option<String> {
        match &self.0 {
            None => Some(upstream_label.to_string()),
            Some(list) => list.iter().find(|m| m.name == master).map(|m| m.label.clone()),
        }
    }
}

/// Follows `url` until shutdown, publishing into `writer` (its only writer).
struct Agent {
    url: String,
    client: reqwest::Client,
    labels: Followed,
    writer: crate::topology::Publisher,
    events: Arc<EventLog>,
    shutdown: CancellationToken,
}

pub fn spawn(
    config: &Config,
    url: &str,
    writer: TopologyWriter,
    events: Arc<EventLog>,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    let client = reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_keepalive(Duration::from_secs(5))
        .build()
        // Only fails when the TLS backend cannot start, and this build has no TLS backend.
        .unwrap_or_default();
    let url = url.trim_end_matches('/').to_string();
    let labels = Followed(config.masters.clone());
    let writer = crate::topology::Publisher::new(writer);
    let agent = Agent { url, client, labels, writer, events, shutdown };
    tokio::spawn(agent.run())
}

impl Agent {
    async fn run(self) {
        let mut backoff = BACKOFF_FIRST;
        let mut was_up = None;
        while !self.shutdown.is_cancelled() {
            let error = tokio::select! {
                e = self.session(&mut backoff, &mut was_up) => e,
                _ = self.shutdown.cancelled() => return,
            };
            if was_up != Some(false) {
                tracing::warn!(upstream = %self.url, "upstream unreachable, masters stale: {error}");
                self.events.push(
                    "upstream_down",
                    None,
                    json!({"upstream": self.url, "error": error.to_string()}),
                );
                was_up = Some(false);
            }
            self.publish(state::stale(&self.current()));
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = self.shutdown.cancelled() => return,
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// One connection: subscribe first (so no event falls between), read the full state, then
    /// re-read it on every event. Returns why it ended.
    async fn session(&self, backoff: &mut Duration, was_up: &mut Option<bool>) -> UpstreamError {
        let stream = match self.subscribe().await {
            Ok(s) => s,
            Err(e) => return e,
        };
        if let Err(e) = self.refresh().await {
            return e;
        }
        if *was_up != Some(true) {
            tracing::info!(upstream = %self.url, "following upstream polestar");
            self.events.push("upstream_up", None, json!({"upstream": self.url}));
            *was_up = Some(true);
        }
        *backoff = BACKOFF_FIRST;
        self.follow(stream).await
    }

    async fn subscribe(&self) -> Result<reqwest::Response, UpstreamError> {
        let url = format!("{}/v1/events/stream", self.url);
        let response = self.client.get(&url).send().await?;
        check(&url, response)
    }

    async fn follow(&self, mut stream: reqwest::Response) -> UpstreamError {
        let mut reader = sse::Reader::default();
        let mut idle = Duration::ZERO;
        loop {
            let chunk = match tokio::time::timeout(RESYNC, stream.chunk()).await {
                Err(_) if idle + RESYNC >= IDLE_LIMIT => return UpstreamError::Idle(IDLE_LIMIT),
                Err(_) => {
                    idle += RESYNC;
                    match self.refresh().await {
                        Ok(()) => continue,
                        Err(e) => return e,
                    }
                }
                Ok(Err(e)) => return e.into(),
                Ok(Ok(None)) => return UpstreamError::Ended,
                Ok(Ok(Some(chunk))) => chunk,
            };
            idle = Duration::ZERO;
            let items = match reader.feed(&chunk) {
                Ok(items) => items,
                Err(e) => return e.into(),
            };
            let events = items.iter().filter(|i| matches!(i, sse::Item::Event { .. })).count();
            if events > 0
                && let Err(e) = self.refresh().await
            {
                return e;
            }
        }
    }

    /// Reads the full state and publishes it.
    async fn refresh(&self) -> Result<(), UpstreamError> {
        let url = format!("{}/v1/masters", self.url);
        let response = self.client.get(&url).timeout(READ_TIMEOUT).send().await?;
        let views: Vec<MasterView> = check(&url, response)?.json().await?;
        let current = self.current();
        let next = state::merge(&current, &views, &self.labels);
        self.record_switches(&current, &next);
        self.publish(next);
        Ok(())
    }

    fn current(&self) -> Arc<Snapshot> {
        self.writer.reader().borrow().clone()
    }

    /// Publishes `next` unless nothing but the version changed (the publisher numbers it).
    fn publish(&self, next: Snapshot) {
        self.writer.replace(next);
    }

    /// The agent's own `switch` events, so its HTTP stream (and agents behind it) see them.
    fn record_switches(&self, current: &Snapshot, next: &Snapshot) {
        for change in crate::sweep::plan::changes(current, next) {
            let epoch = next.master(&change.master).and_then(|m| m.epoch);
            tracing::info!(master = %change.master, from = %change.from, to = %change.to, epoch, via = "upstream", "switch");
            let labels = [("master", change.master.clone())];
            metrics::counter!(crate::metrics::PRIMARY_CHANGES, &labels).increment(1);
            let data = json!({
                "from": change.from.to_string(), "to": change.to.to_string(),
                "hostname": change.to.hostname, "epoch": epoch, "via": "upstream",
            });
            self.events.push("switch", Some(&change.master), data);
        }
    }
}

fn check(url: &str, response: reqwest::Response) -> Result<reqwest::Response, UpstreamError> {
    let status = response.status();
    if status.is_success() {
        Ok(response)
    } else {
        Err(UpstreamError::Status { url: url.to_string(), status })
    }
}
