//! `/v1/events` and its live form, `/v1/events/stream` (Server-Sent Events).
//!
//! A stream starts from `Last-Event-ID` (a reconnecting browser or client) or `?since=`, else
//! from now. It never skips an event it could still deliver: when the broadcast receiver lags,
//! it resyncs from the retained log, and ids already sent are never sent twice.
//!
//! With `?masters=only` (what agents ask for) or `?masters=also`, the stream carries the
//! masters themselves ([`super::feed`]): every master at the start, then what changed at each
//! published snapshot, so a follower needs no `GET /v1/masters` per change. The answer then has
//! the header `polestar-masters: 1`; a polestar without the feed ignores the parameter and
//! answers without the header, which is how an agent knows to re-read instead.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;
use tokio::sync::OwnedSemaphorePermit;
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::time::{Instant, Sleep};

use super::params::{self, Params};
use super::view::MASTERS_HEADER;
use super::{ApiError, Shared};
use crate::events::{Event, EventLog};
use crate::topology::{Snapshot, TopologyReader};

/// Often enough that proxies and NAT tables keep an idle stream open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// An SSE comment: the keep-alive.
const KEEP_ALIVE_FRAME: &[u8] = b":\n\n";

#[derive(Deserialize)]
pub struct SinceQuery {
    since: Option<String>,
}

#[derive(Deserialize)]
pub struct StreamQuery {
    since: Option<String>,
    masters: Option<String>,
}

/// What a stream carries besides keep-alives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Carries {
    Events,
    /// `?masters=only`: the masters, no other events (an agent needs nothing else).
    Masters,
    /// `?masters=also`.
    Both,
}

impl Carries {
    fn parse(value: Option<&str>) -> Result<Self, ApiError> {
        match value {
            None => Ok(Self::Events),
            Some("only") => Ok(Self::Masters),
            Some("also") => Ok(Self::Both),
            Some(other) => Err(ApiError::bad_request(format!(
                "masters: {other:?} is neither \"only\" nor \"also\""
            ))),
        }
    }
}

/// `GET /v1/events?since=<id>`: the retained events after `since` (all without it).
pub async fn list(
    State(s): State<Arc<Shared>>,
    Params(query): Params<SinceQuery>,
) -> Result<Json<Vec<Event>>, ApiError> {
    let since = params::number("since", query.since.as_deref())?;
    Ok(Json(s.api.events.since(since)))
}

/// `GET /v1/events/stream`: `id:` is the event id, `event:` its kind, `data:` the JSON event;
/// with `?masters=`, also (or only) `masters` events without an id.
pub async fn stream(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Params(query): Params<StreamQuery>,
) -> Result<Response, ApiError> {
    let caller = super::auth::reader(&s, &headers)?;
    let since = resume_from(&headers, query.since.as_deref())?;
    let carries = Carries::parse(query.masters.as_deref())?;
    let slot = s.waiter(caller)?;
    let events = (carries != Carries::Masters).then(|| Follower::start(&s.api.events, since));
    let masters = (carries != Carries::Events).then(|| Feed::new(s.clone()));
    let stream = Stream::new(events, masters, slot);
    let frames = futures::stream::unfold(stream, |mut stream| async move {
        let frame = stream.next().await?;
        Some((Ok::<_, Infallible>(frame), stream))
    });
    let frames = frames.take_until(s.shutdown.clone().cancelled_owned());
    let mut response = Body::from_stream(frames).into_response();
    let head = response.headers_mut();
    head.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    head.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if carries != Carries::Events {
        head.insert(MASTERS_HEADER, HeaderValue::from_static("1"));
    }
    Ok(response)
}

/// `Last-Event-ID` wins over `?since=`: a reconnecting client repeats its original URL.
fn resume_from(headers: &HeaderMap, since: Option<&str>) -> Result<Option<u64>, ApiError> {
    let Some(value) = headers.get("last-event-id") else {
        return params::number("since", since);
    };
    let text = value.to_str().map_err(|_| ApiError::bad_request("Last-Event-ID: not text"))?;
    params::number("Last-Event-ID", Some(text))
}

/// The event as the stream sends it (the bytes axum's `Sse` wrote for it before).
fn to_frame(event: &Event) -> Bytes {
    // An event is plain data (strings, numbers, a JSON map): it always serializes, and compact
    // JSON escapes line breaks, so `data` is one line. Kinds are `&'static str` from code.
    let data = serde_json::to_string(event).unwrap_or_else(|_| "{}".to_owned());
    Bytes::from(format!("id: {}\nevent: {}\ndata: {data}\n\n", event.id, event.kind))
}

/// One open stream: what it follows, and when it must send a keep-alive.
struct Stream {
    events: Option<Follower>,
    masters: Option<Feed>,
    /// Fires when a keep-alive may be due. It is moved on only when it fires (to
    /// [`KEEP_ALIVE`] after the last frame), so that sending a frame costs no timer update:
    /// 10,000 streams send one each at a failover.
    keep_alive: Pin<Box<Sleep>>,
    /// When the stream last sent something.
    sent_at: Instant,
    /// Counts this stream against its caller's pool of open streams until it ends.
    _slot: OwnedSemaphorePermit,
}

impl Stream {
    fn new(events: Option<Follower>, masters: Option<Feed>, slot: OwnedSemaphorePermit) -> Self {
        let sent_at = Instant::now();
        let keep_alive = Box::pin(tokio::time::sleep_until(sent_at + KEEP_ALIVE));
        Self { events, masters, keep_alive, sent_at, _slot: slot }
    }

    /// The next bytes to send; `None` ends the stream (the daemon is stopping).
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            let Self { events, masters, keep_alive, sent_at, .. } = self;
            let masters = async {
                match masters {
                    Some(feed) => feed.next().await,
                    None => std::future::pending().await,
                }
            };
            let events = async {
                match events {
                    Some(follower) => follower.next().await.map(|e| to_frame(&e)),
                    None => std::future::pending().await,
                }
            };
            let frame = tokio::select! {
                biased;
                frame = masters => frame?,
                frame = events => frame?,
                () = keep_alive.as_mut() => {
                    let due = *sent_at + KEEP_ALIVE;
                    if Instant::now() < due {
                        keep_alive.as_mut().reset(due);
                        continue;
                    }
                    keep_alive.as_mut().reset(Instant::now() + KEEP_ALIVE);
                    Bytes::from_static(KEEP_ALIVE_FRAME)
                }
            };
            *sent_at = Instant::now();
            return Some(frame);
        }
    }
}

/// One stream's place in the masters feed.
struct Feed {
    shared: Arc<Shared>,
    topology: TopologyReader,
    /// The snapshot whose masters the stream sent last (`None`: none yet).
    sent: Option<Arc<Snapshot>>,
}

impl Feed {
    fn new(shared: Arc<Shared>) -> Self {
        let topology = shared.api.topology.clone();
        Self { shared, topology, sent: None }
    }

    /// Every master at first, then each change that touches a master (a snapshot that changed
    /// only whether a Sentinel is reachable sends nothing). `None` once the topology's writer
    /// is gone (the daemon is stopping).
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            if self.sent.is_some() {
                self.topology.changed().await.ok()?;
            }
            let now = self.topology.borrow_and_update().clone();
            let frame = match &self.sent {
                None => Some(self.shared.frames.full(&now)),
                Some(sent) if Arc::ptr_eq(sent, &now) => None,
                Some(sent) => self.shared.frames.change(sent, &now),
            };
            if let Some(frame) = frame {
                self.sent = Some(now);
                return Some(frame);
            }
        }
    }
}

/// One stream's position in the log.
struct Follower {
    log: Arc<EventLog>,
    /// Retained events still to send before the live ones.
    backlog: VecDeque<Event>,
    live: broadcast::Receiver<Event>,
    /// The newest id sent (or skipped as "before the stream started").
    last: Option<u64>,
}

impl Follower {
    fn start(log: &Arc<EventLog>, since: Option<u64>) -> Self {
        let (past, live) = log.follow(since);
        let (backlog, last) = match since {
            Some(_) => (past.into(), since),
            None => (VecDeque::new(), past.last().map(|e| e.id)),
        };
        Self { log: log.clone(), backlog, live, last }
    }

    /// The next event not sent yet (cancel-safe: an event is taken only when returned).
    async fn next(&mut self) -> Option<Event> {
        loop {
            let event = match self.backlog.pop_front() {
                Some(event) => event,
                None => self.receive().await?,
            };
            if self.last.is_none_or(|last| event.id > last) {
                self.last = Some(event.id);
                return Some(event);
            }
        }
    }

    /// The next live event; after a lag, refills the backlog from the retained log.
    async fn receive(&mut self) -> Option<Event> {
        loop {
            match self.live.recv().await {
                Ok(event) => return Some(event),
                Err(RecvError::Closed) => return None,
                Err(RecvError::Lagged(missed)) => {
                    tracing::debug!(missed, "event stream lagged; resyncing from the log");
                    self.backlog = self.log.since(self.last).into();
                    if let Some(event) = self.backlog.pop_front() {
                        return Some(event);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::events::Kind;

    fn slot() -> OwnedSemaphorePermit {
        let pool = Arc::new(tokio::sync::Semaphore::new(1));
        pool.try_acquire_owned().expect("a fresh semaphore has a permit")
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_stream_sends_a_keep_alive_fifteen_seconds_after_its_last_frame() {
        let log = Arc::new(EventLog::new());
        let mut stream = Stream::new(Some(Follower::start(&log, None)), None, slot());
        let started = Instant::now();
        assert_eq!(stream.next().await.as_deref(), Some(KEEP_ALIVE_FRAME));
        assert_eq!(started.elapsed(), KEEP_ALIVE);
        tokio::time::sleep(Duration::from_secs(5)).await;
        let id = log.push(Kind::Ok, None, Value::Null);
        let event = stream.next().await.expect("the event");
        assert!(event.starts_with(format!("id: {id}\nevent: ok\ndata: ").as_bytes()));
        let sent = Instant::now();
        assert_eq!(stream.next().await.as_deref(), Some(KEEP_ALIVE_FRAME));
        assert_eq!(sent.elapsed(), KEEP_ALIVE, "counted from the event, not the keep-alive");
    }

    #[tokio::test]
    async fn resumes_after_since_and_follows_live() {
        let log = Arc::new(EventLog::new());
        let first = log.push(Kind::Ok, None, Value::Null);
        let second = log.push(Kind::Stale, None, Value::Null);
        let mut follower = Follower::start(&log, Some(first));
        let event = follower.next().await.expect("the retained second event");
        assert_eq!(event.id, second);
        let third = log.push(Kind::Ok, None, Value::Null);
        let event = follower.next().await.expect("the live third event");
        assert_eq!(event.id, third);
    }

    #[tokio::test]
    async fn without_since_starts_from_now() {
        let log = Arc::new(EventLog::new());
        log.push(Kind::Ok, None, Value::Null);
        let mut follower = Follower::start(&log, None);
        let later = log.push(Kind::Stale, None, Value::Null);
        let event = follower.next().await.expect("the live event");
        assert_eq!(event.id, later);
    }

    #[tokio::test]
    async fn a_lagging_stream_resyncs_without_gaps_or_repeats() {
        let log = Arc::new(EventLog::new());
        let mut follower = Follower::start(&log, None);
        let ids: Vec<u64> = (0..1100).map(|_| log.push(Kind::Ok, None, Value::Null)).collect();
        let mut seen = Vec::new();
        while seen.len() < 1000 {
            let event = follower.next().await.expect("events are retained");
            seen.push(event.id);
        }
        // The log retains the newest 1000: those arrive in order, once each.
        assert_eq!(seen, ids[100..]);
    }
}
