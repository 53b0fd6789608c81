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

/// What an event is about: its `kind` in the JSON and its `event:` line on the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// The published primary changed (a flip, provisional or not).
    Switch,
    /// A provisional flip withdrawn: the primary published before it again.
    Revert,
    /// A master no majority of the Sentinels vouches for any more.
    Stale,
    /// A stale or suspect master confirmed again.
    Ok,
    /// A new primary outside the master's lineage: not published.
    Suspect,
    SuspectCleared,
    /// A master no Sentinel monitors any more.
    MasterRemoved,
    SentinelUp,
    SentinelDown,
    /// A primary's own `+sdown`/`-sdown`/`+odown`/`-odown`.
    PrimaryDown,
    /// The old primary paused (`CLIENT PAUSE WRITE`), and the pause lifted.
    Fence,
    Unfence,
    /// Clients of the old primary killed, and the drain given up on an unreachable node.
    Drain,
    DrainAbandoned,
    /// The old primary made a replica of the new one, or refusing it.
    Demote,
    DemoteRefused,
    NodeUnreachable,
    /// Writers still on the old primary when the drain's window ended.
    StaleClientsLeft,
    /// Sockets destroyed by the kernel (`SOCK_DESTROY`).
    Sweep,
    /// A failover asked of a Sentinel through the API, a planned switchover, and a node's
    /// hand-over before its restart.
    FailoverRequested,
    Switchover,
    Handoff,
    HandoffEnded,
    /// A handoff refused once its wait was over (for a primary: what stopping it would cost).
    HandoffRefused,
    /// A data node whose `default` user may publish Sentinel hellos.
    HelloAcl,
    /// An agent's upstream answering again, or not.
    UpstreamUp,
    UpstreamDown,
}

impl Kind {
    pub const ALL: [Kind; 27] = [
        Kind::Switch,
        Kind::Revert,
        Kind::Stale,
        Kind::Ok,
        Kind::Suspect,
        Kind::SuspectCleared,
        Kind::MasterRemoved,
        Kind::SentinelUp,
        Kind::SentinelDown,
        Kind::PrimaryDown,
        Kind::Fence,
        Kind::Unfence,
        Kind::Drain,
        Kind::DrainAbandoned,
        Kind::Demote,
        Kind::DemoteRefused,
        Kind::NodeUnreachable,
        Kind::StaleClientsLeft,
        Kind::Sweep,
        Kind::FailoverRequested,
        Kind::Switchover,
        Kind::Handoff,
        Kind::HandoffEnded,
        Kind::HandoffRefused,
        Kind::HelloAcl,
        Kind::UpstreamUp,
        Kind::UpstreamDown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Switch => "switch",
            Kind::Revert => "revert",
            Kind::Stale => "stale",
            Kind::Ok => "ok",
            Kind::Suspect => "suspect",
            Kind::SuspectCleared => "suspect_cleared",
            Kind::MasterRemoved => "master_removed",
            Kind::SentinelUp => "sentinel_up",
            Kind::SentinelDown => "sentinel_down",
            Kind::PrimaryDown => "primary_down",
            Kind::Fence => "fence",
            Kind::Unfence => "unfence",
            Kind::Drain => "drain",
            Kind::DrainAbandoned => "drain_abandoned",
            Kind::Demote => "demote",
            Kind::DemoteRefused => "demote_refused",
            Kind::NodeUnreachable => "node_unreachable",
            Kind::StaleClientsLeft => "stale_clients_left",
            Kind::Sweep => "sweep",
            Kind::FailoverRequested => "failover_requested",
            Kind::Switchover => "switchover",
            Kind::Handoff => "handoff",
            Kind::HandoffEnded => "handoff_ended",
            Kind::HandoffRefused => "handoff_refused",
            Kind::HelloAcl => "hello_acl",
            Kind::UpstreamUp => "upstream_up",
            Kind::UpstreamDown => "upstream_down",
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The stream-only event of `?masters=` (`http/feed.rs`): not in the log, never retained.
pub const MASTERS: &str = "masters";

#[derive(Clone, Debug, Serialize)]
pub struct Event {
    pub id: u64,
    /// Milliseconds since the Unix epoch.
    pub time_ms: u64,
    pub kind: Kind,
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
    pub fn push(&self, kind: Kind, master: Option<&str>, data: Value) -> u64 {
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

/// A duration in milliseconds to the microsecond, as logs and events carry latencies
/// (`latency_ms=0.059`, not `0.059948999999999995`).
pub fn millis(d: std::time::Duration) -> f64 {
    d.as_micros() as f64 / 1e3
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn latencies_are_rounded_to_the_microsecond() {
        let shown = |nanos| millis(std::time::Duration::from_nanos(nanos)).to_string();
        assert_eq!(shown(59_949), "0.059");
        assert_eq!(shown(2_503_118_234), "2503.118");
        assert_eq!(
            json!({"latency_ms": millis(std::time::Duration::from_nanos(59_949))}).to_string(),
            r#"{"latency_ms":0.059}"#
        );
    }

    #[test]
    fn ids_increase_and_since_filters() {
        let log = EventLog::new();
        let a = log.push(Kind::Switch, Some("m"), json!({"epoch": 1}));
        let b = log.push(Kind::SentinelDown, None, json!({"sentinel": "127.0.0.1:1"}));
        assert!(b > a);
        assert_eq!(log.since(Some(a)).len(), 1);
        assert_eq!(log.since(None).len(), 2);
        assert_eq!(log.since(Some(b)).len(), 0);
    }

    #[tokio::test]
    async fn follow_sees_later_events() {
        let log = EventLog::new();
        log.push(Kind::Ok, None, Value::Null);
        let (past, mut rx) = log.follow(None);
        assert_eq!(past.len(), 1);
        let id = log.push(Kind::Stale, None, Value::Null);
        assert_eq!(rx.recv().await.map(|e| e.id).ok(), Some(id));
    }

    /// The JSON `kind` is the name `as_str` gives (what the stream's `event:` line says), and
    /// every kind has a name of its own.
    #[test]
    fn every_kind_serializes_as_its_own_name() {
        let mut names = std::collections::HashSet::new();
        for kind in Kind::ALL {
            assert_eq!(serde_json::to_value(kind).expect("a unit variant"), json!(kind.as_str()));
            assert!(names.insert(kind.as_str()), "{kind} twice");
        }
        assert!(!names.contains(MASTERS));
    }
}
