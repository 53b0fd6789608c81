//! Agent mode (`upstream:`): follow other polestars instead of the Sentinels.
//!
//! Thousands of application hosts each running a light polestar (for `sweep.remote`, or a local
//! DNS answer) must not each subscribe to the Sentinels. An agent follows every configured
//! upstream URL at once ([`Follower`], one task each) over its event stream, asking it to
//! carry the masters (`GET /v1/events/stream?masters=only`): every master at the start, then
//! what changed at each snapshot the upstream publishes, applied without a request of its own
//! ([`feed`]; 10,000 agents follow one polestar). It subscribes again every few minutes (the
//! full list then replaces what the changes built) and after every gap: a reconnect, with
//! backoff, forever. An upstream that predates that feed answers without it; the agent then
//! reads the full state (`GET /v1/masters`) at the start, on every event and every 5 s.
//! One merger (the single writer of the agent's topology) combines the latest answer of each
//! upstream: per master, a change of primary needs a majority of the configured upstreams
//! serving it (address and epoch), so one lying or lagging polestar moves nothing, and one
//! down of three costs nothing; the same majority decides which masters exist, their DNS
//! labels and their replicas ([`state::combine`]). While no majority confirms it, a master
//! keeps its primary, marked `stale`, so nothing is swept because of an outage.
//!
//! An agent may destroy sockets on its host (`sweep.remote`), so what it accepts is bounded:
//! the bearer token on every request, https verified against `upstream.ca_file`, no redirects,
//! a size limit on every answer, at most [`feed::MAX_MASTERS`] masters from one upstream,
//! and the guards of [`state::decide`] (no majority, an equal
//! epoch with another primary, a lower epoch that is no withdrawal, or a new primary that was
//! not a replica of the master, is refused; how high an epoch is refuses nothing, see there).

pub mod feed;
pub mod sse;
pub mod state;

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::config::{Config, Upstream};
use crate::events::{EventLog, Kind};
use crate::http::view::{MASTERS_HEADER, MasterView, MastersEvent};
use crate::topology::{Publisher, Snapshot};
use state::{Label, Labels};

/// The upstream sends a keep-alive every 15 s; three missed ones mean the stream is dead.
const IDLE_LIMIT: Duration = Duration::from_secs(45);
/// From an upstream without the masters feed: not every change has an event (a failover's
/// end, replica health), so the state is re-read this often anyway.
const RESYNC: Duration = Duration::from_secs(5);
/// From an upstream with the masters feed: subscribe again this often (plus up to a fifth, so
/// that agents started together spread out), and start again from its full list. The stream
/// carries every change; this is the backstop that repairs whatever a lost or misapplied
/// change could have left. (10,000 agents: 33 subscriptions a second.)
const RESUBSCRIBE: Duration = Duration::from_secs(300);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// For `GET /v1/masters`, which the upstream answers from memory.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// `GET /v1/masters` of a thousand masters with replicas is a few hundred kilobytes.
const MAX_BODY: usize = 4 << 20;
/// Answers from the followers waiting for the merger.
const QUEUE: usize = 64;

#[derive(Debug, thiserror::Error)]
enum UpstreamError {
    #[error("{0}")]
    Http(#[from] reqwest::Error),
    #[error(
        "{url}: 401 Unauthorized: the upstream refused this agent's token (upstream.token_file \
         must hold the upstream's http.agent_token_file)"
    )]
    Unauthorized { url: String },
    #[error("{url}: HTTP {status}")]
    Status { url: String, status: reqwest::StatusCode },
    #[error("{url}: the answer is larger than {MAX_BODY} bytes")]
    TooLarge { url: String },
    #[error("{url}: not a polestar answer: {error}")]
    Json { url: String, error: serde_json::Error },
    #[error("the event stream ended")]
    Ended,
    #[error("the event stream was silent for {0:?}")]
    Idle(Duration),
    #[error("the event stream sent no masters within {0:?} of its start")]
    NoMasters(Duration),
    #[error("{url}: the event stream does not carry the masters any more")]
    FeedGone { url: String },
    #[error(transparent)]
    Stream(#[from] sse::LineTooLong),
    #[error(transparent)]
    Refused(#[from] feed::Refused),
    #[error("{url}: {error}")]
    TooMuch { url: String, error: feed::TooMuch },
}

/// Which masters this agent follows: its configured ones, or every one the upstream has.
struct Followed(Option<Vec<crate::config::MasterConfig>>);

impl Labels for Followed {
    fn label(&self, master: &str) -> Label<'_> {
        match &self.0 {
            None => Label::Agreed,
            Some(list) => match list.iter().find(|m| m.name == master) {
                Some(m) => Label::Own(&m.label),
                None => Label::Unfollowed,
            },
        }
    }
}

/// What a follower tells the merger: upstream `index` answered `views` (`None`: it is down).
type Answer = (usize, Option<Vec<MasterView>>);

/// Follows every upstream until shutdown, publishing into `writer` (its only writer). An agent
/// that panics is started afresh, like the Sentinel decider: it publishes nothing new until a
/// majority of its upstreams answer again, but it is not left deaf.
pub fn spawn(
    config: &Config,
    upstream: &Upstream,
    writer: Publisher,
    events: Arc<EventLog>,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    let client = client(upstream);
    let urls: Vec<String> = upstream.urls.iter().map(|u| u.trim_end_matches('/').into()).collect();
    let masters = config.masters.clone();
    let stop = shutdown.clone();
    let start = move || {
        let merger = Merger {
            labels: Followed(masters.clone()),
            latest: vec![None; urls.len()],
            writer: writer.clone(),
            events: events.clone(),
            refused: HashSet::new(),
            lineage: state::Lineage::default(),
        };
        run(merger, urls.clone(), client.clone(), events.clone(), stop.clone())
    };
    tokio::spawn(crate::supervise::restarting("the agent", shutdown, start))
}

/// The HTTP client of every follower: the token on every request, https verified against
/// `ca_file` (or the system roots), redirects refused.
fn client(upstream: &Upstream) -> reqwest::Client {
    let mut headers = HeaderMap::new();
    if let Some(token) = &upstream.token {
        match HeaderValue::from_str(&format!("Bearer {}", token.expose())) {
            Ok(mut value) => {
                value.set_sensitive(true);
                headers.insert(AUTHORIZATION, value);
            }
            Err(_) => tracing::error!("upstream.token_file: the token is not a valid header value"),
        }
    }
    let builder = reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_keepalive(Duration::from_secs(5))
        .redirect(reqwest::redirect::Policy::none())
        .default_headers(headers);
    let builder = match crate::tls::https_client_config(upstream.ca_file.as_deref()) {
        Ok(tls) => builder.use_preconfigured_tls(tls),
        // Checked with the configuration; https upstreams fail to connect, and say why.
        Err(e) => {
            tracing::error!("upstream: no TLS configuration for https upstreams: {e}");
            builder
        }
    };
    // Fails only when the TLS backend cannot start; then every request fails and says so.
    builder.build().unwrap_or_default()
}

/// Starts a follower per URL (restarting one that panicked) and merges their answers.
async fn run(
    mut merger: Merger,
    urls: Vec<String>,
    client: reqwest::Client,
    events: Arc<EventLog>,
    shutdown: CancellationToken,
) {
    // The followers hold the senders; the merger ends with shutdown, not with them.
    let (tx, mut rx) = mpsc::channel::<Answer>(QUEUE);
    let stop = shutdown.clone();
    let (tasks, ids) = (JoinSet::new(), std::collections::HashMap::new());
    let mut followers = Followers { tasks, ids, urls, client, tx, events, shutdown: stop };
    for index in 0..followers.urls.len() {
        followers.start(index);
    }
    loop {
        tokio::select! {
            Some((index, views)) = rx.recv() => {
                // Every answer waiting is taken before one merge: an upstream that sends
                // changes faster than the merger merges costs merges, not a backlog.
                merger.take(index, views);
                while let Ok((index, views)) = rx.try_recv() {
                    merger.take(index, views);
                }
                merger.apply();
            }
            Some(done) = followers.tasks.join_next_with_id() => followers.restart(done),
            _ = shutdown.cancelled() => return,
        }
    }
}

/// One follower task per upstream, owned here and restarted when it stops before shutdown.
struct Followers {
    tasks: JoinSet<usize>,
    /// Which upstream each task follows, to restart the one that stopped.
    ids: std::collections::HashMap<tokio::task::Id, usize>,
    urls: Vec<String>,
    client: reqwest::Client,
    /// To the merger; every follower holds a clone.
    tx: mpsc::Sender<Answer>,
    events: Arc<EventLog>,
    shutdown: CancellationToken,
}

impl Followers {
    fn start(&mut self, index: usize) {
        let follower = Follower {
            index,
            url: self.urls[index].clone(),
            client: self.client.clone(),
            tx: self.tx.clone(),
            events: self.events.clone(),
            shutdown: self.shutdown.clone(),
        };
        let task = self.tasks.spawn(async move {
            follower.run().await;
            index
        });
        self.ids.insert(task.id(), index);
    }

    /// A follower's task ended (it panicked, or shutdown stopped it): started again, unless
    /// shutting down.
    fn restart(&mut self, done: Result<(tokio::task::Id, usize), tokio::task::JoinError>) {
        let id = match &done {
            Ok((id, _)) => *id,
            Err(e) => e.id(),
        };
        let Some(index) = self.ids.remove(&id) else { return };
        if self.shutdown.is_cancelled() {
            return;
        }
        tracing::error!(upstream = %self.urls[index], "the upstream follower stopped; restarting it");
        self.start(index);
    }
}

/// The single writer of an agent's topology.
struct Merger {
    labels: Followed,
    /// The last answer of each upstream (`None`: down).
    latest: Vec<Option<Vec<MasterView>>>,
    writer: Publisher,
    events: Arc<EventLog>,
    /// Refusals logged already, so that a fake upstream repeating one does not flood the log.
    refused: HashSet<String>,
    /// Every node published as a primary or replica of each master: a new primary must be one.
    lineage: state::Lineage,
}

impl Merger {
    /// Keeps upstream `index`'s latest answer (`None`: it is down) for the next [`Self::apply`].
    fn take(&mut self, index: usize, views: Option<Vec<MasterView>>) {
        if let Some(slot) = self.latest.get_mut(index) {
            *slot = views;
        }
    }

    /// Merges the latest answer of every upstream and publishes the result.
    fn apply(&mut self) {
        let current = self.writer.reader().borrow().clone();
        let up: Vec<Option<&[MasterView]>> = self.latest.iter().map(|v| v.as_deref()).collect();
        // An upstream with no masters at all is still loading, as good as down here.
        let next = if up.iter().all(|u| u.is_none_or(<[MasterView]>::is_empty)) {
            state::stale(&current)
        } else {
            let (views, refused) = state::combine(&current, &up, &self.lineage, &self.labels);
            self.log_refused(refused);
            state::merge(&current, &views)
        };
        self.record_switches(&current, &next);
        self.lineage.record(&next, std::time::Instant::now());
        self.publish(next);
    }

    fn log_refused(&mut self, refused: Vec<String>) {
        if self.refused.len() > 1000 {
            self.refused.clear();
        }
        for reason in refused {
            if self.refused.insert(reason.clone()) {
                tracing::warn!("upstream answer refused: {reason}");
            }
        }
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
            self.events.push(Kind::Switch, Some(&change.master), data);
        }
    }
}

/// Follows one upstream URL until shutdown, sending each full state it reads to the merger.
struct Follower {
    index: usize,
    url: String,
    client: reqwest::Client,
    /// To the merger, which outlives every follower.
    tx: mpsc::Sender<Answer>,
    events: Arc<EventLog>,
    shutdown: CancellationToken,
}

impl Follower {
    async fn run(self) {
        let mut backoff = BACKOFF_FIRST;
        let mut was_up = None;
        while !self.shutdown.is_cancelled() {
            let error = tokio::select! {
                e = self.session(&mut backoff, &mut was_up) => e,
                _ = self.shutdown.cancelled() => return,
            };
            // For `/readyz`, which lists why no source answers.
            crate::reach::record(&self.url, Some(&error));
            if was_up != Some(false) {
                if matches!(error, UpstreamError::Unauthorized { .. }) {
                    tracing::error!(upstream = %self.url, "upstream refused this agent: {error}");
                } else {
                    tracing::warn!(upstream = %self.url, "upstream unreachable: {error}");
                }
                self.events.push(
                    Kind::UpstreamDown,
                    None,
                    json!({"upstream": self.url, "error": error.to_string()}),
                );
                was_up = Some(false);
            }
            if self.tx.send((self.index, None)).await.is_err() {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = self.shutdown.cancelled() => return,
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// One connection: subscribe first (so no change falls between), then follow the masters
    /// the stream carries, or (from an upstream without that feed) read the full state and
    /// read it again on every event. Returns why it ended.
    async fn session(&self, backoff: &mut Duration, was_up: &mut Option<bool>) -> UpstreamError {
        let stream = match self.subscribe().await {
            Ok(s) => s,
            Err(e) => return e,
        };
        let following = if stream.headers().contains_key(MASTERS_HEADER) {
            match self.first_masters(stream).await {
                Ok((masters, served)) => Following::Feed(masters, served),
                Err(e) => return e,
            }
        } else {
            if let Err(e) = self.refresh().await {
                return e;
            }
            Following::Reread(stream)
        };
        crate::reach::record(&self.url, None::<&UpstreamError>);
        if *was_up != Some(true) {
            let changes = match following {
                Following::Feed(..) => "from the event stream",
                Following::Reread(_) => "read again on every event (the upstream has no feed)",
            };
            tracing::info!(upstream = %self.url, changes, "following upstream polestar");
            self.events.push(Kind::UpstreamUp, None, json!({"upstream": self.url}));
            *was_up = Some(true);
        }
        *backoff = BACKOFF_FIRST;
        match following {
            Following::Feed(masters, served) => self.follow_masters(masters, served).await,
            Following::Reread(stream) => self.follow(stream).await,
        }
    }

    async fn subscribe(&self) -> Result<reqwest::Response, UpstreamError> {
        let url = format!("{}/v1/events/stream?masters=only", self.url);
        let response = self.client.get(&url).send().await?;
        check(&url, response)
    }

    /// Reads the stream's first `masters` event (every master) and hands it to the merger.
    async fn first_masters(
        &self,
        response: reqwest::Response,
    ) -> Result<(Masters, feed::Served), UpstreamError> {
        let mut masters = Masters::new(&self.url, response);
        let first = tokio::time::timeout(READ_TIMEOUT, masters.next())
            .await
            .map_err(|_| UpstreamError::NoMasters(READ_TIMEOUT))??;
        let mut served = feed::Served::default();
        // A change first is a gap: the stream must start with every master.
        served.apply(first)?;
        self.send(served.views()).await;
        Ok((masters, served))
    }

    /// Applies every change the stream carries; every [`RESUBSCRIBE`] starts again from a new
    /// subscription's full list (the current stream is kept if that fails).
    async fn follow_masters(
        &self,
        mut masters: Masters,
        mut served: feed::Served,
    ) -> UpstreamError {
        let mut renew = tokio::time::Instant::now() + spread(RESUBSCRIBE);
        loop {
            let event = match tokio::time::timeout_at(renew, masters.next()).await {
                Ok(Ok(event)) => event,
                Ok(Err(e)) => return e,
                Err(_) => {
                    renew = tokio::time::Instant::now() + spread(RESUBSCRIBE);
                    match self.resubscribe().await {
                        Ok((again, full)) => (masters, served) = (again, full),
                        Err(e) => tracing::warn!(
                            upstream = %self.url,
                            "subscribing again failed, following the current stream: {e}"
                        ),
                    }
                    continue;
                }
            };
            if let Err(e) = served.apply(event) {
                return e.into();
            }
            self.send(served.views()).await;
        }
    }

    async fn resubscribe(&self) -> Result<(Masters, feed::Served), UpstreamError> {
        let response = self.subscribe().await?;
        if !response.headers().contains_key(MASTERS_HEADER) {
            return Err(UpstreamError::FeedGone { url: self.url.clone() });
        }
        self.first_masters(response).await
    }

    /// From an upstream without the feed: reads the full state again after every chunk that
    /// holds an event, and after [`RESYNC`] without one.
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

    /// Reads the full state and hands it to the merger.
    async fn refresh(&self) -> Result<(), UpstreamError> {
        let url = format!("{}/v1/masters", self.url);
        let response = self.client.get(&url).timeout(READ_TIMEOUT).send().await?;
        let body = read_limited(&url, check(&url, response)?).await?;
        let views: Vec<MasterView> = serde_json::from_slice(&body)
            .map_err(|error| UpstreamError::Json { url: url.clone(), error })?;
        feed::bounded(&views)
            .map_err(|error| UpstreamError::TooMuch { url: url.clone(), error })?;
        self.send(views).await;
        Ok(())
    }

    /// Hands what the upstream serves now to the merger.
    async fn send(&self, views: Vec<MasterView>) {
        // The merger is gone only at shutdown.
        let _ = self.tx.send((self.index, Some(views))).await;
    }
}

/// How a session follows its upstream.
#[allow(clippy::large_enum_variant)] // one per session
enum Following {
    /// The stream carries the masters: what it has told so far.
    Feed(Masters, feed::Served),
    /// An upstream without the feed: its event stream, a signal to read the state again.
    Reread(reqwest::Response),
}

/// An event stream that carries the masters, read event by event.
struct Masters {
    url: String,
    response: reqwest::Response,
    reader: sse::Reader,
    /// Items read from the stream and not taken yet.
    pending: VecDeque<sse::Item>,
}

impl Masters {
    fn new(url: &str, response: reqwest::Response) -> Self {
        let url = format!("{url}/v1/events/stream");
        Self { url, response, reader: sse::Reader::default(), pending: VecDeque::new() }
    }

    /// The next `masters` event (keep-alives and other events are skipped); an error when the
    /// stream ends, breaks, sends what is not a polestar's, or is silent for [`IDLE_LIMIT`].
    /// Cancel-safe: an item is taken from the stream only when it is returned.
    async fn next(&mut self) -> Result<MastersEvent, UpstreamError> {
        loop {
            while let Some(item) = self.pending.pop_front() {
                if let sse::Item::Event { kind, data, .. } = item
                    && kind == crate::events::MASTERS
                {
                    return serde_json::from_str(&data)
                        .map_err(|error| UpstreamError::Json { url: self.url.clone(), error });
                }
            }
            let chunk = match tokio::time::timeout(IDLE_LIMIT, self.response.chunk()).await {
                Err(_) => return Err(UpstreamError::Idle(IDLE_LIMIT)),
                Ok(Err(e)) => return Err(e.into()),
                Ok(Ok(None)) => return Err(UpstreamError::Ended),
                Ok(Ok(Some(chunk))) => chunk,
            };
            self.pending.extend(self.reader.feed(&chunk)?);
        }
    }
}

/// `period` plus up to a fifth more, so that agents started together do not come back together.
fn spread(period: Duration) -> Duration {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    let nanos = now.unwrap_or_default().subsec_nanos();
    period + period.mul_f64(f64::from(nanos % 1000) / 5000.0)
}

/// The body, refused past [`MAX_BODY`] (a declared length is refused before reading).
async fn read_limited(
    url: &str,
    mut response: reqwest::Response,
) -> Result<Vec<u8>, UpstreamError> {
    let too_large = || UpstreamError::TooLarge { url: url.to_string() };
    if response.content_length().is_some_and(|n| n > MAX_BODY as u64) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn check(url: &str, response: reqwest::Response) -> Result<reqwest::Response, UpstreamError> {
    let status = response.status();
    if status.is_success() {
        Ok(response)
    } else if status == reqwest::StatusCode::UNAUTHORIZED {
        Err(UpstreamError::Unauthorized { url: url.to_string() })
    } else {
        Err(UpstreamError::Status { url: url.to_string(), status })
    }
}
