//! `sentinel_api:`: the Sentinel protocol endpoint for Sentinel-aware clients.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_yaml::Value;

use super::walk::{Problems, Section};
use super::{HostPort, SentinelApi, duration, parse_addr, secret_file};

/// Connections the endpoint serves at once when `max_connections` is not given.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// How long a client that subscribes to nothing may stay silent, by default. Sentinel itself
/// closes no idle client (`timeout 0`), but the clients that keep a connection to it between
/// questions (redis-py's and go-redis's pools) check it before reuse and reconnect, as they
/// do against any Redis with a `timeout`; the others ask and close, or subscribe (and a
/// subscriber is never idle-closed). A minute frees what they leave behind.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Above this a listener would outgrow any sensible file-descriptor budget.
const MAX_MAX_CONNECTIONS: usize = 1_000_000;

pub(super) fn parse(value: Value, base: &Path, p: &mut Problems) -> Option<SentinelApi> {
    let mut s = Section::new("sentinel_api", value, p);
    let listen_path = s.path("listen");
    let listen = s.take_list("listen", p, |a: String| parse_addr(&a));
    let password_path = s.path("password_file");
    let password = s
        .take::<PathBuf>("password_file", p)
        .and_then(|f| secret_file(&base.join(f), &password_path, p));
    let peers = s.take_list("peers", p, |a: String| HostPort::parse(&a)).unwrap_or_default();
    let cap_path = s.path("max_connections");
    let max_connections =
        s.take::<i64>("max_connections", p).unwrap_or(DEFAULT_MAX_CONNECTIONS as i64);
    let idle_timeout = s
        .take_with("idle_timeout", p, |d: String| {
            let d = duration::parse(&d)?;
            if d.is_zero() { Err("must be > 0".to_string()) } else { Ok(d) }
        })
        .unwrap_or(DEFAULT_IDLE_TIMEOUT);
    s.finish(p);
    if !(1..=MAX_MAX_CONNECTIONS as i64).contains(&max_connections) {
        p.push(&cap_path, format!("must be between 1 and {MAX_MAX_CONNECTIONS}"));
    }
    let listen = listen.filter(|l| !l.is_empty());
    if listen.is_none() {
        p.push(&listen_path, "missing: give at least one address to serve the Sentinel API on");
    }
    if password.is_none() && listen.iter().flatten().any(|a| !a.ip().is_loopback()) {
        let advice = "the endpoint listens beyond loopback without a password: anyone who can \
                      reach it may connect and subscribe; set sentinel_api.password_file";
        p.warn(&listen_path, advice);
    }
    let max_connections = max_connections.clamp(1, MAX_MAX_CONNECTIONS as i64) as usize;
    Some(SentinelApi { listen: listen?, password, peers, max_connections, idle_timeout })
}
