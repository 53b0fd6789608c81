//! The read side for masters: the list, one master (optionally long-polled), and the bare
//! primary address with the `?is=` check that load balancers use as a health check.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::params::{self, Name, Params, Target};
use super::view::MasterView;
use super::wait::{self, Waited};
use super::{ApiError, Shared};
use crate::topology::Master;

#[derive(Deserialize)]
pub struct WaitQuery {
    wait: Option<String>,
    after: Option<String>,
}

#[derive(Deserialize)]
pub struct IsQuery {
    is: Option<String>,
}

/// `GET /v1/masters`: every master, sorted by name (rendered once per published snapshot).
pub async fn list(State(s): State<Arc<Shared>>) -> Response {
    let json = HeaderValue::from_static("application/json");
    ([(header::CONTENT_TYPE, json)], s.masters_json()).into_response()
}

/// `GET /v1/masters/{name}`, with `?wait=&after=` held until the epoch passes `after` (by
/// default the epoch at the time of the request); on timeout the current state, still 200.
pub async fn one(
    State(s): State<Arc<Shared>>,
    Name(name): Name,
    headers: HeaderMap,
    Params(query): Params<WaitQuery>,
) -> Result<Json<MasterView>, ApiError> {
    let caller = super::auth::reader(&s, &headers)?;
    let limit = params::wait(query.wait.as_deref())?;
    let after = params::number("after", query.after.as_deref())?;
    let master = s.master(&name)?;
    let Some(limit) = limit else { return Ok(Json(MasterView::from(&*master))) };
    let _slot = s.waiter(caller)?;
    let floor = after.or(master.epoch);
    let waited = wait::epoch_above(&s.api.topology, &name, floor, limit, &s.shutdown).await?;
    let (Waited::Moved(m) | Waited::TimedOut(m) | Waited::Stopping(m)) = waited;
    Ok(Json(MasterView::from(&*m)))
}

/// `GET /v1/masters/{name}/primary`: `ip:port` as text, 503 while no primary is confirmed;
/// with `?is=` 200 only when that node is the primary.
pub async fn primary(
    State(s): State<Arc<Shared>>,
    Name(name): Name,
    Params(query): Params<IsQuery>,
) -> Result<Response, ApiError> {
    let target = query.is.as_deref().map(Target::parse).transpose()?;
    let master = s.master(&name)?;
    let Some(primary) = &master.primary else { return Err(no_primary(&master)) };
    if let Some(target) = target.filter(|t| !t.is(primary)) {
        return Err(not_the_primary(&master, &target, primary.addr()));
    }
    let text = primary.addr().to_string();
    Ok((StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text)
        .into_response())
}

fn no_primary(master: &Master) -> ApiError {
    ApiError::unavailable(format!("{} has no confirmed primary", master.name))
}

fn not_the_primary(master: &Master, target: &Target, primary: std::net::SocketAddr) -> ApiError {
    let asked = match target {
        Target::Addr(addr) => addr.to_string(),
        Target::Host(host, port) => format!("{host}:{port}"),
    };
    ApiError::unavailable(format!("{asked} is not the primary of {} ({primary} is)", master.name))
}
