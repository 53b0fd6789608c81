//! Actions the HTTP API asks of the Sentinel side (a planned failover, a lossless switchover, a
//! node handoff), behind a trait so the API can be tested without Sentinels.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("no Sentinel monitors a master named {0:?}")]
    UnknownMaster(String),
    /// No configured or discovered Sentinel answered.
    #[error("no Sentinel reachable: {0}")]
    Unreachable(String),
    /// A Sentinel answered with an error, e.g. `NOGOODSLAVE` or `INPROG`.
    #[error("Sentinel {sentinel} refused: {message}")]
    Refused { sentinel: String, message: String },
}

pub trait Control: Send + Sync + 'static {
    /// Asks a reachable Sentinel for `SENTINEL FAILOVER <master>`; returns the Sentinel used.
    fn failover<'a>(&'a self, master: &'a str) -> BoxFuture<'a, Result<String, ControlError>>;

    /// A switchover that loses no acknowledged write: fence the primary, wait until every
    /// replica Sentinel could promote has all of it, then fail over (see
    /// [`crate::switchover`]). Without one, a plain [`Control::failover`].
    fn switchover<'a>(
        &'a self,
        master: &'a str,
        _options: SwitchoverOptions,
    ) -> BoxFuture<'a, Result<Switched, SwitchoverError>> {
        Box::pin(async move {
            let sentinel = self.failover(master).await?;
            Ok(Switched { sentinel, ..Switched::default() })
        })
    }

    /// Makes `node` safe to stop: a switchover away from it if it is a primary; out of every
    /// replica answer and drained if it is a replica. `master`: the master it must be a node
    /// of (a hook that knows it says so; refused otherwise).
    fn handoff<'a>(
        &'a self,
        _node: SocketAddr,
        _master: Option<&'a str>,
        _options: SwitchoverOptions,
        _wait: std::time::Duration,
    ) -> BoxFuture<'a, Result<HandedOff, SwitchoverError>> {
        Box::pin(async { Err(SwitchoverError::Unsupported("handoff is not available".into())) })
    }
}

/// What a lossless switchover may cost: how long the primary may stay fenced while the
/// replica catches up, and how far behind it may be to start at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwitchoverOptions {
    pub max_wait: std::time::Duration,
    /// Refuse up front when the replica is further behind than this many bytes.
    pub max_lag: Option<u64>,
}

/// `max_wait` when the caller names none.
pub const DEFAULT_MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl Default for SwitchoverOptions {
    fn default() -> Self {
        Self { max_wait: DEFAULT_MAX_WAIT, max_lag: None }
    }
}

/// What a switchover did, once Sentinel accepted the failover.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Switched {
    /// The Sentinel that accepted `SENTINEL FAILOVER`.
    pub sentinel: String,
    /// The primary that was fenced (`None` when the switchover was a plain `SENTINEL FAILOVER`).
    pub primary: Option<SocketAddr>,
    /// The replicas waited for: every one Sentinel could promote.
    pub replicas: Vec<SocketAddr>,
    /// How far behind the furthest of them was when the primary was fenced.
    pub lag_bytes: u64,
    /// How long the fenced primary waited for them.
    pub waited_ms: u64,
    /// Whether Sentinel accepted Valkey 9's `SENTINEL FAILOVER <master> COORDINATED`.
    pub coordinated: bool,
}

/// What a handoff of a node did.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct HandedOff {
    pub node: SocketAddr,
    pub master: String,
    /// `primary` (a switchover moved the primary away) or `replica` (taken out of every
    /// replica answer and drained).
    pub role: &'static str,
    /// Set when the node was the primary.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub switchover: Option<Switched>,
    /// The node's clients killed.
    pub drained: usize,
    /// The node was already handed off and nothing had to be done again.
    pub already: bool,
    /// What the handoff waited for before it could be done (`--wait`), if anything.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waited: Option<Waited>,
}

/// What a handoff waited for: each blocker (its last words) and how long in all.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Waited {
    pub ms: u64,
    #[serde(rename = "for")]
    pub for_: Vec<String>,
}

/// Why a switchover or a handoff was refused. Nothing is left fenced by any of them.
#[derive(Debug, thiserror::Error)]
pub enum SwitchoverError {
    #[error("no master named {0:?}")]
    UnknownMaster(String),
    #[error("{0} has no confirmed primary")]
    NoPrimary(String),
    /// A failover, or another switchover or handoff, of the master is under way.
    #[error("{master}: {why}")]
    Busy { master: String, why: String },
    #[error("{master}: no replica Sentinel could promote ({why})")]
    NoCandidate { master: String, why: String },
    #[error(
        "replica {replica} is {lag_bytes} bytes behind the primary, more than max_lag \
         {max_lag}: nothing fenced, nothing failed over"
    )]
    TooFarBehind { replica: SocketAddr, lag_bytes: u64, max_lag: u64 },
    #[error(
        "replica {replica} was still {lag_bytes} bytes behind after {waited_ms}ms (max_wait): \
         the fence is lifted and nothing failed over"
    )]
    NotCaughtUp { replica: SocketAddr, lag_bytes: u64, waited_ms: u64 },
    #[error("cannot fence the primary {node}: {why}")]
    Fence { node: SocketAddr, why: String },
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error("{0} is not a node of any master polestar serves")]
    UnknownNode(SocketAddr),
    #[error("{node} is a node of {master}, not of {asked}: nothing handed off")]
    OtherMaster { node: SocketAddr, master: String, asked: String },
    /// A replica being handed off (about to stop) is one Sentinel could promote.
    #[error(
        "{replica} of {master} is handed off (about to be stopped) and Sentinel could promote \
         it: nothing fenced, nothing failed over; retry once it is back (restarted and healthy \
         again: the handoff_ended event)"
    )]
    HandedOff { master: String, replica: SocketAddr },
    #[error("handoff of {node} refused: {why}")]
    Refused { node: SocketAddr, why: String },
    #[error("a handoff of {0} is already being asked for: nothing more done")]
    Twice(SocketAddr),
    /// A blocker that could have cleared was still there when the handoff's wait ended; for
    /// a primary, what stopping it now would cost.
    #[error(
        "{why} (still so after waiting {}{}){}",
        crate::config::duration::format(std::time::Duration::from_secs(waited.as_secs())),
        if before.is_empty() { String::new() } else { format!("; before that: {}", before.join("; ")) },
        cost.as_ref().map(|c| format!("; stopping it now: {c}")).unwrap_or_default()
    )]
    Blocked {
        why: Box<SwitchoverError>,
        waited: std::time::Duration,
        /// The other blockers met while it waited (their last words).
        before: Vec<String>,
        cost: Option<String>,
    },
    /// Sentinel accepted, but the new primary was not published in time.
    #[error("{0}")]
    TimedOut(String),
    #[error("{0}")]
    Unsupported(String),
}

impl SwitchoverError {
    /// The replica and its lag, for the errors that have them (the 409 body names both).
    pub fn lag(&self) -> Option<(SocketAddr, u64)> {
        match self {
            Self::TooFarBehind { replica, lag_bytes, .. }
            | Self::NotCaughtUp { replica, lag_bytes, .. } => Some((*replica, *lag_bytes)),
            Self::Blocked { why, .. } => why.lag(),
            _ => None,
        }
    }
}
