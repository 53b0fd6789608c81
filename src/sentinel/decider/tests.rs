//! The shell with observations injected by hand: its three configured Sentinels are
//! unreachable ports, so the links exist (and fail quietly).

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use super::*;
use crate::sentinel::message::Addr;
use crate::topology::Node;

fn decider() -> (Decider, crate::topology::TopologyReader) {
    let text = "sentinels: {addresses: ['127.0.0.1:1', '127.0.0.1:2', '127.0.0.1:3']}\n\
                masters: [{name: m}]";
    let config = Config::parse(text, Path::new("/")).expect("valid test config");
    let (publisher, reader) = crate::topology::channel();
    let events = Arc::new(EventLog::new());
    (Decider::new(&config, publisher, events, None, CancellationToken::new()), reader)
}

fn node(port: u16) -> Node {
    Node { ip: IpAddr::V4(Ipv4Addr::LOCALHOST), port, hostname: None }
}

fn peer(port: u16, runid: &str) -> PeerRecord {
    PeerRecord { addr: Addr { host: "127.0.0.1".into(), port }, runid: runid.into() }
}

fn report(link: SentinelId, port: u16, epoch: u64, peers: Vec<PeerRecord>) -> Observation {
    let master = MasterReport {
        name: "m".into(),
        primary: node(port),
        epoch,
        failover_in_progress: false,
        replicas: Vec::new(),
        followers: Vec::new(),
        peers: Some(peers),
    };
    Observation::Report(Report {
        from: link,
        scope: Scope::All,
        masters: vec![master],
        with_peers: true,
    })
}

fn up(d: &mut Decider, link: SentinelId) {
    d.observe(Observation::Up { from: link, myid: Some(format!("id{link}")) });
}

fn master(d: &mut Decider) -> Arc<Master> {
    d.publish_snapshot();
    let snapshot = d.topology.reader().borrow().clone();
    snapshot.master("m").cloned().expect("a configured master")
}

fn primary(d: &mut Decider) -> Option<(u16, u64)> {
    let m = master(d);
    Some((m.primary.as_ref()?.port, m.epoch?))
}

#[tokio::test]
async fn a_majority_of_configured_sentinels_publishes() {
    let (mut d, _r) = decider();
    for l in 0..3 {
        up(&mut d, l);
    }
    d.observe(report(0, 7001, 3, Vec::new()));
    assert_eq!(primary(&mut d), None, "one Sentinel of three is not a majority");
    d.observe(report(1, 7001, 3, Vec::new()));
    assert_eq!(primary(&mut d), Some((7001, 3)));
}

/// Regression (a forged hello, docs/decisions.md D2): a peer the configured Sentinels list is
/// shown, with no link, no vote and no role check; it goes away when no configured Sentinel lists
/// it.
#[tokio::test]
async fn discovered_sentinels_are_shown_never_linked_and_forgotten() {
    let (mut d, _r) = decider();
    for l in 0..3 {
        up(&mut d, l);
    }
    let fake = peer(9999, "fake");
    let configured = peer(2, "elsewhere");
    let by_runid = peer(4444, "id1");
    d.observe(report(0, 7001, 1, vec![fake.clone(), configured, by_runid]));
    d.observe(report(1, 7001, 1, vec![fake]));
    let m = master(&mut d);
    assert_eq!(m.sentinels.discovered, ["127.0.0.1:9999"], "configured ones are not listed");
    assert_eq!((m.sentinels.configured, m.sentinels.agreeing), (3, 2));
    assert_eq!(d.links.len(), 3, "no link to a discovered Sentinel");
    d.observe(report(0, 7001, 1, Vec::new()));
    assert_eq!(master(&mut d).sentinels.discovered.len(), 1, "Sentinel 1 still lists it");
    d.observe(Observation::Down { from: 1, reason: "test".into() });
    assert!(master(&mut d).sentinels.discovered.is_empty(), "no configured Sentinel lists it");
}

/// Regression (docs/decisions.md D25): forged hellos (200 fake peers in under 2 s) grew the
/// discovered list without bound (`/v1/masters` outgrew an agent's answer limit) and each fake
/// recorded an event, which made every agent read the state again. The list shown is bounded and no
/// event is recorded for it.
#[tokio::test]
async fn forged_hellos_neither_grow_the_discovered_list_nor_wake_agents() {
    let (mut d, _r) = decider();
    for l in 0..3 {
        up(&mut d, l);
    }
    let before = d.events.last_id();
    let mut peers = Vec::new();
    for i in 0..200 {
        peers.push(peer(20000 + i, &format!("fake{i}")));
        d.observe(report(0, 7001, 1, peers.clone()));
    }
    let m = master(&mut d);
    let shown = m.sentinels.discovered.len();
    assert!(shown <= 16, "{shown} discovered Sentinels shown");
    let events = d.events.since(before);
    let about_fakes = |e: &&crate::events::Event| {
        let text = serde_json::to_string(e).expect("plain data");
        peers.iter().any(|p| text.contains(&format!("{}:{}", p.addr.host, p.addr.port)))
    };
    let woken: Vec<_> = events.iter().filter(about_fakes).collect();
    assert!(woken.is_empty(), "events recorded for discovered Sentinels: {woken:?}");
}

#[tokio::test]
async fn a_scoped_report_only_speaks_for_the_masters_it_asked_about() {
    let (mut d, _r) = decider();
    for l in 0..3 {
        up(&mut d, l);
        d.observe(report(l, 7001, 3, Vec::new()));
    }
    assert_eq!(master(&mut d).sentinels.agreeing, 3);
    let scoped = |link, name: &str| {
        let scope = Scope::Masters([name.to_string()].into());
        Observation::Report(Report { from: link, scope, masters: Vec::new(), with_peers: false })
    };
    d.observe(scoped(1, "other"));
    assert_eq!(master(&mut d).sentinels.agreeing, 3, "another master says nothing of m");
    d.observe(scoped(1, "m"));
    assert_eq!(master(&mut d).sentinels.agreeing, 2, "Sentinel 1 no longer monitors m");
    assert_eq!(primary(&mut d), Some((7001, 3)), "the published primary stays");
}

#[tokio::test]
async fn losing_every_sentinel_is_stale_and_keeps_the_primary() {
    let (mut d, r) = decider();
    for l in 0..3 {
        up(&mut d, l);
        d.observe(report(l, 7001, 1, Vec::new()));
    }
    assert_eq!(master(&mut d).state, MasterState::Ok);
    for l in 0..3 {
        d.observe(Observation::Down { from: l, reason: "test".into() });
    }
    let m = master(&mut d);
    assert_eq!(m.state, MasterState::Stale);
    assert_eq!(m.primary.as_ref().map(|p| p.port), Some(7001));
    assert!(!r.borrow().source_reachable);
}

#[tokio::test]
async fn reports_of_down_sentinels_do_not_count() {
    let (mut d, _r) = decider();
    up(&mut d, 0);
    up(&mut d, 1);
    d.observe(report(0, 7001, 1, Vec::new()));
    d.observe(Observation::Down { from: 0, reason: "test".into() });
    d.observe(report(0, 7001, 1, Vec::new()));
    d.observe(report(1, 7001, 1, Vec::new()));
    assert_eq!(primary(&mut d), None, "link 0 is down: its report is ignored");
}

/// A link task that ends on its own (a panic) is restarted by the next tick.
#[tokio::test]
async fn a_link_task_that_ends_is_restarted() {
    let (mut d, _r) = decider();
    let running = |d: &Decider| d.links[0].task.as_ref().is_some_and(|t| !t.is_finished());
    assert!(d.links.iter().all(|l| l.task.is_none()), "the constructor spawns nothing");
    d.start_links();
    assert!(running(&d));
    d.links[0].task.as_ref().expect("started").abort();
    while running(&d) {
        tokio::task::yield_now().await;
    }
    d.tick();
    assert!(running(&d), "a new link task runs");
}

/// A primary's own down events (docs/deciding.md, "The evidence"): three Sentinels' `+sdown` of the
/// primary are one `+sdown`, `+odown` is recorded once per episode, and none of it moves the
/// publication.
#[tokio::test]
async fn a_primarys_down_is_recorded_once_per_transition() {
    let (mut d, _r) = decider();
    for l in 0..3 {
        up(&mut d, l);
    }
    d.observe(report(0, 7001, 1, Vec::new()));
    d.observe(report(1, 7001, 1, Vec::new()));
    let old = Addr { host: "127.0.0.1".into(), port: 7001 };
    let down = |link, objective, began| Observation::MasterDown {
        from: link,
        master: "m".into(),
        node: old.clone(),
        down: Down { objective, began, quorum: objective.then(|| "2/2".to_string()) },
    };
    let recorded = |d: &Decider| {
        let events =
            d.events.since(None).into_iter().filter(|e| e.kind == crate::events::Kind::PrimaryDown);
        events.map(|e| e.data["event"].as_str().unwrap_or("?").to_string()).collect::<Vec<_>>()
    };
    for l in 0..3 {
        d.observe(down(l, false, true));
    }
    d.observe(down(0, true, true));
    d.observe(down(1, true, true));
    assert_eq!(recorded(&d), ["+sdown", "+odown"]);
    assert_eq!(primary(&mut d), Some((7001, 1)), "a down is no publication");
    let odown =
        d.events.since(None).into_iter().find(|e| e.data.get("event") == Some(&"+odown".into()));
    let odown = odown.expect("recorded");
    assert_eq!(odown.master.as_deref(), Some("m"));
    assert_eq!(odown.data["node"], "127.0.0.1:7001");
    assert_eq!(odown.data["sentinel"], "127.0.0.1:1");
    assert_eq!(odown.data["quorum"], "2/2");
    d.observe(down(2, true, false));
    d.observe(down(0, true, false));
    d.observe(down(1, false, false));
    d.observe(down(2, false, false));
    assert_eq!(recorded(&d), ["+sdown", "+odown", "-odown", "-sdown"]);
    // A second episode is recorded again; a master polestar does not follow is not.
    d.observe(down(1, false, true));
    d.observe(Observation::MasterDown {
        from: 0,
        master: "other".into(),
        node: old.clone(),
        down: Down { objective: false, began: true, quorum: None },
    });
    assert_eq!(recorded(&d), ["+sdown", "+odown", "-odown", "-sdown", "+sdown"]);
}

#[test]
fn a_primary_published_again_starts_a_new_down_episode() {
    let mut downs = Downs::default();
    let a = Addr { host: "127.0.0.1".into(), port: 7001 };
    let sdown = Down { objective: false, began: true, quorum: None };
    assert!(downs.note(&a, &sdown));
    assert!(!downs.note(&a, &sdown));
    downs.primary_is(&node(7002));
    assert!(!downs.note(&a, &sdown), "another primary leaves the episode open");
    downs.primary_is(&node(7001));
    assert!(downs.note(&a, &sdown), "published again, its next down is news");
}

/// Regression (docs/decisions.md D3): a polestar started while it reached one Sentinel of three
/// counted the majority over the Sentinels that had ever answered, and followed that one.
#[tokio::test]
async fn a_polestar_started_reaching_one_of_three_sentinels_does_not_follow_it_alone() {
    let (mut d, _r) = decider();
    up(&mut d, 0);
    d.observe(report(0, 7001, 3, Vec::new()));
    assert_eq!(primary(&mut d), None, "one reachable Sentinel of three is not a majority");
    up(&mut d, 1);
    d.observe(report(1, 7001, 3, Vec::new()));
    assert_eq!(primary(&mut d), Some((7001, 3)));
}

/// A configured address shown to be no Sentinel (it refused `SENTINEL`) stops counting.
#[tokio::test]
async fn an_address_shown_to_be_no_sentinel_does_not_count_towards_the_majority() {
    let (mut d, _r) = decider();
    let refused = "unknown command 'SENTINEL'".to_string();
    d.observe(Observation::NotSentinel { from: 2, reason: refused.clone() });
    d.observe(Observation::NotSentinel { from: 1, reason: refused });
    up(&mut d, 0);
    d.observe(report(0, 7001, 3, Vec::new()));
    assert_eq!(primary(&mut d), Some((7001, 3)), "one Sentinel of one");
}

/// A report of many masters that all switch at once (every start-up) publishes one snapshot,
/// not one per master: 1000 masters cost 1000 snapshots of 1000 masters each before.
#[tokio::test]
async fn a_report_of_many_switching_masters_publishes_once() {
    let text = "sentinels: {addresses: ['127.0.0.1:1', '127.0.0.1:2', '127.0.0.1:3']}\n";
    let config = Config::parse(text, Path::new("/")).expect("valid test config");
    let (publisher, reader) = crate::topology::channel();
    let mut d =
        Decider::new(&config, publisher, Arc::new(EventLog::new()), None, CancellationToken::new());
    for l in 0..3 {
        up(&mut d, l);
    }
    let many = |link: SentinelId| {
        let masters = (0..200)
            .map(|i| MasterReport {
                name: format!("m{i}"),
                primary: node(10_000 + i),
                epoch: 1,
                failover_in_progress: false,
                replicas: Vec::new(),
                followers: Vec::new(),
                peers: Some(Vec::new()),
            })
            .collect();
        Observation::Report(Report { from: link, scope: Scope::All, masters, with_peers: true })
    };
    d.publish_snapshot();
    let before = reader.borrow().version;
    for l in 0..3 {
        d.observe(many(l));
        d.publish_snapshot();
    }
    let snapshot = reader.borrow().clone();
    assert_eq!(snapshot.masters.len(), 200);
    let published = snapshot.masters.values().filter(|m| m.primary.is_some()).count();
    assert_eq!(published, 200, "every master published by the majority's reports");
    let versions = snapshot.version - before;
    assert!(versions <= 6, "{versions} snapshots for three reports of 200 masters");
}

#[test]
fn marks_add_up_until_every_master_is_marked() {
    let mut dirty = Dirty::default();
    assert_eq!(dirty, Dirty::Clean);
    dirty.master("a");
    dirty.master("b");
    dirty.master("a");
    assert_eq!(dirty, Dirty::Masters(BTreeSet::from(["a".into(), "b".into()])));
    dirty.all();
    dirty.master("c");
    assert_eq!(dirty, Dirty::All, "every master covers any one");
    assert_eq!(std::mem::take(&mut dirty), Dirty::All);
    assert_eq!(dirty, Dirty::Clean, "taken by a snapshot");
}

/// Idle cost (bench/README.md, "Scale"; docs/decisions.md D21): a tick of idle masters (no
/// promotion under way) changes nothing, so it neither runs their rule nor publishes; a report that
/// changes one master republishes only it.
#[tokio::test]
async fn an_idle_tick_publishes_nothing_and_a_change_rebuilds_only_its_master() {
    let (mut d, reader) = decider();
    for link in 0..3 {
        up(&mut d, link);
        d.observe(report(link, 6379, 1, Vec::new()));
    }
    d.publish_snapshot();
    let (version, before) = (reader.borrow().version, reader.borrow().masters["m"].clone());
    d.tick();
    d.publish_snapshot();
    assert_eq!(reader.borrow().version, version, "an idle tick publishes nothing");
    assert_eq!(d.dirty, Dirty::Clean);
    d.observe(report(0, 6379, 1, Vec::new()));
    assert_eq!(d.dirty, Dirty::Masters(BTreeSet::from(["m".into()])), "only the one reported");
    d.publish_snapshot();
    assert_eq!(reader.borrow().version, version, "the same report: the same view");
    assert!(Arc::ptr_eq(&before, &reader.borrow().masters["m"]));
}
