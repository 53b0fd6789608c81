//! The switchover's parameters and refusals, and `POST /v1/nodes/{ip:port}/handoff`: make a
//! node safe to stop (see [`crate::switchover`]). Behind the admin bearer token.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::auth::Caller;
use super::params::{self, Params};
use super::{ApiError, Shared};
use crate::config::{duration, size};
use crate::control::{SwitchoverError, SwitchoverOptions};

/// How long a handoff waits for its blockers to clear, and then for the new primary, when
/// `?wait=` names no time.
const HANDOFF_WAIT: Duration = Duration::from_secs(30);

/// `?max_wait=5s&max_lag=1MB`, checked before anything is asked of a node.
pub fn options(
    max_wait: Option<&str>,
    max_lag: Option<&str>,
) -> Result<SwitchoverOptions, ApiError> {
    let mut options = SwitchoverOptions::default();
    if let Some(text) = max_wait {
        let wait =
            duration::parse(text).map_err(|e| ApiError::bad_request(format!("max_wait: {e}")))?;
        options.max_wait = wait.min(params::MAX_WAIT);
    }
    if let Some(text) = max_lag {
        let lag = size::parse(text).map_err(|e| ApiError::bad_request(format!("max_lag: {e}")))?;
        options.max_lag = Some(lag);
    }
    Ok(options)
}

/// What a refused switchover or handoff means to an HTTP client; one that waited for a
/// replica names it and its lag beside the error.
pub fn refusal(error: SwitchoverError) -> ApiError {
    use SwitchoverError as E;
    let status = match &error {
        E::UnknownMaster(_) | E::UnknownNode(_) => StatusCode::NOT_FOUND,
        E::NoPrimary(_) => StatusCode::SERVICE_UNAVAILABLE,
        E::Busy { .. } | E::NoCandidate { .. } | E::TooFarBehind { .. } | E::NotCaughtUp { .. } => {
            StatusCode::CONFLICT
        }
        E::Refused { .. } | E::OtherMaster { .. } | E::HandedOff { .. } => StatusCode::CONFLICT,
        E::Twice(_) | E::Blocked { .. } => StatusCode::CONFLICT,
        E::Fence { .. } => StatusCode::BAD_GATEWAY,
        E::TimedOut(_) => StatusCode::GATEWAY_TIMEOUT,
        E::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
        E::Control(_) => StatusCode::OK,
    };
    let lag = error.lag();
    let blocked = match &error {
        E::Blocked { waited, cost, .. } => Some((waited.as_millis() as u64, cost.clone())),
        _ => None,
    };
    let api = match error {
        E::Control(control) => ApiError::from(control),
        other => ApiError::new(status, other.to_string()),
    };
    let api = match lag {
        Some((replica, lag_bytes)) => {
            api.with("replica", json!(replica.to_string())).with("lag_bytes", json!(lag_bytes))
        }
        None => api,
    };
    match blocked {
        Some((waited_ms, cost)) => {
            let api = api.with("waited_ms", json!(waited_ms));
            match cost {
                Some(cost) => api.with("cost", json!(cost)),
                None => api,
            }
        }
        None => api,
    }
}

#[derive(Deserialize)]
pub struct HandoffQuery {
    /// The master the node must be a node of.
    master: Option<String>,
    wait: Option<String>,
    max_wait: Option<String>,
    max_lag: Option<String>,
}

/// `POST /v1/nodes/{ip:port}/handoff?wait=30s[&master=NAME]`: a switchover away from the node
/// if it is a primary (answered once the new primary is published and the node drained), or
/// the node out of every replica answer and drained if it is a replica. 200 with what was
/// done. With `master`, refused (409) unless the node is one of that master's.
pub async fn handoff(
    State(s): State<Arc<Shared>>,
    Path(node): Path<String>,
    headers: HeaderMap,
    Params(query): Params<HandoffQuery>,
) -> Result<Response, ApiError> {
    super::auth::admin(&s, &headers)?;
    let node: SocketAddr = node
        .parse()
        .map_err(|_| ApiError::bad_request(format!("node: {node:?} is not ip:port")))?;
    let wait = params::wait(query.wait.as_deref())?.unwrap_or(HANDOFF_WAIT);
    let options = options(query.max_wait.as_deref(), query.max_lag.as_deref())?;
    let _slot = s.waiter(Caller::Admin)?;
    let master = query.master.as_deref();
    let done = s.api.control.handoff(node, master, options, wait).await.map_err(refusal)?;
    Ok(Json(done).into_response())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on purpose
mod tests {
    use super::*;

    #[test]
    fn switchover_parameters_are_checked_and_named() {
        assert_eq!(options(None, None).unwrap(), SwitchoverOptions::default());
        let o = options(Some("2s"), Some("512KB")).unwrap();
        assert_eq!((o.max_wait, o.max_lag), (Duration::from_secs(2), Some(512 * 1024)));
        let e = options(None, Some("lots")).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.starts_with("max_lag: \"lots\" is not a size"), "{}", e.message);
        assert!(options(Some("soon"), None).unwrap_err().message.starts_with("max_wait:"));
    }

    #[test]
    fn a_switchover_that_waited_in_vain_names_the_replica_and_its_lag() {
        let replica: SocketAddr = "10.0.0.2:6379".parse().unwrap();
        let e = refusal(SwitchoverError::NotCaughtUp { replica, lag_bytes: 4096, waited_ms: 5000 });
        assert_eq!(e.status, StatusCode::CONFLICT);
        assert_eq!(e.fields["replica"], json!("10.0.0.2:6379"));
        assert_eq!(e.fields["lag_bytes"], json!(4096));
        let e = refusal(SwitchoverError::UnknownNode(replica));
        assert_eq!(e.status, StatusCode::NOT_FOUND);
    }
}
