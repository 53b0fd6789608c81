//! Readiness and lag-aware replica answers: `GET /v1/masters/{name}/readiness`,
//! `/replicas?max_lag=` and the per-node load-balancer check `/replica?is=&max_lag=`, all read
//! from the [`crate::readiness::Board`] the readiness poller publishes.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::params::{Name, Params, Target};
use super::{ApiError, Shared};
use crate::config::size;
use crate::readiness::{MasterReadiness, Verdict};
use crate::topology::{Master, Node, Replica};

#[derive(Deserialize)]
pub struct LagQuery {
    max_lag: Option<String>,
    is: Option<String>,
}

/// One replica with its lag (`null`: not known).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaLag {
    pub ip: std::net::IpAddr,
    pub port: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    pub healthy: bool,
    pub lag_bytes: Option<u64>,
}

/// `GET /v1/masters/{name}/readiness`: 200 when a failover is possible, 503 with the same
/// body when it is not; 503 with an error before the first judgement (or on an agent).
pub async fn readiness(
    State(s): State<Arc<Shared>>,
    Name(name): Name,
) -> Result<Response, ApiError> {
    let (_, judged) = judged(&s, &name)?;
    let status =
        if judged.verdict.ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    Ok((status, Json::<Verdict>(judged.verdict)).into_response())
}

/// `GET /v1/masters/{name}/replicas?max_lag=1MB`: the replicas with their lag; with `max_lag`
/// only the healthy ones known to lag at most that.
pub async fn replicas(
    State(s): State<Arc<Shared>>,
    Name(name): Name,
    Params(query): Params<LagQuery>,
) -> Result<Json<Vec<ReplicaLag>>, ApiError> {
    let max_lag = max_lag(query.max_lag.as_deref())?;
    let master = s.master(&name)?;
    let lags = s.api.readiness.borrow().masters.get(&name).map(|m| m.lags.clone());
    let listed = master.replicas.iter().map(|r| with_lag(r, lags.as_ref()));
    Ok(Json(listed.filter(|r| max_lag.is_none_or(|max| under(r, max))).collect()))
}

/// `GET /v1/masters/{name}/replica?is=ip:port&max_lag=1MB`: 200 only when that node is a
/// healthy replica of the master (and, with `max_lag`, known to lag at most that).
pub async fn replica(
    State(s): State<Arc<Shared>>,
    Name(name): Name,
    Params(query): Params<LagQuery>,
) -> Result<Response, ApiError> {
    let target = query.is.as_deref().ok_or_else(|| ApiError::bad_request("is: missing (ip:port)"));
    let target = Target::parse(target?)?;
    let max_lag = max_lag(query.max_lag.as_deref())?;
    let master = s.master(&name)?;
    let Some(found) = master.replicas.iter().find(|r| target.is(&node(r))) else {
        return Err(ApiError::not_found(format!("{} is not a replica of {name}", shown(&target))));
    };
    let lags = s.api.readiness.borrow().masters.get(&name).map(|m| m.lags.clone());
    let r = with_lag(found, lags.as_ref());
    let addr = node(found).addr();
    if !r.healthy {
        return Err(ApiError::unavailable(format!("{addr} is not healthy")));
    }
    let lag = match (max_lag, r.lag_bytes) {
        (Some(_), None) => return Err(ApiError::unavailable(format!("{addr}: lag not known"))),
        (Some(max), Some(lag)) if lag > max => {
            let max = size::format(max);
            return Err(ApiError::unavailable(format!("{addr} lags {lag} bytes (max_lag {max})")));
        }
        (_, lag) => lag.map(|l| format!(" lag {l} bytes")).unwrap_or_default(),
    };
    let text = format!("{addr} is a healthy replica of {name}{lag}");
    Ok((StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text)
        .into_response())
}

fn judged(s: &Shared, name: &str) -> Result<(Arc<Master>, MasterReadiness), ApiError> {
    let master = s.master(name)?;
    let board = s.api.readiness.borrow().clone();
    let judged = board.masters.get(name).cloned().ok_or_else(|| {
        ApiError::unavailable(format!(
            "{name} has not been judged yet (readiness is judged by a polestar that watches \
             Sentinels, every readiness.interval)"
        ))
    })?;
    Ok((master, judged))
}

fn max_lag(value: Option<&str>) -> Result<Option<u64>, ApiError> {
    let Some(text) = value else { return Ok(None) };
    size::parse(text).map(Some).map_err(|e| ApiError::bad_request(format!("max_lag: {e}")))
}

fn with_lag(r: &Replica, lags: Option<&std::collections::BTreeMap<String, u64>>) -> ReplicaLag {
    let lag_bytes = lags.and_then(|l| l.get(&node(r).addr().to_string()).copied());
    ReplicaLag {
        ip: r.ip,
        port: r.port,
        hostname: r.hostname.clone(),
        healthy: r.healthy,
        lag_bytes,
    }
}

fn under(r: &ReplicaLag, max: u64) -> bool {
    r.healthy && r.lag_bytes.is_some_and(|l| l <= max)
}

fn node(r: &Replica) -> Node {
    Node { ip: r.ip, port: r.port, hostname: r.hostname.clone() }
}

fn shown(target: &Target) -> String {
    match target {
        Target::Addr(addr) => addr.to_string(),
        Target::Host(host, port) => format!("{host}:{port}"),
    }
}
