//! The Sentinel endpoint's limits against the real binary and a real failover (issue 26):
//! small input before AUTH, the authentication timeout, requests taken as they arrive, and
//! hostile patterns that neither cost a flip its time nor get messages they do not match.

use crate::common::{Env, FAILOVER, PolestarConfig};

use std::net::SocketAddr;
use std::time::Duration;

use polestar::lab::{Lab, LabOptions};
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

    // Authenticated, the same client may send a 60 KiB request, in 1 KiB writes.
    let mut ok = TcpStream::connect(api).await.expect("connect");
    ok.write_all(b"AUTH limits-pass\r\n").await.expect("auth");
    read_until(&mut ok, "+OK\r\n", Duration::from_secs(5)).await;
    let body = "y".repeat(60 * 1024);
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
    // The authenticated one is still served (the idle timeout is 300 s).
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
