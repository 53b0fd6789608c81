use std::time::Duration;

use super::*;
use crate::drain::Reason;
use crate::drain::episode::DrainOrder;
use crate::node::Role;
use crate::topology::Node;

const PACE: Pace =
    Pace { grace: Duration::from_millis(2500), interval: Duration::from_millis(250) };

fn node(port: u16) -> Node {
    Node { ip: [127, 0, 0, 1].into(), port, hostname: None }
}

/// A flip at `now` to 7002, fenced for 5 s, confirmed or not.
fn orders(now: Instant, demote: bool) -> Orders {
    let drain =
        DrainOrder { at: now, reason: Reason::Flip, only_if_master: false, flipped: Some(now) };
    Orders {
        generation: 1,
        closed: false,
        until: now + Duration::from_secs(60),
        fence_until: now + Duration::from_secs(5),
        drain: Some(drain),
        target: Some(node(7002)),
        demote: demote.then(|| node(7002)),
        stop: None,
    }
}

fn fence(probe: phase::Probe) -> Probe {
    Probe::Fence(probe)
}

const TICK: phase::Probe = phase::Probe::Tick { changed: false, returning: false };

/// At the flip, the drain side waits for the fence side's first attempt; the fence's answer
/// releases the first pass in the same step, whatever the node answered.
#[test]
fn the_first_fence_attempt_releases_the_first_pass() {
    let now = Instant::now();
    let o = orders(now, false);
    let (waiting, actions) = step(State::new(PACE), &o, Probe::Drain(passes::Probe::Tick), now);
    assert_eq!(actions, vec![]);
    assert!(matches!(waiting.drain, Drain::AwaitingFence { .. }), "{waiting:?}");
    let (fencing, actions) = step(waiting, &o, fence(TICK), now);
    assert_eq!(actions, vec![Action::Fence(phase::Action::Fence)]);
    assert_eq!(fencing.drain, waiting.drain, "a fence sent is not a fence tried");
    let pass = Action::Drain(passes::Action::FirstPass {
        cutoff: now + PACE.grace,
        reason: Reason::Flip,
        timed: Some(now),
    });
    let answers = [
        (Some(Role::Master), vec![phase::Action::Paused { first: true, round_trips: 1 }]),
        (Some(Role::Replica), vec![phase::Action::Unpause]),
        (None, vec![]),
    ];
    for (role, fenced) in answers {
        let probe = fence(phase::Probe::Role { role: role.clone(), round_trips: 1 });
        let (next, actions) = step(fencing, &o, probe, now);
        let mut want: Vec<Action> = fenced.into_iter().map(Action::Fence).collect();
        want.extend([Action::Fence(phase::Action::WakeBy(o.fence_until)), pass.clone()]);
        assert_eq!(actions, want, "{role:?}");
        assert!(matches!(next.drain, Drain::FirstPass { .. }), "{role:?}: {next:?}");
    }
    // A demotion attempt is a fence attempt too.
    let confirmed = orders(now, true);
    let (demoting, _) = step(waiting, &confirmed, fence(TICK), now);
    let probe = fence(phase::Probe::Demotion(Demotion::Refused));
    let (next, actions) = step(demoting, &confirmed, probe, now);
    assert_eq!(actions, vec![Action::Fence(phase::Action::Fence), pass]);
    assert!(matches!(next.drain, Drain::FirstPass { .. }), "{next:?}");
}

/// Only a demotion this episode made lets a returning node's drain go ahead on a replica, and
/// it is remembered when new orders make the fence look at the node afresh.
#[test]
fn a_demotion_of_ours_is_remembered_for_the_whole_episode() {
    let now = Instant::now();
    let o = orders(now, true);
    let tried = State { fence: Phase::Open { seen_replica: false }, ..State::new(PACE) };
    let (done, _) = step(tried, &o, fence(phase::Probe::Demotion(Demotion::Done)), now);
    assert_eq!((done.fence, done.demoted), (Phase::Replica, Demoted::ByUs));
    let (already, _) =
        step(tried, &o, fence(phase::Probe::Demotion(Demotion::AlreadyReplica)), now);
    assert_eq!((already.fence, already.demoted), (Phase::Replica, Demoted::NotByUs));
    let changed = fence(phase::Probe::Tick { changed: true, returning: true });
    let (afresh, _) = step(done, &o, changed, now);
    assert_eq!(afresh.fence, Phase::Open { seen_replica: false });
    assert_eq!(afresh.demoted, Demoted::ByUs);
    let order =
        DrainOrder { at: now, reason: Reason::Returning, only_if_master: true, flipped: None };
    let asking = State { drain: Drain::Asking { order, started: now }, ..afresh };
    let back = Orders { drain: Some(order), ..o };
    let (next, actions) =
        step(asking, &back, Probe::Drain(passes::Probe::Role(Some(Role::Replica))), now);
    assert!(matches!(next.drain, Drain::FirstPass { .. }), "{next:?}");
    assert_eq!(actions.len(), 1);
}

/// The window's end reports the drain abandoned only while no pass of its order reached the
/// node (and never with no order at all).
#[test]
fn the_window_abandons_only_a_drain_that_never_reached_the_node() {
    let now = Instant::now();
    let o = orders(now, false);
    let order = o.drain.expect("a drain order");
    let late = o.until;
    let fenced = Phase::Fenced { seen_replica: false };
    let abandoned = vec![
        Action::Fence(phase::Action::Abandon),
        Action::Fence(phase::Action::FenceOver("window")),
        Action::Fence(phase::Action::End),
    ];
    let ended = abandoned[1..].to_vec();
    let cases = vec![
        ("never reached", Drain::Unreached { order, next: late }, abandoned.clone()),
        ("its ROLE unanswered", Drain::Asking { order, started: late }, abandoned),
        ("reached, sweeping", Drain::Sweeping { order, next: late }, ended.clone()),
        ("stale writers", Drain::StaleWriters { order, next: late }, ended.clone()),
        ("no drain order", Drain::Idle, ended.clone()),
        ("over", Drain::Over { order }, ended),
    ];
    for (name, drain, want) in cases {
        let state = State { fence: fenced, drain, ..State::new(PACE) };
        let (next, actions) = step(state, &o, fence(TICK), late);
        assert_eq!(actions, want, "{name}");
        assert_eq!(next.drain, drain, "{name}");
    }
}
