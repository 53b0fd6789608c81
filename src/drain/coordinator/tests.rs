//! The coordinator's orders, with episodes against a node that never answers (their I/O
//! fails quietly; what is checked is what they were told).

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use super::*;

fn coordinator() -> Coordinator {
    let text = "sentinels: {addresses: ['127.0.0.1:1']}\ndrain: {enabled: true}";
    let config = crate::config::Config::parse(text, Path::new("/")).expect("valid test config");
    let (_, topology) = crate::topology::channel();
    Coordinator::new(config.drain, config.nodes, Arc::new(EventLog::new()), topology)
}

fn node(port: u16) -> Node {
    Node { ip: IpAddr::V4(Ipv4Addr::LOCALHOST), port, hostname: None }
}

/// Regression (docs/deciding.md, "Start-up, restarts and reloads"): a reload mid-failover started a
/// new watcher whose first majority (still the old primary) was a flip to it, which stopped the
/// episode fencing it: the old primary took writes again while the leader promoted the replica.
#[tokio::test]
async fn a_reload_mid_failover_does_not_lift_the_fence_of_the_old_primary() {
    let mut c = coordinator();
    let (mut episodes, shutdown) = (Episodes::new(), CancellationToken::new());
    let (master, old, new) = ("m".to_string(), node(1), node(2));
    let at = std::time::Instant::now();
    let promoting = Signal::Promoting {
        master: master.clone(),
        old: old.clone(),
        new: Some(new),
        at,
        coordinated: false,
    };
    c.apply(promoting, &mut episodes, &shutdown);
    // The restarted watcher's first publication: the old primary, from nothing.
    let first = Signal::Flipped {
        master: master.clone(),
        old: None,
        new: old.clone(),
        epoch: 1,
        provisional: false,
        at,
    };
    c.apply(first, &mut episodes, &shutdown);
    let orders =
        episodes.get(&(master.clone(), old.addr())).expect("the fence's episode").borrow().clone();
    assert_eq!(orders.stop, None, "the fence was lifted by a watcher that did not set it");
    assert!(c.promoting.contains_key(&master), "the promotion is still under way");
    shutdown.cancel();
}

#[test]
fn a_coordinated_failovers_promotion_is_fenced_by_no_polestar() {
    // (the leader reports it coordinated, this polestar asked for it coordinated) -> fence
    let table = [
        ((false, false), true),
        ((true, false), false),
        ((false, true), false),
        ((true, true), false),
    ];
    for ((reported, asked), fence) in table {
        assert_eq!(
            fence_at_promotion(reported, asked),
            fence,
            "reported {reported}, asked {asked}"
        );
    }
}

/// Regression (docs/decisions.md D18): only the polestar that asked for a coordinated failover
/// skipped its fence; every other polestar fenced the old primary at the leader's
/// `+selected-slave`, which held the leader's `FAILOVER TO` behind its hello `PUBLISH` until the
/// failover timed out. The leader's word now reaches every polestar: no episode, no fence.
#[tokio::test]
async fn a_promotion_the_leader_runs_coordinated_starts_no_fence() {
    let mut c = coordinator();
    let (mut episodes, shutdown) = (Episodes::new(), CancellationToken::new());
    let (master, old, new) = ("m".to_string(), node(1), node(2));
    let at = std::time::Instant::now();
    for coordinated in [true, false] {
        let promoting = Signal::Promoting {
            master: master.clone(),
            old: old.clone(),
            new: Some(new.clone()),
            at,
            coordinated,
        };
        c.apply(promoting, &mut episodes, &shutdown);
        let fenced = episodes.contains_key(&(master.clone(), old.addr()));
        assert_eq!(fenced, !coordinated, "coordinated {coordinated}");
        assert!(c.promoting.contains_key(&master), "the promotion is under way either way");
    }
    shutdown.cancel();
}
