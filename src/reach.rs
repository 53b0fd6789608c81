//! Why the endpoints polestar dials do not answer: the last connection error of each Sentinel,
//! data node and upstream, kept until a connection to it succeeds.
//!
//! The connecting code records every outcome ([`record`]); `/readyz` lists the errors beside
//! its other reasons, so that an operator whose polestar is not ready reads "certificate
//! signed by an unknown issuer" rather than only "no Sentinel reachable". A new or changed
//! error is logged once (a link retries every few seconds forever; the same error is not
//! logged again each time), and the way back is logged too.
//!
//! It is process-wide because the dialling code is spread over the Sentinel side, the drain
//! side and the agent, and none of them owns the others; the map is bounded.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

/// Endpoints remembered at most: a fleet's data nodes with errors, each a short line.
const MAX_ENDPOINTS: usize = 4096;

static ERRORS: Mutex<BTreeMap<String, String>> = Mutex::new(BTreeMap::new());

fn lock() -> MutexGuard<'static, BTreeMap<String, String>> {
    // Only map operations under the lock, which cannot panic: a poisoned map is consistent.
    ERRORS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Records the outcome of a connection to `endpoint` (`None`: it succeeded).
pub fn record(endpoint: &str, error: Option<&impl std::fmt::Display>) {
    let mut errors = lock();
    match error {
        None => {
            if errors.remove(endpoint).is_some() {
                tracing::info!(%endpoint, "connection works again");
            }
        }
        Some(error) => {
            let error = error.to_string();
            if errors.get(endpoint) == Some(&error) {
                return;
            }
            if errors.len() >= MAX_ENDPOINTS && !errors.contains_key(endpoint) {
                return;
            }
            tracing::warn!(%endpoint, %error, "cannot connect (retrying)");
            errors.insert(endpoint.to_string(), error);
        }
    }
}

/// Every endpoint whose last connection failed, with why (`endpoint: error`), those in
/// `only` when given.
pub fn errors(only: Option<&dyn Fn(&str) -> bool>) -> Vec<String> {
    lock()
        .iter()
        .filter(|(endpoint, _)| only.is_none_or(|f| f(endpoint)))
        .map(|(endpoint, error)| {
            // The error usually starts with the endpoint already.
            if error.contains(endpoint.as_str()) {
                error.clone()
            } else {
                format!("{endpoint}: {error}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_is_kept_until_a_success() {
        let endpoint = "reach-test.invalid:1";
        record(endpoint, Some(&"bad certificate"));
        let mine = |e: &str| e == endpoint;
        assert_eq!(errors(Some(&mine)), ["reach-test.invalid:1: bad certificate"]);
        record(endpoint, None::<&String>);
        assert!(errors(Some(&mine)).is_empty());
    }
}
