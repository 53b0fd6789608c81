//! `/v1/events` and its live form, `/v1/events/stream` (Server-Sent Events).
//!
//! A stream starts from `Last-Event-ID` (a reconnecting browser or client) or `?since=`, else
//! from now. It never skips an event it could still deliver: when the broadcast receiver lags,
//! it resyncs from the retained log, and ids already sent are never sent twice.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{self, KeepAlive, Sse};
use futures::{Stream, StreamExt};
use serde::Deserialize;
use tokio::sync::OwnedSemaphorePermit;
use tokio::sync::broadcast::{self, error::RecvError};

use super::params::{self, Params};
use super::{ApiError, Shared};
use crate::events::{Event, EventLog};

/// Often enough that proxies and NAT tables keep an idle stream open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

#[derive(Deserialize)]
pub struct SinceQuery {
    since: Option<String>,
}

/// `GET /v1/events?since=<id>`: the retained events after `since` (all without it).
pub async fn list(
    State(s): State<Arc<Shared>>,
    Params(query): Params<SinceQuery>,
) -> Result<Json<Vec<Event>>, ApiError> {
    let since = params::number("since", query.since.as_deref())?;
    Ok(Json(s.api.events.since(since)))
}

/// `GET /v1/events/stream`: `id:` is the event id, `event:` its kind, `data:` the JSON event.
pub async fn stream(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Params(query): Params<SinceQuery>,
) -> Result<Sse<impl Stream<Item = Result<sse::Event, Infallible>>>, ApiError> {
    let caller = super::auth::reader(&s, &headers)?;
    let since = resume_from(&headers, &query)?;
    let follower = Follower::start(&s.api.events, since, s.waiter(caller)?);
    let events = futures::stream::unfold(follower, Follower::next).map(|e| Ok(to_sse(&e)));
    let events = events.take_until(s.shutdown.clone().cancelled_owned());
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)))
}

/// `Last-Event-ID` wins over `?since=`: a reconnecting client repeats its original URL.
fn resume_from(headers: &HeaderMap, query: &SinceQuery) -> Result<Option<u64>, ApiError> {
    let Some(value) = headers.get("last-event-id") else {
        return params::number("since", query.since.as_deref());
    };
    let text = value.to_str().map_err(|_| ApiError::bad_request("Last-Event-ID: not text"))?;
    params::number("Last-Event-ID", Some(text))
}

fn to_sse(event: &Event) -> sse::Event {
    // An event is plain data (strings, numbers, a JSON map): it always serializes, and compact
    // JSON escapes the line breaks that `data()` refuses. Kinds are `&'static str` from code.
    let data = serde_json::to_string(event).unwrap_or_else(|_| "{}".to_owned());
    sse::Event::default().id(event.id.to_string()).event(event.kind).data(data)
}

/// One stream's position in the log.
struct Follower {
    log: Arc<EventLog>,
    /// Retained events still to send before the live ones.
    backlog: VecDeque<Event>,
    live: broadcast::Receiver<Event>,
    /// The newest id sent (or skipped as "before the stream started").
    last: Option<u64>,
    /// Counts this stream against the cap on open streams until it ends.
    _slot: OwnedSemaphorePermit,
}

impl Follower {
    fn start(log: &Arc<EventLog>, since: Option<u64>, slot: OwnedSemaphorePermit) -> Self {
        let (past, live) = log.follow(since);
        let (backlog, last) = match since {
            Some(_) => (past.into(), since),
            None => (VecDeque::new(), past.last().map(|e| e.id)),
        };
        Self { log: log.clone(), backlog, live, last, _slot: slot }
    }

    async fn next(mut self) -> Option<(Event, Self)> {
        loop {
            let event = match self.backlog.pop_front() {
                Some(event) => event,
                None => self.receive().await?,
            };
            if self.last.is_none_or(|last| event.id > last) {
                self.last = Some(event.id);
                return Some((event, self));
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
    use tokio::sync::Semaphore;

    use super::*;

    fn slot() -> OwnedSemaphorePermit {
        Arc::new(Semaphore::new(1)).try_acquire_owned().expect("a fresh semaphore has a permit")
    }

    #[tokio::test]
    async fn resumes_after_since_and_follows_live() {
        let log = Arc::new(EventLog::new());
        let first = log.push("ok", None, Value::Null);
        let second = log.push("stale", None, Value::Null);
        let follower = Follower::start(&log, Some(first), slot());
        let (event, follower) = follower.next().await.expect("the retained second event");
        assert_eq!(event.id, second);
        let third = log.push("ok", None, Value::Null);
        let (event, _) = follower.next().await.expect("the live third event");
        assert_eq!(event.id, third);
    }

    #[tokio::test]
    async fn without_since_starts_from_now() {
        let log = Arc::new(EventLog::new());
        log.push("ok", None, Value::Null);
        let follower = Follower::start(&log, None, slot());
        let later = log.push("stale", None, Value::Null);
        let (event, _) = follower.next().await.expect("the live event");
        assert_eq!(event.id, later);
    }

    #[tokio::test]
    async fn a_lagging_stream_resyncs_without_gaps_or_repeats() {
        let log = Arc::new(EventLog::new());
        let mut follower = Follower::start(&log, None, slot());
        let ids: Vec<u64> = (0..1100).map(|_| log.push("ok", None, Value::Null)).collect();
        let mut seen = Vec::new();
        while seen.len() < 1000 {
            let (event, next) = follower.next().await.expect("events are retained");
            seen.push(event.id);
            follower = next;
        }
        // The log retains the newest 1000: those arrive in order, once each.
        assert_eq!(seen, ids[100..]);
    }
}
