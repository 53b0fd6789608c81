//! The published topology in Sentinel's words: the field lists of `SENTINEL MASTER`,
//! `SENTINEL REPLICAS` and `SENTINEL SENTINELS`, as clients parse them.
//!
//! Clients read only some fields (redis-py turns `flags` into `is_master`/`is_sdown`/`is_odown`
//! and checks `num-other-sentinels`; others read `ip`, `port`, `flags`), but expect the
//! numeric ones to be numbers, so every field Sentinel sends is here with a value that is true
//! of the published state or a neutral one (`0` for timers polestar does not keep).

use std::net::IpAddr;

use crate::config::HostPort;
use crate::topology::{Master, MasterState, Node, Replica};

use super::resp::Reply;

/// `SENTINEL MASTER` of a master whose primary is published.
pub fn master(m: &Master, primary: &Node, peers: usize) -> Reply {
    let flags = match m.state {
        MasterState::Failover => "master,failover_in_progress",
        _ => "master",
    };
    let epoch = m.epoch.unwrap_or(0).to_string();
    let quorum = (m.sentinels.configured / 2 + 1).to_string();
    Reply::fields([
        ("name", m.name.clone()),
        ("ip", host(primary)),
        ("port", primary.port.to_string()),
        ("runid", String::new()),
        ("flags", flags.to_string()),
        ("link-pending-commands", "0".into()),
        ("link-refcount", "1".into()),
        ("last-ping-sent", "0".into()),
        ("last-ok-ping-reply", "0".into()),
        ("last-ping-reply", "0".into()),
        ("down-after-milliseconds", "0".into()),
        ("info-refresh", "0".into()),
        ("role-reported", "master".into()),
        ("role-reported-time", "0".into()),
        ("config-epoch", epoch),
        ("num-slaves", m.replicas.len().to_string()),
        ("num-other-sentinels", peers.to_string()),
        ("quorum", quorum),
        ("failover-timeout", "0".into()),
        ("parallel-syncs", "1".into()),
    ])
}

/// One entry of `SENTINEL REPLICAS`: an unhealthy replica is flagged `s_down`, so clients that
/// pick a replica to read from skip it.
pub fn replica(r: &Replica, primary: Option<&Node>) -> Reply {
    let flags = if r.healthy { "slave" } else { "slave,s_down" };
    let ip = r.hostname.clone().unwrap_or_else(|| r.ip.to_string());
    let (master_host, master_port) = match primary {
        Some(p) => (host(p), p.port.to_string()),
        None => ("?".to_string(), "0".to_string()),
    };
    Reply::fields([
        ("name", addr_name(&ip, r.port)),
        ("ip", ip),
        ("port", r.port.to_string()),
        ("runid", String::new()),
        ("flags", flags.to_string()),
        ("link-pending-commands", "0".into()),
        ("link-refcount", "1".into()),
        ("last-ping-sent", "0".into()),
        ("last-ok-ping-reply", "0".into()),
        ("last-ping-reply", "0".into()),
        ("down-after-milliseconds", "0".into()),
        ("info-refresh", "0".into()),
        ("role-reported", "slave".into()),
        ("role-reported-time", "0".into()),
        ("master-link-down-time", "0".into()),
        ("master-link-status", if r.healthy { "ok" } else { "err" }.into()),
        ("master-host", master_host),
        ("master-port", master_port),
        ("slave-priority", "100".into()),
        ("slave-repl-offset", "0".into()),
        ("replica-announced", "1".into()),
    ])
}

/// One entry of `SENTINEL SENTINELS`: another polestar from `sentinel_api.peers`.
pub fn peer(p: &HostPort) -> Reply {
    Reply::fields([
        ("name", addr_name(&p.host, p.port)),
        ("ip", p.host.clone()),
        ("port", p.port.to_string()),
        ("runid", run_id(&p.to_string())),
        ("flags", "sentinel".into()),
        ("link-pending-commands", "0".into()),
        ("link-refcount", "1".into()),
        ("last-ping-sent", "0".into()),
        ("last-ok-ping-reply", "0".into()),
        ("last-ping-reply", "0".into()),
        ("down-after-milliseconds", "0".into()),
        ("last-hello-message", "0".into()),
        ("voted-leader", "?".into()),
        ("voted-leader-epoch", "0".into()),
    ])
}

/// How clients reach a node: its hostname when Sentinel announces hostnames, else its address.
pub fn host(node: &Node) -> String {
    node.hostname.clone().unwrap_or_else(|| node.ip.to_string())
}

fn addr_name(host: &str, port: u16) -> String {
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
        _ => format!("{host}:{port}"),
    }
}

/// A stable 40-hex-digit run id for `seed` (Sentinel's ids have this shape; clients that
/// deduplicate Sentinels by it then see one id per peer).
pub fn run_id(seed: &str) -> String {
    // FNV-1a, widened: not a secret, only stable and well spread.
    let mut out = String::with_capacity(40);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for round in 0u8..3 {
        for b in seed.bytes().chain([round]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        out.push_str(&format!("{h:016x}"));
    }
    out.truncate(40);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_forty_hex_digits_and_stable() {
        let a = run_id("10.0.0.1:26380");
        assert_eq!(a.len(), 40);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(a, run_id("10.0.0.1:26380"));
        assert_ne!(a, run_id("10.0.0.2:26380"));
    }
}
