//! What subscribers hear: Sentinel's event messages, derived from consecutive published
//! snapshots (pure), and the task that broadcasts them.
//!
//! `+switch-master` goes out the moment polestar publishes a new primary (its flip, about a
//! second before the real Sentinels announce theirs), and again with the roles swapped when a
//! provisional flip is withdrawn: a subscriber always hears how to reach what is published.
//! `+sdown`/`-sdown slave` follow whether the replicas polestar publishes are down (as a
//! majority of the configured Sentinels lists them), which is how the old primary of a
//! failover shows up once Sentinel lists it as a replica that is down.
//! A primary's own `+sdown`/`-sdown`/`+odown`/`-odown` are what the configured Sentinels
//! announced, once per transition: the decider records them in the event log
//! (`primary_down`) and [`follow_events`] passes them on. Nothing here invents one.

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::broadcast::{self, error::RecvError};
use tokio_util::sync::CancellationToken;

use crate::events::{Event, EventLog, Kind};
use crate::topology::{Master, Node, Snapshot, TopologyReader};

use super::resp::{Proto, Reply, encode_bulk};
use super::view::host;

/// One event for subscribers: the channel is the event name, as on a Sentinel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub channel: &'static str,
    pub payload: String,
}

/// A message as it goes out, encoded once for every subscriber (at a flip, tens of thousands
/// of them): the whole push to a subscriber of the channel in each protocol, and the channel
/// and payload that every `pmessage` push ends with.
#[derive(Debug)]
pub struct Outgoing {
    pub message: Message,
    /// `message <channel> <payload>`, RESP2 then RESP3.
    to_channel: [Vec<u8>; 2],
    /// The channel and the payload as bulk strings.
    tail: Vec<u8>,
}

impl Outgoing {
    pub fn new(message: Message) -> Self {
        let push = |proto| {
            let mut out = Vec::new();
            let items = vec![
                Reply::bulk("message"),
                Reply::bulk(message.channel),
                Reply::bulk(&message.payload),
            ];
            Reply::Push(items).encode(proto, &mut out);
            out
        };
        let to_channel = [push(Proto::Resp2), push(Proto::Resp3)];
        let mut tail = Vec::new();
        encode_bulk(message.channel.as_bytes(), &mut tail);
        encode_bulk(message.payload.as_bytes(), &mut tail);
        Self { message, to_channel, tail }
    }

    /// The push to a subscriber of the message's channel.
    pub fn to_channel(&self, proto: Proto) -> &[u8] {
        &self.to_channel[usize::from(proto == Proto::Resp3)]
    }

    /// Appends the push to a subscriber of `pattern` (which matched the channel) to `out`.
    pub fn to_pattern(&self, proto: Proto, pattern: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(if proto == Proto::Resp3 { b">4\r\n" } else { b"*4\r\n" });
        encode_bulk(b"pmessage", out);
        encode_bulk(pattern, out);
        out.extend_from_slice(&self.tail);
    }
}

/// The messages that the change from `old` to `new` makes, in the order Sentinel sends them.
pub fn messages(old: &Snapshot, new: &Snapshot) -> Vec<Message> {
    let mut out = Vec::new();
    for m in new.masters.values() {
        let before = old.master(&m.name);
        if let Some(switch) = before.and_then(|b| switch_master(b, m)) {
            out.push(switch);
        }
        out.extend(replica_health(before.map(|b| &**b), m));
    }
    out
}

fn switch_master(before: &Master, after: &Master) -> Option<Message> {
    let (from, to) = (before.primary.as_ref()?, after.primary.as_ref()?);
    if from.addr() == to.addr() {
        return None;
    }
    let payload = format!("{} {} {} {} {}", after.name, host(from), from.port, host(to), to.port);
    Some(Message { channel: "+switch-master", payload })
}

/// `+sdown slave` for a replica that went (or appeared) down, `-sdown slave` for one that came
/// back, in Sentinel's format: `slave <ip:port> <ip> <port> @ <master> <ip> <port>`. Down is
/// Sentinel's down (`s_down`, `disconnected`), not a replication link that is resyncing: the
/// real Sentinels announce nothing of a replica on a planned failover, and neither does this.
fn replica_health(before: Option<&Master>, after: &Master) -> Vec<Message> {
    let Some(primary) = after.primary.as_ref() else { return Vec::new() };
    let was_down = |ip, port| {
        let known = before.into_iter().flat_map(|b| &b.replicas);
        known.into_iter().find(|r| r.ip == ip && r.port == port).map(|r| r.down)
    };
    let mut out = Vec::new();
    for r in &after.replicas {
        let channel = match (was_down(r.ip, r.port), r.down) {
            (Some(false) | None, true) => "+sdown",
            (Some(true), false) => "-sdown",
            _ => continue,
        };
        let node = Node { ip: r.ip, port: r.port, hostname: r.hostname.clone() };
        let (h, p) = (host(&node), node.port);
        let payload =
            format!("slave {h}:{p} {h} {p} @ {} {} {}", after.name, host(primary), primary.port);
        out.push(Message { channel, payload });
    }
    out
}

/// Broadcasts the messages of every published change until `shutdown`. Each subscribed
/// connection holds a receiver of `tx`; one that falls a whole channel behind is closed by its
/// connection, so a slow subscriber never makes this task (or the others) wait or buffer.
///
/// The starting point is the snapshot current when this is called, not when the task first
/// runs: the endpoint calls it before it accepts a connection, so a change published after a
/// client subscribed is never taken for the starting point (it was, by a task scheduled late).
pub fn run(
    mut topology: TopologyReader,
    tx: broadcast::Sender<Arc<Outgoing>>,
    shutdown: CancellationToken,
) -> impl Future<Output = ()> + Send + 'static {
    let mut last = topology.borrow_and_update().clone();
    async move {
        loop {
            tokio::select! {
                changed = topology.changed() => if changed.is_err() { return },
                () = shutdown.cancelled() => return,
            }
            let now = topology.borrow_and_update().clone();
            for message in messages(&last, &now) {
                send(&tx, message);
            }
            last = now;
        }
    }
}

fn send(tx: &broadcast::Sender<Arc<Outgoing>>, message: Message) {
    tracing::debug!(channel = message.channel, payload = %message.payload, "sentinel API: publishing");
    metrics::counter!(crate::metrics::SENTINEL_API_PUBLISHED, "channel" => message.channel)
        .increment(1);
    // No subscriber at all is not an error.
    let _ = tx.send(Arc::new(Outgoing::new(message)));
}

/// The Sentinel message of a `primary_down` event: `<+|->sdown master <name> <ip> <port>`,
/// `+odown` with ` #quorum N/M` when Sentinel gave it. `None` for any other event.
pub fn down_message(event: &Event) -> Option<Message> {
    if event.kind != Kind::PrimaryDown {
        return None;
    }
    let master = event.master.as_deref()?;
    let channel = match event.data.get("event")?.as_str()? {
        "+sdown" => "+sdown",
        "-sdown" => "-sdown",
        "+odown" => "+odown",
        "-odown" => "-odown",
        _ => return None,
    };
    let (host, port) = event.data.get("node")?.as_str()?.rsplit_once(':')?;
    let mut payload = format!("master {master} {host} {port}");
    if let Some(quorum) = event.data.get("quorum").and_then(Value::as_str) {
        payload = format!("{payload} #quorum {quorum}");
    }
    Some(Message { channel, payload })
}

/// Passes the event log's `primary_down` events on to subscribers until `shutdown`, from the
/// moment this is called (like [`run`], before the endpoint accepts a connection). Falling
/// behind the log's broadcast, it catches up from the retained log, never sending an id twice.
pub fn follow_events(
    log: Arc<EventLog>,
    tx: broadcast::Sender<Arc<Outgoing>>,
    shutdown: CancellationToken,
) -> impl Future<Output = ()> + Send + 'static {
    // The past is not this task's to send; it only marks where "from now on" starts.
    let (past, mut live) = log.follow(None);
    let mut last = past.last().map(|e| e.id);
    async move {
        loop {
            let received = tokio::select! {
                received = live.recv() => received,
                () = shutdown.cancelled() => return,
            };
            let events = match received {
                Ok(event) => vec![event],
                Err(RecvError::Lagged(_)) => log.since(last),
                Err(RecvError::Closed) => return,
            };
            for event in events {
                if last.is_some_and(|l| event.id <= l) {
                    continue;
                }
                last = Some(event.id);
                if let Some(message) = down_message(&event) {
                    send(&tx, message);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{MasterState, Replica, SentinelCounts};
    use std::collections::BTreeMap;

    fn node(port: u16) -> Node {
        Node { ip: [10, 0, 0, 1].into(), port, hostname: None }
    }

    fn replica(port: u16, healthy: bool) -> Replica {
        Replica { ip: [10, 0, 0, 1].into(), port, hostname: None, healthy, down: !healthy }
    }

    fn snapshot(primary: Option<u16>, replicas: Vec<Replica>) -> Snapshot {
        let master = Master {
            withdrawn: None,
            provisional: false,
            name: "m".into(),
            label: "m".into(),
            primary: primary.map(node),
            epoch: Some(1),
            since: None,
            state: MasterState::Ok,
            replicas,
            sentinels: SentinelCounts::default(),
        };
        Snapshot {
            version: 1,
            masters: BTreeMap::from([("m".to_string(), Arc::new(master))]),
            source_reachable: true,
        }
    }

    #[test]
    fn a_new_primary_is_a_switch_master_and_the_way_back_too() {
        let a = snapshot(Some(1), vec![replica(2, true)]);
        let b = snapshot(Some(2), vec![replica(2, true)]);
        let expect = |p: &str| vec![Message { channel: "+switch-master", payload: p.into() }];
        assert_eq!(messages(&a, &b), expect("m 10.0.0.1 1 10.0.0.1 2"));
        assert_eq!(messages(&b, &a), expect("m 10.0.0.1 2 10.0.0.1 1"));
        assert_eq!(messages(&a, &a), vec![]);
        assert_eq!(messages(&Snapshot::default(), &a), vec![], "a first primary is no switch");
        assert_eq!(messages(&snapshot(None, vec![]), &a), vec![]);
    }

    #[test]
    fn replicas_going_down_and_up_are_sdown_events() {
        let a = snapshot(Some(2), vec![replica(3, true)]);
        let b = snapshot(Some(2), vec![replica(3, true), replica(1, false)]);
        let c = snapshot(Some(2), vec![replica(3, true), replica(1, true)]);
        let sdown = |ch, port| Message {
            channel: ch,
            payload: format!("slave 10.0.0.1:{port} 10.0.0.1 {port} @ m 10.0.0.1 2"),
        };
        assert_eq!(messages(&a, &b), vec![sdown("+sdown", 1)]);
        assert_eq!(messages(&b, &c), vec![sdown("-sdown", 1)]);
        assert_eq!(messages(&c, &a), vec![]);
    }

    #[test]
    fn a_primarys_recorded_downs_are_sentinel_messages() {
        let log = EventLog::new();
        let push = |event: &str, quorum: Option<&str>| {
            let mut data =
                serde_json::json!({"event": event, "node": "10.0.0.1:7001", "sentinel": "s:1"});
            if let Some(q) = quorum {
                data["quorum"] = q.into();
            }
            log.push(Kind::PrimaryDown, Some("m"), data);
        };
        push("+sdown", None);
        push("+odown", Some("2/3"));
        push("-odown", None);
        log.push(Kind::Switch, Some("m"), serde_json::json!({"event": "+sdown"}));
        let got: Vec<_> = log.since(None).iter().filter_map(down_message).collect();
        let msg = |channel, payload: &str| Message { channel, payload: payload.into() };
        assert_eq!(
            got,
            [
                msg("+sdown", "master m 10.0.0.1 7001"),
                msg("+odown", "master m 10.0.0.1 7001 #quorum 2/3"),
                msg("-odown", "master m 10.0.0.1 7001"),
            ]
        );
    }

    #[test]
    fn a_message_encoded_once_is_what_each_subscriber_would_have_encoded() {
        let message =
            Message { channel: "+switch-master", payload: "m 10.0.0.1 1 10.0.0.1 2".into() };
        let out = Outgoing::new(message.clone());
        for proto in [Proto::Resp2, Proto::Resp3] {
            let encoded = |items: Vec<Reply>| {
                let mut bytes = Vec::new();
                Reply::Push(items).encode(proto, &mut bytes);
                bytes
            };
            let (channel, payload) = (Reply::bulk(message.channel), Reply::bulk(&message.payload));
            let expect = encoded(vec![Reply::bulk("message"), channel.clone(), payload.clone()]);
            assert_eq!(out.to_channel(proto), expect.as_slice());
            let pattern = Reply::bulk("*switch*");
            let expect = encoded(vec![Reply::bulk("pmessage"), pattern, channel, payload]);
            let mut got = Vec::new();
            out.to_pattern(proto, b"*switch*", &mut got);
            assert_eq!(got, expect);
        }
    }

    /// Receives one message within 10 s, or fails naming `what`.
    async fn next(rx: &mut broadcast::Receiver<Arc<Outgoing>>, what: &str) -> Message {
        let got = tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv()).await;
        got.unwrap_or_else(|_| panic!("{what}: nothing sent")).expect("open").message.clone()
    }

    /// Stops the task and waits for it to end.
    async fn ends_at(stop: CancellationToken, task: tokio::task::JoinHandle<()>) {
        stop.cancel();
        task.await.expect("the task ends at the stop");
    }

    #[tokio::test]
    async fn a_change_published_before_the_publisher_first_runs_is_sent() {
        let (publisher, reader) = crate::topology::channel();
        publisher.replace(snapshot(Some(1), vec![]));
        let (tx, mut rx) = broadcast::channel(16);
        let stop = CancellationToken::new();
        let publishing = run(reader, tx, stop.clone());
        // The endpoint has answered a SUBSCRIBE by now; the task has not run yet.
        publisher.replace(snapshot(Some(2), vec![]));
        let task = tokio::spawn(publishing);
        let got = next(&mut rx, "the switch").await;
        assert_eq!(got.channel, "+switch-master");
        assert_eq!(got.payload, "m 10.0.0.1 1 10.0.0.1 2");
        ends_at(stop, task).await;
    }

    #[tokio::test]
    async fn a_down_recorded_before_the_follower_first_runs_is_sent() {
        let log = Arc::new(EventLog::new());
        let (tx, mut rx) = broadcast::channel(16);
        let stop = CancellationToken::new();
        let following = follow_events(log.clone(), tx, stop.clone());
        let data = serde_json::json!({"event": "+sdown", "node": "10.0.0.1:7001"});
        log.push(Kind::PrimaryDown, Some("m"), data);
        let task = tokio::spawn(following);
        assert_eq!(next(&mut rx, "the down").await.channel, "+sdown");
        ends_at(stop, task).await;
    }

    #[tokio::test]
    async fn recorded_downs_reach_subscribers() {
        let log = Arc::new(EventLog::new());
        let (tx, mut rx) = broadcast::channel(16);
        let stop = CancellationToken::new();
        let task = tokio::spawn(follow_events(log.clone(), tx, stop.clone()));
        // Wait until it follows: an event pushed before is not its to send.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let data = serde_json::json!({"event": "+sdown", "node": "10.0.0.1:7001"});
        let first = loop {
            log.push(Kind::PrimaryDown, Some("m"), data.clone());
            let got = tokio::time::timeout(std::time::Duration::from_millis(50), rx.recv()).await;
            if let Ok(Ok(m)) = got {
                break m;
            }
            assert!(std::time::Instant::now() < deadline, "the follower never started");
        };
        assert_eq!(first.message.channel, "+sdown");
        log.push(
            Kind::PrimaryDown,
            Some("m"),
            serde_json::json!({"event": "-sdown", "node": "10.0.0.1:7001"}),
        );
        // (A probe of the wait above may still arrive late: skip those.)
        let next = loop {
            let m = rx.recv().await.expect("a message");
            if m.message.channel != "+sdown" {
                break m;
            }
        };
        let next = &next.message;
        assert_eq!((next.channel, next.payload.as_str()), ("-sdown", "master m 10.0.0.1 7001"));
        stop.cancel();
        task.await.expect("ends at shutdown");
    }
}
