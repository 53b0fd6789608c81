//! The Sentinel endpoint's limits against the real binary and a real failover (docs/limits.md,
//! "Sentinel endpoint"): small input before AUTH, the authentication timeout, requests taken as
//! they arrive, hostile patterns that neither cost a flip its time nor get messages they do not
//! match, the idle timeout that a pooled real client outlives while subscribers are never
//! idle-closed; and, on the endpoint served in-process over real sockets, the per-address and total
//! connection caps and the shared input budget.

use crate::common::{Env, FAILOVER, PolestarConfig};

use std::net::SocketAddr;
use std::time::Duration;

use polestar_lab::{Lab, LabOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::{Instant, sleep, timeout};

const API_LINE: &str = "listening for Sentinel API on ";

async fn start(api: &str) -> (Env, SocketAddr) {
    let lab = Lab::start(LabOptions::default()).await.expect("the lab starts");
    let mut config = PolestarConfig::for_lab(&lab);
    config.extra = format!("sentinel_api:\n  listen: [\"127.0.0.1:0\"]\n{api}");
    let env = Env::with_config(lab, &config).await;
    let addr = env.ps.find_addr(API_LINE).expect("the Sentinel API listens");
    (env, addr)
}

/// Reads until `expect` arrived; everything read so far.
async fn read_until(stream: &mut TcpStream, expect: &str, within: Duration) -> String {
    let (mut seen, mut chunk) = (Vec::new(), vec![0u8; 16 * 1024]);
    let end = Instant::now() + within;
    while !String::from_utf8_lossy(&seen).contains(expect) {
        let left = end.saturating_duration_since(Instant::now());
        match timeout(left, stream.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => seen.extend_from_slice(&chunk[..n]),
            other => panic!("no {expect:?} ({other:?}); got {:?}", String::from_utf8_lossy(&seen)),
        }
    }
    String::from_utf8_lossy(&seen).into_owned()
}

async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut chunk = vec![0u8; 16 * 1024];
    let end = Instant::now() + within;
    loop {
        match timeout(end.saturating_duration_since(Instant::now()), stream.read(&mut chunk)).await
        {
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

fn metric(metrics: &str, series: &str) -> u64 {
    let line = metrics.lines().find(|l| l.starts_with(series)).unwrap_or_default();
    line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0) as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_auth_input_is_small_and_a_silent_client_is_closed_after_the_auth_timeout() {
    let secrets = tempfile::tempdir().expect("a temp dir");
    let password = secrets.path().join("api.pass");
    std::fs::write(&password, "limits-pass\n").expect("write the password file");
    let (env, api) = start(&format!("  password_file: {}\n", password.display())).await;
    let silent = TcpStream::connect(api).await.expect("connect");
    let opened = Instant::now();

    let big_bulk = format!("*2\r\n$4\r\nAUTH\r\n$5000\r\n{}", "x".repeat(100));
    let cases = [
        (big_bulk, "-ERR Protocol error: unauthenticated bulk length"),
        ("*11\r\n".to_string(), "-ERR Protocol error: unauthenticated multibulk length"),
        ("A".repeat(5000), "-ERR Protocol error: unauthenticated too big inline request"),
    ];
    for (input, expect) in &cases {
        let mut s = TcpStream::connect(api).await.expect("connect");
        s.write_all(input.as_bytes()).await.expect("write");
        read_until(&mut s, expect, Duration::from_secs(5)).await;
        assert!(closed_within(&mut s, Duration::from_secs(5)).await, "{expect}: closed");
    }

    // Authenticated, the same client may send a 7 KiB argument (past the 4 KiB allowed before
    // AUTH), in 1 KiB writes.
    let mut ok = TcpStream::connect(api).await.expect("connect");
    ok.write_all(b"AUTH limits-pass\r\n").await.expect("auth");
    read_until(&mut ok, "+OK\r\n", Duration::from_secs(5)).await;
    let body = "y".repeat(7 * 1024);
    let request = format!("*2\r\n$4\r\nECHO\r\n${}\r\n{body}\r\n", body.len());
    for piece in request.as_bytes().chunks(1024) {
        ok.write_all(piece).await.expect("write a piece");
        sleep(Duration::from_millis(2)).await;
    }
    let echoed = read_until(&mut ok, &format!("{body}\r\n"), Duration::from_secs(10)).await;
    assert!(echoed.contains(&format!("${}\r\n", body.len())), "the whole request echoed");

    // The client that never said a word: told and closed once AUTH_TIMEOUT is up, not before.
    let mut silent = silent;
    let limit = polestar::sentinel_api::AUTH_TIMEOUT;
    let said = read_until(&mut silent, "authentication timeout", limit + FAILOVER).await;
    let waited = opened.elapsed();
    assert!(said.starts_with("-ERR"), "{said:?}");
    assert!(waited >= limit - Duration::from_millis(100), "closed after {waited:?}");
    assert!(closed_within(&mut silent, Duration::from_secs(5)).await, "then closed");
    // The authenticated one is still served (the idle timeout is 60 s).
    ok.write_all(b"PING\r\n").await.expect("ping");
    read_until(&mut ok, "+PONG\r\n", Duration::from_secs(5)).await;

    let (_, metrics) = env.ps.get_text("/metrics").await.expect("metrics");
    let limited = "polestar_sentinel_api_limited_total{limit=";
    assert_eq!(metric(&metrics, &format!("{limited}\"unauthenticated_input\"}}")), 3);
    assert_eq!(metric(&metrics, &format!("{limited}\"auth_timeout\"}}")), 1);
    assert!(env.ps.logged("Sentinel API client hit a limit"), "logged (once per interval)");
}

/// Subscribers from many addresses, each with the pattern bytes it is allowed spent on
/// patterns that make a backtracking matcher work hardest, plus one that matches: every one
/// hears the real failover's `+switch-master` once per matching pattern, and none gets a
/// message for a pattern that does not match.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_patterns_get_only_their_matches_and_everyone_hears_the_switch() {
    const SUBSCRIBERS: usize = 400;
    let (env, api) = start("").await;
    // 15 patterns of ~250 bytes (`*+*+*+…*x`, `*-*-…`): none matches `+switch-master`.
    let hostile: Vec<String> = (0..15).map(|i| format!("{}*x{i}", "*+".repeat(120))).collect();
    let mut request = format!("*{}\r\n$10\r\nPSUBSCRIBE\r\n", hostile.len() + 2);
    for p in hostile.iter().map(String::as_str).chain(["*switch-m?ster"]) {
        request.push_str(&format!("${}\r\n{p}\r\n", p.len()));
    }
    let mut subscribers = Vec::with_capacity(SUBSCRIBERS);
    for i in 0..SUBSCRIBERS {
        // 100 per source address: the per-address cap is 256.
        let socket = TcpSocket::new_v4().expect("a socket");
        let source: SocketAddr = format!("127.0.1.{}:0", 1 + i / 100).parse().expect("an address");
        socket.bind(source).expect("bind a loopback source");
        let mut s = socket.connect(api).await.expect("connect");
        s.write_all(request.as_bytes()).await.expect("psubscribe");
        read_until(&mut s, ":16\r\n", Duration::from_secs(10)).await;
        subscribers.push(s);
    }
    let new = env.failover().await;
    let expect = format!("{}\r\n", new.port());
    let mut heard = 0;
    for s in &mut subscribers {
        let got = read_until(s, &expect, FAILOVER * 2).await;
        assert_eq!(got.matches("pmessage").count(), 1, "once, for its one match: {got:?}");
        assert!(got.contains("*switch-m?ster"), "{got:?}");
        heard += 1;
    }
    assert_eq!(heard, SUBSCRIBERS);
}

/// The idle timeout (`sentinel_api.idle_timeout`) closes a client that subscribes to nothing
/// (here after 1 s), which redis-py's `Sentinel` (it keeps its connection pooled between two
/// questions) outlives: it finds the connection closed and asks again on a new one; a
/// subscriber silent far past the timeout is never closed and hears the failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_redis_py_client_outlives_the_idle_timeout_and_subscribers_are_never_idle_closed()
{
    let (env, api) = start("  idle_timeout: 1s\n").await;
    let mut subscriber = TcpStream::connect(api).await.expect("connect");
    subscriber.write_all(b"SUBSCRIBE +switch-master\r\n").await.expect("subscribe");
    read_until(&mut subscriber, ":1\r\n", Duration::from_secs(5)).await;

    let python =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/venv/bin/python");
    assert!(python.exists(), "redis-py is not installed: run `bash tests/deps.sh`");
    let script = format!(
        "import time\nfrom redis.sentinel import Sentinel\n\
         s = Sentinel([('{}', {})], socket_timeout=2)\n\
         print(s.discover_master('{master}'), flush=True)\n\
         time.sleep(2.5)\n\
         print(s.discover_master('{master}'), flush=True)\n",
        api.ip(),
        api.port(),
        master = env.lab.master_name()
    );
    let run = tokio::process::Command::new(&python).args(["-c", &script]).output();
    let out =
        timeout(Duration::from_secs(30), run).await.expect("redis-py finishes").expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let primary = env.lab.primary().await.expect("the lab's primary");
    let expect = format!("('{}', {})", primary.ip(), primary.port());
    assert!(out.status.success(), "redis-py failed: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.lines().collect::<Vec<_>>(), [expect.as_str(), expect.as_str()]);
    let (_, metrics) = env.ps.get_text("/metrics").await.expect("metrics");
    let idle = metric(&metrics, "polestar_sentinel_api_limited_total{limit=\"idle_timeout\"}");
    assert!(idle >= 1, "redis-py's pooled connection was closed while it slept");
    assert!(env.ps.logged("an idle client (no subscription) was closed"), "logged");

    // Silent for seconds past the idle timeout, the subscriber still hears the switch.
    let new = env.failover().await;
    let heard = read_until(&mut subscriber, &format!("{}\r\n", new.port()), FAILOVER).await;
    assert!(heard.contains("+switch-master"), "{heard:?}");
}

// --- The endpoint in-process, over real sockets ----------------------------------------------

struct InProcess {
    addr: SocketAddr,
    stop: tokio_util::sync::CancellationToken,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    _publisher: polestar::topology::Publisher,
}

impl InProcess {
    async fn start(max_connections: usize, input_budget: usize) -> InProcess {
        let (publisher, reader) = polestar::topology::channel();
        let any: SocketAddr = "127.0.0.1:0".parse().expect("an address");
        let listeners = polestar::sentinel_api::bind(&[any]).await.expect("bind");
        let addr = listeners[0].local_addr().expect("bound");
        let api = polestar::sentinel_api::Api {
            topology: reader,
            peers: tokio::sync::watch::channel(Vec::new()).1,
            password: tokio::sync::watch::channel(None).1,
            max_connections,
            idle_timeout: Duration::from_secs(60),
            input_budget,
            events: std::sync::Arc::new(polestar::events::EventLog::new()),
        };
        let stop = tokio_util::sync::CancellationToken::new();
        let server = tokio::spawn(polestar::sentinel_api::serve(listeners, api, stop.clone()));
        InProcess { addr, stop, server, _publisher: publisher }
    }

    async fn stop(self) {
        self.stop.cancel();
        let stopped = timeout(Duration::from_secs(10), self.server).await;
        stopped.expect("the server stops").expect("no panic").expect("no error");
    }
}

async fn connect_from(to: SocketAddr, from: [u8; 4]) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("a socket");
    socket.bind((from, 0).into()).expect("bind a loopback source");
    socket.connect(to).await.expect("connect")
}

/// The per-address cap over the wire (docs/limits.md, "Sentinel endpoint"). One address holds 256
/// connections; its next is told Redis's `-ERR max number of clients reached` and closed while
/// another address still gets in; past `max_connections` every address is told the same, and
/// a connection that ends makes room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_past_its_share_and_a_full_endpoint_say_max_clients_and_close() {
    const PER_CLIENT: usize = polestar::sentinel_api::CONNECTIONS_PER_CLIENT;
    let server = InProcess::start(PER_CLIENT + 10, polestar::sentinel_api::INPUT_BUDGET).await;
    let mut held = Vec::new();
    for _ in 0..PER_CLIENT {
        let mut s = connect_from(server.addr, [127, 0, 3, 1]).await;
        s.write_all(b"PING\r\n").await.expect("ping");
        read_until(&mut s, "+PONG\r\n", Duration::from_secs(5)).await;
        held.push(s);
    }
    let refused = |mut s: TcpStream| async move {
        let said = read_until(&mut s, "\r\n", Duration::from_secs(5)).await;
        assert_eq!(said, "-ERR max number of clients reached\r\n");
        assert!(closed_within(&mut s, Duration::from_secs(5)).await, "then closed");
    };
    refused(connect_from(server.addr, [127, 0, 3, 1]).await).await;
    for _ in 0..10 {
        let mut s = connect_from(server.addr, [127, 0, 3, 2]).await;
        s.write_all(b"PING\r\n").await.expect("ping");
        read_until(&mut s, "+PONG\r\n", Duration::from_secs(5)).await;
        held.push(s);
    }
    refused(connect_from(server.addr, [127, 0, 3, 3]).await).await;
    drop(held.pop());
    // Once the endpoint has seen the close, the third address gets in.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut s = connect_from(server.addr, [127, 0, 3, 3]).await;
        s.write_all(b"PING\r\n").await.expect("ping");
        let said = read_until(&mut s, "\r\n", Duration::from_secs(5)).await;
        if said == "+PONG\r\n" {
            break;
        }
        assert!(Instant::now() < deadline, "no room made: {said:?}");
        sleep(Duration::from_millis(50)).await;
    }
    server.stop().await;
}

/// Incomplete requests draw on one budget shared by every connection (scaled down here to 64 KiB):
/// past it a client is told so and closed, not served silently nothing; whole requests (the honest
/// kind) are answered all the while; a request over `MAX_REQUEST` is a protocol error; and an
/// incomplete one is closed once `REQUEST_TIMEOUT` has passed, which gives its share of the budget
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incomplete_requests_share_a_budget_and_have_their_time() {
    use polestar::sentinel_api::{FREE_INPUT, MAX_REQUEST, REQUEST_TIMEOUT};
    const BUDGET: usize = 64 * 1024;
    const HOGS: usize = 10;
    let server = InProcess::start(100, BUDGET).await;

    let too_large =
        format!("*4\r\n$4\r\nECHO\r\n{}", format!("$8000\r\n{}\r\n", "z".repeat(8000)).repeat(3));
    assert!(too_large.len() > MAX_REQUEST);
    let mut s = TcpStream::connect(server.addr).await.expect("connect");
    s.write_all(too_large.as_bytes()).await.expect("write");
    read_until(&mut s, "-ERR Protocol error: request too large\r\n", Duration::from_secs(5)).await;
    assert!(closed_within(&mut s, Duration::from_secs(5)).await, "closed");

    // Each hog holds 8,004 argument bytes and 6,000 of the third argument: 14,004 pending, of
    // which all but FREE_INPUT is drawn on the budget, so at most 6 fit in 64 KiB.
    let hog = format!(
        "*3\r\n$4\r\nECHO\r\n$8000\r\n{}\r\n$8000\r\n{}",
        "h".repeat(8000),
        "h".repeat(6000)
    );
    let fit = BUDGET / (4 + 8000 + 6000 - FREE_INPUT);
    let mut hogs = Vec::new();
    for i in 0..HOGS {
        let mut s = TcpStream::connect(server.addr).await.expect("connect");
        s.write_all(hog.as_bytes()).await.expect("write");
        hogs.push((i, s, Instant::now()));
    }
    // Read together: a held hog's time is running.
    let answers = futures::future::join_all(hogs.into_iter().map(|(i, mut s, sent)| async move {
        let mut chunk = vec![0u8; 1024];
        let read = timeout(Duration::from_secs(3), s.read(&mut chunk)).await;
        let said = match read {
            Err(_) => None,
            Ok(Ok(n)) => Some(String::from_utf8_lossy(&chunk[..n]).into_owned()),
            Ok(Err(e)) => panic!("hog {i}: {e}"),
        };
        (i, s, sent, said)
    }));
    let (mut held, mut refused) = (Vec::new(), 0);
    for (i, mut s, sent, said) in answers.await {
        let Some(said) = said else {
            held.push((s, sent));
            continue;
        };
        assert!(said.contains("input of all clients is at its limit"), "hog {i}: {said:?}");
        assert!(closed_within(&mut s, Duration::from_secs(5)).await, "hog {i}: closed");
        refused += 1;
    }
    assert!(
        held.len() <= fit,
        "{} incomplete requests held, the budget has room for {fit}",
        held.len()
    );
    assert_eq!(refused, HOGS - held.len(), "every other hog was told why");
    assert!(refused > 0);

    // Whole requests, even large ones, draw nothing: answered while the budget is full.
    let mut honest = TcpStream::connect(server.addr).await.expect("connect");
    let body = "w".repeat(8000);
    let echo = format!("PING\r\n*2\r\n$4\r\nECHO\r\n$8000\r\n{body}\r\n");
    honest.write_all(echo.as_bytes()).await.expect("write");
    read_until(&mut honest, &format!("+PONG\r\n$8000\r\n{body}\r\n"), Duration::from_secs(5)).await;

    // The held hogs are closed once their time is up, not before, and make room again.
    for (mut s, sent) in held {
        let said =
            read_until(&mut s, "request not complete in time", REQUEST_TIMEOUT + FAILOVER).await;
        assert!(said.starts_with("-ERR"), "{said:?}");
        let waited = sent.elapsed();
        assert!(waited >= REQUEST_TIMEOUT - Duration::from_millis(200), "closed after {waited:?}");
    }
    let mut late = TcpStream::connect(server.addr).await.expect("connect");
    late.write_all(hog.as_bytes()).await.expect("write");
    let mut chunk = vec![0u8; 1024];
    let quiet = timeout(Duration::from_secs(2), late.read(&mut chunk)).await;
    assert!(quiet.is_err(), "a new incomplete request fits again: {quiet:?}");
    server.stop().await;
}
