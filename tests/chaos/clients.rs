//! The soak's clients: Lettuce-like (one persistent connection, a connect timeout but no
//! command timeout, re-asking polestar only after a socket error or an error reply). Writers
//! `INCR` a counter and `RPUSH` unique ids, so that the final list tells which acknowledged
//! writes were lost; a reader `GET`s; a blocked reader sits in `BLPOP`. Every success is
//! recorded with the node that served it.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, Query};
use hickory_proto::rr::{Name, RData, RecordType};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpStream, UdpSocket};
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;

use crate::netns::{self, Host};

/// Where a client asks for the primary.
#[derive(Clone, Debug)]
pub enum Find {
    /// An A query for `name` to this DNS server (port 6379 is implied).
    Dns { server: SocketAddr, name: String },
    /// `GET` on a `/v1/masters/{name}/primary` URL.
    Http(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `INCR counter`, `RPUSH ids <unique id>`, every 20 ms.
    Writer,
    /// `GET counter` every 50 ms.
    Reader,
    /// `PING`, then `BLPOP queue 0`, forever.
    Blocked,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Default)]
pub struct Log {
    ok: Mutex<Vec<(Instant, SocketAddr)>>,
    /// Ids whose `RPUSH` was acknowledged, with when.
    acked: Mutex<Vec<(String, Instant)>>,
    incrs: AtomicU64,
    errors: AtomicU64,
    /// Why sessions ended, with how often (for the report).
    reasons: Mutex<std::collections::BTreeMap<String, u64>>,
}

impl Log {
    /// The first success on `node` at or after `after`.
    pub fn first_ok_on(&self, node: SocketAddr, after: Instant) -> Option<Instant> {
        lock(&self.ok).iter().find(|(t, a)| *a == node && *t >= after).map(|(t, _)| *t)
    }

    pub fn acked(&self) -> Vec<(String, Instant)> {
        lock(&self.acked).clone()
    }

    pub fn incrs(&self) -> u64 {
        self.incrs.load(Ordering::SeqCst)
    }

    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::SeqCst)
    }

    pub fn reasons(&self) -> Vec<(String, u64)> {
        lock(&self.reasons).iter().map(|(k, v)| (k.clone(), *v)).collect()
    }

    fn ok(&self, node: SocketAddr) {
        lock(&self.ok).push((Instant::now(), node));
    }
}

pub struct Client {
    pub name: String,
    pub log: Arc<Log>,
    /// How long it keeps a found address (zero: it asks again on every reconnect). A caching
    /// client is back on the new primary only within this, so recovery times leave it out.
    pub cache: Duration,
}

/// Starts a client in `host`'s namespace; it runs until `stop`.
pub fn start(host: &Host, name: &str, find: Find, mode: Mode, stop: CancellationToken) -> Client {
    start_caching(host, name, find, mode, Duration::ZERO, stop)
}

/// [`start`] for a client that keeps a found address for `cache` after asking (the JVM's
/// default `networkaddress.cache.ttl` is 30 s).
pub fn start_caching(
    host: &Host,
    name: &str,
    find: Find,
    mode: Mode,
    cache: Duration,
    stop: CancellationToken,
) -> Client {
    let log = Arc::new(Log::default());
    let (log2, name2) = (log.clone(), name.to_string());
    drop(netns::in_ns(host, move || async move {
        run(&name2, &find, mode, cache, &log2, &stop).await;
        Ok(())
    }));
    Client { name: name.to_string(), log, cache }
}

async fn run(
    name: &str,
    find: &Find,
    mode: Mode,
    cache: Duration,
    log: &Log,
    stop: &CancellationToken,
) {
    let http =
        reqwest::Client::builder().timeout(Duration::from_secs(1)).build().unwrap_or_default();
    let mut seq = 0u64;
    let mut cached: Option<(SocketAddr, Instant)> = None;
    while !stop.is_cancelled() {
        let fresh = cached.filter(|(_, at)| at.elapsed() < cache).map(|(a, _)| a);
        let found = match fresh {
            Some(addr) => Some(addr),
            None => locate(&http, find).await,
        };
        let Some(primary) = found else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        if fresh.is_none() {
            cached = Some((primary, Instant::now()));
        }
        let session = async {
            let stream = timeout(Duration::from_secs(2), TcpStream::connect(primary))
                .await
                .map_err(|_| std::io::Error::other("connect timed out"))??;
            serve(BufReader::new(stream), primary, name, mode, log, &mut seq).await
        };
        let error = tokio::select! {
            r = session => r.err().map(|e| e.to_string()).unwrap_or_default(),
            _ = stop.cancelled() => return,
        };
        log.errors.fetch_add(1, Ordering::SeqCst);
        let reason: String = error.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
        *lock(&log.reasons).entry(reason).or_default() += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn locate(http: &reqwest::Client, find: &Find) -> Option<SocketAddr> {
    match find {
        Find::Http(url) => netns::client::ask(http, url).await,
        Find::Dns { server, name } => Some(SocketAddr::new(resolve_a(*server, name).await?, 6379)),
    }
}

/// The first A record polestar's DNS gives for `name` (one UDP try of 300 ms).
pub async fn resolve_a(server: SocketAddr, name: &str) -> Option<IpAddr> {
    let socket = UdpSocket::bind("0.0.0.0:0").await.ok()?;
    let mut query = Message::query();
    query.add_query(Query::query(Name::from_ascii(name).ok()?, RecordType::A));
    socket.send_to(&query.to_vec().ok()?, server).await.ok()?;
    let mut buf = vec![0u8; 1500];
    let (n, _) =
        timeout(Duration::from_millis(300), socket.recv_from(&mut buf)).await.ok()?.ok()?;
    let answer = Message::from_vec(&buf[..n]).ok()?;
    answer.answers.iter().find_map(|r| match &r.data {
        RData::A(a) => Some(IpAddr::V4(a.0)),
        _ => None,
    })
}

async fn serve(
    mut stream: BufReader<TcpStream>,
    node: SocketAddr,
    name: &str,
    mode: Mode,
    log: &Log,
    seq: &mut u64,
) -> std::io::Result<()> {
    loop {
        match mode {
            Mode::Writer => {
                command(&mut stream, &["INCR", "counter"]).await?;
                log.incrs.fetch_add(1, Ordering::SeqCst);
                log.ok(node);
                let id = format!("{name}-{seq}");
                *seq += 1;
                command(&mut stream, &["RPUSH", "ids", &id]).await?;
                lock(&log.acked).push((id, Instant::now()));
                log.ok(node);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Mode::Reader => {
                command(&mut stream, &["GET", "counter"]).await?;
                log.ok(node);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Mode::Blocked => {
                command(&mut stream, &["PING"]).await?;
                log.ok(node);
                command(&mut stream, &["BLPOP", "queue", "0"]).await?;
            }
        }
    }
}

/// Sends a command and reads its reply with no timeout (as the clients that hang do). An error
/// reply (`READONLY`, `LOADING`...) counts as a failure, after which the client re-asks.
pub async fn command(stream: &mut BufReader<TcpStream>, args: &[&str]) -> std::io::Result<()> {
    let mut out = format!("*{}\r\n", args.len());
    for a in args {
        out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    stream.get_mut().write_all(out.as_bytes()).await?;
    read_reply(stream).await.map(drop)
}

/// Reads one RESP reply; bulk strings and flat arrays of them come back as lines.
pub async fn read_reply(stream: &mut BufReader<TcpStream>) -> std::io::Result<Vec<String>> {
    let head = read_line(stream).await?;
    let count: i64 = head.get(1..).and_then(|n| n.parse().ok()).unwrap_or(0);
    match head.as_bytes().first() {
        Some(b'-') => Err(std::io::Error::other(head)),
        Some(b'$') if count >= 0 => Ok(vec![read_line(stream).await?]),
        Some(b'*') => {
            let mut items = Vec::new();
            for _ in 0..count.max(0) {
                let len = read_line(stream).await?;
                if len != "$-1" {
                    items.push(read_line(stream).await?);
                }
            }
            Ok(items)
        }
        _ => Ok(vec![head]),
    }
}

async fn read_line(stream: &mut BufReader<TcpStream>) -> std::io::Result<String> {
    let mut line = String::new();
    if stream.read_line(&mut line).await? == 0 {
        return Err(std::io::Error::other("connection closed"));
    }
    Ok(line.trim_end().to_string())
}
