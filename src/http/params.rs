//! Request parameters turned into typed values at the edge, with a 400 JSON error naming the
//! parameter when one does not parse (axum's own rejections are plain text).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use axum::extract::{FromRequestParts, Path, Query};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::ApiError;
use crate::config::duration;
use crate::topology::Node;

/// The longest a client may ask a request to be held open.
pub const MAX_WAIT: Duration = Duration::from_secs(300);

/// The query string as `T` (fields are `Option<String>`, parsed by the functions below).
pub struct Params<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let query = Query::<T>::from_request_parts(parts, state).await;
        query.map(|Query(q)| Params(q)).map_err(|e| ApiError::bad_request(e.body_text()))
    }
}

/// The `{name}` of a master route.
pub struct Name(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Name {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let path = Path::<String>::from_request_parts(parts, state).await;
        path.map(|Path(name)| Name(name)).map_err(|e| ApiError::bad_request(e.body_text()))
    }
}

/// `wait=30s`: how long to hold the request, capped at [`MAX_WAIT`]; `None` when absent or zero.
pub fn wait(value: Option<&str>) -> Result<Option<Duration>, ApiError> {
    let Some(text) = value else { return Ok(None) };
    let wait = duration::parse(text).map_err(|e| ApiError::bad_request(format!("wait: {e}")))?;
    Ok(Some(wait.min(MAX_WAIT)).filter(|w| !w.is_zero()))
}

/// A non-negative integer parameter such as `after=<epoch>` or `since=<event id>`.
pub fn number(name: &str, value: Option<&str>) -> Result<Option<u64>, ApiError> {
    let Some(text) = value else { return Ok(None) };
    let number = text.trim().parse().map_err(|_| {
        ApiError::bad_request(format!("{name}: {text:?} is not a non-negative integer"))
    })?;
    Ok(Some(number))
}

/// The node an `?is=` health check asks about: `ip:port`, `[ipv6]:port` or `hostname:port`.
#[derive(Debug, PartialEq, Eq)]
pub enum Target {
    Addr(SocketAddr),
    Host(String, u16),
}

impl Target {
    pub fn parse(text: &str) -> Result<Self, ApiError> {
        if let Ok(addr) = text.parse::<SocketAddr>() {
            return Ok(Self::Addr(addr));
        }
        let bad = || ApiError::bad_request(format!("is: {text:?} is not ip:port"));
        let (host, port) = text.rsplit_once(':').ok_or_else(bad)?;
        let port = port.parse::<u16>().map_err(|_| bad())?;
        if host.parse::<IpAddr>().is_ok() || !is_hostname(host) {
            return Err(bad());
        }
        Ok(Self::Host(host.to_ascii_lowercase(), port))
    }

    pub fn is(&self, node: &Node) -> bool {
        match self {
            Self::Addr(addr) => *addr == node.addr(),
            Self::Host(host, port) => {
                *port == node.port
                    && node.hostname.as_deref().is_some_and(|h| h.eq_ignore_ascii_case(host))
            }
        }
    }
}

fn is_hostname(host: &str) -> bool {
    let allowed = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.';
    !host.is_empty() && host.len() <= 253 && host.chars().all(allowed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_is_capped_and_zero_means_none() {
        assert_eq!(wait(None), Ok(None));
        assert_eq!(wait(Some("0s")), Ok(None));
        assert_eq!(wait(Some("2s")), Ok(Some(Duration::from_secs(2))));
        assert_eq!(wait(Some("1h")), Ok(Some(MAX_WAIT)));
        assert!(wait(Some("fast")).is_err());
    }

    #[test]
    fn numbers_name_the_parameter() {
        assert_eq!(number("after", Some("7")), Ok(Some(7)));
        let error = number("after", Some("x")).err().map(|e| e.message);
        assert_eq!(error.as_deref(), Some("after: \"x\" is not a non-negative integer"));
        assert!(number("since", Some("-1")).is_err());
    }

    #[test]
    fn targets_parse_ips_and_hostnames() {
        let v4: SocketAddr = ([10, 0, 0, 1], 6379).into();
        assert_eq!(Target::parse("10.0.0.1:6379"), Ok(Target::Addr(v4)));
        assert!(matches!(Target::parse("[::1]:6379"), Ok(Target::Addr(_))));
        assert_eq!(Target::parse("Redis-1.lan:6379"), Ok(Target::Host("redis-1.lan".into(), 6379)));
        for bad in ["garbage", "10.0.0.1", "10.0.0.1:x", "10.0.0.1:70000", ":6379", "a b:1"] {
            assert!(Target::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn targets_match_nodes_by_address_or_hostname() {
        let node = Node { ip: [10, 0, 0, 1].into(), port: 6379, hostname: Some("r1.lan".into()) };
        assert!(Target::Addr(node.addr()).is(&node));
        assert!(Target::Host("r1.lan".into(), 6379).is(&node));
        assert!(!Target::Host("r1.lan".into(), 6380).is(&node));
        assert!(!Target::Addr(([10, 0, 0, 2], 6379).into()).is(&node));
    }
}
