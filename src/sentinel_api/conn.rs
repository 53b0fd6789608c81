//! One client connection: bytes in, requests parsed, answered from the published state,
//! replies and pub/sub messages out.
//!
//! Bounded in every direction: a request larger than [`MAX_REQUEST`] is a protocol error, and
//! one begun must be complete within [`REQUEST_TIMEOUT`]; past [`super::FREE_INPUT`] an
//! incomplete request draws on an input budget shared by every connection
//! ([`super::INPUT_BUDGET`]); at most [`MAX_OUTPUT`] of replies is built before it is
//! written; a write that the client does not take within [`WRITE_TIMEOUT`] closes the
//! connection; a subscriber that falls a whole broadcast channel behind is closed (never
//! buffered for); a client that subscribes to nothing and says nothing for `idle_timeout` is
//! closed (a subscriber never is: Sentinel closes none, and its clients do not ping). While a
//! password is set and not yet given, a request is held to [`resp::UNAUTHENTICATED`] (a few
//! KiB) and the connection has [`AUTH_TIMEOUT`] from its start to authenticate. Every limit
//! hit is counted and logged once per interval ([`limit`]).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::config::{HostPort, Secret};
use crate::metrics as m;
use crate::topology::TopologyReader;

use super::budget::{Budget, FREE_INPUT, Reservation};
use super::commands::{self, Context, ServerInfo, Session};
use super::glob;
use super::limit::{self, Limit};
use super::publish::Outgoing;
use super::resp::{self, LIMITS, Parser, Reply, UNAUTHENTICATED};

/// One request's bytes, however it is split.
pub const MAX_REQUEST: usize = LIMITS.max_request;
/// How long a connection may take to authenticate when a password is set: an honest client
/// sends `AUTH` (or `HELLO ... AUTH`) as its first request.
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(10);
/// A request begun must be whole within this (an honest client sends one in a single write).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Replies built before they are written; the rest of a pipeline waits in the input.
pub const MAX_OUTPUT: usize = 16 * 1024;
/// How long a client may leave a write of ours untaken before it is disconnected.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
const READ_CHUNK: usize = 16 * 1024;

/// What every connection shares; owned by the server, one `Arc` per connection.
pub struct Shared {
    /// Read end of the topology; the Sentinel side holds the only writer.
    pub topology: TopologyReader,
    /// `sentinel_api.peers` as currently configured (the reload task holds the sender).
    pub peers: watch::Receiver<Vec<HostPort>>,
    /// `sentinel_api.password_file` as currently configured.
    pub password: watch::Receiver<Option<Secret>>,
    /// Subscribers take a receiver; the publisher task holds this sender's clones' origin.
    pub messages: broadcast::Sender<Arc<Outgoing>>,
    pub idle_timeout: Duration,
    pub run_id: String,
    pub port: u16,
    pub started: Instant,
    pub clients: AtomicUsize,
    pub next_id: AtomicU64,
    /// What all connections' incomplete requests may hold past their free part.
    pub budget: Budget,
}

impl Shared {
    /// What `INFO` and `HELLO` say of this server, now.
    fn server_info(&self) -> ServerInfo {
        ServerInfo {
            run_id: self.run_id.clone(),
            port: self.port,
            pid: std::process::id(),
            uptime_secs: self.started.elapsed().as_secs(),
            connected_clients: self.clients.load(Ordering::Relaxed),
        }
    }
}

/// Why a connection ended, for the metric.
#[derive(Clone, Copy, Debug)]
enum End {
    Closed,
    Quit,
    Idle,
    AuthTimeout,
    Protocol,
    RequestTimeout,
    InputBudget,
    SlowSubscriber,
    SlowReader,
    Shutdown,
}

impl End {
    fn as_str(self) -> &'static str {
        match self {
            End::Closed => "closed",
            End::Quit => "quit",
            End::Idle => "idle",
            End::AuthTimeout => "auth_timeout",
            End::Protocol => "protocol_error",
            End::RequestTimeout => "request_timeout",
            End::InputBudget => "input_budget",
            End::SlowSubscriber => "slow_subscriber",
            End::SlowReader => "write_timeout",
            End::Shutdown => "shutdown",
        }
    }

    /// The limit that ended the connection, if one did (a protocol error counts its own).
    fn limit(self) -> Option<Limit> {
        match self {
            End::Idle => Some(Limit::IdleTimeout),
            End::AuthTimeout => Some(Limit::AuthTimeout),
            End::RequestTimeout => Some(Limit::RequestTimeout),
            End::InputBudget => Some(Limit::InputBudget),
            End::SlowSubscriber => Some(Limit::SlowSubscriber),
            End::SlowReader => Some(Limit::WriteTimeout),
            End::Closed | End::Quit | End::Protocol | End::Shutdown => None,
        }
    }
}

/// Serves one connection until the client leaves, misbehaves or `shutdown`.
pub async fn serve(stream: TcpStream, shared: Arc<Shared>, shutdown: CancellationToken) {
    shared.clients.fetch_add(1, Ordering::Relaxed);
    metrics::gauge!(m::SENTINEL_API_CONNECTIONS).increment(1.0);
    let end = Connection::new(stream, &shared).run(&shutdown).await;
    metrics::gauge!(m::SENTINEL_API_CONNECTIONS).decrement(1.0);
    metrics::counter!(m::SENTINEL_API_DISCONNECTS, "reason" => end.as_str()).increment(1);
    if let Some(hit) = end.limit() {
        limit::hit(hit);
    }
    shared.clients.fetch_sub(1, Ordering::Relaxed);
}

struct Connection<'a> {
    stream: TcpStream,
    shared: &'a Shared,
    session: Session,
    input: Vec<u8>,
    /// What it took of a request that is not complete yet.
    parser: Parser,
    output: Vec<u8>,
    /// The session's patterns that match a channel, per channel: matched once per set of
    /// patterns, not once per message (dropped when a request may have changed them).
    matched: Vec<(&'static str, Vec<Vec<u8>>)>,
    /// When a connection that has not authenticated is closed.
    auth_deadline: tokio::time::Instant,
    /// When the request being received must be whole; `None` while none is.
    request_deadline: Option<tokio::time::Instant>,
    /// Requests taken so far (to tell when one completed).
    requests: u64,
    /// Its draw on the shared input budget.
    reservation: Reservation<'a>,
    /// Held while the session subscribes to anything; `None` otherwise.
    messages: Option<broadcast::Receiver<Arc<Outgoing>>>,
}

enum Wake {
    Read(std::io::Result<usize>),
    Message(Result<Arc<Outgoing>, broadcast::error::RecvError>),
    End(End),
}

impl<'a> Connection<'a> {
    fn new(stream: TcpStream, shared: &'a Shared) -> Self {
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let session = Session::new(id, shared.password.borrow().is_some());
        Self {
            stream,
            shared,
            session,
            input: Vec::new(),
            parser: Parser::default(),
            output: Vec::new(),
            matched: Vec::new(),
            auth_deadline: tokio::time::Instant::now() + AUTH_TIMEOUT,
            request_deadline: None,
            requests: 0,
            reservation: Reservation::new(&shared.budget),
            messages: None,
        }
    }

    async fn run(mut self, shutdown: &CancellationToken) -> End {
        // Only the bytes a read fills are touched: an idle subscriber costs a page, not 16 KiB.
        let mut chunk = Vec::with_capacity(READ_CHUNK);
        // Registered with the token once, not at every wake (at a flip, every subscriber wakes).
        let cancelled = shutdown.cancelled();
        tokio::pin!(cancelled);
        loop {
            let taken = self.requests;
            let more = match self.answer_pending() {
                Ok(more) => more,
                Err(e) => {
                    let reply = Reply::error(protocol_error(&e, self.session.authenticated));
                    return self.close_with(reply, End::Protocol).await;
                }
            };
            // Before the confirmation is written: a client told it is subscribed hears every
            // message published after that (it was cut off from the first one when the
            // receiver came only after the write).
            self.follow_subscriptions();
            if !self.hold_input(self.requests > taken) {
                let reply = Reply::error(
                    "ERR Protocol error: the input of all clients is at its limit, try again",
                );
                return self.close_with(reply, End::InputBudget).await;
            }
            if let Err(end) = self.flush().await {
                return end;
            }
            if self.session.closing {
                return End::Quit;
            }
            if more {
                continue;
            }
            let wake = self.wait(&mut chunk, cancelled.as_mut()).await;
            if let Some(end) = self.woken(wake, &mut chunk).await {
                return end;
            }
        }
    }

    /// The input not yet answered, after answering what it held (`completed`: some request
    /// was): what a large request needed is freed once nothing is held, the request deadline
    /// moves, and what is held is reserved from the shared budget; `false` when it is spent.
    fn hold_input(&mut self, completed: bool) -> bool {
        let pending = self.parser.held() + self.input.len();
        if pending == 0 && self.input.capacity() > FREE_INPUT {
            self.input = Vec::new(); // nor what a large request needed
        }
        let now = tokio::time::Instant::now();
        self.request_deadline = request_deadline(self.request_deadline, pending, completed, now);
        self.reservation.hold(pending)
    }

    /// Takes in what woke the connection: bytes read (into `chunk`), a message to deliver, or
    /// the end.
    async fn woken(&mut self, wake: Wake, chunk: &mut Vec<u8>) -> Option<End> {
        match wake {
            Wake::Read(Ok(0) | Err(_)) => return Some(End::Closed),
            Wake::Read(Ok(n)) => {
                self.input.extend_from_slice(&chunk[..n]);
                chunk.clear();
                if n > FREE_INPUT {
                    // Pages a large read touched are not kept for the connection's life.
                    *chunk = Vec::with_capacity(READ_CHUNK);
                }
            }
            Wake::Message(Ok(message)) => {
                self.deliver(&message);
                return self.deliver_queued().err();
            }
            Wake::Message(Err(broadcast::error::RecvError::Lagged(_))) => {
                return Some(End::SlowSubscriber);
            }
            Wake::Message(Err(broadcast::error::RecvError::Closed)) => return Some(End::Shutdown),
            Wake::End(end) => return Some(self.end(end).await),
        }
        None
    }

    /// Says why when a limit ends the connection.
    async fn end(&mut self, end: End) -> End {
        let why = match end {
            End::AuthTimeout => "ERR authentication timeout, closing the connection",
            End::RequestTimeout => "ERR request not complete in time, closing the connection",
            _ => return end,
        };
        self.close_with(Reply::error(why), end).await
    }

    /// Writes `reply` (as far as the client takes it) and ends with `end`.
    async fn close_with(&mut self, reply: Reply, end: End) -> End {
        reply.encode(self.session.proto, &mut self.output);
        let _ = self.flush().await;
        end
    }

    async fn wait(
        &mut self,
        chunk: &mut Vec<u8>,
        cancelled: Pin<&mut WaitForCancellationFuture<'_>>,
    ) -> Wake {
        let idle = self.session.subscriptions() == 0;
        let timeout = self.shared.idle_timeout;
        let (unauthenticated, auth_deadline) = (!self.session.authenticated, self.auth_deadline);
        let partial = self.request_deadline.is_some();
        let request_deadline = self.request_deadline.unwrap_or(auth_deadline);
        let Self { stream, messages, .. } = self;
        let messages = async {
            match messages.as_mut() {
                Some(rx) => rx.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            read = stream.read_buf(chunk) => Wake::Read(read),
            message = messages => Wake::Message(message),
            () = tokio::time::sleep(timeout), if idle => Wake::End(End::Idle),
            () = tokio::time::sleep_until(auth_deadline), if unauthenticated => {
                Wake::End(End::AuthTimeout)
            }
            () = tokio::time::sleep_until(request_deadline), if partial => {
                Wake::End(End::RequestTimeout)
            }
            () = cancelled => Wake::End(End::Shutdown),
        }
    }

    /// Answers one request into the output, counted by command.
    fn answer(&mut self, request: &resp::Request, ctx: &Context) {
        self.matched.clear();
        let command = commands::metric_name(request);
        metrics::counter!(m::SENTINEL_API_COMMANDS, "command" => command).increment(1);
        for reply in commands::answer(request, &mut self.session, ctx) {
            reply.encode(self.session.proto, &mut self.output);
        }
    }

    /// Answers the complete requests in the input, up to [`MAX_OUTPUT`] of replies; `Ok(true)`
    /// when it stopped there with requests left.
    fn answer_pending(&mut self) -> Result<bool, resp::ProtocolError> {
        // After every delivered message too: nothing to build a context for.
        if self.input.is_empty() {
            return Ok(false);
        }
        let snapshot = self.shared.topology.borrow().clone();
        let peers = self.shared.peers.borrow().clone();
        let password = self.shared.password.borrow().clone();
        let server = self.shared.server_info();
        let ctx = Context {
            snapshot: &snapshot,
            peers: &peers,
            password: password.as_ref(),
            server: &server,
        };
        let (used, result) = self.answer_requests(&ctx);
        self.input.drain(..used);
        result
    }

    /// Answers the complete requests in the input, as long as the output has room and the
    /// session is not closing: how many bytes they took, and whether more input waits.
    fn answer_requests(&mut self, ctx: &Context) -> (usize, Result<bool, resp::ProtocolError>) {
        let mut used = 0;
        let result = loop {
            if self.output.len() >= MAX_OUTPUT || self.session.closing {
                break Ok(used < self.input.len());
            }
            let limits = if self.session.authenticated { &LIMITS } else { &UNAUTHENTICATED };
            match self.parser.next(&self.input[used..], limits) {
                Ok((n, Some(request))) => {
                    used += n;
                    self.requests += 1;
                    if !request.is_empty() {
                        self.answer(&request, ctx);
                    }
                }
                Ok((n, None)) => {
                    used += n;
                    if self.parser.held() + self.input.len() - used > limits.max_request {
                        break Err(resp::ProtocolError::TooLarge);
                    }
                    break Ok(false);
                }
                Err(e) => break Err(e),
            }
        };
        (used, result)
    }

    /// Holds a message receiver exactly while the session subscribes to something.
    fn follow_subscriptions(&mut self) {
        match (self.session.subscriptions() > 0, self.messages.is_some()) {
            (true, false) => self.messages = Some(self.shared.messages.subscribe()),
            (false, true) => self.messages = None,
            _ => {}
        }
    }

    /// Adds `message` (encoded once for everyone) for every channel and pattern of the session
    /// it matches.
    fn deliver(&mut self, message: &Outgoing) {
        let channel = message.message.channel;
        let proto = self.session.proto;
        if self.session.channels.contains(channel.as_bytes()) {
            self.output.extend_from_slice(message.to_channel(proto));
        }
        let Self { matched, session, output, .. } = self;
        for pattern in patterns_of(matched, session, channel) {
            message.to_pattern(proto, pattern, output);
        }
    }

    /// Adds the messages already waiting (up to [`MAX_OUTPUT`]) to the same write.
    fn deliver_queued(&mut self) -> Result<(), End> {
        use broadcast::error::TryRecvError;
        while self.output.len() < MAX_OUTPUT {
            let Some(rx) = self.messages.as_mut() else { return Ok(()) };
            match rx.try_recv() {
                Ok(message) => self.deliver(&message),
                Err(TryRecvError::Empty | TryRecvError::Closed) => return Ok(()),
                Err(TryRecvError::Lagged(_)) => return Err(End::SlowSubscriber),
            }
        }
        Ok(())
    }

    /// Empties the output once written, keeping at most [`MAX_OUTPUT`] of capacity.
    fn written(&mut self) {
        self.output.clear();
        if self.output.capacity() > MAX_OUTPUT {
            self.output = Vec::new();
        }
    }

    async fn flush(&mut self) -> Result<(), End> {
        if self.output.is_empty() {
            return Ok(());
        }
        // A message to a subscriber fits its socket's buffer at once: no timer for that (at a
        // flip, 20,000 of them would each arm and cancel one).
        match self.stream.try_write(&self.output) {
            Ok(n) if n == self.output.len() => {
                self.written();
                return Ok(());
            }
            Ok(n) => {
                self.output.drain(..n);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return Err(End::Closed),
        }
        let write = self.stream.write_all(&self.output);
        match tokio::time::timeout(WRITE_TIMEOUT, write).await {
            Ok(Ok(())) => {
                self.written();
                Ok(())
            }
            Ok(Err(_)) => Err(End::Closed),
            Err(_) if self.session.subscriptions() > 0 => Err(End::SlowSubscriber),
            Err(_) => Err(End::SlowReader),
        }
    }
}

/// The session's patterns that match `channel`, matched on first use of the channel.
fn patterns_of<'m>(
    matched: &'m mut Vec<(&'static str, Vec<Vec<u8>>)>,
    session: &Session,
    channel: &'static str,
) -> &'m [Vec<u8>] {
    let at = match matched.iter().position(|(c, _)| *c == channel) {
        Some(at) => at,
        None => {
            let hits = session.patterns.iter().filter(|p| glob::matches(p, channel.as_bytes()));
            matched.push((channel, hits.cloned().collect()));
            matched.len() - 1
        }
    };
    &matched[at].1
}

/// When the request being received must be whole: never while none is pending; counted from
/// when it began (after the last complete request, or at the read that started it).
fn request_deadline(
    current: Option<tokio::time::Instant>,
    pending: usize,
    completed: bool,
    now: tokio::time::Instant,
) -> Option<tokio::time::Instant> {
    match (pending, completed, current) {
        (0, _, _) => None,
        (_, false, Some(deadline)) => Some(deadline),
        _ => Some(now + REQUEST_TIMEOUT),
    }
}

/// The `-ERR` line of a protocol error, in Redis's words; a limit also counts and logs.
fn protocol_error(e: &resp::ProtocolError, authenticated: bool) -> String {
    if !e.is_limit() {
        return format!("ERR Protocol error: {e}");
    }
    if authenticated {
        limit::hit(Limit::RequestSize);
        return format!("ERR Protocol error: {e}");
    }
    limit::hit(Limit::UnauthenticatedInput);
    let what = match e {
        resp::ProtocolError::MultibulkLength => "multibulk length".to_string(),
        resp::ProtocolError::BulkLength => "bulk length".to_string(),
        other => other.to_string(),
    };
    format!("ERR Protocol error: unauthenticated {what}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_has_its_time_from_when_it_began() {
        let t0 = tokio::time::Instant::now();
        let later = t0 + Duration::from_secs(3);
        let begun = Some(t0 + REQUEST_TIMEOUT);
        // (current, pending bytes, a request completed in this pass, now) -> deadline
        let table = [
            (None, 0, false, t0, None),
            (None, 5, false, t0, begun),
            (begun, 9, false, later, begun),
            (begun, 9, true, later, Some(later + REQUEST_TIMEOUT)),
            (begun, 0, true, later, None),
            (begun, 0, false, later, None),
        ];
        for (current, pending, completed, now, expect) in table {
            let got = request_deadline(current, pending, completed, now);
            assert_eq!(got, expect, "{current:?} {pending} {completed}");
        }
    }
}
