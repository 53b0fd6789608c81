//! Hostile Sentinels beside a real lab: besides the lab's three real Sentinels polestar is
//! configured with fakes (tiny TCP servers in this test) that answer garbage, flood bytes, or
//! never answer. polestar must publish and keep the real Sentinels' truth, never panic, and
//! keep reconnecting to the fakes (configured addresses are retried forever). Every flood here
//! is bounded in bytes and time.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{Env, PolestarConfig, primary_of};
use polestar_lab::{Lab, LabOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Clone, Copy)]
enum Behaviour {
    /// Whatever is asked, bytes that are not RESP, or RESP of the wrong shape.
    Garbage,
    /// A few megabytes of pub/sub-looking pushes and junk replies, as fast as it can.
    Flood,
    /// Reads and never writes.
    Silent,
    /// Answers everything with two bytes, `\r\n`: an element with no type byte.
    Crlf,
}

/// A fake Sentinel; counts the connections it accepted.
async fn fake(behaviour: Behaviour) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("bound");
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let n = count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve(stream, behaviour, n));
        }
    });
    (addr, accepted)
}

async fn serve(mut stream: TcpStream, behaviour: Behaviour, n: usize) {
    let mut buf = [0u8; 4096];
    let replies: [&[u8]; 8] = [
        b"+OK\r\n",
        b"*2\r\n$3\r\nfoo\r\n",             // an array cut short
        b"$-5\r\nxx\r\n",                   // a negative length
        b"*-1\r\n%1\r\n+a\r\n",             // nil, then a map without its value
        b":99999999999999999999999999\r\n", // an integer that does not fit
        b"\x00\xff\xfe garbage\r\n",
        b"*3\r\n$8\r\npmessage\r\n$1\r\n*\r\n", // a pmessage missing its payload
        b"$100000000000\r\n",                   // a bulk string of 100 GB announced
    ];
    match behaviour {
        Behaviour::Garbage => {
            let mut i = n;
            while let Ok(read) = stream.read(&mut buf).await {
                if read == 0 {
                    return;
                }
                if stream.write_all(replies[i % replies.len()]).await.is_err() {
                    return;
                }
                i += 1;
            }
        }
        Behaviour::Flood => {
            let push = b">4\r\n$8\r\npmessage\r\n$1\r\n*\r\n$14\r\n+switch-master\r\n\
                         $40\r\nmymaster 10.9.9.9 1 10.9.9.8 6379 junk!!\r\n";
            let chunk: Vec<u8> = [&push[..], replies[0], replies[5]].concat().repeat(256);
            for _ in 0..64 {
                // ~2 MB per connection at most, and at most 5 s of it.
                let write = tokio::time::timeout(Duration::from_secs(5), stream.write_all(&chunk));
                if !matches!(write.await, Ok(Ok(()))) {
                    return;
                }
            }
        }
        Behaviour::Crlf => {
            while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {
                if stream.write_all(b"\r\n").await.is_err() {
                    return;
                }
            }
        }
        Behaviour::Silent => {
            let idle = async { while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {} };
            let _ = tokio::time::timeout(Duration::from_secs(60), idle).await;
        }
    }
}

/// Also pins the majority rule: configured addresses that answer but not in RESP (the garbage
/// and flooding fakes) are shown to be no Sentinel and leave the count; the silent one still
/// counts (it could be a Sentinel cut off), so 3 real Sentinels of 4 voters publish.
#[tokio::test]
async fn hostile_sentinels_do_not_disturb_the_truth_of_the_real_ones() {
    let mut fakes = Vec::new();
    for behaviour in [Behaviour::Garbage, Behaviour::Flood, Behaviour::Silent] {
        fakes.push(fake(behaviour).await);
    }
    let lab = Lab::start(LabOptions::default()).await.expect("the lab starts");
    let mut config = PolestarConfig::for_lab(&lab);
    config.sentinels.extend(fakes.iter().map(|(addr, _)| addr.to_string()));
    let env = Env::with_config(lab, &config).await;
    let primary = env.lab.primary().await.expect("the lab's primary");
    env.wait_api_primary(primary, common::STARTUP).await;
    // Long enough for several reconnections to each fake and for its pings and reconciliations.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
    while tokio::time::Instant::now() < deadline {
        let m = env.master().await.expect("the API answers");
        assert_eq!(primary_of(&m), Some(primary), "the published primary moved: {m}");
        assert_eq!(m["state"], "ok", "{m}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let m = env.master().await.expect("the API answers");
    assert_eq!(m["sentinels"]["configured"], 6, "{m}");
    for (i, (addr, accepted)) in fakes.iter().enumerate() {
        let n = accepted.load(Ordering::SeqCst);
        // The silent one is reconnected after its response timeout, the others at once.
        assert!(n >= 2, "fake #{i} at {addr} was connected to {n} time(s): not retried");
    }
    assert!(!env.ps.logged("panicked"), "{}", env.ps.log_tail(40));
}

/// A fourth configured Sentinel address that answers every request with `\r\n` ended
/// polestar within seconds (a slice `1..0` in the reply scanner, read by the readiness poll,
/// whose end stopped the daemon). Now it costs that address's exchanges only: the daemon
/// stays up through many readiness rounds, keeps the real primary in DNS and the API, and
/// says what the address sent.
#[tokio::test]
async fn a_sentinel_address_answering_two_bytes_crlf_costs_its_exchanges_only() {
    let (crlf, accepted) = fake(Behaviour::Crlf).await;
    let lab = Lab::start(LabOptions::default()).await.expect("the lab starts");
    let mut config = PolestarConfig::for_lab(&lab);
    config.sentinels.push(crlf.to_string());
    config.dns = true;
    let env = Env::with_config(lab, &config).await;
    let primary = env.lab.primary().await.expect("the lab's primary");
    env.wait_api_primary(primary, common::STARTUP).await;
    let dns = env.ps.dns.expect("DNS is served");
    let name = format!("{}.redis.test.", env.master_name());
    // Readiness rounds are 1 s apart, and each asks the address: a dozen chances to crash.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(12);
    while tokio::time::Instant::now() < deadline {
        let m = env.master().await.expect("the API answers: polestar is up");
        assert_eq!(primary_of(&m), Some(primary), "the published primary moved: {m}");
        let answered = crate::chaos::clients::resolve_a(dns, &name).await;
        assert_eq!(answered, Some(primary.ip()), "DNS answers the primary");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let n = accepted.load(Ordering::SeqCst);
    assert!(n >= 4, "the address was asked {n} time(s): the test proves nothing");
    assert!(!env.ps.logged("panicked"), "{}", env.ps.log_tail(40));
    assert!(env.ps.logged("no RESP"), "the bad replies are said: {}", env.ps.log_tail(40));
}
