//! Issue 26, item 5: 20,000 Sentinel-endpoint subscribers on one polestar, a real failover:
//! polestar's RSS with them attached, and how many hear `+switch-master` within 100 ms of the
//! first of them. Ignored (run by `bench/sentinel-api-crowd.sh`); bounded: setup 120 s, the
//! switch FAILOVER × 2.

use crate::common::{Env, FAILOVER, PolestarConfig};

use std::net::SocketAddr;
use std::time::Duration;

use polestar::lab::{Lab, LabOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;
use tokio::time::{Instant, timeout};

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap_or("VmRSS: 0 kB");
    line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or(0)
}

fn raise_fd_limit(want: u64) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    let target = want.max(hard);
    setrlimit(Resource::RLIMIT_NOFILE, target, target).expect("raise RLIMIT_NOFILE (root)");
}

/// One subscriber: confirmed, then the instant its `+switch-master` arrived (sent on `heard`).
async fn subscriber(api: SocketAddr, source: SocketAddr) -> anyhow::Result<tokio::net::TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(source)?;
    let mut s = socket.connect(api).await?;
    s.write_all(b"SUBSCRIBE +switch-master\r\n").await?;
    let (mut seen, mut chunk) = (Vec::new(), [0u8; 256]);
    while !seen.ends_with(b":1\r\n") {
        let n = s.read(&mut chunk).await?;
        anyhow::ensure!(n > 0, "closed: {:?}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&chunk[..n]);
    }
    Ok(s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: bench/sentinel-api-crowd.sh"]
async fn bench_twenty_thousand_subscribers_hear_the_switch() {
    let count: usize =
        std::env::var("SUBSCRIBERS").ok().and_then(|n| n.parse().ok()).unwrap_or(20_000);
    raise_fd_limit(count as u64 * 2 + 4096);
    let lab = Lab::start(LabOptions::default()).await.expect("the lab starts");
    let mut config = PolestarConfig::for_lab(&lab);
    config.extra =
        format!("sentinel_api:\n  listen: [\"127.0.0.1:0\"]\n  max_connections: {}\n", count + 100);
    let env = Env::with_config(lab, &config).await;
    let api = env.ps.find_addr("listening for Sentinel API on ").expect("the API listens");
    let before = rss_kib(env.ps.pid());

    let started = Instant::now();
    let mut streams = Vec::with_capacity(count);
    for chunk in (0..count).collect::<Vec<_>>().chunks(500) {
        let connects = chunk.iter().map(|&i| {
            // 200 per source address (the per-address cap is 256).
            let source = format!("127.0.{}.{}:0", 10 + i / 200 / 250, 1 + (i / 200) % 250);
            subscriber(api, source.parse().expect("an address"))
        });
        let setup = timeout(Duration::from_secs(120), futures::future::join_all(connects));
        for s in setup.await.expect("setup within 120 s") {
            streams.push(s.expect("a subscriber"));
        }
    }
    let setup = started.elapsed();
    let attached = rss_kib(env.ps.pid());

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for mut s in streams {
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut chunk = [0u8; 512];
            if let Ok(n @ 1..) = s.read(&mut chunk).await {
                let _ = tx.send((Instant::now(), n));
            }
            // Held until the test ends.
            let _ = s.read(&mut chunk).await;
        });
    }
    drop(tx);
    let new = env.failover().await;
    let mut arrivals = Vec::with_capacity(count);
    let end = Instant::now() + FAILOVER * 2;
    while arrivals.len() < count {
        match timeout(end.saturating_duration_since(Instant::now()), rx.recv()).await {
            Ok(Some((at, _))) => arrivals.push(at),
            _ => break,
        }
    }
    let peak = rss_kib(env.ps.pid());
    arrivals.sort();
    let first = arrivals.first().copied().expect("someone heard the switch");
    let within = arrivals.iter().filter(|a| a.duration_since(first) <= Duration::from_millis(100));
    let within = within.count();
    let p99 = arrivals.get(count * 99 / 100).map(|a| a.duration_since(first));
    let last = arrivals.last().map(|a| a.duration_since(first));
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "SENTINEL_API_CROWD subscribers={count} setup={setup:?} new_primary={new} \
         rss_kib: before={before} attached={attached} after_switch={peak}; heard={} \
         within_100ms_of_first={within} ({:.1} %) p99={p99:?} last={last:?}; loadavg {}",
        arrivals.len(),
        100.0 * within as f64 / count as f64,
        load.trim()
    );
    assert_eq!(arrivals.len(), count, "every subscriber hears the switch");
}
