//! Hostile load held while the real work goes on (issue 14): each test keeps one attack up
//! against the real polestar binary and checks, during it, the work that must not be locked
//! out: a real failover followed, agents with the token served, the admin API, AXFR from an
//! allowed address. Memory is read from `/proc/<pid>/status` (`VmRSS`). Every attack is bounded
//! in count, bytes and time, and talks to loopback only.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Env, PolestarConfig, primary_of};
use polestar::lab::{Lab, LabOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The daemon's resident memory in kB.
pub fn rss_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Samples the RSS of `pid` every 100 ms until dropped; `peak()` is the highest seen.
pub struct RssWatch {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl RssWatch {
    pub fn start(pid: u32) -> Self {
        let peak = Arc::new(AtomicU64::new(rss_kb(pid).unwrap_or(0)));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peak.clone(), stop.clone());
        tokio::spawn(async move {
            while !s.load(Ordering::Relaxed) {
                if let Some(kb) = rss_kb(pid) {
                    p.fetch_max(kb, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Self { peak, stop }
    }

    pub fn peak_kb(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }
}

impl Drop for RssWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A fake Sentinel that completes the handshake (HELLO, MYID, PSUBSCRIBE, an empty
/// `SENTINEL MASTERS`), answers PING, and once subscribed floods pub/sub messages about
/// `master` as fast as the socket takes them, until `stop` or `max_bytes` per connection.
/// Counts the bytes flooded.
pub struct FloodingSentinel {
    pub addr: SocketAddr,
    pub flooded: Arc<AtomicU64>,
    pub stop: Arc<AtomicBool>,
}

impl FloodingSentinel {
    pub async fn start(master: &str, max_bytes: u64) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("bound");
        let flooded = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let chunk = Arc::new(flood_chunk(master));
        let (f, s) = (flooded.clone(), stop.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (f, s, chunk) = (f.clone(), s.clone(), chunk.clone());
                tokio::spawn(flood_connection(stream, chunk, f, s, max_bytes));
            }
        });
        Self { addr, flooded, stop }
    }
}

impl Drop for FloodingSentinel {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn push(channel: &str, payload: &str) -> Vec<u8> {
    let mut out = b">4\r\n$8\r\npmessage\r\n$1\r\n*\r\n".to_vec();
    for part in [channel, payload] {
        out.extend_from_slice(format!("${}\r\n{part}\r\n", part.len()).as_bytes());
    }
    out
}

/// ~64 kB of events: changes of the real master (each asks for a reconciliation), failovers
/// of a master nobody monitors, epochs, and channels that are no event at all.
fn flood_chunk(master: &str) -> Vec<u8> {
    let one = [
        push("+switch-master", &format!("{master} 10.9.9.9 1 10.9.9.8 6379")),
        push("+sdown", &format!("slave 10.9.9.7:6379 10.9.9.7 6379 @ {master} 10.9.9.9 1")),
        push("+try-failover", "master ghost 10.9.9.9 1"),
        push("+new-epoch", "99"),
        push("__flood__", &"x".repeat(200)),
    ]
    .concat();
    one.repeat(64 * 1024 / one.len() + 1)
}

/// Reads RESP commands (arrays of bulk strings) off `buf`, returning the ones complete.
fn commands(buf: &mut Vec<u8>) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    loop {
        let Some((command, used)) = parse_command(buf) else { return out };
        buf.drain(..used);
        out.push(command);
    }
}

fn parse_command(buf: &[u8]) -> Option<(Vec<String>, usize)> {
    let line = |at: usize| -> Option<(&[u8], usize)> {
        let end = buf[at..].windows(2).position(|w| w == b"\r\n")? + at;
        Some((&buf[at..end], end + 2))
    };
    let (head, mut at) = line(0)?;
    let n: usize = std::str::from_utf8(head.strip_prefix(b"*")?).ok()?.parse().ok()?;
    let mut args = Vec::new();
    for _ in 0..n {
        let (len, next) = line(at)?;
        let len: usize = std::str::from_utf8(len.strip_prefix(b"$")?).ok()?.parse().ok()?;
        let arg = buf.get(next..next + len)?;
        args.push(String::from_utf8_lossy(arg).to_uppercase());
        at = next + len + 2;
        if at > buf.len() {
            return None;
        }
    }
    Some((args, at))
}

fn reply(command: &[String]) -> Vec<u8> {
    let words: Vec<&str> = command.iter().map(String::as_str).collect();
    let reply: &[u8] = match words.as_slice() {
        ["HELLO", ..] => b"%2\r\n+server\r\n+redis\r\n+proto\r\n:3\r\n",
        ["PING", ..] => b"+PONG\r\n",
        ["SENTINEL", "MYID"] => b"$40\r\nf100df100df100df100df100df100df100df100d\r\n",
        ["SENTINEL", "MASTERS"] => b"*0\r\n",
        ["PSUBSCRIBE", ..] => b">3\r\n$10\r\npsubscribe\r\n$1\r\n*\r\n:1\r\n",
        ["CLIENT", ..] => b"+OK\r\n",
        _ => b"-ERR No such master with that name\r\n",
    };
    reply.to_vec()
}

async fn flood_connection(
    mut stream: TcpStream,
    chunk: Arc<Vec<u8>>,
    flooded: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    max_bytes: u64,
) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let (mut buf, mut read, mut subscribed, mut sent) = (Vec::new(), [0u8; 4096], false, 0u64);
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        // Answer whatever arrived, then one chunk of the flood.
        let wait =
            if subscribed && sent < max_bytes { Duration::ZERO } else { Duration::from_millis(50) };
        match tokio::time::timeout(wait, stream.read(&mut read)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(n)) => buf.extend_from_slice(&read[..n]),
            Err(_) => {}
        }
        let mut out = Vec::new();
        for command in commands(&mut buf) {
            subscribed |= command.first().is_some_and(|c| c == "PSUBSCRIBE");
            out.extend(reply(&command));
        }
        if subscribed && sent < max_bytes {
            out.extend_from_slice(&chunk);
            sent += chunk.len() as u64;
            flooded.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
        let write = tokio::time::timeout(Duration::from_secs(5), stream.write_all(&out));
        if !matches!(write.await, Ok(Ok(()))) {
            return;
        }
    }
}

/// Found 1 of issue 14: a Sentinel flooding pub/sub messages grew polestar to 2.16 GB in 24 s
/// (an unbounded push channel) and stalled the subscription's PING. Beside the lab's three
/// real Sentinels, a fake one floods for the whole test: polestar's memory stays bounded and
/// a real failover is published within seconds.
#[tokio::test]
async fn a_flooding_sentinel_costs_bounded_memory_and_delays_no_failover() {
    let lab = Lab::start(LabOptions::default()).await.expect("the lab starts");
    // At most 4 GB per connection and two minutes: far more than the test lasts.
    let flood = FloodingSentinel::start(lab.master_name(), 4 << 30).await;
    let mut config = PolestarConfig::for_lab(&lab);
    config.sentinels.push(flood.addr.to_string());
    let env = Env::with_config(lab, &config).await;
    let rss = RssWatch::start(env.ps.pid());
    let before = env.lab.primary().await.expect("the lab's primary");
    env.wait_api_primary(before, common::STARTUP).await;
    // The flood is under way: over a hundred megabytes through polestar's link.
    let start = Instant::now();
    while flood.flooded.load(Ordering::Relaxed) < 128 << 20 {
        if start.elapsed() > Duration::from_secs(30) {
            let mb = flood.flooded.load(Ordering::Relaxed) >> 20;
            env.fail(&format!("the fake Sentinel flooded only {mb} MB in 30 s, not 128"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let started = Instant::now();
    env.lab.failover().await.expect("a failover starts");
    let after = env.lab.wait_for_primary_change(before, common::FAILOVER * 2).await.expect("new");
    let switched = started.elapsed();
    env.wait_api_primary(after, Duration::from_secs(5)).await;
    let published = started.elapsed();
    let flooded = flood.flooded.load(Ordering::Relaxed) >> 20;
    let peak = rss.peak_kb() / 1024;
    eprintln!(
        "flood: {flooded} MB sent, polestar peak RSS {peak} MB, Sentinel switched in \
         {switched:?}, published in {published:?}"
    );
    assert!(peak < 150, "polestar's RSS reached {peak} MB under a {flooded} MB flood");
    let m = env.master().await.expect("the API answers");
    assert_eq!(primary_of(&m), Some(after), "{m}");
    assert!(flooded >= 128, "the flood went on");
    assert!(!env.ps.logged("panicked"), "{}", env.ps.log_tail(40));
}
