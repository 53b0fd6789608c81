use std::time::Duration;

use super::*;
use crate::drain::Reason;
use crate::drain::episode::DrainOrder;

const UNTRIED: Phase = Phase::Untried;
const OPEN: Phase = Phase::Open { seen_replica: false };
const SEEN: Phase = Phase::Open { seen_replica: true };
const FENCED: Phase = Phase::Fenced { seen_replica: false };
const FENCED_SEEN: Phase = Phase::Fenced { seen_replica: true };
const REPLICA: Phase = Phase::Replica;

fn node(port: u16) -> Node {
    Node { ip: [127, 0, 0, 1].into(), port, hostname: None }
}

/// Orders at `now`: the window ends in 60 s; `fence` s of fence left; a flip's drain order or
/// none; a confirmed promotion to 7002 or none; a stop or none.
fn orders(now: Instant, fence: i64, drain: bool, demote: bool, stop: Option<Stop>) -> Orders {
    let fence_until = if fence >= 0 {
        now + Duration::from_secs(fence as u64)
    } else {
        now - Duration::from_secs((-fence) as u64)
    };
    let order = DrainOrder { at: now, reason: Reason::Flip, only_if_master: false, flipped: None };
    Orders {
        generation: 1,
        closed: false,
        until: now + Duration::from_secs(60),
        fence_until,
        drain: drain.then_some(order),
        target: Some(node(7002)),
        demote: demote.then(|| node(7002)),
        stop,
    }
}

/// A table row: name, phase, fence left (s), drain, demote, stop, then the phase and actions.
type Row = (&'static str, Phase, i64, bool, bool, Option<Stop>, Phase, Vec<Action>);

const TICK: Probe = Probe::Tick { changed: false, returning: false };

/// The first tick of each situation: (name, phase, fence left (s), drain, demote, stop) ->
/// (phase, actions).
#[test]
fn a_tick_fences_demotes_or_ends_as_the_orders_say() {
    let now = Instant::now();
    let until = now + Duration::from_secs(60);
    let demote = |seen_replica, fenced| Action::Demote { to: node(7002), seen_replica, fenced };
    use Action::*;
    let cases: Vec<Row> = vec![
        (
            "an abort lifts our pause",
            FENCED,
            5,
            true,
            false,
            Some(Stop::Aborted),
            OPEN,
            vec![Lift("aborted"), End],
        ),
        (
            "published again: lifted",
            FENCED,
            5,
            true,
            true,
            Some(Stop::Primary),
            OPEN,
            vec![Lift("primary"), End],
        ),
        (
            "given up: left to lapse",
            FENCED,
            5,
            false,
            false,
            Some(Stop::GaveUp),
            OPEN,
            vec![LeaveToLapse, End],
        ),
        (
            "a stop with no pause of ours",
            OPEN,
            5,
            true,
            false,
            Some(Stop::Aborted),
            OPEN,
            vec![End],
        ),
        ("a stop of a replica", REPLICA, 5, true, true, Some(Stop::Superseded), REPLICA, vec![End]),
        (
            "a replica sleeps to the window's end",
            REPLICA,
            5,
            true,
            true,
            None,
            REPLICA,
            vec![SleepUntil(until)],
        ),
        (
            "confirmed: demote, renewing our pause",
            FENCED,
            5,
            true,
            true,
            None,
            FENCED,
            vec![demote(false, true)],
        ),
        (
            "confirmed, no pause of ours",
            OPEN,
            5,
            true,
            true,
            None,
            OPEN,
            vec![demote(false, false)],
        ),
        (
            "confirmed, fence over: no pause",
            OPEN,
            -1,
            true,
            true,
            None,
            OPEN,
            vec![demote(false, false)],
        ),
        (
            "confirmed, seen replica before",
            SEEN,
            5,
            true,
            true,
            None,
            SEEN,
            vec![demote(true, false)],
        ),
        ("promoting: fence", OPEN, 5, false, false, None, OPEN, vec![Fence]),
        ("renewing: fence", FENCED_SEEN, 5, true, false, None, FENCED_SEEN, vec![Fence]),
        ("fence over", FENCED, -1, true, false, None, OPEN, vec![FenceOver("fence_over")]),
        ("nothing to fence, a drain goes on", OPEN, -1, true, false, None, OPEN, vec![]),
        ("nothing to fence, nothing to drain", OPEN, -1, false, false, None, OPEN, vec![End]),
        // Before any attempt: the phase says so until one is made (the first drain pass waits).
        ("untried, promoting: fence", UNTRIED, 5, true, false, None, UNTRIED, vec![Fence]),
        (
            "untried, confirmed: demote",
            UNTRIED,
            5,
            true,
            true,
            None,
            UNTRIED,
            vec![demote(false, false)],
        ),
        ("untried, nothing to fence: tried", UNTRIED, -1, true, false, None, OPEN, vec![]),
        ("untried, nothing at all", UNTRIED, -1, false, false, None, OPEN, vec![End]),
        ("untried, stopped", UNTRIED, 5, true, false, Some(Stop::Aborted), UNTRIED, vec![End]),
    ];
    for (name, phase, fence, drain, dem, stop, want_phase, want) in cases {
        let o = orders(now, fence, drain, dem, stop);
        assert_eq!(step(phase, &o, TICK, now), (want_phase, want), "{name}");
    }
}

#[test]
fn the_window_ends_the_fence_loop() {
    let now = Instant::now();
    let o = orders(now, 5, true, true, None);
    let late = o.until;
    use Action::*;
    let fenced = step(FENCED, &o, TICK, late);
    assert_eq!(fenced, (OPEN, vec![Abandon, FenceOver("window"), End]));
    assert_eq!(step(OPEN, &o, TICK, late), (OPEN, vec![Abandon, End]));
    // A stop wins over the window's end.
    let stopped = orders(now, 5, true, true, Some(Stop::Aborted));
    assert_eq!(step(FENCED, &stopped, TICK, late), (OPEN, vec![Lift("aborted"), End]));
}

/// What the node answered: (name, phase, answer) -> (phase, actions before the wake-up at
/// `fence_until`). Any answer (or none) means the fence was tried.
#[test]
fn a_master_is_paused_a_replica_needs_no_fence() {
    let now = Instant::now();
    let o = orders(now, 5, false, false, None);
    use Action::*;
    let paused = |first| Paused { first, round_trips: 1 };
    let cases = vec![
        ("first pause", OPEN, Some(Role::Master), FENCED, vec![paused(true)]),
        ("first pause, first attempt", UNTRIED, Some(Role::Master), FENCED, vec![paused(true)]),
        ("renewal", FENCED, Some(Role::Master), FENCED, vec![paused(false)]),
        (
            "promoted again keeps the memory",
            SEEN,
            Some(Role::Master),
            FENCED_SEEN,
            vec![paused(true)],
        ),
        (
            "a replica: our pause lifted",
            FENCED,
            Some(Role::Replica),
            REPLICA,
            vec![Lift("replica")],
        ),
        ("a replica, the fence's pause undone", OPEN, Some(Role::Replica), REPLICA, vec![Unpause]),
        ("a replica at the first attempt", UNTRIED, Some(Role::Replica), REPLICA, vec![Unpause]),
        (
            "another role, fenced: lapses",
            FENCED,
            Some(Role::Other("sentinel".into())),
            FENCED,
            vec![],
        ),
        (
            "another role, never fenced",
            OPEN,
            Some(Role::Other("sentinel".into())),
            OPEN,
            vec![Unpause],
        ),
        (
            "another role at the first attempt",
            UNTRIED,
            Some(Role::Other("sentinel".into())),
            OPEN,
            vec![Unpause],
        ),
        ("no answer", FENCED, None, FENCED, vec![]),
        ("no answer at the first attempt: tried all the same", UNTRIED, None, OPEN, vec![]),
    ];
    for (name, phase, role, want_phase, mut want) in cases {
        want.push(WakeBy(o.fence_until));
        let probe = Probe::Role { role, round_trips: 1 };
        assert_eq!(step(phase, &o, probe, now), (want_phase, want), "{name}");
    }
}

#[test]
fn a_demotion_ends_the_fence_or_falls_back_to_it() {
    let now = Instant::now();
    let o = orders(now, 5, true, true, None);
    let over = orders(now, -1, true, true, None);
    use Action::*;
    let d = |outcome| Probe::Demotion(outcome);
    assert_eq!(step(FENCED, &o, d(Demotion::Done), now), (REPLICA, vec![]));
    assert_eq!(
        step(FENCED, &o, d(Demotion::AlreadyReplica), now),
        (REPLICA, vec![Lift("replica")])
    );
    assert_eq!(step(OPEN, &o, d(Demotion::AlreadyReplica), now), (REPLICA, vec![]));
    assert_eq!(step(FENCED, &o, d(Demotion::Unreachable), now), (FENCED, vec![RetryIfSlow]));
    // Refused: the fence goes on as without demotion, and ends at `fence_until`.
    assert_eq!(step(FENCED, &o, d(Demotion::Refused), now), (FENCED, vec![Fence]));
    let ended = step(FENCED, &over, d(Demotion::Refused), now);
    assert_eq!(ended, (OPEN, vec![FenceOver("fence_over")]));
    // A first attempt that was a demotion counts as tried, whatever it found.
    assert_eq!(step(UNTRIED, &o, d(Demotion::Done), now), (REPLICA, vec![]));
    assert_eq!(step(UNTRIED, &o, d(Demotion::Unreachable), now), (OPEN, vec![RetryIfSlow]));
    assert_eq!(step(UNTRIED, &over, d(Demotion::Refused), now), (OPEN, vec![]));
}

/// New orders look at a demoted node afresh (it may have been promoted again), and a returning
/// node's new drain order forgets that it answered replica (it came back claiming master).
#[test]
fn new_orders_look_at_the_node_afresh() {
    let now = Instant::now();
    let o = orders(now, 5, false, true, None);
    let demote =
        |seen_replica, fenced| vec![Action::Demote { to: node(7002), seen_replica, fenced }];
    let tick = |changed, returning| Probe::Tick { changed, returning };
    let cases = vec![
        (
            "unchanged: still a replica",
            REPLICA,
            tick(false, false),
            REPLICA,
            vec![Action::SleepUntil(o.until)],
        ),
        (
            "changed: demote, but it was a replica",
            REPLICA,
            tick(true, false),
            SEEN,
            demote(true, false),
        ),
        ("a returning node's order", REPLICA, tick(true, true), OPEN, demote(false, false)),
        (
            "a returning node's order, fenced",
            FENCED_SEEN,
            tick(true, true),
            FENCED,
            demote(false, true),
        ),
        (
            "changed, fenced: remembered",
            FENCED_SEEN,
            tick(true, false),
            FENCED_SEEN,
            demote(true, true),
        ),
    ];
    for (name, phase, probe, want_phase, want) in cases {
        assert_eq!(step(phase, &o, probe, now), (want_phase, want), "{name}");
    }
}
