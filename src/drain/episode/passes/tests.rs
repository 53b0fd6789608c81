use super::*;
use crate::drain::episode::Orders;
use crate::drain::episode::phase::Phase;
use crate::topology::Node;

const INTERVAL: Duration = Duration::from_millis(250);
const GRACE: Duration = Duration::from_millis(600);
const PACE: Pace = Pace { grace: GRACE, interval: INTERVAL };

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A flip's order at `at` (timed from `at`), or a returning node's (`only_if_master`).
fn flip(at: Instant) -> DrainOrder {
    DrainOrder { at, reason: Reason::Flip, only_if_master: false, flipped: Some(at) }
}

fn returning(at: Instant) -> DrainOrder {
    DrainOrder { at, reason: Reason::Returning, only_if_master: true, flipped: None }
}

/// Orders naming `drain`, whose window ends 60 s after `now`.
fn orders(now: Instant, drain: Option<DrainOrder>) -> Orders {
    let target = Some(Node { ip: [127, 0, 0, 1].into(), port: 7002, hostname: None });
    Orders {
        generation: 1,
        closed: false,
        until: now + Duration::from_secs(60),
        fence_until: now + Duration::from_secs(5),
        drain,
        target,
        demote: None,
        stop: None,
    }
}

/// The episode's state with the drain at `drain`, the fence tried or not.
fn at(drain: Drain, tried: bool) -> State {
    let fence = if tried { Phase::Open { seen_replica: false } } else { Phase::Untried };
    State { drain, fence, ..State::new(PACE) }
}

fn first_pass(order: DrainOrder, timed: Option<Instant>) -> Action {
    Action::FirstPass { cutoff: order.at + GRACE, reason: order.reason, timed }
}

/// A table row: name, stage, fence tried, the orders' drain order, then the stage and actions.
type Row = (&'static str, Drain, bool, Option<DrainOrder>, Drain, Vec<Action>);

/// What each stage does when the drain side is ticked: (name, stage, fence tried, the
/// orders' drain order) -> (stage, actions).
#[test]
fn a_tick_takes_up_new_orders_and_makes_what_is_due() {
    let now = Instant::now();
    let (a, b) = (flip(now), flip(now - ms(100)));
    let (late, back) = (flip(now - ms(700)), returning(now));
    let soon = now + ms(100);
    use Drain::*;
    let cases: Vec<Row> = vec![
        ("no order", Idle, true, None, Idle, vec![]),
        (
            "a flip's order, fence tried: the first pass at once",
            Idle,
            true,
            Some(a),
            FirstPass { order: a, started: now },
            vec![first_pass(a, Some(now))],
        ),
        (
            "a flip's order before any fence attempt: waits for it",
            Idle,
            false,
            Some(a),
            AwaitingFence { order: a, started: now, by: now + FENCE_FIRST },
            vec![],
        ),
        (
            "past the cutoff: no wait for the fence",
            Idle,
            false,
            Some(late),
            FirstPass { order: late, started: now },
            vec![first_pass(late, late.flipped)],
        ),
        (
            "a returning node's order: ROLE first",
            Idle,
            true,
            Some(back),
            Asking { order: back, started: now },
            vec![Action::AskRole],
        ),
        (
            "unreached, not due",
            Unreached { order: a, next: soon },
            true,
            Some(a),
            Unreached { order: a, next: soon },
            vec![],
        ),
        (
            "unreached, due",
            Unreached { order: a, next: now },
            true,
            Some(a),
            FirstPass { order: a, started: now },
            vec![first_pass(a, Some(now))],
        ),
        (
            "sweeping, due",
            Sweeping { order: a, next: now },
            true,
            Some(a),
            Sweep { order: a, started: now },
            vec![Action::Sweep { cutoff: now + GRACE, timed: Some(now) }],
        ),
        (
            "sweeping, not due",
            Sweeping { order: a, next: soon },
            true,
            Some(a),
            Sweeping { order: a, next: soon },
            vec![],
        ),
        (
            "stale writers, due",
            StaleWriters { order: a, next: now },
            true,
            Some(a),
            StaleWriters { order: a, next: now },
            vec![Action::SweepWriters { last: false }],
        ),
        ("over", Over { order: a }, true, Some(a), Over { order: a }, vec![]),
        (
            "another order is taken up",
            StaleWriters { order: a, next: soon },
            true,
            Some(b),
            FirstPass { order: b, started: now },
            vec![first_pass(b, b.flipped)],
        ),
        (
            "another order after one that is over",
            Over { order: a },
            true,
            Some(b),
            FirstPass { order: b, started: now },
            vec![first_pass(b, b.flipped)],
        ),
        (
            "no order any more: nothing",
            Sweeping { order: a, next: now },
            true,
            None,
            Sweeping { order: a, next: now },
            vec![],
        ),
        (
            "a pass under way is finished first",
            FirstPass { order: a, started: now },
            true,
            Some(b),
            FirstPass { order: a, started: now },
            vec![],
        ),
        (
            "a ROLE under way is answered first",
            Asking { order: back, started: now },
            true,
            Some(a),
            Asking { order: back, started: now },
            vec![],
        ),
        (
            "waiting for the fence, another order: the wait goes on",
            AwaitingFence { order: a, started: now, by: soon },
            false,
            Some(b),
            AwaitingFence { order: a, started: now, by: soon },
            vec![],
        ),
        (
            "the wait for the fence is over: the pass goes",
            AwaitingFence { order: a, started: now - FENCE_FIRST, by: now },
            false,
            Some(b),
            FirstPass { order: a, started: now - FENCE_FIRST },
            vec![first_pass(a, Some(now))],
        ),
    ];
    for (name, drain, tried, order, want_drain, want) in cases {
        let (got, actions) = step(at(drain, tried), &orders(now, order), Probe::Tick, now);
        assert_eq!((got.drain, actions), (want_drain, want), "{name}");
    }
}

/// A returning node's `ROLE`: (name, answer, demoted by this episode, fence tried) -> (stage,
/// actions). It is drained while it claims master, or as a replica this episode made.
#[test]
fn a_returning_node_is_drained_while_master_or_demoted_by_us() {
    let now = Instant::now();
    let order = returning(now - ms(50));
    let started = now - ms(10);
    let asking = Drain::Asking { order, started };
    let pass = |drain| (drain, vec![first_pass(order, None)]);
    let running = Drain::FirstPass { order, started };
    use Demoted::*;
    let cases = vec![
        ("master", Some(Role::Master), NotByUs, true, pass(running)),
        (
            "master, before any fence attempt",
            Some(Role::Master),
            NotByUs,
            false,
            (Drain::AwaitingFence { order, started, by: now + FENCE_FIRST }, vec![]),
        ),
        ("a replica we made", Some(Role::Replica), ByUs, true, pass(running)),
        (
            "a replica someone else made",
            Some(Role::Replica),
            NotByUs,
            true,
            (Drain::Over { order }, vec![]),
        ),
        (
            "a sentinel",
            Some(Role::Other("sentinel".into())),
            ByUs,
            true,
            (Drain::Over { order }, vec![]),
        ),
        (
            "no answer: tried again an interval after the attempt",
            None,
            NotByUs,
            true,
            (Drain::Unreached { order, next: started + INTERVAL }, vec![]),
        ),
    ];
    let o = orders(now, Some(order));
    for (name, role, demoted, tried, want) in cases {
        let state = State { demoted, ..at(asking, tried) };
        let (got, actions) = step(state, &o, Probe::Role(role), now);
        assert_eq!((got.drain, actions), want, "{name}");
    }
}

/// What a pass found: (name, stage, found, orders' window) -> stage. The first pass is retried
/// until it reaches the node; sweeps go on to the cutoff whatever they find; the first pass or
/// sweep that starts at or after the cutoff is the last before the stale writers.
#[test]
fn passes_go_on_to_the_cutoff_then_the_stale_writers_until_the_window_ends() {
    let now = Instant::now();
    let order = flip(now - ms(300));
    let cutoff = order.at + GRACE;
    let early = now - ms(100);
    let stale = Drain::StaleWriters { order, next: now + STALE_SWEEP };
    use Drain::*;
    use Pass::*;
    let cases = vec![
        (
            "first, unreachable",
            FirstPass { order, started: early },
            Unreachable,
            Unreached { order, next: early + INTERVAL },
        ),
        (
            "first, reached",
            FirstPass { order, started: early },
            Complete,
            Sweeping { order, next: early + INTERVAL },
        ),
        (
            "first, part-way",
            FirstPass { order, started: early },
            Interrupted,
            Sweeping { order, next: early + INTERVAL },
        ),
        (
            "the next one at the cutoff, not after it",
            FirstPass { order, started: cutoff - ms(100) },
            Complete,
            Sweeping { order, next: cutoff },
        ),
        (
            "first, after the cutoff, unreachable",
            FirstPass { order, started: cutoff },
            Unreachable,
            Unreached { order, next: cutoff + INTERVAL },
        ),
        (
            "first, after the cutoff, reached: the last",
            FirstPass { order, started: cutoff },
            Complete,
            stale,
        ),
        (
            "a sweep before the cutoff, unreachable",
            Sweep { order, started: early },
            Unreachable,
            Sweeping { order, next: early + INTERVAL },
        ),
        (
            "the sweep at the cutoff, unreachable: the last",
            Sweep { order, started: cutoff },
            Unreachable,
            stale,
        ),
        ("the sweep at the cutoff: the last", Sweep { order, started: cutoff }, Complete, stale),
    ];
    let o = orders(now, Some(order));
    for (name, drain, pass, want) in cases {
        let (got, actions) = step(at(drain, true), &o, Probe::Passed(pass), now);
        assert_eq!((got.drain, actions), (want, vec![]), "{name}");
    }
    // The window ends before the next stale-writer sweep: the order is over.
    let short = Orders { until: now + ms(900), ..o.clone() };
    let (got, _) =
        step(at(Sweep { order, started: cutoff }, true), &short, Probe::Passed(Complete), now);
    assert_eq!(got.drain, Over { order });
    let (got, _) = step(at(stale, true), &o, Probe::Swept, now);
    assert_eq!(got.drain, StaleWriters { order, next: now + STALE_SWEEP });
    let (got, _) = step(at(stale, true), &short, Probe::Swept, now);
    assert_eq!(got.drain, Over { order });
    // The sweep after which the window ends is the last: what it finds is reported left behind.
    let due = StaleWriters { order, next: now };
    let (_, actions) = step(at(due, true), &o, Probe::Tick, now);
    assert_eq!(actions, vec![Action::SweepWriters { last: false }]);
    let (_, actions) = step(at(due, true), &short, Probe::Tick, now);
    assert_eq!(actions, vec![Action::SweepWriters { last: true }]);
}

/// A pass that reached every client times its flip, once: not a part-way pass, not a flip
/// timed before (a returning node's order that took over a flip's carries its instant).
#[test]
fn each_flip_is_timed_once() {
    let now = Instant::now();
    let order = flip(now - ms(100));
    let running = Drain::FirstPass { order, started: now - ms(50) };
    let o = orders(now, Some(order));
    let (done, _) = step(at(running, true), &o, Probe::Passed(Pass::Complete), now);
    assert_eq!(done.timed, order.flipped);
    let (part, _) = step(at(running, true), &o, Probe::Passed(Pass::Interrupted), now);
    assert_eq!(part.timed, None);
    // The next sweep has nothing left to time.
    let (_, actions) = step(done, &o, Probe::Tick, now + INTERVAL);
    assert_eq!(actions, vec![Action::Sweep { cutoff: order.at + GRACE, timed: None }]);
    // A returning node's order carrying the same flip is not timed again.
    let took_over = DrainOrder { flipped: order.flipped, ..returning(now) };
    let asking = Drain::Asking { order: took_over, started: now };
    let state = State { timed: order.flipped, ..at(asking, true) };
    let (_, actions) =
        step(state, &orders(now, Some(took_over)), Probe::Role(Some(Role::Master)), now);
    assert_eq!(actions, vec![first_pass(took_over, None)]);
}

/// An answer that starts nothing is followed as a wait would be: another order is taken up at
/// once, and a pass already due is made.
#[test]
fn an_answer_then_takes_up_new_orders() {
    let now = Instant::now();
    let (a, b) = (flip(now - ms(200)), flip(now - ms(100)));
    let running = Drain::FirstPass { order: a, started: now - ms(150) };
    let (got, actions) =
        step(at(running, true), &orders(now, Some(b)), Probe::Passed(Pass::Complete), now);
    assert_eq!(got.drain, Drain::FirstPass { order: b, started: now });
    assert_eq!(actions, vec![first_pass(b, b.flipped)]);
    assert_eq!(got.timed, a.flipped, "the pass that reached everyone timed its own flip");
    // A pass that took longer than the interval: the next one at once.
    let slow = Drain::FirstPass { order: a, started: now - INTERVAL };
    let (got, actions) =
        step(at(slow, true), &orders(now, Some(a)), Probe::Passed(Pass::Complete), now);
    assert_eq!(got.drain, Drain::Sweep { order: a, started: now });
    assert_eq!(actions.len(), 1);
}

/// The first pass waits for the fence side's first attempt: released by it, or by the time.
#[test]
fn the_first_pass_waits_for_the_first_fence_attempt() {
    let now = Instant::now();
    let order = flip(now);
    let waiting = Drain::AwaitingFence { order, started: now, by: now + FENCE_FIRST };
    let o = orders(now, Some(order));
    let (got, actions) = step(at(waiting, true), &o, Probe::FenceTried, now + ms(30));
    assert_eq!(got.drain, Drain::FirstPass { order, started: now });
    assert_eq!(actions, vec![first_pass(order, Some(now))]);
    assert_eq!(waiting.wake(&o), Some(now + FENCE_FIRST));
    // Anywhere else the news changes nothing.
    let sweeping = Drain::Sweeping { order, next: now + ms(10) };
    assert_eq!(step(at(sweeping, true), &o, Probe::FenceTried, now), (at(sweeping, true), vec![]));
}

/// The drain side's timer: only for a stage whose order the orders still name (else only new
/// orders wake it), and never while a command runs.
#[test]
fn the_timer_is_set_only_while_it_can_do_something() {
    let now = Instant::now();
    let (a, b) = (flip(now), flip(now - ms(1)));
    let next = now + ms(100);
    let o = orders(now, Some(a));
    assert_eq!(Drain::Sweeping { order: a, next }.wake(&o), Some(next));
    assert_eq!(Drain::Sweeping { order: b, next }.wake(&o), None);
    assert_eq!(Drain::Unreached { order: a, next }.wake(&orders(now, None)), None);
    assert_eq!(Drain::FirstPass { order: a, started: now }.wake(&o), None);
    assert_eq!(Drain::Over { order: a }.wake(&o), None);
    assert_eq!(Drain::Idle.wake(&o), None);
}

/// A restarted shell makes again the attempt whose command it dropped.
#[test]
fn an_interrupted_attempt_is_made_again() {
    let now = Instant::now();
    let a = flip(now);
    let then = now - ms(10);
    use Drain::*;
    assert_eq!(
        Asking { order: a, started: then }.interrupted(now),
        Unreached { order: a, next: now }
    );
    assert_eq!(
        FirstPass { order: a, started: then }.interrupted(now),
        Unreached { order: a, next: now }
    );
    let waiting = AwaitingFence { order: a, started: then, by: now };
    assert_eq!(waiting.interrupted(now), Unreached { order: a, next: now });
    assert_eq!(
        Sweep { order: a, started: then }.interrupted(now),
        Sweeping { order: a, next: now }
    );
    let stale = StaleWriters { order: a, next: then };
    assert_eq!(stale.interrupted(now), stale);
}

/// A whole order, every pass reaching the node at once: the first at the flip, a sweep every
/// interval and one exactly at the cutoff, then the stale writers every second.
#[test]
fn a_flip_is_swept_every_interval_and_once_at_the_cutoff() {
    let t0 = Instant::now();
    let order = flip(t0);
    let o = orders(t0, Some(order));
    let mut state = at(Drain::Idle, true);
    let mut now = t0;
    let mut passes = Vec::new();
    for _ in 0..8 {
        let (next, actions) = step(state, &o, Probe::Tick, now);
        state = next;
        match actions.as_slice() {
            [Action::FirstPass { .. } | Action::Sweep { .. }] => {
                passes.push(now - t0);
                state = step(state, &o, Probe::Passed(Pass::Complete), now).0;
            }
            [Action::SweepWriters { last: false }] => {
                passes.push(now - t0);
                state = step(state, &o, Probe::Swept, now).0;
            }
            other => panic!("nothing due at {:?}: {other:?} in {state:?}", now - t0),
        }
        now = state.drain.wake(&o).expect("a next pass");
    }
    let want = [0, 250, 500, 600, 1600, 2600, 3600, 4600].map(ms);
    assert_eq!(passes, want);
}
