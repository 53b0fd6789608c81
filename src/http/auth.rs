//! Who is asking: the bearer tokens of the API.
//!
//! Two tokens, both optional and both reloadable: the admin token opens the endpoints that act
//! (planned failover, drain); the agent token identifies the agents (`upstream:` polestars)
//! that follow this one, so that the slots held open for them (event streams, long-polls)
//! cannot be taken by anonymous clients. A request that presents a token matching neither is
//! refused (401): an agent with a wrong token must hear so, not be served as anonymous.
//! Tokens are compared in constant time so their bytes cannot be probed by timing.

use axum::http::{HeaderMap, StatusCode, header};
use subtle::ConstantTimeEq;

use super::{ApiError, Shared};

/// The caller of a request, by the token it presented.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    Anonymous,
    Agent,
    Admin,
}

/// The caller of a read endpoint: anonymous without a token, else the token must be the
/// agent's or the admin's (401 otherwise).
pub(super) fn reader(s: &Shared, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let Some(given) = bearer(headers) else { return Ok(Caller::Anonymous) };
    if is(given, &s.api.agent_token) {
        Ok(Caller::Agent)
    } else if is(given, &s.api.admin_token) {
        Ok(Caller::Admin)
    } else {
        Err(ApiError::new(StatusCode::UNAUTHORIZED, "wrong bearer token"))
    }
}

/// The admin endpoints: 403 when no admin token is configured, 401 when the request's bearer
/// token is missing or wrong.
pub(super) fn admin(s: &Shared, headers: &HeaderMap) -> Result<(), ApiError> {
    if s.api.admin_token.borrow().is_none() {
        let message = "the admin endpoints are disabled: no http.admin_token_file is configured";
        return Err(ApiError::new(StatusCode::FORBIDDEN, message));
    }
    let unauthorized = |m: &str| ApiError::new(StatusCode::UNAUTHORIZED, m);
    let given = bearer(headers).ok_or_else(|| unauthorized("a bearer token is required"))?;
    if is(given, &s.api.admin_token) { Ok(()) } else { Err(unauthorized("wrong bearer token")) }
}

/// Whether `given` is the token configured now (never, when none is).
fn is(given: &str, token: &super::Token) -> bool {
    let expected = token.borrow();
    expected.as_ref().is_some_and(|e| bool::from(given.as_bytes().ct_eq(e.expose().as_bytes())))
}

/// The token of an `Authorization: Bearer <token>` header (the scheme is case-insensitive).
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn with_authorization(value: &'static str) -> HeaderMap {
        HeaderMap::from_iter([(header::AUTHORIZATION, HeaderValue::from_static(value))])
    }

    #[test]
    fn bearer_tokens_are_read_with_any_scheme_case() {
        assert_eq!(bearer(&with_authorization("Bearer s3cret")), Some("s3cret"));
        assert_eq!(bearer(&with_authorization("bearer s3cret")), Some("s3cret"));
        assert_eq!(bearer(&with_authorization("Basic s3cret")), None);
        assert_eq!(bearer(&with_authorization("Bearer ")), None);
        assert_eq!(bearer(&HeaderMap::new()), None);
    }
}
