//! The event log: every switch, fence, drain, sweep and Sentinel up/down, with increasing ids.
//!
//! Writers push; `/v1/events` reads the retained tail and `/v1/events/stream` follows the
//! broadcast. Ids start above the current Unix time in milliseconds so that they keep growing
//! across restarts and a client resuming with `?since=` never sees an old id again.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::{Map, Value};
use tokio::sync::broadcast;

/// How many events `/v1/events` can return.
const RETAINED: usize = 1000;

#[derive(Clone, Debug, Serialize)]
pub struct Event {
    pub id: u64,
    /// Milliseconds since the Unix epoch.
    pub time_ms: u64,
    /// e.g. `switch`, `sentinel_up`, `sentinel_down`, `stale`, `ok`, `fence`, `drain`,
    /// `primary_down` (a primary's own `+sdown`/`-sdown`/`+odown`/`-odown`).
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub master: Option<String>,
    /// Kind-specific fields (old and new primary, epoch, counts, durations...).
    #[serde(flatten)]
    pub data: Map<String, Value>,
}

pub struct EventLog {
    retained: Mutex<Log>,
    /// Every live `/v1/events/stream` holds a receiver; a lagging one is told and resyncs.
    tx: broadcast::Sender<Event>,
}

struct Log {
    next_id: u64,
    events: VecDeque<Event>,
}

impl Default for EventLog {
    fn default() -> Self {
        Self::new()
    }
}

impl EventLog {
    pub fn new() -> Self {
        let (tx, _) = broadcast::channel(RETAINED);
        let log = Log { next_id: now_ms(), events: VecDeque::with_capacity(RETAINED) };
        Self { retained: Mutex::new(log), tx }
    }

    /// Records an event, logs nothing (callers log in their own words), returns its id.
    pub fn push(&self, kind: &'static str, master: Option<&str>, data: Value) -> u64 {
        let data = match data {
            Value::Object(map) => map,
            Value::Null => Map::new(),
            other => Map::from_iter([("value".to_string(), other)]),
        };
        let mut log = self.lock();
        let id = log.next_id;
        log.next_id += 1;
        let event = Event { id, time_ms: now_ms(), kind, master: master.map(str::to_owned), data };
        if log.events.len() == RETAINED {
            log.events.pop_front();
        }
        log.events.push_back(event.clone());
        // Sent under the lock so that stream subscribers see ids in order.
        let _ = self.tx.send(event);
        id
    }

    /// The retained events with an id above `since` (all of them for `None`).
    pub fn since(&self, since: Option<u64>) -> Vec<Event> {
        let log = self.lock();
        log.events.iter().filter(|e| since.is_none_or(|s| e.id > s)).cloned().collect()
    }

    /// The id of the newest event, if any.
    pub fn last_id(&self) -> Option<u64> {
        self.lock().events.back().map(|e| e.id)
    }

    /// Atomically the retained events after `since` and a receiver for everything later.
    pub fn follow(&self, since: Option<u64>) -> (Vec<Event>, broadcast::Receiver<Event>) {
        let log = self.lock();
        let rx = self.tx.subscribe();
        let past = log.events.iter().filter(|e| since.is_none_or(|s| e.id > s)).cloned().collect();
        (past, rx)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Log> {
        // A panic while holding this lock leaves a consistent log (push is the only writer and
        // cannot panic between its steps), so a poisoned lock is safe to keep using.
        self.retained.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ids_increase_and_since_filters() {
        let log = EventLog::new();
        let a = log.push("switch", Some("m"), json!({"epoch": 1}));
        let b = log.push("sentinel_down", None, json!({"sentinel": "127.0.0.1:1"}));
        assert!(b > a);
        assert_eq!(log.since(Some(a)).len(), 1);
        assert_eq!(log.since(None).len(), 2);
        assert_eq!(log.since(Some(b)).len(), 0);
    }

    #[tokio::test]
    async fn follow_sees_later_events() {
        let log = EventLog::new();
        log.push("ok", None, Value::Null);
        let (past, mut rx) = log.follow(None);
        assert_eq!(past.len(), 1);
        let id = log.push("stale", None, Value::Null);
        assert_eq!(rx.recv().await.map(|e| e.id).ok(), Some(id));
    }
}
