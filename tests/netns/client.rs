//! A Lettuce-like client: one persistent connection (`TCP_NODELAY`, a connect timeout, no read
//! timeout), and a new lookup and connection only after a socket error or an error reply
//! (`READONLY`...). It records every success with the node that served it, so a test can tell
//! when it is on the new primary.
//!
//! A DNS cache time ([`Client::dns_cache`]) makes it reuse a found address that long after the
//! lookup, as the JVM does (`networkaddress.cache.ttl`, 30 s by default); [`Target::Fixed`]
//! pins one address for good; [`Client::reader`] only reads (`GET`).
//!
//! One client serves every measurement: it finds the primary through polestar's HTTP API, at a
//! fixed address (HAProxy), or through a lookup of the caller's (polestar's DNS); it runs in a
//! host's namespace or on the loopback lab; and it takes the serving node from the address it
//! connected to, or from `CLIENT INFO` when a proxy stands in between.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::Host;

/// Connection attempts of one client, at most (one every few ms or slower): a bound on a client
/// that its test forgot, not a figure any test reaches.
const MAX_ATTEMPTS: usize = 5_000;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a command in flight when `stop` comes may still take, so that a writer's last
/// acknowledged `INCR` is counted; a client stuck on a hung node is dropped after it.
const STOP_GRACE: Duration = Duration::from_secs(1);

/// Where the client finds the primary, before every connection.
#[derive(Clone)]
pub enum Target {
    /// `GET` on polestar's `/v1/masters/{name}/primary` URL (`ip:port` as text).
    Ask(String),
    /// Always this address: a proxy in front of the nodes.
    Fixed(SocketAddr),
    /// The caller's lookup, `None` when it found nothing.
    Lookup(Arc<dyn Fn() -> BoxFuture<'static, Option<SocketAddr>> + Send + Sync>),
}

impl Target {
    pub fn lookup<F, Fut>(find: F) -> Target
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Option<SocketAddr>> + Send + 'static,
    {
        Target::Lookup(Arc::new(move || Box::pin(find())))
    }

    async fn find(&self, http: &reqwest::Client) -> Option<SocketAddr> {
        match self {
            Target::Ask(url) => ask(http, url).await,
            Target::Fixed(addr) => Some(*addr),
            Target::Lookup(find) => find().await,
        }
    }
}

/// What the client does on its connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `INCR <key>`, then a pause of [`Pace::incr`], over and over.
    Writer,
    /// `PING`, then `BLPOP <key> 0`, over and over (a blocked reader).
    Blocked,
    /// `GET <key>`, then a pause of [`Pace::incr`], over and over (a reader).
    Reader,
}

/// The client's pauses.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    /// Between two `INCR`s.
    pub incr: Duration,
    /// After a lookup that found no primary.
    pub lookup_retry: Duration,
    /// After a connection ended, before the next lookup.
    pub reconnect: Duration,
}

impl Default for Pace {
    fn default() -> Pace {
        Pace {
            incr: Duration::from_millis(50),
            lookup_retry: Duration::from_millis(100),
            reconnect: Duration::from_millis(20),
        }
    }
}

/// A client to start; [`Client::writer`] and [`Client::blocked`] give the usual one.
#[derive(Clone)]
pub struct Client {
    target: Target,
    mode: Mode,
    /// What `INCR` counts in, or `BLPOP` waits on.
    key: String,
    pace: Pace,
    /// Take the serving node from `CLIENT INFO` (`laddr=`) rather than from the address the
    /// client connected to (a proxy's).
    node_from_client_info: bool,
    /// How long a found address is used again without a new lookup, from the lookup on (the
    /// JVM's `networkaddress.cache.ttl`, a local resolver that clamps TTLs). Zero: a lookup
    /// before every connection.
    dns_cache: Duration,
}

impl Client {
    /// `INCR counter` every 50 ms.
    pub fn writer(target: Target) -> Client {
        Client::new(target, Mode::Writer, "counter")
    }

    /// `PING`, then `BLPOP queue 0`.
    pub fn blocked(target: Target) -> Client {
        Client::new(target, Mode::Blocked, "queue")
    }

    /// `GET counter` every 50 ms.
    pub fn reader(target: Target) -> Client {
        Client::new(target, Mode::Reader, "counter")
    }

    /// Reuses a found address for `cache` after its lookup (see [`Client::dns_cache`]).
    pub fn dns_cache(mut self, cache: Duration) -> Client {
        self.dns_cache = cache;
        self
    }

    fn new(target: Target, mode: Mode, key: &str) -> Client {
        let key = key.to_string();
        let pace = Pace::default();
        Client { target, mode, key, pace, node_from_client_info: false, dns_cache: Duration::ZERO }
    }

    pub fn key(mut self, key: &str) -> Client {
        self.key = key.to_string();
        self
    }

    pub fn pace(mut self, pace: Pace) -> Client {
        self.pace = pace;
        self
    }

    /// Credits each success to the node `CLIENT INFO` names (`laddr=`): the one behind a proxy.
    pub fn node_from_client_info(mut self) -> Client {
        self.node_from_client_info = true;
        self
    }

    /// Starts the client in `host`'s namespace; it runs until `stop`.
    pub fn start_in(self, host: &Host, stop: CancellationToken) -> Arc<Log> {
        let log = Arc::new(Log::default());
        let log2 = log.clone();
        drop(super::in_ns(host, move || async move {
            self.run(&log2, &stop).await;
            Ok(())
        }));
        log
    }

    /// Starts the client on the current runtime (the loopback lab); it runs until `stop`, and the
    /// task ends once it has.
    pub fn spawn(self, stop: CancellationToken) -> (Arc<Log>, JoinHandle<()>) {
        let log = Arc::new(Log::default());
        let log2 = log.clone();
        let task = tokio::spawn(async move { self.run(&log2, &stop).await });
        (log, task)
    }

    async fn run(&self, log: &Log, stop: &CancellationToken) {
        let http =
            reqwest::Client::builder().timeout(Duration::from_secs(1)).build().unwrap_or_default();
        let stopped = async {
            stop.cancelled().await;
            tokio::time::sleep(STOP_GRACE).await;
        };
        tokio::pin!(stopped);
        let mut cached: Option<(SocketAddr, tokio::time::Instant)> = None;
        for _ in 0..MAX_ATTEMPTS {
            if stop.is_cancelled() {
                return;
            }
            let fresh = cached.filter(|(_, at)| at.elapsed() < self.dns_cache).map(|(a, _)| a);
            let found = match fresh {
                Some(addr) => Some(addr),
                None => self.target.find(&http).await,
            };
            let Some(addr) = found else {
                tokio::time::sleep(self.pace.lookup_retry).await;
                continue;
            };
            if fresh.is_none() {
                cached = Some((addr, tokio::time::Instant::now()));
            }
            let result = tokio::select! {
                r = self.session(addr, log, stop) => r,
                _ = &mut stopped => return,
            };
            if let Err(e) = result {
                log.error(format!("{addr}: {e}"));
            }
            tokio::time::sleep(self.pace.reconnect).await;
        }
    }

    /// One connection, until an error or `stop` (between commands).
    async fn session(
        &self,
        addr: SocketAddr,
        log: &Log,
        stop: &CancellationToken,
    ) -> std::io::Result<()> {
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| std::io::Error::other("connect timed out"))??;
        let _ = stream.set_nodelay(true);
        let mut stream = BufReader::new(stream);
        let node = if self.node_from_client_info { serving_node(&mut stream).await? } else { addr };
        let (incr, ping) = (resp(&["INCR", &self.key]), resp(&["PING"]));
        let blpop = resp(&["BLPOP", &self.key, "0"]);
        let get = resp(&["GET", &self.key]);
        while !stop.is_cancelled() {
            match self.mode {
                Mode::Writer => {
                    command(&mut stream, &incr, 1).await?;
                    log.ok(node);
                    tokio::time::sleep(self.pace.incr).await;
                }
                Mode::Reader => {
                    bulk(&mut stream, &get).await?;
                    log.ok(node);
                    tokio::time::sleep(self.pace.incr).await;
                }
                Mode::Blocked => {
                    command(&mut stream, &ping, 1).await?;
                    log.ok(node);
                    command(&mut stream, &blpop, 5).await?;
                }
            }
        }
        Ok(())
    }
}

/// Every success with the node that served it, and every error that ended a connection.
#[derive(Default)]
pub struct Log {
    ok: Mutex<Vec<(SystemTime, SocketAddr)>>,
    errors: Mutex<Vec<(SystemTime, String)>>,
}

impl Log {
    /// The first success on a node other than `old` at or after `after`.
    pub fn first_ok_elsewhere(
        &self,
        old: SocketAddr,
        after: SystemTime,
    ) -> Option<(SystemTime, SocketAddr)> {
        let ok = self.ok.lock().unwrap_or_else(|p| p.into_inner());
        ok.iter().find(|(t, a)| *a != old && *t >= after).copied()
    }

    pub fn last_ok(&self) -> Option<(SystemTime, SocketAddr)> {
        self.ok.lock().unwrap_or_else(|p| p.into_inner()).last().copied()
    }

    /// Successes so far: for a writer, its acknowledged `INCR`s.
    pub fn successes(&self) -> u64 {
        self.ok.lock().unwrap_or_else(|p| p.into_inner()).len() as u64
    }

    pub fn error_count(&self) -> usize {
        self.errors.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn ok(&self, node: SocketAddr) {
        self.ok.lock().unwrap_or_else(|p| p.into_inner()).push((SystemTime::now(), node));
    }

    fn error(&self, e: String) {
        self.errors.lock().unwrap_or_else(|p| p.into_inner()).push((SystemTime::now(), e));
    }
}

/// The primary that polestar's HTTP API names at `url` (`/v1/masters/{name}/primary`).
pub async fn ask(http: &reqwest::Client, url: &str) -> Option<SocketAddr> {
    let response = http.get(url).send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    response.text().await.ok()?.trim().parse().ok()
}

/// `args` as a RESP array of bulk strings.
fn resp(args: &[&str]) -> String {
    let mut out = format!("*{}\r\n", args.len());
    for a in args {
        out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    out
}

/// `CLIENT INFO`'s `laddr=`: the address of the node at the other end (also behind HAProxy).
async fn serving_node(stream: &mut BufReader<TcpStream>) -> std::io::Result<SocketAddr> {
    stream.get_mut().write_all(resp(&["CLIENT", "INFO"]).as_bytes()).await?;
    let mut header = String::new();
    if stream.read_line(&mut header).await? == 0 {
        return Err(std::io::Error::other("connection closed"));
    }
    let len: usize = header
        .strip_prefix('$')
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("CLIENT INFO: {}", header.trim())))?;
    let mut body = vec![0u8; len + 2];
    stream.read_exact(&mut body).await?;
    let text = String::from_utf8_lossy(&body);
    text.split_whitespace()
        .find_map(|f| f.strip_prefix("laddr="))
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| std::io::Error::other("CLIENT INFO without laddr"))
}

/// Sends a command whose reply is a bulk string (or nil) and reads it, with no timeout.
async fn bulk(stream: &mut BufReader<TcpStream>, cmd: &str) -> std::io::Result<()> {
    stream.get_mut().write_all(cmd.as_bytes()).await?;
    let mut header = String::new();
    if stream.read_line(&mut header).await? == 0 {
        return Err(std::io::Error::other("connection closed"));
    }
    if header.starts_with('-') {
        return Err(std::io::Error::other(header.trim().to_string()));
    }
    if header.starts_with("$-1") {
        return Ok(());
    }
    let mut value = String::new();
    if stream.read_line(&mut value).await? == 0 {
        return Err(std::io::Error::other("connection closed"));
    }
    Ok(())
}

/// Sends a command and reads `lines` reply lines, with no timeout (as the clients that hang).
async fn command(
    stream: &mut BufReader<TcpStream>,
    cmd: &str,
    lines: usize,
) -> std::io::Result<()> {
    stream.get_mut().write_all(cmd.as_bytes()).await?;
    for _ in 0..lines {
        let mut line = String::new();
        if stream.read_line(&mut line).await? == 0 {
            return Err(std::io::Error::other("connection closed"));
        }
        if line.starts_with('-') {
            return Err(std::io::Error::other(line.trim().to_string()));
        }
    }
    Ok(())
}
