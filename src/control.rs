//! Actions the HTTP API asks of the Sentinel side (a planned failover), behind a trait so the
//! API can be tested without Sentinels.

use std::future::Future;
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
}
