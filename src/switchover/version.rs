//! Which server a peer is, from its `INFO server`, and whether a switchover may ask Sentinel
//! for Valkey 9's `SENTINEL FAILOVER <master> COORDINATED`: Sentinel then has the primary run
//! `FAILOVER TO <replica>` (it pauses writes and hands over once the replica has the whole
//! stream) instead of sending the replica `REPLICAOF NO ONE`. That needs Valkey 9 or later on
//! the Sentinel that fails over and on every node involved; anything else, or anything
//! unreadable, gets the plain `SENTINEL FAILOVER` (polestar's own fence and wait make that
//! lossless too).

use std::collections::HashMap;

/// What a peer says it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Server {
    /// Valkey (`server_name:valkey`), its `valkey_version` as (major, minor).
    Valkey(u32, u32),
    /// Redis, or a server whose name or version cannot be read.
    Other,
}

/// The first Valkey release with `SENTINEL FAILOVER <master> COORDINATED`.
const COORDINATED_SINCE: (u32, u32) = (9, 0);

impl Server {
    /// From an `INFO server` answer. Valkey answers `redis_version:7.2.4` too, for old
    /// clients: only `server_name` and `valkey_version` tell.
    pub fn parse(info: &str) -> Self {
        let fields: HashMap<&str, &str> =
            info.lines().filter_map(|l| l.trim_end().split_once(':')).collect();
        if fields.get("server_name") != Some(&"valkey") {
            return Self::Other;
        }
        let Some(version) = fields.get("valkey_version") else { return Self::Other };
        let mut parts = version.split('.').map(|p| p.parse::<u32>());
        match (parts.next(), parts.next()) {
            (Some(Ok(major)), Some(Ok(minor))) => Self::Valkey(major, minor),
            _ => Self::Other,
        }
    }

    fn coordinates(self) -> bool {
        matches!(self, Self::Valkey(major, minor) if (major, minor) >= COORDINATED_SINCE)
    }
}

/// Whether the switchover asks for `COORDINATED`: the Sentinel that fails over and every node
/// (the primary and each replica it may promote) are Valkey 9 or later. A node that did not
/// answer counts as [`Server::Other`].
pub fn coordinated(sentinel: Server, nodes: &[Server]) -> bool {
    sentinel.coordinates() && !nodes.is_empty() && nodes.iter().all(|n| n.coordinates())
}

#[cfg(test)]
mod tests {
    use super::*;

    const REDIS_7: &str = "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n";
    const VALKEY_8: &str = "redis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.8\r\n";
    const VALKEY_9: &str = "redis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:9.1.2\r\n";
    const VALKEY_10: &str = "server_name:valkey\r\nvalkey_version:10.0.0\r\n";

    #[test]
    fn info_server_says_which_server_it_is() {
        let table = [
            (REDIS_7, Server::Other),
            (VALKEY_8, Server::Valkey(8, 1)),
            (VALKEY_9, Server::Valkey(9, 1)),
            (VALKEY_10, Server::Valkey(10, 0)),
            ("server_name:valkey\r\nvalkey_version:9.0.0-rc1\r\n", Server::Valkey(9, 0)),
            // A Redis that says valkey_version without server_name, and garbage.
            ("redis_version:7.2.4\r\nvalkey_version:9.1.2\r\n", Server::Other),
            ("server_name:valkey\r\nvalkey_version:nine\r\n", Server::Other),
            ("server_name:valkey\r\nvalkey_version:9\r\n", Server::Other),
            ("server_name:valkey\r\n", Server::Other),
            ("", Server::Other),
        ];
        for (info, expected) in table {
            assert_eq!(Server::parse(info), expected, "{info:?}");
        }
    }

    #[test]
    fn coordinated_only_when_the_sentinel_and_every_node_are_valkey_9() {
        let (v8, v9, v10, other) =
            (Server::Valkey(8, 1), Server::Valkey(9, 1), Server::Valkey(10, 0), Server::Other);
        let table: [(Server, &[Server], bool); 8] = [
            (v9, &[v9, v9, v9], true),
            (v10, &[v9, v10], true),
            (Server::Valkey(9, 0), &[Server::Valkey(9, 0), v9], true),
            (v8, &[v9, v9, v9], false),
            (v9, &[v9, v8, v9], false),
            (v9, &[v9, other], false),
            (other, &[v9, v9], false),
            (v9, &[], false),
        ];
        for (sentinel, nodes, expected) in table {
            assert_eq!(coordinated(sentinel, nodes), expected, "{sentinel:?} {nodes:?}");
        }
    }
}
