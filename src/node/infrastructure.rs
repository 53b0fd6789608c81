//! Which connections of a node belong to the infrastructure, the one rule both the drain
//! (which never kills them) and the node-side sweep (which spares their peers) apply to a
//! [`ClientInfo`] of `CLIENT LIST`: Sentinel's links (`sentinel-<id>-cmd` / `-pubsub`: killing
//! them would make Sentinel see the node flap), polestar's own (named
//! [`CONNECTION_NAME`]`*` or with `lib-name=polestar`, whichever polestar opened them) and
//! replication links (a replica attached to the node, or the node's link to its own master:
//! killing them forces a full resync). The sweep cuts in the kernel, where names are not
//! visible, so it asks the node first and spares these peers by address.
//!
//! A connection still in its handshake is not judged at all by the sweep: every client
//! (polestar, Sentinel) names itself only after `HELLO`, `AUTH` or `CLIENT SETINFO`, so a
//! listing taken in between shows another polestar's brand-new fence or drain connection
//! unnamed. Found in CI: a central polestar's connection, opened at the flip, swept by the
//! node-side polestar in that gap.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use super::CONNECTION_NAME;
use super::clients::{ClientInfo, ClientList};

/// Whose infrastructure a connection is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Infrastructure {
    Polestar,
    Sentinel,
    Replication,
}

/// Commands that only a replication link sends.
const REPLICATION_COMMANDS: [&str; 3] = ["replconf", "psync", "sync"];

/// A connection at most this old (`age=`, whole seconds) whose commands so far are only the
/// handshake's is judged at a later listing, once it has named itself.
const HANDSHAKE_AGE: Duration = Duration::from_secs(2);

impl ClientInfo {
    /// Whose infrastructure this connection is, if it is the infrastructure's.
    pub fn infrastructure(&self) -> Option<Infrastructure> {
        if self.name.starts_with(CONNECTION_NAME) || self.lib_name == CONNECTION_NAME {
            Some(Infrastructure::Polestar)
        } else if self.name.starts_with("sentinel-") {
            Some(Infrastructure::Sentinel)
        } else if self.is_replication() {
            Some(Infrastructure::Replication)
        } else {
            None
        }
    }

    fn is_replication(&self) -> bool {
        self.flags.has('S') || self.flags.has('M') || REPLICATION_COMMANDS.contains(&self.command())
    }

    /// Unnamed, young, and no command yet but the handshake's (`cmd=NULL` before the first).
    /// A connection whose age the node does not say is judged as it is.
    pub fn handshaking(&self) -> bool {
        let young = self.age.is_some_and(|age| age <= HANDSHAKE_AGE);
        self.name.is_empty()
            && self.lib_name.is_empty()
            && young
            && matches!(self.command(), "null" | "hello" | "auth" | "client")
    }
}

impl ClientList {
    /// The peers (`addr=`) of the infrastructure's connections to the node.
    pub fn infrastructure_peers(&self) -> BTreeSet<SocketAddr> {
        let infrastructure = self.clients.iter().filter(|c| c.infrastructure().is_some());
        infrastructure.filter_map(|c| c.addr).collect()
    }

    /// The peers of every connection listed, except those still in their handshake.
    pub fn settled_peers(&self) -> BTreeSet<SocketAddr> {
        self.clients.iter().filter(|c| !c.handshaking()).filter_map(|c| c.addr).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::clients::{parse_line, parse_list};
    use super::*;

    fn peers(set: BTreeSet<SocketAddr>) -> Vec<String> {
        set.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn sentinels_polestars_and_replication_links_are_infrastructure() {
        let list = "\
id=3 addr=10.0.0.5:41000 laddr=10.0.0.1:6379 name=sentinel-8f2c1a3b-cmd flags=N cmd=ping
id=4 addr=10.0.0.5:41002 laddr=10.0.0.1:6379 name=sentinel-8f2c1a3b-pubsub flags=P cmd=subscribe
id=5 addr=10.0.0.9:50000 laddr=10.0.0.1:6379 name=polestar flags=N cmd=role lib-name=
id=6 addr=10.0.0.9:50001 laddr=10.0.0.1:6379 name= flags=N cmd=client|list lib-name=polestar
id=7 addr=10.0.0.2:6379 laddr=10.0.0.1:6379 name= flags=S cmd=replconf
id=8 addr=10.0.0.7:33000 laddr=10.0.0.1:6379 name=app flags=N cmd=set lib-name=redis-rs
id=9 addr=10.0.0.7:33001 laddr=10.0.0.1:6379 name=sentinelish flags=b cmd=blpop
id=10 addr=/tmp/redis.sock:0 laddr=/tmp/redis.sock:0 name=polestar flags=U cmd=role
garbage line without fields";
        let spared = peers(parse_list(list).infrastructure_peers());
        assert_eq!(
            spared,
            [
                "10.0.0.2:6379",
                "10.0.0.5:41000",
                "10.0.0.5:41002",
                "10.0.0.9:50000",
                "10.0.0.9:50001"
            ]
        );
    }

    #[test]
    fn whose_each_connection_is() {
        use Infrastructure::*;
        let cases = [
            ("id=2 name=polestar flags=N", Some(Polestar)),
            ("id=2 name=polestar-drain flags=N", Some(Polestar)),
            ("id=2 name= lib-name=polestar flags=N", Some(Polestar)),
            ("id=2 name=sentinel-1 lib-name=polestar flags=N", Some(Polestar)),
            ("id=3 name=sentinel-1a2b3c4d-cmd flags=N", Some(Sentinel)),
            ("id=3 name=sentinel-1a2b3c4d-pubsub flags=P", Some(Sentinel)),
            ("id=4 flags=S cmd=replconf", Some(Replication)),
            ("id=4 flags=M cmd=ping", Some(Replication)),
            ("id=4 flags=N cmd=psync", Some(Replication)),
            ("id=4 flags=N cmd=SYNC", Some(Replication)),
            ("id=5 name=app flags=N cmd=set lib-name=redis-rs", None),
            ("id=5 name=sentinelish flags=b cmd=blpop", None),
            ("id=5 name=Polestar flags=N cmd=get", None),
        ];
        for (line, want) in cases {
            assert_eq!(parse_line(line).expect("test line").infrastructure(), want, "{line}");
        }
    }

    #[test]
    fn a_connection_in_its_handshake_is_not_listed_yet() {
        let list = "\
id=1 addr=10.0.0.9:50000 name= age=0 flags=N cmd=NULL
id=2 addr=10.0.0.9:50001 name= age=0 flags=N cmd=hello
id=3 addr=10.0.0.9:50002 name= age=1 flags=N cmd=client|setinfo
id=4 addr=10.0.0.9:50003 name= age=2 flags=N cmd=auth
id=5 addr=10.0.0.7:33000 name= age=0 flags=N cmd=set
id=6 addr=10.0.0.7:33001 name= age=3 flags=N cmd=hello
id=7 addr=10.0.0.7:33002 name=app age=0 flags=N cmd=hello
id=8 addr=10.0.0.7:33003 name= age=0 flags=N cmd=hello lib-name=redis-py
id=9 addr=10.0.0.7:33004 name= age=banana flags=N cmd=NULL
id=10 addr=10.0.0.7:33005 name= flags=N cmd=NULL";
        let listed = peers(parse_list(list).settled_peers());
        assert_eq!(
            listed,
            [
                "10.0.0.7:33000",
                "10.0.0.7:33001",
                "10.0.0.7:33002",
                "10.0.0.7:33003",
                "10.0.0.7:33004",
                "10.0.0.7:33005"
            ]
        );
    }

    #[test]
    fn an_empty_or_odd_list_spares_nothing() {
        assert!(parse_list("").infrastructure_peers().is_empty());
        assert!(parse_list("name=sentinel-x addr=banana").infrastructure_peers().is_empty());
        assert!(parse_list("id=1 name=sentinel-x addr=banana").infrastructure_peers().is_empty());
    }
}
