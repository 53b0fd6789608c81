//! Whether a node handed off is back: a pure verdict over what the node itself says and what
//! was known of it when it was handed off, table-tested. It is asked when it matters (a
//! handoff of another node of the same master looks at every node of it still out, directly)
//! and by the background look that follows a node out ([`super::handoff`]).
//!
//! Back means: it answers, it is `role:slave` of the published primary with
//! `master_link_status:up`, it has restarted since its handoff (a new `run_id`, or it was seen
//! gone meanwhile, by us or the Sentinels) or was never stopped at all (the same process
//! [`NEVER_STOPPED`] after its handoff: the shipped hooks stop a node at once), and it is
//! caught up within `readiness.max_lag`.

use std::net::SocketAddr;
use std::time::Duration;

use crate::config::size;

/// A node handed off that still runs the same process this long after its handoff was not
/// stopped for it (the systemd drop-in and the `preStop` hook stop it as soon as the handoff
/// answers): it counts as back once healthy.
pub const NEVER_STOPPED: Duration = Duration::from_secs(60);

/// What was known of a node when it was handed off, and what was seen of it since.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark {
    /// Its `run_id` at its handoff (`None`: it did not say).
    pub run_id: Option<String>,
    /// It was seen gone since: it did not answer us, or the Sentinels reported it unhealthy.
    pub gone: bool,
}

/// One direct look at a node (its `INFO server` and `INFO replication`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    pub run_id: Option<String>,
    /// `role:slave` (or `role:replica`).
    pub replica: bool,
    /// `master_host:master_port`, when it names an address.
    pub primary: Option<SocketAddr>,
    /// `master_link_status:up`.
    pub linked: bool,
    /// `slave_repl_offset`.
    pub offset: Option<u64>,
}

impl NodeInfo {
    /// From the text of `INFO server` and `INFO replication`.
    pub fn parse(server: &str, replication: &str) -> Self {
        let field = |text: &str, key: &str| {
            text.lines()
                .find_map(|l| l.trim_end().strip_prefix(key)?.strip_prefix(':').map(str::to_string))
        };
        let role = field(replication, "role");
        let host = field(replication, "master_host");
        let port = field(replication, "master_port").and_then(|p| p.parse::<u16>().ok());
        let primary = match (host.and_then(|h| h.parse().ok()), port) {
            (Some(ip), Some(port)) => Some(SocketAddr::new(ip, port)),
            _ => None,
        };
        Self {
            run_id: field(server, "run_id"),
            replica: matches!(role.as_deref(), Some("slave" | "replica")),
            primary,
            linked: field(replication, "master_link_status").as_deref() == Some("up"),
            offset: field(replication, "slave_repl_offset").and_then(|o| o.parse().ok()),
        }
    }
}

/// Everything the verdict looks at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts {
    pub mark: Mark,
    /// How long ago it was handed off.
    pub out_for: Duration,
    /// What it says now; `None`: it does not answer.
    pub node: Option<NodeInfo>,
    /// The published primary of its master.
    pub primary: Option<SocketAddr>,
    /// The primary's `master_repl_offset`, read after the node's (`None`: unknown).
    pub primary_offset: Option<u64>,
    /// `readiness.max_lag`.
    pub max_lag: u64,
}

/// `Ok`: back, and whether it restarted (`false`: never stopped). `Err`: why not yet.
pub fn back(f: &Facts) -> Result<bool, String> {
    let Some(node) = &f.node else { return Err("it does not answer".into()) };
    if !node.replica {
        return Err("it is no replica".into());
    }
    let Some(primary) = f.primary else { return Err("its master has no published primary".into()) };
    if node.primary != Some(primary) {
        let theirs = node.primary.map_or("no address".to_string(), |p| p.to_string());
        return Err(format!("it replicates from {theirs}, not the published primary {primary}"));
    }
    if !node.linked {
        return Err("its link to the primary is down (master_link_status)".into());
    }
    let restarted = f.mark.gone || node.run_id != f.mark.run_id;
    if !restarted && f.out_for < NEVER_STOPPED {
        return Err("it has not restarted since its handoff".into());
    }
    match (node.offset, f.primary_offset) {
        (Some(own), Some(top)) if own > top => {
            Err(format!("its offset {own} is ahead of the primary's {top} (another history)"))
        }
        (Some(own), Some(top)) if top - own > f.max_lag => Err(format!(
            "it is {} bytes behind the primary (readiness.max_lag is {})",
            top - own,
            size::format(f.max_lag)
        )),
        (None, _) | (_, None) => Err("its replication offset is unknown".into()),
        _ => Ok(restarted),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on purpose
mod tests {
    use super::*;

    fn primary() -> SocketAddr {
        "10.0.0.1:6379".parse().unwrap()
    }

    fn healthy(run_id: &str) -> NodeInfo {
        NodeInfo {
            run_id: Some(run_id.into()),
            replica: true,
            primary: Some(primary()),
            linked: true,
            offset: Some(1_000),
        }
    }

    fn facts(node: Option<NodeInfo>, gone: bool, out_for: u64) -> Facts {
        Facts {
            mark: Mark { run_id: Some("a".into()), gone },
            out_for: Duration::from_secs(out_for),
            node,
            primary: Some(primary()),
            primary_offset: Some(1_200),
            max_lag: 1 << 20,
        }
    }

    #[test]
    fn a_node_is_back_once_it_restarted_or_never_stopped_and_is_a_caught_up_replica() {
        let with = |change: fn(&mut NodeInfo)| {
            let mut node = healthy("b");
            change(&mut node);
            Some(node)
        };
        let far = |f: &mut Facts| f.primary_offset = Some(1_000 + (2 << 20));
        let ahead = |f: &mut Facts| f.primary_offset = Some(900);
        let unpublished = |f: &mut Facts| f.primary = None;
        let keep = |_: &mut Facts| {};
        type Row = (Option<NodeInfo>, bool, u64, fn(&mut Facts), Result<bool, &'static str>);
        let table: [Row; 13] = [
            // Restarted (a new run id), linked, caught up: back, whatever the Sentinels said.
            (Some(healthy("b")), false, 5, keep, Ok(true)),
            // Seen gone, then the same run id (a persisted one, or a fast restart): back.
            (Some(healthy("a")), true, 5, keep, Ok(true)),
            // Not stopped yet, handed off 5 s ago: still about to be stopped.
            (Some(healthy("a")), false, 5, keep, Err("not restarted")),
            // Never stopped: the same process a long while after its handoff.
            (Some(healthy("a")), false, 61, keep, Ok(false)),
            (None, true, 5, keep, Err("does not answer")),
            (with(|n| n.replica = false), true, 5, keep, Err("no replica")),
            (with(|n| n.primary = "10.0.0.9:6379".parse().ok()), true, 5, keep, Err("10.0.0.9")),
            (with(|n| n.primary = None), true, 5, keep, Err("not the published primary")),
            (with(|n| n.linked = false), true, 5, keep, Err("link to the primary is down")),
            (with(|n| n.offset = None), true, 5, keep, Err("offset is unknown")),
            (Some(healthy("b")), false, 5, far, Err("bytes behind")),
            (Some(healthy("b")), false, 5, ahead, Err("another history")),
            (Some(healthy("b")), false, 5, unpublished, Err("no published primary")),
        ];
        for (node, gone, out_for, change, expected) in table {
            let mut f = facts(node, gone, out_for);
            change(&mut f);
            match (back(&f), expected) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{f:?}"),
                (Err(why), Err(want)) => assert!(why.contains(want), "{why:?} for {f:?}"),
                (got, want) => panic!("{got:?}, not {want:?}, for {f:?}"),
            }
        }
    }

    #[test]
    fn info_says_role_primary_link_offset_and_run_id() {
        let server = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc\r\n";
        let replication = "# Replication\r\nrole:slave\r\nmaster_host:10.0.0.1\r\n\
            master_port:6379\r\nmaster_link_status:up\r\nslave_repl_offset:77\r\n";
        let n = NodeInfo::parse(server, replication);
        assert_eq!(n, NodeInfo { offset: Some(77), ..healthy("abc") });
        let n = NodeInfo::parse(server, "role:master\r\nmaster_repl_offset:9\r\n");
        assert!(!n.replica && !n.linked && n.primary.is_none() && n.offset.is_none());
        let n = NodeInfo::parse("", "role:slave\r\nmaster_host:db1.lan\r\nmaster_port:6379\r\n");
        assert_eq!(n.primary, None, "a hostname is no address");
    }
}
