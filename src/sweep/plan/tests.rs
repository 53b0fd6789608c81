use std::collections::BTreeMap;
use std::sync::Arc;

use super::*;
use crate::topology::{MasterState, Replica, SentinelCounts};

fn node(ip: &str) -> Node {
    Node { ip: ip.parse().expect("test ip"), port: 6379, hostname: None }
}

fn master(primary: Option<&str>, replicas: &[&str], state: MasterState) -> Arc<Master> {
    let replicas = replicas
        .iter()
        .map(|ip| Replica {
            ip: ip.parse().expect("ip"),
            port: 6379,
            hostname: None,
            healthy: true,
            down: false,
        })
        .collect();
    Arc::new(Master {
        withdrawn: None,
        provisional: false,
        name: "m".into(),
        label: "m".into(),
        primary: primary.map(node),
        epoch: Some(1),
        since: None,
        state,
        replicas,
        sentinels: SentinelCounts::default(),
    })
}

fn snapshot(m: Arc<Master>) -> Snapshot {
    Snapshot { version: 1, masters: BTreeMap::from([("m".to_string(), m)]), source_reachable: true }
}

#[test]
fn a_new_primary_is_a_change_with_its_data_hosts() {
    let old = snapshot(master(Some("10.0.0.1"), &["10.0.0.2", "10.0.0.3"], MasterState::Ok));
    let new = snapshot(master(Some("10.0.0.2"), &["10.0.0.3"], MasterState::Ok));
    let found = changes(&old, &new);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].from, node("10.0.0.1"));
    assert_eq!(found[0].to, node("10.0.0.2"));
    let hosts: Vec<String> = found[0].data_hosts.iter().map(ToString::to_string).collect();
    assert_eq!(hosts, ["10.0.0.2", "10.0.0.3"]);
}

#[test]
fn stale_keeps_the_primary_and_selects_nothing() {
    let old = snapshot(master(Some("10.0.0.1"), &["10.0.0.2"], MasterState::Ok));
    let new = snapshot(master(Some("10.0.0.1"), &["10.0.0.2"], MasterState::Stale));
    assert!(changes(&old, &new).is_empty());
}

#[test]
fn a_first_or_lost_primary_is_not_a_change() {
    let unknown = snapshot(master(None, &[], MasterState::Unknown));
    let known = snapshot(master(Some("10.0.0.1"), &[], MasterState::Ok));
    assert!(changes(&unknown, &known).is_empty());
    assert!(changes(&known, &unknown).is_empty());
    assert!(changes(&Snapshot::default(), &known).is_empty());
}

fn sock(local: &str, peer: &str) -> TcpSocket {
    TcpSocket::listed(local.parse().expect("local"), peer.parse().expect("peer"))
}

#[test]
fn the_local_target_spares_replicas_and_sentinels() {
    let spared = BTreeSet::from(["10.0.0.2".parse().expect("ip")]);
    let served = Served::Except(BTreeSet::new());
    let target = Target::Local { port: 6379, spared, peers: BTreeSet::new(), listed: None, served };
    assert!(target.selects(&sock("10.0.0.1:6379", "10.0.0.9:40000")));
    assert!(target.selects(&sock("127.0.0.1:6379", "127.0.0.1:40000")));
    assert!(!target.selects(&sock("10.0.0.1:6379", "10.0.0.2:40000")));
    // This host's own outgoing connections to some port 6379 elsewhere are not clients.
    assert!(!target.selects(&sock("10.0.0.1:40000", "10.0.0.9:6379")));
}

/// Regression (docs/decisions.md D16): the node-side sweep reset the central polestar's and the
/// Sentinels' links to the old primary every interval (its ROLE checks failed with broken
/// pipe, its drain found nothing to kill) because they came from hosts it did not spare.
#[test]
fn the_local_target_spares_the_peers_the_node_names_as_infrastructure() {
    let served = Served::Except(BTreeSet::new());
    let target = Target::Local {
        port: 6379,
        spared: BTreeSet::new(),
        peers: BTreeSet::new(),
        listed: None,
        served,
    };
    let list = "id=1 addr=127.0.0.1:41000 name=sentinel-1a2b3c4d-cmd flags=N cmd=ping\n\
                id=2 addr=127.0.0.1:41001 name=polestar flags=N cmd=client|list\n\
                id=3 addr=127.0.0.1:41002 name=app flags=N cmd=set";
    let parsed = crate::node::clients::parse_list(list);
    let infrastructure = parsed.infrastructure_peers();
    let hung = target.sparing(&infrastructure, None);
    assert!(!hung.selects(&sock("127.0.0.1:6379", "127.0.0.1:41000")), "a Sentinel");
    assert!(!hung.selects(&sock("127.0.0.1:6379", "127.0.0.1:41001")), "a polestar");
    assert!(hung.selects(&sock("127.0.0.1:6379", "127.0.0.1:41002")), "an application");
    assert!(hung.selects(&sock("127.0.0.1:6379", "127.0.0.1:41003")), "a newer one");
    // Seen in CI: the central polestar opened a connection (its demotion) between the node's
    // listing and the sweep. A node that listed its clients this round: only those go.
    let listed = parsed.settled_peers();
    let answering = target.sparing(&infrastructure, Some(&listed));
    assert!(!answering.selects(&sock("127.0.0.1:6379", "127.0.0.1:41001")), "a polestar");
    assert!(answering.selects(&sock("127.0.0.1:6379", "127.0.0.1:41002")), "an application");
    assert!(!answering.selects(&sock("127.0.0.1:6379", "127.0.0.1:41003")), "not listed yet");
}

fn listening(local: &str) -> TcpSocket {
    sock(local, "0.0.0.0:0")
}

#[test]
fn the_local_target_keeps_to_the_addresses_that_reach_the_old_primary() {
    let old: SocketAddr = "10.0.0.5:6379".parse().expect("addr");
    let target = Target::Local {
        port: 6379,
        spared: BTreeSet::new(),
        peers: BTreeSet::new(),
        listed: None,
        served: Served::Except(BTreeSet::new()),
    };
    let client = |local: &str| sock(local, "10.0.0.9:40000");
    // Two redis-servers on one host, each bound to its own address: only O's clients.
    let listeners = [listening("10.0.0.5:6379"), listening("10.0.0.6:6379")];
    let own = target.with_listeners(old, &listeners);
    assert!(own.selects(&client("10.0.0.5:6379")));
    assert!(!own.selects(&client("10.0.0.6:6379")), "another node's client");
    assert!(!own.selects(&client("127.0.0.1:6379")));
    // O on the wildcard address, another node bound to 10.0.0.6: all but 10.0.0.6.
    let listeners =
        [listening("0.0.0.0:6379"), listening("10.0.0.6:6379"), listening("10.0.0.6:7000")];
    let wildcard = target.with_listeners(old, &listeners);
    assert!(wildcard.selects(&client("10.0.0.5:6379")));
    assert!(wildcard.selects(&client("127.0.0.1:6379")), "O's local clients");
    assert!(!wildcard.selects(&client("10.0.0.6:6379")), "another node's client");
    // A dual-stack wildcard listener reports IPv6; its IPv4 clients are O's.
    let dual = target.with_listeners(old, &[listening("[::]:6379")]);
    assert!(dual.selects(&client("10.0.0.5:6379")));
    // The remote target does not depend on listeners.
    let remote = Target::Remote { peer: old };
    assert_eq!(remote.with_listeners(old, &listeners), remote);
}

#[test]
fn the_remote_target_is_exactly_the_old_primary() {
    let target = Target::Remote { peer: "10.0.0.1:6379".parse().expect("addr") };
    assert!(target.selects(&sock("10.0.0.9:40000", "10.0.0.1:6379")));
    assert!(!target.selects(&sock("10.0.0.9:40000", "10.0.0.1:6380")));
    assert!(!target.selects(&sock("10.0.0.9:40000", "10.0.0.2:6379")));
}
