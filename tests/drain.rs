//! Fence and drain (docs/failover.md) against real `redis-server` processes: each test starts its
//! own servers on free loopback ports, drives the `Coordinator` with the signals the Sentinel side
//! sends, and watches real client connections close (or stay).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use polestar::config::{self, Auth};
use polestar::drain::{Coordinator, DrainError, DrainHandle};
use polestar::events::{Event, EventLog, Kind};
use polestar::failover::Signal;
use polestar::node::clients::parse_list;
use polestar::node::infrastructure::Infrastructure;
use polestar::node::{Endpoint, Link, NodeError};
use polestar::topology::{self, Master, MasterState, Node, Replica, SentinelCounts};
use polestar_lab::conf::Monitor;
use polestar_lab::{Flavor, ServerOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;

// ---------------------------------------------------------------------------------------------
// A redis-server process (the lab's standalone `Server`), killed on drop.

struct Server(polestar_lab::Server);

impl Server {
    async fn start(extra: &[&str]) -> Server {
        Self::start_on(&Flavor::Redis, extra).await
    }

    /// A data node of `flavor` (Redis, or Valkey's `valkey-server`); `extra` are arguments
    /// after its config file. Room for the 10,000 clients of the biggest test.
    async fn start_on(flavor: &Flavor, extra: &[&str]) -> Server {
        let opts = ServerOptions {
            flavor: flavor.clone(),
            conf: "maxclients 15000\n".into(),
            args: extra.iter().map(ToString::to_string).collect(),
            ..ServerOptions::node()
        };
        let server = polestar_lab::Server::start(opts).await;
        Server(server.unwrap_or_else(|e| panic!("cannot start {}: {e:#}", flavor.name())))
    }

    fn addr(&self) -> SocketAddr {
        self.0.addr()
    }

    fn port(&self) -> u16 {
        self.0.port()
    }

    fn node(&self) -> Node {
        Node { ip: self.addr().ip(), port: self.port(), hostname: None }
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        self.0.signal(signal).expect("signal redis-server");
    }

    /// A one-off command on a fresh connection; the reply's first chunk.
    async fn ask(&self, args: &[&str]) -> String {
        let mut c = TcpStream::connect(self.addr()).await.expect("connect");
        command(&mut c, args).await.unwrap_or_default()
    }

    /// The node's `ROLE` reply. A drain kills every client of an old primary at moments the
    /// test does not choose (the flip, the fence's end), so a connection killed before it is
    /// answered is opened again: what is asserted is the role, not our connection's luck.
    async fn role(&self) -> String {
        for _ in 0..20 {
            let reply = self.ask(&["ROLE"]).await;
            if !reply.is_empty() {
                return reply;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        String::new()
    }

    async fn info(&self, section: &str) -> String {
        self.ask(&["INFO", section]).await
    }
}

/// A port nothing listens on (it was free a moment ago).
fn free_port() -> u16 {
    polestar_lab::free_port().expect("a free port")
}

// ---------------------------------------------------------------------------------------------
// Raw RESP clients: what a persistent application connection looks like to the node.

fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend(format!("${}\r\n{a}\r\n", a.len()).into_bytes());
    }
    out
}

/// Sends a command and returns the first chunk of the reply (None on EOF, error or 2 s).
async fn command(c: &mut TcpStream, args: &[&str]) -> Option<String> {
    c.write_all(&encode(args)).await.ok()?;
    read_some(c, Duration::from_secs(2)).await
}

async fn read_some(c: &mut TcpStream, within: Duration) -> Option<String> {
    let mut buf = vec![0u8; 64 * 1024];
    match timeout(within, c.read(&mut buf)).await {
        Ok(Ok(n)) if n > 0 => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
        _ => None,
    }
}

/// Reads until the node closes the connection; the moment it did, or None after `limit`.
async fn closed(mut c: TcpStream, limit: Duration) -> Option<Instant> {
    let deadline = tokio::time::Instant::now() + limit;
    let mut buf = vec![0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, c.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(Instant::now()),
            Ok(Ok(_)) => {}
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum ClientKind {
    Idle,
    Writer,
    Blocked,
    Subscriber,
}

/// Connects a client of `kind` and returns a task that ends when the node closes it.
async fn client(addr: SocketAddr, kind: ClientKind, n: usize) -> JoinHandle<Option<Instant>> {
    let mut c = TcpStream::connect(addr).await.expect("connect client");
    let limit = Duration::from_secs(20);
    match kind {
        ClientKind::Idle => {
            command(&mut c, &["PING"]).await.expect("PONG");
            tokio::spawn(closed(c, limit))
        }
        ClientKind::Blocked => {
            c.write_all(&encode(&["BLPOP", &format!("list-{n}"), "0"])).await.expect("BLPOP");
            tokio::spawn(closed(c, limit))
        }
        ClientKind::Subscriber => {
            command(&mut c, &["SUBSCRIBE", "news"]).await.expect("subscribed");
            tokio::spawn(closed(c, limit))
        }
        ClientKind::Writer => {
            command(&mut c, &["INCR", "counter"]).await.expect("first INCR");
            tokio::spawn(write_until_closed(c, limit))
        }
    }
}

/// Pipelines INCRs (10 at a time) until the connection is closed.
async fn write_until_closed(mut c: TcpStream, limit: Duration) -> Option<Instant> {
    let started = Instant::now();
    let batch: Vec<u8> = (0..10).flat_map(|_| encode(&["INCR", "counter"])).collect();
    while started.elapsed() < limit {
        if c.write_all(&batch).await.is_err() {
            return Some(Instant::now());
        }
        if read_some(&mut c, limit).await.is_none() {
            return Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

async fn named(addr: SocketAddr, name: &str) -> TcpStream {
    let mut c = TcpStream::connect(addr).await.expect("connect");
    assert_eq!(command(&mut c, &["CLIENT", "SETNAME", name]).await.as_deref(), Some("+OK\r\n"));
    c
}

async fn clients(
    addr: SocketAddr,
    mix: &[(ClientKind, usize)],
) -> Vec<JoinHandle<Option<Instant>>> {
    let mut out = Vec::new();
    for (kind, count) in mix {
        for n in 0..*count {
            out.push(client(addr, *kind, n).await);
        }
    }
    out
}

/// Waits for every client to be closed; the close moments, or the number still open.
async fn all_closed(tasks: Vec<JoinHandle<Option<Instant>>>) -> Result<Vec<Instant>, usize> {
    let mut times = Vec::new();
    let mut open = 0;
    for t in tasks {
        match t.await.expect("client task") {
            Some(at) => times.push(at),
            None => open += 1,
        }
    }
    if open == 0 { Ok(times) } else { Err(open) }
}

// ---------------------------------------------------------------------------------------------
// The drain side under test.

struct Harness {
    signals: mpsc::UnboundedSender<Signal>,
    events: Arc<EventLog>,
    handle: DrainHandle,
    topology: topology::Publisher,
    shutdown: CancellationToken,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn settings(grace_ms: u64, interval_ms: u64, window_ms: u64, rate: u32) -> config::Drain {
    config::Drain {
        enabled: true,
        grace: Duration::from_millis(grace_ms),
        interval: Duration::from_millis(interval_ms),
        window: Duration::from_millis(window_ms),
        rate,
        spare: config::Spare::default(),
    }
}

fn harness(cfg: config::Drain) -> Harness {
    let events = Arc::new(EventLog::new());
    let (topology, reader) = topology::channel();
    let coordinator = Coordinator::new(cfg, Auth::default(), events.clone(), reader);
    let handle = coordinator.handle();
    let (signals, rx) = mpsc::unbounded_channel();
    let shutdown = CancellationToken::new();
    tokio::spawn(coordinator.run(rx, shutdown.clone()));
    Harness { signals, events, handle, topology, shutdown }
}

impl Harness {
    fn send(&self, signal: Signal) {
        self.signals.send(signal).expect("coordinator running");
    }

    fn flip(&self, master: &str, old: &Server, new: Node) {
        let old = Some(old.node());
        let at = Instant::now();
        self.send(Signal::Flipped {
            master: master.into(),
            old,
            new,
            epoch: 2,
            provisional: false,
            at,
        });
    }

    /// Publishes `primary` (and `replicas`) for `master`, as the decider would.
    fn publish(&self, master: &str, primary: Node, replicas: &[Node]) {
        let replicas = replicas
            .iter()
            .map(|n| Replica { ip: n.ip, port: n.port, hostname: None, healthy: true, down: false })
            .collect();
        let master = Master {
            withdrawn: None,
            provisional: false,
            name: master.into(),
            label: master.into(),
            primary: Some(primary),
            epoch: Some(2),
            since: Some(SystemTime::now()),
            state: MasterState::Ok,
            replicas,
            sentinels: SentinelCounts::default(),
        };
        self.topology.publish([master], true);
    }

    /// The first event of `kind` matching `pred`, waiting up to 10 s (generous: on a loaded
    /// machine; the events come within milliseconds).
    async fn event(&self, kind: Kind, pred: impl Fn(&Event) -> bool) -> Option<Event> {
        for _ in 0..200 {
            if let Some(e) = self.events.since(None).into_iter().find(|e| e.kind == kind && pred(e))
            {
                return Some(e);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    fn count(&self, kind: Kind) -> usize {
        self.events.since(None).iter().filter(|e| e.kind == kind).count()
    }
}

fn field<'a>(e: &'a Event, key: &str) -> &'a serde_json::Value {
    e.data.get(key).unwrap_or(&serde_json::Value::Null)
}

fn spare_names(cfg: &mut config::Drain, names: &[&str]) {
    cfg.spare.names = names.iter().map(|s| s.to_string()).collect();
}

async fn replica_of(primary: &Server) -> Server {
    replica_of_with(&Flavor::Redis, primary).await
}

/// A replica of `primary` that receives its stream: a write to the primary has reached it.
/// `master_link_status:up` alone is not that: after a diskless full sync the primary holds the
/// stream until the replica's first `REPLCONF ACK`, up to a second later, and a failover in
/// that second (seen on a loaded machine) promotes a replica that lacks every write since.
async fn replica_of_with(flavor: &Flavor, primary: &Server) -> Server {
    let port = primary.port().to_string();
    let replica = Server::start_on(flavor, &["--replicaof", "127.0.0.1", &port]).await;
    // Generous: a full sync on a loaded machine (a CI run took more than 5 s once).
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if replica.info("replication").await.contains("master_link_status:up") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Written after the link is up, so in the stream, never in the sync's snapshot.
    let mut mark = 0u64;
    while Instant::now() < deadline {
        mark += 1;
        primary.ask(&["SET", "lab:streamed", &mark.to_string()]).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let got = replica.ask(&["GET", "lab:streamed"]).await;
        if got.lines().nth(1) == Some(mark.to_string().as_str()) {
            return replica;
        }
    }
    panic!("replica never streamed within 30 s:\n{}", replica.info("replication").await);
}

fn other_node() -> Node {
    Node { ip: [127, 0, 0, 1].into(), port: free_port(), hostname: None }
}

// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flip_kills_every_client_but_the_spared_and_the_replication_link() {
    flip_kills_every_client_but_the_spared(&Flavor::Redis).await;
}

/// Valkey 8: its `CLIENT LIST` (more fields, `lib-name`/`lib-ver`, `flags=S` for the
/// replication link) is read the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_flip_kills_every_client_but_the_spared_and_the_replication_link() {
    flip_kills_every_client_but_the_spared(&crate::common::valkey()).await;
}

async fn flip_kills_every_client_but_the_spared(flavor: &Flavor) {
    let old = Server::start_on(flavor, &[]).await;
    let replica = replica_of_with(flavor, &old).await;
    let mix = [
        (ClientKind::Idle, 100),
        (ClientKind::Writer, 40),
        (ClientKind::Blocked, 30),
        (ClientKind::Subscriber, 29),
    ];
    let tasks = clients(old.addr(), &mix).await;
    let mut keep = named(old.addr(), "keepme").await;
    let mut cfg = settings(1500, 250, 30_000, 2000);
    spare_names(&mut cfg, &["keepme"]);
    let h = harness(cfg);

    let flipped = Instant::now();
    h.flip("m", &old, replica.node());

    let times = timeout(Duration::from_secs(10), all_closed(tasks)).await.expect("in time");
    let times = times.unwrap_or_else(|open| panic!("{open} clients still connected"));
    let slowest = times.iter().map(|t| t.duration_since(flipped)).max().unwrap_or_default();
    eprintln!("199 clients killed within {slowest:?} of the flip");
    assert!(slowest < Duration::from_secs(5), "took {slowest:?}");
    assert_eq!(command(&mut keep, &["PING"]).await.as_deref(), Some("+PONG\r\n"));
    assert!(old.info("replication").await.contains("connected_slaves:1"));
    assert!(replica.info("replication").await.contains("master_link_status:up"));

    let drain = h.event(Kind::Drain, |e| field(e, "reason") == "flip").await.expect("drain event");
    assert_eq!(field(&drain, "killed"), 199);
    assert_eq!(field(&drain, "spared_by")["name"], 1);
    assert_eq!(field(&drain, "spared_by")["replication"], 1);
    assert_eq!(field(&drain, "spared_by")["own"], 1);
    assert!(field(&drain, "duration_ms").is_u64());
    let fence = h.event(Kind::Fence, |_| true).await.expect("fence event");
    assert!(fence.id < drain.id, "drained before fencing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_holds_writes_and_abort_lifts_it() {
    let old = Server::start(&[]).await;
    let h = harness(settings(300, 100, 30_000, 2000));
    let mut writer = TcpStream::connect(old.addr()).await.expect("connect");
    assert!(command(&mut writer, &["PING"]).await.is_some());

    h.send(Signal::Promoting {
        master: "m".into(),
        old: old.node(),
        new: None,
        at: Instant::now(),
        coordinated: false,
    });
    h.event(Kind::Fence, |_| true).await.expect("fence event");
    writer.write_all(&encode(&["SET", "k", "v"])).await.expect("send SET");
    // Held past the grace: a slow promotion keeps the fence until the flip or the abort.
    assert_eq!(read_some(&mut writer, Duration::from_millis(800)).await, None, "write not held");
    assert_eq!(old.ask(&["GET", "k"]).await, "$-1\r\n", "a held write ran");

    h.send(Signal::Aborted { master: "m".into(), gave_up: false });
    let reply = read_some(&mut writer, Duration::from_secs(2)).await;
    assert_eq!(reply.as_deref(), Some("+OK\r\n"));
    let unfence = h.event(Kind::Unfence, |_| true).await.expect("unfence event");
    assert_eq!(field(&unfence, "reason"), "aborted");
    assert_eq!(old.ask(&["GET", "k"]).await, "$1\r\nv\r\n");

    // A later promotion of the same node fences it again.
    h.send(Signal::Promoting {
        master: "m".into(),
        old: old.node(),
        new: None,
        at: Instant::now(),
        coordinated: false,
    });
    for _ in 0..200 {
        if h.count(Kind::Fence) == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(h.count(Kind::Fence), 2, "not fenced again");
    writer.write_all(&encode(&["SET", "k", "w"])).await.expect("send SET");
    assert_eq!(read_some(&mut writer, Duration::from_millis(500)).await, None, "write not held");
}

/// The ids of the connections named `polestar` on `server`.
async fn polestar_ids(server: &Server) -> Vec<u64> {
    let list = server.ask(&["CLIENT", "LIST"]).await;
    let named = list.lines().filter(|l| l.split(' ').any(|w| w == "name=polestar"));
    named.filter_map(|l| l.strip_prefix("id=")?.split(' ').next()?.parse().ok()).collect()
}

/// Every side of polestar opens a data-node connection one way, a `node::Link`:
/// named `polestar` (so that drains and sweeps, ours or another polestar's, spare it) and
/// knowing its own client id (so that a drain never kills itself), with a first question
/// sent in the naming's round trip, after the naming; a hung node costs one deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_link_is_named_knows_its_client_id_and_a_hung_node_costs_one_deadline() {
    let server = Server::start(&[]).await;
    let endpoint = Endpoint::at(server.addr(), &Auth::default());
    let link = Link::open(&endpoint, Duration::from_secs(5)).await.expect("open a link");
    let id = link.id().expect("the link knows its client id");
    assert_eq!(polestar_ids(&server).await, [id], "one connection named polestar, with that id");

    let mut list = redis::cmd("CLIENT");
    list.arg("LIST");
    let (asker, text): (Link, String) =
        Link::open_with(&endpoint, "CLIENT LIST", &list, Duration::from_secs(5))
            .await
            .expect("open a link with a first question");
    let asker_id = asker.id().expect("the second link knows its client id");
    let own = parse_list(&text).clients.into_iter().find(|c| c.id == asker_id);
    let own = own.unwrap_or_else(|| panic!("its own connection is not listed: {text}"));
    assert_eq!(own.name, "polestar", "the first question went before the naming: {text}");
    assert_eq!(own.infrastructure(), Some(Infrastructure::Polestar));

    server.signal(nix::sys::signal::Signal::SIGSTOP);
    // `Timeout` is our deadline's: the transport's own (2 s) would be a `Command` or `Connect`
    // error.
    let deadline = Duration::from_millis(300);
    let role = link.role(deadline).await;
    assert!(matches!(role, Err(NodeError::Timeout { .. })), "{role:?}");
    let opened = Link::open(&endpoint, deadline).await.map(|_| ());
    assert!(matches!(opened, Err(NodeError::Timeout { .. })), "{opened:?}");
    server.signal(nix::sys::signal::Signal::SIGCONT);
}

/// The link the fence needs (docs/decisions.md D9) is opened at the first sign of a failover, so
/// the fence at the promotion is one round trip on it, not a connection opened then (on a loaded
/// machine that came after Sentinel promoted the replica, and writes were lost). A link the node
/// closed meanwhile (its `timeout`) is replaced at once, not one fence interval later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_goes_over_the_link_opened_at_the_first_sign_of_the_failover() {
    let old = Server::start(&[]).await;
    let h = harness(settings(300, 100, 30_000, 2000));
    h.send(Signal::FailoverStarted { master: "m".into(), primary: old.node() });
    let mut warm = Vec::new();
    for _ in 0..200 {
        warm = polestar_ids(&old).await;
        if !warm.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(warm.len(), 1, "no link opened at the first sign of the failover: {warm:?}");
    assert_eq!(h.count(Kind::Fence), 0, "fenced before the promotion");

    h.send(Signal::Promoting {
        master: "m".into(),
        old: old.node(),
        new: None,
        at: Instant::now(),
        coordinated: false,
    });
    let fence = h.event(Kind::Fence, |_| true).await.expect("fence event");
    assert_eq!(field(&fence, "round_trips"), 1, "{fence:?}");
    assert_eq!(polestar_ids(&old).await, warm, "the fence opened another connection");

    // The failover aborts; the node closes the link; the next promotion reconnects at once.
    h.send(Signal::Aborted { master: "m".into(), gave_up: false });
    h.event(Kind::Unfence, |_| true).await.expect("unfence event");
    let killed = old.ask(&["CLIENT", "KILL", "ID", &warm[0].to_string()]).await;
    assert_eq!(killed, ":1\r\n");
    h.send(Signal::Promoting {
        master: "m".into(),
        old: old.node(),
        new: None,
        at: Instant::now(),
        coordinated: false,
    });
    let fence = h.event(Kind::Fence, |e| e.id > fence.id).await.expect("a second fence event");
    assert!(field(&fence, "round_trips").as_u64() > Some(1), "{fence:?}");
    assert_eq!(h.count(Kind::NodeUnreachable), 0, "the closed link cost a fence attempt");
}

/// Regression (docs/failover.md, "How a fence ends"): one Sentinel's `+selected-slave` and nothing
/// after it (the leader died, an event was lost) fenced the primary for the whole window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_that_no_promotion_follows_is_lifted_within_seconds() {
    let old = Server::start(&[]).await;
    let h = harness(settings(200, 100, 60_000, 2000));
    let promoted = Instant::now();
    h.send(Signal::Promoting {
        master: "m".into(),
        old: old.node(),
        new: None,
        at: promoted,
        coordinated: false,
    });
    h.event(Kind::Fence, |_| true).await.expect("fence event");
    let mut writer = TcpStream::connect(old.addr()).await.expect("connect");
    writer.write_all(&encode(&["SET", "k", "v"])).await.expect("send SET");
    assert_eq!(read_some(&mut writer, Duration::from_secs(2)).await, None, "write not held");
    // Left to lapse (no UNPAUSE: another polestar may have seen the flip): the node is still
    // the primary, so the held write runs then.
    let reply = read_some(&mut writer, Duration::from_secs(8)).await;
    let lifted = promoted.elapsed();
    assert_eq!(reply.as_deref(), Some("+OK\r\n"), "after {lifted:?}");
    assert!(lifted < Duration::from_secs(7), "lifted after {lifted:?}");
    let unfence = h.event(Kind::Unfence, |_| true).await.expect("unfence event");
    assert_eq!(field(&unfence, "reason"), "unconfirmed");
    assert!(old.role().await.contains("master"));
}

/// Regression (docs/decisions.md D12): the decider's own give-up (`FENCE_WITHOUT_FLIP` with no
/// flip) sent `CLIENT UNPAUSE`, which lifts every polestar's pause, also the fence of another
/// polestar that saw the flip. Given up, the pause is left to lapse; another's (here the test's
/// own, 4 s) still holds the write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn giving_up_a_promotion_leaves_another_polestars_fence_in_place() {
    let old = Server::start(&[]).await;
    let h = harness(settings(200, 100, 60_000, 2000));
    h.send(Signal::Promoting {
        master: "m".into(),
        old: old.node(),
        new: None,
        at: Instant::now(),
        coordinated: false,
    });
    h.event(Kind::Fence, |_| true).await.expect("fence event");
    assert!(old.ask(&["CLIENT", "PAUSE", "4000", "WRITE"]).await.contains("OK"));
    let others_until = Instant::now() + Duration::from_secs(4);
    let mut writer = TcpStream::connect(old.addr()).await.expect("connect");
    writer.write_all(&encode(&["SET", "k", "v"])).await.expect("send SET");
    h.send(Signal::Aborted { master: "m".into(), gave_up: true });
    let unfence = h.event(Kind::Unfence, |_| true).await.expect("unfence event");
    assert_eq!(field(&unfence, "reason"), "gave_up");
    let reply = read_some(&mut writer, Duration::from_secs(8)).await;
    assert_eq!(reply.as_deref(), Some("+OK\r\n"), "the write runs once the other pause lapses");
    assert!(
        Instant::now() + Duration::from_millis(300) >= others_until,
        "the other polestar's fence was lifted {:?} early",
        others_until - Instant::now()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_writes_never_run_on_the_old_primary_which_is_demoted_at_the_flip() {
    let old = Server::start(&[]).await;
    let new = Server::start(&[]).await;
    let h = harness(settings(500, 100, 30_000, 2000));
    let mut writer = TcpStream::connect(old.addr()).await.expect("connect");
    assert!(command(&mut writer, &["PING"]).await.is_some());
    h.send(Signal::Promoting {
        master: "m".into(),
        old: old.node(),
        new: Some(new.node()),
        at: Instant::now(),
        coordinated: false,
    });
    h.event(Kind::Fence, |_| true).await.expect("fence event");
    writer.write_all(&encode(&["SET", "k", "lost"])).await.expect("send SET");
    assert_eq!(read_some(&mut writer, Duration::from_millis(300)).await, None);

    let flipped = Instant::now();
    h.flip("m", &old, new.node());
    // The held write is never acknowledged: its client is killed (or refused) at the demotion.
    let reply = read_some(&mut writer, Duration::from_secs(2)).await.unwrap_or_default();
    assert!(!reply.starts_with('+'), "held write acknowledged: {reply:?}");
    let demote = h.event(Kind::Demote, |_| true).await.expect("demote event");
    assert_eq!(field(&demote, "to"), new.addr().to_string().as_str());
    assert!(
        flipped.elapsed() < Duration::from_secs(2),
        "demoted {:?} after the flip",
        flipped.elapsed()
    );
    assert!(old.role().await.contains("slave"), "not demoted");
    // A client with a stale cache inside the grace: refused at once, then killed.
    let mut stale = TcpStream::connect(old.addr()).await.expect("connect");
    let reply = command(&mut stale, &["SET", "k", "stale"]).await.unwrap_or_default();
    assert!(reply.starts_with("-READONLY"), "{reply:?}");
    assert!(closed(stale, Duration::from_secs(2)).await.is_some(), "stale writer not killed");
    assert_eq!(new.ask(&["GET", "k"]).await, "$-1\r\n", "a held write ran");
    // No pause left behind: reads answer at once.
    assert_eq!(old.ask(&["PING"]).await, "+PONG\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_back_inside_the_grace_is_killed_again_a_reader_after_it_is_left_alone() {
    let old = Server::start(&[]).await;
    let new = Server::start(&[]).await;
    let h = harness(settings(1500, 100, 30_000, 2000));
    let flipped = Instant::now();
    h.flip("m", &old, new.node());

    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut stale = TcpStream::connect(old.addr()).await.expect("connect");
    assert!(command(&mut stale, &["PING"]).await.is_some());
    let killed = closed(stale, Duration::from_secs(2)).await.expect("stale client killed");
    assert!(killed.duration_since(flipped) < Duration::from_millis(1500 + 300));

    tokio::time::sleep_until((flipped + Duration::from_millis(1800)).into()).await;
    let mut reader = TcpStream::connect(old.addr()).await.expect("connect");
    assert!(command(&mut reader, &["GET", "k"]).await.is_some());
    assert_eq!(closed(reader, Duration::from_millis(2500)).await, None, "reader killed");
    assert!(h.count(Kind::Drain) >= 2, "the sweep that killed the stale client was not recorded");
    assert!(old.role().await.contains("slave"), "not demoted");
}

/// Stale writers (docs/decisions.md D14): a client that caches the old address (or pins it) writes
/// into the demoted node, gets `READONLY`, and is killed until the window ends so that it resolves
/// again; a reader of the same node stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_writers_are_killed_until_the_window_ends_readers_stay() {
    let old = Server::start(&[]).await;
    let new = Server::start(&[]).await;
    let h = harness(settings(300, 100, 6_000, 2000));
    let flipped = Instant::now();
    h.flip("m", &old, new.node());
    h.event(Kind::Demote, |_| true).await.expect("demote event");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let mut reader = TcpStream::connect(old.addr()).await.expect("connect");
    assert!(command(&mut reader, &["GET", "k"]).await.is_some());
    let reading = tokio::spawn(closed(reader, Duration::from_secs(4)));
    // A pinned writer: every reconnect is refused and killed again.
    for _ in 0..3 {
        let mut pinned = TcpStream::connect(old.addr()).await.expect("connect");
        let reply = command(&mut pinned, &["INCR", "counter"]).await.unwrap_or_default();
        assert!(reply.starts_with("-READONLY"), "{reply:?}");
        assert!(closed(pinned, Duration::from_secs(3)).await.is_some(), "stale writer not killed");
    }
    assert_eq!(reading.await.expect("reader task"), None, "the reader was killed");
    let swept = h.event(Kind::Drain, |e| field(e, "reason") == "stale_writer").await;
    assert!(swept.is_some_and(|e| field(&e, "killed").as_u64() >= Some(1)));
    // After the window, writers are left alone.
    tokio::time::sleep_until((flipped + Duration::from_millis(6_500)).into()).await;
    let mut late = TcpStream::connect(old.addr()).await.expect("connect");
    assert!(command(&mut late, &["INCR", "counter"]).await.is_some());
    assert_eq!(closed(late, Duration::from_millis(1500)).await, None, "killed after the window");
}

/// Regression (docs/failover.md, "An abort"): an abort after a provisional flip reverted DNS but
/// left the fence and the drain of the real primary running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_after_a_provisional_flip_undoes_the_fence_and_the_drain() {
    let old = Server::start(&[]).await;
    let new = Server::start(&[]).await;
    let idle = clients(old.addr(), &[(ClientKind::Idle, 5)]).await;
    let mut cfg = settings(3000, 100, 30_000, 2000);
    spare_names(&mut cfg, &["keepme"]);
    let h = harness(cfg);
    let at = Instant::now();
    h.send(Signal::Promoting {
        master: "m".into(),
        old: old.node(),
        new: Some(new.node()),
        at,
        coordinated: false,
    });
    h.send(Signal::Flipped {
        master: "m".into(),
        old: Some(old.node()),
        new: new.node(),
        epoch: 2,
        provisional: true,
        at,
    });
    all_closed(idle).await.unwrap_or_else(|open| panic!("{open} clients still connected"));
    // Spared, so that the sweeps of the grace leave it to show the fence.
    let mut writer = named(old.addr(), "keepme").await;
    writer.write_all(&encode(&["SET", "k", "v"])).await.expect("send SET");
    assert_eq!(read_some(&mut writer, Duration::from_millis(500)).await, None, "write not held");
    assert!(old.role().await.contains("master"), "demoted before the confirmation");

    h.send(Signal::Aborted { master: "m".into(), gave_up: false });
    let reply = read_some(&mut writer, Duration::from_secs(2)).await;
    assert_eq!(reply.as_deref(), Some("+OK\r\n"), "the fence was not lifted");
    let unfence = h.event(Kind::Unfence, |_| true).await.expect("unfence event");
    assert_eq!(field(&unfence, "reason"), "aborted");
    // Inside the grace of the withdrawn flip: no sweep kills the primary's clients any more.
    let back = clients(old.addr(), &[(ClientKind::Idle, 3), (ClientKind::Writer, 1)]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(back.iter().all(|t| !t.is_finished()), "a client of the primary was killed");
    assert!(old.role().await.contains("master"));
    assert_eq!(h.count(Kind::Demote), 0);
}

/// A provisional flip drains at once, keeps the node fenced, and demotes it when the
/// promotion is confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provisional_flip_is_demoted_once_confirmed() {
    let old = Server::start(&[]).await;
    let new = Server::start(&[]).await;
    let h = harness(settings(1500, 100, 30_000, 2000));
    let at = Instant::now();
    h.send(Signal::Flipped {
        master: "m".into(),
        old: Some(old.node()),
        new: new.node(),
        epoch: 2,
        provisional: true,
        at,
    });
    h.event(Kind::Fence, |_| true).await.expect("fence event");
    let mut writer = TcpStream::connect(old.addr()).await.expect("connect");
    writer.write_all(&encode(&["SET", "k", "v"])).await.expect("send SET");
    assert_eq!(read_some(&mut writer, Duration::from_millis(500)).await, None, "write not held");
    assert!(old.role().await.contains("master"));
    h.send(Signal::Confirmed { master: "m".into(), new: new.node(), epoch: 2 });
    h.event(Kind::Demote, |_| true).await.expect("demote event");
    let reply = read_some(&mut writer, Duration::from_secs(2)).await.unwrap_or_default();
    assert!(!reply.starts_with('+'), "held write acknowledged: {reply:?}");
    assert!(old.role().await.contains("slave"));
}

/// A node that refuses `REPLICAOF` (here an ACL without it) stays fenced, and its fence ends as
/// it did before demotion existed: held clients killed in the transaction that lifts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_refuses_replicaof_stays_fenced_and_no_held_write_runs() {
    let acl = ["--user", "default", "on", "nopass", "~*", "&*", "+@all", "-replicaof", "-slaveof"];
    let old = Server::start(&acl).await;
    let new = Server::start(&[]).await;
    let h = harness(settings(300, 100, 30_000, 2000));
    h.send(Signal::Promoting {
        master: "m".into(),
        old: old.node(),
        new: None,
        at: Instant::now(),
        coordinated: false,
    });
    h.event(Kind::Fence, |_| true).await.expect("fence event");
    h.flip("m", &old, new.node());
    let refused = h.event(Kind::DemoteRefused, |_| true).await.expect("refused");
    assert!(
        field(&refused, "why").as_str().is_some_and(|w| w.contains("replicaof")),
        "{refused:?}"
    );
    // Past the grace: the write is held by the fence (and its client killed as a stale writer).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut writer = TcpStream::connect(old.addr()).await.expect("connect");
    writer.write_all(&encode(&["SET", "k", "held"])).await.expect("send SET");
    let reply = read_some(&mut writer, Duration::from_secs(2)).await.unwrap_or_default();
    assert!(!reply.starts_with('+'), "a write acknowledged while the fence should hold: {reply:?}");
    let unfence = h.event(Kind::Unfence, |_| true).await.expect("the fence ends");
    assert_eq!(field(&unfence, "reason"), "fence_over");
    assert_eq!(old.ask(&["GET", "k"]).await, "$-1\r\n", "a held write ran");
}

/// An old primary that Sentinel promotes again (it answered replica, now master) is never
/// demoted by a late or repeated signal of the failover that demoted it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_primary_promoted_again_is_never_demoted_by_a_late_signal() {
    let old = Server::start(&[]).await;
    let new = Server::start(&[]).await;
    let h = harness(settings(300, 100, 30_000, 2000));
    h.flip("m", &old, new.node());
    h.event(Kind::Demote, |_| true).await.expect("demote event");
    assert_eq!(old.ask(&["REPLICAOF", "NO", "ONE"]).await, "+OK\r\n");
    h.send(Signal::Confirmed { master: "m".into(), new: new.node(), epoch: 2 });
    let refused = h.event(Kind::DemoteRefused, |_| true).await.expect("refused");
    assert!(field(&refused, "why").as_str().is_some_and(|w| w.contains("promoted again")));
    assert!(old.role().await.contains("master"));
    assert_eq!(h.count(Kind::Demote), 1);
}

/// Regression (docs/failover.md, "A returning old primary"): the returning-node drain checked
/// neither the epoch nor an ongoing failover, so it could fence and drain the replica being
/// promoted before it was published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replica_being_promoted_is_never_taken_for_a_returning_primary() {
    let primary = Server::start(&[]).await;
    let promoted = Server::start(&[]).await;
    let on_promoted =
        clients(promoted.addr(), &[(ClientKind::Idle, 5), (ClientKind::Writer, 1)]).await;
    let h = harness(settings(1500, 100, 30_000, 2000));
    h.publish("m", primary.node(), &[promoted.node()]);
    let returning = |epoch| Signal::Returning {
        master: "m".into(),
        node: promoted.node(),
        published: primary.node(),
        epoch,
    };
    // A stale signal (another epoch than the published one) is ignored.
    h.send(returning(1));
    // So is one while a failover of the master is under way.
    h.send(Signal::Promoting {
        master: "m".into(),
        old: primary.node(),
        new: Some(promoted.node()),
        at: Instant::now(),
        coordinated: false,
    });
    h.send(returning(2));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        on_promoted.iter().all(|t| !t.is_finished()),
        "a client of the promoted node was killed"
    );
    assert!(promoted.role().await.contains("master"));
    assert_eq!(h.count(Kind::Demote), 0);
    assert!(
        h.events
            .since(None)
            .iter()
            .all(|e| field(e, "node") != promoted.addr().to_string().as_str())
    );
}

/// Several polestars fence the same node (docs/decisions.md D12). One that saw only the
/// promotion lets its fence lapse instead of sending `CLIENT UNPAUSE`, so the fence of another
/// that saw the flip holds until that one demotes the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_polestar_never_lifts_the_fence_another_still_needs() {
    let old = Server::start(&[]).await;
    let new = Server::start(&[]).await;
    let (a, b) =
        (harness(settings(1500, 100, 30_000, 2000)), harness(settings(1500, 100, 30_000, 2000)));
    let promoting = || Signal::Promoting {
        master: "m".into(),
        old: old.node(),
        new: Some(new.node()),
        at: Instant::now(),
        coordinated: false,
    };
    a.send(promoting());
    b.send(promoting());
    tokio::time::sleep(Duration::from_secs(3)).await;
    b.send(Signal::Flipped {
        master: "m".into(),
        old: Some(old.node()),
        new: new.node(),
        epoch: 2,
        provisional: true,
        at: Instant::now(),
    });
    // A's fence ends (5 s after its promotion): the node must stay fenced for B.
    a.event(Kind::Unfence, |_| true).await.expect("A's fence ends");
    let mut writer = TcpStream::connect(old.addr()).await.expect("connect");
    writer.write_all(&encode(&["SET", "k", "v"])).await.expect("send SET");
    assert_eq!(read_some(&mut writer, Duration::from_millis(1000)).await, None, "unfenced early");
    b.send(Signal::Confirmed { master: "m".into(), new: new.node(), epoch: 2 });
    b.event(Kind::Demote, |_| true).await.expect("B demotes");
    let reply = read_some(&mut writer, Duration::from_secs(2)).await.unwrap_or_default();
    assert!(!reply.starts_with('+'), "held write acknowledged: {reply:?}");
    // A later confirmation on A finds the node demoted: nothing to do twice.
    a.send(Signal::Flipped {
        master: "m".into(),
        old: Some(old.node()),
        new: new.node(),
        epoch: 2,
        provisional: false,
        at: Instant::now(),
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(old.role().await.contains("slave"));
    assert_eq!(new.ask(&["GET", "k"]).await, "$-1\r\n", "a held write ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_is_paced_by_rate() {
    let old = Server::start(&[]).await;
    let tasks = clients(old.addr(), &[(ClientKind::Idle, 300)]).await;
    let h = harness(settings(1500, 250, 30_000, 100));
    let flipped = Instant::now();
    h.flip("m", &old, other_node());
    let times = all_closed(tasks).await.unwrap_or_else(|open| panic!("{open} still open"));
    let first = times.iter().min().map(|t| t.duration_since(flipped)).unwrap_or_default();
    let last = times.iter().max().map(|t| t.duration_since(flipped)).unwrap_or_default();
    eprintln!("300 clients at rate 100: first killed after {first:?}, last after {last:?}");
    assert!(first < Duration::from_millis(500), "first kill after {first:?}");
    assert!(last > Duration::from_secs(2) && last < Duration::from_secs(6), "last after {last:?}");
}

/// Several polestars (docs/failover.md, "Several polestars"): two polestars draining the same node
/// kill the same clients in the same order (by id, from the same listing), so together they
/// disconnect at about one rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_polestars_draining_one_node_kill_at_about_one_rate() {
    let old = Server::start(&[]).await;
    let tasks = clients(old.addr(), &[(ClientKind::Idle, 300)]).await;
    let (a, b) =
        (harness(settings(1500, 250, 30_000, 100)), harness(settings(1500, 250, 30_000, 100)));
    let flipped = Instant::now();
    a.flip("m", &old, other_node());
    b.flip("m", &old, other_node());
    let times = all_closed(tasks).await.unwrap_or_else(|open| panic!("{open} still open"));
    let last = times.iter().max().map(|t| t.duration_since(flipped)).unwrap_or_default();
    eprintln!("300 clients, two polestars at rate 100 each: last killed after {last:?}");
    // Alone, one would take 3 s; the two adding up their rates would take 1.5 s.
    assert!(last > Duration::from_millis(2300), "killed at twice the rate: {last:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_old_primary_delays_no_other_master_and_is_retried() {
    let hung = Server::start(&[]).await;
    let hung_clients = clients(hung.addr(), &[(ClientKind::Idle, 5)]).await;
    let live = Server::start(&[]).await;
    let live_clients =
        clients(live.addr(), &[(ClientKind::Idle, 50), (ClientKind::Blocked, 10)]).await;
    let closed_port = Node { ip: [127, 0, 0, 1].into(), port: free_port(), hostname: None };
    let h = harness(settings(500, 100, 30_000, 2000));

    hung.signal(nix::sys::signal::Signal::SIGSTOP);
    let flipped = Instant::now();
    h.flip("hung", &hung, other_node());
    let at = Instant::now();
    h.send(Signal::Flipped {
        master: "gone".into(),
        old: Some(closed_port),
        new: other_node(),
        epoch: 3,
        provisional: false,
        at,
    });
    h.flip("live", &live, other_node());

    let times = all_closed(live_clients).await.unwrap_or_else(|open| panic!("{open} still open"));
    let last = times.iter().max().map(|t| t.duration_since(flipped)).unwrap_or_default();
    eprintln!("live master drained {last:?} after the flips, beside a hung and a closed node");
    assert!(last < Duration::from_millis(500), "the live master waited {last:?}");
    let master = |name: &'static str| move |e: &Event| e.master.as_deref() == Some(name);
    assert!(h.event(Kind::NodeUnreachable, master("gone")).await.is_some());
    assert!(h.event(Kind::NodeUnreachable, master("hung")).await.is_some());

    // Back within the window: its clients (connected before the cutoff) are killed.
    hung.signal(nix::sys::signal::Signal::SIGCONT);
    let times = all_closed(hung_clients).await.unwrap_or_else(|open| panic!("{open} still open"));
    assert_eq!(times.len(), 5);
    assert!(h.event(Kind::Drain, master("hung")).await.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returning_node_that_still_claims_master_is_drained_and_demoted_at_once() {
    let primary = Server::start(&[]).await;
    let returning = Server::start(&[]).await;
    let replica = replica_of(&primary).await;
    let on_returning =
        clients(returning.addr(), &[(ClientKind::Idle, 20), (ClientKind::Writer, 5)]).await;
    let on_primary = clients(primary.addr(), &[(ClientKind::Idle, 5)]).await;
    let on_replica = clients(replica.addr(), &[(ClientKind::Idle, 5)]).await;
    let h = harness(settings(2000, 100, 30_000, 2000));
    h.publish("m", primary.node(), &[replica.node(), returning.node()]);

    for node in [primary.node(), replica.node(), returning.node()] {
        h.send(Signal::Returning { master: "m".into(), node, published: primary.node(), epoch: 2 });
    }
    let times = all_closed(on_returning).await.unwrap_or_else(|open| panic!("{open} still open"));
    assert_eq!(times.len(), 25);
    let demote = h.event(Kind::Demote, |_| true).await.expect("demote event");
    assert_eq!(field(&demote, "node").as_str(), Some(returning.addr().to_string().as_str()));
    assert_eq!(field(&demote, "to").as_str(), Some(primary.addr().to_string().as_str()));
    let mut late = TcpStream::connect(returning.addr()).await.expect("connect");
    let reply = command(&mut late, &["SET", "k", "v"]).await.unwrap_or_default();
    assert!(reply.starts_with("-READONLY"), "a returning node acknowledged a write: {reply:?}");

    // The published primary and a true replica are left alone.
    for task in on_primary.into_iter().chain(on_replica) {
        assert!(!task.is_finished(), "a client of the primary or the replica was closed");
    }
    assert_eq!(h.count(Kind::Demote), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_drain_reports_what_it_did() {
    let node = Server::start(&[]).await;
    let tasks = clients(node.addr(), &[(ClientKind::Idle, 10), (ClientKind::Subscriber, 2)]).await;
    let _keep = named(node.addr(), "keepme").await;
    let mut cfg = settings(1500, 250, 30_000, 2000);
    spare_names(&mut cfg, &["keep*"]);
    let h = harness(cfg);
    h.publish("m", node.node(), &[]);

    let report = h.handle.drain_now("m", node.addr()).await.expect("drained");
    assert_eq!(report.killed, 12);
    assert_eq!(report.spared_by.get("name"), Some(&1));
    assert_eq!(all_closed(tasks).await.map(|t| t.len()), Ok(12));
    let event = h.event(Kind::Drain, |e| field(e, "reason") == "manual").await.expect("event");
    assert_eq!(field(&event, "killed"), 12);

    let unknown = h.handle.drain_now("nope", node.addr()).await;
    assert!(matches!(unknown, Err(DrainError::UnknownMaster(_))), "{unknown:?}");
    let stranger = h.handle.drain_now("m", other_node().addr()).await;
    assert!(matches!(stranger, Err(DrainError::UnknownNode { .. })), "{stranger:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_published_again_is_unfenced_at_once() {
    let a = Server::start(&[]).await;
    let h = harness(settings(1500, 100, 30_000, 2000));
    h.send(Signal::Promoting {
        master: "m".into(),
        old: a.node(),
        new: None,
        at: Instant::now(),
        coordinated: false,
    });
    h.event(Kind::Fence, |_| true).await.expect("fence event");
    let at = Instant::now();
    h.send(Signal::Flipped {
        master: "m".into(),
        old: Some(other_node()),
        new: a.node(),
        epoch: 3,
        provisional: false,
        at,
    });
    let unfence = h.event(Kind::Unfence, |_| true).await.expect("unfence event");
    assert_eq!(field(&unfence, "reason"), "primary");
    assert_eq!(a.ask(&["SET", "k", "v"]).await, "+OK\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabled_draining_touches_nothing() {
    let old = Server::start(&[]).await;
    let tasks = clients(old.addr(), &[(ClientKind::Idle, 5)]).await;
    let mut cfg = settings(500, 100, 30_000, 2000);
    cfg.enabled = false;
    let h = harness(cfg);
    h.publish("m", old.node(), &[]);
    h.send(Signal::Promoting {
        master: "m".into(),
        old: old.node(),
        new: None,
        at: Instant::now(),
        coordinated: false,
    });
    h.flip("m", &old, other_node());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(old.ask(&["SET", "k", "v"]).await, "+OK\r\n");
    assert!(tasks.iter().all(|t| !t.is_finished()));
    assert!(matches!(h.handle.drain_now("m", old.addr()).await, Err(DrainError::Disabled)));
    assert!(h.events.since(None).is_empty());
}

/// The figure docs/limits.md quotes for `drain.rate`: 10,000 clients at the default rate (2000/s).
/// Run with `cargo test --test tests drain:: -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "opens 10,000 connections; a measurement, not a check"]
async fn ten_thousand_clients_at_the_default_rate() {
    let old = Server::start(&[]).await;
    let mut tasks = Vec::new();
    for _ in 0..10_000 {
        let c = TcpStream::connect(old.addr()).await.expect("connect");
        tasks.push(tokio::spawn(closed(c, Duration::from_secs(60))));
    }
    let listed = old.ask(&["CLIENT", "INFO"]).await;
    assert!(!listed.is_empty());
    let h = harness(settings(1500, 250, 30_000, 2000));
    let flipped = Instant::now();
    h.flip("m", &old, other_node());
    let times = all_closed(tasks).await.unwrap_or_else(|open| panic!("{open} still open"));
    let last = times.iter().max().map(|t| t.duration_since(flipped)).unwrap_or_default();
    eprintln!("10,000 clients at rate 2000: last killed {last:?} after the flip");
}

// ---------------------------------------------------------------------------------------------
// With a real Sentinel: a planned failover driven by Sentinel's own events, as the decider
// would relay them (Promoting at +selected-slave, Flipped at +promoted-slave).

/// One Sentinel watching `master` as `mm` (quorum 1), the lab's standalone `Server`; killed on
/// drop.
struct Sentinel {
    port: u16,
    _server: polestar_lab::Server,
}

async fn sentinel_for(master: &Server) -> Sentinel {
    let monitor = Monitor {
        name: "mm".into(),
        host: "127.0.0.1".into(),
        port: master.port(),
        quorum: 1,
        down_after: Duration::from_millis(2000),
        failover_timeout: Duration::from_millis(10_000),
        parallel_syncs: 1,
    };
    let server = polestar_lab::Server::start(ServerOptions::sentinel(&monitor)).await;
    let server = server.unwrap_or_else(|e| panic!("cannot start redis-sentinel: {e:#}"));
    Sentinel { port: server.port(), _server: server }
}

async fn sentinel_ask(port: u16, args: &[&str]) -> String {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    match TcpStream::connect(addr).await {
        Ok(mut c) => command(&mut c, args).await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// Where "DNS" sends clients: updated at the flip, read at every reconnect.
type Route = Arc<std::sync::Mutex<SocketAddr>>;

fn route_of(route: &Route) -> SocketAddr {
    *route.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Debug, Default)]
struct WriterLog {
    acked: u64,
    /// The first acknowledged write on each node.
    first_ok: Vec<(SocketAddr, Instant)>,
}

/// A Lettuce-like writer: one connection, no timeout, INCR after INCR; on an error or a
/// closed connection it reconnects to wherever the route points now.
async fn incr_writer(route: Route, stop: CancellationToken) -> WriterLog {
    let mut log = WriterLog::default();
    while !stop.is_cancelled() {
        let addr = route_of(&route);
        let Ok(Ok(mut c)) = timeout(Duration::from_millis(500), TcpStream::connect(addr)).await
        else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        while !stop.is_cancelled() {
            let reply = command_no_timeout(&mut c, &["INCR", "counter"]).await;
            match reply.as_deref() {
                Some(r) if r.starts_with(':') => {
                    log.acked += 1;
                    if !log.first_ok.iter().any(|(a, _)| *a == addr) {
                        log.first_ok.push((addr, Instant::now()));
                    }
                }
                _ => break,
            }
        }
    }
    log
}

async fn command_no_timeout(c: &mut TcpStream, args: &[&str]) -> Option<String> {
    c.write_all(&encode(args)).await.ok()?;
    read_some(c, Duration::from_secs(60)).await
}

/// A client blocked in BLPOP that re-blocks wherever the route points after losing its
/// connection; returns when it re-issued BLPOP on `target`.
async fn blpop_client(
    route: Route,
    target: SocketAddr,
    stop: CancellationToken,
) -> Option<Instant> {
    while !stop.is_cancelled() {
        let addr = route_of(&route);
        let Ok(mut c) = TcpStream::connect(addr).await else { continue };
        if c.write_all(&encode(&["BLPOP", "jobs", "0"])).await.is_err() {
            continue;
        }
        if addr == target {
            return Some(Instant::now());
        }
        let _ = closed(c, Duration::from_secs(60)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_sentinel_failover_loses_no_acknowledged_write() {
    use futures::StreamExt;
    let old = Server::start(&[]).await;
    let new = replica_of(&old).await;
    let sentinel = sentinel_for(&old).await;
    let h = harness(settings(1500, 250, 60_000, 2000));
    let route: Route = Arc::new(std::sync::Mutex::new(old.addr()));
    let stop = CancellationToken::new();
    let writer = tokio::spawn(incr_writer(route.clone(), stop.clone()));
    let blpop = tokio::spawn(blpop_client(route.clone(), new.addr(), stop.clone()));

    // Sentinel's events, relayed as the decider would.
    let url = format!("redis://127.0.0.1:{}/", sentinel.port);
    let mut pubsub = loop {
        if let Ok(c) = redis::Client::open(url.as_str()).expect("url").get_async_pubsub().await {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    pubsub.psubscribe("*").await.expect("psubscribe");
    let mut failover_ok = false;
    let mut commanded = Instant::now();
    for _ in 0..100 {
        commanded = Instant::now();
        let reply = sentinel_ask(sentinel.port, &["SENTINEL", "FAILOVER", "mm"]).await;
        if reply.starts_with("+OK") {
            failover_ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(failover_ok, "Sentinel never accepted the failover");
    let mut messages = pubsub.on_message();
    let mut flipped = None;
    while flipped.is_none() {
        let msg = timeout(Duration::from_secs(15), messages.next()).await;
        let msg = msg.expect("Sentinel events in time").expect("event stream open");
        let at = Instant::now();
        let payload: String = msg.get_payload().unwrap_or_default();
        let ms = SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        eprintln!("{} sentinel {} {payload}", ms.as_millis(), msg.get_channel_name());
        match msg.get_channel_name() {
            // The decider fences at the leader's election of the primary it publishes
            // (docs/decisions.md D9), and again at the selection.
            "+elected-leader" | "+selected-slave" | "+failover-state-send-slaveof-noone" => {
                h.send(Signal::Promoting {
                    master: "mm".into(),
                    old: old.node(),
                    new: None,
                    at,
                    coordinated: false,
                });
            }
            "+promoted-slave" => {
                *route.lock().unwrap_or_else(|p| p.into_inner()) = new.addr();
                h.send(Signal::Flipped {
                    master: "mm".into(),
                    old: Some(old.node()),
                    new: new.node(),
                    epoch: 1,
                    provisional: false,
                    at,
                });
                flipped = Some(at);
            }
            _ => {}
        }
    }
    let flipped = flipped.expect("flipped");

    // Sentinel demotes the old primary on its usual schedule: the fence does not hold it up.
    let mut demoted = None;
    for _ in 0..300 {
        if old.role().await.contains("slave") {
            demoted = Some(flipped.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.cancel();
    let log = writer.await.expect("writer");
    let blpop_back = blpop.await.expect("blpop client");
    let counter = new.ask(&["GET", "counter"]).await;
    let counter: u64 = counter.lines().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
    let recovered = log.first_ok.iter().find(|(a, _)| *a == new.addr()).map(|(_, t)| *t);
    let recovered = recovered.map(|t| t.saturating_duration_since(flipped));
    let blpop_back = blpop_back.map(|t| t.saturating_duration_since(flipped));
    eprintln!(
        "planned failover: flip {:?} after SENTINEL FAILOVER; writer back on the new primary \
         {recovered:?} after the flip, BLPOP client {blpop_back:?}; {} writes acknowledged, \
         counter {counter}, lost {}; old primary demoted {demoted:?} after the flip",
        flipped.duration_since(commanded),
        log.acked,
        log.acked.saturating_sub(counter)
    );
    for e in h.events.since(None) {
        eprintln!("{} {} {:?}", e.time_ms, e.kind, e.data);
    }
    assert!(counter >= log.acked, "lost {} acknowledged writes", log.acked - counter);
    assert!(recovered.is_some_and(|r| r < Duration::from_secs(1)), "writer: {recovered:?}");
    assert!(blpop_back.is_some_and(|r| r < Duration::from_secs(1)), "BLPOP: {blpop_back:?}");
    assert!(demoted.is_some(), "the old primary was never demoted");
}
