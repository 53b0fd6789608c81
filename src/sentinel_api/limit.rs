//! The endpoint's limits, as they are hit: each hit is counted
//! (`polestar_sentinel_api_limited_total{limit}`) and logged once per interval *per limit*
//! with the hits since the last line, so a flood that keeps hitting one limit neither floods
//! the log nor hides that another limit is being hit.

use std::time::Instant;

use crate::log_every::LogEvery;
use crate::metrics as m;

/// One limit of the endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// A connection past `sentinel_api.max_connections`: told `-ERR max number of clients
    /// reached` and closed.
    MaxConnections,
    /// A connection past its address's share ([`super::CONNECTIONS_PER_CLIENT`]): told the
    /// same and closed.
    PerClient,
    /// A subscription past the per-connection caps (count, patterns, bytes): refused.
    Subscriptions,
    /// A request larger than allowed before `AUTH`.
    UnauthenticatedInput,
    /// A request larger than [`super::MAX_REQUEST`].
    RequestSize,
    /// Every connection's partial requests together past [`super::INPUT_BUDGET`].
    InputBudget,
    /// A request begun and not complete within [`super::REQUEST_TIMEOUT`].
    RequestTimeout,
    /// No `AUTH` within [`super::AUTH_TIMEOUT`] while a password is set.
    AuthTimeout,
    /// A client subscribed to nothing, silent for `sentinel_api.idle_timeout`.
    IdleTimeout,
    /// A subscriber a whole backlog behind, or not taking a message within
    /// [`super::WRITE_TIMEOUT`].
    SlowSubscriber,
    /// A client not taking a reply within [`super::WRITE_TIMEOUT`].
    WriteTimeout,
}

impl Limit {
    pub const ALL: [Limit; 11] = [
        Limit::MaxConnections,
        Limit::PerClient,
        Limit::Subscriptions,
        Limit::UnauthenticatedInput,
        Limit::RequestSize,
        Limit::InputBudget,
        Limit::RequestTimeout,
        Limit::AuthTimeout,
        Limit::IdleTimeout,
        Limit::SlowSubscriber,
        Limit::WriteTimeout,
    ];

    /// The `limit` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::MaxConnections => "max_connections",
            Limit::PerClient => "per_client",
            Limit::Subscriptions => "subscriptions",
            Limit::UnauthenticatedInput => "unauthenticated_input",
            Limit::RequestSize => "request_size",
            Limit::InputBudget => "input_budget",
            Limit::RequestTimeout => "request_timeout",
            Limit::AuthTimeout => "auth_timeout",
            Limit::IdleTimeout => "idle_timeout",
            Limit::SlowSubscriber => "slow_subscriber",
            Limit::WriteTimeout => "write_timeout",
        }
    }

    /// What happened, for the log line.
    fn what(self) -> &'static str {
        match self {
            Limit::MaxConnections => {
                "every connection is taken (sentinel_api.max_connections): a new client was told so and closed"
            }
            Limit::PerClient => {
                "a client address holds its share of connections: a new one was told so and closed"
            }
            Limit::Subscriptions => "a subscription past the per-connection caps was refused",
            Limit::UnauthenticatedInput => {
                "a request too large before AUTH: answered with a protocol error and closed"
            }
            Limit::RequestSize => "a request too large: answered with a protocol error and closed",
            Limit::InputBudget => {
                "the partial requests of all clients fill the input budget: a client was refused and closed"
            }
            Limit::RequestTimeout => "a request was not complete in time: closed",
            Limit::AuthTimeout => "a client did not authenticate in time: closed",
            Limit::IdleTimeout => "an idle client (no subscription) was closed",
            Limit::SlowSubscriber => "a subscriber that did not keep up was closed",
            Limit::WriteTimeout => "a client that did not read its replies was closed",
        }
    }

    fn index(self) -> usize {
        Limit::ALL.iter().position(|l| *l == self).unwrap_or(0)
    }
}

/// Counts one hit of `limit` and logs it once per interval (with the hits since).
pub fn hit(limit: Limit) {
    static EVERY: [LogEvery; Limit::ALL.len()] = [const { LogEvery::new() }; Limit::ALL.len()];
    metrics::counter!(m::SENTINEL_API_LIMITED, "limit" => limit.as_str()).increment(1);
    if let Some(hits) = EVERY[limit.index()].hit(Instant::now()) {
        tracing::warn!(
            limit = limit.as_str(),
            hits,
            "Sentinel API client hit a limit: {}",
            limit.what()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_limit_has_its_own_label_and_log() {
        let labels: std::collections::BTreeSet<_> = Limit::ALL.iter().map(|l| l.as_str()).collect();
        assert_eq!(labels.len(), Limit::ALL.len());
        for (i, limit) in Limit::ALL.iter().enumerate() {
            assert_eq!(limit.index(), i);
        }
    }
}
