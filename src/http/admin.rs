//! The endpoints that act (planned failover, drain), behind the admin bearer token.
//!
//! Without a configured token they are closed (403) rather than open: an operator has to opt
//! in (see [`super::auth`]).

use std::sync::Arc;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::auth::Caller;
use super::params::{self, Name, Params};
use super::view::MasterView;
use super::wait::{self, Waited};
use super::{ApiError, BODY_LIMIT, BODY_READ_TIMEOUT, Shared};
use crate::config::duration;
use crate::events::Kind;
use crate::log_every::LogEvery;

#[derive(Deserialize)]
pub struct FailoverQuery {
    wait: Option<String>,
    max_wait: Option<String>,
    max_lag: Option<String>,
}

/// `POST /v1/masters/{name}/failover`: the lossless switchover ([`crate::switchover`]): the
/// primary fenced until the replicas Sentinel may promote have all of it (`?max_wait=`,
/// default 5 s; 409 with the lag if they do not), then `SENTINEL FAILOVER` (`?max_lag=`
/// refuses up front). Without `?wait=` it answers 202 `{"sentinel","epoch_before",...}` once a
/// Sentinel accepted; with it, the new master state once the epoch has moved past the one
/// before the call (504 if it does not in time).
pub async fn failover(
    State(s): State<Arc<Shared>>,
    Name(name): Name,
    headers: HeaderMap,
    Params(query): Params<FailoverQuery>,
) -> Result<Response, ApiError> {
    super::auth::admin(&s, &headers)?;
    let limit = params::wait(query.wait.as_deref())?;
    let options = super::maintenance::options(query.max_wait.as_deref(), query.max_lag.as_deref())?;
    // A waiting failover is held open like a long-poll, from the admin's own pool (taken
    // before asking Sentinel, so a refused request has not started a failover).
    let _slot = limit.map(|_| s.waiter(Caller::Admin)).transpose()?;
    let before = s.master(&name)?.epoch;
    let switched = s.api.control.switchover(&name, options).await;
    let switched = switched.map_err(super::maintenance::refusal)?;
    let sentinel = switched.sentinel.clone();
    tracing::info!(master = %name, %sentinel, "failover requested through the API");
    let mut data = serde_json::to_value(&switched).unwrap_or_default();
    data["epoch_before"] = json!(before);
    s.api.events.push(Kind::FailoverRequested, Some(&name), data.clone());
    let Some(limit) = limit else { return Ok((StatusCode::ACCEPTED, Json(data)).into_response()) };
    match wait::epoch_above(&s.api.topology, &name, before, limit, &s.shutdown).await? {
        Waited::Moved(master) => Ok(Json(MasterView::from(&*master)).into_response()),
        Waited::TimedOut(_) => Err(timed_out(&name, &sentinel, limit)),
        Waited::Stopping(_) => Err(ApiError::unavailable("polestar is shutting down")),
    }
}

#[derive(Deserialize)]
pub struct DrainBody {
    node: String,
}

/// `POST /v1/masters/{name}/drain` with `{"node":"ip:port"}`: drains that node (the master's
/// primary or one of its replicas) now and answers what was done.
pub async fn drain(
    State(s): State<Arc<Shared>>,
    Name(name): Name,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    // The token and the master first: the body of a caller without the token is never read.
    super::auth::admin(&s, &headers)?;
    s.master(&name)?;
    let body = read_body(body).await?;
    let body: DrainBody = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(format!("body must be {{\"node\":\"ip:port\"}}: {e}"))
    })?;
    let node: std::net::SocketAddr = body
        .node
        .parse()
        .map_err(|_| ApiError::bad_request(format!("node: {:?} is not ip:port", body.node)))?;
    let Some(handle) = &s.api.drain else {
        return Err(ApiError::new(StatusCode::NOT_IMPLEMENTED, "draining is not available"));
    };
    let report = handle.drain_now(&name, node).await.map_err(drain_error)?;
    Ok(Json(report).into_response())
}

/// The whole body, within [`BODY_LIMIT`] bytes and [`BODY_READ_TIMEOUT`] (408 past it).
async fn read_body(body: Body) -> Result<Bytes, ApiError> {
    let read = axum::body::to_bytes(body, BODY_LIMIT);
    static TOO_LARGE: LogEvery = LogEvery::new();
    static TOO_SLOW: LogEvery = LogEvery::new();
    match tokio::time::timeout(BODY_READ_TIMEOUT, read).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(_)) => {
            if let Some(hits) = TOO_LARGE.hit(std::time::Instant::now()) {
                tracing::warn!(hits, "HTTP: a body past {BODY_LIMIT} bytes answered 413");
            }
            Err(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "the body is too large"))
        }
        Err(_) => {
            let waited = duration::format(BODY_READ_TIMEOUT);
            if let Some(hits) = TOO_SLOW.hit(std::time::Instant::now()) {
                tracing::warn!(hits, "HTTP: a body not whole within {waited} answered 408");
            }
            Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                format!("no whole body within {waited}"),
            ))
        }
    }
}

fn drain_error(e: crate::drain::DrainError) -> ApiError {
    use crate::drain::DrainError as E;
    let status = match &e {
        E::Disabled => StatusCode::CONFLICT,
        E::UnknownMaster(_) => StatusCode::NOT_FOUND,
        E::UnknownNode { .. } => StatusCode::BAD_REQUEST,
        E::Node(_) => StatusCode::BAD_GATEWAY,
    };
    ApiError::new(status, e.to_string())
}

fn timed_out(name: &str, sentinel: &str, limit: std::time::Duration) -> ApiError {
    let waited = duration::format(limit);
    let message = format!(
        "Sentinel {sentinel} accepted the failover of {name}, but no new primary was published \
         within {waited}"
    );
    ApiError::new(StatusCode::GATEWAY_TIMEOUT, message)
}
