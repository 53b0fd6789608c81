//! Which connections are served, before and after their token is read.
//!
//! A connection is accepted before anything of it is known, so a cap on connections alone
//! lets anonymous clients (32 addresses of 512 keep-alive connections each) take every slot
//! before an agent's or the admin's token is ever read. So:
//!
//! - anonymous connections draw from [`Caps::anonymous`] slots (16,384), each client address
//!   at most [`Caps::per_client`] of all its connections;
//! - when those are all taken a new connection is still accepted, *on probation*, from a pool
//!   of its own ([`Caps::probation`], [`Caps::probation_per_client`] per address): it must
//!   present the agent or the admin token in its first request within [`PROBATION_WAIT`].
//!   Then it moves to the token holders' slots ([`Caps::token`]), which no anonymous
//!   connection ever takes; without a token it is answered 503 and closed;
//! - when the probation pool is full too, new connections wait in the listen backlog, and
//!   the connection that has waited longest on probation gives way to the next one once it
//!   has had [`PROBATION_GRACE`] to show its token (an honest client sends its request right
//!   after connecting). So a crowd that keeps the pool full of silent connections delays a
//!   token holder by the grace once per pool of them ahead of it in the backlog: with the
//!   default pool and the listen backlog (1,024 each), at most about twice the grace (it was
//!   twice [`PROBATION_WAIT`]). A crowd that also overflows the kernel's backlog makes the
//!   holder's SYN wait for a retransmission (1 s, then 3 s): that is the kernel's queue, not
//!   polestar's.
//!
//! Every refusal is counted in `polestar_http_connections_refused_total{reason}` and logged
//! once per interval.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use axum::extract::{self, Request};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::auth::{self, Caller};
use super::{ApiError, Shared, slots};
use crate::limits::{ClientShare, Clients};
use crate::log_every::LogEvery;
use crate::metrics::HTTP_CONNECTIONS_REFUSED;

/// A connection on probation has this long to send its first request's headers.
pub const PROBATION_WAIT: Duration = Duration::from_secs(2);
/// A connection on probation is not made to give way to a newer one before this.
pub const PROBATION_GRACE: Duration = Duration::from_secs(1);

/// The connection caps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// Connections served as anyone's (the token is not known when they are accepted).
    pub anonymous: usize,
    /// Connections one client address (IPv6: one /64) holds at once, of every kind.
    pub per_client: usize,
    /// Connections accepted while the anonymous slots are all taken, until their token is read.
    pub probation: usize,
    pub probation_per_client: usize,
    /// Connections of token holders that came on probation: one upstream serves its agents
    /// ([`slots::AGENT_WAITERS`]) and the admin API ([`slots::ADMIN_WAITERS`]) whatever
    /// anonymous clients hold.
    pub token: usize,
}

impl Default for Caps {
    fn default() -> Self {
        Self {
            anonymous: 16_384,
            per_client: slots::CONNECTIONS_PER_CLIENT,
            probation: 1024,
            probation_per_client: 16,
            // An agent holds two connections: its event stream and its kept-alive reads.
            token: 2 * slots::AGENT_WAITERS + slots::ADMIN_WAITERS,
        }
    }
}

/// Every connection pool of one server.
pub struct Connections {
    anonymous: Arc<Semaphore>,
    probation: Arc<Semaphore>,
    token: Arc<Semaphore>,
    clients: Clients,
    probation_clients: Clients,
    /// The connections on probation, oldest first (some already admitted, refused or gone):
    /// the first to give way when the pool is full.
    on_probation: Mutex<VecDeque<Weak<Probation>>>,
    probation_cap: usize,
}

/// A connection's place, given back when it is dropped.
pub enum Admission {
    /// One of the anonymous slots.
    Open { _slot: OwnedSemaphorePermit, _client: ClientShare },
    /// On probation until its first request shows a token.
    Probation(Arc<Probation>),
}

/// Which slot a connection will get, taken before it is accepted.
enum Reserved {
    Open(OwnedSemaphorePermit),
    Probation(OwnedSemaphorePermit),
}

impl Connections {
    pub fn new(caps: Caps) -> Self {
        Self {
            anonymous: Arc::new(Semaphore::new(caps.anonymous)),
            probation: Arc::new(Semaphore::new(caps.probation)),
            token: Arc::new(Semaphore::new(caps.token)),
            clients: Clients::new(caps.per_client),
            probation_clients: Clients::new(caps.probation_per_client),
            on_probation: Mutex::new(VecDeque::new()),
            probation_cap: caps.probation,
        }
    }

    /// Waits for a free slot of any pool (an anonymous one first), making the oldest
    /// connection on probation give way once it is past its grace; `None` only at shutdown.
    async fn reserve(&self) -> Option<Reserved> {
        loop {
            tokio::select! {
                biased;
                open = self.anonymous.clone().acquire_owned() => {
                    return open.ok().map(Reserved::Open);
                }
                probation = self.probation.clone().acquire_owned() => {
                    return probation.ok().map(Reserved::Probation);
                }
                () = self.evict_oldest() => {}
            }
        }
    }

    /// Once the oldest connection still waiting on probation is [`PROBATION_GRACE`] old, makes
    /// it give way (its slot is free at once); pending while there is none.
    async fn evict_oldest(&self) {
        let Some(oldest) = self.oldest_waiting() else {
            return std::future::pending().await;
        };
        tokio::time::sleep_until((oldest.since + PROBATION_GRACE).into()).await;
        if oldest.evict() {
            refused(
                "probation_evicted",
                "HTTP connections all taken: the oldest silent connection on probation made room",
            );
        }
    }

    /// The oldest connection on probation still waiting for its first request.
    fn oldest_waiting(&self) -> Option<Arc<Probation>> {
        let mut queue = self.on_probation.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while let Some(front) = queue.front() {
            match front.upgrade() {
                Some(p) if p.is_waiting() => return Some(p),
                _ => {
                    queue.pop_front();
                }
            }
        }
        None
    }

    /// Puts a new connection on probation at the back of the queue (forgetting, now and then,
    /// the ones no longer waiting).
    fn enqueue(&self, probation: &Arc<Probation>) {
        let mut queue = self.on_probation.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if queue.len() >= 2 * self.probation_cap.max(1) {
            queue.retain(|p| p.upgrade().is_some_and(|p| p.is_waiting()));
        }
        queue.push_back(Arc::downgrade(probation));
    }

    /// A place for the connection from `ip`, or `None` when that client holds its share.
    fn admit(&self, reserved: Reserved, ip: std::net::IpAddr) -> Option<Admission> {
        let Some(client) = self.clients.admit(ip) else {
            refused("per_client", "an HTTP client holds its share of connections: closed");
            return None;
        };
        match reserved {
            Reserved::Open(slot) => Some(Admission::Open { _slot: slot, _client: client }),
            Reserved::Probation(slot) => {
                let Some(share) = self.probation_clients.admit(ip) else {
                    refused("per_client", "an HTTP client holds its share of connections: closed");
                    return None;
                };
                let waiting = Waiting { _slot: slot, _share: share, client };
                let probation = Arc::new(Probation {
                    state: Mutex::new(State::Waiting(waiting)),
                    token: self.token.clone(),
                    since: Instant::now(),
                    evicted: Notify::new(),
                });
                self.enqueue(&probation);
                Some(Admission::Probation(probation))
            }
        }
    }

    /// The next slot and the connection it is for: waits for a slot first (making the
    /// oldest connection on probation give way once it is past its grace), then accepts, so
    /// past every pool new clients wait in the listen backlog. `None` when `reserve` is.
    pub async fn accept<S, F, Fut>(&self, accept: F) -> Option<(S, Admission)>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Option<(S, std::net::IpAddr)>>,
    {
        loop {
            let reserved = self.reserve().await?;
            let (stream, ip) = accept().await?;
            if let Some(admission) = self.admit(reserved, ip) {
                return Some((stream, admission));
            }
        }
    }
}

/// A connection accepted while the anonymous slots were all taken.
pub struct Probation {
    state: Mutex<State>,
    /// The token holders' slots, one of which it moves to.
    token: Arc<Semaphore>,
    /// When it was accepted.
    since: Instant,
    /// Told when it must give way (its connection closes).
    evicted: Notify,
}

enum State {
    /// Holding a probation slot (and its client's shares).
    Waiting(Waiting),
    /// A token holder's connection, holding one of their slots (and its client's share).
    Admitted { _slot: OwnedSemaphorePermit, _client: ClientShare },
    /// Refused: answered 503 and closing.
    Refused,
}

struct Waiting {
    _slot: OwnedSemaphorePermit,
    _share: ClientShare,
    /// Kept when it moves to a token holder's slot.
    client: ClientShare,
}

impl Probation {
    fn is_waiting(&self) -> bool {
        let state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        matches!(*state, State::Waiting(_))
    }

    /// Makes a connection still waiting for its first request give way: its slots are free at
    /// once and its connection closes. Whether it was still waiting.
    pub(super) fn evict(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !matches!(*state, State::Waiting(_)) {
            return false;
        }
        *state = State::Refused;
        self.evicted.notify_one();
        true
    }

    /// Until the connection is made to give way (see [`Self::evict`]).
    pub async fn evicted(&self) {
        self.evicted.notified().await;
    }

    /// Whether a request of `caller` may be served on this connection: always once it has
    /// moved to a token holder's slot; for the first request, when it is a token holder's
    /// and a slot is free (the probation slot is then given back).
    fn admit(&self, caller: Option<Caller>) -> bool {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if matches!(*state, State::Admitted { .. }) {
            return true;
        }
        let holder = matches!(caller, Some(Caller::Agent | Caller::Admin));
        let slot = holder.then(|| self.token.clone().try_acquire_owned().ok()).flatten();
        match (std::mem::replace(&mut *state, State::Refused), slot) {
            (State::Waiting(waiting), Some(slot)) => {
                *state = State::Admitted { _slot: slot, _client: waiting.client };
                true
            }
            _ => false,
        }
    }
}

/// The gate in front of every route: a request on a connection on probation is served only
/// when it is a token holder's; others get 503 and the connection closes.
pub(super) async fn gate(
    extract::State(s): extract::State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(probation) = request.extensions().get::<Arc<Probation>>().cloned() else {
        return next.run(request).await;
    };
    let caller = auth::reader(&s, request.headers()).ok();
    if probation.admit(caller) {
        return next.run(request).await;
    }
    refused("connections_full", "HTTP connections all taken: a request without a token refused");
    let message = "too many connections open: only agent and admin tokens are served now";
    let mut response = ApiError::unavailable(message).into_response();
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// Counts and logs (once per interval) one refusal.
fn refused(reason: &'static str, what: &'static str) {
    static PER_CLIENT: LogEvery = LogEvery::new();
    static FULL: LogEvery = LogEvery::new();
    static EVICTED: LogEvery = LogEvery::new();
    metrics::counter!(HTTP_CONNECTIONS_REFUSED, "reason" => reason).increment(1);
    let every = match reason {
        "per_client" => &PER_CLIENT,
        "probation_evicted" => &EVICTED,
        _ => &FULL,
    };
    if let Some(n) = every.hit(Instant::now()) {
        tracing::warn!(refused = n, "{what}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probation(token: &Arc<Semaphore>) -> Probation {
        let (pool, clients) = (Arc::new(Semaphore::new(1)), Clients::new(2));
        let ip = [10, 0, 0, 1].into();
        let waiting = Waiting {
            _slot: pool.try_acquire_owned().expect("free"),
            _share: clients.admit(ip).expect("free"),
            client: clients.admit(ip).expect("free"),
        };
        Probation {
            state: Mutex::new(State::Waiting(waiting)),
            token: token.clone(),
            since: Instant::now(),
            evicted: Notify::new(),
        }
    }

    #[test]
    fn a_connection_on_probation_is_served_only_with_a_token() {
        let token = Arc::new(Semaphore::new(1));
        let agent = probation(&token);
        assert!(agent.admit(Some(Caller::Agent)));
        assert!(agent.admit(None), "later requests on a token holder's connection");
        assert_eq!(token.available_permits(), 0, "it holds a token holder's slot");
        let anonymous = probation(&token);
        assert!(!anonymous.admit(Some(Caller::Anonymous)));
        assert!(!anonymous.admit(Some(Caller::Admin)), "refused once is closing");
        let late = probation(&token);
        assert!(!late.admit(Some(Caller::Admin)), "no token holder's slot left");
        drop(agent);
        assert_eq!(token.available_permits(), 1, "given back with the connection");
    }
}
