//! The HTTP API: the same published topology that DNS serves, as JSON for scripts, load-balancer
//! health checks (`/primary?is=`), deploy tooling (long-polls, the event stream) and operators
//! (planned failover behind a bearer token).
//!
//! The API only reads: it takes snapshots from the topology `watch` channel and events from the
//! [`EventLog`]; the one thing it asks of the Sentinel side goes through [`Control`]. Long-polls
//! and event streams wake on the `watch` change itself, so they answer within the same
//! millisecond as DNS.

mod admin;
mod admission;
mod auth;
mod error;
mod events;
mod feed;
mod health;
mod maintenance;
mod masters;
mod page;
mod params;
mod readiness;
mod slots;
pub mod view;
mod wait;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, watch};
use tokio_util::sync::CancellationToken;

use crate::config::{Secret, ServerTls};
use crate::control::Control;
use crate::events::EventLog;
use crate::metrics::HTTP_REQUESTS;
use crate::topology::{Master, Snapshot, TopologyReader};

pub use admission::{Caps, PROBATION_GRACE, PROBATION_WAIT};
pub use error::ApiError;

/// Request bodies are tiny (`{"node":"ip:port"}` at most); anything larger is refused.
const BODY_LIMIT: usize = 64 * 1024;
/// A client has this long to send a request's headers (also how long an idle keep-alive
/// connection stays open).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// A request's body (read only once its token has been checked) must arrive within this.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(5);
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// What the daemon hands the API: read ends and handles, nothing it must give back.
pub struct Api {
    /// Read end of the topology; the Sentinel side holds the only writer.
    pub topology: TopologyReader,
    pub events: Arc<EventLog>,
    /// `http.admin_token_file` as currently configured (a reload replaces it); without one the
    /// POST endpoints answer 403.
    pub admin_token: Token,
    /// `http.agent_token_file`, likewise: agents presenting it get slots of their own.
    pub agent_token: Token,
    pub control: Arc<dyn Control>,
    pub metrics: crate::metrics::Handle,
    /// Manual drains (`POST /v1/masters/{name}/drain`); `None` answers 501.
    pub drain: Option<crate::drain::DrainHandle>,
    /// The readiness verdicts and replica lags ([`crate::readiness::nothing`] when none).
    pub readiness: crate::readiness::Reader,
    /// `http.tls` as currently configured: HTTPS only while set; a reload that renews the
    /// certificate (or names another) applies to the next connection.
    pub tls: watch::Receiver<Option<ServerTls>>,
}

/// A token as currently configured: the daemon keeps it up to date from the configuration
/// ([`crate::reload::project`]); a fixed one comes from [`fixed_token`].
pub type Token = watch::Receiver<Option<Secret>>;

/// A token that never changes (tests, embedding).
pub fn fixed_token(token: Option<Secret>) -> Token {
    // A receiver keeps the last value after its sender is gone.
    watch::channel(token).1
}

/// A TLS setting that never changes (tests, embedding): `None` serves plain HTTP.
pub fn fixed_tls(tls: Option<ServerTls>) -> watch::Receiver<Option<ServerTls>> {
    watch::channel(tls).1
}

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("failed to bind HTTP listener on {addr}: {error}")]
    Bind { addr: SocketAddr, error: io::Error },
}

/// Binds the listener (a separate step so startup can report a busy port before serving).
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, HttpError> {
    let listener =
        TcpListener::bind(addr).await.map_err(|error| HttpError::Bind { addr, error })?;
    let actual = listener.local_addr().map_err(|error| HttpError::Bind { addr, error })?;
    tracing::info!("listening for HTTP on {actual}");
    Ok(listener)
}

/// Serves until `shutdown` is cancelled. In-flight requests finish; long-polls answer with the
/// current state and event streams end at once, so shutdown never waits on a client.
///
/// Not `axum::serve`: that sets no header-read timeout and no connection cap, so clients that
/// send their headers byte by byte (slowloris) or open connections and say nothing would each
/// hold a connection and a file descriptor forever.
pub async fn serve(listener: TcpListener, api: Api, shutdown: CancellationToken) -> io::Result<()> {
    serve_with(listener, api, Caps::default(), shutdown).await
}

/// [`serve`] with other connection caps (tests, embedding). The connections served at once
/// (long-polls and streams included) are bounded by them ([`admission`]); the rest wait in
/// the listen backlog. polestar raises its open-file limit at start to make room for them.
pub async fn serve_with(
    listener: TcpListener,
    api: Api,
    caps: Caps,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let mut tls = Tls::new(api.tls.clone())?;
    let app = routes(Arc::new(Shared::new(api, shutdown.clone())));
    let connections = admission::Connections::new(caps);
    let graceful = GracefulShutdown::new();
    let next = || accept(&listener, &shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = connections.accept(next) => accepted,
            () = shutdown.cancelled() => None,
        };
        let Some((stream, admission)) = accepted else { break };
        let (app, watcher) = (app.clone(), graceful.watcher());
        let acceptor = tls.current();
        // One connection: the graceful shutdown waits for it through `watcher`, and its own
        // timeouts end it (a panic in a handler is axum's to answer with a 500).
        tokio::spawn(serve_accepted(stream, acceptor, app, admission, watcher));
    }
    // Idle connections close at once; the wait is bounded for ones stuck mid-request.
    let _ = tokio::time::timeout(HEADER_READ_TIMEOUT, graceful.shutdown()).await;
    Ok(())
}

/// One accepted connection, holding its admission until it ends: its TLS handshake first when
/// TLS is configured, in the connection's task (a slow handshake holds its slot, not the
/// accept loop).
async fn serve_accepted(
    stream: tokio::net::TcpStream,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    app: Router,
    admission: admission::Admission,
    watcher: hyper_util::server::graceful::Watcher,
) {
    let probation = match &admission {
        admission::Admission::Probation(p) => Some(p.clone()),
        admission::Admission::Open { .. } => None,
    };
    match acceptor {
        None => serve_one(stream, app, probation, watcher).await,
        Some(acceptor) => {
            let handshake = acceptor.accept(stream);
            if let Ok(Ok(stream)) = tokio::time::timeout(HEADER_READ_TIMEOUT, handshake).await {
                serve_one(stream, app, probation, watcher).await;
            }
        }
    }
    drop(admission);
}

/// One HTTP/1.1 connection, plain or TLS, until it ends (or shutdown closes it). A
/// connection on probation carries it to [`admission::gate`] and has less time for its
/// first request.
async fn serve_one<S>(
    stream: S,
    app: Router,
    probation: Option<Arc<admission::Probation>>,
    watcher: hyper_util::server::graceful::Watcher,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    // Rebuilding the routes' layers costs a few microseconds: only on probation.
    let app = match &probation {
        Some(p) => app.layer(axum::Extension(p.clone())),
        None => app,
    };
    let service = TowerToHyperService::new(app);
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
    // A client that goes away is not an error of the server.
    let served = watcher.watch(builder.serve_connection(TokioIo::new(stream), service));
    match probation {
        Some(p) => on_probation(served, &p).await,
        None => {
            let _ = served.await;
        }
    }
}

/// A connection on probation: closed when it must give way to a newer one, or when it has not
/// shown a token within PROBATION_WAIT. Admitted, it is served as any other (a token holder's
/// kept-alive connection was closed after 2 s idle when the probation wait was its header
/// timeout: agents that came on probation reconnected at every read).
async fn on_probation(served: impl std::future::Future, p: &admission::Probation) {
    tokio::pin!(served);
    tokio::select! {
        _ = &mut served => return,
        () = p.evicted() => return,
        () = tokio::time::sleep(admission::PROBATION_WAIT) => {
            if p.evict() {
                return;
            }
        }
    }
    tokio::select! {
        _ = served => {}
        () = p.evicted() => {}
    }
}

/// The TLS acceptor for `http.tls` as configured now, rebuilt when a reload changes it.
struct Tls {
    config: watch::Receiver<Option<ServerTls>>,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
}

impl Tls {
    /// Fails when the configured certificate cannot be loaded (checked with the configuration
    /// already, so only a file changed since).
    fn new(mut config: watch::Receiver<Option<ServerTls>>) -> io::Result<Self> {
        let tls = config.borrow_and_update().clone();
        let acceptor = match tls {
            Some(tls) => Some(acceptor(&tls).map_err(io::Error::other)?),
            None => None,
        };
        if acceptor.is_some() {
            tracing::info!("serving HTTPS only");
        }
        Ok(Self { config, acceptor })
    }

    fn current(&mut self) -> Option<tokio_rustls::TlsAcceptor> {
        if self.config.has_changed().unwrap_or(false) {
            let tls = self.config.borrow_and_update().clone();
            match tls.as_ref().map(acceptor).transpose() {
                Ok(acceptor) => {
                    tracing::info!(https = acceptor.is_some(), "HTTP TLS certificate reloaded");
                    self.acceptor = acceptor;
                }
                Err(e) => tracing::error!("http.tls: keeping the previous certificate: {e}"),
            }
        }
        self.acceptor.clone()
    }
}

fn acceptor(tls: &ServerTls) -> Result<tokio_rustls::TlsAcceptor, crate::tls::TlsError> {
    crate::tls::server_config(tls).map(tokio_rustls::TlsAcceptor::from)
}

/// The next connection and its client's address, or `None` at shutdown.
async fn accept(
    listener: &TcpListener,
    shutdown: &CancellationToken,
) -> Option<(tokio::net::TcpStream, std::net::IpAddr)> {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => return None,
        };
        match accepted {
            Ok((stream, peer)) => return Some((stream, peer.ip())),
            Err(error) => {
                // EMFILE and the like: wait rather than spin; connections ending free slots.
                tracing::warn!(%error, "HTTP accept failed");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
            }
        }
    }
}

/// The routes, for callers that serve them their own way (long-polls then never see shutdown).
pub fn router(api: Api) -> Router {
    routes(Arc::new(Shared::new(api, CancellationToken::new())))
}

fn routes(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/", get(page::index))
        .route("/v1/masters", get(masters::list))
        .route("/v1/masters/{name}", get(masters::one))
        .route("/v1/masters/{name}/primary", get(masters::primary))
        .route("/v1/masters/{name}/failover", post(admin::failover))
        .route("/v1/masters/{name}/drain", post(admin::drain))
        .route("/v1/masters/{name}/readiness", get(readiness::readiness))
        .route("/v1/masters/{name}/replicas", get(readiness::replicas))
        .route("/v1/masters/{name}/replica", get(readiness::replica))
        .route("/v1/nodes/{node}/handoff", post(maintenance::handoff))
        .route("/v1/events", get(events::list))
        .route("/v1/events/stream", get(events::stream))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .fallback(async || ApiError::not_found("no such route"))
        .method_not_allowed_fallback(async || ApiError::method_not_allowed())
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(middleware::from_fn_with_state(shared.clone(), admission::gate))
        .layer(middleware::from_fn(count))
        .with_state(shared)
}

/// Counts every request by route template (so the label set stays bounded) and status code.
async fn count(request: Request, next: Next) -> Response {
    let route = match request.extensions().get::<MatchedPath>() {
        Some(path) => path.as_str().to_owned(),
        None => "unmatched".to_owned(),
    };
    let response = next.run(request).await;
    let code = response.status().as_u16().to_string();
    metrics::counter!(HTTP_REQUESTS, "route" => route, "code" => code).increment(1);
    response
}

/// The state every handler shares.
struct Shared {
    api: Api,
    /// Cancelled at daemon shutdown: long-polls and streams end when it is.
    shutdown: CancellationToken,
    /// One permit per open long-poll, stream or waiting failover, from its caller's pool.
    waiters: slots::Waiters,
    /// `GET /v1/masters` as rendered for the snapshot it was rendered from: every agent reads
    /// it again on every event, all of them at once after a failover (10,000 renders of one
    /// snapshot otherwise).
    masters_json: std::sync::Mutex<Option<(Arc<Snapshot>, axum::body::Bytes)>>,
    /// The `masters` events of the event streams, rendered once for every stream.
    frames: feed::Frames,
}

impl Shared {
    fn new(api: Api, shutdown: CancellationToken) -> Self {
        let masters_json = std::sync::Mutex::new(None);
        let frames = feed::Frames::default();
        Self { api, shutdown, waiters: slots::Waiters::default(), masters_json, frames }
    }

    /// Every master as the JSON of `GET /v1/masters`, rendered once per published snapshot
    /// (callers that ask while it is rendered wait for it instead of rendering it too).
    fn masters_json(&self) -> axum::body::Bytes {
        let snapshot = self.api.topology.borrow().clone();
        let mut cached =
            self.masters_json.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((of, body)) = cached.as_ref()
            && Arc::ptr_eq(of, &snapshot)
        {
            return body.clone();
        }
        let views: Vec<view::MasterView> =
            snapshot.masters.values().map(|m| view::MasterView::from(&**m)).collect();
        // Plain data (strings, numbers, addresses): it always serializes.
        let body = axum::body::Bytes::from(serde_json::to_vec(&views).unwrap_or_default());
        *cached = Some((snapshot, body.clone()));
        body
    }

    /// The master as published now, or 404.
    fn master(&self, name: &str) -> Result<Arc<Master>, ApiError> {
        let snapshot = self.api.topology.borrow();
        snapshot.master(name).cloned().ok_or_else(|| ApiError::unknown_master(name))
    }

    /// A slot for a request of `caller` that will be held open, or 503 when its pool is full.
    fn waiter(&self, caller: auth::Caller) -> Result<OwnedSemaphorePermit, ApiError> {
        self.waiters.take(caller)
    }
}
