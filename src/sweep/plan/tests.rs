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
        })
        .collect();
    Arc::new(Master {
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
    let target = Target::Local { port: 6379, spared };
    assert!(target.selects(&sock("10.0.0.1:6379", "10.0.0.9:40000")));
    assert!(target.selects(&sock("127.0.0.1:6379", "127.0.0.1:40000")));
    assert!(!target.selects(&sock("10.0.0.1:6379", "10.0.0.2:40000")));
    // This host's own outgoing connections to some port 6379 elsewhere are not clients.
    assert!(!target.selects(&sock("10.0.0.1:40000", "10.0.0.9:6379")));
}

#[test]
fn the_remote_target_is_exactly_the_old_primary() {
    let target = Target::Remote { peer: "10.0.0.1:6379".parse().expect("addr") };
    assert!(target.selects(&sock("10.0.0.9:40000", "10.0.0.1:6379")));
    assert!(!target.selects(&sock("10.0.0.9:40000", "10.0.0.1:6380")));
    assert!(!target.selects(&sock("10.0.0.9:40000", "10.0.0.2:6379")));
}
