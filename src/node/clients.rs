//! Which connections of a node belong to the infrastructure, read from its `CLIENT LIST`:
//! Sentinel's links (`sentinel-<id>-cmd` / `-pubsub`), polestar's own (named
//! [`CONNECTION_NAME`](super::CONNECTION_NAME)`*` or with `lib-name=polestar`, whichever
//! polestar opened them) and replication links. The node-side socket sweep spares exactly
//! these peers: it cuts in the kernel, where names are not visible, so it asks the node first.
//!
//! A connection still in its handshake is not judged at all: every client (polestar, Sentinel)
//! names itself only after `HELLO`, `AUTH` or `CLIENT SETINFO`, so a listing taken in between
//! shows another polestar's brand-new fence or drain connection unnamed. Found in CI: a central
//! polestar's connection, opened at the flip, swept by the node-side polestar in that gap.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use super::CONNECTION_NAME;

/// The peers (`addr=` of `CLIENT LIST`) of the infrastructure's connections to the node.
pub fn infrastructure(list: &str) -> BTreeSet<SocketAddr> {
    list.lines().filter(|line| is_infrastructure(line)).filter_map(peer).collect()
}

/// A connection at most this old (`age=`, whole seconds) whose commands so far are only the
/// handshake's is judged at a later listing, once it has named itself.
const HANDSHAKE_AGE: u64 = 2;

/// The peers of every connection `CLIENT LIST` names, except those still in their handshake.
pub fn listed(list: &str) -> BTreeSet<SocketAddr> {
    list.lines().filter(|line| !handshaking(line)).filter_map(peer).collect()
}

/// Unnamed, young, and no command yet but the handshake's (`cmd=NULL` before the first).
fn handshaking(line: &str) -> bool {
    let command = field(line, "cmd").split('|').next().unwrap_or("");
    let young = field(line, "age").parse::<u64>().is_ok_and(|age| age <= HANDSHAKE_AGE);
    field(line, "name").is_empty()
        && field(line, "lib-name").is_empty()
        && young
        && matches!(command, "NULL" | "hello" | "auth" | "client")
}

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    let found = line.split(' ').find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='));
    found.unwrap_or("")
}

fn peer(line: &str) -> Option<SocketAddr> {
    field(line, "addr").parse().ok()
}

fn is_infrastructure(line: &str) -> bool {
    let name = field(line, "name");
    let flags = field(line, "flags");
    let replication = flags.contains('S') || flags.contains('M');
    let replication_cmd = matches!(field(line, "cmd"), "replconf" | "psync" | "sync");
    name.starts_with("sentinel-")
        || name.starts_with(CONNECTION_NAME)
        || field(line, "lib-name") == CONNECTION_NAME
        || replication
        || replication_cmd
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let spared: Vec<String> = infrastructure(list).iter().map(ToString::to_string).collect();
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
id=9 addr=10.0.0.7:33004 name= age=banana flags=N cmd=NULL";
        let listed: Vec<String> = listed(list).iter().map(ToString::to_string).collect();
        assert_eq!(
            listed,
            [
                "10.0.0.7:33000",
                "10.0.0.7:33001",
                "10.0.0.7:33002",
                "10.0.0.7:33003",
                "10.0.0.7:33004"
            ]
        );
    }

    #[test]
    fn an_empty_or_odd_list_spares_nothing() {
        assert!(infrastructure("").is_empty());
        assert!(infrastructure("name=sentinel-x addr=banana").is_empty());
    }
}
