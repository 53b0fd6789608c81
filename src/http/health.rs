//! Liveness, readiness and metrics: what systemd, Kubernetes-style probes and Prometheus ask.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use serde_json::{Value, json};

use super::Shared;
use crate::topology::Snapshot;

/// `GET /healthz`: the process is serving.
pub async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// `GET /readyz`: 200 when every master has a confirmed primary and a Sentinel is reachable,
/// else 503 with every reason.
pub async fn readyz(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    let snapshot = s.api.topology.borrow().clone();
    let mut reasons = unready_reasons(&snapshot);
    if !snapshot.source_reachable {
        // Why: the last error of every endpoint that does not answer (a TLS problem, say).
        reasons.extend(crate::reach::errors(None));
    }
    let status = if reasons.is_empty() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(json!({ "ready": reasons.is_empty(), "reasons": reasons })))
}

/// `GET /metrics`: the Prometheus text exposition. Gauges are kept by their writers.
pub async fn metrics(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    let content_type = "text/plain; version=0.0.4; charset=utf-8";
    ([(header::CONTENT_TYPE, content_type)], s.api.metrics.render())
}

fn unready_reasons(snapshot: &Snapshot) -> Vec<String> {
    let mut reasons = Vec::new();
    if !snapshot.source_reachable {
        reasons.push("no Sentinel reachable".to_owned());
    }
    if snapshot.masters.is_empty() {
        reasons.push("no masters known yet".to_owned());
    }
    let unconfirmed = snapshot.masters.values().filter(|m| m.primary.is_none());
    reasons.extend(unconfirmed.map(|m| format!("{}: no confirmed primary", m.name)));
    reasons
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::topology::{Master, MasterState, Node};

    fn master(name: &str, primary: Option<Node>) -> (String, Arc<Master>) {
        let master = Master {
            withdrawn: None,
            provisional: false,
            name: name.into(),
            label: name.into(),
            primary,
            epoch: None,
            since: None,
            state: MasterState::Unknown,
            replicas: vec![],
            sentinels: Default::default(),
        };
        (name.to_owned(), Arc::new(master))
    }

    #[test]
    fn every_reason_is_listed() {
        let node = Node { ip: [127, 0, 0, 1].into(), port: 6379, hostname: None };
        let masters = BTreeMap::from([master("a", None), master("b", Some(node))]);
        let snapshot = Snapshot { version: 1, masters, source_reachable: false };
        assert_eq!(
            unready_reasons(&snapshot),
            ["no Sentinel reachable", "a: no confirmed primary"]
        );
    }

    #[test]
    fn no_masters_is_not_ready() {
        let snapshot = Snapshot { source_reachable: true, ..Default::default() };
        assert_eq!(unready_reasons(&snapshot), ["no masters known yet"]);
    }
}
