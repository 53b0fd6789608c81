//! One drain pass over one node: list its clients, decide who goes, kill them by id at the
//! node's pace, and say what happened (event, log line, metric).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;
use serde_json::json;
use tokio::time::{Instant, sleep_until};

use super::pace::Pacer;
use super::spare::{Rules, SpareReason};
use crate::events::{EventLog, Kind};
use crate::metrics as m;
use crate::node::clients::ClientInfo;
use crate::node::{KeptLink, Listing, NodeError};

/// Whom a pass kills, among the clients that are not spared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Everyone (the drain at the flip, a returning node, a manual drain).
    All,
    /// Clients that may have connected before this moment (a stale DNS cache could have sent
    /// them); those that certainly connected later are taken to be intended and left alone.
    ConnectedBefore(Instant),
    /// Clients whose last command is a write: on a demoted node they got `READONLY`, so they
    /// hold a stale address (a cached DNS answer, a pinned address). Readers stay.
    Writers,
    /// Clients waiting on the server (held by the pause, or in a blocking command).
    Held,
}

/// Why a pass ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// The first pass after the published primary moved away from the node.
    Flip,
    /// A later pass within the grace.
    Sweep,
    /// A node that came back still claiming master.
    Returning,
    /// `POST /v1/masters/{name}/drain`.
    Manual,
    /// The end of the fence, in the same transaction that lifts the pause.
    Unfence,
    /// The clients the pause held, in the transaction that demotes the node.
    Demote,
    /// Clients of a demoted node whose last command is a write, until the window ends.
    StaleWriter,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Flip => "flip",
            Self::Sweep => "sweep",
            Self::Returning => "returning",
            Self::Manual => "manual",
            Self::Unfence => "unfence",
            Self::Demote => "demote",
            Self::StaleWriter => "stale_writer",
        }
    }
}

/// What one pass did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DrainReport {
    pub node: SocketAddr,
    pub reason: Reason,
    pub killed: usize,
    pub spared: usize,
    /// `spared` by rule: `own`, `polestar`, `sentinel`, `replication`, `name`, `user`, `cidr`.
    pub spared_by: BTreeMap<&'static str, usize>,
    /// Connected after the cutoff of a sweep: intended, left alone.
    pub left: usize,
    /// Lines of `CLIENT LIST` that could not be read.
    pub unreadable: usize,
    #[serde(rename = "duration_ms", serialize_with = "millis")]
    pub duration: Duration,
    /// Set when the node failed part-way; the clients not reached are left for the next pass.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<String>,
}

fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis() as u64)
}

/// The ids to kill and the count of everyone else, from one listing.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Selection {
    pub kill: Vec<u64>,
    pub spared_by: BTreeMap<SpareReason, usize>,
    pub left: usize,
}

pub fn select(listing: &Listing, rules: &Rules, scope: Scope) -> Selection {
    let mut selection = Selection::default();
    for client in &listing.list.clients {
        if let Some(reason) = rules.spare(client, listing.own_id) {
            *selection.spared_by.entry(reason).or_default() += 1;
        } else if in_scope(scope, listing.at, client) {
            selection.kill.push(client.id);
        } else {
            selection.left += 1;
        }
    }
    selection
}

fn in_scope(scope: Scope, listed_at: Instant, client: &ClientInfo) -> bool {
    match scope {
        Scope::All => true,
        // An age the node does not say counts as zero, the youngest possible.
        Scope::ConnectedBefore(cutoff) => {
            possibly_connected_before(listed_at, client.age.unwrap_or_default(), cutoff)
        }
        Scope::Writers => client.last_command_writes(),
        Scope::Held => client.blocked(),
    }
}

/// `age` is whole seconds rounded down, so the connection started in
/// `(listed_at - age - 1s, listed_at - age]`. Any overlap with "before the cutoff" counts:
/// killing an intended client costs it one reconnect, sparing a stale one leaves it on a
/// node that is no longer the primary.
pub fn possibly_connected_before(listed_at: Instant, age: Duration, cutoff: Instant) -> bool {
    // `age` comes from the node: `age=18446744073709551615` must not overflow (it panicked).
    match listed_at.checked_sub(age.saturating_add(Duration::from_secs(1))) {
        Some(earliest) => earliest < cutoff,
        None => true,
    }
}

/// Runs one pass: list, select, kill in paced batches.
pub async fn drain(
    link: &KeptLink,
    rules: &Rules,
    pacer: &Pacer,
    scope: Scope,
    reason: Reason,
) -> Result<DrainReport, NodeError> {
    let started = Instant::now();
    let listing = link.clients().await?;
    let selection = select(&listing, rules, scope);
    let mut report = report(link.addr(), reason, &listing, &selection);
    for batch in selection.kill.chunks(pacer.batch_size()) {
        sleep_until(pacer.reserve(batch.len())).await;
        match link.kill(batch).await {
            Ok(n) => report.killed += n,
            Err(e) => {
                report.interrupted = Some(e.to_string());
                break;
            }
        }
    }
    report.duration = started.elapsed();
    Ok(report)
}

fn report(node: SocketAddr, reason: Reason, listing: &Listing, s: &Selection) -> DrainReport {
    DrainReport {
        node,
        reason,
        killed: 0,
        spared: s.spared_by.values().sum(),
        spared_by: s.spared_by.iter().map(|(r, n)| (r.as_str(), *n)).collect(),
        left: s.left,
        unreadable: listing.list.unreadable,
        duration: Duration::ZERO,
        interrupted: None,
    }
}

/// Counts the kills and, for passes worth telling (`loud`), records an event and an info line.
pub fn record(events: &EventLog, master: &str, report: &DrainReport, loud: bool) {
    let found = (report.killed + report.left) as f64;
    metrics::gauge!(m::OLD_PRIMARY_CLIENTS, "master" => master.to_string()).set(found);
    if report.killed > 0 {
        metrics::counter!(m::DRAIN_KILLED, "master" => master.to_string(), "method" => "client_kill")
            .increment(report.killed as u64);
    }
    if !loud && report.killed == 0 && report.interrupted.is_none() {
        tracing::debug!(master, node = %report.node, reason = report.reason.as_str(), spared = report.spared, "sweep found no stale client");
        return;
    }
    tracing::info!(
        master, node = %report.node, reason = report.reason.as_str(), killed = report.killed,
        spared = report.spared, left = report.left, duration_ms = report.duration.as_millis() as u64,
        interrupted = report.interrupted.as_deref(), "drained clients"
    );
    let data = serde_json::to_value(report).unwrap_or_else(|_| json!({}));
    events.push(Kind::Drain, Some(master), data);
}

/// The window of `node` ended with `found` clients still writing to it (its last stale-writer
/// sweep killed them, and they would have come back): nothing cuts them any more, and they get
/// `READONLY` until they resolve the name again, so they are counted
/// (`polestar_old_primary_stale_clients_total`), logged and recorded as an event.
pub fn stale_left(
    events: &EventLog,
    master: &str,
    node: SocketAddr,
    found: usize,
    window: Duration,
) {
    if found == 0 {
        return;
    }
    metrics::counter!(m::OLD_PRIMARY_STALE_CLIENTS, "master" => master.to_string())
        .increment(found as u64);
    let window_ms = window.as_millis() as u64;
    tracing::warn!(
        master, %node, clients = found, window_ms,
        "clients still write to the old primary as drain.window ends: their DNS cache outlives the window, or they pin the address"
    );
    let data = json!({ "node": node, "clients": found, "window_ms": window_ms });
    events.push(Kind::StaleClientsLeft, Some(master), data);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;
    use crate::node::clients::parse_list;

    /// Regression: `CLIENT LIST` with `age=18446744073709551615` overflowed the
    /// connection-time arithmetic and killed that node's drain episode for good.
    #[test]
    fn a_client_listed_with_the_largest_age_does_not_kill_the_drain() {
        let at = Instant::now();
        let list = parse_list("id=7 addr=10.0.0.9:5000 age=18446744073709551615 cmd=set\n");
        let age = list.clients[0].age.expect("a readable age");
        assert_eq!(age, Duration::from_secs(u64::MAX));
        assert!(possibly_connected_before(at, age, at), "connected before any cutoff");
    }

    fn listing(text: &str, at: Instant) -> Listing {
        Listing { list: parse_list(text), at, own_id: 1 }
    }

    #[test]
    fn connect_time_from_age_is_conservative() {
        let t0 = Instant::now();
        let at = t0 + Duration::from_secs(100);
        let cutoff = t0 + Duration::from_secs(90);
        let s = Duration::from_secs;
        // Connected 11s..12s before `at`: before the cutoff.
        assert!(possibly_connected_before(at, s(11), cutoff));
        // Connected 10s..11s before `at`: possibly before the cutoff, counted as stale.
        assert!(possibly_connected_before(at, s(10), cutoff));
        // Connected 9s..10s before `at`: certainly not before the cutoff.
        assert!(!possibly_connected_before(at, s(9), cutoff));
        assert!(!possibly_connected_before(at, s(0), cutoff));
        // A listing taken before the cutoff: everyone connected before it.
        assert!(possibly_connected_before(t0, s(0), cutoff));
    }

    #[test]
    fn selection_splits_kill_spare_and_left() {
        let t0 = Instant::now() + Duration::from_secs(1000);
        let text = "id=1 name= flags=N\n\
                    id=2 name=sentinel-abc-cmd flags=N age=50\n\
                    id=3 flags=S cmd=replconf age=50\n\
                    id=4 name=app flags=N age=50\n\
                    id=5 name=app flags=b cmd=blpop age=0\n\
                    id=6 name=keep flags=P age=50\n\
                    broken line\n";
        let rules = Rules::new(&config::Spare { names: vec!["keep".into()], ..Default::default() });
        let cutoff = t0 - Duration::from_secs(10);
        let sel = select(&listing(text, t0), &rules, Scope::ConnectedBefore(cutoff));
        assert_eq!(sel.kill, vec![4]);
        assert_eq!(sel.left, 1);
        assert_eq!(sel.spared_by.values().sum::<usize>(), 4);
        let writers = "id=7 cmd=set age=50\nid=8 cmd=get age=50\nid=9 cmd=incr flags=b\n\
                       id=10 name=sentinel-x-cmd cmd=publish\nid=11 cmd=blpop flags=b";
        let w = select(&listing(writers, t0), &rules, Scope::Writers);
        assert_eq!(w.kill, vec![7, 9, 11]);
        assert_eq!(w.left, 1);
        let held = select(&listing(writers, t0), &rules, Scope::Held);
        assert_eq!(held.kill, vec![9, 11]);
        let all = select(&listing(text, t0), &rules, Scope::All);
        assert_eq!(all.kill, vec![4, 5]);
        assert_eq!(all.left, 0);
    }

    #[test]
    fn a_report_serializes_with_milliseconds() {
        let report = DrainReport {
            node: "127.0.0.1:6379".parse().expect("literal"),
            reason: Reason::Flip,
            killed: 3,
            spared: 2,
            spared_by: BTreeMap::from([("sentinel", 2)]),
            left: 0,
            unreadable: 0,
            duration: Duration::from_millis(12),
            interrupted: None,
        };
        let v = serde_json::to_value(&report).expect("serializable");
        assert_eq!(v["duration_ms"], 12);
        assert_eq!(v["reason"], "flip");
        assert_eq!(v["node"], "127.0.0.1:6379");
        assert!(v.get("interrupted").is_none());
    }

    #[test]
    fn stale_clients_left_at_the_window_end_are_an_event_and_none_is_nothing() {
        let events = EventLog::new();
        let node: SocketAddr = "10.0.0.1:6379".parse().expect("an address");
        stale_left(&events, "m", node, 0, Duration::from_secs(60));
        assert!(events.since(None).is_empty(), "no stale client, no event");
        stale_left(&events, "m", node, 3, Duration::from_secs(60));
        let got = events.since(None);
        assert_eq!(got.len(), 1, "{got:?}");
        let shown = serde_json::to_value(&got[0]).expect("an event serializes");
        assert_eq!(shown["kind"], "stale_clients_left", "{shown}");
        assert_eq!(
            (shown["clients"].as_u64(), shown["window_ms"].as_u64()),
            (Some(3), Some(60_000))
        );
        assert_eq!(shown["node"], "10.0.0.1:6379", "{shown}");
    }
}
