//! The Sentinel protocol endpoint (`sentinel_api:`): polestar answers Sentinel-aware clients
//! (Jedis, Lettuce, redis-py, ioredis, go-redis) as if it were a Sentinel, from the published
//! state only.
//!
//! Most Sentinel deployments do not resolve a DNS name: their clients ask a Sentinel for the
//! master on every (re)connect and many subscribe to `+switch-master`. Pointed here instead,
//! they get polestar's early flip (a new primary about a second before the real Sentinels name
//! it, under the same epoch rule and trust model as DNS and HTTP), and the real Sentinels keep
//! a handful of connections instead of one per application process.
//!
//! Layers as in mini-redis: [`resp`] owns bytes and frames, [`commands`] answers a request from
//! a snapshot (pure), [`publish`] turns snapshot changes into Sentinel's event messages, and
//! `conn` runs one connection. This module binds (a startup step of its own, so a busy port
//! fails the start) and accepts under a connection cap.
//!
//! The endpoint runs on a runtime of its own ([`FANOUT_THREADS`] threads): at a flip, tens of
//! thousands of subscribers wake at once, each formats its own messages from the one shared
//! broadcast and writes them; on their own threads they take their share of the CPU from the
//! kernel's scheduler, instead of queueing ahead of DNS and HTTP tasks on the daemon's workers.

mod budget;
pub mod commands;
mod conn;
pub mod glob;
pub mod limit;
pub mod publish;
pub mod resp;
pub mod view;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, broadcast, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::{HostPort, Secret};
use crate::events::EventLog;
use crate::metrics as m;
use crate::topology::TopologyReader;

pub use budget::{FREE_INPUT, INPUT_BUDGET};
pub use conn::{AUTH_TIMEOUT, MAX_OUTPUT, MAX_REQUEST, REQUEST_TIMEOUT, WRITE_TIMEOUT};
use limit::Limit;
pub use publish::{Message, Outgoing};

/// Messages a subscriber may fall behind by before it is disconnected. Shared by all of them
/// (one broadcast ring of about 100 bytes a message), so a slow subscriber costs no memory of
/// its own; large enough for one change that moves many masters at once (a host with the
/// primaries of hundreds of masters going down).
pub const SUBSCRIBER_BACKLOG: usize = 4096;
/// The kernel's send buffer per connection (it autotunes up to megabytes otherwise): what a
/// subscriber that stops reading can hold in the kernel before it counts as slow here.
const SEND_BUFFER: usize = 128 * 1024;
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);
/// What a client past the connection cap is told before it is closed (Redis's words).
const FULL: &[u8] = b"-ERR max number of clients reached\r\n";
/// Connections one client address (IPv6: one /64) holds at once, of every listener: a
/// host's connection pools fit, one host cannot take every connection.
pub const CONNECTIONS_PER_CLIENT: usize = 256;
/// Worker threads of the endpoint's own runtime.
pub const FANOUT_THREADS: usize = 2;

#[derive(Debug, thiserror::Error)]
pub enum SentinelApiError {
    #[error("failed to bind the Sentinel API listener on {addr}: {error}")]
    Bind { addr: SocketAddr, error: io::Error },
}

/// Binds every `sentinel_api.listen` address (before anything is served).
pub async fn bind(addrs: &[SocketAddr]) -> Result<Vec<TcpListener>, SentinelApiError> {
    let mut listeners = Vec::with_capacity(addrs.len());
    for &addr in addrs {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|error| SentinelApiError::Bind { addr, error })?;
        let actual =
            listener.local_addr().map_err(|error| SentinelApiError::Bind { addr, error })?;
        tracing::info!("listening for Sentinel API on {actual}");
        listeners.push(listener);
    }
    Ok(listeners)
}

/// What the daemon hands the endpoint: read ends only.
pub struct Api {
    /// Read end of the topology; the Sentinel side holds the only writer.
    pub topology: TopologyReader,
    /// `sentinel_api.peers` as currently configured (a reload replaces it).
    pub peers: watch::Receiver<Vec<HostPort>>,
    /// `sentinel_api.password_file` as currently configured; `None` serves every client.
    pub password: watch::Receiver<Option<Secret>>,
    pub max_connections: usize,
    pub idle_timeout: Duration,
    /// What all connections' incomplete requests may hold past their first
    /// [`FREE_INPUT`] each: [`INPUT_BUDGET`] (tests use less).
    pub input_budget: usize,
    /// The event log, whose `primary_down` events (a primary's own `+sdown`, `+odown`, as the
    /// configured Sentinels announced them) are published to subscribers.
    pub events: Arc<EventLog>,
}

/// Serves until `shutdown`, on the endpoint's own runtime (started here, on its own thread):
/// one accept loop per listener, one task per connection, and the publisher that turns
/// topology changes into messages. Returns once all of them ended.
pub async fn serve(
    listeners: Vec<TcpListener>,
    api: Api,
    shutdown: CancellationToken,
) -> io::Result<()> {
    // Registered again with the new runtime's reactor there.
    let listeners = listeners.into_iter().map(TcpListener::into_std).collect::<io::Result<_>>()?;
    let (done, finished) = tokio::sync::oneshot::channel();
    std::thread::Builder::new().name("sentinel-api".into()).spawn(move || {
        let _ = done.send(run_on_own_runtime(listeners, api, shutdown));
    })?;
    finished.await.unwrap_or_else(|_| Err(io::Error::other("the Sentinel API thread panicked")))
}

fn run_on_own_runtime(
    listeners: Vec<std::net::TcpListener>,
    api: Api,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(FANOUT_THREADS)
        .thread_name("sentinel-api")
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listeners = listeners.into_iter().map(TcpListener::from_std);
        serve_here(listeners.collect::<io::Result<_>>()?, api, shutdown).await
    })
}

async fn serve_here(
    listeners: Vec<TcpListener>,
    api: Api,
    shutdown: CancellationToken,
) -> io::Result<()> {
    describe_series();
    let port = listeners.first().and_then(|l| l.local_addr().ok()).map_or(0, |a| a.port());
    let (messages, _) = broadcast::channel(SUBSCRIBER_BACKLOG);
    let shared = Arc::new(conn::Shared {
        topology: api.topology.clone(),
        peers: api.peers,
        password: api.password,
        messages: messages.clone(),
        idle_timeout: api.idle_timeout,
        run_id: view::run_id(&format!("{}:{port}:{}", std::process::id(), now_nanos())),
        port,
        started: Instant::now(),
        clients: AtomicUsize::new(0),
        next_id: AtomicU64::new(1),
        budget: budget::Budget::new(api.input_budget),
    });
    let slots = Slots {
        all: Arc::new(Semaphore::new(api.max_connections)),
        clients: crate::limits::Clients::new(CONNECTIONS_PER_CLIENT),
    };
    let mut tasks = JoinSet::new();
    // Both take their starting point here, before any connection is accepted.
    tasks.spawn(publish::run(api.topology, messages.clone(), shutdown.clone()));
    tasks.spawn(publish::follow_events(api.events, messages, shutdown.clone()));
    for listener in listeners {
        tasks.spawn(accept_loop(listener, shared.clone(), slots.clone(), shutdown.clone()));
    }
    while let Some(done) = tasks.join_next().await {
        if let Err(e) = done {
            // A panic in a loop of ours is a bug; the others keep serving until shutdown.
            tracing::error!("a Sentinel API task failed: {e}");
        }
    }
    Ok(())
}

/// The connection caps: in all, and per client address.
#[derive(Clone)]
struct Slots {
    all: Arc<Semaphore>,
    clients: crate::limits::Clients,
}

/// A connection's place among [`Slots`], given back when it is dropped.
struct Slot {
    _all: OwnedSemaphorePermit,
    _client: crate::limits::ClientShare,
}

/// Accepts until `shutdown`; owns (and reaps) the tasks of the connections it accepted.
async fn accept_loop(
    listener: TcpListener,
    shared: Arc<conn::Shared>,
    slots: Slots,
    shutdown: CancellationToken,
) {
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            Some(_) = connections.join_next() => continue,
            () = shutdown.cancelled() => break,
        };
        match accepted {
            Ok((stream, peer)) => match admit(&slots, peer.ip()) {
                Ok(slot) => {
                    let (shared, stop) = (shared.clone(), shutdown.clone());
                    connections.spawn(serve_one(stream, slot, shared, stop));
                }
                Err(limit) => refuse(stream, limit),
            },
            Err(error) => {
                // EMFILE and the like: wait rather than spin; connections ending free fds.
                tracing::warn!(%error, "Sentinel API accept failed");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
            }
        }
    }
    // Connections see the same token and end at once.
    while connections.join_next().await.is_some() {}
}

/// A slot for a connection from `ip`, or the limit that refuses it.
fn admit(slots: &Slots, ip: std::net::IpAddr) -> Result<Slot, Limit> {
    let all = slots.all.clone().try_acquire_owned().map_err(|_| Limit::MaxConnections)?;
    let client = slots.clients.admit(ip).ok_or(Limit::PerClient)?;
    Ok(Slot { _all: all, _client: client })
}

async fn serve_one(
    stream: TcpStream,
    slot: Slot,
    shared: Arc<conn::Shared>,
    shutdown: CancellationToken,
) {
    metrics::counter!(m::SENTINEL_API_ACCEPTED, "outcome" => "served").increment(1);
    let _ = stream.set_nodelay(true);
    socket_options(&stream);
    conn::serve(stream, shared, shutdown).await;
    drop(slot);
}

/// Past a cap: say so without waiting (a client that does not read loses the line) and close;
/// counted and logged once per interval.
fn refuse(stream: TcpStream, limit: Limit) {
    let outcome = match limit {
        Limit::PerClient => "refused_per_client",
        _ => "refused_full",
    };
    metrics::counter!(m::SENTINEL_API_ACCEPTED, "outcome" => outcome).increment(1);
    limit::hit(limit);
    let _ = stream.try_write(FULL);
}

/// A subscriber has no idle timeout: keepalive and `TCP_USER_TIMEOUT` find the ones whose host
/// went away. The send buffer is capped, so one that stops reading is found out (and costs
/// kernel memory) within [`SEND_BUFFER`].
fn socket_options(stream: &TcpStream) {
    let socket = socket2::SockRef::from(stream);
    let settings = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(30))
        .with_interval(Duration::from_secs(10))
        .with_retries(3);
    let _ = socket.set_tcp_keepalive(&settings);
    let _ = socket.set_tcp_user_timeout(Some(Duration::from_secs(60)));
    let _ = socket.set_send_buffer_size(SEND_BUFFER);
}

/// The series exist from the start, so `rate()` works before the first client.
fn describe_series() {
    metrics::gauge!(m::SENTINEL_API_CONNECTIONS).increment(0.0);
    for outcome in ["served", "refused_full", "refused_per_client"] {
        metrics::counter!(m::SENTINEL_API_ACCEPTED, "outcome" => outcome).increment(0);
    }
    for channel in ["+switch-master", "+sdown", "-sdown", "+odown", "-odown"] {
        metrics::counter!(m::SENTINEL_API_PUBLISHED, "channel" => channel).increment(0);
    }
    for reason in ["slow_subscriber", "write_timeout", "request_timeout", "input_budget"] {
        metrics::counter!(m::SENTINEL_API_DISCONNECTS, "reason" => reason).increment(0);
    }
    for limit in Limit::ALL {
        metrics::counter!(m::SENTINEL_API_LIMITED, "limit" => limit.as_str()).increment(0);
    }
}

fn now_nanos() -> u128 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (docs/limits.md, "Sentinel endpoint"): no per-client cap, so one host could take
    /// every connection.
    #[test]
    fn one_address_holds_at_most_its_share_and_others_still_get_in() {
        let slots = Slots {
            all: Arc::new(Semaphore::new(CONNECTIONS_PER_CLIENT * 2)),
            clients: crate::limits::Clients::new(CONNECTIONS_PER_CLIENT),
        };
        let host = [10, 0, 0, 1].into();
        let held: Vec<_> = (0..CONNECTIONS_PER_CLIENT).map(|_| admit(&slots, host)).collect();
        assert!(held.iter().all(Result::is_ok));
        assert_eq!(admit(&slots, host).err(), Some(Limit::PerClient));
        assert!(admit(&slots, [10, 0, 0, 2].into()).is_ok(), "another address gets in");
    }
}
